"""friendsock on trio: ``open_tcp_stream``, ``open_tcp_listeners`` and
``serve_tcp`` with trio's signatures (plus ``friends=``), pairing with any
friendsock end in this process, asyncio ones on other threads included.

A paired connection is a :class:`FriendStream`; anything else is the
``trio.SocketStream`` trio itself would give.
"""

from __future__ import annotations

from typing import Any

from ._trio._pairing import (
    FriendListener,
    open_tcp_listeners,
    open_tcp_stream,
    serve_tcp,
)
from ._trio._stream import FriendStream


def is_friend(stream: Any) -> bool:
    """Whether ``stream`` is one end of a friend link."""
    return isinstance(stream, FriendStream)


__all__ = [
    "FriendListener",
    "FriendStream",
    "is_friend",
    "open_tcp_listeners",
    "open_tcp_stream",
    "serve_tcp",
]
