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
    """One end of an in-memory pair. The two ends may run on two loops in two
    threads (the ``threads`` test): what one hands the other then goes by the
    other loop's ``call_soon_threadsafe``, and the byte counts flow control
    needs are each written by one thread only (``_written`` by the writer's,
    ``_acked`` by the reader's)."""

    def __init__(self, loop: asyncio.AbstractEventLoop, protocol: Optional[asyncio.BaseProtocol],
                 sockname: Any, peername: Any) -> None:
        super().__init__({"sockname": sockname, "peername": peername, "socket": None})
        self._loop = loop
        # (None for a server end until its loop makes it: _start.)
        self._protocol: asyncio.BaseProtocol = protocol  # type: ignore[assignment]
        self.peer: Optional["FloorTransport"] = None
        # The peer's loop's call_soon (or call_soon_threadsafe), set at pairing.
        self._to_peer: Callable[..., Any] = loop.call_soon
        self._closing = False
        self._lost = False
        self._written = 0  # bytes written here
        self._acked = 0  # of those, delivered there
        self._writing_paused = False
        self._reading = True
        self._held: List[bytes] = []  # arrived while reading was paused

    def pair(self, peer: "FloorTransport") -> None:
        self.peer = peer
        self._to_peer = (peer._loop.call_soon if peer._loop is self._loop
                         else peer._loop.call_soon_threadsafe)

    def _start(self, factory: ProtocolFactory) -> None:
        """A server end, on its loop: its protocol, and connection_made."""
        self._protocol = factory()
        self._protocol.connection_made(self)

    # -- writing -------------------------------------------------------------
    def write(self, data: Any) -> None:
        if self._closing or not data:
            return
        data = bytes(data)
        self._written += len(data)
        self._to_peer(self.peer._arrive, data)  # type: ignore[union-attr]
        if not self._writing_paused and self._written - self._acked > _HIGH_WATER:
            self._writing_paused = True
            self._protocol.pause_writing()
            # The reader's thread may have taken it all meanwhile, before it
            # could see the pause.
            self._maybe_resume()

    def writelines(self, list_of_data: Any) -> None:
        for data in list_of_data:
            self.write(data)

    def write_eof(self) -> None:
        if not self._closing:
            self._to_peer(self.peer._eof)  # type: ignore[union-attr]

    def can_write_eof(self) -> bool:
        return True

    def get_write_buffer_size(self) -> int:
        return self._written - self._acked

    def get_write_buffer_limits(self) -> Tuple[int, int]:
        return _LOW_WATER, _HIGH_WATER

    def set_write_buffer_limits(self, high: Optional[int] = None, low: Optional[int] = None) -> None:
        pass

    def _maybe_resume(self) -> None:
        if self._writing_paused and self._written - self._acked <= _LOW_WATER:
            self._writing_paused = False
            self._protocol.resume_writing()

    # -- reading ---------------------------------------------------------------
    def _arrive(self, data: bytes) -> None:
        writer = self.peer
        writer._acked += len(data)  # type: ignore[union-attr]
        if writer._writing_paused:  # type: ignore[union-attr]
            if writer._loop is self._loop:  # type: ignore[union-attr]
                writer._maybe_resume()  # type: ignore[union-attr]
            else:
                self._to_peer(writer._maybe_resume)  # type: ignore[union-attr]
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
            self._to_peer(peer._eof)
        self._loop.call_soon(self._connection_lost)

    def abort(self) -> None:
        self.close()

    def _connection_lost(self) -> None:
        self._lost = True
        self._protocol.connection_lost(None)

    def set_protocol(self, protocol: asyncio.BaseProtocol) -> None:
        self._protocol = protocol

    def get_protocol(self) -> asyncio.BaseProtocol:
        return self._protocol


class FloorEndpoint:
    """The benchmark's endpoint interface over in-memory pairs: a "server"
    is a protocol factory, on the loop it was served on; each connect makes
    a pair, the server end's protocol and its connection_made one loop turn
    later (as an accept), on the server's loop."""

    transport = "memory"
    friends = False
    port: Optional[int] = None
    server: Any = None

    def __init__(self) -> None:
        self._factory: Optional[ProtocolFactory] = None
        self._server_loop: Optional[asyncio.AbstractEventLoop] = None
        self._ports = iter(range(40000, 1 << 30))

    async def serve(self, factory: ProtocolFactory) -> None:
        """On the server's loop: the client's, or another thread's."""
        self._factory = factory
        self._server_loop = asyncio.get_running_loop()

    async def serve_streams(self, handler: Callable[..., Any]) -> None:
        loop = asyncio.get_running_loop()

        def factory() -> asyncio.BaseProtocol:
            return asyncio.StreamReaderProtocol(asyncio.StreamReader(loop=loop), handler, loop=loop)

        self._factory = factory
        self._server_loop = loop

    async def connect(self, factory: ProtocolFactory) -> Tuple[asyncio.BaseTransport, Any]:
        assert self._factory is not None and self._server_loop is not None, "serve() first"
        loop = asyncio.get_running_loop()
        client_address = (HOST, next(self._ports))
        server_address = (HOST, 1)
        client_protocol = factory()
        client = FloorTransport(loop, client_protocol, client_address, server_address)
        # The server's protocol is made on its loop, before anything the
        # client writes reaches it.
        server = FloorTransport(self._server_loop, None, server_address, client_address)
        client.pair(server)
        server.pair(client)
        client._to_peer(server._start, self._factory)
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
