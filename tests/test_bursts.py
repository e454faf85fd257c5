"""Bursts of connects and the server's life cycle, on both paths and loops.

A friend client never sends on its real socket, so a connection the kernel
dropped from a full accept queue would never reach the server: the client
holds its connect back until the queue has room. These tests make such
bursts, concurrent and sequential, and check every connection completes and
echoes its own bytes; a hang fails them through the bounded waits. A waiting
connect looks again by itself only after a minute here, so a wake-up lost
on the way shows as a failure, not as a slow pass.
"""

from __future__ import annotations

import asyncio
import functools
import socket
import sys

import pytest

import friendsock
from friendsock import _handshake
from support import LOCALHOST, bounded, port_of


@pytest.fixture(autouse=True)
def no_room_recheck(monkeypatch):
    monkeypatch.setattr(_handshake, "ROOM_RECHECK", 60.0)


def burst_bound(friends: bool) -> float:
    """How long a burst may take: over TCP some connects wait on SYN
    retransmissions (1 s, then 3 s, 7 s, ...); friends must not wait so."""
    return 30 if friends else 90


async def _echo_handler(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    try:
        data = await reader.readexactly(8)
        writer.write(data)
        await writer.drain()
    finally:
        writer.close()


async def _loop_turns_of_a_round_trip() -> None:
    """Let the loop turn as a round trip over a socket pair makes it."""
    loop = asyncio.get_running_loop()
    left, right = socket.socketpair()
    with left, right:
        left.setblocking(False)
        right.setblocking(False)
        await loop.sock_sendall(left, b"x")
        assert await loop.sock_recv(right, 1) == b"x"


async def _echo_once(port: int, number: int, friends: bool) -> bool:
    reader, writer = await friendsock.open_connection(LOCALHOST, port, friends=friends)
    try:
        payload = number.to_bytes(8, "big")
        writer.write(payload)
        assert await reader.readexactly(8) == payload
        assert await reader.read() == b""
        return friendsock.is_friend(writer)
    finally:
        writer.close()
        await writer.wait_closed()


# 100 is asyncio's default backlog. Over real TCP (the reference path here)
# a burst of 2000 into it leaves some connects to SYN retransmissions backing
# off past a minute when the accepting loop is slow (a loaded machine, debug
# mode): TCP gets a backlog that takes the whole burst.
@pytest.mark.parametrize(("count", "backlog"), [(500, 100), (2000, 100)])
@pytest.mark.timeout(120)
async def test_concurrent_connects_all_complete(count, backlog, friends):
    server = await friendsock.start_server(_echo_handler, LOCALHOST, 0, friends=friends,
                                           backlog=backlog if friends else 4096)
    before = friendsock.stats()
    try:
        port = port_of(server)
        paired = await bounded(
            asyncio.gather(*(_echo_once(port, n, friends) for n in range(count))), burst_bound(friends)
        )
    finally:
        server.close()
    assert paired == [friends] * count
    after = friendsock.stats()
    assert after.links_made - before.links_made == (count if friends else 0)
    assert after.pending == 0


@pytest.mark.timeout(120)
async def test_concurrent_connects_from_several_threads(friends):
    """Clients on four threads' loops burst into one listener at once: each
    looks at the accept queue's room and takes it under one lock, so none
    overflows it for another. (Over TCP, a backlog of 100 would leave some
    of these connects to SYN retransmissions backing off past a minute.)"""
    server = await friendsock.start_server(_echo_handler, LOCALHOST, 0, friends=friends,
                                           backlog=100 if friends else 4096)
    before = friendsock.stats()
    new_loop = type(asyncio.get_running_loop())
    port = port_of(server)

    def client_thread(first: int) -> list:
        async def burst() -> list:
            return await asyncio.gather(*(_echo_once(port, n, friends) for n in range(first, first + 500)))

        loop = new_loop()
        try:
            return loop.run_until_complete(asyncio.wait_for(burst(), burst_bound(friends)))
        finally:
            loop.close()

    try:
        paired = await bounded(asyncio.gather(
            *(asyncio.to_thread(client_thread, 500 * k) for k in range(4))), 90)
    finally:
        server.close()
    assert [sum(part) for part in paired] == [500 * friends] * 4
    assert friendsock.stats().links_made - before.links_made == (2000 if friends else 0)


@pytest.mark.timeout(120)
async def test_sequential_held_connects_then_echo(friends):
    """A pool warming up: connections opened one after another and kept,
    far past the listen backlog, then each used."""
    count = 5000
    server = await friendsock.start_server(_echo_handler, LOCALHOST, 0, friends=friends)
    held = []
    try:
        port = port_of(server)

        async def open_all() -> None:
            for _ in range(count):
                held.append(await friendsock.open_connection(LOCALHOST, port, friends=friends))

        await bounded(open_all(), burst_bound(friends))
        assert [friendsock.is_friend(writer) for _, writer in held] == [friends] * count

        async def use(number: int, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
            payload = number.to_bytes(8, "big")
            writer.write(payload)
            assert await reader.readexactly(8) == payload
            assert await reader.read() == b""

        await bounded(asyncio.gather(*(use(n, r, w) for n, (r, w) in enumerate(held))), 60)
    finally:
        for _, writer in held:
            writer.close()
        server.close()
    await bounded(asyncio.gather(*(writer.wait_closed() for _, writer in held)))


async def test_server_close_right_after_connect_keeps_the_connection(friends):
    """Connect, write, close the server at once: as over TCP, the server has
    already accepted, so the connection lives on and its bytes arrive."""
    got = asyncio.get_running_loop().create_future()

    async def handler(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        got.set_result(await reader.readexactly(4))
        writer.write(b"pong")
        writer.close()

    server = await friendsock.start_server(handler, LOCALHOST, 0, friends=friends)
    reader, writer = await friendsock.open_connection(LOCALHOST, port_of(server), friends=friends)
    try:
        assert friendsock.is_friend(writer) is friends
        writer.write(b"ping")
        server.close()
        assert await bounded(got) == b"ping"
        assert await bounded(reader.read()) == b"pong"
    finally:
        writer.close()
    await bounded(writer.wait_closed())
    await bounded(server.wait_closed())


@pytest.mark.parametrize("client_friends", [True, False], ids=["friend-client", "tcp-client"])
async def test_wait_closed_waits_for_open_connections(client_friends, friends):
    """``wait_closed()`` awaited while serving returns once the server is
    closed and every connection it accepted is gone, whatever the client."""
    server_ends = []
    lost = asyncio.get_running_loop().create_future()

    class Echo(asyncio.Protocol):
        def connection_made(self, transport):
            self.transport = transport
            server_ends.append(transport)

        def data_received(self, data):
            self.transport.write(data)

        def connection_lost(self, exc):
            lost.set_result(exc)

    server = await friendsock.create_server(Echo, LOCALHOST, 0, friends=friends)
    reader, writer = await friendsock.open_connection(
        LOCALHOST, port_of(server), friends=friends and client_friends
    )
    try:
        assert friendsock.is_friend(writer) is (friends and client_friends)
        closed = asyncio.ensure_future(server.wait_closed())
        # A round trip takes several turns of the loop: wait_closed() is
        # waiting by then, and one that did not wait would have finished.
        for _ in range(2):
            writer.write(b"still here")
            assert await bounded(reader.readexactly(10)) == b"still here"
            assert not closed.done()
            server.close()
        assert len(server_ends) == 1
    finally:
        writer.close()
    assert await bounded(lost) is None
    await bounded(closed)
    await bounded(writer.wait_closed())


async def test_tcp_nodelay_as_on_the_loops_own_transports(friends):
    server_made = asyncio.get_running_loop().create_future()

    class Made(asyncio.Protocol):
        def connection_made(self, transport):
            server_made.set_result(transport)

    server = await friendsock.create_server(Made, LOCALHOST, 0, friends=friends)
    transport, _ = await friendsock.create_connection(
        asyncio.Protocol, LOCALHOST, port_of(server), friends=friends
    )
    ends = [transport]
    try:
        ends.append(await bounded(server_made))
        for end in ends:
            assert friendsock.is_friend(end) is friends
            sock = end.get_extra_info("socket")
            assert sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY) != 0
    finally:
        for end in ends:
            end.close()
        server.close()


def test_asyncio_server_attributes_mirrored():
    """Private attributes test helpers read of ``asyncio.Server`` (websockets'
    read ``_ssl_context``) exist on a friendsock server with the same values."""
    async def main() -> None:
        ours = await friendsock.create_server(asyncio.Protocol, LOCALHOST, 0)
        theirs = await asyncio.get_running_loop().create_server(asyncio.Protocol, LOCALHOST, 0)
        try:
            # (3.13's keeps its connections' transports where older ones counted them.)
            connections = "_clients" if sys.version_info >= (3, 13) else "_active_count"
            for name in ("_ssl_context", "_ssl_handshake_timeout", "_ssl_shutdown_timeout",
                         "_backlog", "_protocol_factory", connections, "_serving"):
                assert hasattr(ours, name), name
                # (3.10's keeps no TLS shutdown timeout: it has none.)
                if name != "_protocol_factory" and hasattr(theirs, name):
                    assert getattr(ours, name) == getattr(theirs, name), name
        finally:
            ours.close()
            theirs.close()

    asyncio.run(main())


# -- trio -------------------------------------------------------------------------


# trio's default backlog is the most the kernel takes (somaxconn). Over real
# TCP, 2000 connects at backlog 100 on trio wait on SYN retransmissions for
# 10-20 s: the default is where trio's own users make such bursts.
@pytest.mark.trio
@pytest.mark.parametrize(("count", "backlog"), [(500, 100), (2000, None)])
@pytest.mark.timeout(120)
async def test_trio_concurrent_connects_all_complete(count, backlog, friends):
    import trio

    import friendsock.trio as fst

    async def handler(stream) -> None:
        async with stream:
            data = b""
            while len(data) < 8:
                chunk = await stream.receive_some(8 - len(data))
                assert chunk
                data += chunk
            await stream.send_all(data)

    paired = []

    async def echo_once(port: int, number: int) -> None:
        async with await fst.open_tcp_stream(LOCALHOST, port, friends=friends) as stream:
            payload = number.to_bytes(8, "big")
            await stream.send_all(payload)
            data = b""
            while True:
                chunk = await stream.receive_some()
                if not chunk:
                    break
                data += chunk
            assert data == payload
            paired.append(fst.is_friend(stream))

    before = friendsock.stats()
    with trio.fail_after(burst_bound(friends)):
        async with trio.open_nursery() as nursery:
            listeners = await nursery.start(
                functools.partial(fst.serve_tcp, handler, 0, host=LOCALHOST, backlog=backlog,
                                  friends=friends)
            )
            port = listeners[0].socket.getsockname()[1]
            async with trio.open_nursery() as clients:
                for number in range(count):
                    clients.start_soon(echo_once, port, number)
            nursery.cancel_scope.cancel()
    assert paired == [friends] * count
    assert friendsock.stats().links_made - before.links_made == (count if friends else 0)


@pytest.mark.trio
@pytest.mark.timeout(120)
async def test_trio_sequential_held_connects_then_echo(friends):
    import trio

    import friendsock.trio as fst

    count = 5000

    async def handler(stream) -> None:
        async with stream:
            data = await stream.receive_some(8)
            await stream.send_all(data)

    held = []
    with trio.fail_after(burst_bound(friends)):
        async with trio.open_nursery() as nursery:
            listeners = await nursery.start(
                functools.partial(fst.serve_tcp, handler, 0, host=LOCALHOST, friends=friends)
            )
            port = listeners[0].socket.getsockname()[1]
            try:
                for _ in range(count):
                    held.append(await fst.open_tcp_stream(LOCALHOST, port, friends=friends))
                assert [fst.is_friend(stream) for stream in held] == [friends] * count
                for number, stream in enumerate(held):
                    payload = number.to_bytes(8, "big")
                    await stream.send_all(payload)
                    assert await stream.receive_some(8) == payload
            finally:
                for stream in held:
                    await stream.aclose()
            nursery.cancel_scope.cancel()


@pytest.mark.trio
async def test_trio_a_full_backlog_holds_connects_until_accept(friends):
    """A listener nobody accepts on takes backlog + 1 connects, as the
    kernel does; the next one waits (cancelling it leaves nothing behind)
    and goes through once the listener accepts."""
    import trio
    import trio.testing

    import friendsock.trio as fst

    (listener,) = await fst.open_tcp_listeners(0, host=LOCALHOST, backlog=1, friends=friends)
    port = listener.socket.getsockname()[1]
    streams = []
    before = friendsock.stats()
    try:
        with trio.fail_after(10):
            for _ in range(2):
                streams.append(await fst.open_tcp_stream(LOCALHOST, port, friends=friends))
        with trio.move_on_after(0.3) as waiting:
            streams.append(await fst.open_tcp_stream(LOCALHOST, port, friends=friends))
        assert waiting.cancelled_caught
        assert friendsock.stats().pending == before.pending + 2 * friends
        with trio.fail_after(10):
            accepted = [await listener.accept()]
            streams.append(await fst.open_tcp_stream(LOCALHOST, port, friends=friends))
            accepted += [await listener.accept(), await listener.accept()]
            for number, (client, server) in enumerate(zip(streams, accepted)):
                await client.send_all(b"%d" % number)
                assert await server.receive_some() == b"%d" % number
        assert [fst.is_friend(s) for s in streams + accepted] == [friends] * 6
        assert friendsock.stats().pending == before.pending
    finally:
        for stream in streams + locals().get("accepted", []):
            await stream.aclose()
        await listener.aclose()


@pytest.mark.trio
async def test_trio_listener_closed_under_waiting_connects(friends):
    """Connects waiting for room when the listener closes are refused, and
    the ones in its backlog are reset, as over TCP."""
    import trio
    import trio.testing

    import friendsock.trio as fst

    (listener,) = await fst.open_tcp_listeners(0, host=LOCALHOST, backlog=1, friends=friends)
    port = listener.socket.getsockname()[1]
    queued = [await fst.open_tcp_stream(LOCALHOST, port, friends=friends) for _ in range(2)]
    refused = []

    async def connect() -> None:
        try:
            stream = await fst.open_tcp_stream(LOCALHOST, port, friends=friends)
        except OSError as exc:
            refused.append(exc)
        else:
            await stream.aclose()

    try:
        with trio.fail_after(30):
            async with trio.open_nursery() as nursery:
                for _ in range(5):
                    nursery.start_soon(connect)
                await trio.testing.wait_all_tasks_blocked()
                await listener.aclose()
        # trio's own words for a refused connect, on both paths.
        assert [str(exc) for exc in refused] == [
            f"all attempts to connect to {LOCALHOST}:{port} failed"] * 5
        for stream in queued:
            with trio.fail_after(10), pytest.raises(trio.BrokenResourceError):
                await stream.send_all(b"x" * 65536)
                await stream.receive_some()
        assert friendsock.stats().pending == 0
    finally:
        for stream in queued:
            await stream.aclose()


async def test_wait_closed_with_one_protocol_for_two_connections(friends):
    """A factory that hands the same protocol to every connection: each
    connection still counts in wait_closed() until it is lost."""
    lost = []
    first_lost = asyncio.get_running_loop().create_future()

    class Shared(asyncio.Protocol):
        def connection_made(self, transport):
            transport.write(b"hi")

        def connection_lost(self, exc):
            lost.append(exc)
            if not first_lost.done():
                first_lost.set_result(None)

    shared = Shared()
    server = await friendsock.create_server(lambda: shared, LOCALHOST, 0, friends=friends)
    # Clients that are not friends: the server's native path (on uvloop, the
    # one that follows the protocol).
    ends = [await friendsock.open_connection(LOCALHOST, port_of(server), friends=False)
            for _ in range(2)]
    closed = asyncio.ensure_future(server.wait_closed())
    try:
        for reader, _ in ends:
            assert await bounded(reader.readexactly(2)) == b"hi"
        # wait_closed() waits from before close() (uvloop's, called after,
        # returns at once).
        await asyncio.sleep(0)
        assert not closed.done()
        server.close()
        ends[0][1].close()
        assert await bounded(ends[0][0].read()) == b""
        ends[1][1].write(b"still here")
        await bounded(ends[1][1].drain())
        await bounded(ends[0][1].wait_closed())
        await bounded(first_lost)
        # The other connection still counts: a round trip's turns of the
        # loop pass, and wait_closed() goes on waiting.
        await bounded(_loop_turns_of_a_round_trip())
        assert not closed.done()
    finally:
        for _, writer in ends:
            writer.close()
    await bounded(closed)
    assert lost == [None, None]
