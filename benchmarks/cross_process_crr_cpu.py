"""CPU time per new connection between two processes, at each end: a
client process connects, writes 64 B, reads the 64 B answer and closes, N
times in a row, to a server process over the server's loop's own TCP
server and over a friendsock server (the connection moved off TCP to a
socketpair). CPU time, not wall time, of each process; TCP and friends
alternate round by round, so load on the machine moves both alike.

    python benchmarks/cross_process_crr_cpu.py [--loop uvloop] [--count 2000] [--rounds 5]

What it shows: where a new connection between processes costs more than
TCP's (see the design's "Between processes").
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import subprocess
import sys
from typing import Any, Dict, List

import friendsock

SIZE = 64


class Echo(asyncio.Protocol):
    def connection_made(self, transport: Any) -> None:
        self.transport = transport

    def data_received(self, data: bytes) -> None:
        self.transport.write(data)


def _cpu() -> float:
    times = os.times()
    return times.user + times.system


async def serve() -> None:
    """The server process: both servers; a line on standard input asks for
    its CPU time so far; EOF ends it."""
    loop = asyncio.get_running_loop()
    tcp = await loop.create_server(Echo, "127.0.0.1", 0)
    friends = await friendsock.create_server(Echo, "127.0.0.1", 0)
    print(json.dumps({"tcp": tcp.sockets[0].getsockname()[1],
                      "friends": friends.sockets[0].getsockname()[1]}), flush=True)
    while await loop.run_in_executor(None, sys.stdin.readline):
        print(_cpu(), flush=True)


class _Client(asyncio.Protocol):
    def __init__(self, done: asyncio.Future) -> None:
        self.done = done

    def connection_made(self, transport: Any) -> None:
        self.transport = transport
        transport.write(b"x" * SIZE)

    def data_received(self, data: bytes) -> None:
        self.transport.close()

    def connection_lost(self, exc: Any) -> None:
        if not self.done.done():
            self.done.set_result(None)


async def _round(connect: Any, count: int) -> float:
    loop = asyncio.get_running_loop()
    before = _cpu()
    for _ in range(count):
        done = loop.create_future()
        await connect(lambda: _Client(done))
        await done
    return _cpu() - before


def _server_cpu(server: subprocess.Popen) -> float:
    assert server.stdin is not None and server.stdout is not None
    server.stdin.write("cpu\n")
    server.stdin.flush()
    return float(server.stdout.readline())


async def measure(server: subprocess.Popen, ports: Dict[str, int], count: int,
                  rounds: int) -> Dict[str, Dict[str, List[float]]]:
    loop = asyncio.get_running_loop()
    connects = {
        "tcp": lambda factory: loop.create_connection(factory, "127.0.0.1", ports["tcp"]),
        "friends": lambda factory: friendsock.create_connection(factory, "127.0.0.1", ports["friends"]),
    }
    found: Dict[str, Dict[str, List[float]]] = {path: {"client": [], "server": []} for path in connects}
    for round_ in range(rounds + 1):  # (the first warms up)
        for path, connect in connects.items():
            server_before = _server_cpu(server)
            client = await _round(connect, count)
            server_cpu = _server_cpu(server) - server_before
            if round_:
                found[path]["client"].append(client / count * 1e6)
                found[path]["server"].append(server_cpu / count * 1e6)
        await asyncio.sleep(0.2)  # (connections just closed finish)
    return found


def _run(loop_name: str, main: Any) -> Any:
    if loop_name == "uvloop":
        import uvloop

        return uvloop.run(main)
    return asyncio.run(main)


def main() -> None:
    if sys.argv[1:2] == ["--serve"]:
        _run(sys.argv[2], serve())
        return
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--loop", default="uvloop", choices=["asyncio", "uvloop"])
    parser.add_argument("--count", type=int, default=2000)
    parser.add_argument("--rounds", type=int, default=5)
    args = parser.parse_args()
    server = subprocess.Popen([sys.executable, __file__, "--serve", args.loop],
                              stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    try:
        assert server.stdout is not None
        ports = json.loads(server.stdout.readline())
        found = _run(args.loop, measure(server, ports, args.count, args.rounds))
    finally:
        assert server.stdin is not None
        server.stdin.close()
        server.wait(10)
    print(f"{args.loop}: CPU µs per connection, median of {args.rounds} rounds of {args.count}")
    for path, ends in found.items():
        print(f"  {path:8} client {statistics.median(ends['client']):7.1f}"
              f"   server {statistics.median(ends['server']):7.1f}")


if __name__ == "__main__":
    main()
