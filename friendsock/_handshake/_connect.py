"""The connecting side of pairing: register a connect under its flow key
before the ``connect()`` syscall, make it, and check the kernel names it
so (:class:`ConnectAttempt`); connects on sockets made elsewhere
(``sock_connect``), adopted later."""

from __future__ import annotations

import _socket
import errno
import socket
import threading
import weakref
from typing import Any, Callable, Dict, Optional, Tuple

from .._core._addresses import flow_key, is_ipv4, is_unspecified, kernel_destination, shared_host
from .._core._link import Link
from .._core._registry import PendingConnect, registry
from .._core._stats import Fallback
from .._core._tap import tap_for
from .._core._switch import is_enabled
from .._friend_socket import fresh_buffer_sizes, read_buffer_sizes
from ._binding import (bind_port_now, bind_as_connect_would, bind_local, is_local_address,
                       numeric_address_infos, users_sockname)
from ._listener import (ClientEnd, Entry, Pending, collected_listeners, accept_room, forget_collected,
                        forget_listener)
from ._process import SocketRelease, current_pid
from ._tcp_info import family_of, is_plain_socket, is_tcp_socket


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


# (host, port) as callers name them -> (what fallback_address counts them
# at, whether numeric): a program connects to a handful of places.
_fallback_addresses: Dict[Tuple[Any, Any], Tuple[Any, bool]] = {}


def fallback_address(host: Any, port: Any) -> Any:
    """Where a connect to ``(host, port)`` that takes real TCP before any
    address is tried is counted in ``stats().listeners``: the endpoint of the
    listener of ours it reaches (a numeric host), else the address as the
    caller named it."""
    try:
        address, numeric = _fallback_addresses[(host, port)]
    except (KeyError, TypeError):  # (TypeError: a host or port not hashable)
        infos = numeric_address_infos(host, port)
        address, numeric = ((host, port), False) if infos is None else (infos[0][4], True)
        if len(_fallback_addresses) < 1024:
            try:
                _fallback_addresses[(host, port)] = address, numeric
            except TypeError:
                pass
    if not numeric:
        return address
    if registry.has_port(address[1]):
        entry, _ = registry.match_listener(address)
        if entry is not None:
            return entry.endpoint
    return address


def start_connect(sock: socket.socket, address: Any) -> int:
    """connect() on a non-blocking socket: 0 when the connection is up
    already (on loopback the handshake completes inside the call, though a
    non-blocking connect still says EINPROGRESS), EINPROGRESS when the caller
    must wait for it, any other errno when it failed at once."""
    # The C call: a socket of the patched class would pair this connect again.
    err = _socket.socket.connect_ex(sock, address) if isinstance(sock, _socket.socket) \
        else sock.connect_ex(address)
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
    link.on_done = SocketRelease(current_pid(), sock)
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
    full: wait (:class:`RoomWait`) and try again. Otherwise the pending
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


class RoomWait:
    """A connect waiting for room in a listener's accept queue, whatever
    does the waiting (a loop's future, a trio event, a thread's event). The
    registry's wake-up reaches the waiter once; one it does not take (it
    gave up, or had stopped waiting) goes on to the next connect waiting,
    so no room made is lost.

    ``woken`` wakes the waiter, on the waiter's thread; ``post`` gets a call
    there from the accepting side's thread (None: both are one thread, or
    ``woken`` may be called from any). ``post`` swallows the error of a
    waiter's loop or run that is gone."""

    __slots__ = ("_entry", "_woken", "_post", "_lock", "_over", "_woke")

    def __init__(self, entry: Entry, woken: Callable[[], None],
                 post: Optional[Callable[[Callable[[], None]], None]] = None) -> None:
        self._entry = entry
        self._woken = woken
        self._post = post
        self._lock = threading.Lock()  # a wake-up and the end of the wait may race
        self._over = False
        self._woke = False

    def begin(self) -> bool:
        """Start waiting for the accepting side to make room
        (``registry.accept_room_made``) or the listener to go away. False,
        and no wait begun: the listener is gone, or room was made between
        the look and now; look again at once."""
        entry, wake = self._entry, self.wake
        if not registry.wait_for_accept_room(entry, wake):
            return False
        if accept_room(entry) > 0:
            registry.cancel_wait_for_accept_room(entry, wake)
            return False
        return True

    def wake(self) -> None:
        """The registry's call, on the accepting side's thread."""
        if self._post is None:
            self._settle()
        else:
            self._post(self._settle)

    def _settle(self) -> None:  # on the waiter's thread, where post takes it
        with self._lock:
            over = self._over
            self._woke = not over
        if over:  # woken for room it will not take: pass it on
            registry.accept_room_made(self._entry, 1)
        else:
            self._woken()

    def end(self, taken: bool) -> None:
        """Stop waiting. ``taken``: the waiter goes on to look for room, and
        a wake-up it had was its own; otherwise one it had goes on."""
        with self._lock:
            self._over = True
            pass_on = self._woke and not taken
        if pass_on:
            registry.accept_room_made(self._entry, 1)
        registry.cancel_wait_for_accept_room(self._entry, self.wake)


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
        if collected_listeners:
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

    def bind(self, af: int, local_infos: Optional[list], across: bool = False) -> None:
        """Bind the socket to the first of ``local_infos`` (the caller's local
        address) of the family ``af``; without them, to pair, to the
        destination IP, and no pairing when that is not an address of ours.
        ``across``: the listener is another process's, which must find this
        connect by its port as it accepts: bound before connect() too."""
        sock = self._socket()
        if local_infos is not None:
            bind_local(sock, af, local_infos)
            self._aim_from(sock.getsockname()[0])
            self._check_reaches_us()
        elif self.entry is not None or across:
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
                bind_port_now(sock, host)
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
    infos = numeric_address_infos(address[0], address[1], family_of(sock))
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
