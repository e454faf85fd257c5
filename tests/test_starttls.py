"""STARTTLS over friend links: ``loop.start_tls``, ``StreamWriter.start_tls``
and ``friendsock.start_tls`` upgrade a friend link exactly as they upgrade a
TCP connection (DESIGN.md, "TLS over a friend link").

Every test runs on {friend path, real TCP} x {asyncio, uvloop} (see
conftest) and asserts one outcome for both paths. ``how`` says who routes
the upgrade: ``api`` is ``friendsock.start_tls`` (no install), ``installed``
is the loop's own ``start_tls`` under ``friendsock.installed()``.

The one difference left: on uvloop without install(), uvloop's own
``start_tls`` (and so ``StreamWriter.start_tls``) refuses a friend link with
TypeError (test_loop_start_tls_without_install; the strict xfail of
test_stream_writer_start_tls).
"""

from __future__ import annotations

import asyncio
import contextlib
import random
import ssl
import sys
from typing import Any, AsyncIterator, Callable, Iterator, List, Optional, Tuple

import aiosmtplib
import pytest
import trustme
import uvloop
from aiosmtpd.smtp import SMTP as SMTPServerProtocol

import friendsock
from friendsock._asyncio._install import _class_patches, install_class, native, uninstall_class
from friendsock._asyncio._transport import FriendTransport
from support import (  # noqa: F401 - a fixture
    LOCALHOST,
    Recorder,
    bounded,
    no_transport_left_open,
    old_tls_layer,
    port_of,
    tls_ended,
    track,
)

HOSTNAME = "localhost"
STARTTLS = b"STARTTLS\n"
GO = b"GO\n"

Upgrade = Callable[..., Any]

pytestmark = pytest.mark.usefixtures("no_transport_left_open")


# -- certificates -----------------------------------------------------------------


@pytest.fixture(scope="module")
def ca() -> trustme.CA:
    return trustme.CA()


def server_context(ca: trustme.CA) -> ssl.SSLContext:
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)  # (as support.tls_contexts)
    ca.issue_cert(HOSTNAME, LOCALHOST).configure_cert(context)
    return context


def client_context(ca: trustme.CA) -> ssl.SSLContext:
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
    ca.configure_trust(context)
    return context


@pytest.fixture(scope="module")
def tls(ca) -> Tuple[ssl.SSLContext, ssl.SSLContext]:
    """(server context, client context) for ``localhost``/``127.0.0.1``."""
    return server_context(ca), client_context(ca)


# -- who upgrades -----------------------------------------------------------------


@pytest.fixture(params=["api", "installed"])
def how(request) -> str:
    return request.param


@contextlib.contextmanager
def upgrader(how: str) -> Iterator[Upgrade]:
    """The start_tls to call: friendsock's, or the loop's own under install()."""
    if how == "api":
        yield friendsock.start_tls
        return
    with friendsock.installed() as loop:
        yield loop.start_tls


def on_uvloop() -> bool:
    return isinstance(asyncio.get_running_loop(), uvloop.Loop)


# -- a line protocol that upgrades on "STARTTLS" ----------------------------------


class Peer(Recorder):
    """One end, before and after its upgrades: it stays the protocol (as a
    StreamReaderProtocol does) and records what arrives on whichever
    transport is current. An echoing server end answers ``STARTTLS`` with
    ``GO`` and upgrades (``layers`` times), then echoes."""

    def __init__(
        self,
        echo: bool = False,
        upgrade: Optional[Upgrade] = None,
        context: Optional[ssl.SSLContext] = None,
        layers: int = 0,
        **upgrade_kwargs: Any,
    ) -> None:
        super().__init__()
        self.echo = echo
        self.upgrade = upgrade
        self.context = context
        self.layers = layers
        self.upgrade_kwargs = upgrade_kwargs
        self.raw: Optional[asyncio.Transport] = None
        self.upgrading = False
        self.data_while_upgrading = False
        # The server end's upgrade result.
        self.upgraded = asyncio.get_running_loop().create_future()
        self._stash: List[bytes] = []

    def connection_made(self, transport) -> None:
        self.events.append("made")
        self.transport = self.raw = transport
        track(transport)

    def data_received(self, data: bytes) -> None:
        if not self.events or self.events[-1] != "data":
            self.events.append("data")
        if self.upgrading:
            # The upgrade has not returned the new transport yet: taken
            # once it has.
            self.data_while_upgrading = True
            self._stash.append(data)
            return
        self._take(data)

    def _take(self, data: bytes) -> None:
        self.data += data
        if self.layers and self.upgrade is not None:
            if bytes(self.data) == STARTTLS:
                self.data.clear()
                self.transport.write(GO)
                self.layers -= 1
                self.upgrading = True
                asyncio.ensure_future(self._upgrade_server_side())
        elif self.echo:
            self.transport.write(data)
        self._wake()

    async def _upgrade_server_side(self) -> None:
        try:
            transport = await self.upgrade(
                self.transport, self, self.context, server_side=True, **self.upgrade_kwargs
            )
        except BaseException as exc:
            self.upgrading = False
            self.upgraded.set_exception(exc)
            self.upgraded.exception()  # the test looks at it, or not
            return
        self.attach(transport)
        if not self.upgraded.done():
            self.upgraded.set_result(transport)

    def attach(self, transport: asyncio.Transport) -> None:
        """The upgrade returned: from here on, ``transport`` is ours."""
        self.transport = transport
        self.upgrading = False
        stash, self._stash = self._stash, []
        for data in stash:
            if self.upgrading:  # that was the next STARTTLS
                self._stash.append(data)
            else:
                self._take(data)

    async def wait_bytes(self, size: int) -> bytes:
        return await bounded(super().wait_bytes(size))  # type: ignore[no-any-return]


async def client_upgrade(
    peer: Peer, upgrade: Upgrade, context: ssl.SSLContext, **kwargs: Any
) -> asyncio.Transport:
    """``STARTTLS`` / ``GO`` on the current transport, then the client side
    of the upgrade (``server_hostname`` is ``localhost`` unless given)."""
    peer.data.clear()
    peer.transport.write(STARTTLS)
    assert await peer.wait_bytes(len(GO)) == GO
    peer.data.clear()
    kwargs.setdefault("server_hostname", HOSTNAME)
    peer.upgrading = True
    try:
        transport = await upgrade(peer.transport, peer, context, **kwargs)
    except BaseException:
        peer.upgrading = False
        raise
    peer.attach(transport)
    return transport


class Accepted(List[Peer]):
    """The server ends a server made, in order."""

    def __init__(self) -> None:
        super().__init__()
        self.first: asyncio.Future = asyncio.get_running_loop().create_future()

    def append(self, peer: Peer) -> None:
        super().append(peer)
        if not self.first.done():
            self.first.set_result(peer)


@contextlib.asynccontextmanager
async def starttls_pair(
    friends: bool,
    upgrade: Upgrade,
    server_ctx: Optional[ssl.SSLContext],
    layers: int = 1,
    echo: bool = True,
    **server_kwargs: Any,
) -> AsyncIterator[Tuple[Peer, Accepted]]:
    """A friendsock server whose connections upgrade on ``STARTTLS``, and a
    client connected to it (not upgraded yet): yields (client, servers)."""
    servers = Accepted()

    def factory() -> Peer:
        peer = Peer(echo=echo, upgrade=upgrade, context=server_ctx, layers=layers, **server_kwargs)
        servers.append(peer)
        return peer

    server = await friendsock.create_server(factory, LOCALHOST, 0, friends=friends)
    try:
        _, client = await friendsock.create_connection(Peer, LOCALHOST, port_of(server), friends=friends)
        try:
            assert friendsock.is_friend(client.raw) is friends
            yield client, servers
        finally:
            for peer in [client, *servers]:
                if peer.raw is not None and not peer.raw.is_closing():
                    peer.raw.abort()
    finally:
        server.close()


async def server_end(servers: Accepted) -> Peer:
    """The server's end of the only connection (its connection_made may
    come a loop turn after the client's)."""
    return await bounded(asyncio.shield(servers.first))


def tls_records(data: bytes) -> int:
    """How many whole TLS records ``data`` holds, from its start."""
    count = 0
    while len(data) >= 5 and len(data) >= 5 + int.from_bytes(data[3:5], "big"):
        data = data[5 + int.from_bytes(data[3:5], "big"):]
        count += 1
    return count


def payload(size: int, seed: int = 7) -> bytes:
    return random.Random(seed).randbytes(size)


# -- loop.start_tls / friendsock.start_tls ------------------------------------------


async def test_upgrade_then_echo_byte_exact(friends, how, tls):
    """Client and server upgrade (loop.start_tls under install(), or
    friendsock.start_tls); 300 KiB echo back byte-exact; the link under the
    TLS stays a friend link."""
    server_ctx, client_ctx = tls
    data = payload(300 * 1024)
    with upgrader(how) as upgrade:
        async with starttls_pair(friends, upgrade, server_ctx) as (client, servers):
            transport = await bounded(client_upgrade(client, upgrade, client_ctx))
            # At once: these bytes may reach the server with the end of its
            # handshake, before its start_tls() has returned.
            transport.write(data)
            assert await client.wait_bytes(len(data)) == data
            server = await server_end(servers)
            server_transport = await bounded(server.upgraded)
            assert transport is not client.raw and server_transport is not server.raw
            assert client.raw.get_protocol() is not client  # the SSL layer sits between
            assert bytes(server.data) == data
            assert friendsock.is_friend(client.raw) is friends
            assert friendsock.is_friend(server.raw) is friends
            if on_uvloop():
                # uvloop hands the new transport over before the first bytes
                # on both paths (asyncio's start_tls makes no such promise).
                assert not server.data_while_upgrading

            transport.close()
            assert await bounded(client.lost) is None
            assert await bounded(server.lost) is None


async def test_first_bytes_with_the_end_of_the_handshake(friends, tls, monkeypatch):
    """The peer's first bytes come together with the end of the handshake:
    they arrive whole, and on uvloop start_tls()'s caller has the new
    transport before the protocol's first data_received() (asyncio's own
    start_tls makes no such promise). On the friend path the client's
    Finished is held back here and sent with its first bytes, in one burst,
    as TCP may deliver them; over TCP it comes as it comes."""
    server_ctx, client_ctx = tls
    data = payload(1000, seed=5)
    phase = "plain"
    held: List[bytes] = []
    burst = bytearray()  # what went in one write, the Finished with the first bytes
    original_write = FriendTransport.write

    def write(self: FriendTransport, chunk: Any) -> None:
        nonlocal phase
        if phase == "plain" or self is not client.raw:
            original_write(self, chunk)
        elif phase == "hello":  # the ClientHello goes
            phase = "holding"
            original_write(self, chunk)
        elif phase == "holding":  # the Finished waits
            held.append(bytes(chunk))
        else:  # the first bytes: all in one burst
            burst.extend(b"".join(held) + bytes(chunk))
            original_write(self, bytes(burst))
            phase = "plain"

    monkeypatch.setattr(FriendTransport, "write", write)
    async with starttls_pair(friends, friendsock.start_tls, server_ctx) as (client, servers):
        client.transport.write(STARTTLS)
        assert await client.wait_bytes(len(GO)) == GO
        client.data.clear()
        client.upgrading = True
        phase = "hello"
        transport = await bounded(friendsock.start_tls(client.raw, client, client_ctx, server_hostname=HOSTNAME))
        client.attach(transport)
        phase = "release"
        transport.write(data)
        assert await client.wait_bytes(len(data)) == data
        # (The Finished may wait for them anyway: uvloop flushes it a turn
        # after the handshake, and its caller may write first.)
        assert (tls_records(bytes(burst)) >= 2) is friends
        server = await server_end(servers)
        if on_uvloop():
            assert not server.data_while_upgrading
        transport.close()
        assert await bounded(server.lost) is None


async def test_tls_in_tls(friends, tls):
    """A second upgrade over the first one's TLS transport."""
    if old_tls_layer():
        pytest.skip("3.10's asyncio start_tls() takes no TLS transport (no _start_tls_compatible)")
    server_ctx, client_ctx = tls
    data = payload(40 * 1024, seed=2)
    async with starttls_pair(friends, friendsock.start_tls, server_ctx, layers=2) as (client, servers):
        await bounded(client_upgrade(client, friendsock.start_tls, client_ctx))
        inner = await bounded(client_upgrade(client, friendsock.start_tls, client_ctx))
        inner.write(data)
        assert await client.wait_bytes(len(data)) == data
        assert friendsock.is_friend(client.raw) is friends
        inner.close()
        assert await bounded(client.lost) is None


async def test_close_after_upgrade_sends_close_notify(friends, tls):
    """close() on the TLS transport sends close_notify: the peer's protocol
    gets eof_received() (asyncio calls it only for a close_notify, never
    for a bare TCP FIN), answers with its own, and both ends see EOF and
    connection_lost(None); the links under them close too."""
    server_ctx, client_ctx = tls
    async with starttls_pair(friends, friendsock.start_tls, server_ctx) as (client, servers):
        transport = await bounded(client_upgrade(client, friendsock.start_tls, client_ctx))
        server = await server_end(servers)
        await bounded(server.upgraded)
        transport.write(b"last words\n")
        assert await client.wait_bytes(11) == b"last words\n"

        transport.close()
        assert transport.is_closing()
        assert await bounded(server.lost) is None
        assert await bounded(client.lost) is None
        assert server.events == tls_ended("made", "data")
        assert client.events == ["made", "data", "eof", "lost"]
        assert client.raw.is_closing() and server.raw.is_closing()


async def test_server_closes_after_upgrade(friends, tls):
    server_ctx, client_ctx = tls
    async with starttls_pair(friends, friendsock.start_tls, server_ctx) as (client, servers):
        await bounded(client_upgrade(client, friendsock.start_tls, client_ctx))
        server = await server_end(servers)
        (await bounded(server.upgraded)).close()
        assert await bounded(client.lost) is None
        assert await bounded(server.lost) is None
        assert client.events == tls_ended("made", "data")
        assert server.events == ["made", "data", "eof", "lost"]


async def test_extra_info_after_upgrade(friends, ca):
    """ssl_object, peercert, cipher, ALPN, SNI and mutual TLS come through
    the upgrade; the TCP keys still answer from the link below."""
    server_ctx = server_context(ca)
    server_ctx.verify_mode = ssl.CERT_REQUIRED
    ca.configure_trust(server_ctx)
    server_ctx.set_alpn_protocols(["x-friend"])
    sni: List[Optional[str]] = []
    server_ctx.sni_callback = lambda sslobj, name, context: sni.append(name)
    client_ctx = client_context(ca)
    ca.issue_cert("client.example").configure_cert(client_ctx)
    client_ctx.set_alpn_protocols(["x-friend", "x-other"])

    async with starttls_pair(friends, friendsock.start_tls, server_ctx) as (client, servers):
        transport = await bounded(client_upgrade(client, friendsock.start_tls, client_ctx))
        server = await server_end(servers)
        server_transport = await bounded(server.upgraded)

        sslobj = transport.get_extra_info("ssl_object")
        assert isinstance(sslobj, ssl.SSLObject)
        assert sslobj.server_hostname == HOSTNAME
        assert sslobj.selected_alpn_protocol() == "x-friend"
        assert transport.get_extra_info("sslcontext") is client_ctx
        assert ("DNS", HOSTNAME) in transport.get_extra_info("peercert")["subjectAltName"]
        name, version, bits = transport.get_extra_info("cipher")
        assert name == sslobj.cipher()[0] and version == sslobj.version() and bits > 0
        assert sni == [HOSTNAME]

        server_sslobj = server_transport.get_extra_info("ssl_object")
        assert server_sslobj.selected_alpn_protocol() == "x-friend"
        assert ("DNS", "client.example") in server_transport.get_extra_info("peercert")["subjectAltName"]

        for key in ("peername", "sockname"):
            assert transport.get_extra_info(key) == client.raw.get_extra_info(key)
        assert transport.get_extra_info("socket") is client.raw.get_extra_info("socket")
        assert transport.get_extra_info("peername") == server.raw.get_extra_info("sockname")
        assert friendsock.is_friend(client.raw) is friends
        transport.close()
        assert await bounded(server.lost) is None


async def test_wrong_ca(friends, ca, tls):
    """A client that trusts another CA fails the handshake with the same
    SSLCertVerificationError as over TCP. It aborts at once (asyncio and
    uvloop alike), so its alert never leaves: the server's upgrade fails
    with ConnectionResetError, as over TCP. Both connections close."""
    server_ctx, _ = tls
    stranger_ctx = client_context(trustme.CA())
    async with starttls_pair(friends, friendsock.start_tls, server_ctx) as (client, servers):
        with pytest.raises(ssl.SSLCertVerificationError) as caught:
            await bounded(client_upgrade(client, friendsock.start_tls, stranger_ctx))
        assert caught.value.verify_code == 20  # unable to get local issuer certificate
        assert "certificate verify failed" in str(caught.value)
        assert client.raw.is_closing()
        await both_go_after_a_failed_handshake(client, servers)


async def both_go_after_a_failed_handshake(client: Peer, servers: Accepted) -> None:
    """The client failed its handshake and aborted: the server's upgrade
    fails with ConnectionResetError, and both ends are lost. (3.10's
    asyncio TLS layer, over TCP as over a friend link, waits for the
    server's handshake timeout instead, and tells neither protocol of a
    connection gone before its handshake is done: aborted here.)"""
    server = await server_end(servers)
    if old_tls_layer():
        server.raw.abort()
        return
    with pytest.raises(ConnectionResetError):
        await bounded(server.upgraded)
    await bounded(client.lost)
    await bounded(server.lost)


async def test_server_hostname_mismatch(friends, tls):
    server_ctx, client_ctx = tls
    async with starttls_pair(friends, friendsock.start_tls, server_ctx) as (client, servers):
        with pytest.raises(ssl.SSLCertVerificationError) as caught:
            await bounded(
                client_upgrade(client, friendsock.start_tls, client_ctx, server_hostname="mail.example.org")
            )
        assert "Hostname mismatch" in caught.value.verify_message
        await both_go_after_a_failed_handshake(client, servers)


async def test_handshake_timeout(friends, how, tls):
    """A peer that never answers the handshake: ssl_handshake_timeout fails
    the upgrade with ConnectionAbortedError (both loops, both paths) and
    closes the connection; the silent peer sees it go."""
    _, client_ctx = tls
    with upgrader(how) as upgrade:
        # A server that says GO and then only listens.
        async with starttls_pair(friends, upgrade, None, layers=0, echo=False) as (client, servers):
            client.transport.write(STARTTLS)
            server = await server_end(servers)
            assert await server.wait_bytes(len(STARTTLS)) == STARTTLS
            server.transport.write(GO)
            assert await client.wait_bytes(len(GO)) == GO
            with pytest.raises(ConnectionAbortedError, match="SSL handshake is taking longer than 0.1 seconds"):
                await bounded(
                    upgrade(client.transport, client, client_ctx, server_hostname=HOSTNAME, ssl_handshake_timeout=0.1)
                )
            assert client.raw.is_closing()
            assert await bounded(server.lost) is None
            assert bytes(server.data).startswith(STARTTLS + b"\x16\x03")  # a ClientHello came
            assert server.events == ["made", "data", "eof", "lost"]


async def test_argument_errors(friends, how, tls):
    """The running loop's own argument errors, raised before the transport
    is touched: it still carries plain bytes afterwards."""
    server_ctx, client_ctx = tls
    with upgrader(how) as upgrade:
        async with starttls_pair(friends, upgrade, server_ctx, layers=0) as (client, servers):
            raw = client.transport
            with pytest.raises(TypeError, match="sslcontext is expected to be an instance of ssl.SSLContext"):
                await upgrade(raw, client, object())
            with pytest.raises(TypeError, match="sslcontext is expected to be an instance of ssl.SSLContext"):
                await upgrade(raw, client, None, server_hostname=HOSTNAME)
            with pytest.raises(ValueError, match="ssl_handshake_timeout should be a positive number, got 0"):
                await upgrade(raw, client, client_ctx, ssl_handshake_timeout=0)
            # (3.10's asyncio start_tls() has no ssl_shutdown_timeout.)
            with pytest.raises(TypeError) if old_tls_layer() else \
                    pytest.raises(ValueError, match="ssl_shutdown_timeout should be a positive number, got -1"):
                await upgrade(raw, client, client_ctx, ssl_shutdown_timeout=-1)
            with pytest.raises(TypeError):
                await upgrade(raw, client, client_ctx, bogus=True)
            with pytest.raises(TypeError, match="is not supported by start_tls"):
                await upgrade(object(), client, client_ctx)

            assert raw.get_protocol() is client and raw.is_reading() and not raw.is_closing()
            raw.write(b"still plain\n")
            assert await client.wait_bytes(12) == b"still plain\n"


async def test_loop_start_tls_without_install(friends, tls):
    """Without install(): the stdlib loop's own start_tls upgrades a friend
    link (FriendTransport declares _start_tls_compatible). uvloop's accepts
    only uvloop's transports and refuses a friend link with TypeError,
    before touching it (friendsock.start_tls or install() is the way there);
    that is the one difference left, and this pins it down."""
    server_ctx, client_ctx = tls
    loop = asyncio.get_running_loop()
    async with starttls_pair(friends, friendsock.start_tls, server_ctx) as (client, servers):
        if friends and on_uvloop() and not friendsock.is_installed():  # (pytest --friendsock)
            client.transport.write(STARTTLS)
            assert await client.wait_bytes(len(GO)) == GO
            client.data.clear()
            with pytest.raises(TypeError, match="is not supported by start_tls"):
                await loop.start_tls(client.transport, client, client_ctx, server_hostname=HOSTNAME)
            # The transport is untouched: friendsock.start_tls takes over.
            assert client.raw.get_protocol() is client and client.raw.is_reading()
            client.upgrading = True
            transport = await bounded(friendsock.start_tls(client.raw, client, client_ctx, server_hostname=HOSTNAME))
            client.attach(transport)
        else:
            transport = await bounded(client_upgrade(client, loop.start_tls, client_ctx))
        transport.write(b"ping\n")
        assert await client.wait_bytes(5) == b"ping\n"
        transport.close()
        assert await bounded(client.lost) is None


# -- StreamWriter.start_tls -------------------------------------------------------


@contextlib.contextmanager
def path_switch(friends: bool) -> Iterator[None]:
    """Under install(), plain asyncio calls take the friend path; the TCP
    path is the same code with the bypass switched off."""
    was_enabled = friendsock.is_enabled()
    friendsock.set_enabled(friends)
    try:
        yield
    finally:
        friendsock.set_enabled(was_enabled)


async def echo_until_eof(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    while data := await reader.read(65536):
        writer.write(data)
        await writer.drain()


async def client_streams_case(
    reader: asyncio.StreamReader, writer: asyncio.StreamWriter, client_ctx: ssl.SSLContext, friends: bool
) -> None:
    """STARTTLS from a StreamWriter, 200 KiB echoed byte-exact, close."""
    raw = writer.transport
    track(raw)
    data = payload(200 * 1024, seed=3)
    try:
        assert friendsock.is_friend(writer) is friends
        writer.write(STARTTLS)
        assert await bounded(reader.readexactly(len(GO))) == GO
        await bounded(writer.start_tls(client_ctx, server_hostname=HOSTNAME))
        assert writer.transport is not raw
        assert writer.get_extra_info("ssl_object").server_hostname == HOSTNAME
        assert friendsock.is_friend(raw) is friends
        # A TLS transport over a friend link counts as a friend end.
        assert friendsock.is_friend(writer) is friends
        writer.write(data)
        await bounded(writer.drain())
        assert await bounded(reader.readexactly(len(data))) == data
        writer.close()
        await bounded(writer.wait_closed())
    finally:
        if not raw.is_closing():
            raw.abort()


# StreamWriter.start_tls() is new in Python 3.11.
stream_writer_start_tls = pytest.mark.skipif(sys.version_info < (3, 11),
                                             reason="StreamWriter.start_tls() is new in Python 3.11")


@stream_writer_start_tls
async def test_stream_writer_start_tls(friends, request, tls):
    """The explicit API: friendsock.open_connection's StreamWriter.start_tls()
    against a server that upgrades with friendsock.start_tls."""
    if friends and on_uvloop() and not friendsock.is_installed():
        # StreamWriter.start_tls() calls the loop's start_tls() itself, and
        # uvloop's refuses a friend transport: without install() friendsock
        # can not step in. Strict, so that a fix shows up here.
        request.applymarker(pytest.mark.xfail(
            raises=TypeError, strict=True,
            reason="uvloop's own start_tls refuses a friend link; needs install()",
        ))
    await streams_client_against_upgrading_server(friends, friendsock.start_tls, tls)


async def streams_client_against_upgrading_server(friends: bool, upgrade: Upgrade, tls) -> None:
    """friendsock.open_connection's StreamWriter upgrades (client_streams_case)
    against a server end that upgrades with ``upgrade``."""
    server_ctx, client_ctx = tls
    servers = Accepted()

    def factory() -> Peer:
        peer = Peer(echo=True, upgrade=upgrade, context=server_ctx, layers=1)
        servers.append(peer)
        return peer

    server = await friendsock.create_server(factory, LOCALHOST, 0, friends=friends)
    try:
        reader, writer = await friendsock.open_connection(LOCALHOST, port_of(server), friends=friends)
        await client_streams_case(reader, writer, client_ctx, friends)
        assert await bounded((await server_end(servers)).lost) is None
    finally:
        server.close()
        for peer in servers:
            if not peer.raw.is_closing():
                peer.raw.abort()


@stream_writer_start_tls
async def test_stream_writer_start_tls_installed(friends, tls):
    """Plain asyncio under install(): asyncio.open_connection and
    asyncio.start_server, both ends upgrading with StreamWriter.start_tls()."""
    server_ctx, client_ctx = tls
    handled: List[asyncio.Future] = []
    raws: List[asyncio.BaseTransport] = []

    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        done = asyncio.get_running_loop().create_future()
        handled.append(done)
        raws.append(writer.transport)
        track(writer.transport)
        try:
            assert await reader.readexactly(len(STARTTLS)) == STARTTLS
            writer.write(GO)
            await writer.start_tls(server_ctx)
            assert writer.get_extra_info("peercert") is None  # no client certificate
            await echo_until_eof(reader, writer)
            writer.close()
            await writer.wait_closed()
            done.set_result(friendsock.is_friend(raws[0]))
        except BaseException as exc:
            done.set_exception(exc)
            raise

    with friendsock.installed(), path_switch(friends):
        server = await asyncio.start_server(handle, LOCALHOST, 0)
        try:
            reader, writer = await asyncio.open_connection(LOCALHOST, port_of(server))
            await client_streams_case(reader, writer, client_ctx, friends)
            assert await bounded(handled[0]) is friends
        finally:
            server.close()
            for raw in raws:
                if not raw.is_closing():
                    raw.abort()


@contextlib.contextmanager
def class_patched(loop: asyncio.AbstractEventLoop) -> Iterator[None]:
    """The loop's class patched as the pytest plugin patches it."""
    klass = uvloop.Loop if isinstance(loop, uvloop.Loop) else asyncio.BaseEventLoop
    patched = klass not in _class_patches
    if patched:
        install_class(klass)
    try:
        yield
    finally:
        if patched:
            uninstall_class(klass)


@stream_writer_start_tls
async def test_stream_writer_start_tls_class_patch(friends, tls):
    """The pytest plugin's class patch routes start_tls too: the explicit
    API's StreamWriter.start_tls() then works on uvloop's friend links."""
    loop = asyncio.get_running_loop()
    with class_patched(loop):
        assert "start_tls" not in vars(loop)
        await streams_client_against_upgrading_server(friends, loop.start_tls, tls)


async def test_install_and_uninstall_route_start_tls():
    loop = asyncio.get_running_loop()
    before, original = loop.start_tls, native(loop, "start_tls")
    with friendsock.installed():
        assert vars(loop)["start_tls"] != before
        assert native(loop, "start_tls") == original
    assert "start_tls" not in vars(loop) and loop.start_tls == before


# -- a real STARTTLS client and server: aiosmtplib against aiosmtpd --------------------


class Mailbox:
    """An aiosmtpd handler that keeps each message's DATA as received."""

    def __init__(self) -> None:
        self.received = asyncio.get_running_loop().create_future()
        self.sessions: List[Any] = []

    async def handle_DATA(self, server, session, envelope) -> str:
        self.sessions.append(session)
        if not self.received.done():
            self.received.set_result((envelope.mail_from, list(envelope.rcpt_tos), envelope.original_content))
        return "250 OK"


async def test_aiosmtplib_starttls_to_aiosmtpd(friends, tls):
    """aiosmtplib (loop.start_tls) sends one message through STARTTLS to an
    aiosmtpd server that requires it (aiosmtpd runs asyncio's SSLProtocol
    itself over whatever transport it got), both in this process under
    install(); the handler gets the message byte-exact."""
    server_ctx, client_ctx = tls
    loop = asyncio.get_running_loop()
    mailbox = Mailbox()
    protocols: List[SMTPServerProtocol] = []

    def factory() -> SMTPServerProtocol:
        protocol = SMTPServerProtocol(
            mailbox, hostname="mail.test", tls_context=server_ctx, require_starttls=True, loop=loop
        )
        protocols.append(protocol)
        return protocol

    # CRLF line ends, a line that needs dot-stuffing, 8-bit-clean bytes.
    body = b"".join(b"line %d: %s\r\n" % (i, payload(30, seed=i).hex().encode()) for i in range(2000))
    message = b"Subject: over a friend link\r\n\r\n" + body + b".leading dot\r\n"

    with friendsock.installed(), path_switch(friends):
        links_before = friendsock.stats().links_made
        server = await loop.create_server(factory, LOCALHOST, 0)
        try:
            client = aiosmtplib.SMTP(
                hostname=LOCALHOST, port=port_of(server), start_tls=True, tls_context=client_ctx,
                local_hostname="client.test", timeout=10,
            )
            await bounded(client.connect())
            try:
                assert client.transport.get_extra_info("ssl_object") is not None
                errors, _ = await bounded(client.sendmail("a@client.test", ["b@mail.test"], message))
                assert errors == {}
            finally:
                await bounded(client.quit())
            sender, recipients, content = await bounded(mailbox.received)
            assert (sender, recipients) == ("a@client.test", ["b@mail.test"])
            assert content == message
            assert mailbox.sessions[0].ssl is not None  # the DATA came over TLS
            assert (friendsock.stats().links_made - links_before == 1) is friends
        finally:
            server.close()
            for protocol in protocols:
                for transport in (getattr(protocol, "_original_transport", None), protocol.transport):
                    if transport is not None and not transport.is_closing():
                        transport.abort()
            await bounded(server.wait_closed())
