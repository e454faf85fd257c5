"""A socket's ``connect()`` pairs: with a friendsock listener of this
process at the address, the connect is registered first, as every
friendsock client's is, made on the real socket, and (once the kernel's
names agree, and where the listener may be shared, once this process
claims it) the socket becomes a friend socket. Its timeout bounds every
wait.

A non-blocking socket (tornado's, Twisted's, a ``selectors`` loop's) waits
for nothing: its caller's loop runs the accepting side, often on this very
thread. Its connect pairs where it can at once (the listener is this
process's alone and its accept has run through friendsock), then answers
``EINPROGRESS`` as TCP's does, its ``fileno()`` the link's from then on;
otherwise it is TCP, also answering ``EINPROGRESS``.
"""

from __future__ import annotations

import errno
import os
import select
import socket
import threading
import time
from typing import Any, Optional

from .. import _handshake
from .._core._registry import PendingState, registry
from .._core._stats import Fallback, counters
from .._handshake import (ConnectAttempt, Entry, Pending, call_on_claim, confirmed, family_of,
                          numeric_address_infos, users_sockname, RoomWait)
from .._host._payoff import worth_an_offer
from .._host._ports import listener_elsewhere
from . import _ends
from ._across import connect_across, may_cross
from ._capable import CONNECT_UNREPORTED, FriendCapableSocket
from ._descriptor import Descriptor
from ._paired import become_friend
from ._readiness import Readiness

_OWNER = object()  # a blocking client's scheduler: never a listener's, so links are threaded


def _resolve(sock: socket.socket, address: Any) -> Optional[Any]:
    """The numeric address a connect to ``address`` reaches, as the
    accepting side will see it; None when it cannot pair."""
    try:
        host, port = address[0], address[1]
    except (TypeError, IndexError, KeyError):
        return None  # the native connect reports it
    infos = numeric_address_infos(host, port, family_of(sock))
    if infos is None:
        if type(port) is not int or not (registry.has_port(port) or listener_elsewhere(port)):
            return None
        try:
            infos = socket.getaddrinfo(host, port, sock.family, socket.SOCK_STREAM)
        except (OSError, UnicodeError):
            return None
        if not infos:
            return None
    return infos[0][4]


def _deadline(sock: socket.socket) -> Optional[float]:
    timeout = sock.gettimeout()
    return None if timeout is None else time.monotonic() + timeout


def _left(deadline: Optional[float]) -> Optional[float]:
    """Seconds left before ``deadline``; TimeoutError once none are."""
    if deadline is None:
        return None
    left = deadline - time.monotonic()
    if left <= 0:
        raise TimeoutError("timed out")
    return left


def connect_friend(sock: FriendCapableSocket, address: Any) -> bool:
    """``connect()`` of a socket: pair with a friendsock listener of this
    process if ``address`` is one (True: connected, paired or not; a
    non-blocking socket's connect made raises BlockingIOError, EINPROGRESS,
    instead); False, nothing done, when the native connect should take
    over (the fallback counted)."""
    resolved = _resolve(sock, address)
    if resolved is None:
        return False
    if not registry.has_port(resolved[1]):
        reason = Fallback.NO_LISTENER
        if may_cross(sock, resolved):
            if not worth_an_offer(resolved[1]):
                reason = Fallback.SHORT_LIVED
            elif connect_across(sock, resolved, _deadline(sock)):
                return True  # (to another friendsock process: moved off TCP, or not offered)
        counters.fallback(reason, resolved)
        return False
    sockname = users_sockname(sock)
    if sockname is None:
        return False  # closed: the native connect says so
    # A non-blocking socket's link cannot go on over TCP once its event
    # loop polls it (see link_over_tcp): it pairs from connect() on only
    # with a listener whose accept is known to be friendsock's.
    nonblocking = sock.gettimeout() == 0.0
    attempt = ConnectAttempt(resolved, can_go_over_tcp=not nonblocking, source=sockname[0])
    if attempt.entry is None:
        counters.fallback(Fallback.NO_LISTENER, resolved)
        return False
    descriptor = Descriptor(sock)
    attempt.sock = descriptor  # type: ignore[assignment]
    attempt.bind_users_socket(sockname)
    entry = attempt.entry
    if entry is None:  # not an address of ours
        counters.fallback(attempt.fallback, resolved)
        return False
    deadline = _deadline(sock)
    while (err := _start(sock, attempt)) is None:
        if nonblocking:  # the accept queue is full: the kernel's queue takes it
            return False
        _room_made(entry, deadline)
    pending = attempt.pending
    if pending is None:  # the listener just went away: nothing connected yet
        return False
    try:
        if err == errno.EINPROGRESS and nonblocking:
            try:
                if _handshake_done(descriptor):
                    err = 0
            except BaseException:
                attempt.give_up(close=False)
                raise
        if err:
            attempt.give_up(close=False)
            if nonblocking and err == errno.EINPROGRESS:  # TCP's, from here on (an error waits in SO_ERROR)
                raise BlockingIOError(errno.EINPROGRESS, os.strerror(errno.EINPROGRESS))
            if err in (errno.EAGAIN, errno.EINPROGRESS) and deadline is not None:
                raise TimeoutError("timed out")
            raise OSError(err, os.strerror(err))
        _finish_connect(sock, attempt, pending, descriptor, wait=not nonblocking)
    finally:
        _ends.connecting.pop(pending.link.client, None)
        if pending.state is PendingState.WITHDRAWN:
            pending.link.forget_ends()
    if nonblocking:
        if type(sock) is not FriendCapableSocket:  # paired
            sock.__dict__[CONNECT_UNREPORTED] = True
        raise BlockingIOError(errno.EINPROGRESS, os.strerror(errno.EINPROGRESS))
    return True


def _handshake_done(descriptor: Descriptor) -> bool:
    """A non-blocking connect to a listener of ours: its handshake runs in
    the kernel alone, on loopback at once (only a listener whose kernel
    queue is full makes it wait). True once connected; False if it is not
    within the bound, or failed (its error left in SO_ERROR for its user,
    not read here: reading clears it): the connect goes on as TCP's."""
    poller = select.poll()
    poller.register(descriptor.fileno(), select.POLLOUT)
    if not poller.poll(int(_handshake.CONFIRM_TIMEOUT * 1000)):
        return False
    try:
        descriptor.getpeername()
    except OSError:
        return False
    return True


def _start(sock: FriendCapableSocket, attempt: ConnectAttempt) -> Optional[int]:
    """``attempt.start()``; the link it makes is known as ``sock``'s before
    a fork can see it (the server may accept and fork at once)."""
    with _ends.lock:
        err = attempt.start(_OWNER)
        if attempt.pending is not None:
            _ends.connecting[attempt.pending.link.client] = sock
    return err


def _finish_connect(sock: FriendCapableSocket, attempt: ConnectAttempt, pending: Pending,
                    descriptor: Descriptor, wait: bool) -> None:
    """The rest of :func:`connect_friend`, the link made: its client end is
    ``sock``'s to be (a fork meanwhile hands it over with the link).
    ``wait``: for a claim, where the listener may be shared (a non-blocking
    socket pairs only if it was claimed already)."""
    if not attempt.connected():  # named otherwise by the kernel: plain TCP
        counters.fallback(attempt.fallback, attempt.address)
        return
    if not attempt.optimistic:
        try:
            if not (_confirm(pending, descriptor) if wait else confirmed(pending, False)):
                return  # another process accepted it: plain TCP, connected
        except BaseException:
            attempt.give_up(close=False)
            raise
    client = pending.handle
    become_friend(sock, pending.link.client, client.sockname, client.peername, descriptor)


def _room_made(entry: Entry, deadline: Optional[float]) -> None:
    """Wait for the listener's accept queue to have room made: until it
    accepts, goes away, or a while has passed (for room made by an accept
    friendsock did not see); TimeoutError past the socket's timeout."""
    woken = threading.Event()
    wait = RoomWait(entry, woken.set)  # (an event is set from any thread)
    if not wait.begin():
        return
    taken = False
    try:
        left = _left(deadline)
        if not woken.wait(_handshake.ROOM_RECHECK if left is None else min(left, _handshake.ROOM_RECHECK)):
            _left(deadline)
        taken = True
    finally:
        wait.end(taken)


def _confirm(pending: Pending, descriptor: Descriptor) -> bool:
    """A listener other processes may share: pair only once this process
    claims the connect (True). Anything arriving on the real socket means
    another process accepted it; so does silence past the deadline. Waits
    on both descriptors at once: the claim's wake-up is a readiness pair."""
    readiness = Readiness()
    try:
        return _await_claim(pending, descriptor, readiness)
    finally:
        readiness.close()


def _await_claim(pending: Pending, descriptor: Descriptor, readiness: Readiness) -> bool:
    claimed = []

    def on_claim() -> None:  # on any thread
        claimed.append(True)
        readiness.set_readable()

    call_on_claim(pending, on_claim, on_claim)
    real_fd = descriptor.fileno()
    poller = select.poll()
    poller.register(real_fd, select.POLLIN)
    poller.register(readiness.fd, select.POLLIN)
    deadline = time.monotonic() + _handshake.CONFIRM_TIMEOUT
    while not claimed:
        left = deadline - time.monotonic()
        if left <= 0 or any(fd == real_fd for fd, _ in poller.poll(int(left * 1000) + 1)):
            break
    return confirmed(pending, bool(claimed))

