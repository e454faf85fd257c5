"""The trio stream of one friend end, and what friendsock keeps per trio run.

A :class:`FriendStream` honours ``trio.abc.HalfCloseableStream`` as
``trio.SocketStream`` does: every method is a checkpoint, a cancelled call
consumes nothing, two tasks in the same direction get ``BusyResourceError``,
a closed stream ``ClosedResourceError`` and a reset link
``BrokenResourceError``. Bytes move through the link's channels: a task
waiting to receive (or for room to send) parks, and the friend's write (or
read) reschedules it, directly on the same run, with one
``run_sync_soon`` per burst when the friend runs on another thread.
"""

from __future__ import annotations

import contextlib
import errno
import operator
import os
import socket
import threading
import warnings
import weakref
from typing import Any, Callable, Dict, Optional, Tuple, Union

import trio

from .._core._errors import PeerResetError
from .._core._link import ChannelState, LinkEnd
from .._core._registry import ListenerEntry, registry
from .._friend_socket import FriendSocket

# As trio.SocketStream.receive_some.
DEFAULT_RECEIVE_SIZE = 65536
# Small writes are joined into one receive up to this size.
_MAX_JOIN = 64 * 1024

_checkpoint_if_cancelled = trio.lowlevel.checkpoint_if_cancelled
_cancel_shielded_checkpoint = trio.lowlevel.cancel_shielded_checkpoint
_current_task = trio.lowlevel.current_task
_reschedule = trio.lowlevel.reschedule
_wait_task_rescheduled = trio.lowlevel.wait_task_rescheduled
_ABORTED = trio.lowlevel.Abort.SUCCEEDED


class RunState:
    """What friendsock keeps per trio run: its token (other threads hand
    wake-ups over with it) and the friend ends and listeners living in it,
    torn down when the run ends with them open (their friends, maybe on
    other threads, must not hang)."""

    __slots__ = ("token", "pid", "streams", "listeners", "_lock", "finished", "__weakref__")

    def __init__(self, token: trio.lowlevel.TrioToken) -> None:
        self.token = token
        self.pid = os.getpid()
        # id -> weak reference: an end left open is still collected (and
        # warns). Changed on the run's thread only; the lock is for
        # run_finished(), which a friend's thread may also reach.
        self.streams: "Dict[int, weakref.ref[FriendStream]]" = {}
        self.listeners: "Dict[int, ListenerEntry]" = {}
        self._lock = threading.Lock()
        self.finished = False

    def run_finished(self) -> None:
        """Every friend end still open goes away as if its process died;
        listeners stop pairing."""
        if self.pid != os.getpid():
            return
        with self._lock:
            if self.finished:
                return
            self.finished = True
            streams = [s for s in (ref() for ref in self.streams.values()) if s is not None]
            self.streams = {}
            entries = list(self.listeners.values())
            self.listeners = {}
        for entry in entries:
            forget_listener(entry)
        for stream in streams:
            stream._run_gone()


_run_state: "trio.lowlevel.RunVar[RunState]" = trio.lowlevel.RunVar("friendsock_run_state")


def run_state() -> RunState:
    """The current run's state, made on first use."""
    try:
        return _run_state.get()
    except LookupError:
        state = RunState(trio.lowlevel.current_trio_token())
        _run_state.set(state)
        trio.lowlevel.spawn_system_task(_watch_run_end, state, name="friendsock run watch")
        return state


async def _watch_run_end(state: RunState) -> None:
    # System tasks are cancelled once the main task is done: the run ends.
    try:
        await trio.sleep_forever()
    finally:
        state.run_finished()


def forget_listener(entry: ListenerEntry) -> None:
    """Stop pairing with ``entry``. The kernel resets what still waits in a
    closing backlog; a confirmed connect watches its own socket instead."""
    for orphan in registry.remove_listener(entry):
        if orphan.link.established:
            orphan.link.server.reset()


def reset_error() -> ConnectionResetError:
    return ConnectionResetError(errno.ECONNRESET, "Connection reset by peer")


def broken(exc: OSError) -> trio.BrokenResourceError:
    """The one translation of a link failure into trio's vocabulary, worded
    as trio.SocketStream words it."""
    error = trio.BrokenResourceError(f"socket connection broken: {exc}")
    error.__cause__ = exc
    return error


class FriendStream(trio.abc.HalfCloseableStream):
    """One end of a friend link, as a ``trio.abc.HalfCloseableStream``.

    ``socket`` is the real TCP socket, which stays open while the friends
    are connected; ``setsockopt`` of ``SO_SNDBUF``/``SO_RCVBUF`` on it (or on
    the stream) changes the link's accounting.
    """

    def __init__(self, end: LinkEnd, sock: Any, sockname: Any, peername: Any,
                 state: RunState) -> None:
        self._end = end
        self._out = end.outgoing
        self._in = end.incoming
        self._state = state
        self.socket = FriendSocket(sock, end, self._buffer_sizes_changed)  # a cycle: collectable
        self._sockname = sockname
        self._peername = peername
        self._closed = False
        self._eof_sent = False
        self._reader: Optional[trio.lowlevel.Task] = None  # parked in receive_some
        self._writer: Optional[trio.lowlevel.Task] = None  # parked waiting for room
        # One task per direction at a time (BusyResourceError otherwise).
        self._sending = False
        self._receiving = False

    def start(self) -> None:
        """Hook into the link (on the run's thread)."""
        state = self._state
        state.streams[id(self)] = weakref.ref(self)
        readable, writable = self._hooks()
        self._out.attach_writer(writable)
        self._in.attach_reader(readable)
        # As trio.SocketStream: the real socket is configured alike, so
        # getsockopt() answers the same on both paths.
        sock = self.socket
        with contextlib.suppress(OSError):
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, True)
        if hasattr(socket, "TCP_NOTSENT_LOWAT"):
            with contextlib.suppress(OSError):
                sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NOTSENT_LOWAT, 2**14)
        # The kernel sizes a socket's buffers when the connection is set up;
        # the link was made before that.
        sock.sync_buffer_sizes()

    def _hooks(self) -> Tuple[Callable[[], None], Callable[[], None]]:
        """The hooks the friend calls. They hold this stream weakly: a
        stream its owner dropped is collected (and resets its friend) even
        while the friend lives. A friend on another thread hands each wake-up
        to our run (one per burst: the channel notifies once until we look
        again)."""
        ref = weakref.ref(self)

        def wake_reader() -> None:
            stream = ref()
            if stream is not None:
                stream._wake_reader()

        def wake_writer() -> None:
            stream = ref()
            if stream is not None:
                stream._wake_writer()

        if not self._end.link.threaded:
            return wake_reader, wake_writer
        run_sync_soon = self._state.token.run_sync_soon

        def hand_over(wake: Callable[[], None]) -> Callable[[], None]:
            def remote() -> None:
                try:
                    run_sync_soon(wake)
                except trio.RunFinishedError:
                    stream = ref()
                    if stream is not None:
                        stream._run_gone()

            return remote

        return hand_over(wake_reader), hand_over(wake_writer)

    def __repr__(self) -> str:
        state = "closed" if self._closed else "open"
        eof = " eof-sent" if self._eof_sent else ""
        return (f"<friendsock.trio.FriendStream {state}{eof} peer={self._peername!r} "
                f"queued={self._out.queued} write_bufsize={self._out.write_buffer_size()}>")

    def __del__(self, _warn: Any = warnings.warn) -> None:
        state = getattr(self, "_state", None)  # None: __init__ failed
        if state is None or self._closed or state.pid != os.getpid():
            return
        _warn(f"unclosed friend stream {self!r}", ResourceWarning, source=self)
        self._closed = True
        state.streams.pop(id(self), None)
        # As a socket collected unclosed: closed, what was queued still goes.
        # The collector may run on any thread, even inside a channel's lock:
        # the run does the closing.
        end = self._end
        try:
            state.token.run_sync_soon(end.abort)
        except trio.RunFinishedError:
            end.reset(keep=self._out.rcvbuf)

    # -- waking ------------------------------------------------------------
    def _wake_reader(self) -> None:
        task = self._reader
        if task is not None:
            self._reader = None
            _reschedule(task)

    def _wake_writer(self) -> None:
        task = self._writer
        if task is not None:
            self._writer = None
            _reschedule(task)

    # Parked: the task waits in wait_task_rescheduled (a checkpoint); the
    # friend's wake-up or our aclose() reschedules it, a cancel aborts it.
    def _abort_reader(self, _: Any) -> trio.lowlevel.Abort:
        self._reader = None
        return _ABORTED

    def _abort_writer(self, _: Any) -> trio.lowlevel.Abort:
        self._writer = None
        return _ABORTED

    # -- receiving ---------------------------------------------------------
    async def receive_some(self, max_bytes: Optional[int] = None) -> bytes:
        if self._receiving:
            raise trio.BusyResourceError("another task is currently receiving data on this FriendStream")
        self._receiving = True
        try:
            if max_bytes is None:
                max_bytes = DEFAULT_RECEIVE_SIZE
            else:
                max_bytes = operator.index(max_bytes)
                if max_bytes < 1:
                    raise ValueError("max_bytes must be >= 1")
            # Cancelled here, or while parked: nothing was consumed.
            await _checkpoint_if_cancelled()
            channel = self._in
            parked = False
            while True:
                if self._closed:
                    raise trio.ClosedResourceError("this stream was already closed")
                # The state before the count: a writer on another thread sets
                # EOF/RESET after its last push, so EOF never overtakes bytes.
                state = channel.state
                if channel.queued:
                    data = channel.pull(max_bytes, _MAX_JOIN)
                    break
                if state is ChannelState.OPEN:
                    channel.begin_drain()  # the next push notifies us again
                    if channel.queued or channel.state is not ChannelState.OPEN:
                        continue
                    self._reader = _current_task()
                    await _wait_task_rescheduled(self._abort_reader)
                    parked = True
                    continue
                if state is ChannelState.RESET and not channel.reset_after_fin:
                    raise broken(reset_error())
                # EOF (or a reset after the FIN had arrived: EOF reads first)
                data = b""
                break
            if not parked:
                await _cancel_shielded_checkpoint()
            return data
        finally:
            self._receiving = False

    # -- sending -----------------------------------------------------------
    def _enter_send(self) -> None:
        if self._sending:
            raise trio.BusyResourceError("another task is currently sending data on this FriendStream")
        self._sending = True

    async def send_all(self, data: Union[bytes, bytearray, memoryview]) -> None:
        if self._eof_sent and not self._closed:
            raise trio.ClosedResourceError("can't send data after sending EOF")
        self._enter_send()
        try:
            if self._closed:
                raise trio.ClosedResourceError("this stream was already closed")
            if type(data) is not bytes:
                data = memoryview(data).tobytes()  # the caller may reuse its buffer
            if not data:
                await trio.lowlevel.checkpoint()
                return
            await _checkpoint_if_cancelled()
            out = self._out
            try:
                out.push(data)
            except PeerResetError:
                self._write_to_closed_peer()
            # What send() could not fit in sndbuf + friend rcvbuf waits in our
            # own buffer; send_all returns once it fits. Cancelled meanwhile,
            # the bytes stay queued and still arrive, in order.
            if (out.queued <= out.sndbuf + out.rcvbuf and not out.reader_closed) or \
                    not await self._wait_for_room(raise_broken=True):
                await _cancel_shielded_checkpoint()
        finally:
            self._sending = False

    async def wait_send_all_might_not_block(self) -> None:
        self._enter_send()
        try:
            if self._closed:
                raise trio.ClosedResourceError("this stream was already closed")
            await _checkpoint_if_cancelled()
            if not await self._wait_for_room(raise_broken=False):
                await _cancel_shielded_checkpoint()
        finally:
            self._sending = False

    async def _wait_for_room(self, raise_broken: bool) -> bool:
        """Until what we queued fits in sndbuf + friend rcvbuf, or the friend
        stopped reading. Returns whether it parked (a checkpoint)."""
        out = self._out
        parked = False
        while True:
            if self._closed:
                raise trio.ClosedResourceError("this stream was already closed")
            if out.reader_closed:
                # The friend closed with our bytes unread and reset: over
                # TCP that fails a send still pending in our own buffer.
                if raise_broken and out.closed_with_backlog:
                    raise broken(self._send_error())
                return parked
            if out.wake_writer_at(0):
                return parked
            self._writer = _current_task()
            await _wait_task_rescheduled(self._abort_writer)
            parked = True

    def _write_to_closed_peer(self) -> None:
        incoming = self._in
        if incoming.state is not ChannelState.RESET:
            # The friend closed cleanly. TCP takes this first write, and the
            # friend's kernel answers it with a reset, which drops what the
            # friend had not sent yet (beyond our rcvbuf) and fails the next.
            incoming.reset(keep=incoming.rcvbuf)
            return
        raise broken(self._send_error())

    def _send_error(self) -> OSError:
        """EPIPE when the friend's FIN came in before its reset, ECONNRESET
        otherwise (as a socket send reports it)."""
        if self._in.reset_after_fin:
            return BrokenPipeError(errno.EPIPE, "Broken pipe")
        return reset_error()

    async def send_eof(self) -> None:
        self._enter_send()
        try:
            await trio.lowlevel.checkpoint()
            if self._eof_sent:  # idempotent, as shutdown(SHUT_WR) done once
                return
            if self._closed:
                raise trio.ClosedResourceError("this stream was already closed")
            if self._in.state is ChannelState.RESET:
                # As shutdown(SHUT_WR) on a socket the peer has reset.
                raise broken(OSError(errno.ENOTCONN, os.strerror(errno.ENOTCONN)))
            self._eof_sent = True
            self._end.shutdown_write()
        finally:
            self._sending = False

    # -- closing -----------------------------------------------------------
    async def aclose(self) -> None:
        if not self._closed:
            self._closed = True
            # Tasks parked on this stream wake up to ClosedResourceError.
            self._wake_reader()
            self._wake_writer()
            self._unhook()
            self._state.streams.pop(id(self), None)
            self._end.close()
        await trio.lowlevel.checkpoint()

    def _unhook(self) -> None:
        self._in.notify_readable = None
        self._out.notify_writable = None

    def _run_gone(self) -> None:
        """Our run ended with this end open (called on whatever thread found
        out). The friend sees what a process that dies leaves behind: a
        reset, after the bytes already in its receive buffer."""
        if self._closed:
            return
        self._closed = True
        self._unhook()
        self._end.reset(keep=self._out.rcvbuf)

    def _buffer_sizes_changed(self) -> None:
        # Our capacity moved: a task waiting for room looks again.
        self._wake_writer()

    # -- socket options, as trio.SocketStream ------------------------------
    def setsockopt(self, level: int, option: int, value: Any, length: Optional[int] = None) -> None:
        if length is None:
            if value is None:
                raise TypeError("invalid value for argument 'value', must not be None "
                                "when specifying length")
            self.socket.setsockopt(level, option, value)
            return
        if value is not None:
            raise TypeError(f"invalid value for argument 'value': {value!r}, "
                            "must be None when specifying optlen")
        self.socket.setsockopt(level, option, value, length)

    def getsockopt(self, level: int, option: int, buffersize: int = 0) -> Any:
        if buffersize == 0:
            return self.socket.getsockopt(level, option)
        return self.socket.getsockopt(level, option, buffersize)

    def getsockname(self) -> Any:
        return self._sockname

    def getpeername(self) -> Any:
        return self._peername
