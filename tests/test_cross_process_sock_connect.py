"""Sockets their users connect, to a server of another process (asyncio
and uvloop).

aiohttp's client connects a socket of its own with ``loop.sock_connect``
and hands it to ``create_connection(sock=)``. On an installed loop such a
connection to a friendsock server of another process moves off TCP as
the loop's own connects do; a socket used raw before it is handed over,
or never handed over, stays TCP with every byte. Each test runs with
this process on each loop and the other on the other, and on the friend
path and on TCP (the other process with cross-process moves switched
off), but for the one of a server giving up an offer, made on the
friend path alone.
"""

from __future__ import annotations

import asyncio
import hashlib
import io
import random
import socket

import aiohttp
import pytest

import friendsock
from friendsock._asyncio._loop_state import loop_state
from friendsock._host._offers import peer_shut_down

from support import bounded, until
from test_cross_process import (  # noqa: F401 (fixtures)
    SIZE,
    Peer,
    _environment,
    _serving,
    echoed_over,
    no_peer_left,
    nothing_left_open,
    peer_loop,
)


async def _connected_by_its_user(port: int) -> socket.socket:
    """What aiohttp's connector does first: a socket of its own, connected
    with ``loop.sock_connect``."""
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setblocking(False)
    try:
        await bounded(asyncio.get_running_loop().sock_connect(sock, ("127.0.0.1", port)))
    except BaseException:
        sock.close()
        raise
    return sock


async def test_a_socket_its_user_connected_moves_as_it_is_handed_to_the_loop(peer_loop, path):
    peer, port = await _serving(peer_loop, path)
    payload = random.Random(5).randbytes(SIZE)
    try:
        with friendsock.installed():
            sock = await _connected_by_its_user(port)
            reader, writer = await bounded(asyncio.open_connection(sock=sock))
            assert friendsock.is_friend(writer) is (path == "friend")
            assert writer.get_extra_info("socket").fileno() == sock.fileno()
            ours = await echoed_over(reader, writer, payload)
        theirs = await peer.report()
    finally:
        await peer.finish()
    assert ours["sha256"] == theirs["sha256"] == hashlib.sha256(payload).hexdigest()
    # The kernel's word: payload crossed TCP on the TCP path only, at both ends.
    assert ours["payload_moved"] is theirs["payload_moved"] is (path == "tcp")
    assert ours["sockname"] == theirs["peername"] and ours["peername"] == theirs["sockname"]


async def test_a_socket_used_raw_before_it_is_handed_over_stays_tcp(peer_loop, path):
    """Bytes sent raw cross TCP: the connection stays there, the server
    reading them first, then what the transport sends."""
    peer, port = await _serving(peer_loop, path)
    first, rest = b"raw first|", random.Random(6).randbytes(1 << 16)
    try:
        with friendsock.installed():
            sock = await _connected_by_its_user(port)
            await bounded(asyncio.get_running_loop().sock_sendall(sock, first))
            reader, writer = await bounded(asyncio.open_connection(sock=sock))
            assert not friendsock.is_friend(writer)
            ours = await echoed_over(reader, writer, rest)
        theirs = await peer.report()
    finally:
        await peer.finish()
    assert ours["sha256"] == theirs["sha256"] == hashlib.sha256(first + rest).hexdigest()
    assert ours["payload_moved"] and theirs["payload_moved"]


async def test_a_socket_used_raw_only_is_served_over_tcp(peer_loop, path):
    """Never handed over, only used raw (``sock_sendall``, ``sock_recv``):
    the offer held for it is declined, and the server answers over TCP."""
    peer, port = await _serving(peer_loop, path)
    loop = asyncio.get_running_loop()
    payload = random.Random(8).randbytes(1 << 16)
    try:
        with friendsock.installed():
            sock = await _connected_by_its_user(port)
            with sock:
                await bounded(loop.sock_sendall(sock, payload))
                sock.shutdown(socket.SHUT_WR)
                echoed = bytearray()
                while data := await bounded(loop.sock_recv(sock, 1 << 16)):
                    echoed += data
                assert not friendsock.is_friend(sock)
        theirs = await peer.report()
    finally:
        await peer.finish()
    assert bytes(echoed) == payload
    assert theirs["sha256"] == hashlib.sha256(payload).hexdigest() and theirs["payload_moved"]


async def test_a_socket_used_raw_reaches_a_blocking_server_whose_accept_times_out_sooner(peer_loop, path):
    """A blocking server whose listener times out in 50 ms, less than the
    offer is held: its accept waits for the answer anyway, and serves the
    raw bytes over TCP rather than reset a connection the client may yet
    take."""
    peer, port = await _serving(peer_loop, path, door="blocking-short-timeout")
    loop = asyncio.get_running_loop()
    try:
        with friendsock.installed():
            # (A blocking server publishes its port as it first accepts.)
            (await _connected_by_its_user(port)).close()
            await peer.report()
            sock = await _connected_by_its_user(port)
            with sock:
                if path == "friend":  # (the offer made and held before any byte is sent)
                    across = loop_state(loop).across
                    assert across is not None
                    await until(lambda: across.for_users[sock].held is not None)
                await bounded(loop.sock_sendall(sock, b"ping"))
                sock.shutdown(socket.SHUT_WR)
                assert await bounded(loop.sock_recv(sock, 16)) == b"ping"
        theirs = await peer.report()
    finally:
        await peer.finish()
    assert theirs["sha256"] == hashlib.sha256(b"ping").hexdigest() and theirs["friend"] is False


async def test_a_socket_handed_over_after_its_server_gave_up_is_not_moved(peer_loop, monkeypatch):
    """Held past the time its server waits for the answer (here the offer
    is held a minute; a blocking server's short listener timeout gives it
    half a second): the server resets the connection, as it must when the
    client may yet take its offer, and the socket handed over afterwards
    ends over TCP, not on a transport over a pair nobody serves."""
    monkeypatch.setattr(friendsock._asyncio._across, "CONFIRM_TIMEOUT", 60.0)
    peer, port = await _serving(peer_loop, "friend", door="blocking-short-timeout")
    loop = asyncio.get_running_loop()
    try:
        with friendsock.installed():
            (await _connected_by_its_user(port)).close()  # (the port published as it accepts)
            await peer.report()
            sock = await _connected_by_its_user(port)
            across = loop_state(loop).across
            assert across is not None
            wait = across.for_users[sock]
            await until(lambda: wait.held is not None)
            pair_end = wait.held[3][1]
            await until(lambda: peer_shut_down(pair_end.fileno()))  # the server gave up
            reader, writer = await bounded(asyncio.open_connection(sock=sock))
            try:
                assert not friendsock.is_friend(writer)
                try:  # (EOF or the reset, as the server's shutdown or its reset comes first)
                    ended = await bounded(reader.read())
                except ConnectionResetError:
                    ended = b""
                assert ended == b""
            finally:
                writer.close()
        assert (await peer.report())["error"] == "ConnectionResetError"
    finally:
        await peer.finish()


async def test_a_socket_its_user_closes_unused_leaves_nothing_waiting(peer_loop, path):
    """Connected and closed, never handed over: the server's offer is
    declined and it serves the connection over TCP, reading EOF; nothing
    here waits for the socket any more."""
    peer, port = await _serving(peer_loop, path)
    try:
        with friendsock.installed():
            sock = await _connected_by_its_user(port)
            sock.close()
            theirs = await peer.report()
            across = loop_state(asyncio.get_running_loop()).across
            await until(lambda: across is None or not across.for_users)
    finally:
        await peer.finish()
    assert theirs["sha256"] == hashlib.sha256(b"").hexdigest()
    assert theirs["transport"] != "AcrossTransport"


async def test_an_aiohttp_client_to_an_aiohttp_server_process(peer_loop, path):
    """aiohttp at both ends, each on an installed loop: the request and
    its answer move off TCP, on the connection the pool keeps too."""
    peer = await Peer.start("serve", peer_loop, "aiohttp", env=_environment(path))
    port = int(await peer.line())
    before = friendsock.stats().cross_process_peers.get(peer.process.pid, 0)
    payload = random.Random(7).randbytes(SIZE)
    try:
        with friendsock.installed():
            async with aiohttp.ClientSession() as session:
                for _ in range(2):
                    async with session.post(f"http://127.0.0.1:{port}/echo", data=io.BytesIO(payload)) as response:
                        assert response.connection is not None
                        assert friendsock.is_friend(response.connection.transport) is (path == "friend")
                        body = await bounded(response.read())
                    assert hashlib.sha256(body).digest() == hashlib.sha256(payload).digest()
                    assert response.headers["x-friend"] == str(path == "friend")
                    assert response.headers["x-payload-moved"] == str(path == "tcp")
    finally:
        await peer.finish()
    moved = friendsock.stats().cross_process_peers.get(peer.process.pid, 0) - before
    assert moved == (1 if path == "friend" else 0)
