"""The errors a friend socket's calls raise where the kernel or the socket
module refuses the call, each made in one place: the errno Linux's socket
calls give, with its text (``os.strerror``), and the checks of the
arguments the socket module makes first, for blocking sockets, trio
sockets and socketless ends alike."""

from __future__ import annotations

import errno
import operator
import os
import socket
from typing import Any

_C_INT_MAX = 2 ** 31 - 1
_C_INT_MIN = -2 ** 31


def _error(number: int) -> OSError:
    return OSError(number, os.strerror(number))


def bad_descriptor() -> OSError:
    """A call on a closed socket (EBADF)."""
    return _error(errno.EBADF)


def invalid_argument() -> OSError:
    """A call a connected stream socket refuses: ``listen()``, ``accept()``,
    ``bind()``, a bad ``shutdown()`` (EINVAL)."""
    return _error(errno.EINVAL)


def already_connected() -> OSError:
    """``connect()`` of a connected socket (EISCONN)."""
    return _error(errno.EISCONN)


def would_block() -> BlockingIOError:
    """A non-blocking call that would wait (EAGAIN)."""
    return BlockingIOError(errno.EAGAIN, os.strerror(errno.EAGAIN))


def not_through_descriptor(what: str) -> OSError:
    """``what`` needs the connection's bytes to go through the socket's
    descriptor, which a friend link's do not (EOPNOTSUPP)."""
    return OSError(errno.EOPNOTSUPP, f"{what} is not supported on a friend socket: its bytes "
                                     f"do not go through its descriptor")


def check_flags(flags: int, supported: int) -> None:
    """A call's ``flags`` beyond ``supported`` are refused: those need the
    bytes to go through the descriptor (EOPNOTSUPP)."""
    if flags & ~supported:
        raise not_through_descriptor(f"flags={flags!r}")


def recv_into_view(buffer: Any, nbytes: Any) -> memoryview:
    """The bytes of ``buffer`` a ``recv_into(buffer, nbytes)`` fills (all of
    it for ``nbytes`` 0), checked as the socket module checks them."""
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
    return view


def check_how(how: Any) -> None:
    """``shutdown(how)``'s argument checked as the real call checks it."""
    how = operator.index(how)  # (TypeError for what is no int)
    if not _C_INT_MIN <= how <= _C_INT_MAX:  # as the C call converts it
        raise OverflowError("Python int too large to convert to C int")
    if how not in (socket.SHUT_RD, socket.SHUT_WR, socket.SHUT_RDWR):
        raise invalid_argument()


def no_urgent_data() -> OSError:
    """What ``recv(MSG_OOB)`` gets on a paired socket: TCP's answer when no
    urgent byte waits, and none ever does on a link (a friend's send with
    MSG_OOB is refused)."""
    return invalid_argument()
