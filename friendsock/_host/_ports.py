"""What the port table says of listeners and connects, as every side of
a rendezvous reads and writes it: a friendsock listener publishes its port
(with the loopback families it serves) and withdraws it; a connect asks
whether another friendsock process serves its destination; an accepting
side finds the connect slot of its client. Memory reads and writes, and
the one system call that tells a stale slot's process is gone."""

from __future__ import annotations

import os
import socket
import weakref
from typing import Any, Optional

from .._handshake._process import current_pid
from . import CONNECTS, LISTENERS, Slot, is_loopback, opened_table, port_table


# A listener slot's loop token field says which loopback families it
# serves, and whether its IPv4 one is 127.0.0.1 alone (not 0.0.0.0): a
# plain server of another process may hold the port on 127.0.0.2.
_SERVES_V4, _SERVES_V6, _V4_IS_127_0_0_1 = 1, 2, 4


def listener_elsewhere(port: Any) -> bool:
    """Whether a friendsock process other than this one serves ``port`` on
    this host (the table's word: a hint, see ``_host._table``)."""
    table = port_table()
    if table is None or not isinstance(port, int) or not 0 < port < 65536:
        return False
    pid = table.pid(LISTENERS, port)
    if not pid or pid == current_pid():
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        table.clear(LISTENERS, port, pid)
        return False
    except OSError:
        pass
    return True


def publish_listener(sock: socket.socket) -> Optional[int]:
    """Tell this host's friendsock processes that we serve ``sock``'s port;
    the port, to withdraw later."""
    table = port_table()
    if table is None:
        return None
    try:
        host, port = sock.getsockname()[:2]
        if sock.family != socket.AF_INET6:
            serves = _SERVES_V4 | (_V4_IS_127_0_0_1 if host == "127.0.0.1" else 0)
        elif host == "::" and not sock.getsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY):
            serves = _SERVES_V4 | _SERVES_V6  # (dual-stack: IPv4 clients too)
        else:
            serves = _SERVES_V6
    except OSError:
        return None
    if host not in ("0.0.0.0", "127.0.0.1", "::", "::1"):
        return None  # (another address, loopback or not: its clients stay on TCP)
    published = table.read(LISTENERS, port)
    if published.pid == current_pid():
        serves = _merged(serves, published.token)  # (its other listener, on the same port)
    table.write(LISTENERS, port, current_pid(), token=serves)
    return port


def _merged(ours: int, theirs: int) -> int:
    """What two listeners of one process on one port serve together: each
    family either serves; IPv4 on 127.0.0.1 alone if every IPv4 one is."""
    exact = all(token & _V4_IS_127_0_0_1 for token in (ours, theirs) if token & _SERVES_V4)
    both = (ours | theirs) & ~_V4_IS_127_0_0_1
    return both | (_V4_IS_127_0_0_1 if exact and both & _SERVES_V4 else 0)


# Where a listener's owner (the socket, or the object wrapping it) keeps the
# port it published, with the finalizer that withdraws it.
PUBLISHED = "_friendsock_published"


def keep_published(owner: Any, sock: socket.socket) -> Optional[int]:
    """The port of ``sock`` (the listening socket of ``owner``: itself, or
    what wraps it) published, on the first call, and again if the table
    lost it since; withdrawn by :func:`stop_publishing`, or as ``owner`` is
    collected. None if it cannot be."""
    published = owner.__dict__.get(PUBLISHED)
    if published is not None:
        republish_if_cleared(sock, published[0])
        return published[0]
    port = publish_listener(sock)
    if port is not None:
        owner.__dict__[PUBLISHED] = (port, weakref.finalize(owner, withdraw_listener, port))
    return port


def published_port(owner: Any) -> Optional[int]:
    """The port ``owner`` keeps published (:func:`keep_published`), if any."""
    published = owner.__dict__.get(PUBLISHED)
    return None if published is None else published[0]


def stop_publishing(owner: Any) -> None:
    """Withdraw the port ``owner`` keeps published: its clients must not
    wait for an offer."""
    published = owner.__dict__.pop(PUBLISHED, None)
    if published is not None:
        published[1]()


def republish_if_cleared(sock: socket.socket, port: int) -> None:
    """Publish ``sock`` (served here, its port ``port`` published once) again
    if the table's slot was emptied meanwhile: by a process sharing the
    listener that stopped serving it (withdraw_listener), or found dead by a
    client. Only its clients that connected before then went over TCP."""
    table = port_table()
    if table is not None and not table.read(LISTENERS, port).pid:
        publish_listener(sock)


def serves(host: str, port: int, family: int) -> bool:
    """Whether the listener the table has on ``port`` takes connections of
    ``family`` to ``host`` (a loopback address): a plain server of the
    other family, or on another loopback address, may share the port."""
    table = port_table()
    if table is None:
        return False
    token = table.read(LISTENERS, port).token
    if family == socket.AF_INET6 and not host.startswith("::ffff:"):
        return bool(token & _SERVES_V6)
    host = host.removeprefix("::ffff:")
    return bool(token & _SERVES_V4) and (host == "127.0.0.1" or not token & _V4_IS_127_0_0_1)


def served_elsewhere(host: str, port: Any, family: int) -> bool:
    """Whether a connect of a ``family`` socket to ``host``, ``port`` reaches
    a friendsock listener of another process of this host: a loopback
    address, and the table's word (read first: most ports have none)."""
    return listener_elsewhere(port) and is_loopback(host) and serves(host, port, family)


def withdraw_listener(port: int) -> None:
    """(Also once switched off since: the slot must not outlive the server.)"""
    table = opened_table()
    if table is not None:
        table.clear(LISTENERS, port, current_pid())


def connect_slot(address: Any, listener_port: int) -> Optional[Slot]:
    """For a connection accepted from ``address`` on ``listener_port`` that
    did not pair in this process: the slot of a friendsock process of this
    host waiting for an offer, or None."""
    table = port_table()
    if table is None or not is_loopback(address[0]):
        return None
    slot = table.read(CONNECTS, address[1])
    if slot.pid and slot.port == listener_port and slot.pid != current_pid():
        return slot
    return None
