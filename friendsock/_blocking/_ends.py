"""Which blocking sockets are on which link ends right now, and the lock
that keeps that in step with a fork and with a link going on over TCP.

Held to make a readiness descriptor (two threads asking fileno() at once
make one), to turn a socket into a friend socket, and by a fork's move of
links to TCP: each sees the other done or not begun. Read as
``_ends.lock``, never imported by name: a forked child makes a new one
(the parent's was held through the fork).
"""

from __future__ import annotations

import threading
import weakref
from typing import Any

lock = threading.Lock()
# Every friend socket (duplicates too): a fork moves their links to TCP.
friend_sockets: "weakref.WeakSet[Any]" = weakref.WeakSet()
# Ends whose socket's connect() or accept() is finishing (waiting for the
# claim, say): a fork, or a client going on over TCP (pyOpenSSL's,
# detach()), moves their links too, and the connect or accept returns TCP.
connecting: "weakref.WeakValueDictionary[Any, Any]" = weakref.WeakValueDictionary()


def renew_in_child() -> None:
    """In a forked child: a lock of its own (the parent's was held through
    the fork), and no connect or accept finishing (their threads are the
    parent's)."""
    global lock
    lock = threading.Lock()
    connecting.clear()
