"""Process-wide counters and their typed snapshot."""

from __future__ import annotations

import collections
import dataclasses
import types
from typing import Mapping


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


class Counters:
    """Mutable counters, bumped by the adapters on the hot path."""

    __slots__ = ("links_made", "links_alive", "bytes_moved", "fallbacks")

    def __init__(self) -> None:
        self.links_made = 0
        self.links_alive = 0
        self.bytes_moved = 0
        self.fallbacks: collections.Counter[str] = collections.Counter()

    def fallback(self, reason: str) -> None:
        self.fallbacks[reason] += 1

    def snapshot(self, pending: int) -> FriendStats:
        return FriendStats(
            links_made=self.links_made,
            links_alive=self.links_alive,
            bytes_moved=self.bytes_moved,
            fallbacks=types.MappingProxyType(dict(self.fallbacks)),
            pending=pending,
        )


counters = Counters()
