"""``friendsock.patch_socket()``: blocking sockets of this process pair.

Process-wide, in the manner of gevent's ``monkey.patch_socket()``: the
``socket`` module's ``socket`` class is replaced by a subclass of itself
(:class:`~friendsock._blocking._capable.FriendCapableSocket`).
``socket.create_connection``, ``socket.create_server``, ``socket.socketpair``
and the stdlib's own ``accept()`` look the class up in the module when
called, so they (and what is built on them: ``http.client``, ``urllib``,
urllib3/requests, ``socketserver``, ``http.server``) make friend-capable
sockets without being patched themselves. ``ssl.SSLContext.wrap_socket``
is patched too: a friend socket's TLS runs over its link
(:mod:`friendsock._blocking._tls`); pyOpenSSL's ``SSL.Connection``, which
does its I/O on the descriptor, gets a friend socket's connection moved
to TCP first.
"""

from __future__ import annotations

import _socket
import socket
import threading
from types import ModuleType
from typing import Any, Optional

from .._asyncio._install import every_loop_installed
from .._asyncio._native import routes_through_friendsock
from .._imports import when_imported
from . import _at_fork  # noqa: F401 (a fork moves links between blocking sockets to TCP)
from . import _capable
from ._across import AcrossSocket, is_moved
from ._capable import FriendCapableSocket, natively_driven, steps
from ._connect import connect_friend
from ._descriptor import OriginalSocket
from ._listen import accepting, claim, start_pairing, stop_pairing
from ._paired import FriendBlockingSocket, as_plain_socket, go_on_over_tcp
from ._tls import FriendSSLSocket, patch_ssl, unpatch_ssl

_lock = threading.Lock()

# The patched class pairs through these (they come after it: see PairingSteps).
steps.connect = connect_friend
steps.register_listener = start_pairing
steps.forget_listener = stop_pairing
steps.accepting = accepting
steps.claim = claim
steps.loop_pairs = routes_through_friendsock
steps.every_loop_pairs = every_loop_installed

_saved: Optional[Any] = None  # what socket.socket was before patch_socket()


def _refuse_friend_socket(sock: FriendBlockingSocket) -> Any:
    raise TypeError(f"cannot pass {sock!r} to another process: a friend socket's bytes "
                    f"do not go through its descriptor")


def _teach_multiprocessing(reduction: ModuleType) -> None:
    """multiprocessing hands sockets to its child processes by descriptor
    (uvicorn's --workers and --reload do), with a reducer registered for
    the exact class ``socket.socket`` was when it was imported: the
    stdlib's and the patched class both get it; a socket moved to another
    process of this host goes with its TCP socket; a paired one, whose
    descriptor is not the connection, a clear error."""
    reduce_socket = getattr(reduction, "_reduce_socket", None)
    if reduce_socket is None:  # pragma: no cover - not on this platform
        return
    reduction.register(OriginalSocket, reduce_socket)
    reduction.register(FriendCapableSocket, reduce_socket)
    reduction.register(FriendBlockingSocket, _refuse_friend_socket)
    reduction.register(AcrossSocket, lambda sock: sock.handed_on(reduction.DupFd))


def _teach_pyopenssl(module: ModuleType) -> None:
    """pyOpenSSL's ``SSL.Connection`` does its I/O on the socket's
    descriptor, in C: given a friend socket, its connection first goes on
    over TCP (or the constructor fails clearly, when it cannot)."""
    connection = getattr(module, "Connection", None)
    if connection is None or getattr(connection.__init__, "_friendsock_native", None) is not None:
        return
    native = connection.__init__

    def __init__(self: Any, context: Any, socket: Any = None) -> None:
        if type(socket) is FriendBlockingSocket:
            go_on_over_tcp(socket, "pyOpenSSL's SSL.Connection (its I/O is on the descriptor)")
        native(self, context, socket)

    __init__._friendsock_native = native  # type: ignore[attr-defined]
    connection.__init__ = __init__


def _teach_trio(module: ModuleType) -> None:
    """trio's socket objects do their I/O with the C socket calls on the
    stdlib socket they hold, never through its methods: those sockets are
    left to trio (to friendsock's trio adapter, where installed), a
    friend socket handed to trio first goes on over TCP (or fails clearly,
    when it cannot), and one moved to another process goes on there as a
    moved trio socket."""
    klass = getattr(module, "_SocketType", None)
    native = getattr(klass, "__init__", None)
    if native is None or getattr(native, "_friendsock_native", None) is not None:
        return

    def __init__(self: Any, sock: Any) -> None:
        if is_moved(sock):  # (trio's own init takes the exact class socket.socket only)
            from .._trio._across import wrap_moved  # (trio is imported: this is its socket)

            wrap_moved(self, sock)
            return
        as_plain_socket(sock, "a trio socket (its I/O is on the descriptor)")
        natively_driven.add(sock)
        native(self, sock)

    __init__._friendsock_native = native  # type: ignore[attr-defined]
    setattr(klass, "__init__", __init__)


def _teach_unix_loops(module: ModuleType) -> None:
    """asyncio's Unix loops send a file (``loop.sock_sendfile``, and
    ``loop.sendfile`` on their own transports) with ``os.sendfile()`` on
    the socket's descriptor, which for a paired socket is not its
    connection: for a paired socket they go where ``os.sendfile()``
    cannot serve, to their fallback through ``send()``."""
    loop_class = getattr(module, "_UnixSelectorEventLoop", None)
    native = getattr(loop_class, "_sock_sendfile_native", None)
    if native is None or getattr(native, "_friendsock_native", None) is not None:
        return

    async def _sock_sendfile_native(self: Any, sock: Any, file: Any, offset: int,
                                    count: Optional[int]) -> int:
        if type(sock) is FriendBlockingSocket:
            raise module.exceptions.SendfileNotAvailableError(
                "os.sendfile() does not reach a friend socket's connection")
        return await native(self, sock, file, offset, count)

    _sock_sendfile_native._friendsock_native = native  # type: ignore[attr-defined]
    loop_class._sock_sendfile_native = _sock_sendfile_native  # type: ignore[union-attr]


def patch_socket() -> None:
    """From now on, ``socket.socket`` (and so ``socket.create_connection``
    and ``socket.create_server``) of this process makes friend-capable
    sockets: a blocking or timeout socket that connects to a friendsock
    listener of this process pairs (an asyncio, uvloop or trio server on
    another thread, or a blocking server socket made while patched);
    anything else is the real socket, unchanged. Idempotent."""
    global _saved
    with _lock:
        if _capable.patched:
            return
        _saved = socket.socket
        socket.socket = FriendCapableSocket  # type: ignore[misc]
        patch_ssl()
        _capable.patched = True
    # Kept after unpatch_socket(): the sockets made meanwhile stay this class.
    when_imported("multiprocessing.reduction", _teach_multiprocessing)
    when_imported("OpenSSL.SSL", _teach_pyopenssl)
    when_imported("asyncio.unix_events", _teach_unix_loops)
    when_imported("trio._socket", _teach_trio)


def unpatch_socket() -> None:
    """Undo :func:`patch_socket`: ``socket.socket`` is the class it was.
    Sockets made meanwhile connect and listen natively from now on;
    listeners registered meanwhile pair until they close, and friend
    sockets stay friends until closed (TLS on one is for before this:
    ``wrap_socket`` is the stdlib's again)."""
    global _saved
    with _lock:
        if not _capable.patched:
            return
        _capable.patched = False
        unpatch_ssl()
        if socket.socket is FriendCapableSocket:  # not replaced since by someone else
            socket.socket = _saved  # type: ignore[misc,assignment]
        _saved = None


def patch_again_if_put_back() -> None:
    """While patched, ``socket.socket`` put back to the stdlib's class by
    someone else (pytest-socket restores the class it saved after every
    test) is patched again; not where they left a guard of their own on
    the class's ``connect``."""
    with _lock:
        if _capable.patched and socket.socket is _saved and \
                OriginalSocket.connect is _socket.socket.connect:
            socket.socket = FriendCapableSocket  # type: ignore[misc]


def is_socket_patched() -> bool:
    """Whether :func:`patch_socket` is in force."""
    return _capable.patched


def is_friend_socket(obj: Any) -> bool:
    """Whether ``obj`` is a blocking socket that paired (and is not closed),
    or a TLS socket over one, or one whose connection moved to another
    process of this host."""
    if type(obj) is FriendSSLSocket:
        if obj._closed:
            return False
        obj = obj._raw
    return (type(obj) is FriendBlockingSocket and not obj._friend_closed) or is_moved(obj)
