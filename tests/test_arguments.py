"""Arguments are checked as the loop itself checks them, on either path."""

from __future__ import annotations

import asyncio
import inspect
import socket

import pytest

import friendsock


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
