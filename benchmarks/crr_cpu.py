"""CPU time per connect/request/response/close, split into user and system
time: a client connects, writes 64 B, reads the 64 B answer and closes,
N times in a row, over real TCP (the loop's own transports), friend links
and socketless links. CPU time, not wall time: other load on the machine
moves it much less. For comparing two versions of friendsock's set-up path,
run alternately:

    PYTHONPATH=/path/to/old/tree python benchmarks/crr_cpu.py --loop uvloop
    python benchmarks/crr_cpu.py --loop uvloop --repeat 5

``friends`` connects as a program does, one connection after another to
one server: each link goes over the connection the one before left to the
listener (a reused connection, see the README). ``new-conns`` is friends
with every connection a new one, as when a program has its sockets (no
connection is kept then).

``kernel`` is the kernel's share of a friend connection alone, with no
transport and no loop: a connect to a listener, its accept and an abortive
close of both sockets, in a bare Python loop. A friend connection with real
sockets costs at least that much; TCP's figure over it bounds what friends
with real sockets can reach in ``crr``.
"""

from __future__ import annotations

import argparse
import asyncio
import resource
import socket
import statistics
import struct
from typing import Any, Callable, Dict, List, Optional, Tuple

import friendsock
from friendsock import _handshake

SIZE = 64


class Server(asyncio.Protocol):
    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport

    def data_received(self, data: bytes) -> None:
        self.transport.write(data)  # type: ignore[attr-defined]


class Client(asyncio.Protocol):
    def __init__(self) -> None:
        loop = asyncio.get_running_loop()
        self.answered = loop.create_future()
        self.lost = loop.create_future()

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        transport.write(b"c" * SIZE)  # type: ignore[attr-defined]

    def data_received(self, data: bytes) -> None:
        if not self.answered.done():
            self.answered.set_result(None)

    def connection_lost(self, exc: Optional[BaseException]) -> None:
        if not self.lost.done():
            self.lost.set_result(None)


def microseconds_per_kernel_part(count: int) -> Tuple[float, float]:
    """(user, system) CPU microseconds per connection of the kernel's part
    of a friend connection: socket, connect, accept, an abortive close."""
    abort = struct.pack("ii", 1, 0)
    with socket.create_server(("127.0.0.1", 0)) as listener:
        address = listener.getsockname()

        def one() -> None:
            client = socket.socket()
            client.connect(address)
            server, _ = listener.accept()
            client.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, abort)
            client.close()
            server.close()

        for _ in range(min(count, 200)):  # warm-up
            one()
        before = resource.getrusage(resource.RUSAGE_SELF)
        for _ in range(count):
            one()
        after = resource.getrusage(resource.RUSAGE_SELF)
    return ((after.ru_utime - before.ru_utime) / count * 1e6,
            (after.ru_stime - before.ru_stime) / count * 1e6)


async def microseconds_per_crr(transport: str, count: int) -> Tuple[float, float]:
    """(user, system) CPU microseconds per connection."""
    loop = asyncio.get_running_loop()
    friendsock.set_socketless(transport == "socketless")
    kept_per_listener = _handshake.KEPT_PER_LISTENER
    if transport == "new-conns":
        _handshake.KEPT_PER_LISTENER = 0
    try:
        connect: Callable[..., Any]
        if transport == "tcp":
            server = await loop.create_server(Server, "127.0.0.1", 0)
            connect = loop.create_connection
        else:
            server = await friendsock.create_server(Server, "127.0.0.1", 0)
            connect = friendsock.create_connection
        port = server.sockets[0].getsockname()[1]

        async def one() -> None:
            link, client = await connect(Client, "127.0.0.1", port)
            assert friendsock.is_friend(link) is (transport != "tcp")
            await client.answered
            link.close()
            await client.lost

        for _ in range(min(count, 200)):  # warm-up
            await one()
        before = resource.getrusage(resource.RUSAGE_SELF)
        for _ in range(count):
            await one()
        after = resource.getrusage(resource.RUSAGE_SELF)
        server.close()
        await server.wait_closed()
    finally:
        friendsock.set_socketless(False)
        _handshake.KEPT_PER_LISTENER = kept_per_listener
    return ((after.ru_utime - before.ru_utime) / count * 1e6,
            (after.ru_stime - before.ru_stime) / count * 1e6)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--loop", choices=("asyncio", "uvloop"), default="asyncio")
    parser.add_argument("--count", type=int, default=3000, help="connections per measurement")
    parser.add_argument("--repeat", type=int, default=3, help="measurements (median)")
    parser.add_argument("--transports", default="tcp,friends,new-conns,socketless,kernel")
    args = parser.parse_args()
    if args.loop == "uvloop":
        import uvloop

        run: Callable[[Any], Any] = uvloop.run
    else:
        run = asyncio.run
    transports = args.transports.split(",")
    results: Dict[str, List[Tuple[float, float]]] = {t: [] for t in transports}
    for _ in range(args.repeat):  # interleaved: a noisy machine hits each alike
        for transport in transports:
            if transport == "kernel":
                results[transport].append(microseconds_per_kernel_part(args.count))
            else:
                results[transport].append(run(microseconds_per_crr(transport, args.count)))
    print(f"{args.loop}: CPU us per connect/request/response/close (median of {args.repeat})")
    for transport, values in results.items():
        user = statistics.median(v[0] for v in values)
        system = statistics.median(v[1] for v in values)
        total = statistics.median(v[0] + v[1] for v in values)
        print(f"  {transport:10s} total {total:7.1f}   user {user:7.1f}   system {system:7.1f}")


if __name__ == "__main__":
    main()
