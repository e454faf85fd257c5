"""The server friendsock.create_server returns behaves as asyncio.Server.

Every test runs on both paths: with ``friends=False`` the server *is* the
loop's own (asyncio's or uvloop's), so each expectation is checked against
the real thing too. ``how`` says whether the server binds (host, port) or is
handed a socket with ``sock=`` (confirmed pairing).
"""

from __future__ import annotations

import asyncio
import contextlib
import errno
import os
import socket
import sys

import pytest

import friendsock
from friendsock._asyncio import _server
from support import (  # noqa: F401 (two fixtures)
    LOCALHOST,
    Echoes,
    Recorder,
    bounded,
    echo_and_finish,
    no_transport_left_open,
    patient_confirm,
    port_of,
)

pytestmark = pytest.mark.usefixtures("no_transport_left_open", "patient_confirm")



@pytest.fixture(params=["host", "sock"])
def how(request) -> str:
    return request.param


async def make_server(how: str, friends: bool, factory=None, **kwargs):
    """A server on 127.0.0.1 and the socket handed in (None for host)."""
    factory = factory or Echoes()
    if how == "host":
        return await friendsock.create_server(factory, LOCALHOST, 0, friends=friends, **kwargs), None
    sock = socket.socket()
    sock.bind((LOCALHOST, 0))
    return await friendsock.create_server(factory, sock=sock, friends=friends, **kwargs), sock


async def check_pairs(port: int, friends: bool, echoes: Echoes) -> None:
    """A connection to ``port`` takes the expected path and echoes."""
    transport, client = await bounded(friendsock.create_connection(Recorder, LOCALHOST, port))
    assert friendsock.is_friend(transport) is friends
    await echo_and_finish(transport, client)
    served = echoes.protocols[-1]
    assert friendsock.is_friend(served.transport) is friends
    await bounded(served.lost)


async def test_lifecycle(how, friends):
    loop = asyncio.get_running_loop()
    echoes = Echoes()
    server, sock = await make_server(how, friends, echoes)
    try:
        port = port_of(server)
        assert server.is_serving()
        assert server.get_loop() is loop
        assert len(server.sockets) == 1
        if sock is not None:
            assert server.sockets[0].fileno() == sock.fileno()
        await check_pairs(port, friends, echoes)
    finally:
        server.close()
    assert not server.is_serving()
    assert list(server.sockets) == []
    if sock is not None:
        assert sock.fileno() == -1  # the server owned it
    await bounded(server.wait_closed())
    server.close()  # again: nothing happens
    with pytest.raises(ConnectionRefusedError):
        await friendsock.create_connection(Recorder, LOCALHOST, port)
    with pytest.raises(RuntimeError, match="is closed"):
        await server.serve_forever()


async def test_sockets_and_a_closed_server_as_the_loops_own(how, friends):
    """``sockets`` is of the loop's own server's type (uvloop's a list,
    asyncio's a tuple), open and closed, and so is its repr; a closed
    server refuses to start serving as the loop's own does."""
    loop = asyncio.get_running_loop()
    own = await loop.create_server(asyncio.Protocol, LOCALHOST, 0)
    server, _ = await make_server(how, friends)
    try:
        assert type(server.sockets) is type(own.sockets)
        assert len(server.sockets) == len(own.sockets) == 1
    finally:
        server.close()
        own.close()
    assert server.sockets == own.sockets
    assert repr(server).partition(" ")[2] == repr(own).partition(" ")[2]
    for closed in (server, own):
        with pytest.raises(TypeError):
            await closed.start_serving()
    assert server.is_serving() is own.is_serving()
    await bounded(server.wait_closed())
    await bounded(own.wait_closed())


async def test_start_serving_false_refuses_until_started(how, friends):
    echoes = Echoes()
    server, sock = await make_server(how, friends, echoes, start_serving=False)
    try:
        port = port_of(server)
        assert not server.is_serving()
        with pytest.raises(ConnectionRefusedError):
            await friendsock.create_connection(Recorder, LOCALHOST, port)
        await server.start_serving()
        await server.start_serving()  # again: still one listener
        assert server.is_serving()
        await check_pairs(port, friends, echoes)
        await check_pairs(port, friends, echoes)
        assert friendsock.stats().pending == 0
    finally:
        server.close()


async def test_serve_forever_and_cancel(how, friends):
    echoes = Echoes()
    server, _ = await make_server(how, friends, echoes, start_serving=False)
    started = asyncio.Event()

    async def serve():
        started.set()  # serve_forever starts serving before it first waits
        await server.serve_forever()

    task = asyncio.ensure_future(serve())
    try:
        await bounded(started.wait())
        assert server.is_serving()
        with pytest.raises(RuntimeError, match="already being awaited"):
            await server.serve_forever()
        await check_pairs(port_of(server), friends, echoes)
    finally:
        task.cancel()
        if not started.is_set():
            server.close()
    with pytest.raises(asyncio.CancelledError):
        await bounded(task)
    assert not server.is_serving()
    assert list(server.sockets) == []


async def test_async_with(how, friends):
    echoes = Echoes()
    server, _ = await make_server(how, friends, echoes)
    async with server as entered:
        assert entered is server
        assert server.is_serving()
        port = port_of(server)
        await check_pairs(port, friends, echoes)
    assert not server.is_serving()
    assert list(server.sockets) == []
    with pytest.raises(ConnectionRefusedError):
        await friendsock.create_connection(Recorder, LOCALHOST, port)


async def test_close_leaves_connections_and_wait_closed_waits_for_them(how, friends):
    echoes = Echoes()
    server, _ = await make_server(how, friends, echoes)
    closed = asyncio.ensure_future(server.wait_closed())
    try:
        transport, client = await bounded(
            friendsock.create_connection(Recorder, LOCALHOST, port_of(server))
        )
        served = await bounded(echoes.first)
        transport.write(b"before")  # the round trip lets wait_closed start
        assert await bounded(client.wait_bytes(6)) == b"before"
        server.close()
        # Closing the listener leaves its connections working (as TCP).
        transport.write(b" and after")
        assert await bounded(client.wait_bytes(16)) == b"before and after"
        assert not closed.done()  # waits for the connection, through those loop turns
        transport.write_eof()  # the server end closes on EOF
        await bounded(served.lost)
        await bounded(client.lost)
        await bounded(closed)
    finally:
        closed.cancel()
        server.close()


# Python 3.13's asyncio.Server.close_clients() and abort_clients().
closes_clients = pytest.mark.skipif(sys.version_info < (3, 13),
                                    reason="Server.close_clients()/abort_clients() are new in Python 3.13")


@contextlib.asynccontextmanager
async def server_that_closes_clients(how: str, friends: bool):
    """(server, its Echoes, its wait_closed() task): a server with
    close_clients(), the loop's own on asyncio's real TCP path, a
    friendsock server otherwise (uvloop's own Server has none, so on
    uvloop the real TCP path is its client opting out)."""
    own = not friends and isinstance(asyncio.get_running_loop(), asyncio.BaseEventLoop)
    echoes = Echoes()
    server, _ = await make_server(how, not own, echoes)
    closed = asyncio.ensure_future(server.wait_closed())
    try:
        yield server, echoes, closed
    finally:
        closed.cancel()
        server.close()


async def clients_of(server, friends: bool, echoes: Echoes, count: int):
    """``count`` connections to ``server`` on the path under test, each
    echoed once (its server end made): (transport, Recorder) each."""
    connections = []
    for _ in range(count):
        transport, client = await bounded(
            friendsock.create_connection(Recorder, LOCALHOST, port_of(server), friends=friends))
        connections.append((transport, client))
        assert friendsock.is_friend(transport) is friends
        transport.write(b"x")
        assert await bounded(client.wait_bytes(1)) == b"x"
    assert len(echoes.protocols) == count
    return connections


@closes_clients
async def test_close_clients_closes_each_connection_after_its_bytes(how, friends):
    async with server_that_closes_clients(how, friends) as (server, echoes, closed):
        connections = await clients_of(server, friends, echoes, 2)
        server.close()
        assert not closed.done()
        for served in echoes.protocols:
            served.transport.write(b" and goodbye")
        server.close_clients()
        for _, client in connections:
            assert await bounded(client.lost) is None
            assert client.data == b"x and goodbye"
            assert client.events == ["made", "data", "eof", "lost"]
        await echoes.all_lost()
        await bounded(closed)


@closes_clients
async def test_abort_clients_drops_what_each_connection_buffered(how, friends):
    async with server_that_closes_clients(how, friends) as (server, echoes, closed):
        [(transport, client)] = await clients_of(server, friends, echoes, 1)
        transport.pause_reading()
        served = echoes.protocols[0].transport
        written = 0
        for _ in range(64):  # until the transport holds what the connection can not
            served.write(bytes(1024 * 1024))
            written += 1024 * 1024
            if served.get_write_buffer_size():
                break
        assert served.get_write_buffer_size()
        server.close()
        assert not closed.done()
        server.abort_clients()
        assert served.is_closing()
        assert await bounded(echoes.protocols[0].lost) is None
        await bounded(closed)
        transport.resume_reading()
        await bounded(client.lost)
        assert len(client.data) < len(b"x") + written  # (the echo, then part of the rest)


@pytest.mark.skipif(sys.version_info < (3, 12), reason="eager task factories are new in Python 3.12")
async def test_an_eager_task_factory_starts_each_handler_in_connection_made(friends):
    """3.12's eager task factory runs start_server's handler at once, inside
    the transport's connection_made(): its greeting goes first, and the
    exchange and the close go as over TCP, on both paths."""
    loop = asyncio.get_running_loop()
    if not isinstance(loop, asyncio.BaseEventLoop):
        pytest.skip("uvloop 0.23's create_task() does not work with asyncio's eager task factory")
    steps = []

    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        # (Its protocol keeps the task create_task() returned: not yet, eagerly.)
        steps.append(("started", writer.transport.get_protocol()._task))  # type: ignore[attr-defined]
        writer.write(b"hello\n")
        writer.write(await reader.readline())
        await writer.drain()
        writer.close()

    loop.set_task_factory(asyncio.eager_task_factory)  # type: ignore[attr-defined]
    try:
        server = await friendsock.start_server(handle, LOCALHOST, 0, friends=friends)
        try:
            reader, writer = await bounded(friendsock.open_connection(LOCALHOST, port_of(server), friends=friends))
            assert friendsock.is_friend(writer) is friends
            writer.write(b"ping\n")
            assert await bounded(reader.read()) == b"hello\nping\n"
            assert steps == [("started", None)]
            writer.close()
            await bounded(writer.wait_closed())
        finally:
            server.close()
            await bounded(server.wait_closed())
    finally:
        loop.set_task_factory(None)


async def test_several_listening_sockets(friends):
    echoes = Echoes()
    server = await friendsock.create_server(echoes, [LOCALHOST, "::1"], 0, friends=friends)
    try:
        addresses = sorted(s.getsockname()[:2] for s in server.sockets)
        assert [host for host, _ in addresses] == ["127.0.0.1", "::1"]
        for host, port in addresses:
            transport, client = await bounded(friendsock.create_connection(Recorder, host, port))
            assert friendsock.is_friend(transport) is friends
            await echo_and_finish(transport, client)
        await echoes.all_lost()
    finally:
        server.close()


class _PassingCallsOn:
    """A wrapper that passes every call on to its socket, as gunicorn's
    listening sockets do (uvicorn's workers hand them to create_server)."""

    def __init__(self, sock: socket.socket) -> None:
        self.sock = sock

    def __getattr__(self, name: str):
        return getattr(self.sock, name)


@pytest.mark.parametrize("patched", [False, True], ids=["socket", "patched-socket"])
async def test_a_wrapper_that_passes_calls_on_is_served(friends, patched):
    """The loop's own server takes such a wrapper for ``sock=``; so does
    friendsock's, its socket listening once, registered once."""
    if patched:
        friendsock.patch_socket()
    try:
        sock = socket.socket()
    finally:
        if patched:
            friendsock.unpatch_socket()
    with sock:
        sock.bind((LOCALHOST, 0))
        echoes = Echoes()
        server = await friendsock.create_server(echoes, sock=_PassingCallsOn(sock), friends=friends)
        try:
            port = port_of(server)

            def links_made() -> int:  # (an earlier test may have counted at this port)
                counted = friendsock.stats().listeners.get(f"{LOCALHOST}:{port}")
                return counted.links_made if counted else 0

            before = links_made()
            await check_pairs(port, friends, echoes)
            assert links_made() - before == (1 if friends else 0)
        finally:
            server.close()
            await bounded(server.wait_closed())


# -- arguments, as asyncio takes them -----------------------------------------


def bound_socket(type=socket.SOCK_STREAM) -> socket.socket:
    sock = socket.socket(socket.AF_INET, type)
    sock.bind((LOCALHOST, 0))
    return sock


@pytest.mark.parametrize("extra", [{"host": LOCALHOST}, {"port": 0}, {"host": LOCALHOST, "port": 0}])
async def test_host_or_port_with_sock_is_a_value_error(friends, extra):
    sock = bound_socket()
    try:
        with pytest.raises(ValueError, match="can not be specified at the same time"):
            await friendsock.create_server(Recorder, sock=sock, friends=friends, **extra)
    finally:
        sock.close()


async def test_datagram_sock_is_a_value_error(friends):
    sock = bound_socket(socket.SOCK_DGRAM)
    try:
        with pytest.raises(ValueError, match="A Stream Socket was expected"):
            await friendsock.create_server(Recorder, sock=sock, friends=friends)
    finally:
        sock.close()


@pytest.mark.parametrize("where", ["path", "abstract"])
async def test_a_unix_socket_is_served_as_the_loop_serves_it(friends, where, tmp_path):
    """A Unix listening socket handed in (sanic's ``unix=``) is no TCP
    listener: the loop's own server serves it, and nothing pairs or is
    counted, whatever its address (a path, or the abstract namespace,
    whose address is bytes)."""
    address = str(tmp_path / "server.sock") if where == "path" else f"\0friendsock-{id(tmp_path)}".encode()
    sock = socket.socket(socket.AF_UNIX)
    sock.bind(address)
    before = friendsock.stats()
    echoes = Echoes()
    try:
        server = await friendsock.create_server(echoes, sock=sock, friends=friends)
    except BaseException:
        sock.close()
        raise
    try:
        client = socket.socket(socket.AF_UNIX)  # (libuv's own connect takes no abstract address)
        client.connect(address)
        reader, writer = await bounded(asyncio.open_unix_connection(sock=client))
        writer.write(b"over a unix socket")
        assert await bounded(reader.readexactly(18)) == b"over a unix socket"
        writer.close()
        await bounded(writer.wait_closed())
        await echoes.all_lost()
    finally:
        server.close()
        await server.wait_closed()
    after = friendsock.stats()
    assert after.fallbacks == before.fallbacks
    assert after.listeners.keys() == before.listeners.keys()


async def test_ssl_timeouts_without_ssl_are_a_value_error(how, friends):
    sock = bound_socket() if how == "sock" else None
    where = {"sock": sock} if sock else {"host": LOCALHOST, "port": 0}
    try:
        with pytest.raises(ValueError, match="only meaningful with ssl"):
            await friendsock.create_server(Recorder, ssl_handshake_timeout=1, friends=friends, **where)
    finally:
        if sock is not None:
            sock.close()


async def test_binding_options_are_ignored_with_sock(friends):
    # asyncio ignores what only shapes binding when the socket is given.
    echoes = Echoes()
    sock = bound_socket()
    try:
        server = await friendsock.create_server(
            echoes, sock=sock, family=socket.AF_INET, flags=socket.AI_PASSIVE,
            reuse_address=True, reuse_port=None, ssl=None, backlog=5, friends=friends,
        )
    except BaseException:
        sock.close()
        raise
    try:
        await check_pairs(port_of(server), friends, echoes)
    finally:
        server.close()


async def test_unknown_keyword_is_a_type_error(how, friends):
    sock = bound_socket() if how == "sock" else None
    where = {"sock": sock} if sock else {"host": LOCALHOST, "port": 0}
    try:
        with pytest.raises(TypeError):
            await friendsock.create_server(Recorder, no_such_option=1, friends=friends, **where)
    finally:
        if sock is not None:
            sock.close()


async def test_a_server_out_of_descriptors_as_it_accepts_reports_it_and_accepts_later(monkeypatch):
    """As asyncio's own server out of descriptors: reported to the loop's
    exception handler, and the connection accepted a moment later, a
    friend's, its bytes all there."""
    loop = asyncio.get_running_loop()
    errors: list = []
    loop.set_exception_handler(lambda _loop, context: errors.append(context))
    monkeypatch.setattr(_server, "_ACCEPT_RETRY_DELAY", 0.01)
    out_of_descriptors = OSError(errno.EMFILE, os.strerror(errno.EMFILE))
    accept_from = _server.accept_from

    def failing_once(*args):
        monkeypatch.setattr(_server, "accept_from", accept_from)  # (the next accept is the real one)
        raise out_of_descriptors

    echoes = Echoes()
    server = await friendsock.create_server(echoes, LOCALHOST, 0)
    monkeypatch.setattr(_server, "accept_from", failing_once)
    try:
        transport, client = await bounded(friendsock.create_connection(Recorder, LOCALHOST, port_of(server)))
        await echo_and_finish(transport, client)
        assert friendsock.is_friend((await echoes.first).transport)
    finally:
        server.close()
        await bounded(server.wait_closed())
    assert [(context["message"], context["exception"]) for context in errors] == [
        ("socket.accept() out of system resource", out_of_descriptors)]
