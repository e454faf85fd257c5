"""The sockets ``socket.socket`` makes while patched, and the ones that paired.

:class:`FriendCapableSocket` is what ``socket.socket`` (and so
``socket.create_connection``, ``socket.create_server``, ``socketserver``,
``http.client``, urllib3 ...) makes while :func:`patch_socket` is in force.
It is the real socket, unchanged, except at three moments:

- ``connect()`` of a blocking (or timeout) TCP socket to a friendsock
  listener of this process registers the connect first, as every friendsock
  client does, and pairs;
- ``listen()`` of a blocking (or timeout) TCP socket registers it as a
  friendsock listener (until it is closed, or handed to an event loop,
  which makes it non-blocking); its ``accept()`` claims friend clients;
- a socket that paired becomes a :class:`FriendBlockingSocket` (the same
  object, still a ``socket.socket``) whose data calls go through the link,
  with the socket's own semantics: blocking, timeout and non-blocking modes,
  ``send`` takes what fits in ``sndbuf + friend rcvbuf``, ``recv`` returns
  b"" at EOF, failures are the ``OSError`` the kernel gives.

Its TCP descriptor stays open underneath for options and addresses, as
for every friend end. Its own blocking calls sleep on locks the link's
hooks release; ``fileno()`` is a readiness descriptor that
``select``/``poll`` watch, made and kept in step only once asked for
(``_readiness``).
"""

from __future__ import annotations

import _socket
import errno
import io
import operator
import os
import select
import socket
import sys
import threading
import time
import warnings
import weakref
from typing import Any, Callable, Dict, List, Optional, Set, Tuple

from .._core._fork import Part, on_fork
from .. import _handshake
from .._core._addresses import flow_key
from .._core._channel import (CHANNEL_OPEN, CHANNEL_TCP, SEEN_DATA, SEEN_EOF, SEEN_NOTHING,
                              SEEN_RESET, SEEN_TCP, Seen)
from .._core._errors import FriendError, LinkBrokenError
from .._core._finalizing import close_when_safe
from .._core._link import Link, LinkEnd
from .._core._registry import PendingState, registry
from .._core._stats import Fallback, counters
from .._core._switch import is_enabled
from .._friend_socket import STDLIB_SOCKET, FriendSocket, show_fin
from .._paired_calls import PairedSocketCalls, no_urgent_data, recvmsg_size, recvmsg_views, scatter, sendmsg_data
from .._handshake import (
    ConnectAttempt,
    Entry,
    Pending,
    SocketRelease,
    adopt_accepted,
    call_on_claim,
    claim_accepted,
    confirmed,
    forget_listener,
    forget_when_collected,
    hold_ended,
    make_room,
    numeric_address_infos,
    register_listener,
    users_sockname,
    wait_for_room,
)
from ._readiness import Readiness, Signals, leave, parker, readiness_owners, sleep, wake

_ss = _socket.socket  # the C methods, below every Python override
OriginalSocket: "type[socket.socket]" = STDLIB_SOCKET  # the stdlib class, as it was at import
_INET = (socket.AF_INET, socket.AF_INET6)
_MAX_JOIN = 64 * 1024
# Plain ints: the socket module's are IntFlag members, whose ``&`` and ``~``
# run in Python (some microseconds a call).
_PEEK = int(socket.MSG_PEEK)
_OOB = int(socket.MSG_OOB)
_DONTWAIT = int(socket.MSG_DONTWAIT)
_WAITALL = int(socket.MSG_WAITALL)
_SUPPORTED_RECV_FLAGS = _PEEK | _DONTWAIT | _WAITALL
# MSG_MORE holds a segment back for more to come: a link has no segments.
_SUPPORTED_SEND_FLAGS = (_DONTWAIT | int(getattr(socket, "MSG_NOSIGNAL", 0))
                         | int(getattr(socket, "MSG_MORE", 0)))
_ENTRY = "_friendsock_listener"  # where a registered listener keeps its registry entry
# Held to make a readiness descriptor (two threads asking fileno() at once
# make one), to turn a socket into a friend socket, and by a fork's hand-over
# of links to TCP: each sees the other done or not begun.
_ends_lock = threading.Lock()

# Whether connect() and listen() pair: set by patch_socket(). Sockets made
# while patched stay FriendCapableSockets after unpatch_socket(), plain again.
patched = False


def _unsupported(what: str) -> OSError:
    return OSError(errno.EOPNOTSUPP, f"{what} is not supported on a friend socket: its bytes "
                                     f"do not go through a descriptor")


def _bad_fd() -> OSError:
    return OSError(errno.EBADF, "Bad file descriptor")


def _would_block() -> OSError:
    return BlockingIOError(errno.EAGAIN, "Resource temporarily unavailable")


class _SocketMeta(type):
    """``isinstance(x, socket.socket)`` still holds, while patched, for every
    socket: those made before and ``ssl.SSLSocket``s, whose class is the
    stdlib's."""

    def __instancecheck__(cls, obj: Any) -> bool:
        if cls is FriendCapableSocket:
            return isinstance(obj, OriginalSocket)
        return type.__instancecheck__(cls, obj)

    def __subclasscheck__(cls, sub: type) -> bool:
        if cls is FriendCapableSocket:
            return issubclass(sub, OriginalSocket)
        return type.__subclasscheck__(cls, sub)

    def __setattr__(cls, name: str, value: Any) -> None:
        # pytest-socket's allow_hosts guards a test's connects by setting
        # socket.socket.connect (this class, while patched), and puts back
        # only the class it saved: its guard is asked first here, and
        # dropped after the test (drop_connect_guard).
        if name == "connect" and cls is FriendCapableSocket and \
                getattr(value, "__module__", None) == "pytest_socket":
            value = _asking_first(value)
        type.__setattr__(cls, name, value)
        if cls is FriendCapableSocket and name in _PAIRED_IO:
            _note_replaced(name)

    def __delattr__(cls, name: str) -> None:
        type.__delattr__(cls, name)
        if cls is FriendCapableSocket and name in _PAIRED_IO:
            _note_replaced(name)


# The I/O calls a paired socket's class overrides. A test that mocks one
# on socket.socket (mock.patch("socket.socket.recv", side_effect=...))
# means the mock for every socket; while one is mocked, connects do not
# pair, and the mock sees their bytes, as over TCP. Not any replacement:
# a wrapper that goes on to the original (blockbuster's, in anyio's and
# aiohttp's suites, around every test) changes no byte, and pairing goes
# on under it.
_PAIRED_IO = frozenset({"recv", "recv_into", "recvfrom", "recvfrom_into", "recvmsg",
                        "recvmsg_into", "send", "sendall", "sendto", "sendmsg", "sendfile",
                        "shutdown"})
_replaced_io: Set[str] = set()


def _note_replaced(name: str) -> None:
    if _is_mock(FriendCapableSocket.__dict__.get(name)):
        _replaced_io.add(name)
    else:  # put back (inherited again, or set back), or not a mock
        _replaced_io.discard(name)


def _is_mock(value: Any) -> bool:
    """A unittest.mock object, or a function mock.patch(autospec=True) made."""
    mock = sys.modules.get("unittest.mock")
    if mock is None or value is None:
        return False
    return isinstance(value, mock.NonCallableMock) or \
        isinstance(getattr(value, "mock", None), mock.NonCallableMock)


class Descriptor:
    """The TCP descriptor of a friend socket, as the pairing steps and the
    link see it: the C socket calls, below the friend socket's own
    overrides. Held weakly while the user holds the socket; once the user
    closes it, the descriptor is moved here, and the link releases it when
    both ends are done (``release_sockets``)."""

    __slots__ = ("_ref", "_own", "__weakref__")

    def __init__(self, sock: socket.socket) -> None:
        self._ref = weakref.ref(sock)
        self._own: Optional[socket.socket] = None

    def _target(self) -> Any:
        own = self._own
        if own is not None:
            return own
        sock = self._ref()
        if sock is None:
            raise _bad_fd()
        return sock

    def take_over(self, sock: socket.socket) -> None:
        """The user closed ``sock``: keep its descriptor until the link is
        done (or, one kept already from a duplicate of it, close it)."""
        if self._own is not None:
            _ss.close(sock)
            return
        fd = _ss.detach(sock)
        if fd >= 0:
            self._own = OriginalSocket(sock.family, sock.type, sock.proto, fileno=fd)

    def kept(self) -> Optional[socket.socket]:
        """The descriptor kept from the user's close, if any."""
        return self._own

    def close_kept(self) -> None:
        """Close the descriptor kept from a closed duplicate, if any (the
        connection went on over TCP: the others hold their own)."""
        own, self._own = self._own, None
        if own is not None:
            own.close()

    def fileno(self) -> int:
        try:
            return _ss.fileno(self._target())
        except OSError:
            return -1

    def shutdown(self, how: int) -> None:
        _ss.shutdown(self._target(), how)

    def getsockname(self) -> Any:
        return _ss.getsockname(self._target())

    def getpeername(self) -> Any:
        return _ss.getpeername(self._target())

    def getsockopt(self, *args: Any) -> Any:
        return _ss.getsockopt(self._target(), *args)

    def setsockopt(self, *args: Any) -> None:
        _ss.setsockopt(self._target(), *args)

    def bind(self, address: Any) -> None:
        _ss.bind(self._target(), address)

    def connect_ex(self, address: Any) -> int:
        return _ss.connect_ex(self._target(), address)

    def close(self) -> None:
        own = self._own
        if own is not None:
            self._own = None
            own.close()
            return
        sock = self._ref()
        if sock is not None:
            _ss.close(sock)


def named_as(text: str, name: str, friend: bool = False) -> str:
    """A socket's repr (``<module.Class fd=...>``) under the stdlib class
    ``name`` it stands in for, a paired one's marked at the end: a warning
    filter on "unclosed <socket.socket fd=" (the finalizer's ResourceWarning
    says the repr) matches as without friendsock."""
    text = f"<{name}{text[text.index(' '):]}"
    return f"{text[:-1]} [friend]>" if friend else text


class FriendCapableSocket(OriginalSocket, metaclass=_SocketMeta):  # type: ignore[misc,valid-type]
    """``socket.socket`` while patched (see the module doc). No
    ``__slots__``: a paired one becomes a :class:`FriendBlockingSocket`,
    which needs the same layout."""

    def __init__(self, family: int = -1, type: int = -1, proto: int = -1,
                 fileno: Optional[int] = None) -> None:
        if fileno is not None and readiness_owners:
            friend = _friend_of_readiness(fileno)
            if friend is not None:
                friend._share_with(self, fileno)
                return
        OriginalSocket.__init__(self, family, type, proto, fileno)

    def __repr__(self) -> str:
        return named_as(OriginalSocket.__repr__(self), "socket.socket")  # type: ignore[call-arg]

    # -- connecting -------------------------------------------------------
    def connect(self, address: Any) -> None:
        if not patched or not _may_pair(self) or not connect_friend(self, address):
            _ss.connect(self, address)

    def connect_ex(self, address: Any) -> int:
        if not patched or not _may_pair(self):
            return _ss.connect_ex(self, address)
        try:
            if connect_friend(self, address):
                return 0
        except TimeoutError:
            return errno.EAGAIN  # as the C connect_ex reports its timeout
        except OSError as exc:
            if exc.errno is None:
                raise
            return exc.errno
        return _ss.connect_ex(self, address)

    # -- listening ----------------------------------------------------------
    def listen(self, *backlog: int) -> None:
        _ss.listen(self, *backlog)
        if patched and _ENTRY not in self.__dict__ and _may_pair(self):
            _register_listener(self)

    def accept(self) -> Tuple[socket.socket, Any]:
        entry: Optional[Entry] = self.__dict__.get(_ENTRY)
        if entry is not None:
            entry.proven = True  # what it accepts from now on, it claims
        fd, address = self._accept()  # type: ignore[attr-defined]
        entry = self.__dict__.get(_ENTRY)
        if entry is not None:
            make_room(entry)  # connects held back by a full accept queue may go on
        sock = _new_capable(self.family, self.type, self.proto, fd)
        # As the stdlib's accept(): blocking unless a default timeout is set.
        if socket.getdefaulttimeout() is None and self.gettimeout():
            sock.setblocking(True)
        if entry is not None:
            _claim(sock, address, entry, self.gettimeout())
        return sock, address

    # An event loop taking the socket over makes it non-blocking: its own
    # accept pairs from then on, or nobody's does.
    def setblocking(self, flag: bool) -> None:
        _ss.setblocking(self, flag)
        if not flag and _ENTRY in self.__dict__:
            _forget_listener(self, handed_on=True)

    def settimeout(self, value: Optional[float]) -> None:
        _ss.settimeout(self, value)
        if value == 0 and _ENTRY in self.__dict__:
            _forget_listener(self, handed_on=True)

    def detach(self) -> int:
        if _ENTRY in self.__dict__:
            _forget_listener(self, handed_on=True)
        return OriginalSocket.detach(self)

    def _real_close(self, _ss: Any = _ss) -> None:
        if _ENTRY in self.__dict__:
            _forget_listener(self)
        _ss.close(self)


_OWN_CONNECT = FriendCapableSocket.__dict__["connect"]


def _asking_first(guard: Callable[..., None]) -> Callable[..., None]:
    """``connect`` under a guard that refuses some addresses (raising) and
    connects the others natively: asked with a UDP socket of the same
    family, whose connect sends nothing, what it lets through connects (and
    pairs) as without it; what it refuses is refused as it refuses it."""
    def connect(self: FriendCapableSocket, address: Any) -> None:
        if not patched or not _may_pair(self):
            guard(self, address)
            return
        probe = _ss(self.family, socket.SOCK_DGRAM)
        try:
            guard(probe, address)
        except OSError:
            pass  # let through: the probe's own connect failed (no route)
        except BaseException:
            self.close()  # as the guard closes the socket it refuses
            raise
        finally:
            probe.close()
        _OWN_CONNECT(self, address)

    connect._friendsock_guard = guard  # type: ignore[attr-defined]
    return connect


def drop_connect_guard() -> None:
    """The patched class's own ``connect`` again, if a guard set for a test
    is still on it (see ``_SocketMeta.__setattr__``)."""
    current = FriendCapableSocket.__dict__.get("connect")
    if current is not _OWN_CONNECT and getattr(current, "_friendsock_guard", None) is not None:
        type.__setattr__(FriendCapableSocket, "connect", _OWN_CONNECT)


def _new_capable(family: int, type: int, proto: int, fd: int) -> FriendCapableSocket:
    sock = FriendCapableSocket.__new__(FriendCapableSocket)
    OriginalSocket.__init__(sock, family, type, proto, fd)
    return sock


def _friend_of_readiness(fileno: Any) -> Optional["FriendBlockingSocket"]:
    """The open friend socket whose readiness descriptor ``fileno`` is (or
    a duplicate of it is): a socket made of it is that friend socket's
    connection. None: no readiness descriptor; one of no friend socket
    (a connect's, for its claim) is refused, clearly."""
    try:
        inode = os.fstat(operator.index(fileno)).st_ino
    except (OSError, TypeError, ValueError):
        return None  # the socket constructor reports it
    owner = readiness_owners.get(inode)
    if owner is None:
        return None
    friend = owner()
    if friend is None or friend._friend_closed:
        raise _unsupported("a socket made from this descriptor")
    return friend  # type: ignore[no-any-return]


def _may_pair(sock: socket.socket) -> bool:
    """A blocking (or timeout) TCP socket of the patched class itself, with
    pairing switched on. A subclass (one its user defined while patched)
    keeps its class and its own methods doing the I/O: it is TCP."""
    return type(sock) is FriendCapableSocket and sock.family in _INET and \
        _ss.type.__get__(sock) & 0xF == socket.SOCK_STREAM and sock.gettimeout() != 0.0 and \
        is_enabled() and not _replaced_io and sock not in _handshake.adoptable_connecting


# -- the listening side ---------------------------------------------------------


def _register_listener(sock: FriendCapableSocket) -> None:
    exclusive = True
    if getattr(socket, "SO_REUSEPORT", None) is not None:
        exclusive = not sock.getsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT)
    # Every blocking listener accepts on a thread of its own: its owner is
    # nobody else's, so every link with it is threaded. A weak proxy: the
    # registry must not keep its user's socket open.
    # Not proven until its accept() runs: its owner may hand it to code
    # that accepts natively first (see ListenerEntry).
    entry = register_listener(weakref.proxy(sock), None, owner=object(), exclusive=exclusive,  # type: ignore[arg-type]
                              proven=False)
    sock.__dict__[_ENTRY] = entry
    forget_when_collected(sock, entry)


def _forget_listener(sock: FriendCapableSocket, handed_on: bool = False) -> None:
    """``sock`` stops pairing: closed, or ``handed_on`` (see
    :func:`listener_handed_on`)."""
    entry = sock.__dict__.pop(_ENTRY, None)
    if entry is None:
        return
    if not handed_on:
        forget_listener(entry)
        return
    listener_handed_on(entry)


def listener_handed_on(entry: Entry) -> None:
    """The listener of ``entry`` goes on in the hands of code that accepts
    natively (an event loop's): connects waiting in its backlog from
    blocking sockets go on over TCP, where the new owner's accept finds
    them (their friend ends elsewhere are reset, as by a closing listener)."""
    with _ends_lock:
        ends = _ends_of_sockets()
        forget_listener(entry, lambda link: _hand_over(link, ends, unaccepted=True))


def take_listener(sock: socket.socket) -> Optional[Entry]:
    """The entry of ``sock``, a listener of the patched class, taken from it
    for code that goes on accepting through friendsock (an installed loop's
    server, trio's accept under install()): the socket no longer answers
    for it (made non-blocking, it forgets nothing), and the taker moves its
    backlog on (``Registry.move_listener``), forgets it, or hands it on
    (:func:`listener_handed_on`). None for any other socket."""
    if type(sock) is not FriendCapableSocket:
        return None
    return sock.__dict__.pop(_ENTRY, None)  # type: ignore[no-any-return]


def _claim(sock: FriendCapableSocket, address: Any, entry: Entry,
           timeout: Optional[float]) -> None:
    """Pair the accepted ``sock`` if a friendsock client of this process made
    it. ``timeout``: the listener's (None: blocking), which bounds a hold."""
    descriptor = Descriptor(sock)
    with _ends_lock:  # claimed, and known as sock's, at once (see _connecting)
        pending, sockname = claim_accepted(descriptor, address, hold=True,  # type: ignore[arg-type]
                                           listener=entry.handle)
        if pending is None:
            counters.fallback(Fallback.PEER_NOT_FRIEND, entry.endpoint)
            return
        _connecting[pending.link.server] = sock
    try:
        if pending.state is PendingState.HELD and not _hold_for_client(sock, pending, timeout):
            return
        with _ends_lock:
            # Handed over meanwhile (a fork, the client's hand-over): sock
            # is its connection, and the link nobody's to adopt.
            handed_over = pending.link.server.incoming.state is CHANNEL_TCP
            if not handed_over:
                adopt_accepted(descriptor, pending)  # type: ignore[arg-type]
        if not handed_over:
            become_friend(sock, pending.link.server, sockname, address, descriptor)
    finally:
        _connecting.pop(pending.link.server, None)
    # A blocking client still inside its connect() (between the syscall and
    # becoming a friend socket) becomes one now: once accept() returns, a
    # thread polling it (fileno()) sees the link, not the TCP descriptor.
    client_sock = _connecting.get(pending.link.client)
    if client_sock is not None:
        client = pending.handle
        become_friend(client_sock, pending.link.client, client.sockname, client.peername,
                      client.sock)  # type: ignore[arg-type]
    if pending.on_claimed is not None:
        pending.on_claimed()


def _hold_for_client(sock: FriendCapableSocket, pending: Pending,
                     timeout: Optional[float]) -> bool:
    """The accept of a connect whose socket its user still holds (an event
    loop's ``sock_connect``, as aiohttp's connector makes, until it hands
    the socket to ``create_connection(sock=)``) waits for that adoption, in
    the accepting thread: True once the link forms; False (TCP, with
    whatever arrived still in ``sock``) when TCP bytes or EOF arrive
    instead (the socket is used raw), or after the confirmed mode's
    deadline, or the listener's own ``timeout`` if that is shorter (an
    accept with a timeout returns within it)."""
    me = parker()
    settled = [me]  # the connecting end's settling wakes us (any thread)
    pending.on_settled = lambda state: wake(settled)
    try:
        poller = select.poll()
        fd = _ss.fileno(sock)
        poller.register(fd, select.POLLIN)
        poller.register(me.read_fd, select.POLLIN)
        wait = _handshake.CONFIRM_TIMEOUT
        if timeout is not None:
            wait = min(wait, timeout)
        deadline = time.monotonic() + wait
        # Set, then check: the connecting end may have settled it first.
        while pending.state is PendingState.HELD:
            left = deadline - time.monotonic()
            if left <= 0:
                break
            ready = dict(poller.poll(int(left * 1000) + 1))
            if fd in ready:
                break  # used raw
            if me.read_fd in ready:
                me.take_wakes()
                settled[:] = [me]
    finally:
        pending.on_settled = None
    return hold_ended(pending)


# -- the connecting side ----------------------------------------------------------

_OWNER = object()  # a blocking client's scheduler: never a listener's, so links are threaded


def _resolve(sock: socket.socket, address: Any) -> Optional[Any]:
    """The numeric address a connect to ``address`` reaches, as the
    accepting side will see it; None when it cannot pair."""
    try:
        host, port = address[0], address[1]
    except (TypeError, IndexError, KeyError):
        return None  # the native connect reports it
    infos = numeric_address_infos(host, port, sock.family)
    if infos is None:
        if type(port) is not int or not registry.has_port(port):
            return None
        try:
            infos = socket.getaddrinfo(host, port, sock.family, socket.SOCK_STREAM)
        except (OSError, UnicodeError):
            return None
        if not infos:
            return None
    return infos[0][4]


def _deadline(sock: socket.socket) -> Optional[float]:
    timeout = sock.gettimeout()
    return None if timeout is None else time.monotonic() + timeout


def _left(deadline: Optional[float]) -> Optional[float]:
    """Seconds left before ``deadline``; TimeoutError once none are."""
    if deadline is None:
        return None
    left = deadline - time.monotonic()
    if left <= 0:
        raise TimeoutError("timed out")
    return left


def connect_friend(sock: FriendCapableSocket, address: Any) -> bool:
    """``connect()`` of a blocking socket: pair with a friendsock listener
    of this process if ``address`` is one (True: connected, paired or
    not); False, nothing done, when the native connect should take over
    (the fallback counted)."""
    resolved = _resolve(sock, address)
    if resolved is None:
        return False
    if not registry.has_port(resolved[1]):
        counters.fallback(Fallback.NO_LISTENER, resolved)
        return False
    sockname = users_sockname(sock)
    if sockname is None:
        return False  # closed: the native connect says so
    attempt = ConnectAttempt(resolved, source=sockname[0])
    if attempt.entry is None:
        counters.fallback(Fallback.NO_LISTENER, resolved)
        return False
    descriptor = Descriptor(sock)
    attempt.sock = descriptor  # type: ignore[assignment]
    attempt.bind_users_socket(sockname)
    entry = attempt.entry
    if entry is None:  # not an address of ours
        counters.fallback(attempt.fallback, resolved)
        return False
    deadline = _deadline(sock)
    while (err := _start(sock, attempt)) is None:
        _room_made(entry, deadline)
    pending = attempt.pending
    if pending is None:  # the listener just went away: nothing connected yet
        return False
    try:
        if err:
            attempt.give_up(close=False)
            if err in (errno.EAGAIN, errno.EINPROGRESS) and deadline is not None:
                raise TimeoutError("timed out")
            raise OSError(err, os.strerror(err))
        return _finish_connect(sock, attempt, pending, descriptor)
    finally:
        _connecting.pop(pending.link.client, None)


def _start(sock: FriendCapableSocket, attempt: ConnectAttempt) -> Optional[int]:
    """``attempt.start()``; the link it makes is known as ``sock``'s before
    a fork can see it (the server may accept and fork at once)."""
    with _ends_lock:
        err = attempt.start(_OWNER)
        if attempt.pending is not None:
            _connecting[attempt.pending.link.client] = sock
    return err


def _finish_connect(sock: FriendCapableSocket, attempt: ConnectAttempt, pending: Pending,
                    descriptor: Descriptor) -> bool:
    """The rest of :func:`connect_friend`, the link made: its client end is
    ``sock``'s to be (a fork meanwhile hands it over with the link)."""
    if not attempt.connected():  # named otherwise by the kernel: plain TCP
        counters.fallback(attempt.fallback, attempt.address)
        return True
    if not attempt.optimistic:
        try:
            if not _confirm(pending, descriptor):
                return True  # another process accepted it: plain TCP, connected
        except BaseException:
            attempt.give_up(close=False)
            raise
    client = pending.handle
    become_friend(sock, pending.link.client, client.sockname, client.peername, descriptor)
    return True


def _room_made(entry: Entry, deadline: Optional[float]) -> None:
    """Wait for the listener's accept queue to have room made: until it
    accepts, goes away, or a while has passed (for room made by an accept
    friendsock did not see); TimeoutError past the socket's timeout."""
    woken = threading.Event()
    if not wait_for_room(entry, woken.set):
        return
    try:
        left = _left(deadline)
        wait = _handshake.ROOM_RECHECK if left is None else min(left, _handshake.ROOM_RECHECK)
        if not woken.wait(wait):
            _left(deadline)
    finally:
        registry.cancel_wait_for_accept_room(entry, woken.set)


def _confirm(pending: Pending, descriptor: Descriptor) -> bool:
    """A listener other processes may share: pair only once this process
    claims the connect (True). Anything arriving on the real socket means
    another process accepted it; so does silence past the deadline. Waits
    on both descriptors at once: the claim's wake-up is a readiness pair."""
    readiness = Readiness()
    try:
        return _await_claim(pending, descriptor, readiness)
    finally:
        readiness.close()


def _await_claim(pending: Pending, descriptor: Descriptor, readiness: Readiness) -> bool:
    claimed = []

    def on_claim() -> None:  # on any thread
        claimed.append(True)
        readiness.set_readable()

    call_on_claim(pending, on_claim, on_claim)
    real_fd = descriptor.fileno()
    poller = select.poll()
    poller.register(real_fd, select.POLLIN)
    poller.register(readiness.fd, select.POLLIN)
    deadline = time.monotonic() + _handshake.CONFIRM_TIMEOUT
    while not claimed:
        left = deadline - time.monotonic()
        if left <= 0 or any(fd == real_fd for fd, _ in poller.poll(int(left * 1000) + 1)):
            break
    return confirmed(pending, bool(claimed))


# -- the paired socket ------------------------------------------------------------


def become_friend(sock: FriendCapableSocket, end: LinkEnd, sockname: Any, peername: Any,
                  descriptor: Descriptor) -> bool:
    """Turn ``sock`` (connected or accepted, the link established) into the
    friend socket of ``end``; False, ``sock`` left as it is, when a fork
    handed the link over to TCP meanwhile (``sock`` is its connection)."""
    with _ends_lock:
        if end.incoming.state is CHANNEL_TCP:
            return False
        if type(sock) is not FriendBlockingSocket:  # else made one by the accept already
            _make_friend(sock, end, sockname, peername, descriptor)
    return True


def _make_friend(sock: FriendCapableSocket, end: LinkEnd, sockname: Any, peername: Any,
                 descriptor: Descriptor) -> None:
    sock.__class__ = FriendBlockingSocket
    friend: FriendBlockingSocket = sock  # type: ignore[assignment]
    _friend_sockets.add(friend)
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
    # that takes the end over (give_end_away) to show it. (Hidden before it
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


class FriendBlockingSocket(PairedSocketCalls, FriendCapableSocket):
    """A blocking socket (connected or accepted) whose bytes move through a
    friend link. Not made directly: ``connect()`` and ``accept()`` turn a
    socket into one."""

    _end: LinkEnd
    _signals: Signals
    _descriptor: Descriptor
    _options: FriendSocket
    _read_shut: bool
    _friend_closed: bool

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        raise TypeError("friend sockets are made by connect() and accept(), not directly")

    def __del__(self) -> None:
        # Collected unclosed: warn and close, as a real socket's finalizer
        # (by a thread of its own where a collection runs it: see
        # close_when_safe).
        # Under a TLS socket it is that one's (which warns for itself), as
        # the stdlib's SSLSocket takes over the socket it wraps. Closed even
        # where the warning is an error: the friend must not wait forever.
        if not self.__dict__.get("_friend_closed", True):
            try:
                if not self.__dict__.get("_under_tls", False):
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
        with _ends_lock:
            ready = self._signals.ready
            if ready is not None:  # another thread made it meanwhile
                return ready.fd
            if self._in.state is CHANNEL_TCP:  # handed over meanwhile
                return _ss.fileno(self)  # type: ignore[no-any-return]
            try:
                ready = Readiness(self)
            except OSError as exc:
                if exc.errno not in (errno.EMFILE, errno.ENFILE) or not _hand_over_socket(self):
                    raise
                return _ss.fileno(self)  # type: ignore[no-any-return]
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

    def _check_open(self) -> None:
        if self._friend_closed:
            raise _bad_fd()

    def dup(self) -> socket.socket:
        """Another socket object on this connection, as the kernel's dup():
        its bytes are this one's link, and the connection closes with the
        last of them."""
        self._check_open()
        twin: FriendBlockingSocket = FriendCapableSocket.__new__(FriendCapableSocket)  # type: ignore[assignment]
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
        OriginalSocket.__init__(twin, self.family, self.type, self.proto, fd)  # type: ignore[misc]
        twin.__class__ = FriendBlockingSocket
        _friend_sockets.add(twin)  # type: ignore[arg-type]
        handles = self.__dict__.get("_handles")
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
        fd = self.__dict__.get("_shared_fd")
        if fd is not None:
            if not self._friend_closed:
                self._close_friend()
            return fd  # type: ignore[no-any-return]
        if not self._friend_closed:
            go_on_over_tcp(self, "detach()")
        return OriginalSocket.detach(self)

    def listen(self, *args: Any) -> None:
        self._check_open()
        raise OSError(errno.EINVAL, "Invalid argument")

    def accept(self) -> Tuple[socket.socket, Any]:
        self._check_open()
        raise OSError(errno.EINVAL, "Invalid argument")

    def bind(self, address: Any) -> None:
        self._check_open()
        raise OSError(errno.EINVAL, "Invalid argument")

    def connect(self, address: Any) -> None:
        self._check_open()
        raise OSError(errno.EISCONN, "Transport endpoint is already connected")

    def connect_ex(self, address: Any) -> int:
        self._check_open()
        return errno.EISCONN

    def setblocking(self, flag: bool) -> None:
        self._check_open()
        _ss.setblocking(self, flag)

    def settimeout(self, value: Optional[float]) -> None:
        self._check_open()
        _ss.settimeout(self, value)

    def sendfile(self, file: Any, offset: int = 0, count: Optional[int] = None) -> int:
        # os.sendfile() would write to the readiness descriptor: send() instead.
        return self._sendfile_use_send(file, offset, count)  # type: ignore[attr-defined,no-any-return]

    def _sendfile_use_sendfile(self, file: Any, offset: int = 0, count: Optional[int] = None) -> int:
        # The stdlib's os.sendfile() path, which code may call itself (CPython's
        # own tests do): its checks, its giving up on what os.sendfile()
        # cannot read, and its result; the bytes go through send() too.
        self._check_sendfile_params(file, offset, count)  # type: ignore[attr-defined]
        try:
            size = os.fstat(file.fileno()).st_size
        except (AttributeError, io.UnsupportedOperation, OSError) as exc:
            raise socket._GiveupOnSendfile(exc)  # type: ignore[attr-defined]  # not a regular file
        if not size:
            return 0
        return self._sendfile_use_send(file, offset, count)  # type: ignore[attr-defined,no-any-return]

    # -- waiting ---------------------------------------------------------------
    @staticmethod
    def _wait_deadline(timeout: Optional[float], deadline: Optional[float]) -> Optional[float]:
        """The deadline of a wait (set on its first sleep). Non-blocking:
        BlockingIOError; past the timeout: TimeoutError."""
        if timeout is None:
            return None
        if timeout == 0.0:
            raise _would_block()
        if deadline is None:
            return time.monotonic() + timeout
        if time.monotonic() >= deadline:
            raise TimeoutError("timed out")
        return deadline

    # -- receiving -------------------------------------------------------------
    def _drained(self) -> None:
        """The link is empty: the readiness descriptor is unreadable until
        the next write (a write that raced in is seen, and keeps it
        readable)."""
        self._in.begin_drain()
        ready = self._signals.ready
        if ready is not None:
            self._signals.sync_readable(ready)

    def _readable(self, timeout: Optional[float], at_least: int = 1) -> Seen:
        """Wait until the link has something for us: DATA (``at_least``
        bytes of it, unless the friend is done writing), EOF or RESET."""
        channel = self._in
        signals = self._signals
        deadline = None
        while True:
            if self._friend_closed:
                raise _bad_fd()
            seen = channel.seen()
            if seen is not SEEN_NOTHING and (
                    seen is not SEEN_DATA or channel.queued >= at_least or channel.state is not CHANNEL_OPEN):
                return seen
            if self._read_shut:  # Linux still reads what comes (then EOF, not a wait)
                return SEEN_EOF
            if timeout is not None:
                deadline = self._wait_deadline(timeout, deadline)
            me = parker()
            readers = signals.readers
            readers.append(me)
            # The reader's hook is armed only now: a reader that never
            # waits costs the writer nothing.
            if signals.ready is None:
                channel.begin_drain()
            else:
                self._drained()  # and a token that raced in is taken back
            if channel.queued >= at_least or channel.state is not CHANNEL_OPEN or self._read_shut or \
                    self._friend_closed:
                leave(readers, me)
            else:
                sleep(readers, me, deadline)

    def recv(self, bufsize: int, flags: int = 0) -> bytes:
        channel = self._in
        if type(bufsize) is int and bufsize > 0 and not flags:  # the common case
            if channel.queued and not self._friend_closed:
                seen = SEEN_DATA
            else:
                seen = self._readable(self.gettimeout())
        else:
            bufsize = operator.index(bufsize)
            if bufsize < 0:
                raise ValueError("negative buffersize in recv")
            if bufsize == 0:  # the C call's answer before any other check
                return b""
            if flags & _OOB:
                timeout = self.gettimeout()
                if timeout:  # the stdlib waits for readiness first in timeout mode
                    self._readable(timeout)
                else:
                    self._check_open()
                raise no_urgent_data()
            timeout = self._flags_timeout(flags, _SUPPORTED_RECV_FLAGS)
            self._check_open()
            if flags & _WAITALL and timeout is None:
                return self._recv_waiting_for_all(bufsize, flags)
            # (In timeout mode the stdlib polls, then reads what is there:
            # MSG_WAITALL changes nothing, as it changes nothing here.)
            seen = self._readable(timeout)
        while seen is SEEN_DATA:
            peek = flags & _PEEK
            data = channel.peek(bufsize) if peek else channel.pull(bufsize, _MAX_JOIN)
            if data:
                if not peek and not channel.queued and self._signals.ready is not None:
                    self._drained()
                return data
            # Taken by a duplicate's reader, or handed over to TCP (a fork),
            # since we looked.
            seen = self._readable(self._flags_timeout(flags, _SUPPORTED_RECV_FLAGS) if flags
                                  else self.gettimeout())
        if seen is SEEN_EOF:
            return b""
        if seen is SEEN_TCP:
            return _ss.recv(self, bufsize, flags)  # type: ignore[no-any-return]
        self._read_reset()
        return b""

    def _recv_waiting_for_all(self, bufsize: int, flags: int) -> bytes:
        """A blocking ``recv(bufsize, MSG_WAITALL)``, as Linux answers it:
        ``bufsize`` bytes, or fewer once the friend is done writing (EOF, or
        its reset, which the next call reports when bytes came first). With
        MSG_PEEK, once ``bufsize`` bytes are there, they stay there."""
        channel = self._in
        if flags & _PEEK:
            seen = self._readable(None, at_least=bufsize)
            if seen is SEEN_DATA:
                return channel.peek(bufsize)
            if seen is SEEN_TCP:
                return _ss.recv(self, bufsize, flags)  # type: ignore[no-any-return]
            if seen is SEEN_RESET:
                self._read_reset()
            return b""
        parts: List[bytes] = []
        wanted = bufsize
        while wanted:
            # Pulled as it comes, making room for the friend's writes: more
            # may be asked for than the link holds at once.
            seen = self._readable(None)
            if seen is SEEN_DATA:
                data = channel.pull(wanted, _MAX_JOIN)
                parts.append(data)
                wanted -= len(data)
            elif seen is SEEN_TCP:
                parts.append(_ss.recv(self, wanted, flags))
                break
            else:
                if seen is SEEN_RESET and not parts:
                    self._read_reset()
                break
        if not channel.queued and self._signals.ready is not None:
            self._drained()
        return b"".join(parts)

    def recv_into(self, buffer: Any, nbytes: int = 0, flags: int = 0) -> int:
        view = memoryview(buffer)
        if view.readonly:
            raise TypeError("recv_into() argument 'buffer' must be read-write bytes-like object")
        view = view.cast("B")
        nbytes = operator.index(nbytes)
        if nbytes < 0:
            raise ValueError("negative buffersize in recv_into")
        if nbytes:
            if nbytes > len(view):
                raise ValueError("buffer too small for requested bytes")
            view = view[:nbytes]
        if flags:
            data = self.recv(len(view), flags)
            view[:len(data)] = data
            return len(data)
        self._check_open()
        if not view:
            return 0
        channel = self._in
        seen = SEEN_DATA if channel.queued else self._readable(self.gettimeout())
        while seen is SEEN_DATA:
            copied = channel.pull_into(view)
            if copied:
                if not channel.queued and self._signals.ready is not None:
                    self._drained()
                return copied
            seen = self._readable(self.gettimeout())  # (see recv)
        if seen is SEEN_EOF:
            return 0
        if seen is SEEN_TCP:
            return _ss.recv_into(self, view)  # type: ignore[no-any-return]
        self._read_reset()
        return 0

    def _read_reset(self) -> None:
        """A read found the friend's reset and nothing left: its error, the
        first time (raised); EOF after that (returns)."""
        error = self._end.take_error()
        if error is not None:
            raise error.as_os_error()

    def recvfrom(self, bufsize: int, flags: int = 0) -> Tuple[bytes, None]:
        # A connected stream socket's recvfrom() gives no address.
        return self.recv(bufsize, flags), None

    def recvfrom_into(self, buffer: Any, nbytes: int = 0, flags: int = 0) -> Tuple[int, None]:
        return self.recv_into(buffer, nbytes, flags), None

    # recvmsg/sendmsg: scatter/gather reads and writes (see recvmsg_size).
    def recvmsg(self, bufsize: int, ancbufsize: int = 0, flags: int = 0) -> Tuple[bytes, list, int, None]:
        return self.recv(recvmsg_size(bufsize, ancbufsize), flags), [], 0, None

    def recvmsg_into(self, buffers: Any, ancbufsize: int = 0, flags: int = 0) -> Tuple[int, list, int, None]:
        views = recvmsg_views(buffers, ancbufsize)
        return scatter(self.recv(sum(len(view) for view in views), flags), views), [], 0, None

    def _flags_timeout(self, flags: int, supported: int) -> Optional[float]:
        """The timeout a call with ``flags`` waits for. MSG_DONTWAIT makes a
        blocking socket's call non-blocking; in timeout mode the stdlib
        waits for readiness before the call, so the flag changes nothing."""
        if flags & ~supported:
            raise _unsupported(f"flags={flags!r}")
        timeout = self.gettimeout()
        return 0.0 if flags & _DONTWAIT and timeout is None else timeout

    # -- sending ----------------------------------------------------------------
    def _sync_writable(self) -> None:
        """Make the readiness descriptor (there is one) writable exactly
        while the link has room (the friend's read that makes room drains
        it)."""
        ready = self._signals.ready
        if ready is None:
            return
        out = self._out
        if out.wake_writer_at(-1):
            ready.set_writable()
            return
        ready.clear_writable()
        if out.wake_writer_at(-1):  # room made meanwhile, its wake-up maybe before the fill
            ready.set_writable()

    def _send_some(self, data: bytes) -> int:
        try:
            sent = self._end.send_some(data)
        except LinkBrokenError as exc:
            raise exc.as_os_error() from None
        out = self._out
        if sent and out.queued >= out.sndbuf + out.rcvbuf and self._signals.ready is not None:
            self._sync_writable()
        return sent

    def _wait_writable(self, timeout: Optional[float], deadline: Optional[float]) -> Optional[float]:
        """Sleep until the link has room (or the friend's reader went away,
        or this socket is shut or closed); the deadline."""
        out = self._out
        if out.wake_writer_at(-1):
            return deadline  # room already: try again
        deadline = self._wait_deadline(timeout, deadline)
        signals = self._signals
        writers = signals.writers
        me = parker()
        writers.append(me)
        ready = signals.ready
        if out.wake_writer_at(-1) or out.state is not CHANNEL_OPEN or out.reader_closed or \
                self._friend_closed:
            leave(writers, me)
            if ready is not None:
                ready.set_writable()
            return deadline
        if ready is not None:
            ready.clear_writable()
            if out.wake_writer_at(-1):  # room made meanwhile, its wake-up maybe before the fill
                ready.set_writable()
                leave(writers, me)
                return deadline
        sleep(writers, me, deadline)
        return deadline

    def _push_whole(self, data: bytes) -> bool:
        """The common case: all of ``data`` (bytes) fits; queued by reference."""
        out = self._out
        if self._friend_closed or out.state is not CHANNEL_OPEN or out.reader_closed or \
                out.queued + len(data) > out.sndbuf + out.rcvbuf:
            return False
        try:
            out.push(data)
        except FriendError:  # the friend went away meanwhile: the slow way says how
            return False
        if out.queued >= out.sndbuf + out.rcvbuf and self._signals.ready is not None:
            self._sync_writable()
        return True

    def send(self, data: Any, flags: int = 0) -> int:
        if type(data) is not bytes:
            data = memoryview(data).tobytes()  # the caller may reuse its buffer
        if not flags and data and self._push_whole(data):
            return len(data)
        timeout = self._flags_timeout(flags, _SUPPORTED_SEND_FLAGS)
        if timeout is None:
            self._send_all(data, None)  # a blocking send() returns once all is queued
            return len(data)
        deadline = None
        while True:
            self._check_open()
            sent = self._send_some(data)
            if sent < 0:
                return _ss.send(self, data, flags)  # type: ignore[no-any-return]
            if sent or not data:
                return sent
            deadline = self._wait_writable(timeout, deadline)

    def sendall(self, data: Any, flags: int = 0) -> None:
        if type(data) is bytes and not flags and data and self._push_whole(data):
            return
        timeout = self._flags_timeout(flags, _SUPPORTED_SEND_FLAGS)
        self._send_all(data, timeout)

    def _send_all(self, data: Any, timeout: Optional[float]) -> None:
        """Queue all of ``data``, a piece at a time as room is made. Past the
        timeout, TimeoutError: what was queued stays queued, and arrives."""
        view = memoryview(data).cast("B")
        total = len(view)
        self._check_open()
        if not total:  # a send of nothing is checked as any send is
            if self._send_some(b"") < 0:
                _ss.sendall(self, b"")
            return
        offset = 0
        deadline = None
        out = self._out
        while offset < total:
            self._check_open()
            room = out.sndbuf + out.rcvbuf - out.queued
            if room <= 0 and out.state is CHANNEL_OPEN and not out.reader_closed:
                deadline = self._wait_writable(timeout, deadline)
                continue
            size = total - offset if room <= 0 else min(room, total - offset)
            chunk = data if size == total and type(data) is bytes else view[offset:offset + size].tobytes()
            sent = self._send_some(chunk)
            if sent < 0:
                _ss.sendall(self, view[offset:])
                return
            offset += sent

    def sendto(self, data: Any, *args: Any) -> int:
        # A connected stream socket ignores the address, as Linux's TCP does.
        if len(args) not in (1, 2):
            raise TypeError(f"sendto() takes 2 or 3 arguments ({len(args) + 1} given)")
        return self.send(data, args[0] if len(args) == 2 else 0)

    def sendmsg(self, buffers: Any, ancdata: Any = (), flags: int = 0, address: Any = None) -> int:
        return self.send(sendmsg_data(buffers, ancdata, address), flags)

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

    def give_end_away(self) -> Optional[Tuple[LinkEnd, socket.socket, Any, Any]]:
        """Hand this socket's end of the link to an event loop's transport
        (``create_connection(sock=)`` of an installed loop: uvloop's own
        would do its I/O on the readiness descriptor): ``(end, real socket,
        sockname, peername)``, this socket closed as far as its user is
        concerned; the real socket, its TCP descriptor, is the link's and
        released with it. None, nothing changed, where it cannot: closed,
        duplicated, under TLS, gone over to TCP."""
        with _ends_lock:
            if self._friend_closed or self._in.state is CHANNEL_TCP or \
                    self.__dict__.get("_handles") is not None or self.__dict__.get("_under_tls", False):
                return None
            if _hand_over_unclaimed(self):
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
        if self._in.state is CHANNEL_TCP:  # handed over as this close began
            _ss.close(self)
            return
        handles = self.__dict__.get("_handles")
        if handles is not None and handles.remove():
            self._descriptor.take_over(self)  # the connection stays the others'
            return
        self._in.notify_readable = None
        self._out.notify_writable = None
        self._descriptor.take_over(self)
        show_fin(self._end, self._descriptor)
        self._end.close()
        self._signals.close()


# -- fork(): links between threads go on over TCP --------------------------------

# Every friend socket (duplicates too): a fork hands their links over.
_friend_sockets: "weakref.WeakSet[FriendBlockingSocket]" = weakref.WeakSet()
# Ends whose socket's connect() or accept() is finishing (waiting for the
# claim, say): a fork, or a client's hand-over (pyOpenSSL's, detach()),
# hands their links over too, and the connect or accept returns TCP.
_connecting: "weakref.WeakValueDictionary[LinkEnd, FriendCapableSocket]" = weakref.WeakValueDictionary()
# What a direction may hold to be handed over: the real connection carried
# nothing yet, so its receive buffer takes this much at once.
_HAND_OVER_LIMIT = 64 * 1024
_HAND_OVER_WAIT = 5.0


def _send_on_tcp(sock: socket.socket, data: bytes, eof: bool) -> None:
    """What an end had queued, then its EOF, onto its real socket (under
    the link's locks: waits for room only within _HAND_OVER_WAIT)."""
    view = memoryview(data)
    deadline = time.monotonic() + _HAND_OVER_WAIT
    poller = None
    while view:
        try:
            view = view[_ss.send(sock, view, _DONTWAIT):]
        except BlockingIOError:
            left = deadline - time.monotonic()
            if left <= 0:
                raise
            if poller is None:  # poll, not select: any descriptor number
                poller = select.poll()
                poller.register(_ss.fileno(sock), select.POLLOUT)
            poller.poll(int(left * 1000) + 1)
    if eof:
        _ss.shutdown(sock, socket.SHUT_WR)


class HandedOverSocket(FriendCapableSocket):
    """A friend socket whose link went on over TCP (a fork): the real
    socket. A call begun as a friend socket's, on another thread, finishes
    with the friend socket's helpers, which find the link handed over."""


for _name in ("_check_open", "_wait_deadline", "_drained", "_readable", "_flags_timeout",
              "_sync_writable", "_send_some", "_wait_writable", "_push_whole", "_send_all",
              "_shutdown_end", "_shutdown_on_tcp", "_show_fin", "_close_friend", "_watched"):
    setattr(HandedOverSocket, _name, getattr(FriendBlockingSocket, _name))


def _now_tcp(sock: FriendBlockingSocket) -> None:
    """``sock``'s link went on over TCP: from now on it is its real socket.
    One somebody polls keeps its ``fileno()``: that number becomes its
    connection's descriptor."""
    sock.__class__ = HandedOverSocket
    signals = sock._signals
    ready, signals.ready = signals.ready, None
    if ready is not None:
        timeout = sock.gettimeout()
        number = ready.become(_ss.fileno(sock))
        real = _ss.detach(sock)
        _ss.__init__(sock, sock.family, sock.type, sock.proto, number)
        os.close(real)
        _ss.settimeout(sock, timeout)
    signals.close()
    if sock._read_shut:
        try:
            _ss.shutdown(sock, socket.SHUT_RD)
        except OSError:
            pass
    sock._descriptor.close_kept()


def _ends_of_sockets() -> Dict[LinkEnd, List[FriendBlockingSocket]]:
    """Each link end of a blocking socket, with its open friend sockets (none
    yet: a connect finishing, which has written nothing). Under _ends_lock."""
    ends: Dict[LinkEnd, List[FriendBlockingSocket]] = {}
    for sock in list(_friend_sockets):
        if type(sock) is FriendBlockingSocket and not sock._friend_closed:
            ends.setdefault(sock._end, []).append(sock)
    for end in list(_connecting.keys()):
        ends.setdefault(end, [])
    return ends


def _hand_over(link: Link, ends: Dict[LinkEnd, List[FriendBlockingSocket]],
               unaccepted: bool = False) -> bool:
    """Hand ``link`` over to TCP (:meth:`Link.hand_over`) if its ends are
    blocking sockets' (``ends``; its server end not accepted yet, with
    ``unaccepted``), one of them closed already or not, and their sockets
    become their real ones. Under _ends_lock. False: a friend link it
    stays."""
    if link.client is None or link.server is None:  # done: both ends closed
        return False
    sockets = {link.client: ends.get(link.client),
               link.server: [] if unaccepted else ends.get(link.server)}
    closed: Dict[LinkEnd, socket.socket] = {}  # ends closed already: the socket each left
    for end, kept in zip((link.server, link.client), _sockets_closes_left(link)):
        if sockets[end] is None and end.closed and kept is not None:
            sockets[end], closed[end] = [], kept
    # Open ends of another adapter that go on over their real socket (a
    # trio socket's): the socket, and the switch to it.
    others: Dict[LinkEnd, Tuple[Any, Callable[[], None]]] = {}
    for end in (link.server, link.client):
        if sockets[end] is None and not end.closed and end.over_tcp is not None:
            other = end.over_tcp()
            if other is not None:
                sockets[end], others[end] = [], other
    if any(same is None or len(same) > 1 and same[0]._signals.ready is not None
           for same in sockets.values()):
        return False  # an end elsewhere, or one readiness descriptor for duplicates

    def send(end: LinkEnd, data: bytes, eof: bool) -> None:
        same = sockets[end]
        if same:
            _send_on_tcp(same[0], data, eof)
        elif end in closed:  # what it wrote, its EOF, then the close it made
            _send_on_tcp(closed[end], data, eof)
            closed[end].close()
        elif end in others:  # under the link's locks: no write of its overtakes these
            real, switch = others[end]
            _send_on_tcp(real, data, eof)
            switch()

    if not link.hand_over(send, _HAND_OVER_LIMIT, first=next(iter(others), None)):
        return False
    for same in sockets.values():
        for sock in same:  # type: ignore[union-attr]
            _now_tcp(sock)
    return True


def _sockets_closes_left(link: Link) -> Tuple[Optional[socket.socket], Optional[socket.socket]]:
    """The real sockets (server's, client's) that the closes of a link's
    blocking sockets left to it; None for an end still open, or one not a
    blocking socket of this process."""
    release = link.on_done
    pair = release.accepted_and_connected() if isinstance(release, SocketRelease) else None
    if pair is None:
        return None, None
    server, client = (descriptor.kept() if isinstance(descriptor, Descriptor) else None
                      for descriptor in pair)
    return server, client


def _hand_over_socket(sock: FriendBlockingSocket) -> bool:
    """``sock``'s link goes on over TCP, as at a fork, if its friend is a
    blocking socket, or a connect its listener has not accepted yet
    (withdrawn: the accept finds a plain connection, with what was sent).
    Under _ends_lock. False: it stays a friend link."""
    link = sock._end.link
    ends = _ends_of_sockets()
    if _hand_over(link, ends):
        return True
    if sock._end is not link.client or not link.can_hand_over(_HAND_OVER_LIMIT) or \
            not registry.withdraw_unclaimed(flow_key(sock._sockname, sock._peername), link):
        return False
    if _hand_over(link, ends, unaccepted=True):
        return True
    # More was written meanwhile than the connection takes at once: it
    # is lost, as a connection the kernel had to drop.
    link.server.reset()
    return False


def _hand_over_unclaimed(sock: FriendBlockingSocket) -> bool:
    """``sock``'s connect, not accepted yet, by a listener whose accept is
    not known to be friendsock's (a blocking listener that has not
    accepted yet), goes on over TCP (withdrawn: the accept finds a plain
    connection, with what was sent). Under _ends_lock. False: it stays a
    friend link (claimed already, a proven listener, or more written than
    the connection takes at once)."""
    link = sock._end.link
    if sock._end is not link.client or not link.can_hand_over(_HAND_OVER_LIMIT) or \
            not registry.withdraw_unclaimed(flow_key(sock._sockname, sock._peername), link,
                                            unless_proven=True):
        return False
    if _hand_over(link, _ends_of_sockets(), unaccepted=True):
        return True
    link.server.reset()  # written meanwhile past what it takes: lost, as a dropped connection
    return False


def go_on_over_tcp(sock: FriendBlockingSocket, what: str) -> None:
    """``sock``'s connection goes on over TCP now: ``what`` is to do its own
    I/O on the descriptor (C code: pyOpenSSL's ``SSL.Connection``, or
    ``detach()``). OSError (EOPNOTSUPP) when the link cannot be handed over
    (its friend is an asyncio transport, say): better than I/O that waits
    forever."""
    with _ends_lock:
        if type(sock) is not FriendBlockingSocket or sock._friend_closed:
            return  # handed over already (a fork), or closed: the descriptor's own
        if not _hand_over_socket(sock):
            raise _unsupported(what)


def as_plain_socket(sock: socket.socket, what: str) -> None:
    """For ``what``, code that takes the exact class ``socket.socket`` only
    and does its own I/O on the descriptor (trio's ``from_stdlib_socket``):
    a friend socket's connection goes on over TCP (or OSError EOPNOTSUPP,
    see :func:`go_on_over_tcp`), and the socket is of that class again."""
    if type(sock) is FriendBlockingSocket:
        go_on_over_tcp(sock, what)
    if type(sock) is HandedOverSocket:
        sock.__class__ = FriendCapableSocket


def _hand_over_before_fork() -> None:
    """Before ``fork()``: each link whose two ends are blocking sockets of
    this process (or one a trio socket, which becomes trio's own socket:
    ``LinkEnd.over_tcp``) goes on over TCP, as the kernel's connection it
    rides on, so the child may use either end as its own (a forking
    server's accepted connection) and the parent the other. A link with an
    end on an asyncio or uvloop loop, more than _HAND_OVER_LIMIT bytes
    queued one way, bytes queued behind a FIN its writer's socket already
    sent (a descriptor polled, see ``LinkEnd.fin_to_show``), or duplicates
    (dup()) of a socket somebody polls (their one readiness descriptor
    cannot be each one's connection) stays a friend link: the parent's; in
    the child its ends fail (:func:`_cut_off_in_child`). _ends_lock is held
    through the fork: no socket turns friend, nor gets a readiness
    descriptor, between the hand-over and the fork."""
    global _held_for_fork
    _ends_lock.acquire()
    try:
        ends = _ends_of_sockets()
        for link in {end.link: None for end in ends}:  # each once, in order
            _hand_over(link, ends)
    except BaseException:
        _ends_lock.release()
        raise
    _held_for_fork = True


_held_for_fork = False  # by _hand_over_before_fork (a failed one printed its error and let go)


def _forked_parent() -> None:
    global _held_for_fork
    if _held_for_fork:
        _held_for_fork = False
        _ends_lock.release()


def _cut_off_in_child() -> None:
    """In a forked child: the friend sockets still on a link (not handed
    over) have their friend in the parent. Their reads and writes fail
    (ECONNRESET) rather than wait for bytes that cannot come; their
    sleepers' wake-ups are the parent's, not theirs."""
    global _ends_lock, _held_for_fork
    _ends_lock = threading.Lock()  # the parent's, held through the fork
    _held_for_fork = False
    for sock in list(_friend_sockets):
        if type(sock) is FriendBlockingSocket:
            sock._end.link.forked_away()
            signals = sock._signals
            signals.readers, signals.writers, signals.ready = [], [], None
    _connecting.clear()


on_fork(Part.BLOCKING, before=_hand_over_before_fork, after_in_parent=_forked_parent,
        after_in_child=_cut_off_in_child)


def patchable_class() -> Callable[..., socket.socket]:
    """The class ``socket.socket`` becomes while patched."""
    return FriendCapableSocket
