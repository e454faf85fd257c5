"""Per-loop wake-ups: the drain queue through which a loop's links deliver
(replies in rounds, with no loop turn each), and the queue (with its
eventfd) through which other threads hand this loop's callbacks over, one
wake-up per batch."""

from __future__ import annotations

import asyncio
import contextlib
import contextvars
import os
import threading
from typing import Any, Callable, List, Optional, Tuple

from .._core._stats import Shard, counters

# Rounds of callbacks posted by other threads that one wake-up runs.
_DRAIN_ROUNDS = 16
# What one turn of the loop may deliver, however many links are ready:
# drains, and bytes read (what asyncio reads of one socket in one turn).
# Past it, what waits runs in the next turn, after the loop's timers, its
# other callbacks and its I/O.
TURN_DRAINS = 1024
_TURN_BYTES = 256 * 1024
# An outermost drain that leaves no more than this of the turn's budget
# asks for the next turn's callback, which gives the budget back.
ASK_AT = TURN_DRAINS // 2


class DrainQueue:
    """A loop's drains (a transport delivering what its friend wrote),
    each in its transport's context (``contextvars``), as the loop's own
    transports call their protocols.

    A drain asked for from outside any drain is a loop callback of its own.
    One asked for while a drain runs (a reply, written from
    ``data_received``) waits in the queue, and the outermost drain runs
    those when it is done, round after round, so a request/response
    exchange between two ends on this loop costs no loop turn per message.
    A reply never runs inside its writer's write().

    The work is bounded per turn of the loop, not per callback (like NAPI's
    poll budget): a turn runs a callback for each link woken from outside
    a drain, and rounds bounded per callback would add up to rounds of
    every link, a thousand links' worth in each of a thousand callbacks.
    ``left`` counts the drains the turn may still run, the outermost ones
    and those of the rounds; once it is spent (or the turn's bytes are),
    what is ready waits in the queue, an outermost drain too, and the loop
    gets its turn for I/O, timers and tasks. ``_next_turn``, a loop callback
    asked for once half the budget is spent or drains wait (so a turn with
    little to do asks for none), gives the budget back and runs them: it
    runs in the next turn, as a loop runs the callbacks asked for during a
    turn only in the next.

    ``running``: a drain runs now (the drain sets it, see
    ``FriendTransport._drain``). A drain is asked for, once per burst of
    writes, by ``FriendTransport._schedule_drain``: appended to ``waiting``
    while one runs, else a loop callback in its transport's context."""

    __slots__ = ("_call_soon", "waiting", "running", "left", "_turn_due", "_bytes_at", "_meter")

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self._call_soon = loop.call_soon
        # Drains asked for while one runs (for its rounds), and those the
        # spent budget put off to the next turn.
        self.waiting: List[Tuple[Callable[[], None], contextvars.Context]] = []
        self.running = False
        self.left = TURN_DRAINS
        self._turn_due = False  # _next_turn is a loop callback now
        # The loop thread's counters shard (bytes its readers took), found on
        # the first run, on that thread; what it counted when the turn began.
        self._meter: Optional[Shard] = None
        self._bytes_at = 0

    def defer(self, drain: Callable[[], None], context: contextvars.Context) -> None:
        """An outermost drain found the turn's budget spent: it runs in the
        next turn, after those already waiting."""
        self.waiting.append((drain, context))
        self._ask_next_turn()

    def run_rounds(self, entered: Optional[contextvars.Context]) -> None:
        """Run the drains that waited, and those they ask for, in rounds,
        within the turn's budget; called by the outermost drain as it ends
        (``running`` still set), which is unset once no round is due.
        ``entered``: the context the caller runs in, where a drain of its
        own runs as it is (a context cannot be entered twice)."""
        meter = self._meter or self._find_meter()
        bytes_until = self._bytes_at + _TURN_BYTES
        ready = self.waiting
        left = self.left
        while True:
            self.waiting = []  # drains asked for from here on: the next round
            if len(ready) > left:  # the budget ends in this round: the rest goes first next turn
                self.waiting = ready[left:]
                ready = ready[:left]
            index = 0
            try:
                for drain, context in ready:
                    index += 1
                    if context is entered:
                        drain()
                    else:
                        context.run(drain)
            except BaseException:  # only SystemExit/KeyboardInterrupt get here
                self.left = left - index
                self.waiting[:0] = ready[index:]
                self.stop()
                raise
            left -= index
            ready = self.waiting
            if not ready or left <= 0 or meter.moved >= bytes_until:
                break
        self.left = left
        self.stop()

    def stop(self) -> None:
        """The outermost drain is done, or gives the loop its turn: what
        waits runs from the next turn's callback, which is asked for too
        once half the budget (drains or bytes) is spent."""
        self.running = False
        read = (self._meter or self._find_meter()).moved - self._bytes_at
        if read >= _TURN_BYTES:
            self.left = 0
        if self.waiting or self.left <= ASK_AT or read >= _TURN_BYTES // 2:
            self._ask_next_turn()

    def _ask_next_turn(self) -> None:
        if not self._turn_due:
            self._turn_due = True
            self._call_soon(self._next_turn)

    def _find_meter(self) -> Shard:
        meter = self._meter = counters.shard()
        self._bytes_at = meter.moved
        return meter

    def _next_turn(self) -> None:
        """A new turn of the loop: its budget, and what waited."""
        self._turn_due = False
        self.left = TURN_DRAINS
        self._bytes_at = (self._meter or self._find_meter()).moved
        if self.waiting and not self.running:  # (an outermost drain may have run them)
            self.running = True
            self.run_rounds(None)


# A loop's wake-up fd: written with ``_signal(fd, 1)``, read with
# ``_consume(fd)`` (BlockingIOError when nothing was written).
if hasattr(os, "eventfd"):  # Linux: one fd, an 8-byte counter

    def _wakeup_fds() -> Tuple[int, int]:
        fd = os.eventfd(0, os.EFD_NONBLOCK | os.EFD_CLOEXEC)
        return fd, fd

    _signal: Callable[[int, int], Any] = os.eventfd_write  # (the C calls themselves: no frame per wake)
    _consume: Callable[[int], Any] = os.eventfd_read

else:  # pragma: no cover - elsewhere: a pipe

    def _wakeup_fds() -> Tuple[int, int]:
        read_fd, write_fd = os.pipe()
        for fd in (read_fd, write_fd):
            os.set_blocking(fd, False)
            os.set_inheritable(fd, False)
        return read_fd, write_fd

    def _signal(fd: int, value: int) -> Any:
        os.write(fd, b"\0")

    def _consume(fd: int) -> Any:
        os.read(fd, 64)


class RemoteDrainQueue:
    """Callbacks handed to this loop by other threads (a drain for a writer
    there, or a wake-up for a reader there): one wake-up of this loop per
    batch, however many links and writes fill it meanwhile.

    The wake-up is the queue's own: an eventfd (a pipe where there is none)
    this loop watches with ``add_reader``, written only when no wake-up is
    outstanding (``_armed``, under the lock): one syscall per batch for the
    writer and no Handle, one read for the woken loop. While ``_armed``
    holds nobody writes the fd, so the read takes the batch's one write;
    callbacks added before the flag drops are run by this loop without
    another write. The write is made outside the lock: it lets go of the
    GIL, and a woken loop that found the lock taken would sleep on it.

    The fd is closed with the loop (:meth:`LoopState.loop_closed`). A writer
    that finds the loop closed before that was seen (``call_soon_threadsafe``
    would raise RuntimeError) runs ``on_closed``, which tears it all down.
    """

    __slots__ = ("_lock", "_ready", "_armed", "_signalling", "_fd", "_read_fd", "_signal_fd",
                 "_loop", "_is_closed", "_call_soon", "_on_closed")

    def __init__(self, loop: asyncio.AbstractEventLoop, on_closed: Callable[[], None]) -> None:
        self._lock = threading.Lock()
        self._on_closed = on_closed
        self._ready: List[Callable[[], None]] = []
        self._armed = False  # a wake-up is outstanding: the fd was written, or a run is due
        self._loop = loop
        self._is_closed = loop.is_closed
        self._call_soon = loop.call_soon
        self._signalling = 0  # writers writing the fd right now (not under the lock)
        # _fd: the fd this loop reads, -1 once closed (_read_fd keeps it
        # until the last writer is done with _signal_fd).
        self._fd = self._read_fd = self._signal_fd = -1
        self._read_fd, self._signal_fd = _wakeup_fds()
        try:
            loop.add_reader(self._read_fd, self._run)  # on the loop's own thread
        except BaseException:
            self._close_fds()
            raise
        self._fd = self._read_fd

    def add(self, callback: Callable[[], None]) -> None:
        """Run ``callback`` on this queue's loop, soon; from any thread. A
        loop found closed (its close not seen yet) is torn down instead."""
        lock = self._lock  # acquire()/release(): see LockedChannel.push
        lock.acquire()
        try:
            if self._fd < 0 or self._is_closed():
                self._ready = []
                gone = True
            else:
                self._ready.append(callback)
                if self._armed:
                    return  # a wake-up is on its way
                self._armed = True
                self._signalling += 1  # close() leaves the fd to us meanwhile
                gone = False
        finally:
            lock.release()
        if gone:
            self._on_closed()
            return
        try:
            _signal(self._signal_fd, 1)
        finally:
            lock.acquire()
            try:
                self._signalling -= 1
                if self._fd < 0 and not self._signalling:
                    self._close_fds()  # close() came meanwhile
            finally:
                lock.release()

    def _run(self) -> None:
        """The fd is readable: the one wake-up ``add`` wrote. The batch runs
        before the fd is read (a reply it writes is on its way sooner); the
        queue stays armed until after the read, so nothing writes the fd
        meanwhile and the read takes just that one write."""
        lock = self._lock
        lock.acquire()
        try:
            ready = self._ready
            self._ready = []
        finally:
            lock.release()
        try:
            self._call_all(ready)
        finally:
            try:
                _consume(self._fd)
            except BlockingIOError:
                pass
        self._pump()

    def _pump(self) -> None:
        """Run what was posted meanwhile (a friend on another thread
        may answer while this loop still runs the batch: it finds the queue
        armed and writes nothing), for a bounded number of rounds; then the
        loop gets its turn, the queue still armed."""
        lock = self._lock
        for _ in range(_DRAIN_ROUNDS):
            lock.acquire()
            try:
                ready = self._ready
                if not ready:
                    self._armed = False  # from here, the next add writes the fd
                    return
                self._ready = []
            finally:
                lock.release()
            self._call_all(ready)
        self._call_soon(self._pump)

    def _call_all(self, ready: List[Callable[[], None]]) -> None:
        for index, callback in enumerate(ready):
            try:
                callback()
            except BaseException:  # only SystemExit/KeyboardInterrupt get here
                for later in ready[index + 1:]:
                    self._call_soon(later)
                self._call_soon(self._pump)  # still armed: the rest comes from there
                raise

    def close(self) -> None:
        """The loop closed: no more wake-ups; the fd is closed (from
        whatever thread saw the loop close: the loop no longer polls), or
        by the last writer still writing it."""
        with self._lock:
            self._ready = []
            self._armed = True
            fd, self._fd = self._fd, -1
            if fd < 0:
                return
            with contextlib.suppress(Exception):  # whatever the loop thinks, the fd goes
                self._loop.remove_reader(fd)  # a closed loop: nothing to do
            if not self._signalling:
                self._close_fds()

    def _close_fds(self) -> None:
        """Under the lock (or before anyone else can see the queue)."""
        read_fd, signal_fd = self._read_fd, self._signal_fd
        self._read_fd = self._signal_fd = -1
        if read_fd >= 0:
            os.close(read_fd)
        if signal_fd >= 0 and signal_fd != read_fd:
            os.close(signal_fd)
