"""What a small write costs the writer, between two processes: 64-byte
``transport.write()`` calls (a ``drain()`` every 256) on a connection to a
server process that reads and discards, over TCP and moved off it, the two
interleaved in each round, on asyncio and uvloop. A moved transport looks
at its pair end for the other end's close before each write (a
``poll()``), which TCP's own transport does not need::

    python benchmarks/cross_process_writes.py
    python benchmarks/cross_process_writes.py --loops uvloop --rounds 9

The figure is the writer's wall time per ``write()``, the median over the
rounds; the server's loop is the client's.
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import subprocess
import sys
import time
from typing import Any, Dict, List

CHUNK = b"x" * 64


def _run(loop: str, main: Any) -> Any:
    if loop == "uvloop":
        import uvloop

        return uvloop.run(main)
    return asyncio.run(main)


async def _serve() -> None:
    import friendsock

    async def discard(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        while await reader.read(1 << 16):
            pass
        writer.close()

    server = await friendsock.start_server(discard, "127.0.0.1", 0)
    print(server.sockets[0].getsockname()[1], flush=True)
    await asyncio.get_running_loop().run_in_executor(None, sys.stdin.read)
    server.close()


async def _per_write(port: int, friends: bool, count: int) -> float:
    """Seconds per write() on a new connection, moved or not."""
    import friendsock

    friendsock.set_cross_process(friends)
    reader, writer = await friendsock.open_connection("127.0.0.1", port)
    try:
        assert friendsock.is_friend(writer) is friends
        started = time.perf_counter()
        for i in range(count):
            writer.write(CHUNK)
            if i % 256 == 255:
                await writer.drain()
        await writer.drain()
        return (time.perf_counter() - started) / count
    finally:
        writer.close()
        await writer.wait_closed()


async def _measure(port: int, rounds: int, count: int) -> Dict[str, List[float]]:
    figures: Dict[str, List[float]] = {"tcp": [], "friends": []}
    await _per_write(port, True, count // 10)  # (warm-up)
    for _ in range(rounds):
        for path in figures:
            figures[path].append(await _per_write(port, path == "friends", count))
    return figures


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--loops", default="asyncio,uvloop")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--count", type=int, default=100_000, help="writes a round, each path")
    parser.add_argument("--serve", help=argparse.SUPPRESS)  # (the server process)
    args = parser.parse_args()
    if args.serve is not None:
        _run(args.serve, _serve())
        return
    print("| loop | TCP µs/write | friends µs/write | friends / TCP |")
    print("|---|---|---|---|")
    for loop in args.loops.split(","):
        server = subprocess.Popen([sys.executable, __file__, "--serve", loop],
                                  stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
        try:
            assert server.stdout is not None
            port = int(server.stdout.readline())
            figures = _run(loop, _measure(port, args.rounds, args.count))
        finally:
            server.communicate("", timeout=30)
        tcp, friends = (statistics.median(figures[path]) * 1e6 for path in ("tcp", "friends"))
        print(f"| {loop} | {tcp:.2f} | {friends:.2f} | {friends / tcp:.2f}× |", flush=True)


if __name__ == "__main__":
    main()
