"""What a ``fork()`` does to blocking sockets on links: before it, each link
between blocking sockets of this process goes on over TCP (``_over_tcp``),
so parent and child may each use an end; after it, in the child, the
links that stayed are cut off (their friend ends are the parent's).
Registered with the package's one fork hook (``_core._fork``).
"""

from __future__ import annotations

from .._core._fork import Part, on_fork
from . import _ends
from ._over_tcp import link_over_tcp
from ._paired import FriendBlockingSocket, ends_of_sockets

_held_for_fork = False  # by _links_over_tcp_before_fork (a failed one printed its error and let go)


def _links_over_tcp_before_fork() -> None:
    """Before ``fork()``: each link whose two ends are blocking sockets of
    this process (or one a trio socket, which becomes trio's own socket:
    ``LinkEnd.over_tcp``) goes on over TCP, as the kernel's connection it
    rides on, so the child may use either end as its own (a forking
    server's accepted connection) and the parent the other. A link with an
    end on an asyncio or uvloop loop, more than ``OVER_TCP_LIMIT`` bytes
    queued one way, bytes queued behind a FIN its writer's socket already
    sent (a descriptor polled, see ``LinkEnd.fin``), or duplicates
    (dup()) of a socket somebody polls (their one readiness descriptor
    cannot be each one's connection) stays a friend link: the parent's; in
    the child its ends fail (:func:`_cut_off_in_child`). ``_ends.lock`` is
    held through the fork: no socket turns friend, nor gets a readiness
    descriptor, between the move to TCP and the fork."""
    global _held_for_fork
    _ends.lock.acquire()
    try:
        ends = ends_of_sockets()
        for link in {end.link: None for end in ends}:  # each once, in order
            link_over_tcp(link, ends)
    except BaseException:
        _ends.lock.release()
        raise
    _held_for_fork = True


def _forked_parent() -> None:
    global _held_for_fork
    if _held_for_fork:
        _held_for_fork = False
        _ends.lock.release()


def _cut_off_in_child() -> None:
    """In a forked child: the friend sockets still on a link (not moved to
    TCP) have their friend in the parent. Their reads and writes fail
    (ECONNRESET) rather than wait for bytes that cannot come; their
    sleepers' wake-ups are the parent's, not theirs."""
    global _held_for_fork
    _held_for_fork = False
    _ends.renew_in_child()
    for sock in list(_ends.friend_sockets):
        if type(sock) is FriendBlockingSocket:
            sock._end.link.forked_away()
            signals = sock._signals
            signals.readers, signals.writers, signals.ready = [], [], None


on_fork(Part.BLOCKING, before=_links_over_tcp_before_fork, after_in_parent=_forked_parent,
        after_in_child=_cut_off_in_child)
