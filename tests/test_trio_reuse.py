"""Reused connections on trio: a link between friendsock.trio's
``open_tcp_stream`` and a listener of the same run leaves its TCP
connection to the listener, and the next connect to it makes its link over
that one. trio's conformance tests run again with every friend connect
over a kept connection (real TCP stays the reference), and what is
particular to them."""

from __future__ import annotations

import socket

import pytest
import trio

import friendsock.trio as fst
from friendsock._trio import _pairing
from support import always_over_kept_connections, descriptors_open
from test_trio import *  # noqa: F401,F403 (the conformance tests, run again here)
from test_trio import connect_then_accept
from trio_support import LOCALHOST, TIMEOUT, listening, receive_exactly

pytestmark = pytest.mark.trio


@pytest.fixture(autouse=True)
def over_kept_connections(monkeypatch):
    """Every friend connect of the test (to a listener of its own run)
    goes over a connection its listener kept."""
    always_over_kept_connections(monkeypatch, _pairing)


async def test_connect_then_accept_in_one_task(friends):
    """As over a new connection, with no connect pending: over a kept one,
    the server end waits in the listener's backlog, as a socketless one's."""
    await connect_then_accept(friends, pending=False)




async def _one_exchange(listener, port: int, friends: bool, use_socket=None):
    """A connection that sends a line, reads it back and closes, both ends;
    its client address, and the server's peer address of it."""
    with trio.fail_after(TIMEOUT):
        client = await fst.open_tcp_stream(LOCALHOST, port, friends=friends)
        server = await listener.accept()
        if use_socket is not None:
            use_socket(client.socket)
        await client.send_all(b"ping")
        assert await receive_exactly(server, 4) == b"ping"
        addresses = client.socket.getsockname(), server.socket.getpeername()
        await client.aclose()
        await server.aclose()
    return addresses


async def test_the_next_connect_goes_over_the_connection_a_finished_link_left(friends, monkeypatch):
    """One connect after another to one listener: the second (and every
    later one) goes over the connection the first left, with its client
    address, as the server's end sees it, and no descriptor more. Over TCP
    each connect is the kernel's own."""
    monkeypatch.undo()  # the connects below find what the ones before them left
    async with listening(friends, LOCALHOST) as (listener, port):
        before = descriptors_open()
        addresses = [await _one_exchange(listener, port, friends) for _ in range(4)]
        assert all(client == seen for client, seen in addresses)
        assert (len({client for client, _ in addresses[1:]}) == 1) is friends
        if friends:
            assert descriptors_open() - before == 2  # the kept connection's two ends


@pytest.mark.parametrize("use", ["read", "fileno"])
async def test_a_connection_whose_descriptor_was_seen_is_not_kept(friends, monkeypatch, use):
    """Reading a stream's socket's addresses and options leaves its
    connection to keep; its descriptor seen ends it with the link."""
    monkeypatch.undo()

    def use_socket(sock):
        sock.getpeername()
        sock.getsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF)
        if use == "fileno":
            assert sock.fileno() >= 0

    async with listening(friends, LOCALHOST) as (listener, port):
        first, _ = await _one_exchange(listener, port, friends, use_socket)
        second, _ = await _one_exchange(listener, port, friends)
        assert (second == first) is (friends and use == "read")


async def test_a_kept_connection_serves_a_stream_as_a_new_one(friends, monkeypatch):
    """The options trio's streams set on their sockets (TCP_NODELAY,
    TCP_NOTSENT_LOWAT) read the same on a link over a kept connection as
    on a new one."""
    monkeypatch.undo()
    options = ((socket.IPPROTO_TCP, socket.TCP_NODELAY), (socket.IPPROTO_TCP, socket.TCP_NOTSENT_LOWAT))
    async with listening(friends, LOCALHOST) as (listener, port):
        seen = []
        for _ in range(2):
            await _one_exchange(listener, port, friends, lambda sock: seen.append(
                [sock.getsockopt(*option) for option in options]))
        assert seen[0] == seen[1] and seen[0][0] != 0
