"""friendsock.trio across threads: an asyncio (or uvloop) loop in one thread,
a trio run in another, both through friendsock. Either side may connect;
both pair (friends=False: both take real TCP); bytes arrive whole and in
order (sha256) both ways at once; back pressure holds across the threads;
a loop or run that ends with the link open resets the other side."""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import gc
import hashlib
import random
import socket
import threading
import warnings
from typing import Any, List, Tuple

import pytest
import trio
from trio.testing import wait_all_tasks_blocked

import friendsock
import friendsock.trio as fst
from support import Recorder, chunked
from trio_support import (  # noqa: F401 (nothing_left_behind: an autouse fixture)
    LOCALHOST,
    MiB,
    TIMEOUT,
    AsyncioThread,
    assert_path,
    fallbacks_since,
    listening,
    nothing_left_behind,
    receive_exactly,
    receive_until_eof,
    sockopt,
)


@pytest.fixture(params=["asyncio", "uvloop"])
def aio(request):
    """An asyncio or uvloop loop in a second thread; must report no loop
    errors and leave nothing open when it closes."""
    thread = AsyncioThread(request.param)
    try:
        yield thread
    finally:
        thread.close()
    assert thread.errors == []
    assert thread.leaked == []


def digest(data: bytes) -> bytes:
    return hashlib.sha256(data).digest()


# -- both ends' roles ------------------------------------------------------------------


async def asyncio_peer(reader: asyncio.StreamReader, writer: asyncio.StreamWriter,
                       payload: bytes, seed: int) -> Tuple[bool, bytes]:
    """On the asyncio thread: stream ``payload`` out while reading to EOF.
    Returns (paired?, sha256 of what arrived)."""

    async def send() -> None:
        for chunk in chunked(payload, random.Random(seed), largest=64 * 1024):
            writer.write(chunk)
            await writer.drain()
        writer.write_eof()

    sending = asyncio.ensure_future(send())
    received = await reader.read()
    await sending
    writer.close()
    await writer.wait_closed()
    return friendsock.is_friend(writer), digest(received)


async def trio_peer(stream: trio.abc.HalfCloseableStream, payload: bytes, seed: int) -> bytes:
    """On the trio side: the same; returns the sha256 of what arrived."""

    async def send() -> None:
        for chunk in chunked(payload, random.Random(seed), largest=64 * 1024):
            await stream.send_all(chunk)
        await stream.send_eof()

    async with trio.open_nursery() as nursery:
        nursery.start_soon(send)
        received = await receive_until_eof(stream)
    await stream.aclose()
    return digest(received)


def assert_link_stats(before: friendsock.FriendStats, friends: bool, moved: int) -> None:
    after = friendsock.stats()
    if friends:
        assert after.links_made == before.links_made + 1
        assert fallbacks_since(before) == {}
        assert after.bytes_moved - before.bytes_moved == moved
    else:
        assert after.links_made == before.links_made
        assert fallbacks_since(before) == {"opted-out": 1}
        assert after.bytes_moved == before.bytes_moved
    assert after.pending == 0


# -- pairing and bytes, both directions --------------------------------------------------


@pytest.mark.trio
@pytest.mark.parametrize("connects", ["trio", "asyncio"])
async def test_both_ways_at_once_across_threads(aio, friends, connects):
    """4 MiB each way at the same time; the trio side connects to an asyncio
    server, or an asyncio client connects to a trio listener."""
    rng = random.Random(1)
    up, down = rng.randbytes(4 * MiB), rng.randbytes(4 * MiB)  # up: trio -> asyncio
    before = friendsock.stats()
    with trio.fail_after(3 * TIMEOUT):
        if connects == "trio":
            results = await aio.call(aio.loop.create_future)

            async def handler(reader, writer) -> None:
                try:
                    results.set_result(await asyncio_peer(reader, writer, down, 2))
                except BaseException as exc:  # noqa: BLE001 (reported to the test)
                    results.set_exception(exc)

            server = await aio.run(friendsock.start_server(handler, LOCALHOST, 0, friends=friends))
            try:
                port = server.sockets[0].getsockname()[1]
                stream = await fst.open_tcp_stream(LOCALHOST, port, friends=friends)
                assert_path(friends, stream)
                async with trio.open_nursery() as nursery:
                    far: List[Any] = []

                    async def asyncio_side() -> None:
                        far.append(await aio.run(results, 3 * TIMEOUT))

                    nursery.start_soon(asyncio_side)
                    got_down = await trio_peer(stream, up, 3)
            finally:
                await aio.call(server.close)
                await aio.run(server.wait_closed())
            paired, got_up = far[0]
        else:
            async with listening(friends) as (listener, port):

                async def connect() -> Tuple[bool, bytes]:
                    reader, writer = await friendsock.open_connection(LOCALHOST, port, friends=friends)
                    return await asyncio_peer(reader, writer, down, 2)

                async with trio.open_nursery() as nursery:
                    far = []

                    async def asyncio_side() -> None:
                        far.append(await aio.run(connect(), 3 * TIMEOUT))

                    nursery.start_soon(asyncio_side)
                    stream = await listener.accept()
                    assert_path(friends, stream)
                    got_down = await trio_peer(stream, up, 3)
                paired, got_up = far[0]
    assert paired is friends
    assert got_up == digest(up)
    assert got_down == digest(down)
    assert_link_stats(before, friends, len(up) + len(down))


# -- back pressure across threads -----------------------------------------------------------


@pytest.mark.trio
async def test_trio_writer_blocks_on_a_paused_asyncio_reader(aio):
    """The asyncio reader stops reading: send_all returns up to exactly the
    trio end's SO_SNDBUF + the asyncio end's SO_RCVBUF, blocks past it, and
    goes on when the reader (on its thread) resumes."""
    accepted = await aio.call(aio.loop.create_future)

    def on_client(reader, writer) -> None:
        accepted.set_result((reader, writer))

    server = await aio.run(friendsock.start_server(on_client, LOCALHOST, 0))
    try:
        port = server.sockets[0].getsockname()[1]
        async with await fst.open_tcp_stream(LOCALHOST, port) as stream:
            assert_path(True, stream)
            reader, writer = await aio.run(accepted)
            assert await aio.call(friendsock.is_friend, writer)
            transport = writer.transport
            await aio.call(transport.pause_reading)
            rcvbuf = await aio.call(
                lambda: transport.get_extra_info("socket").getsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF)
            )
            cap = sockopt(stream, socket.SO_SNDBUF) + rcvbuf
            with trio.fail_after(TIMEOUT):
                await stream.send_all(b"a" * cap)  # within the capacity: no reader needed
            done = trio.Event()

            async def one_more() -> None:
                await stream.send_all(b"b")
                done.set()

            with trio.fail_after(TIMEOUT):
                async with trio.open_nursery() as nursery:
                    nursery.start_soon(one_more)
                    await wait_all_tasks_blocked()
                    assert not done.is_set()
                    await aio.call(transport.resume_reading)
                    await done.wait()
            data = await aio.run(reader.readexactly(cap + 1))
            assert data == b"a" * cap + b"b"
            await aio.call(writer.close)
    finally:
        await aio.call(server.close)
        await aio.run(server.wait_closed())


@pytest.mark.trio
async def test_asyncio_writer_waits_for_the_trio_reader(aio):
    """The trio end does not read: the asyncio writer's buffer grows past
    SO_SNDBUF (its own) + SO_RCVBUF (the trio end's) and drain() waits;
    the trio end reads, and drain() returns, every byte in order."""
    async with listening(None) as (listener, port):
        _, writer = await aio.run(friendsock.open_connection(LOCALHOST, port))
        try:
            async with await listener.accept() as stream:
                assert_path(True, stream)
                assert await aio.call(friendsock.is_friend, writer)
                sndbuf = await aio.call(
                    lambda: writer.get_extra_info("socket").getsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF)
                )
                cap = sndbuf + sockopt(stream, socket.SO_RCVBUF)
                payload = random.Random(4).randbytes(cap + 100_000)

                async def write() -> Tuple[int, "asyncio.Future[None]"]:
                    writer.write(payload)
                    return writer.transport.get_write_buffer_size(), asyncio.ensure_future(writer.drain())

                size, drain = await aio.run(write())
                assert size == 100_000
                assert not await aio.call(drain.done)  # a round trip on its loop later
                with trio.fail_after(TIMEOUT):
                    assert await receive_exactly(stream, len(payload)) == payload
                await aio.run(drain)
        finally:
            await aio.call(writer.close)


# -- one side's loop or run ends with the link open ---------------------------------------------


@pytest.mark.trio
@pytest.mark.parametrize("asyncio_side", ["client", "server"])
@pytest.mark.parametrize("trio_state", ["receiving", "sending"])
async def test_asyncio_loop_ends_under_an_open_link(aio, asyncio_side, trio_state):
    """The asyncio loop stops and closes with the link open: the trio end
    gets BrokenResourceError (blocked in receive_some, or on its next
    sends), never a hang, and nothing stays alive."""
    async with contextlib.AsyncExitStack() as stack:
        if asyncio_side == "client":
            listener, port = await stack.enter_async_context(listening(None))
            _, writer = await aio.run(friendsock.open_connection(LOCALHOST, port))
            stream = await listener.accept()
            await aio.call(writer.write, b"ping")
        else:
            accepted = await aio.call(aio.loop.create_future)

            def on_client(reader, writer) -> None:
                writer.write(b"ping")
                accepted.set_result(writer)

            server = await aio.run(friendsock.start_server(on_client, LOCALHOST, 0))
            stream = await fst.open_tcp_stream(LOCALHOST, server.sockets[0].getsockname()[1])
            writer = await aio.run(accepted)
        async with stream:
            assert_path(True, stream)
            assert await aio.call(friendsock.is_friend, writer)
            with trio.fail_after(TIMEOUT):
                assert await receive_exactly(stream, 4) == b"ping"
                if trio_state == "receiving":

                    async def receive_broken() -> None:
                        with pytest.raises(trio.BrokenResourceError):
                            await stream.receive_some(10)

                    async with trio.open_nursery() as nursery:
                        nursery.start_soon(receive_broken)
                        await wait_all_tasks_blocked()
                        await aio.aclose()
                else:
                    await aio.aclose()
                    with pytest.raises(trio.BrokenResourceError):
                        for _ in range(1000):
                            await stream.send_all(b"x" * 10_000)
                            await trio.lowlevel.checkpoint()
    assert friendsock.stats().pending == 0


def run_trio_in_thread(main, *args) -> "asyncio.Future[Any]":
    """trio.run(main, *args) in a thread of its own, as an asyncio future."""
    future: concurrent.futures.Future = concurrent.futures.Future()

    def target() -> None:
        try:
            future.set_result(trio.run(main, *args))
        except BaseException as exc:  # noqa: BLE001 (reported to the test)
            future.set_exception(exc)

    threading.Thread(target=target, name="trio-run", daemon=True).start()
    return asyncio.wrap_future(future)


@pytest.mark.parametrize("trio_side", ["client", "server"])
async def test_trio_run_ends_under_an_open_link(trio_side):
    """(An asyncio test: the test's own loop is asyncio or uvloop.) A trio
    run in another thread returns with its friend stream never closed: the
    asyncio end gets connection_lost(ConnectionResetError), not a hang.
    The trio stream stays referenced until then, so it is the run's end, not
    garbage collection, that resets the link."""
    loop = asyncio.get_running_loop()
    kept: List[Any] = []
    made: "asyncio.Future[Recorder]" = loop.create_future()

    def factory() -> Recorder:
        protocol = Recorder()
        if not made.done():
            made.set_result(protocol)
        return protocol

    server = None
    try:
        if trio_side == "client":
            server = await friendsock.create_server(factory, LOCALHOST, 0)
            port = server.sockets[0].getsockname()[1]

            async def trio_main() -> bool:
                stream = await fst.open_tcp_stream(LOCALHOST, port)
                kept.append(stream)
                await stream.send_all(b"ping")
                return fst.is_friend(stream)

            paired = await asyncio.wait_for(run_trio_in_thread(trio_main), TIMEOUT)
            protocol = await asyncio.wait_for(made, TIMEOUT)
            transport = protocol.transport
        else:
            port_ready: concurrent.futures.Future = concurrent.futures.Future()

            async def trio_main() -> bool:
                listeners = await fst.open_tcp_listeners(0, host=LOCALHOST)
                async with listeners[0] as listener:
                    port_ready.set_result(listener.socket.getsockname()[1])
                    with trio.fail_after(TIMEOUT):
                        stream = await listener.accept()
                kept.append(stream)
                await stream.send_all(b"pong")
                return fst.is_friend(stream)

            ran = run_trio_in_thread(trio_main)
            port = await asyncio.wait_for(asyncio.wrap_future(port_ready), TIMEOUT)
            transport, protocol = await friendsock.create_connection(factory, LOCALHOST, port)
            paired = await asyncio.wait_for(ran, TIMEOUT)
        assert paired and friendsock.is_friend(transport)
        exc = await asyncio.wait_for(protocol.lost, TIMEOUT)
        assert isinstance(exc, ConnectionResetError), exc
        sent = b"ping" if trio_side == "client" else b"pong"
        assert sent.startswith(bytes(protocol.data))  # at most what was sent, then the reset
        assert "eof" not in protocol.events
    finally:
        if server is not None:
            server.close()
            await server.wait_closed()
    # The dead run's stream: whatever collecting it says is not the point here.
    with warnings.catch_warnings(record=True):
        warnings.simplefilter("always")
        kept.clear()
        gc.collect()


# -- a listener other processes may share: the trio client confirms ------------------------


async def shared_listener_server(aio: AsyncioThread) -> Tuple[Any, int]:
    """An asyncio echo server on a listening socket handed in with ``sock=``
    (it may be shared with other processes, so clients wait for the claim)."""

    async def echo(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        writer.write(await reader.read(100))
        await writer.drain()
        writer.close()
        await writer.wait_closed()

    listen_sock = socket.socket()
    listen_sock.bind((LOCALHOST, 0))
    listen_sock.listen(16)
    server = await aio.run(friendsock.start_server(echo, sock=listen_sock))
    return server, listen_sock.getsockname()[1]


@pytest.mark.trio
async def test_confirmed_connect_pairs_once_claimed(aio, monkeypatch):
    """The asyncio thread claims the connect and tells the trio run, which
    only then pairs."""
    from friendsock import _handshake

    monkeypatch.setattr(_handshake, "CONFIRM_TIMEOUT", TIMEOUT)  # a loaded machine
    server, port = await shared_listener_server(aio)
    before = friendsock.stats()
    try:
        with trio.fail_after(TIMEOUT):
            async with await fst.open_tcp_stream(LOCALHOST, port) as stream:
                assert_path(True, stream)
                await stream.send_all(b"confirmed")
                assert await receive_until_eof(stream) == b"confirmed"
    finally:
        await aio.call(server.close)
        await aio.run(server.wait_closed())
    assert friendsock.stats().links_made == before.links_made + 1
    assert fallbacks_since(before) == {}


@pytest.mark.trio
async def test_unclaimed_connect_goes_on_over_tcp(aio, monkeypatch):
    """Nobody in this process claims the connect before the deadline (here:
    the server's loop is busy; as when another process accepts it): the
    stream is TCP on the same socket, and works once it is accepted. A
    socketless connect has no kernel connection another process could
    take: it pairs at once, and is served once the loop is free."""
    from friendsock import _handshake

    monkeypatch.setattr(_handshake, "CONFIRM_TIMEOUT", 0.01)
    socketless = friendsock.is_socketless()
    server, port = await shared_listener_server(aio)
    before = friendsock.stats()
    busy, release = threading.Event(), threading.Event()

    def hold_the_loop() -> None:
        busy.set()
        release.wait(TIMEOUT)

    aio.loop.call_soon_threadsafe(hold_the_loop)  # the loop cannot accept
    assert await trio.to_thread.run_sync(busy.wait, TIMEOUT)
    try:
        with trio.fail_after(TIMEOUT):
            async with await fst.open_tcp_stream(LOCALHOST, port) as stream:
                assert_path(socketless, stream)
                release.set()
                await stream.send_all(b"over tcp")
                assert await receive_until_eof(stream) == b"over tcp"
    finally:
        release.set()
        await aio.call(server.close)
        await aio.run(server.wait_closed())
    if socketless:
        assert friendsock.stats().links_made == before.links_made + 1
        assert fallbacks_since(before) == {}
    else:
        assert friendsock.stats().links_made == before.links_made
        assert fallbacks_since(before) == {"unconfirmed": 1, "peer-not-friend": 1}
