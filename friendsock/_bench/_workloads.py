"""The workloads: netperf's TCP_STREAM, TCP_RR, TCP_CRR, and their N-connection,
stream-API and cross-thread variants.

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
import dataclasses
import threading
import time
from typing import Any, Awaitable, Callable, Dict, List, Optional, Sequence, Tuple, TypeVar

import friendsock

from ._transports import FRIEND_TRANSPORTS, Endpoint

T = TypeVar("T")

# A pump writes at most this much (or one write, if larger) before it lets the
# loop run: over TCP the kernel takes megabytes before pausing anyone, and
# hundreds of connections filling theirs in one loop iteration would stretch
# a round far past its length. Also bounds a transport that never pauses.
_MAX_BURST = 256 * 1024
# Connections opened at once (the server's backlog is larger).
_CONNECT_BATCH = 64
# How long a workload waits for in-flight bytes or closes to settle.
_SETTLE_TIMEOUT = 10.0


@dataclasses.dataclass
class Sample:
    """One round's figure for one cell."""

    value: float
    # None: not the friends transport; True: the figure came from friend
    # links; False: it did not (``note`` says why).
    friend_ok: Optional[bool] = None
    note: Optional[str] = None


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


async def until(condition: Callable[[], bool], what: str, timeout: float = _SETTLE_TIMEOUT) -> None:
    """Poll ``condition``: it may depend on another thread's loop."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    delay = 0.0
    while not condition():
        if loop.time() > deadline:
            raise TimeoutError(f"timed out waiting for {what}")
        await asyncio.sleep(delay)
        delay = min(0.001 if delay == 0 else delay * 2, 0.005)


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


def fallback_delta(before: friendsock.FriendStats) -> str:
    """The fallback reasons counted since ``before``, as ``reason=n, ...``."""
    after = friendsock.stats().fallbacks
    parts = [f"{reason}={n - before.fallbacks.get(reason, 0)}"
             for reason, n in sorted(after.items()) if n - before.fallbacks.get(reason, 0) > 0]
    return ", ".join(parts) or "none counted"


def links_verdict(transport: str, ends: Sequence[Any], before: friendsock.FriendStats,
                  connections: Optional[int] = None) -> Tuple[Optional[bool], Optional[str]]:
    """Whether every end in ``ends`` is a friend link end, and friendsock
    counted a new link for each connection (default: ``ends`` holds both
    ends of each)."""
    if transport not in FRIEND_TRANSPORTS:
        return None, None
    if connections is None:
        connections = len(ends) // 2
    friends = sum(1 for end in ends if friendsock.is_friend(end))
    made = friendsock.stats().links_made - before.links_made
    if ends and friends == len(ends) and made >= connections:
        return True, None
    return False, (f"friends fell back to TCP: {len(ends) - friends} of {len(ends)} "
                   f"connection ends are not friends (fallbacks: {fallback_delta(before)})")


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


def moved_verdict(links_ok: Optional[bool], note: Optional[str],
                  moved_before: int) -> Tuple[Optional[bool], Optional[str]]:
    """Links that paired must also have carried the round's bytes."""
    if links_ok and friendsock.stats().bytes_moved == moved_before:
        return False, "no bytes moved over friend links during the round"
    return links_ok, note


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


# -- protocols -------------------------------------------------------------


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


class Echo(asyncio.Protocol):
    """Server of request/response: a whole response per whole request."""

    def __init__(self, size: int, response: bytes, tally: Tally) -> None:
        self.size = size
        self.response = response
        self.tally = tally
        self.got = 0
        self.transport: Optional[asyncio.WriteTransport] = None

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

    def connection_lost(self, exc: Optional[BaseException]) -> None:
        self.tally.lost += 1


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


class CrrServer(asyncio.Protocol):
    """Answers one request, then closes when the client does."""

    def __init__(self, size: int, response: bytes, tally: Tally) -> None:
        self.size = size
        self.response = response
        self.tally = tally
        self.got = 0
        self.transport: Optional[asyncio.WriteTransport] = None

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

    def connection_lost(self, exc: Optional[BaseException]) -> None:
        self.tally.lost += 1


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


# -- workloads -------------------------------------------------------------


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


class _Connected(Workload):
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
        for transport, _ in clients:
            if abort:
                transport.abort()
            else:
                transport.close()
        try:
            if clients:
                await until(lambda: self.tally.lost >= len(clients), "the connections to close",
                            timeout=2.0 if abort else _SETTLE_TIMEOUT)
        except TimeoutError:
            if not abort:
                raise
        finally:
            await super().close(abort)


class StreamWorkload(_Connected):
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


class RRWorkload(_Connected):
    """TCP_RR: transactions/s, one request outstanding per connection."""

    async def setup(self) -> None:
        loop = asyncio.get_running_loop()
        payload = b"q" * self.size
        await self.serve(lambda: Echo(self.size, payload, self.tally))
        await self._connect(lambda: Requester(self.size, payload, loop))

    async def measure(self, seconds: float, warmup: float) -> Sample:
        requesters: List[Requester] = [p for _, p in self.clients]
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
        ok, note = moved_verdict(self.links_ok, self.links_note, moved)
        return Sample(done / elapsed, ok, note)


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
        state = {"running": True, "done": 0}

        async def client() -> None:
            while state["running"]:
                writer.write(request)
                await writer.drain()
                await reader.readexactly(size)
                state["done"] += 1

        task = asyncio.get_running_loop().create_task(client())
        try:
            await asyncio.sleep(warmup)
            moved = friendsock.stats().bytes_moved
            done, start = state["done"], time.perf_counter()
            await asyncio.wait({task}, timeout=seconds)
            done, elapsed = state["done"] - done, time.perf_counter() - start
        finally:
            state["running"] = False
        await task
        ok, note = moved_verdict(self.links_ok, self.links_note, moved)
        return Sample(done / elapsed, ok, note)

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
                            timeout=2.0 if abort else _SETTLE_TIMEOUT)
                await writer.wait_closed()
            except (ConnectionError, TimeoutError):
                pass
        await super().close(abort)
