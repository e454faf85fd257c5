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
``_wakeups.RemoteDrainQueue``). The loop's :class:`LoopState` knows the
ends living there, so a loop that closes with ends open resets their friends
instead of leaving them hanging.
"""

from __future__ import annotations

import asyncio
import contextvars
import errno
import os
import socket
import warnings
from asyncio import format_helpers, sslproto
from asyncio.log import logger  # what a loop's own transport says, said where it says it
from asyncio.constants import _SendfileMode
from asyncio.transports import _FlowControlMixin
from functools import partial
from types import MappingProxyType
from typing import Any, Callable, Mapping, Optional, Tuple

from .._core._addresses import shared_host
from .._core._errors import ChannelShutdownError, LinkBrokenError, PeerResetError
from .._core._channel import CHANNEL_OPEN, SEEN_EOF, SEEN_RESET, Seen
from .._core._link import LinkEnd
from .._friend_socket import FriendSocket, UvloopFriendSocket, copy_buffer_sizes, show_fin
from .._handshake import current_pid
from ._loop_state import DEFAULT_HIGH_WATER, LoopState, loop_state
from ._wakeups import ASK_AT

# As asyncio: after this many writes to a lost connection, warn on each.
_LOG_THRESHOLD_FOR_CONNLOST_WRITES = 5
# Largest chunk handed to data_received in one call (asyncio's socket read
# size); whole writes up to it go by reference, a larger one is cut.
_MAX_CHUNK = 256 * 1024
# Small writes are joined into one data_received up to this size; larger
# ones go over by reference, uncopied.
_MAX_JOIN = 64 * 1024


_NO_EXTRA: Mapping[str, Any] = MappingProxyType({})


def set_nodelay(loop: asyncio.AbstractEventLoop, sock: Any) -> None:
    """TCP_NODELAY on ``sock`` as ``loop``'s own TCP transport sets it, so
    the socket answers the same on both paths: uvloop on every TCP socket,
    asyncio on those made with proto IPPROTO_TCP (not 0)."""
    if isinstance(loop, asyncio.BaseEventLoop) and sock.proto != socket.IPPROTO_TCP:
        return
    try:
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    except OSError:  # released already
        pass


# The get_extra_info() name a friend end answers with itself: TLS
# transports over it (asyncio's and uvloop's) pass the question down.
FRIEND_END_INFO = "friendsock.end"


def fills_buffers(state: LoopState, protocol: Any) -> bool:
    """Whether the transport hands ``protocol`` its bytes through
    ``get_buffer()``/``buffer_updated()``, as the loop's own would."""
    if isinstance(protocol, asyncio.BufferedProtocol):
        return True
    return (state.buffered_by_duck_type and not isinstance(protocol, asyncio.Protocol)
            and hasattr(protocol, "get_buffer"))


def _fail_as_writelines_once_closed(list_of_data: Any, close_called: bool) -> None:
    """What the stdlib transport's writelines() raises once closed, on the
    Pythons whose writelines() does not look for that (see LoopState)."""
    for data in list_of_data:
        memoryview(data)  # (a str: TypeError, first)
    if close_called:
        raise TypeError("'NoneType' object is not callable")
    raise AttributeError("'NoneType' object has no attribute '_add_writer'")


def _no_drain() -> None:
    """A closed transport's drain: nothing to deliver."""


class FriendTransport(_FlowControlMixin):
    """One end of a friend link, as an ``asyncio.Transport``.

    Of asyncio's flow-control base (as its socket transports) it keeps only
    the class: its own flow control is below; the stdlib loop's
    ``sendfile()`` (and others' code) checks for that class."""

    # TLS runs over a friend link as over TCP: the stdlib loop's start_tls()
    # refuses transports that do not declare this.
    _start_tls_compatible = True
    # sendfile() as on a socket transport the loop cannot sendfile(2) to:
    # the file read and written, with this transport's flow control.
    _sendfile_compatible = _SendfileMode.FALLBACK

    __slots__ = (
        "_end",
        "_out",
        "_in",
        "_protocol",
        "_buffered",
        "_server",
        "_closing",
        "_close_called",
        "_closed",
        "_eof",
        "_eof_delivered",
        "_conn_lost",
        "_paused_reading",
        "_drains",
        "_drain_now",
        "_context",
        "_resume_context",
        "_state",
        "_sock",
        "_sockname",
        "_peername",
        "_socket",
        # As asyncio's socket transports: test code may replace a method on
        # one transport (mock.patch.object).
        "__dict__",
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
        # Not asyncio's per-transport extra dict: what get_extra_info
        # answers is in slots (thousands of idle links weigh less). Nor the
        # flow-control base's __init__: every field it sets is set here.
        self._extra = _NO_EXTRA
        self._sock = sock
        self._sockname = shared_host(sockname)
        self._peername = shared_host(peername)
        self._socket: Optional[FriendSocket] = None  # made once asked for
        self._loop = loop
        self._end = end
        self._out = end.outgoing
        self._in = end.incoming
        self._protocol = protocol
        self._server = server
        self._closing = False  # close() or abort() was called
        self._close_called = False
        self._closed = False  # connection_lost() ran
        self._eof = False  # write_eof() was called
        self._eof_delivered = False
        self._conn_lost = 0
        self._paused_reading = False
        self._protocol_paused = False
        self._state = state = state or loop_state(loop)
        self._buffered = fills_buffers(state, protocol)
        self._low_water, self._high_water = state.default_write_limits
        self._drains = state.drains
        self._drain_now = self._drain  # bound once: scheduled per burst
        # What the protocol's data_received and eof_received run in: a copy
        # of the context the transport is made in, as the loop's own
        # transports copy it, never the context of the friend's write().
        self._context = contextvars.copy_context()
        self._resume_context: Optional[contextvars.Context] = None  # see _call_flow_control
        if server is not None:
            server._attach()

    def start(self, reading: bool = True) -> None:
        """Hook into the link and tell the protocol (its connection_made);
        with ``reading=False`` incoming bytes wait for :meth:`start_reading`."""
        # Found through its link by a loop that closes with it open (see
        # LoopState.loop_closed); no registry entry per end.
        self._end.owner = self  # (which also describes the end to links())
        self._out.attach_writer(self._hooks()[1])
        # The kernel sizes a socket's buffers when the connection is set up
        # (SO_SNDBUF grows from tcp_wmem[1]); the link was made before that.
        # (A socketless link, and one over a reused connection, was made
        # with its ends' sizes.)
        if not self._end.link.sizes_settled and self._sock.fileno() >= 0:
            copy_buffer_sizes(self._sock, self._end)
        if not self._connection_made() and not isinstance(self._loop, asyncio.BaseEventLoop):
            # uvloop starts reading only once connection_made returned.
            self._paused_reading = True
        if reading:
            self.start_reading()

    def start_reading(self) -> None:
        """Take the friend's bytes (and its EOF or reset) from now on: what
        it wrote meanwhile waits in the link. create_connection starts
        reading once it returns, as a loop's own transport reads only after
        its waiter woke the caller, so no data_received comes first."""
        if self._closing:  # reads no more (its connection_lost detaches)
            return
        if self._in.attach_reader(self._hooks()[0]):
            self._schedule_drain()

    def _hooks(self) -> Tuple[Callable[[], None], Callable[[], None]]:
        """(readable, writable): what the link calls when there is
        something to read, or room to write."""
        if self._end.link.threaded:
            # The friend runs on another thread: what it asks of us is
            # handed to our loop (the reader's loop, for its bytes).
            return self._remote_hooks()
        # readable: the friend, on this loop, wrote to us (inside its
        # write()). A bound method per end: a partial would cost no fewer
        # instructions per message and some 190 bytes more per idle end.
        return self._schedule_drain, self._writable

    def _schedule_drain(self) -> None:
        """From this loop's own thread: deliver soon, never now. Not even
        to asyncio's own stream protocol, whose feed runs no user code: fed
        at once, its reader's task would wake before the writer's next step,
        where over TCP the reader learns of the bytes only at the loop's next
        poll (aioftp's server answers, then frees the data port a step
        later, and its tests count on the port being free when the answer
        is read)."""
        # See DrainQueue: for the running drain's rounds, or a callback of its own.
        drains = self._drains
        if drains.running:
            drains.waiting.append((self._drain_now, self._context))
        else:
            self._loop.call_soon(self._drain_now, context=self._context)

    def _connection_made(self) -> bool:
        """The protocol's connection_made, as the loop's own transports call
        it: a loop callback, in a copy of the current context, whose
        exception goes to the exception handler ("Exception in callback")
        and leaves the connection as it is (asyncio and uvloop keep it: a
        later close() gives connection_lost(None)). False if it raised.

        asyncio's transports look connection_made up as they are made: a
        protocol without one is an AttributeError from create_connection.
        uvloop's look it up when they call it: missing, it fails as a
        callback that raised."""
        protocol = self._protocol
        if self._state.one_context_per_transport:  # uvloop's
            context = self._context
            callback = getattr(protocol, "connection_made", None)
            if callback is None:
                self._loop.call_exception_handler({
                    "message": f"Exception in callback {type(self).__name__}._connection_made",
                    "exception": AttributeError(
                        f"{type(protocol).__name__!r} object has no attribute 'connection_made'"),
                    "transport": self,
                })
                return False
        else:
            callback = protocol.connection_made
            context = contextvars.copy_context()
        try:
            context.run(callback, self)
        except (SystemExit, KeyboardInterrupt):
            raise
        except BaseException as exc:
            self._loop.call_exception_handler({
                "message": f"Exception in callback {format_helpers._format_callback_source(callback, (self,))}",
                "exception": exc,
                "handle": asyncio.Handle(callback, (self,), self._loop, context),
            })
            return False
        return True

    def discard(self) -> None:
        """The transport never got going (its protocol failed as it
        started): its end closes as the socket would, and no callback runs."""
        self._closing = self._closed = True
        self._end.owner = None
        self._end.close()

    def _describe_end(self) -> Tuple[bool, bool, str]:
        """For friendsock.links(): paused reading, paused writing, the loop."""
        loop = self._loop
        return (self._paused_reading, self._protocol_paused,
                f"{type(loop).__module__}.{type(loop).__qualname__} at {id(loop):#x}")

    def _remote_hooks(self) -> Tuple[Callable[[], None], Callable[[], None]]:
        """The hooks the friend's thread calls: one wake-up of our loop per
        burst (the channel notifies once until we drain), none per write;
        both through the loop's one remote queue, which also finds a loop
        that closed unseen (and tears it down)."""
        add_remote = self._state.remote().add
        return partial(add_remote, partial(self._context.run, self._drain)), partial(add_remote, self._writable)

    def __repr__(self) -> str:
        info = [self.__class__.__name__]
        if self._closed:
            info.append("closed")
        elif self._closing:
            info.append("closing")
        try:
            info.append(f"fd={self._sock.fileno()}")
        except OSError:  # the real socket is already released
            pass
        info.append(f"peer={self._peername!r}")
        info.append("read=" + ("idle" if not self.is_reading() else "polling"))
        info.append(f"queued={self._out.queued}")
        info.append(f"write_bufsize={self._out.write_buffer_size()}")
        if self._eof:
            info.append("eof-sent")
        return "<{}>".format(" ".join(info))

    def __del__(self, _warn: Any = warnings.warn) -> None:
        if not self._closed and not self._closing and self._state.pid == current_pid():
            try:
                _warn(f"unclosed transport {self!r}", ResourceWarning, source=self)
            finally:  # the warning an error: the friend must not wait forever
                self._end.owner = None
                self._end.abort()

    # -- BaseTransport ----------------------------------------------------
    def get_extra_info(self, name: str, default: Any = None) -> Any:
        if name == "socket":
            wrapped = self._socket
            if wrapped is None:
                # uvloop makes a transport's socket object when first asked,
                # and none once the transport is gone; asyncio always has one.
                if self._closed and not isinstance(self._loop, asyncio.BaseEventLoop):
                    return None
                kind = FriendSocket if isinstance(self._loop, asyncio.BaseEventLoop) else UvloopFriendSocket
                wrapped = self._socket = kind(self._sock, self._end, self._buffer_sizes_changed)
                # Set once somebody can look (no segment of ours is ever
                # delayed: the bytes do not go through the socket).
                set_nodelay(self._loop, wrapped)
            return wrapped
        if name == "peername":
            return self._peername
        if name == "sockname":
            return self._sockname
        if name == FRIEND_END_INFO:
            return self
        return self._extra.get(name, default)

    def is_closing(self) -> bool:
        return self._closing

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

    def set_protocol(self, protocol: asyncio.BaseProtocol) -> None:  # type: ignore[override]
        self._protocol = protocol
        self._buffered = fills_buffers(self._state, protocol)
        if isinstance(protocol, sslproto.SSLProtocol):
            # Its TLS transport says it rides a friend link once lost too,
            # as this end does (3.10's is lost at the peer's close_notify;
            # a lost layer no longer asks the transport under it).
            protocol._extra.setdefault(FRIEND_END_INFO, self)  # type: ignore[attr-defined]

    def get_protocol(self) -> asyncio.BaseProtocol:  # type: ignore[override]
        return self._protocol

    # -- ReadTransport ----------------------------------------------------
    def is_reading(self) -> bool:
        return not self._paused_reading and not self._closing

    @property
    def _paused(self) -> bool:
        """The loop's own transports' private flag, which code reaching past
        their API reads (uvloop's own tests among it): asyncio's is set by
        pause_reading() and unset by resume_reading(); uvloop's says the
        transport reads no more."""
        if isinstance(self._loop, asyncio.BaseEventLoop):
            return self._paused_reading
        return not self.is_reading()

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
        """Deliver what is queued now, then EOF or the reset if that is all
        that is left. A push from here on schedules the next drain: a writer
        refilling from resume_writing() (called from this loop) must not
        keep the event loop in one callback forever. The outermost drain
        runs the drains asked for meanwhile as it ends (see DrainQueue)."""
        if self._paused_reading or self._closing or self._eof_delivered:
            # The notification stays taken: no wake-ups while paused
            # (resume_reading() drains), nor after EOF, when asyncio stops
            # reading for good (a later reset is learnt by writing).
            return
        channel = self._in
        drains = self._drains
        outermost = not drains.running
        if outermost:
            if drains.left <= 0:  # the loop's turn has had its share
                drains.defer(self._drain_now, self._context)
                return
            drains.running = True
        try:
            if self._buffered:
                self._drain_into_buffers()
            else:  # data_received(), the hot path: inline
                try:
                    # The first chunk with the same lock round trip as begin_drain.
                    data, budget = channel.begin_pull(_MAX_CHUNK, _MAX_JOIN)
                    while data:
                        # (Looked up each time: set_protocol() may come.)
                        self._protocol.data_received(data)  # type: ignore[attr-defined]
                        if budget <= 0 or not channel.queued or self._paused_reading or self._closing:
                            break
                        data = channel.pull(_MAX_CHUNK, _MAX_JOIN)
                        budget -= len(data)
                except (SystemExit, KeyboardInterrupt):
                    raise
                except BaseException as exc:
                    self._fatal_error(exc, "Fatal error: protocol.data_received() call failed.")
            # The writer is done (else more may come), and this end still reads.
            if channel.state is not CHANNEL_OPEN and not (self._paused_reading or self._closing):
                self._drain_end(channel.seen())
        except BaseException:
            if outermost:
                drains.stop()
            raise
        if outermost:
            drains.left -= 1
            if drains.waiting or drains.left <= ASK_AT:
                drains.run_rounds(self._context)
            else:
                drains.running = False

    def _drain_end(self, seen: Seen) -> None:
        """The writer is done: EOF or the reset once its bytes are read."""
        if seen is SEEN_RESET:
            error = self._end.take_error()
            if error is not None:
                self._force_close(error.as_os_error())
                return
            self._deliver_eof()  # reported already, as a read gets EOF then
        elif seen is SEEN_EOF:
            self._deliver_eof()
        # DATA: newer bytes, their drain is scheduled (EOF after them).

    def _drain_into_buffers(self) -> None:
        """``get_buffer()``/``buffer_updated()`` with what is queued now,
        until reading stops. Each call's failure is reported as asyncio
        reports it."""
        channel = self._in
        channel.begin_drain()
        budget = channel.queued
        while budget > 0 and channel.queued:
            protocol = self._protocol
            try:
                buffer = protocol.get_buffer(self._state.buffer_size_hint)  # type: ignore[attr-defined]
                if not len(buffer):
                    raise RuntimeError("get_buffer() returned an empty buffer")
            except (SystemExit, KeyboardInterrupt):
                raise
            except BaseException as exc:
                self._fatal_error(exc, "Fatal error: protocol.get_buffer() call failed.")
                return
            size = channel.pull_into(memoryview(buffer).cast("B"))
            budget -= size
            try:
                protocol.buffer_updated(size)  # type: ignore[attr-defined]
            except (SystemExit, KeyboardInterrupt):
                raise
            except BaseException as exc:
                self._fatal_error(exc, "Fatal error: protocol.buffer_updated() call failed.")
                return
            if self._paused_reading or self._closing:
                return

    def _deliver_eof(self) -> None:
        self._eof_delivered = True
        if self._state.stops_reading_at_eof:
            self._paused_reading = True
        try:
            keep_open = self._protocol.eof_received()  # type: ignore[attr-defined]
        except (SystemExit, KeyboardInterrupt):
            raise
        except BaseException as exc:
            self._fatal_error(exc, "Fatal error: protocol.eof_received() call failed.")
            return
        if not keep_open:
            self.close()

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
        except ChannelShutdownError:  # its socket was shut for writing: send() gets EPIPE
            self._fatal_error(BrokenPipeError(errno.EPIPE, os.strerror(errno.EPIPE)),
                              "Fatal write error on socket transport")
            return
        except PeerResetError:
            try:
                self._end.send_refused()
            except LinkBrokenError as exc:
                self._fatal_error(exc.as_os_error(), "Fatal write error on socket transport")
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

    def _show_fin(self) -> None:
        """Our FIN on the real socket too, as the link's rule says (see
        ``LinkEnd.fin_to_show``): the friend's descriptor then polls
        readable once we are done writing, as a TCP socket's does."""
        show_fin(self._end, self._sock)

    def can_write_eof(self) -> bool:
        return True

    def abort(self) -> None:
        self._force_close(None)

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

    def _check_alive(self) -> None:
        """On uvloop, as its transports: RuntimeError once connection_lost()
        has returned (the protocol is let go of then)."""
        if self._closed and self._protocol is None and self._state.refuses_writes_once_lost:
            raise RuntimeError(f"unable to perform operation on {self!r}; the handler is closed")

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

    # -- errors and the end ----------------------------------------------
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
        self._end.drop_own_buffer()
        self._closing = True
        self._conn_lost += 1
        self._schedule_connection_lost(exc)

    def _schedule_connection_lost(self, exc: Optional[BaseException]) -> None:
        context = self._context if self._state.one_context_per_transport else None
        self._loop.call_soon(self._call_connection_lost, exc, context=context)

    def _call_connection_lost(self, exc: Optional[BaseException]) -> None:
        if self._closed:
            return
        self._closed = True
        try:
            # (typeshed says Exception; the loops pass on what they caught)
            self._protocol.connection_lost(exc)  # type: ignore[arg-type]
        finally:
            self._show_fin()
            self._end.close()
            self._unhook()
            # As the loops' own transports: get_protocol() is None from now
            # on, and a protocol that keeps its transport makes no cycle.
            self._protocol = None  # type: ignore[assignment]
            server = self._server
            if server is not None:
                self._server = None
                server._detach()

    def _unhook(self) -> None:
        """Done with the link. A transport dropped from then on goes at
        once, as the loop's own, with its protocol (and what that holds):
        the bound drain was a reference cycle."""
        self._end.describe = self._end.owner = None
        self._in.notify_readable = None
        self._out.notify_writable = None
        self._drain_now = _no_drain

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

