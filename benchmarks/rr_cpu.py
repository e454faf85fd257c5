"""CPU time per request/response round trip on one friend link: a client
protocol writes 64 B, an echo protocol writes it back, N times, and the
process's CPU time (not wall time: other load on the machine moves it much
less) is divided by N. For comparing two versions of friendsock's hot path
on a noisy machine, run alternately:

    PYTHONPATH=/path/to/old/tree python benchmarks/rr_cpu.py --loop asyncio
    python benchmarks/rr_cpu.py --loop asyncio --repeat 5
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import time

import friendsock


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


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--loop", choices=("asyncio", "uvloop"), default="asyncio")
    parser.add_argument("--count", type=int, default=20000)
    parser.add_argument("--size", type=int, default=64)
    parser.add_argument("--repeat", type=int, default=1)
    args = parser.parse_args()
    results = []
    for _ in range(args.repeat):
        run = microseconds_per_round_trip(args.count, args.size)
        if args.loop == "uvloop":
            import uvloop

            results.append(uvloop.run(run))
        else:
            results.append(asyncio.run(run))
    print(" ".join(f"{r:.2f}" for r in results), f"(median {statistics.median(results):.2f} µs CPU per round trip)")


if __name__ == "__main__":
    main()
