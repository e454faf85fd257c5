"""friendsock: the Linux "TCP friends" loopback bypass for asyncio, in user space.

When both ends of a TCP connection live in this process, they pair during the
handshake and move bytes straight between each other's queues; any other peer
gets real TCP on the loop's native transport.
"""

from __future__ import annotations

import sys
from typing import Any

from ._asyncio._api import (
    create_connection,
    create_server,
    is_friend as _is_asyncio_friend,
    open_connection,
    start_server,
    start_tls,
)
from ._asyncio._install import install, installed, is_installed, new_event_loop, uninstall
from ._core._registry import registry as _registry
from ._core._stats import FriendStats, ListenerStats, counters as _counters
from ._core._switch import is_enabled, set_enabled

__version__ = "0.1.0"


def is_friend(obj: Any) -> bool:
    """Whether ``obj`` is one end of a friend link: an asyncio transport or
    ``StreamWriter`` (TLS over a friend link included), or a
    ``friendsock.trio`` stream or paired ``trio.socket`` socket."""
    if _is_asyncio_friend(obj):
        return True
    # A trio friend end exists only once the trio adapter was imported;
    # asking must not import trio.
    friendsock_trio = sys.modules.get("friendsock.trio")
    return friendsock_trio is not None and friendsock_trio.is_friend(obj)


def stats() -> FriendStats:
    """A snapshot of the process-wide counters, in total and per listener
    address (``stats().listeners``)."""
    return _counters.snapshot(pending=_registry.pending_count())


__all__ = [
    "FriendStats",
    "ListenerStats",
    "create_connection",
    "create_server",
    "install",
    "installed",
    "is_installed",
    "new_event_loop",
    "uninstall",
    "is_enabled",
    "is_friend",
    "open_connection",
    "set_enabled",
    "start_server",
    "start_tls",
    "stats",
]
