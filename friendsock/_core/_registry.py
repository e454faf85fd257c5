"""The process-wide pairing registry.

It holds the listening addresses of friendsock servers and the client
connects waiting for their server to accept, keyed by the flow key. Claim and
withdraw are atomic under one lock, so both ends always agree on whether a
connection is a friend link or real TCP.
"""

from __future__ import annotations

import enum
import threading
from typing import Any, Callable, Dict, Generic, List, Optional, Tuple, TypeVar

from ._fork import Part, on_fork
from ._addresses import Endpoint, FlowKey, is_ipv4, normalize_endpoint
from ._link import Link

# The adapters' own objects for a listener and for a client end: the
# registry keeps them for the other side and never looks inside.
ListenerT = TypeVar("ListenerT")
ClientT = TypeVar("ClientT")


class ListenerEntry(Generic[ListenerT]):
    """A friendsock listening socket, as the registry knows it.

    ``owner`` identifies the scheduler that accepts (an adapter's choice:
    the event loop); ``exclusive`` says the socket is this process's alone,
    so a connect to it can only land here (optimistic pairing);
    ``handle`` is the adapter's own object (its server and socket).
    """

    __slots__ = ("endpoint", "v6only", "exclusive", "owner", "handle", "waiting", "room_waiters",
                 "proven")

    def __init__(
        self,
        address: Any,
        *,
        v6only: bool,
        exclusive: bool,
        owner: object,
        handle: ListenerT,
        proven: bool = True,
    ) -> None:
        self.endpoint = normalize_endpoint(address)
        self.v6only = v6only
        self.exclusive = exclusive
        # Its accept is known to claim what it takes (an event loop's,
        # trio's; a blocking socket's once its accept() ran). Until then its
        # owner may still hand it to code that accepts natively, and a
        # connect whose end cannot go on over TCP pairs only once claimed.
        self.proven = proven
        self.owner = owner
        self.handle = handle
        self.waiting = 0  # connects registered here and not yet claimed
        # Connects waiting for room in the listener's accept queue: called
        # (under no lock) when the accepting side took connections, or the
        # listener went away.
        self.room_waiters: List[Callable[[], None]] = []

    def __repr__(self) -> str:
        mode = "exclusive" if self.exclusive else "shared"
        return f"<ListenerEntry {self.endpoint[0]}:{self.endpoint[1]} {mode}>"


class PendingState(enum.Enum):
    WAITING = "waiting"  # not accepted yet
    # Accepted, but one end is still a plain socket in its user's hands (a
    # socket connected or accepted elsewhere, not adopted yet): the link
    # forms when that end is adopted, or never (it is used raw: TCP).
    HELD = "held"
    CLAIMED = "claimed"  # both ends are friendsock's: a friend link
    WITHDRAWN = "withdrawn"  # real TCP


class PendingConnect(Generic[ClientT, ListenerT]):
    """A client end registered before its ``connect()`` syscall."""

    __slots__ = ("key", "link", "listener", "state", "on_claimed", "handle", "client_ready",
                 "server_ready", "on_settled", "optimistic", "client")

    def __init__(self, key: FlowKey, link: Link, listener: ListenerEntry[ListenerT],
                 handle: Any = None, client_ready: bool = True, client: Any = None) -> None:
        self.key = key
        # The connecting socket's own address (bound before connect()), by
        # which an accepting side that names the connection otherwise still
        # finds it (see Registry.take_misnamed); None: not registered so.
        self.client: Optional[Endpoint] = None if client is None else normalize_endpoint(client)
        self.link = link
        self.listener = listener
        self.state = PendingState.WAITING
        # Called (under no lock) by the claiming side, for confirmed connects.
        self.on_claimed: Optional[Callable[[], None]] = None
        # Whether each end is friendsock's yet: False for a socket connected
        # (client) or accepted (server) by the loop's own sock_* methods,
        # until it is handed to a transport.
        self.client_ready = client_ready
        self.server_ready = False
        # Called (under no lock) with the outcome, CLAIMED or WITHDRAWN, by
        # whoever settles a HELD connect, for the accepting side waiting on it.
        self.on_settled: Optional[Callable[[PendingState], None]] = None
        # The client adapter's own object (None: a connect made by the core
        # alone, which no adapter will look at).
        self.handle: ClientT = handle
        # Paired from connect() on (the link established as it registered):
        # no claim to wait for.
        self.optimistic = False

    def __repr__(self) -> str:
        return f"<PendingConnect {self.key} {self.state.value}>"


class Registry:
    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._listeners: Dict[Endpoint, List[ListenerEntry]] = {}
        self._ports: Dict[int, int] = {}
        self._pending: Dict[FlowKey, PendingConnect] = {}
        # The same connects by their client's address (see take_misnamed).
        self._by_client: Dict[Endpoint, PendingConnect] = {}

    # -- listeners --------------------------------------------------------
    def add_listener(self, entry: ListenerEntry) -> None:
        with self._lock:
            self._listeners.setdefault(entry.endpoint, []).append(entry)
            port = entry.endpoint[1]
            self._ports[port] = self._ports.get(port, 0) + 1

    def remove_listener(self, entry: ListenerEntry) -> List[PendingConnect]:
        """Forget ``entry``; returns the connects still waiting in its backlog
        (now withdrawn: the kernel resets them when the listener closes)."""
        with self._lock:
            if not self._unlist(entry):
                return []
            orphans = [p for p in self._pending.values() if p.listener is entry]
            for pending in orphans:
                self._forget(pending)
                pending.state = PendingState.WITHDRAWN
            entry.waiting = 0
            waiters, entry.room_waiters = entry.room_waiters, []
        for wake in waiters:  # they find the listener gone
            wake()
        return orphans

    def move_listener(self, entry: ListenerEntry, successor: ListenerEntry) -> bool:
        """``entry``'s socket accepts as ``successor`` from now on (another
        adapter took it over, and claims what it accepts): the connects
        waiting in its backlog are the successor's to claim. False, nothing
        moved, when ``entry`` is gone already."""
        with self._lock:
            if not self._unlist(entry):
                return False
            for pending in self._pending.values():
                if pending.listener is entry:
                    pending.listener = successor
                    successor.waiting += 1
            entry.waiting = 0
            waiters, entry.room_waiters = entry.room_waiters, []
        for wake in waiters:  # they find the listener gone, and look again
            wake()
        return True

    def _unlist(self, entry: ListenerEntry) -> bool:
        """Take ``entry`` off its endpoint (the lock held); False if it was not on it."""
        entries = self._listeners.get(entry.endpoint)
        if entries is None or entry not in entries:
            return False
        entries.remove(entry)
        if not entries:
            del self._listeners[entry.endpoint]
        port = entry.endpoint[1]
        self._ports[port] -= 1
        if not self._ports[port]:
            del self._ports[port]
        return True

    def is_listening(self, entry: ListenerEntry) -> bool:
        """Whether ``entry`` is still registered (no lock needed to ask; a
        decision that depends on it asks again under the lock)."""
        return entry in self._listeners.get(entry.endpoint, ())

    def has_port(self, port: int) -> bool:
        """Cheap first test before resolving a host: any listener on ``port``?"""
        return port in self._ports

    def match_listener(self, address: Any) -> Tuple[Optional[ListenerEntry], bool]:
        """The listener a connect to ``address`` reaches, and whether it is
        the only one there (several sharing a port: the kernel picks)."""
        host, port = normalize_endpoint(address)
        with self._lock:
            found = self._listeners.get((host, port))
            if not found:
                if is_ipv4(host):
                    found = self._listeners.get(("0.0.0.0", port)) or [
                        e for e in self._listeners.get(("::", port), ()) if not e.v6only
                    ]
                else:
                    found = self._listeners.get(("::", port))
            if not found:
                return None, False
            return found[0], len(found) == 1

    def wait_for_accept_room(self, entry: ListenerEntry, wake: Callable[[], None]) -> bool:
        """Call ``wake`` once the accepting side of ``entry`` has taken
        connections off its accept queue (or the listener is gone); False,
        and no call, when the listener is already gone."""
        with self._lock:
            if not self.is_listening(entry):
                return False
            entry.room_waiters.append(wake)
            return True

    def cancel_wait_for_accept_room(self, entry: ListenerEntry, wake: Callable[[], None]) -> None:
        with self._lock:
            try:
                entry.room_waiters.remove(wake)
            except ValueError:
                pass

    def accept_room_made(self, entry: ListenerEntry, room: int) -> None:
        """The accepting side of ``entry`` took connections and its accept
        queue has ``room``: that many waiting connects, first come first,
        look again."""
        if not entry.room_waiters or room <= 0:
            return
        with self._lock:
            waiters = entry.room_waiters[:room]
            del entry.room_waiters[:room]
        for wake in waiters:
            wake()

    # -- pending connects -------------------------------------------------
    def add_pending(self, pending: PendingConnect, establish: bool = False) -> bool:
        """Register a connect to ``pending.listener``; False (nothing
        registered) when that listener is already gone: another thread
        closed it since the match, and nobody would ever claim the connect.
        ``establish``: the link exists from now on (optimistic pairing),
        decided under the lock so no claim can come first."""
        with self._lock:
            listener = pending.listener
            if not self.is_listening(listener):
                pending.state = PendingState.WITHDRAWN
                return False
            if establish:
                pending.link.establish()
            self._pending[pending.key] = pending
            if pending.client is not None:
                self._by_client[pending.client] = pending
            listener.waiting += 1
            return True

    def claim(self, key: FlowKey, ready: bool = True, hold: bool = False) -> Optional[PendingConnect]:
        """The accepting side takes the connect, if it is still waiting.

        ``ready``: the accepted socket is friendsock's already (a server's
        own accept), not a socket handed to its user. A connect whose ends
        are not both ready is HELD until they are (:meth:`adopt`); a
        claimer that cannot wait (``hold`` False) withdraws it instead, and
        returns None: the connection is TCP.
        """
        with self._lock:
            pending = self._pending.get(key)
            if pending is None:
                return None
            self._forget(pending)
            pending.listener.waiting -= 1
            pending.server_ready = ready
            if ready and pending.client_ready:
                pending.state = PendingState.CLAIMED
            elif hold:
                pending.state = PendingState.HELD
            else:
                pending.state = PendingState.WITHDRAWN
                return None
        return pending

    def adopt(self, pending: PendingConnect, server: bool) -> PendingState:
        """An end that was a plain socket is friendsock's now (``server``:
        the accepted end, else the connecting end). Returns the state after:
        CLAIMED (the link forms: this caller starts its end, and wakes the
        other), WAITING or HELD (the other end is not there yet: wait for
        it), WITHDRAWN (real TCP)."""
        with self._lock:
            if server:
                pending.server_ready = True
            else:
                pending.client_ready = True
            if pending.state is PendingState.HELD and pending.client_ready and pending.server_ready:
                pending.state = PendingState.CLAIMED
                # Before either end can use it (this caller starts its end
                # after the lock), as optimistic links are made.
                pending.link.establish()
            return pending.state

    def withdraw(self, pending: PendingConnect) -> bool:
        """The connect goes on as TCP; False when it was claimed first. The
        connecting side gives up a WAITING connect, either side a HELD one.

        A connect its listener already dropped (``remove_listener``) is
        withdrawn all the same: nobody will claim it.
        """
        with self._lock:
            if pending.state is PendingState.CLAIMED:
                return False
            # A HELD connect was taken off the table by its claim already.
            if self._pending.get(pending.key) is pending:
                self._forget(pending)
                pending.listener.waiting -= 1
            pending.state = PendingState.WITHDRAWN
            return True

    def withdraw_unclaimed(self, key: FlowKey, link: Link, unless_proven: bool = False) -> bool:
        """Withdraw the connect of ``link`` waiting under ``key`` (its
        listener has not accepted it yet): the accept will find a plain
        connection. False when it is not waiting (claimed already), or, with
        ``unless_proven``, when its listener's accept is known to claim it."""
        with self._lock:
            pending = self._pending.get(key)
            if pending is None or pending.link is not link or unless_proven and pending.listener.proven:
                return False
            self._forget(pending)
            pending.listener.waiting -= 1
            pending.state = PendingState.WITHDRAWN
            return True

    def take_misnamed(self, key: FlowKey, peer: Any) -> Optional[PendingConnect]:
        """An accepting side found no connect under ``key``, its own names
        of the connection: the connect waiting under other names whose
        client is ``peer``, withdrawn, if there is one. Its connection
        landed here, but its two ends name it differently (a rewrite on
        the way: NAT), so it is no link: both ends go on as TCP, and one
        that was paired from ``connect()`` on must be failed, not left to
        wait on a link nobody runs. (The client's address is its own bound
        port: no other connection has it.)"""
        with self._lock:
            pending = self._by_client.get(normalize_endpoint(peer))
            if pending is None or pending.state is not PendingState.WAITING or pending.key == key:
                return None
            self._forget(pending)
            pending.listener.waiting -= 1
            pending.state = PendingState.WITHDRAWN
            return pending

    def _forget(self, pending: PendingConnect) -> None:
        """Take ``pending`` off the tables (the lock held)."""
        del self._pending[pending.key]
        if pending.client is not None and self._by_client.get(pending.client) is pending:
            del self._by_client[pending.client]

    def is_pending(self, key: FlowKey) -> bool:
        """Whether a connect with this flow key waits to be claimed."""
        return key in self._pending

    def pending_count(self) -> int:
        return len(self._pending)

    def listener_count(self) -> int:
        return sum(len(v) for v in self._listeners.values())

    def _reset_after_fork(self) -> None:
        # A child must never pair with listeners or connects it inherited.
        self._lock = threading.Lock()
        self._listeners = {}
        self._ports = {}
        self._pending = {}
        self._by_client = {}

    def _shared_after_fork(self) -> None:
        # The child holds this process's listening sockets too, and may
        # accept a connect made here: no listener is ours alone any more.
        with self._lock:
            for entries in self._listeners.values():
                for entry in entries:
                    entry.exclusive = False


registry = Registry()
on_fork(Part.REGISTRY, after_in_child=registry._reset_after_fork,
        after_in_parent=registry._shared_after_fork)
