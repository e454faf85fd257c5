"""Real components with blocking sockets in threads, one process.

Friend path: ``patch_socket()`` and installed loops; real TCP: neither.
"""

from __future__ import annotations

import asyncio
import hashlib
import http.client
import http.server
import os
import socket
import socketserver
import threading
import urllib.request
from typing import Any, Iterator, List

import aiohttp
import httpx
import pytest
import requests
import uvicorn
import uvloop
from aiohttp import web

import friendsock
from support import run_on
from test_blocking import TIMEOUT, ServerLoop, patched, run_thread  # noqa: F401 (a fixture)


@pytest.fixture(params=["asyncio", "uvloop"])
def server_loop(request, patched) -> Iterator[ServerLoop]:
    """A loop in another thread; installed on the friend path."""
    side = ServerLoop(request.param)
    if patched:
        side.run(_install())
    try:
        yield side
    finally:
        side.close()
    assert side.errors == []


async def _install() -> None:
    friendsock.install()


def _links() -> int:
    return friendsock.stats().links_made


# -- http.client, urllib and requests against uvicorn and aiohttp ----------------


async def _asgi_app(scope: dict, receive: Any, send: Any) -> None:
    assert scope["type"] == "http"
    body = b""
    while True:
        message = await receive()
        body += message.get("body", b"")
        if not message.get("more_body"):
            break
    reply = body or b"hello"
    await send({"type": "http.response.start", "status": 200,
                "headers": [(b"content-length", str(len(reply)).encode())]})
    await send({"type": "http.response.body", "body": reply})


class _StartedServer(uvicorn.Server):
    def __init__(self, config: uvicorn.Config) -> None:
        super().__init__(config)
        self.listening = threading.Event()

    async def startup(self, sockets: Any = None) -> None:
        await super().startup(sockets=sockets)
        self.listening.set()


def test_http_client_and_urllib_against_uvicorn(patched, server_loop):
    config = uvicorn.Config(_asgi_app, host="127.0.0.1", port=0, loop="none", lifespan="off",
                            log_config=None, log_level="warning", access_log=False)
    server = _StartedServer(config)
    serving = asyncio.run_coroutine_threadsafe(server.serve(), server_loop.loop)
    try:
        assert server.listening.wait(TIMEOUT)
        port = server.servers[0].sockets[0].getsockname()[1]
        before = _links()
        body = os.urandom(1 << 20)
        connection = http.client.HTTPConnection("127.0.0.1", port, timeout=TIMEOUT)
        try:
            for _ in range(3):  # one kept-alive connection
                connection.request("POST", "/", body=body)
                response = connection.getresponse()
                assert response.status == 200 and response.read() == body
            assert friendsock.is_friend(connection.sock) is patched
        finally:
            connection.close()
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/", timeout=TIMEOUT) as response:
            assert response.read() == b"hello"
        assert _links() - before == (2 if patched else 0)
    finally:
        server.should_exit = True
        serving.result(TIMEOUT * 3)


def test_requests_against_aiohttp(patched, server_loop):
    async def echo(request: web.Request) -> web.Response:
        return web.Response(body=await request.read() or b"hello")

    async def start() -> web.AppRunner:
        app = web.Application(client_max_size=8 << 20)
        app.router.add_route("*", "/", echo)
        runner = web.AppRunner(app, access_log=None)
        await runner.setup()
        await web.TCPSite(runner, "127.0.0.1", 0).start()
        return runner

    runner = server_loop.run(start())
    try:
        port = runner.addresses[0][1]
        before = _links()
        body = os.urandom(1 << 20)
        with requests.Session() as session:
            for _ in range(3):  # a pooled connection, polled by urllib3 before each reuse
                response = session.post(f"http://127.0.0.1:{port}/", data=body, timeout=TIMEOUT)
                assert response.status_code == 200 and response.content == body
            assert session.get(f"http://127.0.0.1:{port}/", timeout=TIMEOUT).content == b"hello"
        assert _links() - before == (1 if patched else 0)
    finally:
        server_loop.run(runner.cleanup())


# -- a patched ThreadingHTTPServer against http.client, httpx and asyncio --------


class _EchoHandler(http.server.BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"

    def do_POST(self) -> None:
        body = self.rfile.read(int(self.headers["Content-Length"]))
        self.send_response(200)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args: Any) -> None:
        pass


@pytest.fixture
def http_server(patched) -> Iterator[int]:
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _EchoHandler)
    server.daemon_threads = True
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield server.server_address[1]
    finally:
        server.shutdown()
        server.server_close()
        thread.join(TIMEOUT)


def test_threading_http_server_with_http_client(patched, http_server):
    before = _links()
    connection = http.client.HTTPConnection("127.0.0.1", http_server, timeout=TIMEOUT)
    try:
        for size in (0, 100, 1 << 20):
            body = os.urandom(size)
            connection.request("POST", "/", body=body)
            response = connection.getresponse()
            assert response.status == 200 and response.read() == body
        assert friendsock.is_friend(connection.sock) is patched
    finally:
        connection.close()
    assert _links() - before == (1 if patched else 0)


@pytest.mark.parametrize("loop_kind", ["asyncio", "uvloop"])
def test_threading_http_server_with_httpx_and_asyncio(patched, http_server, loop_kind):
    base = asyncio.new_event_loop if loop_kind == "asyncio" else uvloop.new_event_loop

    async def main() -> None:
        body = os.urandom(1 << 20)
        async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{http_server}") as client:
            for _ in range(2):
                response = await client.post("/", content=body)
                assert response.status_code == 200 and response.content == body
        reader, writer = await asyncio.open_connection("127.0.0.1", http_server)
        assert friendsock.is_friend(writer) is patched
        writer.write(b"POST / HTTP/1.1\r\nHost: x\r\nContent-Length: 4\r\nConnection: close\r\n\r\nping")
        reply = await asyncio.wait_for(reader.read(), TIMEOUT)
        assert reply.startswith(b"HTTP/1.0 200") or reply.startswith(b"HTTP/1.1 200")
        assert reply.endswith(b"\r\n\r\nping")
        writer.close()
        await writer.wait_closed()

    before = _links()
    factory = (lambda: friendsock.new_event_loop(base)) if patched else base
    run_on(factory, asyncio.wait_for(main(), TIMEOUT * 2))
    assert _links() - before == (2 if patched else 0)


@pytest.mark.parametrize("loop_kind", ["asyncio", "uvloop"])
def test_threading_http_server_with_aiohttp_client(patched, http_server, loop_kind):
    """aiohttp's connector connects a socket of its own (``sock_connect``),
    then hands it over (``create_connection(sock=)``): the patched server's
    accept, which comes first, holds the connection until the handover."""
    base = asyncio.new_event_loop if loop_kind == "asyncio" else uvloop.new_event_loop

    async def main() -> None:
        body = os.urandom(1 << 20)
        async with aiohttp.ClientSession() as session:
            for _ in range(2):  # the second reuses the pooled connection
                async with session.post(f"http://127.0.0.1:{http_server}/", data=body) as response:
                    assert response.status == 200
                    assert await response.read() == body

    before = _links()
    factory = (lambda: friendsock.new_event_loop(base)) if patched else base
    run_on(factory, asyncio.wait_for(main(), TIMEOUT * 2))
    assert _links() - before == (1 if patched else 0)


class _OneRequestHandler(_EchoHandler):
    """Answers one request as if the connection stayed open (HTTP/1.1, no
    ``Connection: close``), then closes it: a server whose keep-alive
    timeout ended an idle connection."""

    def handle(self) -> None:
        self.handle_one_request()


class _ClosingServer(http.server.ThreadingHTTPServer):
    daemon_threads = True

    def __init__(self) -> None:
        super().__init__(("127.0.0.1", 0), _OneRequestHandler)
        self.closed_one = threading.Event()

    def shutdown_request(self, request: Any) -> None:
        super().shutdown_request(request)  # its FIN sent, as over TCP
        self.closed_one.set()


@pytest.mark.parametrize("loop_kind", ["asyncio", "uvloop"])
def test_httpx_drops_a_pooled_connection_its_threading_server_closed(patched, loop_kind):
    """httpcore learns that the server closed a pooled connection by
    polling the connection's descriptor: readable, it opens a new one
    instead of sending the next request into a closed connection (which
    fails "Server disconnected without sending a response")."""
    server = _ClosingServer()
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    base = asyncio.new_event_loop if loop_kind == "asyncio" else uvloop.new_event_loop

    async def main() -> None:
        async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{server.server_address[1]}") as client:
            for body in (b"first", b"second", b"third"):
                server.closed_one.clear()
                response = await client.post("/", content=body)
                assert response.status_code == 200 and response.content == body
                assert await asyncio.to_thread(server.closed_one.wait, TIMEOUT)

    before = _links()
    factory = (lambda: friendsock.new_event_loop(base)) if patched else base
    try:
        run_on(factory, asyncio.wait_for(main(), TIMEOUT * 2))
    finally:
        server.shutdown()
        server.server_close()
        thread.join(TIMEOUT)
    assert _links() - before == (3 if patched else 0)


# -- socketserver: 64 client threads at once -----------------------------------


class _Echo(socketserver.BaseRequestHandler):
    def handle(self) -> None:
        while data := self.request.recv(65536):
            self.request.sendall(data)


class _EchoServer(socketserver.ThreadingTCPServer):
    # Room for every client at once: with the default backlog of 5, TCP
    # itself resets some of 64 simultaneous connects.
    request_queue_size = 128


def test_socketserver_echo_under_64_client_threads(patched):
    server = _EchoServer(("127.0.0.1", 0), _Echo)
    server.daemon_threads = True
    serving = threading.Thread(target=server.serve_forever, daemon=True)
    serving.start()
    results: List[Any] = []

    def client(seed: int) -> None:
        payload = os.urandom(50_000 + seed * 997)
        with socket.create_connection(server.server_address, timeout=TIMEOUT) as sock:
            writer = run_thread(lambda: (sock.sendall(payload), sock.shutdown(socket.SHUT_WR)))
            digest = hashlib.sha256()
            while chunk := sock.recv(65536):
                digest.update(chunk)
            writer()
            results.append((digest.digest() == hashlib.sha256(payload).digest(),
                             friendsock.is_friend(sock)))

    before = _links()
    try:
        joins = [run_thread(lambda seed=seed: client(seed)) for seed in range(64)]
        for join in joins:
            join()
    finally:
        server.shutdown()
        server.server_close()
        serving.join(TIMEOUT)
    assert results == [(True, patched)] * 64
    assert _links() - before == (64 if patched else 0)
