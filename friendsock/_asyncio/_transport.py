"""The asyncio transport of one friend end.

It honours the contract of asyncio's socket transports
(``selector_events._SelectorSocketTransport``): callback order, flow control
that pauses and resumes the protocol once each, errors to the loop's
exception handler, ``ResourceWarning`` when left open. Bytes move through the
link's channels; delivery is deferred to the reader's loop, one drain per
burst, so a reply never recurses into the writer's stack.

The two ends may run on different loops in different threads (the link is
then ``threaded``): each end's callbacks run on its own loop, and what one
end asks of the other (drain, wake the writer) is handed over with one
wake-up of the other loop per burst (an eventfd it watches, see
:class:`_RemoteDrainQueue`). Per loop, a :class:`LoopState` knows the
ends living there, so a loop that closes with ends open resets their friends
instead of leaving them hanging.
"""

from __future__ import annotations

import asyncio
import contextlib
import errno
import logging
import os
import socket
import threading
import warnings
import weakref
from functools import partial
from typing import Any, Callable, Dict, List, Optional, Tuple

from .._core._errors import PeerResetError
from .._core._link import ChannelState, LinkEnd
from .._core._stats import counters
from .._friend_socket import FriendSocket

logger = logging.getLogger("friendsock")

# As asyncio: after this many writes to a lost connection, warn on each.
_LOG_THRESHOLD_FOR_CONNLOST_WRITES = 5
# Largest chunk handed to data_received in one call (asyncio's socket read
# size); whole writes up to it go by reference, a larger one is cut.
_MAX_CHUNK = 256 * 1024
# Small writes are joined into one data_received up to this size; larger
# ones go over by reference, uncopied.
_MAX_JOIN = 64 * 1024
_DEFAULT_HIGH_WATER = 64 * 1024


# Rounds of deliveries one loop callback may run before yielding, and the
# bytes after which it yields anyway (what asyncio reads in one turn).
_DRAIN_ROUNDS = 16
_DRAIN_BYTES = 256 * 1024


class _DrainQueue:
    """One loop callback runs every drain asked for since the last: many
    busy links cost one loop handle, not one each. Replies written while
    delivering are delivered by the same callback, for a bounded number of
    rounds (like NAPI's poll budget); then the loop gets its turn for I/O,
    timers and tasks. A reply never runs inside its writer's write()."""

    __slots__ = ("_call_soon", "_ready", "_scheduled")

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self._call_soon = loop.call_soon
        self._ready: List[Callable[[], None]] = []
        self._scheduled = False

    def add(self, drain: Callable[[], None]) -> None:
        self._ready.append(drain)
        if not self._scheduled:
            self._scheduled = True
            self._call_soon(self._run)

    def _run(self) -> None:
        meter = counters.shard()  # this thread's: what its readers consumed
        start = meter.moved
        for _ in range(_DRAIN_ROUNDS):
            ready = self._ready
            if not ready or meter.moved - start >= _DRAIN_BYTES:
                break
            self._ready = []  # drains asked for from here on: the next round
            for index, drain in enumerate(ready):
                try:
                    drain()
                except BaseException:  # only SystemExit/KeyboardInterrupt get here
                    self._ready[:0] = ready[index + 1:]
                    self._call_soon(self._run)
                    raise
        if self._ready:
            self._call_soon(self._run)
        else:
            self._scheduled = False


# A loop's wake-up fd: written with ``_signal(fd, 1)``, read with
# ``_consume(fd)`` (BlockingIOError when nothing was written).
if hasattr(os, "eventfd"):  # Linux: one fd, an 8-byte counter

    def _wakeup_fds() -> Tuple[int, int]:
        fd = os.eventfd(0, os.EFD_NONBLOCK | os.EFD_CLOEXEC)
        return fd, fd

    _signal = os.eventfd_write
    _consume = os.eventfd_read

else:  # pragma: no cover - elsewhere: a pipe

    def _wakeup_fds() -> Tuple[int, int]:
        read_fd, write_fd = os.pipe()
        for fd in (read_fd, write_fd):
            os.set_blocking(fd, False)
            os.set_inheritable(fd, False)
        return read_fd, write_fd

    def _signal(fd: int, value: int) -> None:
        os.write(fd, b"\0")

    def _consume(fd: int) -> None:
        os.read(fd, 64)


class _RemoteDrainQueue:
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
                 "_loop", "_is_closed", "_call_soon", "_local", "_on_closed")

    def __init__(self, loop: asyncio.AbstractEventLoop, local: _DrainQueue,
                 on_closed: Callable[[], None]) -> None:
        self._lock = threading.Lock()
        self._on_closed = on_closed
        self._ready: List[Callable[[], None]] = []
        self._armed = False  # a wake-up is outstanding: the fd was written, or a run is due
        self._loop = loop
        self._is_closed = loop.is_closed
        self._call_soon = loop.call_soon
        self._local = local
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
        """Run what was handed over meanwhile (a friend on another thread
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
                    self._local.add(later)
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


class LoopState:
    """What friendsock keeps per event loop: its drain queues, and the friend
    transports and servers living on it, to tear down if the loop closes
    with them open (their friends, on other loops, must not hang)."""

    __slots__ = ("drains", "pid", "_loop", "_remote", "_lock", "transports", "servers",
                 "__weakref__")

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self.drains = _DrainQueue(loop)
        # A forked child inherits the object, not the loop or the links:
        # nothing of it may be torn down there (locks another thread held,
        # sockets shared with the parent).
        self.pid = os.getpid()
        self._loop = loop
        self._remote: Optional[_RemoteDrainQueue] = None
        self._lock = threading.Lock()
        # The live ends, id -> weak reference (cheaper than a WeakSet): weak,
        # so an end left open is still collected (and warns from __del__).
        # Ends come and go on the loop's own thread only, so no lock; the
        # lock is for loop_closed(), which the closing thread and a friend's
        # thread (finding the loop closed) may both call.
        self.transports: "Dict[int, weakref.ref[FriendTransport]]" = {}
        self.servers: "weakref.WeakSet[Any]" = weakref.WeakSet()

    def remote(self) -> _RemoteDrainQueue:
        """The queue other threads hand this loop's callbacks to (made on
        the loop's own thread, by the first end whose friend is elsewhere)."""
        remote = self._remote
        if remote is None:
            remote = _RemoteDrainQueue(self._loop, self.drains, self.loop_closed)
            with self._lock:
                self._remote = remote
        return remote

    def loop_closed(self) -> None:
        """The loop closed (on whatever thread): every friend end on it goes
        away as if its process died; servers stop listening."""
        if self.pid != os.getpid():
            return
        with self._lock:
            transports = [t for t in (ref() for ref in self.transports.values()) if t is not None]
            self.transports = {}
            servers = list(self.servers)
            self.servers = weakref.WeakSet()
        # Unhook them all first: a friend on this same loop must not try to
        # schedule anything on it.
        for transport in transports:
            transport._unhook()
        for server in servers:
            server._loop_gone()
        for transport in transports:
            transport._loop_gone()
        with self._lock:
            remote, self._remote = self._remote, None
        if remote is not None:
            remote.close()


# Per loop, weakly both ways: the state lives as long as the loop is open
# (its close watch holds it), and never keeps a loop alive.
_states: "weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, weakref.ref[LoopState]]" = (
    weakref.WeakKeyDictionary()
)
# Far enough never to matter; re-armed should it ever fire.
_WATCH_DELAY = 1e6


def loop_state(loop: asyncio.AbstractEventLoop) -> LoopState:
    """The loop's state, made on first use (on the loop's own thread)."""
    ref = _states.get(loop)
    state = ref() if ref is not None else None
    if state is None:
        state = LoopState(loop)
        _states[loop] = weakref.ref(state)
        _CloseWatch(state).arm(loop)
    return state


class _CloseWatch:
    """Learns that a loop closed, without touching the loop object.

    Neither asyncio nor uvloop tells anyone that a loop closed, and patching
    ``close`` on the instance would leave a trace ``uninstall()`` must not
    leave. But both drop their pending timers on ``close()`` (and with the
    loop, if it is collected unclosed): this object waits in one far-off
    timer, and its ``__del__`` is the notice.
    """

    __slots__ = ("_state",)

    def __init__(self, state: LoopState) -> None:
        self._state = state

    def arm(self, loop: asyncio.AbstractEventLoop) -> None:
        loop.call_later(_WATCH_DELAY, _rearm, loop, self)

    def __del__(self) -> None:
        try:
            self._state.loop_closed()
        except Exception:  # noqa: BLE001 - a finalizer must not raise
            logger.exception("friendsock: tearing down a closed loop's links failed")


def _rearm(loop: asyncio.AbstractEventLoop, watch: _CloseWatch) -> None:
    watch.arm(loop)


def _reset_error() -> ConnectionResetError:
    return ConnectionResetError(errno.ECONNRESET, "Connection reset by peer")


class FriendTransport(asyncio.Transport):
    """One end of a friend link, as an ``asyncio.Transport``."""

    # TLS runs over a friend link as over TCP: the stdlib loop's start_tls()
    # refuses transports that do not declare this.
    _start_tls_compatible = True

    __slots__ = (
        "_loop",
        "_end",
        "_out",
        "_in",
        "_protocol",
        "_buffered",
        "_server",
        "_closing",
        "_closed",
        "_eof",
        "_eof_delivered",
        "_conn_lost",
        "_paused_reading",
        "_protocol_paused",
        "_high_water",
        "_low_water",
        "_schedule_drain",
        "_state",
        "__weakref__",
    )

    def __init__(
        self,
        loop: asyncio.AbstractEventLoop,
        end: LinkEnd,
        sock: Any,
        protocol: asyncio.BaseProtocol,
        sockname: Any,
        peername: Any,
        server: Any = None,
        state: Optional[LoopState] = None,
    ) -> None:
        extra = {
            "socket": FriendSocket(sock, end, self._buffer_sizes_changed),
            "sockname": sockname,
            "peername": peername,
        }
        super().__init__(extra)
        self._loop = loop
        self._end = end
        self._out = end.outgoing
        self._in = end.incoming
        self._protocol = protocol
        self._buffered = isinstance(protocol, asyncio.BufferedProtocol)
        self._server = server
        self._closing = False  # close() or abort() was called
        self._closed = False  # connection_lost() ran
        self._eof = False  # write_eof() was called
        self._eof_delivered = False
        self._conn_lost = 0
        self._paused_reading = False
        self._protocol_paused = False
        self._high_water = _DEFAULT_HIGH_WATER
        self._low_water = _DEFAULT_HIGH_WATER // 4
        self._state = state = state or loop_state(loop)
        drain, add = self._drain, state.drains.add
        self._schedule_drain = lambda: add(drain)  # from this loop's own thread
        if server is not None:
            server._attach()

    def start(self) -> None:
        """Hook into the link and tell the protocol (its connection_made)."""
        self._state.transports[id(self)] = weakref.ref(self)
        incoming = self._in
        if self._end.link.threaded:
            # The friend runs on another thread: what it asks of us is
            # handed to our loop (the reader's loop, for its bytes).
            readable, writable = self._remote_hooks()
            self._out.attach_writer(writable)
            pending = incoming.attach_reader(readable)
        else:  # attach_writer/attach_reader, inlined: no other thread to mind
            self._out.notify_writable = self._writable
            incoming.notify_readable = self._schedule_drain
            pending = bool(incoming.queued) or incoming.state is not ChannelState.OPEN
            if pending:
                incoming._reader_notified = True
        sock = self._extra["socket"]
        # As the loop's own TCP transports (asyncio and uvloop alike), so
        # getsockopt() answers the same on both paths.
        try:
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        except OSError:
            pass
        # The kernel sizes a socket's buffers when the connection is set up
        # (SO_SNDBUF grows from tcp_wmem[1]); the link was made before that.
        sock.sync_buffer_sizes()
        try:
            self._protocol.connection_made(self)
        except (SystemExit, KeyboardInterrupt):
            raise
        except BaseException as exc:
            self._fatal_error(exc, "Fatal error: protocol.connection_made() call failed.")
            return
        if pending:
            self._schedule_drain()

    def _remote_hooks(self) -> Tuple[Callable[[], None], Callable[[], None]]:
        """The hooks the friend's thread calls: one wake-up of our loop per
        burst (the channel notifies once until we drain), none per write;
        both through the loop's one remote queue, which also finds a loop
        that closed unseen (and tears it down)."""
        add_remote = self._state.remote().add
        return partial(add_remote, self._drain), partial(add_remote, self._writable)

    def __repr__(self) -> str:
        info = [self.__class__.__name__]
        if self._closed:
            info.append("closed")
        elif self._closing:
            info.append("closing")
        sock = self._extra["socket"]
        try:
            info.append(f"fd={sock.fileno()}")
        except OSError:  # the real socket is already released
            pass
        info.append(f"peer={self._extra['peername']!r}")
        info.append("read=" + ("idle" if not self.is_reading() else "polling"))
        info.append(f"queued={self._out.queued}")
        info.append(f"write_bufsize={self._out.write_buffer_size()}")
        if self._eof:
            info.append("eof-sent")
        return "<{}>".format(" ".join(info))

    def __del__(self, _warn: Any = warnings.warn) -> None:
        if not self._closed and not self._closing and self._state.pid == os.getpid():
            _warn(f"unclosed transport {self!r}", ResourceWarning, source=self)
            self._state.transports.pop(id(self), None)
            self._end.abort()

    # -- BaseTransport ----------------------------------------------------
    def is_closing(self) -> bool:
        return self._closing

    def close(self) -> None:
        if self._closing:
            return
        self._closing = True
        if self._out.write_buffer_size() == 0 or self._out.reader_closed:
            self._conn_lost += 1
            self._loop.call_soon(self._call_connection_lost, None)
        else:
            # Like asyncio: connection_lost once the own buffer is flushed,
            # i.e. once what is queued fits in sndbuf + friend rcvbuf.
            self._wake_me_at(0)

    def set_protocol(self, protocol: asyncio.BaseProtocol) -> None:  # type: ignore[override]
        self._protocol = protocol
        self._buffered = isinstance(protocol, asyncio.BufferedProtocol)

    def get_protocol(self) -> asyncio.BaseProtocol:  # type: ignore[override]
        return self._protocol

    # -- ReadTransport ----------------------------------------------------
    def is_reading(self) -> bool:
        return not self._paused_reading and not self._closing

    def pause_reading(self) -> None:
        if not self.is_reading():
            return
        self._paused_reading = True

    def resume_reading(self) -> None:
        if self._closing or not self._paused_reading:
            return
        self._paused_reading = False
        self._schedule_drain()

    def _drain(self) -> None:
        if self._paused_reading or self._closing or self._eof_delivered:
            # The notification stays taken: no wake-ups while paused
            # (resume_reading() drains), nor after EOF, when asyncio stops
            # reading for good (a later reset is learnt by writing).
            return
        channel = self._in
        # Deliver only what is queued now; a push from here on schedules the
        # next drain. A writer refilling from resume_writing() (called from
        # this loop) must not keep the event loop in one callback forever.
        try:
            if self._buffered:
                channel.begin_drain()
                budget = channel.queued
            else:  # the first chunk with the same lock round trip
                data, budget = channel.begin_pull(_MAX_CHUNK, _MAX_JOIN)
                if data:
                    self._protocol.data_received(data)  # type: ignore[attr-defined]
                    if self._paused_reading or self._closing:
                        return
            protocol = self._protocol
            while budget > 0 and channel.queued:
                if self._buffered:
                    buffer = protocol.get_buffer(-1)  # type: ignore[attr-defined]
                    if not len(buffer):
                        raise RuntimeError("get_buffer() returned an empty buffer")
                    size = channel.pull_into(memoryview(buffer).cast("B"))
                    budget -= size
                    protocol.buffer_updated(size)  # type: ignore[attr-defined]
                else:
                    data = channel.pull(_MAX_CHUNK, _MAX_JOIN)
                    budget -= len(data)
                    protocol.data_received(data)  # type: ignore[attr-defined]
                if self._paused_reading or self._closing:
                    return
                protocol = self._protocol
            # The state before the count: a writer on another thread sets
            # EOF/RESET after its last push, so EOF never overtakes bytes.
            state = channel.state
            if channel.queued:
                return  # newer bytes: their drain is scheduled, EOF after them
            if state is ChannelState.OPEN:
                return
            if state is ChannelState.RESET and not channel.reset_after_fin:
                self._force_close(_reset_error())
                return
            # EOF; or a reset that came after the FIN had arrived, which
            # leaves the FIN readable (the reset shows on the next send).
            self._eof_delivered = True
        except (SystemExit, KeyboardInterrupt):
            raise
        except BaseException as exc:
            self._fatal_error(exc, "Fatal error: protocol.data_received() call failed.")
            return
        try:
            if self._protocol.eof_received():  # type: ignore[attr-defined]
                return
        except (SystemExit, KeyboardInterrupt):
            raise
        except BaseException as exc:
            self._fatal_error(exc, "Fatal error: protocol.eof_received() call failed.")
            return
        self.close()

    # -- WriteTransport ---------------------------------------------------
    def write(self, data: Any) -> None:
        if not isinstance(data, (bytes, bytearray, memoryview)):
            raise TypeError(
                f"data argument must be a bytes-like object, not {type(data).__name__!r}"
            )
        if self._eof:
            raise RuntimeError("Cannot call write() after write_eof()")
        if not data:
            return
        if self._conn_lost:
            if self._conn_lost >= _LOG_THRESHOLD_FOR_CONNLOST_WRITES:
                logger.warning("socket.send() raised exception.")
            self._conn_lost += 1
            return
        out = self._out
        try:
            # bytes go by reference; mutable buffers are copied once.
            out.push(data if type(data) is bytes else bytes(data))
        except PeerResetError:
            self._write_to_closed_peer()
            return
        if out.queued - out.sndbuf - out.rcvbuf > self._high_water:
            self._maybe_pause_protocol()

    def writelines(self, list_of_data: Any) -> None:
        for data in list_of_data:
            self.write(data)

    def write_eof(self) -> None:
        if self._closing or self._eof:
            return
        self._eof = True
        if self._in.state is ChannelState.RESET:
            # The peer's reset came in: over TCP the socket is closed and
            # asyncio's shutdown(SHUT_WR) raises ENOTCONN out of write_eof().
            raise OSError(errno.ENOTCONN, os.strerror(errno.ENOTCONN))
        self._end.shutdown_write()

    def can_write_eof(self) -> bool:
        return True

    def abort(self) -> None:
        self._force_close(None)

    def get_write_buffer_size(self) -> int:
        return self._out.write_buffer_size()

    def get_write_buffer_limits(self) -> Tuple[int, int]:
        return (self._low_water, self._high_water)

    def set_write_buffer_limits(self, high: Optional[int] = None, low: Optional[int] = None) -> None:
        if high is None:
            high = _DEFAULT_HIGH_WATER if low is None else 4 * low
        if low is None:
            low = high // 4
        if not high >= low >= 0:
            raise ValueError(f"high ({high!r}) must be >= low ({low!r}) must be >= 0")
        self._high_water = high
        self._low_water = low
        if self._protocol_paused:
            self._wake_me_at(low)
        self._maybe_pause_protocol()

    # -- flow control -----------------------------------------------------
    def _maybe_pause_protocol(self) -> None:
        if self._out.write_buffer_size() <= self._high_water or self._protocol_paused:
            return
        self._protocol_paused = True
        self._wake_me_at(self._low_water)
        try:
            self._protocol.pause_writing()
        except (SystemExit, KeyboardInterrupt):
            raise
        except BaseException as exc:
            self._loop.call_exception_handler({
                "message": "protocol.pause_writing() failed",
                "exception": exc,
                "transport": self,
                "protocol": self._protocol,
            })

    def _maybe_resume_protocol(self) -> None:
        if not self._protocol_paused or self._out.write_buffer_size() > self._low_water:
            return
        self._protocol_paused = False
        try:
            self._protocol.resume_writing()
        except (SystemExit, KeyboardInterrupt):
            raise
        except BaseException as exc:
            self._loop.call_exception_handler({
                "message": "protocol.resume_writing() failed",
                "exception": exc,
                "transport": self,
                "protocol": self._protocol,
            })

    def _writable(self) -> None:
        """The reader consumed down to our threshold, or went away."""
        if self._closed or self._conn_lost:
            return
        out = self._out
        if out.reader_closed:
            # The peer closed with our bytes unread, and reset: over TCP that
            # fails a send still pending in our own buffer; an idle end
            # learns of it by reading or writing.
            if out.closed_with_backlog:
                self._force_close(self._send_error())
            return
        if self._closing:
            if out.write_buffer_size() == 0:
                self._conn_lost += 1
                self._call_connection_lost(None)
            else:
                self._wake_me_at(0)
            return
        self._maybe_resume_protocol()
        if self._protocol_paused:
            self._wake_me_at(self._low_water)

    def _wake_me_at(self, threshold: int) -> None:
        """Ask for _writable once our buffer falls to ``threshold``. Set, then
        check: a reader on another thread may get there first, and then no
        wake-up would ever come; we call ourselves on the next turn instead."""
        if self._out.wake_writer_at(threshold):
            self._loop.call_soon(self._writable)

    def _buffer_sizes_changed(self) -> None:
        """A setsockopt of SO_SNDBUF/SO_RCVBUF moved our capacity."""
        if self._closed:
            return
        if self._protocol_paused:
            self._writable()
        else:
            self._maybe_pause_protocol()

    # -- errors and the end ----------------------------------------------
    def _write_to_closed_peer(self) -> None:
        incoming = self._in
        if incoming.state is not ChannelState.RESET:
            # The peer closed cleanly. TCP takes this first write, and the
            # peer's kernel answers it with a reset, which drops what the
            # peer had not sent yet (beyond our rcvbuf) and fails the next.
            incoming.reset(keep=incoming.rcvbuf)
            return
        self._fatal_error(self._send_error(), "Fatal write error on socket transport")

    def _send_error(self) -> OSError:
        """What a send fails with after the peer's reset: EPIPE when its
        FIN had come in first (CLOSE_WAIT), ECONNRESET otherwise."""
        if self._in.reset_after_fin:
            return BrokenPipeError(errno.EPIPE, "Broken pipe")
        return _reset_error()

    def _fatal_error(self, exc: BaseException, message: str = "Fatal error on transport") -> None:
        if isinstance(exc, OSError):
            if self._loop.get_debug():
                logger.debug("%r: %s", self, message, exc_info=True)
        else:
            self._loop.call_exception_handler({
                "message": message,
                "exception": exc,
                "transport": self,
                "protocol": self._protocol,
            })
        self._force_close(exc)

    def _force_close(self, exc: Optional[BaseException]) -> None:
        if self._conn_lost:
            return
        # What does not fit in sndbuf + friend rcvbuf is our own buffer:
        # an abort drops it, as asyncio drops its buffer.
        self._out.truncate(self._out.capacity)
        self._closing = True
        self._conn_lost += 1
        self._loop.call_soon(self._call_connection_lost, exc)

    def _call_connection_lost(self, exc: Optional[BaseException]) -> None:
        if self._closed:
            return
        self._closed = True
        try:
            self._protocol.connection_lost(exc)
        finally:
            self._end.close()
            self._in.notify_readable = None
            self._out.notify_writable = None
            self._state.transports.pop(id(self), None)
            server = self._server
            if server is not None:
                self._server = None
                server._detach()

    def _unhook(self) -> None:
        self._in.notify_readable = None
        self._out.notify_writable = None

    def _loop_gone(self) -> None:
        """Our loop closed with this end open (called on whatever thread
        closed it, or found it closed). The friend sees what a process that
        dies leaves behind: a reset, after the bytes already in its receive
        buffer. The protocol hears nothing: its loop can run no callback."""
        if self._closed:
            return
        self._closing = self._closed = True
        self._conn_lost += 1
        self._server = None
        self._unhook()
        self._end.reset(keep=self._out.rcvbuf)
