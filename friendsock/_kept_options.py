"""Options of a friend end's socket whose TCP connection its listener may
keep for a later link (see ``ListenerHandle.keep``): the options that can
be given back as a new connection has them before it is kept, and the
check that a socket about to connect over a kept connection has set
nothing else.
"""

from __future__ import annotations

import _socket
import socket
import struct
from typing import Any, Dict, Tuple

LINGER = struct.Struct("ii")  # struct linger, as SO_LINGER takes and gives it

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


def set_restorably(release: Any, sock: socket.socket, args: "tuple[Any, ...]") -> bool:
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
        (socket.SOL_SOCKET, "SO_LINGER", LINGER.size), (socket.SOL_SOCKET, "SO_REUSEADDR", 0),
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
            set_restorably(release, kept, (level, option, set_to))


def restore_options_set_before_connect(sock: socket.socket, release: Any) -> None:
    """The options of :data:`_RESTORABLE` its user set on ``sock`` before
    it connected (its connection one to keep): given back their values of
    a new socket's before it is kept."""
    for level, option, value in _new_socket_values(sock.family)[1]:
        if _socket.socket.getsockopt(sock, level, option) != value:
            release.restore_before_keeping(sock, level, option, value)
