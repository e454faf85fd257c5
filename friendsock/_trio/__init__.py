"""The trio adapter: friend streams, listeners and connects on trio."""

from __future__ import annotations

from typing import Any

# First, before any module of the adapter: under FRIENDSOCK_INSTALL (and
# the other process-wide switches) this import installs the adapter's
# patches as trio arrives, and none of its modules is half made then.
import trio


def is_friend(stream: Any) -> bool:
    """Whether ``stream`` (a stream, or a ``trio.socket`` socket, or a
    ``trio.SocketStream`` over one) is one end of a friend link, or of a
    connection moved to another process of this host."""
    from ._across import is_moved_stream
    from ._socket import FriendTrioSocket
    from ._stream import FriendStream

    if isinstance(stream, trio.SocketStream):
        stream = stream.socket
    return isinstance(stream, (FriendStream, FriendTrioSocket)) or is_moved_stream(stream)
