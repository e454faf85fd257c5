"""A friend transport's methods answer as the loop's own TCP transport's,
state by state, with and without TLS over it, on asyncio's loop and on
uvloop (each loop's own rules:
uvloop's transports refuse writes once the connection is lost, asyncio's
drop them): the same value, or the same exception type.

As tests/test_blocking_parity.py: each state on a fresh connection, each
call on its own connection, every differing answer printed. What the call
makes the protocol see later is the other transport tests' business.
"""

from __future__ import annotations

import array
import asyncio
import socket
import struct
import sys
from typing import Any, Callable, Dict, Optional, Tuple

import pytest

import friendsock
from parity_states import TLS_TRANSPORT, TRANSPORT, driver, states_of
from support import LOOP_RUNNERS, descriptors_open, report, tls_contexts, until

LOCALHOST = "127.0.0.1"
TIMEOUT = 10.0


class _Protocol(asyncio.Protocol):
    def __init__(self) -> None:
        self.transport: Optional[asyncio.Transport] = None
        self.received = bytearray()
        self.eof = False
        self.lost = False
        self.lost_with: Optional[BaseException] = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]

    def data_received(self, data: bytes) -> None:
        self.received += data

    def eof_received(self) -> bool:
        self.eof = True
        return True  # keep the transport open: the state is "peer wrote EOF"

    def connection_lost(self, exc: Optional[BaseException]) -> None:
        self.lost = True
        self.lost_with = exc


End = Tuple[asyncio.Transport, _Protocol]


# -- the driver: the client's end into each state of tests/parity_states.py ------
async def _fresh(client: End, server: End) -> None:
    pass


async def _backlogged(client: End, server: End) -> None:
    server[0].pause_reading()
    client[0].set_write_buffer_limits(high=1)
    sndbuf = client[0].get_extra_info("socket").getsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF)
    rcvbuf = server[0].get_extra_info("socket").getsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF)
    client[0].write(bytes(sndbuf + rcvbuf + 4 * 1024 * 1024))  # more than the buffers take


async def _closing_with_a_backlog(client: End, server: End) -> None:
    await _backlogged(client, server)
    client[0].close()


async def _lost(client: End, server: End) -> None:
    client[0].close()
    await until(lambda: client[1].lost)


async def _wrote_eof(client: End, server: End) -> None:
    client[0].write_eof()
    await until(lambda: server[1].eof)


async def _reading_paused(client: End, server: End) -> None:
    client[0].pause_reading()


async def _peer_sent(client: End, server: End) -> None:
    server[0].write(b"hello\nworld")
    await until(lambda: len(client[1].received) == 11)


async def _peer_wrote_eof(client: End, server: End) -> None:
    server[0].write_eof()
    await until(lambda: client[1].eof)


async def _peer_sent_and_wrote_eof(client: End, server: End) -> None:
    server[0].write(b"bye")
    server[0].write_eof()
    await until(lambda: client[1].eof)


async def _peer_closed_with_linger_zero(client: End, server: End) -> None:
    raw = server[0].get_extra_info("socket")
    raw.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    server[0].close()
    await until(lambda: client[1].lost)


async def _peer_closed(client: End, server: End) -> None:
    server[0].close()
    # (3.10's asyncio TLS layer tells its protocol connection_lost() alone.)
    await until(lambda: client[1].eof or client[1].lost)


async def _peer_aborted_over_unread_bytes(client: End, server: End) -> None:
    server[0].pause_reading()  # what comes stays unread, in the kernel
    client[0].write(b"never read")
    server[0].abort()
    await until(lambda: client[1].lost)


async def _aborted(client: End, server: End) -> None:
    client[0].abort()
    await until(lambda: client[1].lost)


DRIVER: Dict[str, Callable[[End, End], Any]] = driver(TRANSPORT, {
    "fresh": _fresh,
    "write buffer full": _backlogged,
    "closing, write buffer full": _closing_with_a_backlog,
    "closed": _lost,
    "we shut writing": _wrote_eof,
    "reading paused": _reading_paused,
    "bytes to read": _peer_sent,
    "peer shut writing": _peer_wrote_eof,
    "peer sent, then shut writing": _peer_sent_and_wrote_eof,
    "peer closed": _peer_closed,
    "peer reset": _peer_aborted_over_unread_bytes,
    "peer closed with SO_LINGER 0": _peer_closed_with_linger_zero,
    "aborted": _aborted,
})


# -- calls ------------------------------------------------------------------------
CALLS: Dict[str, Callable[[asyncio.Transport], Any]] = {
    "write": lambda transport: transport.write(b"x"),
    "write(b'')": lambda transport: transport.write(b""),
    "write(str)": lambda transport: transport.write("text"),  # type: ignore[arg-type]
    "write(bytearray)": lambda transport: transport.write(bytearray(b"x")),
    "write(memoryview)": lambda transport: transport.write(memoryview(b"x")),
    "writelines": lambda transport: transport.writelines([b"a", b"b"]),
    "writelines([str])": lambda transport: transport.writelines(["text"]),  # type: ignore[list-item]
    "writelines([])": lambda transport: transport.writelines([]),
    "writelines([b''])": lambda transport: transport.writelines([b""]),
    "writelines([bytes, str])": lambda transport: transport.writelines([b"a", "text"]),  # type: ignore[list-item]
    "write_eof": lambda transport: transport.write_eof(),
    "can_write_eof": lambda transport: transport.can_write_eof(),
    "get_write_buffer_size > 0": lambda transport: transport.get_write_buffer_size() > 0,
    "get_write_buffer_limits": lambda transport: transport.get_write_buffer_limits(),
    "set_write_buffer_limits": lambda transport: transport.set_write_buffer_limits(high=1000),
    "set_write_buffer_limits(low > high)": lambda transport: transport.set_write_buffer_limits(high=1, low=2),
    "is_closing": lambda transport: transport.is_closing(),
    "is_reading": lambda transport: transport.is_reading(),
    "pause_reading": lambda transport: transport.pause_reading(),
    "resume_reading": lambda transport: transport.resume_reading(),
    "pause, is_reading": lambda transport: (transport.pause_reading(), transport.is_reading()),
    "close": lambda transport: transport.close(),
    "close, is_closing": lambda transport: (transport.close(), transport.is_closing()),
    "abort": lambda transport: transport.abort(),
    "peername": lambda transport: type(transport.get_extra_info("peername")).__name__,
    "sockname": lambda transport: type(transport.get_extra_info("sockname")).__name__,
    "unknown extra": lambda transport: transport.get_extra_info("no such thing", "default"),
    "get_protocol": lambda transport: type(transport.get_protocol()).__name__,
    "socket given": lambda transport: transport.get_extra_info("socket") is not None,
    "limits set, then read": lambda transport: (transport.set_write_buffer_limits(high=100, low=10),
                                                transport.get_write_buffer_limits()),
    # uvloop's write() takes any contiguous buffer, asyncio's bytes,
    # bytearray and memoryview (and fails the connection on a view that is
    # not contiguous, which uvloop's refuses).
    "write(array)": lambda transport: transport.write(array.array("i", [1, 2])),  # type: ignore[arg-type]
    "write(strided memoryview)": lambda transport: transport.write(memoryview(b"abcde")[::2]),
    # asyncio's transport socket passes shutdown() to the socket; uvloop's
    # refuses it, and every call that moves bytes past the transport.
    "socket shutdown(SHUT_WR)": lambda transport: transport.get_extra_info("socket").shutdown(socket.SHUT_WR),
    "socket shutdown(SHUT_RDWR)": lambda transport: transport.get_extra_info("socket").shutdown(socket.SHUT_RDWR),
    "socket shutdown(9)": lambda transport: transport.get_extra_info("socket").shutdown(9),
    # (asyncio's before 3.11 passes these on too, with a DeprecationWarning.)
    **({
        "socket send": lambda transport: transport.get_extra_info("socket").send(b"x"),
        "socket recv": lambda transport: transport.get_extra_info("socket").recv(1),
        "socket close": lambda transport: transport.get_extra_info("socket").close(),
    } if sys.version_info >= (3, 11) else {}),
    # The loop's own transports' private flag (uvloop's tests read it).
    "_paused": lambda transport: transport._paused,  # type: ignore[attr-defined]
    "pause, _paused": lambda transport: (transport.pause_reading(), transport._paused),  # type: ignore[attr-defined]
}


def _answer(call: Callable[[], Any]) -> Any:
    try:
        return "returned", call()
    except Exception as exc:  # noqa: BLE001 - compared by type
        return type(exc).__name__


_TLS: Dict[str, Any] = {}  # the contexts, made on first use


def _tls_options() -> Tuple[Dict[str, Any], Dict[str, Any]]:
    """create_server's and create_connection's TLS arguments."""
    if not _TLS:
        import trustme  # the test extra's

        _TLS["server"], _TLS["client"] = tls_contexts(trustme.CA())
    return {"ssl": _TLS["server"]}, {"ssl": _TLS["client"], "server_hostname": "localhost"}


async def _connection(friends: bool, tls: bool) -> Tuple[End, End, asyncio.AbstractServer]:
    served: "asyncio.Future[_Protocol]" = asyncio.get_running_loop().create_future()

    def serve() -> _Protocol:
        protocol = _Protocol()
        served.set_result(protocol)
        return protocol

    serving, connecting = _tls_options() if tls else ({}, {})
    server = await friendsock.create_server(serve, LOCALHOST, 0, friends=friends, **serving)
    port = server.sockets[0].getsockname()[1]
    descriptors = descriptors_open()
    transport, client = await asyncio.wait_for(
        friendsock.create_connection(_Protocol, LOCALHOST, port, friends=friends, **connecting), TIMEOUT)
    assert friendsock.is_friend(transport) is friends
    server_protocol = await asyncio.wait_for(served, TIMEOUT)
    await until(lambda: server_protocol.transport is not None)
    # Two sockets, the client's and the accepted one; none when socketless.
    assert descriptors_open() - descriptors == (0 if friends and friendsock.is_socketless() else 2)
    return (transport, client), (server_protocol.transport, server_protocol), server  # type: ignore[return-value]


async def _answers(friends: bool, state: str, tls: bool) -> Dict[str, Any]:
    answers = {}
    for name, call in CALLS.items():
        client, served, server = await _connection(friends, tls)
        try:
            await DRIVER[state](client, served)
            answers[name] = _answer(lambda: call(client[0]))
        finally:
            for transport, _ in (client, served):
                transport.abort()
            server.close()
            await server.wait_closed()
            await until(lambda: client[1].lost and served[1].lost)
    return answers


@pytest.mark.parametrize("state, tls", [(state, False) for state in states_of(TRANSPORT)] +
                         [(state, True) for state in states_of(TLS_TRANSPORT)])
@pytest.mark.parametrize("loop", list(LOOP_RUNNERS))
@pytest.mark.parametrize("link", ["friend", "socketless"])
def test_every_method_answers_as_the_loops_own(link, loop, state, tls):
    run = LOOP_RUNNERS[loop]
    over_tcp = run(_answers(False, state, tls))
    friendsock.set_socketless(link == "socketless")
    try:
        paired = run(_answers(True, state, tls))
    finally:
        friendsock.set_socketless(False)
    differing = {name: (over_tcp[name], paired[name]) for name in CALLS if over_tcp[name] != paired[name]}
    assert not differing, report(differing)
