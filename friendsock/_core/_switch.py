"""The process-wide switches: ``FRIENDSOCK=0`` or ``set_enabled(False)``;
``FRIENDSOCK_SOCKETLESS=1`` or ``set_socketless(True)``."""

from __future__ import annotations

import os

_OFF_VALUES = frozenset({"0", "false", "no", "off"})

_enabled = os.environ.get("FRIENDSOCK", "1").strip().lower() not in _OFF_VALUES


def set_enabled(enabled: bool) -> None:
    """Turn the bypass on or off for every connection made from now on.

    Connections already paired stay friends; nothing switches a working
    stream to another path.
    """
    global _enabled
    _enabled = bool(enabled)


def is_enabled() -> bool:
    """Whether new connections may pair (``FRIENDSOCK=0`` starts it off)."""
    return _enabled


_socketless = os.environ.get("FRIENDSOCK_SOCKETLESS", "0").strip().lower() not in _OFF_VALUES | {""}


def set_socketless(socketless: bool) -> None:
    """Make connects to a friendsock listener of this process socketless
    from now on (no kernel socket: no descriptor, port or handshake), where
    the listener can take them so; off, they use real sockets. Links
    already made stay as they are."""
    global _socketless
    _socketless = bool(socketless)


def is_socketless() -> bool:
    """Whether new connects may be socketless (``FRIENDSOCK_SOCKETLESS=1``
    starts it on)."""
    return _socketless


_cross_process = os.environ.get("FRIENDSOCK_CROSS_PROCESS", "1").strip().lower() not in _OFF_VALUES


def set_cross_process(cross_process: bool) -> None:
    """Let connections to friendsock processes of this host (and this user)
    move off TCP from now on; off, only a connection within this process
    pairs. Connections already moved stay as they are."""
    global _cross_process
    _cross_process = bool(cross_process)


def is_cross_process() -> bool:
    """Whether connections may move off TCP between processes
    (``FRIENDSOCK_CROSS_PROCESS=0`` starts it off)."""
    return _cross_process
