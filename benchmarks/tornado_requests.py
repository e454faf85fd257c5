"""tornado's HTTP client and server in one process, over TCP and over
friend links: requests per second, real tornado on both ends, switched on
as a user would (``patch_socket()`` and the loop installed, what
``python -m friendsock run --sockets`` does), on asyncio and uvloop.

Tests (``--tests``):

- ``requests``: ``SimpleAsyncHTTPClient.fetch`` of a 64 B body, one at a
  time; tornado's client opens a new connection for every request;
- ``keepalive``: one kept-alive connection, an ``IOStream`` writing an
  HTTP/1.1 GET and reading the response (headers, then Content-Length
  bytes), one at a time, to the same ``HTTPServer``.

One server per loop serves both paths: a round switches pairing on or off
(``friendsock.set_enabled``) and checks from ``friendsock.stats()`` that
its connections took the path it measures, and every response body is
checked. A cell is a warm-up round per path, then ``--rounds`` rounds of
``--seconds``, the paths interleaved; printed: the median, min-max, and
friends over TCP::

    python benchmarks/tornado_requests.py [--loops asyncio,uvloop]
        [--tests requests,keepalive] [--seconds 1] [--rounds 5]
"""

from __future__ import annotations

import argparse
import asyncio
import socket
import statistics
import time
from typing import Any, Callable, Dict, List, Tuple

import uvloop
from tornado import httpserver, iostream, netutil, simple_httpclient, web

import friendsock

BODY = b"x" * 64
REQUEST = b"GET / HTTP/1.1\r\nHost: bench\r\n\r\n"


class _Hello(web.RequestHandler):
    def get(self) -> None:
        self.write(BODY)

    def compute_etag(self) -> None:  # no hashing of the body on every response
        return None


def _check(body: bytes) -> None:
    if body != BODY:
        raise SystemExit(f"wrong body: {body[:80]!r}")


async def _requests(port: int, seconds: float) -> int:
    client = simple_httpclient.SimpleAsyncHTTPClient(force_instance=True)
    url = f"http://127.0.0.1:{port}/"
    done = 0
    deadline = time.perf_counter() + seconds
    try:
        while time.perf_counter() < deadline:
            _check((await client.fetch(url)).body)
            done += 1
    finally:
        client.close()
    return done


async def _keepalive(port: int, seconds: float) -> int:
    stream = await iostream.IOStream(socket.socket()).connect(("127.0.0.1", port))
    done = 0
    deadline = time.perf_counter() + seconds
    try:
        while time.perf_counter() < deadline:
            await stream.write(REQUEST)
            head = await stream.read_until(b"\r\n\r\n")
            length = next(int(line.split(b":", 1)[1]) for line in head.split(b"\r\n")
                          if line.lower().startswith(b"content-length:"))
            _check(await stream.read_bytes(length))
            done += 1
    finally:
        stream.close()
    return done


TESTS: Dict[str, Callable[[int, float], Any]] = {"requests": _requests, "keepalive": _keepalive}


async def _cell(test: str, seconds: float, rounds: int) -> Dict[bool, List[float]]:
    """Requests per second, by path (True: friends), warm-up dropped."""
    sockets = netutil.bind_sockets(0, "127.0.0.1")
    server = httpserver.HTTPServer(web.Application([("/", _Hello)]))
    server.add_sockets(sockets)
    port = sockets[0].getsockname()[1]
    # A server's first non-blocking connection is TCP (its listener has not
    # accepted yet): one before the rounds.
    client = simple_httpclient.SimpleAsyncHTTPClient(force_instance=True)
    _check((await client.fetch(f"http://127.0.0.1:{port}/")).body)
    client.close()
    figures: Dict[bool, List[float]] = {True: [], False: []}
    try:
        for round_ in range(rounds + 1):
            for friends in (True, False):
                friendsock.set_enabled(friends)
                before = friendsock.stats().links_made
                started = time.perf_counter()
                count = await TESTS[test](port, seconds)
                rate = count / (time.perf_counter() - started)
                paired = friendsock.stats().links_made - before
                if bool(paired) is not friends:
                    raise SystemExit(f"{test}: {paired} links on the {'friend' if friends else 'TCP'} path")
                if round_:
                    figures[friends].append(rate)
    finally:
        friendsock.set_enabled(True)
        server.stop()
        await server.close_all_connections()
    return figures


def _run(loop_kind: str, test: str, seconds: float, rounds: int) -> Dict[bool, List[float]]:
    loop = asyncio.new_event_loop() if loop_kind == "asyncio" else uvloop.new_event_loop()
    friendsock.install(loop)
    try:
        return loop.run_until_complete(_cell(test, seconds, rounds))
    finally:
        friendsock.uninstall(loop)
        loop.close()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--loops", default="asyncio,uvloop")
    parser.add_argument("--tests", default="requests,keepalive")
    parser.add_argument("--seconds", type=float, default=1.0)
    parser.add_argument("--rounds", type=int, default=5)
    args = parser.parse_args()
    friendsock.patch_socket()
    rows: List[Tuple[str, ...]] = []
    for loop_kind in args.loops.split(","):
        for test in args.tests.split(","):
            figures = _run(loop_kind, test, args.seconds, args.rounds)
            tcp = statistics.median(figures[False])
            for friends in (False, True):
                values = figures[friends]
                median = statistics.median(values)
                rows.append((loop_kind, test, "friends" if friends else "tcp", f"{median:,.0f} /s",
                             f"{min(values):,.0f}-{max(values):,.0f}", f"{median / tcp:.2f}"))
    print(f"{'loop':8} {'test':10} {'path':8} {'median':>12} {'min-max':>16} {'x TCP':>6}")
    for row in rows:
        print(f"{row[0]:8} {row[1]:10} {row[2]:8} {row[3]:>12} {row[4]:>16} {row[5]:>6}")


if __name__ == "__main__":
    main()
