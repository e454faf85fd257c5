"""Shared pieces of the trio tests: a connected pair of streams on either
path, pairing assertions, clogging, leak checks, and an asyncio loop in a
thread that a trio test can drive."""

from __future__ import annotations

import asyncio
import contextlib
import gc
import socket
import warnings
from typing import Any, AsyncIterator, Awaitable, Dict, List, Optional, Tuple

import pytest
import trio
import trio.testing

import friendsock
import friendsock.trio as fst
from test_threads import LoopThread

LOCALHOST = "127.0.0.1"
TIMEOUT = 10
MiB = 1 << 20


# -- pairing assertions -----------------------------------------------------------


def assert_path(friends: bool, *streams: Any) -> None:
    """Each stream took the path under test: a FriendStream on the friend
    path, trio's own SocketStream on real TCP."""
    for stream in streams:
        assert fst.is_friend(stream) is friends, stream
        assert friendsock.is_friend(stream) is friends, stream
        if friends:
            assert isinstance(stream, fst.FriendStream), stream
        else:
            assert type(stream) is trio.SocketStream, stream
        assert isinstance(stream, trio.abc.HalfCloseableStream)


def fallbacks_since(before: friendsock.FriendStats) -> Dict[str, int]:
    after = friendsock.stats().fallbacks
    moved = {k: after.get(k, 0) - before.fallbacks.get(k, 0) for k in set(after) | set(before.fallbacks)}
    return {k: v for k, v in moved.items() if v}


def assert_paired_since(before: friendsock.FriendStats, friends: bool, count: int = 1) -> None:
    """``count`` connections made since ``before`` paired (friends) or all
    took real TCP because both ends opted out (not friends)."""
    after = friendsock.stats()
    if friends:
        assert after.links_made - before.links_made == count
        assert fallbacks_since(before) == {}, fallbacks_since(before)
    else:
        assert after.links_made == before.links_made
        assert fallbacks_since(before) == {"opted-out": count}, fallbacks_since(before)


def sockopt(stream: Any, option: int) -> int:
    return stream.getsockopt(socket.SOL_SOCKET, option)


def capacity(writer: Any, reader: Any) -> int:
    """What ``writer`` may queue toward ``reader`` before send_all blocks."""
    return sockopt(writer, socket.SO_SNDBUF) + sockopt(reader, socket.SO_RCVBUF)


# -- a connected pair ---------------------------------------------------------------


@contextlib.asynccontextmanager
async def listening(friends: Optional[bool], host: str = LOCALHOST, **kwargs: Any):
    """friendsock listeners on ``host``, port 0; yields (first listener, its port)."""
    listeners = await fst.open_tcp_listeners(0, host=host, friends=friends, **kwargs)
    try:
        yield listeners[0], listeners[0].socket.getsockname()[1]
    finally:
        for listener in listeners:
            await listener.aclose()


@contextlib.asynccontextmanager
async def stream_pair(
    friends: bool, host: str = LOCALHOST
) -> AsyncIterator[Tuple[trio.abc.HalfCloseableStream, trio.abc.HalfCloseableStream]]:
    """A (client, server) pair on the path under test, connect then accept
    in this one task; both closed (forcefully) afterwards."""
    before = friendsock.stats()
    async with listening(friends, host) as (listener, port):
        with trio.fail_after(TIMEOUT):
            client = await fst.open_tcp_stream(host, port, friends=friends)
        try:
            with trio.fail_after(TIMEOUT):
                server = await listener.accept()
            try:
                assert_path(friends, client, server)
                assert_paired_since(before, friends)
                assert client.socket.getsockname() == server.socket.getpeername()
                assert client.socket.getpeername() == server.socket.getsockname()
                yield client, server
            finally:
                await trio.aclose_forcefully(server)
        finally:
            await trio.aclose_forcefully(client)


async def fill(stream: trio.abc.SendStream, chunk: int = 64 * 1024) -> int:
    """Send until send_all blocks (nothing else runnable), then cancel it.
    Returns how many bytes were handed to send_all (the cancelled call's
    included; on the friend path they all stay queued)."""
    handed = 0

    async def sender() -> None:
        nonlocal handed
        while True:
            handed += chunk
            await stream.send_all(b"x" * chunk)

    async with trio.open_nursery() as nursery:
        nursery.start_soon(sender)
        await trio.testing.wait_all_tasks_blocked()
        nursery.cancel_scope.cancel()
    return handed


async def shrink_buffers(writer: Any, reader: Any) -> None:
    writer.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, 4096)
    reader.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)


async def receive_exactly(stream: trio.abc.ReceiveStream, size: int, max_bytes: int = 256 * 1024) -> bytes:
    got = bytearray()
    while len(got) < size:
        data = await stream.receive_some(min(max_bytes, size - len(got)))
        assert data, f"EOF after {len(got)} of {size} bytes"
        got += data
    return bytes(got)


async def receive_until_eof(stream: trio.abc.ReceiveStream, max_bytes: Optional[int] = None) -> bytes:
    got = bytearray()
    while True:
        data = await stream.receive_some(max_bytes)
        if not data:
            return bytes(got)
        if max_bytes is not None:
            assert len(data) <= max_bytes
        got += data


# -- leak checks ------------------------------------------------------------------------


@pytest.fixture(autouse=True)
def nothing_left_behind():
    """After the test (and its trio.run, and its other fixtures): no link
    alive that was not alive before, no pending connect, nothing that warns
    when collected (ResourceWarning is an error in this suite)."""
    before = friendsock.stats()
    yield
    gc.collect()
    after = friendsock.stats()
    assert after.links_alive == before.links_alive, "friend links left alive"
    assert after.pending == 0, "pending connects left behind"


# -- an asyncio loop in another thread, driven from trio ------------------------------


class AsyncioThread(LoopThread):
    """An asyncio (or uvloop) loop running forever in a thread of its own,
    driven from trio: ``run`` awaits from a trio task, and ``close`` records
    what the loop reports left open instead of raising inside C."""

    def __init__(self, kind: str) -> None:
        super().__init__(kind)
        self.leaked: List[str] = []

    async def run(self, aw: Awaitable[Any], timeout: float = TIMEOUT) -> Any:
        """Await ``aw`` on this loop from a trio task, bounded by ``timeout``."""

        async def wrapper() -> Any:
            return await aw

        future = asyncio.run_coroutine_threadsafe(wrapper(), self.loop)
        token = trio.lowlevel.current_trio_token()
        done = trio.Event()

        def wake(_future: Any) -> None:
            with contextlib.suppress(trio.RunFinishedError):
                token.run_sync_soon(done.set)

        future.add_done_callback(wake)
        try:
            with trio.fail_after(timeout):
                await done.wait()
        except BaseException:
            future.cancel()
            raise
        return future.result()

    def close(self) -> None:
        self.stop()
        if not self.loop.is_closed():
            with warnings.catch_warnings(record=True) as caught:
                warnings.simplefilter("always", ResourceWarning)
                self.loop.close()
            self.leaked += [str(w.message) for w in caught if issubclass(w.category, ResourceWarning)]

    async def aclose(self) -> None:
        """close() without blocking the trio thread."""
        await trio.to_thread.run_sync(self.close)


async def until_readable(sock: Any) -> None:
    """Until the trio socket ``sock`` has something to read, bounded (a
    friend socket's descriptor is not the connection's: trio's
    wait_readable would not see it)."""
    with trio.fail_after(TIMEOUT):
        await trio.testing.wait_all_tasks_blocked()
        while not sock.is_readable():
            await trio.sleep(0)


# -- parity tests: the same calls over TCP and paired --------------------------------


async def answer_each(names: List[str], pairs: List[Tuple[Any, Any]], drive: Any, answer: Any) -> Dict[str, Any]:
    """``answer(name, client)`` for each of ``names`` on its own pair of
    ``pairs`` (the same order), the pair put in its state by ``drive(client,
    server)`` just before: the pairs side by side, in tasks of their own, so
    that the calls that wait are given their wait all at once, not one after
    another (each still has the whole of it; a pair is its own, what one
    does no other sees)."""
    found: Dict[str, Any] = {}

    async def one(name: str, client: Any, server: Any) -> None:
        await drive(client, server)
        found[name] = await answer(name, client)

    async with trio.open_nursery() as nursery:
        for name, (client, server) in zip(names, pairs):
            nursery.start_soon(one, name, client, server)
    return {name: found[name] for name in names}


def differences_under_trio(answers: Any, state: str, socketless: bool, wait: float) -> Dict[str, Any]:
    """The calls whose answers differ over TCP and paired (see
    ``support.answers_that_differ``), ``answers(state, names, wait)`` run by
    ``trio.run`` once as trio is, once under ``friendsock.trio.install()``
    (socketless or not), which must make links exactly then."""
    from support import answers_that_differ

    def run(paired: bool, names: Optional[List[str]] = None, wait: float = wait) -> Dict[str, Any]:
        made = friendsock.stats().links_made
        if paired:
            fst.install()
        friendsock.set_socketless(paired and socketless)
        try:
            found = trio.run(answers, state, names, wait)
        finally:
            friendsock.set_socketless(False)
            fst.uninstall()
        assert (friendsock.stats().links_made > made) is paired
        return found

    return answers_that_differ(run(False), run(True), lambda name, paired: run(paired, [name], 1.0)[name])
