"""A blocking client moved off TCP against one on TCP, under random sequences.

A hypothesis state machine opens two connections from a blocking socket
of this process (``patch_socket()``) to a server process
(``stateful_peer.py``, the server of ``test_stateful``'s machine across
processes): one that moves off TCP between the two processes and one
that stays on TCP. It drives both the same way: on the client,
``sendall()``, reads of each kind that do not wait, ``shutdown()`` each
way, ``getpeername()``, ``SO_ERROR``, ``close()`` and a close with
``SO_LINGER {1, 0}``; on the server, writes, ``write_eof()``,
``close()``, ``abort()`` and pausing its reading. Each client call must
answer the same on both paths (the same bytes, the same error), and the
server ends must see the same: what they read, EOF, how they end.

The bytes in flight each way stay under every buffer's size on both
paths, so that no write waits and what a kernel's buffer sizes decide
(how much a reset leaves) does not come into it. Where a moved
connection answers otherwise by design (docs/differences.md: a reset
that follows a half-close not read yet; the other end's writes once
this end shut down both ways), the machine does not compare.
"""

from __future__ import annotations

import array
import asyncio
import contextlib
import errno
import fcntl
import select
import socket
import struct
import sys
import termios
import time
from typing import Any, Callable, Dict, List, Optional, Tuple

import pytest
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, precondition, rule, run_state_machine_as_test

import friendsock
from friendsock._host import _payoff

from stateful_streams import stream_bytes
from test_stateful import ACROSS_EXAMPLES, QUIET_LIMIT, STEPS, RemoteEnd, ServerProcess, settled

PATHS = ("friend", "tcp")
# Bytes written and not yet read, at most, each way.
IN_FLIGHT = 32 * 1024
# Reads, by what each returns (the bytes, or how many went into a buffer);
# "peek": recv() with MSG_PEEK, which leaves what it returns to be read.
READS = ("recv", "recv_into", "recvfrom", "recvfrom_into", "recvmsg", "peek")

Outcome = Tuple[str, Any]  # ("ok", what it returned) or (the error's type, its errno)
# What a client call meets where it may meet the reset alone, or the EOF
# and the EPIPE TCP's socket holds (see client_fin_uncertain).
_THE_RESET_OR_EOF = [("ok", b""), ("ok", 0), ("ok", "EPIPE"), ("ok", "ECONNRESET"),
                     ("ConnectionResetError", errno.ECONNRESET), ("BrokenPipeError", errno.EPIPE)]


def _read(sock: socket.socket, how: str, size: int) -> bytes:
    """``size`` bytes at most, read without waiting by the read ``how``."""
    timeout = sock.gettimeout()
    sock.settimeout(0)  # (with a timeout, Python waits to read before it reads: MSG_DONTWAIT too)
    try:
        return _read_now(sock, how, size)
    finally:
        sock.settimeout(timeout)


def _read_now(sock: Any, how: str, size: int) -> bytes:
    if how == "recv":
        return sock.recv(size)
    if how == "peek":
        return sock.recv(size, socket.MSG_PEEK)
    if how == "recvfrom":
        data, address = sock.recvfrom(size)
        assert address is None
        return data
    if how == "recvmsg":
        data, ancillary, msg_flags, address = sock.recvmsg(size)
        assert ancillary == [] and msg_flags == 0 and address is None
        return data
    buffer = bytearray(size)
    if how == "recv_into":
        count = sock.recv_into(buffer, size)
    else:
        count, address = sock.recvfrom_into(buffer, size)
        assert address is None
    return bytes(buffer[:count])


# TCP's states in which what this end sent may wait to be acknowledged
# (not once a reset ended the connection: what it held then never will be).
_SENDING_STATES = (1, 4, 8, 9, 11)  # ESTABLISHED, FIN_WAIT1, CLOSE_WAIT, LAST_ACK, CLOSING


def _unacknowledged(sock: Any) -> bool:
    """Whether bytes or the FIN a TCP socket sent wait for the other
    kernel's ACK: Nagle's algorithm holds a small write back until the
    one before it is acknowledged, which a delayed ACK may leave for
    later than the next step."""
    if sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_INFO, 1)[0] not in _SENDING_STATES:
        return False
    queued = array.array("i", [0])
    fcntl.ioctl(sock.fileno(), termios.TIOCOUTQ, queued)  # (sent or not, not acknowledged)
    return queued[0] > 0


def _moved_to_client(sock: Any) -> Optional[int]:
    """What ``friendsock.links()`` says was moved to the client ``sock``."""
    sockname = sock.getsockname()
    for link in friendsock.links():
        if link.peer_pid is not None and tuple(link.client.address) == sockname:
            return link.to_client.moved
    return None


class BlockingVsTcp(RuleBasedStateMachine):
    loop: asyncio.AbstractEventLoop  # set by the test function
    server: ServerProcess

    def __init__(self) -> None:
        super().__init__()
        self.changed = asyncio.Event()
        self.server.changed = self.changed
        self.socks: Dict[str, Any] = {}
        self.ends: Dict[str, RemoteEnd] = {}
        self.sent = 0  # bytes the client's sendall() took, on both paths
        self.read = dict.fromkeys(PATHS, 0)  # bytes the client read
        self.server_wrote = 0  # bytes the server's write() took, on both paths
        self.client_shut: Dict[str, bool] = {"read": False, "write": False}
        self.client_closed = False
        self.client_reset = False  # closed with SO_LINGER {1, 0}, or with bytes unread
        self.sent_after_server_close = False  # (which the server's kernel answers with a reset)
        self.eof_read = dict.fromkeys(PATHS, False)  # a client read found the server's EOF
        # A reset that followed a half-close the other end had not read: a
        # moved end meets the reset alone, where TCP's reads the EOF (and
        # holds EPIPE, not ECONNRESET): docs/differences.md.
        self.client_fin_uncertain = False
        self.server_fin_uncertain = False
        self.server_eof = False
        self.server_closed = False
        self.server_paused = False
        self.log: List[str] = []

    def run(self, coro: Any) -> Any:
        return self.loop.run_until_complete(asyncio.wait_for(coro, 30))

    @initialize(keep_open=st.booleans())
    def connect(self, keep_open: bool) -> None:
        self.run(self.server.call("keep_open", value=keep_open))
        for path in PATHS:
            after = max(self.server.ends, default=0)
            sock = self._open(self.server.ports[path])
            self.socks[path] = sock
            assert self._moved(sock) is (path == "friend")
            self.ends[path] = self.run(self.server.accepted(path, after))

    def teardown(self) -> None:
        try:
            if self.ends and not self.client_closed:
                for sock in self.socks.values():
                    sock.close()
        finally:
            for end in self.ends.values():
                if not end.lost:
                    with contextlib.suppress(Exception):  # (the machine's failure is the one to report)
                        end.transport.abort()
            if self.ends:
                self.run(self.server.call("sync"))

    # -- the client's calls ---------------------------------------------------
    def _open(self, port: int) -> Any:
        """A client socket connected to ``port``."""
        return socket.create_connection(("127.0.0.1", port), timeout=QUIET_LIMIT)

    def _moved(self, sock: Any) -> bool:
        """Whether ``sock``'s connection moved off TCP."""
        return friendsock.is_friend(sock)

    def _read(self, sock: Any, how: str, size: int) -> bytes:
        """``size`` bytes at most, read from ``sock`` without waiting by the read ``how``."""
        return _read(sock, how, size)

    # -- helpers ------------------------------------------------------------
    def _each(self, what: str, call: Callable[[Any, str], Any]) -> Dict[str, Outcome]:
        """``call(sock, path)`` on each path's client socket: what each
        answered, which must be the same (but where the client meets the
        reset alone, see client_fin_uncertain)."""
        outcome: Dict[str, Outcome] = {}
        for path in PATHS:
            try:
                outcome[path] = ("ok", call(self.socks[path], path))
            except OSError as exc:
                outcome[path] = (type(exc).__name__, exc.errno)
        self.log.append(f"{what}: {outcome}")
        agree = outcome["friend"] == outcome["tcp"] or (
            self.client_fin_uncertain and all(found in _THE_RESET_OR_EOF for found in outcome.values()))
        assert agree, (what, outcome, self._dump())
        return outcome

    def _on_server(self, what: str, op: str, **fields: Any) -> Dict[str, Optional[str]]:
        """``op`` on each path's server end; each must succeed or fail alike."""
        outcome: Dict[str, Optional[str]] = {}
        for path, end in self.ends.items():
            try:
                self.run(self.server.call(op, end.transport.serial, **fields))
                outcome[path] = None
            except Exception as exc:  # noqa: BLE001 - compared below
                outcome[path] = type(exc).__name__
        self.log.append(f"server {what}: {outcome}")
        # (Where the moved end met the reset alone, it is gone; TCP's is not.)
        assert outcome["friend"] == outcome["tcp"] or self.server_fin_uncertain, (what, outcome, self._dump())
        return outcome

    def _server_gone(self) -> bool:
        """Whether the server closed its ends (or they closed at EOF)."""
        return self.server_closed or all(end.lost for end in self.ends.values())

    def _server_unread(self) -> int:
        """The client's bytes the server has not read yet, on the path with more."""
        return self.sent - min(end.received for end in self.ends.values())

    def _client_unread(self) -> int:
        """The server's bytes the client has not read yet, on the path with more."""
        return self.server_wrote - min(self.read.values())

    def _dump(self) -> str:
        lines = list(self.log[-12:])
        for path, end in self.ends.items():
            lines.append(f"{path} server end: {end.events} {end.received} bytes; client read {self.read[path]}")
        return "\n".join(lines)

    # -- the client's rules ---------------------------------------------------
    @precondition(lambda self: self.ends and not self.client_closed)
    @rule(size=st.one_of(st.integers(0, 100), st.integers(100, IN_FLIGHT)))
    def send(self, size: int) -> None:
        if self.server_closed:
            # Writing into a closed end: TCP takes the first write (the
            # other kernel answers it with a reset); a small one keeps to
            # that rule, where a large one may meet the reset midway.
            size = min(size, 1000)
        size = min(size, IN_FLIGHT - self._server_unread())
        data = stream_bytes(self.sent, size)
        outcome = self._each(f"sendall({size})", lambda sock, path: sock.sendall(data))
        if outcome["tcp"][0] == "ok":
            self.sent += size
            self.sent_after_server_close |= self._server_gone() and size > 0

    @precondition(lambda self: self.ends and not self.client_closed)
    @rule(how=st.sampled_from(READS), size=st.sampled_from([1, 7, 100, 4096, IN_FLIGHT]))
    def read_some(self, how: str, size: int) -> None:
        def read(sock: Any, path: str) -> bytes:
            data = self._read(sock, how, size)
            assert data == stream_bytes(self.read[path], len(data)), (path, "not the stream's bytes")
            if how != "peek":
                self.read[path] += len(data)
            self.eof_read[path] |= not data and size > 0
            return data

        self._each(f"{how}({size})", read)
        # links() counts each byte read once (a peek none).
        assert _moved_to_client(self.socks["friend"]) == self.read["friend"], self._dump()

    @precondition(lambda self: self.ends and not self.client_closed)
    @rule(how=st.sampled_from([socket.SHUT_RD, socket.SHUT_WR, socket.SHUT_RDWR]))
    def shutdown(self, how: int) -> None:
        outcome = self._each(f"shutdown({how})", lambda sock, path: sock.shutdown(how))
        if outcome["tcp"][0] == "ok":
            self.client_shut["read"] |= how != socket.SHUT_WR
            self.client_shut["write"] |= how != socket.SHUT_RD

    @precondition(lambda self: self.ends and not self.client_closed)
    @rule()
    def getpeername(self) -> None:
        self._each("getpeername()", lambda sock, path: sock.getpeername() == (
            "127.0.0.1", self.server.ports[path]))

    @precondition(lambda self: self.ends and not self.client_closed)
    @rule()
    def so_error(self) -> None:
        self._each("SO_ERROR", lambda sock, path: errno.errorcode.get(
            sock.getsockopt(socket.SOL_SOCKET, socket.SO_ERROR), 0))

    @precondition(lambda self: self.ends and not self.client_closed)
    @rule(linger=st.booleans())
    def close(self, linger: bool) -> None:
        if linger:
            self._each("SO_LINGER {1, 0}", lambda sock, path: sock.setsockopt(
                socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0)))
        unread = {path: self.read[path] < self.server_wrote for path in PATHS}
        self.client_reset = linger or any(unread.values())
        if self.client_reset and self.client_shut["write"]:
            self.server_fin_uncertain = not all(end.eof for end in self.ends.values())
        self._each("close()", lambda sock, path: sock.close())
        self.client_closed = True

    # -- the server's rules ---------------------------------------------------
    @precondition(lambda self: self.ends and not self.server_closed)
    @rule(size=st.one_of(st.integers(0, 100), st.integers(100, IN_FLIGHT)))
    def server_write(self, size: int) -> None:
        if self.client_shut["read"] and self.client_shut["write"] and not self.client_closed:
            # TCP's client resets at the first byte that comes once it has
            # shut both ways; a moved one does not (docs/differences.md).
            return
        if self.client_closed:
            size = min(size, 1000)  # (see send)
        size = min(size, IN_FLIGHT - self._client_unread())
        if self._on_server(f"write({size})", "write", size=size, kind="bytes")["tcp"] is None:
            self.server_wrote += size

    @precondition(lambda self: self.ends and not self.server_closed and not self.server_eof)
    @rule()
    def server_write_eof(self) -> None:
        self._on_server("write_eof()", "call", method="write_eof", args=[])
        self.server_eof = True

    @precondition(lambda self: self.ends and not self.server_closed)
    @rule(aborted=st.booleans())
    def server_close(self, aborted: bool) -> None:
        method = "abort" if aborted else "close"
        unread = any(end.received < self.sent for end in self.ends.values())
        if self.server_eof and (aborted or unread):
            self.client_fin_uncertain = not all(self.eof_read.values())
        self._on_server(f"{method}()", "call", method=method, args=[])
        self.server_closed = True

    @precondition(lambda self: self.ends)
    @rule(paused=st.booleans())
    def server_reading(self, paused: bool) -> None:
        method = "pause_reading" if paused else "resume_reading"
        if self.server_closed or (not paused and any(end.eof for end in self.ends.values())):
            return  # (asyncio's own transport would deliver EOF again)
        self._on_server(f"{method}()", "call", method=method, args=[])
        self.server_paused = paused

    # -- settling and comparing -------------------------------------------------
    def _unsettled(self, end: RemoteEnd) -> Optional[str]:
        """What must still happen at a server end, if anything."""
        if end.lost or self.server_closed or self.server_paused:
            return None
        if self.client_reset:
            # (An end that read EOF reads no more: a reset after it waits
            # for its next write, as over TCP.)
            return None if end.eof else "the reset"
        if end.received < self.sent:
            return f"{end.received}/{self.sent} bytes"
        if (self.client_shut["write"] or self.client_closed) and not end.eof:
            return "EOF"
        return None

    async def _settle(self) -> None:
        await settled(lambda: self.server.call("sync"),
                      lambda: {path: self._unsettled(end) for path, end in self.ends.items()},
                      self.changed, self._dump)

    def _client_caught_up(self, path: str) -> bool:
        """Whether what the server did has reached the client's socket on
        ``path``: its bytes, its FIN, the reset that answered a write after
        its close; and the client's bytes and FIN, the server's kernel
        (where the server's close would otherwise find other bytes unread,
        or a connection not over yet)."""
        sock = self.socks[path]
        if path == "tcp" and _unacknowledged(sock):
            # (Its bytes and FIN at the server's kernel before the server
            # closes: there, over the pair, they are at once.)
            return False
        fd = sock.fileno()
        poller = select.poll()
        poller.register(fd, select.POLLIN | select.POLLRDHUP)
        events = dict(poller.poll(0)).get(fd, 0)
        if self.sent_after_server_close and path == "tcp":
            return bool(events & (select.POLLHUP | select.POLLERR))
        if self.server_eof or self._server_gone():
            return bool(events & (select.POLLRDHUP | select.POLLHUP | select.POLLERR))
        queued = array.array("i", [0])
        fcntl.ioctl(fd, termios.FIONREAD, queued)
        return queued[0] >= self.server_wrote - self.read[path]

    def _until_the_client_caught_up(self) -> None:
        """Loopback TCP hands a segment on as it is sent, but a busy machine
        may leave that to its softirq thread, later: wait for it (bounded)."""
        if self.client_closed:
            return
        deadline = time.monotonic() + QUIET_LIMIT
        for path, sock in self.socks.items():
            while not self._client_caught_up(path):
                assert time.monotonic() < deadline, f"the server's doing not at the client ({path})\n{self._dump()}"
                poller = select.poll()
                poller.register(sock.fileno(), select.POLLIN | select.POLLRDHUP)
                poller.poll(10)

    @invariant()
    def server_ends_agree(self) -> None:
        if not self.ends:
            return
        self.run(self._settle())
        self._until_the_client_caught_up()
        ends = self.ends
        for path, end in ends.items():
            # A prefix of what was sent: no byte lost, repeated or reordered.
            assert end.intact and end.received <= self.sent, (path, self._dump())
        if not self.client_reset:
            assert ends["friend"].received == ends["tcp"].received, self._dump()
        events = {path: [e for e in end.events if e != "data"] for path, end in ends.items()}
        if self.client_reset:
            # How much came before the reset is the kernel's to say.
            events = {path: [e for e in found if e != "eof"] for path, found in events.items()}
        if self.server_fin_uncertain:
            # The EOF (and, kept open, no more) against the reset alone.
            events = {path: [e for e in found if e != "eof" and not e.startswith("lost")]
                      for path, found in events.items()}
        assert events["friend"] == events["tcp"], self._dump()


def run_against_a_server_process(machine: Any, server_loop: str) -> None:
    """``machine`` (a :class:`BlockingVsTcp`) run against a server process
    on ``server_loop``, every connection moved however short; neither
    process's loop may have met an error it did not handle."""
    monkeypatch = pytest.MonkeyPatch()
    monkeypatch.setattr(_payoff, "SHORT_RUN", sys.maxsize)  # (see _payoff)
    loop = asyncio.new_event_loop()
    errors: List[dict] = []
    loop.set_exception_handler(lambda _loop, context: errors.append(context))
    asyncio.set_event_loop(loop)
    try:
        server = loop.run_until_complete(ServerProcess.start(server_loop))
        try:
            machine.loop = loop
            machine.server = server
            run_state_machine_as_test(machine, settings=settings(
                max_examples=ACROSS_EXAMPLES, stateful_step_count=STEPS, deadline=None,
                suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much]))
        finally:
            loop.run_until_complete(server.finish())
    finally:
        asyncio.set_event_loop(None)
        loop.close()
        monkeypatch.undo()
    assert errors == []
    assert server.loop_errors == []


@pytest.mark.timeout(600)  # only a failing run, shrinking, takes long
@pytest.mark.parametrize("server_loop", ["asyncio", "uvloop"])
def test_a_blocking_client_moved_between_processes_behaves_as_tcp(server_loop):
    friendsock.patch_socket()
    try:
        run_against_a_server_process(BlockingVsTcp, server_loop)
    finally:
        friendsock.unpatch_socket()
