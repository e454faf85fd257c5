"""The class ``socket.socket`` is while :func:`patch_socket` is in force.

:class:`FriendCapableSocket` is what ``socket.socket`` (and so
``socket.create_connection``, ``socket.create_server``, ``socketserver``,
``http.client``, urllib3 ...) makes while patched. It is the real socket,
unchanged, except at three moments:

- ``connect()`` of a TCP socket to a friendsock listener of this process
  registers the connect first, as every friendsock client does, and pairs
  (``_connect``); a non-blocking one answers ``EINPROGRESS`` as TCP's
  does, and its ``fileno()`` shows the link from then on;
- ``listen()`` of a TCP socket registers it as a friendsock listener
  (until it is closed, duplicated or detached, or passed on to an event
  loop, which calls ``setblocking(False)`` on it), and so does making one
  of a listening descriptor; its ``accept()`` claims friend clients
  (``_listen``);
- a socket that paired becomes a ``FriendBlockingSocket`` (``_paired``: the
  same object, still a ``socket.socket``) whose data calls go through the
  link.

This module owns the class, what keeps ``isinstance(x, socket.socket)``
true while patched, and how a test's mock or guard on the class is seen.
The pairing steps are the modules above it: :data:`steps` is how the class
reaches them.
"""

from __future__ import annotations

import _socket
import errno
import operator
import os
import socket
import sys
import weakref
from typing import Any, Callable, Dict, Optional, Set, Tuple

from .. import _handshake
from .._core._switch import is_enabled
from .._handshake import Entry, is_listening, is_tcp_socket, make_room
from .._host._ports import PUBLISHED
from .._socket_errors import not_through_descriptor
from ._descriptor import OriginalSocket, _ss
from ._readiness import readiness_owners

_ENTRY = "_friendsock_listener"  # where a registered listener keeps its registry entry
_NATIVE = "_friendsock_connected_natively"  # set by a connect friendsock left to the kernel
# Set on a socket paired or moved by a non-blocking connect, until a
# connect() call has been answered that it is done.
CONNECT_UNREPORTED = "_friendsock_connect_unreported"

# Whether connect() and listen() pair: set by patch_socket(). Sockets made
# while patched stay FriendCapableSockets after unpatch_socket(), plain again.
patched = False


def connect_again(sock: "FriendCapableSocket") -> int:
    """What a connect of ``sock``, connected by friendsock, answers (as
    ``connect_ex()``): done (0), once, after a non-blocking connect, as
    the kernel's does; after that, already connected."""
    return 0 if sock.__dict__.pop(CONNECT_UNREPORTED, False) else errno.EISCONN


class PairingSteps:
    """What the patched class does at its moments of pairing. Set by
    ``_patch`` from the connecting and listening modules, which sit above
    this one: they make paired sockets, whose class is a subclass of this
    module's."""

    #: Pair a connect to ``address`` (True: connected; False: connect
    #: natively; a non-blocking socket's: BlockingIOError, EINPROGRESS).
    connect: Callable[["FriendCapableSocket", Any], bool]
    #: The socket listens: its accept() pairs from now on (``shared=True``:
    #: with connects this process claims, as other processes may accept).
    register_listener: Callable[..., None]
    #: The socket stops pairing: closed, or ``passed_on`` to code that accepts natively.
    forget_listener: Callable[..., None]
    #: The listening socket's own accept() runs.
    accepting: Callable[["FriendCapableSocket"], None]
    #: Pair the socket the listener accepted (from ``address``, by its
    #: ``entry`` if registered) if a friendsock client made it, of this
    #: process or another.
    claim: Callable[["FriendCapableSocket", "FriendCapableSocket", Any, Optional[Entry]], None]
    #: Whether an asyncio loop routes through friendsock (is installed).
    loop_pairs: Callable[[Any], bool]
    #: Whether every asyncio loop the process can make does.
    every_loop_pairs: Callable[[], bool]


steps = PairingSteps()


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
        if fileno is not None and moved_pair_ends:
            moved = _moved_of(fileno)
            if moved is not None:
                moved.share_with(self, fileno)
                return
        OriginalSocket.__init__(self, family, type, proto, fileno)
        if fileno is not None and patched and _may_pair(self) and is_listening(self):
            # A listener handed over (systemd's socket activation, a process
            # manager's, socket.fromfd()): it pairs as one made here, with
            # what this process claims (its siblings may accept too).
            steps.register_listener(self, shared=True)

    def __repr__(self) -> str:
        return named_as(OriginalSocket.__repr__(self), "socket.socket")

    def fileno(self) -> int:
        # A bound method kept from before the socket paired (Twisted's
        # transports keep ``sock.fileno``, taken before their connect)
        # answers as the socket is now: a friend socket's readiness.
        cls = type(self)
        if cls is FriendCapableSocket or not cls.__dict__.get("_forwards_fileno"):
            return _ss.fileno(self)  # (a user's subclass may call this one)
        return cls.fileno(self)

    # -- connecting -------------------------------------------------------
    # A connect made natively is the socket's for good: a later connect()
    # on it (a non-blocking one's second call, which says whether it is
    # connected yet, as Twisted's reactors make it) must not pair its
    # connection, which the listener may have accepted as TCP already.
    def connect(self, address: Any) -> None:
        if not self._pairs_connect(address):
            _ss.connect(self, address)

    def connect_ex(self, address: Any) -> int:
        try:
            if self._pairs_connect(address):
                return 0
        except TimeoutError:
            return errno.EAGAIN  # as the C connect_ex reports its timeout
        except OSError as exc:
            if exc.errno is None:
                raise
            return exc.errno
        return _ss.connect_ex(self, address)

    def _pairs_connect(self, address: Any) -> bool:
        """The connect, if it may pair (True: made, paired or not); False:
        the native connect is to be made."""
        if patched and _NATIVE not in self.__dict__ and _may_pair(self):
            try:
                return steps.connect(self, address)
            finally:
                if type(self) is FriendCapableSocket:  # not paired: the kernel's from now on
                    self.__dict__[_NATIVE] = True
        self.__dict__[_NATIVE] = True
        return False

    # -- listening ----------------------------------------------------------
    def listen(self, *backlog: int) -> None:
        _ss.listen(self, *backlog)
        if patched and _ENTRY not in self.__dict__ and _may_pair(self):
            steps.register_listener(self)

    def accept(self) -> Tuple[socket.socket, Any]:
        entry: Optional[Entry] = self.__dict__.get(_ENTRY)
        if entry is not None:
            if _ss.gettimeout(self) == 0.0 and not _loop_lets_pair():
                # Accepting for a loop friendsock is not installed on (its
                # sock_accept), whose transports may read the descriptor
                # in C: passed on, as to any code that accepts natively.
                steps.forget_listener(self, passed_on=True)
            else:
                entry.proven = True  # what it accepts from now on, it claims
        if patched and type(self) is FriendCapableSocket and _may_pair(self):
            # Its own accept (a passed-on listener's too, accepting here
            # again): it may offer to clients of other processes. (Not a TLS
            # listener's: other processes pair with plain listeners only.)
            steps.accepting(self)
        fd, address = self._accept()
        entry = self.__dict__.get(_ENTRY)
        if entry is not None:
            make_room(entry)  # connects held back by a full accept queue may go on
        sock = _new_capable(self.family, self.type, self.proto, fd)
        # As the stdlib's accept(): blocking unless a default timeout is set.
        if socket.getdefaulttimeout() is None and self.gettimeout():
            sock.setblocking(True)
        if entry is not None or PUBLISHED in self.__dict__:
            steps.claim(self, sock, address, entry)
        return sock, address

    # An event loop friendsock is not installed on, taking the socket over,
    # makes it non-blocking: passed on, nobody's accept pairs any more. On
    # an installed loop's thread (its sock_accept, create_server(sock=) take
    # the registration over) or no loop's, it stays registered, as a socket
    # made non-blocking before listen() is: its first client pairs.
    def setblocking(self, flag: bool) -> None:
        _ss.setblocking(self, flag)
        if not flag and self._serves_friends() and not _loop_lets_pair():
            steps.forget_listener(self, passed_on=True)

    def settimeout(self, value: Optional[float]) -> None:
        _ss.settimeout(self, value)
        if value == 0 and self._serves_friends() and not _loop_lets_pair():
            steps.forget_listener(self, passed_on=True)

    def detach(self) -> int:
        if self._serves_friends():
            steps.forget_listener(self, passed_on=True)
        return OriginalSocket.detach(self)

    def dup(self) -> socket.socket:
        # A duplicate accepts natively, on the same queue: passed on, and
        # the duplicate is not registered as one made of a listening
        # descriptor is (socket.dup's steps, without __init__'s check).
        if self._serves_friends():
            steps.forget_listener(self, passed_on=True)
        klass = type(self)
        twin = klass.__new__(klass)
        OriginalSocket.__init__(twin, self.family, self.type, self.proto, _socket.dup(_ss.fileno(self)))
        twin.settimeout(self.gettimeout())
        return twin

    def _serves_friends(self) -> bool:
        """Registered here, or published to other processes."""
        return _ENTRY in self.__dict__ or PUBLISHED in self.__dict__

    def _real_close(self, _ss: Any = _ss) -> None:
        if self._serves_friends():
            steps.forget_listener(self)
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
    """An accepted socket, connected: a connect() on it is the kernel's."""
    sock = FriendCapableSocket.__new__(FriendCapableSocket)
    OriginalSocket.__init__(sock, family, type, proto, fd)
    sock.__dict__[_NATIVE] = True
    return sock


def _inode_of(fileno: Any) -> int:
    """The inode of the descriptor ``fileno``; -1 where it is none."""
    try:
        return os.fstat(operator.index(fileno)).st_ino
    except (OSError, TypeError, ValueError):
        return -1  # the socket constructor reports it


def _friend_of_readiness(fileno: Any) -> Optional[Any]:
    """The open friend socket whose readiness descriptor ``fileno`` is (or
    a duplicate of it is): a socket made of it is that friend socket's
    connection. None: no readiness descriptor; one of no friend socket
    (a connect's, for its claim) is refused, clearly."""
    owner = readiness_owners.get(_inode_of(fileno))
    if owner is None:
        return None
    friend = owner()
    if friend is None or friend._friend_closed:
        raise not_through_descriptor("a socket made from this descriptor")
    return friend


# The pair ends of sockets moved to another process of this host, by
# inode, each with a way to an open socket of its connection (``_across``
# keeps them): a socket made of one (``socket.fromfd(sock.fileno())``,
# ``socket.socket(fileno=...)``) is one more socket on that connection.
moved_pair_ends: Dict[int, Callable[[], Optional[Any]]] = {}


def _moved_of(fileno: Any) -> Optional[Any]:
    """The open moved socket whose pair end ``fileno`` is (or a duplicate
    of it is); None: none."""
    open_one = moved_pair_ends.get(_inode_of(fileno))
    return None if open_one is None else open_one()


# Sockets whose user does their I/O with the C socket calls (trio's socket
# objects call ``_socket.socket.recv(sock, ...)``, not ``sock.recv``): a
# friend socket's own calls would never run, so they never pair here.
natively_driven: "weakref.WeakSet[socket.socket]" = weakref.WeakSet()


# The patched class, and the TLS listener built on it (``_tls``): the
# classes whose sockets pair (a user's subclass does its own I/O).
pairing_classes: Set[type] = {FriendCapableSocket}


def _may_pair(sock: socket.socket) -> bool:
    """A TCP socket of the patched class itself, with pairing switched on.
    A subclass (one its user defined while patched) keeps its class and its
    own methods doing the I/O: it is TCP."""
    return type(sock) in pairing_classes and is_tcp_socket(sock) and is_enabled() and \
        not _replaced_io and sock not in _handshake.adoptable_connecting and \
        sock not in natively_driven and (sock.gettimeout() != 0.0 or _loop_lets_pair())


def _loop_lets_pair() -> bool:
    """A non-blocking socket pairs unless this thread runs an asyncio loop
    friendsock is not installed on: such a loop may hand the socket to a
    transport of its own that does its I/O on the descriptor, in C
    (uvloop's ``create_connection(sock=)``, its server's accept), where no
    friend socket's call runs. Installed, the loop hands it over through
    friendsock."""
    loop = running_asyncio_loop()
    return loop is None or steps.loop_pairs(loop)


def running_asyncio_loop() -> Any:
    """The asyncio loop this thread runs, if any (None without importing
    asyncio where nothing has)."""
    events = sys.modules.get("asyncio.events")
    return events._get_running_loop() if events is not None else None


def listen_unregistered(sock: socket.socket, *backlog: int) -> None:
    """``listen()`` for code that registers the listener itself (an event
    loop's or trio's server through friendsock): never the patched class's
    registration as well."""
    if isinstance(sock, _ss):
        _ss.listen(sock, *backlog)
        return
    # A wrapper that passes calls on to a socket (gunicorn's listeners,
    # handed to uvicorn's create_server): the socket under it listens, as
    # the loop's own server would have it, and still not through the class.
    real = _ss(fileno=sock.fileno())
    try:
        real.listen(*backlog)
    finally:
        real.detach()


def patchable_class() -> Callable[..., socket.socket]:
    """The class ``socket.socket`` becomes while patched."""
    return FriendCapableSocket
