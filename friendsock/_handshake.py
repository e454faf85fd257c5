"""The socket-level steps of pairing, shared by the asyncio and trio adapters.

No event loop here: plain sockets and the registry. A client registers its
pending connect before the ``connect()`` syscall (:func:`register_connect`;
an address at a time: :class:`ConnectAttempt`); the accepting side claims it
by the flow key of the accepted socket (:func:`claim_accepted`). Either side
may be asyncio or trio: what the other side needs of a listener or a client
end is in :class:`ListenerHandle` and :class:`ClientEnd`.
"""

from __future__ import annotations

import _socket
import atexit
import collections
import errno
import os
import random
import socket
import struct
import sys
import threading
import weakref
from typing import Any, Callable, Dict, List, Optional, Set, Tuple

from ._core._addresses import flow_key, is_ipv4, is_unspecified, kernel_destination, shared_host
from ._core import _link
from ._core._errors import PairingCheckError
from ._core._fork import Part, on_fork
from ._core._link import Link, LinkEnd
from ._core._registry import ListenerEntry, PendingConnect, PendingState, registry
from ._core._stats import Fallback, counters
from ._core._tap import tap_for
from ._core._switch import _OFF_VALUES, is_enabled
from ._friend_socket import STDLIB_SOCKET, fresh_buffer_sizes, read_buffer_sizes

# How long a confirmed connect (a listener that other processes may share)
# waits for this process to claim it before it goes on as plain TCP. The
# adapters read it (and ROOM_RECHECK) here at each use: tests change it.
CONFIRM_TIMEOUT = 0.25
# How often a connect held back by a full accept queue looks again, in case
# room was made by an accept friendsock did not see.
ROOM_RECHECK = 1.0

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


on_fork(Part.PROCESS, after_in_child=_Process._forked)


def current_pid() -> int:
    return _Process.pid


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
    return STDLIB_SOCKET(_RAW_FAMILY(sock), _RAW_TYPE(sock), sock.proto, fd)  # type: ignore[no-any-return]


_RAW_FAMILY, _RAW_TYPE = _socket.socket.family.__get__, _socket.socket.type.__get__


class SocketRelease:
    """A link's ``on_done``: :func:`release_sockets` of its real sockets, the
    accepted one first when there is one (slots, not a closure per link:
    idle links stay small); or, for a connection neither of whose sockets
    was handed out (see :meth:`exposed`), kept by its listener for a later
    connect (:meth:`ListenerHandle.keep`)."""

    __slots__ = ("pid", "first", "second", "keeper", "client", "restores")

    def __init__(self, pid: int, first: socket.socket,
                 second: Optional[socket.socket] = None,
                 keeper: Optional["ListenerHandle"] = None, client: Optional[LinkEnd] = None) -> None:
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
        kept.append(KeptConnection(_Process.pid, server_sock, client_sock, names, sizes))
        return True

    def take_kept(self, address: Any) -> "Optional[KeptConnection]":
        """A kept connection whose client connected to ``address`` (none in
        a forked child: the parent's, whose copies of the descriptors it
        drops)."""
        kept = self.kept
        while kept:
            connection = kept.pop()  # the newest: one connect after another takes the same
            if connection.pid != _Process.pid:
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
        return _ACCEPT_QUEUE.unpack_from(info, _ACCEPT_QUEUE_OFFSET)  # type: ignore[return-value]

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
    if _collected:
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


def why_not_friends(friends: Optional[bool], kwargs: dict) -> Optional[Fallback]:
    """The fallback reason that applies before any address is looked at.
    (``ssl=`` is none: TLS runs over a friend link as over TCP.)"""
    if friends is False:
        return Fallback.OPTED_OUT
    if not is_enabled():
        return Fallback.DISABLED
    if kwargs.get("sock") is not None:
        return Fallback.SOCK
    return None


def fallback_address(host: Any, port: Any) -> Any:
    """Where a connect to ``(host, port)`` that takes real TCP before any
    address is tried is counted in ``stats().listeners``: the endpoint of the
    listener of ours it reaches (a numeric host), else the address as the
    caller named it."""
    infos = numeric_address_infos(host, port)
    if infos is None:
        return (host, port)
    address = infos[0][4]
    if registry.has_port(address[1]):
        entry, _ = registry.match_listener(address)
        if entry is not None:
            return entry.endpoint
    return address


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
    known = _numeric_hosts.get((host, family))
    if known is None:
        known = _numeric_host(host, family)
        if len(_numeric_hosts) < 1024:
            _numeric_hosts[(host, family)] = known
    if not known:
        return None
    af, host = known
    address = (host, port) if af == socket.AF_INET else (host, port, 0, 0)
    return [(af, socket.SOCK_STREAM, proto or socket.IPPROTO_TCP, "", address)]


# (host text, family asked) -> (family, canonical text), or () for a name
# to resolve: a program connects to a handful of hosts, again and again.
_numeric_hosts: Dict[Tuple[str, int], Tuple[Any, ...]] = {}


def _numeric_host(host: str, family: int) -> Tuple[Any, ...]:
    for af in (socket.AF_INET, socket.AF_INET6):
        if family not in (0, af):
            continue
        try:
            # Canonical text, as getsockname() reports it: the flow key
            # must be the one the accepting side computes.
            return af, sys.intern(socket.inet_ntop(af, socket.inet_pton(af, host)))
        except OSError:
            continue
    return ()


def first_host(local_infos: Optional[list], af: int) -> Optional[str]:
    """The IP :func:`bind_local` tries first for the family ``af``, if any."""
    for laf, _, _, _, laddr in local_infos or ():
        if laf == af:
            return laddr[0]  # type: ignore[no-any-return]
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
                                       f"{laddr!r}: {(exc.strerror or '').lower()}")
    raise error or OSError(f"no matching local address with family={af} found")


# Linux's "bind an address now, the port at connect()" (Python names it
# from 3.12 on).
_IP_BIND_ADDRESS_NO_PORT = getattr(socket, "IP_BIND_ADDRESS_NO_PORT",
                                   24 if sys.platform == "linux" else None)


class _EphemeralPorts:
    """The ports a kernel connect() takes: the even ones of
    ``net.ipv4.ip_local_port_range`` less ``ip_local_reserved_ports`` (Linux
    takes even ports for connect() first, and odd ones for bind() to port 0,
    so that a port a program picks with ``bind(("", 0))`` and closes, to
    listen on later, is not taken by a client meanwhile), read once; from a
    random start, each connect the next."""

    def __init__(self) -> None:
        try:
            with open("/proc/sys/net/ipv4/ip_local_port_range") as text:
                low, high = (int(n) for n in text.read().split())
            reserved: Set[int] = set()
            with open("/proc/sys/net/ipv4/ip_local_reserved_ports") as text:
                for part in text.read().strip().split(","):
                    if part:
                        first, _, last = part.partition("-")
                        reserved.update(range(int(first), int(last or first) + 1))
        except (OSError, ValueError):
            low, high, reserved = 32768, 60999, set()
        self.first = low + low % 2
        self.count = max((high - self.first) // 2 + 1, 0)
        self.reserved = reserved
        self.cursor = random.randrange(self.count) if self.count else 0
        # Per local address, the connects left that bind to port 0 straight
        # away: TIME_WAIT on one address's ports says nothing of another's.
        self.skips: Dict[str, int] = {}

    def bind(self, sock: socket.socket, host: str) -> None:
        """Bind ``sock`` to ``host`` and the next of these ports free there;
        to port 0, the kernel's choice, if the next two are not. A port in
        TIME_WAIT (which a connect() may take again, but a bind() may not)
        is not free: where TCP connections left most of these ports in
        TIME_WAIT, the next connects bind to port 0 at once, for a while."""
        count = self.count
        skips = self.skips
        skip = skips.get(host)
        if skip:
            skips[host] = skip - 1
        else:
            for _ in range(min(count, _PORT_TRIES)):
                self.cursor = cursor = (self.cursor + 1) % count
                port = self.first + 2 * cursor
                if port in self.reserved:
                    continue
                try:
                    sock.bind((host, port))
                    return
                except OSError as exc:
                    if exc.errno != errno.EADDRINUSE:
                        raise
                # Out of a run of ports in use: elsewhere next time.
                self.cursor = random.randrange(count)
            if len(skips) >= _SKIPPING_HOSTS:
                skips.clear()
            skips[host] = _PORT_SKIPS
        sock.bind((host, 0))


# Ports tried before the kernel's choice is taken instead, and how many
# connects take it at once after that.
_PORT_TRIES = 2
_PORT_SKIPS = 16
_SKIPPING_HOSTS = 64  # local addresses whose skips are remembered at once
# Read as friendsock is imported, not at a first connect: that one runs on
# an event loop, where a file read is a blocking call (blockbuster, which
# aiohttp's and anyio's suites run, fails it).
_ephemeral_ports = _EphemeralPorts()


def bind_as_connect_would(sock: socket.socket, host: str) -> None:
    """Bind ``sock`` to ``host`` and a port that a connect() of the kernel's
    would take (see :class:`_EphemeralPorts`), so the connection's 4-tuple
    is known before connect()."""
    _ephemeral_ports.bind(sock, host)


def _bind_port_now(sock: socket.socket, host: str) -> None:
    """Bind a socket with no port yet to ``host`` and a port, now, even if
    its user asked for the port at connect() (``IP_BIND_ADDRESS_NO_PORT``,
    Linux's only way to bind without a port, which also lets this second
    bind() happen); the option stays as its user set it."""
    option = _IP_BIND_ADDRESS_NO_PORT
    no_port = 0
    if option is not None:
        no_port = sock.getsockopt(socket.IPPROTO_IP, option)
        if no_port:
            sock.setsockopt(socket.IPPROTO_IP, option, 0)
    try:
        bind_as_connect_would(sock, host)
    finally:
        if no_port:
            sock.setsockopt(socket.IPPROTO_IP, option, no_port)  # type: ignore[arg-type]


def is_local_address(host: str) -> bool:
    """Whether ``host`` is an address of this host: a socket can bind it."""
    family = socket.AF_INET if is_ipv4(host) else socket.AF_INET6
    try:
        with socket.socket(family, socket.SOCK_DGRAM) as probe:
            probe.bind((host, 0))
    except OSError:
        return False
    return True


def users_sockname(sock: socket.socket) -> Optional[Any]:
    """The address of a socket made elsewhere; None when it is closed."""
    try:
        return sock.getsockname()
    except OSError:
        return None


def is_bound(sockname: Any) -> bool:
    """Whether a socket at ``sockname`` was bound by its user (an address or
    a port of its own)."""
    return bool(sockname[1]) or not is_unspecified(sockname[0])


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


def connection_sockname(sock: socket.socket, address: Any) -> Any:
    """``sock``'s address (bound, not yet connected) as its connection to
    ``address`` will have it. Bound to the wildcard address with a port
    already (``bind(("", 0))``, ``source_address=("", 0)``, as paho-mqtt
    connects), its IP is the route's, chosen at connect(): a UDP socket of
    the same family connected there, which sends nothing, says which. (The
    server claims the connection by the address it sees.)"""
    sockname = sock.getsockname()
    if is_unspecified(sockname[0]):
        try:
            family = socket.AF_INET if is_ipv4(sockname[0]) else socket.AF_INET6
            with socket.socket(family, socket.SOCK_DGRAM) as probe:
                probe.connect(address)
                sockname = (probe.getsockname()[0],) + tuple(sockname[1:])
        except OSError:  # the connect fails as well, or goes over TCP
            pass
    return sockname


def register_connect(sock: socket.socket, address: Any, entry: Entry, only_one: bool,
                     threaded: bool, adoptable: bool = False, fresh: bool = False,
                     unproven_ok: bool = True) -> Optional[Pending]:
    """Register ``sock``'s connect to ``address`` (bound, not yet connected);
    None when the listener went away meanwhile (the connect is plain TCP).

    ``threaded``: the listener's scheduler (which accepts, and runs the
    server end) is not the caller's; known now, so a link on one scheduler
    never pays for locks. An exclusive, only listener cannot be reached by
    anyone else, so the link exists from connect() on (optimistic).
    ``adoptable``: the socket stays its user's after the connect (the loop's
    sock_connect), and is friendsock's only once handed to a transport.
    ``fresh``: friendsock made the socket just now (its buffer sizes are
    every new socket's). ``unproven_ok``: the connecting end can go on over
    TCP (a blocking or trio socket), so it may pair from connect() on with
    a listener whose accept is not known to be friendsock's yet.
    """
    handle = entry.handle
    client_sndbuf, client_rcvbuf = fresh_buffer_sizes(sock) if fresh else read_buffer_sizes(sock)
    sockname = shared_host(connection_sockname(sock, address))
    link = Link(client_sndbuf, client_rcvbuf, handle.sndbuf, handle.rcvbuf, threaded=threaded,
                listener=entry.endpoint, addresses=(sockname, address),
                tap=tap_for(sockname, address))
    pending: Pending = PendingConnect(flow_key(sockname, address), link, entry,
                                      ClientEnd(sock, sockname, address), client_ready=not adoptable,
                                      client=sockname)
    link.on_done = SocketRelease(_Process.pid, sock)
    optimistic = entry.exclusive and only_one and not adoptable and (entry.proven or unproven_ok)
    pending.optimistic = optimistic
    if not registry.add_pending(pending, establish=optimistic):
        link.on_done = None
        return None
    return pending


def connect_if_room(sock: socket.socket, address: Any, entry: Entry, only_one: bool,
                    threaded: bool, fresh: bool = False, unproven_ok: bool = True,
                    requested: Any = None) -> Optional[Tuple[Optional[Pending], int]]:
    """Register ``sock``'s connect to the listener ``entry`` and start it
    (:func:`register_connect`, then :func:`start_connect`), if its accept
    queue has room (:func:`accept_room`); None, and nothing done, when it is
    full: wait (:func:`wait_for_room`) and try again. Otherwise the pending
    connect and ``start_connect``'s answer; ``(None, 0)``, nothing
    connected, when the listener just went away.

    One connect at a time per listener looks at the room and takes it, so
    connects on several threads cannot overflow the queue for each other.
    ``requested``: the address its user asked to connect to, where it
    connects (the kernel takes it to ``address``), if not ``address``.
    """
    with entry.handle.connect_lock:
        if registry.is_listening(entry) and accept_room(entry) <= 0:
            return None
        pending = register_connect(sock, address, entry, only_one, threaded, fresh=fresh,
                                   unproven_ok=unproven_ok)
        if pending is None:
            return None, 0
        try:
            return pending, start_connect(sock, address if requested is None else requested)
        except BaseException:
            abandon_connect(pending, sock)
            raise


def wait_for_room(entry: Entry, wake: Callable[[], None]) -> bool:
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


def make_room(entry: Entry) -> None:
    """The accepting side took connections off ``entry``'s queue: wake as
    many waiting connects as there is room for."""
    if entry.room_waiters:
        registry.accept_room_made(entry, accept_room(entry))


def abandon_connect(pending: Pending, sock: socket.socket, close: bool = True) -> None:
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
        if close:
            sock.close()
    else:
        link.client.close()


_SOCK_NONBLOCK = getattr(socket, "SOCK_NONBLOCK", 0)


class ConnectAttempt:
    """A connect to one address, as far as it goes without waiting.

    Made with the listener the address reaches (``entry``; None: no pairing,
    for the reason ``fallback``). :meth:`open` makes the socket, :meth:`bind`
    binds it, :meth:`start` registers and starts the connect, and
    :meth:`give_up` undoes what was done. Waiting (for room, for the connect
    to complete) is the adapter's, and so is a connect that does not pair.
    """

    __slots__ = ("requested", "address", "entry", "only_one", "fallback", "sock", "pending",
                 "fresh", "can_go_over_tcp")

    def __init__(self, address: Any, can_go_over_tcp: bool = True,
                 source: Optional[str] = None) -> None:
        if _collected:
            forget_collected()
        # What the caller asked for, and where the kernel takes a socket that
        # connects there (see kernel_destination) from the IP ``source``,
        # if the caller knows it yet (bind() finds it out otherwise): what
        # the registry, the flow key and the link's addresses are made of.
        self.requested = address
        self.entry: Optional[Entry] = None
        self._aim(kernel_destination(address, source))
        self.fallback = Fallback.NO_LISTENER
        self.sock: Optional[socket.socket] = None
        self.pending: Optional[Pending] = None
        self.fresh = False  # the socket is open()'s, not its user's
        # The connecting end can go on over TCP (see register_connect).
        self.can_go_over_tcp = can_go_over_tcp

    def _aim(self, address: Any) -> None:
        """Connect to ``address``, with the listener that reaches."""
        self.address = address
        entry: Optional[Entry]
        entry, self.only_one = registry.match_listener(address)
        while entry is not None and entry.handle.is_closed():
            # Closed by its user without friendsock seeing it (a listener
            # registered by the loop's sock_accept): it pairs no more.
            forget_listener(entry)
            entry, self.only_one = registry.match_listener(address)
        self.entry = entry

    def _aim_from(self, source: str) -> None:
        """The socket is bound to the IP ``source``: a wildcard destination
        is where the kernel takes a socket bound there."""
        address = kernel_destination(self.requested, source)
        if address != self.address:
            self._aim(address)
            if self.entry is None:
                self.fallback = Fallback.NO_LISTENER

    def open(self, af: int, socktype: int, proto: int) -> socket.socket:
        """The connect's socket, non-blocking."""
        # Made non-blocking (one system call, not two).
        sock = self.sock = socket.socket(af, socktype | _SOCK_NONBLOCK, proto)
        if not _SOCK_NONBLOCK:
            sock.setblocking(False)
        self.fresh = True
        return sock

    def bind(self, af: int, local_infos: Optional[list]) -> None:
        """Bind the socket to the first of ``local_infos`` (the caller's local
        address) of the family ``af``; without them, to pair, to the
        destination IP, and no pairing when that is not an address of ours."""
        sock = self._socket()
        if local_infos is not None:
            bind_local(sock, af, local_infos)
            self._aim_from(sock.getsockname()[0])
            self._check_reaches_us()
        elif self.entry is not None:
            # Bind first so the 4-tuple is known before connect(); binding
            # to the destination IP also proves it is an address of ours.
            try:
                bind_as_connect_would(sock, self.address[0])
            except OSError:
                self.entry, self.fallback = None, Fallback.NOT_LOCAL

    def bind_users_socket(self, sockname: Any = None) -> None:
        """:meth:`bind` for a socket its user made, and may have bound (its
        address ``sockname``, if read already): unbound (or bound to the
        wildcard address, no port yet), to the destination IP; bound to an
        address of its own with no port yet (``IP_BIND_ADDRESS_NO_PORT``, as
        trio's ``local_address=`` binds), a port on that address now; bound
        with a port, as it is. Either way the 4-tuple is known before
        connect(). No pairing when the socket cannot be bound or the
        destination is not an address of ours."""
        sock = self._socket()
        try:
            host, port = (sockname or sock.getsockname())[:2]
            if not is_unspecified(host):
                self._aim_from(host)
                if self.entry is None:
                    return
            if not port:
                if is_unspecified(host):
                    host = self.address[0]  # binding it proves it ours, as bind()'s
                _bind_port_now(sock, host)
        except OSError:
            self.entry, self.fallback = None, Fallback.NOT_LOCAL
            return
        if host != self.address[0]:
            self._check_reaches_us()

    def _check_reaches_us(self) -> None:
        """A socket bound to an address of its own: the destination must be
        an address of ours, or the connect leaves this host however well a
        listener of ours matches it (a wildcard one, on that port)."""
        entry = self.entry
        if entry is not None and is_unspecified(entry.endpoint[0]) and \
                not is_local_address(self.address[0]):
            self.entry, self.fallback = None, Fallback.NOT_LOCAL

    def start(self, owner: object) -> Optional[int]:
        """Register the connect with ``entry`` and start it, if the listener's
        accept queue has room (:func:`connect_if_room`): None, nothing done,
        when it is full (wait, then call again); else :func:`start_connect`'s
        answer with ``pending`` set, or 0 and no ``pending`` (nothing
        connected) when the listener just went away. ``owner``: the caller's
        scheduler; the link is threaded unless it is the listener's."""
        entry = self.entry
        assert entry is not None, "no listener to pair with"
        # The kernel takes the connect where it goes: connected() checks
        # that the names it was registered under are the kernel's.
        started = connect_if_room(self._socket(), self.address, entry, self.only_one,
                                  threaded=entry.owner is not owner, fresh=self.fresh,
                                  unproven_ok=self.can_go_over_tcp, requested=self.requested)
        if started is None:
            return None
        self.pending, err = started
        return err

    def connected(self) -> bool:
        """The connect completed: whether it still pairs. Its flow key was
        made before ``connect()``, from where the kernel takes it; here the
        kernel's own names of the connection (``getsockname()`` and
        ``getpeername()``) must say the same, as the accepting side's
        names of it do when it claims (they mirror the client's). Should
        they not (a destination rewritten on the way: NAT), the connect is
        withdrawn before its end is anybody's, an optimistic link undone:
        no byte has entered it. A socket that cannot say (reset already)
        stays as it is: a claim, or the listener's close, settles it.

        This and :func:`claim_accepted` are the two places a link's ends
        are named; with it, both ends of every link made from a
        ``ConnectAttempt`` (every door's connect: asyncio's and uvloop's,
        trio's streams and sockets, blocking sockets, ``sock_connect``
        adoption; TLS runs over whichever) agree by the kernel's names.
        Kept connections and socketless links are named by friendsock
        itself, from the same destination."""
        pending = self.pending
        if pending is None:
            return False
        if named_as_registered(pending) or not registry.withdraw(pending):
            return True  # (claimed: by the accepting side's names, the same)
        link = pending.link
        link.on_done = None  # the socket goes on as plain TCP
        if link.established:  # optimistic: made, never used
            # (Its accepting side may have reset it already, on its thread:
            # see _landed_misnamed.)
            for end in (link.client, link.server):
                if end is not None:
                    end.close()
        self.pending = None
        self.fallback = Fallback.NAMES_DIFFER
        return False

    @property
    def optimistic(self) -> bool:
        """Paired from ``connect()`` on (an exclusive listener, the only one
        there, see :func:`register_connect`): no claim to wait for."""
        return self.pending is not None and self.pending.optimistic

    def give_up(self, close: bool = True) -> None:
        """The connect failed or was cancelled: :func:`abandon_connect` once
        registered, else close the socket (if made). ``close=False``: the
        socket is its user's, who closes it (a failed connect of a socket
        made elsewhere)."""
        if self.pending is not None:
            abandon_connect(self.pending, self.pending.handle.sock, close=close)
        elif self.sock is not None and close:
            self.sock.close()

    def _socket(self) -> socket.socket:
        sock = self.sock
        assert sock is not None, "open() first"
        return sock


def named_as_registered(pending: Pending) -> bool:
    """Whether the kernel names the connection of the connect ``pending``
    (connected) as its flow key does; True when its socket cannot say
    (reset already). See :meth:`ConnectAttempt.connected`."""
    sock = pending.handle.sock
    try:
        return flow_key(sock.getsockname(), sock.getpeername()) == pending.key
    except OSError:
        return True


def check_link_names(link: Link, writer: LinkEnd) -> None:
    """``FRIENDSOCK_CHECK_PAIRING``: before ``writer`` sends its first byte,
    each real socket under ``link`` that friendsock holds must name the
    connection as the link does (its flow key); else raise
    :class:`PairingCheckError`, which no adapter turns into anything else.
    A link without real sockets (socketless) has only the names it was
    given."""
    release = link.on_done
    if not isinstance(release, SocketRelease) or link.addresses is None:
        return
    expected = flow_key(*link.addresses)
    side = "client" if writer is link.client else "server"
    for sock in (release.first, release.second):
        if sock is None:
            continue
        try:
            names = sock.getsockname(), sock.getpeername()
        except OSError:
            continue  # closed or reset already: nothing named
        if flow_key(*names) != expected:
            raise PairingCheckError(
                f"friend link {link.addresses[0]} -> {link.addresses[1]}: a real socket under it "
                f"is {names[0]} -> {names[1]} (the {side} end's first byte); "
                f"the two ends would not agree")


if os.environ.get("FRIENDSOCK_CHECK_PAIRING", "").strip().lower() not in _OFF_VALUES | {""}:
    _link.first_push_check = check_link_names


def call_on_claim(pending: Pending, here: Callable[[], None], elsewhere: Callable[[], None]) -> None:
    """Have the claim of the confirmed connect ``pending`` call ``here`` when
    the accepting side runs on the caller's scheduler; else ``elsewhere``, on
    the accepting thread (to hand ``here`` over to the caller's)."""
    pending.on_claimed = elsewhere if pending.link.threaded else here
    # Set, then check: the accepting side may have claimed the connect
    # before on_claimed was there to call (while the connect finished).
    if pending.state is PendingState.CLAIMED:
        here()


def confirmed(pending: Pending, claimed: bool) -> bool:
    """Whether a confirmed connect pairs once its wait is over: ``claimed``,
    or claimed after all (too late to withdraw). Otherwise it is withdrawn
    and counted as unconfirmed: its socket goes on as plain TCP. (A wait
    that fails instead: :func:`abandon_connect`.)"""
    if claimed or not registry.withdraw(pending):
        return True
    # Counted even when withdrawn already: a listener closed under it
    # withdraws without counting (see go_tcp for the held connects).
    pending.link.on_done = None  # the socket is plain TCP's now, not the link's
    counters.fallback(Fallback.UNCONFIRMED, pending.listener.endpoint)
    return False


def hold_ended(pending: Pending) -> bool:
    """The accepting end of a HELD connect stopped waiting for the
    connecting end's adoption (it came, bytes or EOF came raw instead, or
    the deadline passed): whether it is a link. Not formed by now, it is
    TCP from here on, counted ``used-raw`` (once, by whichever end withdraws
    it first); formed at the last moment, a link after all."""
    return pending.state is PendingState.CLAIMED or not go_tcp(pending, Fallback.USED_RAW)


def go_tcp(pending: Pending, reason: Optional[Fallback]) -> bool:
    """A connect made or accepted by the loop's sock_* methods goes on as
    TCP, whichever end decides it: withdraw it (counted once, by the end
    that withdraws it first), and wake an accepting end holding it. The sockets stay their users'. False, and
    nothing done, when the link formed first."""
    withdrawn_before = pending.state is PendingState.WITHDRAWN
    if not registry.withdraw(pending):
        return False
    pending.link.on_done = None  # the socket is plain TCP's now, not the link's
    if not withdrawn_before:
        if reason is not None:
            counters.fallback(reason, pending.listener.endpoint)
        settle_held(pending, PendingState.WITHDRAWN)
    return True


def settle_held(pending: Pending, state: PendingState) -> None:
    """Tell an accepting end waiting on a HELD connect (``on_settled``) how
    it ended: CLAIMED or WITHDRAWN."""
    hook = pending.on_settled
    if hook is not None:
        pending.on_settled = None
        hook(state)


def accept_from(listen_sock: socket.socket, handle: ListenerHandle) -> Tuple[socket.socket, Any]:
    """``listen_sock.accept()`` for the listener of ``handle``, without the
    Python wrapper's look-up of the listener's family and type as enums on
    every call (the new socket is blocking, as that wrapper's may be)."""
    fd, address = listen_sock._accept()  # type: ignore[attr-defined]
    return socket.socket(*handle.kind, fd), address


def claim_accepted(conn: socket.socket, address: Any, *, ready: bool = True,
                   hold: bool = False, listener: Optional[ListenerHandle] = None,
                   ) -> Tuple[Optional[Pending], Any]:
    """The pending connect an accepted socket belongs to, claimed (or None),
    and the socket's own address (None when nothing could be pending).
    ``ready`` and ``hold``: see :meth:`Registry.claim`. ``listener``: the
    handle of the listener that accepted it, if known."""
    if not registry.pending_count():
        return None, None
    sockname = listener.accepted_sockname if listener is not None else None
    if sockname is None:
        try:
            sockname = conn.getsockname()
        except OSError:  # already reset by the peer
            return None, None
    key = flow_key(sockname, address)
    pending = registry.claim(key, ready=ready, hold=hold)
    if pending is None:
        misnamed = registry.take_misnamed(key, address)
        if misnamed is not None:
            _landed_misnamed(misnamed)
    return pending, sockname


def _landed_misnamed(pending: Pending) -> None:
    """The connect ``pending`` (withdrawn) reached an accepting side that
    names it otherwise (see :meth:`Registry.take_misnamed`): TCP on both
    ends. Paired from connect() on, its client end may have written into
    the link already and may wait on it: the link is reset, as the kernel
    resets a connection, so the client end fails at once (a reset) rather
    than hang; its real socket closes with the link."""
    counters.fallback(Fallback.NAMES_DIFFER, pending.listener.endpoint)
    link = pending.link
    if link.established:
        link.server.reset()
    else:  # a confirmed connect: its client goes on over TCP when it looks
        link.on_done = None


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


def is_tcp_socket(sock: Any) -> bool:
    """An IPv4 or IPv6 stream socket: what pairs, or counts as real TCP
    when it does not (a Unix socket's connection is neither)."""
    try:
        return sock.family in (socket.AF_INET, socket.AF_INET6) and sock.type == socket.SOCK_STREAM
    except AttributeError:  # not a socket: the loop's own call says so
        return False


# The modules of the socket classes whose I/O a friend end may take over:
# the stdlib's and the one patch_socket() puts in its place.
_PLAIN_SOCKET_MODULES = frozenset({"socket", "friendsock._blocking._socket"})


def is_plain_socket(sock: socket.socket) -> bool:
    """Not a socket of a subclass of its user's, whose own methods (which
    may count, log or change what goes through) must go on doing its I/O."""
    return type(sock).__module__ in _PLAIN_SOCKET_MODULES


# Sockets whose connect an event loop's sock_connect makes once it is
# registered as adoptable: the connect() the loop calls on one of them is
# that connect, never a patched socket's own pairing as well (a blocking
# socket, as asyncssh hands the loop, would pair twice, the loop's way
# unconfirmed).
adoptable_connecting: "weakref.WeakSet[socket.socket]" = weakref.WeakSet()


def register_adoptable_connect(sock: socket.socket, address: Any, owner: object) -> Optional[Pending]:
    """Before the loop's own ``sock_connect(sock, address)``: register it as
    a connect that pairs if ``sock`` reaches a friendsock transport before
    any payload moves (:func:`payload_moved`). None, nothing registered, when
    ``address`` is no friendsock listener of this process, or friendsock
    made this connect itself (it registered it already). The socket gets
    its port first (:meth:`ConnectAttempt.bind_users_socket`), so its
    4-tuple is known before the connection exists."""
    if not is_enabled() or not is_plain_socket(sock) or not is_tcp_socket(sock):
        return None
    infos = numeric_address_infos(address[0], address[1], sock.family)
    if infos is None:
        return None  # a name: the loop resolves it, as it always does
    address = infos[0][4]  # as the accepting side will see it
    source = users_sockname(sock)
    if source is None:
        return None  # closed: the loop's connect says so
    attempt = ConnectAttempt(address, source=source[0])
    if attempt.entry is None:
        return None
    attempt.sock = sock
    attempt.bind_users_socket()
    entry = attempt.entry
    if entry is None:
        return None  # not an address of ours, or not bindable: plain TCP
    try:
        sockname = sock.getsockname()
    except OSError:
        return None
    if registry.is_pending(flow_key(sockname, attempt.address)):
        return None  # friendsock's own connect, registered already
    return register_connect(sock, attempt.address, entry, attempt.only_one,
                            threaded=entry.owner is not owner, adoptable=True)


def adopt_accepted(conn: socket.socket, pending: Pending,
                   keeper: Optional[ListenerHandle] = None) -> None:
    """The accepting side takes over a claimed link: both real sockets are
    released once the link is done; or kept by ``keeper``, the listener,
    if the client end is one whose socket nobody else saw
    (:func:`offer_for_reuse`) and neither socket is handed out meanwhile."""
    # The client's as its release has it: the socket its close left, if it
    # closed first (SocketRelease.keep).
    release = pending.link.on_done
    if isinstance(release, SocketRelease):
        client_sock, client, restores = release.first, release.client, release.restores
    else:
        client_sock, client, restores = pending.handle.sock, None, None
    adopted = pending.link.on_done = SocketRelease(_Process.pid, conn, client_sock, keeper, client)
    adopted.restores = restores
    pending.link.establish()


def offer_for_reuse(pending: Pending) -> None:
    """The client end of ``pending`` is on a socket friendsock made, on the
    listener's own scheduler: its connection may be kept once the link is
    done (see :meth:`ListenerHandle.keep`)."""
    release = pending.link.on_done
    if isinstance(release, SocketRelease):
        release.client = pending.link.client


# Listeners whose socket was collected unclosed, to forget at the pairing
# steps' next use: never in the collection itself, which may run on any
# thread, inside any lock of the registry's or a link's (a collection
# triggered while one is held would wait on it for ever).
_collected: "collections.deque[ListenerEntry]" = collections.deque()


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
    """A finalizer's: no lock taken (see _collected)."""
    entry.handle.sock = _COLLECTED_LISTENER  # type: ignore[assignment]
    _collected.append(entry)


def forget_when_collected(listen_sock: Any, entry: ListenerEntry) -> None:
    """Forget ``entry`` once its listening socket (a user's, held weakly)
    is collected; the callback takes no lock."""
    weakref.finalize(listen_sock, _listener_collected, entry)


def forget_collected() -> None:
    """Forget the listeners collected since the last call (see above)."""
    while _collected:
        try:
            entry = _collected.popleft()
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
