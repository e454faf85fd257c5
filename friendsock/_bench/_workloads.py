"""What every asyncio workload shares: its life, where its server runs, the
server side's tally, opening many connections at once, and the verdict on
whether a figure came from friend links.

The workloads are netperf's TCP_STREAM (``_stream_workloads``), TCP_RR and
its stream-API form (``_rr_workloads``) and TCP_CRR (``_crr_workloads``);
the multi test's N connections and the threads test's server thread are the
same workloads with ``conns`` or a ``LoopThread``. The blocking-socket ones
are in ``_blocking_workloads``, the idle ones in ``_memory``, trio's in
``_trio_workloads``.

Every workload has the same life: ``setup()`` once (server and connections),
``measure()`` once per round, ``close()`` at the end. The runner interleaves
the rounds of the three transports, so a workload must stop cleanly between
rounds: no bytes in flight, no request outstanding.

Payloads are built once and handed over as ``bytes``, the same objects to
every transport, so no transport pays for building them.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import threading
import time
from typing import Any, Awaitable, Callable, Dict, List, Optional, Sequence, Tuple, TypeVar

import friendsock

from ._samples import Sample, links_verdict
from ._transports import Endpoint

T = TypeVar("T")

# Connections opened at once (the server's backlog is larger).
_CONNECT_BATCH = 64
# How long a workload waits for in-flight bytes or closes to settle.
SETTLE_TIMEOUT = 10.0


# -- where the server runs -------------------------------------------------


class SameLoop:
    """The server runs on the client's loop."""

    async def run(self, coro: Awaitable[T]) -> T:
        return await coro


class LoopThread:
    """An event loop of its own in a second thread, for the server side."""

    def __init__(self, new_loop: Callable[[], asyncio.AbstractEventLoop],
                 on_exception: Optional[Callable[[Any, Dict[str, Any]], None]] = None) -> None:
        self._new_loop = new_loop
        self._on_exception = on_exception
        self._ready = threading.Event()
        self.loop: Optional[asyncio.AbstractEventLoop] = None
        self._error: Optional[BaseException] = None
        self._thread = threading.Thread(target=self._main, name="friendsock-bench-server",
                                        daemon=True)
        self._thread.start()
        self._ready.wait()
        if self._error is not None:
            raise self._error

    def _main(self) -> None:
        try:
            loop = self._new_loop()
        except BaseException as exc:  # reported to the starting thread
            self._error = exc
            self._ready.set()
            return
        if self._on_exception is not None:
            loop.set_exception_handler(self._on_exception)
        asyncio.set_event_loop(loop)
        self.loop = loop
        self._ready.set()
        try:
            loop.run_forever()
        finally:
            try:
                tasks = asyncio.all_tasks(loop)
                for task in tasks:
                    task.cancel()
                if tasks:
                    loop.run_until_complete(asyncio.gather(*tasks, return_exceptions=True))
                loop.run_until_complete(loop.shutdown_asyncgens())
            finally:
                loop.close()

    async def run(self, coro: Awaitable[T]) -> T:
        assert self.loop is not None
        future: "concurrent.futures.Future[T]" = asyncio.run_coroutine_threadsafe(coro, self.loop)  # type: ignore[arg-type]
        return await asyncio.wrap_future(future)

    def stop(self, timeout: float = 10.0) -> None:
        loop = self.loop
        if loop is not None and not loop.is_closed():
            try:
                loop.call_soon_threadsafe(loop.stop)
            except RuntimeError:  # closed meanwhile
                pass
        self._thread.join(timeout)


ServerSide = Any  # SameLoop | LoopThread


# -- helpers ---------------------------------------------------------------


async def until(condition: Callable[[], bool], what: str, timeout: float = SETTLE_TIMEOUT) -> None:
    """Poll ``condition``: it may depend on another thread's loop."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    delay = 0.0
    while not condition():
        if loop.time() > deadline:
            raise TimeoutError(f"timed out waiting for {what}")
        await asyncio.sleep(delay)
        delay = min(0.001 if delay == 0 else delay * 2, 0.005)


async def repeat_for(step: Callable[[], Awaitable[None]], seconds: float,
                     warmup: float) -> Tuple[float, int]:
    """Run ``step`` over and over: for ``warmup``, then ``seconds``
    measured, then to the end of the one in progress (its error raised).
    Steps per second in the measured part, and ``stats().bytes_moved`` as
    that part began."""
    state = {"running": True, "done": 0}

    async def steps() -> None:
        while state["running"]:
            await step()
            state["done"] += 1

    task = asyncio.get_running_loop().create_task(steps())
    try:
        await asyncio.sleep(warmup)
        moved = friendsock.stats().bytes_moved
        done, start = state["done"], time.perf_counter()
        await asyncio.wait({task}, timeout=seconds)
        done, elapsed = state["done"] - done, time.perf_counter() - start
    finally:
        state["running"] = False
    await task
    return done / elapsed, moved


async def connect_many(endpoint: Endpoint, factory: Callable[[], asyncio.BaseProtocol],
                       count: int, accepted: Callable[[], int]) -> List[Tuple[asyncio.BaseTransport, Any]]:
    """``count`` connections, a batch at a time; all or none.

    Each batch waits for the server to accept the one before: uvloop's AF_UNIX
    connect returns before the accept and fails with EAGAIN once the backlog
    is full.
    """
    made: List[Tuple[asyncio.BaseTransport, Any]] = []
    try:
        while len(made) < count:
            if made:
                await until(lambda: accepted() >= len(made), "the server to accept")
            batch = min(_CONNECT_BATCH, count - len(made))
            results = await asyncio.gather(*(endpoint.connect(factory) for _ in range(batch)),
                                           return_exceptions=True)
            error = None
            for result in results:
                if isinstance(result, BaseException):
                    error = error or result
                else:
                    made.append(result)
            if error is not None:
                raise error
    except BaseException:
        for transport, _ in made:
            transport.abort()  # type: ignore[attr-defined]
        raise
    return made


async def close_clients(clients: Sequence[Tuple[asyncio.BaseTransport, Any]],
                        closed: Callable[[], bool], abort: bool) -> None:
    """Close (or, after a failure, abort) ``clients`` and wait until
    ``closed()``; after an abort, not long, and a time-out is no error."""
    for transport, _ in clients:
        if abort:
            transport.abort()  # type: ignore[attr-defined]
        else:
            transport.close()
    try:
        if clients:
            await until(closed, "the connections to close",
                        timeout=2.0 if abort else SETTLE_TIMEOUT)
    except TimeoutError:
        if not abort:
            raise


def cross_thread_verdict(client_ends: Sequence[Any], server_ends: Sequence[Any],
                         server_loop: Optional[asyncio.AbstractEventLoop]
                         ) -> Tuple[Optional[bool], Optional[str]]:
    """For the ``threads`` test, on top of :func:`links_verdict`: every end
    is a friend end on its own side's loop (the client's here, the server's
    in the server thread), over a link friendsock made for two threads. A
    friend figure from links within one loop would not be a cross-thread one."""
    client_loop = asyncio.get_running_loop()
    ends = [(end, client_loop) for end in client_ends] + [(end, server_loop) for end in server_ends]
    wrong = 0
    for end, loop in ends:
        link_end = getattr(end, "_end", None)
        if not (friendsock.is_friend(end) and getattr(end, "_loop", None) is loop
                and link_end is not None and link_end.link.threaded):
            wrong += 1
    if server_loop is None or server_loop is client_loop or wrong or not ends:
        return False, (f"friends did not cross threads: {wrong} of {len(ends)} connection ends "
                       "are not friend ends on their own thread's loop")
    return True, None


class Tally:
    """What the server side saw; read from the client's thread (plain ints
    and list appends are safe under the GIL)."""

    __slots__ = ("bytes", "ends", "made", "lost", "friend_ends")

    def __init__(self) -> None:
        self.bytes = 0
        self.ends: List[asyncio.BaseTransport] = []
        # Where the ends are not kept (crr, memory): how many came, and how
        # many of them were friends.
        self.made = 0
        self.friend_ends = 0
        self.lost = 0


# -- the workload's life ---------------------------------------------------



class Responder(asyncio.Protocol):
    """A server protocol that answers each ``size``-byte request with
    ``response``, counting its connections in ``tally`` (rr, crr)."""

    def __init__(self, size: int, response: bytes, tally: Tally) -> None:
        self.size = size
        self.response = response
        self.tally = tally
        self.got = 0
        self.transport: Optional[asyncio.WriteTransport] = None

    def connection_lost(self, exc: Optional[BaseException]) -> None:
        self.tally.lost += 1


class Workload:
    """One transport's part of one table row."""

    def __init__(self, endpoint: Endpoint, size: int, conns: int = 1,
                 server_side: Optional[ServerSide] = None) -> None:
        self.endpoint = endpoint
        self.transport = endpoint.transport
        self.size = size
        self.conns = conns
        self.server_side = server_side or SameLoop()
        self.tally = Tally()
        self.links_ok: Optional[bool] = None
        self.links_note: Optional[str] = None
        self._served = False

    async def serve(self, factory: Callable[[], asyncio.BaseProtocol]) -> None:
        await self.server_side.run(self.endpoint.serve(factory))
        self._served = True

    async def setup(self) -> None:
        raise NotImplementedError

    async def measure(self, seconds: float, warmup: float) -> Sample:
        raise NotImplementedError

    async def close(self, abort: bool = False) -> None:
        """Close connections and server; ``abort`` after a failure: abort the
        connections and do not wait long for them."""
        if self._served:
            self._served = False
            await self.server_side.run(self.endpoint.close())


class ConnectedWorkload(Workload):
    """Workloads over ``conns`` long-lived protocol connections."""

    clients: List[Tuple[asyncio.BaseTransport, Any]]

    async def _connect(self, client_factory: Callable[[], asyncio.BaseProtocol]) -> None:
        before = friendsock.stats()
        self.clients = await connect_many(self.endpoint, client_factory, self.conns,
                                          lambda: len(self.tally.ends))
        await until(lambda: len(self.tally.ends) >= self.conns, "the server to accept")
        ends = [t for t, _ in self.clients] + list(self.tally.ends)
        self.links_ok, self.links_note = links_verdict(self.transport, ends, before)
        if self.links_ok and isinstance(self.server_side, LoopThread):
            # The threads test: the friend figure must come from links
            # across the two threads.
            self.links_ok, self.links_note = cross_thread_verdict(
                [t for t, _ in self.clients], list(self.tally.ends), self.server_side.loop)

    async def close(self, abort: bool = False) -> None:
        clients, self.clients = getattr(self, "clients", []), []
        lost = self.tally.lost
        try:
            await close_clients(clients, lambda: self.tally.lost - lost >= len(clients), abort)
        finally:
            await super().close(abort)
