"""friendsock.trio conformance: every behaviour test runs on the friend path
and on real TCP (``friends=False``, trio's own SocketStream, the reference).
Exact byte thresholds are asserted on the friend path only, where the
accounting is ours (``sndbuf + friend rcvbuf``)."""

from __future__ import annotations

import functools
import gc
import hashlib
import random
import socket
import struct
import sys
import warnings
from typing import List

import pytest
import trio
import trio.testing
from trio.testing import assert_checkpoints, wait_all_tasks_blocked

import friendsock
import friendsock.trio as fst
from friendsock._core._registry import registry as _registry
from support import chunked, cyclic_garbage_of_ours, descriptors_open, resource_warnings_raised
from trio_support import (  # noqa: F401 (nothing_left_behind: an autouse fixture)
    LOCALHOST,
    MiB,
    TIMEOUT,
    assert_paired_since,
    assert_path,
    capacity,
    fallbacks_since,
    fill,
    listening,
    nothing_left_behind,
    receive_exactly,
    receive_until_eof,
    shrink_buffers,
    sockopt,
    stream_pair,
)

if sys.version_info < (3, 11):
    from exceptiongroup import ExceptionGroup

pytestmark = pytest.mark.trio


async def arrived(friends: bool, stream) -> None:
    """Until bytes sent toward ``stream`` reached its end of the connection.
    On the friend path a returned send_all has queued them on the link; on
    TCP, wait until the kernel holds something to read."""
    if not friends:
        with trio.fail_after(TIMEOUT):
            await trio.lowlevel.wait_readable(stream.socket)


class Ledger:
    """Chunks sent in order, each one byte value repeated (a value of its
    own: at most 255 chunks), and whether each send_all returned. What arrives must be every chunk in
    order: a completed one whole, a cancelled one a prefix of it (on the
    friend path: all of it or none of it; none only if cancelled before it
    blocked)."""

    def __init__(self) -> None:
        self.chunks: List[bytes] = []
        self.completed: List[bool] = []

    async def send(self, stream, size: int) -> None:
        assert len(self.chunks) < 255
        chunk = bytes([1 + len(self.chunks)]) * size
        self.chunks.append(chunk)
        self.completed.append(False)
        await stream.send_all(chunk)
        self.completed[-1] = True

    @property
    def cancelled(self) -> int:
        return self.completed.count(False)

    def check(self, received: bytes, friends: bool, whole_if_blocked: bool = False) -> None:
        pos = 0
        for index, (chunk, done) in enumerate(zip(self.chunks, self.completed)):
            window = received[pos:pos + len(chunk)]
            n = len(window) - len(window.lstrip(chunk[:1]))
            if done or whole_if_blocked:
                assert n == len(chunk), f"chunk {index} ({'sent' if done else 'cancelled'}): {n} of {len(chunk)} bytes"
            elif friends:
                assert n in (0, len(chunk)), f"cancelled chunk {index} arrived in part: {n} of {len(chunk)}"
            else:
                assert n <= len(chunk)
            pos += n
        assert pos == len(received), f"{len(received) - pos} bytes nobody sent, at {pos}"


# -- trio's own generic stream checks -----------------------------------------------


async def test_check_half_closeable_stream(friends):
    before = friendsock.stats()
    made = 0
    async with listening(friends) as (listener, port):

        async def stream_maker():
            nonlocal made
            client = await fst.open_tcp_stream(LOCALHOST, port, friends=friends)
            server = await listener.accept()
            made += 1
            assert_path(friends, client, server)
            return client, server

        async def clogged_stream_maker():
            client, server = await stream_maker()
            if friends:
                await shrink_buffers(client, server)
                await shrink_buffers(server, client)
            for writer, reader in ((client, server), (server, client)):
                handed = await fill(writer)
                if friends:
                    assert handed > capacity(writer, reader)
            return client, server

        await trio.testing.check_half_closeable_stream(stream_maker, clogged_stream_maker)
    assert made > 10
    assert_paired_since(before, friends, made)


# -- pairing ---------------------------------------------------------------------------


async def test_connect_then_accept_in_one_task(friends):
    """The client end is usable before the server accepts: bytes and EOF
    sent then wait for the accept, as on an established TCP connection."""
    # A socketless link has no pending connect: its server end waits in
    # the listener's socketless backlog.
    await connect_then_accept(friends, pending=friends and not friendsock.is_socketless())


async def connect_then_accept(friends: bool, pending: bool) -> None:
    """test_connect_then_accept_in_one_task, with a connect ``pending``
    until the accept (not one whose server end waits in the listener's
    backlog)."""
    before = friendsock.stats()
    async with listening(friends) as (listener, port):
        with trio.fail_after(TIMEOUT):
            client = await fst.open_tcp_stream(LOCALHOST, port, friends=friends)
        async with client:
            assert_path(friends, client)
            # A socketless link has no descriptor.
            socketless = friends and friendsock.is_socketless()
            assert (client.socket.fileno() >= 0) is not socketless
            assert friendsock.stats().pending == (1 if pending else 0)
            with trio.fail_after(TIMEOUT):
                await client.send_all(b"sent before the accept")
                await client.send_eof()
                server = await listener.accept()
            async with server:
                assert_path(friends, server)
                assert friendsock.stats().pending == 0
                assert client.socket.getsockname() == server.socket.getpeername()
                assert client.socket.getpeername() == server.socket.getsockname() == (LOCALHOST, port)
                with trio.fail_after(TIMEOUT):
                    assert await receive_until_eof(server) == b"sent before the accept"
                    await server.send_all(b"reply")
                    assert await client.receive_some(100) == b"reply"
    assert_paired_since(before, friends)


async def test_mixed_peers_get_tcp():
    """Any end that is not friendsock, or opted out, gets real TCP."""
    async with listening(None) as (listener, port):
        assert isinstance(listener, fst.FriendListener)
        # A plain trio client to a friendsock listener.
        before = friendsock.stats()
        plain = await trio.open_tcp_stream(LOCALHOST, port)
        async with plain, await listener.accept() as server:
            assert_path(False, server)
            await plain.send_all(b"plain")
            assert await receive_exactly(server, 5) == b"plain"
        assert fallbacks_since(before) == {"peer-not-friend": 1}
        # An opted-out friendsock client to a friendsock listener.
        before = friendsock.stats()
        client = await fst.open_tcp_stream(LOCALHOST, port, friends=False)
        async with client, await listener.accept() as server:
            assert_path(False, client, server)
            await client.send_all(b"opted out")
            assert await receive_exactly(server, 9) == b"opted out"
        assert fallbacks_since(before) == {"opted-out": 1, "peer-not-friend": 1}
        assert friendsock.stats().links_made == before.links_made
    # A friendsock client to a plain trio listener.
    listeners = await trio.open_tcp_listeners(0, host=LOCALHOST)
    async with listeners[0] as plain_listener:
        before = friendsock.stats()
        client = await fst.open_tcp_stream(LOCALHOST, plain_listener.socket.getsockname()[1])
        async with client, await plain_listener.accept() as server:
            assert_path(False, client)
            await server.send_all(b"from plain")
            assert await receive_exactly(client, 10) == b"from plain"
        assert fallbacks_since(before) == {"no-listener": 1}


async def test_switch_off_gives_tcp():
    before = friendsock.stats()
    friendsock.set_enabled(False)
    try:
        async with listening(None) as (listener, port):
            client = await fst.open_tcp_stream(LOCALHOST, port)
            async with client, await listener.accept() as server:
                assert_path(False, client, server)
                await client.send_all(b"over tcp")
                assert await receive_exactly(server, 8) == b"over tcp"
    finally:
        friendsock.set_enabled(True)
    assert friendsock.stats().links_made == before.links_made
    assert "disabled" in fallbacks_since(before)


async def test_ipv6(friends):
    async with stream_pair(friends, host="::1") as (client, server):
        assert client.socket.family == socket.AF_INET6
        assert client.socket.getpeername()[:2] == server.socket.getsockname()[:2]
        await client.send_all(b"six")
        assert await receive_exactly(server, 3) == b"six"


async def test_wildcard_listeners(friends):
    """host=None listens on 0.0.0.0 and :: (each its own port); both pair."""
    before = friendsock.stats()
    listeners = await fst.open_tcp_listeners(0, friends=friends)
    try:
        families = sorted(listener.socket.family for listener in listeners)
        assert families == [socket.AF_INET, socket.AF_INET6]
        for listener in listeners:
            host = "127.0.0.1" if listener.socket.family == socket.AF_INET else "::1"
            client = await fst.open_tcp_stream(host, listener.socket.getsockname()[1], friends=friends)
            async with client, await listener.accept() as server:
                assert_path(friends, client, server)
                await client.send_all(host.encode())
                assert await receive_exactly(server, len(host)) == host.encode()
    finally:
        for listener in listeners:
            await listener.aclose()
    assert_paired_since(before, friends, 2)


async def test_local_address_and_happy_eyeballs(friends):
    before = friendsock.stats()
    async with listening(friends) as (listener, port):
        client = await fst.open_tcp_stream(
            "localhost", port, friends=friends, local_address=LOCALHOST, happy_eyeballs_delay=0.1
        )
        async with client, await listener.accept() as server:
            assert_path(friends, client, server)
            assert client.socket.getsockname()[0] == LOCALHOST
            await server.send_all(b"hi")
            assert await receive_exactly(client, 2) == b"hi"
    assert_paired_since(before, friends)


# -- bytes ---------------------------------------------------------------------------------


@pytest.mark.parametrize("size", [0, 1, 100_003, 16 * MiB])
async def test_echo_byte_exact(friends, size):
    """A chunked payload (bytes, bytearray, memoryview) echoed back whole
    and in order, then EOF both ways."""
    rng = random.Random(size)
    payload = rng.randbytes(size)
    before = friendsock.stats()
    async with stream_pair(friends) as (client, server):

        async def echo() -> None:
            while data := await server.receive_some():
                await server.send_all(data)
            await server.send_eof()

        async def send() -> None:
            for chunk in chunked(payload, rng, largest=max(1, size // 64)):
                await client.send_all(chunk)
            await client.send_eof()

        with trio.fail_after(TIMEOUT):
            async with trio.open_nursery() as nursery:
                nursery.start_soon(echo)
                nursery.start_soon(send)
                received = await receive_until_eof(client, 300_007)
    assert hashlib.sha256(received).digest() == hashlib.sha256(payload).digest()
    moved = friendsock.stats().bytes_moved - before.bytes_moved
    assert moved == (2 * size if friends else 0)


async def test_one_large_send_all(friends):
    """One 8 MiB send_all, read with random max_bytes: never more than asked."""
    payload = random.Random(20).randbytes(8 * MiB)
    rng = random.Random(21)
    async with stream_pair(friends) as (client, server):
        received = bytearray()

        async def receive() -> None:
            while len(received) < len(payload):
                max_bytes = rng.choice([1, 7, 4096, 65536, 1 << 20, None])
                data = await server.receive_some(max_bytes)
                assert data and (max_bytes is None or len(data) <= max_bytes)
                received.extend(data)

        with trio.fail_after(TIMEOUT):
            async with trio.open_nursery() as nursery:
                nursery.start_soon(receive)
                await client.send_all(payload)
        assert received == payload


@pytest.mark.parametrize("first", ["client", "server"])
async def test_half_close(friends, first):
    async with stream_pair(friends) as (client, server):
        a, b = (client, server) if first == "client" else (server, client)
        with trio.fail_after(TIMEOUT):
            await a.send_all(b"before eof")
            await a.send_eof()
            assert await receive_until_eof(b) == b"before eof"
            assert await b.receive_some(10) == b""  # EOF stays EOF
            with pytest.raises(trio.ClosedResourceError):
                await a.send_all(b"after eof")
            with pytest.raises(trio.ClosedResourceError):
                await a.send_all(b"")
            await a.send_eof()  # again: fine
            # The other direction still works.
            await b.send_all(b"reply")
            await b.send_all(b" after eof")
            await b.send_eof()
            assert await receive_until_eof(a) == b"reply after eof"
            await a.aclose()
            await b.aclose()
        for stream in (a, b):
            with pytest.raises(trio.ClosedResourceError):
                await stream.receive_some(1)
            with pytest.raises(trio.ClosedResourceError):
                await stream.send_all(b"x")
            await stream.aclose()  # again: fine


async def test_argument_errors(friends):
    async with stream_pair(friends) as (client, server):
        with pytest.raises(TypeError):
            await client.send_all("text")  # type: ignore[arg-type]
        with pytest.raises(ValueError):
            await server.receive_some(0)
        with pytest.raises(ValueError):
            await server.receive_some(-1)
        with pytest.raises(TypeError):
            await server.receive_some(1.5)  # type: ignore[arg-type]
        await client.send_all(b"still fine")
        assert await receive_exactly(server, 10) == b"still fine"


async def test_busy(friends):
    async with stream_pair(friends) as (client, server):
        with pytest.raises(ExceptionGroup) as info:
            async with trio.open_nursery() as nursery:
                nursery.start_soon(server.receive_some, 10)
                nursery.start_soon(server.receive_some, 10)
        assert info.group_contains(trio.BusyResourceError)
        if friends:
            await shrink_buffers(client, server)
        await fill(client)
        with pytest.raises(ExceptionGroup) as info:
            async with trio.open_nursery() as nursery:
                nursery.start_soon(client.send_all, b"1")
                nursery.start_soon(client.send_all, b"2")
        assert info.group_contains(trio.BusyResourceError)


# -- close, reset, and the errors they give ---------------------------------------------


async def test_aclose_delivers_everything_then_eof(friends):
    """aclose() right after send_all returns: every byte still arrives, then EOF."""
    payload = random.Random(1).randbytes(4 * MiB)
    async with stream_pair(friends) as (client, server):

        async def send_and_close() -> None:
            for chunk in chunked(payload, random.Random(2), largest=256 * 1024):
                await server.send_all(chunk)
            await server.aclose()

        with trio.fail_after(TIMEOUT):
            async with trio.open_nursery() as nursery:
                nursery.start_soon(send_and_close)
                await wait_all_tasks_blocked()  # the sender is blocked (its buffers are full)
                received = await receive_until_eof(client)
        assert received == payload


async def test_aclose_with_data_queued_delivers_it(friends):
    """A sender that queued what its buffers hold and closed, before the
    reader read anything: the reader still gets it all, then EOF."""
    async with stream_pair(friends) as (client, server):
        if friends:
            size = capacity(client, server)
        else:
            size = 64 * 1024
        payload = random.Random(3).randbytes(size)
        with trio.fail_after(TIMEOUT):
            await client.send_all(payload)  # does not block: no reader needed
            await client.aclose()
            assert await receive_until_eof(server) == payload


@pytest.mark.parametrize("peer", ["receiving", "idle", "sending"])
async def test_aclose_with_unread_data_resets_the_peer(friends, peer):
    async with stream_pair(friends) as (client, server):
        await server.send_all(b"never read")
        await arrived(friends, client)
        with trio.fail_after(TIMEOUT):
            if peer == "receiving":

                async def receive_broken() -> None:
                    with pytest.raises(trio.BrokenResourceError):
                        await server.receive_some(10)

                async with trio.open_nursery() as nursery:
                    nursery.start_soon(receive_broken)
                    await wait_all_tasks_blocked()
                    await client.aclose()
            elif peer == "idle":
                await client.aclose()
                with pytest.raises(trio.BrokenResourceError):
                    await server.receive_some(10)
            else:
                await client.aclose()
                with pytest.raises(trio.BrokenResourceError):
                    for _ in range(100):
                        await server.send_all(b"x" * 1000)
                # Once broken, it stays broken.
                with pytest.raises(trio.BrokenResourceError):
                    await server.send_all(b"x")


async def test_reset_leaves_the_peer_what_sat_in_its_rcvbuf(friends):
    """A stream closed with unread incoming bytes, after sending more than
    its friend holds: the friend reads at most its SO_RCVBUF of it (friend
    path: exactly that), in order, then BrokenResourceError, not EOF."""
    async with stream_pair(friends) as (client, server):
        await server.send_all(b"never read")
        await arrived(friends, client)
        handed = await fill(client)
        rcvbuf = sockopt(server, socket.SO_RCVBUF)
        assert handed > rcvbuf
        await client.aclose()
        received = bytearray()
        with trio.fail_after(TIMEOUT):
            with pytest.raises(trio.BrokenResourceError):
                while True:
                    data = await server.receive_some()
                    assert data, "EOF instead of a reset"
                    received += data
        assert received == b"x" * len(received)
        if friends:
            assert len(received) == rcvbuf
        else:
            assert len(received) <= rcvbuf


async def test_an_abortive_close_resets_the_peer(friends):
    """SO_LINGER {1, 0}: aclose() resets. The peer, which had what was sent
    before, gets BrokenResourceError, not EOF."""
    async with stream_pair(friends) as (client, server):
        await client.send_all(b"before the reset")
        with trio.fail_after(TIMEOUT):
            received = b""
            while len(received) < 16:
                received += await server.receive_some()
            assert received == b"before the reset"
            client.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
            await client.aclose()
            with pytest.raises(trio.BrokenResourceError):
                await server.receive_some()


async def test_a_finished_connection_leaves_no_cycle(friends):
    """Used and closed on both ends, a connection is freed by its last
    reference, as a socket is: nothing of it waits for the collector."""
    with cyclic_garbage_of_ours() as garbage:
        async with stream_pair(friends) as (client, server):
            with trio.fail_after(TIMEOUT):
                await client.send_all(b"ping")
                assert await server.receive_some(4) == b"ping"
                await server.send_all(b"pong")
                assert await client.receive_some(4) == b"pong"
        del client, server
    assert garbage == []


async def test_send_after_peer_closed(friends):
    """The peer closed cleanly: EOF, then sending fails (TCP: the peer's
    reset), and stays failed."""
    async with stream_pair(friends) as (client, server):
        await server.aclose()
        with trio.fail_after(TIMEOUT):
            assert await client.receive_some(10) == b""
            with pytest.raises(trio.BrokenResourceError):
                for _ in range(100):
                    await client.send_all(b"x" * 1000)
            with pytest.raises(trio.BrokenResourceError):
                await client.send_all(b"x")


async def test_peer_closed_while_send_all_blocked(friends):
    async with stream_pair(friends) as (client, server):
        if friends:
            await shrink_buffers(client, server)
        await fill(client)

        async def send_broken() -> None:
            with pytest.raises(trio.BrokenResourceError):
                await client.send_all(b"y" * 100_000)

        with trio.fail_after(TIMEOUT):
            async with trio.open_nursery() as nursery:
                nursery.start_soon(send_broken)
                await wait_all_tasks_blocked()
                await server.aclose()


async def test_aclose_wakes_own_blocked_calls(friends):
    """Closing a stream wakes its own blocked receive_some and send_all with
    ClosedResourceError."""
    async with stream_pair(friends) as (client, server):
        if friends:
            await shrink_buffers(client, server)
        await fill(client)

        async def expect_closed(fn, *args) -> None:
            with pytest.raises(trio.ClosedResourceError):
                await fn(*args)

        with trio.fail_after(TIMEOUT):
            async with trio.open_nursery() as nursery:
                nursery.start_soon(expect_closed, client.send_all, b"z" * 1000)
                nursery.start_soon(expect_closed, client.receive_some, 10)
                await wait_all_tasks_blocked()
                await client.aclose()


# -- accounting ------------------------------------------------------------------------------


async def test_send_all_blocks_past_sndbuf_plus_friend_rcvbuf(friends):
    async with stream_pair(friends) as (client, server):
        cap = capacity(client, server)
        if friends:
            with trio.fail_after(TIMEOUT):
                await client.send_all(b"a" * cap)  # queued == capacity: does not block
        else:
            await fill(client)
        done = trio.Event()

        async def one_more() -> None:
            await client.send_all(b"b")
            done.set()

        with trio.fail_after(TIMEOUT):
            async with trio.open_nursery() as nursery:
                nursery.start_soon(one_more)
                await wait_all_tasks_blocked()
                assert not done.is_set()
                if friends:
                    assert await server.receive_some(1) == b"a"  # back to capacity
                    await done.wait()
                    rest = await receive_exactly(server, cap)
                    assert rest == b"a" * (cap - 1) + b"b"
                else:
                    received = await receive_until_b(server)
                    await done.wait()
                    assert set(received[:-1]) == {ord("x")} and received[-1:] == b"b"


async def receive_until_b(stream) -> bytes:
    got = bytearray()
    while not got.endswith(b"b"):
        data = await stream.receive_some()
        assert data
        got += data
    return bytes(got)


@pytest.mark.parametrize("option", ["SO_SNDBUF", "SO_RCVBUF"])
@pytest.mark.parametrize("value", [32 * 1024, MiB])
async def test_setsockopt_changes_the_accounting(friends, option, value):
    """SO_SNDBUF set on the writer, or SO_RCVBUF on the reader, moves the
    point where send_all blocks, by what the kernel reports."""
    async with stream_pair(friends) as (client, server):
        opt = getattr(socket, option)
        target = client if option == "SO_SNDBUF" else server
        old = sockopt(target, opt)
        target.setsockopt(socket.SOL_SOCKET, opt, value)
        assert sockopt(target, opt) != old
        assert target.socket.getsockopt(socket.SOL_SOCKET, opt) == sockopt(target, opt)
        cap = capacity(client, server)
        if friends:
            with trio.fail_after(TIMEOUT):
                await client.send_all(b"a" * cap)
            blocked = True
            with trio.move_on_after(TIMEOUT) as scope:  # never: it must block at once
                async with trio.open_nursery() as nursery:
                    nursery.start_soon(client.send_all, b"b")
                    await wait_all_tasks_blocked()
                    assert nursery.child_tasks, "send_all past the capacity did not block"
                    assert await server.receive_some(1) == b"a"
                    blocked = False
            assert not scope.cancelled_caught and not blocked
            with trio.fail_after(TIMEOUT):
                assert await receive_exactly(server, cap) == b"a" * (cap - 1) + b"b"
        else:
            chunk = 64 * 1024
            handed = await fill(client, chunk)
            await client.send_eof()
            with trio.fail_after(TIMEOUT):
                received = await receive_until_eof(server)
            # The cancelled last send_all may have sent a prefix of its chunk.
            assert handed - chunk <= len(received) <= handed
            assert received == b"x" * len(received)


async def test_setsockopt_on_the_reader_unblocks_the_writer():
    """The reader grows SO_RCVBUF while the writer is blocked past the old
    capacity and within the new one: the writer's send_all returns."""
    async with stream_pair(True) as (client, server):
        server.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
        cap = capacity(client, server)
        done = trio.Event()

        async def send() -> None:
            await client.send_all(b"q" * (cap + 64 * 1024))
            done.set()

        with trio.fail_after(TIMEOUT):
            async with trio.open_nursery() as nursery:
                nursery.start_soon(send)
                await wait_all_tasks_blocked()
                assert not done.is_set()
                server.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 256 * 1024)
                assert capacity(client, server) >= cap + 64 * 1024
                await done.wait()
            assert await receive_exactly(server, cap + 64 * 1024) == b"q" * (cap + 64 * 1024)


async def test_wait_send_all_might_not_block(friends):
    async with stream_pair(friends) as (client, server):
        with trio.fail_after(TIMEOUT):
            await client.wait_send_all_might_not_block()  # nothing queued: returns
        if friends:
            await shrink_buffers(client, server)
        await fill(client)
        record: List[str] = []

        with trio.fail_after(TIMEOUT):
            async with trio.open_nursery() as nursery:

                async def waiter() -> None:
                    await client.wait_send_all_might_not_block()
                    record.append("woke")
                    nursery.cancel_scope.cancel()

                async def drain() -> None:
                    record.append("draining")
                    while True:
                        assert await server.receive_some(16 * 1024)

                nursery.start_soon(waiter)
                await wait_all_tasks_blocked()
                nursery.start_soon(drain)
        assert record == ["draining", "woke"]


# -- cancellation ------------------------------------------------------------------------------


async def test_cancel_blocked_send_all(friends):
    """A send_all blocked on a full link is cancelled: the bytes it took
    still arrive (TCP: a prefix of them), nothing before it is lost, the
    stream keeps working, nothing reorders."""
    chunk = 64 * 1024
    async with stream_pair(friends) as (client, server):
        cap = capacity(client, server)
        ledger = Ledger()

        async def writer() -> None:
            while True:
                await ledger.send(client, chunk)

        with trio.fail_after(TIMEOUT):
            async with trio.open_nursery() as nursery:
                nursery.start_soon(writer)
                await wait_all_tasks_blocked()
                nursery.cancel_scope.cancel()
        assert ledger.cancelled == 1 and not ledger.completed[-1]
        if friends:
            assert ledger.completed.count(True) == cap // chunk

        async def more() -> None:
            for size in (1, 10_000, 3 * chunk):
                await ledger.send(client, size)
            await client.send_eof()

        with trio.fail_after(TIMEOUT):
            async with trio.open_nursery() as nursery:
                nursery.start_soon(more)
                received = await receive_until_eof(server)
        assert ledger.cancelled == 1
        ledger.check(received, friends, whole_if_blocked=friends)


async def test_cancel_receive_some(friends):
    async with stream_pair(friends) as (client, server):
        # A receive_some blocked on nothing, cancelled.
        with trio.fail_after(TIMEOUT):
            async with trio.open_nursery() as nursery:
                nursery.start_soon(server.receive_some, 10)
                await wait_all_tasks_blocked()
                nursery.cancel_scope.cancel()
        # A receive_some cancelled before it runs takes nothing.
        await client.send_all(b"abc")
        await arrived(friends, server)
        with trio.CancelScope() as scope:
            scope.cancel()
            await server.receive_some(10)
        assert scope.cancelled_caught
        with trio.fail_after(TIMEOUT):
            assert await receive_exactly(server, 3) == b"abc"
            # And the stream goes on working both ways.
            await server.send_all(b"back")
            assert await receive_exactly(client, 4) == b"back"


async def test_cancellation_storm(friends):
    """Sender and receiver both cancelled at random checkpoints, hundreds of
    times: completed sends arrive whole, cancelled ones as a prefix (friend
    path: whole or not at all), in order, nothing extra."""
    rng = random.Random(30)
    sizes = [1, 100, 5000, 40_000, 200_000, 200_000]
    async with stream_pair(friends) as (client, server):
        if friends:
            await shrink_buffers(client, server)
        else:  # a small send buffer, so that send_all blocks often
            client.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, 4096)
        ledger = Ledger()
        received = bytearray()
        scopes: List = [None, None]  # (sender's, receiver's) current scope
        finished = [False, False]

        async def sender() -> None:
            for _ in range(250):
                with trio.CancelScope() as scope:
                    scopes[0] = scope
                    await ledger.send(client, rng.choice(sizes))
            scopes[0] = None
            await client.send_eof()
            finished[0] = True

        async def receiver() -> None:
            while True:
                with trio.CancelScope() as scope:
                    scopes[1] = scope
                    data = await server.receive_some(rng.choice([1, 999, 4096, 16384, 65536]))
                    if not data:
                        break
                    received.extend(data)
            scopes[1] = None
            finished[1] = True

        async def chaos() -> None:
            while not all(finished):
                for _ in range(rng.randint(0, 6)):
                    await trio.lowlevel.checkpoint()
                scope = scopes[rng.randrange(2)]
                if scope is not None and rng.random() < 0.3:
                    scope.cancel()

        with trio.fail_after(TIMEOUT):
            async with trio.open_nursery() as nursery:
                nursery.start_soon(sender)
                nursery.start_soon(receiver)
                nursery.start_soon(chaos)
        assert ledger.cancelled > 10
        ledger.check(bytes(received), friends)


# -- listeners and serve_tcp ---------------------------------------------------------------------


async def test_listener(friends):
    listeners = await fst.open_tcp_listeners(0, host=LOCALHOST, friends=friends)
    assert len(listeners) == 1
    listener = listeners[0]
    try:
        assert isinstance(listener, trio.abc.Listener)
        assert isinstance(listener.socket, trio.socket.SocketType)
        assert listener.socket.getsockname()[0] == LOCALHOST
        assert listener.socket.getsockopt(socket.SOL_SOCKET, socket.SO_ACCEPTCONN)
        if friends:
            assert isinstance(listener, fst.FriendListener)
        before = friendsock.stats()
        port = listener.socket.getsockname()[1]
        async with await fst.open_tcp_stream(LOCALHOST, port, friends=friends) as client:
            async with await listener.accept() as server:
                assert_path(friends, client, server)
        assert_paired_since(before, friends)

        async def accept_closed() -> None:
            with pytest.raises(trio.ClosedResourceError):
                await listener.accept()

        with trio.fail_after(TIMEOUT):
            async with trio.open_nursery() as nursery:
                nursery.start_soon(accept_closed)
                await wait_all_tasks_blocked()
                await listener.aclose()
        with pytest.raises(trio.ClosedResourceError):
            await listener.accept()
    finally:
        await listener.aclose()
        await listener.aclose()  # again: fine


async def test_listener_arguments(friends):
    with pytest.raises(TypeError):
        await fst.open_tcp_listeners("0", host=LOCALHOST, friends=friends)  # type: ignore[arg-type]
    with pytest.raises(TypeError):
        await fst.open_tcp_listeners(0, host=LOCALHOST, backlog="5", friends=friends)  # type: ignore[arg-type]
    with pytest.raises(socket.gaierror):
        await fst.open_tcp_listeners(0, host="nonexistent.invalid", friends=friends)
    before = friendsock.stats()
    async with listening(friends, backlog=1) as (listener, port):
        with pytest.raises(OSError):
            await fst.open_tcp_listeners(port, host=LOCALHOST, friends=friends)
        client = await fst.open_tcp_stream(LOCALHOST, port, friends=friends)
        async with client, await listener.accept() as server:
            assert_path(friends, client, server)
    assert_paired_since(before, friends)


async def test_listener_closed_before_accept_resets_the_client(friends):
    async with listening(friends) as (listener, port):
        client = await fst.open_tcp_stream(LOCALHOST, port, friends=friends)
        async with client:
            assert_path(friends, client)
            await client.send_all(b"for a server that never accepts")
            await listener.aclose()
            with trio.fail_after(TIMEOUT):
                with pytest.raises(trio.BrokenResourceError):
                    await client.receive_some(10)
    assert friendsock.stats().pending == 0


async def test_connect_refused(friends):
    async with listening(friends) as (_, port):
        pass
    with trio.fail_after(TIMEOUT):
        with pytest.raises(OSError):
            await fst.open_tcp_stream(LOCALHOST, port, friends=friends)
    assert friendsock.stats().pending == 0


async def test_open_tcp_stream_arguments(friends):
    async with listening(friends) as (listener, port):
        with trio.fail_after(TIMEOUT):
            with pytest.raises(socket.gaierror):
                await fst.open_tcp_stream("nonexistent.invalid", port, friends=friends)
            with pytest.raises(ValueError):
                await fst.open_tcp_stream(None, port, friends=friends)  # type: ignore[arg-type]
            with pytest.raises(TypeError):
                await fst.open_tcp_stream(LOCALHOST, str(port), friends=friends)  # type: ignore[arg-type]
            # bytes for the host are fine
            async with await fst.open_tcp_stream(LOCALHOST.encode(), port, friends=friends) as client:
                async with await listener.accept() as server:
                    assert_path(friends, client, server)
    assert friendsock.stats().pending == 0


async def test_sockopt_signatures(friends):
    """setsockopt/getsockopt on the stream take trio's arguments, and
    report what the real socket reports."""
    async with stream_pair(friends) as (client, server):
        for stream in (client, server):
            rcvbuf = sockopt(stream, socket.SO_RCVBUF)
            raw = stream.getsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4)
            assert isinstance(raw, bytes) and int.from_bytes(raw, sys.byteorder) == rcvbuf
            assert rcvbuf == stream.socket.getsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF)
            # trio's SocketStream turns Nagle off; a drop-in reports the same.
            assert stream.getsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY)
            with pytest.raises(TypeError):
                stream.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, None)
            with pytest.raises(TypeError):
                stream.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 65536, 4)
            stream.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, False)
            assert not stream.getsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY)
        await client.send_all(b"ok")
        assert await receive_exactly(server, 2) == b"ok"


async def test_serve_tcp(friends):
    before = friendsock.stats()
    handled: List = []

    async def handler(stream) -> None:
        assert_path(friends, stream)
        handled.append(stream)
        await stream.send_all(b"hello from serve_tcp")
        await stream.send_eof()
        assert await receive_until_eof(stream) == b"bye"

    with trio.fail_after(TIMEOUT):
        async with trio.open_nursery() as handlers, trio.open_nursery() as nursery:
            listeners = await nursery.start(
                functools.partial(
                    fst.serve_tcp, handler, 0, host=LOCALHOST, friends=friends, handler_nursery=handlers
                )
            )
            assert len(listeners) == 1 and isinstance(listeners[0], trio.abc.Listener)
            if friends:
                assert isinstance(listeners[0], fst.FriendListener)
            port = listeners[0].socket.getsockname()[1]
            for _ in range(3):
                async with await fst.open_tcp_stream(LOCALHOST, port, friends=friends) as client:
                    assert_path(friends, client)
                    assert await receive_until_eof(client) == b"hello from serve_tcp"
                    await client.send_all(b"bye")
                    await client.send_eof()
            nursery.cancel_scope.cancel()
        assert len(handled) == 3
        assert_paired_since(before, friends, 3)
        # Cancelling serve_tcp closed its listener.
        with pytest.raises(OSError):
            await fst.open_tcp_stream(LOCALHOST, port, friends=friends)


async def test_200_concurrent_echoes(friends):
    before = friendsock.stats()

    async def echo(stream) -> None:
        assert_path(friends, stream)
        while data := await stream.receive_some():
            await stream.send_all(data)

    async def one(i: int, port: int) -> None:
        payload = random.Random(i).randbytes(16 * 1024 + i)
        async with await fst.open_tcp_stream(LOCALHOST, port, friends=friends) as stream:
            assert_path(friends, stream)

            async def send() -> None:
                await stream.send_all(payload)
                await stream.send_eof()

            async with trio.open_nursery() as nursery:
                nursery.start_soon(send)
                received = await receive_until_eof(stream)
        assert hashlib.sha256(received).digest() == hashlib.sha256(payload).digest()

    with trio.fail_after(30):
        async with trio.open_nursery() as nursery:
            listeners = await nursery.start(
                functools.partial(fst.serve_tcp, echo, 0, host=LOCALHOST, backlog=512, friends=friends)
            )
            port = listeners[0].socket.getsockname()[1]
            async with trio.open_nursery() as clients:
                for i in range(200):
                    clients.start_soon(one, i, port)
            nursery.cancel_scope.cancel()
    assert_paired_since(before, friends, 200)


# -- a stream never closed -----------------------------------------------------------------------


@pytest.mark.parametrize("unread", [False, True], ids=["read-all", "unread-data"])
async def test_unclosed_friend_stream_warns_and_closes_as_a_collected_socket(unread):
    """A stream dropped without aclose() warns, and its friend sees what a
    collected socket leaves: a close (bytes, then EOF), or a reset when
    bytes sent to it were never read."""
    async with listening(None) as (listener, port):
        client = await fst.open_tcp_stream(LOCALHOST, port)
        async with await listener.accept() as server:
            assert_path(True, client, server)
            await client.send_all(b"last words")
            if unread:
                await server.send_all(b"never read")
            with warnings.catch_warnings(record=True) as caught:
                warnings.simplefilter("always")
                del client
                gc.collect()
            messages = [str(w.message) for w in caught if issubclass(w.category, ResourceWarning)]
            # Named as the stdlib's finalizer names a socket: filters match alike.
            assert messages and messages[0].startswith("unclosed <socket.socket fd="), caught
            with trio.fail_after(TIMEOUT):
                assert await server.receive_some() == b"last words"
                if unread:
                    with pytest.raises(trio.BrokenResourceError):
                        await server.receive_some()
                else:
                    assert await server.receive_some() == b""

async def test_an_unclosed_stream_closes_where_its_warning_is_an_error(friends):
    """With ResourceWarning an error, the finalizer's warning raises into
    the unraisable hook; the stream is closed all the same, as a socket
    is: its friend gets EOF, not a wait."""
    async with listening(friends) as (listener, port):
        client = await fst.open_tcp_stream(LOCALHOST, port, friends=friends)
        async with await listener.accept() as server:
            assert_path(friends, client, server)
            with resource_warnings_raised() as raised:
                del client
                gc.collect()
            assert any(isinstance(exc, ResourceWarning) for exc in raised), raised
            with trio.fail_after(TIMEOUT):
                assert await server.receive_some() == b""


# -- what review found: send_eof after a reset, a collection on another thread ----------------


async def test_send_eof_after_a_reset_stays_broken(friends):
    async with stream_pair(friends) as (client, server):
        await server.send_all(b"never read")
        await arrived(friends, client)
        await client.aclose()  # unread bytes: a reset
        with trio.fail_after(TIMEOUT):
            with pytest.raises(trio.BrokenResourceError):
                await server.receive_some(10)
            for _ in range(2):
                with pytest.raises(trio.BrokenResourceError):
                    await server.send_eof()
            with pytest.raises(trio.BrokenResourceError):
                await server.send_all(b"x")


async def test_send_eof_stays_idempotent_after_aclose(friends):
    async with stream_pair(friends) as (client, server):
        await client.send_eof()
        await client.aclose()
        with assert_checkpoints():
            await client.send_eof()
        with trio.fail_after(TIMEOUT):
            assert await receive_until_eof(server) == b""


async def test_a_stream_collected_on_another_thread_closes_through_its_run():
    """The collector may run on any thread, while the friend waits in
    receive_some: the friend still gets the bytes and EOF."""
    async with listening(None) as (listener, port):
        client = await fst.open_tcp_stream(LOCALHOST, port)
        async with await listener.accept() as server:
            assert_path(True, client, server)
            await client.send_all(b"last words")
            received = []

            async def receive() -> None:
                received.append(await receive_until_eof(server))

            with trio.fail_after(TIMEOUT):
                async with trio.open_nursery() as nursery:
                    nursery.start_soon(receive)
                    await wait_all_tasks_blocked()  # the friend is parked
                    gc.disable()  # only the other thread's collection may free it
                    try:
                        with warnings.catch_warnings(record=True) as caught:
                            warnings.simplefilter("always")
                            del client
                            await trio.to_thread.run_sync(gc.collect)
                    finally:
                        gc.enable()
            messages = [str(w.message) for w in caught if issubclass(w.category, ResourceWarning)]
            # Named as the stdlib's finalizer names a socket: filters match alike.
            assert messages and messages[0].startswith("unclosed <socket.socket fd="), caught
            assert received == [b"last words"]




async def test_cancelled_open_tcp_listeners_leaves_no_socket():
    listeners_before, fds_before = _registry.listener_count(), descriptors_open()
    with trio.CancelScope() as scope:
        scope.cancel()
        await fst.open_tcp_listeners(0, host=LOCALHOST)
    assert scope.cancelled_caught
    assert descriptors_open() == fds_before
    assert _registry.listener_count() == listeners_before
