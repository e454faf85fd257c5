"""CPU time per HTTP request with a new connection each time, real
libraries on both ends in one process, over TCP and with friendsock
installed (``friendsock.install()``, as the README switches it on): an
aiohttp or uvicorn server, and aiohttp's client (``force_close``: it
connects its own socket with ``sock_connect``, then hands it over) or a
plain asyncio streams client (``open_connection``, ``Connection: close``).

Each cell runs in a fresh interpreter; rounds alternate TCP and friends,
and the table shows the medians (µs of CPU per request, friends as a ratio
to TCP)::

    python benchmarks/http_connects.py
    python benchmarks/http_connects.py --loops uvloop --servers aiohttp --rounds 5
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import subprocess
import sys
import time
from typing import Any, Dict, List, Tuple

BODY = b"x" * 64
REQUEST = b"GET / HTTP/1.1\r\nHost: bench\r\nConnection: close\r\n\r\n"


async def _asgi_app(scope: Dict[str, Any], receive: Any, send: Any) -> None:
    if scope["type"] != "http":
        return
    await send({"type": "http.response.start", "status": 200,
                "headers": [(b"content-length", str(len(BODY)).encode())]})
    await send({"type": "http.response.body", "body": BODY})


async def _serve(server: str) -> Tuple[int, Any]:
    """A server on 127.0.0.1: its port, and how to stop it."""
    if server == "aiohttp":
        from aiohttp import web

        async def handler(request: Any) -> Any:
            return web.Response(body=BODY)

        app = web.Application()
        app.router.add_get("/", handler)
        runner = web.AppRunner(app, access_log=None)
        await runner.setup()
        site = web.TCPSite(runner, "127.0.0.1", 0)
        await site.start()
        return site._server.sockets[0].getsockname()[1], runner.cleanup  # type: ignore[union-attr]
    import uvicorn

    config = uvicorn.Config(_asgi_app, host="127.0.0.1", port=0, log_level="error",
                            lifespan="off", loop="none")
    served = uvicorn.Server(config)
    task = asyncio.ensure_future(served.serve())
    while not served.started:
        await asyncio.sleep(0.01)

    async def stop() -> None:
        served.should_exit = True
        await task

    return served.servers[0].sockets[0].getsockname()[1], stop


async def _measure(server: str, client: str, friends: bool, count: int, warmup: int) -> float:
    if friends:
        import friendsock

        friendsock.install()
    port, stop = await _serve(server)
    try:
        if client == "aiohttp":
            import aiohttp

            session = aiohttp.ClientSession(connector=aiohttp.TCPConnector(force_close=True))
            url = f"http://127.0.0.1:{port}/"

            async def one() -> None:
                async with session.get(url) as response:
                    assert await response.read() == BODY
        else:
            session = None

            async def one() -> None:
                reader, writer = await asyncio.open_connection("127.0.0.1", port)
                writer.write(REQUEST)
                assert (await reader.read()).endswith(BODY)
                writer.close()
                await writer.wait_closed()

        try:
            for _ in range(warmup):
                await one()
            started = time.process_time()
            for _ in range(count):
                await one()
            spent = time.process_time() - started
        finally:
            if session is not None:
                await session.close()
    finally:
        await stop()
    if friends:
        assert friendsock.stats().links_made >= count, "the requests did not pair"
    return spent / count * 1e6


def _one_cell(args: argparse.Namespace) -> None:
    friends = args.transport == "friends"
    coro = _measure(args.server, args.client, friends, args.count, args.warmup)
    if args.loop == "uvloop":
        import uvloop

        print(uvloop.run(coro))
    else:
        print(asyncio.run(coro))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--loops", default="asyncio,uvloop")
    parser.add_argument("--servers", default="aiohttp,uvicorn")
    parser.add_argument("--clients", default="aiohttp,streams")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--count", type=int, default=1000)
    parser.add_argument("--warmup", type=int, default=100)
    # One cell, in this interpreter (what the table's rounds run).
    parser.add_argument("--loop", help=argparse.SUPPRESS)
    parser.add_argument("--server", help=argparse.SUPPRESS)
    parser.add_argument("--client", help=argparse.SUPPRESS)
    parser.add_argument("--transport", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.transport is not None:
        _one_cell(args)
        return
    print("| loop | server | client | TCP µs | friends µs | TCP µs / friends µs |")
    print("|---|---|---|---|---|---|")
    for loop in args.loops.split(","):
        for server in args.servers.split(","):
            for client in args.clients.split(","):
                figures: Dict[str, List[float]] = {"tcp": [], "friends": []}
                for _ in range(args.rounds):
                    for transport in figures:
                        out = subprocess.run(
                            [sys.executable, __file__, "--loop", loop, "--server", server,
                             "--client", client, "--transport", transport,
                             "--count", str(args.count), "--warmup", str(args.warmup)],
                            check=True, capture_output=True, text=True)
                        figures[transport].append(float(out.stdout.split()[-1]))
                tcp = statistics.median(figures["tcp"])
                friends = statistics.median(figures["friends"])
                print(f"| {loop} | {server} | {client} | {tcp:.0f} | {friends:.0f} | "
                      f"{tcp / friends:.2f}× |", flush=True)


if __name__ == "__main__":
    main()
