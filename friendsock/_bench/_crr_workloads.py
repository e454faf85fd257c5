"""TCP_CRR: connect, request, response, close, in transactions/s, a fresh
connection each transaction; and its two protocols, the server end that
answers once and the client end that waits for the answer and the close."""

from __future__ import annotations

import asyncio
from typing import Any, Callable, NamedTuple, Optional

import friendsock

from ._transports import FRIEND_TRANSPORTS
from ._samples import Sample, fallback_delta
from ._workloads import Responder, Workload, repeat_for, until


class CrrServer(Responder):
    """Answers one request, then closes when the client does."""

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]
        # Only the verdict is kept: holding thousands of ends would skew
        # the allocator for the rounds after.
        self.tally.made += 1
        if friendsock.is_friend(transport):
            self.tally.friend_ends += 1

    def data_received(self, data: bytes) -> None:
        before = self.got
        self.got += len(data)
        if before < self.size <= self.got:
            self.transport.write(self.response)  # type: ignore[union-attr]


class CrrClient(asyncio.Protocol):
    def __init__(self, size: int, request: bytes, loop: asyncio.AbstractEventLoop) -> None:
        self.size = size
        self.request = request
        self.got = 0
        self.answered = loop.create_future()
        self.lost = loop.create_future()

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        transport.write(self.request)  # type: ignore[attr-defined]

    def data_received(self, data: bytes) -> None:
        self.got += len(data)
        if self.got >= self.size and not self.answered.done():
            self.answered.set_result(None)

    def connection_lost(self, exc: Optional[BaseException]) -> None:
        if not self.answered.done():
            self.answered.set_exception(ConnectionError(f"connection lost before the response: {exc!r}"))
        if not self.lost.done():
            self.lost.set_result(exc)


class CrrResult(NamedTuple):
    rate: float  # transactions per second in the measured part
    opened: int  # connections, warm-up included
    friends: int  # of them, friend ends at the client


async def run_crr(endpoint: Any, size: int, request: bytes, seconds: float,
                  warmup: float) -> CrrResult:
    """Connect, request, response, close, one after another, for ``warmup``
    then ``seconds`` measured, then to the end of the one in progress (its
    error, if any, is raised)."""
    loop = asyncio.get_running_loop()
    count = {"opened": 0, "friends": 0}
    factory: Callable[[], CrrClient] = lambda: CrrClient(size, request, loop)

    async def transaction() -> None:
        transport, protocol = await endpoint.connect(factory)
        count["opened"] += 1
        count["friends"] += friendsock.is_friend(transport)
        try:
            await protocol.answered
        finally:
            transport.close()
        await protocol.lost

    rate, _ = await repeat_for(transaction, seconds, warmup)
    return CrrResult(rate, count["opened"], count["friends"])


class CRRWorkload(Workload):
    """TCP_CRR: connect, request, response, close; transactions/s."""

    async def setup(self) -> None:
        payload = b"c" * self.size
        await self.serve(lambda: CrrServer(self.size, payload, self.tally))
        self.request = payload

    async def measure(self, seconds: float, warmup: float) -> Sample:
        before = friendsock.stats()
        friend_ends, lost = self.tally.friend_ends, self.tally.lost
        result = await run_crr(self.endpoint, self.size, self.request, seconds, warmup)
        # Server ends close once they see the client's EOF.
        await until(lambda: self.tally.lost >= lost + result.opened, "server ends to close")
        ok: Optional[bool] = None
        note: Optional[str] = None
        if self.transport in FRIEND_TRANSPORTS:
            made = friendsock.stats().links_made - before.links_made
            server_friends = self.tally.friend_ends - friend_ends
            not_friend = result.opened - result.friends
            ok = not_friend == 0 and server_friends == result.opened and made >= result.opened
            if not ok:
                note = (f"friends fell back to TCP: {not_friend} of {result.opened} "
                        f"connections not friends (fallbacks: {fallback_delta(before)})")
        return Sample(result.rate, ok, note)
