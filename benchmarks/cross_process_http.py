"""HTTP between two processes with aiohttp at both ends, over TCP and
moved off it: an aiohttp server in one process and aiohttp's client in
another, both with friendsock installed (as ``FRIENDSOCK_INSTALL=1`` does);
the TCP rounds switch cross-process moves off in the client
(``set_cross_process(False)``).

aiohttp's client connects a socket of its own (``loop.sock_connect``) and
hands it to ``create_connection(sock=)``. Three workloads, each a client
process timing its requests one after another (wall clock):

- ``get``: GET of a 64-byte body on one kept connection (request/response);
- ``post``: POST of 1 MiB echoed back, on one kept connection (a stream);
- ``close``: GET of 64 bytes on a new connection each time (``force_close``).

Rounds alternate TCP and friends; the table shows the medians (requests a
second, friends as a ratio to TCP)::

    python benchmarks/cross_process_http.py
    python benchmarks/cross_process_http.py --loops uvloop --tests get,post --rounds 7
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import subprocess
import sys
import time
from typing import Any, Dict, List

BODY = b"x" * 64
POSTED = os.urandom(1 << 20)
COUNTS = {"get": 2000, "post": 100, "close": 500}


def _run(loop: str, main: Any) -> Any:
    if loop == "uvloop":
        import uvloop

        return uvloop.run(main)
    return asyncio.run(main)


async def _serve() -> None:
    from aiohttp import web

    import friendsock

    friendsock.install()

    async def get(request: Any) -> Any:
        return web.Response(body=BODY)

    async def post(request: Any) -> Any:
        return web.Response(body=await request.read())

    app = web.Application(client_max_size=1 << 30)
    app.router.add_get("/", get)
    app.router.add_post("/", post)
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    print(runner.addresses[0][1], flush=True)
    await asyncio.get_running_loop().run_in_executor(None, sys.stdin.read)
    await runner.cleanup()


async def _measure(port: int, test: str, friends: bool, count: int) -> float:
    import io

    import aiohttp

    import friendsock

    friendsock.install()
    friendsock.set_cross_process(friends)
    url = f"http://127.0.0.1:{port}/"
    connector = aiohttp.TCPConnector(force_close=test == "close")
    async with aiohttp.ClientSession(connector=connector) as session:

        async def one() -> None:
            if test == "post":
                async with session.post(url, data=io.BytesIO(POSTED)) as response:
                    assert len(await response.read()) == len(POSTED)
            else:
                async with session.get(url) as response:
                    assert await response.read() == BODY

        for _ in range(max(1, count // 10)):
            await one()
        started = time.perf_counter()
        for _ in range(count):
            await one()
        spent = time.perf_counter() - started
    moved = friendsock.stats().cross_process
    assert (moved > 0) is friends, f"{moved} connections moved"
    return count / spent


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--loops", default="asyncio,uvloop")
    parser.add_argument("--tests", default="get,post,close")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--scale", type=float, default=1.0, help="request counts times this")
    # A process of the run (the server, or one round's client).
    parser.add_argument("--serve", help=argparse.SUPPRESS)
    parser.add_argument("--client", nargs=4, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.serve is not None:
        _run(args.serve, _serve())
        return
    if args.client is not None:
        loop, port, test, transport = args.client
        print(_run(loop, _measure(int(port), test, transport == "friends",
                                  max(1, int(COUNTS[test] * args.scale)))))
        return
    print("| loop | test | TCP req/s | friends req/s | friends / TCP |")
    print("|---|---|---|---|---|")
    for loop in args.loops.split(","):
        server = subprocess.Popen([sys.executable, __file__, "--serve", loop],
                                  stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
        try:
            assert server.stdout is not None
            port = server.stdout.readline().strip()
            for test in args.tests.split(","):
                figures: Dict[str, List[float]] = {"tcp": [], "friends": []}
                for _ in range(args.rounds):
                    for transport in figures:
                        out = subprocess.run(
                            [sys.executable, __file__, "--client", loop, port, test, transport,
                             "--scale", str(args.scale)],
                            check=True, capture_output=True, text=True)
                        figures[transport].append(float(out.stdout.split()[-1]))
                tcp = statistics.median(figures["tcp"])
                friends = statistics.median(figures["friends"])
                print(f"| {loop} | {test} | {tcp:,.0f} | {friends:,.0f} | {friends / tcp:.2f}× |",
                      flush=True)
        finally:
            server.communicate("", timeout=30)


if __name__ == "__main__":
    main()
