"""The socket-like objects through which a friend end's real socket is
reached: the one a transport hands out as its ``socket`` extra info
(:class:`FriendSocket`, and uvloop's kind), and the real socket under a
paired socket object that hands it out as it is (a watched socket); with
what they do to the real socket, shared with every friend end: its buffer
sizes copied into the link's accounting, its FIN shown by the link's rule,
``shutdown(SHUT_WR)``.

Options act on the real TCP socket, which stays open while the friends are
connected. ``SO_SNDBUF``/``SO_RCVBUF`` also feed the link's accounting, with
the value the kernel reports back (Linux doubles what it is given).
"""

from __future__ import annotations

import _socket
import errno
import os
import socket
import types
import weakref
from typing import Any, Callable, Dict, Optional

from ._core._errors import LinkBrokenError
from ._core._link import LinkEnd
from ._kept_options import LINGER, set_restorably, to_keep
from ._socket_errors import check_how

_BUFFER_OPTIONS = (socket.SO_SNDBUF, socket.SO_RCVBUF)


_sizes: Dict[int, int] = {}


def _shared(size: int) -> int:
    """One int object per buffer size (sockets have a handful): thousands of
    idle links keep four each."""
    shared = _sizes.get(size)
    if shared is None:
        if len(_sizes) >= 1024:
            return size
        shared = _sizes[size] = size
    return shared


def read_buffer_sizes(sock: socket.socket) -> "tuple[int, int]":
    """``(SO_SNDBUF, SO_RCVBUF)`` of a real socket."""
    return (
        _shared(sock.getsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF)),
        _shared(sock.getsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF)),
    )


_fresh_sizes: Optional["tuple[int, int]"] = None


def fresh_buffer_sizes(sock: socket.socket) -> "tuple[int, int]":
    """:func:`read_buffer_sizes` of a TCP socket just made, nothing set on
    it: every such socket starts alike (the network namespace's
    ``tcp_wmem[1]`` and ``tcp_rmem[1]``), so they are read once."""
    global _fresh_sizes
    if _fresh_sizes is None:
        _fresh_sizes = read_buffer_sizes(sock)
    return _fresh_sizes


def copy_buffer_sizes(sock: Any, end: LinkEnd) -> None:
    """Copy the real socket's buffer sizes into the link's accounting:
    ``end``'s ``sndbuf`` on what it writes, its ``rcvbuf`` on what it reads."""
    sndbuf, rcvbuf = read_buffer_sizes(sock)
    end.outgoing.sndbuf = sndbuf
    end.incoming.rcvbuf = rcvbuf
    end.incoming.capacity_changed()


def show_fin(end: LinkEnd, sock: Any) -> None:
    """``end`` is done writing (EOF, or closed): its real socket ``sock``
    sends its FIN, when and if the link's rule says so
    (:meth:`LinkEnd.fin_to_show`)."""
    if _real_fileno(sock) >= 0:  # (not a socketless end's stand-in, nor released)
        if end.fin_to_show(sock):
            _shutdown_write(sock)


def reveal(end: LinkEnd) -> None:
    """``end``'s real descriptor is about to be seen (and maybe polled):
    the FIN its friend held back while nobody could look is sent now, so
    the descriptor polls readable as a TCP socket's does after the peer's
    FIN."""
    sock = end.reveal()
    if sock is not None:
        _shutdown_write(sock)


# A socket's own calls, not a subclass's (a watched socket's fileno() hands
# its descriptor out; a paired one's shutdown() is the link's).
def _real_fileno(sock: Any) -> int:
    return _socket.socket.fileno(sock) if isinstance(sock, _socket.socket) else sock.fileno()


def _shutdown_write(sock: Any) -> None:
    try:
        if isinstance(sock, _socket.socket):
            _socket.socket.shutdown(sock, socket.SHUT_WR)
        else:  # a paired blocking socket's descriptor
            sock.shutdown(socket.SHUT_WR)
    except OSError:  # gone already (its link done)
        pass


def shut_write(end: LinkEnd, show_own_fin: Callable[[], None],
               shutdown_on_tcp: Callable[[int], None]) -> None:
    """``shutdown(SHUT_WR)`` of a friend end's socket: EOF to the friend
    after what was written (the link's errno as an ``OSError``), then the
    real socket's FIN by the link's rule (``show_own_fin``); or, the link
    gone on over TCP, the real socket's own shutdown."""
    try:
        on_link = end.shutdown_write()
    except LinkBrokenError as exc:
        raise exc.as_os_error() from None
    if on_link:
        show_own_fin()
    else:
        shutdown_on_tcp(socket.SHUT_WR)


def held_weakly(hook: Optional[Callable[[], None]]) -> Any:
    """``hook`` as an owner's object keeps it: a bound method weakly."""
    return weakref.WeakMethod(hook) if isinstance(hook, types.MethodType) else hook


def call_held(kept: Any) -> None:
    """Call a hook kept by :func:`held_weakly`, if it (and its owner) is still there."""
    hook = kept() if isinstance(kept, weakref.WeakMethod) else kept
    if hook is not None:
        hook()


class FriendSocket:
    """Like ``asyncio.trsock.TransportSocket``: the real socket, minus the
    calls that would steal it from the transport."""

    __slots__ = ("_sock", "_end", "_on_change", "_on_read_shut")

    def __init__(
        self,
        sock: socket.socket,
        end: LinkEnd,
        on_change: Optional[Callable[[], None]] = None,
        on_read_shut: Optional[Callable[[], None]] = None,
    ) -> None:
        self._sock = sock
        self._end = end
        # The owner re-checks flow control (on_change), and learns that its
        # reading is shut (on_read_shut). Bound methods are held weakly: the
        # owner holds this object, and a cycle would leave a finished
        # connection to the cyclic collector.
        self._on_change: Any = held_weakly(on_change)
        self._on_read_shut: Any = held_weakly(on_read_shut)

    family = property(lambda self: self._sock.family)
    type = property(lambda self: self._sock.type)
    proto = property(lambda self: self._sock.proto)

    @property
    def _link_done(self) -> bool:
        # (A done link lets go of its ends; its connection may carry
        # another link by then, kept by its listener.)
        return self._end.link.client is None

    def __repr__(self) -> str:
        if self._link_done:
            return "<friendsock.FriendSocket [closed]>"
        return f"<friendsock.FriendSocket {self._sock!r}>"

    def __getstate__(self) -> None:
        raise TypeError("Cannot serialize friendsock.FriendSocket object")

    def _real(self) -> socket.socket:
        """The real socket; EBADF, as from a closed socket, once the link is
        done: its connection may carry another link by then (kept by its
        listener, see :meth:`ListenerHandle.keep`)."""
        if self._link_done:
            raise OSError(errno.EBADF, os.strerror(errno.EBADF))
        return self._sock

    def _for_calls(self) -> socket.socket:
        """The real socket, for the calls a transport's socket makes on
        its descriptor (addresses, options): :meth:`_real`."""
        return self._real()

    def _seen(self) -> None:
        """The descriptor is handed out (to poll, to pass on): the
        connection is not one to keep once the link is done."""
        exposed = getattr(self._end.link.on_done, "exposed", None)
        if exposed is not None:
            exposed()
        reveal(self._end)  # (a FIN may be owed to a friend not hidden: one hooked in after it)

    def fileno(self) -> int:
        # -1 once its end is closed, as a closed transport's socket: the
        # real one lives on until the friend is done too.
        if self._end.closed:
            return -1
        self._seen()
        return self._sock.fileno()

    def dup(self) -> socket.socket:
        sock = self._real()
        self._seen()
        return sock.dup()

    def get_inheritable(self) -> bool:
        return self._real().get_inheritable()

    def getsockname(self) -> Any:
        return self._for_calls().getsockname()

    def getpeername(self) -> Any:
        return self._for_calls().getpeername()

    def getsockopt(self, *args: Any) -> Any:
        return self._for_calls().getsockopt(*args)

    def setsockopt(self, *args: Any) -> None:
        sock = self._for_calls()
        release = self._end.link.on_done
        # (A connection to keep once the link is done: as it was made.)
        if not to_keep(release) or not set_restorably(release, sock, args):
            sock.setsockopt(*args)
        if args[0] == socket.SOL_SOCKET:
            if args[1] in _BUFFER_OPTIONS:
                self.sync_buffer_sizes()
            elif args[1] == socket.SO_LINGER:
                self.sync_linger()

    def sync_linger(self) -> None:
        """SO_LINGER read back as the kernel keeps it: {1, 0} makes the
        end's close abortive."""
        try:
            kept = self._sock.getsockopt(socket.SOL_SOCKET, socket.SO_LINGER, LINGER.size)
        except OSError:  # a socketless end's, never set
            return
        onoff, linger = LINGER.unpack(kept)
        self._end.abortive = bool(onoff) and linger == 0

    def sync_buffer_sizes(self) -> None:
        """:func:`copy_buffer_sizes`, then tell the owner."""
        copy_buffer_sizes(self._sock, self._end)
        call_held(self._on_change)

    def shutdown(self, how: int) -> None:
        """As asyncio's transport socket passes it to the socket: SHUT_WR
        (and SHUT_RDWR) sends the friend EOF after what was written, with
        the real socket's FIN, and the transport's later writes fail with
        EPIPE; SHUT_RD shuts the real socket's reading side."""
        if self._end.closed:
            raise OSError(errno.EBADF, os.strerror(errno.EBADF))
        sock = self._real()
        check_how(how)
        if how != socket.SHUT_RD:
            end = self._end
            # (Looked up only if it goes on over TCP: a socketless end's
            # stand-in has no shutdown.)
            shut_write(end, lambda: show_fin(end, sock), lambda how: sock.shutdown(how))
        if how != socket.SHUT_WR:
            if _real_fileno(sock) >= 0:  # (a socketless end has none)
                sock.shutdown(socket.SHUT_RD)
            call_held(self._on_read_shut)

    def settimeout(self, value: Optional[float]) -> None:
        if value == 0:
            return
        raise ValueError("settimeout(): only 0 timeout is allowed on transport sockets")

    def gettimeout(self) -> float:
        return 0

    def setblocking(self, flag: bool) -> None:
        if not flag:
            return
        raise ValueError("setblocking(): transport sockets cannot be blocking")


class UvloopFriendSocket(FriendSocket):
    """A friend transport's socket on uvloop, which answers as uvloop's
    own (its ``PseudoSocket``) does: its addresses read once and kept, and,
    once closed, ValueError from a call that needs its descriptor (which
    it then holds as -1)."""

    __slots__ = ("_sockname", "_peername")

    def __init__(self, sock: socket.socket, end: LinkEnd, on_change: Optional[Callable[[], None]] = None,
                 on_read_shut: Optional[Callable[[], None]] = None) -> None:
        super().__init__(sock, end, on_change, on_read_shut)
        self._sockname: Any = None
        self._peername: Any = None

    def _for_calls(self) -> socket.socket:
        if self._link_done:
            raise ValueError("negative file descriptor")
        return self._sock

    def getsockname(self) -> Any:
        if self._sockname is None:
            self._sockname = super().getsockname()
        return self._sockname

    def getpeername(self) -> Any:
        if self._peername is None:
            self._peername = super().getpeername()
        return self._peername


def _not_on_uvloop(name: str) -> Callable[..., Any]:
    def refuse(self: Any, *args: Any, **kwargs: Any) -> Any:
        raise TypeError(f"transport sockets do not support {name}() method")
    refuse.__name__ = name
    return refuse


# The socket calls uvloop's PseudoSocket refuses (those that would steal
# the descriptor from the transport, or move bytes past it).
_REFUSED_ON_UVLOOP = (
    "accept", "bind", "close", "connect", "connect_ex", "detach", "listen", "makefile", "recv",
    "recv_into", "recvfrom", "recvfrom_into", "recvmsg", "recvmsg_into", "send", "sendall",
    "sendfile", "sendmsg", "sendmsg_afalg", "sendto", "shutdown")


def refuse_as_uvloop(cls: type) -> type:
    """``cls`` (a transport's socket) refusing what uvloop's PseudoSocket
    refuses, with its TypeError."""
    for name in _REFUSED_ON_UVLOOP:
        setattr(cls, name, _not_on_uvloop(name))
    return cls


refuse_as_uvloop(UvloopFriendSocket)


# The stdlib's class, as it was when friendsock was imported (patch_socket()
# may replace the name later).
STDLIB_SOCKET = socket.socket
_watchers: "weakref.WeakKeyDictionary[socket.socket, FriendSocket]" = weakref.WeakKeyDictionary()


class _WatchedSocket(STDLIB_SOCKET):
    """The kernel's socket under a paired socket object that hands it out
    as it is (anyio's ``raw_socket`` of a stream on trio): the options set
    on it reach the link as through the paired socket (buffer sizes feed
    the accounting, SO_LINGER {1, 0} makes the close a reset), and its
    ``getpeername()`` fails ENOTCONN after the friend's reset, as TCP's.
    The stdlib class's layout: an object becomes one when handed out, and
    the stdlib's class again once the link goes on over TCP, by its
    ``__class__``
    (:func:`watch_options`, :func:`unwatch_options`)."""

    __slots__ = ()

    def setsockopt(self, *args: Any) -> None:
        options = _watchers.get(self)
        release = options._end.link.on_done if options is not None else None
        # (A connection to keep once the link is done: as it was made.)
        if not to_keep(release) or not set_restorably(release, self, args):
            super().setsockopt(*args)
        if options is not None and args[0] == socket.SOL_SOCKET:
            if args[1] in _BUFFER_OPTIONS:
                options.sync_buffer_sizes()
            elif args[1] == socket.SO_LINGER:
                options.sync_linger()

    def fileno(self) -> int:
        # Its descriptor handed out (anyio's raw_socket, which httpcore
        # polls): the connection is not one to keep (see FriendSocket).
        options = _watchers.get(self)
        if options is not None:
            options._seen()
        return super().fileno()

    def getpeername(self) -> Any:
        options = _watchers.get(self)
        if options is not None and _socket.socket.fileno(self) >= 0:
            error = options._end.peername_error()
            if error is not None:
                raise error.as_os_error()
        return super().getpeername()


def watch_options(options: FriendSocket) -> None:
    """Options set on ``options``' real socket itself reach its link end
    from now on (see :class:`_WatchedSocket`); a socket of a class of its
    user's (or of patch_socket()'s) is left as it is."""
    sock = options._sock
    if type(sock) is STDLIB_SOCKET:
        sock.__class__ = _WatchedSocket
        _watchers[sock] = options


def is_watched(sock: Any) -> bool:
    """Whether options set on ``sock`` reach its link end (:func:`watch_options`)."""
    return type(sock) is _WatchedSocket


def unwatch_options(sock: Any) -> None:
    """The socket is the kernel's connection's alone again (gone on over TCP)."""
    if type(sock) is _WatchedSocket:
        _watchers.pop(sock, None)
        sock.__class__ = STDLIB_SOCKET  # type: ignore[assignment]
