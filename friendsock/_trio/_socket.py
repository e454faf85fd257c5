"""A ``trio.socket`` socket whose connection paired.

Code that drives ``trio.socket`` sockets itself (anyio's trio backend,
libraries that connect a socket and wrap it) keeps its socket object: once
its connect or accept pairs, the object's class becomes
:class:`FriendTrioSocket`, whose data calls go through the link with the
socket's own semantics (``send`` takes what fits in ``sndbuf + friend
rcvbuf``, ``recv`` returns b"" at EOF, failures are the ``OSError`` the
kernel would give). The real socket stays open underneath for addresses and
options, as for every friend end.
"""

from __future__ import annotations

import operator
import socket
import weakref
from typing import Any, Callable, Optional, Tuple

import trio

from .._core._errors import LinkBrokenError
from .._core._channel import CHANNEL_OPEN, SEEN_NOTHING
from .._core._link import LinkEnd
from .._friend_socket import FriendSocket, is_watched, show_fin, unwatch_options, watch_options
from .._handshake import SocketRelease
from .._kept_options import to_keep
from .._paired_calls import (PairedSocketCalls, recvmsg_size, recvmsg_views, scatter,
                             sendmsg_data)
from .._socket_errors import (already_connected, bad_descriptor, check_flags, invalid_argument, no_urgent_data,
                              not_through_descriptor, recv_into_view)
from ._end import TrioEnd, stream_error
from ._run import RunState

# trio's own socket class (private: found through a socket it wraps).
# Paired sockets become a subclass of it, so isinstance() checks against
# trio.socket.SocketType still hold.
with socket.socket() as _probe:
    TrioSocketType: type = type(trio.socket.from_stdlib_socket(_probe))
del _probe

_checkpoint = trio.lowlevel.checkpoint
_checkpoint_if_cancelled = trio.lowlevel.checkpoint_if_cancelled
_cancel_shielded_checkpoint = trio.lowlevel.cancel_shielded_checkpoint


async def _answering_at_once() -> None:
    """The checkpoints of a call that answers without waiting, as trio's
    own socket makes them: cancellable before it, never after its answer
    (a yield that a deadline passes meanwhile would turn the answer into
    Cancelled)."""
    await _checkpoint_if_cancelled()
    await _cancel_shielded_checkpoint()


def _as_bytes(data: Any, limit: int) -> bytes:
    """The first ``limit`` bytes of ``data`` (all of it if fewer), as bytes
    the caller cannot change later: a view of a whole bytes object (what
    anyio and trio.SocketStream pass) is that object; of any other buffer,
    only those bytes are copied (the caller may reuse it)."""
    if type(data) is memoryview and type(data.obj) is bytes and \
            len(data.obj) == data.nbytes <= limit:
        return data.obj
    view = memoryview(data)
    if view.nbytes <= limit:
        return view.tobytes()
    if view.c_contiguous:
        return view.cast("B")[:max(limit, 0)].tobytes()
    return view.tobytes()[:max(limit, 0)]


def _no_descriptor() -> ValueError:
    """What trio's readiness calls on a closed socket raise (they poll its
    descriptor, -1 by then)."""
    return ValueError("file descriptor cannot be a negative integer (-1)")


# A trio socket's descriptor is non-blocking: there the kernel's MSG_WAITALL
# returns what is there, as a call without it does, and a call with
# MSG_DONTWAIT waits (trio's) as one without it does. MSG_NOSIGNAL (Python
# ignores SIGPIPE) and MSG_MORE (a link has no segments to hold back)
# change nothing.
_WAITALL = int(socket.MSG_WAITALL)
_PEEK = int(socket.MSG_PEEK)
_OOB = int(socket.MSG_OOB)
_NO_CHANGE_TO_RECV = _WAITALL | int(socket.MSG_DONTWAIT)
_NO_CHANGE_TO_SEND = (int(socket.MSG_DONTWAIT) | int(getattr(socket, "MSG_NOSIGNAL", 0))
                      | int(getattr(socket, "MSG_MORE", 0)))


class FriendTrioSocket(PairedSocketCalls, TrioEnd, TrioSocketType):
    """A ``trio.socket`` socket (made by trio, connected or accepted) whose
    bytes move through a friend link.

    Its life, one object throughout (its user holds it): made by trio as
    trio's own socket class; this class once its connect or accept pairs
    (:func:`become_friend` sets ``__class__``: never made directly); closed
    here, or trio's class again once its link goes on over TCP (a fork),
    its real socket doing the I/O from then on."""

    _sock: socket.socket

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        raise TypeError("friend sockets are made by connect() and accept(), not directly")

    def _closed_error(self) -> BaseException:
        return bad_descriptor()

    def _broken(self, exc: LinkBrokenError) -> BaseException:
        return exc.as_os_error()

    def __repr__(self) -> str:
        if self._closed:
            return f"<friendsock FriendTrioSocket [closed] family={self.family!r}>"
        return (f"<friendsock FriendTrioSocket laddr={self._sockname!r} raddr={self._peername!r} "
                f"queued={self._out.queued}>")

    def __del__(self) -> None:
        self._warn_unclosed()

    # -- what stays the real socket's ---------------------------------------
    def fileno(self) -> int:
        if self._closed:
            return -1
        self._options._seen()  # (its connection is then not one to keep)
        return self._sock.fileno()

    def dup(self) -> Any:
        raise not_through_descriptor("dup()")

    def detach(self) -> int:
        raise not_through_descriptor("detach()")

    def share(self, *args: Any) -> bytes:  # pragma: no cover - Windows only
        """Windows only; on a friend socket ``OSError(EOPNOTSUPP)``."""
        raise not_through_descriptor("share()")

    def listen(self, *args: Any) -> None:
        self._check_open()
        raise invalid_argument()

    async def accept(self) -> Any:
        await _answering_at_once()
        self._check_open()
        raise invalid_argument()

    async def connect(self, address: Any) -> None:
        await _checkpoint()
        self._check_open()
        raise already_connected()

    def _check_open(self) -> None:
        if self._closed:
            raise bad_descriptor()

    # -- receiving ----------------------------------------------------------
    async def recv(self, bufsize: int, flags: int = 0) -> bytes:
        if type(bufsize) is int and bufsize > 0 and not flags and not self._read_shut:
            return await self._receive(bufsize)  # the common case
        bufsize = operator.index(bufsize)
        if bufsize < 0:
            raise ValueError("negative buffersize in recv")
        if flags & _OOB:
            await _answering_at_once()
            if self._closed:
                raise self._closed_error()
            raise no_urgent_data()
        check_flags(flags, _NO_CHANGE_TO_RECV | _PEEK)
        # Shut for reading, Linux still reads what comes (then EOF, not a wait).
        if bufsize == 0 or self._read_shut and self._in.seen() is SEEN_NOTHING:
            await _answering_at_once()
            return b""
        return await self._receive(bufsize, peek=bool(flags & _PEEK))

    async def recv_into(self, buffer: Any, nbytes: int = 0, flags: int = 0) -> int:
        view = recv_into_view(buffer, nbytes)
        data = await self.recv(len(view), flags)
        view[:len(data)] = data
        return len(data)

    async def recvfrom(self, bufsize: int, flags: int = 0) -> Tuple[bytes, None]:
        # A connected stream socket's recvfrom() gives no address.
        return await self.recv(bufsize, flags), None

    async def recvfrom_into(self, buffer: Any, nbytes: int = 0, flags: int = 0) -> Tuple[int, None]:
        return await self.recv_into(buffer, nbytes, flags), None

    # recvmsg/sendmsg: scatter/gather reads and writes (see recvmsg_size).
    async def recvmsg(self, bufsize: int, ancbufsize: int = 0, flags: int = 0) -> Tuple[bytes, list, int, None]:
        return await self.recv(recvmsg_size(bufsize, ancbufsize), flags), [], 0, None

    async def recvmsg_into(self, buffers: Any, ancbufsize: int = 0,
                           flags: int = 0) -> Tuple[int, list, int, None]:
        views = recvmsg_views(buffers, ancbufsize)
        return scatter(await self.recv(sum(len(view) for view in views), flags), views), [], 0, None

    def is_readable(self) -> bool:
        if self._closed:
            raise _no_descriptor()
        return self._read_shut or self._in.seen() is not SEEN_NOTHING

    # -- sending --------------------------------------------------------------
    async def send(self, data: Any, flags: int = 0) -> int:
        """What fits in ``sndbuf + friend rcvbuf``, once at least a byte does;
        cancelled while waiting, nothing was sent. Of a buffer that is not
        bytes, only what fits is copied: one sent piece by piece (anyio's
        send loop passes the rest of its view each time) is not copied whole
        for every piece."""
        if flags:
            check_flags(flags, _NO_CHANGE_TO_SEND)
        await _checkpoint_if_cancelled()
        out = self._out
        buffer = data
        if type(data) is not bytes:
            data = _as_bytes(buffer, out.room())
        if len(data) <= out.room() and not self._closed and data and \
                out.state is CHANNEL_OPEN and not out.reader_closed:
            out.push(data)  # the common case: it fits (a buffer: what of it fits)
            await _cancel_shielded_checkpoint()
            return len(data)
        parked = False
        end = self._end
        while True:
            if self._closed:
                raise self._closed_error()
            if data is not buffer:  # a buffer: what fits now (a byte, to learn there is no room)
                data = _as_bytes(buffer, max(out.room(), 1))
            try:
                sent = end.send_some(data)
            except LinkBrokenError as exc:
                raise self._broken(exc) from None
            if sent < 0:  # moved to TCP meanwhile
                return await TrioSocketType.send(self, buffer)  # type: ignore[attr-defined]
            if sent or not data:
                break
            parked = await self._wait_for_room(-1, raise_broken=True) or parked
        if not parked:
            await _cancel_shielded_checkpoint()
        return sent

    async def sendto(self, data: Any, *args: Any) -> int:
        # A connected stream socket ignores the address, as Linux's TCP does.
        if len(args) not in (1, 2):
            raise TypeError(f"sendto() takes 2 or 3 arguments ({len(args) + 1} given)")
        return await self.send(data, args[0] if len(args) == 2 else 0)

    async def sendmsg(self, buffers: Any, ancdata: Any = (), flags: int = 0, address: Any = None) -> int:
        return await self.send(sendmsg_data(buffers, ancdata, address), flags)

    async def wait_writable(self) -> None:
        if self._closed:
            raise _no_descriptor()
        await _checkpoint_if_cancelled()
        if not await self._wait_for_room(-1, raise_broken=False):
            await _cancel_shielded_checkpoint()

    # -- shutting down and closing ----------------------------------------
    def shutdown(self, flag: int) -> None:
        if self._shutdown_end(flag):
            self._did_shutdown_SHUT_WR = True

    def _shutdown_on_tcp(self, how: int) -> None:
        self._sock.shutdown(how)

    def _show_fin(self) -> None:
        show_fin(self._end, self._sock)

    def close(self) -> None:
        if not self._closed:
            release = self._end.link.on_done
            # SO_LINGER may have been set on the socket underneath itself
            # (anyio hands it out as its streams' raw_socket): seen as it was
            # set if that socket is watched and its descriptor was never
            # handed out (the connection still one to keep).
            if not (is_watched(self._sock) and to_keep(release)):
                self._options.sync_linger()
            unwatch_options(self._sock)  # (released with a linger of the link's own)
            if isinstance(release, SocketRelease):
                # Its FIN from where the descriptor goes: ours shows -1 then.
                show_fin(self._end, release.keep(self._sock))
            self._close_end()

    def __exit__(self, *exc_info: Any) -> None:
        self.close()  # not the real socket's __exit__: the link owns it


def socketless_trio_socket(stand_in: Any) -> Any:
    """A ``trio.socket`` socket object over a socketless end's stand-in
    socket, to become a friend socket (trio's own constructor takes a real
    socket only)."""
    trio_sock: Any = object.__new__(TrioSocketType)
    trio_sock._sock = stand_in
    trio_sock._did_shutdown_SHUT_WR = False
    return trio_sock


def become_friend(trio_sock: Any, end: LinkEnd, sockname: Any, peername: Any,
                  state: RunState) -> FriendTrioSocket:
    """Turn the ``trio.socket`` socket ``trio_sock`` (its real socket connected
    or accepted, the link established) into the friend socket of ``end``."""
    trio_sock.__class__ = FriendTrioSocket
    friend: FriendTrioSocket = trio_sock
    friend._init_end(end, state)
    friend._sockname = sockname
    friend._peername = peername
    friend._read_shut = False
    friend._options = FriendSocket(friend._sock, end, friend._wake_writer)
    friend._hook_in()
    if isinstance(friend._sock, socket.socket):  # (a socketless end has none)
        end.over_tcp = _over_tcp(friend)
        # anyio hands the real socket out (a stream's raw_socket), and its
        # users set options there.
        watch_options(friend._options)
    # The kernel sized the real socket's buffers when the connection was set
    # up; the link was made before that (unless it was made with its ends'
    # sizes: a socketless link, or one over a reused connection).
    if not end.link.sizes_settled:
        friend._options.sync_buffer_sizes()
    return friend


def _over_tcp(friend: FriendTrioSocket) -> Callable[[], Optional[Tuple[socket.socket, Callable[[], None]]]]:
    """``friend``'s ``LinkEnd.over_tcp``: the link going on over TCP (a
    blocking friend's socket given to pyOpenSSL, say), its real socket, and
    the switch that makes it trio's own socket again: what it is called
    from then on is trio's, and a call under way on the link finishes on
    the socket (see ``TrioEnd._receive``). Held weakly: the end does not keep
    its socket object."""
    ref = weakref.ref(friend)

    def over_tcp() -> Optional[Tuple[socket.socket, Callable[[], None]]]:
        friend = ref()
        if friend is None or friend._closed:
            return None

        def switch() -> None:  # on the move's thread, under the link's locks
            friend.__class__ = TrioSocketType
            unwatch_options(friend._sock)
            friend._end.describe = None
            friend._state.streams.pop(id(friend), None)
            if friend._read_shut:
                try:
                    friend._sock.shutdown(socket.SHUT_RD)
                except OSError:
                    pass

        return friend._sock, switch

    return over_tcp


# -- trio.SocketStream over a friend socket -------------------------------------------
# What trio.SocketStream's own receive_some and send_all do, in one step
# each instead of a loop of socket calls (install() routes a SocketStream
# whose socket paired here).

DEFAULT_RECEIVE_SIZE = 65536


async def stream_receive_some(sock: FriendTrioSocket, max_bytes: Optional[int]) -> bytes:
    if max_bytes is None:
        max_bytes = DEFAULT_RECEIVE_SIZE
    elif max_bytes < 1:
        raise ValueError("max_bytes must be >= 1")
    else:
        max_bytes = operator.index(max_bytes)
    try:
        if sock._read_shut:
            return await sock.recv(max_bytes)
        return await sock._receive(max_bytes)
    except OSError as exc:
        raise stream_error(exc) from None


async def stream_wait_send_all_might_not_block(stream: trio.SocketStream,
                                               sock: FriendTrioSocket) -> None:
    # trio's own takes fileno() == -1 for closed: a socketless end's always is.
    with stream._send_conflict_detector:
        if sock._closed:
            raise trio.ClosedResourceError
        try:
            await sock.wait_writable()
        except OSError as exc:
            raise stream_error(exc) from None


async def stream_send_all(stream: trio.SocketStream, sock: FriendTrioSocket, data: Any) -> None:
    if sock._did_shutdown_SHUT_WR:
        raise trio.ClosedResourceError("can't send data after sending EOF")
    with stream._send_conflict_detector:
        if type(data) is not bytes:
            data = memoryview(data).tobytes()  # the caller may reuse its buffer
        if not data:
            if sock._closed:
                raise trio.ClosedResourceError("socket was already closed")
            await _checkpoint()
            return
        try:
            if sock._closed:
                raise sock._closed_error()
            await sock._send_all(data)
        except OSError as exc:
            raise stream_error(exc) from None
