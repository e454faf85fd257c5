"""Reused connections: the TCP connection of a finished friend link whose
sockets were not handed out is kept by its listener, and the next
connect to it makes its link over that one (no handshake, no new
descriptors). The transport conformance tests run again with every friend
connect over a kept connection (real TCP stays the reference), and what is
particular to them: which connections are kept, and for how long."""

from __future__ import annotations

import asyncio
import contextlib
import errno
import socket
import struct

import pytest

import friendsock
from friendsock import _handshake
from friendsock._asyncio import _pairing
from support import (
    TCP_ESTABLISHED,
    Echoes,
    Recorder,
    always_over_kept_connections,
    bounded,
    descriptors_open,
    port_of,
    tcp_connections,
)
from test_tls import *  # noqa: F401,F403 (TLS over the link, run again here)
from test_transport import *  # noqa: F401,F403 (the conformance tests, run again here)


@pytest.fixture(autouse=True)
def over_kept_connections(monkeypatch):
    """Every friend connect of the test (to a listener on its own loop)
    goes over a connection its listener kept."""
    always_over_kept_connections(monkeypatch, _pairing)




async def _one_exchange(port: int, friends: bool, use_socket=None):
    """A connection that sends a line, reads it back and closes; its client
    address, and the server's peer address of it. ``use_socket`` is called
    with its transport's socket first."""
    transport, client = await friendsock.create_connection(Recorder, "127.0.0.1", port, friends=friends)
    if use_socket is not None:
        use_socket(transport.get_extra_info("socket"))
    transport.write(b"ping")
    assert await bounded(client.wait_bytes(4)) == b"ping"
    sockname = transport.get_extra_info("sockname")
    transport.close()
    await bounded(client.lost)
    return sockname


@contextlib.asynccontextmanager
async def serving(friends: bool):
    """A server on 127.0.0.1: yields its protocol factory and port. Closed,
    it ends the connections it kept: none is left established on its port
    and, on the friend path, none in TIME_WAIT (TCP's clients, which close
    first, leave theirs)."""
    echoes = Echoes()
    server = await friendsock.create_server(echoes, "127.0.0.1", 0, friends=friends)
    port = port_of(server)
    lingering = tcp_connections(port)  # (of an earlier listener on this port)
    try:
        yield echoes, port
    finally:
        server.close()
        await server.wait_closed()
    for _ in range(3):  # (uvloop closes a listener's handle at its next turn)
        await asyncio.sleep(0)
    assert tcp_connections(port, TCP_ESTABLISHED) == set()
    assert (tcp_connections(port) - lingering == set()) is friends


async def test_the_next_connect_goes_over_the_connection_a_finished_link_left(friends, monkeypatch):
    """One connect after another to one server: the second (and every
    later one) goes over the connection the first left, with its client
    address, as the server's end sees it; no descriptor more than the
    one connection's two. Over TCP each connect is the kernel's own."""
    monkeypatch.undo()  # the connects below find what the ones before them left
    async with serving(friends) as (echoes, port):
        before = descriptors_open()
        addresses = []
        for round_ in range(4):
            addresses.append(await _one_exchange(port, friends))
            await echoes.all_lost()
            for _ in range(3):  # (the link is done once both ends' connection_lost ran)
                await asyncio.sleep(0)
            seen = echoes.protocols[round_].transport.get_extra_info("peername")
            assert seen == addresses[-1]
        assert (len(set(addresses[1:])) == 1) is friends
        if friends:
            # The one kept connection, established: its two descriptors.
            assert descriptors_open() - before == 2
            assert len(tcp_connections(port, TCP_ESTABLISHED)) == 2  # (both of its ends)


def _set_options_a_server_sets(sock) -> None:
    """What aiohttp's and uvicorn's ends do with their transports' sockets."""
    sock.getpeername()
    sock.getsockname()
    sock.getsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF)
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, True)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_KEEPALIVE, 1)
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_KEEPIDLE, 30)


_FRESH_OPTIONS = ((socket.SOL_SOCKET, socket.SO_KEEPALIVE), (socket.IPPROTO_TCP, socket.TCP_KEEPIDLE))


async def _after_a_finished_link(port: int, friends: bool, echoes: Echoes, use_socket):
    """The client address of a connection whose socket ``use_socket`` used,
    and of the one after it, with the options of ``_FRESH_OPTIONS`` as the
    later one's socket has them."""
    first = await _one_exchange(port, friends, use_socket)
    await echoes.all_lost()
    for _ in range(3):  # (the link is done once both ends' connection_lost ran)
        await asyncio.sleep(0)
    options = []
    second = await _one_exchange(port, friends, lambda sock: options.extend(
        sock.getsockopt(*option) for option in _FRESH_OPTIONS))
    return first, second, options


async def test_a_connection_whose_socket_was_only_read_or_given_options_back_is_kept(friends, monkeypatch):
    """Reading a socket's addresses and options, and setting options that
    can be given back (TCP_NODELAY, keep-alive), as servers do with every
    connection, leaves the connection to keep; the next link over it finds
    those options as a new connection has them."""
    monkeypatch.undo()
    with socket.socket() as fresh:
        expected = [fresh.getsockopt(*option) for option in _FRESH_OPTIONS]
    async with serving(friends) as (echoes, port):
        first, second, options = await _after_a_finished_link(port, friends, echoes,
                                                              _set_options_a_server_sets)
        assert (second == first) is friends
        assert options == expected


@pytest.mark.parametrize("use", ["fileno", "dup", "sndbuf", "linger"])
async def test_a_connection_whose_socket_was_handed_out_is_not_kept(friends, monkeypatch, use):
    """A program that had a transport's descriptor (to poll or pass on), or
    set an option that cannot be given back (a buffer size, which the kernel
    then stops tuning; SO_LINGER), gets its connection ended with the link,
    as TCP's: the next connect makes a new one."""
    monkeypatch.undo()

    def use_socket(sock):
        if use == "fileno":
            assert sock.fileno() >= 0
        elif use == "dup":
            sock.dup().close()
        elif use == "sndbuf":
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, 1 << 16)
        else:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 5))

    async with serving(friends) as (echoes, port):
        first, second, _ = await _after_a_finished_link(port, friends, echoes, use_socket)
        assert second != first
        # (Between those two ports only: a connect elsewhere may take the
        # first's port again while it is in TIME_WAIT.)
        assert {ends for ends in tcp_connections(first[1], TCP_ESTABLISHED)
                if {int(end.rsplit(":", 1)[1], 16) for end in ends} == {first[1], port}} == set()


async def test_a_socket_its_link_outlived_answers_as_closed(friends, monkeypatch):
    """A transport's socket kept by its user past the connection's end
    answers as a closed socket (EBADF), on both paths; on the friend path it
    never reaches the connection, kept for the next link."""
    monkeypatch.undo()
    async with serving(friends) as (echoes, port):
        held = []
        first = await _one_exchange(port, friends, held.append)
        await echoes.all_lost()
        for _ in range(3):
            await asyncio.sleep(0)
        old = held[0]
        # (uvloop's socket object holds its descriptor as -1 once closed, and
        # makes a socket of it for each call.)
        closed = OSError if isinstance(asyncio.get_running_loop(), asyncio.BaseEventLoop) else ValueError

        def calls():
            yield lambda: old.getsockopt(socket.SOL_SOCKET, socket.SO_KEEPALIVE)
            yield lambda: old.setsockopt(socket.SOL_SOCKET, socket.SO_KEEPALIVE, 1)
            yield old.getpeername
            yield old.getsockname

        for call in calls():
            with pytest.raises(closed) as caught:
                call()
            assert closed is ValueError or caught.value.errno == errno.EBADF
        with pytest.raises(OSError) as caught:
            old.dup()
        assert caught.value.errno == errno.EBADF
        assert old.fileno() == -1
        options = []

        def look(sock):
            options.append(sock.getsockopt(socket.SOL_SOCKET, socket.SO_KEEPALIVE))
            for call in calls():
                pytest.raises(closed, call)
            options.append(sock.getsockopt(socket.SOL_SOCKET, socket.SO_KEEPALIVE))

        second = await _one_exchange(port, friends, look)
        assert (second == first) is friends
        assert options == [0, 0]


async def test_a_listener_keeps_a_few_connections_and_ends_them_as_it_closes(friends, monkeypatch):
    """Many links open at once, then all closed: the listener keeps no more
    than its few (two descriptors each), ends the rest, and ends those as
    it closes."""
    monkeypatch.undo()
    async with serving(friends) as (echoes, port):
        before = descriptors_open()
        clients = [(await friendsock.create_connection(Recorder, "127.0.0.1", port, friends=friends))[0]
                   for _ in range(3 * _handshake.KEPT_PER_LISTENER)]
        await bounded(echoes.first)
        for transport in clients:
            transport.close()
        await echoes.all_lost()
        for _ in range(3):
            await asyncio.sleep(0)
        kept = descriptors_open() - before
        assert kept == (2 * _handshake.KEPT_PER_LISTENER if friends else 0)
    assert descriptors_open() == before - 1
