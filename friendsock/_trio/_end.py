"""What every trio-side friend end shares, whatever it looks like to its
user (a ``FriendStream``, or a ``trio.socket`` socket that paired): hooking
into the link, parking a task until the friend's write (or read) wakes it,
and going away with the run.

A task waiting to receive (or for room to send) parks; the friend's write
(or read) reschedules it, directly on the same run, with one
``run_sync_soon`` per burst when the friend runs on another thread. Errors
are raised here in the core's vocabulary (:class:`LinkBrokenError`); each
kind of end translates them once (``_broken``, ``_closed_error``).
"""

from __future__ import annotations

import errno
import socket
import warnings
import weakref
from typing import Any, Callable, Optional, Tuple

import trio

from .._core._errors import FriendError, LinkBrokenError
from .._core._finalizing import close_when_safe
from .._core._channel import CHANNEL_TCP, SEEN_DATA, SEEN_NOTHING, SEEN_RESET, SEEN_TCP
from .._core._link import LinkEnd
from .._handshake import current_pid
from ._run import RunState

# Small writes are joined into one receive up to this size.
_MAX_JOIN = 64 * 1024
_PEEK = int(socket.MSG_PEEK)

_checkpoint_if_cancelled = trio.lowlevel.checkpoint_if_cancelled
_cancel_shielded_checkpoint = trio.lowlevel.cancel_shielded_checkpoint
_current_task = trio.lowlevel.current_task
_reschedule = trio.lowlevel.reschedule
_wait_task_rescheduled = trio.lowlevel.wait_task_rescheduled
_ABORTED = trio.lowlevel.Abort.SUCCEEDED


def stream_error(exc: OSError) -> BaseException:
    """The one translation of a socket error into trio's stream vocabulary,
    as ``trio.SocketStream`` makes it."""
    if exc.errno in (errno.EBADF, errno.ENOTSOCK):
        return trio.ClosedResourceError("this socket was already closed")
    error = trio.BrokenResourceError(f"socket connection broken: {exc}")
    error.__cause__ = exc
    return error


class TrioEnd:
    """One end of a friend link living in a trio run."""

    _end: LinkEnd
    _state: RunState
    _closed: bool
    _reader: Optional[trio.lowlevel.Task]
    _writer: Optional[trio.lowlevel.Task]
    _sockname: Any  # its address and its friend's, as the socket's
    _peername: Any

    def _init_end(self, end: LinkEnd, state: RunState) -> None:
        self._end = end
        self._out = end.outgoing
        self._in = end.incoming
        self._state = state
        self._closed = False
        self._reader = None  # parked waiting for bytes
        self._writer = None  # parked waiting for room

    # -- what each kind of end says ----------------------------------------
    def _closed_error(self) -> BaseException:
        """What a call on this end raises once it is closed."""
        raise NotImplementedError

    def _broken(self, exc: LinkBrokenError) -> BaseException:
        """The translation of a link failure for this kind of end."""
        raise NotImplementedError

    # -- the link --------------------------------------------------------
    def _hook_in(self) -> None:
        """Hook into the link (on the run's thread)."""
        self._state.streams[id(self)] = weakref.ref(self)
        ref = weakref.ref(self)
        # For friendsock.links(): trio has no paused reading; a writer
        # parked waiting for room is paused writing.
        def describe() -> Optional[Tuple[Optional[bool], bool, Optional[str]]]:
            end = ref()
            return None if end is None else (None, end._writer is not None, "trio")

        self._end.describe = describe
        # The real descriptor is seen only through the end's FriendSocket
        # (fileno()), which reveals it: the friend's FIN waits for that.
        self._end.fd_hidden = True
        readable, writable = self._hooks()
        self._out.attach_writer(writable)
        self._in.attach_reader(readable)

    def _hooks(self) -> Tuple[Callable[[], None], Callable[[], None]]:
        """The hooks the friend calls. They hold this end weakly: an end its
        owner dropped is collected (and resets its friend) even while the
        friend lives. A friend on another thread hands each wake-up to our
        run (one per burst: the channel notifies once until we look again)."""
        ref = weakref.ref(self)
        # TrioEnd's own, not looked up on the end: one whose link went on
        # over TCP is of trio's socket class by the time its tasks are woken.
        wake_reader_of, wake_writer_of = TrioEnd._wake_reader, TrioEnd._wake_writer
        run_gone_of = TrioEnd._run_gone

        def wake_reader() -> None:
            end = ref()
            if end is not None:
                wake_reader_of(end)

        def wake_writer() -> None:
            end = ref()
            if end is not None:
                wake_writer_of(end)

        if not self._end.link.threaded:
            return wake_reader, wake_writer
        run_sync_soon = self._state.token.run_sync_soon

        def posted_to_run(wake: Callable[[], None]) -> Callable[[], None]:
            def remote() -> None:
                try:
                    run_sync_soon(wake)
                except trio.RunFinishedError:
                    end = ref()
                    if end is not None:
                        run_gone_of(end)

            return remote

        return posted_to_run(wake_reader), posted_to_run(wake_writer)

    def _unhook(self) -> None:
        self._end.describe = None
        self._in.notify_readable = None
        self._out.notify_writable = None

    def _close_end(self) -> None:
        """Close this end: tasks parked on it wake up to find it closed."""
        self._closed = True
        self._wake_reader()
        self._wake_writer()
        self._unhook()
        self._state.streams.pop(id(self), None)
        self._show_fin()
        self._end.close()

    def _show_fin(self) -> None:
        """Done writing: the real socket's FIN, by the link's rule
        (``_friend_socket.show_fin``)."""
        raise NotImplementedError

    def _run_gone(self) -> None:
        """Our run ended with this end open (called on whatever thread found
        out). The friend sees what a process that dies leaves behind: a
        reset, after the bytes already in its receive buffer."""
        if self._closed or self._end.closed:  # (closed by a move to TCP: nothing to reset)
            return
        self._closed = True
        self._unhook()
        self._end.went_away()

    def _warn_unclosed(self, warn: Any = warnings.warn) -> None:
        """Collected open: warn, and close as a socket collected unclosed
        (what was queued still goes). The collector may run on any thread,
        even inside a channel's lock: the run does the closing. The warning
        names the socket as the stdlib's finalizer does on the TCP path
        ("unclosed <socket.socket ..."), so warning filters match alike."""
        state = getattr(self, "_state", None)  # None: never hooked in
        if state is None or self._closed or state.pid != current_pid():
            return
        try:
            warn(f"unclosed <socket.socket fd=-1, laddr={self._sockname!r}, "
                 f"raddr={self._peername!r} [friend]>",
                 ResourceWarning, source=self)
        finally:  # the warning an error: the friend must not wait forever
            self._closed = True
            state.streams.pop(id(self), None)
            end = self._end
            try:
                state.token.run_sync_soon(end.abort)
            except trio.RunFinishedError:
                close_when_safe(end.went_away)

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
    # friend's wake-up or our close reschedules it, a cancel aborts it.
    def _abort_reader(self, _: Any) -> trio.lowlevel.Abort:
        self._reader = None
        return _ABORTED

    def _abort_writer(self, _: Any) -> trio.lowlevel.Abort:
        self._writer = None
        return _ABORTED

    # -- receiving and waiting for room ------------------------------------
    async def _receive(self, max_bytes: int, peek: bool = False) -> bytes:
        """Up to ``max_bytes`` bytes, b"" at EOF; a checkpoint. Cancelled,
        nothing was consumed. ``peek`` (``MSG_PEEK``): nor otherwise."""
        await _checkpoint_if_cancelled()
        channel = self._in
        if channel.queued and not self._closed:  # the common case, first
            data = channel.peek(max_bytes) if peek else channel.pull(max_bytes, _MAX_JOIN)
            if data:  # (b"": moved to TCP meanwhile, see below)
                await _cancel_shielded_checkpoint()
                return data
        parked = False
        while True:
            if self._closed:
                raise self._closed_error()
            seen = channel.seen()
            if seen is SEEN_DATA:
                data = channel.peek(max_bytes) if peek else channel.pull(max_bytes, _MAX_JOIN)
                if not data:
                    continue
                break
            if seen is SEEN_NOTHING:
                channel.begin_drain()  # the next push notifies us again
                if channel.seen() is not SEEN_NOTHING:
                    continue
                if self._reader is not None:  # as trio's wait_readable on one fd
                    raise trio.BusyResourceError("another task is already reading from this socket")
                self._reader = _current_task()
                await _wait_task_rescheduled(self._abort_reader)
                parked = True
                if channel.queued and not self._closed:  # woken by a write, as a rule
                    data = channel.peek(max_bytes) if peek else channel.pull(max_bytes, _MAX_JOIN)
                    if data:
                        break
                continue
            if seen is SEEN_RESET:
                error = self._end.take_error()
                if error is not None:
                    raise self._broken(error)
            if seen is SEEN_TCP:  # moved to TCP (LinkEnd.over_tcp): trio's own socket by now
                return await self.recv(max_bytes, _PEEK if peek else 0)  # type: ignore[attr-defined]
            data = b""  # EOF
            break
        if not parked:
            await _cancel_shielded_checkpoint()
        return data

    async def _send_all(self, data: bytes) -> None:
        """Queue all of ``data`` (not empty), then wait until what we queued
        fits in ``sndbuf + friend rcvbuf``; a checkpoint. Cancelled while
        waiting, the bytes stay queued and still arrive, in order."""
        await _checkpoint_if_cancelled()
        out = self._out
        try:
            out.push(data)
        except FriendError as refused:
            if out.state is CHANNEL_TCP:
                # Moved to TCP meanwhile (LinkEnd.over_tcp): trio's own socket by now.
                view = memoryview(data)
                while view:
                    view = view[await self.send(view):]  # type: ignore[attr-defined]
                return
            error = self._end.push_refused(refused)
            if error is not None:
                raise self._broken(error) from None
        if (out.room() >= 0 and not out.reader_closed) or \
                not await self._wait_for_room(0, raise_broken=True):
            await _cancel_shielded_checkpoint()

    async def _wait_for_room(self, threshold: int, raise_broken: bool) -> bool:
        """Until ``queued - (sndbuf + friend rcvbuf) <= threshold``, or the
        friend stopped reading. Returns whether it parked (a checkpoint)."""
        out = self._out
        parked = False
        while True:
            if self._closed:
                raise self._closed_error()
            if out.reader_closed:
                error = self._end.pending_send_error() if raise_broken else None
                if error is not None:
                    raise self._broken(error)
                return parked
            if out.wake_writer_at(threshold):
                return parked
            if self._writer is not None:  # as trio's wait_writable on one fd
                raise trio.BusyResourceError("another task is already writing to this socket")
            self._writer = _current_task()
            await _wait_task_rescheduled(self._abort_writer)
            parked = True
