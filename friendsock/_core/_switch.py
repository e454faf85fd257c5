"""The process-wide switch: ``FRIENDSOCK=0`` or ``set_enabled(False)``."""

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
