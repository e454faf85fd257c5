"""What a TCP socket's kernel state says: whether payload crossed it
(``TCP_INFO``), whether the other end finished, whether it listens, and
whether it is a plain TCP socket at all."""

from __future__ import annotations

import _socket
import socket
import struct
from typing import Any



# struct tcp_info's tcpi_notsent_bytes (then tcpi_min_rtt), and
# tcpi_data_segs_in and tcpi_data_segs_out (Linux 4.6+): segments that
# carried payload.
_NOTSENT = struct.Struct("I")
_NOTSENT_OFFSET = 144
_DATA_SEGS = struct.Struct("II")
_DATA_SEGS_OFFSET = 152
_TCP_INFO_NEEDED = _DATA_SEGS_OFFSET + _DATA_SEGS.size


def payload_moved(sock: socket.socket) -> bool:
    """Whether payload crossed ``sock``'s connection, either way, or waits
    to: such a connection stays TCP, or bytes would be lost or reordered.
    A socket that cannot tell (closed, reset, an old kernel) counts as used."""
    try:
        info = sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_INFO, _TCP_INFO_NEEDED)
    except OSError:
        return True
    if len(info) < _TCP_INFO_NEEDED:
        return True
    segs_in, segs_out = _DATA_SEGS.unpack_from(info, _DATA_SEGS_OFFSET)
    return bool(segs_in or segs_out or _NOTSENT.unpack_from(info, _NOTSENT_OFFSET)[0])


_TCP_ESTABLISHED = 1  # (tcpi_state, struct tcp_info's first byte)


def other_end_finished(sock: socket.socket) -> bool:
    """Whether ``sock``'s connection is past established: the other end's
    FIN or reset came. (Its socket polls readable then, but also once its
    own user shut its reading.) A closed socket counts as finished."""
    try:
        return sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_INFO, 1)[0] != _TCP_ESTABLISHED
    except OSError:
        return True


def is_listening(sock: socket.socket) -> bool:
    """Whether the kernel has ``sock`` listening (``SO_ACCEPTCONN``); False
    for a closed one. The C socket's own call: a subclass's or a test's
    mock of ``getsockopt`` is not asked."""
    try:
        return bool(_socket.socket.getsockopt(sock, socket.SOL_SOCKET, socket.SO_ACCEPTCONN))
    except OSError:
        return False


# The C socket's own family and type, as ints: the socket module's
# properties make enums of them (some 0.6 µs each), a cost every connect
# to a peer without friendsock would pay.
_family = _socket.socket.family.__get__
_type = _socket.socket.type.__get__
_INET = (socket.AF_INET, socket.AF_INET6)


def family_of(sock: socket.socket) -> int:
    """``sock.family`` (a socket of the stdlib's class or a subclass), as
    an int."""
    return _family(sock)


def is_tcp_socket(sock: Any) -> bool:
    """An IPv4 or IPv6 stream socket: what pairs, or counts as real TCP
    when it does not (a Unix socket's connection is neither)."""
    if isinstance(sock, _socket.socket):
        return _family(sock) in _INET and _type(sock) == socket.SOCK_STREAM
    try:
        return sock.family in _INET and sock.type == socket.SOCK_STREAM
    except AttributeError:  # not a socket: the loop's own call says so
        return False


# The modules of the socket classes whose I/O a friend end may take over:
# the stdlib's, and the ones patch_socket() puts in its place (the class
# itself, and what a socket of it becomes as it pairs and goes back to TCP).
_PLAIN_SOCKET_MODULES = frozenset({"socket", "friendsock._blocking._capable",
                                   "friendsock._blocking._paired"})


def is_plain_socket(sock: socket.socket) -> bool:
    """Not a socket of a subclass of its user's, whose own methods (which
    may count, log or change what goes through) must go on doing its I/O."""
    return type(sock).__module__ in _PLAIN_SOCKET_MODULES
