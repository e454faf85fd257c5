"""Arguments are checked as the loop itself checks them, on either path."""

from __future__ import annotations

import asyncio
import gc
import inspect
import socket

import pytest

import friendsock
from support import resource_warnings_raised, until


async def _outcome(connect) -> str:
    try:
        transport, _ = await connect()
    except Exception as exc:  # the verdict is the exception's type
        return type(exc).__name__
    transport.close()
    return "ok"


@pytest.mark.parametrize(
    "kwargs",
    [
        {"bogus": 1},
        {"server_hostname": "example.org"},
        {"ssl_handshake_timeout": 1.0},
        {"ssl_shutdown_timeout": 1.0},
        {"happy_eyeballs_delay": 0.1},
        {"interleave": 1},
        {"all_errors": True},
    ],
    ids=lambda kwargs: next(iter(kwargs)),
)
async def test_connection_keywords_get_the_loops_verdict(friends, kwargs):
    loop = asyncio.get_running_loop()
    server = await friendsock.create_server(asyncio.Protocol, "127.0.0.1", 0, friends=friends)
    port = server.sockets[0].getsockname()[1]
    try:
        expected = await _outcome(
            lambda: loop.create_connection(asyncio.Protocol, "127.0.0.1", port, **kwargs)
        )
        got = await _outcome(
            lambda: friendsock.create_connection(
                asyncio.Protocol, "127.0.0.1", port, friends=friends, **kwargs
            )
        )
        assert got == expected
    finally:
        server.close()


async def test_a_given_listening_socket_ignores_unset_tls_timeouts(friends):
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    # The keywords the loop's own create_server takes (3.10's asyncio has
    # no ssl_shutdown_timeout, uvloop has it on every version): those only.
    takes = inspect.signature(asyncio.get_running_loop().create_server).parameters
    if "ssl_shutdown_timeout" not in takes:
        with pytest.raises(TypeError, match="ssl_shutdown_timeout"):
            await friendsock.create_server(asyncio.Protocol, sock=sock, ssl_shutdown_timeout=None,
                                           friends=friends)
    timeouts = {name: None for name in ("ssl_handshake_timeout", "ssl_shutdown_timeout") if name in takes}
    server = await friendsock.create_server(asyncio.Protocol, sock=sock, **timeouts, friends=friends)
    try:
        assert server.sockets[0].getsockname() == sock.getsockname()
    finally:
        server.close()
    with pytest.raises(ValueError, match="only meaningful with ssl"):
        await friendsock.create_server(asyncio.Protocol, "127.0.0.1", 0,
                                       ssl_handshake_timeout=1.0, friends=friends)


@pytest.mark.parametrize("port", ["abc", b"abc", "8o", "", 1.5, "{port}", b"{port}"])
async def test_a_port_gets_the_loops_verdict(friends, port):
    """A port getaddrinfo cannot read is its error (socket.gaierror, an
    OSError; TypeError for what is no port at all), not int()'s; its
    digits as text connect as the number does."""
    loop = asyncio.get_running_loop()
    server = await friendsock.create_server(asyncio.Protocol, "127.0.0.1", 0, friends=friends)
    number = server.sockets[0].getsockname()[1]
    if isinstance(port, (str, bytes)):
        port = port.replace(b"{port}", str(number).encode()) if isinstance(port, bytes) else port.format(port=number)
    try:
        expected = await _outcome(lambda: loop.create_connection(asyncio.Protocol, "127.0.0.1", port))
        got = await _outcome(
            lambda: friendsock.create_connection(asyncio.Protocol, "127.0.0.1", port, friends=friends))
        assert got == expected
    finally:
        server.close()


async def test_a_refused_connect_says_what_the_loops_says(friends):
    """Refused at an address where no listener is, on a port where one of
    ours listens elsewhere: the loop's own words (asyncio's name the
    address)."""
    loop = asyncio.get_running_loop()
    server = await friendsock.create_server(asyncio.Protocol, "127.0.0.1", 0, friends=friends)
    port = server.sockets[0].getsockname()[1]
    try:
        with pytest.raises(ConnectionRefusedError) as by_loop:
            await loop.create_connection(asyncio.Protocol, "127.0.0.2", port)
        with pytest.raises(ConnectionRefusedError) as ours:
            await friendsock.create_connection(asyncio.Protocol, "127.0.0.2", port, friends=friends)
        assert str(ours.value) == str(by_loop.value)
    finally:
        server.close()


class _OnlyConnectionMade:
    def connection_made(self, transport) -> None:
        self.transport = transport


@pytest.mark.parametrize("factory", [object, lambda: None, _OnlyConnectionMade],
                         ids=["object", "None", "only connection_made"])
async def test_a_factory_that_makes_no_protocol_gets_the_loops_verdict(friends, factory, loop_guard):
    """What create_connection does with it (asyncio's raise at once;
    uvloop's refuse None, and connect with anything else, whose missing
    callbacks fail as callbacks that raised), and what reaches the loop's
    exception handler."""
    loop = asyncio.get_running_loop()
    server = await friendsock.create_server(asyncio.Protocol, "127.0.0.1", 0, friends=friends)
    port = server.sockets[0].getsockname()[1]

    async def verdict(connect) -> tuple:
        try:
            transport, _ = await connect()
        except Exception as exc:
            return type(exc).__name__, []
        assert friendsock.is_friend(transport) is (friends and connect is ours)
        transport.close()
        # connection_lost is called (and fails) as the loop's next callback.
        await until(lambda: any("connection_lost" in str(context.get("exception")) for context in loop_guard))
        reported = [type(context["exception"]).__name__ for context in loop_guard]
        loop_guard.clear()
        return "connected", reported

    def by_loop():
        return loop.create_connection(factory, "127.0.0.1", port)

    def ours():
        return friendsock.create_connection(factory, "127.0.0.1", port, friends=friends)

    try:
        # (asyncio's own create_connection leaves its socket to the
        # collector when the protocol has no connection_made: its warning
        # is no failure here.)
        with resource_warnings_raised():
            expected = await verdict(by_loop)
            got = await verdict(ours)
            gc.collect()
        assert got == expected
    finally:
        server.close()
        await server.wait_closed()
