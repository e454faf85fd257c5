"""A blocking listener pairs: registered as a friendsock listener when it
listens (``FriendCapableSocket.listen``), its ``accept()`` claims the
connects friendsock clients of this process made, and it stops pairing
when closed or passed on to code that accepts natively (an event loop's).
Once its own ``accept()`` runs, its port is published to this host's
friendsock processes, whose connects it offers to move (``_across``).
"""

from __future__ import annotations

import select
import socket
import time
import weakref
from typing import Any, Optional

from .. import _handshake
from .._core._channel import CHANNEL_TCP
from .._core._registry import PendingState, registry
from .._core._stats import Fallback, counters
from .._handshake import (Entry, Pending, adopt_accepted, claim_accepted, forget_listener,
                          forget_when_collected, hold_ended, register_listener)
from .._host._ports import keep_published, published_port, stop_publishing
from . import _ends
from ._across import accept_across
from ._capable import _ENTRY, FriendCapableSocket, running_asyncio_loop, steps
from ._descriptor import Descriptor, _ss
from ._over_tcp import link_over_tcp
from ._paired import become_friend, ends_of_sockets
from ._readiness import parker, wake


def start_pairing(sock: FriendCapableSocket, shared: bool = False) -> None:
    """``sock`` listens: registered, its accept() pairs from now on.
    ``shared``: other processes may accept from it too."""
    exclusive = not shared
    if exclusive and getattr(socket, "SO_REUSEPORT", None) is not None:
        exclusive = not sock.getsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT)
    # Every blocking listener accepts on a thread of its own: its owner is
    # nobody else's, so every link with it is threaded. A weak proxy: the
    # registry must not keep its user's socket open.
    # Not proven until its accept() runs: its owner may hand it to an event
    # loop that accepts natively first (see ListenerEntry). Where every loop
    # is installed, none does: whoever accepts it (its own thread, a
    # readiness loop such as tornado's or Twisted's, an installed loop
    # taking it over) does so through friendsock, from its listen() on.
    entry = register_listener(weakref.proxy(sock), None, owner=object(), exclusive=exclusive,  # type: ignore[arg-type]
                              proven=steps.every_loop_pairs())
    sock.__dict__[_ENTRY] = entry
    forget_when_collected(sock, entry)


def accepting(sock: FriendCapableSocket) -> None:
    """``sock``'s own accept() runs: its port is published for other
    processes' connects to wait for its offer, on its first accept (its
    owner may hand it to code that accepts natively before, whose clients
    would wait in vain); again if the table lost it since."""
    if _offers_across():
        keep_published(sock, sock)


def _offers_across() -> bool:
    """Whether an accept in this thread may offer to another process, which
    waits for the answer here: not on a thread that runs an asyncio loop,
    whose own connects' offers that loop answers (two such loops offering
    to each other would each wait for the other)."""
    return running_asyncio_loop() is None


def stop_pairing(sock: FriendCapableSocket, passed_on: bool = False) -> None:
    """``sock`` stops pairing: closed, or ``passed_on`` (see
    :func:`listener_passed_on`)."""
    stop_publishing(sock)
    entry = sock.__dict__.pop(_ENTRY, None)
    if entry is None:
        return
    if not passed_on:
        forget_listener(entry)
        return
    listener_passed_on(entry)


def listener_passed_on(entry: Entry) -> None:
    """The listener of ``entry`` goes on in the hands of code that accepts
    natively (an event loop's): connects waiting in its backlog from
    blocking sockets go on over TCP, where the new owner's accept finds
    them (their friend ends elsewhere are reset, as by a closing listener)."""
    with _ends.lock:
        ends = ends_of_sockets()
        forget_listener(entry, lambda link: link_over_tcp(link, ends, unaccepted=True))


def take_listener(sock: socket.socket) -> Optional[Entry]:
    """The entry of ``sock``, a listener of the patched class, taken from it
    for code that goes on accepting through friendsock (an installed loop's
    server, trio's accept under install()): the socket no longer answers
    for it (made non-blocking, it forgets nothing), and the taker moves its
    backlog on (``Registry.move_listener``), forgets it, or passes it on
    (:func:`listener_passed_on`). None for any other socket."""
    if type(sock) is not FriendCapableSocket:
        return None
    entry: Optional[Entry] = sock.__dict__.pop(_ENTRY, None)
    if entry is not None and not registry.is_listening(entry):
        return None  # forgotten: a fork's child (whose registry starts empty), or closed
    return entry


def claim(listener: FriendCapableSocket, sock: FriendCapableSocket, address: Any,
          entry: Optional[Entry]) -> None:
    """Pair ``sock``, which ``listener`` (its registry ``entry``, if
    registered) accepted, if a friendsock client of this process made it;
    offer it to the process that made it if another's (see ``_across``)."""
    descriptor = Descriptor(sock)
    pending = None
    if entry is not None:
        with _ends.lock:  # claimed, and known as sock's, at once (see _ends.connecting)
            pending, sockname = claim_accepted(descriptor, address, hold=True,  # type: ignore[arg-type]
                                               listener=entry.handle)
            if pending is not None:
                _ends.connecting[pending.link.server] = sock
    if pending is None:  # (not this process's: maybe another's, which waits for an offer)
        port = published_port(listener)
        if not (port is not None and _offers_across() and
                accept_across(sock, address, port, listener.gettimeout())):
            if entry is not None:
                counters.fallback(Fallback.PEER_NOT_FRIEND, entry.endpoint)
        return
    try:
        if pending.state is PendingState.HELD and \
                not _hold_for_client(sock, pending, listener.gettimeout()):
            return
        with _ends.lock:
            # Moved to TCP meanwhile (a fork, the client's move to TCP): sock
            # is its connection, and the link nobody's to adopt.
            moved_to_tcp = pending.link.server.incoming.state is CHANNEL_TCP
            if not moved_to_tcp:
                adopt_accepted(descriptor, pending)  # type: ignore[arg-type]
        if not moved_to_tcp:
            become_friend(sock, pending.link.server, sockname, address, descriptor)
    finally:
        _ends.connecting.pop(pending.link.server, None)
    # A blocking client still inside its connect() (between the syscall and
    # becoming a friend socket) becomes one now: once accept() returns, a
    # thread polling it (fileno()) sees the link, not the TCP descriptor.
    client_sock = _ends.connecting.get(pending.link.client)
    if client_sock is not None:
        client = pending.handle
        become_friend(client_sock, pending.link.client, client.sockname, client.peername,
                      client.sock)  # type: ignore[arg-type]
    if pending.on_claimed is not None:
        pending.on_claimed()


def _hold_for_client(sock: FriendCapableSocket, pending: Pending,
                     timeout: Optional[float]) -> bool:
    """The accept of a connect whose socket its user still holds (an event
    loop's ``sock_connect``, as aiohttp's connector makes, until it hands
    the socket to ``create_connection(sock=)``) waits for that adoption, in
    the accepting thread: True once the link forms; False (TCP, with
    whatever arrived still in ``sock``) when TCP bytes or EOF arrive
    instead (the socket is used raw), or after the confirmed mode's
    deadline, or the listener's own ``timeout`` if that is shorter (an
    accept with a timeout returns within it)."""
    me = parker()
    settled = [me]  # the connecting end's settling wakes us (any thread)
    pending.on_settled = lambda state: wake(settled)
    try:
        poller = select.poll()
        fd = _ss.fileno(sock)
        poller.register(fd, select.POLLIN)
        poller.register(me.read_fd, select.POLLIN)
        wait = _handshake.CONFIRM_TIMEOUT
        if timeout is not None:
            wait = min(wait, timeout)
        deadline = time.monotonic() + wait
        # Set, then check: the connecting end may have settled it first.
        while pending.state is PendingState.HELD:
            left = deadline - time.monotonic()
            if left <= 0:
                break
            ready = dict(poller.poll(int(left * 1000) + 1))
            if fd in ready:
                break  # used raw
            if me.read_fd in ready:
                me.take_wakes()
                settled[:] = [me]
    finally:
        pending.on_settled = None
    return hold_ended(pending)

