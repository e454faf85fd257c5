"""The asyncio transport of one friend end: :class:`FriendTransport`, made
and hooked into its link here, and what it answers as a ``BaseTransport``
(its extra info, its protocol); its read side is ``_transport_reads``, its
write side and flow control ``_transport_writes``, its state and how its
connection ends ``_transport_base``.

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
import socket
from asyncio import format_helpers, sslproto
from asyncio.constants import _SendfileMode
from functools import partial
from types import MappingProxyType
from typing import Any, Callable, Mapping, Optional, Tuple

from .._core._addresses import shared_host
from .._core._link import LinkEnd
from .._friend_socket import FriendSocket, UvloopFriendSocket, copy_buffer_sizes
from ._loop_state import LoopState, loop_name, loop_state
from ._transport_reads import ReadSide
from ._transport_writes import WriteSide

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


class FriendTransport(ReadSide, WriteSide):
    """One end of a friend link, as an ``asyncio.Transport``."""

    # TLS runs over a friend link as over TCP: the stdlib loop's start_tls()
    # refuses transports that do not declare this.
    _start_tls_compatible = True
    # sendfile() as on a socket transport the loop cannot sendfile(2) to:
    # the file read and written, with this transport's flow control.
    _sendfile_compatible = _SendfileMode.FALLBACK

    __slots__ = ()

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
        self._socket = None  # made once asked for
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
        self._read_shut = False
        self._conn_lost = 0
        self._paused_reading = False
        self._protocol_paused = False
        self._state = state = state or loop_state(loop)
        self._buffered = fills_buffers(state, protocol)
        self._low_water, self._high_water = state.default_write_limits
        self._drains = state.drains
        # What the protocol's data_received and eof_received run in: a copy
        # of the context the transport is made in, as the loop's own
        # transports copy it, never the context of the friend's write().
        self._context = contextvars.copy_context()
        self._resume_context = None  # see _call_flow_control
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

    def _describe_end(self) -> Tuple[bool, bool, str]:
        """For friendsock.links(): paused reading, paused writing, the loop."""
        return (self._paused_reading, self._protocol_paused, loop_name(self._loop))

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
                wrapped = self._socket = kind(self._sock, self._end, self._buffer_sizes_changed,
                                              self._reading_shut)
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

    def set_protocol(self, protocol: asyncio.BaseProtocol) -> None:
        self._protocol = protocol
        self._buffered = fills_buffers(self._state, protocol)
        if isinstance(protocol, sslproto.SSLProtocol):
            # Its TLS transport says it rides a friend link once lost too,
            # as this end does (3.10's is lost at the peer's close_notify;
            # a lost layer no longer asks the transport under it).
            protocol._extra.setdefault(FRIEND_END_INFO, self)

    def get_protocol(self) -> asyncio.BaseProtocol:
        return self._protocol
