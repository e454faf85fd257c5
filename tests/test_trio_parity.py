"""Every call of a ``trio.socket`` socket, in every state of its
connection, answers on a paired socket (``friendsock.trio.install()``) as
on a TCP one: the same return value, or the same exception type and errno,
or both wait.

As tests/test_blocking_parity.py: each state on a fresh pair, each call on
its own pair, every differing answer printed.
"""

from __future__ import annotations

import contextlib
import socket
import struct
from typing import Any, Awaitable, Callable, Dict, List, Optional, Tuple

import pytest
import trio
import trio.testing

import friendsock
import friendsock.trio as fst
from parity_states import TRIO, driver, states_of
from support import WAITED, report, returned
from trio_support import answer_each, differences_under_trio, until_readable

LOCALHOST = "127.0.0.1"
TIMEOUT = 10.0
WAIT = 0.05  # how long a call that would block is given: WAITED on both paths
Sock = Any  # a trio socket


async def _pair() -> Tuple[Sock, Sock]:
    listener = trio.socket.socket()
    with listener:
        await listener.bind((LOCALHOST, 0))
        listener.listen()
        client = trio.socket.socket()
        with trio.fail_after(TIMEOUT):
            await client.connect(listener.getsockname())
            server, _ = await listener.accept()
    return client, server


# -- the driver: the client's socket into each state of tests/parity_states.py ---
async def _fresh(client: Sock, server: Sock) -> None:
    pass


async def _peer_sent(client: Sock, server: Sock) -> None:
    await server.send(b"hello world")
    await until_readable(client)


async def _we_shut_writing(client: Sock, server: Sock) -> None:
    client.shutdown(socket.SHUT_WR)


async def _we_shut_reading(client: Sock, server: Sock) -> None:
    client.shutdown(socket.SHUT_RD)


async def _we_shut_both_ways(client: Sock, server: Sock) -> None:
    client.shutdown(socket.SHUT_RDWR)


async def _shut_reading_then_data(client: Sock, server: Sock) -> None:
    client.shutdown(socket.SHUT_RD)
    await server.send(b"late")
    await until_readable(client)


async def _peer_shut_writing(client: Sock, server: Sock) -> None:
    server.shutdown(socket.SHUT_WR)
    await until_readable(client)


async def _peer_sent_and_shut(client: Sock, server: Sock) -> None:
    await server.send(b"bye")
    server.shutdown(socket.SHUT_WR)
    await until_readable(client)


async def _peer_closed(client: Sock, server: Sock) -> None:
    server.close()
    await until_readable(client)


async def _reset_by_peer(client: Sock, server: Sock) -> None:
    await client.send(b"never read")
    await until_readable(server)
    server.close()  # unread bytes: a reset
    await until_readable(client)


async def _linger_zero_close(client: Sock, server: Sock) -> None:
    server.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    server.close()
    await until_readable(client)


async def _closed(client: Sock, server: Sock) -> None:
    client.close()


DRIVER: Dict[str, Callable[[Sock, Sock], Awaitable[None]]] = driver(TRIO, {
    "fresh": _fresh,
    "bytes to read": _peer_sent,
    "we shut writing": _we_shut_writing,
    "we shut reading": _we_shut_reading,
    "we shut reading, then bytes came": _shut_reading_then_data,
    "we shut both ways": _we_shut_both_ways,
    "peer shut writing": _peer_shut_writing,
    "peer sent, then shut writing": _peer_sent_and_shut,
    "peer closed": _peer_closed,
    "peer reset": _reset_by_peer,
    "peer closed with SO_LINGER 0": _linger_zero_close,
    "closed": _closed,
})


# -- calls ------------------------------------------------------------------------
def _calls(sock: Sock) -> Dict[str, Callable[[], Awaitable[Any]]]:
    return {
        "recv": lambda: sock.recv(10),
        "recv(0)": lambda: sock.recv(0),
        "recv MSG_WAITALL": lambda: sock.recv(10, socket.MSG_WAITALL),
        "recv MSG_DONTWAIT": lambda: sock.recv(10, socket.MSG_DONTWAIT),
        "recv MSG_PEEK": lambda: sock.recv(4, socket.MSG_PEEK),
        "recv MSG_PEEK, recv": lambda: _each(lambda: sock.recv(4, socket.MSG_PEEK), lambda: sock.recv(10)),
        "recv_into MSG_PEEK": lambda: sock.recv_into(bytearray(5), 0, socket.MSG_PEEK),
        "recv MSG_OOB": lambda: sock.recv(10, socket.MSG_OOB),
        "recvmsg": lambda: sock.recvmsg(10),
        "recvmsg MSG_PEEK": lambda: sock.recvmsg(4, 0, socket.MSG_PEEK),
        "recvmsg_into": lambda: _recvmsg_into(sock),
        "recvmsg(-1)": lambda: sock.recvmsg(-1),
        "sendmsg": lambda: sock.sendmsg([b"ab", memoryview(b"cd")]),
        "sendmsg, bad ancillary data": lambda: sock.sendmsg([b"x"], [(1, 2)]),
        "recv_into": lambda: sock.recv_into(bytearray(5)),
        "recvfrom": lambda: sock.recvfrom(10),
        "send": lambda: sock.send(b"x"),
        "send(b'')": lambda: sock.send(b""),
        "send MSG_MORE": lambda: sock.send(b"x", socket.MSG_MORE),
        "send MSG_DONTWAIT": lambda: sock.send(b"x", socket.MSG_DONTWAIT),
        "sendto": lambda: sock.sendto(b"z", (LOCALHOST, 9)),
        "wait_writable": lambda: sock.wait_writable(),
        "is_readable": lambda: returned(sock.is_readable()),
        "SO_ERROR": lambda: returned(sock.getsockopt(socket.SOL_SOCKET, socket.SO_ERROR)),
        "getpeername": lambda: returned(type(sock.getpeername()).__name__),
        "getsockname": lambda: returned(type(sock.getsockname()).__name__),
        "shutdown(SHUT_RDWR)": lambda: returned(sock.shutdown(socket.SHUT_RDWR)),
        "listen": lambda: returned(sock.listen()),
        "recv, recv, send": lambda: _each(lambda: sock.recv(10), lambda: sock.recv(10),
                                          lambda: sock.send(b"q")),
        "send, send, recv": lambda: _each(lambda: sock.send(b"q"), lambda: sock.send(b"q"),
                                          lambda: sock.recv(10)),
    }
# Not compared: connect() on a connected socket (trio's connect is
# non-blocking, and the kernel then answers 0 once; friendsock EISCONN).


async def _recvmsg_into(sock: Sock) -> Any:
    first, second = bytearray(3), bytearray(5)
    size, ancdata, flags, address = await sock.recvmsg_into([first, second])
    return size, bytes(first + second), ancdata, flags, address


async def _each(*calls: Callable[[], Awaitable[Any]]) -> Any:
    """Each call's answer, in turn (each given WAIT)."""
    return [await _answer(call) for call in calls]


async def _answer(call: Callable[[], Awaitable[Any]], wait: float = WAIT) -> Any:
    try:
        with trio.move_on_after(wait) as waited:
            result = await call()
        if waited.cancelled_caught:
            return WAITED
        return "returned", result
    except OSError as exc:
        return type(exc).__name__, exc.errno
    except (TypeError, ValueError) as exc:
        return type(exc).__name__


async def _answers(state: str, names: Optional[List[str]] = None, wait: float = WAIT) -> Dict[str, Any]:
    names = list(names or _calls(None))
    with contextlib.ExitStack() as opened:
        pairs = []
        for _ in names:
            client, server = await _pair()
            opened.enter_context(client)
            opened.enter_context(server)
            # A socket of the kernel's under each end; none when socketless.
            assert (client.fileno() < 0) is (fst.is_installed() and friendsock.is_socketless())
            pairs.append((client, server))
        # A sequence gives each of its calls ``wait``.
        return await answer_each(names, pairs, DRIVER[state],
                                 lambda name, client: _answer(_calls(client)[name], wait * (2 + name.count(","))))


@pytest.mark.parametrize("state", states_of(TRIO))
@pytest.mark.parametrize("link", ["friend", "socketless"])
def test_every_call_answers_as_over_tcp(link, state):
    differing = differences_under_trio(_answers, state, link == "socketless", WAIT)
    assert not differing, report(differing)


async def _answers_cancelled_meanwhile(state: str, names: Optional[List[str]] = None,
                                       wait: float = WAIT) -> Dict[str, Any]:
    """Each call that answers at once (the client shut for reading), its
    cancel scope cancelled by a task that runs while the call yields."""
    calls: Dict[str, Callable[[Sock], Awaitable[Any]]] = {
        "recv": lambda sock: sock.recv(10),
        "recv MSG_PEEK": lambda sock: sock.recv(4, socket.MSG_PEEK),
        "recv(0)": lambda sock: sock.recv(0),
        "recv MSG_OOB": lambda sock: sock.recv(10, socket.MSG_OOB),
        "accept": lambda sock: sock.accept(),
    }
    found: Dict[str, Any] = {}
    async with trio.open_nursery() as nursery:
        for name in names or calls:
            client, server = await _pair()
            with client, server:
                client.shutdown(socket.SHUT_RD)
                scope = trio.CancelScope()
                nursery.start_soon(_cancel, scope)  # (runs at the call's first yield)
                with scope:
                    found[name] = await _answer(lambda: calls[name](client), TIMEOUT)
                if scope.cancelled_caught:
                    found[name] = "cancelled"
    return found


async def _cancel(scope: trio.CancelScope) -> None:
    scope.cancel()


@pytest.mark.parametrize("link", ["friend", "socketless"])
def test_a_call_that_answers_at_once_keeps_its_answer_when_cancelled_meanwhile(link):
    """As trio's own socket: such a call is cancellable before it runs,
    and its answer stands once it has one, whatever is cancelled while
    it yields after."""
    differing = differences_under_trio(_answers_cancelled_meanwhile, "fresh", link == "socketless", WAIT)
    assert not differing, report(differing)
