"""The trio stream of one friend end.

A :class:`FriendStream` honours ``trio.abc.HalfCloseableStream`` as
``trio.SocketStream`` does: every method is a checkpoint, a cancelled call
consumes nothing, two tasks in the same direction get ``BusyResourceError``,
a closed stream ``ClosedResourceError`` and a reset link
``BrokenResourceError``. Bytes move through the link's channels (see
``_end``).
"""

from __future__ import annotations

import contextlib
import operator
import socket
from typing import Any, Optional, Union

import trio

from .._core._errors import LinkBrokenError
from .._core._link import LinkEnd
from .._friend_socket import FriendSocket, show_fin
from ._end import TrioEnd, stream_error
from ._run import RunState

# As trio.SocketStream.receive_some.
DEFAULT_RECEIVE_SIZE = 65536

_checkpoint_if_cancelled = trio.lowlevel.checkpoint_if_cancelled
_cancel_shielded_checkpoint = trio.lowlevel.cancel_shielded_checkpoint


def broken(exc: LinkBrokenError) -> BaseException:
    """A link failure in trio's stream vocabulary (see ``stream_error``)."""
    return stream_error(exc.as_os_error())


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


class FriendStream(TrioEnd, trio.abc.HalfCloseableStream):
    """One end of a friend link, as a ``trio.abc.HalfCloseableStream``.

    ``socket`` is the real TCP socket, which stays open while the friends
    are connected; ``setsockopt`` of ``SO_SNDBUF``/``SO_RCVBUF`` on it (or on
    the stream) changes the link's accounting.
    """

    def __init__(self, end: LinkEnd, sock: Any, sockname: Any, peername: Any,
                 state: RunState) -> None:
        self._init_end(end, state)
        self.socket = FriendSocket(sock, end, self._buffer_sizes_changed)
        self._sockname = sockname
        self._peername = peername
        self._eof_sent = False
        self._send_conflicts = _ConflictDetector(
            "another task is currently sending data on this FriendStream")
        self._receive_conflicts = _ConflictDetector(
            "another task is currently receiving data on this FriendStream")

    def start(self) -> None:
        """Hook into the link (on the run's thread)."""
        self._hook_in()
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

    def _closed_error(self) -> BaseException:
        return trio.ClosedResourceError("this stream was already closed")

    def _broken(self, exc: LinkBrokenError) -> BaseException:
        return broken(exc)

    def __repr__(self) -> str:
        state = "closed" if self._closed else "open"
        eof = " eof-sent" if self._eof_sent else ""
        return (f"<friendsock.trio.FriendStream {state}{eof} peer={self._peername!r} "
                f"queued={self._out.queued} write_bufsize={self._out.write_buffer_size()}>")

    def __del__(self) -> None:
        self._warn_unclosed()

    # -- receiving ---------------------------------------------------------
    async def receive_some(self, max_bytes: Optional[int] = None) -> bytes:
        with self._receive_conflicts:
            if max_bytes is None:
                max_bytes = DEFAULT_RECEIVE_SIZE
            else:
                max_bytes = operator.index(max_bytes)
                if max_bytes < 1:
                    raise ValueError("max_bytes must be >= 1")
            return await self._receive(max_bytes)

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
            await self._send_all(data)

    async def wait_send_all_might_not_block(self) -> None:
        with self._send_conflicts:
            if self._closed:
                raise trio.ClosedResourceError("this stream was already closed")
            await _checkpoint_if_cancelled()
            if not await self._wait_for_room(0, raise_broken=False):
                await _cancel_shielded_checkpoint()

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
            self._show_fin()

    # -- closing -----------------------------------------------------------
    async def aclose(self) -> None:
        if not self._closed:
            self._close_end()
        await trio.lowlevel.checkpoint()

    def _show_fin(self) -> None:
        show_fin(self._end, self.socket._sock)

    def _buffer_sizes_changed(self) -> None:
        # Our capacity moved: a task waiting for room looks again.
        self._wake_writer()

    # -- socket options, as trio.SocketStream ------------------------------
    def setsockopt(self, level: int, option: int, value: Any, length: Optional[int] = None) -> None:
        """As ``trio.SocketStream.setsockopt``: on the real socket; ``SO_SNDBUF``/``SO_RCVBUF``
        feed the link's accounting."""
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
        """As ``trio.SocketStream.getsockopt``: the real socket's option."""
        if buffersize == 0:
            return self.socket.getsockopt(level, option)
        return self.socket.getsockopt(level, option, buffersize)

    def getsockname(self) -> Any:
        """This end's address, as the real socket's ``getsockname()``."""
        return self._sockname

    def getpeername(self) -> Any:
        """The friend's address, as the real socket's ``getpeername()``."""
        return self._peername
