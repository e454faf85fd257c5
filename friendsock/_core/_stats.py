"""Process-wide counters and their typed snapshot."""

from __future__ import annotations

import collections
import dataclasses
import enum
import os
import threading
import types
from typing import Dict, List, Mapping


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


@dataclasses.dataclass(frozen=True)
class FriendStats:
    """A snapshot of friendsock's counters (see :func:`friendsock.stats`).

    ``links_made``: friend links ever paired; ``links_alive``: links with at
    least one end still open; ``bytes_moved``: payload bytes delivered over
    friend links; ``fallbacks``: connections that took real TCP, by reason;
    ``pending``: client connects waiting for their server to accept.
    """

    links_made: int
    links_alive: int
    bytes_moved: int
    fallbacks: Mapping[str, int]
    pending: int


class Shard:
    """One thread's counters. Only that thread writes them, so counting
    needs no lock and loses nothing, however many threads run links; a
    snapshot adds the shards up."""

    __slots__ = ("made", "done", "moved", "fallbacks")

    def __init__(self) -> None:
        self.made = 0  # links established on this thread
        self.done = 0  # links whose last end closed on this thread
        self.moved = 0  # bytes read by ends on this thread
        self.fallbacks: Dict[str, int] = {}


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
            return self._local.shard  # type: ignore[no-any-return]
        except AttributeError:
            shard = self._local.shard = Shard()
            with self._lock:
                self._shards.append(shard)
            return shard

    def fallback(self, reason: Fallback) -> None:
        # Counted by the plain string: FriendStats.fallbacks is looked up by it.
        fallbacks = self.shard().fallbacks
        fallbacks[reason.value] = fallbacks.get(reason.value, 0) + 1

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
        )

    def _reset_after_fork(self) -> None:
        # Another thread may have held the lock at fork(). The parent's
        # links are not alive in the child: it never runs the loops they
        # live on (and never closes them, see the adapters' pid checks).
        self._lock = threading.Lock()
        self.shard().done += self.links_alive


counters = Counters()
if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=counters._reset_after_fork)
