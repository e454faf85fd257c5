"""friendsock: the Linux "TCP friends" loopback bypass in user space, for
asyncio, uvloop, trio, anyio and blocking sockets.

When both ends of a TCP connection live in this process, they pair during the
handshake and move bytes straight between each other's queues; any other peer
gets real TCP on the loop's native transport. This module is the asyncio and
uvloop front door, blocking sockets' (:func:`patch_socket`), and what every
kind of end shares (the switches, :func:`stats`, :func:`links`, capture);
trio's and anyio's is :mod:`friendsock.trio`.
"""

from __future__ import annotations

import sys
from typing import Any, List

from ._asyncio._api import (
    create_connection,
    create_server,
    is_friend as _is_asyncio_friend,
    open_connection,
    start_server,
    start_tls,
)
from ._asyncio._install import install, installed, is_installed, new_event_loop, uninstall
from ._blocking._patch import is_friend_socket as _is_blocking_friend
from ._blocking._patch import is_socket_patched, patch_socket, unpatch_socket
from ._capture import Capture, capture, start_capture, stop_capture
from ._capture import start_from_environment as _capture_from_env
from ._core._live import DirectionInfo, EndInfo, LinkInfo, snapshot as _live_snapshot
from ._core._registry import registry as _registry
from ._core._stats import FriendStats, ListenerStats, counters as _counters
from ._core._switch import (
    is_cross_process,
    is_enabled,
    is_socketless,
    set_cross_process,
    set_enabled,
    set_socketless,
)

__version__ = "0.1.0"


def is_friend(obj: Any) -> bool:
    """Whether ``obj`` is one end of a friend link: an asyncio transport or
    ``StreamWriter`` (TLS over a friend link included, and a connection to
    another process of this host moved off TCP), or a
    ``friendsock.trio`` stream or paired ``trio.socket`` socket, or a
    blocking socket that paired (:func:`patch_socket`)."""
    if _is_asyncio_friend(obj) or _is_blocking_friend(obj):
        return True
    # A trio friend end exists only once the trio adapter was imported
    # (by friendsock.trio, or by a switch that covers trio); asking must
    # not import trio.
    trio_adapter = sys.modules.get("friendsock._trio")
    return trio_adapter is not None and trio_adapter.is_friend(obj)


def links() -> List[LinkInfo]:
    """A snapshot of the live friend links, one :class:`LinkInfo` each, in
    the order they were made: both addresses, each direction's state and
    bytes queued and moved, each end's buffers, paused reading/writing,
    thread and loop, and the link's age (like ``ss -tni`` for friends).
    A connection to another process of this host that moved off TCP is
    listed as this process's end sees it, with ``peer_pid``."""
    return _live_snapshot()


def stats() -> FriendStats:
    """A snapshot of the process-wide counters, in total and per listener
    address (``stats().listeners``)."""
    return _counters.snapshot(pending=_registry.pending_count())


# FRIENDSOCK_PCAP=FILE: every link made from now until exit is captured.
_capture_from_env()

__all__ = [
    "Capture",
    "DirectionInfo",
    "EndInfo",
    "LinkInfo",
    "capture",
    "links",
    "start_capture",
    "stop_capture",
    "FriendStats",
    "ListenerStats",
    "create_connection",
    "create_server",
    "install",
    "installed",
    "is_installed",
    "new_event_loop",
    "uninstall",
    "is_cross_process",
    "is_enabled",
    "is_friend",
    "is_socket_patched",
    "patch_socket",
    "unpatch_socket",
    "open_connection",
    "set_cross_process",
    "set_enabled",
    "set_socketless",
    "is_socketless",
    "start_server",
    "start_tls",
    "stats",
]
