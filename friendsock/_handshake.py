"""The socket-level steps of pairing, shared by the asyncio and trio adapters.

No event loop here: plain sockets and the registry. A client registers its
pending connect before the ``connect()`` syscall (:func:`register_connect`);
the accepting side claims it by the flow key of the accepted socket
(:func:`claim_accepted`). Either side may be asyncio or trio: what the
other side needs of a listener or a client end is in :class:`ListenerHandle`
and :class:`ClientEnd`.
"""

from __future__ import annotations

import errno
import os
import socket
import struct
import threading
from typing import Any, Callable, Optional, Tuple

from ._core._addresses import flow_key
from ._core._link import Link
from ._core._registry import ListenerEntry, PendingConnect, registry
from ._core._switch import is_enabled
from ._friend_socket import read_buffer_sizes

_LINGER_ABORT = struct.pack("ii", 1, 0)
# struct tcp_info's tcpi_unacked and tcpi_sacked, which a listening socket
# fills with its accept queue's length and limit (min(backlog, somaxconn)).
_ACCEPT_QUEUE = struct.Struct("II")
_ACCEPT_QUEUE_OFFSET = 24
_ACCEPT_QUEUE_ANY = 1 << 30


class _Process:
    """This process's id, kept current across fork() without a getpid()
    syscall per connection."""

    pid = os.getpid()

    @classmethod
    def _forked(cls) -> None:
        cls.pid = os.getpid()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_Process._forked)


def current_pid() -> int:
    return _Process.pid


def release_sockets(pid: int, *socks: socket.socket) -> None:
    """Close the real sockets of a finished link without TIME_WAIT.

    Both ends are ours and done; an abortive close (SO_LINGER 0) ends the
    connection at once, so connect/close-heavy work cannot use up ports.
    ``pid``: the process that made the link. A forked child that somehow
    finishes an inherited link only drops its copies of the descriptors:
    SO_LINGER would act on the sockets it shares with the parent.
    """
    inherited = _Process.pid != pid
    for sock in socks:
        if not inherited:
            try:
                sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, _LINGER_ABORT)
            except OSError:
                pass
        sock.close()


class ListenerHandle:
    """What the registry keeps of a listener for its clients: the listening
    socket, the buffer sizes accepted sockets inherit, and the adapter's
    per-scheduler state (a client on the same scheduler shares it)."""

    __slots__ = ("sock", "sndbuf", "rcvbuf", "state", "connect_lock")

    def __init__(self, listen_sock: socket.socket, state: object) -> None:
        self.sock = listen_sock
        self.sndbuf, self.rcvbuf = read_buffer_sizes(listen_sock)
        self.state = state
        # One connect at a time looks at the room and takes it, whatever
        # thread it runs on.
        self.connect_lock = threading.Lock()

    def accept_queue(self) -> Tuple[int, int]:
        """The listener's accept queue: how many connections wait in it, and
        its limit (the kernel takes limit + 1). An empty, unlimited queue
        when the socket is closed: the connect finds out."""
        try:
            info = self.sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_INFO, 32)
        except OSError:
            return 0, _ACCEPT_QUEUE_ANY
        return _ACCEPT_QUEUE.unpack_from(info, _ACCEPT_QUEUE_OFFSET)  # type: ignore[return-value]


def accept_room(entry: ListenerEntry) -> int:
    """How many more connects the accept queue of the listener ``entry``
    takes now.

    A TCP client that overflows it recovers by itself: a dropped SYN is
    sent again, and a dropped final ACK (a SYN-cookie handshake) is made up
    for by its first data segment. A friend client never sends on its real
    socket, so its connection would never be accepted: it waits for room
    instead. Friend connects whose handshake the kernel has not finished
    yet are not in the queue, but are in ``entry.waiting``.
    """
    handle: ListenerHandle = entry.handle  # type: ignore[assignment]
    queued, limit = handle.accept_queue()
    return limit + 1 - max(queued, entry.waiting)


class ClientEnd:
    """What a pending connect keeps of its client: the real socket and its
    addresses (known before connect(), so no syscall asks for them again)."""

    __slots__ = ("sock", "sockname", "peername")

    def __init__(self, sock: socket.socket, sockname: Any, peername: Any) -> None:
        self.sock = sock
        self.sockname = sockname
        self.peername = peername


def why_not_friends(friends: Optional[bool], kwargs: dict) -> Optional[str]:
    """The fallback reason that applies before any address is looked at."""
    if friends is False:
        return "opted-out"
    if not is_enabled():
        return "disabled"
    if kwargs.get("ssl"):
        return "ssl"
    if kwargs.get("sock") is not None:
        return "sock"
    return None


def numeric_address_infos(host: Any, port: Any, family: int = 0, proto: int = 0) -> Optional[list]:
    """getaddrinfo's answer for a numeric IP, without the resolver thread
    (asyncio and trio skip it the same way); None when the host needs
    resolving."""
    if isinstance(host, bytes):
        try:
            host = host.decode("ascii")
        except UnicodeDecodeError:
            return None
    if not isinstance(host, str) or "%" in host:
        return None
    try:
        port = int(port)
    except (TypeError, ValueError):
        return None
    for af in (socket.AF_INET, socket.AF_INET6):
        if family not in (0, af):
            continue
        try:
            # Canonical text, as getsockname() reports it: the flow key
            # must be the one the accepting side computes.
            host = socket.inet_ntop(af, socket.inet_pton(af, host))
        except OSError:
            continue
        address = (host, port) if af == socket.AF_INET else (host, port, 0, 0)
        return [(af, socket.SOCK_STREAM, proto or socket.IPPROTO_TCP, "", address)]
    return None


def bind_local(sock: socket.socket, af: int, local_infos: list) -> None:
    """Bind to the first of ``local_infos`` of the socket's family."""
    error: Optional[OSError] = None
    for laf, _, _, _, laddr in local_infos:
        if laf != af:
            continue
        try:
            sock.bind(laddr)
            return
        except OSError as exc:
            error = OSError(exc.errno, f"error while attempting to bind on address "
                                       f"{laddr!r}: {exc.strerror.lower()}")
    raise error or OSError(f"no matching local address with family={af} found")


def start_connect(sock: socket.socket, address: Any) -> int:
    """connect() on a non-blocking socket: 0 when the connection is up
    already (on loopback the handshake completes inside the call, though a
    non-blocking connect still says EINPROGRESS), EINPROGRESS when the caller
    must wait for it, any other errno when it failed at once."""
    err = sock.connect_ex(address)
    if err == errno.EINPROGRESS:
        try:
            sock.getpeername()
            return 0
        except OSError:
            pass
    return err


def register_connect(sock: socket.socket, address: Any, entry: ListenerEntry, only_one: bool,
                     threaded: bool) -> Optional[PendingConnect]:
    """Register ``sock``'s connect to ``address`` (bound, not yet connected);
    None when the listener went away meanwhile (the connect is plain TCP).

    ``threaded``: the listener's scheduler (which accepts, and runs the
    server end) is not the caller's; known now, so a link on one scheduler
    never pays for locks. An exclusive, only listener cannot be reached by
    anyone else, so the link exists from connect() on (optimistic).
    """
    handle: ListenerHandle = entry.handle  # type: ignore[assignment]
    client_sndbuf, client_rcvbuf = read_buffer_sizes(sock)
    link = Link(client_sndbuf, client_rcvbuf, handle.sndbuf, handle.rcvbuf, threaded=threaded)
    sockname = sock.getsockname()
    pending = PendingConnect(flow_key(sockname, address), link, entry)
    pending.handle = ClientEnd(sock, sockname, address)
    pid = _Process.pid
    link.on_done = lambda: release_sockets(pid, sock)
    if not registry.add_pending(pending, establish=entry.exclusive and only_one):
        link.on_done = None
        return None
    return pending


def connect_if_room(sock: socket.socket, address: Any, entry: ListenerEntry, only_one: bool,
                    threaded: bool) -> Optional[Tuple[Optional[PendingConnect], int]]:
    """Register ``sock``'s connect to the listener ``entry`` and start it
    (:func:`register_connect`, then :func:`start_connect`), if its accept
    queue has room (:func:`accept_room`); None, and nothing done, when it is
    full: wait (:func:`wait_for_room`) and try again. Otherwise the pending
    connect and ``start_connect``'s answer; ``(None, 0)``, nothing
    connected, when the listener just went away.

    One connect at a time per listener looks at the room and takes it, so
    connects on several threads cannot overflow the queue for each other.
    """
    handle: ListenerHandle = entry.handle  # type: ignore[assignment]
    with handle.connect_lock:
        if registry.is_listening(entry) and accept_room(entry) <= 0:
            return None
        pending = register_connect(sock, address, entry, only_one, threaded)
        if pending is None:
            return None, 0
        try:
            return pending, start_connect(sock, address)
        except BaseException:
            abandon_connect(pending, sock)
            raise


def wait_for_room(entry: ListenerEntry, wake: Callable[[], None]) -> bool:
    """Have ``wake`` called when the accepting side of ``entry`` makes room
    (``registry.accept_room_made``) or the listener goes away. False, and no
    call: there is no need to wait (the listener is gone, or room was made
    between the look and now), try again at once."""
    if not registry.wait_for_accept_room(entry, wake):
        return False
    if accept_room(entry) > 0:
        registry.cancel_wait_for_accept_room(entry, wake)
        return False
    return True


def make_room(entry: ListenerEntry) -> None:
    """The accepting side took connections off ``entry``'s queue: wake as
    many waiting connects as there is room for."""
    if entry.room_waiters:
        registry.accept_room_made(entry, accept_room(entry))


def abandon_connect(pending: PendingConnect, sock: socket.socket) -> None:
    """The connecting side gives up (its connect failed, or was cancelled).

    Withdrawn in time: the socket is closed here, and an optimistic link
    (counted as made) is finished. Claimed first, by a listener on another
    thread: the link is the accepting side's too, so the client end closes
    and the server end sees it go (the link releases both sockets).
    """
    link = pending.link
    if registry.withdraw(pending):
        link.on_done = None
        if link.established:
            link.client.close()
            link.server.close()
        sock.close()
    else:
        link.client.close()


def claim_accepted(conn: socket.socket, address: Any) -> Tuple[Optional[PendingConnect], Any]:
    """The pending connect an accepted socket belongs to, claimed (or None),
    and the socket's own address (None when nothing could be pending)."""
    if not registry.pending_count():
        return None, None
    try:
        sockname = conn.getsockname()
    except OSError:  # already reset by the peer
        return None, None
    return registry.claim(flow_key(sockname, address)), sockname


def adopt_accepted(conn: socket.socket, pending: PendingConnect) -> None:
    """The accepting side takes over a claimed link: both real sockets are
    released once the link is done."""
    client_sock = pending.handle.sock  # type: ignore[attr-defined]
    pid = _Process.pid
    pending.link.on_done = lambda: release_sockets(pid, conn, client_sock)
    pending.link.establish()
