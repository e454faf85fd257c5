"""What a benchmark round yields, and the verdicts on whether its figure
came from friend links: loop-free, shared by the asyncio, trio and
blocking workloads."""

from __future__ import annotations

import dataclasses
from typing import Any, Optional, Sequence, Tuple

import friendsock

from ._transports import FRIEND_TRANSPORTS


@dataclasses.dataclass
class Sample:
    """One round's figure for one cell."""

    value: float
    # None: not the friends transport; True: the figure came from friend
    # links; False: it did not (``note`` says why).
    friend_ok: Optional[bool] = None
    note: Optional[str] = None


def fallback_delta(before: friendsock.FriendStats) -> str:
    """The fallback reasons counted since ``before``, as ``reason=n, ...``."""
    after = friendsock.stats().fallbacks
    parts = [f"{reason}={n - before.fallbacks.get(reason, 0)}"
             for reason, n in sorted(after.items()) if n - before.fallbacks.get(reason, 0) > 0]
    return ", ".join(parts) or "none counted"


def links_verdict(transport: str, ends: Sequence[Any], before: friendsock.FriendStats,
                  connections: Optional[int] = None) -> Tuple[Optional[bool], Optional[str]]:
    """Whether every end in ``ends`` is a friend link end, and friendsock
    counted a new link for each connection (default: ``ends`` holds both
    ends of each)."""
    if transport not in FRIEND_TRANSPORTS:
        return None, None
    if connections is None:
        connections = len(ends) // 2
    friends = sum(1 for end in ends if friendsock.is_friend(end))
    made = friendsock.stats().links_made - before.links_made
    if ends and friends == len(ends) and made >= connections:
        return True, None
    return False, (f"friends fell back to TCP: {len(ends) - friends} of {len(ends)} "
                   f"connection ends are not friends (fallbacks: {fallback_delta(before)})")


def moved_verdict(links_ok: Optional[bool], note: Optional[str],
                  moved_before: int) -> Tuple[Optional[bool], Optional[str]]:
    """Links that paired must also have carried the round's bytes."""
    if links_ok and friendsock.stats().bytes_moved == moved_before:
        return False, "no bytes moved over friend links during the round"
    return links_ok, note
