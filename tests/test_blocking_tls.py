"""TLS on blocking sockets (``SSLContext.wrap_socket``) under
``friendsock.patch_socket()``: both ends blocking, and a blocking client of
an asyncio TLS server on another thread (``http.client``'s HTTPS).

Each test runs on the friend path (patched: the sockets pair, TLS runs over
the link) and on real TCP (the stdlib's sockets, the reference); both must
agree.
"""

from __future__ import annotations

import asyncio
import contextlib
import errno
import gc
import hashlib
import http.client
import random
import select
import socket
import ssl
import struct
import sys
import warnings
from typing import Any, Iterator, Tuple

import pytest
import trustme

import friendsock
from friendsock._blocking._readiness import parker
from friendsock._blocking._tls import FriendSSLSocket
from support import Recorder, descriptors_open, tls_contexts
from test_blocking import (  # noqa: F401 (fixtures)
    LOCALHOST,
    MiB,
    TIMEOUT,
    ServerLoop,
    blocking_pair,
    patched,
    receive_exactly,
    receive_until_eof,
    run_thread,
    server_loop,
)


@pytest.fixture(scope="module")
def contexts() -> Tuple[ssl.SSLContext, ssl.SSLContext]:
    return tls_contexts(trustme.CA())


@pytest.fixture
def tls_pair(patched, contexts) -> Iterator[Tuple[ssl.SSLSocket, ssl.SSLSocket]]:  # noqa: F811
    """(client, server) TLS sockets over a blocking pair, the handshake done
    (the server's in a thread)."""
    server_context, client_context = contexts
    with blocking_pair(patched) as (client, server):
        join = run_thread(lambda: server_context.wrap_socket(server, server_side=True))
        tls_client = client_context.wrap_socket(client, server_hostname="localhost")
        tls_server = join()
        with tls_client, tls_server:
            for sock in (tls_client, tls_server):
                assert isinstance(sock, ssl.SSLSocket)
                assert (type(sock) is FriendSSLSocket) is patched
                assert friendsock.is_friend(sock) is patched
            yield tls_client, tls_server
        assert not friendsock.is_friend(tls_client)  # closed


def test_tls_between_blocking_sockets_keeps_the_tls_socket_contract(patched, tls_pair):  # noqa: F811
    client, server = tls_pair
    assert client.version() == server.version() and client.version().startswith("TLS")
    assert client.cipher() == server.cipher()
    assert client.getpeercert()["subjectAltName"]
    assert client.getpeername() == server.getsockname()
    assert client.getsockname() == server.getpeername()
    assert client.gettimeout() == TIMEOUT
    client.sendall(b"hello")
    assert server.recv(5) == b"hello"
    server.sendall(b"line one\nline two\n")
    with client.makefile("rb") as lines:
        assert lines.readline() == b"line one\n"
        assert lines.readline() == b"line two\n"
    buffer = bytearray(10)
    server.sendall(b"into")
    assert client.recv_into(buffer) == 4 and buffer[:4] == b"into"
    assert client.pending() == 0
    with pytest.raises(ValueError):
        client.recv(10, socket.MSG_PEEK)  # as the stdlib's: no flags on a TLS socket


@pytest.mark.parametrize("size", [0, 1, 100_003, 3 * MiB])
def test_tls_bytes_arrive_whole_and_in_order(patched, tls_pair, size):  # noqa: F811
    client, server = tls_pair
    payload = random.Random(size).randbytes(size)

    def send() -> None:
        client.sendall(payload)
        client.shutdown(socket.SHUT_WR)  # as the stdlib's: no close_notify, the raw EOF

    join = run_thread(send)
    assert receive_until_eof(server) == payload  # a ragged EOF reads as b"" (suppressed)
    join()


def test_a_tls_socket_closed_with_a_makefile_open_stays_usable(patched, tls_pair):  # noqa: F811
    client, server = tls_pair
    reader = client.makefile("rb")
    client.close()
    assert client.fileno() > 0
    server.sendall(b"through the file\n")
    assert reader.readline() == b"through the file\n"
    reader.close()
    assert client.fileno() == -1


def test_tls_read_timeout_and_close(patched, tls_pair):  # noqa: F811
    client, server = tls_pair
    client.settimeout(0.05)
    with pytest.raises(TimeoutError):
        client.recv(10)
    client.settimeout(TIMEOUT)
    server.sendall(b"still there")
    assert client.recv(100) == b"still there"
    server.close()
    assert client.recv(100) == b""


def test_unwrap_goes_back_to_plain_bytes(patched, tls_pair):  # noqa: F811
    """STARTTLS's end: both sides unwrap (close_notify each way), then plain
    bytes on the same connection."""
    client, server = tls_pair
    client.sendall(b"secret")
    assert server.recv(6) == b"secret"
    join = run_thread(server.unwrap)
    plain_client = client.unwrap()
    plain_server = join()
    assert plain_client.version() is None
    plain_client.sendall(b"in the clear")
    assert plain_server.recv(100) == b"in the clear"


def test_starttls_on_a_blocking_connection(patched, contexts):  # noqa: F811
    """Plain bytes, then TLS on the same connection, then plain EOF."""
    server_context, client_context = contexts
    with blocking_pair(patched) as (client, server):
        client.sendall(b"STARTTLS\r\n")
        assert server.recv(100) == b"STARTTLS\r\n"
        join = run_thread(lambda: server_context.wrap_socket(server, server_side=True))
        tls_client = client_context.wrap_socket(client, server_hostname="localhost")
        tls_server = join()
        with tls_client, tls_server:
            tls_client.sendall(b"AUTH secret\r\n")
            assert tls_server.recv(100) == b"AUTH secret\r\n"
            tls_server.sendall(b"235 ok\r\n")
            assert tls_client.recv(100) == b"235 ok\r\n"


def test_wrapping_takes_the_socket_over(patched, contexts):  # noqa: F811
    """As the stdlib's wrap_socket() detaches what it wraps: the plain
    socket is done (closing it changes nothing), the TLS socket has its
    timeout, in gettimeout() and the ``timeout`` attribute alike."""
    server_context, client_context = contexts
    with blocking_pair(patched, timeout=7.0) as (client, server):
        join = run_thread(lambda: server_context.wrap_socket(server, server_side=True))
        tls_client = client_context.wrap_socket(client, server_hostname="localhost")
        tls_server = join()
        assert client.fileno() == -1 and server.fileno() == -1
        client.close()
        server.close()
        with tls_client, tls_server:
            assert tls_client.timeout == tls_client.gettimeout() == 7.0
            tls_client.settimeout(3.0)
            assert tls_client.timeout == tls_client.gettimeout() == 3.0
            tls_client.sendall(b"after the plain sockets closed")
            assert tls_server.recv(100) == b"after the plain sockets closed"


def _send_all_non_blocking(sock: ssl.SSLSocket, data: bytes, received: bytearray,
                           reader: ssl.SSLSocket) -> int:
    """``data`` through the non-blocking ``sock`` as an event loop sends
    it: on SSLWantWriteError the same bytes again (OpenSSL's contract),
    once ``reader`` (same thread) has taken what it can. The number of
    SSLWantWriteErrors."""
    view = memoryview(data)
    cut_short = 0
    while view:
        try:
            view = view[sock.send(view[:256 * 1024]):]
        except ssl.SSLWantWriteError:
            cut_short += 1
            _read_what_waits(reader, received)
    return cut_short


def _read_what_waits(sock: ssl.SSLSocket, received: bytearray) -> None:
    select.select([sock], [], [], TIMEOUT)
    while True:
        try:
            data = sock.recv(MiB)
        except ssl.SSLWantReadError:
            return
        assert data
        received += data


def _send_until_cut_short(sock: ssl.SSLSocket, data: bytes) -> memoryview:
    """Non-blocking sends of ``data`` until one raises SSLWantWriteError:
    what is left, starting with the bytes of the send cut short (its retry
    must pass them again)."""
    view = memoryview(data)
    with pytest.raises(ssl.SSLWantWriteError):
        while True:
            view = view[sock.send(view[:256 * 1024]):]
    return view


def _more_than_fits(writer: ssl.SSLSocket, reader: ssl.SSLSocket) -> int:
    """A size no send buffer and receive buffer take at once: their sizes
    as the sockets report them (the kernel may have grown SO_SNDBUF past
    4 MiB for a loopback connection, from metrics it keeps per
    destination), and more."""
    return (writer.getsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF)
            + reader.getsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF) + 4 * MiB)


def _read_until(sock: ssl.SSLSocket, received: bytearray, size: int) -> None:
    while len(received) < size:
        _read_what_waits(sock, received)


def test_a_non_blocking_write_cut_short_is_sent_once(patched, tls_pair):  # noqa: F811
    """A non-blocking TLS send() the socket cannot take whole raises
    SSLWantWriteError; its retry with the same bytes sends them once:
    what arrives is what was sent, nothing twice."""
    client, server = tls_pair
    client.setblocking(False)
    server.setblocking(False)
    payload = random.Random(7).randbytes(_more_than_fits(client, server))
    received = bytearray()
    assert _send_all_non_blocking(client, payload, received, server) > 0
    _read_until(server, received, len(payload))
    assert received == payload


def test_a_read_is_not_held_up_by_a_write_cut_short(patched, tls_pair):  # noqa: F811
    """While a non-blocking write waits for room (SSLWantWriteError), the
    same socket still reads what its peer sent, as OpenSSL's read does."""
    client, server = tls_pair
    server.sendall(b"hello")
    client.setblocking(False)
    payload = random.Random(8).randbytes(_more_than_fits(client, server))
    view = _send_until_cut_short(client, payload)
    select.select([client], [], [], TIMEOUT)
    assert client.recv(100) == b"hello"
    # The write cut short goes on, then the rest, once the peer reads.
    server.setblocking(False)
    received = bytearray()
    _send_all_non_blocking(client, bytes(view), received, server)
    _read_until(server, received, len(payload))
    assert received == payload


def test_a_write_cut_short_then_a_reset_fails_for_good(patched, tls_pair):  # noqa: F811
    """A non-blocking write cut short, whose peer then resets: retrying it
    fails, and so do later writes; none claims to have sent anything."""
    client, server = tls_pair
    client.setblocking(False)
    payload = random.Random(9).randbytes(_more_than_fits(client, server))
    view = _send_until_cut_short(client, payload)
    server.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    server.close()
    select.select([], [client], [], TIMEOUT)
    for _ in range(3):
        with pytest.raises(OSError) as caught:
            client.send(view[:256 * 1024])
        assert not isinstance(caught.value, ssl.SSLWantWriteError)


# How the ssl module reports a reset under TLS over OpenSSL 3: before 3.13
# as the stream's end cut short (SSLEOFError; b"" from a read with
# suppress_ragged_eofs), from 3.13 on (gh-115627) as the socket's error.
RESET_IS_TLS_EOF = sys.version_info < (3, 13)
openssl_3 = pytest.mark.skipif(ssl.OPENSSL_VERSION_INFO < (3,), reason="OpenSSL 3's report of a reset under TLS")


def _reset_under_tls(client: ssl.SSLSocket, server: ssl.SSLSocket) -> None:
    """The server closes over bytes it did not read (a reset, no close_notify)."""
    client.sendall(b"read")
    assert receive_exactly(server, 4) == b"read"
    client.sendall(b"never read")
    assert select.select([server], [], [], TIMEOUT)[0] == [server]
    server.close()


@openssl_3
def test_a_reset_under_tls_reads_as_the_ssl_module_reports_it(patched, tls_pair):  # noqa: F811
    """A read: b"" before 3.13; from 3.13 on ConnectionResetError, then
    b"" (the socket shows the reset once). A write after it: SSLEOFError
    (urllib3 tells a proxy's TLS failure by it)."""
    client, server = tls_pair
    _reset_under_tls(client, server)
    if not RESET_IS_TLS_EOF:
        with pytest.raises(ConnectionResetError):
            client.recv(100)
    assert client.recv(100) == b""
    with pytest.raises(ssl.SSLEOFError) as caught:
        client.send(b"more")
    assert caught.value.args[0] == ssl.SSL_ERROR_EOF


@openssl_3
def test_a_reset_under_tls_writes_as_the_ssl_module_reports_it(patched, tls_pair):  # noqa: F811
    """Writes: SSLEOFError before 3.13; from 3.13 on the socket's errors,
    ConnectionResetError, then BrokenPipeError."""
    client, server = tls_pair
    _reset_under_tls(client, server)
    for expected in [ssl.SSLEOFError] * 2 if RESET_IS_TLS_EOF else [ConnectionResetError, BrokenPipeError]:
        with pytest.raises(expected):
            client.send(b"more")
    assert client.recv(100) == b""


def test_select_sees_each_tls_record_till_the_close(patched, tls_pair):  # noqa: F811
    """A TLS socket takes one record at a time off the connection, as
    OpenSSL reads a socket: the records still to come keep it readable for
    select() (a select-driven server sees them, then the close_notify)."""
    client, server = tls_pair
    records = [bytes([65 + i]) * 1000 for i in range(8)]
    for record in records:
        client.sendall(record)
    unwrapped = run_thread(client.unwrap)
    for record in records:
        assert select.select([server], [], [], TIMEOUT)[0] == [server]
        assert server.recv(1000) == record
    assert select.select([server], [], [], TIMEOUT)[0] == [server]
    server.unwrap()
    unwrapped()


def test_plain_bytes_to_a_tls_server_reset_the_client(patched, contexts):  # noqa: F811
    """A TLS server that fails the handshake on plain HTTP closes over the
    bytes it did not read: the client sees a reset, as over TCP."""
    server_context, _ = contexts
    with blocking_pair(patched) as (client, server):
        client.sendall(b"GET / HTTP/1.1\r\nHost: localhost\r\n" + b"X-Pad: x\r\n" * 50 + b"\r\n")
        with pytest.raises(ssl.SSLError):
            server_context.wrap_socket(server, server_side=True)
        server.close()
        with pytest.raises(ConnectionResetError):
            while client.recv(100):
                pass


def _pyopenssl_client(sock: socket.socket) -> Any:
    from OpenSSL import SSL

    context = SSL.Context(SSL.TLS_CLIENT_METHOD)
    context.set_verify(SSL.VERIFY_NONE)
    connection = SSL.Connection(context, sock)
    connection.set_connect_state()
    connection.set_tlsext_host_name(b"localhost")
    return connection


def test_pyopenssl_on_a_paired_socket(patched, contexts):  # noqa: F811
    """pyOpenSSL's SSL.Connection does its I/O on the descriptor: given a
    friend socket, the connection goes on over TCP first, and the TLS
    session runs as over TCP (urllib3's pyOpenSSL injection, cheroot's
    pyOpenSSL adapter)."""
    server_context, _ = contexts
    with blocking_pair(patched) as (client, server):
        join = run_thread(lambda: server_context.wrap_socket(server, server_side=True))
        client.settimeout(None)  # pyOpenSSL's blocking calls want a blocking descriptor
        connection = _pyopenssl_client(client)
        connection.do_handshake()
        with join() as tls_server:
            assert not friendsock.is_friend(client)
            connection.sendall(b"over pyOpenSSL")
            assert tls_server.recv(100) == b"over pyOpenSSL"
            tls_server.sendall(b"and back")
            assert connection.recv(100) == b"and back"


def test_pyopenssl_on_a_link_to_an_event_loop_fails_clearly(patched, server_loop):  # noqa: F811
    """A friend socket whose friend is an event loop's end cannot hand its
    connection to TCP: SSL.Connection fails at once (EOPNOTSUPP), where
    its I/O on the descriptor would wait forever; over TCP it is made."""
    async def read_to_eof(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        writer.write(b"hi")  # the client waits for it: the server has the connection
        await reader.read()
        writer.close()
        await writer.wait_closed()

    async def start() -> asyncio.AbstractServer:
        return await friendsock.start_server(read_to_eof, "127.0.0.1", 0, friends=patched)

    async def stop(server: asyncio.AbstractServer) -> None:
        server.close()
        await server.wait_closed()

    server = server_loop.run(start())
    try:
        with socket.create_connection(server.sockets[0].getsockname(), timeout=10) as client:
            assert friendsock.is_friend(client) is patched
            assert client.recv(2) == b"hi"
            if patched:
                with pytest.raises(OSError) as caught:
                    _pyopenssl_client(client)
                assert caught.value.errno == errno.EOPNOTSUPP
                client.sendall(b"still a friend socket")  # and it still works
            else:
                _pyopenssl_client(client)
            client.shutdown(socket.SHUT_WR)
            assert client.recv(10) == b""  # the handler read to EOF, and closed
    finally:
        server_loop.run(stop(server))


def test_data_then_a_reset_before_the_handshake_is_refused(patched, contexts):  # noqa: F811
    """As the stdlib's wrap_socket checks: a peer that sent bytes and reset
    before any TLS makes the wrap fail (the bytes must not pass for TLS)."""
    _, client_context = contexts
    with blocking_pair(patched) as (client, server):
        server.sendall(b"before the handshake")
        server.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
        server.close()
        with pytest.raises(ssl.SSLError, match="Closed before TLS handshake with data"):
            client_context.wrap_socket(client, server_hostname="localhost")


def test_a_wrong_certificate_fails_the_handshake_on_both_ends(patched, contexts):  # noqa: F811
    server_context, _ = contexts
    stranger = ssl.create_default_context()  # trusts nothing of ours
    with blocking_pair(patched) as (client, server):
        join = run_thread(lambda: server_context.wrap_socket(server, server_side=True))
        with pytest.raises(ssl.SSLCertVerificationError):
            stranger.wrap_socket(client, server_hostname="localhost")
        with pytest.raises(ssl.SSLError, match="ALERT_UNKNOWN_CA"):  # the client's alert came
            join()


def test_http_client_https_to_an_asyncio_server_in_another_thread(patched, server_loop, contexts):  # noqa: F811
    """``http.client.HTTPSConnection`` (what urllib and urllib3 build on) to
    an asyncio TLS server on a loop of its own."""
    server_context, client_context = contexts

    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        while (await reader.readline()).strip():
            pass
        body = b"x" * 100_000
        writer.write(b"HTTP/1.1 200 OK\r\nContent-Length: %d\r\n\r\n" % len(body) + body)
        await writer.drain()
        writer.close()

    async def start() -> asyncio.AbstractServer:
        return await friendsock.start_server(handle, LOCALHOST, 0, ssl=server_context,
                                             friends=patched)

    server = server_loop.run(start())
    try:
        before = friendsock.stats().links_made
        port = server.sockets[0].getsockname()[1]
        connection = http.client.HTTPSConnection("localhost", port, timeout=TIMEOUT,
                                                 context=client_context)
        try:
            connection.request("GET", "/")
            response = connection.getresponse()
            assert response.status == 200 and response.read() == b"x" * 100_000
            assert (type(connection.sock) is FriendSSLSocket) is patched
        finally:
            connection.close()
        assert friendsock.stats().links_made - before == (1 if patched else 0)
    finally:
        server_loop.close_server(server)


def test_wrap_socket_is_the_stdlibs_again_after_unpatching():
    native = ssl.SSLContext.wrap_socket
    friendsock.patch_socket()
    try:
        assert ssl.SSLContext.wrap_socket is not native
    finally:
        friendsock.unpatch_socket()
    assert ssl.SSLContext.wrap_socket is native


def test_a_friend_socket_under_tls_leaves_no_descriptor_behind(patched, contexts):  # noqa: F811
    """Its duplicate of the TCP descriptor goes with it, and a failed wrap
    closes nothing that is not its own."""


    server_context, client_context = contexts
    parker()  # this thread's, made by its first wait and kept for its life: not counted
    before = descriptors_open(collected=True)
    with blocking_pair(patched) as (client, server):
        join = run_thread(lambda: server_context.wrap_socket(server, server_side=True))
        with client_context.wrap_socket(client, server_hostname="localhost"), join():
            pass
    assert descriptors_open(collected=True) == before
    with blocking_pair(patched) as (client, server):
        server.close()  # no TLS there: the handshake fails
        with pytest.raises((ssl.SSLError, OSError)):
            client_context.wrap_socket(client, server_hostname="localhost")
        a, b = socket.socketpair()  # takes any descriptor number just freed
        with a, b:
            client.close()
            a.sendall(b"mine")
            assert b.recv(4) == b"mine"
    assert descriptors_open(collected=True) == before


def test_an_unclosed_tls_socket_warns_as_the_stdlibs_once(patched, contexts):  # noqa: F811
    """One ResourceWarning, naming it as the stdlib does ("unclosed
    <ssl.SSLSocket"), so a project's warning filters match alike."""
    server_context, client_context = contexts
    with blocking_pair(patched) as (client, server):
        join = run_thread(lambda: server_context.wrap_socket(server, server_side=True))
        tls = client_context.wrap_socket(client, server_hostname="localhost")
        port = tls.getsockname()[1]
        with join():
            with warnings.catch_warnings(record=True) as caught:
                warnings.simplefilter("always")
                del tls
                gc.collect()
    # Of this socket only: a collection may find what an earlier test left.
    messages = [str(w.message) for w in caught
                if issubclass(w.category, ResourceWarning) and str(w.message).startswith("unclosed <")
                and f"laddr=('127.0.0.1', {port})" in str(w.message)]
    assert len(messages) == 1 and messages[0].startswith("unclosed <ssl.SSLSocket fd="), messages


@pytest.mark.parametrize("api", ["installed", "explicit"])
@pytest.mark.parametrize("tls", [False, True], ids=["plain", "tls"])
async def test_a_paired_socket_handed_to_the_loop_goes_on_in_a_transport(patched, contexts, tls, api):  # noqa: F811
    """A blocking socket connected while patched (it paired), then handed to
    an installed loop with ``create_connection(sock=)``, as aiosmtplib's
    ``SMTP(sock=)`` does, or to friendsock's own: uvloop's own transport
    would do its I/O on the readiness descriptor; the link goes on in a
    friend transport, TLS over it or not."""
    server_context, client_context = contexts

    async def echo_line(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        writer.write(await reader.readline())
        await writer.drain()
        writer.close()

    installed = patched and api == "installed"
    open_connection = asyncio.open_connection if api == "installed" else friendsock.open_connection
    with friendsock.installed() if installed else contextlib.nullcontext():
        server = await friendsock.start_server(echo_line, LOCALHOST, 0, friends=patched,
                                               ssl=server_context if tls else None)
        try:
            sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            try:
                sock.settimeout(TIMEOUT)
                await asyncio.to_thread(sock.connect, server.sockets[0].getsockname())
            except BaseException:
                sock.close()
                raise
            assert friendsock.is_friend(sock) is patched
            options: Any = {"ssl": client_context, "server_hostname": "localhost"} if tls else {}
            reader, writer = await open_connection(sock=sock, **options)
            try:
                assert friendsock.is_friend(writer) is patched
                writer.write(b"hello\n")
                assert await asyncio.wait_for(reader.readline(), TIMEOUT) == b"hello\n"
                assert await asyncio.wait_for(reader.read(), TIMEOUT) == b""
            finally:
                writer.close()
            await asyncio.wait_for(writer.wait_closed(), TIMEOUT)
        finally:
            server.close()
            await server.wait_closed()


@pytest.mark.parametrize("tls", [False, True], ids=["plain", "tls"])
async def test_a_paired_accepted_socket_handed_to_the_loop_goes_on_in_a_transport(patched, contexts, tls):  # noqa: F811
    """A blocking listener's accepted socket (it paired) handed to an
    installed loop with ``connect_accepted_socket(sock=)``: the link goes
    on in a friend transport, TLS over it or not (the server's handshake
    runs while the client's, in a thread, does)."""
    server_context, client_context = contexts
    loop = asyncio.get_running_loop()
    with friendsock.installed() if patched else contextlib.nullcontext():
        with socket.create_server((LOCALHOST, 0)) as listener:
            with socket.create_connection(listener.getsockname(), timeout=TIMEOUT) as plain_client:
                accepted, _ = listener.accept()  # in the backlog already
                assert friendsock.is_friend(accepted) is patched
                client: Any = plain_client
                if tls:
                    (transport, _), client = await asyncio.gather(
                        loop.connect_accepted_socket(Recorder, sock=accepted, ssl=server_context),
                        asyncio.to_thread(client_context.wrap_socket, plain_client,
                                          server_hostname="localhost"),
                    )
                    # (uvloop's own returns its SSLProtocol there, not ours.)
                    protocol = transport.get_protocol()
                else:
                    transport, protocol = await loop.connect_accepted_socket(Recorder, sock=accepted)
                try:
                    assert friendsock.is_friend(transport) is patched
                    assert (transport.get_extra_info("ssl_object") is not None) is tls
                    await asyncio.to_thread(client.sendall, b"ping")
                    assert await asyncio.wait_for(protocol.wait_bytes(4), TIMEOUT) == b"ping"
                    transport.write(b"pong")
                    assert await asyncio.to_thread(receive_exactly, client, 4) == b"pong"
                finally:
                    transport.close()
                    # (A TLS close waits for the client's close_notify, or
                    # its going away.)
                    client.close()
                await asyncio.wait_for(protocol.lost, TIMEOUT)


# -- a TLS listener ------------------------------------------------------------------


def tls_listener(server_context: ssl.SSLContext, wrapped: str) -> ssl.SSLSocket:
    """A TLS listener made as servers make them: wrapped before ``listen()``
    (anyio's tests) or after (http.server's HTTPS recipe)."""
    if wrapped == "before-listen":
        listener = server_context.wrap_socket(socket.socket(), server_side=True)
        listener.bind((LOCALHOST, 0))
        listener.listen()
        return listener
    plain = socket.socket()
    plain.bind((LOCALHOST, 0))
    plain.listen()
    return server_context.wrap_socket(plain, server_side=True)


def serve_digest(listener: ssl.SSLSocket, size: int) -> Tuple[type, bool]:
    """Accept one TLS client, answer the SHA-256 of its ``size`` bytes: the
    accepted socket's class, and whether it is a friend."""
    conn, _ = listener.accept()
    with conn:
        conn.settimeout(TIMEOUT)
        conn.sendall(hashlib.sha256(receive_exactly(conn, size)).digest())
        return type(conn), friendsock.is_friend(conn)


@pytest.mark.parametrize("wrapped", ["before-listen", "after-listen"])
def test_a_tls_listener_pairs_a_blocking_client(patched, contexts, wrapped):  # noqa: F811
    server_context, client_context = contexts
    payload = random.Random(3).randbytes(100_003)
    with tls_listener(server_context, wrapped) as listener:
        assert isinstance(listener, ssl.SSLSocket)
        assert repr(listener).startswith("<ssl.SSLSocket fd=")
        address = listener.getsockname()
        join = run_thread(lambda: serve_digest(listener, len(payload)))
        with socket.create_connection(address, timeout=TIMEOUT) as plain:
            with client_context.wrap_socket(plain, server_hostname="localhost") as client:
                assert friendsock.is_friend(client) is patched
                client.sendall(payload)
                assert receive_exactly(client, 32) == hashlib.sha256(payload).digest()
        assert join() == ((FriendSSLSocket if patched else ssl.SSLSocket), patched)
    with pytest.raises(ConnectionRefusedError):  # closed: forgotten, as the kernel's
        socket.create_connection(address, timeout=TIMEOUT)


@pytest.mark.parametrize("wrapped", ["before-listen", "after-listen"])
async def test_a_tls_listener_pairs_an_event_loop_client(patched, contexts, wrapped):  # noqa: F811
    """A client on an installed loop connects before the listener's thread
    accepts: it waits for the claim, and pairs."""
    server_context, client_context = contexts
    payload = random.Random(4).randbytes(100_003)
    with friendsock.installed() if patched else contextlib.nullcontext():
        with tls_listener(server_context, wrapped) as listener:
            join = run_thread(lambda: serve_digest(listener, len(payload)))
            reader, writer = await asyncio.wait_for(asyncio.open_connection(
                *listener.getsockname(), ssl=client_context, server_hostname="localhost"), TIMEOUT)
            try:
                assert friendsock.is_friend(writer.transport) is patched
                writer.write(payload)
                digest = await asyncio.wait_for(reader.readexactly(32), TIMEOUT)
                assert digest == hashlib.sha256(payload).digest()
            finally:
                writer.close()
            assert await asyncio.to_thread(join) == ((FriendSSLSocket if patched else ssl.SSLSocket),
                                                     patched)


def test_a_context_with_a_tls_socket_class_of_its_own_keeps_it(patched):  # noqa: F811
    """``SSLContext.sslsocket_class`` set by its user: its listener is that
    class, doing its own I/O, and its clients' connections are TCP."""
    class TrackedSSLSocket(ssl.SSLSocket):
        pass

    server_context, client_context = tls_contexts(trustme.CA())
    server_context.sslsocket_class = TrackedSSLSocket
    with tls_listener(server_context, "before-listen") as listener:
        assert type(listener) is TrackedSSLSocket
        join = run_thread(lambda: serve_digest(listener, 5))
        with socket.create_connection(listener.getsockname(), timeout=TIMEOUT) as plain:
            with client_context.wrap_socket(plain, server_hostname="localhost") as client:
                assert not friendsock.is_friend(client)
                client.sendall(b"hello")
                assert receive_exactly(client, 32) == hashlib.sha256(b"hello").digest()
        assert join() == (TrackedSSLSocket, False)
