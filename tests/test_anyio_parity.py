"""anyio's streams on trio answer over a friend link
(``friendsock.trio.install()``) as over TCP, call by call and state by
state: anyio's own connect and listener, its error translation on top.

As tests/test_trio_parity.py: each state on a fresh connection, each call on
its own connection, every differing answer printed.
"""

from __future__ import annotations

import contextlib
import socket
import struct
from typing import Any, Awaitable, Callable, Dict, List, Optional, Tuple

import anyio
import anyio.abc
import pytest
import trio
import trio.testing
from anyio.abc import SocketAttribute

import friendsock
import friendsock.trio as fst
from parity_states import ANYIO, driver, states_of
from support import WAITED, report, returned
from trio_support import answer_each, differences_under_trio, until_readable

LOCALHOST = "127.0.0.1"
TIMEOUT = 10.0
WAIT = 0.05  # how long a call that would wait is given: WAITED on both paths
Stream = anyio.abc.SocketStream


async def _pair() -> Tuple[Stream, Stream]:
    multi = await anyio.create_tcp_listener(local_host=LOCALHOST)
    async with multi:
        listener = multi.listeners[0]
        port = listener.extra(anyio.abc.SocketAttribute.local_port)
        with trio.fail_after(TIMEOUT):
            client = await anyio.connect_tcp(LOCALHOST, port)
            server = await listener.accept()
    # A socket of the kernel's under each end; none when socketless.
    raw = client.extra(anyio.abc.SocketAttribute.raw_socket)
    assert (raw.fileno() < 0) is (fst.is_installed() and friendsock.is_socketless())
    return client, server


async def _readable(stream: Stream) -> None:
    await until_readable(stream._trio_socket)  # type: ignore[attr-defined]


# -- the driver: the client's stream into each state of tests/parity_states.py ---
async def _fresh(client: Stream, server: Stream) -> None:
    pass


async def _peer_sent(client: Stream, server: Stream) -> None:
    await server.send(b"hello")
    await _readable(client)


async def _peer_sent_eof(client: Stream, server: Stream) -> None:
    await server.send_eof()
    await _readable(client)


async def _peer_sent_and_eof(client: Stream, server: Stream) -> None:
    await server.send(b"bye")
    await server.send_eof()
    await _readable(client)


async def _peer_closed(client: Stream, server: Stream) -> None:
    await server.aclose()
    await _readable(client)


async def _peer_reset(client: Stream, server: Stream) -> None:
    await client.send(b"never read")
    await _readable(server)
    await server.aclose()  # unread bytes: a reset
    await _readable(client)


async def _peer_linger_zero(client: Stream, server: Stream) -> None:
    raw = server.extra(anyio.abc.SocketAttribute.raw_socket)
    raw.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    await server.aclose()
    await _readable(client)


async def _we_sent_eof(client: Stream, server: Stream) -> None:
    await client.send_eof()


async def _we_closed(client: Stream, server: Stream) -> None:
    await client.aclose()


DRIVER: Dict[str, Callable[[Stream, Stream], Awaitable[None]]] = driver(ANYIO, {
    "fresh": _fresh,
    "bytes to read": _peer_sent,
    "peer shut writing": _peer_sent_eof,
    "peer sent, then shut writing": _peer_sent_and_eof,
    "peer closed": _peer_closed,
    "peer reset": _peer_reset,
    "peer closed with SO_LINGER 0": _peer_linger_zero,
    "we shut writing": _we_sent_eof,
    "closed": _we_closed,
})


# -- calls ------------------------------------------------------------------------
async def _each(calls: List[Callable[[], Awaitable[Any]]]) -> Any:
    return [await _answer(call) for call in calls]


def _calls(stream: Stream) -> Dict[str, Callable[[], Awaitable[Any]]]:
    return {
        "receive": lambda: stream.receive(10),
        "send": lambda: stream.send(b"x"),
        "send_eof": lambda: stream.send_eof(),
        "aclose": lambda: stream.aclose(),
        "receive, receive, receive": lambda: _each([lambda: stream.receive(10)] * 3),
        "send, send, send": lambda: _each([lambda: stream.send(b"q")] * 3),
        # (What kind of address: its port is the connection's own.)
        "remote_address": lambda: returned(type(stream.extra(SocketAttribute.remote_address)).__name__),
        "local_address": lambda: returned(type(stream.extra(SocketAttribute.local_address)).__name__),
    }


async def _answer(call: Callable[[], Awaitable[Any]], wait: float = WAIT) -> Any:
    try:
        with trio.move_on_after(wait) as waited:
            result = await call()
        if waited.cancelled_caught:
            return WAITED
        return "returned", result
    except OSError as exc:
        return type(exc).__name__, exc.errno
    except Exception as exc:  # noqa: BLE001 - compared by type (anyio's own errors)
        return type(exc).__name__


async def _answers(state: str, names: Optional[List[str]], wait: float) -> Dict[str, Any]:
    names = list(names or _calls(None))  # type: ignore[arg-type]
    async with contextlib.AsyncExitStack() as opened:
        pairs = []
        for _ in names:
            client, server = await _pair()
            opened.push_async_callback(server.aclose)
            opened.push_async_callback(client.aclose)
            pairs.append((client, server))
        # A sequence gives each of its calls ``wait``.
        return await answer_each(names, pairs, DRIVER[state],
                                 lambda name, client: _answer(_calls(client)[name], wait * (2 + name.count(","))))


@pytest.mark.parametrize("state", states_of(ANYIO))
@pytest.mark.parametrize("link", ["friend", "socketless"])
def test_every_call_answers_as_over_tcp(link, state):
    differing = differences_under_trio(_answers, state, link == "socketless", WAIT)
    assert not differing, report(differing)
