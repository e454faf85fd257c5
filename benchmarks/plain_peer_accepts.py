"""What friendsock costs a server whose clients do not run it: a client
process that never imports friendsock (plain uvloop) connects, writes
64 B, reads the 64 B echo and closes, again and again, to a server in
this process. Each door friendsock offers a server against the loop's own
``create_server``, interleaved in every round (the order turned round
each round):

- ``own``: the loop's own ``create_server``;
- ``friendsock``: ``friendsock.create_server``;
- ``installed``: the loop's own ``create_server`` under
  ``friendsock.install()``;
- ``looked-up``: not a door, a measure of one way a door could go: the
  loop's own ``create_server``, each connection's protocol first a
  stand-in that makes friendsock's look-ups for it as it learns of the
  connection (a connect of this process waiting for it? of another?),
  finds none, and hands the transport to the server's protocol: what the
  loop's own accept would cost with friendsock deciding after it.

Printed per loop and door, each the median over the rounds: connections
per second, and the server process's CPU time per connection (user and
system), each over the loop's own server's (1.00: no cost).

    python benchmarks/plain_peer_accepts.py [--loops asyncio,uvloop]
        [--count 1000] [--rounds 11]
"""

from __future__ import annotations

import argparse
import asyncio
import socket
import subprocess
import sys
import time
from typing import Any

import friendsock
from friendsock._core._registry import registry
from friendsock._core._stats import Fallback, counters
from friendsock._host._ports import connect_slot

from plain_peer_connects import Figures, print_interleaved

# The client: plain uvloop, no friendsock imported. "PORT COUNT" on its
# standard input runs COUNT connections to PORT, then prints a line.
CLIENT = r"""
import asyncio, sys
import uvloop

MESSAGE = b"m" * 64

class Client(asyncio.Protocol):
    def __init__(self, done):
        self.done = done
    def connection_made(self, transport):
        self.transport = transport
        transport.write(MESSAGE)
    def data_received(self, data):
        self.transport.close()
    def connection_lost(self, exc):
        self.done.set_result(None)

async def main():
    loop = asyncio.get_running_loop()
    while line := await loop.run_in_executor(None, sys.stdin.readline):
        port, count = map(int, line.split())
        for _ in range(count):
            done = loop.create_future()
            await loop.create_connection(lambda: Client(done), "127.0.0.1", port)
            await done
        print("done", flush=True)

uvloop.run(main())
"""


class _Echo(asyncio.Protocol):
    def connection_made(self, transport: Any) -> None:
        self.transport = transport

    def data_received(self, data: bytes) -> None:
        self.transport.write(data)


class _LookedUp(asyncio.Protocol):
    """The ``looked-up`` way's stand-in (see the module's text)."""

    def __init__(self, port: int) -> None:
        self.port = port

    def connection_made(self, transport: Any) -> None:
        address = transport.get_extra_info("peername")
        if registry.pending_count() or connect_slot(address, self.port) is not None:
            raise AssertionError("a plain client's connection would have paired")
        counters.fallback(Fallback.PEER_NOT_FRIEND, ("127.0.0.1", self.port))
        protocol = _Echo()
        transport.set_protocol(protocol)
        protocol.connection_made(transport)


WAYS = ("own", "friendsock", "installed", "looked-up")


def run_round(loop_name: str, way: str, client: subprocess.Popen, count: int) -> Figures:
    async def main() -> Figures:
        loop = asyncio.get_running_loop()
        if way == "installed":
            friendsock.install(loop)
        create = friendsock.create_server if way == "friendsock" else loop.create_server
        if way == "looked-up":
            listener = socket.create_server(("127.0.0.1", 0), backlog=1024)
            port = listener.getsockname()[1]
            server = await create(lambda: _LookedUp(port), sock=listener, backlog=1024)
        else:
            server = await create(_Echo, "127.0.0.1", 0, backlog=1024)
        port = server.sockets[0].getsockname()[1]
        start, cpu = time.perf_counter(), time.process_time()
        client.stdin.write(f"{port} {count}\n")  # type: ignore[union-attr]
        client.stdin.flush()  # type: ignore[union-attr]
        done = await loop.run_in_executor(None, client.stdout.readline)  # type: ignore[union-attr]
        figures = (count / (time.perf_counter() - start), (time.process_time() - cpu) / count * 1e6)
        assert done.strip() == "done", done
        server.close()
        await server.wait_closed()
        return figures

    if loop_name == "uvloop":
        import uvloop
        return uvloop.run(main())
    return asyncio.run(main())


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--loops", default="asyncio,uvloop")
    parser.add_argument("--count", type=int, default=1000, help="connections per round")
    parser.add_argument("--rounds", type=int, default=11)
    args = parser.parse_args()
    client = subprocess.Popen([sys.executable, "-c", CLIENT], stdin=subprocess.PIPE,
                              stdout=subprocess.PIPE, text=True)
    try:
        print(f"{'server':9} {'way':11} {'connections':>12} {'x own':>6} {'CPU/conn':>9} {'x own':>6}")
        for loop_name in args.loops.split(","):
            print_interleaved(loop_name, WAYS,
                              lambda way, count, name=loop_name: run_round(name, way, client, count),
                              args.count, args.rounds)
    finally:
        client.stdin.close()  # type: ignore[union-attr]
        client.wait(timeout=10)


if __name__ == "__main__":
    main()
