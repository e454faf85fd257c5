"""``ssl=`` over friend links: ``create_connection``/``create_server``/
``open_connection``/``start_server`` with TLS pair, and run the real TLS
record layer over the link (DESIGN.md, "TLS over a friend link").

Every test runs on {friend path, real TCP} x {asyncio, uvloop} (see
conftest) and asserts one outcome for both paths: what ``ssl`` gives
(verification, SNI, ALPN, client certificates, the extra info, the
handshake timeout, close_notify) is the same over a friend link.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import hashlib
import random
import socket
import ssl
import threading
from asyncio import sslproto
from typing import Any, AsyncIterator, Awaitable, Callable, Iterator, List, Optional, Tuple

import httpx
import pytest
import trustme
from aiohttp import web

import friendsock
from friendsock._asyncio._tls import TLSOptions
from support import (  # noqa: F401 - fixtures
    LOCALHOST,
    PAYLOAD,
    old_tls_layer,
    Echoes,
    Recorder,
    bounded,
    fallbacks_since,
    no_transport_left_open,
    patient_confirm,
    port_of,
    shutdown_timeout,
    tls_contexts,
    tls_ended,
    track,
    until,
)

HOSTNAME = "localhost"

pytestmark = pytest.mark.usefixtures("no_transport_left_open")


@pytest.fixture(scope="module")
def ca() -> trustme.CA:
    return trustme.CA()


@pytest.fixture(scope="module")
def tls(ca) -> Tuple[ssl.SSLContext, ssl.SSLContext]:
    """(server context for ``localhost``/127.0.0.1, client context)."""
    return tls_contexts(ca)


@pytest.fixture
def bypass(friends) -> Iterator[None]:
    """The process-wide switch as the path says: under install(), plain
    asyncio calls take the friend path, or real TCP with the switch off."""
    was_enabled = friendsock.is_enabled()
    friendsock.set_enabled(friends)
    yield
    friendsock.set_enabled(was_enabled)


def payload(size: int, seed: int = 7) -> bytes:
    return random.Random(seed).randbytes(size)


def digest(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


# -- servers ----------------------------------------------------------------------


class Recorders(List[Recorder]):
    """A protocol factory of plain Recorders that keeps what it made."""

    def __call__(self) -> Recorder:
        self.append(Recorder())
        return self[-1]


class Handled:
    """A start_server callback that echoes until EOF, then closes; keeps,
    per connection, whether its transport rode a friend link, and what the
    handler ended with (None, or its exception)."""

    def __init__(self, then: Optional[Callable[..., Any]] = None) -> None:
        self.friends: List[bool] = []
        self.done: List[asyncio.Future] = []
        self.then = then

    async def __call__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        done = asyncio.get_running_loop().create_future()
        self.done.append(done)
        track(writer.transport)
        self.friends.append(friendsock.is_friend(writer))
        try:
            if self.then is not None:
                await self.then(reader, writer)
            else:
                while data := await reader.read(256 * 1024):
                    writer.write(data)
                    await writer.drain()
            writer.close()
            await writer.wait_closed()
        except BaseException as exc:
            done.set_result(exc)
            raise
        done.set_result(None)

    async def all_done(self) -> List[Optional[BaseException]]:
        return await bounded(asyncio.gather(*self.done))  # type: ignore[no-any-return]


@contextlib.asynccontextmanager
async def tls_stream_server(friends: bool, server_ctx: ssl.SSLContext, handled: Handled,
                            **kwargs: Any) -> AsyncIterator[int]:
    """friendsock.start_server with ``ssl=``; yields its port."""
    server = await friendsock.start_server(handled, LOCALHOST, 0, ssl=server_ctx, friends=friends, **kwargs)
    try:
        yield port_of(server)
    finally:
        server.close()
        await bounded(server.wait_closed())


@contextlib.asynccontextmanager
async def tls_server(friends: bool, server_ctx: ssl.SSLContext, factory: Callable[[], asyncio.BaseProtocol],
                     **kwargs: Any) -> AsyncIterator[asyncio.AbstractServer]:
    """friendsock.create_server with ``ssl=``; yields the server."""
    server = await friendsock.create_server(factory, LOCALHOST, 0, ssl=server_ctx, friends=friends, **kwargs)
    try:
        yield server
    finally:
        server.close()


async def connect(friends: bool, port: int, context: Any, factory: Callable[[], asyncio.BaseProtocol] = Recorder,
                  **kwargs: Any) -> Tuple[asyncio.Transport, Any]:
    return await bounded(friendsock.create_connection(  # type: ignore[no-any-return]
        factory, LOCALHOST, port, ssl=context, friends=friends, **kwargs))


@contextlib.asynccontextmanager
async def tls_ends(friends: bool, server_ctx: ssl.SSLContext,
                   client_ctx: ssl.SSLContext) -> AsyncIterator[Tuple[asyncio.Transport, asyncio.Transport]]:
    """A TLS connection to an echo server, both ends through their
    handshakes (one byte echoed): yields (client transport, server
    transport); closed from the client at the end."""
    echoes = Echoes()
    async with tls_server(friends, server_ctx, echoes) as server:
        transport, client = await connect(friends, port_of(server), client_ctx, server_hostname=HOSTNAME)
        echo = await bounded(asyncio.shield(echoes.first))
        await bounded(echo.made)
        transport.write(b"x")
        await bounded(client.wait_bytes(1))
        assert friendsock.is_friend(transport) is friends
        assert friendsock.is_friend(echo.transport) is friends
        yield transport, echo.transport
        transport.close()
        assert await bounded(echo.lost) is None


async def close_writer(writer: asyncio.StreamWriter) -> None:
    writer.close()
    await bounded(writer.wait_closed())


async def echo_once(reader: asyncio.StreamReader, writer: asyncio.StreamWriter, data: bytes,
                    handled: Handled, friends: bool) -> None:
    """One echo of ``data`` through a Handled server, then close: the
    handler ended cleanly, and both ends took the path ``friends`` says."""
    track(writer.transport)
    assert friendsock.is_friend(writer) is friends
    writer.write(data)
    assert await bounded(reader.readexactly(len(data))) == data
    await close_writer(writer)
    assert await handled.all_done() == [None]
    assert handled.friends == [friends]


# -- streams ----------------------------------------------------------------------


async def test_streams_echo_byte_exact(friends, tls):
    """4 MiB each way through open_connection/start_server with ssl= (the
    server name from the host, 127.0.0.1); byte-exact by sha256. The link
    is counted as made, and no fallback for ssl."""
    server_ctx, client_ctx = tls
    data = payload(4 * 2 ** 20)
    handled = Handled()
    before = friendsock.stats()
    async with tls_stream_server(friends, server_ctx, handled) as port:
        reader, writer = await bounded(friendsock.open_connection(LOCALHOST, port, ssl=client_ctx, friends=friends))
        track(writer.transport)
        assert friendsock.is_friend(writer) is friends

        async def send() -> None:
            view = memoryview(data)
            for start in range(0, len(data), 300_000):
                writer.write(view[start:start + 300_000])
                await writer.drain()

        _, received = await bounded(asyncio.gather(send(), reader.readexactly(len(data))))
        assert digest(received) == digest(data)
        await close_writer(writer)
        assert await handled.all_done() == [None]
        assert handled.friends == [friends]
    assert friendsock.stats().links_made - before.links_made == int(friends)
    assert fallbacks_since(before) == ({} if friends else {"opted-out": 1})


async def test_tcp_client_of_a_tls_friend_server(tls):
    """A client that opts out reaches a friendsock TLS server over real TCP:
    the server's accept runs the loop's own TLS (both loops)."""
    server_ctx, client_ctx = tls
    handled = Handled()
    before = friendsock.stats()
    async with tls_stream_server(True, server_ctx, handled) as port:
        reader, writer = await bounded(friendsock.open_connection(LOCALHOST, port, ssl=client_ctx, friends=False))
        assert writer.get_extra_info("peercert")["subjectAltName"]
        await echo_once(reader, writer, PAYLOAD * 1000, handled, False)
    assert fallbacks_since(before) == {"opted-out": 1, "peer-not-friend": 1}


async def test_close_sends_close_notify(friends, tls):
    """close() sends close_notify, which the peer reads as EOF (reader.read()
    returns what came, then the end), either way round; TLS has no
    half-close: write_eof() fails as over TCP."""
    server_ctx, client_ctx = tls

    async def reply_then_close(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        request = await reader.readexactly(4)
        if request == b"ping":
            writer.write(b"pong")  # and close: the client reads to EOF
        else:
            assert request + await reader.read() == b"last words"  # to the client's EOF

    handled = Handled(reply_then_close)
    async with tls_stream_server(friends, server_ctx, handled) as port:
        reader, writer = await bounded(friendsock.open_connection(LOCALHOST, port, ssl=client_ctx, friends=friends))
        track(writer.transport)
        assert not writer.can_write_eof()
        with pytest.raises(NotImplementedError):
            writer.write_eof()
        writer.write(b"ping")
        assert await bounded(reader.read()) == b"pong"
        assert reader.at_eof()
        await close_writer(writer)

        reader, writer = await bounded(friendsock.open_connection(LOCALHOST, port, ssl=client_ctx, friends=friends))
        track(writer.transport)
        writer.write(b"last")
        writer.write(b" words")
        await close_writer(writer)
        assert await handled.all_done() == [None, None]
        assert handled.friends == [friends, friends]


# -- protocols --------------------------------------------------------------------


async def test_protocols_echo_and_close(friends, tls):
    """create_connection/create_server with protocols: connection_made gets
    the TLS transport (before any data), and close() ends both sides with
    close_notify: EOF, then connection_lost(None)."""
    server_ctx, client_ctx = tls
    echoes = Echoes()
    async with tls_server(friends, server_ctx, echoes) as server:
        transport, client = await connect(friends, port_of(server), client_ctx, server_hostname=HOSTNAME)
        assert client.transport is transport and client.events == ["made"]
        assert friendsock.is_friend(transport) is friends
        echo = await bounded(asyncio.shield(echoes.first))
        await bounded(echo.made)
        assert friendsock.is_friend(echo.transport) is friends
        data = payload(300 * 1024, seed=3)
        transport.write(data)
        assert await bounded(client.wait_bytes(len(data))) == data
        transport.close()
        assert await bounded(client.lost) is None
        assert await bounded(echo.lost) is None
        assert client.events == ["made", "data", "eof", "lost"]


class Greeter(asyncio.Protocol):
    """A server protocol that speaks first, from connection_made."""

    def connection_made(self, transport) -> None:
        track(transport)
        transport.write(b"220 hello\r\n")
        transport.close()


class Greeted(Recorder):
    """Notes whether bytes came before create_connection had returned."""

    returned = False
    early: Optional[bool] = None

    def data_received(self, data: bytes) -> None:
        if self.early is None:
            self.early = not self.returned
        super().data_received(data)


async def test_server_speaks_first(friends, ca):
    """Over TLS 1.2 the server's first bytes come with the end of the
    client's handshake. The client's protocol is told connection_made
    first, and on uvloop (as with uvloop's own TLS) the caller of
    create_connection holds the transport before data_received: on the
    friend path the one burst the friend end delivers is held back a turn
    for it."""
    server_ctx, client_ctx = tls_contexts(ca)
    client_ctx.maximum_version = ssl.TLSVersion.TLSv1_2
    async with tls_server(friends, server_ctx, Greeter) as server:
        # Awaited directly: wait_for's own task would add a loop turn.
        transport, client = await friendsock.create_connection(
            Greeted, LOCALHOST, port_of(server), ssl=client_ctx, server_hostname=HOSTNAME, friends=friends)
        client.returned = True
        assert transport.get_extra_info("ssl_object").version() == "TLSv1.2"
        assert await bounded(client.lost) is None
        assert client.data == b"220 hello\r\n"
        assert client.events == tls_ended("made", "data")
        if not isinstance(asyncio.get_running_loop(), asyncio.BaseEventLoop):
            assert client.early is False  # (asyncio's own TLS makes no such promise)


async def test_extra_info_alike(friends, tls):
    """ssl_object, peercert, cipher, sslcontext, and the TCP keys (peername,
    sockname, socket) answer on both ends as over TCP."""
    server_ctx, client_ctx = tls
    async with tls_ends(friends, server_ctx, client_ctx) as (transport, server_end):
        for end, context, peer in ((transport, client_ctx, True), (server_end, server_ctx, False)):
            sslobj = end.get_extra_info("ssl_object")
            assert isinstance(sslobj, ssl.SSLObject)
            assert end.get_extra_info("sslcontext") is context
            cipher = end.get_extra_info("cipher")
            assert cipher == sslobj.cipher() and cipher[1] == sslobj.version()
            peercert = end.get_extra_info("peercert")
            if peer:  # the client sees the server's certificate
                assert ("DNS", HOSTNAME) in peercert["subjectAltName"]
            else:  # no client certificate asked for
                assert peercert is None
            sock = end.get_extra_info("socket")
            assert sock.family == socket.AF_INET and sock.type == socket.SOCK_STREAM
            assert sock.getsockname() == end.get_extra_info("sockname")
            assert sock.getpeername() == end.get_extra_info("peername")
            assert sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY) != 0
        assert transport.get_extra_info("ssl_object").server_hostname == HOSTNAME
        assert transport.get_extra_info("peername") == server_end.get_extra_info("sockname")
        assert transport.get_extra_info("sockname") == server_end.get_extra_info("peername")


async def test_alpn_and_sni(friends, ca):
    server_ctx, client_ctx = tls_contexts(ca)
    server_ctx.set_alpn_protocols(["h2", "http/1.1"])
    names: List[Optional[str]] = []
    server_ctx.sni_callback = lambda sslobj, name, context: names.append(name)
    client_ctx.set_alpn_protocols(["x-other", "h2"])
    async with tls_ends(friends, server_ctx, client_ctx) as (transport, server_end):
        assert transport.get_extra_info("ssl_object").selected_alpn_protocol() == "h2"
        assert server_end.get_extra_info("ssl_object").selected_alpn_protocol() == "h2"
        assert names == [HOSTNAME]


async def test_client_certificates(friends, ca):
    """A server that requires a client certificate (CERT_REQUIRED) sees it,
    and the client sees the server's."""
    server_ctx, client_ctx = tls_contexts(ca)
    server_ctx.verify_mode = ssl.CERT_REQUIRED
    ca.configure_trust(server_ctx)
    ca.issue_cert("client.example").configure_cert(client_ctx)
    async with tls_ends(friends, server_ctx, client_ctx) as (transport, server_end):
        assert ("DNS", "client.example") in server_end.get_extra_info("peercert")["subjectAltName"]
        assert ("DNS", HOSTNAME) in transport.get_extra_info("peercert")["subjectAltName"]


# -- verification fails -----------------------------------------------------------


async def good_client_echoes(friends: bool, port: int, client_ctx: ssl.SSLContext, echoes: Echoes) -> None:
    """The server still serves: a client it can verify gets an echo."""
    transport, client = await connect(friends, port, client_ctx, server_hostname=HOSTNAME)
    transport.write(PAYLOAD)
    assert await bounded(client.wait_bytes(len(PAYLOAD))) == PAYLOAD
    assert friendsock.is_friend(transport) is friends
    transport.close()
    assert await bounded(client.lost) is None
    assert await bounded(echoes.protocols[-1].lost) is None


async def test_wrong_ca(friends, tls):
    """A client that trusts another CA fails with the same
    SSLCertVerificationError as over TCP, leaves nothing open, and the server
    (which hears of it in debug mode only) goes on serving. On the friend
    path a TCP client fails the same against the same friendsock server."""
    server_ctx, client_ctx = tls
    _, stranger_ctx = tls_contexts(trustme.CA())
    echoes = Echoes()
    async with tls_server(friends, server_ctx, echoes) as server:
        for client_friends in {friends, False}:
            with pytest.raises(ssl.SSLCertVerificationError) as caught:
                await connect(client_friends, port_of(server), stranger_ctx, server_hostname=HOSTNAME)
            assert caught.value.verify_code == 20  # unable to get local issuer certificate
            assert "certificate verify failed" in str(caught.value)
            await good_client_echoes(friends, port_of(server), client_ctx, echoes)


async def test_default_context_does_not_trust_a_private_ca(friends, tls):
    """ssl=True is ssl.create_default_context(): the system's CAs only."""
    server_ctx, _ = tls
    async with tls_server(friends, server_ctx, Echoes()) as server:
        with pytest.raises(ssl.SSLCertVerificationError) as caught:
            await connect(friends, port_of(server), True)
        assert caught.value.verify_code == 20


async def test_server_hostname_mismatch(friends, tls):
    server_ctx, client_ctx = tls
    echoes = Echoes()
    async with tls_server(friends, server_ctx, echoes) as server:
        with pytest.raises(ssl.SSLCertVerificationError) as caught:
            await connect(friends, port_of(server), client_ctx, server_hostname="mail.example.org")
        assert "Hostname mismatch" in caught.value.verify_message
        await good_client_echoes(friends, port_of(server), client_ctx, echoes)


# -- timeouts ---------------------------------------------------------------------


async def test_client_handshake_timeout(friends, tls):
    """A (plain) server that accepts and stays silent: ssl_handshake_timeout
    fails create_connection with ConnectionAbortedError and closes the
    connection; the server saw a ClientHello, then the end."""
    _, client_ctx = tls
    servers = Recorders()
    server = await friendsock.create_server(servers, LOCALHOST, 0, friends=friends)
    try:
        with pytest.raises(ConnectionAbortedError, match="SSL handshake is taking longer than 0.1 seconds"):
            await connect(friends, port_of(server), client_ctx, server_hostname=HOSTNAME,
                          ssl_handshake_timeout=0.1)
        assert await bounded(servers[0].lost) is None
        assert bytes(servers[0].data).startswith(b"\x16\x03")  # a TLS handshake record
        assert servers[0].events == ["made", "data", "eof", "lost"]
        assert friendsock.is_friend(servers[0].transport) is friends
    finally:
        server.close()


async def test_server_handshake_timeout(friends, tls):
    """A plain client that connects to a TLS server and says nothing: the
    server's ssl_handshake_timeout ends the connection; the client sees EOF,
    then connection_lost(None). The server keeps the TLS arguments where
    asyncio.Server keeps them."""
    server_ctx, _ = tls
    shutdown = shutdown_timeout(5.0)
    async with tls_server(friends, server_ctx, Echoes(), ssl_handshake_timeout=0.1, **shutdown) as server:
        if friends or isinstance(asyncio.get_running_loop(), asyncio.BaseEventLoop):
            assert server._ssl_context is server_ctx  # type: ignore[attr-defined]
            assert server._ssl_handshake_timeout == 0.1  # type: ignore[attr-defined]
            # (3.10's asyncio.Server has no shutdown timeout to keep.)
            assert getattr(server, "_ssl_shutdown_timeout", None) == shutdown.get("ssl_shutdown_timeout")
        transport, client = await bounded(friendsock.create_connection(
            Recorder, LOCALHOST, port_of(server), friends=friends))
        assert friendsock.is_friend(transport) is friends
        assert await bounded(client.lost) is None
        assert client.events == ["made", "eof", "lost"]


def test_bad_handshake_timeout_is_sslprotocols_error(tls):
    """A client's bad timeout fails before connecting, with SSLProtocol's
    own words (asyncio finds it once connected)."""
    _, client_ctx = tls
    for timeout in (0, -1):
        with pytest.raises(ValueError) as ours:
            TLSOptions.for_client(client_ctx, LOCALHOST, None, timeout, None)
        with pytest.raises(ValueError) as theirs:
            sslproto.SSLProtocol(None, asyncio.Protocol(), client_ctx, None, ssl_handshake_timeout=timeout)
        assert str(ours.value) == str(theirs.value)


async def test_tls_argument_errors(friends, tls):
    """The loop's own argument errors, on either path."""
    server_ctx, client_ctx = tls
    async with tls_server(friends, server_ctx, Echoes()) as server:
        port = port_of(server)
        with pytest.raises(ValueError, match="You must set server_hostname when using ssl without a host"):
            await friendsock.create_connection(asyncio.Protocol, "", port, ssl=client_ctx, friends=friends)
        with pytest.raises(ValueError, match="server_hostname is only meaningful with ssl"):
            await friendsock.create_connection(asyncio.Protocol, LOCALHOST, port, server_hostname=HOSTNAME,
                                               friends=friends)
    with pytest.raises(TypeError, match="ssl argument must be an SSLContext or None"):
        await friendsock.create_server(asyncio.Protocol, LOCALHOST, 0, ssl=True, friends=friends)
    sock = socket.socket()
    try:
        sock.bind((LOCALHOST, 0))
        with pytest.raises(TypeError, match="ssl argument must be an SSLContext or None"):
            await friendsock.create_server(asyncio.Protocol, sock=sock, ssl=True, friends=friends)
    finally:
        sock.close()


async def test_failed_handshake_reported_in_debug_mode_only_on_asyncio(friends, tls, loop_guard):
    """As the loop's own server: in debug mode the stdlib loop reports a
    server-side handshake that failed to the exception handler, uvloop
    does not; the server goes on serving. (Out of debug mode nothing is
    reported: test_wrong_ca.)"""
    server_ctx, client_ctx = tls
    _, stranger_ctx = tls_contexts(trustme.CA())
    loop = asyncio.get_running_loop()
    reported: asyncio.Future = loop.create_future()

    def handler(_loop: Any, context: dict) -> None:
        if context.get("message") == "Error on transport creation for incoming connection" \
                and not reported.done():
            reported.set_result(context)
        else:
            loop_guard.append(context)

    loop.set_exception_handler(handler)
    loop.set_debug(True)
    echoes = Echoes()
    try:
        async with tls_server(friends, server_ctx, echoes) as server:
            with pytest.raises(ssl.SSLCertVerificationError):
                await connect(friends, port_of(server), stranger_ctx, server_hostname=HOSTNAME)
            if isinstance(loop, asyncio.BaseEventLoop):
                context = await bounded(reported)
                assert isinstance(context["exception"], ConnectionResetError)
                assert context["protocol"] is echoes.protocols[0]
            await good_client_echoes(friends, port_of(server), client_ctx, echoes)
            assert reported.done() is isinstance(loop, asyncio.BaseEventLoop)
    finally:
        loop.set_debug(False)


@pytest.mark.parametrize("path", ["friend"])  # over TCP asyncio leaks the socket
async def test_tls_layer_that_cannot_be_made_leaves_nothing(friends, tls, loop_guard):
    """A server_hostname ssl cannot take fails create_connection with the
    error it fails the loop's own with, after connecting (as asyncio): the
    friend end goes away unseen by its protocol, and the server end sees
    EOF. uvloop's own TLS (which a friend end runs on uvloop) also reports
    each to the exception handler as a failed handshake, as over its own
    TCP. A server whose handshake timeout SSLProtocol refuses closes each
    connection (asyncio fails each one too)."""
    server_ctx, client_ctx = tls
    servers = Recorders()
    server = await friendsock.create_server(servers, LOCALHOST, 0, friends=friends)
    errors = (UnicodeError, TypeError)
    try:
        for made, (name, error) in enumerate(zip(("x" * 300, "a\0b"), errors), 1):
            with pytest.raises(error):
                await connect(friends, port_of(server), client_ctx, factory=asyncio.Protocol, server_hostname=name)
            await until(lambda: len(servers) == made)  # (the connect failed before the accept)
            assert await bounded(servers[-1].lost) is None
            assert servers[-1].events == ["made", "eof", "lost"]
    finally:
        server.close()
    if not isinstance(asyncio.get_running_loop(), asyncio.BaseEventLoop) or old_tls_layer():
        # (3.13's idna codec raises UnicodeEncodeError, a UnicodeError.)
        assert [(context["message"], isinstance(context["exception"], error))
                for context, error in zip(loop_guard, errors)] == [("SSL handshake failed", True)] * 2
        assert len(loop_guard) == len(errors)
        del loop_guard[:]
    async with tls_server(friends, server_ctx, Echoes(), ssl_handshake_timeout=0) as server:
        transport, client = await bounded(friendsock.create_connection(
            Recorder, LOCALHOST, port_of(server), friends=friends))
        assert friendsock.is_friend(transport)
        assert await bounded(client.lost) is None
        assert client.events == ["made", "eof", "lost"]


# -- a listener handed in ---------------------------------------------------------


async def test_given_listening_socket(friends, tls, patient_confirm):
    """create_server(sock=..., ssl=...): a listener that may be shared, so
    the client pairs once this process claimed its connect, then runs TLS."""
    server_ctx, client_ctx = tls
    sock = socket.socket()
    sock.bind((LOCALHOST, 0))
    handled = Handled()
    server = await friendsock.start_server(handled, sock=sock, ssl=server_ctx, friends=friends)
    try:
        reader, writer = await bounded(friendsock.open_connection(
            LOCALHOST, port_of(server), ssl=client_ctx, server_hostname=HOSTNAME, friends=friends))
        await echo_once(reader, writer, PAYLOAD, handled, friends)
    finally:
        server.close()


async def test_server_on_another_thread(friends, tls):
    """The TLS server on a loop of its own in another thread, the client
    here: each end runs its TLS on its own loop."""
    server_ctx, client_ctx = tls
    other = asyncio.new_event_loop()
    thread = threading.Thread(target=other.run_forever, name="tls-server", daemon=True)
    thread.start()
    handled: "concurrent.futures.Future[bool]" = concurrent.futures.Future()

    async def echo(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        while data := await reader.read(65536):
            writer.write(data)
            await writer.drain()
        handled.set_result(friendsock.is_friend(writer))
        writer.close()

    async def on_other(aw: Awaitable[Any]) -> Any:
        return await bounded(asyncio.wrap_future(asyncio.run_coroutine_threadsafe(aw, other)))

    async def start() -> asyncio.AbstractServer:
        return await friendsock.start_server(echo, LOCALHOST, 0, ssl=server_ctx, friends=friends)

    async def stop(server: asyncio.AbstractServer) -> None:
        server.close()

    try:
        server = await on_other(start())
        reader, writer = await bounded(friendsock.open_connection(
            LOCALHOST, port_of(server), ssl=client_ctx, friends=friends))
        track(writer.transport)
        assert friendsock.is_friend(writer) is friends
        data = payload(2 * 2 ** 20, seed=21)
        writer.write(data)
        assert digest(await bounded(reader.readexactly(len(data)))) == digest(data)
        await close_writer(writer)
        assert await bounded(asyncio.wrap_future(handled)) is friends
        await on_other(stop(server))
    finally:
        other.call_soon_threadsafe(other.stop)
        thread.join(10)
        other.close()


# -- install() --------------------------------------------------------------------


async def test_installed_asyncio_streams_pair(friends, tls, bypass):
    """Plain asyncio under install(): asyncio.open_connection(ssl=...) to
    asyncio.start_server(ssl=...) pairs."""
    server_ctx, client_ctx = tls
    handled = Handled()
    with friendsock.installed():
        before = friendsock.stats()
        server = await asyncio.start_server(handled, LOCALHOST, 0, ssl=server_ctx)
        try:
            reader, writer = await bounded(asyncio.open_connection(LOCALHOST, port_of(server), ssl=client_ctx))
            await echo_once(reader, writer, payload(200 * 1024, seed=9), handled, friends)
        finally:
            server.close()
    assert friendsock.stats().links_made - before.links_made == int(friends)
    assert fallbacks_since(before) == ({} if friends else {"disabled": 1})


async def test_aiohttp_server_httpx_client(friends, tls, bypass):
    """aiohttp's server with ssl_context (web.TCPSite) and httpx's client
    (anyio's TLS over loop.create_connection) under install(): the request
    pairs, and the body arrives byte-exact."""
    server_ctx, client_ctx = tls
    body = payload(2 * 2 ** 20, seed=13)
    server_side: List[bool] = []

    async def blob(request: web.Request) -> web.Response:
        server_side.append(friendsock.is_friend(request.transport))
        return web.Response(body=body)

    app = web.Application()
    app.router.add_get("/blob", blob)
    with friendsock.installed():
        runner = web.AppRunner(app)
        await runner.setup()
        try:
            site = web.TCPSite(runner, LOCALHOST, 0, ssl_context=server_ctx)
            await site.start()
            port = runner.addresses[0][1]
            before = friendsock.stats()
            async with httpx.AsyncClient(verify=client_ctx) as client:
                response = await bounded(client.get(f"https://{LOCALHOST}:{port}/blob"))
            assert response.status_code == 200
            assert digest(response.content) == digest(body)
            assert server_side == [friends]
            assert friendsock.stats().links_made - before.links_made == int(friends)
            assert "ssl" not in fallbacks_since(before)
        finally:
            await bounded(runner.cleanup())
