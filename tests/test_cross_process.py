"""Connections between two processes of this host (asyncio and uvloop).

The other process is real (``cross_process_peer.py``), on the other loop
than this one's. On the friend path its bytes move over a socketpair and
the kernel's TCP_INFO shows no payload on either TCP socket; on the TCP
path (the other process with ``FRIENDSOCK_CROSS_PROCESS=0``) the same
test runs over TCP. A process that does not play by the rules ends on TCP
or a reset, never a hang and never another connection's bytes.
"""

from __future__ import annotations

import asyncio
import contextlib
import errno
import functools
import hashlib
import json
import multiprocessing
import os
import random
import select
import signal
import socket
import struct
import sys
import threading
from pathlib import Path
from typing import Any, AsyncIterator, Callable, Dict, List, Optional, Sequence, cast

import pytest
import pytest_asyncio
import trustme
import uvloop

import friendsock
from friendsock._handshake._tcp_info import payload_moved
from friendsock._host import LISTENERS, opened_table

from support import (Recorder, bounded, fallbacks_since, port_of, rendezvous_thread_settled, tcp_connections, tls_contexts,
                     until)
from cross_process_peer import handed_echo
from test_blocking import _thread_asleep, _until, run_thread
from test_capture import check_tcp_shape, read_capture, tshark_check

PEER = str(Path(__file__).with_name("cross_process_peer.py"))
SIZE = 1 << 21


@pytest_asyncio.fixture
async def peer_loop() -> str:
    """The other process's loop: the other of the two than this test's, so
    that, as the test runs on both, each loop is at each end, and every
    connection joins the two."""
    return "asyncio" if isinstance(asyncio.get_running_loop(), uvloop.Loop) else "uvloop"


def _environment(path: str, **extra: str) -> Dict[str, str]:
    env = dict(os.environ, **extra)
    env.pop("FRIENDSOCK_INSTALL", None)
    env.update(extra)
    if path == "tcp":
        env["FRIENDSOCK_CROSS_PROCESS"] = "0"
    return env


class Peer:
    """The other process, its lines read as they come."""

    started: List["Peer"] = []  # (each test's, killed after it if still running)

    def __init__(self, process: asyncio.subprocess.Process) -> None:
        self.process = process
        Peer.started.append(self)

    @classmethod
    async def start(cls, *args: str, env: Dict[str, str], user: Any = None) -> "Peer":
        as_user = {} if user is None else {"preexec_fn": lambda: os.setuid(user)}
        process = await asyncio.create_subprocess_exec(
            sys.executable, PEER, *args, env=env, **as_user,
            stdin=asyncio.subprocess.PIPE, stdout=asyncio.subprocess.PIPE)
        return cls(process)

    async def line(self) -> str:
        assert self.process.stdout is not None
        text = await bounded(self.process.stdout.readline(), 20)
        assert text, "the other process ended"
        return text.decode().strip()

    async def report(self) -> Dict[str, Any]:
        return json.loads(await self.line())

    async def finish(self) -> None:
        if self.process.returncode is None:
            assert self.process.stdin is not None
            self.process.stdin.close()
            try:
                await bounded(self.process.wait(), 20)
            finally:
                if self.process.returncode is None:
                    self.process.kill()
                    await self.process.wait()


@pytest.fixture
def nothing_left_open():
    """What friendsock's thread holds for a test's blocking and trio
    connections (their TCP sockets, the channels their servers opened)
    it closes as those servers finish: within a bound, and before the
    next test (which may count descriptors) begins. (Torn down after the
    other processes are gone.)"""
    yield
    assert rendezvous_thread_settled()


@pytest.fixture(autouse=True)
def no_peer_left(nothing_left_open):
    """A test that failed before it finished its other processes does not
    leave them running."""
    yield
    for peer in Peer.started:
        if peer.process.returncode is None:
            peer.process.kill()
    Peer.started.clear()




async def _serving(peer_loop: str, path: str, door: str = "api", **env: str) -> "tuple[Peer, int]":
    peer = await Peer.start("serve", peer_loop, door, env=_environment(path, **env))
    return peer, int(await peer.line())


@contextlib.asynccontextmanager
async def _connected_to_a_server(peer_loop: str, path: str, door: str = "api") -> Any:
    """An asyncio connection to a server process behind ``door``: the
    process, its port, the reader and the writer; the writer closed and
    the process finished after."""
    peer, port = await _serving(peer_loop, path, door=door)
    try:
        reader, writer = await bounded(friendsock.open_connection("127.0.0.1", port))
        try:
            yield peer, port, reader, writer
        finally:
            writer.close()
    finally:
        await peer.finish()


async def _client_report(server: Any, *args: str, path: str,
                         exit_checked: bool = True) -> Dict[str, Any]:
    """The other process run as a client (``args``) of ``server``, a server
    of this process: its report once it has finished (and exited 0, where
    ``exit_checked``); the server is closed after, whatever happened."""
    try:
        peer = await Peer.start(*args, env=_environment(path))
        theirs = await peer.report()
        await peer.finish()
        if exit_checked:
            assert peer.process.returncode == 0
    finally:
        server.close()
        await bounded(server.wait_closed())
    return theirs


async def _echoed(port: int, payload: bytes) -> Dict[str, Any]:
    return await echoed_over(*await bounded(friendsock.open_connection("127.0.0.1", port)), payload)


async def echoed_over(reader: asyncio.StreamReader, writer: asyncio.StreamWriter,
                      payload: bytes) -> Dict[str, Any]:
    """``payload`` sent to an echo server, then EOF; what came back, and
    what the connection's end here says of itself. Closed after."""
    try:
        writer.write(payload)
        writer.write_eof()
        digest = hashlib.sha256()
        while data := await bounded(reader.read(1 << 16)):
            digest.update(data)
        return {
            "sha256": digest.hexdigest(),
            "payload_moved": payload_moved(writer.get_extra_info("socket")),
            "nodelay": writer.get_extra_info("socket").getsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY),
            "friend": friendsock.is_friend(writer),
            "sockname": list(writer.get_extra_info("sockname")),
            "peername": list(writer.get_extra_info("peername")),
        }
    finally:
        writer.close()
        await writer.wait_closed()


async def test_echo_to_a_server_process(peer_loop, path):
    peer, port = await _serving(peer_loop, path)
    try:
        payload = random.Random(1).randbytes(SIZE)
        ours = await _echoed(port, payload)
        theirs = await peer.report()
    finally:
        await peer.finish()
    sent = hashlib.sha256(payload).hexdigest()
    assert ours["sha256"] == theirs["sha256"] == sent
    # The kernel's word: payload crossed TCP on the TCP path only, at both ends.
    assert ours["payload_moved"] is theirs["payload_moved"] is (path == "tcp")
    assert ours["sockname"] == theirs["peername"] and ours["peername"] == theirs["sockname"]
    # Set by each loop's own transport on the TCP socket, whichever path.
    assert ours["nodelay"] and theirs["nodelay"]


async def test_links_and_stats_name_the_other_process(peer_loop, path):
    """``links()`` in either process lists the connection with the other
    process's id and each direction's bytes counted at its end, until it
    closes; ``stats()`` counts it per process. Over TCP, neither does."""
    peer, port = await _serving(peer_loop, path)
    before = friendsock.stats().cross_process_peers.get(peer.process.pid, 0)
    bytes_before = friendsock.stats().bytes_moved
    payload = b"counted" * 10_000
    try:
        reader, writer = await bounded(friendsock.open_connection("127.0.0.1", port))
        writer.write(payload)
        writer.write_eof()
        assert await bounded(reader.read()) == payload
        sockname = list(writer.get_extra_info("sockname"))
        ours = [link for link in friendsock.links() if list(link.client.address) == sockname]
        writer.close()
        await bounded(writer.wait_closed())
        theirs = await peer.report()
    finally:
        await peer.finish()
    assert not [link for link in friendsock.links() if list(link.client.address) == sockname]
    counted = friendsock.stats().cross_process_peers.get(peer.process.pid, 0) - before
    read_here = friendsock.stats().bytes_moved - bytes_before
    assert read_here == (len(payload) if path == "friend" else 0)
    if path == "tcp":
        assert ours == [] and theirs["link"] is None and counted == 0
        assert str(os.getpid()) not in theirs["peers"]
        return
    [link] = ours
    server = [link.server.address[0], port]
    assert link.peer_pid == peer.process.pid and list(link.server.address) == server
    assert link.listener == f"127.0.0.1:{port}"
    assert (link.to_server.state, link.to_server.queued, link.to_server.moved) == ("eof", 0, len(payload))
    assert (link.to_client.state, link.to_client.queued, link.to_client.moved) == ("eof", 0, len(payload))
    assert link.client.closed is False and link.server.closed is True  # (its EOF came)
    assert link.server.paused_reading is None and link.server.thread is None
    assert link.captured is False
    # Theirs, at our EOF and before sending theirs: all ours read, all echoed.
    assert theirs["link"]["peer_pid"] == os.getpid()
    assert theirs["link"]["client"] == sockname and theirs["link"]["server"] == server
    assert theirs["link"]["to_server"] == ["eof", 0, len(payload)]
    state, queued, moved = theirs["link"]["to_client"]
    assert state == "open" and queued + moved == len(payload)
    assert counted == 1 and theirs["peers"][str(os.getpid())] >= 1


async def test_a_capture_here_shows_a_connection_to_a_server_process(peer_loop, path, tmp_path):
    """A capture in the client's process writes the connection as its
    in-process links are written: the handshake, each side's bytes, a FIN
    each way; Wireshark follows it. Over TCP it is not in the capture
    (tcpdump sees that one)."""
    peer, port = await _serving(peer_loop, path)
    pcap = str(tmp_path / "client.pcap")
    payload = random.Random(3).randbytes(300_000)
    try:
        with friendsock.capture(pcap) as running:
            ours = await _echoed(port, payload)
            theirs = await peer.report()
    finally:
        await peer.finish()
    assert ours["sha256"] == theirs["sha256"]
    streams = read_capture(pcap)
    if path == "tcp":
        assert streams == {} and running.links == 0
        return
    assert running.links == 1
    stream = streams[(tuple(ours["sockname"]), tuple(ours["peername"]))]
    assert stream.up.data == payload and stream.down.data == payload
    check_tcp_shape(stream)
    tshark_check(pcap, {0: (payload, payload)})


async def test_a_capture_here_shows_a_connection_from_a_client_process(peer_loop, path, tmp_path):
    async def echo(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        while data := await reader.read(1 << 16):
            writer.write(data)
            await writer.drain()
        writer.close()

    pcap = str(tmp_path / "server.pcap")
    with friendsock.capture(pcap) as running:
        server = await friendsock.start_server(echo, "127.0.0.1", 0)
        port = server.sockets[0].getsockname()[1]
        theirs = await _client_report(server, "connect", peer_loop, "api", str(port), "100000", "4",
                                      path=path)
    assert theirs["sha256"] == theirs["sent"]
    streams = read_capture(pcap)
    if path == "tcp":
        assert streams == {} and running.links == 0
        return
    payload = random.Random(4).randbytes(100_000)
    stream = streams[(tuple(theirs["sockname"]), tuple(theirs["peername"]))]
    assert stream.up.data == payload and stream.down.data == payload
    check_tcp_shape(stream)


async def test_a_listener_two_processes_share_stays_published(peer_loop, path):
    """Two processes serve one listening socket (a pre-fork server's
    workers), and the one that published the port last stops serving. Its
    sibling publishes the port again at its next accept: after that one
    connection over TCP, its clients move off TCP again."""
    peer = await Peer.start("shared", peer_loop, "-", env=_environment(path))

    async def served_by() -> "tuple[int, bool]":
        reader, writer = await bounded(friendsock.open_connection("127.0.0.1", shared["port"]))
        try:
            writer.write(b"which\n")
            pid, echoed = (await bounded(reader.readline())).split()
            assert echoed == b"which"
            return int(pid), friendsock.is_friend(writer)
        finally:
            writer.close()
            await writer.wait_closed()

    try:
        shared = await peer.report()
        first = await served_by()
        assert peer.process.stdin is not None
        peer.process.stdin.write(b"stop\n")
        await peer.process.stdin.drain()
        assert await peer.line() == "stopped"
        after = [await served_by() for _ in range(4)]
    finally:
        await peer.finish()
    assert first[0] in (shared["first"], shared["last"]) and first[1] is (path == "friend")
    assert [pid for pid, _ in after] == [shared["first"]] * 4
    friend = path == "friend"
    assert [is_friend for _, is_friend in after] == [False, friend, friend, friend]


def _echo_recording(ends: List[Dict[str, Any]]) -> Any:
    """An echo handler that records, per connection, what its end saw."""
    async def echo(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        digest = hashlib.sha256()
        while data := await reader.read(1 << 16):
            digest.update(data)
            writer.write(data)
            await writer.drain()
        ends.append({"sha256": digest.hexdigest(), "friend": friendsock.is_friend(writer),
                     "payload_moved": payload_moved(writer.get_extra_info("socket")),
                     "peername": list(writer.get_extra_info("peername"))})
        writer.close()

    return echo


async def test_echo_from_a_client_process(peer_loop, path):
    ends: List[Dict[str, Any]] = []
    server = await friendsock.start_server(_echo_recording(ends), "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    theirs = await _client_report(server, "connect", peer_loop, "api", str(port), str(SIZE), "2",
                                  path=path)
    assert theirs["sha256"] == theirs["sent"] == ends[0]["sha256"]
    assert theirs["payload_moved"] is ends[0]["payload_moved"] is (path == "tcp")


async def test_switched_on_by_the_environment(peer_loop, path):
    """A server process written for plain asyncio, switched on with
    ``FRIENDSOCK_INSTALL=1`` as the README says."""
    peer, port = await _serving(peer_loop, path, door="plain", FRIENDSOCK_INSTALL="1")
    try:
        ours = await _echoed(port, b"over the pair" * 1000)
        theirs = await peer.report()
    finally:
        await peer.finish()
    assert ours["sha256"] == theirs["sha256"]
    assert ours["payload_moved"] is theirs["payload_moved"] is (path == "tcp")


async def test_switched_off_here():
    """``set_cross_process(False)`` in one process is enough for TCP."""
    peer, port = await _serving("asyncio", "friend")
    friendsock.set_cross_process(False)
    try:
        ours = await _echoed(port, b"x" * 1000)
        theirs = await peer.report()
    finally:
        friendsock.set_cross_process(True)
        await peer.finish()
    assert ours["payload_moved"] is theirs["payload_moved"] is True


async def test_a_server_without_friendsock():
    peer, port = await _serving("asyncio", "tcp", door="plain", FRIENDSOCK="0")
    try:
        ours = await _echoed(port, b"y" * 1000)
        theirs = await peer.report()
    finally:
        await peer.finish()
    assert ours["sha256"] == theirs["sha256"]
    assert ours["payload_moved"] is True


@pytest.mark.parametrize("how, ends_on", [
    ("pipe", "reset"),      # a descriptor that is no socket at all
    ("other", "reset"),     # a socket of another connection
    ("none", "reset"),      # no descriptor
    ("declined", "tcp"),
    ("squatted", "tcp"),    # a squatter on the channel name of the slot's pid
])
async def test_a_process_that_breaks_the_rules(peer_loop, how, ends_on):
    peer, port = await _serving(peer_loop, "friend")
    try:
        rogue = await Peer.start("answer", "-", how, str(port), env=_environment("friend"))
        result = await rogue.report()
        await rogue.finish()
        if ends_on == "tcp":
            assert result == {"read": "ping"}
            theirs = await peer.report()
            assert theirs["payload_moved"] is True
        else:
            # Not served: reset, or (as that process holds a copy of the
            # server's socket, which it was handed) finished unread.
            assert result in ({"read": ""}, {"error": "ECONNRESET"}, {"error": "EPIPE"},
                              {"error": "ENOTCONN"})
        # The server goes on serving, and pairs the next connection.
        ours = await _echoed(port, b"next" * 1000)
        assert ours["payload_moved"] is False
    finally:
        await peer.finish()


@pytest.mark.parametrize("stopped_first", [False, True], ids=["killed", "stopped-then-killed"])
async def test_a_client_killed_mid_rendezvous(peer_loop, stopped_first):
    peer, port = await _serving(peer_loop, "friend")
    try:
        rogue = await Peer.start("answer", "-", "silent", str(port), env=_environment("friend"))
        assert await rogue.line() == "offered"
        if stopped_first:
            # While it is stopped with the offer unanswered, the server
            # serves (and pairs) every other connection.
            rogue.process.send_signal(signal.SIGSTOP)
            ours = await _echoed(port, b"meanwhile" * 1000)
            assert ours["payload_moved"] is False
            assert (await peer.report())["sha256"] == ours["sha256"]
        rogue.process.send_signal(signal.SIGKILL)
        await bounded(rogue.process.wait())
        # Its offer unanswered, the server serves the connection over TCP,
        # and sees it end, with nothing sent.
        theirs = await peer.report()
        assert theirs["sha256"] == hashlib.sha256(b"").hexdigest()
        ours = await _echoed(port, b"after" * 1000)
        assert ours["payload_moved"] is False
    finally:
        await peer.finish()


async def test_the_transports_socket_ends_a_direction_as_over_tcp(peer_loop, path):
    """``get_extra_info('socket').shutdown(SHUT_WR)`` half-closes the
    connection, as asyncio's socket does over TCP: the other end reads
    EOF and answers. uvloop's refuses it, as its own does. Before 3.11
    asyncio's socket still sends (with a warning); from 3.11 it has no
    ``send()``."""
    peer, port = await _serving(peer_loop, path)
    try:
        reader, writer = await bounded(friendsock.open_connection("127.0.0.1", port))
        try:
            sock = writer.get_extra_info("socket")
            if isinstance(asyncio.get_running_loop(), uvloop.Loop):
                with pytest.raises(TypeError):
                    sock.shutdown(socket.SHUT_WR)
                with pytest.raises(TypeError):
                    sock.send(b"raw")
                writer.write(b"half")
                writer.write_eof()
            elif sys.version_info < (3, 11):
                with pytest.warns(DeprecationWarning):
                    assert sock.send(b"half") == 4
                sock.shutdown(socket.SHUT_WR)
            else:
                assert not hasattr(sock, "send")
                writer.write(b"half")
                sock.shutdown(socket.SHUT_WR)
            assert await bounded(reader.read()) == b"half"
        finally:
            writer.close()
            await writer.wait_closed()
        theirs = await peer.report()
    finally:
        await peer.finish()
    assert theirs["sha256"] == hashlib.sha256(b"half").hexdigest()


@pytest.mark.asyncio(loop_factories=["asyncio"])  # (uvloop's transport socket refuses shutdown())
async def test_a_write_after_the_sockets_own_shutdown_fails_as_over_tcp(peer_loop, path):
    """After ``get_extra_info('socket').shutdown(SHUT_WR)`` and the other
    end's close, a write fails with EPIPE, the connection lost, as over TCP
    (not taken as the first write after the other end's close is): the
    streams' drain() says the connection was lost."""
    peer, port = await _serving(peer_loop, path)
    try:
        reader, writer = await bounded(friendsock.open_connection("127.0.0.1", port))
        try:
            writer.write(b"half")
            writer.get_extra_info("socket").shutdown(socket.SHUT_WR)
            assert await bounded(reader.read()) == b"half"  # echoed, then the server's close
            theirs = await peer.report()
            writer.write(b"after")
            assert writer.transport.is_closing()  # (EPIPE: lost at once)
            with pytest.raises(ConnectionResetError):
                await bounded(writer.drain())
        finally:
            writer.close()
    finally:
        await peer.finish()
    assert theirs["sha256"] == hashlib.sha256(b"half").hexdigest()


@pytest.mark.asyncio(loop_factories=["asyncio"])  # (uvloop's transport socket refuses shutdown())
@pytest.mark.parametrize("after", ["both-finished", "write-taken"])
async def test_a_shutdown_of_a_closed_tcp_socket_fails(peer_loop, path, after):
    """Where TCP's socket is closed by now, a shutdown of the transport's
    socket, its getpeername() and the transport's write_eof() fail with
    ENOTCONN, as over TCP:
    once both directions finished (this socket's writing shut down, the
    server's EOF read), or once the write taken after the server's close
    was answered with a reset."""
    peer, port = await _serving(peer_loop, path, door="close")
    try:
        reader, writer = await bounded(friendsock.open_connection("127.0.0.1", port))
        sock = writer.get_extra_info("socket")
        writer.write(b"ping")
        assert await bounded(reader.read()) == b"ping"  # (then the server's EOF)
        assert await peer.report() == {"closed": True}
        if after == "both-finished":
            sock.shutdown(socket.SHUT_WR)
        else:
            writer.write(b"more")
        with pytest.raises(OSError) as by_socket:
            sock.shutdown(socket.SHUT_WR)
        with pytest.raises(OSError) as by_name:
            sock.getpeername()
        with pytest.raises(OSError) as by_transport:
            writer.write_eof()
        writer.close()
        await bounded(writer.wait_closed())
    finally:
        await peer.finish()
    assert by_socket.value.errno == by_name.value.errno == by_transport.value.errno == errno.ENOTCONN


@pytest.mark.parametrize("ending, linger", [("abort", False), ("abort", True), ("close", True)],
                         ids=["abort", "abort-linger-0", "close-linger-0"])
async def test_an_abort_at_the_other_end(peer_loop, path, ending, linger, tmp_path):
    """As the loop's own abort(): the socket closes (a FIN), or, with
    SO_LINGER {1, 0} set on it, resets; so does its close() with that
    set. A capture here shows which."""
    peer, port = await _serving(peer_loop, path)
    pcap = str(tmp_path / "abort.pcap")
    try:
        with friendsock.capture(pcap):
            reader, writer = await bounded(friendsock.open_connection("127.0.0.1", port))
            writer.write(b"ping")
            assert await bounded(reader.readexactly(4)) == b"ping"
            if linger:
                writer.get_extra_info("socket").setsockopt(
                    socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
            if ending == "abort":
                writer.transport.abort()
            else:
                writer.close()
            report = await peer.report()
        if linger:
            assert report == {"error": "ConnectionResetError"}
        else:
            assert report["sha256"] == hashlib.sha256(b"ping").hexdigest()
    finally:
        await peer.finish()
    streams = read_capture(pcap)
    if path == "tcp":
        assert streams == {}
        return
    [stream] = streams.values()
    assert stream.up.data == stream.down.data == b"ping"
    assert (stream.up.rst, stream.up.fin) == (linger, not linger)
    assert stream.events[-2 if not linger else -1] == ("client", "RA" if linger else "FA")


@pytest.mark.parametrize("door, free, warm", [
    ("api", 1, False),  # (none for the rendezvous's listener)
    ("api", 2, False),  # (none to accept the server's channel with)
    ("api", 3, False),  # (none for the sockets the offer hands over)
    ("api", 1, True),  # (the channel open: one of the two handed over)
    ("blocking", 1, True),
])
async def test_a_client_short_of_descriptors_is_served_over_tcp(peer_loop, path, door, free, warm):
    """A client process with almost no descriptors left cannot take an
    offer (nor its channel, nor listen for one): it connects, and its
    bytes are echoed over TCP, where the server here waited for an answer
    for the connection's life."""
    async def echo(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        writer.write(await reader.read())
        writer.close()

    server = await friendsock.start_server(echo, "127.0.0.1", 0)
    theirs = await _client_report(server, "short", peer_loop, door, str(port_of(server)), str(free),
                                  str(int(warm)), path=path)
    assert theirs == {"echo": "ping"}


async def test_a_connection_both_ends_finished_is_not_connected(peer_loop, path):
    """After the client's ``write_eof()`` and the server's EOF behind its
    answer, TCP's socket is closed: the transport's socket's
    ``getpeername()`` fails with ENOTCONN, as TCP's does."""
    peer, port = await _serving(peer_loop, path)
    try:
        reader, writer = await bounded(friendsock.open_connection("127.0.0.1", port))
        assert friendsock.is_friend(writer) is (path == "friend")
        writer.write(b"ping")
        writer.write_eof()
        assert await bounded(reader.read()) == b"ping"
        assert (await peer.report())["sha256"] == hashlib.sha256(b"ping").hexdigest()
        with pytest.raises(OSError) as raised:
            writer.get_extra_info("socket").getpeername()
        assert raised.value.errno == errno.ENOTCONN
        writer.close()
        await writer.wait_closed()
    finally:
        await peer.finish()


async def test_a_server_killed_is_eof_here(peer_loop, path):
    peer, port = await _serving(peer_loop, path)
    try:
        reader, writer = await bounded(friendsock.open_connection("127.0.0.1", port))
        assert friendsock.is_friend(writer) is (path == "friend")
        writer.write(b"ping")
        assert await bounded(reader.readexactly(4)) == b"ping"
        peer.process.send_signal(signal.SIGKILL)
        await bounded(peer.process.wait())
        # Nothing was left unread there: its sockets close as with a FIN.
        assert await bounded(reader.read()) == b""
        writer.close()
        await writer.wait_closed()
    finally:
        await peer.finish()


@pytest.mark.parametrize("first", ["client", "server"])
async def test_no_time_wait_is_left(peer_loop, first):
    """Whichever end finishes first, the connection's TCP sockets go
    without TIME_WAIT: the client's port, bound before connect(), could
    not be bound again for a minute."""
    peer, port = await _serving(peer_loop, "friend")
    try:
        reader, writer = await bounded(friendsock.open_connection("127.0.0.1", port))
        client_port = writer.get_extra_info("sockname")[1]
        writer.write(b"ping")
        assert await bounded(reader.readexactly(4)) == b"ping"
        if first == "client":
            writer.close()
            await writer.wait_closed()
            await peer.report()
        else:
            writer.write_eof()  # the server echoes EOF, then closes first
            assert await bounded(reader.read()) == b""
            await peer.report()
            writer.close()
            await writer.wait_closed()
        assert await _connection_gone(client_port, port)
    finally:
        await peer.finish()


async def _connection_gone(client_port: int, port: int) -> bool:
    """Whether the kernel holds no socket of the connection between the two
    ports within a bound: both go once the last FIN is answered. (Only this
    connection's: another test's may have one of the ports too.)"""
    def left() -> set:
        return {pair for pair in tcp_connections(client_port)
                if {int(end.rsplit(":", 1)[1], 16) for end in pair} == {client_port, port}}

    for _ in range(500):
        if not left():
            return True
        await asyncio.sleep(0.01)
    return not left()


@pytest.mark.skipif(os.getuid() != 0, reason="a process of another user needs root to make")
async def test_a_process_of_another_user_gets_no_channel():
    """A process of another uid that reaches this loop's rendezvous channel
    (it can: abstract names are not files) is cut off before it says
    anything."""
    from friendsock._asyncio._across import rendezvous
    from friendsock._host._proof import Message, What, channel_address

    across = rendezvous(asyncio.get_running_loop())
    assert across is not None and across._listen()
    name = channel_address(across.pid, across.token)  # (the name has our uid in it)
    read_fd, write_fd = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: another user from here on
        verdict = b"?"
        try:
            os.close(read_fd)
            os.setgid(65534)
            os.setuid(65534)
            with socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET) as chan:
                chan.settimeout(10)
                chan.connect(name)
                try:
                    chan.send(Message(What.OFFER, 1, 1).encode())
                    verdict = b"closed" if chan.recv(64) == b"" else b"answered"
                except (BrokenPipeError, ConnectionResetError):  # closed before it read
                    verdict = b"closed"
        except BaseException as exc:  # (said, not raised: the child must exit)
            verdict = repr(exc).encode()
        finally:
            os.write(write_fd, verdict)
            os._exit(0)
    os.close(write_fd)

    def verdict() -> bytes:
        with open(read_fd, "rb") as pipe:
            said = pipe.read()
        os.waitpid(pid, 0)
        return said

    assert await bounded(asyncio.get_running_loop().run_in_executor(None, verdict)) == b"closed"
    assert across.taking == []


async def test_a_tls_server_is_not_moved_off_its_tls(path):
    """A server with ssl= in this process: a client in another process that
    speaks plaintext gets its handshake's failure, as over TCP, and the
    server's handler never sees its bytes."""
    server_context, _ = tls_contexts(trustme.CA())
    seen: List[bytes] = []

    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        seen.append(await reader.read(100))
        writer.close()

    server = await friendsock.start_server(handle, "127.0.0.1", 0, ssl=server_context)
    theirs = await _client_report(server, "connect", "asyncio", "api", str(port_of(server)), "100",
                                  "4", path=path, exit_checked=False)
    assert seen == []
    assert theirs["sha256"] == hashlib.sha256(b"").hexdigest()
    assert theirs["payload_moved"] is True  # its plaintext went to the TLS server over TCP


async def test_a_dual_stack_listener_moves_ipv4_clients(peer_loop, path):
    """A listener on :: that takes IPv4 too names an IPv4 client's end
    ::ffff:127.0.0.1; the proof takes it for the same 4-tuple."""
    sock = socket.create_server(("::", 0), family=socket.AF_INET6, dualstack_ipv6=True)
    ends: List[bool] = []

    async def echo(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        while data := await reader.read(1 << 16):
            writer.write(data)
        ends.append(payload_moved(writer.get_extra_info("socket")))
        writer.close()

    server = await friendsock.start_server(echo, sock=sock)
    theirs = await _client_report(server, "connect", peer_loop, "api", str(sock.getsockname()[1]),
                                  "1000", "5", path=path, exit_checked=False)
    assert theirs["sha256"] == theirs["sent"]
    assert theirs["payload_moved"] is ends[0] is (path == "tcp")


async def test_starttls_between_processes(peer_loop, path, tmp_path):
    """STARTTLS (a plaintext exchange, then TLS on the same connection)
    through friendsock's start_tls, at both ends, on either loop."""
    ca = trustme.CA()
    server_context, _ = tls_contexts(ca)
    ca_file = tmp_path / "ca.pem"
    ca.cert_pem.write_to_path(str(ca_file))
    loop = asyncio.get_running_loop()

    class Server(asyncio.Protocol):
        def connection_made(self, transport: Any) -> None:
            self.transport = transport

        def data_received(self, data: bytes) -> None:
            assert data == b"STARTTLS\n"
            self.transport.write(b"GO\n")
            loop.create_task(self.upgrade())

        async def upgrade(self) -> None:
            answering = Answer()
            answering.answer_on(await friendsock.start_tls(self.transport, answering, server_context,
                                                           server_side=True))

    class Answer(asyncio.Protocol):
        """Answers over TLS (what came before start_tls returned, then)."""

        transport: Any = None
        early = b""

        def answer_on(self, transport: Any) -> None:
            self.transport = transport
            if self.early:
                self.data_received(self.early)

        def data_received(self, data: bytes) -> None:
            if self.transport is None:
                self.early += data
            else:
                self.transport.write(b"secret:" + data)

    server = await friendsock.create_server(Server, "127.0.0.1", 0)
    theirs = await _client_report(server, "starttls", peer_loop, "-", str(port_of(server)),
                                  str(ca_file), path=path)
    assert (theirs["answer"], theirs["cipher"]) == ("secret:secret\n", True)
    assert (theirs["transport"] == "AcrossTransport") is (path == "friend")


# -- blocking sockets (patch_socket) --------------------------------------------------


@pytest.fixture
def socket_patched():
    """Blocking sockets pair (``patch_socket()``) for the test."""
    friendsock.patch_socket()
    try:
        yield
    finally:
        friendsock.unpatch_socket()


async def _on_a_thread_against_a_server(peer_loop: str, path: str, client: Any,
                                        door: str = "api") -> "tuple[Any, Dict[str, Any]]":
    """``client(port)`` (a blocking or trio client) run on a thread of its
    own against a server process (``serve``, its ``door``): what it
    returned, and the server's report of the connection."""
    peer, port = await _serving(peer_loop, path, door=door)
    try:
        found = await bounded(asyncio.to_thread(client, port), 30)
        return found, await peer.report()
    finally:
        await peer.finish()


async def _on_a_thread_until_the_server_reports(peer_loop: str, path: str, client: Any,
                                                door: str) -> "tuple[Any, Dict[str, Any]]":
    """``client(port, reported)`` run on a thread of its own against a
    server process behind ``door``, the event ``reported`` set once the
    server reported the connection: what it returned, and that report."""
    peer, port = await _serving(peer_loop, path, door=door)
    reported = threading.Event()
    try:
        running = asyncio.ensure_future(asyncio.to_thread(client, port, reported))
        try:
            report = await peer.report()
        finally:
            reported.set()
            found = await bounded(running)
        return found, report
    finally:
        await peer.finish()


def _moved_counts(sockname: List[Any]) -> Any:
    """What ``friendsock.links()`` says of the connection whose end here is
    ``sockname``: the other end's pid and the bytes moved to the server
    and to the client; None if it does not list it."""
    for link in friendsock.links():
        if link.peer_pid is not None and tuple(sockname) in (link.client.address, link.server.address):
            return [link.peer_pid, link.to_server.moved, link.to_client.moved]
    return None


def _blocking_echo(port: int, payload: bytes, host: str) -> Dict[str, Any]:
    """A blocking client, as ``socket.create_connection`` makes one: the
    payload sent from a second thread while this one reads the echo."""
    sock = socket.create_connection((host, port), timeout=20)
    with sock:
        names = {"sockname": list(sock.getsockname()), "peername": list(sock.getpeername())}
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        quiet = select.select([sock], [], [], 0)[0] == []
        sender = threading.Thread(target=sock.sendall, args=(payload,))
        sender.start()
        digest = hashlib.sha256()
        with sock.makefile("rb") as stream:
            left = len(payload)
            while left:
                data = stream.read1(min(left, 1 << 16))
                assert data, "EOF before the whole echo"
                digest.update(data)
                left -= len(data)
            sender.join(20)
            sock.shutdown(socket.SHUT_WR)
            eof = stream.read() == b""
        link = _moved_counts(names["sockname"])
        try:  # finished both ways: TCP's socket is closed
            sock.getpeername()
            finished = "connected"
        except OSError as exc:
            finished = errno.errorcode[exc.errno or 0]
        return {
            "sha256": digest.hexdigest(), "eof": eof, "quiet": quiet, "finished": finished,
            "friend": friendsock.is_friend(sock), "family": sock.family,
            "nodelay": sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY),
            "payload_moved": payload_moved(sock), "link": link, **names,
        }


@pytest.mark.parametrize("host", ["127.0.0.1", "localhost"])
@pytest.mark.usefixtures("socket_patched")
async def test_a_blocking_client_to_a_server_process(peer_loop, path, host):
    """A blocking socket's connection moves off TCP as a transport's does:
    its descriptor carries the bytes, its names and options are TCP's."""
    peer, port = await _serving(peer_loop, path)
    before = friendsock.stats().cross_process_peers.get(peer.process.pid, 0)
    payload = random.Random(5).randbytes(SIZE)
    try:
        ours = await bounded(asyncio.to_thread(_blocking_echo, port, payload, host), 30)
        theirs = await peer.report()
    finally:
        await peer.finish()
    assert ours["sha256"] == theirs["sha256"] == hashlib.sha256(payload).hexdigest()
    assert ours["eof"] and ours["quiet"] and ours["nodelay"] and ours["family"] == socket.AF_INET
    assert ours["finished"] == "ENOTCONN"
    assert ours["friend"] is (path == "friend")
    assert ours["payload_moved"] is theirs["payload_moved"] is (path == "tcp")
    assert ours["sockname"] == theirs["peername"] and ours["peername"] == theirs["sockname"]
    moved = friendsock.stats().cross_process_peers.get(peer.process.pid, 0) - before
    assert moved == (1 if path == "friend" else 0)


def _blocking_abort(port: int) -> int:
    """Connect, exchange, then close with SO_LINGER {1, 0}; the client port."""
    sock = socket.create_connection(("127.0.0.1", port), timeout=20)
    sock.sendall(b"ping")
    assert sock.recv(4) == b"ping"
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    client_port = sock.getsockname()[1]
    sock.close()
    return client_port


@pytest.mark.usefixtures("socket_patched")
async def test_a_blocking_client_resets_as_tcp_does(peer_loop, path):
    _, theirs = await _on_a_thread_against_a_server(peer_loop, path, _blocking_abort)
    assert theirs == {"error": "ConnectionResetError"}


def _blocking_ping(port: int) -> int:
    """Connect, exchange, close as a client does; the client port."""
    with socket.create_connection(("127.0.0.1", port), timeout=20) as sock:
        sock.sendall(b"ping")
        assert sock.recv(4) == b"ping"
        assert friendsock.is_friend(sock)
        return sock.getsockname()[1]


@pytest.mark.usefixtures("socket_patched")
async def test_a_blocking_client_leaves_no_time_wait(peer_loop):
    """Its TCP socket is let go of by friendsock's own thread: answered
    with a reset once the server's FIN comes, so no port is left in
    TIME_WAIT."""
    peer, port = await _serving(peer_loop, "friend")
    try:
        client_port = await bounded(asyncio.to_thread(_blocking_ping, port), 30)
        await peer.report()
        assert await _connection_gone(client_port, port)
    finally:
        await peer.finish()


async def test_run_with_sockets_moves_a_blocking_client(tmp_path):
    """``python -m friendsock run --sockets``: an unchanged program whose
    ``urllib`` (``http.client``) asks a friendsock server of another process."""
    async def answer(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        while (await reader.readline()).strip():
            pass
        body = b"over the pair"
        writer.write(b"HTTP/1.1 200 OK\r\nContent-Length: %d\r\nConnection: close\r\n\r\n%s"
                     % (len(body), body))
        await writer.drain()
        writer.close()

    server = await friendsock.start_server(answer, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    (tmp_path / "app.py").write_text(
        "import urllib.request\n"
        f"print(urllib.request.urlopen('http://127.0.0.1:{port}/', timeout=20).read().decode())\n")
    try:
        process = await asyncio.create_subprocess_exec(
            sys.executable, "-m", "friendsock", "run", "--sockets", "app.py", cwd=str(tmp_path),
            env=_environment("friend"), stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE)
        out, err = await bounded(process.communicate(), 30)
    finally:
        server.close()
        await bounded(server.wait_closed())
    assert process.returncode == 0, err.decode()
    assert out.decode().split() == ["over", "the", "pair"]
    assert f"friendsock: between processes: 1 moved off TCP (pid {os.getpid()}: 1)" in err.decode().splitlines()


async def _script_against_a_server_here(path: str, *python_args: str) -> "tuple[int, str, str]":
    """A Python process (``python_args``, then the port) run against a
    friendsock echo server of this process, which it must exit 0 from:
    the port, and what it wrote to its standard output and error."""
    server = await friendsock.start_server(_echo_recording([]), "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    try:
        process = await asyncio.create_subprocess_exec(
            sys.executable, *python_args, str(port), env=_environment(path),
            stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE)
        out, err = await bounded(process.communicate(), 30)
    finally:
        server.close()
        await bounded(server.wait_closed())
    assert process.returncode == 0, err.decode()
    return port, out.decode(), err.decode()


_FORKING_CLIENT = """
import os, socket, sys
import friendsock

friendsock.patch_socket()

def ask(port):
    with socket.create_connection(("127.0.0.1", port), timeout=20) as sock:
        sock.sendall(b"ping")
        return sock.recv(4) == b"ping" and friendsock.is_friend(sock)

port = int(sys.argv[1])
before = ask(port)
child = os.fork()
if child == 0:
    os._exit(0 if ask(port) else 3)
_, status = os.waitpid(child, 0)
print(before, os.waitstatus_to_exitcode(status), ask(port))
"""


async def test_a_blocking_client_forks(tmp_path):
    """A process whose blocking connections moved forks: the child's own
    connections move too (a rendezvous of its own), and the parent's go on."""
    before = friendsock.stats().cross_process
    _, out, _ = await _script_against_a_server_here("friend", "-c", _FORKING_CLIENT)
    assert out.split() == ["True", "0", "True"]
    assert friendsock.stats().cross_process - before == 3


def _descriptor_calls(port: int) -> Dict[str, Any]:
    """fromfd() of a socket's fileno() and socket(fileno=...) on a
    connection to a server process (see test_blocking's
    test_descriptor_calls): what each socket made so answers."""
    found: Dict[str, Any] = {}
    with socket.create_connection(("127.0.0.1", port), timeout=20) as sock:
        with socket.fromfd(sock.fileno(), socket.AF_INET, socket.SOCK_STREAM) as copy:
            found["copy"] = {"friend": friendsock.is_friend(copy), "peername": list(copy.getpeername()),
                             "nodelay": copy.getsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY)}
            copy.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)  # (the connection's, as TCP's)
            copy.sendall(b"from a copy, ")
        found["nodelay_set_by_the_copy"] = sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY)
        sock.sendall(b"from the original, ")
        shared = socket.socket(fileno=sock.fileno())
        found["shared"] = {"fileno": shared.fileno() == sock.fileno(), "family": shared.family,
                           "sockname": list(shared.getsockname())}
        shared.sendall(b"from the sharer")
        found["detached"] = shared.detach() == sock.fileno()
        found.update(friend=friendsock.is_friend(sock), sockname=list(sock.getsockname()),
                     peername=list(sock.getpeername()))
        sock.shutdown(socket.SHUT_WR)
        echo = b""
        while data := sock.recv(1 << 16):
            echo += data
        found["echo"] = echo.decode()
    return found


@pytest.mark.usefixtures("socket_patched")
async def test_sockets_made_of_a_moved_sockets_descriptor_are_on_its_connection(peer_loop, path):
    """A socket made of a moved socket's descriptor (``socket.fromfd(sock.
    fileno())``, a duplicate, closed on its own; ``socket.socket(fileno=
    ...)``, sharing it, whose detach() gives it back) is another socket
    on that connection, as over TCP: its names and options the TCP
    connection's, its bytes in order with the original's."""
    ours, theirs = await _on_a_thread_against_a_server(peer_loop, path, _descriptor_calls)
    assert ours["echo"] == "from a copy, from the original, from the sharer"
    assert theirs["sha256"] == hashlib.sha256(ours["echo"].encode()).hexdigest()
    assert ours["friend"] is ours["copy"]["friend"] is (path == "friend")
    assert ours["copy"]["peername"] == ours["peername"] == theirs["sockname"]
    assert ours["copy"]["nodelay"] == 0 and ours["nodelay_set_by_the_copy"] == 1
    assert ours["shared"] == {"fileno": True, "family": socket.AF_INET, "sockname": ours["sockname"]}
    assert ours["detached"]


def _trio_over_a_connected_socket(port: int, payload: bytes) -> Dict[str, Any]:
    """A blocking client's socket handed to trio (``trio.socket.
    from_stdlib_socket()``), as code that connects first and then runs
    trio over the socket does: the echo of ``payload`` (see
    _trio_echoed), and what trio's stream says of itself."""
    import trio

    sock = socket.create_connection(("127.0.0.1", port), timeout=20)

    async def exchange() -> Dict[str, Any]:
        stream = trio.SocketStream(trio.socket.from_stdlib_socket(sock))
        return await _trio_echoed(stream, payload, lambda names: {
            "friend": friendsock.is_friend(stream), "link": _moved_counts(names["sockname"])})

    return cast(Dict[str, Any], trio.run(exchange))


@pytest.mark.usefixtures("socket_patched")
async def test_a_moved_socket_handed_to_trio_goes_on_there(peer_loop, path):
    """A blocking socket moved to another process, handed to trio
    (``trio.socket.from_stdlib_socket()``, which takes the exact class
    ``socket.socket`` only): trio's socket goes on over the pair, its
    names TCP's, its bytes counted, as over TCP it goes on over TCP."""
    payload = random.Random(11).randbytes(SIZE)
    ours, theirs = await _on_a_thread_against_a_server(
        peer_loop, path, functools.partial(_trio_over_a_connected_socket, payload=payload))
    assert ours["sha256"] == theirs["sha256"] == hashlib.sha256(payload).hexdigest()
    assert ours["friend"] is (path == "friend")
    assert ours["sockname"] == theirs["peername"] and ours["peername"] == theirs["sockname"]
    if path == "friend":  # (the other process's, each way's bytes)
        assert ours["link"][0] not in (None, os.getpid()) and ours["link"][1:] == [SIZE, SIZE]
    else:
        assert ours["link"] is None


@pytest.mark.parametrize("door", ["api", "install"])
@pytest.mark.usefixtures("socket_patched")
async def test_a_moved_socket_handed_to_a_loop_goes_on_in_its_transport(peer_loop, path, door):
    """A blocking socket moved to another process, handed to an event loop
    (``open_connection(sock=)``, as code that connects first and then runs
    asyncio over the socket does): the connection goes on in a transport
    of the loop over the pair (uvloop's own refuses the pair's
    descriptor), its names and options TCP's, as over TCP the loop's own
    transport goes on over TCP."""
    peer, port = await _serving(peer_loop, path)
    payload = random.Random(13).randbytes(SIZE)
    try:
        sock = await bounded(asyncio.to_thread(socket.create_connection, ("127.0.0.1", port), 20))
        moved = friendsock.is_friend(sock)
        if door == "api":
            reader, writer = await bounded(friendsock.open_connection(sock=sock))
        else:
            with friendsock.installed():
                reader, writer = await bounded(asyncio.open_connection(sock=sock))
        ours = await echoed_over(reader, writer, payload)
        theirs = await peer.report()
    finally:
        await peer.finish()
    assert moved is ours["friend"] is (path == "friend")
    assert ours["sha256"] == theirs["sha256"] == hashlib.sha256(payload).hexdigest()
    assert ours["payload_moved"] is theirs["payload_moved"] is (path == "tcp")
    assert ours["sockname"] == theirs["peername"] and ours["peername"] == theirs["sockname"]
    assert ours["nodelay"]  # (set as the loop's own transport sets it)


@pytest.mark.usefixtures("socket_patched")
async def test_anyios_stream_of_a_moved_socket_goes_on_over_the_pair(peer_loop, path):
    """anyio's ``SocketStream.from_socket()`` of a moved blocking socket, on
    an installed loop (as ``FRIENDSOCK_INSTALL=1`` installs them): its
    stream goes on over the pair, on uvloop too."""
    import anyio
    from anyio.abc import SocketStream

    peer, port = await _serving(peer_loop, path)
    payload = random.Random(19).randbytes(SIZE)
    echoed = bytearray()
    try:
        sock = await bounded(asyncio.to_thread(socket.create_connection, ("127.0.0.1", port), 20))
        moved = friendsock.is_friend(sock)
        with friendsock.installed():
            stream = await bounded(SocketStream.from_socket(sock))

        async def send() -> None:
            await stream.send(payload)
            await stream.send_eof()

        async with stream:
            sending = asyncio.ensure_future(send())
            with contextlib.suppress(anyio.EndOfStream):
                while True:
                    echoed += await bounded(stream.receive())
            await bounded(sending)
        theirs = await peer.report()
    finally:
        await peer.finish()
    assert moved is (path == "friend")
    assert theirs["sha256"] == hashlib.sha256(echoed).hexdigest() == hashlib.sha256(payload).hexdigest()
    assert theirs["payload_moved"] is (path == "tcp")


@pytest.mark.usefixtures("socket_patched")
async def test_a_capture_shows_a_moved_socket_handed_to_a_loop_once(peer_loop, path, tmp_path):
    """Captured, a moved blocking socket that a loop's transport takes over
    is one connection in the capture: one handshake, its bytes each way
    in order, a FIN each way, whatever is done with the socket object the
    transport took it from. Over TCP it is not in the capture."""
    peer, port = await _serving(peer_loop, path)
    payload = random.Random(17).randbytes(100_000)
    pcap = str(tmp_path / "handed.pcap")
    try:
        with friendsock.capture(pcap) as running:
            sock = await bounded(asyncio.to_thread(socket.create_connection, ("127.0.0.1", port), 20))
            sock.sendall(b"first, ")
            reader, writer = await bounded(friendsock.open_connection(sock=sock))
            if path == "friend":  # (the object given away: the transport goes on)
                sock.close()
            ours = await echoed_over(reader, writer, payload)
        theirs = await peer.report()
    finally:
        await peer.finish()
    sent = b"first, " + payload
    assert ours["sha256"] == theirs["sha256"] == hashlib.sha256(sent).hexdigest()
    if path == "tcp":
        assert read_capture(pcap) == {} and running.links == 0
        return
    assert running.links == 1
    stream = read_capture(pcap)[(tuple(ours["sockname"]), tuple(ours["peername"]))]
    assert stream.up.data == sent and stream.down.data == sent
    check_tcp_shape(stream)


@contextlib.asynccontextmanager
async def _client_process_accepted_here(peer_loop: str, path: str,
                                        accept: Callable[[socket.socket], Any]) -> AsyncIterator[Any]:
    """A client process (``connect``: SIZE bytes seeded 2 with EOF, the
    echo read) of a blocking listener here, whose ``accept(listener)`` runs
    on a thread: what that returned, and the client, finished after."""
    with socket.create_server(("127.0.0.1", 0)) as listener:
        port = listener.getsockname()[1]
        accepted = asyncio.ensure_future(asyncio.to_thread(accept, listener))
        if path == "friend":  # (published as its accept() runs: the client must come after)
            await until(lambda: opened_table().read(LISTENERS, port).pid == os.getpid())
        peer = await Peer.start("connect", peer_loop, "api", str(port), str(SIZE), "2", env=_environment(path))
        try:
            yield await bounded(accepted, 60), peer
        finally:
            await peer.finish()


@pytest.mark.usefixtures("socket_patched")
async def test_a_moved_accepted_socket_handed_to_a_loop_goes_on_in_its_transport(peer_loop, path):
    """The accepting side of the same: a blocking listener's accepted
    socket, moved, handed to ``connect_accepted_socket()`` of an installed
    loop, serves its client over the pair."""
    ends: List[Dict[str, Any]] = []
    async with _client_process_accepted_here(peer_loop, path, socket.socket.accept) as ((conn, _), peer):
        moved = friendsock.is_friend(conn)
        with friendsock.installed():
            await bounded(asyncio.get_running_loop().connect_accepted_socket(
                lambda: asyncio.StreamReaderProtocol(asyncio.StreamReader(), _echo_recording(ends)), conn))
        theirs = await peer.report()
        await until(lambda: bool(ends))
    assert moved is ends[0]["friend"] is (path == "friend")
    assert ends[0]["sha256"] == theirs["sha256"] == theirs["sent"]
    assert ends[0]["payload_moved"] is theirs["payload_moved"] is (path == "tcp")
    assert ends[0]["peername"] == theirs["sockname"]


def _handed_to_a_spawned_process(sock: socket.socket, payload_size: int) -> Dict[str, Any]:
    """``sock`` handed to a spawned process (``handed_echo``) over
    multiprocessing's pipe and closed here once sent, as a process that
    accepts for its workers does: what that process reports."""
    context = multiprocessing.get_context("spawn")
    ours, theirs = context.Pipe()
    child = context.Process(target=handed_echo, args=(theirs, payload_size))
    child.start()
    try:
        with sock:
            ours.send(sock)
        assert ours.poll(30), "no report from the process handed the socket"
        return cast(Dict[str, Any], ours.recv())
    finally:
        child.join(20)
        assert child.exitcode == 0
        ours.close()
        theirs.close()


def _connected_and_handed(port: int) -> Dict[str, Any]:
    sock = socket.create_connection(("127.0.0.1", port))
    return {"friend_here": friendsock.is_friend(sock), **_handed_to_a_spawned_process(sock, SIZE)}


def _accepted_and_handed(listener: socket.socket) -> Dict[str, Any]:
    conn, _ = listener.accept()
    return {"friend_here": friendsock.is_friend(conn), **_handed_to_a_spawned_process(conn, 0)}


@pytest.mark.parametrize("end", ["connecting", "accepting"])
@pytest.mark.usefixtures("socket_patched")
async def test_a_moved_socket_goes_on_in_the_process_it_is_handed_to(peer_loop, path, end, monkeypatch):
    """multiprocessing hands a socket to another process by descriptor (a
    process that accepts for its workers; the stdlib's own tests do): a
    socket moved off TCP goes with its TCP socket, and the process it is
    handed to carries the connection on over the pair, its names and
    options TCP's, after the process that handed it closed its own."""
    monkeypatch.setenv("FRIENDSOCK_INSTALL", "1")
    monkeypatch.setenv("FRIENDSOCK_SOCKETS", "1")
    if path == "tcp":
        monkeypatch.setenv("FRIENDSOCK_CROSS_PROCESS", "0")
    sent = hashlib.sha256(random.Random(7 if end == "connecting" else 2).randbytes(SIZE)).hexdigest()
    if end == "connecting":
        peer, port = await _serving(peer_loop, path)
        try:
            ours = await bounded(asyncio.to_thread(_connected_and_handed, port), 60)
            theirs = await peer.report()
        finally:
            await peer.finish()
        assert ours["sha256"] == theirs["sha256"] == sent
    else:
        async with _client_process_accepted_here(peer_loop, path, _accepted_and_handed) as (ours, peer):
            theirs = await peer.report()
        assert ours["sha256"] == theirs["sha256"] == theirs["sent"] == sent
    assert ours["friend_here"] is ours["friend"] is (path == "friend")
    assert ours["payload_moved"] is theirs["payload_moved"] is (path == "tcp")
    assert ours["family"] == socket.AF_INET and ours["nodelay"] == 0
    assert ours["sockname"] == theirs["peername"] and ours["peername"] == theirs["sockname"]


def _blocking_timed_out(port: int) -> str:
    """A read bounded by SO_RCVTIMEO (set before connect) with nothing
    sent: what it ends with."""
    sock = socket.socket()
    with sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVTIMEO, struct.pack("ll", 0, 200_000))
        sock.connect(("127.0.0.1", port))
        try:
            sock.recv(10)
        except OSError as exc:
            return errno.errorcode[exc.errno or 0]
        return "read"


@pytest.mark.usefixtures("socket_patched")
async def test_a_blocking_clients_receive_timeout_holds(peer_loop, path):
    """SO_RCVTIMEO bounds the reads of a moved socket as of a TCP one."""
    ended, _ = await _on_a_thread_against_a_server(peer_loop, path, _blocking_timed_out)
    assert ended == "EAGAIN"


def _blocking_reset(port: int) -> str:
    with socket.create_connection(("127.0.0.1", port), timeout=20) as sock:
        sock.sendall(b"ping")
        assert sock.recv(4) == b"ping"
        try:
            return repr(sock.recv(10))
        except OSError as exc:
            return type(exc).__name__


@pytest.mark.usefixtures("socket_patched")
async def test_a_server_abort_resets_a_blocking_client(peer_loop, path):
    """The server aborts with SO_LINGER {1, 0}: the client's read raises
    ConnectionResetError, not EOF."""
    got, theirs = await _on_a_thread_against_a_server(peer_loop, path, _blocking_reset, door="abort")
    assert got == "ConnectionResetError" and theirs == {"aborted": True}


# After the server's answer: what each step of a client's gets, once the
# server's FIN or abort came. ``recv0``: recv(0); ``recv``: recv(10);
# ``send``: a send of 4 bytes; ``gone``: wait until the server's socket is
# gone (a TCP socket's POLLHUP comes with the reset that answers a write,
# a moved one's as the pair closes).
def _blocking_steps(port: int, steps: Sequence[str]) -> List[str]:
    with socket.create_connection(("127.0.0.1", port), timeout=20) as sock:
        sock.sendall(b"ping")
        assert sock.recv(4) == b"ping"
        assert select.select([sock], [], [], 20)[0]  # (its FIN or reset came)
        outcomes = []
        for step in steps:
            if step == "gone":
                _peer_gone(sock)
                continue
            outcomes.append(_blocking_step(sock, step))
        return outcomes


def _blocking_step(sock: socket.socket, step: str) -> str:
    """What ``step`` gets: its answer's repr, or its error's type name."""
    try:
        if step in _ASKED:
            return cast(str, _ASKED[step](sock))
        return repr(sock.send(_SENT[step]) if step in _SENT else sock.recv(_SIZES[step]))
    except OSError as exc:
        return type(exc).__name__


async def _trio_step(sock: Any, step: str) -> str:
    """The same, of a trio socket."""
    try:
        if step in _ASKED:
            return cast(str, _ASKED[step](sock))
        return repr(await (sock.send(_SENT[step]) if step in _SENT else sock.recv(_SIZES[step])))
    except OSError as exc:
        return type(exc).__name__


def _trio_steps(port: int, steps: Sequence[str]) -> List[str]:
    """The same steps, for a trio socket."""
    import trio

    import friendsock.trio

    async def exchange() -> List[str]:
        stream = await friendsock.trio.open_tcp_stream("127.0.0.1", port)
        async with stream:
            await stream.send_all(b"ping")
            assert await stream.receive_some(4) == b"ping"
            sock = stream.socket
            with trio.fail_after(20):
                await trio.lowlevel.wait_readable(sock)  # (its FIN or reset came)
            outcomes = []
            for step in steps:
                if step == "gone":
                    _peer_gone(sock)
                    continue
                outcomes.append(await _trio_step(sock, step))
            return outcomes

    return trio.run(exchange)


_SIZES = {"recv0": 0, "recv": 10}
_SENT = {"send": b"more", "send0": b""}
# Steps that ask the socket: a shutdown of its writing, its peer's name
# (whether it has one), and its error (SO_ERROR, which takes it), by name.
_ASKED = {"shut": lambda sock: repr(sock.shutdown(socket.SHUT_WR)),
          "peer": lambda sock: repr(bool(sock.getpeername())),
          "error": lambda sock: _error_taken(sock) or "0"}
_CLIENT_STEPS = {"blocking": _blocking_steps, "trio": _trio_steps}


def _peer_gone(sock: Any) -> None:
    poller = select.poll()
    poller.register(sock.fileno(), select.POLLHUP)
    assert poller.poll(20_000)


# A blocking or trio client's calls once the server ended the connection,
# each answered as over TCP: the server's door, the client's steps (see
# _blocking_steps; "gone": until the server's socket is gone), what each
# step got, and the server's report.
_AFTER_THE_SERVER_ENDED = {
    # recv(0) answers b'' and leaves the reset to the next read that asks
    # for bytes: it neither raises it nor takes it away.
    "recv-of-nothing-leaves-the-reset": (
        "abort", ("recv0", "recv"), ["b''", "ConnectionResetError"], {"aborted": True}),
    # After a clean close the next send is taken (the other kernel resets
    # it), where a socketpair would refuse it; the one after raises EPIPE.
    # A send of nothing before them is none.
    "first-send-after-a-close-taken": (
        "close", ("send0", "send", "gone", "send", "recv"), ["0", "4", "BrokenPipeError", "b''"],
        {"closed": True}),
    # The reset that taken send met closed TCP's socket: shutdown ENOTCONN.
    "shutdown-after-the-taken-send": (
        "close", ("send", "gone", "shut", "recv"), ["4", "OSError", "b''"], {"closed": True}),
    # A waiting reset fails a shutdown too, and is left to the read.
    "shutdown-after-an-abort": (
        "abort", ("gone", "shut", "recv", "recv"), ["OSError", "ConnectionResetError", "b''"],
        {"aborted": True}),
    # Both directions finished, TCP's socket is closed: a second shutdown fails.
    "second-shutdown-when-both-finished": (
        "close", ("recv", "shut", "shut"), ["b''", "None", "OSError"], {"closed": True}),
    # After an abort the next send raises the reset, and a read finds EOF.
    "send-after-an-abort": (
        "abort", ("gone", "send", "recv"), ["ConnectionResetError", "b''"], {"aborted": True}),
    # A reset after the server's EOF (read here) meets TCP's socket in
    # CLOSE_WAIT: the send raises EPIPE, not the reset.
    "send-after-a-reset-that-followed-eof": (
        "eof-abort", ("recv", "send", "gone", "send", "recv"), ["b''", "4", "BrokenPipeError", "b''"],
        {"aborted": True}),
    # Once a read raised the reset, a send raises EPIPE (not taken as a
    # first send after a clean close).
    "send-after-the-reset-was-read": (
        "abort", ("recv", "send", "recv"), ["ConnectionResetError", "BrokenPipeError", "b''"],
        {"aborted": True}),
}


@pytest.mark.parametrize("case", list(_AFTER_THE_SERVER_ENDED))
@pytest.mark.parametrize("client", ["blocking", "trio"])
@pytest.mark.usefixtures("socket_patched")
async def test_calls_after_the_server_ended_answer_as_over_tcp(peer_loop, path, client, case):
    """What a client's sends, reads and shutdowns get once the server
    answered and closed or aborted (see _AFTER_THE_SERVER_ENDED)."""
    door, steps, expected, report = _AFTER_THE_SERVER_ENDED[case]
    run = functools.partial(_CLIENT_STEPS[client], steps=steps)
    got, theirs = await _on_a_thread_against_a_server(peer_loop, path, run, door=door)
    assert got == expected and theirs == report


def _unread_at_close(port: int, reported: Optional[threading.Event] = None, *, client: str,
                     steps: Sequence[str], eof_first: bool) -> List[Any]:
    """Whether a client's connection moved (after a first connection: a
    blocking server's is TCP's), then what its ``steps`` (see
    _blocking_steps) get once the server closed with bytes of its unread;
    ``eof_first``: the server's EOF read before. With ``reported``, the
    client shuts its writing down behind those bytes, and the steps wait
    for the server's report of its close (``-fin`` doors)."""
    with socket.create_connection(("127.0.0.1", port), timeout=20) as sock:
        sock.sendall(b"warm")
        assert sock.recv(4) == b"warm"
    if client == "trio":
        import trio

        async def exchange() -> List[Any]:
            import friendsock.trio

            stream = await friendsock.trio.open_tcp_stream("127.0.0.1", port)
            async with stream:
                sock = stream.socket
                await sock.send(b"ping")
                assert await sock.recv(4) == b"ping"
                assert not eof_first or await sock.recv(10) == b""
                await sock.send(b"unread")
                if reported is None:
                    _peer_gone(sock)
                else:
                    sock.shutdown(socket.SHUT_WR)
                    assert await trio.to_thread.run_sync(reported.wait, 20)
                return [friendsock.is_friend(sock)] + [await _trio_step(sock, step) for step in steps]

        return trio.run(exchange)
    with socket.create_connection(("127.0.0.1", port), timeout=20) as sock:
        sock.sendall(b"ping")
        assert sock.recv(4) == b"ping"
        assert not eof_first or sock.recv(10) == b""
        sock.sendall(b"unread")
        if reported is None:
            _peer_gone(sock)
        else:
            sock.shutdown(socket.SHUT_WR)
            assert reported.wait(20)
        return [friendsock.is_friend(sock)] + [_blocking_step(sock, step) for step in steps]


# Steps after the server's close with bytes unread, and what each gets;
# "eof-first": the server's EOF came (and was read) before that close.
_AFTER_A_CLOSE_WITH_BYTES_UNREAD = {
    # The next send raises the reset, the one after EPIPE: not taken as
    # after a clean close, its bytes lost.
    "sends": (("send", "send", "recv"), ["ConnectionResetError", "BrokenPipeError", "b''"]),
    # SO_ERROR takes the reset: the read finds EOF, a send fails EPIPE.
    "error-taken": (("error", "error", "recv", "send"), ["ECONNRESET", "0", "b''", "BrokenPipeError"]),
    # A send of nothing takes the reset too: TCP's socket is closed.
    "empty-send": (("send0", "peer", "send"), ["ConnectionResetError", "OSError", "BrokenPipeError"]),
    # The reset met TCP's socket after the EOF (CLOSE_WAIT): reads find
    # EOF again, and the socket holds EPIPE.
    "eof-first": (("recv", "error", "recv", "send"), ["b''", "EPIPE", "b''", "BrokenPipeError"]),
    "eof-first-error-taken": (("error", "error", "recv", "send"), ["EPIPE", "0", "b''", "BrokenPipeError"]),
}


@pytest.mark.parametrize("case", list(_AFTER_A_CLOSE_WITH_BYTES_UNREAD))
@pytest.mark.parametrize("client", ["blocking", "trio"])
@pytest.mark.usefixtures("socket_patched")
async def test_a_close_with_bytes_unread_resets_the_other_end(path, client, case):
    """The server closes with bytes of the client's unread: as over TCP,
    whose close is a reset then, the client's calls meet that reset (see
    _AFTER_A_CLOSE_WITH_BYTES_UNREAD)."""
    steps, expected = _AFTER_A_CLOSE_WITH_BYTES_UNREAD[case]
    eof_first = case.startswith("eof-first")
    run = functools.partial(_unread_at_close, client=client, steps=steps, eof_first=eof_first)
    door = "blocking-eof-close-unread" if eof_first else "blocking-close-unread"
    got, _ = await _on_a_thread_against_a_server("-", path, run, door=door)
    assert got == [path == "friend"] + expected


@pytest.mark.parametrize("client", ["blocking", "trio"])
@pytest.mark.usefixtures("socket_patched")
async def test_a_close_after_both_fins_resets_nothing(path, client):
    """The server's EOF read, the client's sent behind bytes the server
    leaves unread: TCP's connection is over, and the server's close
    resets nothing. The client's socket holds no error, a send fails
    with EPIPE (its own shutdown), a read finds EOF."""
    run = functools.partial(_unread_at_close, client=client, steps=("error", "send", "recv", "peer", "error"),
                            eof_first=True)
    got, report = await _on_a_thread_until_the_server_reports("-", path, run,
                                                              door="blocking-eof-close-unread-fin")
    assert report == {"closed": True}
    assert got == [path == "friend", "0", "BrokenPipeError", "b''", "OSError", "0"]


def _blocking_sends_after_shutdown_and_reset(port: int, reported: threading.Event) -> List[str]:
    with socket.create_connection(("127.0.0.1", port), timeout=20) as sock:
        sock.shutdown(socket.SHUT_WR)
        assert reported.wait(20)
        _peer_gone(sock)
        return [_blocking_step(sock, "send"), _blocking_step(sock, "send")]


def _trio_sends_after_shutdown_and_reset(port: int, reported: threading.Event) -> List[str]:
    import trio

    import friendsock.trio

    async def exchange() -> List[str]:
        stream = await friendsock.trio.open_tcp_stream("127.0.0.1", port)
        async with stream:
            sock = stream.socket
            sock.shutdown(socket.SHUT_WR)
            assert await trio.to_thread.run_sync(reported.wait, 20)
            _peer_gone(sock)
            return [await _trio_step(sock, "send"), await _trio_step(sock, "send")]

    return trio.run(exchange)


@pytest.mark.parametrize("client", ["blocking", "trio"])
@pytest.mark.usefixtures("socket_patched")
async def test_a_send_after_a_shutdown_takes_the_reset_that_came(peer_loop, path, client):
    """The client shuts its writing down; the server reads the EOF, then
    resets: a send fails as TCP's does, with the reset that waits (the
    send takes it), then with EPIPE."""
    run = (_blocking_sends_after_shutdown_and_reset if client == "blocking"
           else _trio_sends_after_shutdown_and_reset)
    got, report = await _on_a_thread_until_the_server_reports(peer_loop, path, run, door="eof-abort-late")
    assert report == {"aborted": True}
    assert got == ["ConnectionResetError", "BrokenPipeError"]


def _not_connected(*calls: Any) -> List[Optional[str]]:
    """The errno name each of ``calls`` fails with (None: it does not)."""
    found: List[Optional[str]] = []
    for call in calls:
        try:
            call()
            found.append(None)
        except OSError as exc:
            found.append(errno.errorcode[exc.errno])
    return found


def _error_taken(sock: Any) -> Optional[str]:
    """The errno name ``SO_ERROR`` takes off ``sock`` (None: none)."""
    return errno.errorcode.get(sock.getsockopt(socket.SOL_SOCKET, socket.SO_ERROR))


def _blocking_write_taken_after_close(port: int, reported: threading.Event) -> List[Optional[str]]:
    with socket.create_connection(("127.0.0.1", port), timeout=20) as sock:
        sock.sendall(b"ping")
        assert sock.makefile("rb").read() == b"ping"  # (then the server's EOF)
        assert reported.wait(20)
        sock.sendall(b"more")  # (taken: the server's kernel answers it with a reset)
        return _not_connected(sock.getpeername, lambda: sock.shutdown(socket.SHUT_WR)) + [
            _error_taken(sock), _error_taken(sock)] + _not_connected(lambda: sock.send(b"late"))


def _trio_write_taken_after_close(port: int, reported: threading.Event) -> List[Optional[str]]:
    import trio

    import friendsock.trio

    async def exchange() -> List[Optional[str]]:
        stream = await friendsock.trio.open_tcp_stream("127.0.0.1", port)
        async with stream:
            await stream.send_all(b"ping")
            got = b""
            while data := await stream.receive_some():
                got += data
            assert got == b"ping"
            assert await trio.to_thread.run_sync(reported.wait, 20)
            await stream.send_all(b"more")
            sock = stream.socket
            got = _not_connected(sock.getpeername, lambda: sock.shutdown(socket.SHUT_WR))
            return got + [_error_taken(sock), _error_taken(sock)]

    return trio.run(exchange)


@pytest.mark.parametrize("client", ["blocking", "trio"])
@pytest.mark.usefixtures("socket_patched")
async def test_a_moved_socket_reset_by_a_write_after_the_close_is_not_connected(peer_loop, path, client):
    """The server closes; the client writes once more, which TCP takes
    and the server's kernel answers with a reset: the client's socket is
    closed by it, so getpeername() and shutdown() fail with ENOTCONN; the
    reset came after the server's FIN, so the error it left is EPIPE,
    which SO_ERROR takes once (and a blocking socket's next write meets
    EPIPE all the same)."""
    run = _blocking_write_taken_after_close if client == "blocking" else _trio_write_taken_after_close
    got, report = await _on_a_thread_until_the_server_reports(peer_loop, path, run, door="close")
    assert report == {"closed": True}
    assert got == ["ENOTCONN", "ENOTCONN", "EPIPE", None] + (["EPIPE"] if client == "blocking" else [])


def _blocking_reset_taken(port: int, reported: threading.Event) -> List[Any]:
    with socket.create_connection(("127.0.0.1", port), timeout=20) as sock:
        sock.sendall(b"ping")
        assert reported.wait(20)
        got: List[Any] = [sock.recv(4), errno.errorcode[sock.getsockopt(socket.SOL_SOCKET, socket.SO_ERROR)]]
        return got + _not_connected(sock.getpeername, lambda: sock.shutdown(socket.SHUT_WR),
                                    lambda: sock.send(b"late"))


@pytest.mark.usefixtures("socket_patched")
async def test_a_moved_socket_whose_reset_was_taken_is_not_connected(peer_loop, path):
    """The server answers, then aborts (a reset); the client reads the
    answer and takes the reset off its socket (SO_ERROR): TCP's socket is
    closed all the same, so getpeername() and shutdown() fail with
    ENOTCONN, with no error left pending, and a write with EPIPE."""
    got, report = await _on_a_thread_until_the_server_reports(peer_loop, path, _blocking_reset_taken,
                                                              door="abort")
    assert report == {"aborted": True}
    assert got == [b"ping", "ECONNRESET", "ENOTCONN", "ENOTCONN", "EPIPE"]


def _blocking_read_shut(port: int, reported: threading.Event) -> bytes:
    with socket.create_connection(("127.0.0.1", port), timeout=20) as sock:
        sock.shutdown(socket.SHUT_RD)
        got = sock.recv(10)  # (nothing came yet: EOF)
        sock.sendall(b"ping")  # (answered, then closed)
        assert reported.wait(20)
        return got


def _trio_read_shut(port: int, reported: threading.Event) -> bytes:
    import trio

    import friendsock.trio

    async def exchange() -> bytes:
        stream = await friendsock.trio.open_tcp_stream("127.0.0.1", port)
        async with stream:
            stream.socket.shutdown(socket.SHUT_RD)
            got = await stream.receive_some(10)
            await stream.send_all(b"ping")
            assert await trio.to_thread.run_sync(reported.wait, 20)
            return got

    return trio.run(exchange)


@pytest.mark.parametrize("client", ["blocking", "trio"])
@pytest.mark.usefixtures("socket_patched")
async def test_a_read_shutdown_of_a_moved_socket_is_tcps(peer_loop, path, client):
    """A blocking or trio socket's ``shutdown(SHUT_RD)`` is TCP's: a read
    with nothing to read finds EOF at once, and the server's answer is
    written (a socketpair's would refuse it, EPIPE) and its close a clean
    one."""
    run = _blocking_read_shut if client == "blocking" else _trio_read_shut
    got, report = await _on_a_thread_until_the_server_reports(peer_loop, path, run, door="close")
    assert report == {"closed": True}
    assert got == b""


def _blocking_shut_both_ways(port: int, reported: threading.Event) -> List[Any]:
    with socket.create_connection(("127.0.0.1", port), timeout=20) as sock:
        with pytest.raises(OSError) as refused:
            sock.shutdown(7)  # (no such direction)
        assert refused.value.errno == errno.EINVAL
        sock.shutdown(socket.SHUT_RDWR)
        assert reported.wait(20)
        got: List[Any] = [sock.recv(10), sock.getpeername() == ("127.0.0.1", port)]
        try:
            sock.send(b"late")
        except OSError as exc:
            got.append(type(exc).__name__)
        return got


def _trio_shut_both_ways(port: int, reported: threading.Event) -> List[Any]:
    import trio

    import friendsock.trio

    async def exchange() -> List[Any]:
        stream = await friendsock.trio.open_tcp_stream("127.0.0.1", port)
        async with stream:
            stream.socket.shutdown(socket.SHUT_RDWR)
            assert await trio.to_thread.run_sync(reported.wait, 20)
            got: List[Any] = [await stream.receive_some(10),
                              stream.socket.getpeername() == ("127.0.0.1", port)]
            try:
                await stream.socket.send(b"late")
            except OSError as exc:
                got.append(type(exc).__name__)
            return got

    return trio.run(exchange)


@pytest.mark.parametrize("client", ["blocking", "trio"])
@pytest.mark.usefixtures("socket_patched")
async def test_a_shutdown_both_ways_of_a_moved_socket_is_tcps(peer_loop, path, client):
    """A blocking or trio socket's ``shutdown(SHUT_RDWR)`` is TCP's: the
    server reads EOF; while it holds its end open the connection is not
    over, so the socket still names its peer; a read finds EOF, a write
    fails with BrokenPipeError."""
    run = _blocking_shut_both_ways if client == "blocking" else _trio_shut_both_ways
    got, report = await _on_a_thread_until_the_server_reports(peer_loop, path, run, door="eof-hold")
    assert report == {"eof": True}
    assert got == [b"", True, "BrokenPipeError"]


def _blocking_reader_stopped(port: int, reported: threading.Event, timeout: Any,
                             hows: Sequence[int] = (socket.SHUT_RDWR,)) -> bytes:
    with socket.create_connection(("127.0.0.1", port), timeout=20) as sock:
        sock.settimeout(timeout)
        reader: List[int] = []
        read = run_thread(lambda: reader.append(threading.get_native_id()) or sock.recv(10))
        _until(lambda: bool(reader) and _thread_asleep(reader[0], on_a_lock=False), "the read to wait")
        for how in hows:
            sock.shutdown(how)
        got = cast(bytes, read())
        assert sock.recv(10) == b""
        assert reported.wait(20)
        assert sock.getpeername() == ("127.0.0.1", port)  # (the server holds its end open)
        return got


def _trio_reader_stopped(port: int, reported: threading.Event) -> bytes:
    import trio
    import trio.testing

    import friendsock.trio

    async def exchange() -> bytes:
        got: List[bytes] = []
        with trio.fail_after(20):
            stream = await friendsock.trio.open_tcp_stream("127.0.0.1", port)
            async with stream, trio.open_nursery() as nursery:
                async def read() -> None:
                    got.append(await stream.socket.recv(10))

                nursery.start_soon(read)
                await trio.testing.wait_all_tasks_blocked()
                stream.socket.shutdown(socket.SHUT_RDWR)
        return got[0]

    return trio.run(exchange)


_READER_STOPPED = {"blocking": functools.partial(_blocking_reader_stopped, timeout=None),
                   "timeout": functools.partial(_blocking_reader_stopped, timeout=20.0),
                   "read-then-write": functools.partial(_blocking_reader_stopped, timeout=None,
                                                        hows=(socket.SHUT_RD, socket.SHUT_WR)),
                   "trio": _trio_reader_stopped}


@pytest.mark.parametrize("client", list(_READER_STOPPED))
@pytest.mark.usefixtures("socket_patched")
async def test_a_shutdown_wakes_a_read_waiting_on_another_thread(peer_loop, path, client):
    """A read waits (blocking, with a timeout, or a trio task); another
    thread or task shuts the socket down both ways, as a service stops
    its reader (or its reading, then its writing): TCP's read wakes with
    EOF, and the server reads EOF;
    a blocking socket's next read finds EOF too, and it still names its
    peer, which holds its end open."""
    got, report = await _on_a_thread_until_the_server_reports(peer_loop, path, _READER_STOPPED[client],
                                                              door="eof-hold")
    assert report == {"eof": True}
    assert got == b""


def _blocking_call_after_close(port: int, reported: threading.Event, call: str) -> str:
    sock = socket.create_connection(("127.0.0.1", port), timeout=20)
    sock.shutdown(socket.SHUT_RDWR)
    assert reported.wait(20)
    sock.close()
    with pytest.raises(OSError) as closed:
        sock.recv(10) if call == "recv" else sock.shutdown(socket.SHUT_RDWR)
    return errno.errorcode[closed.value.errno]


@pytest.mark.parametrize("call", ["recv", "shutdown"])
@pytest.mark.usefixtures("socket_patched")
async def test_a_closed_socket_that_was_shut_down_is_ebadf(peer_loop, path, call):
    """A read or a shutdown() after the close of a socket that was shut
    down both ways fails with EBADF, as TCP's (not a poller's complaint
    of its descriptor, ValueError: socketserver, which shuts each
    connection down after its handler, catches OSError only)."""
    run = functools.partial(_blocking_call_after_close, call=call)
    got, report = await _on_a_thread_until_the_server_reports(peer_loop, path, run, door="eof-hold")
    assert report == {"eof": True}
    assert got == "EBADF"


_ECHOED = b"0123456789"


def _blocking_reads(port: int, reported: threading.Event) -> List[Any]:
    with socket.create_connection(("127.0.0.1", port), timeout=20) as sock:
        sock.sendall(_ECHOED)
        got: List[Any] = [sock.recv(10, socket.MSG_PEEK | socket.MSG_WAITALL)]  # (the echo, all here)
        into = bytearray(2)
        got += [sock.recv_into(into), bytes(into), sock.recvfrom_into(into), bytes(into),
                sock.recvfrom(2), sock.recvmsg(2), sock.recv(2), _moved_counts(list(sock.getsockname()))]
        sock.shutdown(socket.SHUT_RD)
        return got + [sock.recv(10), sock.recv_into(into), sock.recvfrom(10), sock.recvfrom_into(into),
                      sock.recvmsg(10)]


def _trio_reads(port: int, reported: threading.Event) -> List[Any]:
    import trio

    import friendsock.trio

    async def exchange() -> List[Any]:
        with trio.fail_after(20):
            stream = await friendsock.trio.open_tcp_stream("127.0.0.1", port)
            async with stream:
                sock = stream.socket
                await stream.send_all(_ECHOED)
                got: List[Any] = [await sock.recv(10, socket.MSG_PEEK)]
                while len(got[0]) < len(_ECHOED):  # (until the echo is all here)
                    await trio.lowlevel.wait_readable(sock)
                    got[0] = await sock.recv(10, socket.MSG_PEEK)
                into = bytearray(2)
                got += [await sock.recv_into(into), bytes(into), await sock.recvfrom_into(into), bytes(into),
                        await sock.recvfrom(2), await sock.recvmsg(2), await sock.recv(2),
                        _moved_counts(list(sock.getsockname()))]
                sock.shutdown(socket.SHUT_RD)
                return got + [await sock.recv(10), await sock.recv_into(into), await sock.recvfrom(10),
                              await sock.recvfrom_into(into), await sock.recvmsg(10)]

    return trio.run(exchange)


@pytest.mark.parametrize("client", ["blocking", "trio"])
@pytest.mark.usefixtures("socket_patched")
async def test_each_read_of_a_moved_socket_answers_and_counts_as_tcps(peer_loop, path, client):
    """Each read call of a blocking or trio socket gives what TCP's gives:
    a peek leaves the echo to the reads that follow (and counts none of
    it), each read takes its part, and after ``shutdown(SHUT_RD)`` each
    finds EOF in its own shape; ``links()`` counts each byte once."""
    run = _blocking_reads if client == "blocking" else _trio_reads
    got, report = await _on_a_thread_until_the_server_reports(peer_loop, path, run, door="api")
    assert report["sha256"] == hashlib.sha256(_ECHOED).hexdigest()
    counts = got.pop(8)
    assert got == [_ECHOED, 2, b"01", (2, None), b"23", (b"45", None), (b"67", [], 0, None), b"89",
                   b"", 0, (b"", None), (0, None), (b"", [], 0, None)]
    if path == "tcp":
        assert counts is None
    else:
        assert counts[1:] == [len(_ECHOED), len(_ECHOED)] and counts[0] != os.getpid()


def _blocking_shut_and_closed(port: int) -> None:
    with socket.create_connection(("127.0.0.1", port), timeout=20) as sock:
        sock.shutdown(socket.SHUT_RDWR)


def _trio_shut_and_closed(port: int) -> None:
    import trio

    import friendsock.trio

    async def exchange() -> None:
        with trio.fail_after(20):
            stream = await friendsock.trio.open_tcp_stream("127.0.0.1", port)
            async with stream:
                stream.socket.shutdown(socket.SHUT_RDWR)

    trio.run(exchange)


async def _eof_read_after_the_close(peer: Any, port: int) -> Dict[str, Any]:
    """What the server process behind ``eof-late`` reads, told to once the
    client's end of its connection to ``port`` closed (the kernel's table
    shows none established)."""
    assert await peer.report() == {"accepted": True}
    await until(lambda: not tcp_connections(port, "01"))
    peer.process.send_signal(signal.SIGUSR1)
    return await peer.report()


@pytest.mark.parametrize("client", ["blocking", "trio"])
@pytest.mark.usefixtures("socket_patched")
async def test_a_close_after_a_shutdown_both_ways_ends_with_a_fin(peer_loop, path, client):
    """A client shuts its socket down both ways and closes it, as a
    stopping service does: its close is TCP's FIN, not a reset (its TCP
    socket polls readable once its reading is shut, which is not the
    server's FIN to answer). The server, reading only after, finds EOF."""
    peer, port = await _serving(peer_loop, path, door="eof-late")
    try:
        await bounded(asyncio.to_thread(_blocking_shut_and_closed if client == "blocking" else _trio_shut_and_closed,
                                        port), 30)
        assert await _eof_read_after_the_close(peer, port) == {"eof": True}
    finally:
        await peer.finish()


@pytest.mark.asyncio(loop_factories=["asyncio"])  # (uvloop's transport socket refuses shutdown())
async def test_a_transport_closed_after_its_socket_shut_down_both_ways_ends_with_a_fin(peer_loop, path):
    """The same of a transport whose socket (``get_extra_info('socket')``)
    was shut down both ways before its close."""
    async with _connected_to_a_server(peer_loop, path, door="eof-late") as (peer, port, reader, writer):
        writer.get_extra_info("socket").shutdown(socket.SHUT_RDWR)
        writer.close()
        assert await _eof_read_after_the_close(peer, port) == {"eof": True}


def _blocking_fin_behind_unread(port: int, reported: threading.Event) -> List[Any]:
    with socket.create_connection(("127.0.0.1", port), timeout=20) as sock:
        sock.setblocking(False)
        with pytest.raises(BlockingIOError):
            while True:
                sock.send(bytes(1 << 16))
        sock.settimeout(20)
        sock.shutdown(socket.SHUT_WR)
        assert reported.wait(20)
        got: List[Any] = [sock.recv(10)]
        sock.shutdown(socket.SHUT_WR)
        return got + [sock.getpeername() == ("127.0.0.1", port)]


@pytest.mark.usefixtures("socket_patched")
async def test_a_shutdown_while_the_fin_waits_behind_unread_bytes_goes_through(peer_loop, path):
    """The server sends EOF and reads nothing; the client fills what the
    connection holds, shuts its writing down and reads that EOF. TCP's
    FIN from the client still waits behind its unread bytes, its socket
    open: a second shutdown goes through and it still names its peer."""
    got, report = await _on_a_thread_until_the_server_reports(peer_loop, path, _blocking_fin_behind_unread,
                                                              door="eof-unread")
    assert report == {"eof_sent": True}
    assert got == [b"", True]


def _blocking_from_wildcard(port: int, host: str) -> bool:
    """A client bound to the wildcard address before connect()."""
    with socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET) as sock:
        sock.settimeout(20)
        sock.bind((host, 0))
        sock.connect(("::1" if ":" in host else "127.0.0.1", port))
        sock.sendall(b"ping")
        assert sock.recv(4) == b"ping"
        return friendsock.is_friend(sock)


@pytest.mark.parametrize("wildcard", ["0.0.0.0", "::"])
@pytest.mark.usefixtures("socket_patched")
async def test_clients_bound_to_the_wildcard_address_move(peer_loop, path, wildcard):
    """A client bound by its user to the wildcard address (``source_address``,
    ``local_addr``) has its address only once connected: it moves, blocking
    or on a loop, to a server serving both loopback families on one port."""
    peer, port = await _serving(peer_loop, path, door="both")
    try:
        blocking = await bounded(asyncio.to_thread(_blocking_from_wildcard, port, wildcard), 30)
        loopback = "::1" if ":" in wildcard else "127.0.0.1"
        reader, writer = await bounded(friendsock.open_connection(loopback, port, local_addr=(wildcard, 0)))
        writer.write(b"ping")
        assert await bounded(reader.readexactly(4)) == b"ping"
        on_loop = friendsock.is_friend(writer)
        writer.close()
        await writer.wait_closed()
    finally:
        await peer.finish()
    assert blocking is on_loop is (path == "friend")


_LEFT_OPEN = """
import socket, sys, warnings
import friendsock

warnings.simplefilter("always", ResourceWarning)
friendsock.patch_socket()
sock = socket.create_connection(("127.0.0.1", int(sys.argv[1])), timeout=20)
sock.sendall(b"ping")
assert sock.recv(4) == b"ping"
print(friendsock.is_friend(sock))
"""


async def test_a_blocking_socket_left_open_warns_once(path):
    """Left open at exit, a moved socket gives its one ResourceWarning, as
    a TCP one does, naming both its addresses (not friendsock's own copy)."""
    port, out, err = await _script_against_a_server_here(path, "-X", "dev", "-c", _LEFT_OPEN)
    assert out.split() == [str(path == "friend")]
    unclosed = [line for line in err.splitlines() if "unclosed <socket.socket" in line]
    assert len(unclosed) == 1 and f"raddr=('127.0.0.1', {port})" in unclosed[0], unclosed


@pytest.mark.parametrize("door", ["trio", "trio-install"])
async def test_a_trio_client_process(door, path):
    """A trio client of another process (``friendsock.trio.open_tcp_stream``,
    or trio's own under ``friendsock.trio.install()``) moves off TCP."""
    ends: List[Dict[str, Any]] = []
    server = await friendsock.start_server(_echo_recording(ends), "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    theirs = await _client_report(server, "connect", "-", door, str(port), str(SIZE), "7", path=path)
    [ours] = ends
    assert theirs["sha256"] == theirs["sent"] == ours["sha256"]
    assert theirs["transport"] == "SocketStream"
    assert theirs["friend"] is ours["friend"] is (path == "friend")
    assert theirs["payload_moved"] is ours["payload_moved"] is (path == "tcp")
    assert theirs["sockname"] == ours["peername"] and theirs["peername"] == ["127.0.0.1", port]


def _trio_reset(port: int) -> str:
    import trio

    import friendsock.trio

    async def exchange() -> str:
        stream = await friendsock.trio.open_tcp_stream("127.0.0.1", port)
        async with stream:
            await stream.send_all(b"ping")
            assert await stream.receive_some(4) == b"ping"
            try:
                return repr(await stream.receive_some(10))
            except trio.BrokenResourceError as exc:
                return f"BrokenResourceError from {type(exc.__cause__).__name__}"

    return trio.run(exchange)


async def test_a_server_abort_resets_a_trio_client(peer_loop, path):
    """The server aborts with SO_LINGER {1, 0}: trio's read raises
    BrokenResourceError from ConnectionResetError, not EOF."""
    got, theirs = await _on_a_thread_against_a_server(peer_loop, path, _trio_reset, door="abort")
    assert got == "BrokenResourceError from ConnectionResetError" and theirs == {"aborted": True}


@pytest.mark.parametrize("eof_read", [True, False], ids=["eof-read", "eof-not-read-yet"])
async def test_a_transport_write_after_the_other_end_closed_is_taken(peer_loop, path, eof_read):
    """The server answers and closes: as over TCP, the client's next
    write is taken, whether its EOF was read here yet or not (reading
    paused), and closing then loses nothing (no BrokenPipeError in
    connection_lost, as a socketpair's would give). The write after it
    fails, the connection lost. Writes of nothing before it are none.
    (Not writelines() of nothing: from 3.12 on, asyncio's own transport
    queues it, and what follows it goes otherwise, over TCP too.)"""
    peer, port = await _serving(peer_loop, path, door="close")
    try:
        reader, writer = await bounded(friendsock.open_connection("127.0.0.1", port))
        writer.write(b"ping")
        assert await bounded(reader.readexactly(4)) == b"ping"
        if eof_read:
            assert await bounded(reader.read()) == b""
        else:
            writer.transport.pause_reading()
        assert await peer.report() == {"closed": True}  # (its socket is gone)
        writer.write(b"")
        writer.write(memoryview(b""))
        writer.write(b"more")
        closing = writer.transport.is_closing()
        if not eof_read:
            writer.write(b"again")
            assert writer.transport.is_closing()
            with pytest.raises(ConnectionError):
                await bounded(writer.drain())
        writer.close()
        if eof_read:
            await bounded(writer.wait_closed())
        else:
            with pytest.raises(ConnectionError):
                await bounded(writer.wait_closed())
    finally:
        await peer.finish()
    assert not closing


@pytest.mark.parametrize("reset_by", ["write-taken-after-a-close", "abort-while-paused"])
async def test_a_write_eof_after_a_reset_fails(peer_loop, path, reset_by):
    """Where TCP's connection was reset by now, by the write taken after
    the server's close (its kernel answers that write with a reset) or by
    the server's abort while reading here was paused (TCP's socket holds
    the reset until a call takes it), a write_eof() fails with ENOTCONN as
    the loop's own transport fails it: asyncio's raises it (its writing
    done all the same; reading resumed then meets the reset), uvloop's
    loses the connection with it."""
    aborts = reset_by == "abort-while-paused"
    peer, port = await _serving(peer_loop, path, door="abort" if aborts else "close")
    try:
        reader, writer = await bounded(friendsock.open_connection("127.0.0.1", port))
        if aborts:
            writer.transport.pause_reading()
        writer.write(b"ping")
        if not aborts:
            assert await bounded(reader.read()) == b"ping"  # (then the server's EOF)
        assert await peer.report() == ({"aborted": True} if aborts else {"closed": True})
        if not aborts:
            writer.write(b"more")
        if isinstance(asyncio.get_running_loop(), uvloop.Loop):
            writer.write_eof()
            with pytest.raises(OSError) as raised:
                await bounded(writer.wait_closed())
        else:
            with pytest.raises(OSError) as raised:
                writer.write_eof()
            with pytest.raises(RuntimeError, match="write_eof"):
                writer.write(b"late")
            if aborts:
                writer.transport.resume_reading()
                with pytest.raises(ConnectionResetError):
                    await bounded(reader.read())
            writer.close()
    finally:
        await peer.finish()
    assert raised.value.errno == errno.ENOTCONN


async def test_a_transport_write_after_a_reset_that_followed_eof_fails_with_epipe(peer_loop, path):
    """The server sends EOF, the client reads it and writes again, the
    server aborts: as over TCP, whose socket met the reset in CLOSE_WAIT,
    the client's next write loses the connection with BrokenPipeError,
    not ConnectionResetError."""
    peer, port = await _serving(peer_loop, path, door="eof-abort")
    try:
        transport, client = await bounded(friendsock.create_connection(
            lambda: Recorder(eof_keep_open=True), "127.0.0.1", port))
        transport.write(b"ping")
        await bounded(client.eof)
        transport.write(b"done")
        assert await peer.report() == {"aborted": True}
        transport.write(b"more")
        lost = await bounded(client.lost)
    finally:
        await peer.finish()
    assert bytes(client.data) == b"ping" and isinstance(lost, BrokenPipeError)


async def _closed_with_bytes_unread(peer: Peer, port: int) -> Any:
    """A connection to the server behind ``blocking-close-unread``, which
    answered and closed with bytes of ours unread: its reader and writer,
    reading paused."""
    reader, writer = await bounded(friendsock.open_connection("127.0.0.1", port))
    writer.write(b"ping")
    assert await bounded(reader.readexactly(4)) == b"ping"
    writer.transport.pause_reading()
    writer.write(b"unread")
    assert await peer.report() == {"closed": True}
    return reader, writer


async def test_a_transport_write_after_the_other_end_closed_with_bytes_unread_is_reset(path):
    """The server closes with bytes of the client's unread: the client's
    next write meets the reset, as over TCP (whose close is a reset then):
    the connection is lost with ConnectionResetError."""
    peer, port = await _serving("-", path, door="blocking-close-unread")
    try:
        for _ in range(2):  # (a blocking server's first connection is TCP's)
            reader, writer = await _closed_with_bytes_unread(peer, port)
            writer.write(b"more")
            assert writer.transport.is_closing()
            with pytest.raises(ConnectionResetError):
                await bounded(writer.drain())
            writer.close()
    finally:
        await peer.finish()
    assert friendsock.is_friend(writer) == (path == "friend")


async def test_a_transport_sockets_error_shows_the_reset_of_a_close_with_bytes_unread(path):
    """The server closes with bytes of the client's unread, its reading
    paused: as over TCP (whose close is a reset then), the transport's
    socket's SO_ERROR reads ECONNRESET and takes it; reading on finds EOF,
    and the next write loses the connection."""
    peer, port = await _serving("-", path, door="blocking-close-unread")
    try:
        for _ in range(2):  # (a blocking server's first connection is TCP's)
            reader, writer = await _closed_with_bytes_unread(peer, port)
            sock = writer.get_extra_info("socket")
            errors = [sock.getsockopt(socket.SOL_SOCKET, socket.SO_ERROR) for _ in range(2)]
            writer.transport.resume_reading()
            assert await bounded(reader.read()) == b""
            writer.write(b"more")
            with pytest.raises(ConnectionError):
                await bounded(writer.drain())
            writer.close()
    finally:
        await peer.finish()
    assert friendsock.is_friend(writer) == (path == "friend")
    assert errors == [errno.ECONNRESET, 0]


async def test_a_write_after_both_ends_sent_eof_fails(peer_loop, path):
    """Each end half-closed, the server then closed: a write here raises
    as the loop's own transport does after write_eof(), every time (not
    taken as the first write after the other end's close)."""
    peer, port = await _serving(peer_loop, path)
    try:
        reader, writer = await bounded(friendsock.open_connection("127.0.0.1", port))
        writer.write(b"ping")
        writer.write_eof()
        assert await bounded(reader.read()) == b"ping"
        await peer.report()
        for _ in range(2):
            with pytest.raises(RuntimeError, match="write_eof"):
                writer.write(b"late")
        writer.close()
        await bounded(writer.wait_closed())
    finally:
        await peer.finish()


@pytest.mark.asyncio(loop_factories=["asyncio"])  # (uvloop's transport socket refuses shutdown())
async def test_a_read_shutdown_here_leaves_the_other_end_writing(peer_loop, path):
    """``get_extra_info('socket').shutdown(SHUT_RD)`` is TCP's: the other
    end's writes go on (a socketpair's would refuse them, EPIPE), and its
    close is a clean one."""
    async with _connected_to_a_server(peer_loop, path, door="close") as (peer, port, reader, writer):
        writer.get_extra_info("socket").shutdown(socket.SHUT_RD)
        writer.write(b"ping")  # (answered, then closed)
        assert await peer.report() == {"closed": True}


@pytest.mark.asyncio(loop_factories=["asyncio"])  # (uvloop's transport socket refuses shutdown())
async def test_a_shutdown_both_ways_here_leaves_the_connection_open(peer_loop, path):
    """``get_extra_info('socket').shutdown(SHUT_RDWR)`` is TCP's: the other
    end reads EOF; while it holds its end open the connection is not
    over, so another shutdown is taken (TCP's fails, ENOTCONN, only once
    the connection is closed). One of no direction fails EINVAL first."""
    async with _connected_to_a_server(peer_loop, path, door="eof-hold") as (peer, port, reader, writer):
        sock = writer.get_extra_info("socket")
        with pytest.raises(OSError) as refused:
            sock.shutdown(7)
        assert refused.value.errno == errno.EINVAL
        sock.shutdown(socket.SHUT_RDWR)
        assert await peer.report() == {"eof": True}
        sock.shutdown(socket.SHUT_WR)
        assert sock.getpeername() == ("127.0.0.1", port)


@pytest.mark.asyncio(loop_factories=["asyncio"])  # (uvloop's transport socket refuses shutdown())
async def test_a_read_shutdown_here_reads_eof_after_what_came(peer_loop, path):
    """After ``get_extra_info('socket').shutdown(SHUT_RD)``, as over TCP,
    the reader finds what came before, then EOF, and not what the server
    echoes later; the client's writing goes on, the server reads all of it."""
    async with _connected_to_a_server(peer_loop, path) as (peer, port, reader, writer):
        writer.write(b"ping")
        assert await bounded(reader.readexactly(4)) == b"ping"
        writer.get_extra_info("socket").shutdown(socket.SHUT_RD)
        assert await bounded(reader.read()) == b""
        writer.write(b"more")
        writer.write_eof()
        report = await peer.report()
    assert report["sha256"] == hashlib.sha256(b"pingmore").hexdigest()


@pytest.mark.asyncio(loop_factories=["asyncio"])  # (uvloop's transport socket refuses shutdown())
async def test_a_reset_after_a_read_shutdown_is_what_the_read_finds(peer_loop, path):
    """A reset that came after ``get_extra_info('socket').shutdown(SHUT_RD)``,
    while reading was paused, is what reading finds as it resumes, as over
    TCP (where the reset is met before the shut reading's EOF)."""
    async with _connected_to_a_server(peer_loop, path, door="abort-later") as (peer, port, reader, writer):
        writer.write(b"ping")
        assert await bounded(reader.readexactly(4)) == b"ping"
        writer.transport.pause_reading()
        writer.get_extra_info("socket").shutdown(socket.SHUT_RD)
        writer.write(b"more")  # (the server's go-ahead to reset)
        assert await peer.report() == {"aborted": True}
        writer.transport.resume_reading()
        with pytest.raises(ConnectionResetError):
            await bounded(reader.read())


async def test_loop_sendfile_over_a_moved_connection(peer_loop, path, tmp_path):
    """``loop.sendfile()`` sends the file's range as over TCP (asyncio);
    uvloop has none, for TCP or a moved connection alike."""
    payload = random.Random(4).randbytes(3 * SIZE + 17)
    file = tmp_path / "sent"
    file.write_bytes(payload)
    peer, port = await _serving(peer_loop, path)
    try:
        reader, writer = await bounded(friendsock.open_connection("127.0.0.1", port))
        try:
            loop = asyncio.get_running_loop()
            with open(file, "rb") as source:
                if isinstance(loop, uvloop.Loop):
                    with pytest.raises(NotImplementedError):
                        await loop.sendfile(writer.transport, source, 5, SIZE)
                    return
                sent = await bounded(loop.sendfile(writer.transport, source, 5, 2 * SIZE))
                writer.write(b"end")
                writer.write_eof()
                echoed = hashlib.sha256()
                while data := await bounded(reader.read(1 << 16)):
                    echoed.update(data)
                assert sent == 2 * SIZE and source.tell() == 5 + 2 * SIZE
            assert echoed.hexdigest() == hashlib.sha256(payload[5:5 + 2 * SIZE] + b"end").hexdigest()
            assert friendsock.is_friend(writer) == (path == "friend")
        finally:
            writer.close()
            await writer.wait_closed()
    finally:
        await peer.finish()


async def _trio_echoed(stream: Any, payload: bytes, seen: Callable[[Dict[str, Any]], Dict[str, Any]],
                       ) -> Dict[str, Any]:
    """``payload`` sent over the trio ``stream`` while the echo is read,
    then its EOF, then the server's: the echo's SHA-256, the stream's
    names, and what ``seen(names)`` says before it closes."""
    import trio

    names = {"sockname": list(stream.socket.getsockname()), "peername": list(stream.socket.getpeername())}
    echoed = bytearray()

    async def send() -> None:
        await stream.send_all(payload)
        await stream.send_eof()

    with trio.fail_after(20):
        async with stream, trio.open_nursery() as nursery:
            nursery.start_soon(send)
            while data := await stream.receive_some(1 << 16):
                echoed += data
            return {"sha256": hashlib.sha256(echoed).hexdigest(), **names, **seen(names)}


def _trio_echo(port: int, payload: bytes) -> Dict[str, Any]:
    """A trio client: the echo of ``payload`` (see _trio_echoed), and
    whether friendsock.links() says its connection is captured."""
    import trio

    import friendsock.trio

    async def exchange() -> Dict[str, Any]:
        stream = await friendsock.trio.open_tcp_stream("127.0.0.1", port)
        return await _trio_echoed(stream, payload, lambda names: {
            "captured": [link.captured for link in friendsock.links()
                         if list(link.client.address) == names["sockname"]]})

    return cast(Dict[str, Any], trio.run(exchange))


@pytest.mark.parametrize("client", ["blocking", "trio"])
@pytest.mark.usefixtures("socket_patched")
async def test_a_capture_here_shows_a_moved_socket(peer_loop, path, client, tmp_path):
    """A blocking or trio client's connection to a server process, moved,
    is captured as a transport's is: the handshake, each side's bytes, a
    FIN each way, all acknowledged; Wireshark follows it. Over TCP it is
    not in the capture."""
    payload = random.Random(9).randbytes(300_000)
    pcap = str(tmp_path / f"{client}.pcap")
    run = ((lambda port: _blocking_echo(port, payload, "127.0.0.1")) if client == "blocking"
           else (lambda port: _trio_echo(port, payload)))
    with friendsock.capture(pcap) as running:
        ours, theirs = await _on_a_thread_against_a_server(peer_loop, path, run)
    assert ours["sha256"] == theirs["sha256"] == hashlib.sha256(payload).hexdigest()
    streams = read_capture(pcap)
    if path == "tcp":
        assert streams == {} and running.links == 0
        return
    assert running.links == 1
    if client == "trio":
        assert ours["captured"] == [True]  # (links() says so)
    stream = streams[(tuple(ours["sockname"]), tuple(ours["peername"]))]
    assert stream.up.data == payload and stream.down.data == payload
    check_tcp_shape(stream)
    tshark_check(pcap, {0: (payload, payload)})


def _blocking_first_read(port: int) -> str:
    try:
        # (With a timeout the connect reads its result after a wait: a
        # reset that came first is its error, over TCP too.)
        with socket.create_connection(("127.0.0.1", port), timeout=20) as sock:
            return repr(sock.recv(10))
    except OSError as exc:
        return type(exc).__name__


def _trio_first_read(port: int) -> str:
    import trio

    import friendsock.trio

    async def read() -> str:
        try:
            stream = await friendsock.trio.open_tcp_stream("127.0.0.1", port)
        except OSError as exc:  # (trio checks its connect after the reset came: TCP's does so too)
            assert str(exc) == f"all attempts to connect to 127.0.0.1:{port} failed"
            return " ".join(type(error).__name__ for error in exc.__cause__.exceptions)
        async with stream:
            try:
                return repr(await stream.receive_some(10))
            except trio.BrokenResourceError as exc:
                return type(exc.__cause__).__name__

    return trio.run(read)


@pytest.mark.parametrize("server", ["closing", "speaking"])
@pytest.mark.parametrize("client", ["blocking", "trio"])
@pytest.mark.usefixtures("socket_patched")
async def test_a_server_that_offers_nothing_is_not_waited_for(client, server, monkeypatch):
    """A connect to a port a friendsock process published, where what
    accepts offers nothing: the listener closes with the connection in its
    backlog (a server shutting down; the kernel resets it), or a server
    sharing the port speaks first over TCP. The client stops waiting for
    an offer as the reset or the bytes come, however long it would wait
    (here a minute), and reads them, as over TCP."""
    monkeypatch.setattr(friendsock._blocking._across, "OFFER_TIMEOUT", 60.0)
    monkeypatch.setattr(friendsock._trio._across, "OFFER_TIMEOUT", 60.0)
    run = _blocking_first_read if client == "blocking" else _trio_first_read
    peer = await Peer.start("serve", "-", server, env=_environment("friend"))
    try:
        port = int(await peer.line())
        got = await bounded(asyncio.to_thread(run, port), 20)
        assert await peer.report() == ({"closed": True} if server == "closing" else {"said": "hello"})
    finally:
        await peer.finish()
    assert got == ("ConnectionResetError" if server == "closing" else "b'hello'")


def _trio_within_a_deadline(port: int) -> str:
    import trio

    import friendsock.trio

    async def exchange() -> str:
        with trio.fail_after(0.8):  # (sooner than the offer's wait, a second)
            stream = await friendsock.trio.open_tcp_stream("127.0.0.1", port)
        async with stream:
            await stream.send_all(b"ping")
            return (await stream.receive_some(4)).decode()

    return trio.run(exchange)


async def test_a_trio_connect_keeps_its_callers_deadline():
    """A trio connect to a port a friendsock process published, whose
    server offers nothing (it reads first, over TCP): within a deadline
    sooner than its wait for the offer, the connect stops waiting in time
    and returns the TCP connection, as TCP's connect would, instead of
    failing with TooSlowError."""
    peer = await Peer.start("serve", "-", "silent", env=_environment("friend"))
    try:
        port = int(await peer.line())
        got = await bounded(asyncio.to_thread(_trio_within_a_deadline, port), 20)
        assert await peer.report() == {"answered": True}
    finally:
        await peer.finish()
    assert got == "ping"


def _pinged(client: str, port: int) -> str:
    """``ping`` sent to ``port`` and the answer read by a ``client``
    (blocking or trio) of this thread."""
    if client == "blocking":
        with socket.create_connection(("127.0.0.1", port), timeout=20) as sock:
            sock.sendall(b"ping")
            return sock.recv(4).decode()
    import trio

    import friendsock.trio

    async def exchange() -> str:
        async with await friendsock.trio.open_tcp_stream("127.0.0.1", port) as stream:
            await stream.send_all(b"ping")
            return (await stream.receive_some(4)).decode()

    return trio.run(exchange)


@pytest.mark.parametrize("client", ["asyncio", "blocking", "trio"])
@pytest.mark.usefixtures("socket_patched")
async def test_a_port_whose_process_offered_nothing_is_not_waited_on_again(client):
    """A port the table says a live friendsock process serves, where what
    accepts offers nothing and reads first (a process whose listener is
    gone, its pid now another's, or one killed and not yet reaped, with
    a plain server on the port now): the connect waits its second for
    the offer, then goes over TCP, and the slot goes with it, so that no
    later connect there waits."""
    from friendsock._host import LISTENERS, opened_table

    peer = await Peer.start("serve", "-", "silent", env=_environment("friend"))
    try:
        port = int(await peer.line())
        table = opened_table()
        assert table is not None and table.read(LISTENERS, port).pid == peer.process.pid
        if client == "asyncio":
            reader, writer = await bounded(friendsock.open_connection("127.0.0.1", port))
            assert not friendsock.is_friend(writer)
            writer.write(b"ping")
            got = (await bounded(reader.readexactly(4))).decode()
            writer.close()
        else:
            got = await bounded(asyncio.to_thread(_pinged, client, port), 20)
        assert await peer.report() == {"answered": True}
    finally:
        await peer.finish()
    assert got == "ping"
    assert table.read(LISTENERS, port).pid == 0


def _trio_dup(port: int) -> Dict[str, Any]:
    import trio

    import friendsock.trio

    async def exchange() -> Dict[str, Any]:
        stream = await friendsock.trio.open_tcp_stream("127.0.0.1", port)
        async with stream:
            copy = stream.socket.dup()
            with copy:
                await copy.send(b"ping")
                echoed = await stream.receive_some(4)
                found = {"echoed": echoed.decode(), "friend": friendsock.is_friend(copy),
                         "blocking": os.get_blocking(stream.socket.fileno()),
                         "peername": list(copy.getpeername())}
            with trio.move_on_after(0.2):  # (nothing comes: a read that waits, not one that blocks)
                await stream.receive_some(10)
            return found

    return trio.run(exchange)


async def test_a_trio_clients_socket_duplicates(peer_loop, path):
    """``dup()`` of a moved trio socket is one of the same kind, as trio's
    is of a TCP one; neither copy blocks the other's reads."""
    found, theirs = await _on_a_thread_against_a_server(peer_loop, path, _trio_dup)
    port = theirs["sockname"][1]
    assert found == {"echoed": "ping", "friend": path == "friend", "blocking": False,
                     "peername": ["127.0.0.1", port]}


async def test_a_plain_server_on_another_loopback_address_is_not_waited_on():
    """A friendsock server of another process on 127.0.0.1:P, a plain one
    here on 127.0.0.2:P: a connect to the second is TCP's at once (the
    table says the first serves 127.0.0.1 alone), with no wait for an
    offer that would never come."""
    peer, port = await _serving("asyncio", "friend")

    async def hello(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        writer.write(b"plain")
        writer.close()

    plain = await asyncio.start_server(hello, "127.0.0.2", port)
    before = friendsock.stats()
    try:
        reader, writer = await bounded(friendsock.open_connection("127.0.0.2", port))
        assert await bounded(reader.read()) == b"plain"
        writer.close()
        await writer.wait_closed()
        assert fallbacks_since(before) == {"no-listener": 1}
        moved = await _echoed(port, b"ping")  # (and 127.0.0.1's still moves)
        assert moved["friend"] is True
        await peer.report()
    finally:
        plain.close()
        await plain.wait_closed()
        await peer.finish()
