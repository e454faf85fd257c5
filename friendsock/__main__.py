"""``python -m friendsock SUBCOMMAND``; the one subcommand so far is ``bench``."""

from __future__ import annotations

import sys
from typing import Optional, Sequence

USAGE = """\
usage: python -m friendsock bench [options]

subcommands:
  bench    compare real TCP, AF_UNIX and friend links (python -m friendsock bench --help)
"""


def main(argv: Optional[Sequence[str]] = None) -> int:
    args = list(sys.argv[1:] if argv is None else argv)
    if args and args[0] in ("-h", "--help"):
        print(USAGE, end="")
        return 0
    if not args or args[0] != "bench":
        if args:
            print(f"python -m friendsock: error: unknown subcommand {args[0]!r}", file=sys.stderr)
        print(USAGE, end="", file=sys.stderr)
        return 2
    # Imported here: the benchmark's dependencies (rich) are optional.
    from ._bench._cli import main as bench_main

    return bench_main(args[1:], prog="python -m friendsock bench")


if __name__ == "__main__":
    sys.exit(main())
