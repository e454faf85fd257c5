"""Third-party servers and clients on a loop with friendsock installed, each
in this one process: they pair (friendsock.stats() / is_friend on the server
side) and every byte arrives as sent. The last cases reach a server in
another process and are reached from one: real TCP, counted as fallbacks.

Every test runs on asyncio and on uvloop (see conftest).
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import io
import os
import random
import socket
import ssl
import sys
from typing import AsyncIterator, List, Optional, Tuple

import aiohttp
import httpx
import pytest
import pytest_asyncio
import trustme
import uvicorn
from aiohttp import web
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import PlainTextResponse, Response, StreamingResponse
from starlette.routing import Route
from websockets.asyncio.client import connect as ws_connect
from websockets.asyncio.server import serve as ws_serve

import friendsock
from support import tls_contexts


@pytest_asyncio.fixture
async def installed_loop() -> AsyncIterator[asyncio.AbstractEventLoop]:
    """Friend links on the test's loop, as an application would turn them on."""
    with friendsock.installed() as loop:
        yield loop


def stream_chunks(seed: int) -> List[bytes]:
    rng = random.Random(seed)
    return [rng.randbytes(rng.choice([1, 17, 4096, 65536, 200_000])) for _ in range(40)]


# -- aiohttp -------------------------------------------------------------------


class HostPortConnector(aiohttp.TCPConnector):
    """aiohttp's connector, but connecting with ``loop.create_connection(host,
    port)`` rather than handing the loop a socket aiohappyeyeballs already
    connected with ``loop.sock_connect`` (``sock=``): both pair."""

    async def _wrap_create_connection(self, *args, addr_infos, req, timeout, client_error=aiohttp.ClientConnectorError,
                                      **kwargs):
        host, port = addr_infos[0][4][:2]
        try:
            return await self._loop.create_connection(*args, host=host, port=port, **kwargs)
        except OSError as exc:
            raise client_error(req.connection_key, exc) from exc


@contextlib.asynccontextmanager
async def aiohttp_server(ssl_context: Optional[ssl.SSLContext] = None) -> AsyncIterator[Tuple[str, List[bool]]]:
    """An aiohttp app on web.AppRunner + web.TCPSite (HTTPS with
    ``ssl_context``); yields (base URL, is_friend of each request's
    server-side transport)."""
    server_side: List[bool] = []

    @web.middleware
    async def record(request, handler):
        server_side.append(friendsock.is_friend(request.transport))
        return await handler(request)

    async def hello(request):
        return web.Response(text="hello from aiohttp")

    async def echo(request):
        received = await request.read()
        return web.Response(body=received, headers={"X-Request-SHA256": hashlib.sha256(received).hexdigest()})

    async def stream(request):
        response = web.StreamResponse()
        response.enable_chunked_encoding()
        await response.prepare(request)
        for chunk in stream_chunks(int(request.query["seed"])):
            await response.write(chunk)
        await response.write_eof()
        return response

    app = web.Application(middlewares=[record], client_max_size=8 * 2 ** 20)
    app.router.add_get("/", hello)
    app.router.add_post("/echo", echo)
    app.router.add_get("/stream", stream)
    runner = web.AppRunner(app)
    await runner.setup()
    try:
        site = web.TCPSite(runner, "127.0.0.1", 0, ssl_context=ssl_context)
        await site.start()
        port = runner.addresses[0][1]
        scheme = "https" if ssl_context is not None else "http"
        yield f"{scheme}://127.0.0.1:{port}", server_side
    finally:
        await runner.cleanup()


@pytest.mark.parametrize("connector", ["host-port", "default"])
async def test_aiohttp(installed_loop, connector):
    before = friendsock.stats()
    body = os.urandom(4 * 2 ** 20)
    async with aiohttp_server() as (url, server_side):
        session_connector = HostPortConnector() if connector == "host-port" else aiohttp.TCPConnector()
        async with aiohttp.ClientSession(connector=session_connector) as session:
            async with session.get(url + "/") as response:
                assert response.status == 200
                assert await response.text() == "hello from aiohttp"
            # io.BytesIO: aiohttp warns (ResourceWarning) on a large raw bytes body.
            async with session.post(url + "/echo", data=io.BytesIO(body)) as response:
                assert response.status == 200
                assert await response.read() == body
            async with session.get(url + "/stream", params={"seed": "7"}) as response:
                assert response.headers["Transfer-Encoding"] == "chunked"
                received = [chunk async for chunk in response.content.iter_chunked(16384)]
            assert b"".join(received) == b"".join(stream_chunks(7))
    # One keep-alive connection carried all three requests. The default
    # connector connects its socket itself (loop.sock_connect) and hands it
    # over with sock=: adopted, it pairs all the same.
    assert server_side == [True, True, True]
    after = friendsock.stats()
    assert after.links_made > before.links_made
    assert after.bytes_moved - before.bytes_moved >= 2 * len(body)
    assert after.fallbacks == before.fallbacks


BIG_BODY = 4 * 2 ** 20


def sha256(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


async def aiohttp_echo(session: aiohttp.ClientSession, url: str, body: bytes) -> bytes:
    """POST ``body`` with aiohttp's client, checking that the client end of
    the connection is a friend link and that the server got ``body`` whole
    (its ``X-Request-SHA256``); returns the response body."""
    async with session.post(url, data=io.BytesIO(body)) as response:
        assert response.status == 200
        assert friendsock.is_friend(response.connection.transport)
        assert response.headers["X-Request-SHA256"] == sha256(body)
        return await response.read()


def assert_paired_since(before: friendsock.FriendStats, body: bytes, links: int = 1) -> None:
    after = friendsock.stats()
    assert after.links_made == before.links_made + links
    assert after.bytes_moved - before.bytes_moved >= 2 * len(body)
    assert after.fallbacks == before.fallbacks


async def test_aiohttp_tls(installed_loop):
    """HTTPS: aiohttp's default connector connects its socket itself and hands
    it over with sock= and ssl=; adopted, the TLS runs over the friend link."""
    server_context, client_context = tls_contexts(trustme.CA())
    body = os.urandom(BIG_BODY)
    before = friendsock.stats()
    async with aiohttp_server(ssl_context=server_context) as (url, server_side):
        async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(ssl=client_context)) as session:
            async with session.post(url + "/echo", data=io.BytesIO(body)) as response:
                assert response.status == 200
                transport = response.connection.transport
                assert transport.get_extra_info("ssl_object") is not None
                assert friendsock.is_friend(transport)
                assert response.headers["X-Request-SHA256"] == sha256(body)
                received = await response.read()
    assert sha256(received) == sha256(body)
    assert server_side == [True]
    assert_paired_since(before, body)


# -- uvicorn + Starlette, httpx -----------------------------------------------------


class StartedServer(uvicorn.Server):
    """uvicorn.Server that says when it listens (no polling of .started)."""

    def __init__(self, config: uvicorn.Config) -> None:
        super().__init__(config)
        self.listening = asyncio.Event()

    async def startup(self, sockets=None) -> None:
        await super().startup(sockets=sockets)
        self.listening.set()


@pytest.mark.parametrize("listen", ["host-port", "sockets"])
async def test_uvicorn_starlette_with_httpx(installed_loop, listen):
    """``sockets``: listening sockets handed in, as a gunicorn worker does
    (create_server(sock=...): a listener that may be shared, so clients pair
    once the claim is confirmed)."""
    async def hello(request: Request):
        return PlainTextResponse("hello from starlette")

    async def echo(request: Request):
        return Response(await request.body(), media_type="application/octet-stream")

    async def stream(request: Request):
        async def chunks():
            for chunk in stream_chunks(11):
                yield chunk
        return StreamingResponse(chunks(), media_type="application/octet-stream")

    app = Starlette(routes=[
        Route("/", hello),
        Route("/echo", echo, methods=["POST"]),
        Route("/stream", stream),
    ])
    config = uvicorn.Config(app, host="127.0.0.1", port=0, loop="none", lifespan="off",
                            log_config=None, log_level="warning", access_log=False)
    server = StartedServer(config)
    sockets = None
    if listen == "sockets":
        sockets = [socket.socket()]
        sockets[0].bind(("127.0.0.1", 0))
    serving = asyncio.create_task(server.serve(sockets=sockets))
    try:
        await asyncio.wait_for(server.listening.wait(), 10)
        port = server.servers[0].sockets[0].getsockname()[1]
        before = friendsock.stats()
        body = os.urandom(2 * 2 ** 20)
        async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{port}") as client:
            response = await client.get("/")
            assert response.status_code == 200 and response.text == "hello from starlette"
            response = await client.post("/echo", content=body)
            assert response.status_code == 200 and response.content == body
            async with client.stream("GET", "/stream") as response:
                received = [chunk async for chunk in response.aiter_raw()]
            assert b"".join(received) == b"".join(stream_chunks(11))
            # The server side of the (one, kept-alive) connection is a friend.
            connections = list(server.server_state.connections)
            assert len(connections) == 1
            assert friendsock.is_friend(connections[0].transport)
        after = friendsock.stats()
        assert after.links_made == before.links_made + 1
        assert after.bytes_moved - before.bytes_moved >= 2 * len(body)
    finally:
        server.should_exit = True
        await asyncio.wait_for(serving, 30)


@contextlib.asynccontextmanager
async def uvicorn_serving(app) -> AsyncIterator[StartedServer]:
    """``app`` on uvicorn, 127.0.0.1, port 0, on the running loop."""
    config = uvicorn.Config(app, host="127.0.0.1", port=0, loop="none", lifespan="off",
                            log_config=None, log_level="warning", access_log=False)
    server = StartedServer(config)
    serving = asyncio.create_task(server.serve())
    try:
        await asyncio.wait_for(server.listening.wait(), 10)
        yield server
    finally:
        server.should_exit = True
        await asyncio.wait_for(serving, 30)


async def test_aiohttp_client_with_uvicorn(installed_loop):
    """aiohttp's default connector (sock_connect, then sock=) against uvicorn."""
    async def echo(request: Request):
        received = await request.body()
        return Response(received, media_type="application/octet-stream",
                        headers={"X-Request-SHA256": sha256(received)})

    app = Starlette(routes=[Route("/echo", echo, methods=["POST"])])
    body = os.urandom(BIG_BODY)
    async with uvicorn_serving(app) as server:
        port = server.servers[0].sockets[0].getsockname()[1]
        before = friendsock.stats()
        async with aiohttp.ClientSession() as session:
            received = await aiohttp_echo(session, f"http://127.0.0.1:{port}/echo", body)
            connections = list(server.server_state.connections)
            assert len(connections) == 1
            assert friendsock.is_friend(connections[0].transport)
        assert sha256(received) == sha256(body)
        assert_paired_since(before, body)


# -- aiohttp's client against a hand-written HTTP/1.1 server ------------------------


async def http_echo_handler(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    """HTTP/1.1 with keep-alive, just enough for a client's POST: reads the
    request head and its Content-Length body, answers with the body."""
    try:
        while True:
            try:
                head = await reader.readuntil(b"\r\n\r\n")
            except asyncio.IncompleteReadError as exc:
                assert exc.partial == b"", exc.partial  # the client closed between requests
                return
            request_line, *header_lines = head.decode("latin-1").split("\r\n")
            assert request_line.startswith("POST /echo HTTP/1.1"), request_line
            headers = dict(line.split(":", 1) for line in header_lines if line)
            headers = {name.strip().lower(): value.strip() for name, value in headers.items()}
            received = await reader.readexactly(int(headers["content-length"]))
            writer.write(
                b"HTTP/1.1 200 OK\r\nContent-Type: application/octet-stream\r\n"
                b"Content-Length: %d\r\nX-Request-SHA256: %s\r\n\r\n"
                % (len(received), sha256(received).encode())
            )
            writer.write(received)
            await writer.drain()
    finally:
        writer.close()
        await writer.wait_closed()


@pytest.mark.parametrize("start_server", ["friendsock", "asyncio"])
async def test_aiohttp_client_with_stream_server(installed_loop, start_server):
    server_side: List[bool] = []
    handled: List[asyncio.Future] = []

    async def handler(reader, writer):
        server_side.append(friendsock.is_friend(writer))
        handled.append(asyncio.ensure_future(http_echo_handler(reader, writer)))

    starter = friendsock.start_server if start_server == "friendsock" else asyncio.start_server
    server = await starter(handler, "127.0.0.1", 0)
    body = os.urandom(BIG_BODY)
    try:
        port = server.sockets[0].getsockname()[1]
        before = friendsock.stats()
        async with aiohttp.ClientSession() as session:
            received = await aiohttp_echo(session, f"http://127.0.0.1:{port}/echo", body)
        await asyncio.wait_for(asyncio.gather(*handled), 10)
    finally:
        server.close()
        await server.wait_closed()
    assert sha256(received) == sha256(body)
    assert server_side == [True]
    assert_paired_since(before, body)


# -- websockets ---------------------------------------------------------------------


WS_TEXT = "héllo wörld ✓ 🙂 " * 8000


def ws_messages(seed: int, count: int = 1000) -> list:
    """Text and binary messages of varied sizes."""
    rng = random.Random(seed)
    messages: list = []
    for n in range(count):
        # Frame length encodings: 7 bits, 16 bits (126..65535), 64 bits.
        size = rng.choice([0, 1, 125, 126, 1000, 4096, 65535] * 4 + [65536, 100_000])
        if n % 3 == 0:
            start = rng.randrange(1000)
            messages.append(WS_TEXT[start:start + size // 2])
        else:
            messages.append(rng.randbytes(size))
    return messages


async def test_websockets_thousand_messages_each_way(installed_loop):
    to_server, to_client = ws_messages(1), ws_messages(2)
    got_by_server: list = []
    server_side: List[bool] = []

    async def handler(websocket):
        server_side.append(friendsock.is_friend(websocket.transport))

        async def send_all():
            for message in to_client:
                await websocket.send(message)

        sender = asyncio.create_task(send_all())
        for _ in range(len(to_server)):
            got_by_server.append(await websocket.recv())
        await sender
        await websocket.wait_closed()

    before = friendsock.stats()
    async with ws_serve(handler, "127.0.0.1", 0, max_size=None) as server:
        port = server.sockets[0].getsockname()[1]
        async with ws_connect(f"ws://127.0.0.1:{port}", max_size=None) as websocket:
            assert friendsock.is_friend(websocket.transport)

            async def send_all():
                for message in to_server:
                    await websocket.send(message)

            sender = asyncio.create_task(send_all())
            got_by_client = [await websocket.recv() for _ in range(len(to_client))]
            await sender
    assert got_by_client == to_client
    assert got_by_server == to_server
    assert server_side == [True]
    assert friendsock.stats().links_made == before.links_made + 1


# -- another process: real TCP ------------------------------------------------------


@contextlib.asynccontextmanager
async def http_server_process(directory) -> AsyncIterator[int]:
    """``python -m http.server`` on 127.0.0.1, port 0; yields its port."""
    process = await asyncio.create_subprocess_exec(
        sys.executable, "-u", "-m", "http.server", "0", "--bind", "127.0.0.1", "--directory", str(directory),
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.DEVNULL,
    )
    try:
        line = await asyncio.wait_for(process.stdout.readline(), 30)
        # "Serving HTTP on 127.0.0.1 port 12345 (http://127.0.0.1:12345/) ..."
        words = line.decode().split()
        assert words[:3] == ["Serving", "HTTP", "on"], line
        yield int(words[words.index("port") + 1])
    finally:
        process.kill()
        await process.wait()


async def test_server_in_another_process(installed_loop, tmp_path):
    payload = os.urandom(3 * 2 ** 20 + 5)
    (tmp_path / "payload.bin").write_bytes(payload)
    async with http_server_process(tmp_path) as port:
        before = friendsock.stats()
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        try:
            assert not friendsock.is_friend(writer)
            writer.write(b"GET /payload.bin HTTP/1.0\r\nHost: 127.0.0.1\r\n\r\n")
            response = await asyncio.wait_for(reader.read(), 30)
        finally:
            writer.close()
            await writer.wait_closed()
        head, _, body = response.partition(b"\r\n\r\n")
        assert head.startswith(b"HTTP/1.0 200 ")
        assert body == payload
        # A library's client too (httpx, through anyio's create_connection).
        async with httpx.AsyncClient() as client:
            response = await client.get(f"http://127.0.0.1:{port}/payload.bin")
            assert response.content == payload
        after = friendsock.stats()
    assert after.links_made == before.links_made
    assert after.fallbacks.get("no-listener", 0) == before.fallbacks.get("no-listener", 0) + 2


CLIENT_PROCESS = """
import socket, sys
payload = bytes(range(256)) * 4096
with socket.create_connection(("127.0.0.1", int(sys.argv[1]))) as sock:
    sock.sendall(payload)
    sock.shutdown(socket.SHUT_WR)
    received = b""
    while chunk := sock.recv(65536):
        received += chunk
print("echoed" if received == payload else "mismatch: %d bytes" % len(received))
"""


async def test_client_in_another_process(installed_loop):
    server_side: List[bool] = []

    async def echo(reader, writer):
        server_side.append(friendsock.is_friend(writer))
        writer.write(await reader.read())
        await writer.drain()
        writer.close()

    before = friendsock.stats()
    server = await asyncio.start_server(echo, "127.0.0.1", 0)
    try:
        port = server.sockets[0].getsockname()[1]
        process = await asyncio.create_subprocess_exec(
            sys.executable, "-c", CLIENT_PROCESS, str(port), stdout=asyncio.subprocess.PIPE,
        )
        try:
            output, _ = await asyncio.wait_for(process.communicate(), 30)
        finally:
            if process.returncode is None:
                process.kill()
                await process.wait()
        assert output.decode().strip() == "echoed"
        assert process.returncode == 0
    finally:
        server.close()
    assert server_side == [False]
    after = friendsock.stats()
    assert after.fallbacks.get("peer-not-friend", 0) == before.fallbacks.get("peer-not-friend", 0) + 1
