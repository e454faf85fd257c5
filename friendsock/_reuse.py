"""Reused connections: a connect to a friendsock listener of the same
scheduler that finds a connection its listener kept (the TCP connection of
a finished friend link neither of whose sockets was handed out, see
:meth:`ListenerHandle.keep`) makes its link over that one: real sockets,
established, with their own addresses, and no handshake, no new
descriptors, no reset and no port taken from the kernel for it.

Loop-free, as socketless links: the listener's ``socketless_accept`` takes
the server end, as it takes a socketless one.
"""

from __future__ import annotations

from typing import Any, Optional

from ._core._addresses import flow_key
from ._core._link import Link
from ._core._registry import PendingConnect
from ._core._tap import tap_for
from ._handshake import ClientEnd, Entry, Pending, SocketRelease, current_pid


def reused_connect(entry: Entry, address: Any) -> Optional[Pending]:
    """A link to the listener ``entry`` (on the caller's scheduler) over a
    connection it kept whose client connected to ``address``, established,
    its server end handed to the listener's ``socketless_accept``; None
    when it keeps none. The returned connect (registered nowhere) holds
    the client end: its ``handle`` is the client's :class:`ClientEnd`."""
    handle = entry.handle
    accept = handle.socketless_accept
    if accept is None or not handle.kept:
        return None
    kept = handle.take_kept(address)
    if kept is None:
        return None
    sockname, peername = kept.names
    # The sizes its sockets had at the last link's end: nobody changed them.
    link = Link(*kept.sizes, listener=entry.endpoint, addresses=kept.names,
                tap=tap_for(sockname, peername))
    link.sizes_settled = True
    # Kept again once done, unless a socket is handed out meanwhile.
    link.on_done = SocketRelease(current_pid(), kept.server_sock, kept.client_sock, handle, link.client)
    # Neither descriptor is seen unless asked for (see FriendTransport._show_fin).
    link.client.fd_hidden = link.server.fd_hidden = True
    pending: Pending = PendingConnect(flow_key(sockname, peername), link, entry,
                                      ClientEnd(kept.client_sock, sockname, peername))
    link.establish()
    accept(link, kept.server_sock, sockname)
    return pending
