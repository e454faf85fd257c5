"""Non-blocking sockets under ``patch_socket()``: code that drives its own
sockets by readiness (tornado's ``IOStream``, Twisted's reactors, a plain
``selectors`` loop) pairs, and sees what it sees over TCP.

Every scenario is written once, as a generator that yields what it waits
for (``("read" | "write", sock)``), and driven by each poller: ``select``,
``poll`` and ``epoll`` through ``selectors``, and ``add_reader``/
``add_writer`` of an asyncio and a uvloop loop (installed, as a process
that pairs non-blocking sockets on a loop's thread has it); on both paths.
"""

from __future__ import annotations

import asyncio
import contextlib
import errno
import gc
import hashlib
import os
import selectors
import socket
import threading
from typing import Any, Generator, Iterator, Tuple

import pytest
import uvloop

import friendsock
from friendsock._report import since
from support import answered_after_the_connect, every_loop_installed

LOCALHOST = "127.0.0.1"
TIMEOUT = 10
MiB = 1 << 20

Wait = Tuple[str, socket.socket]
Scenario = Generator[Wait, None, Any]

pytestmark = pytest.mark.timeout(60)


@pytest.fixture
def patched(friends: bool) -> Iterator[bool]:
    """The friend path: ``patch_socket()`` for the test; real TCP: the
    stdlib's sockets as they are."""
    if friends:
        friendsock.patch_socket()
    try:
        yield friends
    finally:
        friendsock.unpatch_socket()


def _run_with_selector(kind: str, scenario: Scenario) -> Any:
    selector = {"select": selectors.SelectSelector, "poll": selectors.PollSelector,
                "epoll": selectors.EpollSelector}[kind]()
    events = {"read": selectors.EVENT_READ, "write": selectors.EVENT_WRITE}
    with selector:
        try:
            what, sock = next(scenario)
            while True:
                selector.register(sock, events[what])
                try:
                    assert selector.select(TIMEOUT), f"not {what}able within {TIMEOUT} s: {sock!r}"
                finally:
                    selector.unregister(sock)
                what, sock = scenario.send(None)
        except StopIteration as done:
            return done.value


def _run_on_loop(kind: str, scenario: Scenario) -> Any:
    loop = asyncio.new_event_loop() if kind == "asyncio" else uvloop.new_event_loop()
    friendsock.install(loop)

    async def drive() -> Any:
        try:
            what, sock = next(scenario)
            while True:
                ready = loop.create_future()
                add, remove = (loop.add_reader, loop.remove_reader) if what == "read" else \
                    (loop.add_writer, loop.remove_writer)
                fd = sock.fileno()
                add(fd, lambda: ready.done() or ready.set_result(None))
                try:
                    await asyncio.wait_for(ready, TIMEOUT)
                finally:
                    remove(fd)
                what, sock = scenario.send(None)
        except StopIteration as done:
            return done.value

    try:
        return loop.run_until_complete(drive())
    finally:
        friendsock.uninstall(loop)
        loop.close()


POLLERS = ["select", "poll", "epoll", "asyncio", "uvloop"]


def drive(poller: str, scenario: Scenario) -> Any:
    if poller in ("asyncio", "uvloop"):
        return _run_on_loop(poller, scenario)
    return _run_with_selector(poller, scenario)


@contextlib.contextmanager
def nonblocking_listener(proven: bool = True, after_listen: bool = False,
                         **options: int) -> Iterator[socket.socket]:
    """``proven``: its accept has run (a first connection, TCP), so a
    non-blocking connect pairs from its connect() on, as with a server
    that has served before. Made non-blocking before ``listen()``, as
    tornado's ``bind_sockets`` and Twisted's ports are, or ``after_listen``,
    as a ``selectors`` loop's ``socket.create_server()`` socket is."""
    listener = socket.socket()
    with listener:
        for name, value in options.items():
            listener.setsockopt(socket.SOL_SOCKET, getattr(socket, name), value)
        if not after_listen:
            listener.setblocking(False)
        listener.bind((LOCALHOST, 0))
        listener.listen(8)
        if after_listen:
            listener.setblocking(False)
        if proven:
            with socket.socket() as first:
                first.setblocking(False)
                drive("poll", _connect(first, listener.getsockname()))
                drive("poll", _accept(listener)).close()
        yield listener


def _connect(client: socket.socket, address: Any) -> Scenario:
    """The non-blocking connect as tornado's IOStream makes it."""
    assert client.connect_ex(address) == errno.EINPROGRESS
    yield "write", client
    assert client.getsockopt(socket.SOL_SOCKET, socket.SO_ERROR) == 0
    assert client.getpeername() == address


def _writable(sock: socket.socket) -> Scenario:
    yield "write", sock


def _accept(listener: socket.socket) -> Generator[Wait, None, socket.socket]:
    yield "read", listener
    server, _ = listener.accept()
    server.setblocking(False)
    return server


def _connected(listener: socket.socket, client: socket.socket) -> Generator[Wait, None, socket.socket]:
    """``client``, made non-blocking, connected to ``listener``; the
    accepted socket."""
    client.setblocking(False)
    yield from _connect(client, listener.getsockname())
    return (yield from _accept(listener))


def _send_all(sock: socket.socket, data: bytes) -> Scenario:
    view = memoryview(data)
    while view:
        try:
            view = view[sock.send(view[:256 * 1024]):]
        except BlockingIOError:
            yield "write", sock


def _recv_exactly(sock: socket.socket, size: int) -> Generator[Wait, None, bytes]:
    got = bytearray()
    while len(got) < size:
        try:
            chunk = sock.recv(size - len(got))
        except BlockingIOError:
            yield "read", sock
            continue
        assert chunk, f"EOF after {len(got)} of {size} bytes"
        got += chunk
    return bytes(got)


def _recv_eof(sock: socket.socket) -> Scenario:
    while True:
        try:
            assert sock.recv(1) == b""
            return
        except BlockingIOError:
            yield "read", sock


def _echo_both_ways(client: socket.socket, server: socket.socket, data: bytes) -> Scenario:
    """``data`` to the server and back, each side never blocking: written
    in slices, what came read before more is written."""
    echoed = bytearray()
    step = 64 * 1024
    for start in range(0, len(data), step):
        piece = data[start:start + step]
        yield from _send_all(client, piece)
        yield from _send_all(server, (yield from _recv_exactly(server, len(piece))))
        echoed += yield from _recv_exactly(client, len(piece))
    return bytes(echoed)


@pytest.mark.parametrize("poller", POLLERS)
def test_a_connection_driven_by_readiness_answers_as_tcp(patched, poller):
    """Connect (EINPROGRESS, writable, SO_ERROR 0), accept, EAGAIN with
    nothing to read, 1 MiB each way, half-close each way: as over TCP, and
    a friend link on the friend path."""
    before = friendsock.stats()
    data = os.urandom(MiB)

    def scenario() -> Scenario:
        with nonblocking_listener() as listener, socket.socket() as client:
            server = yield from _connected(listener, client)
            with server:
                assert server.getpeername() == client.getsockname()
                assert friendsock.is_friend(client) is friendsock.is_friend(server) is patched
                for sock in (client, server):
                    with pytest.raises(BlockingIOError):
                        sock.recv(1)
                    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
                    assert sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY) == 1
                    assert sock.getsockopt(socket.SOL_SOCKET, socket.SO_ERROR) == 0
                    assert sock.gettimeout() == 0.0 and not sock.getblocking()
                echoed = yield from _echo_both_ways(client, server, data)
                assert hashlib.sha256(echoed).digest() == hashlib.sha256(data).digest()
                client.shutdown(socket.SHUT_WR)
                yield from _recv_eof(server)
                yield from _send_all(server, b"last words")
                server.shutdown(socket.SHUT_WR)
                assert (yield from _recv_exactly(client, 10)) == b"last words"
                yield from _recv_eof(client)

    drive(poller, scenario())
    assert since(before, friendsock.stats()).links_made == patched


@pytest.mark.parametrize("poller", POLLERS)
def test_a_fileno_method_kept_from_before_the_connect_follows_the_socket(patched, poller):
    """Twisted's transports keep ``sock.fileno`` (the bound method), taken
    before their connect, and register what it returns: it answers the
    descriptor that shows the connection's readiness, as ``fileno()`` does."""

    class Kept:  # what the pollers are given: Twisted's transport, in effect
        def __init__(self, sock: socket.socket) -> None:
            self.fileno = sock.fileno

    def scenario() -> Scenario:
        with nonblocking_listener() as listener, socket.socket() as client:
            client.setblocking(False)
            kept = Kept(client)
            yield from _connect(client, listener.getsockname())
            assert kept.fileno() == client.fileno()
            server = yield from _accept(listener)
            with server:
                yield from _send_all(server, b"to the kept descriptor")
                yield "read", kept  # type: ignore[misc]
                assert client.recv(100) == b"to the kept descriptor"

    drive(poller, scenario())


def test_a_second_connect_after_a_native_one_stays_native(patched):
    """Twisted's reactors call ``connect_ex()`` again once the socket is
    writable, to learn that it is connected (0). After a first connect
    that did not pair (here, pairing was off then), the second must not
    pair a connection the listener has accepted as TCP already."""
    with nonblocking_listener() as listener, socket.socket() as client:
        client.setblocking(False)
        friendsock.set_enabled(False)
        try:
            assert client.connect_ex(listener.getsockname()) == errno.EINPROGRESS
        finally:
            friendsock.set_enabled(True)
        server = drive("poll", _accept(listener))
        with server:
            drive("poll", _writable(client))
            assert client.connect_ex(listener.getsockname()) == 0
            assert not friendsock.is_friend(client) and not friendsock.is_friend(server)
            drive("poll", _send_all(server, b"over tcp"))
            assert drive("poll", _recv_exactly(client, 8)) == b"over tcp"


def test_a_descriptor_closed_behind_the_sockets_back_fails_its_calls(patched):
    """tornado's ``test_inline_read_error``: ``os.close(sock.fileno())``,
    then a read with nothing to read fails with EBADF, not EAGAIN, and so
    does the socket's own close, as over TCP."""
    with nonblocking_listener() as listener, socket.socket() as client:
        server = drive("poll", _connected(listener, client))
        os.close(server.fileno())
        with pytest.raises(OSError) as failed:
            server.recv(1)
        assert failed.value.errno == errno.EBADF
        with pytest.raises(OSError) as failed:
            server.close()
        assert failed.value.errno == errno.EBADF


def test_a_fork_leaves_a_polled_link_to_the_parent(patched):
    """A fork with a link between polled non-blocking sockets: their
    event loop's epoll registration would not survive a move to TCP, so
    the link stays the parent's, where it goes on; in the child its
    sockets fail with ECONNRESET at once, never waiting. (Over TCP the
    child finds nothing to read: EAGAIN.)"""
    with nonblocking_listener() as listener, socket.socket() as client:
        server = drive("poll", _connected(listener, client))
        with server:
            assert friendsock.is_friend(client) is patched
            pid = os.fork()
            if pid == 0:
                status = 1
                try:
                    client.recv(1)
                except ConnectionResetError:
                    status = 0 if patched else 2
                except BlockingIOError:
                    status = 3 if patched else 0
                finally:
                    os._exit(status)
            _, status = os.waitpid(pid, 0)
            assert os.waitstatus_to_exitcode(status) == 0
            drive("poll", _send_all(server, b"after the fork"))
            assert drive("poll", _recv_exactly(client, 14)) == b"after the fork"
            assert friendsock.is_friend(client) is patched


@pytest.mark.parametrize("poller", ["epoll", "uvloop"])
def test_a_close_with_unread_bytes_resets_the_peer(patched, poller):
    def scenario() -> Scenario:
        with nonblocking_listener() as listener, socket.socket() as client:
            server = yield from _connected(listener, client)
            with server:
                yield from _send_all(client, b"unread")
                yield "read", server
                server.close()
                yield "read", client
                with pytest.raises(ConnectionResetError):
                    client.recv(1)

    drive(poller, scenario())


@pytest.mark.parametrize("after_listen", [False, True], ids=["before-listen", "after-listen"])
@pytest.mark.parametrize("poller", POLLERS)
def test_a_readiness_loops_first_client_pairs_where_every_loop_is_installed(patched, poller,
                                                                            after_listen):
    """Every loop installed, a listener made non-blocking (before its
    ``listen()``, as tornado's and Twisted's; or after it) is accepted
    through friendsock, by its owner's readiness loop or an installed
    loop: the first non-blocking client, connected before any accept,
    pairs, and nothing falls back. (With ``patch_socket()`` alone, a loop
    friendsock is not installed on may still take the listener natively:
    see ``test_an_early_clients_bytes_reach_a_listener_handed_to_uvloop``.)"""
    data = os.urandom(300_000)
    counted = []

    def scenario() -> Scenario:
        with nonblocking_listener(proven=False, after_listen=after_listen) as listener, \
                socket.socket() as client:
            counted.append(friendsock.stats())
            server = yield from _connected(listener, client)
            with server:
                assert friendsock.is_friend(client) is friendsock.is_friend(server) is patched
                echoed = yield from _echo_both_ways(client, server, data)
                assert hashlib.sha256(echoed).digest() == hashlib.sha256(data).digest()

    with every_loop_installed():
        drive(poller, scenario())
    delta = since(counted[0], friendsock.stats())
    assert (delta.links_made, dict(delta.fallbacks)) == (int(patched), {})


@pytest.mark.parametrize("loop_kind", ["asyncio", "uvloop"])
def test_an_event_loop_client_pairs_with_a_readiness_loops_listener_before_its_accept(
        patched, loop_kind):
    """Every loop installed, an event loop's client (whose transport cannot
    go on over TCP) connects to a listener made non-blocking before
    ``listen()``, whose accept runs only after ``open_connection``
    returns (anyio's tests accept that way, on the client's thread): a
    friend link from the connect on, every byte there."""
    with every_loop_installed(), nonblocking_listener(proven=False) as listener:
        before = friendsock.stats()
        answered_after_the_connect(listener.getsockname(), lambda: drive("poll", _accept(listener)),
                                   loop_kind, patched)
        delta = since(before, friendsock.stats())
        # (Over TCP, the installed loop counts its connect to a plain listener.)
        assert (delta.links_made, dict(delta.fallbacks)) == \
            ((1, {}) if patched else (0, {"no-listener": 1}))


@pytest.mark.parametrize("every_loop", [False, True], ids=["patch_socket", "every-loop"])
def test_a_shared_listener_is_tcp_until_it_has_claimed(patched, every_loop):
    """A listener others may share (SO_REUSEPORT): a non-blocking connect
    cannot wait for its claim, so it takes TCP, counted as unconfirmed (and
    by the accepting end, which finds no friend connect, as such), with
    every loop installed too."""
    counted = []

    def scenario() -> Scenario:
        with nonblocking_listener(SO_REUSEPORT=1) as listener, socket.socket() as client:
            counted.append(friendsock.stats())
            server = yield from _connected(listener, client)
            with server:
                assert not friendsock.is_friend(client) and not friendsock.is_friend(server)
                echoed = yield from _echo_both_ways(client, server, b"over tcp")
                assert echoed == b"over tcp"

    with every_loop_installed() if every_loop else contextlib.nullcontext():
        drive("epoll", scenario())
    delta = since(counted[0], friendsock.stats())
    assert delta.links_made == 0
    assert dict(delta.fallbacks) == ({"unconfirmed": 1, "peer-not-friend": 1} if patched else {})


@pytest.mark.parametrize("handed", ["itself", "dup"])
def test_an_early_clients_bytes_reach_a_listener_handed_to_uvloop(patched, handed):
    """A non-blocking client connects to a non-blocking listener whose
    accept has not run yet, and writes; the listener (or a duplicate of
    it) is then handed to a loop that accepts natively (uvloop's
    ``create_server(sock=)``, not installed): every byte arrives. (Such a
    client takes TCP: polled by its loop, its link could not go on over
    TCP then.)"""
    with nonblocking_listener(proven=False) as listener, socket.socket() as client:
        client.setblocking(False)
        drive("poll", _connect(client, listener.getsockname()))
        drive("poll", _send_all(client, b"early bytes"))
        client.shutdown(socket.SHUT_WR)

        async def serve() -> bytes:
            loop = asyncio.get_running_loop()
            done = loop.create_future()
            received = []

            class Collect(asyncio.Protocol):
                def data_received(self, data: bytes) -> None:
                    received.append(data)

                def eof_received(self) -> None:
                    done.set_result(b"".join(received))

            handed_on = listener if handed == "itself" else listener.dup()
            server = await loop.create_server(Collect, sock=handed_on)
            try:
                return await asyncio.wait_for(done, TIMEOUT)
            finally:
                server.close()
                await server.wait_closed()

        loop = uvloop.new_event_loop()
        try:
            assert loop.run_until_complete(serve()) == b"early bytes"
        finally:
            loop.close()
        assert not friendsock.is_friend(client)


def test_a_connect_that_takes_tcp_leaves_no_cycle_behind(patched):
    """A non-blocking connect to a listener that has not accepted yet is
    TCP: the link it was registered with, which never formed, is let go
    of without a reference cycle (tornado's tests look for such garbage)."""
    from friendsock._core._link import Link, LinkEnd

    with nonblocking_listener(proven=False) as listener:
        gc.collect()
        gc.disable()
        gc.set_debug(gc.DEBUG_SAVEALL)
        try:
            with socket.socket() as client:
                client.setblocking(False)
                drive("poll", _connect(client, listener.getsockname()))
                assert not friendsock.is_friend(client)
                drive("poll", _accept(listener)).close()
            gc.collect()
            assert not [item for item in gc.garbage if isinstance(item, (Link, LinkEnd))]
        finally:
            gc.set_debug(0)
            gc.garbage.clear()
            gc.enable()


def test_a_trio_socket_is_left_to_trio(patched):
    """trio's sockets do their I/O with the C socket calls: under
    ``patch_socket()`` alone their connects stay TCP, and carry every byte
    to a non-blocking listener of the patched class."""
    import trio

    with nonblocking_listener() as listener:
        address = listener.getsockname()
        accepted: list = []
        ready = threading.Event()

        def serve() -> None:
            server = drive("poll", _accept(listener))
            accepted.append(server)
            ready.set()

        async def client() -> bytes:
            sock = trio.socket.socket()
            with sock:
                await sock.connect(address)
                await trio.to_thread.run_sync(serve)
                server = accepted[0]
                with server:
                    await sock.send(b"ping")
                    assert drive("poll", _recv_exactly(server, 4)) == b"ping"
                    drive("poll", _send_all(server, b"pong"))
                    assert not friendsock.is_friend(server)
                    return await sock.recv(4)

        assert trio.run(client) == b"pong"
        assert ready.is_set()


def test_uninstalled_loop_threads_keep_their_sockets_tcp(patched):
    """On a thread running a loop friendsock is not installed on, a
    non-blocking socket stays TCP: uvloop's ``create_connection(sock=)``
    does its I/O on the descriptor, in C (aiohttp's way: ``sock_connect``,
    then ``sock=``)."""
    with nonblocking_listener() as listener:
        address = listener.getsockname()

        async def exchange() -> bytes:
            loop = asyncio.get_running_loop()
            sock = socket.socket()
            sock.setblocking(False)
            await loop.sock_connect(sock, address)
            assert not friendsock.is_friend(sock)
            server, _ = listener.accept()
            with server:
                reader, writer = await asyncio.open_connection(sock=sock)
                writer.write(b"ping")
                server.setblocking(True)
                server.settimeout(TIMEOUT)
                assert server.recv(4) == b"ping"
                server.sendall(b"pong")
                answer = await asyncio.wait_for(reader.readexactly(4), TIMEOUT)
                writer.close()
                await writer.wait_closed()
                return answer

        loop = uvloop.new_event_loop()
        try:
            assert loop.run_until_complete(exchange()) == b"pong"
        finally:
            loop.close()


def test_a_listener_accepted_by_an_uninstalled_loop_serves_a_blocking_client(patched):
    """A non-blocking listener made before the loop runs (registered at
    listen()), accepted by uvloop's own ``sock_accept`` on a loop
    friendsock is not installed on, whose transport reads the descriptor
    in C: a blocking client on another thread (which pairs from its
    connect on) is served over TCP, every byte."""
    with nonblocking_listener(proven=False) as listener:
        address = listener.getsockname()
        answers: list = []

        def client() -> None:
            with socket.create_connection(address, timeout=TIMEOUT) as sock:
                sock.sendall(b"hello")
                answers.append(sock.recv(100))

        async def serve() -> bytes:
            loop = asyncio.get_running_loop()
            thread = threading.Thread(target=client)
            thread.start()
            try:
                conn, _ = await asyncio.wait_for(loop.sock_accept(listener), TIMEOUT)
                got = loop.create_future()

                class Echo(asyncio.Protocol):
                    def connection_made(self, transport: Any) -> None:
                        self.transport = transport

                    def data_received(self, data: bytes) -> None:
                        self.transport.write(data)
                        if not got.done():
                            got.set_result(data)

                transport, _ = await loop.connect_accepted_socket(Echo, conn)
                try:
                    return await asyncio.wait_for(got, TIMEOUT)
                finally:
                    await loop.run_in_executor(None, thread.join, TIMEOUT)
                    transport.close()
            finally:
                thread.join(TIMEOUT)

        loop = uvloop.new_event_loop()
        try:
            assert loop.run_until_complete(serve()) == b"hello"
        finally:
            loop.close()
        assert answers == [b"hello"]


def test_connect_on_a_connected_socket_answers_as_tcp(patched):
    """A non-blocking socket's next connect() after its connect completed
    says it is done (0: Twisted's reactors ask so), then EISCONN; an
    accepted socket's is EISCONN: as TCP's, and nothing pairs again."""
    with nonblocking_listener() as listener, socket.socket() as client:
        server = drive("poll", _connected(listener, client))
        with server:
            assert client.connect_ex(listener.getsockname()) == 0
            assert client.connect_ex(listener.getsockname()) == errno.EISCONN
            with pytest.raises(OSError) as failed:
                client.connect(listener.getsockname())
            assert failed.value.errno == errno.EISCONN
            assert server.connect_ex(listener.getsockname()) == errno.EISCONN
            assert friendsock.is_friend(client) is friendsock.is_friend(server) is patched


def test_a_subclass_made_while_patched_keeps_its_own_fileno(patched):
    """A class its user derives from ``socket.socket`` while patched, whose
    ``fileno()`` calls the base class's, answers the descriptor."""

    class Logged(socket.socket):
        def fileno(self) -> int:
            return super().fileno()

    with Logged() as sock:
        assert sock.fileno() == socket.socket.fileno(sock) >= 0
        assert "fd=" in repr(sock)


@pytest.mark.parametrize("door", ["install", "every-loop"])
def test_tornado_http_and_websocket_pair_in_one_process(patched, door):
    """A real tornado app: ``HTTPServer`` and ``SimpleAsyncHTTPClient`` (a
    connection per request) and a websocket, in one process with sockets
    patched and the loop installed: every connection a friend link, every
    body intact. With that loop alone installed (``install(loop)``), the
    first is TCP: until the server's first accept another loop might
    have taken its listener natively."""
    from tornado import httpserver, netutil, simple_httpclient, websocket
    from tornado import web as tornado_web

    body = os.urandom(300_000)

    class Files(tornado_web.RequestHandler):
        def get(self) -> None:
            self.write(body)

        def post(self) -> None:
            self.write(hashlib.sha256(self.request.body).hexdigest())

    class Echo(websocket.WebSocketHandler):
        def on_message(self, message: Any) -> None:
            self.write_message(message, binary=isinstance(message, bytes))

    async def main() -> None:
        app = tornado_web.Application([("/", Files), ("/ws", Echo)])
        sockets = netutil.bind_sockets(0, LOCALHOST)
        server = httpserver.HTTPServer(app)
        server.add_sockets(sockets)
        port = sockets[0].getsockname()[1]
        client = simple_httpclient.SimpleAsyncHTTPClient(force_instance=True)
        try:
            for _ in range(3):
                response = await client.fetch(f"http://{LOCALHOST}:{port}/")
                assert response.body == body
            response = await client.fetch(f"http://localhost:{port}/", method="POST", body=body,
                                          headers={"Content-Type": "application/octet-stream"})
            assert response.body.decode() == hashlib.sha256(body).hexdigest()
            ws = await websocket.websocket_connect(f"ws://{LOCALHOST}:{port}/ws")
            await ws.write_message(body[:70_000], binary=True)
            assert await ws.read_message() == body[:70_000]
            ws.close()
        finally:
            client.close()
            server.stop()
            await server.close_all_connections()

    before = friendsock.stats()
    with every_loop_installed() if door == "every-loop" else contextlib.nullcontext():
        loop = asyncio.new_event_loop()
        if door == "install":
            friendsock.install(loop)
        try:
            loop.run_until_complete(main())
        finally:
            if door == "install":
                friendsock.uninstall(loop)
            loop.close()
    # Three GETs and a POST on connections of their own, and the websocket.
    links = 5 if door == "every-loop" else 4
    assert since(before, friendsock.stats()).links_made == (links if patched else 0)
