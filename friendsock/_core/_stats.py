"""Process-wide counters and their typed snapshot."""

from __future__ import annotations

import collections
import dataclasses
import enum
import itertools
import threading
import types
from typing import Any, Dict, List, Mapping, Optional, Tuple

from ._addresses import normalize_endpoint
from ._fork import Part, on_fork


class Fallback(str, enum.Enum):
    """Why a connection took real TCP; its value is the key it is counted
    under in ``FriendStats.fallbacks``."""

    OPTED_OUT = "opted-out"  # the caller said friends=False
    DISABLED = "disabled"  # pairing is switched off (FRIENDSOCK=0, set_enabled(False))
    SSL = "ssl"  # create_connection(ssl=...): the loop's own TLS connection
    SOCK = "sock"  # create_connection(sock=...): the caller's own socket
    NO_LISTENER = "no-listener"  # no friendsock listener of this process at the address (any more)
    NOT_LOCAL = "not-local"  # a listener on the port, but the address is not this host's
    PEER_NOT_FRIEND = "peer-not-friend"  # accepted: the client is no friendsock connect of ours
    UNCONFIRMED = "unconfirmed"  # a shared listener: not claimed here within CONFIRM_TIMEOUT
    CONNECT_FAILED = "connect-failed"  # trio: a friend connect failed; trio's own connect retries
    # A socket connected or accepted with the loop's sock_* methods carried
    # payload over TCP before both ends were friendsock's (or never became so).
    USED_RAW = "used-raw"
    # The kernel's names of a connect's connection are not those it was
    # registered under (its destination rewritten on the way: NAT).
    NAMES_DIFFER = "names-differ"
    # Another friendsock process of this host serves the port, but its offer
    # to move the connection off TCP did not come (in time) or was refused.
    NOT_OFFERED = "not-offered"
    # Another friendsock process of this host serves the port, but the
    # connections moved there lately were too short to pay for the move.
    SHORT_LIVED = "short-lived"


@dataclasses.dataclass(frozen=True)
class FriendStats:
    """A snapshot of friendsock's counters (see :func:`friendsock.stats`).

    ``links_made``: friend links ever paired; ``links_alive``: links with at
    least one end still open; ``bytes_moved``: payload bytes delivered over
    friend links (and those this process's transports read over
    connections moved to another process, counted as each ends); ``fallbacks``: connections that took real TCP, by reason;
    ``pending``: client connects waiting for their server to accept;
    ``listeners``: links made and fallbacks per listener address
    (:class:`ListenerStats`), most links first; a connect that reached no
    listener of ours is counted under the address it connected to;
    ``cross_process``: connections to another process of this host whose
    bytes moved off TCP, counted at each end this process held, open or
    since closed (those count in neither ``links_made`` nor ``fallbacks``);
    ``cross_process_peers``: the same per process id of the other end, the
    most first (for at most :data:`MAX_PEERS` processes per thread: past
    that, those counted least are dropped).
    """

    links_made: int
    links_alive: int
    bytes_moved: int
    fallbacks: Mapping[str, int]
    pending: int
    listeners: Mapping[str, "ListenerStats"] = dataclasses.field(
        default_factory=lambda: types.MappingProxyType({})
    )
    cross_process: int = 0
    cross_process_peers: Mapping[int, int] = dataclasses.field(
        default_factory=lambda: types.MappingProxyType({})
    )


@dataclasses.dataclass(frozen=True)
class ListenerStats:
    """Links made and fallbacks at one listener address (``"127.0.0.1:8000"``,
    ``"[::1]:8000"``), counted per end as in :class:`FriendStats`: a server's
    own fallbacks (``peer-not-friend``) and its clients' (``sock``,
    ``opted-out``, ...) both land here."""

    address: str
    links_made: int
    fallbacks: Mapping[str, int]
    # The per-thread counts summed here, ``(links_made, fallbacks)`` by
    # serial: one missing from a later snapshot was dropped for more
    # recently used addresses (see MAX_PLACES), one new began afresh, so a
    # difference of two snapshots is taken part by part.
    parts: Mapping[int, Tuple[int, Mapping[str, int]]] = dataclasses.field(
        default_factory=lambda: types.MappingProxyType({}), repr=False, compare=False
    )

    @property
    def fell_back(self) -> int:
        """Connections counted here that took real TCP, whatever the reason."""
        return sum(self.fallbacks.values())


# Per-address counts are kept for at most this many addresses per thread,
# those used lately: a long test session starts a server on a new port for
# every test, and the last ones' counts are the ones asked for. (The totals
# count every link.)
MAX_PLACES = 1024
# Per-peer counts of connections moved to other processes are kept for at
# most this many process ids per thread (a supervisor may start a process
# per job; the totals count every one).
MAX_PEERS = 256


def format_address(key: Tuple[str, Any]) -> str:
    """``host:port``, an IPv6 host in brackets."""
    host, port = key
    if port is None:
        return host
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"


_place_serials = itertools.count(1)  # next() is atomic: shards of any thread share it


class _Place:
    """One thread's counts at one address."""

    __slots__ = ("made", "fallbacks", "used", "serial")

    def __init__(self) -> None:
        self.made = 0
        self.fallbacks: Dict[str, int] = {}
        self.used = True  # since room was last made (see Shard._make_room)
        self.serial = next(_place_serials)


class Shard:
    """One thread's counters. Only that thread writes them, so counting
    needs no lock and loses nothing, however many threads run links; a
    snapshot adds the shards up."""

    __slots__ = ("made", "done", "moved", "across", "peers", "fallbacks", "places")

    def __init__(self) -> None:
        self.made = 0  # links established on this thread
        self.across = 0  # connections moved off TCP to another process
        self.peers: Dict[int, int] = {}  # the same per process id (at most MAX_PEERS)
        self.done = 0  # links whose last end closed on this thread
        self.moved = 0  # bytes read by ends on this thread
        self.fallbacks: Dict[str, int] = {}
        self.places: Dict[Tuple[str, Any], _Place] = {}  # the same per address

    def place(self, address: Any) -> _Place:
        """The counts at ``address``: a listener's endpoint, a socket
        address, or ``(host, port)`` as a caller named it."""
        place = self.places.get(address)  # a listener's endpoint is its own key
        if place is None:
            host, port = address[0], address[1]
            if isinstance(host, bytes):  # trio takes a host name as bytes too
                host = host.decode("ascii", "replace")
                address = (host, port)
            key = normalize_endpoint(address) if isinstance(host, str) else (str(host), port)
            place = self.places.get(key)
            if place is None:
                if len(self.places) >= MAX_PLACES:
                    self._make_room()
                self.places[key] = place = _Place()
        place.used = True
        return place

    def _make_room(self) -> None:
        """The places used since the last time room was made stay (at most
        half of MAX_PLACES, the newest), the others go. A new dict, not
        deletions: a snapshot copies the one it finds on another thread."""
        kept = [(key, place) for key, place in self.places.items() if place.used]
        for _, place in kept:
            place.used = False
        self.places = dict(kept[-(MAX_PLACES // 2):])


class Counters:
    """Counters shared by every thread that runs friend links."""

    __slots__ = ("_local", "_shards", "_lock")

    def __init__(self) -> None:
        self._local = threading.local()
        self._shards: List[Shard] = []  # every thread's, kept when it ends
        self._lock = threading.Lock()  # only to add a shard

    def shard(self) -> Shard:
        """The calling thread's shard."""
        try:
            return self._local.shard
        except AttributeError:
            shard = self._local.shard = Shard()
            with self._lock:
                self._shards.append(shard)
            return shard

    def fallback(self, reason: Fallback, address: Any = None) -> None:
        """A connection took real TCP; ``address``: the listener's endpoint,
        or where the connect went when no listener of ours was there."""
        # Counted by the plain string: FriendStats.fallbacks is looked up by
        # it. (_value_ is .value without the property: every connect to a
        # peer without friendsock counts here.)
        key = reason._value_
        shard = self.shard()
        fallbacks = shard.fallbacks
        fallbacks[key] = fallbacks.get(key, 0) + 1
        if address is not None:
            fallbacks = shard.place(address).fallbacks
            fallbacks[key] = fallbacks.get(key, 0) + 1

    def link_made(self, listener: Optional[Any]) -> None:
        """A friend link was established to ``listener`` (its endpoint)."""
        shard = self.shard()
        shard.made += 1
        if listener is not None:
            shard.place(listener).made += 1

    def read_across(self, count: int) -> None:
        """A connection moved to another process ended, ``count`` bytes read
        over it here."""
        self.shard().moved += count

    def moved_across(self, peer_pid: int) -> None:
        """A connection to process ``peer_pid`` of this host moved off TCP."""
        shard = self.shard()
        shard.across += 1
        peers = shard.peers
        count = peers.get(peer_pid, 0)
        if not count and len(peers) >= MAX_PEERS:
            # The quarter counted least goes. A new dict, as for places: a
            # snapshot copies the one it finds.
            kept = sorted(peers.items(), key=lambda item: item[1])[MAX_PEERS // 4:]
            shard.peers = peers = dict(kept)
        peers[peer_pid] = count + 1

    @property
    def links_made(self) -> int:
        return sum(shard.made for shard in list(self._shards))

    @property
    def links_alive(self) -> int:
        shards = list(self._shards)
        return sum(shard.made for shard in shards) - sum(shard.done for shard in shards)

    @property
    def bytes_moved(self) -> int:
        return sum(shard.moved for shard in list(self._shards))

    def snapshot(self, pending: int) -> FriendStats:
        shards = list(self._shards)
        fallbacks: collections.Counter[str] = collections.Counter()
        for shard in shards:
            fallbacks.update(dict(shard.fallbacks))  # dict(): one atomic copy
        made = sum(shard.made for shard in shards)
        return FriendStats(
            links_made=made,
            links_alive=made - sum(shard.done for shard in shards),
            bytes_moved=sum(shard.moved for shard in shards),
            fallbacks=types.MappingProxyType(dict(fallbacks)),
            pending=pending,
            listeners=_listeners(shards),
            cross_process=sum(shard.across for shard in shards),
            cross_process_peers=_peers(shards),
        )

    def _reset_after_fork(self) -> None:
        # Another thread may have held the lock at fork(). The parent's
        # links are not alive in the child: it never runs the loops they
        # live on (and never closes them, see the adapters' pid checks).
        self._lock = threading.Lock()
        self.shard().done += self.links_alive


def _peers(shards: List[Shard]) -> Mapping[int, int]:
    counts: collections.Counter[int] = collections.Counter()
    for shard in shards:
        counts.update(dict(shard.peers))  # dict(): one atomic copy
    return types.MappingProxyType(dict(counts.most_common()))


def listener_stats(address: str, parts: Mapping[int, Tuple[int, Mapping[str, int]]]) -> ListenerStats:
    """The counts at ``address``: its ``parts`` added up."""
    fallbacks: collections.Counter[str] = collections.Counter()
    for _, counts in parts.values():
        fallbacks.update(counts)
    return ListenerStats(address, sum(made for made, _ in parts.values()),
                         types.MappingProxyType(dict(fallbacks)), types.MappingProxyType(dict(parts)))


def _listeners(shards: List[Shard]) -> Mapping[str, ListenerStats]:
    parts: Dict[str, Dict[int, Tuple[int, Mapping[str, int]]]] = {}
    for shard in shards:
        for key, place in dict(shard.places).items():  # dict(): one atomic copy
            counts = (place.made, types.MappingProxyType(dict(place.fallbacks)))
            parts.setdefault(format_address(key), {})[place.serial] = counts
    stats = [listener_stats(address, by_serial) for address, by_serial in parts.items()]
    stats.sort(key=lambda s: (-s.links_made, -s.fell_back, s.address))
    return types.MappingProxyType({s.address: s for s in stats})


counters = Counters()
on_fork(Part.STATS, after_in_child=counters._reset_after_fork)
