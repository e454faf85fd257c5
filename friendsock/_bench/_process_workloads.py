"""The ``processes`` test: the client on the runner's loop, its server in a
second process (``_server_process``), as local services run.

Tables, each with ``tcp``, ``unix`` and ``friends`` (friendsock at both
ends, the connection moved off TCP to a socketpair between the two):

- ``processes-rr``: request/response, one outstanding;
- ``processes-stream``: one-way writes, a fresh connection each round:
  the bytes the server counted (and answered at EOF) over the time from
  the first write to that answer;
- ``processes-agg``: N connections open at once, one request outstanding
  on each, the rate in all (a service's pool of kept connections);
- ``processes-crr``: connect, request, response, close. A friendsock
  client sends connections that end this soon over TCP (their move would
  not pay: ``friendsock._host._payoff``), so its cell is mostly TCP's
  connections, as a user gets them; its note counts them.

The in-process reference is the same run's ``rr``, ``stream`` and ``crr``
tables. A friend figure counts only when every connection moved to the
server's process (``stats().cross_process_peers``).
"""

from __future__ import annotations

import asyncio
import time
from typing import Any, List, Optional, Sequence, Tuple

import friendsock

from ._crr_workloads import run_crr
from ._plan import MULTI_RR_SIZE, Case
from ._rr_workloads import Requester, run_requesters
from ._samples import Sample, fallback_delta
from ._server_process import COUNT, ServerProcess
from ._stream_workloads import Pump
from ._transports import FRIEND_TRANSPORTS
from ._workloads import SETTLE_TIMEOUT, Workload, close_clients

# Connections opened at once.
_CONNECT_BATCH = 64


class AcrossWorkload(Workload):
    """One transport's part of a ``processes`` row: ``service`` of the
    server process, over ``transport``."""

    def __init__(self, server: ServerProcess, transport: str, service: str, size: int,
                 conns: int = 1) -> None:
        super().__init__(server.endpoint(transport, service), size, conns)
        self.server = server

    def verdict(self, transports: Sequence[Any], before: friendsock.FriendStats
                ) -> Tuple[Optional[bool], Optional[str]]:
        """Whether every connection in ``transports`` moved to the server's
        process (None: not the friends transport)."""
        if self.transport not in FRIEND_TRANSPORTS:
            return None, None
        pid = self.server.pid
        moved = (friendsock.stats().cross_process_peers.get(pid, 0)
                 - before.cross_process_peers.get(pid, 0))
        friends = sum(1 for transport in transports if friendsock.is_friend(transport))
        if transports and friends == len(transports) and moved >= len(transports):
            return True, None
        return False, (f"{len(transports) - friends} of {len(transports)} connections stayed "
                       f"on TCP (fallbacks: {fallback_delta(before)})")


class AcrossRRWorkload(AcrossWorkload):
    """``processes-rr`` (one connection) and ``processes-agg`` (``conns``)."""

    clients: List[Tuple[Any, Requester]]

    async def setup(self) -> None:
        loop = asyncio.get_running_loop()
        self.clients = []
        payload = b"q" * self.size
        before = friendsock.stats()
        while len(self.clients) < self.conns:
            batch = min(_CONNECT_BATCH, self.conns - len(self.clients))
            results = await asyncio.gather(
                *(self.endpoint.connect(lambda: Requester(self.size, payload, loop))
                  for _ in range(batch)), return_exceptions=True)
            made = [r for r in results if not isinstance(r, BaseException)]
            self.clients += made
            error = next((r for r in results if isinstance(r, BaseException)), None)
            if error is not None:
                raise error
            # One round trip on each: the server has accepted them all
            # before the next batch (uvloop's AF_UNIX connect returns
            # before the accept, and fails once the backlog is full).
            await self._round_trips(made)
        self.links_ok, self.links_note = self.verdict([t for t, _ in self.clients], before)

    @staticmethod
    async def _round_trips(clients: Sequence[Tuple[Any, Requester]]) -> None:
        for _, requester in clients:
            requester.start()
            requester.stop()
        await asyncio.gather(*(r.idle for _, r in clients if r.idle is not None))

    async def measure(self, seconds: float, warmup: float) -> Sample:
        rate, _ = await run_requesters([r for _, r in self.clients], seconds, warmup)
        return Sample(rate, self.links_ok, self.links_note)

    async def close(self, abort: bool = False) -> None:
        clients, self.clients = getattr(self, "clients", []), []
        await close_clients(clients, lambda: all(r.closed for _, r in clients), abort)


class Counted(Pump):
    """A pump that also reads the sink's answer: the count of what it got."""

    def __init__(self, payload: bytes, loop: asyncio.AbstractEventLoop) -> None:
        super().__init__(payload, loop)
        self.answer = bytearray()
        self.counted: asyncio.Future = loop.create_future()

    def data_received(self, data: bytes) -> None:
        self.answer += data
        if len(self.answer) >= COUNT.size and not self.counted.done():
            self.counted.set_result(COUNT.unpack(self.answer[:COUNT.size])[0])

    def connection_lost(self, exc: Optional[BaseException]) -> None:
        super().connection_lost(exc)
        if not self.counted.done():
            self.counted.set_exception(ConnectionError(f"lost before the count: {exc!r}"))


class AcrossStreamWorkload(AcrossWorkload):
    """``processes-stream``: a connection each round to the sink, which
    counts until EOF; the rate is its count over the time from the first
    write to the count's arrival (the draining included)."""

    async def setup(self) -> None:
        self.payload = b"x" * self.size

    async def measure(self, seconds: float, warmup: float) -> Sample:
        loop = asyncio.get_running_loop()
        before = friendsock.stats()
        transport, pump = await self.endpoint.connect(lambda: Counted(self.payload, loop))
        ok, note = self.verdict([transport], before)
        try:
            start = time.perf_counter()
            pump.start()
            await asyncio.sleep(warmup + seconds)
            pump.stop()
            if pump.closed:
                raise ConnectionError(f"stream connection lost: {pump.lost!r}")
            transport.write_eof()  # type: ignore[attr-defined]
            count = await asyncio.wait_for(pump.counted, SETTLE_TIMEOUT)
            elapsed = time.perf_counter() - start
        finally:
            transport.close()
        if count != pump.sent:
            raise ConnectionError(f"stream: {pump.sent} bytes sent, the server counted {count}")
        return Sample(count * 8 / elapsed / 1e6, ok, note)


class AcrossCRRWorkload(AcrossWorkload):
    """``processes-crr``: connect, request, response, close."""

    async def setup(self) -> None:
        self.request = b"c" * self.size

    async def measure(self, seconds: float, warmup: float) -> Sample:
        before = friendsock.stats()
        result = await run_crr(self.endpoint, self.size, self.request, seconds, warmup)
        ok: Optional[bool] = None
        note: Optional[str] = None
        if self.transport in FRIEND_TRANSPORTS:
            ok = result.friends == result.opened
            if not ok:
                # One text for every round: a cell keeps each distinct note.
                reasons = sorted(set(friendsock.stats().fallbacks.items())
                                 - set(before.fallbacks.items()))
                note = ("not every connection moved; fallbacks: "
                        + (", ".join(reason for reason, _ in reasons) or "none counted")
                        + (" (a connection this short is not moved: the move would not pay)"
                           if any(reason == "short-lived" for reason, _ in reasons) else ""))
        return Sample(result.rate, ok, note)


def make_process_workload(case: Case, param: int, transport: str,
                          server: ServerProcess) -> Workload:
    key = case.key
    if key == "processes-rr":
        return AcrossRRWorkload(server, transport, "echo", size=param)
    if key == "processes-agg":
        return AcrossRRWorkload(server, transport, "echo", size=MULTI_RR_SIZE, conns=param)
    if key == "processes-stream":
        return AcrossStreamWorkload(server, transport, "sink", size=param)
    if key == "processes-crr":
        return AcrossCRRWorkload(server, transport, "echo", size=param)
    raise ValueError(f"unknown case {key!r}")
