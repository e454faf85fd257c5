"""Shared test pieces: recording protocols and a connected pair on either path."""

from __future__ import annotations

import asyncio
import contextlib
from typing import AsyncIterator, List, Optional, Tuple

import friendsock


class Recorder(asyncio.Protocol):
    """Records every callback in order; ``data`` holds what arrived."""

    def __init__(self, eof_keep_open: bool = False) -> None:
        self.events: List[str] = []
        self.data = bytearray()
        self.transport: Optional[asyncio.Transport] = None
        self.eof_keep_open = eof_keep_open
        self.lost_exc: Optional[BaseException] = None
        loop = asyncio.get_running_loop()
        self.made = loop.create_future()
        self.eof = loop.create_future()
        self.lost = loop.create_future()
        self._waiters: List[Tuple[int, asyncio.Future]] = []

    def connection_made(self, transport) -> None:
        self.events.append("made")
        self.transport = transport
        self.made.set_result(None)

    def data_received(self, data: bytes) -> None:
        assert isinstance(data, bytes)
        if not self.events or self.events[-1] != "data":
            self.events.append("data")
        self.data += data
        self._wake()

    def eof_received(self):
        self.events.append("eof")
        self.eof.set_result(None)
        return self.eof_keep_open

    def connection_lost(self, exc) -> None:
        self.events.append("lost")
        self.lost_exc = exc
        self.lost.set_result(exc)
        self._wake()

    def _wake(self) -> None:
        for size, fut in list(self._waiters):
            if (len(self.data) >= size or self.lost.done()) and not fut.done():
                fut.set_result(None)

    async def wait_bytes(self, size: int) -> bytes:
        """Until at least ``size`` bytes arrived (or the connection ended)."""
        if len(self.data) < size and not self.lost.done():
            fut = asyncio.get_running_loop().create_future()
            self._waiters.append((size, fut))
            await fut
        return bytes(self.data)


@contextlib.asynccontextmanager
async def connected_pair(
    friends: bool,
    server_protocol=None,
    client_protocol=None,
    host: str = "127.0.0.1",
) -> AsyncIterator[Tuple[asyncio.Transport, Recorder, Recorder]]:
    """A server and a client on ``host``; yields (client transport, client
    protocol, server protocol) once both ends saw connection_made."""
    server_protocols: List[asyncio.BaseProtocol] = []
    server_factory = server_protocol or Recorder
    made = asyncio.get_running_loop().create_future()

    def factory():
        protocol = server_factory()
        server_protocols.append(protocol)
        if not made.done():
            made.set_result(protocol)
        return protocol

    server = await friendsock.create_server(factory, host, 0, friends=friends)
    port = server.sockets[0].getsockname()[1]
    try:
        transport, client = await friendsock.create_connection(
            client_protocol or Recorder, host, port, friends=friends
        )
        try:
            server_side = await asyncio.wait_for(made, 10)
            assert friendsock.is_friend(transport) is friends
            yield transport, client, server_side
        finally:
            transport.abort()
            for protocol in server_protocols:
                if getattr(protocol, "transport", None) is not None:
                    protocol.transport.abort()
    finally:
        server.close()
