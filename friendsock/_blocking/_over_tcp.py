"""A link between blocking sockets goes on over TCP: what each end had
queued is written to its real connection, then its FIN, and its sockets
become their real ones. A fork does this to every such link (the child
may use either end), as does a socket whose descriptor must carry the
bytes from now on (``detach()``, pyOpenSSL, a listener passed on to an
event loop): ``_paired`` and ``_listen`` decide when; this module does it.
"""

from __future__ import annotations

import select
import socket
import time
from typing import Any, Callable, Dict, Mapping, Optional, Protocol, Sequence, Tuple, cast

from .._core._link import Link, LinkEnd
from .._handshake import SocketRelease
from ._descriptor import Descriptor, _ss
from ._readiness import Signals

# What a direction may hold to go on over TCP: the real connection carried
# nothing yet, so its receive buffer takes this much at once.
OVER_TCP_LIMIT = 64 * 1024
_OVER_TCP_WAIT = 5.0
_DONTWAIT = int(socket.MSG_DONTWAIT)


class SocketOnLink(Protocol):
    """A friend socket, as this module sees it (``FriendBlockingSocket``)."""

    _signals: Signals

    def gettimeout(self) -> Optional[float]:
        """The socket's timeout (0.0: non-blocking)."""

    def _now_tcp(self) -> None:
        """The link went on over TCP: become the real socket."""


def _send_on_tcp(sock: socket.socket, data: bytes, eof: bool) -> None:
    """What an end had queued, then its EOF, onto its real socket (under
    the link's locks: waits for room only within _OVER_TCP_WAIT)."""
    view = memoryview(data)
    deadline = time.monotonic() + _OVER_TCP_WAIT
    poller = None
    while view:
        try:
            view = view[_ss.send(sock, view, _DONTWAIT):]
        except BlockingIOError:
            left = deadline - time.monotonic()
            if left <= 0:
                raise
            if poller is None:  # poll, not select: any descriptor number
                poller = select.poll()
                poller.register(_ss.fileno(sock), select.POLLOUT)
            poller.poll(int(left * 1000) + 1)
    if eof:
        _ss.shutdown(sock, socket.SHUT_WR)




def link_over_tcp(link: Link, ends: Mapping[LinkEnd, Sequence[SocketOnLink]],
                  unaccepted: bool = False) -> bool:
    """``link`` goes on over TCP (:meth:`Link.go_on_over_tcp`) if its ends are
    blocking sockets' (``ends``; its server end not accepted yet, with
    ``unaccepted``), one of them closed already or not, and their sockets
    become their real ones. Under ``_ends.lock``. False: a friend link it
    stays."""
    if link.client is None or link.server is None:  # done: both ends closed
        return False
    sockets = {link.client: ends.get(link.client),
               link.server: [] if unaccepted else ends.get(link.server)}
    closed: Dict[LinkEnd, socket.socket] = {}  # ends closed already: the socket each left
    for end, kept in zip((link.server, link.client), _sockets_closes_left(link)):
        if sockets[end] is None and end.closed and kept is not None:
            sockets[end], closed[end] = [], kept
    # Open ends of another adapter that go on over their real socket (a
    # trio socket's): the socket, and the switch to it.
    others: Dict[LinkEnd, Tuple[Any, Callable[[], None]]] = {}
    for end in (link.server, link.client):
        if sockets[end] is None and not end.closed and end.over_tcp is not None:
            other = end.over_tcp()
            if other is not None:
                sockets[end], others[end] = [], other
    if any(same is None or same and same[0]._signals.ready is not None and
           (len(same) > 1 or same[0].gettimeout() == 0.0)
           for same in sockets.values()):
        # An end elsewhere; one readiness descriptor for duplicates; or a
        # non-blocking socket that was polled: its event loop's epoll
        # registration would lose it (the number would name the
        # connection, but epoll follows the descriptor it was given).
        return False

    def send(end: LinkEnd, data: bytes, eof: bool) -> None:
        same = sockets[end]
        if same:
            _send_on_tcp(cast(socket.socket, same[0]), data, eof)  # (a socket.socket too)
        elif end in closed:  # what it wrote, its EOF, then the close it made
            _send_on_tcp(closed[end], data, eof)
            closed[end].close()
        elif end in others:  # under the link's locks: no write of its overtakes these
            real, switch = others[end]
            _send_on_tcp(real, data, eof)
            switch()

    if not link.go_on_over_tcp(send, OVER_TCP_LIMIT, first=next(iter(others), None)):
        return False
    for same in sockets.values():
        for sock in same:  # type: ignore[union-attr]
            sock._now_tcp()
    return True


def _sockets_closes_left(link: Link) -> Tuple[Optional[socket.socket], Optional[socket.socket]]:
    """The real sockets (server's, client's) that the closes of a link's
    blocking sockets left to it; None for an end still open, or one not a
    blocking socket of this process."""
    release = link.on_done
    pair = release.accepted_and_connected() if isinstance(release, SocketRelease) else None
    if pair is None:
        return None, None
    server, client = (descriptor.kept() if isinstance(descriptor, Descriptor) else None
                      for descriptor in pair)
    return server, client

