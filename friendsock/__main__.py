"""``python -m friendsock SUBCOMMAND`` (and the ``friendsock`` console
script): ``run`` a program with friendsock on, or ``bench``."""

from __future__ import annotations

import os
import sys
from typing import Optional, Sequence

USAGE = """\
usage: {prog} SUBCOMMAND [args]

subcommands:
  run      run a Python program with friendsock on every event loop it makes,
           and report what paired ({prog} run --help)
  bench    compare real TCP, AF_UNIX and friend links ({prog} bench --help)

seeing what friend links carry (no subcommand: set in the program's environment,
or called in it):
  FRIENDSOCK_PCAP=FILE      write every friend link made from start-up to exit
                            to FILE, a classic pcap of the TCP segments the
                            connection would carry (handshake, data, FIN/RST),
                            readable while it grows; Wireshark's and tshark's
                            "follow TCP stream" shows what each end wrote.
                            "{{pid}}" in FILE becomes the process id
  FRIENDSOCK_PCAP_MAX=SIZE  go on in a new file before one grows past SIZE
                            (bytes, or e.g. 64K, 100M, 1G): x.pcap, then
                            x.1.pcap, x.2.pcap...
  FRIENDSOCK_PCAP_FILES=N   keep only the newest N of those files
  friendsock.capture(path)  the same for a with-block (also start_capture(path),
                            stop_capture()); max_bytes=, max_files= as above
  friendsock.links()        the live friend links, one LinkInfo each, like ss -tni:
                            both addresses; per direction its state (open, eof,
                            reset) and bytes queued and moved; per end sndbuf,
                            rcvbuf, paused reading/writing, thread and loop; age
  Connections that fell back to real TCP are in neither: they are the
  kernel's, and tcpdump sees them.
"""


def _prog() -> str:
    name = os.path.basename(sys.argv[0]) if sys.argv and sys.argv[0] else ""
    return "python -m friendsock" if name in ("", "__main__.py", "-c") else name


def main(argv: Optional[Sequence[str]] = None) -> int:
    args = list(sys.argv[1:] if argv is None else argv)
    prog = _prog()
    if args and args[0] in ("-h", "--help"):
        print(USAGE.format(prog=prog), end="")
        return 0
    if args and args[0] == "run":
        from ._run import main as run_main

        return run_main(args[1:], prog=f"{prog} run")
    if not args or args[0] != "bench":
        if args:
            print(f"{prog}: error: unknown subcommand {args[0]!r}", file=sys.stderr)
        print(USAGE.format(prog=prog), end="", file=sys.stderr)
        return 2
    # Imported here: the benchmark's dependencies (rich) are optional.
    from ._bench._cli import main as bench_main

    return bench_main(args[1:], prog=f"{prog} bench")


if __name__ == "__main__":
    sys.exit(main())
