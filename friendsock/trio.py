"""friendsock on trio: ``open_tcp_stream``, ``open_tcp_listeners`` and
``serve_tcp`` with trio's signatures (plus ``friends=``), pairing with any
friendsock end in this process, asyncio ones on other threads included;
and :func:`install`, after which unchanged trio code (and anyio on trio)
pairs too.

A paired connection is a :class:`FriendStream`, or, for code that connects
or accepts ``trio.socket`` sockets itself, a :class:`FriendTrioSocket`;
anything else is what trio itself would give.
"""

from __future__ import annotations

from ._trio import is_friend
from ._trio._pairing import (
    FriendListener,
    open_tcp_listeners,
    open_tcp_stream,
    serve_tcp,
)
from ._trio._install import install, is_installed, uninstall
from ._trio._socket import FriendTrioSocket
from ._trio._stream import FriendStream


__all__ = [
    "FriendListener",
    "FriendStream",
    "FriendTrioSocket",
    "install",
    "is_friend",
    "is_installed",
    "open_tcp_listeners",
    "open_tcp_stream",
    "serve_tcp",
    "uninstall",
]
