"""A blocking server in another process (``socketserver``, ``http.server``,
under ``patch_socket()``), a trio one, or anyio's on asyncio: its
connections move off TCP as an asyncio server's do, to asyncio, uvloop,
blocking and trio clients here.

A blocking server publishes its port once its own ``accept()`` runs, so
its first connection is TCP's (each test makes that one first). On the TCP path the
server process has ``FRIENDSOCK_CROSS_PROCESS=0`` and the same test runs
over TCP.
"""

from __future__ import annotations

import asyncio
import contextlib
import errno
import hashlib
import os
import random
import selectors
import signal
import socket
import struct
import sys
from typing import Any, AsyncIterator, Dict, Tuple

import pytest

import friendsock
from friendsock._asyncio._across import Offered
from friendsock._asyncio._adoption import _listeners, forget_sock_accept_listener, listener_for_sock_accept
from friendsock._asyncio._loop_state import loop_state
from friendsock._handshake._tcp_info import payload_moved
from friendsock._host._ports import listener_elsewhere

from cross_process_peer import echoed_over_trio
from support import TCP_ESTABLISHED, bounded, tcp_connections, until
from test_cross_process import (  # noqa: F401 (fixtures)
    SIZE,
    Peer,
    _blocking_echo,
    _connection_gone,
    _echoed,
    _environment,
    _moved_counts,
    _serving,
    no_peer_left,
    nothing_left_open,
    peer_loop,
    socket_patched,
)


# Where this process's loop takes no part (both ends other processes, or
# its end on a thread of its own), one loop is enough.
ONE_LOOP = pytest.mark.asyncio(loop_factories=["asyncio"])


async def _server(path: str, door: str = "blocking") -> Tuple[Peer, int]:
    """A server process (``door``: ``blocking`` echoes, ``blocking-abort``
    aborts after 4 bytes, ``blocking-select`` accepts by select(); ``trio``
    and ``trio-install``; ``anyio``, on asyncio, and ``anyio-uvloop``) and
    its port; a blocking one's first connection served (over TCP: its
    accept() had not run yet)."""
    if door.startswith("anyio"):  # (anyio-uvloop: on uvloop)
        loop = "uvloop" if door == "anyio-uvloop" else "-"
        return await _serving(loop, path, door=door.replace("-uvloop", ""), FRIENDSOCK_INSTALL="1")
    peer, port = await _serving("-", path, door=door)
    if door.startswith("blocking"):
        reader, writer = await bounded(friendsock.open_connection("127.0.0.1", port))
        assert not friendsock.is_friend(writer)
        writer.write(b"ping")
        assert await bounded(reader.readexactly(4)) == b"ping"
        writer.close()
        await writer.wait_closed()
        first = await peer.report()
        assert first.get("payload_moved", True) is True
    return peer, port


def _trio_echo(port: int, payload: bytes) -> Dict[str, Any]:
    import trio

    import friendsock.trio

    async def exchange() -> Dict[str, Any]:
        stream = await friendsock.trio.open_tcp_stream("127.0.0.1", port)
        sock = stream.socket
        found = {"sockname": list(sock.getsockname()), "peername": list(sock.getpeername()),
                 "friend": friendsock.is_friend(stream)}
        async with stream:
            found.update(sha256=await echoed_over_trio(stream, payload),
                         payload_moved=payload_moved(sock),  # type: ignore[arg-type]
                         link=_moved_counts(found["sockname"]))
        return found

    return trio.run(exchange)


def _nonblocking_echo(port: int, payload: bytes, selector: str = "DefaultSelector") -> Dict[str, Any]:
    """A client that drives its own non-blocking socket by readiness (a
    ``selectors`` loop, as Twisted's reactors and tornado's do), on a
    thread with no asyncio loop: connect_ex, then the payload sent and the
    echo read as the poller says, EOF sent once all is written. Its
    connects answer as TCP's: in progress, then done (once), then already
    connected."""
    poller = getattr(selectors, selector)()
    sock = socket.socket()
    address = ("127.0.0.1", port)
    try:
        sock.setblocking(False)
        assert sock.connect_ex(address) == errno.EINPROGRESS
        poller.register(sock, selectors.EVENT_WRITE)
        assert poller.select(20), "the connect did not finish"
        assert sock.getsockopt(socket.SOL_SOCKET, socket.SO_ERROR) == 0
        assert [sock.connect_ex(address), sock.connect_ex(address)] == [0, errno.EISCONN]
        names = {"sockname": list(sock.getsockname()), "peername": list(sock.getpeername())}
        poller.modify(sock, selectors.EVENT_READ | selectors.EVENT_WRITE)
        unsent, digest, eof = memoryview(payload), hashlib.sha256(), False
        while not eof:
            ready = poller.select(20)
            assert ready, "neither readable nor writable for 20 s"
            events = ready[0][1]
            if events & selectors.EVENT_WRITE:
                try:
                    unsent = unsent[sock.send(unsent[:1 << 16]):]
                except BlockingIOError:
                    pass
                if not unsent:
                    sock.shutdown(socket.SHUT_WR)
                    poller.modify(sock, selectors.EVENT_READ)
            if events & selectors.EVENT_READ:
                try:
                    data = sock.recv(1 << 16)
                except BlockingIOError:
                    continue
                digest.update(data)
                eof = not data
        return {"sha256": digest.hexdigest(), "friend": friendsock.is_friend(sock),
                "payload_moved": payload_moved(sock), "link": _moved_counts(names["sockname"]),
                **names}
    finally:
        poller.close()
        sock.close()


SERVER_DOORS = pytest.mark.parametrize(
    "server", ["blocking", "blocking-select", "trio", "trio-install", "anyio", "anyio-uvloop"])


@SERVER_DOORS
@pytest.mark.usefixtures("socket_patched")
async def test_asyncio_clients_of_a_server_process_move(path, server):
    """An asyncio client's connection, on either loop, to a server process
    of each kind moves (see :func:`_clients_move`)."""
    await _clients_move(path, server, "asyncio")


@ONE_LOOP  # (each client runs on a thread of its own: this loop takes no part)
@pytest.mark.parametrize("client", ["blocking", "trio", "nonblocking"])
@SERVER_DOORS
@pytest.mark.usefixtures("socket_patched")
async def test_clients_of_a_server_process_move(path, server, client):
    """So does a blocking, a trio and a non-blocking client's."""
    await _clients_move(path, server, client)


async def _clients_move(path: str, server: str, client: str) -> None:
    """A blocking server's connections (past its first), a trio server's
    and an anyio one's on asyncio (which accepts with ``sock_accept``),
    from friendsock clients of every kind (a non-blocking socket driven
    by a ``selectors`` loop too), move: the bytes go over the pair, the
    names and TCP_INFO are TCP's. So do those of a listener made
    non-blocking and accepting through select() (gunicorn's sync
    workers)."""
    peer, port = await _server(path, door=server)
    payload = random.Random(11).randbytes(SIZE)
    before = friendsock.stats().cross_process_peers.get(peer.process.pid, 0)
    try:
        if client == "asyncio":
            ours = await _echoed(port, payload)
        elif client == "blocking":
            ours = await bounded(asyncio.to_thread(_blocking_echo, port, payload, "127.0.0.1"), 30)
        elif client == "nonblocking":
            ours = await bounded(asyncio.to_thread(_nonblocking_echo, port, payload), 30)
        else:
            ours = await bounded(asyncio.to_thread(_trio_echo, port, payload), 30)
        theirs = await peer.report()
    finally:
        await peer.finish()
    assert ours["sha256"] == theirs["sha256"] == hashlib.sha256(payload).hexdigest()
    assert ours["friend"] is theirs["friend"] is (path == "friend")
    assert ours["payload_moved"] is theirs["payload_moved"] is (path == "tcp")
    if server.startswith("blocking"):
        assert theirs["transport"] == ("AcrossSocket" if path == "friend" else "FriendCapableSocket")
    elif server.startswith("anyio"):
        assert (theirs["transport"] == "AcrossTransport") is (path == "friend")
    assert ours["sockname"] == theirs["peername"] and ours["peername"] == theirs["sockname"]
    moved = friendsock.stats().cross_process_peers.get(peer.process.pid, 0) - before
    assert moved == (1 if path == "friend" else 0)
    # friendsock.links() lists the moved connection at both ends, with the
    # other process and the bytes each end moved.
    if path == "friend":
        link = theirs["link"]
        assert (link["peer_pid"], link["to_server"][2], link["to_client"][2]) == (os.getpid(), SIZE, SIZE)
        if client != "asyncio":  # (read as it ends: the echo's last bytes)
            assert ours["link"] == [peer.process.pid, SIZE, SIZE]
    else:
        assert theirs["link"] is None and ours.get("link") is None


async def test_a_blocking_servers_abort_resets_its_client(path):
    """The server closes with SO_LINGER {1, 0}: the client's read raises
    ConnectionResetError, as over TCP."""
    peer, port = await _server(path, door="blocking-abort")
    try:
        reader, writer = await bounded(friendsock.open_connection("127.0.0.1", port))
        writer.write(b"ping")
        assert await bounded(reader.readexactly(4)) == b"ping"
        assert await peer.report() == {"aborted": True}
        with pytest.raises(ConnectionResetError):
            await bounded(reader.read(10))
        assert friendsock.is_friend(writer) is (path == "friend")
        writer.close()
    finally:
        await peer.finish()


@pytest.mark.parametrize("server", ["blocking", "trio"])
async def test_a_clients_abort_resets_the_server(path, server):
    peer, port = await _server(path, door=server)
    try:
        reader, writer = await bounded(friendsock.open_connection("127.0.0.1", port))
        writer.write(b"ping")
        assert await bounded(reader.readexactly(4)) == b"ping"
        writer.get_extra_info("socket").setsockopt(socket.SOL_SOCKET, socket.SO_LINGER,
                                                   struct.pack("ii", 1, 0))
        writer.transport.abort()
        assert await peer.report() == {"error": "ConnectionResetError"}
    finally:
        await peer.finish()


@pytest.mark.parametrize("first", ["client", "server"])
@pytest.mark.parametrize("server", ["blocking", "trio"])
async def test_a_server_leaves_no_time_wait(server, first):
    """Whichever end finishes first, the moved connection's TCP sockets go
    without TIME_WAIT (the server's FIN, answered by the client's reset)."""
    peer, port = await _server("friend", door=server)
    try:
        reader, writer = await bounded(friendsock.open_connection("127.0.0.1", port))
        assert friendsock.is_friend(writer)
        client_port = writer.get_extra_info("sockname")[1]
        writer.write(b"ping")
        assert await bounded(reader.readexactly(4)) == b"ping"
        if first == "server":
            writer.write_eof()  # the server reads EOF and closes first
            assert await bounded(reader.read()) == b""
        writer.close()
        await writer.wait_closed()
        await peer.report()
        assert await _connection_gone(client_port, port)
    finally:
        await peer.finish()


@ONE_LOOP
@pytest.mark.parametrize("how", ["pipe", "other", "none", "declined", "silent"])
@pytest.mark.parametrize("server", ["blocking", "trio", "anyio"])
async def test_a_server_and_a_process_that_breaks_the_rules(server, how):
    """A client process that takes the offer without its proof, answers
    with no socket, or never answers (stopped, then killed) has its
    connection reset: the server's accept() hands out a connection that
    reads the reset, as TCP's does for one reset before it was read. One
    that declines gets TCP. Either way the server goes on, and its next
    connection moves."""
    peer, port = await _server("friend", door=server)
    try:
        rogue = await Peer.start("answer", "-", how, str(port), env=_environment("friend"))
        if how == "silent":
            assert await rogue.line() == "offered"
            rogue.process.send_signal(signal.SIGSTOP)
            # Unanswered in time, the connection is reset (the stopped
            # process's end too, by the kernel).
            await until(lambda: not tcp_connections(port, TCP_ESTABLISHED))
            rogue.process.send_signal(signal.SIGKILL)
            await bounded(rogue.process.wait())
        else:
            result = await rogue.report()
            await rogue.finish()
            if how == "declined":
                assert result == {"read": "ping"}
            else:
                assert result in ({"read": ""}, {"error": "ECONNRESET"}, {"error": "EPIPE"},
                                  {"error": "ENOTCONN"})
        theirs = await peer.report()
        if how == "other":
            # With the other connection it opened to hand over, served over
            # TCP (nothing sent; its report may come first).
            reports = [theirs, await peer.report()]
            other = [report for report in reports if report.get("sha256") == hashlib.sha256(b"").hexdigest()]
            assert len(other) == 1
            reports.remove(other[0])
            [theirs] = reports
        if how == "declined":
            assert (theirs["sha256"], theirs["payload_moved"]) == (hashlib.sha256(b"ping").hexdigest(), True)
        else:
            assert theirs == {"error": "ConnectionResetError"}
        ours = await _echoed(port, b"next" * 1000)
        assert ours["friend"] is True
        assert (await peer.report())["sha256"] == ours["sha256"]
    finally:
        await peer.finish()


@ONE_LOOP
@pytest.mark.parametrize("server", ["blocking", "trio", "trio-timeout", "trio-install-timeout",
                                    "anyio", "anyio-uvloop", "anyio-timeout"])
async def test_a_client_that_answers_late_is_waited_for(server):
    """A client process that runs but answers the offer late (its GIL or
    its loop busy elsewhere) is waited for, past the offer's second: its
    connection moves, rather than being lost. So it does where each
    accept has a deadline that passes meanwhile (``-timeout``): a later
    accept hands it out, as TCP's backlog keeps a connection no accept
    took."""
    peer, port = await _server("friend", door=server)
    try:
        client = await Peer.start("answer", "-", "late", str(port), env=_environment("friend"))
        ours = await client.report()
        await client.finish()
        theirs = await peer.report()
    finally:
        await peer.finish()
    assert (ours, theirs.get("sha256"), theirs.get("friend")) == \
        ({"read": "ping"}, hashlib.sha256(b"ping").hexdigest(), True), theirs


async def test_an_accept_cancelled_as_its_held_connection_is_answered_leaves_it_held():
    """An anyio accept that hands out the connection a cancelled accept
    left, and is cancelled itself in the loop turn that its answer came in
    (its deadline, say), leaves it to the next accept still: the
    connection moves, rather than being dropped and reset."""
    import anyio
    from anyio.abc import SocketAttribute

    loop = asyncio.get_running_loop()
    with friendsock.installed():
        listener = await anyio.create_tcp_listener(local_host="127.0.0.1")
        [accepting] = listener.listeners
        try:
            client = await Peer.start("answer", "-", "late", str(listener.extra(SocketAttribute.local_port)),
                                      env=_environment("friend"))
            first = loop.create_task(accepting.accept())
            # Cancelled while its offer is out: the connection is held.
            await until(lambda: (across := loop_state(loop).across) is not None
                        and any(chan.replies for chan in across.channels.values()))
            first.cancel()
            with pytest.raises(asyncio.CancelledError):
                await bounded(first)
            [(_, _, offer)] = _listeners[listener.extra(SocketAttribute.raw_socket)].held
            second = loop.create_task(accepting.accept())
            offer.add_done_callback(lambda _: second.cancel())  # the answer and the cancel, one turn
            with pytest.raises(asyncio.CancelledError):
                await bounded(second)
            assert offer.done() and not offer.cancelled()
            async with await bounded(accepting.accept()) as stream:
                assert friendsock.is_friend(stream._transport)
                assert await bounded(stream.receive()) == b"ping"
                await stream.send(b"ping")
                await stream.send_eof()
                assert await client.report() == {"read": "ping"}
                await client.finish()
        finally:
            await listener.aclose()


@contextlib.asynccontextmanager
async def _moved_accept() -> AsyncIterator[Tuple[socket.socket, "Peer", socket.socket]]:
    """Under install(): an anyio listener, a friendsock client process that
    answers its offer late, and the client's connection as sock_accept()
    hands it out, moved to that process. Yields the listening socket, the
    client and the accepted socket."""
    import anyio
    from anyio.abc import SocketAttribute

    with friendsock.installed():
        listener = await anyio.create_tcp_listener(local_host="127.0.0.1")
        raw = listener.extra(SocketAttribute.raw_socket)
        try:
            client = await Peer.start("answer", "-", "late", str(listener.extra(SocketAttribute.local_port)),
                                      env=_environment("friend"))
            conn, _ = await bounded(asyncio.get_running_loop().sock_accept(raw))
            yield raw, client, conn
        finally:
            await listener.aclose()


async def test_an_accept_cancelled_as_its_transport_starts_gives_the_connection_back():
    """A connection moved to another process, handed out by sock_accept(),
    whose connect_accepted_socket() is cancelled as its transport starts
    (anyio's accept, its deadline passing then), is not lost: the next
    accept hands it out, the bytes its client sent still to read, as the
    kernel's backlog keeps a connection no accept took."""
    loop = asyncio.get_running_loop()
    async with _moved_accept() as (raw, client, conn):
        starting = loop.create_task(loop.connect_accepted_socket(asyncio.Protocol, conn))
        await asyncio.sleep(0)  # (a turn: its first step, up to the transport's start)
        assert not starting.done()
        starting.cancel()
        with pytest.raises(asyncio.CancelledError):
            await bounded(starting)
        again, _ = await bounded(loop.sock_accept(raw))
        assert again is conn
        reader, writer = await bounded(asyncio.open_connection(sock=again))
        try:
            assert friendsock.is_friend(writer)
            assert await bounded(reader.read()) == b"ping"
            writer.write(b"ping")
            writer.write_eof()
            assert await client.report() == {"read": "ping"}
            await client.finish()
        finally:
            writer.close()
            await writer.wait_closed()


async def test_a_moved_accept_out_of_descriptors_as_its_transport_starts_ends_its_connection(monkeypatch):
    """connect_accepted_socket() of a connection moved to another process,
    out of descriptors as it starts (the copy of the pair end it keeps
    fails): the loop's error is raised, and the pair end is closed rather
    than left open, so the client's connection ends instead of hanging."""
    out_of_descriptors = OSError(errno.EMFILE, os.strerror(errno.EMFILE))

    def failing_once(self):
        monkeypatch.undo()
        raise out_of_descriptors

    async with _moved_accept() as (_, client, conn):
        try:
            monkeypatch.setattr(socket.socket, "dup", failing_once)
            with pytest.raises(OSError) as raised:
                await bounded(asyncio.get_running_loop().connect_accepted_socket(asyncio.Protocol, conn))
            assert raised.value is out_of_descriptors
            assert await client.report() in ({"read": ""}, {"error": "ECONNRESET"}, {"error": "EPIPE"})
            await client.finish()
        finally:
            conn.close()


@ONE_LOOP
async def test_a_listener_that_closes_resets_what_a_cancelled_accept_left():
    """An accept cut short while the client answers late leaves the
    connection to the next accept; the listener closes instead, and the
    connection is reset, as the kernel resets its backlog: no hang, and
    nothing moves."""
    peer, port = await _server("friend", door="trio-close")
    try:
        client = await Peer.start("answer", "-", "late", str(port), env=_environment("friend"))
        assert await peer.report() == {"closed": True}
        assert await client.report() in ({"read": ""}, {"error": "ECONNRESET"}, {"error": "EPIPE"})
        await client.finish()
    finally:
        await peer.finish()


async def test_a_listeners_timeout_bounds_the_wait_for_an_answer():
    """A listener with a timeout (0.5 s) waits for a late answer no longer
    than that: the connection is reset, as one its client reset, and the
    server goes on."""
    peer, port = await _server("friend", door="blocking-timeout")
    try:
        client = await Peer.start("answer", "-", "late", str(port), env=_environment("friend"))
        assert await client.report() in ({"read": ""}, {"error": "ECONNRESET"}, {"error": "EPIPE"})
        await client.finish()
        assert await peer.report() == {"error": "ConnectionResetError"}
        ours = await _echoed(port, b"next" * 1000)
        assert ours["friend"] is True
    finally:
        await peer.finish()


async def test_a_blocking_server_withdraws_its_port_as_it_closes(path):
    """Published once it accepts (switched on), withdrawn as its listener
    closes: a connect to the port no longer waits for an offer."""
    peer, port = await _server(path)
    assert listener_elsewhere(port) is (path == "friend")
    await peer.finish()
    assert listener_elsewhere(port) is False


async def test_run_with_sockets_serves_http_server(tmp_path, path):
    """``python -m friendsock run --sockets -m http.server``, unchanged: past
    its first request, a friendsock client's requests move off TCP."""
    (tmp_path / "page.txt").write_bytes(b"served" * 10000)
    env = _environment(path, PYTHONUNBUFFERED="1")
    process = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "friendsock", "run", "--sockets", "-m", "http.server", "0",
        "--bind", "127.0.0.1", cwd=str(tmp_path), env=env,
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.DEVNULL)
    Peer(process)  # (killed after the test if still running)
    assert process.stdout is not None
    words = (await bounded(process.stdout.readline(), 20)).decode().split()
    port = int(words[words.index("port") + 1])

    async def get() -> Tuple[bytes, bool]:
        reader, writer = await bounded(friendsock.open_connection("127.0.0.1", port))
        writer.write(b"GET /page.txt HTTP/1.0\r\n\r\n")
        response = await bounded(reader.read())
        writer.close()
        await writer.wait_closed()
        return response.partition(b"\r\n\r\n")[2], friendsock.is_friend(writer)

    try:
        assert await get() == (b"served" * 10000, False)
        before = friendsock.stats().cross_process_peers.get(process.pid, 0)
        assert await get() == (b"served" * 10000, path == "friend")
        assert friendsock.stats().cross_process_peers.get(process.pid, 0) - before == (path == "friend")
    finally:
        process.send_signal(signal.SIGINT)
        await bounded(process.wait(), 20)


@pytest.mark.usefixtures("socket_patched")
async def test_a_blocking_server_keeps_no_channel_to_processes_gone():
    """A long-lived blocking server (this process) offers to client
    processes in turn: it keeps a channel open only to those still running
    (one descriptor for each that has gone would add up)."""
    from friendsock._blocking import _across
    from friendsock._host import LISTENERS, port_table

    with socket.create_server(("127.0.0.1", 0)) as listener:
        port = listener.getsockname()[1]

        def serve_one() -> None:
            conn, _ = listener.accept()
            with conn:
                while data := conn.recv(1 << 16):
                    conn.sendall(data)

        for _ in range(3):
            serving = asyncio.ensure_future(asyncio.to_thread(serve_one))
            table = port_table()
            assert table is not None
            await until(lambda: table.read(LISTENERS, port).pid == os.getpid())  # (its accept() runs)
            client = await Peer.start("connect", "asyncio", "api", str(port), "1000", "1",
                                      env=_environment("friend"))
            theirs = await client.report()
            await client.finish()
            await bounded(serving)
            assert theirs["transport"] == "AcrossTransport"
            assert {pid for pid, _ in _across._rendezvous.offering} == {client.process.pid}


@pytest.mark.parametrize("selector", ["EpollSelector", "PollSelector", "SelectSelector"])
@pytest.mark.usefixtures("socket_patched")
async def test_a_nonblocking_client_to_an_asyncio_server_process(peer_loop, path, selector):
    """A non-blocking socket driven by each poller moves to a friendsock
    server of another process on either loop: its connect_ex() returns
    once the offer is taken, and the descriptor it registers after is the
    pair's, readable and writable as TCP's would be."""
    peer, port = await _serving(peer_loop, path)
    payload = random.Random(13).randbytes(SIZE)
    try:
        ours = await bounded(asyncio.to_thread(_nonblocking_echo, port, payload, selector), 30)
        theirs = await peer.report()
    finally:
        await peer.finish()
    assert ours["sha256"] == theirs["sha256"] == hashlib.sha256(payload).hexdigest()
    assert ours["friend"] is (path == "friend")
    assert ours["payload_moved"] is theirs["payload_moved"] is (path == "tcp")
    assert ours["sockname"] == theirs["peername"] and ours["peername"] == theirs["sockname"]


@pytest.mark.usefixtures("socket_patched")
async def test_a_nonblocking_connect_on_an_asyncio_loops_thread_stays_on_tcp(path):
    """On a thread that runs an asyncio loop a non-blocking socket's
    connect does not wait for an offer (the loop's own code may hand the
    socket to a transport that does its I/O in C): it goes over TCP, as
    the kernel's connect."""
    peer, port = await _serving("asyncio", path)
    loop = asyncio.get_running_loop()
    try:
        sock = socket.socket()
        sock.setblocking(False)
        try:
            await bounded(loop.sock_connect(sock, ("127.0.0.1", port)))
            await loop.sock_sendall(sock, b"ping")
            sock.shutdown(socket.SHUT_WR)
            assert await bounded(loop.sock_recv(sock, 10)) == b"ping"
            assert not friendsock.is_friend(sock)
            assert payload_moved(sock)
        finally:
            sock.close()
        assert (await peer.report())["payload_moved"] is True
    finally:
        await peer.finish()


@ONE_LOOP
async def test_a_listener_that_closes_resets_every_connection_it_held_whatever_its_offer_came_to():
    """Connections held for the next sock_accept (see the tests above), as
    the listener closes: each is reset, whether its offer is still out,
    was answered with a pair (closed too), or failed (no descriptor left
    for the pair, say); a failed one stops none of the others."""
    loop = asyncio.get_running_loop()
    with friendsock.installed(), socket.create_server(("127.0.0.1", 0)) as listening:
        listening.setblocking(False)
        listener_for_sock_accept(loop, listening)
        held = _listeners[listening].held
        clients = [socket.create_connection(listening.getsockname()) for _ in range(3)]
        ours, theirs = socket.socketpair()
        try:
            failed, answered, out = (loop.create_future() for _ in range(3))
            failed.set_exception(OSError(errno.EMFILE, os.strerror(errno.EMFILE)))
            answered.set_result(Offered(ours, None, None, None))  # type: ignore[arg-type]
            for offer in (failed, answered, out):
                conn, address = listening.accept()
                held.append((conn, address, offer))
            forget_sock_accept_listener(listening)
            assert not held and out.cancelled() and ours.fileno() == -1
            for client in clients:  # (its FIN, then its reset: as reset_offered ends them)
                client.settimeout(10)
                try:
                    ended = client.recv(1) == b""
                except ConnectionResetError:
                    ended = True
                assert ended
        finally:
            for sock in (*clients, ours, theirs):
                sock.close()
