"""The friend path against real TCP, side by side, under random sequences.

A hypothesis state machine opens a friend link and a real TCP connection
and drives both the same way: writes of 0 B to 1 MiB (bytes, bytearray,
memoryview), pause/resume reading on either end, write_eof, close, abort,
set_write_buffer_limits, SO_RCVBUF/SO_SNDBUF. After every step both
connections are let settle, and what each reader received and the order of
its callbacks must be the same on both.

What TCP decides by its kernel's buffer sizes (how much an abort or a reset
leaves, when pause_writing comes, whether a close waits for a paused peer)
is not compared exactly; there the friend reader's bytes must still be a
prefix of what was written, as over TCP.

The same machine runs with each connection's server end in another
process (:class:`AcrossVsTcp`, ``stateful_peer.py``): a connection moved
off TCP between two processes against a TCP one between the same two.
"""

from __future__ import annotations

import asyncio
import builtins
import dataclasses
import itertools
import json
import os
import socket
import sys
from pathlib import Path
from typing import Any, Awaitable, Callable, Dict, List, Optional

import pytest
import uvloop
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import (
    RuleBasedStateMachine,
    initialize,
    invariant,
    precondition,
    rule,
    run_state_machine_as_test,
)

import friendsock
from friendsock._host import _payoff

from stateful_streams import MiB, Rec, stream_bytes

PATHS = ("friend", "tcp")
SIDES = ("client", "server")
PEER = {"client": "server", "server": "client"}
# Wait this long, at most, for the next callback while settling (a bug shows
# as "no progress" after it; shrinking that example repeats the wait).
QUIET_LIMIT = 5.0
# Unread bytes beyond which a clean close's FIN may not have reached the
# reader when a reset follows (TCP's window decides; ours is rcvbuf).
UNCERTAIN_IN_FLIGHT = 32 * 1024
# FRIENDSOCK_STATEFUL_EXAMPLES / _STEPS run it longer (e.g. 2000 / 40).
EXAMPLES = int(os.environ.get("FRIENDSOCK_STATEFUL_EXAMPLES", "250"))
STEPS = int(os.environ.get("FRIENDSOCK_STATEFUL_STEPS", "30"))
# Across processes (FRIENDSOCK_STATEFUL_ACROSS_EXAMPLES): each call to the
# server end is a round trip to its process.
ACROSS_EXAMPLES = int(os.environ.get("FRIENDSOCK_STATEFUL_ACROSS_EXAMPLES", "120"))
SERVER_PROCESS = str(Path(__file__).with_name("stateful_peer.py"))


@dataclasses.dataclass
class Side:
    """What the machine did to one end (the same on both paths)."""

    written: int = 0  # bytes accepted by write()
    deliverable: Optional[int] = None  # written when the peer closed
    paused: bool = False
    eof_sent: bool = False
    socket_shut: bool = False  # its socket's shutdown(SHUT_WR): the transport's writes fail
    closed: bool = False  # close() or abort()
    aborted: bool = False

    def delivered_target(self) -> int:
        return self.written if self.deliverable is None else self.deliverable


class FriendVsTcp(RuleBasedStateMachine):
    loop: asyncio.AbstractEventLoop  # set by the test function

    def __init__(self) -> None:
        super().__init__()
        self.changed = asyncio.Event()
        self.ends: Dict[str, Dict[str, Rec]] = {}
        self.sides = {side: Side() for side in SIDES}
        # Per path: whether each side reset the connection (closed with
        # unread bytes), which leaves its peer a prefix, then an error.
        self.reset_by: Dict[str, Dict[str, bool]] = {p: dict.fromkeys(SIDES, False) for p in PATHS}
        # Sides whose outcome differed only in how the loop reports it.
        self.excused: Dict[str, bool] = dict.fromkeys(SIDES, False)
        # Sides whose peer closed while much of the peer's stream was still
        # unread here: whether the FIN got in before a later reset (EOF and
        # EPIPE, or ECONNRESET and fewer bytes) is up to TCP's window.
        self.fin_uncertain: Dict[str, bool] = dict.fromkeys(SIDES, False)

    def run(self, coro):
        return self.loop.run_until_complete(asyncio.wait_for(coro, 30))

    # -- setup --------------------------------------------------------------
    @initialize(keep_open=st.booleans())
    def connect(self, keep_open: bool) -> None:
        self.keep_open = keep_open
        for path in PATHS:
            self.ends[path] = self.run(self._open(path == "friend", keep_open))
        # Each end's SO_RCVBUF as the connection began (the rules only grow it).
        self.first_rcvbuf = {side: self.ends["tcp"][side].transport.get_extra_info("socket").getsockopt(
            socket.SOL_SOCKET, socket.SO_RCVBUF) for side in SIDES}

    async def _open(self, friends: bool, keep_open: bool) -> Dict[str, Rec]:
        made: List[Rec] = []

        def factory() -> Rec:
            made.append(Rec(keep_open, self.changed))
            return made[-1]

        server = await friendsock.create_server(factory, "127.0.0.1", 0, friends=friends)
        try:
            port = server.sockets[0].getsockname()[1]
            transport, client = await friendsock.create_connection(
                lambda: Rec(keep_open, self.changed), "127.0.0.1", port, friends=friends
            )
            assert friendsock.is_friend(transport) is friends
            while not made:
                self.changed.clear()
                await asyncio.wait_for(self.changed.wait(), QUIET_LIMIT)
        finally:
            server.close()
        return {"client": client, "server": made[0]}

    def teardown(self) -> None:
        if not self.ends:
            return
        try:
            # Let everything flush: both ends read, then close.
            for side in SIDES:
                self.resume_reading(side)
            self.settle()
            self.check_same()
            for side in SIDES:
                if not self.sides[side].closed:
                    self.close(side)
            self.settle(until_lost=True)
            self.check_same()
        finally:
            for ends in self.ends.values():
                for rec in ends.values():
                    if rec.transport is not None and not rec.lost:
                        rec.transport.abort()
            self.run(self._spin(3))

    async def _spin(self, turns: int) -> None:
        for _ in range(turns):
            await asyncio.sleep(0)

    # -- helpers ------------------------------------------------------------
    def _each(self, side: str, method: str, *args, equivalent=None) -> Dict[str, Optional[type]]:
        """Call ``method`` on ``side``'s transport on both paths; the
        exception type each raised (None: none). They must agree, unless
        ``equivalent(outcome, side)`` says the difference is only how a
        loop reports the same thing."""
        outcome: Dict[str, Optional[type]] = {}
        for path in PATHS:
            try:
                getattr(self.ends[path][side].transport, method)(*args)
                outcome[path] = None
            except Exception as exc:  # noqa: BLE001 - compared below
                outcome[path] = type(exc)
        if outcome["friend"] != outcome["tcp"]:
            assert equivalent is not None and equivalent(outcome, side), (method, side, outcome)
            self.excused[side] = True
        return outcome

    def _fin_may_wait(self, side: str) -> bool:
        """Whether a FIN between ``side`` and its peer may wait behind bytes
        its reader has not taken: more of them unread there than half the
        reader's SO_RCVBUF, the least its window holds."""
        for writer, reader in ((side, PEER[side]), (PEER[side], side)):
            unread = self.sides[writer].written - self.ends["tcp"][reader].received
            if unread > self.first_rcvbuf[reader] // 2:
                return True
        return False

    def _lost_anywhere(self, side: str) -> bool:
        return any(self.ends[path][side].lost for path in PATHS)

    def _eof_anywhere(self, side: str) -> bool:
        return any(self.ends[path][side].eof for path in PATHS)

    # -- rules --------------------------------------------------------------
    sides = st.sampled_from(SIDES)

    @rule(
        side=sides,
        size=st.one_of(st.just(0), st.integers(1, 200), st.integers(200, 64 * 1024),
                       st.integers(64 * 1024, MiB)),
        kind=st.sampled_from(["bytes", "bytearray", "memoryview"]),
    )
    def write(self, side: str, size: int, kind: str) -> None:
        me = self.sides[side]
        # uvloop's own transport raises after connection_lost; asyncio's and
        # ours drop the write: not a friend/TCP difference.
        if me.closed or me.socket_shut or self._lost_anywhere(side):
            return
        peer = self.sides[PEER[side]]
        if peer.closed:
            # Writing into a closed peer: over TCP, whether the error comes
            # on the first write or the next depends on how much the kernel
            # took; small writes keep it to the rule (first taken, next fails).
            size = min(size, 1000)
        raw = stream_bytes(me.written, size)
        data = raw if kind == "bytes" else bytearray(raw) if kind == "bytearray" else memoryview(raw)
        outcome = self._each(side, "write", data)
        if outcome["friend"] is None:
            me.written += size

    @precondition(lambda self: self.ends)
    @rule(side=sides)
    def pause_reading(self, side: str) -> None:
        if self.sides[side].closed:
            return
        self._each(side, "pause_reading")
        self.sides[side].paused = True

    @precondition(lambda self: self.ends)
    @rule(side=sides)
    def resume_reading(self, side: str) -> None:
        # After EOF asyncio's own transport would deliver EOF a second time
        # on resume (it re-adds the reader); not what TCP does.
        if self.sides[side].closed or self._eof_anywhere(side):
            return
        self._each(side, "resume_reading")
        self.sides[side].paused = False

    @precondition(lambda self: self.ends)
    @rule(side=sides)
    def write_eof(self, side: str) -> None:
        if self.sides[side].closed or self._lost_anywhere(side):
            return  # (uvloop's own transport raises once lost, as for write)
        self._each(side, "write_eof", equivalent=self._write_eof_equivalent)
        self.sides[side].eof_sent = True

    def _write_eof_equivalent(self, outcome: Dict[str, Optional[type]], side: str) -> bool:
        if outcome == {"friend": None, "tcp": OSError} and self._fin_may_wait(side):
            # TCP's socket was closed (ENOTCONN): both FINs arrived. With
            # that much unread ahead of one a friend takes it for not
            # arrived yet, and the shutdown goes through
            # (friendsock._core._link.fin_arrived).
            return True
        # After a reset, shutdown() fails with ENOTCONN: asyncio's transport
        # (and ours) raise it from write_eof(), uvloop's reports it to
        # connection_lost() instead.
        if not self._on_uvloop(side):
            return False
        if outcome != {"friend": OSError, "tcp": None}:
            return False
        self.run(self._until_lost(self.ends["tcp"][side]))
        if self.ends["tcp"][side].events[-1] != "lost:OSError":
            return False
        # uvloop's transport is gone; let ours follow, so the two go on alike.
        self.ends["friend"][side].transport.abort()
        self.sides[side].closed = True
        return True

    def _on_uvloop(self, side: str) -> bool:
        """Whether ``side``'s ends run on uvloop."""
        return isinstance(self.loop, uvloop.Loop)

    async def _until_lost(self, rec: Rec) -> None:
        """Until ``rec`` was told its connection was lost, or it is quiet
        for ``QUIET_LIMIT``."""
        await self._spin(2)
        while not rec.lost:
            self.changed.clear()
            try:
                await asyncio.wait_for(self.changed.wait(), QUIET_LIMIT)
            except asyncio.TimeoutError:
                return

    def _closing(self, side: str, method: str) -> None:
        me, peer = self.sides[side], self.sides[PEER[side]]
        if me.closed:
            return
        for path in PATHS:
            # Unread bytes at close: the kernel answers with a reset.
            unread = self.ends[path][side].received < peer.delivered_target()
            self.reset_by[path][side] = unread and not self.ends[path][side].lost
        if self.reset_by["friend"][side] != self.reset_by["tcp"][side]:
            # Only whether this end learnt of its peer's reset yet differs:
            # a paused end learns of it through a write still buffered, and
            # TCP's sizes decide whether there is one (see _comparable_events).
            cut_off = peer.aborted or any(self.reset_by[p][PEER[side]] for p in PATHS)
            assert me.paused and cut_off, (side, self.reset_by, self._dump())
            self.excused[side] = True
        in_flight = max(me.written - self.ends[path][PEER[side]].received for path in PATHS)
        if in_flight > UNCERTAIN_IN_FLIGHT:
            self.fin_uncertain[PEER[side]] = True
        self._each(side, method)
        me.closed = True
        me.aborted = method == "abort"
        if peer.deliverable is None:
            peer.deliverable = peer.written

    @precondition(lambda self: self.ends)
    @rule(side=sides)
    def shutdown_socket(self, side: str) -> None:
        """``get_extra_info('socket').shutdown(SHUT_WR)``: EOF to the other
        end, as write_eof() (the transport knows nothing of it)."""
        me = self.sides[side]
        if self._on_uvloop(side) or me.closed or me.eof_sent or self._lost_anywhere(side):
            return  # (uvloop's transport socket refuses shutdown())
        outcome: Dict[str, Optional[type]] = {}
        for path in PATHS:
            try:
                self.ends[path][side].transport.get_extra_info("socket").shutdown(socket.SHUT_WR)
                outcome[path] = None
            except OSError as exc:
                outcome[path] = type(exc)
        assert outcome["friend"] == outcome["tcp"], (side, outcome)
        me.eof_sent = me.socket_shut = True

    @precondition(lambda self: self.ends)
    @rule(side=sides)
    def close(self, side: str) -> None:
        self._closing(side, "close")

    @precondition(lambda self: self.ends)
    @rule(side=sides)
    def abort(self, side: str) -> None:
        self._closing(side, "abort")

    @precondition(lambda self: self.ends)
    @rule(side=sides, high=st.integers(0, 256 * 1024), low_fraction=st.floats(0, 1))
    def set_write_buffer_limits(self, side: str, high: int, low_fraction: float) -> None:
        if self._lost_anywhere(side):
            return  # (uvloop's own transport raises once lost)
        self._each(side, "set_write_buffer_limits", high, int(high * low_fraction))

    @precondition(lambda self: self.ends)
    @rule(side=sides, option=st.sampled_from([socket.SO_RCVBUF, socket.SO_SNDBUF]),
          size=st.sampled_from([4096, 64 * 1024, 256 * 1024, MiB, 4 * MiB]))
    def setsockopt(self, side: str, option: int, size: int) -> None:
        if self.sides[side].closed or self._lost_anywhere(side):
            return  # TCP closes the socket with the transport; a friend's may stay
        socks = {path: self.ends[path][side].transport.get_extra_info("socket") for path in PATHS}
        shrinks = socks["tcp"].getsockopt(socket.SOL_SOCKET, option) >= 2 * size  # (doubled)
        if option == socket.SO_RCVBUF and shrinks:
            # Shrinking a receive buffer below the window TCP already offered
            # makes the kernel drop data and wait for retransmission timers:
            # real, but seconds slow. Only grow it.
            return
        if option == socket.SO_SNDBUF and shrinks:
            # Bytes the kernel took stay taken when SO_SNDBUF shrinks; the
            # friend accounting moves them back into the writer's own buffer
            # (a known difference). Shrink only with nothing in flight.
            unread = [self.ends[p][PEER[side]].received < self.sides[side].written for p in PATHS]
            if any(unread):
                return
        for sock in socks.values():
            sock.setsockopt(socket.SOL_SOCKET, option, size)

    # -- settling and comparing ---------------------------------------------
    def _unsettled(self, path: str, until_lost: bool) -> List[str]:
        """What must still happen on ``path`` (path-independent rules)."""
        ends = self.ends[path]
        waiting: List[str] = []
        for writer, reader in (("client", "server"), ("server", "client")):
            w, r = self.sides[writer], self.sides[reader]
            rec = ends[reader]
            if rec.lost or r.closed or r.paused or rec.eof:
                continue
            if w.aborted or self.reset_by[path][writer]:
                # What is left of the stream, then EOF or the reset.
                waiting.append(f"{reader}: end of a cut stream")
            elif rec.received < w.delivered_target():
                waiting.append(f"{reader}: {rec.received}/{w.delivered_target()} bytes")
            elif w.eof_sent or w.closed:
                waiting.append(f"{reader}: EOF")
        for side in SIDES:
            me, peer = self.sides[side], self.sides[PEER[side]]
            rec = ends[side]
            if rec.lost or not me.closed:
                continue
            # A close waits for its buffer to flush: not while the peer
            # is paused (and alive) on the other end.
            peer_rec = ends[PEER[side]]
            if me.aborted or until_lost or not peer.paused or peer.closed or peer_rec.lost:
                waiting.append(f"{side}: connection_lost")
        return waiting

    def settle(self, until_lost: bool = False) -> None:
        self.run(self._settle(until_lost))

    async def _settle(self, until_lost: bool) -> None:
        await settled(lambda: self._spin(2), lambda: {path: self._unsettled(path, until_lost) for path in PATHS},
                      self.changed, self._dump)
        await self._quiet()

    async def _quiet(self) -> None:
        """Until what follows at once has happened (a close's connection_lost)."""
        await self._spin(2)

    def _dump(self) -> str:
        lines = [f"sides: {self.sides}", f"reset_by: {self.reset_by}"]
        for path in PATHS:
            for side in SIDES:
                rec = self.ends[path][side]
                t = rec.transport
                state = ("(in the server process)" if isinstance(t, RemoteTransport)
                         else f"closing={t.is_closing()} bufsize={t.get_write_buffer_size()}")
                lines.append(f"{path} {side}: {rec.events} {rec.received} bytes; {state}")
        return "\n".join(lines)

    def _comparable_events(self, path: str, side: str) -> List[str]:
        events = list(self.ends[path][side].events)
        me, peer = self.sides[side], self.sides[PEER[side]]
        if self.excused[side]:
            return [e for e in events if not e.startswith("lost")]
        if self.fin_uncertain[side]:
            # Only that it ends is certain (settle(until_lost) sees to it).
            return [e for e in events if e != "eof" and not e.startswith("lost")]
        if events and events[-1].startswith("lost"):
            # Closed by the test, or by itself at the peer's EOF (keep_open
            # False).
            closed = me.closed or (not self.keep_open and "eof" in events)
            if closed and not me.aborted and peer.paused and not peer.closed:
                # Whether a close waited for the paused peer depends on how
                # much the kernel took: only at the end is it the same.
                events.pop()
            elif me.paused and not me.closed and self.reset_by[path][PEER[side]]:
                # A paused end learns of the peer's reset only through a
                # write still buffered, and TCP sizes decide if there is one.
                events.pop()
        return events

    @invariant()
    def check_same(self) -> None:
        if not self.ends:
            return
        self.settle()
        for side in SIDES:
            writer = self.sides[PEER[side]]
            target = writer.delivered_target()
            cut = (writer.aborted or self.fin_uncertain[side]
                   or any(self.reset_by[p][PEER[side]] for p in PATHS))
            got = {path: self.ends[path][side] for path in PATHS}
            for path, rec in got.items():
                # A prefix of what was written: no byte lost, repeated or reordered.
                assert rec.intact and rec.received <= target, (path, side, rec.received, target)
            if not cut and not self.sides[side].paused and not self.sides[side].closed:
                if not any(self.ends[p][side].lost for p in PATHS):
                    assert got["friend"].received == got["tcp"].received, (
                        side, got["friend"].received, got["tcp"].received)
            events = {path: self._comparable_events(path, side) for path in PATHS}
            if cut:
                # How much arrives before the end differs: "data" may be
                # missing on one; the rest must agree.
                events = {p: [e for e in ev if e != "data"] for p, ev in events.items()}
            assert events["friend"] == events["tcp"], (side, events, self._dump())


async def settled(turn: Callable[[], Awaitable[Any]], waiting: Callable[[], Dict[str, Any]],
                  changed: asyncio.Event, dump: Callable[[], str]) -> None:
    """Until, after a ``turn()``, ``waiting()`` finds nothing left to wait
    for on any path; a failure once nothing is ``changed`` for
    QUIET_LIMIT, with what it still waited for and ``dump()``."""
    while True:
        await turn()
        left = waiting()
        if not any(left.values()):
            return
        changed.clear()
        try:
            await asyncio.wait_for(changed.wait(), QUIET_LIMIT)
        except asyncio.TimeoutError:
            raise AssertionError(f"no progress; still waiting for {left}\n{dump()}") from None


class ServerProcess:
    """The server ends of :class:`AcrossVsTcp`, in another process
    (``stateful_peer.py``): what it tells of each, read as it comes, and
    the calls made there, each answered in turn."""

    def __init__(self, process: asyncio.subprocess.Process, kind: str, ports: Dict[str, int]) -> None:
        self.process = process
        self.kind = kind
        self.ports = ports
        self.loop = asyncio.get_running_loop()
        self.ends: Dict[int, RemoteEnd] = {}
        self.replies: Dict[int, asyncio.Future] = {}
        self.ids = itertools.count()
        self.loop_errors: List[str] = []
        self.changed = asyncio.Event()  # (the running machine's, see AcrossVsTcp)
        self.reading = asyncio.ensure_future(self._read())

    @classmethod
    async def start(cls, kind: str) -> "ServerProcess":
        env = dict(os.environ)
        env.pop("FRIENDSOCK_INSTALL", None)
        process = await asyncio.create_subprocess_exec(
            sys.executable, SERVER_PROCESS, kind, env=env,
            stdin=asyncio.subprocess.PIPE, stdout=asyncio.subprocess.PIPE)
        assert process.stdout is not None
        first = await asyncio.wait_for(process.stdout.readline(), 20)
        assert first, "the server process ended"
        return cls(process, kind, json.loads(first)["ports"])

    async def _read(self) -> None:
        assert self.process.stdout is not None
        while line := await self.process.stdout.readline():
            message = json.loads(line)
            if "reply" in message:
                self.replies.pop(message["reply"]).set_result(message)
            elif "loop_error" in message:
                self.loop_errors.append(message["loop_error"])
            else:
                serial = message["serial"]
                if serial not in self.ends:
                    self.ends[serial] = RemoteEnd(self, serial, message["path"])
                self.ends[serial].told(message)
            self.changed.set()
        for reply in self.replies.values():
            reply.set_exception(AssertionError("the server process ended"))

    async def call(self, op: str, serial: Optional[int] = None, **fields: Any) -> Any:
        """``op`` run in the server process (see ``stateful_peer.py``):
        what it returned, or the exception it raised, of a type of that name."""
        assert self.process.stdin is not None
        ident = next(self.ids)
        reply = self.replies[ident] = self.loop.create_future()
        command = {"id": ident, "op": op, "serial": serial, **fields}
        self.process.stdin.write(json.dumps(command).encode() + b"\n")
        answer = await asyncio.wait_for(reply, 20)
        if answer["error"] is not None:
            raise _raised(answer["error"])
        return answer.get("value")

    async def accepted(self, path: str, after: int) -> "RemoteEnd":
        """The first end accepted on ``path``'s server with a serial above ``after``."""
        while True:
            for serial, end in self.ends.items():
                if serial > after and end.path == path:
                    return end
            self.changed.clear()
            await asyncio.wait_for(self.changed.wait(), QUIET_LIMIT)

    async def finish(self) -> None:
        assert self.process.stdin is not None
        self.process.stdin.close()
        try:
            await asyncio.wait_for(self.process.wait(), 20)
            await asyncio.wait_for(self.reading, 20)
        finally:
            if self.process.returncode is None:
                self.process.kill()
                await self.process.wait()


_RAISED: Dict[str, type] = {}


def _raised(name: str) -> type:
    """The exception type the server process named: the builtin one, or one
    made once for the name (the machine compares types)."""
    found = getattr(builtins, name, None)
    if isinstance(found, type) and issubclass(found, BaseException):
        return found
    return _RAISED.setdefault(name, type(name, (Exception,), {}))


class RemoteTransport:
    """A server end's transport, its calls made in the server process."""

    _CALLS = frozenset({"pause_reading", "resume_reading", "write_eof", "close", "abort",
                        "set_write_buffer_limits", "is_closing", "get_write_buffer_size"})

    def __init__(self, server: ServerProcess, serial: int) -> None:
        self.server = server
        self.serial = serial

    def run(self, op: str, **fields: Any) -> Any:
        return self.server.loop.run_until_complete(self.server.call(op, self.serial, **fields))

    def write(self, data: Any) -> None:
        # (The server process writes the same bytes: the next of its stream.)
        self.run("write", size=memoryview(data).nbytes, kind=type(data).__name__)

    def __getattr__(self, name: str) -> Any:
        if name not in self._CALLS:
            raise AttributeError(name)
        return lambda *args: self.run("call", method=name, args=list(args))

    def get_extra_info(self, name: str) -> Any:
        assert name == "socket"
        return RemoteSocket(self)


class RemoteSocket:
    """A server end's socket (``get_extra_info('socket')``), in the server process."""

    def __init__(self, transport: RemoteTransport) -> None:
        self.transport = transport

    def getsockopt(self, *args: int) -> int:
        return self.transport.run("getsockopt", args=list(args))

    def setsockopt(self, *args: int) -> None:
        self.transport.run("setsockopt", args=list(args))

    def shutdown(self, how: int) -> None:
        self.transport.run("shutdown", args=[how])


class RemoteEnd(Rec):
    """A server end in the server process, as it tells of its callbacks."""

    def __init__(self, server: ServerProcess, serial: int, path: str) -> None:
        super().__init__(keep_open=False, changed=server.changed)  # (keep_open: the process's)
        self.path = path
        self.transport = RemoteTransport(server, serial)  # type: ignore[assignment]

    def told(self, message: Dict[str, Any]) -> None:
        self.events = message["events"]
        self.received = message["received"]
        self.intact = message["intact"]


class AcrossVsTcp(FriendVsTcp):
    """The same machine with each connection's server end in another
    process: a connection that moved off TCP between the two processes
    against one that stayed on TCP between the same two."""

    server: ServerProcess  # set by the test function

    def __init__(self) -> None:
        super().__init__()
        self.server.changed = self.changed

    async def _open(self, friends: bool, keep_open: bool) -> Dict[str, Rec]:
        path = "friend" if friends else "tcp"
        await self.server.call("keep_open", value=keep_open)
        after = max(self.server.ends, default=0)
        transport, client = await friendsock.create_connection(
            lambda: Rec(keep_open, self.changed), "127.0.0.1", self.server.ports[path], friends=friends)
        assert friendsock.is_friend(transport) is friends
        return {"client": client, "server": await self.server.accepted(path, after)}

    def _on_uvloop(self, side: str) -> bool:
        return self.server.kind == "uvloop" if side == "server" else super()._on_uvloop(side)

    def _closing(self, side: str, method: str) -> None:
        reader = PEER[side]
        if (self.sides[side].eof_sent and not self.sides[side].closed
                and not self.ends["friend"][reader].eof
                and self.ends["friend"][side].received < self.sides[reader].delivered_target()):
            # A reset after an EOF the reader has not read: TCP's reader
            # reads the EOF, a moved one the reset alone (a known
            # difference, docs/differences.md).
            self.fin_uncertain[reader] = True
        super()._closing(side, method)

    async def _quiet(self) -> None:
        # What follows at once in the server process too: the answer to a
        # call comes after what that process did before it, and it turns
        # its loop before it answers this one.
        await self._spin(2)
        await self.server.call("sync")
        await self._spin(2)


def _run_machine(machine: type, kind: str, examples: int, server_kind: Optional[str] = None) -> None:
    """``machine`` run on a new loop of ``kind`` (its server ends in a
    process of ``server_kind``, if given); no error may reach either
    loop's exception handler."""
    loop = (uvloop.new_event_loop if kind == "uvloop" else asyncio.new_event_loop)()
    errors: List[dict] = []
    loop.set_exception_handler(lambda _loop, context: errors.append(context))
    asyncio.set_event_loop(loop)
    server = None
    try:
        machine.loop = loop
        if server_kind is not None:
            server = machine.server = loop.run_until_complete(ServerProcess.start(server_kind))
        run_state_machine_as_test(
            machine,
            settings=settings(
                max_examples=examples,
                stateful_step_count=STEPS,
                deadline=None,
                suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much],
            ),
        )
    finally:
        if server is not None:
            loop.run_until_complete(server.finish())
        asyncio.set_event_loop(None)
        loop.run_until_complete(loop.shutdown_asyncgens())
        loop.close()
    assert errors == []
    assert server is None or server.loop_errors == []


@pytest.mark.timeout(600)  # only a failing run, shrinking, takes long
@pytest.mark.parametrize("kind", ["asyncio", "uvloop"])
def test_friend_link_behaves_as_tcp(kind):
    _run_machine(FriendVsTcp, kind, EXAMPLES)


@pytest.mark.timeout(600)
@pytest.mark.parametrize("kind", ["asyncio", "uvloop"])
def test_a_connection_moved_between_processes_behaves_as_tcp(kind, monkeypatch):
    # Every connection here is short: each must still move (see _payoff).
    monkeypatch.setattr(_payoff, "SHORT_RUN", sys.maxsize)
    # (The server process on the other loop: each loop at each end.)
    _run_machine(AcrossVsTcp, kind, ACROSS_EXAMPLES, "asyncio" if kind == "uvloop" else "uvloop")
