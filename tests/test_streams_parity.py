"""asyncio streams over a friend link answer as over TCP, call by call and
state by state, on asyncio's loop and on uvloop: the same value, the same
exception type (and errno, and an IncompleteReadError's partial bytes), or
both wait.

As tests/test_blocking_parity.py: each state on a fresh connection, each
call on its own connection, every differing answer printed. Exception
messages are not compared (uvloop's name the transport's class).
"""

from __future__ import annotations

import asyncio
import socket
import struct
from typing import Any, Awaitable, Callable, Dict, List, Optional, Tuple, Union

import pytest

import friendsock
from parity_states import STREAMS, driver, states_of
from support import LOOP_RUNNERS, WAITED, answers_that_differ, descriptors_open, report, returned, until
from test_threads import Here, LoopThread

LOCALHOST = "127.0.0.1"
TIMEOUT = 10.0
WAIT = 0.05  # how long a call that would wait is given: WAITED on both paths
Streams = Tuple[asyncio.StreamReader, asyncio.StreamWriter]


def _buffered(reader: asyncio.StreamReader) -> int:
    return len(reader._buffer)  # type: ignore[attr-defined]


# -- the driver: the client's streams into each state of tests/parity_states.py --
def driver_on(served_loop: Union[Here, LoopThread], kind: str = STREAMS
              ) -> Dict[str, Callable[[Streams, Streams], Awaitable[None]]]:
    """The steps that put the client's streams in each state ``kind`` can
    be in, what they do to the served end done on ``served_loop`` (this
    loop, or another thread's)."""

    async def fresh(client: Streams, served: Streams) -> None:
        pass

    async def peer_sent(client: Streams, served: Streams) -> None:
        await served_loop.call(served[1].write, b"hello\nworld")
        await until(lambda: _buffered(client[0]) == 11)

    async def peer_wrote_eof(client: Streams, served: Streams) -> None:
        await served_loop.call(served[1].write_eof)
        await until(client[0].at_eof)

    async def peer_sent_and_wrote_eof(client: Streams, served: Streams) -> None:
        await served_loop.call(served[1].write, b"bye")
        await served_loop.call(served[1].write_eof)
        await until(lambda: client[0]._eof)  # type: ignore[attr-defined]

    async def peer_closed(client: Streams, served: Streams) -> None:
        await served_loop.call(served[1].close)
        await served_loop.run(served[1].wait_closed())
        await until(client[0].at_eof)

    async def peer_reset(client: Streams, served: Streams) -> None:
        await served_loop.call(served[1].transport.pause_reading)  # what comes stays unread, in the kernel
        client[1].write(b"never read")  # sent within the call, on either path
        await served_loop.call(served[1].transport.abort)
        await until(lambda: client[0].exception() is not None)

    async def peer_linger_zero(client: Streams, served: Streams) -> None:
        raw = served[1].get_extra_info("socket")
        await served_loop.call(raw.setsockopt, socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
        await served_loop.call(served[1].close)
        await until(lambda: client[0].exception() is not None or client[0].at_eof())

    async def we_wrote_eof(client: Streams, served: Streams) -> None:
        client[1].write_eof()
        await until(served[0].at_eof)

    async def we_closed(client: Streams, served: Streams) -> None:
        client[1].close()
        await client[1].wait_closed()

    async def we_aborted(client: Streams, served: Streams) -> None:
        client[1].transport.abort()
        await until(client[0].at_eof)

    async def reading_paused(client: Streams, served: Streams) -> None:
        client[1].transport.pause_reading()

    return driver(kind, {
        "fresh": fresh,
        "bytes to read": peer_sent,
        "peer shut writing": peer_wrote_eof,
        "peer sent, then shut writing": peer_sent_and_wrote_eof,
        "peer closed": peer_closed,
        "peer reset": peer_reset,
        "peer closed with SO_LINGER 0": peer_linger_zero,
        "we shut writing": we_wrote_eof,
        "closed": we_closed,
        "reading paused": reading_paused,
        "aborted": we_aborted,
    })


# -- calls ------------------------------------------------------------------------
async def _write_and_drain(writer: asyncio.StreamWriter) -> None:
    writer.write(b"x")
    await writer.drain()


async def _close_and_wait(writer: asyncio.StreamWriter) -> None:
    writer.close()
    await writer.wait_closed()


def _calls(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> Dict[str, Callable[[], Awaitable[Any]]]:
    return {
        "read(10)": lambda: reader.read(10),
        "read()": lambda: reader.read(),
        "readline": lambda: reader.readline(),
        "readexactly(3)": lambda: reader.readexactly(3),
        "readuntil": lambda: reader.readuntil(b"\n"),
        "at_eof": lambda: returned(reader.at_eof()),
        "exception": lambda: returned(type(reader.exception()).__name__),
        "write, drain": lambda: _write_and_drain(writer),
        "drain": lambda: writer.drain(),
        "write_eof": lambda: returned(writer.write_eof()),
        "can_write_eof": lambda: returned(writer.can_write_eof()),
        "is_closing": lambda: returned(writer.is_closing()),
        "wait_closed": lambda: writer.wait_closed(),
        "close, wait_closed": lambda: _close_and_wait(writer),
        "peername": lambda: returned(type(writer.get_extra_info("peername")).__name__),
        "get_write_buffer_size": lambda: returned(writer.transport.get_write_buffer_size()),
        "write, drain x3": lambda: _each([lambda: _write_and_drain(writer)] * 3),
        "read, read": lambda: _each([lambda: reader.read(10)] * 2),
    }


async def _each(calls: List[Callable[[], Awaitable[Any]]]) -> Any:
    return [await _answer(call) for call in calls]


async def _answer(call: Callable[[], Awaitable[Any]], wait: float = WAIT) -> Any:
    try:
        return "returned", await asyncio.wait_for(call(), wait)
    except asyncio.TimeoutError:
        return WAITED
    except asyncio.IncompleteReadError as exc:
        return "IncompleteReadError", exc.partial
    except OSError as exc:
        return type(exc).__name__, exc.errno
    except Exception as exc:  # noqa: BLE001 - compared by type
        return type(exc).__name__


async def _connection(friends: bool) -> Tuple[Streams, Streams, asyncio.AbstractServer]:
    accepted: "asyncio.Future[Streams]" = asyncio.get_running_loop().create_future()

    async def handler(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        accepted.set_result((reader, writer))

    server = await friendsock.start_server(handler, LOCALHOST, 0, friends=friends)
    port = server.sockets[0].getsockname()[1]
    descriptors = descriptors_open()
    # (friends=False: plain TCP on both ends, whatever the host's port
    # table says of the port, which another process may have held.)
    client = await asyncio.wait_for(friendsock.open_connection(LOCALHOST, port, friends=friends), TIMEOUT)
    assert friendsock.is_friend(client[1].transport) is friends
    served = await asyncio.wait_for(accepted, TIMEOUT)
    # Two sockets, the client's and the accepted one; none when socketless.
    assert descriptors_open() - descriptors == (0 if friends and friendsock.is_socketless() else 2)
    return client, served, server


async def answer_each(names: List[str], connections: List[Tuple[Streams, Streams]],
                      drive: Callable[[Streams, Streams], Awaitable[None]], wait: float) -> Dict[str, Any]:
    """Each call of ``names`` on its own connection of ``connections`` (the
    same order), the connection put in its state by ``drive`` just before:
    the connections side by side, so that the calls that wait are given
    their ``wait`` all at once, not one after another (each still has the
    whole of it; a connection is its own, what one does no other sees)."""

    async def answer(name: str, client: Streams, served: Streams) -> Any:
        await drive(client, served)
        # A sequence gives each of its calls ``wait``.
        return await _answer(_calls(*client)[name], wait * (2 + name.count(",")))

    found = await asyncio.gather(*(answer(name, *pair) for name, pair in zip(names, connections)))
    return dict(zip(names, found))


async def _answers(friends: bool, state: str, names: Optional[List[str]] = None,
                   wait: float = WAIT) -> Dict[str, Any]:
    names = list(names or _calls(None, None))  # type: ignore[arg-type]
    opened: List[Tuple[Streams, Streams, asyncio.AbstractServer]] = []
    try:
        for _ in names:  # one after another: each counts the descriptors it opens
            opened.append(await _connection(friends))
        return await answer_each(names, [(client, served) for client, served, _ in opened],
                                 driver_on(Here())[state], wait)
    finally:
        for client, served, server in opened:
            for writer in (client[1], served[1]):
                writer.transport.abort()
            server.close()
            await server.wait_closed()


@pytest.mark.parametrize("state", states_of(STREAMS))
@pytest.mark.parametrize("loop", list(LOOP_RUNNERS))
@pytest.mark.parametrize("link", ["friend", "socketless"])
def test_every_call_answers_as_over_tcp(link, loop, state):
    run = LOOP_RUNNERS[loop]

    def answers(paired: bool, names: Optional[List[str]] = None, wait: float = WAIT) -> Dict[str, Any]:
        friendsock.set_socketless(paired and link == "socketless")
        try:
            return run(_answers(paired, state, names, wait))
        finally:
            friendsock.set_socketless(False)

    differing = answers_that_differ(answers(False), answers(True),
                                    lambda name, paired: answers(paired, [name], 1.0)[name])
    assert not differing, report(differing)
