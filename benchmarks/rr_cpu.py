"""CPU time per request/response round trip on one friend link: a client
protocol writes 64 B, an echo protocol writes it back, N times, and the
process's CPU time (not wall time: other load on the machine moves it much
less) is divided by N. ``--streams``: the same through asyncio's streams
(StreamReader/StreamWriter); ``--floor``: over the benchmark's in-memory
floor instead of a friend link. For comparing two versions of friendsock's
hot path on a noisy machine, run alternately:

    PYTHONPATH=/path/to/old/tree python benchmarks/rr_cpu.py --loop asyncio
    python benchmarks/rr_cpu.py --loop asyncio --repeat 5

or count instructions, which do not move between runs (valgrind's
callgrind; user space only): the total at one count minus the total at
another, over their difference:

    valgrind --tool=callgrind --callgrind-out-file=/dev/null \
        python benchmarks/rr_cpu.py --streams --loop uvloop --count 4000
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import time

import friendsock
from friendsock._bench._floor import FloorEndpoint


class Echo(asyncio.Protocol):
    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport

    def data_received(self, data: bytes) -> None:
        self.transport.write(data)  # type: ignore[attr-defined]


class Client(asyncio.Protocol):
    def __init__(self, count: int, size: int) -> None:
        self.left = count
        self.message = b"x" * size
        self.done = asyncio.get_running_loop().create_future()

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport

    def data_received(self, data: bytes) -> None:
        self.left -= 1
        if self.left:
            self.transport.write(self.message)  # type: ignore[attr-defined]
        else:
            self.done.set_result(None)


async def microseconds_per_round_trip(count: int, size: int) -> float:
    server = await friendsock.create_server(Echo, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    transport, client = await friendsock.create_connection(
        lambda: Client(count, size), "127.0.0.1", port)
    assert friendsock.is_friend(transport)
    started = time.process_time()
    transport.write(client.message)
    await client.done
    spent = time.process_time() - started
    transport.close()
    server.close()
    return spent / count * 1e6


async def microseconds_per_streams_round_trip(count: int, size: int, floor: bool) -> float:
    """As the benchmark's streams-rr: write, drain, readexactly."""
    finished = asyncio.get_running_loop().create_future()

    async def echo(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        length = int.from_bytes(await reader.readexactly(4), "big")  # the client's size, sent first
        try:
            while True:
                writer.write(await reader.readexactly(length))
                await writer.drain()
        except asyncio.IncompleteReadError:
            pass
        finally:
            writer.close()
            finished.set_result(None)

    if floor:
        endpoint = FloorEndpoint()
        await endpoint.serve_streams(echo)
        reader, writer = await endpoint.open()
    else:
        server = await friendsock.start_server(echo, "127.0.0.1", 0)
        port = server.sockets[0].getsockname()[1]
        reader, writer = await friendsock.open_connection("127.0.0.1", port)
        assert friendsock.is_friend(writer.transport)
    writer.write(size.to_bytes(4, "big"))
    message = b"s" * size
    for _ in range(min(count, 500)):  # warm-up
        writer.write(message)
        await writer.drain()
        await reader.readexactly(size)
    started = time.process_time()
    for _ in range(count):
        writer.write(message)
        await writer.drain()
        await reader.readexactly(size)
    spent = time.process_time() - started
    writer.close()
    await finished
    if not floor:
        server.close()
    return spent / count * 1e6


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--loop", choices=("asyncio", "uvloop"), default="asyncio")
    parser.add_argument("--count", type=int, default=20000)
    parser.add_argument("--size", type=int, default=64)
    parser.add_argument("--repeat", type=int, default=1)
    parser.add_argument("--streams", action="store_true",
                        help="through StreamReader/StreamWriter (open_connection/start_server)")
    parser.add_argument("--floor", action="store_true",
                        help="over the in-memory floor, not a friend link (with --streams)")
    args = parser.parse_args()
    if args.floor and not args.streams:
        parser.error("--floor goes with --streams")
    results = []
    for _ in range(args.repeat):
        if args.streams:
            run = microseconds_per_streams_round_trip(args.count, args.size, args.floor)
        else:
            run = microseconds_per_round_trip(args.count, args.size)
        if args.loop == "uvloop":
            import uvloop

            results.append(uvloop.run(run))
        else:
            results.append(asyncio.run(run))
    print(" ".join(f"{r:.2f}" for r in results), f"(median {statistics.median(results):.2f} µs CPU per round trip)")


if __name__ == "__main__":
    main()
