"""A server in another process whose connections keep ending short (a
connection per request) is connected over TCP: moving each would cost
more than it saves (see ``friendsock._host._payoff``). One connect in a
growing number still moves, and one of those that lasts starts the moves
again. On the TCP path (the server process switched off) nothing moves
and nothing is counted as short-lived. Each client kind decides in its
own connect: asyncio's, a blocking socket's, ``friendsock.trio``'s.
"""

from __future__ import annotations

import asyncio
import socket
from typing import Callable

import pytest

import friendsock
from friendsock._handshake._tcp_info import payload_moved
from friendsock._host._payoff import (
    PAYING_BYTES,
    PAYING_CALLS,
    SHORT_RUN,
    moved_connection_ended,
    worth_an_offer,
)

from support import bounded
from test_cross_process import _serving, peer_loop, socket_patched  # noqa: F401 (fixtures)

MESSAGE = b"m" * 64


async def _asyncio_exchanges(port: int, rounds: int) -> bool:
    reader, writer = await bounded(friendsock.open_connection("127.0.0.1", port))
    try:
        for _ in range(rounds):
            writer.write(MESSAGE)
            assert await bounded(reader.readexactly(len(MESSAGE))) == MESSAGE
        return not payload_moved(writer.get_extra_info("socket"))
    finally:
        writer.close()
        await writer.wait_closed()


def _blocking_exchanges(port: int, rounds: int) -> bool:
    with socket.create_connection(("127.0.0.1", port), timeout=20) as sock:
        for _ in range(rounds):
            sock.sendall(MESSAGE)
            got = b""
            while len(got) < len(MESSAGE):
                data = sock.recv(len(MESSAGE) - len(got))
                assert data, "EOF before the echo"
                got += data
        return not payload_moved(sock)


def _trio_exchanges(port: int, rounds: int) -> bool:
    import trio

    import friendsock.trio

    async def exchanges() -> bool:
        stream = await friendsock.trio.open_tcp_stream("127.0.0.1", port)
        async with stream:
            for _ in range(rounds):
                await stream.send_all(MESSAGE)
                got = b""
                with trio.fail_after(20):
                    while len(got) < len(MESSAGE):
                        got += await stream.receive_some(len(MESSAGE) - len(got))
            return not payload_moved(stream.socket)  # type: ignore[arg-type]

    return trio.run(exchanges)


_CLIENTS = {"blocking": _blocking_exchanges, "trio": _trio_exchanges}


@pytest.mark.parametrize("client", ["asyncio", "blocking", "trio"])
@pytest.mark.usefixtures("socket_patched")
async def test_short_connections_go_over_tcp_until_one_pays(path, client):
    peer, port = await _serving("asyncio", path)

    async def connection(rounds: int) -> bool:
        """One connection and ``rounds`` 64 B round trips: moved off TCP?"""
        if client == "asyncio":
            moved = await _asyncio_exchanges(port, rounds)
        else:
            exchanges: Callable[[int, int], bool] = _CLIENTS[client]
            moved = await bounded(asyncio.to_thread(exchanges, port, rounds), 30)
        assert (await peer.report())["payload_moved"] is not moved
        return moved

    def short_lived() -> int:
        return friendsock.stats().fallbacks.get("short-lived", 0)

    friend = path == "friend"
    before = short_lived()
    try:
        # A request each: moved, until SHORT_RUN of them in a row did not pay.
        assert [await connection(1) for _ in range(SHORT_RUN)] == [friend] * SHORT_RUN
        # Then TCP at once, counted as short-lived, but for one in SHORT_RUN.
        assert [await connection(1) for _ in range(SHORT_RUN - 1)] == [False] * (SHORT_RUN - 1)
        assert short_lived() - before == (SHORT_RUN - 1 if friend else 0)
        # That one moves, and lasts (it pays): the next moves again.
        assert await connection(PAYING_CALLS) is friend
        assert await connection(1) is friend
        assert short_lived() - before == (SHORT_RUN - 1 if friend else 0)
    finally:
        await peer.finish()


def _a_free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


@pytest.mark.parametrize("paying", ["calls", "bytes"])
def test_a_connection_pays_by_its_calls_or_by_its_bytes(paying):
    """The rule itself: a run of SHORT_RUN short connections sends the
    connects to that server over TCP, but for one in SHORT_RUN, then one
    in twice as many; one connection that pays (a dozen reads or writes
    at the connecting end, or a megabyte in a single call, as an upload)
    starts over."""
    port = _a_free_port()
    for _ in range(SHORT_RUN - 1):
        moved_connection_ended(port, 1, 128)
    assert worth_an_offer(port)  # (not a run yet)
    moved_connection_ended(port, 1, 128)
    decided = [worth_an_offer(port) for _ in range(3 * SHORT_RUN)]
    assert decided == ([False] * (SHORT_RUN - 1) + [True] + [False] * (2 * SHORT_RUN - 1) + [True])
    calls, moved = (PAYING_CALLS, 128) if paying == "calls" else (1, PAYING_BYTES)
    moved_connection_ended(port, calls, moved)
    assert all(worth_an_offer(port) for _ in range(SHORT_RUN))
