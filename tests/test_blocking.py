"""Blocking sockets in threads (``friendsock.patch_socket()``).

Each behaviour test runs on the friend path (patched: the sockets pair) and
on real TCP (not patched: the stdlib's sockets, the reference); both must
agree. Waits are bounded by socket timeouts, thread joins and
``pytest-timeout``.
"""

from __future__ import annotations

import asyncio
import contextlib
import errno
import gc
import hashlib
import io
import os
import random
import select
import selectors
import socket
import struct
import threading
import time
import warnings
from typing import Any, Callable, Iterator, List, Tuple
from unittest import mock

import pytest
import uvloop

import friendsock
from friendsock._blocking._across import is_moved
from friendsock._blocking._readiness import Parker, wake
from friendsock._blocking._descriptor import OriginalSocket
from friendsock._blocking._paired import FriendBlockingSocket
from friendsock._report import since
from support import (answered_after_the_connect, cyclic_garbage_of_ours,  # noqa: F401 (a fixture)
                     every_loop_installed, patient_confirm, received_exactly,
                     resource_warnings_raised, run_inner_pytest, run_on)

pytest_plugins = ["pytester"]

LOCALHOST = "127.0.0.1"
TIMEOUT = 10
MiB = 1 << 20


@pytest.fixture
def patched(friends: bool) -> Iterator[bool]:
    """The friend path: ``patch_socket()`` for the test; real TCP: the
    stdlib's sockets as they are."""
    assert not friendsock.is_socket_patched()
    if friends:
        friendsock.patch_socket()
    try:
        yield friends
    finally:
        friendsock.unpatch_socket()
    assert socket.socket is OriginalSocket


@contextlib.contextmanager
def blocking_pair(patched: bool, timeout: float = TIMEOUT) -> Iterator[Tuple[socket.socket, socket.socket]]:
    """(client, server): ``create_server``, ``create_connection``, ``accept``
    in one thread (the connect pairs before the accept)."""
    with socket.create_server((LOCALHOST, 0)) as listener:
        client = socket.create_connection(listener.getsockname(), timeout=timeout)
        with client:
            server, address = listener.accept()
            with server:
                server.settimeout(timeout)
                assert address == client.getsockname()
                assert friendsock.is_friend(client) is friendsock.is_friend(server) is patched
                yield client, server


def test_a_replaced_socket_call_sees_every_connection(patched):
    """A test that replaces ``socket.socket.recv`` (aiosmtpd's mocks it to
    raise) means it for every socket, and over TCP every socket's recv()
    is that one: while it is replaced, connects do not pair; once it is put
    back, they pair again."""
    def connected() -> Tuple[socket.socket, socket.socket, socket.socket]:
        listener = socket.create_server((LOCALHOST, 0))
        client = socket.create_connection(listener.getsockname(), timeout=TIMEOUT)
        return listener, client, listener.accept()[0]

    with mock.patch("socket.socket.recv", side_effect=OSError(errno.EIO, "mocked")) as recv:
        listener, client, server = connected()
        with listener, client, server:
            assert not friendsock.is_friend(client) and not friendsock.is_friend(server)
            server.sendall(b"x")
            with pytest.raises(OSError, match="mocked"):
                client.recv(1)
            assert recv.call_count == 1
    with blocking_pair(patched) as (client, server):
        server.sendall(b"x")
        assert client.recv(1) == b"x"


def test_a_collected_listener_leaves_no_dead_reference_to_find(patched):
    """A patched listener that paired, closed, dropped and collected:
    nothing the collector can reach is a dead weak proxy of it (code that
    walks ``gc.get_objects()`` with ``isinstance()``, as anyio's tests do,
    raises ReferenceError at one)."""
    with blocking_pair(patched):
        pass
    gc.collect()
    for obj in gc.get_objects():
        isinstance(obj, socket.socket)


@pytest.mark.parametrize("restore", ["delattr", "setattr"])
def test_a_wrapper_around_a_socket_call_leaves_pairing_on(patched, restore):
    """A wrapper that goes on to the original call (blockbuster wraps every
    socket call around each test of anyio's and aiohttp's suites), put back
    by deleting it or by setting the original back: connects pair under it
    and after it, as without it."""
    original = socket.socket.recv
    calls = []

    def wrapper(self: socket.socket, *args: Any) -> bytes:
        calls.append(self)
        return original(self, *args)

    socket.socket.recv = wrapper  # type: ignore[method-assign]
    try:
        with blocking_pair(patched) as (client, server):
            server.sendall(b"x")
            assert client.recv(1) == b"x"
        # A paired socket's own recv() does the reading (not the wrapper's
        # original, the C call on the real descriptor).
        assert bool(calls) is not patched
    finally:
        if restore == "delattr":
            del socket.socket.recv
        else:
            socket.socket.recv = original  # type: ignore[method-assign]
    try:
        with blocking_pair(patched) as (client, server):
            server.sendall(b"y")
            assert client.recv(1) == b"y"
    finally:
        if "recv" in vars(socket.socket):  # set back: inherited again
            del socket.socket.recv



def run_thread(target: Callable[[], Any]) -> Callable[[], Any]:
    """Run ``target`` in a thread; returns a join that re-raises its error."""
    outcome: List[Any] = []

    def wrapper() -> None:
        try:
            outcome.append((True, target()))
        except BaseException as exc:  # noqa: BLE001 (handed to the joiner)
            outcome.append((False, exc))

    thread = threading.Thread(target=wrapper, daemon=True)
    thread.start()

    def join() -> Any:
        thread.join(TIMEOUT)
        assert not thread.is_alive(), "the thread did not finish"
        ok, value = outcome[0]
        if not ok:
            raise value
        return value

    return join


def receive_until_eof(sock: socket.socket) -> bytes:
    received = bytearray()
    while chunk := sock.recv(MiB):
        received += chunk
    return bytes(received)


def receive_exactly(sock: socket.socket, size: int) -> bytes:
    """``size`` bytes (fewer only at EOF)."""
    received = bytearray()
    while len(received) < size and (chunk := sock.recv(size - len(received))):
        received += chunk
    return bytes(received)


# -- an asyncio server on a loop in another thread --------------------------------


class ServerLoop:
    """An event loop (asyncio or uvloop) running in a thread of its own."""

    def __init__(self, kind: str) -> None:
        self.loop = asyncio.new_event_loop() if kind == "asyncio" else uvloop.new_event_loop()
        self.errors: List[dict] = []
        self.loop.set_exception_handler(lambda _loop, context: self.errors.append(context))
        self.thread = threading.Thread(target=self.loop.run_forever, daemon=True)
        self.thread.start()

    def run(self, coro: Any) -> Any:
        return asyncio.run_coroutine_threadsafe(coro, self.loop).result(TIMEOUT)

    def close_server(self, server: asyncio.AbstractServer) -> None:
        """Close ``server`` and wait until its connections are closed too: a
        loop stopped while one still closes (a TLS close waiting for the
        client's EOF) leaves its transport unclosed, a ResourceWarning in
        whatever test the collector runs in."""
        self.run(_close_and_wait(server))

    def close(self) -> None:
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(TIMEOUT)
        self.loop.close()


async def _close_and_wait(server: asyncio.AbstractServer) -> None:
    # wait_closed() first: on 3.11 it returns at once once close() ran.
    closed = asyncio.ensure_future(server.wait_closed())
    await asyncio.sleep(0)  # (its waiter is registered)
    server.close()
    await closed


@pytest.fixture(params=["asyncio", "uvloop"])
def server_loop(request) -> Iterator[ServerLoop]:
    side = ServerLoop(request.param)
    try:
        yield side
    finally:
        side.close()
    assert side.errors == []


async def _echo_lines(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    while line := await reader.readline():
        writer.write(line)
        await writer.drain()
    writer.close()


def test_client_pairs_with_an_asyncio_server_in_another_thread(patched, server_loop):
    async def start() -> asyncio.AbstractServer:
        return await friendsock.start_server(_echo_lines, LOCALHOST, 0, friends=patched)

    server = server_loop.run(start())
    try:
        before = friendsock.stats().links_made
        address = server.sockets[0].getsockname()
        with socket.create_connection(address, timeout=TIMEOUT) as client:
            assert isinstance(client, socket.socket)
            assert friendsock.is_friend(client) is patched
            assert client.getpeername() == address
            assert client.getsockname()[0] == LOCALHOST
            client.sendall(b"hello\n")
            assert client.recv(100) == b"hello\n"
            with client.makefile("rwb") as stream:
                stream.write(b"one\ntwo\n")
                stream.flush()
                assert stream.readline() == b"one\n"
                assert stream.readline() == b"two\n"
            payload = random.Random(1).randbytes(3 * MiB) + b"\n"
            join = run_thread(lambda: client.sendall(payload))
            received = bytearray()
            while len(received) < len(payload):
                received += client.recv(MiB)
            join()
            assert received == payload
            client.shutdown(socket.SHUT_WR)
            assert client.recv(100) == b""
        assert friendsock.stats().links_made - before == (1 if patched else 0)
    finally:
        server_loop.close_server(server)


@pytest.mark.parametrize("server_kind", ["blocking", "event-loop"])
def test_a_client_bound_to_the_wildcard_address_first_pairs_and_delivers(patched, server_loop, server_kind):
    """``create_connection(source_address=("", 0))``, as paho-mqtt always
    connects: bound to 0.0.0.0 with a port before connect(), its
    connection's address is the route's (127.0.0.1), which is what the
    server sees and claims it by. Its bytes reach the server, paired or
    not."""
    if server_kind == "event-loop":
        async def start() -> asyncio.AbstractServer:
            return await friendsock.start_server(_echo_lines, LOCALHOST, 0, friends=patched)

        server: Any = server_loop.run(start())
        address = server.sockets[0].getsockname()
        join = None
    else:
        server = socket.create_server((LOCALHOST, 0))
        address = server.getsockname()

        def echo_one_line() -> None:
            accepted, _ = server.accept()
            with accepted:
                accepted.sendall(accepted.makefile("rb").readline())

        join = run_thread(echo_one_line)
    try:
        with socket.create_connection(address, timeout=TIMEOUT, source_address=("", 0)) as client:
            assert friendsock.is_friend(client) is patched
            assert client.getsockname()[0] == LOCALHOST
            client.sendall(b"CONNECT\n")
            assert receive_exactly(client, 8) == b"CONNECT\n"
        if join is not None:
            join()
    finally:
        if server_kind == "event-loop":
            server_loop.close_server(server)
        else:
            server.close()


# -- the socket contract, both ends blocking ---------------------------------------


async def _install() -> None:
    friendsock.install()


async def _sock_connect(port: int) -> socket.socket:
    """What aiohttp's connector does first: connect a socket of its own."""
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setblocking(False)
    await asyncio.get_running_loop().sock_connect(sock, (LOCALHOST, port))
    return sock


async def serve_one_line(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    """A stream server's handler: one line back, then close."""
    writer.write(await reader.readline())
    writer.close()
    await writer.wait_closed()


@pytest.mark.parametrize("handed", ["itself", "dup"])
def test_a_listener_handed_to_an_event_loop_keeps_its_backlog(patched, server_loop, handed):
    """A blocking listener (or a duplicate of it, which accepts on the same
    queue) handed to a loop (start_server(sock=) makes it non-blocking): a
    client that connected, and wrote, while it was still blocking is
    served by the loop, its bytes first, as over TCP."""
    with socket.create_server((LOCALHOST, 0)) as listener:
        with socket.create_connection(listener.getsockname(), timeout=TIMEOUT) as client:
            assert friendsock.is_friend(client) is patched
            client.sendall(b"written before the loop took over\n")

            async def start() -> asyncio.AbstractServer:
                return await asyncio.start_server(
                    serve_one_line, sock=listener if handed == "itself" else listener.dup())

            server = server_loop.run(start())
            try:
                assert receive_until_eof(client) == b"written before the loop took over\n"
                assert not friendsock.is_friend(client)
            finally:
                server_loop.close_server(server)  # before the listener's with-block closes it


@pytest.mark.parametrize("client", ["blocking", "asyncio"])
def test_a_listener_handed_to_an_installed_loop_pairs_its_backlog(patched, server_loop, client):
    """A blocking listener handed to an installed loop (start_server(sock=),
    as a server started on another thread with a socket bound before): a
    client that connected (a blocking one wrote too) while the listener was
    still blocking is served, its bytes first, and is a friend, as one that
    connects later is; none is reset. (An asyncio client's connect waits for
    the claim: the listener's accept was not seen yet.)"""
    if patched:
        server_loop.run(_install())
    client_loop = ServerLoop("uvloop") if client == "asyncio" else None

    try:
        with socket.create_server((LOCALHOST, 0)) as listener:
            address = listener.getsockname()

            def connect_and_write(line: bytes, queued: bool) -> Callable[[], Tuple[bytes, bool]]:
                """Connects now, and writes (an asyncio client once its
                connect is claimed); what it returns reads the answer.
                ``queued``: nobody accepts yet, so the connect waits in the
                listener's accept queue when this returns."""
                if client_loop is None:
                    sock = socket.create_connection(address, timeout=TIMEOUT)
                    sock.sendall(line)

                    def answer() -> Tuple[bytes, bool]:
                        with sock:
                            return receive_until_eof(sock), friendsock.is_friend(sock)
                    return answer

                async def exchange() -> Tuple[bytes, bool]:
                    return await one_line_answered(
                        *await friendsock.open_connection(*address, friends=patched), line)

                answer = asyncio.run_coroutine_threadsafe(exchange(), client_loop.loop)
                if queued:  # the kernel took the connect
                    assert select.select([listener], [], [], TIMEOUT)[0] == [listener]
                return lambda: answer.result(TIMEOUT)

            early = connect_and_write(b"connected before the loop took over\n", queued=True)
            server = server_loop.run(asyncio.start_server(serve_one_line, sock=listener))
            try:
                answers = [early(), connect_and_write(b"written after\n", queued=False)()]
            finally:
                server_loop.close_server(server)  # before the listener's with-block closes it
        assert answers == [(b"connected before the loop took over\n", patched),
                           (b"written after\n", patched)]
    finally:
        if client_loop is not None:
            client_loop.close()


async def one_line_answered(reader: asyncio.StreamReader, writer: asyncio.StreamWriter,
                            line: bytes = b"a line\n") -> Tuple[bytes, bool]:
    """Writes ``line``, reads the answer to EOF, closes: (the answer, whether
    the connection was a friend link)."""
    writer.write(line)
    got = await reader.read()
    writer.close()
    await writer.wait_closed()
    return got, friendsock.is_friend(writer.transport)


def test_a_listener_handed_to_native_accept_serves_an_early_event_loop_client(patched, server_loop):
    """A blocking listener its thread hands to code that accepts natively
    (start_server(sock=) on a loop friendsock is not installed on) before
    its own accept() ever ran: an asyncio client that connected meanwhile
    is served over TCP, every byte, never reset (its transport could not
    go on over TCP once paired, so it waited for a claim that never came)."""
    client_loop = ServerLoop("asyncio")

    async def exchange(address: Any) -> Tuple[bytes, bool]:
        return await one_line_answered(*await friendsock.open_connection(*address, friends=patched))

    try:
        with socket.create_server((LOCALHOST, 0)) as listener:
            answer = asyncio.run_coroutine_threadsafe(exchange(listener.getsockname()), client_loop.loop)
            # In the listener's accept queue: the kernel took the connect.
            assert select.select([listener], [], [], TIMEOUT)[0] == [listener]
            server = server_loop.run(asyncio.start_server(serve_one_line, sock=listener))
            try:
                assert answer.result(TIMEOUT) == (b"a line\n", False)
            finally:
                server_loop.close_server(server)  # before the listener's with-block closes it
    finally:
        client_loop.close()


def test_a_blocking_client_handed_to_a_loop_before_its_accept_is_served_over_tcp(patched, server_loop):
    """A blocking client connected to a blocking listener that has not
    accepted yet, then handed to an installed loop (``open_connection(sock=)``,
    as asyncio's own test_ssl clients do), while the listener's thread hands
    the listener to code that accepts natively: the client is served over
    TCP, every byte, never reset (a transport, once paired, could not go on
    over TCP when the listener's accept turned out native)."""
    client_loop = ServerLoop("asyncio")

    async def hand_over(sock: socket.socket) -> Tuple[asyncio.StreamReader, asyncio.StreamWriter]:
        friendsock.install()
        return await asyncio.open_connection(sock=sock)

    try:
        with socket.create_server((LOCALHOST, 0)) as listener:
            sock = socket.create_connection(listener.getsockname(), timeout=TIMEOUT)
            reader, writer = client_loop.run(hand_over(sock))
            server = server_loop.run(asyncio.start_server(serve_one_line, sock=listener))
            try:
                assert client_loop.run(one_line_answered(reader, writer)) == (b"a line\n", False)
            finally:
                server_loop.close_server(server)  # before the listener's with-block closes it
    finally:
        client_loop.close()


@pytest.mark.parametrize("listener_timeout", [TIMEOUT, 0.05])
@pytest.mark.parametrize("client_sends", [True, False])
def test_an_accept_held_for_a_handover_that_never_comes_is_tcp(patched, server_loop, client_sends,
                                                                listener_timeout):
    """A client that connects with the loop's ``sock_connect`` pairs only
    once it hands its socket to the loop (``create_connection(sock=)``);
    the blocking accept that comes first waits for that (no longer than the
    listener's own timeout). A client that uses the socket raw instead
    (``client_sends``), or never hands it over, leaves the accepted socket
    TCP, with every byte."""
    if patched:
        server_loop.run(_install())
    before = friendsock.stats()
    with socket.create_server((LOCALHOST, 0)) as listener:
        port = listener.getsockname()[1]

        async def client() -> bytes:
            loop = asyncio.get_running_loop()
            sock = await _sock_connect(port)
            with sock:
                if client_sends:
                    await loop.sock_sendall(sock, b"raw request")
                reply = b""
                while not reply.endswith(b"!"):
                    reply += await loop.sock_recv(sock, 100)
                return reply

        answer = asyncio.run_coroutine_threadsafe(client(), server_loop.loop)
        # Accepting only once the connection is there: a short timeout
        # bounds the hold, never the accept itself.
        select.select([listener], [], [], TIMEOUT)
        listener.settimeout(listener_timeout)
        server, _ = listener.accept()
        with server:
            server.settimeout(TIMEOUT)
            assert not friendsock.is_friend(server)
            if client_sends:
                request = b""
                while request != b"raw request":
                    request += server.recv(100)
            server.sendall(b"raw answer!")
        assert answer.result(TIMEOUT) == b"raw answer!"
    if patched:
        assert friendsock.stats().links_made == before.links_made
        assert friendsock.stats().fallbacks.get("used-raw", 0) == before.fallbacks.get("used-raw", 0) + 1


def test_pair_keeps_the_socket_contract(patched):
    with blocking_pair(patched) as (client, server):
        for sock in (client, server):
            assert isinstance(sock, socket.socket)
            assert sock.family == socket.AF_INET and sock.type == socket.SOCK_STREAM
            assert sock.fileno() >= 0
        assert client.getpeername() == server.getsockname()
        assert client.getsockname() == server.getpeername()
        assert client.gettimeout() == TIMEOUT
        assert client.send(b"") == 0
        assert client.recv(0) == b""
        assert client.sendto(b"ab", ("192.0.2.1", 9)) == 2  # the address is ignored
        assert server.recvfrom(10) == (b"ab", None)
        client.sendall(bytearray(b"cdef"))
        buffer = bytearray(10)
        assert server.recv_into(buffer, 2) == 2 and buffer[:2] == b"cd"
        assert server.recvfrom_into(memoryview(buffer)[2:]) == (2, None) and buffer[:4] == b"cdef"
        client.sendall(b"peek")
        assert server.recv(4, socket.MSG_PEEK) == b"peek"
        assert server.recv(4) == b"peek"
        server.settimeout(None)  # in timeout mode the stdlib waits even so
        with pytest.raises(BlockingIOError):
            server.recv(4, socket.MSG_DONTWAIT)
        server.settimeout(TIMEOUT)
        with pytest.raises(ValueError):
            server.recv(-1)
        with pytest.raises(TypeError):
            server.recv_into(b"read-only")
        with pytest.raises(OSError) as caught:
            client.shutdown(99)
        assert caught.value.errno == errno.EINVAL
        client.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        assert client.getsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY)
    for sock in (client, server):
        assert sock.fileno() == -1
        with pytest.raises(OSError) as caught:
            sock.recv(1)
        assert caught.value.errno == errno.EBADF
        with pytest.raises(OSError) as caught:
            sock.getpeername()
        assert caught.value.errno == errno.EBADF


def test_timeouts_and_non_blocking_mode(patched):
    with blocking_pair(patched, timeout=0.05) as (client, server):
        with pytest.raises(TimeoutError):
            client.recv(10)
        client.setblocking(False)
        with pytest.raises(BlockingIOError):
            client.recv(10)
        sent = 0
        with pytest.raises(BlockingIOError):
            while True:
                sent += client.send(bytes(65536))
        assert sent > 0
        client.settimeout(0.05)
        with pytest.raises(TimeoutError):
            client.sendall(b"x" * MiB)
        with pytest.raises(TimeoutError):
            client.send(b"x")
        server.settimeout(TIMEOUT)
        join = run_thread(lambda: receive_until_eof(server))  # room made: sends go on
        client.settimeout(TIMEOUT)
        assert client.send(b"y") == 1
        client.shutdown(socket.SHUT_WR)
        assert len(join()) > sent


def test_half_close(patched):
    with blocking_pair(patched) as (client, server):
        client.sendall(b"request")
        client.shutdown(socket.SHUT_WR)
        with pytest.raises(BrokenPipeError):
            client.send(b"after shutdown")
        assert receive_until_eof(server) == b"request"
        assert server.recv(10) == b""  # EOF stays
        server.sendall(b"response")
        server.shutdown(socket.SHUT_WR)
        assert receive_until_eof(client) == b"response"


def test_a_shutdown_once_both_directions_finished_fails(patched):
    """Each end shut its writing down and read the other's EOF: TCP's
    sockets are closed by then, and a second shutdown fails with ENOTCONN."""
    with blocking_pair(patched) as (client, server):
        client.shutdown(socket.SHUT_WR)
        assert receive_until_eof(server) == b""
        server.shutdown(socket.SHUT_WR)
        assert receive_until_eof(client) == b""
        for sock in (client, server):
            with pytest.raises(OSError) as raised:
                sock.shutdown(socket.SHUT_WR)
            assert raised.value.errno == errno.ENOTCONN


@pytest.mark.parametrize("unread_by", ["server", "client"])
def test_a_shutdown_while_a_fin_waits_behind_unread_bytes_goes_through(patched, unread_by):
    """As above, but one end read nothing of the other's bytes, more than
    its receive buffer holds: TCP's FIN from the other end still waits
    behind them, the client's socket open, so its second shutdown goes
    through and it still names its peer."""
    with blocking_pair(patched) as (client, server):
        reader, writer = (server, client) if unread_by == "server" else (client, server)
        writer.setblocking(False)
        sent = 0
        with pytest.raises(BlockingIOError):
            while True:
                sent += writer.send(bytes(1 << 16))
        assert sent > reader.getsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF)
        writer.setblocking(True)
        for sock in (client, server):
            sock.shutdown(socket.SHUT_WR)
        if unread_by == "server":
            assert receive_until_eof(client) == b""
        client.shutdown(socket.SHUT_WR)
        assert client.getpeername() == server.getsockname()


def test_shutdown_read_gives_eof(patched):
    with blocking_pair(patched) as (client, server):
        server.shutdown(socket.SHUT_RD)
        assert server.recv(10) == b""
        assert select.select([server], [], [], 0)[0] == [server]


def test_recv_with_msg_waitall_waits_for_every_byte(patched):
    """A blocking recv(n, MSG_WAITALL) returns n bytes (Pyro5 reads so):
    more than the connection holds at once, written by a thread whose
    sendall waits for room; with MSG_PEEK, n bytes left in place; fewer at
    EOF. In timeout mode the stdlib polls, then reads what is there."""
    payload = random.Random(3).randbytes(4 * MiB)
    with blocking_pair(patched) as (client, server):
        writer = threading.Thread(target=lambda: (server.sendall(payload), server.sendall(b"PY"),
                                                  server.sendall(b"RO05"), server.sendall(b"tail"),
                                                  server.shutdown(socket.SHUT_WR)))
        writer.start()
        client.settimeout(None)
        try:
            received = client.recv(len(payload), socket.MSG_WAITALL)
            assert hashlib.sha256(received).digest() == hashlib.sha256(payload).digest()
            assert client.recv(6, socket.MSG_PEEK | socket.MSG_WAITALL) == b"PYRO05"
            buffer = bytearray(6)
            assert client.recv_into(buffer, 6, socket.MSG_WAITALL) == 6 and buffer == b"PYRO05"
            assert client.recv(10, socket.MSG_WAITALL) == b"tail"
            assert client.recv(10, socket.MSG_WAITALL) == b""
        finally:
            writer.join(TIMEOUT)
        client.settimeout(0.01)
        with pytest.raises(TimeoutError):
            server.settimeout(0.01)
            server.recv(10, socket.MSG_WAITALL)
        client.sendall(b"abc")
        server.settimeout(TIMEOUT)
        assert server.recv(10, socket.MSG_WAITALL) == b"abc"


def test_recv_with_msg_waitall_returns_what_came_before_a_reset(patched):
    """The friend's reset ends a blocking MSG_WAITALL read early with the
    bytes that came before it; the next read reports the reset."""
    with blocking_pair(patched) as (client, server):
        server.sendall(b"abc")
        server.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
        server.close()
        client.settimeout(None)
        assert client.recv(10, socket.MSG_WAITALL) == b"abc"
        with pytest.raises(ConnectionResetError):
            client.recv(10, socket.MSG_WAITALL)


def test_close_with_unread_bytes_resets_the_peer(patched):
    with blocking_pair(patched) as (client, server):
        client.sendall(b"never read")
        server.sendall(b"reply")
        server.close()
        # The reply sent before the reset may or may not still be read: TCP
        # drops what the receiver had not read when the RST arrives.
        with pytest.raises(ConnectionResetError):
            for _ in range(2):
                if client.recv(100) == b"":
                    break


def test_an_abortive_close_resets_the_peer(patched):
    """SO_LINGER {on, 0}: close() resets: the peer reads what had reached
    it, then ConnectionResetError; getpeername() is ENOTCONN from the
    reset on, and shutdown() of a number no C int holds is OverflowError."""
    with blocking_pair(patched) as (client, server):
        client.sendall(b"before the reset")
        client.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
        client.close()
        assert server.recv(100) == b"before the reset"
        with pytest.raises(OSError) as caught:
            server.getpeername()
        assert caught.value.errno == errno.ENOTCONN
        with pytest.raises(ConnectionResetError):
            server.recv(100)
        for how in (1 << 40, -(1 << 40)):
            with pytest.raises(OverflowError):
                server.shutdown(how)


def _reset_by_the_peer(client: socket.socket, server: socket.socket) -> None:
    """The server closes with the client's bytes unread: a reset, which the
    client has not looked at yet."""
    client.sendall(b"never read")
    assert select.select([server], [], [], TIMEOUT)[0] == [server]
    server.close()
    assert select.select([client], [], [], TIMEOUT)[0] == [client]


def _outcome(call: Callable[[], Any]) -> Any:
    try:
        return call()
    except OSError as exc:
        return type(exc).__name__


_ASK_ERROR = (socket.SOL_SOCKET, socket.SO_ERROR)


@pytest.mark.parametrize("calls, expected", [
    (["recv", "recv", "send"], ["ConnectionResetError", b"", "BrokenPipeError"]),
    (["send", "send", "recv"], ["ConnectionResetError", "BrokenPipeError", b""]),
    (["send empty", "send empty", "recv"], ["ConnectionResetError", "BrokenPipeError", b""]),
    (["SO_ERROR", "SO_ERROR", "send", "recv"], [errno.ECONNRESET, 0, "BrokenPipeError", b""]),
    (["SO_ERROR as bytes", "recv"], [struct.pack("i", errno.ECONNRESET), b""]),
], ids=["recv first", "send first", "empty send first", "SO_ERROR first", "SO_ERROR as bytes"])
def test_the_peers_reset_is_reported_once(patched, calls, expected):
    """The kernel leaves a reset's error pending, and the first call that
    reports it (a read with nothing left, any send, SO_ERROR) clears it:
    after that a read finds EOF and a send EPIPE (code that carries on
    after one ConnectionResetError must not see it forever)."""
    make = {
        "recv": lambda sock: sock.recv(100),
        "send": lambda sock: sock.send(b"x"),
        "send empty": lambda sock: sock.send(b""),
        "SO_ERROR": lambda sock: sock.getsockopt(*_ASK_ERROR),
        "SO_ERROR as bytes": lambda sock: sock.getsockopt(*_ASK_ERROR, 4),
    }
    with blocking_pair(patched) as (client, server):
        _reset_by_the_peer(client, server)
        assert [_outcome(lambda: make[call](client)) for call in calls] == expected


def test_poll_shows_the_peers_fin_and_reset(patched):
    """poll() events as TCP's: POLLRDHUP once the peer is done writing (or
    we shut our reading), POLLHUP too after its reset."""
    wanted = select.POLLIN | select.POLLOUT | select.POLLRDHUP | select.POLLHUP

    def events(sock: socket.socket) -> int:
        poller = select.poll()
        poller.register(sock, wanted)
        found = poller.poll(TIMEOUT * 1000)
        return found[0][1] & wanted if found else 0

    with blocking_pair(patched) as (client, server):
        assert events(client) == select.POLLOUT
        server.shutdown(socket.SHUT_WR)
        assert events(client) == select.POLLIN | select.POLLOUT | select.POLLRDHUP
        client.shutdown(socket.SHUT_WR)  # done both ways
        assert events(client) == wanted
        assert events(server) == wanted
    with blocking_pair(patched) as (client, server):
        client.shutdown(socket.SHUT_RD)
        assert events(client) == select.POLLIN | select.POLLOUT | select.POLLRDHUP
    with blocking_pair(patched) as (client, server):
        _reset_by_the_peer(client, server)
        assert events(client) == wanted


def test_bytes_that_come_after_shutdown_read_are_read(patched):
    """Linux's shutdown(SHUT_RD) does not stop the connection's bytes: a
    read gets what came, then EOF at once."""
    with blocking_pair(patched) as (client, server):
        server.shutdown(socket.SHUT_RD)
        client.sendall(b"late")
        assert select.select([server], [], [], TIMEOUT)[0] == [server]
        assert server.recv(100) == b"late"
        assert server.recv(100) == b""
        client.sendall(b"later")
        assert select.select([server], [], [], TIMEOUT)[0] == [server]
        buffer = bytearray(10)
        assert server.recv_into(buffer) == 5 and buffer[:5] == b"later"
        assert server.recv_into(buffer) == 0


def test_an_empty_send_is_checked_as_any_send(patched):
    with blocking_pair(patched) as (client, server):
        assert client.send(b"") == 0
        client.sendall(b"")
        client.shutdown(socket.SHUT_WR)
        with pytest.raises(BrokenPipeError):
            client.send(b"")
        with pytest.raises(BrokenPipeError):
            client.sendall(b"")
        assert server.recv(10) == b""


def test_calls_on_a_closed_socket_fail_as_the_stdlibs(patched):
    with blocking_pair(patched) as (client, server):
        client.close()
        assert client.recv(0) == b""  # answered before any check, as the C call does
        for call in (client.listen, lambda: client.recv(1), lambda: client.send(b"x")):
            with pytest.raises(OSError) as caught:
                call()
            assert caught.value.errno == errno.EBADF


@pytest.mark.parametrize("path_taken", ["sendfile", "_sendfile_use_sendfile"])
def test_sendfile_sends_all_once(patched, tmp_path, path_taken):
    """socket.sendfile(), and its os.sendfile() path that code may call
    itself (CPython's own tests do): all of the file, once, from the offset
    given and as much as asked, and the file's position after what was
    sent; a non-blocking socket is refused with ValueError, as the stdlib
    refuses it."""
    data = random.Random(3).randbytes(100_000)
    path = tmp_path / "file"
    path.write_bytes(data)
    with blocking_pair(patched) as (client, server):
        send = getattr(client, path_taken)
        with open(path, "rb") as file:
            assert send(file) == len(data)
            assert file.tell() == len(data)
            assert send(file, 10, 5000) == 5000
            assert file.tell() == 5010
            client.setblocking(False)
            with pytest.raises(ValueError):
                send(file)
            client.setblocking(True)
        if path_taken == "_sendfile_use_sendfile":  # what os.sendfile() cannot read
            with pytest.raises(socket._GiveupOnSendfile):  # type: ignore[attr-defined]
                send(io.BytesIO(b"no descriptor"))
        client.shutdown(socket.SHUT_WR)
        assert receive_until_eof(server) == data + data[10:5010]



@pytest.mark.parametrize("loop_kind", ["asyncio", "uvloop"])
def test_a_loop_sends_a_file_on_a_paired_socket(patched, tmp_path, loop_kind):
    """``loop.sock_sendfile()`` with a socket that paired (made non-blocking
    and handed to the loop's ``sock_*`` calls): asyncio's ``os.sendfile()``
    on its descriptor would not reach its connection (the send waited for
    ever); it takes asyncio's fallback through ``send()``: all of the file,
    once. uvloop has no ``sock_sendfile``, on either path."""
    data = random.Random(5).randbytes(300_000)
    path = tmp_path / "file"
    path.write_bytes(data)

    async def send(client: socket.socket) -> int:
        with open(path, "rb") as file:
            return await asyncio.wait_for(
                asyncio.get_running_loop().sock_sendfile(client, file), TIMEOUT)

    with blocking_pair(patched) as (client, server):
        received: List[bytes] = []
        reader = threading.Thread(target=lambda: received.append(receive_until_eof(server)))
        reader.start()
        try:
            client.setblocking(False)
            if loop_kind == "uvloop":
                with pytest.raises(NotImplementedError):
                    uvloop.run(send(client))
            else:
                assert asyncio.run(send(client)) == len(data)
        finally:
            client.shutdown(socket.SHUT_WR)
            reader.join(TIMEOUT)
        assert received == [data if loop_kind == "asyncio" else b""]

def test_sendmsg_gathers_and_recvmsg_scatters(patched):
    """sendmsg/recvmsg/recvmsg_into on a TCP connection: gather and scatter,
    no ancillary data, no address; bad arguments are the C call's
    TypeError, and send nothing."""
    with blocking_pair(patched) as (client, server):
        assert client.sendmsg([b"ab", bytearray(b"cd"), memoryview(b"ef")]) == 6
        for bad in ([object()], b"not in an iterable"):
            with pytest.raises(TypeError):
                client.sendmsg(bad)
        for ancdata in ([object()], [(0, 0)], [(0, 0, b"data", 42)], [(0, 0, object())]):
            with pytest.raises(TypeError):
                client.sendmsg([b"x"], ancdata)
        with pytest.raises(TypeError):
            client.sendmsg([b"x"], [], 0, object())
        assert server.recvmsg(2) == (b"ab", [], 0, None)
        first, second = bytearray(1), bytearray(10)
        assert server.recvmsg_into([first, second]) == (4, [], 0, None)
        assert (bytes(first), bytes(second[:3])) == (b"c", b"def")
        with pytest.raises(ValueError):
            server.recvmsg(-1)


def test_close_after_reading_everything_gives_eof(patched):
    with blocking_pair(patched) as (client, server):
        client.sendall(b"read")
        assert server.recv(100) == b"read"
        server.sendall(b"bye")
        server.close()
        assert receive_until_eof(client) == b"bye"


def test_select_poll_and_selectors_readiness(patched):
    with blocking_pair(patched) as (client, server):
        assert select.select([server], [server], [], 0) == ([], [server], [])
        poller = select.poll()
        poller.register(server, select.POLLIN | select.POLLOUT)
        assert poller.poll(0) == [(server.fileno(), select.POLLOUT)]
        client.sendall(b"data")
        assert select.select([server], [], [], TIMEOUT)[0] == [server]
        assert poller.poll(TIMEOUT * 1000) == [(server.fileno(), select.POLLIN | select.POLLOUT)]
        assert server.recv(100) == b"data"
        assert select.select([server], [], [], 0)[0] == []
        with selectors.DefaultSelector() as selector:
            selector.register(server, selectors.EVENT_READ)
            assert selector.select(0) == []
            client.shutdown(socket.SHUT_WR)
            events = selector.select(TIMEOUT)
            assert [(key.fileobj, mask) for key, mask in events] == [(server, selectors.EVENT_READ)]
            assert server.recv(100) == b""
            assert selector.select(0) != []  # EOF stays readable
        # Writable while there is room: fill, then let the peer read.
        server.setblocking(False)
        with pytest.raises(BlockingIOError):
            while True:
                server.send(bytes(65536))
        with selectors.DefaultSelector() as selector:
            selector.register(server, selectors.EVENT_WRITE)
            assert selector.select(0) == []
            join = run_thread(lambda: receive_until_eof(client))
            assert selector.select(TIMEOUT) != []
            server.setblocking(True)
            server.shutdown(socket.SHUT_WR)
            assert len(join()) > 0


def test_makefile_lines_text_and_binary(patched):
    with blocking_pair(patched) as (client, server):
        with client.makefile("w", encoding="utf-8", newline="\n") as text_out:
            text_out.write("first line\nsecond é\n")
        with server.makefile("r", encoding="utf-8", newline="\n") as text_in:
            assert text_in.readline() == "first line\n"
            assert text_in.readline() == "second é\n"
        with server.makefile("wb", buffering=0) as raw_out:
            raw_out.write(b"a\nb")
        server.shutdown(socket.SHUT_WR)
        with client.makefile("rb") as binary_in:
            assert binary_in.readline() == b"a\n"
            assert binary_in.readline() == b"b"
            assert binary_in.readline() == b""


def test_makefile_keeps_the_connection_after_close(patched):
    """``close()`` with a makefile open closes the connection only once
    the file closes too (http.client relies on it)."""
    with blocking_pair(patched) as (client, server):
        reader = client.makefile("rb")
        client.close()
        server.sendall(b"still there\n")
        assert reader.readline() == b"still there\n"
        reader.close()
        assert receive_until_eof(server) == b""


@pytest.mark.parametrize("seed", [1, 2])
def test_random_writes_up_to_16_mib(patched, seed):
    rng = random.Random(seed)
    sizes = [0, 1, 16 * MiB] + [rng.choice([rng.randrange(100), rng.randrange(MiB)]) for _ in range(12)]
    rng.shuffle(sizes)
    payload = rng.randbytes(sum(sizes))
    with blocking_pair(patched) as (client, server):
        def write() -> None:
            offset = 0
            for size in sizes:
                piece = payload[offset:offset + size]
                kind = rng.randrange(3)
                client.sendall(piece if kind == 0 else bytearray(piece) if kind == 1 else memoryview(piece))
                offset += size
            client.shutdown(socket.SHUT_WR)

        join = run_thread(write)
        digest = hashlib.sha256()
        buffer = bytearray(256 * 1024)
        total = 0
        while n := server.recv_into(buffer):
            digest.update(buffer[:n])
            total += n
        join()
    assert total == len(payload)
    assert digest.digest() == hashlib.sha256(payload).digest()


def test_sendall_interrupted_by_its_timeout_loses_no_byte(patched):
    payload = random.Random(3).randbytes(64 * MiB)
    with blocking_pair(patched, timeout=0.2) as (client, server):
        with pytest.raises(TimeoutError):
            client.sendall(payload)  # nobody reads: more than any buffer holds
        client.shutdown(socket.SHUT_WR)
        server.settimeout(TIMEOUT)
        received = receive_until_eof(server)
    assert 0 < len(received) < len(payload)
    assert received == payload[:len(received)]


def test_a_peer_thread_dying_mid_transfer_resets_never_hangs(patched):
    with blocking_pair(patched) as (client, server):
        def die_half_way() -> None:
            server.recv(65536)
            server.close()  # unread bytes: a reset

        join = run_thread(die_half_way)
        with pytest.raises((ConnectionResetError, BrokenPipeError)):
            for _ in range(1000):
                client.sendall(bytes(MiB))
        join()


def test_buffer_sizes_feed_the_accounting(patched):
    with blocking_pair(patched) as (client, server):
        client.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, 4096)
        server.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
        sndbuf = client.getsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF)
        rcvbuf = server.getsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF)
        assert (sndbuf, rcvbuf) == (8192, 8192)  # Linux doubles what it is given
        client.setblocking(False)
        queued = 0
        with pytest.raises(BlockingIOError):
            while True:
                queued += client.send(bytes(1024))
        if patched:  # exactly sndbuf + friend rcvbuf; TCP's depends on segments in flight
            assert queued == sndbuf + rcvbuf
        assert 0 < queued < 1 * MiB


def test_dup_shares_the_connection_till_the_last_close(patched):
    """As the kernel's dup(): both objects read and write the one
    connection, each with its own timeout; it closes with the last."""
    with blocking_pair(patched) as (client, server):
        twin = client.dup()
        assert type(twin) is type(client) and friendsock.is_friend(twin) is patched
        assert twin.getpeername() == client.getpeername()
        assert twin.gettimeout() == client.gettimeout()
        twin.settimeout(0.05)
        assert client.gettimeout() == TIMEOUT
        twin.sendall(b"one ")
        client.sendall(b"two ")
        assert server.recv(100) == b"one two "
        client.close()
        assert client.fileno() == -1
        with pytest.raises(TimeoutError):
            twin.recv(10)
        server.sendall(b"to the twin")
        assert twin.recv(100) == b"to the twin"
        twin.sendall(b"three")
        twin.close()
        assert receive_until_eof(server) == b"three"


def test_descriptor_calls(patched):
    """fromfd() of a socket's fileno() is another socket on its connection
    (a duplicate, closed on its own), socket(fileno=...) one sharing its
    descriptor, whose detach() gives that descriptor back."""
    with blocking_pair(patched) as (client, server):
        with socket.fromfd(client.fileno(), socket.AF_INET, socket.SOCK_STREAM) as copy:
            assert copy.getpeername() == client.getpeername()
            assert friendsock.is_friend(copy) is patched
            copy.sendall(b"from a copy, ")
        client.sendall(b"from the original, ")
        shared = socket.socket(fileno=client.fileno())
        assert shared.fileno() == client.fileno()
        assert shared.getsockname() == client.getsockname()
        shared.sendall(b"from the sharer")
        assert shared.detach() == client.fileno()
        assert shared.fileno() == -1
        expected = b"from a copy, from the original, from the sharer"
        assert receive_exactly(server, len(expected)) == expected
        server.sendall(b"back")
        assert client.recv(100) == b"back"
        client.sendall(b"still works")
        assert server.recv(100) == b"still works"
        client.close()
        assert receive_until_eof(server) == b""


@pytest.mark.parametrize("polled", [False, True], ids=["unpolled", "polled"])
def test_a_detached_descriptor_carries_the_connection(patched, polled):
    """detach() gives away the descriptor (the number fileno() showed) with
    the connection in it: a socket made of it goes on where the detached
    one stopped, in both directions, and closing it ends the connection."""
    with blocking_pair(patched) as (client, server):
        client.sendall(b"before, ")
        server.sendall(b"unread by the detached, ")
        shown = server.fileno() if polled else None
        fd = server.detach()
        assert shown is None or fd == shown
        assert server.fileno() == -1
        with pytest.raises(OSError):
            server.recv(1)
        server.close()
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM, fileno=fd) as again:
            again.settimeout(TIMEOUT)
            client.sendall(b"after")
            expected = b"before, after"
            assert receive_exactly(again, len(expected)) == expected
            again.sendall(b"from the new socket")
            expected = b"unread by the detached, from the new socket"
            assert receive_exactly(client, len(expected)) == expected
        assert receive_until_eof(client) == b""


def test_detach_after_the_peer_sent_and_closed(patched):
    """The peer wrote and closed before the detach: a socket made of the
    descriptor reads what it wrote, then EOF."""
    with blocking_pair(patched) as (client, server):
        client.sendall(b"last words")
        client.close()
        with socket.socket(fileno=server.detach()) as again:
            again.settimeout(TIMEOUT)
            assert receive_until_eof(again) == b"last words"


def test_detach_before_the_listener_accepts(patched):
    """A client detached while its connect waits in the listener's backlog
    (as anyio's ``connect_tcp`` wraps a socket's descriptor): the accept
    finds the connection, with what was sent before and after the detach."""
    with socket.socket() as listener:
        listener.bind((LOCALHOST, 0))
        listener.listen()
        listener.settimeout(TIMEOUT)
        client = socket.create_connection(listener.getsockname(), timeout=TIMEOUT)
        client.sendall(b"before, ")
        with socket.socket(fileno=client.detach()) as again:
            assert client.fileno() == -1
            again.settimeout(TIMEOUT)
            again.sendall(b"after")
            served, address = listener.accept()
            with served:
                assert address == again.getsockname()
                assert not friendsock.is_friend(served)
                expected = b"before, after"
                assert receive_exactly(served, len(expected)) == expected
                served.sendall(b"back")
                assert receive_exactly(again, 4) == b"back"
                again.shutdown(socket.SHUT_WR)
                assert receive_until_eof(served) == b""
        client.close()


def test_detach_while_the_listener_accepts(patched):
    """Clients detached right after their connect, while a thread accepts
    them (the accept finishing as the detach runs): each connection goes on
    over TCP with its bytes, whichever comes first (pyOpenSSL's
    SSL.Connection made right after a connect, as urllib3's tests do)."""
    count = 300
    with socket.socket() as listener:
        listener.bind((LOCALHOST, 0))
        listener.listen(count)
        listener.settimeout(TIMEOUT)
        served: List[bytes] = []

        def serve() -> None:
            for _ in range(count):
                conn, _ = listener.accept()
                with conn:
                    conn.settimeout(TIMEOUT)
                    served.append(receive_until_eof(conn))

        server = threading.Thread(target=serve)
        server.start()
        try:
            for number in range(count):
                client = socket.create_connection(listener.getsockname(), timeout=TIMEOUT)
                with socket.socket(fileno=client.detach()) as again:
                    again.sendall(b"%d" % number)
                client.close()
        finally:
            server.join(TIMEOUT)
        assert served == [b"%d" % number for number in range(count)]


def test_detach_before_an_event_loop_server_accepts(patched, server_loop):
    """A client detached before the event loop's server has accepted its
    connect (the loop busy meanwhile) goes on over TCP: the server's accept
    finds the connection, with what was sent before and after."""
    async def start() -> asyncio.AbstractServer:
        return await friendsock.start_server(_echo_lines, LOCALHOST, 0, friends=patched)

    server = server_loop.run(start())
    busy, release = threading.Event(), threading.Event()

    def hold_the_loop() -> None:
        busy.set()
        release.wait(TIMEOUT)

    try:
        server_loop.loop.call_soon_threadsafe(hold_the_loop)
        assert busy.wait(TIMEOUT)
        try:
            client = socket.create_connection(server.sockets[0].getsockname(), timeout=TIMEOUT)
            client.sendall(b"before, ")
            again = socket.socket(fileno=client.detach())
        finally:
            release.set()
        with again:
            again.settimeout(TIMEOUT)
            again.sendall(b"after\n")
            assert receive_exactly(again, 14) == b"before, after\n"
            again.shutdown(socket.SHUT_WR)
            assert receive_until_eof(again) == b""
        client.close()
    finally:
        release.set()
        server_loop.close_server(server)


def _counting_socket_class() -> type:
    """A subclass of ``socket.socket`` as it is now (the patched class, on
    the friend path) whose own methods count what it moves, as websockets'
    tests track their sockets; its accept() makes its own kind, in the
    stdlib's manner, without the base class's accept()."""

    class CountingSocket(socket.socket):
        sent = received = 0  # class attributes: they must stay its own

        def recv(self, bufsize: int, flags: int = 0) -> bytes:
            data = super().recv(bufsize, flags)
            self.received += len(data)
            return data

        def sendall(self, data: Any, flags: int = 0) -> None:
            super().sendall(data, flags)
            self.sent += len(data)

        def accept(self) -> Tuple[socket.socket, Any]:
            fd, address = self._accept()  # type: ignore[attr-defined]
            sock = type(self)(self.family, self.type, self.proto, fileno=fd)
            sock.settimeout(TIMEOUT)
            return sock, address

    return CountingSocket


def test_a_socket_subclass_keeps_its_class_and_methods(patched, server_loop):
    """A subclass of ``socket.socket`` defined while patched is its user's:
    its own methods go on doing its I/O, so it connects and listens over
    TCP (to an event loop's server, and as a listener whose accept() never
    calls the base class's: its clients must not wait for a claim)."""
    counting_socket = _counting_socket_class()

    async def start() -> asyncio.AbstractServer:
        return await friendsock.start_server(_echo_lines, LOCALHOST, 0, friends=patched)

    server = server_loop.run(start())
    try:
        with counting_socket(socket.AF_INET, socket.SOCK_STREAM) as client:
            client.settimeout(TIMEOUT)
            client.connect(server.sockets[0].getsockname())
            assert type(client) is counting_socket and not friendsock.is_friend(client)
            client.sendall(b"hello\n")
            assert receive_exactly(client, 6) == b"hello\n"
            assert (client.sent, client.received) == (6, 6)
    finally:
        server_loop.close_server(server)
    with counting_socket(socket.AF_INET, socket.SOCK_STREAM) as listener:
        listener.bind((LOCALHOST, 0))
        listener.listen()
        with socket.create_connection(listener.getsockname(), timeout=TIMEOUT) as client:
            served, _ = listener.accept()
            with served:
                assert not friendsock.is_friend(client)
                client.sendall(b"ping")
                assert receive_exactly(served, 4) == b"ping"
                assert served.received == 4


def test_detaching_a_friend_of_an_event_loops_end_is_a_clear_error(patched, server_loop):
    """An event loop's end cannot go on over TCP: once the server has the
    connection, detach() refuses (EOPNOTSUPP) and changes nothing; over TCP
    it hands the descriptor out."""
    async def start() -> asyncio.AbstractServer:
        return await friendsock.start_server(_echo_lines, LOCALHOST, 0, friends=patched)

    server = server_loop.run(start())
    try:
        with socket.create_connection(server.sockets[0].getsockname(), timeout=TIMEOUT) as client:
            assert friendsock.is_friend(client) is patched
            client.sendall(b"accepted?\n")  # the echo: the server has it
            assert receive_exactly(client, 10) == b"accepted?\n"
            if patched:
                with pytest.raises(OSError) as caught:
                    client.detach()
                assert caught.value.errno == errno.EOPNOTSUPP
                assert "friend socket" in str(caught.value)
                connection = client
            else:
                connection = socket.socket(fileno=client.detach())
                assert client.fileno() == -1
            with connection:
                connection.settimeout(TIMEOUT)
                connection.sendall(b"still works\n")
                assert connection.recv(100) == b"still works\n"
                connection.shutdown(socket.SHUT_WR)
                assert connection.recv(100) == b""  # the server is done with it
    finally:
        server_loop.close_server(server)


def _fileno_with_no_descriptor_left(sock: socket.socket) -> int:
    """``sock.fileno()`` asked once every descriptor is taken."""
    import resource

    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    filler: List[int] = []
    highest = max(int(fd) for fd in os.listdir("/proc/self/fd"))
    try:  # a few to spare, then none
        resource.setrlimit(resource.RLIMIT_NOFILE, (highest + 16, hard))
        while True:
            try:
                filler.append(os.dup(0))
            except OSError as exc:
                assert exc.errno == errno.EMFILE
                break
        return sock.fileno()
    finally:
        for fd in filler:
            os.close(fd)
        resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))


def test_fileno_out_of_descriptors_gives_the_connections(patched):
    """fileno() never fails for want of a descriptor (a real socket's has
    one already): a paired socket that cannot make its readiness
    descriptor goes on over TCP, whose descriptor it gives."""
    with blocking_pair(patched) as (client, server):
        number = _fileno_with_no_descriptor_left(client)
        assert not friendsock.is_friend(client)
        server.sendall(b"over TCP now")
        assert select.select([number], [], [], TIMEOUT)[0] == [number]
        assert client.recv(100) == b"over TCP now"


def test_fileno_out_of_descriptors_before_the_accept(patched):
    """The same before the server accepted: the connect is taken back from
    the listener, whose accept then finds a plain connection holding what
    the client sent."""
    with socket.create_server((LOCALHOST, 0)) as listener:
        with socket.create_connection(listener.getsockname(), timeout=TIMEOUT) as client:
            assert friendsock.is_friend(client) is patched
            client.sendall(b"sent while paired, ")
            number = _fileno_with_no_descriptor_left(client)
            assert not friendsock.is_friend(client)
            client.sendall(b"then over TCP")
            server, _ = listener.accept()
            with server:
                server.settimeout(TIMEOUT)
                assert not friendsock.is_friend(server)
                expected = b"sent while paired, then over TCP"
                assert receive_exactly(server, len(expected)) == expected
                server.sendall(b"back")
                assert select.select([number], [], [], TIMEOUT)[0] == [number]
                assert client.recv(100) == b"back"


def test_a_client_is_paired_once_the_accept_returns(patched, monkeypatch):
    """Once accept() returns, the client socket is a friend socket, even
    while its connect() has not returned yet on its own thread: a third
    thread polling it (fileno()) sees the link, never the TCP descriptor,
    which carries nothing."""
    from friendsock._blocking import _connect as blocking_connect

    gate = threading.Event()
    finish = blocking_connect._finish_connect

    def held(*args: Any, **kwargs: Any) -> None:  # the connect, held between its syscall and its end
        gate.wait(TIMEOUT)
        finish(*args, **kwargs)

    monkeypatch.setattr(blocking_connect, "_finish_connect", held)
    with socket.create_server((LOCALHOST, 0)) as listener, socket.socket() as client:
        client.settimeout(TIMEOUT)
        join = run_thread(lambda: client.connect(listener.getsockname()))
        server, _ = listener.accept()
        with server:
            try:
                assert friendsock.is_friend(client) is patched
                server.sendall(b"seen by a poller")
                assert select.select([client], [], [], TIMEOUT)[0] == [client]
            finally:
                gate.set()
            join()
            assert client.recv(100) == b"seen by a poller"


def test_a_late_notice_does_not_make_a_drained_socket_readable(patched):
    """A writer's notice can land after a reader on another thread took
    its bytes (the writer pushes, the reader drains, then the notice runs):
    select() must not show the socket readable with nothing to read, or a
    blocking recv() after it waits, and urllib3 drops the pooled
    connection as closed."""
    with blocking_pair(patched) as (client, server):
        client.fileno()  # polled: the readiness descriptor is kept in step
        server.sendall(b"bytes")
        assert client.recv(100) == b"bytes"
        if patched:
            client._signals.readable()  # the notice of that push, landing late
        assert select.select([client], [], [], 0)[0] == []
        server.sendall(b"more")
        assert select.select([client], [], [], TIMEOUT)[0] == [client]
        assert client.recv(100) == b"more"
        server.shutdown(socket.SHUT_WR)
        assert select.select([client], [], [], TIMEOUT)[0] == [client]
        assert client.recv(100) == b""


def test_a_wake_leaves_the_sleepers_that_come_meanwhile_asleep():
    """A wake is for the sleepers there when it starts. A thread that came
    to sleep for its next message while the waker's write let go of the
    GIL looks at the link after it came, and must not be woken for nothing
    (it would look, sleep, be woken again, for as long as the waker's loop
    ran: a storm of eventfd writes and reads per message under load)."""
    first, second, newcomer = Parker(), Parker(), Parker()

    class Arriving(list):
        """Sleepers to which ``newcomer`` comes during the first wake-up."""

        def pop(self, *index):
            taken = super().pop(*index)
            if not newcomer_came.is_set():
                newcomer_came.set()
                self.append(newcomer)
            return taken

    newcomer_came = threading.Event()
    sleepers = Arriving([first, second])
    try:
        wake(sleepers)
        assert newcomer_came.is_set()
        assert sleepers == [newcomer]  # still asleep, still to be woken
        for parker in (first, second, newcomer):
            os.set_blocking(parker.read_fd, False)
        for parker in (first, second):  # each woken, once
            assert os.read(parker.read_fd, 4096)
            with pytest.raises(BlockingIOError):
                os.read(parker.read_fd, 4096)
        with pytest.raises(BlockingIOError):
            os.read(newcomer.read_fd, 4096)
        wake(sleepers)  # the next wake is its
        assert sleepers == []
    finally:
        for parker in (first, second, newcomer):
            parker.close()


def test_a_wake_is_a_write_that_cannot_block():
    """Waking a sleeper is a write to its parker, made on the waker's thread,
    an event loop's among them (a loop's transport writing to a blocking
    friend): it must not be a blocking call there (asyncio debug tools such
    as blockbuster refuse those), while the sleeper's read blocks."""
    sleeper = Parker()
    try:
        assert not os.get_blocking(sleeper.write_fd)
        assert os.get_blocking(sleeper.read_fd)
        sleepers = [sleeper]
        wake(sleepers)
        assert os.read(sleeper.read_fd, 4096)
    finally:
        sleeper.close()


@pytest.mark.parametrize("loop_kind", ["asyncio", "uvloop"])
def test_a_listener_an_event_loop_takes_over_stays_real(patched, loop_kind):
    """A listener made non-blocking on the thread of an event loop
    friendsock is not installed on (as its ``create_server(sock=)`` does,
    whose accept may run in C) is passed on: its clients are the real
    socket's, even once its own ``accept()`` runs again."""
    with socket.create_server((LOCALHOST, 0)) as listener:
        async def take_over() -> None:
            listener.setblocking(False)

        runner = uvloop.run if loop_kind == "uvloop" else asyncio.run
        runner(take_over())
        with socket.create_connection(listener.getsockname(), timeout=TIMEOUT) as client:
            assert not friendsock.is_friend(client)
            listener.setblocking(True)
            server, _ = listener.accept()
            with server:
                assert not friendsock.is_friend(server)
                client.sendall(b"tcp")
                assert server.recv(10) == b"tcp"


def test_a_listener_made_non_blocking_where_no_loop_runs_pairs_its_first_client(patched):
    """``socket.create_server()``, then ``setblocking(False)`` for a poller
    of its user's (a ``selectors`` server's): still the listener it was, so
    a client that connects before its first ``accept()`` pairs, and every
    byte arrives."""
    with socket.create_server((LOCALHOST, 0)) as listener:
        listener.setblocking(False)
        with socket.create_connection(listener.getsockname(), timeout=TIMEOUT) as client:
            client.sendall(b"before any accept")
            assert select.select([listener], [], [], TIMEOUT)[0] == [listener]
            server, _ = listener.accept()
            with server:
                assert friendsock.is_friend(client) is patched
                assert friendsock.is_friend(server) is patched
                server.setblocking(True)
                server.settimeout(TIMEOUT)
                assert server.recv(100) == b"before any accept"


@pytest.mark.parametrize("loop_kind", ["asyncio", "uvloop"])
def test_an_event_loop_client_pairs_before_the_first_accept_where_every_loop_is_installed(
        patched, loop_kind):
    """Every loop installed, a blocking listener (``socket.create_server()``)
    is accepted through friendsock whoever accepts it: an event loop's
    client (whose transport cannot go on over TCP) pairs at once, though
    the listener's first ``accept()`` runs only after ``open_connection``
    returns, on the client's thread (anyio's tests accept that way)."""
    with every_loop_installed(), socket.create_server((LOCALHOST, 0)) as listener:
        listener.settimeout(TIMEOUT)
        before = friendsock.stats()
        answered_after_the_connect(listener.getsockname(), lambda: listener.accept()[0], loop_kind,
                                   patched)
        delta = since(before, friendsock.stats())
        # (Over TCP, the installed loop counts its connect to a plain listener.)
        assert (delta.links_made, dict(delta.fallbacks)) == \
            ((1, {}) if patched else (0, {"no-listener": 1}))


def _serve_digests(listener: socket.socket, count: int) -> Callable[[], Any]:
    """Accept ``count`` connections on a thread, answering each with the
    SHA-256 of what it sent; returns the join (which friend each was)."""
    def serve() -> List[bool]:
        paired = []
        for _ in range(count):
            server, _ = listener.accept()
            with server:
                server.settimeout(TIMEOUT)
                size = struct.unpack("!I", received_exactly(server, 4))[0]
                server.sendall(hashlib.sha256(received_exactly(server, size)).digest())
                paired.append(friendsock.is_friend(server))
        return paired

    return run_thread(serve)


def _digest_answered(address: Any, data: bytes) -> bool:
    """A blocking client's exchange with :func:`_serve_digests`: whether it paired."""
    with socket.create_connection(address, timeout=TIMEOUT) as client:
        client.sendall(struct.pack("!I", len(data)) + data)
        assert received_exactly(client, 32) == hashlib.sha256(data).digest()
        return friendsock.is_friend(client)


async def _digest_answered_on_a_loop(address: Any, data: bytes, friends: bool) -> None:
    reader, writer = await friendsock.open_connection(*address, friends=friends)
    try:
        writer.write(struct.pack("!I", len(data)) + data)
        assert await asyncio.wait_for(reader.readexactly(32), TIMEOUT) == hashlib.sha256(data).digest()
    finally:
        writer.close()
        await writer.wait_closed()


@pytest.mark.parametrize("client_kind", ["blocking", "asyncio", "uvloop"])
@pytest.mark.parametrize("made", ["socket(fileno=)", "fromfd"])
def test_a_listener_handed_over_by_descriptor_pairs(patched, made, client_kind):
    """A listening socket made of a descriptor handed over (systemd's socket
    activation, a process manager's: ``socket.socket(fileno=...)``, or
    ``socket.fromfd()``) pairs as one that listened here, with the
    connects this process claims (its siblings may accept from it too):
    blocking and event loop clients, every byte."""
    supervisors = OriginalSocket()
    supervisors.bind((LOCALHOST, 0))
    supervisors.listen(8)
    fd = os.dup(supervisors.fileno())
    supervisors.close()
    if made == "fromfd":
        listener = socket.fromfd(fd, socket.AF_INET, socket.SOCK_STREAM)
        os.close(fd)
    else:
        listener = socket.socket(fileno=fd)
    data = os.urandom(100_003)
    before = friendsock.stats()
    with listener:
        join = _serve_digests(listener, 2)
        for _ in range(2):
            if client_kind == "blocking":
                assert _digest_answered(listener.getsockname(), data) is patched
            else:
                new_loop = asyncio.new_event_loop if client_kind == "asyncio" else uvloop.new_event_loop
                run_on(new_loop, _digest_answered_on_a_loop(listener.getsockname(), data, patched))
        assert join() == [patched, patched]
    delta = since(before, friendsock.stats())
    assert delta.links_made == (2 if patched else 0)
    assert not patched or not delta.fallbacks


@pytest.mark.parametrize("acceptor", ["made-again", "first"])
def test_a_listener_made_again_from_its_descriptor_pairs_through_either(patched, acceptor):
    """``socket.fromfd()`` of a listener that listened here: two socket
    objects, one accept queue. Whichever of them accepts, every byte a
    client sent arrives; so once the other is closed."""
    with socket.create_server((LOCALHOST, 0)) as first:
        made_again = socket.fromfd(first.fileno(), socket.AF_INET, socket.SOCK_STREAM)
        with made_again:
            accepting, other = (made_again, first) if acceptor == "made-again" else (first, made_again)
            data = os.urandom(70_001)
            join = _serve_digests(accepting, 2)
            for _ in range(2):
                assert _digest_answered(first.getsockname(), data) is patched
            assert join() == [patched, patched]
            other.close()
            join = _serve_digests(accepting, 1)
            assert _digest_answered(accepting.getsockname(), data) is patched
            assert join() == [patched]


def test_a_duplicated_listener_is_passed_on_not_registered_again(patched):
    """``listener.dup()`` is for code that accepts natively (it takes the
    listener over, as ``detach()`` does): neither socket pairs from then
    on, and a client connects over TCP at once, not waiting for a claim
    (counted ``no-listener``), every byte to whichever accepts."""
    with socket.create_server((LOCALHOST, 0)) as first:
        with first.dup() as twin:
            before = friendsock.stats()
            data = os.urandom(70_001)
            join = _serve_digests(twin, 1)
            assert _digest_answered(first.getsockname(), data) is False
            assert join() == [False]
            delta = since(before, friendsock.stats())
            assert dict(delta.fallbacks) == ({"no-listener": 1} if patched else {})


def _report_sockname(sock: socket.socket, conn: Any) -> None:
    """In a spawned child: what it got."""
    conn.send(sock.getsockname())
    sock.close()


def sockname_in_a_child(sock: socket.socket) -> Any:
    """``sock`` handed to a spawned child process, which says its address."""
    import multiprocessing

    context = multiprocessing.get_context("spawn")
    receiver, sender = context.Pipe(duplex=False)
    child = context.Process(target=_report_sockname, args=(sock, sender))
    child.start()
    try:
        assert receiver.poll(TIMEOUT)
        return receiver.recv()
    finally:
        child.join(TIMEOUT)
        assert child.exitcode == 0
        receiver.close()
        sender.close()


def test_sockets_pass_to_a_spawned_process(patched):
    """multiprocessing hands a socket to its child by descriptor (uvicorn's
    --workers and --reload hand over their listeners so): a socket made
    while patched goes as the stdlib's; a paired one, whose descriptor is
    not the connection, is refused with a clear error."""
    from multiprocessing.reduction import ForkingPickler

    with socket.create_server((LOCALHOST, 0)) as listener:
        assert sockname_in_a_child(listener) == listener.getsockname()
    with blocking_pair(patched) as (client, _):
        if patched:
            with pytest.raises(TypeError, match="friend socket"):
                ForkingPickler.dumps(client)
        else:
            assert sockname_in_a_child(client) == client.getsockname()


def test_an_unclosed_socket_warns_as_the_stdlibs(patched):
    """The finalizer's ResourceWarning names the socket as the stdlib's
    does ("unclosed <socket.socket"), paired or not, so a project's warning
    filters match alike."""
    with socket.create_server((LOCALHOST, 0)) as listener:
        client = socket.create_connection(listener.getsockname(), timeout=TIMEOUT)
        lone = socket.socket()
        lone.bind((LOCALHOST, 0))
        ours = [f"laddr=('{LOCALHOST}', {sock.getsockname()[1]})" for sock in (client, lone)]
        server, _ = listener.accept()
        with server:
            with warnings.catch_warnings(record=True) as caught:
                warnings.simplefilter("always")
                del client, lone
                gc.collect()
    # Of these sockets only: a collection may find what an earlier test left.
    messages = [str(w.message) for w in caught
                if issubclass(w.category, ResourceWarning) and str(w.message).startswith("unclosed <")
                and any(address in str(w.message) for address in ours)]
    # As the stdlib's: a filter such as "ignore:unclosed <socket.socket fd=" matches.
    assert len(messages) == 2 and all(m.startswith("unclosed <socket.socket fd=") for m in messages), messages


def test_an_unclosed_socket_closes_where_its_warning_is_an_error(patched):
    """With ResourceWarning an error (a common test setting), the
    finalizer's warning raises into the unraisable hook; the socket is
    closed all the same, as the stdlib's: its peer gets EOF, not a wait."""
    with socket.create_server((LOCALHOST, 0)) as listener:
        client = socket.create_connection(listener.getsockname(), timeout=TIMEOUT)
        server, _ = listener.accept()
        with server:
            server.settimeout(TIMEOUT)
            with resource_warnings_raised() as raised:
                del client
                gc.collect()
            assert any(isinstance(exc, ResourceWarning) for exc in raised), raised
            assert server.recv(100) == b""


def test_a_socket_collected_while_its_peer_sends_closes(patched):
    """A collection can start inside the peer's send (any allocation starts
    one): the collected socket's close must not wait for the send it
    interrupted. The peer's sends finish and it then sees the connection
    gone, as over TCP."""
    with socket.create_server((LOCALHOST, 0)) as listener, \
            socket.create_connection(listener.getsockname(), timeout=TIMEOUT) as client:
        server, _ = listener.accept()

        class Holder:
            pass

        holder = Holder()
        holder.cycle, holder.sock = holder, server  # only a collection frees it
        del server, holder

        def send_while_collecting() -> None:
            thresholds = gc.get_threshold()
            gc.set_threshold(1, 1, 1)  # a collection at nearly every allocation
            try:
                for _ in range(100):
                    client.sendall(b"x" * 100)
            except (BrokenPipeError, ConnectionResetError):
                pass  # the close came first
            finally:
                gc.set_threshold(*thresholds)

        with warnings.catch_warnings():
            warnings.simplefilter("ignore", ResourceWarning)
            run_thread(send_while_collecting)()
            gc.collect()
        try:  # EOF, or a reset where bytes arrived before the close
            while client.recv(MiB):
                pass
        except ConnectionResetError:
            pass


def test_a_finished_connection_leaves_no_cycle(patched):
    """Used and closed on both ends, a connection is freed by its last
    reference, as a socket is: nothing of it waits for the collector."""
    with cyclic_garbage_of_ours() as garbage:
        with blocking_pair(patched) as (client, server):
            client.sendall(b"ping")
            assert server.recv(4) == b"ping"
            server.sendall(b"pong")
            assert client.recv(4) == b"pong"
        del client, server
    assert garbage == []


def test_patch_and_unpatch():
    before = socket.socket()
    try:
        friendsock.patch_socket()
        friendsock.patch_socket()  # idempotent
        assert friendsock.is_socket_patched()
        assert socket.socket is not OriginalSocket
        assert isinstance(before, socket.socket)  # made before: still a socket.socket
        assert issubclass(FriendBlockingSocket, socket.socket)
        with socket.socket() as made:
            assert isinstance(made, OriginalSocket)
        with pytest.raises(TypeError):
            FriendBlockingSocket()
    finally:
        friendsock.unpatch_socket()
        before.close()
    assert not friendsock.is_socket_patched()
    assert socket.socket is OriginalSocket
    friendsock.unpatch_socket()  # idempotent


def test_fork_after_patching(patched, patient_confirm):  # noqa: F811
    """A child forked after patching pairs its own connections; it never
    pairs in-process with its parent's listener, which it only shares (its
    connection there is one between two processes: TCP, or moved off it
    once the parent's accept() has run, both ends agreeing), and the
    parent's own connections go on pairing."""
    with socket.create_server((LOCALHOST, 0)) as listener:
        address = listener.getsockname()
        pid = os.fork()
        if pid == 0:  # the child: report through the exit status only
            status = 1
            try:
                with blocking_pair(patched):
                    pass
                with socket.create_connection(address, timeout=TIMEOUT) as to_parent:
                    to_parent.sendall(b"from the child")
                    status = 10 + friendsock.is_friend(to_parent) + 2 * is_moved(to_parent)
            finally:
                os._exit(status)
        server, _ = listener.accept()
        with server:
            server.settimeout(TIMEOUT)
            moved = is_moved(server)
            assert friendsock.is_friend(server) is moved
            assert receive_until_eof(server) == b"from the child"
        _, status = os.waitpid(pid, 0)
        assert os.waitstatus_to_exitcode(status) == (13 if moved else 10)
        # The parent: its listener is shared now, so a connect pairs once
        # the claim comes (the accept runs in another thread meanwhile).
        accepted = run_thread(listener.accept)
        with socket.create_connection(address, timeout=TIMEOUT) as client:
            server, _ = accepted()
            with server:
                assert friendsock.is_friend(client) is friendsock.is_friend(server) is patched
                client.sendall(b"after the fork")
                assert server.recv(100) == b"after the fork"


def _in_child(work: Callable[[], bool]) -> int:
    """Fork; the child runs ``work`` and reports through its exit status
    only (0: it returned True). The parent gets the child's pid."""
    pid = os.fork()
    if pid == 0:
        status = 1
        try:
            status = 0 if work() else 2
        finally:
            os._exit(status)
    return pid


def _exit_code(pid: int) -> int:
    _, status = os.waitpid(pid, 0)
    return os.waitstatus_to_exitcode(status)


def test_a_forked_child_serves_a_connection_accepted_before_the_fork(patched):
    """A forking server (socketserver.ForkingMixIn): the child answers a
    connection its parent accepted, the parent closes its copy. What was
    sent before the fork, either way, arrives once and in order, the
    client's reader asleep across the fork wakes to it, and EOF comes when
    the child is done. A friend link goes on over TCP at the fork."""
    request = b"request sent before the fork"
    with blocking_pair(patched) as (client, server):
        server.sendall(b"greeting, ")
        client.sendall(request)
        answer = run_thread(lambda: receive_until_eof(client))

        def serve() -> bool:
            got = b""
            while len(got) < len(request):
                got += server.recv(100)
            server.sendall(b"answer from the child")
            return got == request

        pid = _in_child(serve)
        server.close()
        assert answer() == b"greeting, answer from the child"
        assert _exit_code(pid) == 0
        assert not friendsock.is_friend(client)


def test_a_forked_child_reads_what_a_client_sent_before_closing(patched):
    """The client sent its request and closed before the fork (a one-shot
    client): the child still reads the request, then EOF."""
    request = b"request, then the client's close"
    with blocking_pair(patched) as (client, server):
        client.sendall(request)
        client.close()

        def serve() -> bool:
            return receive_until_eof(server) == request

        pid = _in_child(serve)
        server.close()
        assert _exit_code(pid) == 0


def _thread_asleep(tid: int, on_a_lock: bool = True) -> bool:
    """Whether thread ``tid`` of this process sleeps (in a system call);
    not ``on_a_lock``: in one that is not a lock's wait (a futex, as the
    GIL's is), such as a read's."""
    task = f"/proc/self/task/{tid}"
    with open(f"{task}/stat") as stat:
        if stat.read().rpartition(")")[2].split()[0] != "S":
            return False
    with open(f"{task}/wchan") as wchan:
        return on_a_lock or "futex" not in wchan.read()


def _until(condition: Callable[[], bool], what: str) -> None:
    """Wait, bounded, until ``condition()`` holds (checked between naps:
    it is about another thread's state, which nothing announces)."""
    deadline = time.monotonic() + TIMEOUT
    while not condition():
        assert time.monotonic() < deadline, f"waited {TIMEOUT} s for {what}"
        time.sleep(0.001)


@contextlib.contextmanager
def _runs_only_while_we_wait(tid: int) -> Iterator[None]:
    """Thread ``tid`` runs only when the calling thread waits: both on one
    CPU, ``tid`` at idle priority. What it does when woken comes after
    whatever the caller does without waiting."""
    ours = os.sched_getaffinity(0)
    theirs = os.sched_getaffinity(tid)
    cpu = {min(ours)}
    os.sched_setaffinity(0, cpu)
    os.sched_setaffinity(tid, cpu)
    os.sched_setscheduler(tid, os.SCHED_IDLE, os.sched_param(0))
    try:
        yield
    finally:
        os.sched_setscheduler(tid, os.SCHED_OTHER, os.sched_param(0))
        os.sched_setaffinity(tid, theirs)
        os.sched_setaffinity(0, ours)


def test_fork_keeps_the_number_a_polling_thread_holds(patched):
    """A socket somebody polls, as test code and urllib3 do (select, then
    recv), keeps its fileno() across the fork: a select() asleep on it
    then wakes, and one made later on that number sees the connection.
    The select is asleep when the fork comes, and looks at the number
    again only after the fork has done all it does without waiting (a
    select then watches what it found on its first look only); the child
    sends once it has."""
    with blocking_pair(patched) as (client, server):
        number = client.fileno()
        poller: List[int] = []

        def select_then_receive() -> bytes:
            poller.append(threading.get_native_id())
            received = b""
            while True:
                # Longer than the join waits: a select that missed its
                # wake-up would find the bytes at its timeout, too late.
                assert select.select([number], [], [], 3 * TIMEOUT)[0] == [number]
                chunk = client.recv(100)
                if not chunk:
                    return received
                received += chunk

        answer = run_thread(select_then_receive)
        _until(lambda: poller and _thread_asleep(poller[0]), "the select to sleep")
        go_read, go_write = os.pipe()
        with _runs_only_while_we_wait(poller[0]):
            pid = _in_child(lambda: os.read(go_read, 1) == b"!" and server.sendall(b"from the child") is None)
        _until(lambda: _thread_asleep(poller[0]), "the poller to sleep again")
        os.write(go_write, b"!")
        os.close(go_read)
        os.close(go_write)
        server.close()
        assert _exit_code(pid) == 0
        assert answer() == b"from the child"
        assert client.fileno() == number
        client.sendall(b"after the fork")  # the peer is gone: TCP takes it, then resets
        poller_after = select.poll()
        poller_after.register(number, select.POLLIN)
        assert poller_after.poll(TIMEOUT * 1000)


def test_forks_during_a_transfer_lose_and_reorder_nothing(patched):
    """Forks while one thread streams random writes and another reads
    them: whether a fork finds the link handed over or too full to be (it
    stays a friend link then), every byte arrives once and in order."""
    rng = random.Random(7)
    data = rng.randbytes(2 * MiB)
    with blocking_pair(patched) as (client, server):
        def write() -> None:
            view = memoryview(data)
            offset = 0
            while offset < len(view):
                size = rng.choice([1, 1000, 16 * 1024, 70_000])
                client.sendall(view[offset:offset + size])
                offset += size
            client.shutdown(socket.SHUT_WR)

        received = run_thread(lambda: receive_until_eof(server))
        written = run_thread(write)
        for _ in range(10):
            assert _exit_code(_in_child(lambda: True)) == 0
        written()
        assert hashlib.sha256(received()).digest() == hashlib.sha256(data).digest()


def test_a_link_left_to_the_parent_fails_in_the_child(patched):
    """A link that cannot go on over TCP at a fork (here: duplicates of a
    socket somebody polls, whose one readiness descriptor cannot be each
    one's connection) stays the parent's: in the child its ends fail at
    once, never wait; the parent goes on using it. Over TCP the child
    shares the connection."""
    with blocking_pair(patched) as (client, server):
        twin = client.dup()
        with twin:
            select.select([client], [], [], 0)

            def use_in_child() -> bool:
                server.settimeout(TIMEOUT)
                if not patched:
                    server.sendall(b"from the child")
                    return True
                with pytest.raises(ConnectionResetError):
                    server.recv(100)
                with pytest.raises(OSError):
                    server.sendall(b"from the child")
                return True

            assert _exit_code(_in_child(use_in_child)) == 0
            if not patched:
                assert client.recv(100) == b"from the child"
            assert friendsock.is_friend(client) is friendsock.is_friend(twin) is patched
            twin.sendall(b"the parent's still")
            assert server.recv(100) == b"the parent's still"


PLUGIN_TEST = '''
import socket

import friendsock


def test_blocking_pair():
    with socket.create_server(("127.0.0.1", 0)) as listener:
        with socket.create_connection(listener.getsockname(), timeout=10) as client:
            server, _ = listener.accept()
            with server:
                client.sendall(b"hi")
                assert server.recv(10) == b"hi"
                print("PAIRED", friendsock.is_friend(client), friendsock.is_socket_patched())
'''


@pytest.mark.parametrize("args, paired", [
    (("--friendsock",), False),  # asyncio and trio only
    (("--friendsock", "--friendsock-sockets"), True),
])
def test_plugin_option(pytester, args, paired):
    pytester.makepyfile(test_inner=PLUGIN_TEST)
    result = run_inner_pytest(pytester, "-s", *args, timeout=60)
    result.assert_outcomes(passed=1)
    result.stdout.fnmatch_lines([f"*PAIRED {paired} {paired}*"])
