"""The asyncio transport of one friend end.

It honours the contract of asyncio's socket transports
(``selector_events._SelectorSocketTransport``): callback order, flow control
that pauses and resumes the protocol once each, errors to the loop's
exception handler, ``ResourceWarning`` when left open. Bytes move through the
link's channels; delivery is deferred to the reader's loop, one drain per
burst, so a reply never recurses into the writer's stack.
"""

from __future__ import annotations

import asyncio
import errno
import logging
import warnings
import weakref
from typing import Any, Callable, List, Optional, Tuple

from .._core._errors import PeerResetError
from .._core._link import ChannelState, LinkEnd
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


class _DrainQueue:
    """One loop callback per loop turn runs every drain asked for since the
    last: many busy links cost one loop handle, not one each."""

    __slots__ = ("_call_soon", "_ready", "__weakref__")

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self._call_soon = loop.call_soon
        self._ready: List[Callable[[], None]] = []

    def add(self, drain: Callable[[], None]) -> None:
        ready = self._ready
        ready.append(drain)
        if len(ready) == 1:
            self._call_soon(self._run)

    def _run(self) -> None:
        ready = self._ready
        self._ready = []  # drains asked for from here on run next turn
        for index, drain in enumerate(ready):
            try:
                drain()
            except BaseException:  # only SystemExit/KeyboardInterrupt get here
                for later in ready[index + 1:]:
                    self.add(later)
                raise


_drain_queues: "weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, _DrainQueue]" = (
    weakref.WeakKeyDictionary()
)


def _drain_queue(loop: asyncio.AbstractEventLoop) -> _DrainQueue:
    queue = _drain_queues.get(loop)
    if queue is None:
        queue = _drain_queues[loop] = _DrainQueue(loop)
    return queue


def _reset_error() -> ConnectionResetError:
    return ConnectionResetError(errno.ECONNRESET, "Connection reset by peer")


class FriendTransport(asyncio.Transport):
    """One end of a friend link, as an ``asyncio.Transport``."""

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
        "_peer_reset",
        "_paused_reading",
        "_protocol_paused",
        "_high_water",
        "_low_water",
        "_schedule_drain",
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
        self._peer_reset = False  # a write hit a peer that had closed
        self._paused_reading = False
        self._protocol_paused = False
        self._high_water = _DEFAULT_HIGH_WATER
        self._low_water = _DEFAULT_HIGH_WATER // 4
        drain, add = self._drain, _drain_queue(loop).add
        self._schedule_drain = lambda: add(drain)
        if server is not None:
            server._attach()

    def start(self) -> None:
        """Hook into the link and tell the protocol (its connection_made)."""
        self._in.notify_readable = self._schedule_drain
        self._out.notify_writable = self._writable
        # The kernel sizes a socket's buffers when the connection is set up
        # (SO_SNDBUF grows from tcp_wmem[1]); the link was made before that.
        self._extra["socket"].sync_buffer_sizes()
        try:
            self._protocol.connection_made(self)
        except (SystemExit, KeyboardInterrupt):
            raise
        except BaseException as exc:
            self._fatal_error(exc, "Fatal error: protocol.connection_made() call failed.")
            return
        if self._in.queued or self._in.state is not ChannelState.OPEN:
            self._schedule_drain()

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
        if not self._closed and not self._closing:
            _warn(f"unclosed transport {self!r}", ResourceWarning, source=self)
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
            self._out.wake_writer_at(0)

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
        channel = self._in
        # Deliver only what is queued now; a push from here on schedules the
        # next drain. A writer refilling from resume_writing() (called from
        # this loop) must not keep the event loop in one callback forever.
        channel.begin_drain()
        budget = channel.queued
        try:
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
            if channel.queued:
                return  # newer bytes: their drain is scheduled, EOF after them
            state = channel.state
            if state is ChannelState.RESET:
                self._force_close(_reset_error())
            elif state is ChannelState.EOF and not self._eof_delivered:
                self._eof_delivered = True
                if self._protocol.eof_received():  # type: ignore[attr-defined]
                    return
                self.close()
        except (SystemExit, KeyboardInterrupt):
            raise
        except BaseException as exc:
            self._fatal_error(exc, "Fatal error: protocol.data_received() call failed.")

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
            self._out.wake_writer_at(low)
        self._maybe_pause_protocol()

    # -- flow control -----------------------------------------------------
    def _maybe_pause_protocol(self) -> None:
        if self._out.write_buffer_size() <= self._high_water or self._protocol_paused:
            return
        self._protocol_paused = True
        self._out.wake_writer_at(self._low_water)
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
            # Over TCP the peer's reset fails a transport that still has
            # bytes to send; an idle one learns of it by reading or writing.
            if self._protocol_paused or self._closing:
                self._force_close(_reset_error())
            return
        if self._closing:
            if out.write_buffer_size() == 0:
                self._conn_lost += 1
                self._call_connection_lost(None)
            else:
                out.wake_writer_at(0)
            return
        self._maybe_resume_protocol()
        if self._protocol_paused:
            out.wake_writer_at(self._low_water)

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
        # TCP takes the first write after the peer closed and answers it with
        # a reset; the next write fails: EPIPE once the peer's FIN came in.
        if not self._peer_reset:
            self._peer_reset = True
            return
        if self._in.state is ChannelState.EOF:
            exc: OSError = BrokenPipeError(errno.EPIPE, "Broken pipe")
        else:
            exc = _reset_error()
        self._fatal_error(exc, "Fatal write error on socket transport")

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
            server = self._server
            if server is not None:
                self._server = None
                server._detach()
