"""The write side of a friend transport: ``write()``, ``writelines()``,
``write_eof()``, ``close()`` once what is queued is flushed, and flow
control (``pause_writing()``/``resume_writing()`` around the write
buffer's limits, as the friend reads).
"""

from __future__ import annotations

import asyncio
import contextvars
from asyncio.log import logger  # what a loop's own transport says, said where it says it
from typing import Any, Callable, Optional, Tuple

from .._core._errors import FriendError, LinkBrokenError
from ._loop_state import DEFAULT_HIGH_WATER
from ._transport_base import TransportBase

# As asyncio: after this many writes to a lost connection, warn on each.
_LOG_THRESHOLD_FOR_CONNLOST_WRITES = 5


def _fail_as_writelines_once_closed(list_of_data: Any, close_called: bool) -> None:
    """What the stdlib transport's writelines() raises once closed, on the
    Pythons whose writelines() does not look for that (see LoopState)."""
    for data in list_of_data:
        memoryview(data)  # (a str: TypeError, first)
    if close_called:
        raise TypeError("'NoneType' object is not callable")
    raise AttributeError("'NoneType' object has no attribute '_add_writer'")


class WriteSide(TransportBase):
    """A friend transport's writing: the ``asyncio.WriteTransport`` calls,
    and the flow control of its protocol."""

    __slots__ = ()

    # -- BaseTransport ----------------------------------------------------
    def close(self) -> None:
        self._close_called = True
        if self._closing:
            return
        self._closing = True
        if self._out.write_buffer_size() == 0 or self._out.reader_closed:
            self._conn_lost += 1
            self._schedule_connection_lost(None)
        else:
            # Like asyncio: connection_lost once the own buffer is flushed,
            # i.e. once what is queued fits in sndbuf + friend rcvbuf.
            self._wake_me_at(0)

    # -- WriteTransport ---------------------------------------------------
    def write(self, data: Any) -> None:
        # (What is not the common case checks _check_alive() first, as
        # uvloop's write() does.)
        if type(data) is not bytes:
            data = self._bytes_of(data)
        if self._eof:
            self._check_alive()
            raise RuntimeError("Cannot call write() after write_eof()")
        if not data:
            self._check_alive()
            return
        if self._conn_lost:
            self._check_alive()
            if self._conn_lost >= _LOG_THRESHOLD_FOR_CONNLOST_WRITES and self._state.warns_of_lost_writes:
                logger.warning("socket.send() raised exception.")
            self._conn_lost += 1
            return
        out = self._out
        try:
            out.push(data)
        except FriendError as refused:  # (its socket shut for writing, or the friend gone)
            error = self._end.push_refused(refused)
            if error is not None:
                self._fatal_error(error.as_os_error(), "Fatal write error on socket transport")
            return
        if out.queued - out.sndbuf - out.rcvbuf > self._high_water:
            self._maybe_pause_protocol()

    def _bytes_of(self, data: Any) -> Any:
        """What write() sends of ``data``, not bytes, as the loop's own
        transport takes it: bytes (mutable buffers are copied once), or
        ``data`` as it is where write()'s checks of the transport's state
        answer first. asyncio's take bytes, bytearray and memoryview, and
        fail the connection with BufferError on a view that is not
        contiguous (the socket's send() refuses it; before 3.12 one that
        joins a backlog is a TypeError); uvloop's take any
        contiguous buffer (array, ctypes, mmap), once the state checks
        passed."""
        self._check_alive()
        state = self._state
        if state.takes_any_buffer:
            if self._eof or not data or self._conn_lost:
                return data
            try:
                view = memoryview(data)
            except TypeError:
                raise TypeError(f"data argument must be a bytes-like object, not {type(data).__name__!r}") from None
            return view.cast("B").tobytes()  # (TypeError when not contiguous, as uvloop's)
        if not isinstance(data, (bytes, bytearray, memoryview)):
            raise TypeError(f"data argument must be a bytes-like object, not {type(data).__name__!r}")
        if isinstance(data, memoryview) and not data.c_contiguous:
            if self._eof or not data or self._conn_lost:
                return data
            if state.extends_a_bytearray and self._out.write_buffer_size():
                raise TypeError("can't set bytearray slice from memoryview")
            self._fatal_error(BufferError("memoryview: underlying buffer is not C-contiguous"),
                              "Fatal write error on socket transport")
            return b""
        return bytes(data)

    def writelines(self, list_of_data: Any) -> None:
        self._check_alive()
        if self._state.joins_writelines:
            self.write(b"".join(list_of_data))
            return
        # The loop's own: past write_eof() or lost, before the data is
        # looked at; a lost connection counts the call as one write.
        if self._eof:
            raise RuntimeError("Cannot call writelines() after write_eof()")
        if self._state.writelines_fails_once_closed and (self._close_called or self._closed) and list_of_data:
            _fail_as_writelines_once_closed(list_of_data, self._close_called)
        if self._conn_lost:
            self._conn_lost += 1
            return
        for data in list_of_data:
            self.write(data)

    def write_eof(self) -> None:
        self._check_alive()
        if self._eof:
            return
        if self._closing:
            # The close sends the EOF after what is queued. asyncio's
            # transports ignore the call; uvloop's take it, so a write()
            # after it raises.
            if not isinstance(self._loop, asyncio.BaseEventLoop):
                self._eof = True
            return
        self._eof = True
        try:
            self._end.shutdown_write()
        except LinkBrokenError as exc:  # asyncio's shutdown(SHUT_WR) raises it out
            raise exc.as_os_error() from None
        self._show_fin()

    def can_write_eof(self) -> bool:
        return True

    def get_write_buffer_size(self) -> int:
        return self._out.write_buffer_size()

    def get_write_buffer_limits(self) -> Tuple[int, int]:
        return (self._low_water, self._high_water)

    def set_write_buffer_limits(self, high: Optional[int] = None, low: Optional[int] = None) -> None:
        self._check_alive()
        if high is None:
            high = DEFAULT_HIGH_WATER if low is None else 4 * low
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
            self._call_flow_control(self._protocol.pause_writing, pausing=True)
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
            self._call_flow_control(self._protocol.resume_writing, pausing=False)
        except (SystemExit, KeyboardInterrupt):
            raise
        except BaseException as exc:
            self._loop.call_exception_handler({
                "message": "protocol.resume_writing() failed",
                "exception": exc,
                "transport": self,
                "protocol": self._protocol,
            })

    def _call_flow_control(self, callback: Callable[[], None], pausing: bool) -> None:
        """pause_writing() or resume_writing() as the loop's own transports
        call them: uvloop's in a copy of the transport's context; asyncio's
        pause_writing() in the call that filled the buffer (a write()), and
        resume_writing() in a copy of that call's context (their writer
        callback's). Never in the context of the friend's read that made
        room."""
        if self._state.one_context_per_transport:
            self._context.copy().run(callback)
        elif pausing:
            self._resume_context = contextvars.copy_context()
            callback()
        else:
            context, self._resume_context = self._resume_context, None
            (context or self._context.copy()).run(callback)

    def _writable(self) -> None:
        """The reader consumed down to our threshold, or went away."""
        if self._closed or self._conn_lost:
            return
        out = self._out
        if out.reader_closed:
            error = self._end.pending_send_error()
            if error is not None:
                self._force_close(error.as_os_error())
                return
            # The friend read all we wrote, then went (its close may reach
            # us before the wake-up saying our buffer drained): the buffer
            # is flushed, as once TCP has sent it. A close completes, a
            # paused protocol resumes.
        if self._closing:
            if out.write_buffer_size() == 0:
                self._conn_lost += 1
                if self._state.one_context_per_transport:
                    # uvloop's transports: a callback in the transport's context.
                    self._schedule_connection_lost(None)
                else:  # asyncio's: at once, from their writer callback
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
