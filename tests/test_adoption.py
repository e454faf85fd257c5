"""Adoption: sockets that libraries connect (``loop.sock_connect``, then
``create_connection(sock=)``) or accept (``loop.sock_accept``, then
``connect_accepted_socket``) themselves pair on installed loops, as long as
no payload crossed the real connection first; anything used raw stays TCP
with every byte in order.

Each test runs on both loops and both paths: ``friend`` installs friendsock
on the loop, ``tcp`` leaves the loop alone. Whatever the tcp path does is
what the friend path must do, except that it pairs.
"""

from __future__ import annotations

import asyncio
import contextlib
import gc
import hashlib
import os
import socket
import weakref
from typing import Any, AsyncIterator, Callable, List, Tuple

import anyio
import pytest

import friendsock
from friendsock._core._registry import registry
from friendsock._host import LISTENERS, opened_table
from support import LOCALHOST, bounded, fallbacks_since, patient_confirm, registered, until  # noqa: F401

MiB = 1 << 20


def maybe_installed(friends: bool) -> Any:
    return friendsock.installed() if friends else contextlib.nullcontext()


def raw_socket() -> socket.socket:
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setblocking(False)
    return sock


async def sock_connect_streams(port: int) -> Tuple[asyncio.StreamReader, asyncio.StreamWriter]:
    """What aiohttp's connector does: connect a socket of its own with
    ``loop.sock_connect``, then hand it over with ``sock=``."""
    sock = raw_socket()
    try:
        await asyncio.get_running_loop().sock_connect(sock, (LOCALHOST, port))
    except BaseException:
        sock.close()
        raise
    return await asyncio.open_connection(sock=sock)


class SockAcceptServer:
    """What anyio's listeners do: accept with ``loop.sock_accept``, then hand
    each socket to ``connect_accepted_socket``; ``handle`` serves the
    streams (``adopt=False``: it gets the raw socket instead)."""

    def __init__(self, handle: Callable[..., Any], adopt: bool = True,
                 open_connection: bool = False) -> None:
        self.listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        self.listener.bind((LOCALHOST, 0))
        self.listener.listen(100)
        self.listener.setblocking(False)
        self.port = self.listener.getsockname()[1]
        self.handle = handle
        self.adopt = adopt
        # Hand each socket to asyncio.open_connection(sock=) instead, as
        # code that accepts by hand often does.
        self.open_connection = open_connection
        self.writers: List[asyncio.StreamWriter] = []
        self.tasks: List[asyncio.Task] = []
        self._accepting = asyncio.get_running_loop().create_task(self._accept_forever())

    async def _accept_forever(self) -> None:
        loop = asyncio.get_running_loop()
        while True:
            conn, _ = await loop.sock_accept(self.listener)
            self.tasks.append(loop.create_task(self._serve(conn)))

    async def _serve(self, conn: socket.socket) -> None:
        loop = asyncio.get_running_loop()
        if not self.adopt:
            try:
                await self.handle(conn)
            finally:
                conn.close()
            return
        if self.open_connection:
            reader, writer = await asyncio.open_connection(sock=conn)
        else:
            reader = asyncio.StreamReader()
            protocol = asyncio.StreamReaderProtocol(reader)
            transport, _ = await loop.connect_accepted_socket(lambda: protocol, conn)
            writer = asyncio.StreamWriter(transport, protocol, reader, loop)
        self.writers.append(writer)
        try:
            await self.handle(reader, writer)
        finally:
            writer.close()

    async def aclose(self) -> None:
        self._accepting.cancel()
        for task in self.tasks:
            task.cancel()
        await asyncio.gather(self._accepting, *self.tasks, return_exceptions=True)
        self.listener.close()


@contextlib.asynccontextmanager
async def sock_accept_server(handle: Callable[..., Any], adopt: bool = True,
                             open_connection: bool = False) -> AsyncIterator[SockAcceptServer]:
    server = SockAcceptServer(handle, adopt, open_connection)
    # Its first sock_accept call registers the listener: clients connect after.
    await first_accept_call(server.port, friendsock.is_installed())
    try:
        yield server
    finally:
        await server.aclose()


async def echo_streams(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    try:
        while data := await reader.read(MiB):
            writer.write(data)
            await writer.drain()
        writer.write_eof()
    finally:
        writer.close()


async def first_accept_call(port: int, friends: bool) -> None:
    """Until a listener that friendsock first sees at its sock_accept call
    is registered (only then do connects to it pair): a few loop turns."""
    for _ in range(1000):
        if not friends or registry.has_port(port):
            return
        await asyncio.sleep(0)
    raise AssertionError("the listener never called sock_accept")


async def exchange(reader: asyncio.StreamReader, writer: asyncio.StreamWriter, size: int) -> None:
    """``size`` random bytes through an echo, checked by sha256."""
    payload = os.urandom(size)

    async def send() -> None:
        writer.write(payload)
        await writer.drain()
        writer.write_eof()

    sender = asyncio.ensure_future(send())
    echoed = await bounded(reader.read(-1))
    await bounded(sender)
    assert hashlib.sha256(echoed).digest() == hashlib.sha256(payload).digest()


@contextlib.asynccontextmanager
async def start_server_echo() -> AsyncIterator[int]:
    server = await asyncio.start_server(echo_streams, LOCALHOST, 0)
    try:
        yield server.sockets[0].getsockname()[1]
    finally:
        server.close()
        await server.wait_closed()


@contextlib.asynccontextmanager
async def sock_accept_echo() -> AsyncIterator[int]:
    async with sock_accept_server(echo_streams) as server:
        yield server.port


@contextlib.asynccontextmanager
async def sock_accept_open_connection_echo() -> AsyncIterator[int]:
    async with sock_accept_server(echo_streams, open_connection=True) as server:
        yield server.port


SERVERS = {"start_server": start_server_echo, "sock_accept": sock_accept_echo,
           "sock_accept+open_connection": sock_accept_open_connection_echo}


# -- pairing -------------------------------------------------------------------


# (open_connection, start_server): both ends friendsock's own, test_pairing.py
@pytest.mark.parametrize("client_kind, server_kind", [
    ("sock_connect", "start_server"),
    ("sock_connect", "sock_accept"),
    ("open_connection", "sock_accept"),
    ("sock_connect", "sock_accept+open_connection"),
    ("open_connection", "sock_accept+open_connection"),
])
async def test_sockets_made_elsewhere_pair(friends, client_kind, server_kind, patient_confirm):
    with maybe_installed(friends):
        async with SERVERS[server_kind]() as port:
            before = friendsock.stats()
            if client_kind == "sock_connect":
                reader, writer = await sock_connect_streams(port)
            else:
                reader, writer = await asyncio.open_connection(LOCALHOST, port)
            try:
                assert friendsock.is_friend(writer) is friends
                await exchange(reader, writer, 4 * MiB)
            finally:
                writer.close()
            if friends:
                assert friendsock.stats().links_made == before.links_made + 1
                assert fallbacks_since(before) == {}


async def test_a_socket_subclass_handed_over_stays_tcp(friends):
    """A socket of a subclass of its user's, connected with ``sock_connect``
    and handed over with ``sock=``: its own methods may count, log or change
    what goes through it, and the loop's transport calls them: TCP."""
    class TrackedSocket(socket.socket):
        used_for_read = False

        def recv(self, *args: Any) -> bytes:
            self.used_for_read = True
            return super().recv(*args)

    with maybe_installed(friends):
        async with start_server_echo() as port:
            before = friendsock.stats()
            sock = TrackedSocket(socket.AF_INET, socket.SOCK_STREAM)
            sock.setblocking(False)
            try:
                await asyncio.get_running_loop().sock_connect(sock, (LOCALHOST, port))
            except BaseException:
                sock.close()
                raise
            reader, writer = await asyncio.open_connection(sock=sock)
            try:
                assert not friendsock.is_friend(writer)
                await exchange(reader, writer, MiB)
            finally:
                writer.close()
            assert friendsock.stats().links_made == before.links_made
            # The stdlib loop's transport reads through the socket's methods
            # (uvloop's reads the descriptor in C).
            assert sock.used_for_read is isinstance(asyncio.get_running_loop(), asyncio.BaseEventLoop)


async def test_a_blocking_socket_of_the_patched_class_pairs_once(friends):
    """Under ``patch_socket()``, a blocking socket (asyncssh hands the loop
    ``socket.socket()`` as it comes) connected with ``sock_connect`` and
    handed over with ``sock=``: the loop's connect is the adoptable one, not
    a blocking socket's pairing as well. One link, no fallback, a friend
    transport; TCP where the loop is not installed."""
    friendsock.patch_socket()
    try:
        with maybe_installed(friends):
            async with start_server_echo() as port:
                before = friendsock.stats()
                sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
                assert sock.getblocking()
                try:
                    await asyncio.get_running_loop().sock_connect(sock, (LOCALHOST, port))
                except BaseException:
                    sock.close()
                    raise
                assert not friendsock.is_friend(sock)
                reader, writer = await asyncio.open_connection(sock=sock)
                try:
                    assert friendsock.is_friend(writer) is friends
                    await exchange(reader, writer, MiB)
                finally:
                    writer.close()
                assert friendsock.stats().links_made == before.links_made + friends
                # (Where the loop is not installed, the socket's own connect
                # looked for a listener of ours, and found none.)
                assert fallbacks_since(before) == ({} if friends else {"no-listener": 1})
    finally:
        friendsock.unpatch_socket()


@pytest.mark.parametrize("proto", [0, socket.IPPROTO_TCP])
@pytest.mark.parametrize("server_kind", ["start_server", "sock_accept"])
async def test_a_handed_over_socket_gets_tcp_nodelay_as_from_the_loop(friends, server_kind, proto,
                                                                        patient_confirm):
    """The loop's own transport sets TCP_NODELAY on a socket its user hands
    over with ``sock=`` (uvloop on any TCP socket, asyncio on those made
    with proto IPPROTO_TCP), and the user, who holds the socket, may look:
    a friend end does the same."""
    loop = asyncio.get_running_loop()
    expected = proto == socket.IPPROTO_TCP or not isinstance(loop, asyncio.BaseEventLoop)
    with maybe_installed(friends):
        async with SERVERS[server_kind]() as port:
            sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM, proto)
            sock.setblocking(False)
            await loop.sock_connect(sock, (LOCALHOST, port))
            assert sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY) == 0
            reader, writer = await asyncio.open_connection(sock=sock)
            try:
                assert friendsock.is_friend(writer) is friends
                assert bool(sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY)) is expected
                await exchange(reader, writer, 1024)
            finally:
                writer.close()


@pytest.mark.parametrize("server_kind", sorted(SERVERS))
async def test_a_cancelled_sock_connect_leaves_the_socket_to_its_user(friends, server_kind):
    """A ``sock_connect`` cancelled while it waits leaves nothing of the
    loop's watching the socket; its user closes it, and the next connect
    pairs (or not) as ever."""
    loop = asyncio.get_running_loop()
    with maybe_installed(friends):
        async with SERVERS[server_kind]() as port:
            sock = raw_socket()
            try:
                connecting = asyncio.ensure_future(loop.sock_connect(sock, (LOCALHOST, port)))
                await asyncio.sleep(0)
                assert not connecting.done()
                connecting.cancel()
                with pytest.raises(asyncio.CancelledError):
                    await connecting
                assert not loop.remove_writer(sock.fileno())  # (uvloop's says None, asyncio's False)
            finally:
                sock.close()
            reader, writer = await bounded(sock_connect_streams(port))
            try:
                assert friendsock.is_friend(writer) is friends
                await exchange(reader, writer, 1024)
            finally:
                writer.close()


async def test_sock_connect_in_debug_mode_refuses_a_blocking_socket(friends):
    """As the loop's own ``sock_connect`` in debug mode: ValueError."""
    loop = asyncio.get_running_loop()
    with maybe_installed(friends):
        async with start_server_echo() as port:
            loop.set_debug(True)
            try:
                with socket.socket() as sock:
                    with pytest.raises(ValueError, match="non-blocking"):
                        await loop.sock_connect(sock, (LOCALHOST, port))
            finally:
                loop.set_debug(False)


async def test_a_collected_sock_accept_listener_leaves_no_dead_reference_to_find(friends):
    """A listening socket first seen by ``sock_accept``, closed, dropped and
    collected: nothing the collector can reach is a dead weak proxy of it
    (code that walks ``gc.get_objects()`` with ``isinstance()``, as anyio's
    tests do, raises ReferenceError at one)."""
    loop = asyncio.get_running_loop()
    with maybe_installed(friends):
        listener = raw_socket()
        listener.bind((LOCALHOST, 0))
        listener.listen()
        accepting = asyncio.ensure_future(loop.sock_accept(listener))
        client = raw_socket()
        await bounded(loop.sock_connect(client, listener.getsockname()))
        conn, _ = await bounded(accepting)
        for sock in (conn, client, listener):
            sock.close()
        del listener, accepting, conn
        gc.collect()
        for obj in gc.get_objects():
            isinstance(obj, asyncio.AbstractEventLoop)


async def test_anyio_listener_pairs_with_asyncio_and_anyio_clients(friends, patient_confirm):
    """anyio's create_tcp_listener serves over sock_accept +
    connect_accepted_socket; asyncio.open_connection and anyio.connect_tcp
    both pair with it."""
    payload = os.urandom(2 * MiB)
    served: List[bool] = []

    async def handle(stream: Any) -> None:
        async with stream:
            served.append(friendsock.is_friend(stream._transport))
            received = bytearray()
            while len(received) < len(payload):
                received += await stream.receive()
            await stream.send(bytes(received))

    with maybe_installed(friends):
        listener = await anyio.create_tcp_listener(local_host=LOCALHOST, local_port=0)
        port = listener.extra(anyio.abc.SocketAttribute.local_port)
        async with anyio.create_task_group() as group:
            group.start_soon(listener.serve, handle)
            await first_accept_call(port, friends)
            reader, writer = await asyncio.open_connection(LOCALHOST, port)
            try:
                writer.write(payload)
                assert await bounded(reader.readexactly(len(payload))) == payload
                assert friendsock.is_friend(writer) is friends
            finally:
                writer.close()
            async with await anyio.connect_tcp(LOCALHOST, port) as stream:
                await stream.send(payload)
                received = bytearray()
                with anyio.fail_after(10):
                    while len(received) < len(payload):
                        received += await stream.receive()
                assert bytes(received) == payload
                assert friendsock.is_friend(stream._transport) is friends
            group.cancel_scope.cancel()
        await listener.aclose()
    assert served == [friends, friends]



async def test_an_anyio_listener_keeps_its_port_published_while_open(friends):
    """anyio's listener publishes its port as it is made, so that friendsock
    clients of other processes wait for its offer, and withdraws it as it
    closes; on a loop without friendsock it publishes nothing."""
    table = opened_table()
    assert table is not None
    with maybe_installed(friends):
        listener = await anyio.create_tcp_listener(local_host=LOCALHOST, local_port=0)
        port = listener.extra(anyio.abc.SocketAttribute.local_port)
        try:
            assert (table.read(LISTENERS, port).pid == os.getpid()) is friends
        finally:
            await listener.aclose()
        # (Not 0: the table is the host's, and a process killed earlier may
        # have left its slot for this port, which its clients clear.)
        assert table.read(LISTENERS, port).pid != os.getpid()


async def test_an_anyio_listener_pairs_a_client_that_connects_before_its_first_accept(friends):
    """anyio's listener is registered as it is made, not at its first
    sock_accept: a client that connects and writes before the listener
    accepts (the usual test, and the usual start-up) pairs, and every byte
    arrives; on a loop without friendsock it stays the loop's own."""
    payload = os.urandom(4096)
    with maybe_installed(friends):
        async with await anyio.create_tcp_listener(local_host=LOCALHOST, local_port=0) as multi:
            port = multi.extra(anyio.abc.SocketAttribute.local_port)
            assert registered(port) is friends
            async with await anyio.connect_tcp(LOCALHOST, port) as client:
                await client.send(payload)
                async with await bounded(multi.listeners[0].accept()) as server:
                    assert friendsock.is_friend(client._transport) is friends
                    assert friendsock.is_friend(server._transport) is friends
                    received = bytearray()
                    with anyio.fail_after(10):
                        while len(received) < len(payload):
                            received += await server.receive()
                    assert bytes(received) == payload
                    await server.send(b"back")
                    with anyio.fail_after(10):
                        assert await client.receive() == b"back"



async def test_an_anyio_listener_closed_before_it_accepts_resets_its_client(friends):
    """A client waiting in the backlog of an anyio listener that closes is
    reset, as the kernel resets it, on a friend link too (not left waiting
    on a link nobody will ever claim)."""
    with maybe_installed(friends):
        multi = await anyio.create_tcp_listener(local_host=LOCALHOST, local_port=0)
        port = multi.extra(anyio.abc.SocketAttribute.local_port)
        async with await anyio.connect_tcp(LOCALHOST, port) as client:
            await client.send(b"never accepted")
            assert friendsock.is_friend(client._transport) is friends
            await multi.aclose()
            assert not registered(port)
            with anyio.fail_after(10):
                with pytest.raises(anyio.BrokenResourceError):
                    await client.receive()


async def test_a_socket_anyio_only_wraps_is_known_from_its_first_accept(friends):
    """``SocketListener.from_socket`` wraps a listener made elsewhere (a
    pre-fork parent's, a supervisor's), which another process may share:
    it is not registered as this process's alone when wrapped, so a client
    that connects before any accept is TCP, and every byte arrives."""
    sock = socket.create_server((LOCALHOST, 0))
    sock.setblocking(False)
    port = sock.getsockname()[1]
    with maybe_installed(friends):
        async with await anyio.abc.SocketListener.from_socket(sock) as listener:
            assert not registered(port)
            async with await anyio.connect_tcp(LOCALHOST, port) as client:
                await client.send(b"before any accept")
                assert not friendsock.is_friend(client._transport)
                async with await bounded(listener.accept()) as server:
                    with anyio.fail_after(10):
                        assert await server.receive() == b"before any accept"


def _non_blocking_before_listen() -> socket.socket:
    listener = raw_socket()
    listener.bind((LOCALHOST, 0))
    listener.listen()
    return listener


def _made_by_create_server() -> socket.socket:
    listener = socket.create_server((LOCALHOST, 0))
    listener.setblocking(False)  # for sock_accept, on the loop's thread
    return listener


@pytest.mark.parametrize("make_listener", [_non_blocking_before_listen, _made_by_create_server],
                         ids=["non-blocking-before-listen", "create_server"])
async def test_a_listener_seen_at_listen_pairs_a_client_before_its_first_sock_accept(
        friends, make_listener, patient_confirm):
    """Under ``patch_socket()``, a listener friendsock saw ``listen()``
    (made non-blocking before, as anyio's and tornado's are; or made by
    ``socket.create_server()`` and made non-blocking on the loop's thread
    after) is registered there: a client that connected and wrote before
    the listener's first ``sock_accept`` on an installed loop is claimed by
    that accept and pairs, every byte arriving; the loop's accept takes the
    registration over, so the listener is registered once."""
    payload = os.urandom(4096)
    loop = asyncio.get_running_loop()
    if friends:
        friendsock.patch_socket()
    try:
        with maybe_installed(friends):
            listener = make_listener()
            with listener:
                port = listener.getsockname()[1]
                assert registered(port) is friends

                async def connect() -> asyncio.StreamWriter:
                    reader, writer = await asyncio.open_connection(LOCALHOST, port)
                    writer.write(payload)
                    return writer

                connecting = asyncio.ensure_future(connect())
                if friends:  # the client waits for its claim: no accept has run yet
                    await until(lambda: friendsock.stats().pending == 1)
                conn, _ = await bounded(loop.sock_accept(listener))
                reader = asyncio.StreamReader()
                transport, _ = await loop.connect_accepted_socket(
                    lambda: asyncio.StreamReaderProtocol(reader), conn)
                client = await bounded(connecting)
                try:
                    assert friendsock.is_friend(client.transport) is friends
                    assert friendsock.is_friend(transport) is friends
                    assert len(registry._listeners.get((LOCALHOST, port), ())) == friends
                    assert await bounded(reader.readexactly(len(payload))) == payload
                finally:
                    client.close()
                    transport.close()
                    await client.wait_closed()
    finally:
        friendsock.unpatch_socket()


# -- used raw: TCP, byte-exact ------------------------------------------------------


@pytest.mark.parametrize("server_kind", list(SERVERS))
async def test_bytes_sent_raw_before_adoption_keep_the_connection_tcp(friends, server_kind, patient_confirm):
    # (patient_confirm: a loaded machine's stall must not let the deadline
    # end the held connection before its raw bytes are seen.)
    with maybe_installed(friends):
        async with SERVERS[server_kind]() as port:
            before = friendsock.stats()
            loop = asyncio.get_running_loop()
            sock = raw_socket()
            await loop.sock_connect(sock, (LOCALHOST, port))
            await loop.sock_sendall(sock, b"raw first|")
            reader, writer = await asyncio.open_connection(sock=sock)
            try:
                assert not friendsock.is_friend(writer)
                writer.write(b"then the stream")
                writer.write_eof()
                assert await bounded(reader.read(-1)) == b"raw first|then the stream"
            finally:
                writer.close()
            if friends:
                assert fallbacks_since(before).get("used-raw") == 1


@pytest.mark.parametrize("server_kind", list(SERVERS))
async def test_a_socket_used_raw_only_is_byte_exact(friends, server_kind):
    payload = os.urandom(512 * 1024)
    with maybe_installed(friends):
        async with SERVERS[server_kind]() as port:
            loop = asyncio.get_running_loop()
            sock = raw_socket()
            try:
                await loop.sock_connect(sock, (LOCALHOST, port))
                await loop.sock_sendall(sock, payload)
                sock.shutdown(socket.SHUT_WR)
                echoed = bytearray()
                while chunk := await bounded(loop.sock_recv(sock, MiB)):
                    echoed += chunk
                assert bytes(echoed) == payload
            finally:
                sock.close()


async def test_a_server_that_writes_raw_before_adoption_stays_tcp(friends):
    async def greet_then_adopt(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await echo_streams(reader, writer)

    loop = asyncio.get_running_loop()

    class Greeting(SockAcceptServer):
        async def _serve(self, conn: socket.socket) -> None:
            await loop.sock_sendall(conn, b"220 hello\r\n")
            await super()._serve(conn)

    with maybe_installed(friends):
        server = Greeting(greet_then_adopt)
        await first_accept_call(server.port, friends)
        try:
            reader, writer = await asyncio.open_connection(LOCALHOST, server.port)
            try:
                assert await bounded(reader.readline()) == b"220 hello\r\n"
                assert not friendsock.is_friend(writer)
                writer.write(b"EHLO")
                writer.write_eof()
                assert await bounded(reader.read(-1)) == b"EHLO"
            finally:
                writer.close()
        finally:
            await server.aclose()


async def test_a_server_that_never_adopts_serves_raw(friends):
    """The client waits no longer than the confirmed mode's deadline for a
    claim that never comes, then goes on over TCP."""
    loop = asyncio.get_running_loop()

    async def raw_echo(conn: socket.socket) -> None:
        while data := await loop.sock_recv(conn, 65536):
            await loop.sock_sendall(conn, data)

    with maybe_installed(friends):
        async with sock_accept_server(raw_echo, adopt=False) as server:
            reader, writer = await bounded(asyncio.open_connection(LOCALHOST, server.port))
            try:
                assert not friendsock.is_friend(writer)
                await exchange(reader, writer, 256 * 1024)
            finally:
                writer.close()


async def test_a_client_that_is_no_friend_is_counted_by_a_sock_accept_server(friends):
    """A plain socket's connection accepted with ``sock_accept`` (anyio's
    listeners): TCP, counted as a peer that is no friend, as a friendsock
    server's own accept counts it."""
    with maybe_installed(friends):
        async with sock_accept_server(echo_streams) as server:
            before = friendsock.stats()
            with socket.create_connection((LOCALHOST, server.port), timeout=10) as client:
                await asyncio.to_thread(client.sendall, b"ping")
                assert await asyncio.to_thread(client.recv, 4) == b"ping"
            assert fallbacks_since(before) == ({"peer-not-friend": 1} if friends else {})


async def test_a_closed_server_goes_while_a_socket_that_reached_it_lives(friends):
    """As uvloop's own test_create_server_7: a server the program let go
    lives while it serves, and is collected once closed, though a socket
    that reached it through ``loop.sock_connect`` (a connect friendsock
    registered, never handed to a transport) is still referenced."""
    loop = asyncio.get_running_loop()
    lost = loop.create_future()

    class Hello(asyncio.Protocol):
        def connection_made(self, transport: asyncio.BaseTransport) -> None:
            transport.write(b"hello")  # type: ignore[attr-defined]

        def connection_lost(self, exc: Any) -> None:
            lost.set_result(exc)

    with maybe_installed(friends):
        server = await loop.create_server(Hello, LOCALHOST, 0)
        port = server.sockets[0].getsockname()[1]
        server_ref = weakref.ref(server)
        del server
        gc.collect()
        sock = raw_socket()
        with sock:
            await bounded(loop.sock_connect(sock, (LOCALHOST, port)))
            assert await bounded(loop.sock_recv(sock, 100)) == b"hello"
        await bounded(lost)
        server = server_ref()
        assert server is not None  # the loop keeps a serving server
        server.close()
        await bounded(server.wait_closed())
        del server

        def collected() -> bool:
            gc.collect()
            return server_ref() is None

        # (uvloop's own lets go once its listeners' handles are closed, a
        # loop turn after close(); its wait_closed() does not wait for that.)
        await until(collected)
        assert sock.fileno() == -1  # (and the socket still referenced here)


# -- listeners seen by sock_accept -----------------------------------------------------


async def test_a_closed_sock_accept_listener_pairs_no_more(friends):
    with maybe_installed(friends):
        async with sock_accept_echo() as port:
            # By port, not by count: other tests' closed listeners may be
            # forgotten at any time meanwhile.
            assert registered(port) == bool(friends)
        # Closed by its user: a connect finds the port closed, as over TCP,
        # and the registry forgets the listener.
        with pytest.raises(ConnectionRefusedError):
            await asyncio.open_connection(LOCALHOST, port)
        assert not registry.has_port(port)
