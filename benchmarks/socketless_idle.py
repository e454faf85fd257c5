"""Idle socketless links in one process: how many, with how few descriptors.

Opens N socketless links (``friendsock.set_socketless(True)``) to one
friendsock server under a soft RLIMIT_NOFILE of 20,000 (real TCP would need
2N descriptors and runs out of ephemeral ports at ~28,000 per client
address), reports the heap per link (tracemalloc, both ends) and the
descriptors open, then closes them all and reports what is left:

    python benchmarks/socketless_idle.py --links 100000 [--loop uvloop]
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import os
import resource
import time
import tracemalloc

import friendsock


class Idle(asyncio.Protocol):
    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport


async def run(links: int) -> None:
    server = await friendsock.create_server(Idle, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    gc.collect()
    tracemalloc.start()
    base = tracemalloc.get_traced_memory()[0]
    started = time.perf_counter()
    clients = []
    for _ in range(links):
        transport, _ = await friendsock.create_connection(Idle, "127.0.0.1", port)
        clients.append(transport)
    await asyncio.sleep(0.1)
    heap = tracemalloc.get_traced_memory()[0] - base
    stats = friendsock.stats()
    print(f"{links:,} links in {time.perf_counter() - started:.1f} s (under tracemalloc): "
          f"{stats.links_alive:,} alive, {len(os.listdir('/proc/self/fd'))} descriptors open, "
          f"{heap / links:,.0f} B heap per link (both ends)")
    for transport in clients:
        transport.close()
    del clients
    for _ in range(5):
        await asyncio.sleep(0)
    server.close()
    await server.wait_closed()
    gc.collect()
    left = tracemalloc.get_traced_memory()[0] - base
    print(f"all closed: {friendsock.stats().links_alive} alive, "
          f"{left / links:,.0f} B heap per link not given back")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--links", type=int, default=100_000)
    parser.add_argument("--loop", choices=("asyncio", "uvloop"), default="asyncio")
    args = parser.parse_args()
    hard = resource.getrlimit(resource.RLIMIT_NOFILE)[1]
    resource.setrlimit(resource.RLIMIT_NOFILE, (min(20_000, hard), hard))
    friendsock.set_socketless(True)
    if args.loop == "uvloop":
        import uvloop

        uvloop.run(run(args.links))
    else:
        asyncio.run(run(args.links))


if __name__ == "__main__":
    main()
