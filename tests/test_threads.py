"""Friends across threads: the two ends on different event loops.

The test's own loop (asyncio or uvloop, from conftest) runs one end; a loop
of either kind in a second thread runs the other, so asyncio<->asyncio,
asyncio<->uvloop, uvloop<->asyncio and uvloop<->uvloop are all covered.
Every callback must run on its own end's loop thread, bytes and accounting
must hold across the threads, and a burst of writes costs the reader's loop
one wake-up.
"""

from __future__ import annotations

import asyncio
import hashlib
import os
import random
import socket
import sys
import threading
import warnings
from typing import Any, Awaitable, Callable, List, Optional, Set

import pytest
import uvloop

import friendsock
from friendsock._asyncio import _loop_state, _wakeups
from friendsock._core._channel import ChannelState
from friendsock._core._locked_channel import LockedChannel
from friendsock._core._registry import registry
from support import (  # noqa: F401 (a fixture)
    LOCALHOST,
    ContextRecorder,
    Recorder,
    chunked,
    fallbacks_since,
    patient_confirm,
    port_of,
    request_var,
)

TIMEOUT = 10
MiB = 1 << 20
LOOP_FACTORIES = {"asyncio": asyncio.new_event_loop, "uvloop": uvloop.new_event_loop}


class LoopThread:
    """An event loop running in a thread of its own."""

    def __init__(self, kind: str) -> None:
        self.kind = kind
        self.loop = LOOP_FACTORIES[kind]()
        self.errors: List[dict] = []
        self.loop.set_exception_handler(lambda _loop, context: self.errors.append(context))
        self.thread = threading.Thread(target=self.loop.run_forever, name=f"other-{kind}", daemon=True)
        self.thread.start()

    async def run(self, aw: Awaitable[Any], timeout: float = TIMEOUT) -> Any:
        """Await ``aw`` on this loop, from another loop, with a bound."""

        async def wrapper() -> Any:
            return await aw

        future = asyncio.run_coroutine_threadsafe(wrapper(), self.loop)
        return await asyncio.wait_for(asyncio.wrap_future(future), timeout)

    async def call(self, fn: Callable[..., Any], *args: Any) -> Any:
        """``fn(*args)`` on this loop's thread; its result."""

        async def invoke() -> Any:
            return fn(*args)

        return await self.run(invoke())

    def stop(self) -> None:
        if self.thread.is_alive():
            self.loop.call_soon_threadsafe(self.loop.stop)
            self.thread.join(TIMEOUT)
            assert not self.thread.is_alive(), "the other loop did not stop"

    def close(self) -> None:
        self.stop()
        if not self.loop.is_closed():
            self.loop.close()


@pytest.fixture(params=["asyncio", "uvloop"])
def other(request):
    """A loop of either kind in a second thread; must see no loop errors."""
    thread = LoopThread(request.param)
    try:
        yield thread
    finally:
        thread.close()
    assert thread.errors == []


class Here:
    """The test's own loop, with LoopThread's interface."""

    def __init__(self) -> None:
        self.loop = asyncio.get_running_loop()
        self.thread = threading.current_thread()

    async def run(self, aw: Awaitable[Any], timeout: float = TIMEOUT) -> Any:
        return await asyncio.wait_for(aw, timeout)

    async def call(self, fn: Callable[..., Any], *args: Any) -> Any:
        return fn(*args)


class ThreadRecorder(Recorder):
    """A Recorder that notes which thread ran each callback, and pause/resume."""

    def __init__(self, eof_keep_open: bool = False) -> None:
        super().__init__(eof_keep_open)
        self.threads: Set[int] = set()
        self.flow: List[str] = []
        loop = asyncio.get_running_loop()
        self.paused = loop.create_future()
        self.resumed = loop.create_future()

    def connection_made(self, transport) -> None:
        self.threads.add(threading.get_ident())
        super().connection_made(transport)

    def data_received(self, data: bytes) -> None:
        self.threads.add(threading.get_ident())
        super().data_received(data)

    def eof_received(self):
        self.threads.add(threading.get_ident())
        return super().eof_received()

    def connection_lost(self, exc) -> None:
        self.threads.add(threading.get_ident())
        super().connection_lost(exc)

    def pause_writing(self) -> None:
        self.threads.add(threading.get_ident())
        self.flow.append("pause")
        if not self.paused.done():
            self.paused.set_result(None)

    def resume_writing(self) -> None:
        self.threads.add(threading.get_ident())
        self.flow.append("resume")
        if not self.resumed.done():
            self.resumed.set_result(None)


class EchoUntilEof(ThreadRecorder):
    """Writes back what it reads; at EOF closes after the echo."""

    def data_received(self, data: bytes) -> None:
        super().data_received(data)
        self.transport.write(data)


class Factory:
    """A protocol factory that keeps what it made; ``first`` resolves (on
    the factory's loop) with the first protocol."""

    def __init__(self, make: Callable[[], asyncio.BaseProtocol] = ThreadRecorder) -> None:
        self.make = make
        self.made: List[Any] = []
        self.first: Optional[asyncio.Future] = None

    def __call__(self) -> Any:
        protocol = self.make()
        self.made.append(protocol)
        if self.first is None:
            self.first = asyncio.get_running_loop().create_future()
        if not self.first.done():
            self.first.set_result(protocol)
        return protocol

    async def wait_first(self) -> Any:
        while self.first is None:  # set on the factory's loop; polled here
            await asyncio.sleep(0)
        return await self.first


async def make_server(side: Any, factory: Any, **kwargs: Any) -> Any:
    return await side.run(friendsock.create_server(factory, LOCALHOST, 0, **kwargs))


async def close_server(side: Any, server: Any) -> None:
    await side.call(server.close)


# -- the core channel, one writer thread and one reader thread ----------------


def test_locked_channel_loses_no_byte_and_no_wakeup():
    """A writer thread and a reader thread hammer one LockedChannel with
    flow control: the writer waits for notify_writable past a threshold, the
    reader for notify_readable when empty. A lost wake-up leaves one of them
    waiting (and the test fails on the bounded wait); a lost, repeated or
    reordered byte fails the digest; the accounting must end at zero."""
    channel = LockedChannel(sndbuf=3000, rcvbuf=2000)
    readable, writable = threading.Event(), threading.Event()
    channel.attach_reader(readable.set)
    channel.attach_writer(writable.set)
    rng = random.Random(9)
    chunks = [rng.randbytes(rng.choice((1, 7, 100, 1500, 9000))) for _ in range(20_000)]
    sent, received = hashlib.sha256(), hashlib.sha256()
    stuck: List[str] = []
    total = [0]

    def writer() -> None:
        for chunk in chunks:
            channel.push(chunk)
            sent.update(chunk)
            if channel.write_buffer_size() > 4000:
                writable.clear()  # clear, then ask: a wake-up cannot slip between
                if not channel.wake_writer_at(1000) and not writable.wait(TIMEOUT):
                    stuck.append(f"writer, buffer {channel.write_buffer_size()}")
                    return
        channel.shutdown()

    def reader() -> None:
        buffer = memoryview(bytearray(4096))
        while True:
            readable.clear()
            channel.begin_drain()  # from here a push notifies again
            while channel.queued:
                if rng.random() < 0.5:
                    data = channel.pull(rng.randint(1, 20_000))
                else:
                    data = bytes(buffer[:channel.pull_into(buffer)])
                received.update(data)
                total[0] += len(data)
            state = channel.state  # before the count, as the transport reads it
            if not channel.queued and state is ChannelState.EOF:
                return
            if not readable.wait(TIMEOUT):
                stuck.append(f"reader, {channel.queued} queued, {state}")
                return

    threads = [threading.Thread(target=writer), threading.Thread(target=reader)]
    interval = sys.getswitchinterval()
    sys.setswitchinterval(1e-6)  # switch threads between almost any two bytecodes
    try:
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(2 * TIMEOUT)
    finally:
        sys.setswitchinterval(interval)
    assert stuck == [] and not any(thread.is_alive() for thread in threads)
    assert total[0] == sum(map(len, chunks))
    assert received.digest() == sent.digest()
    assert channel.queued == 0 and channel.write_buffer_size() == 0


# -- pairing and bytes across loops -------------------------------------------


@pytest.mark.parametrize("server_on", ["other", "here"])
async def test_echo_across_loops(other, server_on):
    """A 3 MiB echo, the server on one loop, the client on the other."""
    here = Here()
    server_side, client_side = (other, here) if server_on == "other" else (here, other)
    payload = random.Random(1).randbytes(3 * MiB)
    chunks = chunked(payload, random.Random(2), largest=128 * 1024)
    before = friendsock.stats()
    factory = Factory(EchoUntilEof)
    server = await make_server(server_side, factory)
    try:
        transport, client = await client_side.run(
            friendsock.create_connection(ThreadRecorder, LOCALHOST, port_of(server))
        )
        echo = await server_side.run(factory.wait_first())

        def send() -> None:
            for chunk in chunks:
                transport.write(chunk)
            transport.write_eof()

        await client_side.call(send)
        assert await client_side.run(client.lost) is None
        assert await server_side.run(echo.lost) is None
    finally:
        await close_server(server_side, server)
    assert friendsock.is_friend(transport) and friendsock.is_friend(echo.transport)
    assert client.data == payload and echo.data == payload
    assert client.events == ["made", "data", "eof", "lost"]
    assert echo.events == ["made", "data", "eof", "lost"]
    # Each end's callbacks ran on its own loop's thread, and nowhere else.
    assert client.threads == {client_side.thread.ident}
    assert echo.threads == {server_side.thread.ident}
    after = friendsock.stats()
    assert fallbacks_since(before) == {}
    assert after.links_made == before.links_made + 1
    assert after.links_alive == before.links_alive
    assert after.bytes_moved - before.bytes_moved == 2 * len(payload)
    assert after.pending == 0


async def test_both_directions_at_once(other):
    """Both ends stream 4 MiB at each other at the same time, each from its
    own thread; every byte arrives, in order, on the right thread."""
    rng = random.Random(3)
    up, down = rng.randbytes(4 * MiB), rng.randbytes(4 * MiB)
    factory = Factory(lambda: ThreadRecorder(eof_keep_open=True))
    server = await make_server(other, factory)
    try:
        transport, client = await friendsock.create_connection(
            lambda: ThreadRecorder(eof_keep_open=True), LOCALHOST, port_of(server)
        )
        peer = await other.run(factory.wait_first())

        def stream(writer: asyncio.Transport, payload: bytes, seed: int) -> None:
            for chunk in chunked(payload, random.Random(seed), largest=64 * 1024):
                writer.write(chunk)
            writer.write_eof()

        # The far end starts writing on its thread while we write on ours.
        far = asyncio.ensure_future(other.call(stream, peer.transport, down, 4))
        stream(transport, up, 5)
        await far
        await asyncio.wait_for(client.eof, TIMEOUT)
        await other.run(peer.eof)
        transport.close()
        await other.call(peer.transport.close)
        assert await asyncio.wait_for(client.lost, TIMEOUT) is None
        assert await other.run(peer.lost) is None
    finally:
        await close_server(other, server)
    assert hashlib.sha256(peer.data).digest() == hashlib.sha256(up).digest()
    assert hashlib.sha256(client.data).digest() == hashlib.sha256(down).digest()
    assert client.threads == {threading.get_ident()}
    assert peer.threads == {other.thread.ident}


async def test_confirmed_listener_pairs_across_loops(other, patient_confirm):  # noqa: F811
    """A listener handed in with sock= (maybe shared with other processes):
    the client waits for the claim, made on the server's thread, which may
    come before the client is even waiting. A missed claim would hold each
    connect for the whole (patient, 10 s) deadline: the bound is half that."""
    here = Here()
    sock = socket.socket()
    sock.bind((LOCALHOST, 0))
    sock.listen()
    factory = Factory(EchoUntilEof)
    server = await other.run(friendsock.create_server(factory, sock=sock))
    before = friendsock.stats()
    try:
        for index in range(5):
            transport, client = await asyncio.wait_for(
                friendsock.create_connection(ThreadRecorder, LOCALHOST, port_of(server)),
                TIMEOUT / 2,
            )
            assert friendsock.is_friend(transport)
            transport.write(b"confirmed %d" % index)
            transport.write_eof()
            assert await here.run(client.lost) is None
            assert client.data == b"confirmed %d" % index
    finally:
        await close_server(other, server)
    assert fallbacks_since(before) == {}
    assert friendsock.stats().pending == 0


# -- accounting and flow control across threads ---------------------------------


async def test_back_pressure_across_threads(other):
    """The reader (other thread) pauses: the writer pauses exactly at
    sndbuf + friend rcvbuf + high water, once; resumes once when the reader
    drains; nothing is lost."""
    factory = Factory(ThreadRecorder)
    server = await make_server(other, factory)
    try:
        transport, client = await friendsock.create_connection(
            ThreadRecorder, LOCALHOST, port_of(server)
        )
        reader = await other.run(factory.wait_first())
        await other.call(reader.transport.pause_reading)
        sndbuf = transport.get_extra_info("socket").getsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF)
        rcvbuf = await other.call(
            lambda: reader.transport.get_extra_info("socket").getsockopt(
                socket.SOL_SOCKET, socket.SO_RCVBUF
            )
        )
        low, high = transport.get_write_buffer_limits()
        block = random.Random(6).randbytes(64 * 1024)
        sent = bytearray()

        def write(size: int) -> None:
            while size:
                piece = block[: min(size, len(block))]
                transport.write(piece)
                sent.extend(piece)
                size -= len(piece)

        write(sndbuf + rcvbuf + high)
        assert client.flow == []
        assert transport.get_write_buffer_size() == high
        write(1)
        assert client.flow == ["pause"]
        write(100_000)  # a paused protocol may still write: the buffer grows
        assert transport.get_write_buffer_size() == high + 100_001
        await other.call(reader.transport.resume_reading)
        await asyncio.wait_for(client.resumed, TIMEOUT)
        assert transport.get_write_buffer_size() <= low
        assert await other.run(reader.wait_bytes(len(sent))) == sent
        assert client.flow == ["pause", "resume"]
        assert client.threads == {threading.get_ident()}
        transport.close()
        await other.run(reader.lost)
        await asyncio.wait_for(client.lost, TIMEOUT)
    finally:
        await close_server(other, server)


@pytest.mark.parametrize("friends", [True, False])
@pytest.mark.parametrize("writer_is", ["closing", "paused"])
async def test_a_writer_hears_its_buffer_drained_when_the_reader_takes_all_and_closes(
        other, friends, writer_is):
    """The writer has bytes in its own buffer, and has closed (or is paused
    by flow control); the reader, on its thread, takes every byte and
    closes at once, before the writer's loop learns that its buffer
    drained. The writer still hears it, as over TCP once its loop has sent
    the rest: connection_lost(None), or resume_writing()."""
    size = 0  # set once connected: more than the link holds
    reader_gone = threading.Event()

    class TakeAllThenClose(ThreadRecorder):
        def connection_made(self, transport) -> None:
            super().connection_made(transport)
            transport.pause_reading()  # until the writer has closed

        def data_received(self, data: bytes) -> None:
            super().data_received(data)
            if len(self.data) >= size:
                self.transport.close()

        def connection_lost(self, exc) -> None:
            super().connection_lost(exc)
            # Once the transport is done with the link (after this call).
            asyncio.get_running_loop().call_soon(reader_gone.set)

    factory = Factory(TakeAllThenClose)
    server = await make_server(other, factory, friends=friends)
    try:
        transport, client = await friendsock.create_connection(
            ThreadRecorder, LOCALHOST, port_of(server), friends=friends
        )
        assert friendsock.is_friend(transport) is friends
        reader = await other.run(factory.wait_first())
        rcvbuf = await other.call(lambda: reader.transport.get_extra_info("socket").getsockopt(
            socket.SOL_SOCKET, socket.SO_RCVBUF))
        sndbuf = transport.get_extra_info("socket").getsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF)
        _, high = transport.get_write_buffer_limits()
        # Beyond the link's capacity: past the high-water mark, or not as far.
        size = sndbuf + rcvbuf + (MiB if writer_is == "paused" else high // 2)
        payload = random.Random(7).randbytes(size)
        transport.write(payload)
        if writer_is == "closing":
            transport.close()
        if friends:  # (over TCP the kernel took some of it)
            assert transport.get_write_buffer_size() > 0
            assert client.paused.done() is (writer_is == "paused")
        other.loop.call_soon_threadsafe(reader.transport.resume_reading)
        if friends:
            # A friend's reader takes the writer's own buffer without the
            # writer's loop (over TCP that loop sends it): held until the
            # reader is gone, this loop hears of the drained buffer only
            # after the reader closed.
            assert reader_gone.wait(TIMEOUT)
        if writer_is == "paused":
            if client.paused.done():
                await asyncio.wait_for(client.resumed, TIMEOUT)
            transport.close()
        assert await asyncio.wait_for(client.lost, TIMEOUT) is None
        assert await other.run(reader.wait_bytes(size)) == payload
        await other.run(reader.lost)
    finally:
        await close_server(other, server)


async def test_setsockopt_on_the_reader_thread_moves_the_writer(other):
    """The reader grows its SO_RCVBUF on its own thread while the writer is
    paused: the writer's capacity grows with it, and it resumes."""
    factory = Factory(ThreadRecorder)
    server = await make_server(other, factory)
    try:
        transport, client = await friendsock.create_connection(
            ThreadRecorder, LOCALHOST, port_of(server)
        )
        reader = await other.run(factory.wait_first())
        await other.call(reader.transport.pause_reading)
        reader_sock = reader.transport.get_extra_info("socket")
        await other.call(reader_sock.setsockopt, socket.SOL_SOCKET, socket.SO_RCVBUF, 32 * 1024)
        transport.set_write_buffer_limits(high=0)
        sndbuf = transport.get_extra_info("socket").getsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF)
        rcvbuf = reader_sock.getsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF)
        filler = b"f" * (sndbuf + rcvbuf + 512 * 1024)
        transport.write(filler)
        assert client.flow == ["pause"]
        size = transport.get_write_buffer_size()
        assert size == 512 * 1024
        await other.call(reader_sock.setsockopt, socket.SOL_SOCKET, socket.SO_RCVBUF, 2 * MiB)
        await asyncio.wait_for(client.resumed, TIMEOUT)
        assert transport.get_write_buffer_size() == 0 < size
        assert client.flow == ["pause", "resume"]
        await other.call(reader.transport.resume_reading)
        assert len(await other.run(reader.wait_bytes(len(filler)))) == len(filler)
        transport.close()
        await asyncio.wait_for(client.lost, TIMEOUT)
        await other.run(reader.lost)
    finally:
        await close_server(other, server)


class WakeupCounter:
    """Counts the writes of every loop's wake-up fd, and the callbacks handed
    to ``loop`` with call_soon_threadsafe (``original`` is the real one)."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch, loop: asyncio.AbstractEventLoop) -> None:
        self.signals: List[int] = []
        self.threadsafe: List[str] = []
        signal = _wakeups._signal

        def counting_signal(fd: int, value: int) -> None:
            self.signals.append(fd)
            signal(fd, value)

        monkeypatch.setattr(_wakeups, "_signal", counting_signal)
        self._loop = loop
        self.original = original = loop.call_soon_threadsafe

        def counting(callback: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
            self.threadsafe.append(getattr(callback, "__qualname__", repr(callback)))
            return original(callback, *args, **kwargs)

        loop.call_soon_threadsafe = counting  # type: ignore[method-assign]

    def clear(self) -> None:
        del self.signals[:], self.threadsafe[:]

    def restore(self) -> None:
        del self._loop.call_soon_threadsafe  # the class's method again


async def test_a_burst_costs_the_reader_one_wakeup(other, monkeypatch):
    """1000 writes while the reader's loop is busy: its loop is woken once
    (one write of its wake-up fd, no call_soon_threadsafe), and one drain
    delivers them all."""
    counted = WakeupCounter(monkeypatch, other.loop)
    factory = Factory(ThreadRecorder)
    server = await make_server(other, factory)
    try:
        transport, client = await friendsock.create_connection(
            ThreadRecorder, LOCALHOST, port_of(server)
        )
        reader = await other.run(factory.wait_first())
        wakeup = wakeup_of(other.loop)
        busy, release = threading.Event(), threading.Event()

        def block() -> None:  # keeps the reader's loop inside one callback
            busy.set()
            release.wait(TIMEOUT)

        counted.original(block)
        assert await asyncio.get_running_loop().run_in_executor(None, busy.wait, TIMEOUT)
        counted.clear()
        for index in range(1000):
            transport.write(b"%04d" % index)
        woken, handed = list(counted.signals), list(counted.threadsafe)
        release.set()
        expected = b"".join(b"%04d" % i for i in range(1000))
        assert await other.run(reader.wait_bytes(len(expected))) == expected
        assert woken == [wakeup._signal_fd]
        assert handed == []
        assert reader.events == ["made", "data"]
        transport.close()
        await other.run(reader.lost)
        await asyncio.wait_for(client.lost, TIMEOUT)
    finally:
        await close_server(other, server)
        counted.restore()


class LockChecker(ThreadRecorder):
    """Fails if any lock of its link is held by its own thread while a
    protocol callback runs (acquiring a plain Lock it holds would block; a
    lock the other thread holds for a moment is released soon)."""

    def _check(self) -> None:
        transport = self.transport
        if transport is None:
            return
        end = transport._end
        for lock in (end.link._lock, end.outgoing._lock, end.incoming._lock):
            assert lock.acquire(timeout=TIMEOUT), "a lock was held during a protocol callback"
            lock.release()

    def data_received(self, data: bytes) -> None:
        self._check()
        super().data_received(data)
        self.transport.write(data)  # echo: the friend's channel, from here

    def eof_received(self):
        self._check()
        return super().eof_received()

    def pause_writing(self) -> None:
        self._check()
        super().pause_writing()

    def resume_writing(self) -> None:
        self._check()
        super().resume_writing()

    def connection_lost(self, exc) -> None:
        self._check()
        super().connection_lost(exc)


async def test_no_lock_is_held_while_a_protocol_callback_runs(other):
    factory = Factory(LockChecker)
    server = await make_server(other, factory)
    try:
        transport, client = await friendsock.create_connection(
            LockChecker, LOCALHOST, port_of(server)
        )
        assert transport._end.link.threaded
        peer = await other.run(factory.wait_first())

        def small_buffers(end: asyncio.Transport) -> None:
            sock = end.get_extra_info("socket")
            for option in (socket.SO_SNDBUF, socket.SO_RCVBUF):
                sock.setsockopt(socket.SOL_SOCKET, option, 8192)
            end.set_write_buffer_limits(1000)

        await other.call(small_buffers, peer.transport)
        small_buffers(transport)
        payload = random.Random(7).randbytes(MiB)
        for chunk in chunked(payload, random.Random(8), largest=32 * 1024):
            transport.write(chunk)
        # Both ends echo what they get: bounce it around a while.
        await asyncio.wait_for(client.wait_bytes(4 * MiB), TIMEOUT)
        transport.abort()
        await asyncio.wait_for(client.lost, TIMEOUT)
        await other.run(peer.lost)
    finally:
        await close_server(other, server)
    assert "pause" in peer.flow or "pause" in client.flow


async def test_the_writer_is_woken_through_its_loops_wakeup(other, monkeypatch):
    """A paused writer here, its reader on the other thread: the reader's
    drain wakes the writer through this loop's wake-up fd, as drains come,
    not through call_soon_threadsafe."""
    loop = asyncio.get_running_loop()
    factory = Factory(ThreadRecorder)
    server = await make_server(other, factory)
    counted = WakeupCounter(monkeypatch, loop)
    try:
        transport, client = await friendsock.create_connection(
            ThreadRecorder, LOCALHOST, port_of(server)
        )
        reader = await other.run(factory.wait_first())
        await other.call(reader.transport.pause_reading)
        transport.set_write_buffer_limits(high=64 * 1024)
        sent = 0
        while not client.flow:
            transport.write(b"w" * 64 * 1024)
            sent += 64 * 1024
        counted.clear()
        await other.call(reader.transport.resume_reading)
        await asyncio.wait_for(client.resumed, TIMEOUT)
        assert client.flow == ["pause", "resume"]
        assert client.threads == {threading.get_ident()}
        assert wakeup_of(loop)._signal_fd in counted.signals
        assert [name for name in counted.threadsafe if "Friend" in name or "Drain" in name] == []
        assert len(await other.run(reader.wait_bytes(sent))) == sent
        transport.close()
        await asyncio.wait_for(client.lost, TIMEOUT)
        await other.run(reader.lost)
    finally:
        counted.restore()
        await close_server(other, server)


@pytest.mark.parametrize("kind", ["asyncio", "uvloop"])
def test_a_wakeup_outstanding_when_its_loop_closed_still_finds_it_closed(kind):
    """A loop closes with a wake-up written and never read (a callback was
    handed over, the loop never ran it), and nobody saw the close: the next
    hand-over finds the loop closed and tears it down instead of trusting
    the outstanding wake-up; the fd is closed."""
    loop = LOOP_FACTORIES[kind]()
    torn_down: List[bool] = []
    queue = _wakeups.RemoteDrainQueue(loop, lambda: torn_down.append(True))
    ran: List[int] = []
    queue.add(lambda: ran.append(1))  # the wake-up is written, and outstanding
    fd = queue._fd
    assert fd_is_open(fd)
    loop.close()
    queue.add(lambda: ran.append(2))
    assert torn_down == [True] and ran == []
    queue.close()
    assert not fd_is_open(fd)
    queue.close()  # once is enough


def wakeup_of(loop: asyncio.AbstractEventLoop) -> Any:
    """The remote queue (and wake-up fd) friendsock keeps for ``loop``;
    looked up without making one (any thread may look)."""
    ref = _loop_state._states.get(loop)
    state = ref() if ref is not None else None
    assert state is not None and state._remote is not None
    return state._remote


def fd_is_open(fd: int) -> bool:
    try:
        os.fstat(fd)
    except OSError:
        return False
    return True


@pytest.mark.parametrize("server_kind", ["asyncio", "uvloop"])
async def test_a_loop_closed_under_open_links_leaves_no_wakeup_fd(other, server_kind):
    """Client and server on loops in two threads of their own, the link
    open both ways. The server's loop closes: the client gets a reset, and
    the closed loop's wake-up fd is closed with it (and uvloop finds nothing
    left open). Then the client's loop closes: its fd goes too."""
    before = friendsock.stats()
    doomed = LoopThread(server_kind)
    try:
        factory = Factory(ThreadRecorder)
        server = await make_server(doomed, factory)
        transport, client = await other.run(
            friendsock.create_connection(ThreadRecorder, LOCALHOST, port_of(server))
        )
        peer = await doomed.run(factory.wait_first())
        assert transport._end.link.threaded
        await other.call(transport.write, b"ping")
        assert await doomed.run(peer.wait_bytes(4)) == b"ping"
        await doomed.call(peer.transport.write, b"pong")
        assert await other.run(client.wait_bytes(4)) == b"pong"
        wakeups = [wakeup_of(doomed.loop), wakeup_of(other.loop)]
        fds = [wakeup._fd for wakeup in wakeups]
        assert fds[0] != fds[1] and all(fd_is_open(fd) for fd in fds)
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always", ResourceWarning)
            doomed.close()
        assert [str(w.message) for w in caught if issubclass(w.category, ResourceWarning)] == []
        assert isinstance(await other.run(client.lost), ConnectionResetError)
        assert client.events == ["made", "data", "lost"]
        assert wakeups[0]._fd == wakeups[0]._signal_fd == -1
        assert not fd_is_open(fds[0])
        assert fd_is_open(fds[1])  # the client's loop lives on
        assert friendsock.stats().links_alive == before.links_alive
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always", ResourceWarning)
            other.close()
        assert [str(w.message) for w in caught if issubclass(w.category, ResourceWarning)] == []
        assert wakeups[1]._fd == wakeups[1]._signal_fd == -1
        assert not fd_is_open(fds[1])
    finally:
        doomed.close()
    assert doomed.errors == []


# -- endings across threads -----------------------------------------------------


@pytest.mark.parametrize("side", ["client", "server"])
@pytest.mark.parametrize("how", ["close", "write_eof", "abort"])
async def test_callback_order_across_threads(other, how, side):
    """As tests/test_transport.py's test_callback_order, the ends on two
    threads: whoever ends it, how, both see what TCP shows."""
    here = Here()
    factory = Factory(ThreadRecorder)
    server = await make_server(other, factory)
    try:
        transport, client = await friendsock.create_connection(
            ThreadRecorder, LOCALHOST, port_of(server)
        )
        peer = await other.run(factory.wait_first())
        transport.write(b"hello")
        assert await other.run(peer.wait_bytes(5)) == b"hello"
        await other.call(peer.transport.write, b"world")
        assert await here.run(client.wait_bytes(5)) == b"world"
        ender, ender_side, far, far_side = (
            (client, here, peer, other) if side == "client" else (peer, other, client, here)
        )
        await ender_side.call(getattr(ender.transport, how))
        assert await ender_side.run(ender.lost) is None
        assert await far_side.run(far.lost) is None
        if how == "write_eof":
            assert ender.events == ["made", "data", "eof", "lost"]
        else:
            assert ender.events == ["made", "data", "lost"]
        assert far.events == ["made", "data", "eof", "lost"]
    finally:
        await close_server(other, server)
    assert friendsock.stats().pending == registry.pending_count() == 0


async def test_callbacks_across_threads_run_in_their_transports_context(other):
    """As tests/test_transport.py's test_protocol_callbacks_run_in_their_transports_context,
    the writer on another thread: the reader's callbacks run in its own
    transport's context, never in the one its loop's wake-up runs in."""
    factory = Factory(ContextRecorder)
    server = await make_server(other, factory)
    try:
        transport, client = await friendsock.create_connection(Recorder, LOCALHOST, port_of(server))
        reader = await other.run(factory.wait_first())

        async def send(request: str, data: bytes) -> None:
            request_var.set(request)
            transport.write(data)

        for count, data in enumerate([b"1", b"2"], 1):
            await asyncio.create_task(send(f"write {count}", data))
            assert await other.run(reader.wait_bytes(count)) == b"12"[:count]

        async def finish() -> None:
            request_var.set("eof")
            transport.write_eof()

        await asyncio.create_task(finish())
        await other.run(reader.lost)
        await asyncio.wait_for(client.lost, TIMEOUT)
    finally:
        await close_server(other, server)
    request = "made" if other.kind == "uvloop" else "none"
    assert reader.seen == [("data", request, 1), ("data", request, 2),
                           ("eof", request, 3), ("lost", request, 4)]
