"""What friendsock costs a connection to a process without friendsock: a
client connects, writes 64 B, reads the 64 B answer and closes, again and
again, to an echo server in another process that never imports
friendsock. Each door friendsock offers against the same client without
it, interleaved in every round (the order turned round each round):

- ``asyncio`` and ``uvloop``: the loop's own ``create_connection``;
  friendsock's (``friendsock.create_connection``); the loop's own under
  ``friendsock.install()``;
- ``trio``: trio's ``open_tcp_stream``; ``friendsock.trio.open_tcp_stream``;
- ``blocking``: ``socket.create_connection``, then the same under
  ``friendsock.patch_socket()``.

Printed per door, each the median over the rounds: connections per
second, and the client process's CPU time per connection (user and
system: other load on the machine moves it less than the rate), each
over the same client's without friendsock (1.00: no cost).

    python benchmarks/plain_peer_connects.py [--clients asyncio,uvloop,trio,blocking]
        [--count 1000] [--rounds 11]
"""

from __future__ import annotations

import argparse
import asyncio
import socket
import statistics
import subprocess
import sys
import time
from typing import Any, Callable, Dict, List, Sequence, Tuple

import friendsock

MESSAGE = b"m" * 64

# The server: plain uvloop, no friendsock imported (its clients' cost is
# what is measured, and every door's connections reach the same server).
SERVER = r"""
import asyncio, sys
import uvloop

class Echo(asyncio.Protocol):
    def connection_made(self, transport):
        self.transport = transport
    def data_received(self, data):
        self.transport.write(data)

async def main():
    server = await asyncio.get_running_loop().create_server(Echo, "127.0.0.1", 0, backlog=1024)
    print(server.sockets[0].getsockname()[1], flush=True)
    await asyncio.get_running_loop().run_in_executor(None, sys.stdin.read)

uvloop.run(main())
"""


class _Client(asyncio.Protocol):
    def __init__(self) -> None:
        self.done = asyncio.get_running_loop().create_future()
        self.transport: Any = None

    def connection_made(self, transport: Any) -> None:
        self.transport = transport
        transport.write(MESSAGE)

    def data_received(self, data: bytes) -> None:
        self.transport.close()

    def connection_lost(self, exc: Any) -> None:
        if not self.done.done():
            self.done.set_result(None)


Figures = Tuple[float, float]  # connections per second; CPU µs per connection (the measuring end)


def _figures(start: float, cpu: float, count: int) -> Figures:
    return (count / (time.perf_counter() - start),
            (time.process_time() - cpu) / count * 1e6)


def _asyncio_round(kind: str, way: str, port: int, count: int) -> Figures:
    async def main() -> Figures:
        loop = asyncio.get_running_loop()
        if way == "installed":
            friendsock.install(loop)
        connect: Callable[[], Any] = (
            (lambda: friendsock.create_connection(_Client, "127.0.0.1", port)) if way == "friendsock"
            else (lambda: loop.create_connection(_Client, "127.0.0.1", port)))
        start, cpu = time.perf_counter(), time.process_time()
        for _ in range(count):
            _, protocol = await connect()
            await protocol.done
        return _figures(start, cpu, count)

    if kind == "uvloop":
        import uvloop
        return uvloop.run(main())
    return asyncio.run(main())


def _trio_round(way: str, port: int, count: int) -> Figures:
    import trio
    import friendsock.trio

    open_stream = friendsock.trio.open_tcp_stream if way == "friendsock" else trio.open_tcp_stream

    async def main() -> Figures:
        start, cpu = time.perf_counter(), time.process_time()
        for _ in range(count):
            stream = await open_stream("127.0.0.1", port)
            await stream.send_all(MESSAGE)
            await stream.receive_some(len(MESSAGE))
            await stream.aclose()
        return _figures(start, cpu, count)

    return trio.run(main)


def _blocking_round(way: str, port: int, count: int) -> Figures:
    if way == "patched":
        friendsock.patch_socket()
    try:
        start, cpu = time.perf_counter(), time.process_time()
        for _ in range(count):
            sock = socket.create_connection(("127.0.0.1", port))
            sock.sendall(MESSAGE)
            sock.recv(len(MESSAGE))
            sock.close()
        return _figures(start, cpu, count)
    finally:
        if way == "patched":
            friendsock.unpatch_socket()


# client -> (way without friendsock, then friendsock's ways)
WAYS: Dict[str, Tuple[str, ...]] = {
    "asyncio": ("own", "friendsock", "installed"),
    "uvloop": ("own", "friendsock", "installed"),
    "trio": ("own", "friendsock"),
    "blocking": ("own", "patched"),
}


def run_round(client: str, way: str, port: int, count: int) -> Figures:
    if client in ("asyncio", "uvloop"):
        return _asyncio_round(client, way, port, count)
    if client == "trio":
        return _trio_round(way, port, count)
    return _blocking_round(way, port, count)


def print_interleaved(label: str, ways: Sequence[str], run: Callable[[str, int], Figures],
                      count: int, rounds: int) -> None:
    """A warm-up round of ``ways[0]`` (the one without friendsock), then
    ``rounds`` rounds of every way (``run(way, count)``), the order turned
    round each round; printed per way: the medians, and over the first's."""
    results: Dict[str, List[Figures]] = {way: [] for way in ways}
    run(ways[0], count // 4)
    for index in range(rounds):
        for way in ways if index % 2 == 0 else tuple(reversed(ways)):
            results[way].append(run(way, count))
    own_rate = statistics.median(rate for rate, _ in results[ways[0]])
    own_cpu = statistics.median(cpu for _, cpu in results[ways[0]])
    for way in ways:
        rate = statistics.median(rate for rate, _ in results[way])
        cpu = statistics.median(cpu for _, cpu in results[way])
        print(f"{label:9} {way:11} {rate:>10,.0f}/s {rate / own_rate:6.2f} "
              f"{cpu:>7.1f}µs {cpu / own_cpu:6.2f}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--clients", default=",".join(WAYS))
    parser.add_argument("--count", type=int, default=1000, help="connections per round")
    parser.add_argument("--rounds", type=int, default=11)
    args = parser.parse_args()
    server = subprocess.Popen([sys.executable, "-c", SERVER], stdin=subprocess.PIPE,
                              stdout=subprocess.PIPE, text=True)
    try:
        port = int(server.stdout.readline())  # type: ignore[union-attr]
        print(f"{'client':9} {'way':11} {'connections':>12} {'x own':>6} {'CPU/conn':>9} {'x own':>6}")
        for client in args.clients.split(","):
            print_interleaved(client, WAYS[client],
                              lambda way, count, client=client: run_round(client, way, port, count),
                              args.count, args.rounds)
    finally:
        server.stdin.close()  # type: ignore[union-attr]
        server.wait(timeout=10)


if __name__ == "__main__":
    main()
