"""The socket-like object a friend end hands out as its ``socket``.

Options act on the real TCP socket, which stays open while the friends are
connected. ``SO_SNDBUF``/``SO_RCVBUF`` also feed the link's accounting, with
the value the kernel reports back (Linux doubles what it is given).
"""

from __future__ import annotations

import _socket
import errno
import operator
import os
import socket
import struct
import sys
import types
import weakref
from typing import Any, Callable, Dict, List, Optional, Tuple

from ._core._errors import LinkBrokenError
from ._core._channel import CHANNEL_TCP
from ._core._link import LinkEnd

_BUFFER_OPTIONS = (socket.SO_SNDBUF, socket.SO_RCVBUF)
_LINGER = struct.Struct("ii")  # struct linger
_C_INT_MAX = 2 ** 31 - 1
_C_INT_MIN = -2 ** 31


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


def check_how(how: Any) -> None:
    """``shutdown(how)``'s argument checked as the real call checks it."""
    how = operator.index(how)  # (TypeError for what is no int)
    if not _C_INT_MIN <= how <= _C_INT_MAX:  # as the C call converts it
        raise OverflowError("Python int too large to convert to C int")
    if how not in (socket.SHUT_RD, socket.SHUT_WR, socket.SHUT_RDWR):
        raise OSError(errno.EINVAL, "Invalid argument")


class FriendSocket:
    """Like ``asyncio.trsock.TransportSocket``: the real socket, minus the
    calls that would steal it from the transport."""

    __slots__ = ("_sock", "_end", "_on_change")

    def __init__(
        self,
        sock: socket.socket,
        end: LinkEnd,
        on_change: Optional[Callable[[], None]] = None,
    ) -> None:
        self._sock = sock
        self._end = end
        # The owner re-checks flow control. Its bound method is held weakly:
        # the owner holds this object, and a cycle would leave a finished
        # connection to the cyclic collector.
        self._on_change: Any = (weakref.WeakMethod(on_change)
                                if isinstance(on_change, types.MethodType) else on_change)

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
        if not to_keep(release) or not _set_restorably(release, sock, args):
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
            kept = self._sock.getsockopt(socket.SOL_SOCKET, socket.SO_LINGER, _LINGER.size)
        except OSError:  # a socketless end's, never set
            return
        onoff, linger = _LINGER.unpack(kept)
        self._end.abortive = bool(onoff) and linger == 0

    def sync_buffer_sizes(self) -> None:
        """:func:`copy_buffer_sizes`, then tell the owner."""
        copy_buffer_sizes(self._sock, self._end)
        on_change = self._on_change
        if isinstance(on_change, weakref.WeakMethod):
            on_change = on_change()
        if on_change is not None:
            on_change()

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
        if how != socket.SHUT_WR and _real_fileno(sock) >= 0:  # (a socketless end has none)
            sock.shutdown(socket.SHUT_RD)

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

    def __init__(self, sock: socket.socket, end: LinkEnd,
                 on_change: Optional[Callable[[], None]] = None) -> None:
        super().__init__(sock, end, on_change)
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
for _name in ("accept", "bind", "close", "connect", "connect_ex", "detach", "listen", "makefile",
              "recv", "recv_into", "recvfrom", "recvfrom_into", "recvmsg", "recvmsg_into", "send",
              "sendall", "sendfile", "sendmsg", "sendmsg_afalg", "sendto", "shutdown"):
    setattr(UvloopFriendSocket, _name, _not_on_uvloop(_name))
del _name


# Options that a connection kept for another link can be given back as it
# had them (a plain value each, with no lasting side effect).
_RESTORABLE = frozenset({
    (socket.SOL_SOCKET, socket.SO_KEEPALIVE),
    (socket.IPPROTO_TCP, socket.TCP_NODELAY),
    (socket.IPPROTO_TCP, socket.TCP_KEEPIDLE),
    (socket.IPPROTO_TCP, socket.TCP_KEEPINTVL),
    (socket.IPPROTO_TCP, socket.TCP_KEEPCNT),
    # (trio's streams set it on every connection)
    *([(socket.IPPROTO_TCP, socket.TCP_NOTSENT_LOWAT)] if hasattr(socket, "TCP_NOTSENT_LOWAT") else []),
})


def to_keep(release: Any) -> bool:
    """Whether a link's ``on_done`` will keep its connection for a later
    link: a ``SocketRelease`` none of whose sockets was handed out (see
    ``SocketRelease.exposed``)."""
    return getattr(release, "client", None) is not None


def _set_restorably(release: Any, sock: socket.socket, args: "tuple[Any, ...]") -> bool:
    """``setsockopt(*args)`` on a socket whose connection its listener may
    keep for a later link (``release``: the link's ``SocketRelease``): an
    option of :data:`_RESTORABLE` is set here (the C call), and given back
    its value before the connection is kept, as a new connection would have
    it. False for any other option, which the caller sets: that change
    (buffer sizes lock, SO_LINGER, ...) ends the connection with the link."""
    if len(args) != 3 or type(args[2]) not in (int, bool) or args[:2] not in _RESTORABLE:
        release.exposed()
        return False
    level, option = args[0], args[1]
    before = _socket.socket.getsockopt(sock, level, option)
    _socket.socket.setsockopt(sock, *args)
    if args[2] != before:  # (a value the kernel takes as ``before`` is given back as it was)
        release.restore_before_keeping(sock, level, option, before)
    return True


# What a program may set on a socket before connect() (besides
# _RESTORABLE's): a connect over a kept connection, which hands its user
# another socket's descriptor, is made only for a socket whose values of
# these are a new socket's.
_SET_BEFORE_CONNECT = tuple(
    (level, getattr(socket, name), size)
    for level, name, size in (
        (socket.SOL_SOCKET, "SO_SNDBUF", 0), (socket.SOL_SOCKET, "SO_RCVBUF", 0),
        (socket.SOL_SOCKET, "SO_LINGER", _LINGER.size), (socket.SOL_SOCKET, "SO_REUSEADDR", 0),
        (socket.SOL_SOCKET, "SO_REUSEPORT", 0), (socket.SOL_SOCKET, "SO_OOBINLINE", 0),
        (socket.SOL_SOCKET, "SO_PRIORITY", 0), (socket.SOL_SOCKET, "SO_RCVLOWAT", 0),
        (socket.SOL_SOCKET, "SO_MARK", 0), (socket.SOL_SOCKET, "SO_BINDTODEVICE", 16),
        (socket.IPPROTO_TCP, "TCP_MAXSEG", 0), (socket.IPPROTO_TCP, "TCP_USER_TIMEOUT", 0),
        (socket.IPPROTO_TCP, "TCP_WINDOW_CLAMP", 0), (socket.IPPROTO_TCP, "TCP_CONGESTION", 16),
        (socket.IPPROTO_TCP, "TCP_FASTOPEN_CONNECT", 0),
        (socket.IPPROTO_IP, "IP_TOS", 0), (socket.IPPROTO_IP, "IP_TTL", 0),
        (socket.IPPROTO_IP, "IP_BIND_ADDRESS_NO_PORT", 0),
        (socket.IPPROTO_IPV6, "IPV6_TCLASS", 0), (socket.IPPROTO_IPV6, "IPV6_UNICAST_HOPS", 0),
        (socket.IPPROTO_IPV6, "IPV6_V6ONLY", 0),
    )
    if hasattr(socket, name)
)
# Per family, what a new socket has: ((level, option, size, value), ...) of
# _SET_BEFORE_CONNECT, and ((level, option, value), ...) of _RESTORABLE.
_new_socket_options: Dict[int, Tuple[Tuple[Any, ...], Tuple[Any, ...]]] = {}


def _option(sock: Any, level: int, option: int, size: int) -> Any:
    return (_socket.socket.getsockopt(sock, level, option, size) if size
            else _socket.socket.getsockopt(sock, level, option))


def _new_socket_values(family: int) -> Tuple[Tuple[Any, ...], Tuple[Any, ...]]:
    """What a new TCP socket of ``family`` has of :data:`_SET_BEFORE_CONNECT`
    and :data:`_RESTORABLE` (read once per family; the options a family has
    not left out)."""
    values = _new_socket_options.get(family)
    if values is None:
        new = _socket.socket(family, socket.SOCK_STREAM)
        checked, restorable = [], []
        try:
            for level, option, size in _SET_BEFORE_CONNECT:
                try:
                    checked.append((level, option, size, _option(new, level, option, size)))
                except OSError:  # not of this family
                    pass
            for level, option in _RESTORABLE:
                restorable.append((level, option, _option(new, level, option, 0)))
        finally:
            new.close()
        values = _new_socket_options[family] = (tuple(checked), tuple(restorable))
    return values


def set_as_a_new_socket(sock: socket.socket) -> bool:
    """Whether ``sock`` (not connected yet) has nothing of
    :data:`_SET_BEFORE_CONNECT` set otherwise than a new socket has it
    (options of :data:`_RESTORABLE` it may have set: :func:`carry_options`
    carries them over)."""
    for level, option, size, value in _new_socket_values(sock.family)[0]:
        if _option(sock, level, option, size) != value:
            return False
    return True


def carry_options(sock: socket.socket, kept: socket.socket, release: Any) -> None:
    """The options of :data:`_RESTORABLE` its user set on ``sock`` (made
    for a connect that goes over the connection ``kept``) set on ``kept``
    too, and given back before that connection is kept again."""
    for level, option, value in _new_socket_values(sock.family)[1]:
        set_to = _socket.socket.getsockopt(sock, level, option)
        if set_to != value:
            _set_restorably(release, kept, (level, option, set_to))


def restore_options_set_before_connect(sock: socket.socket, release: Any) -> None:
    """The options of :data:`_RESTORABLE` its user set on ``sock`` before
    it connected (its connection one to keep): given back their values of
    a new socket's before it is kept."""
    for level, option, value in _new_socket_values(sock.family)[1]:
        if _socket.socket.getsockopt(sock, level, option) != value:
            release.restore_before_keeping(sock, level, option, value)


# The stdlib's class, as it was when friendsock was imported (patch_socket()
# may replace the name later).
STDLIB_SOCKET = socket.socket
_watchers: "weakref.WeakKeyDictionary[socket.socket, FriendSocket]" = weakref.WeakKeyDictionary()


class _WatchedSocket(STDLIB_SOCKET):  # type: ignore[misc,valid-type]
    """The kernel's socket under a paired socket object that hands it out
    as it is (anyio's ``raw_socket`` of a stream on trio): the options set
    on it reach the link as through the paired socket (buffer sizes feed
    the accounting, SO_LINGER {1, 0} makes the close a reset), and its
    ``getpeername()`` fails ENOTCONN after the friend's reset, as TCP's.
    The stdlib class's layout: an object becomes one, and back, by its
    ``__class__`` (:func:`watch_options`)."""

    __slots__ = ()

    def setsockopt(self, *args: Any) -> None:
        options = _watchers.get(self)
        release = options._end.link.on_done if options is not None else None
        # (A connection to keep once the link is done: as it was made.)
        if not to_keep(release) or not _set_restorably(release, self, args):
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


# recvmsg()/sendmsg() on a TCP connection: scatter/gather reads and writes;
# no ancillary data comes (TCP ignores what sendmsg gives). Their arguments,
# checked as the C calls check them, for every kind of paired socket.
def recvmsg_size(bufsize: Any, ancbufsize: Any) -> int:
    bufsize = operator.index(bufsize)
    if bufsize < 0:
        raise ValueError("negative buffer size in recvmsg()")
    _check_ancillary_size(ancbufsize)
    return bufsize


def _check_ancillary_size(ancbufsize: Any) -> None:
    if operator.index(ancbufsize) < 0:
        raise ValueError("invalid ancillary data buffer length")  # the C call's words


def recvmsg_views(buffers: Any, ancbufsize: Any) -> List[memoryview]:
    """``recvmsg_into()``'s buffers, as byte views to fill in turn."""
    views = [memoryview(buffer).cast("B") for buffer in buffers]
    if any(view.readonly for view in views):
        raise TypeError("recvmsg_into() argument 1 must be an iterable of single-segment "
                        "read-write buffers")
    _check_ancillary_size(ancbufsize)
    return views


def scatter(data: bytes, views: List[memoryview]) -> int:
    """``data`` into ``views`` in turn; its size."""
    offset = 0
    for view in views:
        piece = data[offset:offset + len(view)]
        view[:len(piece)] = piece
        offset += len(piece)
    return len(data)


def sendmsg_data(buffers: Any, ancdata: Any, address: Any) -> bytes:
    """What ``sendmsg()`` sends: its buffers joined. Its ancillary data and
    address are checked as the C call does, then ignored, as TCP does on a
    connected socket."""
    data = b"".join(memoryview(buffer).cast("B") for buffer in buffers)
    for item in ancdata:
        if not isinstance(item, tuple) or len(item) != 3:
            raise TypeError("sendmsg() ancillary data items must be (level, type, data) tuples")
        operator.index(item[0]), operator.index(item[1]), memoryview(item[2])
    if address is not None and not isinstance(address, tuple):
        raise TypeError(f"sendmsg() address must be a tuple, not {type(address).__name__}")
    return data


def no_urgent_data() -> OSError:
    """What ``recv(MSG_OOB)`` gets on a paired socket: TCP's answer when no
    urgent byte waits, and none ever does on a link (a friend's send with
    MSG_OOB is refused)."""
    return OSError(errno.EINVAL, os.strerror(errno.EINVAL))


class PairedSocketCalls:
    """The calls a paired socket object (a trio socket, or a blocking
    socket, whose connection paired) answers from its link end rather than
    its descriptor: the addresses known at pairing, and the options through
    its :class:`FriendSocket` (``_options``), so buffer sizes feed the
    accounting. ``_check_open`` raises what the call on a closed socket
    raises."""

    _sockname: Any
    _peername: Any
    _options: FriendSocket
    _end: LinkEnd
    _read_shut: bool

    def _check_open(self) -> None:
        raise NotImplementedError

    def getsockname(self) -> Any:
        self._check_open()
        return self._sockname

    def getpeername(self) -> Any:
        self._check_open()
        error = self._end.peername_error()
        if error is not None:
            raise error.as_os_error()
        return self._peername

    def getsockopt(self, *args: Any) -> Any:
        self._check_open()
        value = self._options.getsockopt(*args)
        if args[:2] == (socket.SOL_SOCKET, socket.SO_ERROR):
            error = self._end.take_error()  # the friend's reset, pending: reported once
            if error is not None:
                number = error.errno
                return number if type(value) is int else number.to_bytes(4, sys.byteorder)[:len(value)]
        return value

    def setsockopt(self, *args: Any) -> None:
        self._check_open()
        self._options.setsockopt(*args)

    def _shutdown_end(self, how: int) -> bool:
        """``shutdown(how)`` on the link: EOF to the friend for SHUT_WR and
        SHUT_RDWR (the link's errno as an OSError), EOF for later reads for
        SHUT_RD and SHUT_RDWR, as on Linux. Returns whether the writing side
        was shut."""
        # Bound now: a hand-over meanwhile may give this object its real
        # socket's class (a trio socket's: trio's own).
        shutdown_on_tcp, show_own_fin = self._shutdown_on_tcp, self._show_fin
        self._check_open()
        check_how(how)
        # The link may go on over TCP meanwhile (a fork on another thread),
        # too early for its hand-over to carry this shutdown: the socket
        # makes it then.
        if how != socket.SHUT_RD:
            shut_write(self._end, show_own_fin, shutdown_on_tcp)
        if how != socket.SHUT_WR:
            self._read_shut = True
            if self._end.incoming.state is CHANNEL_TCP:  # (a second one is harmless)
                shutdown_on_tcp(socket.SHUT_RD)
        return how != socket.SHUT_RD

    def _shutdown_on_tcp(self, how: int) -> None:
        """``shutdown(how)`` on the real socket (the link went on over TCP)."""
        raise NotImplementedError

    def _show_fin(self) -> None:
        """Done writing on the link: the real socket's FIN, by the link's
        rule (:func:`show_fin`)."""
        raise NotImplementedError
