"""Which process owns the real sockets under a link, and letting them go
when both ends are done (:class:`SocketRelease`, a link's ``on_done``)."""

from __future__ import annotations

import _socket
import os
import socket
import struct
from typing import Any, List, Optional, Protocol, Tuple

from .._core._fork import Part, on_fork
from .._core._link import LinkEnd
from .._friend_socket import STDLIB_SOCKET


_LINGER_ABORT = struct.pack("ii", 1, 0)


class _Process:
    """This process's id, kept current across fork() without a getpid()
    syscall per connection."""

    pid = os.getpid()

    @classmethod
    def _forked(cls) -> None:
        cls.pid = os.getpid()


on_fork(Part.PROCESS, after_in_child=_Process._forked)


def current_pid() -> int:
    return _Process.pid


def close_with_reset(sock: socket.socket) -> None:
    """Close ``sock`` with a reset (SO_LINGER 0), as ``abort()`` on TCP does."""
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, _LINGER_ABORT)
    except OSError:  # closed, or reset already
        pass
    sock.close()


def release_sockets(pid: int, *socks: socket.socket) -> None:
    """Close the real sockets of a finished link without TIME_WAIT.

    Both ends are ours and done; an abortive close (SO_LINGER 0) ends the
    connection at once, so connect/close-heavy work cannot use up ports.
    One abortive close is enough: its reset closes the other end's socket,
    whose own close then sends nothing and leaves nothing behind.
    ``pid``: the process that made the link. A forked child that somehow
    finishes an inherited link only drops its copies of the descriptors:
    SO_LINGER would act on the sockets it shares with the parent.
    """
    abort = _Process.pid == pid
    for sock in socks:
        if abort:
            try:
                sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, _LINGER_ABORT)
                abort = False
            except OSError:  # closed, or reset already: the next one
                pass
        sock.close()


def _detached(sock: socket.socket) -> socket.socket:
    """A socket object of its own with ``sock``'s descriptor, which
    ``sock`` gives up (the C call: a patched class's detach() would do more).
    Of the stdlib's class: a later link over the connection may hand it to
    its user (a trio socket's, as anyio's raw socket)."""
    fd = _socket.socket.detach(sock)
    if fd < 0:
        return sock
    # (The C type's plain ints: the stdlib's properties make enums of them.)
    return STDLIB_SOCKET(_RAW_FAMILY(sock), _RAW_TYPE(sock), sock.proto, fd)


_RAW_FAMILY, _RAW_TYPE = _socket.socket.family.__get__, _socket.socket.type.__get__


class Keeper(Protocol):
    """What keeps a finished link's connection for reuse (a listener:
    ``_listener.ListenerHandle``)."""

    def keep(self, server_sock: socket.socket, client_sock: socket.socket,
             names: Tuple[Any, Any], sizes: Tuple[int, int, int, int]) -> bool: ...


class SocketRelease:
    """A link's ``on_done``: :func:`release_sockets` of its real sockets, the
    accepted one first when there is one (slots, not a closure per link:
    idle links stay small); or, for a connection neither of whose sockets
    was handed out (see :meth:`exposed`), kept by its listener for a later
    connect (:meth:`ListenerHandle.keep`)."""

    __slots__ = ("pid", "first", "second", "keeper", "client", "restores")

    def __init__(self, pid: int, first: socket.socket,
                 second: Optional[socket.socket] = None,
                 keeper: Optional["Keeper"] = None, client: Optional[LinkEnd] = None) -> None:
        self.pid = pid
        self.first = first
        self.second = second
        # The listener that keeps the connection once the link is done, and
        # the link's client end (its addresses, and its channels' sizes, are
        # the sockets'): set only while neither socket was handed out
        # (see exposed()).
        self.keeper = keeper
        self.client = client
        # Options its user changed on either socket, and their values
        # before: given back as the connection is kept (see exposed()).
        self.restores: Optional[List[Tuple[socket.socket, int, int, int]]] = None

    def exposed(self) -> None:
        """A socket of the link was handed to its user in a way that may
        outlast it (its descriptor seen, to poll or pass on; an option set
        that cannot be given back): the connection ends with the link,
        never to be reused. Reading its addresses and options, and setting
        options that can be given back, are not that."""
        self.client = None

    def restore_before_keeping(self, sock: socket.socket, level: int, option: int, value: int) -> None:
        """``option`` of ``sock`` was ``value`` before its user changed it."""
        restores = self.restores
        if restores is None:
            restores = self.restores = []
        if not any(kept[:3] == (sock, level, option) for kept in restores):
            restores.append((sock, level, option, value))

    def _restored(self) -> bool:
        """The options changed on the sockets given back their values;
        False if one cannot be (the connection then ends)."""
        restores, self.restores = self.restores, None
        try:
            for sock, level, option, value in restores or ():
                sock.setsockopt(level, option, value)
        except OSError:
            return False
        return True

    def accepted_and_connected(self) -> Optional[Tuple[socket.socket, socket.socket]]:
        """(server's, client's) real socket of a link whose both ends are
        this process's sockets (as :func:`adopt_accepted` gives them)."""
        if self.second is None:
            return None
        return self.first, self.second

    def keep(self, sock: socket.socket) -> socket.socket:
        """Its user closes ``sock``, one of these, while the link still
        needs its connection: the descriptor moves to a socket object of the
        link's own, and the user's shows it closed (``fileno()`` -1), as
        after a close over TCP. The socket object the descriptor is in now."""
        if sock is self.first:
            kept = self.first = _detached(sock)
        elif sock is self.second:
            kept = self.second = _detached(sock)
        else:
            return sock
        if self.restores:  # (options to give back: on the socket object kept)
            self.restores = [(kept if each[0] is sock else each[0],) + each[1:] for each in self.restores]
        return kept

    def __call__(self) -> None:
        keeper, client = self.keeper, self.client
        if keeper is not None and client is not None and self.second is not None and \
                self.pid == _Process.pid and self._restored():
            to_server, to_client = client.outgoing, client.incoming
            sizes = (to_server.sndbuf, to_client.rcvbuf, to_client.sndbuf, to_server.rcvbuf)
            if keeper.keep(self.first, self.second, client.link.addresses, sizes):  # type: ignore[arg-type]
                return
        if self.second is None:
            release_sockets(self.pid, self.first)
        else:
            release_sockets(self.pid, self.first, self.second)
