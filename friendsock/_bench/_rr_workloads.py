"""TCP_RR: request/response in transactions/s, one request outstanding per
connection, over one connection (``rr``, ``rr-tls``, ``threads-rr``) or N
at once (``multi-rr``), and the same through StreamReader/StreamWriter
(``streams-rr``); with its two protocols: the echo that answers and the
requester that asks."""

from __future__ import annotations

import asyncio
import time
from typing import Optional, Sequence, Tuple

import friendsock

from ._samples import Sample, links_verdict, moved_verdict
from ._workloads import (
    SETTLE_TIMEOUT, ConnectedWorkload, Responder, Workload, repeat_for, until,
)


class Echo(Responder):
    """Server of request/response: a whole response per whole request."""

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]
        self.tally.ends.append(transport)

    def data_received(self, data: bytes) -> None:
        got = self.got + len(data)
        size = self.size
        while got >= size:
            got -= size
            self.transport.write(self.response)  # type: ignore[union-attr]
        self.got = got


class Requester(asyncio.Protocol):
    """Client of request/response: one request outstanding at a time."""

    def __init__(self, size: int, request: bytes, loop: asyncio.AbstractEventLoop) -> None:
        self.size = size
        self.request = request
        self.loop = loop
        self.transport: Optional[asyncio.WriteTransport] = None
        self.got = 0
        self.done = 0
        self.running = False
        self.idle: Optional[asyncio.Future] = None
        self.lost: Optional[BaseException] = None
        self.closed = False

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]

    def start(self) -> None:
        if self.closed:
            raise ConnectionError(f"request/response connection lost: {self.lost!r}")
        self.running = True
        self.idle = self.loop.create_future()
        self.transport.write(self.request)  # type: ignore[union-attr]

    def stop(self) -> None:
        self.running = False

    def data_received(self, data: bytes) -> None:
        self.got += len(data)
        if self.got >= self.size:
            self.got -= self.size
            self.done += 1
            if self.running:
                self.transport.write(self.request)  # type: ignore[union-attr]
            elif self.idle is not None and not self.idle.done():
                self.idle.set_result(None)

    def connection_lost(self, exc: Optional[BaseException]) -> None:
        self.closed = True
        self.lost = exc
        if self.idle is not None and not self.idle.done():
            self.idle.set_exception(ConnectionError(f"connection lost mid-round: {exc!r}"))


async def run_requesters(requesters: Sequence[Requester], seconds: float,
                         warmup: float) -> Tuple[float, int]:
    """Run ``requesters`` for ``warmup``, then ``seconds`` measured, then
    until none has a request outstanding: round trips per second in all,
    and ``stats().bytes_moved`` as the measured part began."""
    for requester in requesters:
        requester.start()
    try:
        await asyncio.sleep(warmup)
        moved = friendsock.stats().bytes_moved
        done, start = sum(r.done for r in requesters), time.perf_counter()
        await asyncio.sleep(seconds)
        done, elapsed = sum(r.done for r in requesters) - done, time.perf_counter() - start
    finally:
        for requester in requesters:
            requester.stop()
    await asyncio.gather(*(r.idle for r in requesters if r.idle is not None))
    return done / elapsed, moved


class RRWorkload(ConnectedWorkload):
    """TCP_RR: transactions/s, one request outstanding per connection."""

    async def setup(self) -> None:
        loop = asyncio.get_running_loop()
        payload = b"q" * self.size
        await self.serve(lambda: Echo(self.size, payload, self.tally))
        await self._connect(lambda: Requester(self.size, payload, loop))

    async def measure(self, seconds: float, warmup: float) -> Sample:
        rate, moved = await run_requesters([p for _, p in self.clients], seconds, warmup)
        ok, note = moved_verdict(self.links_ok, self.links_note, moved)
        return Sample(rate, ok, note)


class StreamsRRWorkload(Workload):
    """TCP_RR through StreamReader/StreamWriter (open_connection/start_server)."""

    async def setup(self) -> None:
        size = self.size
        payload = b"s" * size
        tally = self.tally

        async def handler(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
            tally.ends.append(writer.transport)
            try:
                while True:
                    await reader.readexactly(size)
                    writer.write(payload)
                    await writer.drain()
            except (asyncio.IncompleteReadError, ConnectionError):
                pass
            finally:
                writer.close()
                tally.lost += 1

        await self.server_side.run(self.endpoint.serve_streams(handler))
        self._served = True
        before = friendsock.stats()
        self.reader, self.writer = await self.endpoint.open()
        self.request = payload
        await until(lambda: len(tally.ends) >= 1, "the server to accept")
        self.links_ok, self.links_note = links_verdict(
            self.transport, [self.writer, tally.ends[0]], before)

    async def measure(self, seconds: float, warmup: float) -> Sample:
        reader, writer, request, size = self.reader, self.writer, self.request, self.size

        async def transaction() -> None:
            writer.write(request)
            await writer.drain()
            await reader.readexactly(size)

        rate, moved = await repeat_for(transaction, seconds, warmup)
        ok, note = moved_verdict(self.links_ok, self.links_note, moved)
        return Sample(rate, ok, note)

    async def close(self, abort: bool = False) -> None:
        writer = getattr(self, "writer", None)
        if writer is not None:
            self.writer = None  # type: ignore[assignment]
            if abort:
                writer.transport.abort()
            else:
                writer.close()
            try:
                await until(lambda: self.tally.lost >= 1, "the server handler to finish",
                            timeout=2.0 if abort else SETTLE_TIMEOUT)
                await writer.wait_closed()
            except (ConnectionError, TimeoutError):
                pass
        await super().close(abort)
