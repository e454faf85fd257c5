"""What both sides of a friend transport share: its state (the slots every
part of :class:`~friendsock._asyncio._transport.FriendTransport` reads and
sets), and how its connection ends: a fatal error, ``abort()``, the
protocol's ``connection_lost()``, a loop that closes with it open, one left
open for the collector.

The read side (``_transport_reads``) and the write side
(``_transport_writes``) build on it; ``_transport`` makes the transport
and hooks it into the link.
"""

from __future__ import annotations

import asyncio
import contextvars
import warnings
from asyncio.log import logger  # what a loop's own transport says, said where it says it
from asyncio.transports import _FlowControlMixin
from typing import Any, Optional

from .._core._channel import Channel
from .._core._link import LinkEnd
from .._friend_socket import FriendSocket, show_fin
from .._handshake import current_pid
from ._loop_state import LoopState
from ._wakeups import DrainQueue


class TransportBase(_FlowControlMixin):
    """The state of one end of a friend link as an ``asyncio.Transport``,
    and the way its connection ends. Set up by ``FriendTransport.__init__``.

    Of asyncio's flow-control base (as its socket transports) it keeps only
    the class: its own flow control is the write side's; the stdlib loop's
    ``sendfile()`` (and others' code) checks for that class."""

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
        "_read_shut",
        "_conn_lost",
        "_paused_reading",
        "_drains",
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

    _loop: asyncio.AbstractEventLoop
    _end: LinkEnd
    _out: Channel
    _in: Channel
    _protocol: asyncio.BaseProtocol
    _buffered: bool
    _server: Any
    _closing: bool  # close() or abort() was called
    _close_called: bool
    _closed: bool  # connection_lost() ran
    _eof: bool  # write_eof() was called
    _eof_delivered: bool
    _read_shut: bool  # its socket's shutdown(SHUT_RD)
    _conn_lost: int
    _paused_reading: bool
    _protocol_paused: bool
    _low_water: int
    _high_water: int
    _drains: DrainQueue
    _context: contextvars.Context
    _resume_context: Optional[contextvars.Context]
    _state: LoopState
    _sock: Any
    _sockname: Any
    _peername: Any
    _socket: Optional[FriendSocket]

    def __del__(self, _warn: Any = warnings.warn) -> None:
        if not self._closed and not self._closing and self._state.pid == current_pid():
            try:
                _warn(f"unclosed transport {self!r}", ResourceWarning, source=self)
            finally:  # the warning an error: the friend must not wait forever
                self._end.owner = None
                self._end.abort()

    def _check_alive(self) -> None:
        """On uvloop, as its transports: RuntimeError once connection_lost()
        has returned (the protocol is let go of then)."""
        if self._closed and self._protocol is None and self._state.refuses_writes_once_lost:
            raise RuntimeError(f"unable to perform operation on {self!r}; the handler is closed")

    def _show_fin(self) -> None:
        """Our FIN on the real socket too, as the link's rule says (see
        ``LinkEnd.fin_to_show``): the friend's descriptor then polls
        readable once we are done writing, as a TCP socket's does."""
        show_fin(self._end, self._sock)

    # -- errors and the end ----------------------------------------------
    def discard(self) -> None:
        """The transport never got going (its protocol failed as it
        started): its end closes as the socket would, and no callback runs."""
        self._closing = self._closed = True
        self._end.owner = None
        self._end.close()

    def abort(self) -> None:
        self._force_close(None)

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
        once, as the loop's own, with its protocol (and what that holds).
        (A drain scheduled before finds the transport closing.)"""
        self._end.describe = self._end.owner = None
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

