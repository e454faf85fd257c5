"""N links on one loop, each a 64 B request/response exchange driven from
``data_received`` (as a protocol-level proxy runs, or the benchmark's
multi-rr): how late a timer on the same loop runs, and the longest loop
turn a 1 ms ticker sees.

    python benchmarks/busy_links.py --loop asyncio --links 512
    python benchmarks/busy_links.py --loop uvloop --links 512 --tcp

``--count K``: no timer; each link makes K round trips and the program
ends, for counting instructions per round trip (valgrind's callgrind: the
total at one K minus the total at another, over N times their
difference).
"""

from __future__ import annotations

import argparse
import asyncio
import time
from typing import Any, Dict, List

import friendsock

PAYLOAD = b"q" * 64


class Echo(asyncio.Protocol):
    def connection_made(self, transport: Any) -> None:
        self.transport = transport

    def data_received(self, data: bytes) -> None:
        self.transport.write(data)


class Requester(asyncio.Protocol):
    """The next request as soon as the answer to the last is in (one 64 B
    write each way: the answer arrives whole on both paths here), until
    ``left`` runs out or ``running`` is unset."""

    def __init__(self, shared: Dict[str, Any]) -> None:
        self.shared = shared
        self.left = shared["count"]

    def connection_made(self, transport: Any) -> None:
        self.transport = transport

    def data_received(self, data: bytes) -> None:
        shared = self.shared
        shared["done"] += 1
        self.left -= 1
        if shared["running"] and self.left:
            self.transport.write(PAYLOAD)
        elif not self.left:
            shared["finished"] += 1
            if shared["finished"] == shared["links"]:
                shared["all_done"].set_result(None)


async def main(links: int, friends: bool, count: int) -> None:
    loop = asyncio.get_running_loop()
    shared: Dict[str, Any] = {"count": count or -1, "done": 0, "running": True, "finished": 0, "links": links,
              "all_done": loop.create_future()}
    server = await friendsock.create_server(Echo, "127.0.0.1", 0, friends=friends)
    port = server.sockets[0].getsockname()[1]  # type: ignore[attr-defined]
    transports: List[Any] = []
    for _ in range(links):
        transport, _ = await friendsock.create_connection(
            lambda: Requester(shared), "127.0.0.1", port, friends=friends)
        assert friendsock.is_friend(transport) is friends
        transports.append(transport)
    for transport in transports:
        transport.write(PAYLOAD)
    if count:
        await shared["all_done"]
    else:
        await asyncio.sleep(0.2)
        gaps: List[float] = []
        last = [time.perf_counter()]

        def tick() -> None:
            now = time.perf_counter()
            gaps.append(now - last[0])
            last[0] = now
            if shared["running"]:
                loop.call_later(0.001, tick)

        loop.call_later(0.001, tick)
        done, started = shared["done"], time.perf_counter()
        await asyncio.sleep(0.5)
        slept = time.perf_counter() - started
        rate = (shared["done"] - done) / slept
        shared["running"] = False
        print(f"{type(loop).__module__.split('.')[0]} {'friends' if friends else 'TCP'} "
              f"{links} links: sleep(0.5) took {slept:.3f} s, longest turn {max(gaps):.3f} s, "
              f"{rate:,.0f} round trips/s")
    for transport in transports:
        transport.close()
    server.close()
    await server.wait_closed()


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--loop", choices=["asyncio", "uvloop"], default="asyncio")
    parser.add_argument("--links", type=int, default=256)
    parser.add_argument("--tcp", action="store_true", help="real TCP instead of friend links")
    parser.add_argument("--count", type=int, default=0, help="round trips per link, then end")
    args = parser.parse_args()
    coroutine = main(args.links, not args.tcp, args.count)
    if args.loop == "uvloop":
        import uvloop

        uvloop.run(coroutine)
    else:
        asyncio.run(coroutine)
