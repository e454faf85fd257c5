"""Lifetime: either end, or its whole loop, may go away at any moment.

A loop that closes with friend transports open: their friends on other
loops see a reset (what a process that dies leaves behind), never a hang;
nothing stays alive, registered or open. Protocol callbacks that raise are
handled as asyncio handles them. A forked child never pairs with what it
inherited.
"""

from __future__ import annotations

import asyncio
import gc
import json
import os
import socket
import threading
import traceback
from typing import Any, List

import pytest
import uvloop

import friendsock
from friendsock._asyncio import _loop_state
from friendsock._core._registry import registry
from test_threads import (
    LOCALHOST,
    TIMEOUT,
    Factory,
    Here,
    LoopThread,
    ThreadRecorder,
    make_server,
    port_of,
)

MiB = 1 << 20


def loop_kind() -> str:
    return "uvloop" if isinstance(asyncio.get_running_loop(), uvloop.Loop) else "asyncio"


@pytest.fixture(params=["asyncio", "uvloop"])
def doomed(request):
    """A loop in a second thread that the test will close; whatever it
    reported to its exception handler is in ``doomed.errors``."""
    thread = LoopThread(request.param)
    try:
        yield thread
    finally:
        thread.close()


def sockets_closed(*transports: asyncio.BaseTransport) -> bool:
    socks = [t.get_extra_info("socket") for t in transports]
    return all(sock is None or sock.fileno() == -1 for sock in socks)  # uvloop: None


def assert_nothing_left(before) -> None:
    after = friendsock.stats()
    assert after.links_alive == before.links_alive
    assert after.pending == registry.pending_count() == 0


# -- a loop that closes with links open -----------------------------------------


@pytest.mark.parametrize("state", ["idle", "unread", "writer-paused"])
async def test_server_loop_closes_under_an_open_link(doomed, state):
    """The server's loop stops and closes with the link open. The client:
    ``idle``, waiting to read; ``unread``, paused reading with the server's
    bytes queued (it gets what sat in its receive buffer, then the reset);
    ``writer-paused``, its writes held by a server that stopped reading."""
    before = friendsock.stats()
    factory = Factory(ThreadRecorder)
    server = await make_server(doomed, factory)
    port = port_of(server)
    transport, client = await friendsock.create_connection(ThreadRecorder, LOCALHOST, port)
    peer = await doomed.run(factory.wait_first())
    rcvbuf = transport.get_extra_info("socket").getsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF)
    if state == "unread":
        transport.pause_reading()
        await doomed.call(peer.transport.write, b"u" * (rcvbuf + MiB))
    elif state == "writer-paused":
        await doomed.call(peer.transport.pause_reading)
        while not client.flow:
            transport.write(b"w" * 256 * 1024)
    doomed.close()  # stops the loop, then closes it: server and link on it
    if state == "unread":
        assert not client.lost.done()  # a paused reader learns by reading
        transport.resume_reading()
    exc = await asyncio.wait_for(client.lost, TIMEOUT)
    assert isinstance(exc, ConnectionResetError)
    assert "eof" not in client.events and client.events[-1] == "lost"
    if state == "unread":
        assert client.data == b"u" * rcvbuf  # what the kernel had delivered
    assert client.threads == {threading.get_ident()}
    # Nothing left: the link, the listener, the real sockets.
    assert_nothing_left(before)
    assert not registry.has_port(port)
    assert sockets_closed(transport)
    with pytest.raises(ConnectionRefusedError):
        await friendsock.create_connection(ThreadRecorder, LOCALHOST, port)
    assert doomed.errors == []
    # The dead loop's end is done quietly: its protocol heard nothing, and
    # collecting it warns of nothing (it was not leaked, it was torn down).
    assert peer.events[-1] != "lost"
    del peer
    gc.collect()


async def test_client_loop_closes_under_an_open_link(doomed):
    before = friendsock.stats()
    factory = Factory(ThreadRecorder)
    server = await friendsock.create_server(factory, LOCALHOST, 0)
    try:
        transport, client = await doomed.run(
            friendsock.create_connection(ThreadRecorder, LOCALHOST, port_of(server))
        )
        peer = await factory.wait_first()
        await doomed.call(transport.write, b"ping")
        assert await asyncio.wait_for(peer.wait_bytes(4), TIMEOUT) == b"ping"
        doomed.close()
        assert isinstance(await asyncio.wait_for(peer.lost, TIMEOUT), ConnectionResetError)
        assert peer.events == ["made", "data", "lost"]
        assert sockets_closed(peer.transport)
    finally:
        server.close()
    assert_nothing_left(before)


async def test_stopped_loop_keeps_its_links_until_it_closes(doomed):
    """Stopping is not going away (the loop may run again): the client's
    connect waits in the stopped server's backlog, as over TCP. Closing the
    loop resets it."""
    before = friendsock.stats()
    factory = Factory(ThreadRecorder)
    server = await make_server(doomed, factory)
    port = port_of(server)
    doomed.stop()
    transport, client = await friendsock.create_connection(ThreadRecorder, LOCALHOST, port)
    assert friendsock.is_friend(transport)  # optimistic: usable at once
    transport.write(b"queued for a server that never accepts")
    for _ in range(5):
        await asyncio.sleep(0)
    assert not client.lost.done() and friendsock.stats().pending == 1
    doomed.loop.close()
    assert isinstance(await asyncio.wait_for(client.lost, TIMEOUT), ConnectionResetError)
    assert factory.made == []
    assert_nothing_left(before)
    assert sockets_closed(transport)


async def test_loop_closing_with_a_link_of_its_own_leaks_nothing(doomed):
    """Both ends on the loop that closes: nobody to tell, nothing to leak."""
    before = friendsock.stats()
    factory = Factory(ThreadRecorder)
    server = await make_server(doomed, factory)
    transport, client = await doomed.run(
        friendsock.create_connection(ThreadRecorder, LOCALHOST, port_of(server))
    )
    peer = await doomed.run(factory.wait_first())
    assert not transport._end.link.threaded
    await doomed.call(transport.write, b"x")
    assert friendsock.stats().links_alive == before.links_alive + 1
    doomed.close()
    assert_nothing_left(before)
    assert sockets_closed(transport, peer.transport)
    del transport, client, peer
    gc.collect()  # no ResourceWarning: the ends were torn down, not leaked


async def test_a_close_nobody_saw_is_found_on_the_next_write(doomed, monkeypatch):
    """Without the close watch (a loop friendsock cannot watch), the dead
    loop is found when its friend next hands it something: the hand-over
    (call_soon_threadsafe) fails, and the link is torn down right there."""
    monkeypatch.setattr(_loop_state._CloseWatch, "arm", lambda self, loop: None)
    before = friendsock.stats()
    factory = Factory(ThreadRecorder)
    server = await make_server(doomed, factory)
    transport, client = await friendsock.create_connection(ThreadRecorder, LOCALHOST, port_of(server))
    peer = await doomed.run(factory.wait_first())
    transport.write(b"first")
    assert await doomed.run(peer.wait_bytes(5)) == b"first"
    doomed.close()
    for _ in range(3):
        await asyncio.sleep(0)
    assert not client.lost.done()  # nobody noticed yet
    transport.write(b"second")
    assert isinstance(await asyncio.wait_for(client.lost, TIMEOUT), ConnectionResetError)
    assert_nothing_left(before)
    server.close()  # the dead loop's server was never told: close it here


# -- protocol callbacks that raise ------------------------------------------------


class Boom(Exception):
    pass


class RaisingOnData(ThreadRecorder):
    def data_received(self, data: bytes) -> None:
        super().data_received(data)
        raise Boom("data_received")


@pytest.mark.parametrize("server_on", ["here", "other"])
async def test_data_received_raising_closes_and_tells_the_friend(friends, server_on):
    """As asyncio: the error goes to the loop's exception handler, the
    transport closes with it, and the friend sees the close (EOF, then its
    own close)."""
    other = LoopThread(loop_kind()) if server_on == "other" else None
    side = other or Here()
    errors: List[dict] = other.errors if other else []
    if other is None:
        asyncio.get_running_loop().set_exception_handler(lambda _l, context: errors.append(context))
    try:
        factory = Factory(RaisingOnData)
        server = await make_server(side, factory, friends=friends)
        try:
            transport, client = await friendsock.create_connection(
                ThreadRecorder, LOCALHOST, port_of(server), friends=friends
            )
            peer = await side.run(factory.wait_first())
            transport.write(b"trigger")
            assert isinstance(await side.run(peer.lost), Boom)
            assert await asyncio.wait_for(client.lost, TIMEOUT) is None
            assert client.events == ["made", "eof", "lost"]
            assert peer.events == ["made", "data", "lost"]
        finally:
            await side.call(server.close)
    finally:
        if other is not None:
            other.close()
    assert [type(context.get("exception")) for context in errors] == [Boom]
    assert errors[0]["protocol"] is peer


@pytest.mark.parametrize("server_on", ["here", "other"])
async def test_protocol_factory_raising_closes_the_client(friends, server_on):
    other = LoopThread(loop_kind()) if server_on == "other" else None
    side = other or Here()
    errors: List[dict] = other.errors if other else []
    if other is None:
        asyncio.get_running_loop().set_exception_handler(lambda _l, context: errors.append(context))
    before = friendsock.stats()

    def factory() -> asyncio.Protocol:
        raise Boom("protocol_factory")

    try:
        # friendsock's server on both paths (a friends=False client is
        # accepted natively by it); asyncio's own would only log in debug
        # mode and leave the accepted socket to the garbage collector.
        server = await make_server(side, factory)
        try:
            transport, client = await friendsock.create_connection(
                ThreadRecorder, LOCALHOST, port_of(server), friends=friends
            )
            assert friendsock.is_friend(transport) is friends
            transport.write(b"anyone there?")
            exc = await asyncio.wait_for(client.lost, TIMEOUT)
            assert exc is None or isinstance(exc, ConnectionResetError)
            assert client.events[0] == "made" and client.events[-1] == "lost"
        finally:
            await side.call(server.close)
    finally:
        if other is not None:
            other.close()
    assert [type(context.get("exception")) for context in errors] == [Boom]
    assert errors[0]["message"] == "Error on transport creation for incoming connection"
    assert_nothing_left(before)


async def test_a_server_closed_by_its_protocol_factory_serves_no_connection(friends, loop_guard):
    """The connection whose protocol factory closes the server gets no
    transport, and is closed: asyncio's and uvloop's servers refuse to
    attach a transport once closed (an ``assert`` in their ``_attach``), and
    report it in debug mode only. aiosmtpd's suite closes a server whose
    accepted connection is still on its way to a transport."""
    before = friendsock.stats()
    made: List[ThreadRecorder] = []
    server: Any = None

    def closing_factory() -> ThreadRecorder:
        server.close()
        made.append(ThreadRecorder())
        return made[-1]

    server = await friendsock.create_server(closing_factory, LOCALHOST, 0)
    transport, client = await friendsock.create_connection(
        ThreadRecorder, LOCALHOST, port_of(server), friends=friends)
    assert friendsock.is_friend(transport) is friends
    exc = await asyncio.wait_for(client.lost, TIMEOUT)
    assert exc is None or isinstance(exc, ConnectionResetError)
    await asyncio.wait_for(server.wait_closed(), TIMEOUT)
    assert len(made) == 1 and made[0].events == []  # no connection_made
    assert_nothing_left(before)


class RaisingOnLost(ThreadRecorder):
    def connection_lost(self, exc) -> None:
        super().connection_lost(exc)
        raise Boom("connection_lost")


async def test_connection_lost_raising_still_finishes_the_link(friends, loop_guard):
    before = friendsock.stats()
    factory = Factory(RaisingOnLost)
    server = await friendsock.create_server(factory, LOCALHOST, 0, friends=friends)
    try:
        transport, client = await friendsock.create_connection(
            ThreadRecorder, LOCALHOST, port_of(server), friends=friends
        )
        peer = await factory.wait_first()
        transport.close()
        await asyncio.wait_for(peer.lost, TIMEOUT)
        await asyncio.wait_for(client.lost, TIMEOUT)
        for _ in range(3):
            await asyncio.sleep(0)
    finally:
        server.close()
    assert [type(context.get("exception")) for context in loop_guard] == [Boom]
    del loop_guard[:]
    assert_nothing_left(before)
    assert sockets_closed(peer.transport)


# -- fork ------------------------------------------------------------------------


def _child(port: int, kind: str, inherited_link: Any) -> dict:
    """In the forked child: a loop of its own, a connect to the parent's
    friendsock server (another process to it), and a friend pair of its own."""
    asyncio.events._set_running_loop(None)  # the parent's, inherited
    loop = (uvloop.new_event_loop if kind == "uvloop" else asyncio.new_event_loop)()

    async def main() -> dict:
        report: dict = {
            "registry": [registry.listener_count(), registry.pending_count()],
            "alive": friendsock.stats().links_alive,
        }
        transport, client = await friendsock.create_connection(ThreadRecorder, LOCALHOST, port)
        report["friend_to_parent"] = friendsock.is_friend(transport)
        transport.write(b"from the child")
        await asyncio.wait_for(client.wait_bytes(14), TIMEOUT)
        report["echo"] = client.data.decode()
        transport.close()
        await asyncio.wait_for(client.lost, TIMEOUT)
        # The child's own server and client still pair.
        factory = Factory(ThreadRecorder)
        server = await friendsock.create_server(factory, LOCALHOST, 0)
        own, own_client = await friendsock.create_connection(ThreadRecorder, LOCALHOST, port_of(server))
        report["own_friend"] = friendsock.is_friend(own)
        own.close()
        await asyncio.wait_for(own_client.lost, TIMEOUT)
        server.close()
        # Finishing an inherited link (as a collected transport would) only
        # drops the child's descriptors: no SO_LINGER on shared sockets.
        inherited_link.client.close()
        inherited_link.server.close()
        return report

    try:
        return loop.run_until_complete(main())
    finally:
        loop.close()


class EchoProtocol(asyncio.Protocol):
    def connection_made(self, transport) -> None:
        self.transport = transport

    def data_received(self, data: bytes) -> None:
        self.transport.write(data)


async def test_forked_child_pairs_with_the_parent_as_another_process(loop_guard):
    """The child inherits the registry, a listener and an open friend link:
    it must pair in-process with none of them; its connect to the parent's
    server is one between two processes (moved off TCP) and works, and the
    parent's link is untouched."""
    server = await friendsock.create_server(EchoProtocol, LOCALHOST, 0)
    before = friendsock.stats()
    try:
        port = port_of(server)
        transport, client = await friendsock.create_connection(ThreadRecorder, LOCALHOST, port)
        assert friendsock.is_friend(transport)
        link = transport._end.link
        kind = loop_kind()
        read_fd, write_fd = os.pipe()
        pid = os.fork()
        if pid == 0:  # the child
            status = 0
            try:
                os.close(read_fd)
                out = json.dumps(_child(port, kind, link)).encode()
            except BaseException:
                out, status = traceback.format_exc().encode(), 1
            os.write(write_fd, out)
            os._exit(status)
        os.close(write_fd)

        def collect() -> "tuple[bytes, int]":
            chunks = []
            while True:
                chunk = os.read(read_fd, 65536)
                if not chunk:
                    break
                chunks.append(chunk)
            os.close(read_fd)
            _, wait_status = os.waitpid(pid, 0)
            return b"".join(chunks), os.waitstatus_to_exitcode(wait_status)

        # Our loop keeps serving the child while a worker thread waits for it.
        out, code = await asyncio.wait_for(
            asyncio.get_running_loop().run_in_executor(None, collect), 2 * TIMEOUT
        )
        assert code == 0, out.decode()
        report = json.loads(out)
        assert report == {
            "registry": [0, 0],
            "alive": 0,
            "friend_to_parent": True,  # another process now: moved off TCP
            "echo": "from the child",
            "own_friend": True,
        }
        after = friendsock.stats()
        assert after.cross_process == before.cross_process + 1
        assert after.links_made == before.links_made + 1  # (the parent's own link)
        assert after.fallbacks == before.fallbacks
        # The parent's own link still works after the child is gone, and
        # its sockets were left as they were.
        transport.write(b"still here")
        assert await asyncio.wait_for(client.wait_bytes(10), TIMEOUT) == b"still here"
        linger = transport.get_extra_info("socket").getsockopt(socket.SOL_SOCKET, socket.SO_LINGER, 8)
        assert linger == bytes(8)
        transport.close()
        await asyncio.wait_for(client.lost, TIMEOUT)
    finally:
        server.close()
