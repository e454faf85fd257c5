"""A loop busy with many links still runs its timers in time.

Each of 512 links carries a 64 B request/response exchange driven from the
protocols' callbacks, never idle; a timer due in 0.2 s on the same loop must
run before 1 s has passed, as it does over TCP (the other path of each test).
A bound, not a timing: over TCP a loop turn at this load takes milliseconds;
a delivery budget that grew with the number of links made one turn take
seconds here.
"""

from __future__ import annotations

import asyncio
import functools
import time
from typing import Any, List, Tuple

import pytest

import friendsock
from support import LOCALHOST, Echoes, bounded, port_of, until
from test_threads import LoopThread

LINKS = 512
SIZE = 64
PAYLOAD = b"r" * SIZE
TIMER = 0.2
BOUND = 1.0


class Requests:
    """The client ends' protocols: each sends the next request as soon as
    the answer to the last is in, until stopped."""

    def __init__(self) -> None:
        self.done = 0  # answers, over all links
        self.answered: List[int] = []  # per link
        self.running = True
        self.lost: List[asyncio.Future] = []

    def __call__(self) -> asyncio.Protocol:
        return _Requester(self, len(self.answered))


class _Requester(asyncio.Protocol):
    def __init__(self, requests: Requests, index: int) -> None:
        self.requests = requests
        self.index = index
        self.got = 0
        requests.answered.append(0)
        lost = asyncio.get_running_loop().create_future()
        requests.lost.append(lost)
        self.lost = lost

    def connection_made(self, transport: Any) -> None:
        self.transport = transport

    def data_received(self, data: bytes) -> None:
        self.got += len(data)
        requests = self.requests
        while self.got >= SIZE:
            self.got -= SIZE
            requests.done += 1
            requests.answered[self.index] += 1
            if requests.running:
                self.transport.write(PAYLOAD)

    def connection_lost(self, exc: Any) -> None:
        self.lost.set_result(exc)


async def connect_busy_links(port: int, friends: bool) -> Tuple[Requests, List[Any]]:
    """LINKS links to ``port``, each exchanging requests from the start."""
    requests = Requests()
    transports = []
    for _ in range(LINKS):
        transport, _ = await friendsock.create_connection(requests, LOCALHOST, port, friends=friends)
        transports.append(transport)
    assert [friendsock.is_friend(t) for t in transports] == [friends] * LINKS
    # All connected first: the connects would take turns with the
    # exchanges already running.
    for transport in transports:
        transport.write(PAYLOAD)
    await until(lambda: min(requests.answered) > 0)  # every link is busy
    return requests, transports


async def close_busy_links(requests: Requests, transports: List[Any]) -> None:
    requests.running = False
    for transport in transports:
        transport.close()
    await bounded(asyncio.gather(*requests.lost))


async def timer_delay() -> float:
    """How long after it was set a timer due in TIMER ran, on this loop."""
    loop = asyncio.get_running_loop()
    ran = loop.create_future()
    started = time.monotonic()
    loop.call_later(TIMER, lambda: ran.set_result(time.monotonic()))
    return await bounded(ran, 60) - started


@pytest.mark.timeout(120)
async def test_a_timer_runs_in_time_beside_512_busy_links(friends):
    echoes = Echoes()
    server = await friendsock.create_server(echoes, LOCALHOST, 0, friends=friends)
    try:
        requests, transports = await connect_busy_links(port_of(server), friends)
        try:
            before = requests.done
            delay = await timer_delay()
            assert requests.done > before  # the links kept busy meanwhile
            assert delay < BOUND
        finally:
            await close_busy_links(requests, transports)
        await echoes.all_lost()
    finally:
        server.close()
        await server.wait_closed()


@pytest.mark.parametrize("kind", ["asyncio", "uvloop"])
@pytest.mark.timeout(120)
async def test_timers_run_in_time_on_both_loops_of_512_busy_links_across_threads(kind, friends):
    """The servers here, their clients on a loop in another thread."""
    other = LoopThread(kind)
    try:
        echoes = Echoes()
        server = await friendsock.create_server(echoes, LOCALHOST, 0, friends=friends)
        try:
            requests, transports = await other.run(connect_busy_links(port_of(server), friends), 60)
            try:
                before = requests.done
                here, there = await asyncio.gather(timer_delay(), other.run(timer_delay(), 60))
                assert requests.done > before
                assert here < BOUND and there < BOUND
            finally:
                await other.run(close_busy_links(requests, transports), 60)
            await echoes.all_lost()
        finally:
            server.close()
            await server.wait_closed()
    finally:
        other.close()
    assert other.errors == []


@pytest.mark.trio
@pytest.mark.timeout(120)
async def test_trio_a_timer_runs_in_time_beside_512_busy_links(friends):
    import trio

    import friendsock.trio as fst

    answered = [0] * LINKS
    running = True

    async def receive_exactly(stream: Any, size: int) -> bool:
        while size:
            data = await stream.receive_some(size)
            if not data:
                return False
            size -= len(data)
        return True

    async def echo(stream: Any) -> None:
        async with stream:
            while await receive_exactly(stream, SIZE):
                await stream.send_all(PAYLOAD)

    async def request(stream: Any, index: int) -> None:
        async with stream:
            while running:
                await stream.send_all(PAYLOAD)
                assert await receive_exactly(stream, SIZE)
                answered[index] += 1
            await stream.send_eof()
            assert not await receive_exactly(stream, 1)

    with trio.fail_after(60):
        async with trio.open_nursery() as nursery:
            listeners = await nursery.start(
                functools.partial(fst.serve_tcp, echo, 0, host=LOCALHOST, friends=friends))
            port = listeners[0].socket.getsockname()[1]
            # All connected first: trio's connects would take turns with
            # the exchanges already running.
            streams = [await fst.open_tcp_stream(LOCALHOST, port, friends=friends) for _ in range(LINKS)]
            assert [fst.is_friend(stream) for stream in streams] == [friends] * LINKS
            async with trio.open_nursery() as clients:
                for index, stream in enumerate(streams):
                    clients.start_soon(request, stream, index)
                while min(answered) == 0:  # every link is busy
                    await trio.sleep(0)
                before = sum(answered)
                started = time.monotonic()
                await trio.sleep(TIMER)
                delay = time.monotonic() - started
                assert sum(answered) > before
                running = False
            nursery.cancel_scope.cancel()
    assert delay < BOUND
