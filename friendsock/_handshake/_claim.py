"""The accepting side of pairing: claim an accepted socket's connect by
its own names; confirm, hold and settle connects; and the check of
``FRIENDSOCK_CHECK_PAIRING``."""

from __future__ import annotations

import os
import socket
from typing import Any, Callable, Optional, Tuple

from .._core._addresses import flow_key
from .._core import _link
from .._core._errors import PairingCheckError
from .._core._link import Link, LinkEnd
from .._core._registry import PendingState, registry
from .._core._stats import Fallback, counters
from .._core._switch import _OFF_VALUES
from ._listener import ListenerHandle, Pending
from ._process import SocketRelease, current_pid


def check_link_names(link: Link, writer: LinkEnd) -> None:
    """``FRIENDSOCK_CHECK_PAIRING``: before ``writer`` sends its first byte,
    each real socket under ``link`` that friendsock holds must name the
    connection as the link does (its flow key); else raise
    :class:`PairingCheckError`, which no adapter turns into anything else.
    A link without real sockets (socketless) has only the names it was
    given."""
    release = link.on_done
    if not isinstance(release, SocketRelease) or link.addresses is None:
        return
    expected = flow_key(*link.addresses)
    side = "client" if writer is link.client else "server"
    for sock in (release.first, release.second):
        if sock is None:
            continue
        try:
            names = sock.getsockname(), sock.getpeername()
        except OSError:
            continue  # closed or reset already: nothing named
        if flow_key(*names) != expected:
            raise PairingCheckError(
                f"friend link {link.addresses[0]} -> {link.addresses[1]}: a real socket under it "
                f"is {names[0]} -> {names[1]} (the {side} end's first byte); "
                f"the two ends would not agree")


if os.environ.get("FRIENDSOCK_CHECK_PAIRING", "").strip().lower() not in _OFF_VALUES | {""}:
    _link.first_push_check = check_link_names


def call_on_claim(pending: Pending, here: Callable[[], None], elsewhere: Callable[[], None]) -> None:
    """Have the claim of the confirmed connect ``pending`` call ``here`` when
    the accepting side runs on the caller's scheduler; else ``elsewhere``, on
    the accepting thread (to hand ``here`` over to the caller's)."""
    pending.on_claimed = elsewhere if pending.link.threaded else here
    # Set, then check: the accepting side may have claimed the connect
    # before on_claimed was there to call (while the connect finished).
    if pending.state is PendingState.CLAIMED:
        here()


def confirmed(pending: Pending, claimed: bool) -> bool:
    """Whether a confirmed connect pairs once its wait is over: ``claimed``,
    or claimed after all (too late to withdraw). Otherwise it is withdrawn
    and counted as unconfirmed: its socket goes on as plain TCP. (A wait
    that fails instead: :func:`abandon_connect`.)"""
    if claimed or not registry.withdraw(pending):
        return True
    # Counted even when withdrawn already: a listener closed under it
    # withdraws without counting (see go_tcp for the held connects).
    pending.link.on_done = None  # the socket is plain TCP's now, not the link's
    counters.fallback(Fallback.UNCONFIRMED, pending.listener.endpoint)
    return False


def hold_ended(pending: Pending) -> bool:
    """The accepting end of a HELD connect stopped waiting for the
    connecting end's adoption (it came, bytes or EOF came raw instead, or
    the deadline passed): whether it is a link. Not formed by now, it is
    TCP from here on, counted ``used-raw`` (once, by whichever end withdraws
    it first); formed at the last moment, a link after all."""
    return pending.state is PendingState.CLAIMED or not go_tcp(pending, Fallback.USED_RAW)


def go_tcp(pending: Pending, reason: Optional[Fallback]) -> bool:
    """A connect made or accepted by the loop's sock_* methods goes on as
    TCP, whichever end decides it: withdraw it (counted once, by the end
    that withdraws it first), and wake an accepting end holding it. The sockets stay their users'. False, and
    nothing done, when the link formed first."""
    withdrawn_before = pending.state is PendingState.WITHDRAWN
    if not registry.withdraw(pending):
        return False
    pending.link.on_done = None  # the socket is plain TCP's now, not the link's
    if not withdrawn_before:
        if reason is not None:
            counters.fallback(reason, pending.listener.endpoint)
        settle_held(pending, PendingState.WITHDRAWN)
    return True


def settle_held(pending: Pending, state: PendingState) -> None:
    """Tell an accepting end waiting on a HELD connect (``on_settled``) how
    it ended: CLAIMED or WITHDRAWN."""
    hook = pending.on_settled
    if hook is not None:
        pending.on_settled = None
        hook(state)


def accept_from(listen_sock: socket.socket, handle: ListenerHandle) -> Tuple[socket.socket, Any]:
    """``listen_sock.accept()`` for the listener of ``handle``, without the
    Python wrapper's look-up of the listener's family and type as enums on
    every call (the new socket is blocking, as that wrapper's may be)."""
    fd, address = listen_sock._accept()  # type: ignore[attr-defined]
    return socket.socket(*handle.kind, fd), address


def claim_accepted(conn: socket.socket, address: Any, *, ready: bool = True,
                   hold: bool = False, listener: Optional[ListenerHandle] = None,
                   ) -> Tuple[Optional[Pending], Any]:
    """The pending connect an accepted socket belongs to, claimed (or None),
    and the socket's own address (None when nothing could be pending).
    ``ready`` and ``hold``: see :meth:`Registry.claim`. ``listener``: the
    handle of the listener that accepted it, if known."""
    if not registry.pending_count():
        return None, None
    sockname = listener.accepted_sockname if listener is not None else None
    if sockname is None:
        try:
            sockname = conn.getsockname()
        except OSError:  # already reset by the peer
            return None, None
    key = flow_key(sockname, address)
    pending = registry.claim(key, ready=ready, hold=hold)
    if pending is None:
        misnamed = registry.take_misnamed(key, address)
        if misnamed is not None:
            _landed_misnamed(misnamed)
    return pending, sockname


def _landed_misnamed(pending: Pending) -> None:
    """The connect ``pending`` (withdrawn) reached an accepting side that
    names it otherwise (see :meth:`Registry.take_misnamed`): TCP on both
    ends. Paired from connect() on, its client end may have written into
    the link already and may wait on it: the link is reset, as the kernel
    resets a connection, so the client end fails at once (a reset) rather
    than hang; its real socket closes with the link."""
    counters.fallback(Fallback.NAMES_DIFFER, pending.listener.endpoint)
    link = pending.link
    if link.established:
        link.server.reset()
    else:  # a confirmed connect: its client goes on over TCP when it looks
        link.on_done = None


def adopt_accepted(conn: socket.socket, pending: Pending,
                   keeper: Optional[ListenerHandle] = None) -> None:
    """The accepting side takes over a claimed link: both real sockets are
    released once the link is done; or kept by ``keeper``, the listener,
    if the client end is one whose socket nobody else saw
    (:func:`offer_for_reuse`) and neither socket is handed out meanwhile."""
    # The client's as its release has it: the socket its close left, if it
    # closed first (SocketRelease.keep).
    release = pending.link.on_done
    if isinstance(release, SocketRelease):
        client_sock, client, restores = release.first, release.client, release.restores
    else:
        client_sock, client, restores = pending.handle.sock, None, None
    adopted = pending.link.on_done = SocketRelease(current_pid(), conn, client_sock, keeper, client)
    adopted.restores = restores
    pending.link.establish()


def offer_for_reuse(pending: Pending) -> None:
    """The client end of ``pending`` is on a socket friendsock made, on the
    listener's own scheduler: its connection may be kept once the link is
    done (see :meth:`ListenerHandle.keep`)."""
    release = pending.link.on_done
    if isinstance(release, SocketRelease):
        release.client = pending.link.client


# Listeners whose socket was collected unclosed, to forget at the pairing
# steps' next use: never in the collection itself, which may run on any
# thread, inside any lock of the registry's or a link's (a collection
# triggered while one is held would wait on it for ever).
