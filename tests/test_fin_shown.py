"""A connection pool learns that its server closed an idle connection by
polling the connection's descriptor (httpcore polls
``get_extra_info('socket')``'s, urllib3 its socket): over TCP it polls
readable once the peer's FIN came. A friend link's bytes never cross the
real sockets, so a friend end done writing sends its real socket's FIN
too: whatever kind of end wrote (an asyncio or uvloop transport, a trio
stream or socket, a blocking socket) and whatever kind reads (a
transport's socket, a trio stream's or socket, polled or waited on with
``trio.lowlevel.wait_readable``),
on one loop or across threads, on both paths."""

from __future__ import annotations

import asyncio
import contextlib
import functools
import select
import socket
import threading
from typing import Any, Callable, Iterator, List, Tuple

import pytest
import trio
import uvloop

import friendsock
import friendsock.trio as fst

HOST = "127.0.0.1"
TIMEOUT = 10.0


class Steps:
    """What the two ends tell each other across threads, each wait bounded."""

    def __init__(self) -> None:
        self.port: List[int] = []
        self.listening = threading.Event()
        self.finish = threading.Event()  # the reader has looked (or not): done writing now
        self.written = threading.Event()  # the writer is done writing (and closed, or not)

    def wait(self, event: threading.Event) -> None:
        assert event.wait(TIMEOUT), "the other end did not get there"


# -- finishing writing, each kind of end its way: shut down writing (and maybe
# close at once), or close; then, still open, read until the other end closes.


async def asyncio_finish(reader: asyncio.StreamReader, writer: asyncio.StreamWriter, how: str,
                         steps: Steps) -> None:
    if how != "close":
        writer.write_eof()
    if how != "shutdown":
        writer.close()
    steps.written.set()
    if how == "shutdown":
        await asyncio.wait_for(reader.read(), TIMEOUT)
        writer.close()


async def trio_finish(stream: Any, how: str, steps: Steps) -> None:
    if how != "close":
        await stream.send_eof()
    if how != "shutdown":
        await stream.aclose()
    steps.written.set()
    if how == "shutdown":
        while await stream.receive_some():
            pass


def blocking_finish(conn: socket.socket, how: str, steps: Steps) -> None:
    if how != "close":
        conn.shutdown(socket.SHUT_WR)
    if how != "shutdown":
        conn.close()
    steps.written.set()
    if how == "shutdown":
        while conn.recv(1024):
            pass


async def trio_listen(friends: bool, steps: Steps, unchanged: bool) -> Any:
    """friendsock.trio's listeners, or (``unchanged``) trio's own, which pair
    under friendsock.trio.install() (friend trio sockets); the port posted."""
    listeners = await (trio.open_tcp_listeners(0, host=HOST) if unchanged
                       else fst.open_tcp_listeners(0, host=HOST, friends=friends))
    steps.port.append(listeners[0].socket.getsockname()[1])
    steps.listening.set()
    return listeners


async def trio_connect(friends: bool, steps: Steps, waits: Callable[..., Any], unchanged: bool) -> Any:
    await waits(steps.listening)
    stream = await (trio.open_tcp_stream(HOST, steps.port[0]) if unchanged
                    else fst.open_tcp_stream(HOST, steps.port[0], friends=friends))
    assert friendsock.is_friend(stream) is friends
    return stream


# -- the end that finishes writing: the server -------------------------------------


async def asyncio_writer(friends: bool, how: str, steps: Steps, waits: Callable[..., Any]) -> None:
    done = asyncio.get_running_loop().create_future()

    async def answer(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            await reader.readline()
            writer.write(b"OK\n")
            await waits(steps.finish)
            await asyncio_finish(reader, writer, how, steps)
            await writer.wait_closed()
        finally:
            done.set_result(None)

    server = await friendsock.start_server(answer, HOST, 0, friends=friends)
    steps.port.append(server.sockets[0].getsockname()[1])
    steps.listening.set()
    try:
        await asyncio.wait_for(done, TIMEOUT)
    finally:
        server.close()
        await server.wait_closed()


async def trio_writer(friends: bool, how: str, steps: Steps, waits: Callable[..., Any],
                      unchanged: bool = False) -> None:
    listeners = await trio_listen(friends, steps, unchanged)
    try:
        with trio.fail_after(TIMEOUT):
            stream = await listeners[0].accept()
            async with stream:
                while not (await stream.receive_some()).endswith(b"\n"):
                    pass
                await stream.send_all(b"OK\n")
                await waits(steps.finish)
                await trio_finish(stream, how, steps)
    finally:
        for listener in listeners:
            await listener.aclose()


def blocking_writer(friends: bool, how: str, steps: Steps) -> None:
    with socket.create_server((HOST, 0)) as listener:
        steps.port.append(listener.getsockname()[1])
        steps.listening.set()
        listener.settimeout(TIMEOUT)
        conn, _ = listener.accept()
        with conn:
            conn.settimeout(TIMEOUT)
            assert friendsock.is_friend(conn) is friends
            conn.makefile("rb").readline()
            conn.sendall(b"OK\n")
            steps.wait(steps.finish)
            blocking_finish(conn, how, steps)


# -- the end whose descriptor is polled: the client ----------------------------------


def polls_readable(fd: int, timeout: float) -> bool:
    poller = select.poll()
    poller.register(fd, select.POLLIN)
    return poller.poll(int(timeout * 1000)) != []


async def asyncio_reader(friends: bool, asked: str, steps: Steps, waits: Callable[..., Any]) -> None:
    await waits(steps.listening)
    reader, writer = await friendsock.open_connection(HOST, steps.port[0], friends=friends)
    try:
        assert friendsock.is_friend(writer) is friends
        writer.write(b"hi\n")
        assert await asyncio.wait_for(reader.readline(), TIMEOUT) == b"OK\n"
        if asked == "before":
            assert not polls_readable(writer.get_extra_info("socket").fileno(), 0)
        steps.finish.set()
        if asked == "after":
            await waits(steps.written)
        fd = writer.get_extra_info("socket").fileno()
        # Off the loop: the writer may run on it.
        assert await asyncio.to_thread(polls_readable, fd, TIMEOUT), "no FIN to see"
        assert await asyncio.wait_for(reader.read(), TIMEOUT) == b""
    finally:
        writer.close()
        await writer.wait_closed()


async def trio_reader(friends: bool, asked: str, steps: Steps, waits: Callable[..., Any],
                      unchanged: bool = False) -> None:
    with trio.fail_after(TIMEOUT):
        stream = await trio_connect(friends, steps, waits, unchanged)
        async with stream:
            await stream.send_all(b"hi\n")
            assert await stream.receive_some() == b"OK\n"
            if asked == "before":
                assert not polls_readable(stream.socket.fileno(), 0)
            steps.finish.set()
            if asked == "after":
                await waits(steps.written)
            await trio.lowlevel.wait_readable(stream.socket)
            assert await stream.receive_some() == b""


# -- running them ---------------------------------------------------------------------


async def asyncio_waits(event: threading.Event) -> None:
    """Wait for ``event`` (set on another thread, or on this loop) without
    holding up the loop."""
    assert await asyncio.to_thread(event.wait, TIMEOUT), "the other end did not get there"


async def trio_waits(event: threading.Event) -> None:
    assert await trio.to_thread.run_sync(event.wait, TIMEOUT), "the other end did not get there"


def run_on(kind: str, *ends: Callable[..., Any]) -> Callable[[], None]:
    """A function that runs ``ends`` (coroutine functions of ``waits``)
    together on one loop or trio run of ``kind``."""
    if kind.startswith("trio"):
        async def trio_main() -> None:
            async with trio.open_nursery() as nursery:
                for end in ends:
                    nursery.start_soon(end, trio_waits)

        return lambda: trio.run(trio_main)

    async def asyncio_main() -> None:
        await asyncio.gather(*(end(asyncio_waits) for end in ends))

    return lambda: (uvloop.run if kind == "uvloop" else asyncio.run)(asyncio_main())


@contextlib.contextmanager
def switched_on(friends: bool, kinds: Tuple[str, ...]) -> Iterator[None]:
    """Blocking sockets pair only while the socket module is patched, and
    unchanged trio code only under friendsock.trio.install()."""
    blocking, trio_unchanged = friends and "blocking" in kinds, friends and "trio-unchanged" in kinds
    if blocking:
        friendsock.patch_socket()
    if trio_unchanged:
        fst.install()
    try:
        yield
    finally:
        if trio_unchanged:
            fst.uninstall()
        if blocking:
            friendsock.unpatch_socket()


def run_threads(*targets: Callable[[], None]) -> None:
    """Each target in a thread of its own; their first failure raised."""
    failures: List[BaseException] = []

    def guarded(target: Callable[[], None]) -> None:
        try:
            target()
        except BaseException as exc:  # reported below, on the test's thread
            failures.append(exc)

    threads = [threading.Thread(target=guarded, args=(target,)) for target in targets]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(3 * TIMEOUT)
        assert not thread.is_alive(), "an end did not finish"
    if failures:
        raise failures[0]


@pytest.mark.parametrize("asked", ["before", "after"])
@pytest.mark.parametrize("how", ["close", "shutdown", "shutdown, close"])
@pytest.mark.parametrize("writer_kind", ["asyncio", "uvloop", "trio", "trio-unchanged", "blocking"])
@pytest.mark.parametrize("reader_kind", ["asyncio", "uvloop", "trio", "trio-unchanged"])
def test_the_descriptor_polls_readable_once_the_friend_is_done_writing(
        friends, reader_kind, writer_kind, how, asked):
    """As over TCP: not readable while the peer is open (``asked``
    ``before``), readable once it closed or shut down writing (and maybe
    closed at once after), with the descriptor first asked for before or
    after that. (``trio``: friendsock.trio's streams; ``trio-unchanged``:
    trio's own, over friend trio sockets.)"""
    steps = Steps()
    readers = {"asyncio": asyncio_reader, "uvloop": asyncio_reader, "trio": trio_reader,
               "trio-unchanged": functools.partial(trio_reader, unchanged=True)}
    writers = {"asyncio": asyncio_writer, "uvloop": asyncio_writer, "trio": trio_writer,
               "trio-unchanged": functools.partial(trio_writer, unchanged=True)}

    def read(waits: Callable[..., Any]) -> Any:
        return readers[reader_kind](friends, asked, steps, waits)

    def write(waits: Callable[..., Any]) -> Any:
        return writers[writer_kind](friends, how, steps, waits)

    before = friendsock.stats().links_made
    with switched_on(friends, (reader_kind, writer_kind)):
        if writer_kind == reader_kind:  # one loop, one thread
            run_threads(run_on(reader_kind, write, read))
        elif writer_kind == "blocking":
            run_threads(lambda: blocking_writer(friends, how, steps), run_on(reader_kind, read))
        else:
            run_threads(run_on(writer_kind, write), run_on(reader_kind, read))
    assert friendsock.stats().links_made - before == (1 if friends else 0)


# -- a FIN that came before the reader's end was accepted ----------------------------


async def asyncio_client_writer(friends: bool, how: str, steps: Steps, waits: Callable[..., Any]) -> None:
    await waits(steps.listening)
    reader, writer = await friendsock.open_connection(HOST, steps.port[0], friends=friends)
    try:
        assert friendsock.is_friend(writer) is friends
        writer.write(b"hi\n")
        await asyncio_finish(reader, writer, how, steps)
    finally:
        writer.close()
        await writer.wait_closed()


async def trio_client_writer(friends: bool, how: str, steps: Steps, waits: Callable[..., Any],
                             unchanged: bool = False) -> None:
    with trio.fail_after(TIMEOUT):
        stream = await trio_connect(friends, steps, waits, unchanged)
        async with stream:
            await stream.send_all(b"hi\n")
            await trio_finish(stream, how, steps)


def blocking_client_writer(friends: bool, how: str, steps: Steps) -> None:
    steps.wait(steps.listening)
    with socket.create_connection((HOST, steps.port[0]), timeout=TIMEOUT) as conn:
        assert friendsock.is_friend(conn) is friends
        conn.sendall(b"hi\n")
        blocking_finish(conn, how, steps)


async def trio_server_reader(friends: bool, steps: Steps, waits: Callable[..., Any],
                             unchanged: bool = False) -> None:
    """Accepts only once the client is done writing, then waits for its
    descriptor to be readable, and reads the client's line and EOF."""
    listeners = await trio_listen(friends, steps, unchanged)
    try:
        await waits(steps.written)
        with trio.fail_after(TIMEOUT):
            stream = await listeners[0].accept()
            async with stream:
                assert friendsock.is_friend(stream) is friends
                await trio.lowlevel.wait_readable(stream.socket)
                received = b""
                while chunk := await stream.receive_some():
                    received += chunk
                assert received == b"hi\n"
    finally:
        for listener in listeners:
            await listener.aclose()


@pytest.mark.parametrize("how", ["close", "shutdown", "shutdown, close"])
@pytest.mark.parametrize("writer_kind", ["asyncio", "uvloop", "trio", "trio-unchanged", "blocking"])
@pytest.mark.parametrize("reader_kind", ["trio", "trio-unchanged"])
def test_the_descriptor_of_an_end_accepted_after_the_friend_finished_polls_readable(
        friends, reader_kind, writer_kind, how):
    """The client is done writing (and maybe closed) before the server
    accepts: the accepted socket's descriptor polls readable, as over TCP,
    though the server's end was not hooked in when the client finished."""
    steps = Steps()

    def read(waits: Callable[..., Any]) -> Any:
        return trio_server_reader(friends, steps, waits, unchanged=reader_kind == "trio-unchanged")

    def write(waits: Callable[..., Any]) -> Any:
        if writer_kind.startswith("trio"):
            return trio_client_writer(friends, how, steps, waits, unchanged=writer_kind == "trio-unchanged")
        return asyncio_client_writer(friends, how, steps, waits)

    before = friendsock.stats().links_made
    with switched_on(friends, (reader_kind, writer_kind)):
        if writer_kind == reader_kind:  # one trio run
            run_threads(run_on(reader_kind, read, write))
        elif writer_kind == "blocking":
            run_threads(run_on(reader_kind, read), lambda: blocking_client_writer(friends, how, steps))
        else:
            run_threads(run_on(reader_kind, read), run_on(writer_kind, write))
    assert friendsock.stats().links_made - before == (1 if friends else 0)
