"""``friendsock.trio.install()``: unchanged trio code, trio sockets driven
directly, anyio on both backends, hypercorn's trio worker with httpx.

Each behaviour test runs on the friend path (installed) and on real TCP
(not installed: trio exactly as it is, the reference); both must agree.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import hashlib
import os
import random
import select
import errno
import socket
import struct
import ssl
import subprocess
import sys
import textwrap
from typing import Any, AsyncIterator, Iterator, List, Tuple

import anyio
import anyio.abc
import anyio.streams.tls
import pytest
import trio
import trio.testing
import trustme

import friendsock
import friendsock.trio as fst
from friendsock._trio._install import _SocketType
from trio import open_tcp_stream as open_tcp_stream_imported_early
from trio_support import (  # noqa: F401 (nothing_left_behind: an autouse fixture)
    LOCALHOST,
    MiB,
    TIMEOUT,
    capacity,
    fill,
    nothing_left_behind,
    receive_exactly,
    receive_until_eof,
    shrink_buffers,
    until_readable,
)
from support import run_inner_pytest

pytest_plugins = ["pytester"]

# Linux's (Python names it from 3.12 on; trio's own value).
IP_BIND_ADDRESS_NO_PORT = getattr(trio.socket, "IP_BIND_ADDRESS_NO_PORT", 24)


@pytest.fixture
def installed(friends: bool) -> Iterator[bool]:
    """The friend path: ``friendsock.trio.install()`` for the test; real TCP:
    trio as it is."""
    assert not fst.is_installed()
    if friends:
        fst.install()
    try:
        yield friends
    finally:
        fst.uninstall()


def links_made() -> int:
    return friendsock.stats().links_made


# -- unchanged trio code ------------------------------------------------------------


@pytest.mark.trio
async def test_serve_tcp_and_open_tcp_stream_pair(installed):
    before = links_made()
    payload = random.Random(1).randbytes(100_003)
    server_kinds = []

    async def echo(stream: trio.abc.Stream) -> None:
        server_kinds.append(fst.is_friend(stream))
        async with stream:
            got = await receive_exactly(stream, len(payload))
            await stream.send_all(got)

    async with trio.open_nursery() as nursery:
        listeners = await nursery.start(trio.serve_tcp, echo, 0)
        assert all(type(listener) is trio.SocketListener for listener in listeners)
        port = listeners[0].socket.getsockname()[1]
        with trio.fail_after(TIMEOUT):
            async with await trio.open_tcp_stream(LOCALHOST, port) as client:
                assert type(client) is trio.SocketStream
                assert fst.is_friend(client) is installed
                await client.send_all(payload)
                assert await receive_exactly(client, len(payload)) == payload
        nursery.cancel_scope.cancel()
    assert server_kinds == [installed]
    assert links_made() - before == (1 if installed else 0)


@pytest.mark.trio
async def test_connect_then_accept_in_one_task(installed):
    """trio's own listener: connect, send and send EOF before the accept."""
    listeners = await trio.open_tcp_listeners(0, host=LOCALHOST)
    async with listeners[0] as listener:
        port = listener.socket.getsockname()[1]
        with trio.fail_after(TIMEOUT):
            client = await trio.open_tcp_stream(LOCALHOST, port)
            async with client:
                await client.send_all(b"before the accept")
                await client.send_eof()
                async with await listener.accept() as server:
                    assert fst.is_friend(server) is fst.is_friend(client) is installed
                    assert await receive_until_eof(server) == b"before the accept"
                    await server.send_all(b"reply")
                assert await receive_until_eof(client) == b"reply"


@pytest.mark.trio
async def test_a_function_imported_before_install_pairs(installed):
    """``from trio import open_tcp_stream`` before install(): the same
    function, whose sockets pair; the stream is trio's own type."""
    assert open_tcp_stream_imported_early is trio.open_tcp_stream
    listeners = await trio.open_tcp_listeners(0, host=LOCALHOST)
    async with listeners[0] as listener:
        port = listener.socket.getsockname()[1]
        with trio.fail_after(TIMEOUT):
            async with await open_tcp_stream_imported_early("localhost", port) as client:
                assert type(client) is trio.SocketStream
                assert fst.is_friend(client) is installed
                assert friendsock.is_friend(client) is installed
                async with await listener.accept() as server:
                    assert type(server) is trio.SocketStream
                    assert fst.is_friend(server) is installed
                    await client.send_all(b"ping")
                    assert await server.receive_some() == b"ping"


@pytest.mark.trio
async def test_after_a_fork_listeners_pair_only_once_claimed(installed):
    """A forked child holds the listening socket too and could accept a
    connect made here: from the fork on, a connect pairs once this process's
    listener claims it (so connect-then-accept in one task is TCP), and
    still pairs when the accept runs meanwhile. A socketless connect has no
    kernel connection the child could take: it pairs either way."""
    listeners = await trio.open_tcp_listeners(0, host=LOCALHOST)
    async with listeners[0] as listener:
        port = listener.socket.getsockname()[1]
        pid = os.fork()
        if pid == 0:
            os._exit(0)
        assert os.waitpid(pid, 0)[1] == 0
        before = friendsock.stats()
        socketless = installed and friendsock.is_socketless()
        with trio.fail_after(TIMEOUT):  # connect, then accept: never claimed in time
            async with await trio.open_tcp_stream(LOCALHOST, port) as client:
                async with await listener.accept() as server:
                    assert fst.is_friend(client.socket) is fst.is_friend(server.socket) is socketless
                    await client.send_all(b"tcp")
                    assert await server.receive_some() == b"tcp"
        if installed:
            assert friendsock.stats().fallbacks.get("unconfirmed", 0) == \
                before.fallbacks.get("unconfirmed", 0) + (0 if socketless else 1)
        server_streams = []

        async def accept() -> None:
            server_streams.append(await listener.accept())

        with trio.fail_after(TIMEOUT):
            async with trio.open_nursery() as nursery:
                nursery.start_soon(accept)
                client = await trio.open_tcp_stream(LOCALHOST, port)
        async with client, server_streams[0] as server:
            assert fst.is_friend(client) is fst.is_friend(server) is installed
            await client.send_all(b"after the fork")
            assert await server.receive_some() == b"after the fork"


# -- trio sockets driven directly ----------------------------------------------------


async def socket_pair(host: str = LOCALHOST) -> Tuple[Any, Any, Any]:
    """(listening, client, server) trio sockets: bind, listen, connect, accept."""
    listening = trio.socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET)
    await listening.bind((host, 0))
    listening.listen()
    client = trio.socket.socket(listening.family)
    with trio.fail_after(TIMEOUT):
        await client.connect(listening.getsockname())
        server, address = await listening.accept()
    assert address == client.getsockname()
    return listening, client, server


@pytest.mark.trio
@pytest.mark.parametrize("host", [LOCALHOST, "::1"])
async def test_trio_sockets_pair_and_keep_the_socket_contract(installed, host):
    listening, client, server = await socket_pair(host)
    with listening, client, server:
        for sock in (client, server):
            assert fst.is_friend(sock) is installed
            assert isinstance(sock, trio.socket.SocketType)
        assert client.getpeername() == server.getsockname()
        assert client.getsockname() == server.getpeername()
        assert client.family == listening.family and client.type == socket.SOCK_STREAM
        assert not server.is_readable()
        assert await client.send(b"hello") == 5
        with trio.fail_after(TIMEOUT):
            await trio.testing.wait_all_tasks_blocked()
            while not server.is_readable():  # real TCP: loopback delivers at once
                await trio.sleep(0)
        buffer = bytearray(10)
        assert await server.recv_into(buffer, 3) == 3 and buffer[:3] == b"hel"
        assert await server.recvfrom(10) == (b"lo", None)
        client.shutdown(socket.SHUT_WR)
        assert client.did_shutdown_SHUT_WR
        assert await server.recv(10) == b""
        with pytest.raises(BrokenPipeError):
            await client.send(b"after shutdown")
        await server.send(b"still open this way")
        assert await socket_receive_exactly(client, 19) == b"still open this way"
        await trio.testing.wait_all_tasks_blocked()
        server.close()
        assert server.fileno() == -1
        with pytest.raises(OSError):
            server.getpeername()
        assert await client.recv(10) == b""


async def socket_receive_exactly(sock: Any, size: int) -> bytes:
    """``size`` bytes from a trio socket (fewer only at EOF)."""
    got = bytearray()
    with trio.fail_after(TIMEOUT):
        while len(got) < size and (data := await sock.recv(size - len(got))):
            got += data
    return bytes(got)


@pytest.mark.trio
async def test_send_takes_what_fits_and_bytes_arrive_in_order(installed):
    listening, client, server = await socket_pair()
    with listening, client, server:
        payload = random.Random(2).randbytes(16 * MiB)
        first = await client.send(payload)
        assert 0 < first < len(payload)  # the rest does not fit: sent in part
        if installed:
            assert first == capacity(client, server)

        async def send_rest() -> None:
            view = memoryview(payload)[first:]
            while view:
                view = view[await client.send(view):]
            client.shutdown(socket.SHUT_WR)

        async with trio.open_nursery() as nursery:
            nursery.start_soon(send_rest)
            got = bytearray()
            with trio.fail_after(TIMEOUT):
                while data := await server.recv(random.choice([1, 1000, 1 << 20])):
                    got += data
        assert hashlib.sha256(got).digest() == hashlib.sha256(payload).digest()


async def fill_socket(sock: Any, chunk: int = 65536) -> int:
    """send() until it waits for room (nothing else runnable), then cancel
    it; returns how many bytes send() took."""
    sent = 0

    async def sender() -> None:
        nonlocal sent
        while True:
            sent += await sock.send(b"x" * chunk)

    async with trio.open_nursery() as nursery:
        nursery.start_soon(sender)
        await trio.testing.wait_all_tasks_blocked()
        nursery.cancel_scope.cancel()
    return sent


async def drain_socket(sock: Any) -> int:
    """recv() until EOF; returns how many bytes came, all b"x"."""
    got = 0
    with trio.fail_after(TIMEOUT):
        while data := await sock.recv(1 << 20):
            assert set(data) == {ord("x")}
            got += len(data)
    return got


@pytest.mark.trio
async def test_cancelled_send_sends_nothing(installed):
    listening, client, server = await socket_pair()
    with listening, client, server:
        sent = await fill_socket(client)  # its last send, parked, was cancelled
        with trio.CancelScope() as cancelled:
            cancelled.cancel()
            await client.send(b"x" * 10)
        client.shutdown(socket.SHUT_WR)
        assert await drain_socket(server) == sent


@pytest.mark.trio
async def test_close_with_unread_bytes_resets_the_peer(installed):
    listening, client, server = await socket_pair()
    with listening, client, server:
        await client.send(b"never read")
        await server.send(b"read")
        with trio.fail_after(TIMEOUT):
            await trio.testing.wait_all_tasks_blocked()
            while not server.is_readable():
                await trio.sleep(0)
        server.close()
        with trio.fail_after(TIMEOUT):
            assert await client.recv(10) == b"read"
            with pytest.raises(ConnectionResetError):
                await client.recv(10)
            # Reported once, as the kernel clears the error it reports:
            # then EOF, and a send gets EPIPE.
            assert await client.recv(10) == b""
            assert client.getsockopt(socket.SOL_SOCKET, socket.SO_ERROR) == 0
            with pytest.raises(BrokenPipeError):
                await client.send(b"")


@pytest.mark.trio
async def test_a_reset_is_pending_until_a_call_reports_it(installed):
    listening, client, server = await socket_pair()
    with listening, client, server:
        await client.send(b"never read")
        with trio.fail_after(TIMEOUT):
            await until_readable(server)
            server.close()
            await until_readable(client)
        assert client.getsockopt(socket.SOL_SOCKET, socket.SO_ERROR) == errno.ECONNRESET
        with pytest.raises(BrokenPipeError):
            await client.send(b"x")
        assert await client.recv(10) == b""


@pytest.mark.trio
async def test_bytes_that_come_after_shutdown_read_are_read(installed):
    listening, client, server = await socket_pair()
    with listening, client, server:
        server.shutdown(socket.SHUT_RD)
        await client.send(b"late")
        with trio.fail_after(TIMEOUT):
            await until_readable(server)
            assert await server.recv(10) == b"late"
            assert await server.recv(10) == b""


@pytest.mark.trio
async def test_wait_writable_and_socket_options(installed):
    listening, client, server = await socket_pair()
    with listening, client, server:
        with trio.fail_after(TIMEOUT):
            await client.wait_writable()
        client.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, 8192)
        server.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 8192)
        assert client.getsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF) == 16384
        sent = await fill_socket(client, 4096)
        if installed:
            assert sent == capacity(client, server)
        writable = trio.Event()

        async def wait_writable() -> None:
            await client.wait_writable()
            writable.set()

        async with trio.open_nursery() as nursery:
            nursery.start_soon(wait_writable)
            await trio.testing.wait_all_tasks_blocked()
            assert not writable.is_set()
            client.shutdown(socket.SHUT_WR)
            assert await drain_socket(server) == sent
            with trio.fail_after(TIMEOUT):
                await writable.wait()


@pytest.mark.trio
async def test_friend_sockets_refuse_what_would_bypass_the_link(installed):
    listening, client, server = await socket_pair()
    with listening, client, server:
        if not installed:
            client.dup().close()
            return
        with pytest.raises(OSError, match="not supported on a friend socket"):
            client.dup()
        with pytest.raises(OSError, match="not supported on a friend socket"):
            client.detach()
        with pytest.raises(OSError) as info:
            await client.connect(listening.getsockname())
        assert info.value.errno == 106  # EISCONN


@pytest.mark.trio
async def test_sendto_on_a_connected_socket_ignores_the_address(installed):
    listening, client, server = await socket_pair()
    with listening, client, server:
        assert await client.sendto(b"xx", ("127.0.0.1", 9)) == 2
        assert await client.sendto(b"x", 0, ("127.0.0.1", 9)) == 1
        client.shutdown(socket.SHUT_WR)
        assert await drain_socket(server) == 3


@pytest.mark.trio
async def test_calls_on_a_closed_socket_fail_as_trios_own(installed):
    listening, client, server = await socket_pair()
    with listening, client, server:
        client.close()
        for call in (client.listen, lambda: client.sendto(b"x", ("127.0.0.1", 9)),
                     lambda: client.connect(listening.getsockname())):
            with pytest.raises(OSError) as info:
                result = call()
                if result is not None:
                    await result
            assert info.value.errno == errno.EBADF
        with pytest.raises(ValueError):
            client.is_readable()
        with pytest.raises(ValueError):
            await client.wait_writable()


@pytest.mark.trio
async def test_a_socket_made_in_a_with_block_closes_its_end_on_leaving_it(installed):
    """``with trio.socket.socket() as s: await s.connect(...)``: leaving the
    block closes the socket, so its peer sees EOF (``with`` took __exit__
    before the connect made the socket a friend)."""
    listening = trio.socket.socket()
    await listening.bind((LOCALHOST, 0))
    listening.listen()
    with listening, trio.fail_after(TIMEOUT):
        with trio.socket.socket() as client:
            await client.connect(listening.getsockname())
            server, _ = await listening.accept()
            assert fst.is_friend(client) is fst.is_friend(server) is installed
            await client.send(b"last words")
        assert client.fileno() == -1
        with server:
            got = b""
            while data := await server.recv(100):
                got += data
            assert got == b"last words"


@pytest.mark.trio
@pytest.mark.parametrize("first", ["client", "server"])
async def test_closing_closes_the_real_socket_under_it(installed, first):
    """The real socket under a closed trio socket shows it closed
    (``fileno()`` -1), as anyio checks its raw socket after ``aclose()``,
    whichever end closes first, the client even before its accept; what
    it sent still arrives, then EOF."""
    listening = trio.socket.socket()
    await listening.bind((LOCALHOST, 0))
    listening.listen()
    with listening, trio.fail_after(TIMEOUT):
        client = trio.socket.socket()
        await client.connect(listening.getsockname())
        client_raw = client._sock
        await client.send(b"last words")
        if first == "client":
            client.close()  # before the accept: a connect still waiting in the backlog
            assert client_raw.fileno() == -1
        server, _ = await listening.accept()
        server_raw = server._sock
        assert fst.is_friend(server) is installed
        with server:
            assert await socket_receive_exactly(server, 10) == b"last words"
            if first == "client":
                assert await server.recv(10) == b""
            else:
                server.close()
                assert server_raw.fileno() == -1
                assert await client.recv(10) == b""
                client.close()
        assert (client_raw.fileno(), server_raw.fileno()) == (-1, -1)


@pytest.mark.trio
async def test_from_stdlib_socket_of_a_blocking_friend_socket(installed):
    """``trio.socket.from_stdlib_socket`` (anyio's ``SocketStream.from_socket``)
    of a patched blocking socket that paired with a blocking listener: its
    connection goes on over TCP, as the socket trio drives itself."""
    if installed:
        friendsock.patch_socket()
    try:
        with socket.create_server((LOCALHOST, 0)) as listening:
            blocking = socket.create_connection(listening.getsockname(), timeout=TIMEOUT)
            assert friendsock.is_friend(blocking) is installed
            blocking.sendall(b"sent blocking, ")
            blocking.setblocking(False)
            client = trio.socket.from_stdlib_socket(blocking)
            assert not fst.is_friend(client)
            server, _ = listening.accept()
            with client, server, trio.fail_after(TIMEOUT):
                server.settimeout(TIMEOUT)
                await client.send(b"sent from trio")
                expected = b"sent blocking, sent from trio"
                got = await trio.to_thread.run_sync(receive_blocking, server, len(expected))
                assert got == expected
                server.sendall(b"back")
                assert await socket_receive_exactly(client, 4) == b"back"
    finally:
        friendsock.unpatch_socket()


@pytest.mark.trio
@pytest.mark.parametrize("client", ["asyncio", "blocking"])
async def test_a_blocking_listener_handed_to_trio_keeps_its_backlog(installed, client):
    """A listening socket of the patched class handed to trio
    (``from_stdlib_socket``, as dnspython's test server does on its thread)
    after a client connected (a blocking one wrote too): trio's accept takes
    that connection, its bytes first, and it is a friend link, as a connect
    made after the hand-over is; none is reset."""
    if installed:
        friendsock.patch_socket()
    try:
        with socket.create_server((LOCALHOST, 0)) as listening:
            address = listening.getsockname()
            async def asyncio_exchange(request: bytes) -> bytes:
                reader, writer = await friendsock.open_connection(*address, friends=installed)
                try:
                    writer.write(request)
                    return await reader.readexactly(len(request))
                finally:
                    writer.close()

            def exchange(request: bytes) -> bytes:
                if client == "asyncio":
                    return asyncio.run(asyncio_exchange(request))
                with socket.create_connection(address, timeout=TIMEOUT) as blocking:
                    blocking.sendall(request)
                    return receive_blocking(blocking, len(request))

            async def echo_one(listener: trio.SocketListener) -> bool:
                async with await listener.accept() as stream:
                    await stream.send_all((await receive_exactly(stream, 5)).upper())
                    return fst.is_friend(stream)

            answers: List[bytes] = []
            with trio.fail_after(TIMEOUT):
                async with trio.open_nursery() as nursery:
                    nursery.start_soon(_append, answers, trio.to_thread.run_sync(exchange, b"early"))
                    # In the listener's accept queue: the kernel took the connect.
                    await trio.to_thread.run_sync(select.select, [listening], [], [], TIMEOUT)
                    listener = trio.SocketListener(trio.socket.from_stdlib_socket(listening))
                    paired = [await echo_one(listener)]
                async with trio.open_nursery() as nursery:
                    nursery.start_soon(_append, answers, trio.to_thread.run_sync(exchange, b"later"))
                    paired.append(await echo_one(listener))
            assert answers == [b"EARLY", b"LATER"]
            assert paired == [installed, installed]
    finally:
        friendsock.unpatch_socket()


async def _append(results: List[Any], awaitable: Any) -> None:
    results.append(await awaitable)


@pytest.mark.trio
@pytest.mark.parametrize("how", ["detach", "from_stdlib_socket"])
async def test_a_blocking_friend_of_a_trio_server_goes_on_over_tcp(installed, how):
    """A patched blocking client paired with a trio server, handed to code
    that does its own I/O on the descriptor (``detach()``, pyOpenSSL, trio's
    ``from_stdlib_socket``) while the server's task waits for bytes: the
    link goes on over TCP, the server's socket becomes trio's own again, and
    the bytes flow both ways, in order, then EOF."""
    served: List[bytes] = []
    if installed:
        friendsock.patch_socket()
    try:
        async def echo_twice(stream: trio.SocketStream) -> None:
            async with stream:
                for _ in range(2):
                    data = await receive_exactly(stream, 5)
                    served.append(data)
                    await stream.send_all(data.upper())
                served.append(await stream.receive_some(10))  # EOF
                served.append(b"friend" if fst.is_friend(stream) else b"tcp")

        async with trio.open_nursery() as nursery:
            listeners = await nursery.start(functools.partial(trio.serve_tcp, echo_twice, 0,
                                                              host=LOCALHOST))
            address = listeners[0].socket.getsockname()

            def client_thread() -> List[bytes]:
                blocking = socket.create_connection(address, timeout=TIMEOUT)
                assert friendsock.is_friend(blocking) is installed
                blocking.sendall(b"first")
                got = [receive_blocking(blocking, 5)]  # the server waits for more now
                with socket.socket(fileno=blocking.detach()) as plain:
                    plain.settimeout(TIMEOUT)
                    plain.sendall(b"after")
                    got.append(receive_blocking(plain, 5))
                    plain.shutdown(socket.SHUT_WR)
                    got.append(receive_blocking(plain, 10))
                blocking.close()
                return got

            if how == "detach":
                got = await trio.to_thread.run_sync(client_thread)
            else:
                got = await _blocking_then_trio(address, installed)
            nursery.cancel_scope.cancel()
        assert got == [b"FIRST", b"AFTER", b""]
        assert served == [b"first", b"after", b"", b"tcp"]
    finally:
        friendsock.unpatch_socket()


@pytest.mark.trio
async def test_a_fork_takes_a_blocking_friend_of_a_trio_socket_over_to_tcp(installed):
    """A fork hands a link between a blocking socket and a trio socket over
    to TCP, as one between two blocking sockets: in the parent both go on
    there, in order, the trio end as trio's own socket."""
    if installed:
        friendsock.patch_socket()
    try:
        listening = trio.socket.socket()
        await listening.bind((LOCALHOST, 0))
        listening.listen()
        with listening, trio.fail_after(TIMEOUT):
            blocking = socket.create_connection(listening.getsockname(), timeout=TIMEOUT)
            server, _ = await listening.accept()
            with blocking, server:
                assert fst.is_friend(server) is friendsock.is_friend(blocking) is installed
                blocking.sendall(b"before, ")
                pid = os.fork()
                if pid == 0:
                    os._exit(0)
                assert os.waitpid(pid, 0)[1] == 0
                assert not fst.is_friend(server) and not friendsock.is_friend(blocking)
                blocking.sendall(b"after")
                assert await socket_receive_exactly(server, 13) == b"before, after"
                await server.send(b"back")
                assert receive_blocking(blocking, 4) == b"back"
    finally:
        friendsock.unpatch_socket()


async def _blocking_then_trio(address: Any, installed: bool) -> List[Any]:
    """A blocking client's first exchange in a thread, the rest as a
    trio socket made of it (``from_stdlib_socket``)."""
    def first() -> socket.socket:
        blocking = socket.create_connection(address, timeout=TIMEOUT)
        assert friendsock.is_friend(blocking) is installed
        blocking.sendall(b"first")
        assert receive_blocking(blocking, 5) == b"FIRST"
        return blocking

    blocking = await trio.to_thread.run_sync(first)
    blocking.setblocking(False)
    with trio.socket.from_stdlib_socket(blocking) as client:
        assert not fst.is_friend(client)
        await client.send(b"after")
        answer = await socket_receive_exactly(client, 5)
        client.shutdown(socket.SHUT_WR)
        eof = await client.recv(10)
    return [b"FIRST", answer, eof]


def receive_blocking(sock: socket.socket, size: int) -> bytes:
    received = b""
    while len(received) < size and (chunk := sock.recv(size - len(received))):
        received += chunk
    return received


@pytest.mark.trio
async def test_a_connect_cancelled_while_resolving_closes_the_socket(installed):
    """As trio's own connect: cancelled anywhere in it (here in the name's
    look-up), the socket is closed."""
    listening = trio.socket.socket()
    await listening.bind((LOCALHOST, 0))
    listening.listen()
    with listening:
        client = trio.socket.socket()
        with trio.CancelScope() as scope:
            scope.cancel()
            await client.connect(("localhost", listening.getsockname()[1]))
        assert scope.cancelled_caught
        assert client.fileno() == -1


@pytest.mark.trio
async def test_accept_on_a_listener_closed_underfoot_is_a_checkpoint(installed):
    """trio's rule: every socket call that can block is a checkpoint, even
    one that fails at once."""
    listening = trio.socket.socket()
    await listening.bind((LOCALHOST, 0))
    listening.listen()
    listener = trio.SocketListener(listening)
    listening.close()
    with trio.testing.assert_checkpoints():
        with pytest.raises(trio.ClosedResourceError):
            await listener.accept()
    with trio.testing.assert_checkpoints():
        with pytest.raises(OSError):
            await listening.accept()


@pytest.mark.trio
@pytest.mark.parametrize("local_address", ["127.0.0.2", "0.0.0.0"])
async def test_open_tcp_stream_keeps_its_local_address(installed, local_address):
    """trio binds ``local_address=`` with IP_BIND_ADDRESS_NO_PORT (the port
    comes at connect()): the connection keeps that address, its two ends
    agree on each other's, and bytes flow both ways."""
    listeners = await trio.open_tcp_listeners(0, host=LOCALHOST)
    async with listeners[0] as listener:
        port = listener.socket.getsockname()[1]
        with trio.fail_after(TIMEOUT):
            async with await trio.open_tcp_stream(LOCALHOST, port, local_address=local_address) \
                    as client, await listener.accept() as server:
                assert fst.is_friend(client.socket) is fst.is_friend(server.socket) is installed
                sockname = client.socket.getsockname()
                assert sockname[0] == (LOCALHOST if local_address == "0.0.0.0" else local_address)
                assert sockname == server.socket.getpeername() and sockname[1] != 0
                if client.socket.fileno() != -1:  # (a socketless end has no such option)
                    assert client.socket.getsockopt(socket.IPPROTO_IP, IP_BIND_ADDRESS_NO_PORT)
                await client.send_all(b"ping")
                assert await receive_exactly(server, 4) == b"ping"
                await server.send_all(b"pong")
                assert await receive_exactly(client, 4) == b"pong"


@pytest.mark.trio
async def test_check_half_closeable_stream_over_trio_sockets(installed):
    """trio.SocketStream over sockets that paired themselves (anyio's and
    early-imported trio functions' kind of friend end)."""
    made = 0
    opened = []

    async def stream_maker():
        nonlocal made
        listening, client, server = await socket_pair()
        opened.append(listening)
        made += 1
        assert fst.is_friend(client) is fst.is_friend(server) is installed
        return trio.SocketStream(client), trio.SocketStream(server)

    async def clogged_stream_maker():
        client, server = await stream_maker()
        await shrink_buffers(client, server)
        await shrink_buffers(server, client)
        for writer in (client, server):
            await fill(writer)
        return client, server

    before = links_made()
    try:
        await trio.testing.check_half_closeable_stream(stream_maker, clogged_stream_maker)
    finally:
        for listening in opened:
            listening.close()
    assert made > 10
    assert links_made() - before == (made if installed else 0)


# -- install / uninstall ------------------------------------------------------------


def test_uninstall_restores_the_exact_objects():
    places = [
        (anyio, "create_tcp_listener"),
        (trio.socket, "from_stdlib_socket"),
        (_SocketType, "listen"),
        (_SocketType, "close"),
        (_SocketType, "connect"),
        (_SocketType, "accept"),
    ]
    missing = object()
    before = [vars(owner).get(name, missing) for owner, name in places]
    assert not fst.is_installed()
    fst.install()
    try:
        fst.install()  # idempotent
        assert fst.is_installed()
        during = [vars(owner).get(name, missing) for owner, name in places]
        assert all(now is not then for now, then in zip(during, before))
    finally:
        fst.uninstall()
    fst.uninstall()  # uninstalled already: nothing to do
    assert not fst.is_installed()
    after = [vars(owner).get(name, missing) for owner, name in places]
    assert all(now is then for now, then in zip(after, before))


# -- anyio on both backends -------------------------------------------------------------

BACKENDS = [
    pytest.param(("asyncio", {}), id="anyio-asyncio"),
    pytest.param(("asyncio", {"use_uvloop": True}), id="anyio-uvloop"),
    pytest.param(("trio", {}), id="anyio-trio"),
]


def run_anyio(backend: Tuple[str, dict], installed: bool, main: Any) -> Any:
    """``main()`` on anyio's ``backend``, friendsock installed the way that
    backend's user installs it (asyncio: on the running loop; trio: the
    process-wide patches, from the ``installed`` fixture)."""
    name, options = backend

    async def wrapper() -> Any:
        if installed and name == "asyncio":
            friendsock.install()
        with anyio.fail_after(TIMEOUT):
            return await main()

    return anyio.run(wrapper, backend=name, backend_options=options)


async def anyio_echo_exchange(payload: bytes, tls: "Tuple[ssl.SSLContext, ssl.SSLContext] | None" = None) -> bytes:
    async def echo(stream: anyio.abc.ByteStream) -> None:
        async with stream:
            got = bytearray()
            while len(got) < len(payload):
                got += await stream.receive()
            await stream.send(bytes(got))

    listener: Any = await anyio.create_tcp_listener(local_host=LOCALHOST)
    port = listener.extra(anyio.abc.SocketAttribute.local_port)
    if tls is not None:
        listener = anyio.streams.tls.TLSListener(listener, tls[0])
    async with listener, anyio.create_task_group() as group:
        group.start_soon(listener.serve, echo)
        # Serving: on asyncio a listener made elsewhere is first seen at its
        # first accept (anyio's accepts with loop.sock_accept).
        await anyio.wait_all_tasks_blocked()
        if tls is None:
            client = await anyio.connect_tcp(LOCALHOST, port)
        else:
            client = await anyio.connect_tcp(LOCALHOST, port, ssl_context=tls[1],
                                             tls_hostname="localhost")
        async with client:
            await client.send(payload)
            got = bytearray()
            while len(got) < len(payload):
                got += await client.receive()
        group.cancel_scope.cancel()
    return bytes(got)


@pytest.fixture
def patient_confirm(monkeypatch):
    # anyio's listeners are sockets made elsewhere (maybe shared with another
    # process): a connect pairs once they claim it, within CONFIRM_TIMEOUT.
    from friendsock import _handshake

    monkeypatch.setattr(_handshake, "CONFIRM_TIMEOUT", TIMEOUT)


@pytest.mark.parametrize("backend", BACKENDS)
def test_anyio_connect_tcp_and_create_tcp_listener_pair(installed, backend, patient_confirm):
    payload = random.Random(3).randbytes(4 * MiB)
    before = friendsock.stats()
    assert run_anyio(backend, installed, lambda: anyio_echo_exchange(payload)) == payload
    after = friendsock.stats()
    assert after.links_made - before.links_made == (1 if installed else 0)
    assert after.fallbacks == before.fallbacks


@pytest.mark.trio
@pytest.mark.parametrize("reuse_port", [False, True])
async def test_anyio_listeners_pair_from_connect_on_unless_reuse_port(installed, reuse_port, monkeypatch):
    """anyio's create_tcp_listener makes its sockets itself, in this process:
    as trio's own, a connect pairs from connect() on, so connect-then-accept
    in one task pairs. With reuse_port=True another process may listen on
    the port too: the connect waits for a claim, which a task that accepts
    only afterwards never gives in time (TCP, counted unconfirmed). A
    socketless connect has no kernel connection another process could
    take: it pairs at once either way."""
    from friendsock import _handshake

    monkeypatch.setattr(_handshake, "CONFIRM_TIMEOUT", 0.05)
    socketless = installed and friendsock.is_socketless()
    paired = installed and (socketless or not reuse_port)
    before = friendsock.stats()
    multi = await anyio.create_tcp_listener(local_host=LOCALHOST, reuse_port=reuse_port)
    async with multi:
        listener = multi.listeners[0]
        port = listener.extra(anyio.abc.SocketAttribute.local_port)
        with trio.fail_after(TIMEOUT):
            async with await anyio.connect_tcp(LOCALHOST, port) as client, \
                    await listener.accept() as server:
                await client.send(b"one task")
                assert await server.receive() == b"one task"
                for stream in (client, server):
                    sock = stream.extra(anyio.abc.SocketAttribute.raw_socket)
                    assert fst.is_friend(stream._trio_socket) is paired  # anyio's trio socket
                    assert (sock.fileno() >= 0) is not socketless
    after = friendsock.stats()
    assert after.links_made - before.links_made == (1 if paired else 0)
    unconfirmed = after.fallbacks.get("unconfirmed", 0) - before.fallbacks.get("unconfirmed", 0)
    assert unconfirmed == (1 if installed and reuse_port and not socketless else 0)


@contextlib.asynccontextmanager
async def anyio_streams(installed: bool) -> AsyncIterator[Tuple[anyio.abc.SocketStream, anyio.abc.SocketStream]]:
    """(client, server): anyio's own connect to its own listener."""
    multi = await anyio.create_tcp_listener(local_host=LOCALHOST)
    async with multi:
        port = multi.listeners[0].extra(anyio.abc.SocketAttribute.local_port)
        with trio.fail_after(TIMEOUT):
            async with await anyio.connect_tcp(LOCALHOST, port) as client, \
                    await multi.listeners[0].accept() as server:
                assert fst.is_friend(client._trio_socket) is installed
                yield client, server


@pytest.mark.trio
async def test_so_linger_set_on_anyios_raw_socket_resets(installed):
    """anyio hands out the real socket under a stream (its raw_socket), the
    place its users set options: SO_LINGER {1, 0} set there makes the
    stream's close reset the connection, as over TCP."""
    async with anyio_streams(installed) as (client, server):
        raw = server.extra(anyio.abc.SocketAttribute.raw_socket)
        raw.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
        await server.aclose()
        with pytest.raises(anyio.BrokenResourceError):
            await client.receive()


@pytest.mark.trio
async def test_buffer_sizes_set_on_anyios_raw_socket_bound_a_send(installed):
    """SO_SNDBUF and SO_RCVBUF set on the raw_socket of anyio's streams
    bound what a send hands over while the reader reads nothing, as over
    TCP: a send of far more waits for the reader. Friend links with a
    kernel socket under them and without (socketless)."""
    for socketless in ([False, True] if installed else [False]):
        friendsock.set_socketless(socketless)
        try:
            async with anyio_streams(installed) as (client, server):
                raw = anyio.abc.SocketAttribute.raw_socket
                assert (client.extra(raw).fileno() < 0) is socketless
                client.extra(raw).setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, 4096)
                server.extra(raw).setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
                # The default buffers take this much at once, these do not.
                with trio.move_on_after(0.5) as waited:
                    await client.send(bytes(1 * MiB))
                assert waited.cancelled_caught
        finally:
            friendsock.set_socketless(False)


@pytest.fixture(scope="module")
def tls_contexts() -> Tuple[ssl.SSLContext, ssl.SSLContext]:
    ca = trustme.CA()
    server_ctx = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    ca.issue_cert("localhost", LOCALHOST).configure_cert(server_ctx)
    client_ctx = ssl.create_default_context()
    ca.configure_trust(client_ctx)
    return server_ctx, client_ctx


@pytest.mark.parametrize("backend", BACKENDS)
def test_anyio_tls_over_a_friend_link(installed, backend, patient_confirm, tls_contexts):
    payload = random.Random(4).randbytes(1 * MiB)
    before = links_made()
    got = run_anyio(backend, installed, lambda: anyio_echo_exchange(payload, tls_contexts))
    assert got == payload
    assert links_made() - before == (1 if installed else 0)


@pytest.mark.trio
async def test_trio_ssl_over_a_friend_link(installed, tls_contexts):
    """trio.serve_ssl_over_tcp and trio.open_ssl_over_tcp_stream, unchanged:
    TLS runs over the friend link as over TCP (certificates verified)."""
    server_ctx, client_ctx = tls_contexts
    before = links_made()
    payload = random.Random(6).randbytes(256 * 1024)

    async def echo(stream: trio.SSLStream) -> None:
        async with stream:
            await stream.send_all(await receive_exactly(stream, len(payload)))

    async with trio.open_nursery() as nursery:
        listeners = await nursery.start(functools.partial(
            trio.serve_ssl_over_tcp, echo, 0, server_ctx, host=LOCALHOST))
        port = listeners[0].transport_listener.socket.getsockname()[1]
        with trio.fail_after(TIMEOUT):
            client = await trio.open_ssl_over_tcp_stream(LOCALHOST, port, ssl_context=client_ctx)
            async with client:
                assert fst.is_friend(client.transport_stream) is installed
                await client.send_all(payload)
                assert await receive_exactly(client, len(payload)) == payload
        nursery.cancel_scope.cancel()
    assert links_made() - before == (1 if installed else 0)


# -- hypercorn's trio worker and httpx on trio -------------------------------------------


async def asgi_echo(scope: dict, receive: Any, send: Any) -> None:
    if scope["type"] == "lifespan":
        while True:
            message = await receive()
            if message["type"] == "lifespan.startup":
                await send({"type": "lifespan.startup.complete"})
            elif message["type"] == "lifespan.shutdown":
                await send({"type": "lifespan.shutdown.complete"})
                return
    body = bytearray()
    while True:
        message = await receive()
        body += message.get("body", b"")
        if not message.get("more_body"):
            break
    await send({"type": "http.response.start", "status": 200,
                "headers": [(b"content-type", b"application/octet-stream")]})
    await send({"type": "http.response.body", "body": hashlib.sha256(body).digest() + bytes(body)})


@pytest.mark.trio
async def test_hypercorn_trio_worker_with_httpx_on_trio(installed, patient_confirm):
    import httpx
    from hypercorn.config import Config
    from hypercorn.trio import serve

    config = Config()
    config.bind = [f"{LOCALHOST}:0"]
    config.accesslog = None
    config.errorlog = None
    payload = random.Random(5).randbytes(4 * MiB)
    before = friendsock.stats()
    stop = trio.Event()
    async with trio.open_nursery() as nursery:
        binds = await nursery.start(lambda task_status: serve(asgi_echo, config, shutdown_trigger=stop.wait,
                                                               task_status=task_status))
        url = binds[0]
        with trio.fail_after(TIMEOUT):
            async with httpx.AsyncClient() as http:
                response = await http.post(url + "/echo", content=payload)
        stop.set()
    assert response.status_code == 200
    assert response.content == hashlib.sha256(payload).digest() + payload
    after = friendsock.stats()
    assert after.links_made - before.links_made == (1 if installed else 0)


# -- a peer in another process -------------------------------------------------------------


@pytest.mark.trio
async def test_a_peer_in_another_process_stays_tcp(installed):
    before = friendsock.stats()
    peer = textwrap.dedent("""
        import socket, sys
        with socket.create_connection(("127.0.0.1", int(sys.argv[1]))) as s:
            s.sendall(b"from another process")
            s.shutdown(socket.SHUT_WR)
            assert s.recv(100) == b"ack"
    """)
    listeners = await trio.open_tcp_listeners(0, host=LOCALHOST)
    async with listeners[0] as listener:
        port = listener.socket.getsockname()[1]
        async with trio.open_nursery() as nursery:
            process = await nursery.start(lambda task_status: trio.run_process(
                [sys.executable, "-c", peer, str(port)], task_status=task_status))
            with trio.fail_after(TIMEOUT):
                async with await listener.accept() as server:
                    assert type(server) is trio.SocketStream and not fst.is_friend(server)
                    assert await receive_until_eof(server) == b"from another process"
                    await server.send_all(b"ack")
        assert process.returncode == 0
    after = friendsock.stats()
    assert after.links_made == before.links_made
    if installed:
        assert after.fallbacks.get("peer-not-friend", 0) - before.fallbacks.get("peer-not-friend", 0) == 1


# -- the pytest plugin: pytest-trio and anyio's plugin, unchanged -----------------------------

# An unchanged trio exchange, as a test body and as a program's main().
TRIO_EXCHANGE = """
    async def echo(stream):
        async with stream:
            await stream.send_all(await stream.receive_some())

    async with trio.open_nursery() as nursery:
        listeners = await nursery.start(trio.serve_tcp, echo, 0)
        port = listeners[0].socket.getsockname()[1]
        async with await trio.open_tcp_stream("127.0.0.1", port) as client:
            await client.send_all(b"ping")
            assert await client.receive_some() == b"ping"
            {check}
        nursery.cancel_scope.cancel()
"""

TRIO_SUITE = """
import pytest
import trio
import friendsock

pytestmark = pytest.mark.{marker}


async def test_echo({fixtures}):
""" + TRIO_EXCHANGE


ANYIO_SUITE = """
import pytest
import anyio
import friendsock

pytestmark = pytest.mark.anyio


@pytest.fixture(params=["asyncio", "trio"])
def anyio_backend(request):
    return request.param


async def test_echo():
    async def echo(stream):
        async with stream:
            await stream.send(await stream.receive())

    listener = await anyio.create_tcp_listener(local_host="127.0.0.1")
    port = listener.extra(anyio.abc.SocketAttribute.local_port)
    async with listener, anyio.create_task_group() as group:
        group.start_soon(listener.serve, echo)
        await anyio.wait_all_tasks_blocked()  # serving (asyncio: seen at the first accept)
        async with await anyio.connect_tcp("127.0.0.1", port) as client:
            await client.send(b"ping")
            assert await client.receive() == b"ping"
        group.cancel_scope.cancel()
"""


def run_inner(pytester: pytest.Pytester, *args: str) -> pytest.RunResult:
    return run_inner_pytest(pytester, "-v", *args, timeout=60, needs=("trio",))


def test_plugin_covers_pytest_trio(pytester):
    pytester.makeini("[pytest]\ntrio_mode = false\n")
    pytester.makepyfile(test_suite=TRIO_SUITE.format(marker="trio", fixtures="", check=""))
    result = run_inner(pytester, "--friendsock")
    result.assert_outcomes(passed=1)
    result.stdout.fnmatch_lines(["*= friendsock =*", "links made:  1"])
    result = run_inner(pytester)
    result.assert_outcomes(passed=1)
    assert "links made" not in result.stdout.str()


def test_fixture_and_real_tcp_marker_under_pytest_trio(pytester):
    pytester.makepyfile(
        test_paired=TRIO_SUITE.format(marker="trio", fixtures="friendsock",
                                      check="friendsock.assert_paired(client)"),
        test_real=TRIO_SUITE.format(marker="trio", fixtures="friendsock",
                                    check="friendsock.assert_fell_back(client)")
        .replace("pytestmark = pytest.mark.trio", "pytestmark = [pytest.mark.trio, pytest.mark.real_tcp]"),
    )
    run_inner(pytester).assert_outcomes(passed=2)


def test_plugin_covers_anyio_on_both_backends(pytester):
    pytester.makeconftest("from friendsock import _handshake\n_handshake.CONFIRM_TIMEOUT = 10\n")
    pytester.makepyfile(test_suite=ANYIO_SUITE)
    result = run_inner(pytester, "--friendsock")
    result.assert_outcomes(passed=2)
    result.stdout.fnmatch_lines(["*= friendsock =*", "links made:  2", "fell back:   0"])


# -- switched on for a whole program ----------------------------------------------------------


@pytest.mark.parametrize("how", ["run", "FRIENDSOCK_INSTALL"])
def test_a_whole_unchanged_trio_program_pairs(tmp_path, how):
    program = tmp_path / "program.py"
    program.write_text("import trio\n\n\nasync def main():\n"
                       + TRIO_EXCHANGE.format(check="")
                       + "    print('done')\n\n\ntrio.run(main)\n")
    report = tmp_path / "report.json"
    env = {k: v for k, v in os.environ.items() if not k.startswith("FRIENDSOCK")}
    if how == "run":
        command = [sys.executable, "-m", "friendsock", "run", "-q", "--report", f"json={report}",
                   str(program)]
    else:
        command = [sys.executable, str(program)]
        env.update(FRIENDSOCK_INSTALL="1", FRIENDSOCK_REPORT=f"json={report}")
    result = subprocess.run(command, capture_output=True, text=True, timeout=60, env=env)
    assert result.returncode == 0, result.stderr
    assert result.stdout == "done\n"
    import json

    assert json.loads(report.read_text())["links_made"] == 1


def test_anyio_imported_after_the_switch_is_patched_too(tmp_path):
    """FRIENDSOCK_INSTALL=1 puts the trio patches in as trio is imported;
    anyio, imported later, gets its own then: its listener pairs a connect
    made before the accept in the same task (a shared listener would leave
    it waiting for a claim, then TCP)."""
    program = tmp_path / "program.py"
    program.write_text(textwrap.dedent("""
        import trio
        import anyio
        import anyio.abc
        import friendsock

        async def main():
            multi = await anyio.create_tcp_listener(local_host="127.0.0.1")
            async with multi:
                listener = multi.listeners[0]
                port = listener.extra(anyio.abc.SocketAttribute.local_port)
                async with await anyio.connect_tcp("127.0.0.1", port) as client, \\
                        await listener.accept() as server:
                    await client.send(b"late import")
                    assert await server.receive() == b"late import"
            stats = friendsock.stats()
            print(stats.links_made, dict(stats.fallbacks))

        anyio.run(main, backend="trio")
    """))
    env = {k: v for k, v in os.environ.items() if not k.startswith("FRIENDSOCK")}
    env["FRIENDSOCK_INSTALL"] = "1"
    result = subprocess.run([sys.executable, str(program)], capture_output=True, text=True,
                            timeout=60, env=env)
    assert result.returncode == 0, result.stderr
    assert result.stdout == "1 {}\n"
