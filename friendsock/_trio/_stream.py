"""The trio stream of one friend end.

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
import operator
import os
import socket
import warnings
import weakref
from typing import Any, Callable, Optional, Tuple, Union

import trio

from .._core._errors import LinkBrokenError, PeerResetError
from .._core._link import LinkEnd, Seen
from .._friend_socket import FriendSocket
from ._run import RunState

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


def broken(exc: LinkBrokenError) -> trio.BrokenResourceError:
    """The one translation of a link failure into trio's vocabulary, worded
    as trio.SocketStream words the socket error."""
    cause = exc.as_os_error()
    error = trio.BrokenResourceError(f"socket connection broken: {cause}")
    error.__cause__ = cause
    return error


class _ConflictDetector:
    """One task at a time in one direction, as trio's own streams guard
    theirs: a second task gets BusyResourceError."""

    __slots__ = ("_held", "_message")

    def __init__(self, message: str) -> None:
        self._held = False
        self._message = message

    def __enter__(self) -> None:
        if self._held:
            raise trio.BusyResourceError(self._message)
        self._held = True

    def __exit__(self, *exc_info: object) -> None:
        self._held = False


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
        self._send_conflicts = _ConflictDetector(
            "another task is currently sending data on this FriendStream")
        self._receive_conflicts = _ConflictDetector(
            "another task is currently receiving data on this FriendStream")

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
        with self._receive_conflicts:
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
                seen = channel.seen()
                if seen is Seen.DATA:
                    data = channel.pull(max_bytes, _MAX_JOIN)
                    break
                if seen is Seen.NOTHING:
                    channel.begin_drain()  # the next push notifies us again
                    if channel.seen() is not Seen.NOTHING:
                        continue
                    self._reader = _current_task()
                    await _wait_task_rescheduled(self._abort_reader)
                    parked = True
                    continue
                if seen is Seen.RESET:
                    raise broken(self._end.read_error())
                data = b""  # EOF
                break
            if not parked:
                await _cancel_shielded_checkpoint()
            return data

    # -- sending -----------------------------------------------------------
    async def send_all(self, data: Union[bytes, bytearray, memoryview]) -> None:
        if self._eof_sent and not self._closed:
            raise trio.ClosedResourceError("can't send data after sending EOF")
        with self._send_conflicts:
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
                try:
                    self._end.send_refused()
                except LinkBrokenError as exc:
                    raise broken(exc)
            # What send() could not fit in sndbuf + friend rcvbuf waits in our
            # own buffer; send_all returns once it fits. Cancelled meanwhile,
            # the bytes stay queued and still arrive, in order.
            if (out.queued <= out.sndbuf + out.rcvbuf and not out.reader_closed) or \
                    not await self._wait_for_room(raise_broken=True):
                await _cancel_shielded_checkpoint()

    async def wait_send_all_might_not_block(self) -> None:
        with self._send_conflicts:
            if self._closed:
                raise trio.ClosedResourceError("this stream was already closed")
            await _checkpoint_if_cancelled()
            if not await self._wait_for_room(raise_broken=False):
                await _cancel_shielded_checkpoint()

    async def _wait_for_room(self, raise_broken: bool) -> bool:
        """Until what we queued fits in sndbuf + friend rcvbuf, or the friend
        stopped reading. Returns whether it parked (a checkpoint)."""
        out = self._out
        parked = False
        while True:
            if self._closed:
                raise trio.ClosedResourceError("this stream was already closed")
            if out.reader_closed:
                error = self._end.pending_send_error() if raise_broken else None
                if error is not None:
                    raise broken(error)
                return parked
            if out.wake_writer_at(0):
                return parked
            self._writer = _current_task()
            await _wait_task_rescheduled(self._abort_writer)
            parked = True

    async def send_eof(self) -> None:
        with self._send_conflicts:
            await trio.lowlevel.checkpoint()
            if self._eof_sent:  # idempotent, as shutdown(SHUT_WR) done once
                return
            if self._closed:
                raise trio.ClosedResourceError("this stream was already closed")
            try:
                self._end.shutdown_write()
            except LinkBrokenError as exc:
                raise broken(exc)
            self._eof_sent = True

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
