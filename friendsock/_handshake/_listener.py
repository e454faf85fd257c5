"""Listeners as the registry keeps them for their clients
(:class:`ListenerHandle`): the listening socket, the buffer sizes its
accepted sockets inherit, the connections it keeps for reuse, its accept
queue's room; registering, forgetting, and those collected unclosed."""

from __future__ import annotations

import atexit
import collections
import errno
import os
import socket
import struct
import threading
import weakref
from typing import Any, Callable, Optional, Tuple

from .._core._addresses import is_unspecified
from .._core._link import Link
from .._core._registry import ListenerEntry, PendingConnect, registry
from .._friend_socket import read_buffer_sizes
from ._process import current_pid, release_sockets


_LINGER_ABORT = struct.pack("ii", 1, 0)
# struct tcp_info's tcpi_unacked and tcpi_sacked, which a listening socket
# fills with its accept queue's length and limit (min(backlog, somaxconn)).
_ACCEPT_QUEUE = struct.Struct("II")
_ACCEPT_QUEUE_OFFSET = 24
_ACCEPT_QUEUE_ANY = 1 << 30


class ListenerHandle:
    """What the registry keeps of a listener for its clients: the listening
    socket, the buffer sizes accepted sockets inherit, and the adapter's
    per-scheduler state (a client on the same scheduler shares it)."""

    __slots__ = ("sock", "kind", "accepted_sockname", "sndbuf", "rcvbuf", "state",
                 "connect_lock", "socketless_accept", "socketless_close", "kept")

    def __init__(self, listen_sock: socket.socket, state: object) -> None:
        # A weak proxy for a listener its user owns (sock_accept's): the
        # registry must not keep it open.
        self.sock = listen_sock
        # (family, type, proto) of the sockets it accepts, as plain ints.
        self.kind = (int(listen_sock.family), int(listen_sock.type), listen_sock.proto)
        # What every socket it accepts has as its own address, when it is
        # bound to one address (not 0.0.0.0 or ::): no getsockname() each.
        sockname = listen_sock.getsockname()
        self.accepted_sockname = None if is_unspecified(sockname[0]) else sockname
        self.sndbuf, self.rcvbuf = read_buffer_sizes(listen_sock)
        self.state = state
        # One connect at a time looks at the room and takes it, whatever
        # thread it runs on.
        self.connect_lock = threading.Lock()
        # Set by a listener that takes links with no accept() of the
        # kernel's (socketless ones, friendsock._socketless, and those over
        # a connection it kept, friendsock._reuse): called, on any thread,
        # with the link, the server end's socket (a stand-in, or the kept
        # one) and the client's address.
        self.socketless_accept: Optional[Callable[[Link, Any, Any], None]] = None
        # Set with it by a listener that keeps such links until accepted:
        # called once the listener pairs no more, to reset what still waits.
        self.socketless_close: Optional[Callable[[], None]] = None
        # The TCP connections of finished links kept for later connects
        # (see keep()); None until the first.
        self.kept: "Optional[collections.deque[KeptConnection]]" = None

    def keep(self, server_sock: socket.socket, client_sock: socket.socket,
             names: Tuple[Any, Any], sizes: Tuple[int, int, int, int]) -> bool:
        """Keep the established connection of a finished link between two
        ends of this process, neither of whose sockets was handed out
        (see :meth:`SocketRelease.exposed`), for a later connect to this listener of the same
        address (:meth:`take_kept`): that one needs no handshake, no new
        sockets, and no reset to close them. False, nothing kept, when this
        listener pairs no more (or no longer takes links without an accept),
        keeps enough already, or the addresses are not of its family (an
        IPv4 client of a dual-stack listener: the server's end sees mapped
        addresses). ``sizes``: the client's and the server's SO_SNDBUF and
        SO_RCVBUF, as a :class:`Link` takes them."""
        if self.socketless_accept is None or len(names[0]) != (2 if self.kind[0] == socket.AF_INET else 4):
            return False
        kept = self.kept
        if kept is None:
            kept = self.kept = collections.deque()
            _keeping.add(self)
        if len(kept) >= KEPT_PER_LISTENER:
            return False
        kept.append(KeptConnection(current_pid(), server_sock, client_sock, names, sizes))
        return True

    def take_kept(self, address: Any) -> "Optional[KeptConnection]":
        """A kept connection whose client connected to ``address`` (none in
        a forked child: the parent's, whose copies of the descriptors it
        drops)."""
        kept = self.kept
        while kept:
            connection = kept.pop()  # the newest: one connect after another takes the same
            if connection.pid != current_pid():
                release_sockets(connection.pid, connection.server_sock, connection.client_sock)
                continue
            if connection.names[1] == address:
                return connection
            kept.appendleft(connection)
            return None
        return None

    def drop_kept(self) -> None:
        """End the kept connections (the listener pairs no more)."""
        kept, self.kept = self.kept, None
        _keeping.discard(self)
        while kept:
            connection = kept.popleft()
            release_sockets(connection.pid, connection.server_sock, connection.client_sock)

    def accept_queue(self) -> Tuple[int, int]:
        """The listener's accept queue: how many connections wait in it, and
        its limit (the kernel takes limit + 1). An empty, unlimited queue
        when the socket is closed: the connect finds out."""
        try:
            info = self.sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_INFO, 32)
        except (OSError, ReferenceError):
            return 0, _ACCEPT_QUEUE_ANY
        return _ACCEPT_QUEUE.unpack_from(info, _ACCEPT_QUEUE_OFFSET)

    def is_closed(self) -> bool:
        try:
            return self.sock.fileno() < 0
        except ReferenceError:  # collected
            return True


# How many finished links' connections a listener keeps (two descriptors
# each), for connects that come one after another or a few at a time.
KEPT_PER_LISTENER = 8


class KeptConnection:
    """A finished link's TCP connection, established and idle, kept by its
    listener (:meth:`ListenerHandle.keep`)."""

    __slots__ = ("pid", "server_sock", "client_sock", "names", "sizes")

    def __init__(self, pid: int, server_sock: socket.socket, client_sock: socket.socket,
                 names: Tuple[Any, Any], sizes: Tuple[int, int, int, int]) -> None:
        self.pid = pid
        self.server_sock = server_sock
        self.client_sock = client_sock
        self.names = names  # the client's (sockname, peername)
        self.sizes = sizes  # (client SO_SNDBUF, SO_RCVBUF, server SO_SNDBUF, SO_RCVBUF)


# Listeners keeping connections: ended as the interpreter exits, so no
# socket of theirs is collected unclosed then.
_keeping: "set[ListenerHandle]" = set()


@atexit.register
def _drop_all_kept() -> None:
    for handle in list(_keeping):
        handle.drop_kept()


class ClientEnd:
    """What a pending connect keeps of its client: the real socket and its
    addresses (known before connect(), so no syscall asks for them again)."""

    __slots__ = ("sock", "sockname", "peername")

    def __init__(self, sock: socket.socket, sockname: Any, peername: Any) -> None:
        self.sock = sock
        self.sockname = sockname
        self.peername = peername


# A listener and a pending connect as both adapters register them.
Entry = ListenerEntry[ListenerHandle]
Pending = PendingConnect[ClientEnd, ListenerHandle]


def register_listener(listen_sock: socket.socket, state: object, *, owner: object,
                      exclusive: bool, proven: bool = True) -> Entry:
    """Register the listening socket ``listen_sock`` for pairing: it accepts
    on the scheduler ``owner``, whose adapter state is ``state``.
    ``exclusive``, ``proven``: see ListenerEntry."""
    if collected_listeners:
        forget_collected()
    v6only = False
    if listen_sock.family == socket.AF_INET6:
        v6only = bool(listen_sock.getsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY))
    entry = ListenerEntry(
        listen_sock.getsockname(),
        v6only=v6only,
        exclusive=exclusive,
        owner=owner,
        handle=ListenerHandle(listen_sock, state),
        proven=proven,
    )
    registry.add_listener(entry)
    return entry


def accept_room(entry: Entry) -> int:
    """How many more connects the accept queue of the listener ``entry``
    takes now.

    A TCP client that overflows it recovers by itself: a dropped SYN is
    sent again, and a dropped final ACK (a SYN-cookie handshake) is made up
    for by its first data segment. A friend client never sends on its real
    socket, so its connection would never be accepted: it waits for room
    instead. Friend connects whose handshake the kernel has not finished
    yet are not in the queue, but are in ``entry.waiting``.
    """
    queued, limit = entry.handle.accept_queue()
    return limit + 1 - max(queued, entry.waiting)



collected_listeners: "collections.deque[ListenerEntry]" = collections.deque()


class _CollectedListener:
    """What a listener's handle holds once its user's socket (held through
    a weak proxy) was collected: a socket that answers as a closed one. Not
    the dead proxy, which raises ReferenceError at any touch, even
    ``isinstance()`` (programs that look through ``gc.get_objects()``,
    anyio's tests among them, would find it through the registry)."""

    __slots__ = ()

    def fileno(self) -> int:
        return -1

    def getsockopt(self, *args: Any) -> Any:
        raise OSError(errno.EBADF, os.strerror(errno.EBADF))


_COLLECTED_LISTENER = _CollectedListener()


def _listener_collected(entry: ListenerEntry) -> None:
    """A finalizer's: no lock taken (see collected_listeners)."""
    entry.handle.sock = _COLLECTED_LISTENER
    collected_listeners.append(entry)


def forget_when_collected(listen_sock: Any, entry: ListenerEntry) -> None:
    """Forget ``entry`` once its listening socket (a user's, held weakly)
    is collected; the callback takes no lock."""
    weakref.finalize(listen_sock, _listener_collected, entry)


def forget_collected() -> None:
    """Forget the listeners collected since the last call (see above)."""
    while collected_listeners:
        try:
            entry = collected_listeners.popleft()
        except IndexError:  # another thread took the last one
            return
        forget_listener(entry)


def forget_listener(entry: ListenerEntry,
                    go_on_over_tcp: Optional[Callable[[Link], bool]] = None) -> None:
    """Stop pairing with ``entry``. The kernel resets what still waits in a
    closing backlog. A confirmed connect (not established) watches its own
    socket instead: a listener shared with another process stays open
    there, and the connect goes on over TCP. ``go_on_over_tcp``: the
    listener stays open, in other hands (an event loop took it over), and
    accepts its backlog there: each established connect waiting in it is
    offered to this (True: its link went on over TCP) before it is reset."""
    for orphan in registry.remove_listener(entry):
        link = orphan.link
        if link.established and not (go_on_over_tcp is not None and go_on_over_tcp(link)):
            link.server.reset()
    handle = entry.handle
    close = handle.socketless_close
    # Dropped: a connect that outlives its listener (withdrawn, kept with
    # its user's socket) keeps the entry, and must not keep the server
    # these hooks belong to.
    handle.socketless_accept = handle.socketless_close = None
    handle.drop_kept()
    if close is not None:
        close()
