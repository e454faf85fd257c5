"""The floor: the naive in-memory transport, on asyncio and uvloop.

Two protocols hand each other bytes with ``loop.call_soon(peer.data_received,
data)``: no sockets, no accounting, nothing friendsock's links keep (buffer
sizes, EOF and reset rules, threads). What any in-process transport costs at
least, for friends to be measured against (the benchmark's ``memory``
transport on these loops; on trio it is ``trio.testing.memory_stream_pair``).

The one thing it adds to "naive" is a pause point: a writer that only awaits
``drain()`` would otherwise never yield to the loop.
"""

from __future__ import annotations

import asyncio
from typing import Any, Callable, List, Optional, Tuple

from ._transports import HOST

# Bytes handed over but not yet delivered before the writer pauses (as a
# selector transport's default high-water mark), and resumes.
_HIGH_WATER = 64 * 1024
_LOW_WATER = _HIGH_WATER // 4

ProtocolFactory = Callable[[], asyncio.BaseProtocol]


class FloorTransport(asyncio.Transport):
    """One end of an in-memory pair."""

    def __init__(self, loop: asyncio.AbstractEventLoop, protocol: asyncio.BaseProtocol,
                 sockname: Any, peername: Any) -> None:
        super().__init__({"sockname": sockname, "peername": peername, "socket": None})
        self._loop = loop
        self._protocol = protocol
        self.peer: Optional["FloorTransport"] = None
        self._closing = False
        self._lost = False
        self._in_flight = 0  # written here, not yet delivered there
        self._writing_paused = False
        self._reading = True
        self._held: List[bytes] = []  # arrived while reading was paused

    # -- writing -------------------------------------------------------------
    def write(self, data: Any) -> None:
        if self._closing or not data:
            return
        data = bytes(data)
        self._in_flight += len(data)
        self._loop.call_soon(self.peer._arrive, data)  # type: ignore[union-attr]
        if not self._writing_paused and self._in_flight > _HIGH_WATER:
            self._writing_paused = True
            self._protocol.pause_writing()

    def writelines(self, list_of_data: Any) -> None:
        for data in list_of_data:
            self.write(data)

    def write_eof(self) -> None:
        if not self._closing:
            self._loop.call_soon(self.peer._eof)  # type: ignore[union-attr]

    def can_write_eof(self) -> bool:
        return True

    def get_write_buffer_size(self) -> int:
        return self._in_flight

    def get_write_buffer_limits(self) -> Tuple[int, int]:
        return _LOW_WATER, _HIGH_WATER

    def set_write_buffer_limits(self, high: Optional[int] = None, low: Optional[int] = None) -> None:
        pass

    def _delivered(self, size: int) -> None:
        self._in_flight -= size
        if self._writing_paused and self._in_flight <= _LOW_WATER:
            self._writing_paused = False
            self._protocol.resume_writing()

    # -- reading ---------------------------------------------------------------
    def _arrive(self, data: bytes) -> None:
        self.peer._delivered(len(data))  # type: ignore[union-attr]
        if self._lost:
            return
        if not self._reading:
            self._held.append(data)
            return
        self._protocol.data_received(data)  # type: ignore[attr-defined]

    def _eof(self) -> None:
        if self._lost:
            return
        if not self._protocol.eof_received():  # type: ignore[attr-defined]
            self.close()

    def is_reading(self) -> bool:
        return self._reading and not self._closing

    def pause_reading(self) -> None:
        self._reading = False

    def resume_reading(self) -> None:
        if self._reading:
            return
        self._reading = True
        held, self._held = self._held, []
        for data in held:
            self._loop.call_soon(self._deliver_held, data)

    def _deliver_held(self, data: bytes) -> None:
        if not self._lost:
            self._protocol.data_received(data)  # type: ignore[attr-defined]

    # -- closing ---------------------------------------------------------------
    def is_closing(self) -> bool:
        return self._closing

    def close(self) -> None:
        if self._closing:
            return
        self._closing = True
        peer = self.peer
        if peer is not None and not peer._closing:
            self._loop.call_soon(peer._eof)
        self._loop.call_soon(self._connection_lost)

    def abort(self) -> None:
        self.close()

    def _connection_lost(self) -> None:
        self._lost = True
        self._protocol.connection_lost(None)

    def set_protocol(self, protocol: asyncio.BaseProtocol) -> None:  # type: ignore[override]
        self._protocol = protocol

    def get_protocol(self) -> asyncio.BaseProtocol:  # type: ignore[override]
        return self._protocol


class FloorEndpoint:
    """The benchmark's endpoint interface over in-memory pairs: a "server"
    is a protocol factory; each connect makes a pair, the server end's
    connection_made one loop turn later (as an accept)."""

    transport = "memory"
    friends = False
    port: Optional[int] = None
    server: Any = None

    def __init__(self) -> None:
        self._factory: Optional[ProtocolFactory] = None
        self._ports = iter(range(40000, 1 << 30))

    async def serve(self, factory: ProtocolFactory) -> None:
        self._factory = factory

    async def serve_streams(self, handler: Callable[..., Any]) -> None:
        loop = asyncio.get_running_loop()

        def factory() -> asyncio.BaseProtocol:
            return asyncio.StreamReaderProtocol(asyncio.StreamReader(loop=loop), handler, loop=loop)

        self._factory = factory

    async def connect(self, factory: ProtocolFactory) -> Tuple[asyncio.BaseTransport, Any]:
        assert self._factory is not None, "serve() first"
        loop = asyncio.get_running_loop()
        client_address = (HOST, next(self._ports))
        server_address = (HOST, 1)
        client_protocol = factory()
        server_protocol = self._factory()
        client = FloorTransport(loop, client_protocol, client_address, server_address)
        server = FloorTransport(loop, server_protocol, server_address, client_address)
        client.peer, server.peer = server, client
        loop.call_soon(server_protocol.connection_made, server)
        client_protocol.connection_made(client)
        return client, client_protocol

    async def open(self) -> Tuple[asyncio.StreamReader, asyncio.StreamWriter]:
        loop = asyncio.get_running_loop()
        reader = asyncio.StreamReader(loop=loop)
        protocol = asyncio.StreamReaderProtocol(reader, loop=loop)
        transport, _ = await self.connect(lambda: protocol)
        assert isinstance(transport, FloorTransport)
        return reader, asyncio.StreamWriter(transport, protocol, reader, loop)

    async def close(self) -> None:
        self._factory = None
