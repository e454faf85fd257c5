"""TCP_STREAM: one-way bulk transfer in Mbit/s, over one connection
(``stream``, ``stream-tls``, ``threads-stream``) or N at once
(``multi-stream``), and its two protocols: the pump that writes and the
sink that counts."""

from __future__ import annotations

import asyncio
import time
from typing import Any, List, Optional

import friendsock

from ._samples import Sample, moved_verdict
from ._workloads import ConnectedWorkload, Tally, until

# A pump writes at most this much (or one write, if larger) before it lets the
# loop run: over TCP the kernel takes megabytes before pausing anyone, and
# hundreds of connections filling theirs in one loop iteration would stretch
# a round far past its length. Also bounds a transport that never pauses.
_MAX_BURST = 256 * 1024


class Sink(asyncio.Protocol):
    """Receiver of a stream: counts bytes."""

    def __init__(self, tally: Tally) -> None:
        self.tally = tally

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.tally.ends.append(transport)

    def data_received(self, data: bytes) -> None:
        self.tally.bytes += len(data)

    def connection_lost(self, exc: Optional[BaseException]) -> None:
        self.tally.lost += 1


class Pump(asyncio.Protocol):
    """Sender of a stream: writes while not paused, resumes on resume_writing."""

    def __init__(self, payload: bytes, loop: asyncio.AbstractEventLoop) -> None:
        self.payload = payload
        self.loop = loop
        self.transport: Optional[asyncio.WriteTransport] = None
        self.sent = 0
        self.running = False
        self.paused = False
        self.scheduled = False
        self.lost: Optional[BaseException] = None
        self.closed = False

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]

    def pause_writing(self) -> None:
        self.paused = True

    def resume_writing(self) -> None:
        self.paused = False
        if self.running and not self.scheduled:
            self._pump()

    def connection_lost(self, exc: Optional[BaseException]) -> None:
        self.closed = True
        self.lost = exc

    def start(self) -> None:
        if self.closed:
            raise ConnectionError(f"stream connection lost: {self.lost!r}")
        self.running = True
        self._schedule()

    def stop(self) -> None:
        self.running = False

    def _schedule(self) -> None:
        if self.running and not self.scheduled:
            self.scheduled = True
            self.loop.call_soon(self._pump)

    def _pump(self) -> None:
        self.scheduled = False
        transport = self.transport
        if transport is None or transport.is_closing():
            return
        write = transport.write
        payload = self.payload
        count = 0
        budget = max(1, _MAX_BURST // len(payload))
        while self.running and not self.paused and count < budget:
            write(payload)
            count += 1
        self.sent += count * len(payload)
        if count == budget and not self.paused:
            self._schedule()  # the rest of the burst, after the loop's turn


class StreamWorkload(ConnectedWorkload):
    """TCP_STREAM: one-way bulk transfer, Mbit/s (aggregate over ``conns``).

    ``per_round``: fresh connections each round, aborted at its end. With
    many connections the bytes in flight (socket buffers, friend queues) take
    seconds to drain; an abort drops them at once, and they must not load the
    next transport's round.
    """

    def __init__(self, *args: Any, per_round: bool = False, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.per_round = per_round

    async def setup(self) -> None:
        self.payload = b"x" * self.size
        await self.serve(lambda: Sink(self.tally))
        if not self.per_round:
            await self._open()

    async def _open(self) -> None:
        loop = asyncio.get_running_loop()
        payload = self.payload
        await self._connect(lambda: Pump(payload, loop))

    async def measure(self, seconds: float, warmup: float) -> Sample:
        if self.per_round:
            self.tally.ends.clear()
            self._lost_before = self.tally.lost
            await self._open()
        try:
            return await self._measure(seconds, warmup)
        finally:
            if self.per_round:
                await self._abort()

    async def _abort(self) -> None:
        clients, self.clients = self.clients, []
        for transport, _ in clients:
            transport.abort()  # type: ignore[attr-defined]
        await until(lambda: self.tally.lost - self._lost_before >= len(clients),
                    "the connections to close")

    async def _measure(self, seconds: float, warmup: float) -> Sample:
        pumps: List[Pump] = [p for _, p in self.clients]
        tally = self.tally
        for pump in pumps:
            pump.start()
        try:
            await asyncio.sleep(warmup)
            moved = friendsock.stats().bytes_moved
            received, start = tally.bytes, time.perf_counter()
            await asyncio.sleep(seconds)
            received, elapsed = tally.bytes - received, time.perf_counter() - start
        finally:
            for pump in pumps:
                pump.stop()
        if not self.per_round:
            # Let the receiver catch up, so this round's bytes do not load
            # the next transport's round.
            await until(lambda: (tally.bytes >= sum(p.sent for p in pumps)
                                 or any(p.closed for p in pumps)), "the receiver to catch up")
        for pump in pumps:
            if pump.closed:
                raise ConnectionError(f"stream connection lost: {pump.lost!r}")
        ok, note = moved_verdict(self.links_ok, self.links_note, moved)
        return Sample(received * 8 / elapsed / 1e6, ok, note)
