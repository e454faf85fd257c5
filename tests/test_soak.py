"""Soak: many connections at once across two loops, every stream checked;
and connect/close cycles that must leave nothing behind.

Both are bounded (counts, not durations) and use plain protocols, not
streams, to stay fast.
"""

from __future__ import annotations

import asyncio
import gc
import hashlib
import random
import tracemalloc
from typing import List

import pytest
import uvloop

import friendsock
from friendsock._bench._memory import IdleWorkload
from friendsock._bench._transports import Endpoint
from friendsock._core._registry import registry
from test_threads import LoopThread

TIMEOUT = 60
MiB = 1 << 20
LOCALHOST = "127.0.0.1"
_BLOCK = random.Random(20).randbytes(2 * MiB)


def loop_kind() -> str:
    return "uvloop" if isinstance(asyncio.get_running_loop(), uvloop.Loop) else "asyncio"


class Echo(asyncio.Protocol):
    """Echoes; at EOF closes (after the echo is flushed)."""

    def connection_made(self, transport) -> None:
        self.transport = transport

    def data_received(self, data: bytes) -> None:
        self.transport.write(data)

    def eof_received(self):
        return False


class Sender(asyncio.Protocol):
    """Sends ``payload`` in pieces (bytes, bytearray, memoryview), half-closes
    and hashes the echo; ``done`` resolves with (digest of echo, bytes, exc)."""

    def __init__(self, payload: bytes, rng: random.Random) -> None:
        self.payload = payload
        self.rng = rng
        self.hash = hashlib.sha256()
        self.received = 0
        self.done: asyncio.Future = asyncio.get_running_loop().create_future()

    def connection_made(self, transport) -> None:
        view = memoryview(self.payload)
        pos = 0
        while pos < len(view):
            size = self.rng.randint(1, 96 * 1024)
            piece = view[pos:pos + size]
            kind = self.rng.randrange(3)
            transport.write(bytes(piece) if kind == 0 else bytearray(piece) if kind == 1 else piece)
            pos += size
        transport.write_eof()

    def data_received(self, data: bytes) -> None:
        self.hash.update(data)
        self.received += len(data)

    def eof_received(self):
        return False  # close: the echo is complete

    def connection_lost(self, exc) -> None:
        if not self.done.done():
            self.done.set_result((self.hash.digest(), self.received, exc))


def random_size(rng: random.Random) -> int:
    roll = rng.random()
    if roll < 0.05:
        return 0
    if roll < 0.70:
        return rng.randint(1, 4096)
    if roll < 0.95:
        return rng.randint(4096, 64 * 1024)
    return rng.randint(64 * 1024, MiB)


async def run_clients(ports: List[int], count: int, at_once: int, seed: int) -> List[str]:
    """``count`` echo connections over ``ports`` (round robin), at most
    ``at_once`` open together; returns what went wrong (nothing, we hope)."""
    rng = random.Random(seed)
    limit = asyncio.Semaphore(at_once)
    problems: List[str] = []

    async def one(index: int) -> None:
        size = random_size(rng)
        start = rng.randrange(len(_BLOCK) - size + 1)
        payload = _BLOCK[start:start + size]
        expected = hashlib.sha256(payload).digest()
        async with limit:
            transport, sender = await friendsock.create_connection(
                lambda: Sender(payload, random.Random(index)), LOCALHOST, ports[index % len(ports)]
            )
            if not friendsock.is_friend(transport):
                problems.append(f"#{index}: not a friend link")
            digest, received, exc = await asyncio.wait_for(sender.done, TIMEOUT)
        if (digest, received, exc) != (expected, size, None):
            problems.append(f"#{index}: {received}/{size} bytes, exc={exc!r}, digest ok: {digest == expected}")

    await asyncio.gather(*(one(index) for index in range(count)))
    return problems


async def test_soak_two_loops_every_stream_intact():
    """2,000 echo connections, 200 open at once, half from each of two loops
    in two threads (asyncio and uvloop: the test's kind here, the other kind
    there), each to a server on its own or the other loop: same-loop and
    cross-thread links side by side. The SHA-256 of every echo must be that
    of what was sent."""
    other = LoopThread("asyncio" if loop_kind() == "uvloop" else "uvloop")
    before = friendsock.stats()
    try:
        here_server = await friendsock.create_server(Echo, LOCALHOST, 0)
        there_server = await other.run(friendsock.create_server(Echo, LOCALHOST, 0))
        ports = [s.sockets[0].getsockname()[1] for s in (here_server, there_server)]
        try:
            here, there = await asyncio.gather(
                run_clients(ports, 1000, 100, seed=1),
                other.run(run_clients(ports[::-1], 1000, 100, seed=2), timeout=5 * TIMEOUT),
            )
        finally:
            here_server.close()
            await other.call(there_server.close)
        assert here == [] and there == []
        # Each end closes on its own loop; let the last connection_lost run.
        for _ in range(10):
            if friendsock.stats().links_alive == before.links_alive:
                break
            await other.run(asyncio.sleep(0))
            await asyncio.sleep(0)
    finally:
        other.close()
    after = friendsock.stats()
    assert after.links_made - before.links_made == 2000
    assert after.links_alive == before.links_alive
    assert after.pending == registry.pending_count() == 0
    assert dict(after.fallbacks) == dict(before.fallbacks)
    assert other.errors == []


# -- connect/close cycles -----------------------------------------------------------


class Closer(asyncio.Protocol):
    """A client that closes at once; ``lost`` resolves when it is gone."""

    def __init__(self, lost: asyncio.Future) -> None:
        self.lost = lost

    def connection_made(self, transport) -> None:
        transport.close()

    def connection_lost(self, exc) -> None:
        self.lost.set_result(exc)


class Sink(asyncio.Protocol):
    """The server side: reads, closes at EOF; counts itself out when lost."""

    live = 0

    def connection_made(self, transport) -> None:
        Sink.live += 1

    def eof_received(self):
        return False

    def connection_lost(self, exc) -> None:
        Sink.live -= 1


async def cycles(port: int, count: int, at_once: int) -> None:
    loop = asyncio.get_running_loop()

    async def worker(share: int) -> None:
        for _ in range(share):
            lost = loop.create_future()
            await friendsock.create_connection(lambda: Closer(lost), LOCALHOST, port)
            assert await lost is None

    await asyncio.wait_for(
        asyncio.gather(*(worker(count // at_once) for _ in range(at_once))), TIMEOUT
    )
    # The server ends close on their own turn: until the last is gone.
    for _ in range(100):
        if not Sink.live:
            break
        await asyncio.sleep(0)
    assert Sink.live == 0


async def test_connect_close_cycles_leave_nothing_behind():
    """10,000 connect/close cycles (50 at a time): afterwards no live
    link, an empty registry, and memory back where it started (tracemalloc,
    within a small bound: nothing grows per connection)."""
    server = await friendsock.create_server(Sink, LOCALHOST, 0)
    try:
        port = server.sockets[0].getsockname()[1]
        before = friendsock.stats()
        await cycles(port, 1000, 50)  # warm up: first-use allocations, free lists
        gc.collect()
        tracemalloc.start()
        try:
            # From 3.12 on the last gather's finished tasks stay referenced
            # until the next one's: each measure holds one such batch.
            await cycles(port, 50, 50)
            gc.collect()
            start, _ = tracemalloc.get_traced_memory()
            await cycles(port, 10_000, 50)
            gc.collect()
            end, _ = tracemalloc.get_traced_memory()
        finally:
            tracemalloc.stop()
        after = friendsock.stats()
    finally:
        server.close()
    assert after.links_made - before.links_made == 11_050
    assert after.links_alive == before.links_alive
    assert after.pending == registry.pending_count() == 0
    # 10,000 connections: even 4 bytes kept per connection would be 40 kB.
    assert end - start < 32 * 1024, f"grew by {end - start} bytes"


async def heap_per_idle_connection(transport: str, tmpdir: str, count: int = 300) -> float:
    """Python heap per idle connection, both ends, as the benchmark's memory
    test measures it (tracemalloc, after a warm-up)."""
    workload = IdleWorkload(Endpoint(transport, tmpdir), count, heap=True)
    await workload.setup()
    try:
        await workload.warm_up()
        sample = await workload.measure_here()
    finally:
        await workload.close()
    if transport != "tcp":
        assert sample.friend_ok, sample.note
    return sample.value


@pytest.mark.parametrize("transport", ["friends", "socketless"])
async def test_an_idle_link_weighs_no_more_than_an_idle_tcp_connection(transport, tmp_path):
    """Holding many idle connections is one reason to switch friendsock on:
    an idle friend link (socketless too), both ends, takes no more Python
    heap than the loop's own TCP connection."""
    tcp = await heap_per_idle_connection("tcp", str(tmp_path))
    friend = await heap_per_idle_connection(transport, str(tmp_path))
    assert friend <= tcp, f"{transport}: {friend:.0f} bytes per idle connection, TCP {tcp:.0f}"
