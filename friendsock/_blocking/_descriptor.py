"""The real socket under a blocking friend socket: the C socket calls below
every Python override (``_ss``), the stdlib's socket class as it was
before any patching, and the :class:`Descriptor` through which the
pairing steps and the link reach a friend socket's TCP descriptor."""

from __future__ import annotations

import _socket
import socket
import weakref
from typing import Any, Optional

from .._friend_socket import STDLIB_SOCKET
from .._socket_errors import bad_descriptor

_ss = _socket.socket  # the C methods, below every Python override
OriginalSocket: "type[socket.socket]" = STDLIB_SOCKET  # the stdlib class, as it was at import


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
            raise bad_descriptor()
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

