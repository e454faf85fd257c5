"""The three transports under test, behind one small interface.

``tcp`` is friendsock with ``friends=False`` (the loop's own TCP transport),
``unix`` is the loop's AF_UNIX transport, ``friends`` is friendsock as a user
gets it. A server may run on another loop (the ``threads`` test): ``serve``
runs on the server's loop, ``connect`` on the client's.
"""

from __future__ import annotations

import asyncio
import itertools
import os
from typing import Any, Callable, Optional, Tuple

import friendsock

TRANSPORTS = ("tcp", "unix", "friends")
LOOPS = ("asyncio", "uvloop")
HOST = "127.0.0.1"
# Large enough that hundreds of concurrent connects never overflow it.
BACKLOG = 1024

ProtocolFactory = Callable[[], asyncio.BaseProtocol]
StreamHandler = Callable[[asyncio.StreamReader, asyncio.StreamWriter], Any]

_socket_names = itertools.count()


class Endpoint:
    """One server of one transport, and how clients reach it."""

    def __init__(self, transport: str, tmpdir: str) -> None:
        if transport not in TRANSPORTS:
            raise ValueError(f"unknown transport {transport!r}")
        self.transport = transport
        self._tmpdir = tmpdir
        self.server: Optional[asyncio.AbstractServer] = None
        self.port: Optional[int] = None
        self.path: Optional[str] = None

    @property
    def friends(self) -> Optional[bool]:
        # None: friendsock decides (it pairs); False: forced real TCP.
        return None if self.transport == "friends" else False

    async def serve(self, factory: ProtocolFactory) -> None:
        """Start a protocol server on the running loop."""
        if self.transport == "unix":
            self.path = self._new_path()
            loop = asyncio.get_running_loop()
            self.server = await loop.create_unix_server(factory, self.path, backlog=BACKLOG)
        else:
            self.server = await friendsock.create_server(
                factory, HOST, 0, friends=self.friends, backlog=BACKLOG
            )
            self.port = self.server.sockets[0].getsockname()[1]

    async def serve_streams(self, handler: StreamHandler) -> None:
        """Start a StreamReader/StreamWriter server on the running loop."""
        if self.transport == "unix":
            self.path = self._new_path()
            self.server = await asyncio.start_unix_server(handler, self.path, backlog=BACKLOG)
        else:
            self.server = await friendsock.start_server(
                handler, HOST, 0, friends=self.friends, backlog=BACKLOG
            )
            self.port = self.server.sockets[0].getsockname()[1]

    async def connect(self, factory: ProtocolFactory) -> Tuple[asyncio.BaseTransport, Any]:
        if self.transport == "unix":
            loop = asyncio.get_running_loop()
            return await loop.create_unix_connection(factory, self.path)
        return await friendsock.create_connection(factory, HOST, self.port, friends=self.friends)

    async def open(self) -> Tuple[asyncio.StreamReader, asyncio.StreamWriter]:
        if self.transport == "unix":
            return await asyncio.open_unix_connection(self.path)
        return await friendsock.open_connection(HOST, self.port, friends=self.friends)

    async def close(self) -> None:
        """Stop listening (on the server's loop). Connections stay up."""
        server, self.server = self.server, None
        if server is not None:
            server.close()
        if self.path is not None:
            # Python 3.11's unix servers leave their socket file behind.
            try:
                os.unlink(self.path)
            except OSError:
                pass

    def _new_path(self) -> str:
        return os.path.join(self._tmpdir, f"s{next(_socket_names)}.sock")


def loop_factory(kind: str) -> Callable[[], asyncio.AbstractEventLoop]:
    """How to make an event loop of ``kind``."""
    if kind == "asyncio":
        # Not asyncio.new_event_loop(): a policy (uvloop.install()) may
        # have changed what that returns.
        return asyncio.SelectorEventLoop
    if kind == "uvloop":
        import uvloop

        return uvloop.new_event_loop
    raise ValueError(f"unknown loop {kind!r}")
