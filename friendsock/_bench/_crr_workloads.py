"""TCP_CRR: connect, request, response, close, in transactions/s, a fresh
connection each transaction; and its two protocols, the server end that
answers once and the client end that waits for the answer and the close."""

from __future__ import annotations

import asyncio
import time
from typing import Callable, Optional

import friendsock

from ._transports import FRIEND_TRANSPORTS
from ._samples import Sample, fallback_delta
from ._workloads import Responder, Workload, until


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


class CRRWorkload(Workload):
    """TCP_CRR: connect, request, response, close; transactions/s."""

    async def setup(self) -> None:
        payload = b"c" * self.size
        await self.serve(lambda: CrrServer(self.size, payload, self.tally))
        self.request = payload

    async def measure(self, seconds: float, warmup: float) -> Sample:
        loop = asyncio.get_running_loop()
        state = {"running": True, "done": 0, "not_friend": 0, "opened": 0}
        size, request, endpoint = self.size, self.request, self.endpoint
        factory: Callable[[], CrrClient] = lambda: CrrClient(size, request, loop)

        async def client() -> None:
            while state["running"]:
                transport, protocol = await endpoint.connect(factory)
                state["opened"] += 1
                if not friendsock.is_friend(transport):
                    state["not_friend"] += 1
                try:
                    await protocol.answered
                finally:
                    transport.close()
                await protocol.lost
                state["done"] += 1

        before = friendsock.stats()
        friend_ends, lost = self.tally.friend_ends, self.tally.lost
        task = loop.create_task(client())
        try:
            await asyncio.sleep(warmup)
            done, start = state["done"], time.perf_counter()
            await asyncio.wait({task}, timeout=seconds)
            done, elapsed = state["done"] - done, time.perf_counter() - start
        finally:
            state["running"] = False
        await task  # the transaction in progress, and its error if any
        # Server ends close once they see the client's EOF.
        await until(lambda: self.tally.lost >= lost + state["opened"], "server ends to close")
        ok: Optional[bool] = None
        note: Optional[str] = None
        if self.transport in FRIEND_TRANSPORTS:
            made = friendsock.stats().links_made - before.links_made
            server_friends = self.tally.friend_ends - friend_ends
            ok = (state["not_friend"] == 0 and server_friends == state["opened"]
                  and made >= state["opened"])
            if not ok:
                note = (f"friends fell back to TCP: {state['not_friend']} of {state['opened']} "
                        f"connections not friends (fallbacks: {fallback_delta(before)})")
        return Sample(done / elapsed, ok, note)
