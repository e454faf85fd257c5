"""A blocking socket that paired: :class:`FriendBlockingSocket`, its life
from the moment it pairs (:func:`become_friend`) to its close, and the
ways back to TCP it takes when its descriptor must carry the bytes.

Its TCP descriptor stays open underneath for options and addresses, as
for every friend end. ``fileno()`` is a readiness descriptor that
``select``/``poll`` watch, made and kept in step only once asked for
(``_readiness``). Its reads and writes are :class:`PairedIO`'s.

A socket object changes class twice here, in place (its user holds it):
a ``FriendCapableSocket`` that pairs becomes a :class:`FriendBlockingSocket`,
and one whose link goes on over TCP becomes a :class:`OverTcpSocket`,
its real socket again.
"""

from __future__ import annotations

import _socket
import errno
import io
import operator
import os
import socket
import threading
import warnings
import weakref
from typing import Any, Dict, List, Optional, Tuple

from .._core._addresses import flow_key
from .._core._channel import CHANNEL_TCP
from .._core._finalizing import close_when_safe
from .._core._link import LinkEnd
from .._core._registry import registry
from .._friend_socket import FriendSocket, show_fin
from .._paired_calls import PairedSocketCalls
from .._socket_errors import already_connected, invalid_argument, not_through_descriptor
from . import _ends
from ._capable import FriendCapableSocket, connect_again
from ._descriptor import Descriptor, OriginalSocket, _ss
from ._over_tcp import OVER_TCP_LIMIT, link_over_tcp
from ._paired_io import PairedIO
from ._readiness import Readiness, Signals


def become_friend(sock: FriendCapableSocket, end: LinkEnd, sockname: Any, peername: Any,
                  descriptor: Descriptor) -> bool:
    """Turn ``sock`` (connected or accepted, the link established) into the
    friend socket of ``end``; False, ``sock`` left as it is, when a fork
    moved the link to TCP meanwhile (``sock`` is its connection)."""
    with _ends.lock:
        if end.incoming.state is CHANNEL_TCP:
            return False
        if type(sock) is not FriendBlockingSocket:  # else made one by the accept already
            _make_friend(sock, end, sockname, peername, descriptor)
    return True


def _make_friend(sock: FriendCapableSocket, end: LinkEnd, sockname: Any, peername: Any,
                 descriptor: Descriptor) -> None:
    sock.__class__ = FriendBlockingSocket
    friend: FriendBlockingSocket = sock
    _ends.friend_sockets.add(friend)
    signals = Signals(end.incoming)
    friend.__dict__.update(
        _end=end, _in=end.incoming, _out=end.outgoing, _sockname=sockname, _peername=peername,
        _descriptor=descriptor, _signals=signals, _read_shut=False, _friend_closed=False,
    )
    ref = weakref.ref(friend)

    def capacity_changed() -> None:  # a buffer size changed: room may have been made
        friend = ref()
        if friend is not None and not friend._friend_closed:
            if signals.ready is not None:
                friend._sync_writable()
            signals.writable()  # sleeping writers look again

    friend._options = FriendSocket(descriptor, end, capacity_changed)  # type: ignore[arg-type]
    # Its real descriptor is never handed out (fileno() is the readiness
    # descriptor's): the friend's FIN waits for an event loop's transport
    # that takes the end over (detach_for_loop) to show it. (Hidden before it
    # is hooked in: a friend done writing on its thread meanwhile owes it.)
    end.fd_hidden = True
    # The hooks hold the signals only: a friend socket its user drops is
    # collected (and closed) as a real one is. What already waits needs no
    # hook: a reader looks before it sleeps.
    end.outgoing.attach_writer(signals.writable)
    end.incoming.attach_reader(signals.readable)
    # The kernel sized the real socket's buffers during the handshake; the
    # link was made before that.
    friend._options.sync_buffer_sizes()


class _Handles:
    """How many socket objects share one friend end (dup())."""

    __slots__ = ("_count", "_lock")

    def __init__(self) -> None:
        self._count = 1
        self._lock = threading.Lock()

    def add(self) -> None:
        with self._lock:
            self._count += 1

    def remove(self) -> bool:
        """One closed: whether others are left."""
        with self._lock:
            self._count -= 1
            return self._count > 0


class FriendBlockingSocket(PairedIO, PairedSocketCalls, FriendCapableSocket):
    """A blocking socket (connected or accepted) whose bytes move through a
    friend link.

    Its life, one object throughout (its user holds it): made a
    ``FriendCapableSocket``; this class once its connect or accept pairs
    (:func:`become_friend` sets ``__class__``: never made directly); closed
    here, or :class:`OverTcpSocket` once its link goes on over TCP
    (``_now_tcp``), a plain socket from then on."""

    _descriptor: Descriptor
    _options: FriendSocket
    _sockname: Any
    _peername: Any
    # Set on some only: a socket dup() shares (how many handles it has),
    # one made of another's readiness descriptor (that number), one under
    # a TLS socket (its warnings are the TLS socket's).
    _handles: Optional[_Handles] = None
    _shared_fd: Optional[int] = None
    _under_tls = False
    # A fileno bound method taken while it was a FriendCapableSocket
    # answers with this class's (see FriendCapableSocket.fileno).
    _forwards_fileno = True

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        raise TypeError("friend sockets are made by connect() and accept(), not directly")

    def __del__(self) -> None:
        # Collected unclosed: warn and close, as a real socket's finalizer
        # (by a thread of its own where a collection runs it: see
        # close_when_safe).
        # Under a TLS socket it is that one's (which warns for itself), as
        # the stdlib's SSLSocket takes over the socket it wraps. Closed even
        # where the warning is an error: the friend must not wait forever.
        # (A dup() whose set-up failed has no state at all: nothing to close.)
        if not self.__dict__.get("_friend_closed", True):
            try:
                if not self._under_tls:
                    warnings.warn(f"unclosed {self!r}", ResourceWarning, source=self)
            finally:
                close_when_safe(self._close_friend)

    # -- what stays a socket's -------------------------------------------------
    def fileno(self) -> int:
        if self._friend_closed:
            return -1
        ready = self._signals.ready
        return ready.fd if ready is not None else self._watched()

    def _watched(self) -> int:
        """Somebody will poll this socket: make its readiness descriptor and
        keep it in step from now on (the hooks see it before we look, so
        nothing that happens meanwhile is missed). Its number. Out of
        descriptors, the link goes on over TCP if it can (fileno() is the
        connection's then: a socket's fileno() never fails)."""
        with _ends.lock:
            ready = self._signals.ready
            if ready is not None:  # another thread made it meanwhile
                return ready.fd
            if self._in.state is CHANNEL_TCP:  # moved to TCP meanwhile
                return _ss.fileno(self)
            try:
                ready = Readiness(self)
            except OSError as exc:
                if exc.errno not in (errno.EMFILE, errno.ENFILE) or not _socket_over_tcp(self):
                    raise
                return _ss.fileno(self)
            self._signals.ready = ready
            self._drained()  # readable now if there is something to read
            self._sync_writable()
        return ready.fd

    def __repr__(self) -> str:
        # socket.__repr__ asks fileno(), which would make the readiness
        # descriptor: show the TCP descriptor's until there is one.
        ready = self._signals.ready
        fd = -1 if self._friend_closed else ready.fd if ready is not None else self._descriptor.fileno()
        state = " [closed]" if self._friend_closed else ""
        text = (f"<socket.socket{state} fd={fd}, "
                f"family={self.family!s}, type={self.type!s}, proto={self.proto}")
        if not self._friend_closed:
            text += f", laddr={self._sockname}, raddr={self._peername} [friend]"
        return text + ">"

    def dup(self) -> "FriendBlockingSocket":
        """Another socket object on this connection, as the kernel's dup():
        its bytes are this one's link, and the connection closes with the
        last of them."""
        self._check_open()
        twin: FriendBlockingSocket = FriendCapableSocket.__new__(FriendCapableSocket)
        self._share_with(twin)
        return twin

    def _share_with(self, twin: socket.socket, fileno: Optional[int] = None) -> None:
        """Make ``twin``, a socket object not yet set up, another handle on
        this connection (:meth:`dup`). ``fileno``: the descriptor ``twin``
        was made of (``socket.socket(fileno=...)``): this socket's own
        readiness descriptor, which ``twin`` then shares (its ``detach()``
        hands it back, still open), or a duplicate of it (``fromfd``),
        which ``twin`` owns and so closes."""
        self._check_open()
        # For what stays a descriptor's (addresses, options).
        fd = _socket.dup(_ss.fileno(self))
        OriginalSocket.__init__(twin, self.family, self.type, self.proto, fd)
        twin.__class__ = FriendBlockingSocket
        _ends.friend_sockets.add(twin)
        handles = self._handles
        if handles is None:
            handles = self._handles = _Handles()
        handles.add()
        twin.__dict__.update(self.__dict__)
        twin.__dict__.pop("_shared_fd", None)
        if fileno is not None:
            if fileno == self._signals.ready.fd:  # type: ignore[union-attr]
                twin._shared_fd = fileno  # type: ignore[attr-defined]
            else:
                os.close(fileno)
        twin.settimeout(self.gettimeout())

    def detach(self) -> int:
        """A socket made of another's ``fileno()`` gives that descriptor
        back, still the other's, and leaves the connection to the others.
        Any other gives away a descriptor the connection must go through:
        its link goes on over TCP first (as at a fork), and the real
        socket's descriptor is handed out (the number ``fileno()`` showed).
        OSError (EOPNOTSUPP) where the link cannot go over (its friend is an
        event loop's end)."""
        fd = self._shared_fd
        if fd is not None:
            if not self._friend_closed:
                self._close_friend()
            return fd
        if not self._friend_closed:
            go_on_over_tcp(self, "detach()")
        return OriginalSocket.detach(self)

    def listen(self, *args: Any) -> None:
        self._check_open()
        raise invalid_argument()

    def accept(self) -> Tuple[socket.socket, Any]:
        self._check_open()
        raise invalid_argument()

    def bind(self, address: Any) -> None:
        self._check_open()
        raise invalid_argument()

    def connect(self, address: Any) -> None:
        if self.connect_ex(address):
            raise already_connected()

    def connect_ex(self, address: Any) -> int:
        self._check_open()
        return connect_again(self)

    def setblocking(self, flag: bool) -> None:
        self._check_open()
        _ss.setblocking(self, flag)

    def settimeout(self, value: Optional[float]) -> None:
        self._check_open()
        _ss.settimeout(self, value)

    def sendfile(self, file: Any, offset: int = 0, count: Optional[int] = None) -> int:
        # os.sendfile() would write to the readiness descriptor: send() instead.
        return self._sendfile_use_send(file, offset, count)

    def _sendfile_use_sendfile(self, file: Any, offset: int = 0, count: Optional[int] = None) -> int:
        # The stdlib's os.sendfile() path, which code may call itself (CPython's
        # own tests do): its checks, its giving up on what os.sendfile()
        # cannot read, and its result; the bytes go through send() too.
        self._check_sendfile_params(file, offset, count)
        try:
            size = os.fstat(file.fileno()).st_size
        except (AttributeError, io.UnsupportedOperation, OSError) as exc:
            raise socket._GiveupOnSendfile(exc)  # type: ignore[attr-defined]  # not a regular file
        if not size:
            return 0
        return self._sendfile_use_send(file, offset, count)


    # -- shutting down and closing ------------------------------------------------
    def shutdown(self, how: int) -> None:
        self._check_open()
        wrote_shut = self._shutdown_end(operator.index(how))
        if self._read_shut:
            self._signals.read_shut = True
        if wrote_shut:
            self._signals.write_shut = True
            self._signals.writable()  # as TCP's: a send now fails at once
        if wrote_shut or self._read_shut:
            self._signals.readable()

    def _shutdown_on_tcp(self, how: int) -> None:
        _ss.shutdown(self, how)

    def _show_fin(self) -> None:
        # (The descriptor: the link may keep it until the friend looks,
        # and it does not keep this socket object alive.)
        show_fin(self._end, self._descriptor)

    def _real_close(self, _ss: Any = _ss) -> None:
        if not self._friend_closed:
            self._close_friend()

    def detach_for_loop(self) -> Optional[Tuple[LinkEnd, socket.socket, Any, Any]]:
        """Detach this socket's end of the link for an event loop's transport
        (``create_connection(sock=)`` of an installed loop: uvloop's own
        would do its I/O on the readiness descriptor): ``(end, real socket,
        sockname, peername)``, this socket closed as far as its user is
        concerned; the real socket, its TCP descriptor, is the link's and
        released with it. None, nothing changed, where it cannot: closed,
        duplicated, under TLS, gone over to TCP."""
        with _ends.lock:
            if self._friend_closed or self._in.state is CHANNEL_TCP or \
                    self._handles is not None or self._under_tls:
                return None
            if _unclaimed_over_tcp(self):
                # Its listener may yet go to code that accepts natively,
                # and a transport cannot go on over TCP then: TCP now.
                return None
            self._friend_closed = True
            self._in.notify_readable = None
            self._out.notify_writable = None
            self._descriptor.take_over(self)
            self._signals.close()
            real = self._descriptor.kept()
        assert real is not None, "a descriptor taken over"
        return self._end, real, self._sockname, self._peername

    def _close_friend(self) -> None:
        """Close the friend end (EOF, or a reset over unread bytes); the link
        releases the TCP descriptor once both ends are done. Of a socket
        duplicated (dup()), only the last one's close does."""
        self._friend_closed = True
        if self._in.state is CHANNEL_TCP:  # moved to TCP as this close began
            _ss.close(self)
            return
        handles = self._handles
        if handles is not None and handles.remove():
            self._descriptor.take_over(self)  # the connection stays the others'
            return
        self._in.notify_readable = None
        self._out.notify_writable = None
        self._descriptor.take_over(self)
        show_fin(self._end, self._descriptor)
        self._end.close()
        self._signals.close()

    def _now_tcp(self) -> None:
        """The link went on over TCP: from now on this is its real socket.
        One somebody polls keeps its ``fileno()``: that number becomes its
        connection's descriptor."""
        self.__class__ = OverTcpSocket
        signals = self._signals
        ready, signals.ready = signals.ready, None
        if ready is not None:
            timeout = self.gettimeout()
            number = ready.become(_ss.fileno(self))
            real = _ss.detach(self)
            _ss.__init__(self, self.family, self.type, self.proto, number)
            os.close(real)
            _ss.settimeout(self, timeout)
        signals.close()
        if self._read_shut:
            try:
                _ss.shutdown(self, socket.SHUT_RD)
            except OSError:
                pass
        self._descriptor.close_kept()


class OverTcpSocket(FriendCapableSocket):
    """A friend socket whose link went on over TCP (a fork, ``detach()``):
    the real socket, made this class in place by ``_now_tcp`` (its last
    class; :func:`as_plain_socket` makes it the patched class itself). A
    call begun as a friend socket's, on another thread, finishes with the
    friend socket's helpers, which find the link gone over to TCP."""

    _handles: Optional[_Handles] = None  # (read by those helpers)


for _name in ("_check_open", "_wait_deadline", "_drained", "_readable", "_flags_timeout",
              "_sync_writable", "_send_some", "_wait_writable", "_push_whole", "_send_all",
              "_shutdown_end", "_shutdown_on_tcp", "_show_fin", "_close_friend", "_watched"):
    setattr(OverTcpSocket, _name, getattr(FriendBlockingSocket, _name))


def ends_of_sockets() -> Dict[LinkEnd, List[FriendBlockingSocket]]:
    """Each link end of a blocking socket, with its open friend sockets (none
    yet: a connect finishing, which has written nothing). Under ``_ends.lock``."""
    ends: Dict[LinkEnd, List[FriendBlockingSocket]] = {}
    for sock in list(_ends.friend_sockets):
        if type(sock) is FriendBlockingSocket and not sock._friend_closed:
            ends.setdefault(sock._end, []).append(sock)
    for end in list(_ends.connecting.keys()):
        ends.setdefault(end, [])
    return ends


def _socket_over_tcp(sock: FriendBlockingSocket) -> bool:
    """``sock``'s link goes on over TCP, as at a fork, if its friend is a
    blocking socket, or a connect its listener has not accepted yet
    (withdrawn: the accept finds a plain connection, with what was sent).
    Under ``_ends.lock``. False: it stays a friend link."""
    link = sock._end.link
    ends = ends_of_sockets()
    if link_over_tcp(link, ends):
        return True
    if sock._end is not link.client or not link.can_go_on_over_tcp(OVER_TCP_LIMIT) or \
            not registry.withdraw_unclaimed(flow_key(sock._sockname, sock._peername), link):
        return False
    if link_over_tcp(link, ends, unaccepted=True):
        return True
    # More was written meanwhile than the connection takes at once: it
    # is lost, as a connection the kernel had to drop.
    link.server.reset()
    return False


def _unclaimed_over_tcp(sock: FriendBlockingSocket) -> bool:
    """``sock``'s connect, not accepted yet, by a listener whose accept is
    not known to be friendsock's (a blocking listener that has not
    accepted yet), goes on over TCP (withdrawn: the accept finds a plain
    connection, with what was sent). Under ``_ends.lock``. False: it stays a
    friend link (claimed already, a proven listener, or more written than
    the connection takes at once)."""
    link = sock._end.link
    if sock._end is not link.client or not link.can_go_on_over_tcp(OVER_TCP_LIMIT) or \
            not registry.withdraw_unclaimed(flow_key(sock._sockname, sock._peername), link,
                                            unless_proven=True):
        return False
    if link_over_tcp(link, ends_of_sockets(), unaccepted=True):
        return True
    link.server.reset()  # written meanwhile past what it takes: lost, as a dropped connection
    return False


def go_on_over_tcp(sock: FriendBlockingSocket, what: str) -> None:
    """``sock``'s connection goes on over TCP now: ``what`` is to do its own
    I/O on the descriptor (C code: pyOpenSSL's ``SSL.Connection``, or
    ``detach()``). OSError (EOPNOTSUPP) when the link cannot be moved to TCP
    (its friend is an asyncio transport, say): better than I/O that waits
    forever."""
    with _ends.lock:
        if type(sock) is not FriendBlockingSocket or sock._friend_closed:
            return  # moved to TCP already (a fork), or closed: the descriptor's own
        if not _socket_over_tcp(sock):
            raise not_through_descriptor(what)


def as_plain_socket(sock: socket.socket, what: str) -> None:
    """For ``what``, code that takes the exact class ``socket.socket`` only
    and does its own I/O on the descriptor (trio's ``from_stdlib_socket``):
    a friend socket's connection goes on over TCP (or OSError EOPNOTSUPP,
    see :func:`go_on_over_tcp`), and the socket is of that class again."""
    if type(sock) is FriendBlockingSocket:
        go_on_over_tcp(sock, what)
    if type(sock) is OverTcpSocket:
        sock.__class__ = FriendCapableSocket


