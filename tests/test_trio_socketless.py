"""Socketless links on trio (``set_socketless(True)``): the trio tests —
``friendsock.trio``'s streams, ``install()`` with trio's own code and anyio,
and trio with asyncio across threads — again with no kernel socket under
the friend path (real TCP stays the reference), and what is particular to
them: no descriptor, a listener's socketless backlog, what stays real."""

from __future__ import annotations

import gc
import socket

import pytest
import trio

import friendsock
import friendsock.trio as fst
import test_trio
from support import descriptors
from test_socketless import socketless  # noqa: F401 (autouse: every friend connect is socketless)
from test_trio import *  # noqa: F401,F403 (friendsock.trio's streams, run again here)
from test_trio_install import *  # noqa: F401,F403 (install(): trio, anyio, run again here)
from test_trio_threads import *  # noqa: F401,F403 (trio and asyncio across threads, run again here)
from trio_support import LOCALHOST, TIMEOUT, listening, receive_until_eof, stream_pair

# test_trio marks its whole module trio; here that mark goes on its tests only.
del pytestmark  # noqa: F821
for _name in dir(test_trio):
    if _name.startswith("test_"):
        globals()[_name] = pytest.mark.trio(getattr(test_trio, _name))


# -- what is particular to socketless links on trio ---------------------------------




@pytest.mark.trio
async def test_a_socketless_trio_end_has_no_descriptor_and_plausible_addresses(installed):
    """Both of trio's kinds of friend end — trio's own SocketStream over a
    socket that paired itself, and friendsock.trio's FriendStream — with no
    descriptor on the friend path, addresses that mirror each other, and
    options kept as the kernel keeps them."""
    listeners = await trio.open_tcp_listeners(0, host=LOCALHOST)
    async with listeners[0] as listener:
        port = listener.socket.getsockname()[1]
        with trio.fail_after(TIMEOUT):
            async with await trio.open_tcp_stream(LOCALHOST, port) as client, \
                    await listener.accept() as server:
                for stream in (client, server):
                    assert type(stream) is trio.SocketStream
                    assert fst.is_friend(stream.socket) is installed
                    assert (stream.socket.fileno() == -1) is installed
                assert client.socket.getsockname() == server.socket.getpeername()
                assert client.socket.getpeername() == server.socket.getsockname() == (LOCALHOST, port)
                assert 1024 <= client.socket.getsockname()[1] < 65536
                client.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, 65536)
                assert client.getsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF) == 131072
                assert client.getsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY) == 1
                await client.wait_send_all_might_not_block()
                await client.send_all(b"no descriptor")
                await client.send_eof()
                assert await receive_until_eof(server) == b"no descriptor"
    async with stream_pair(installed) as (client, server):
        assert (client.socket.fileno() == -1) is installed
        assert (server.socket.fileno() == -1) is installed


@pytest.mark.trio
async def test_a_trio_socket_bound_before_connect_stays_real(installed):
    """A socket its user bound asked for a real socket: it pairs over real
    sockets (or is TCP), never socketless."""
    listeners = await trio.open_tcp_listeners(0, host=LOCALHOST)
    async with listeners[0] as listener:
        client = trio.socket.socket()
        await client.bind((LOCALHOST, 0))
        with client, trio.fail_after(TIMEOUT):
            await client.connect(listener.socket.getsockname())
            async with await listener.accept() as server:
                assert client.fileno() >= 0 and server.socket.fileno() >= 0
                assert fst.is_friend(client) is installed


@pytest.mark.trio
async def test_many_trio_links_use_no_descriptors_and_leave_nothing_behind(friends):
    """2,000 links open at once on trio (no descriptor each on the friend
    path, two on TCP), unique addresses, then all closed: no live link,
    descriptors back."""
    count = 2000 if friends else 200
    async with stream_pair(friends):
        pass
    before_fds = descriptors(collected=True)
    before = friendsock.stats()
    async with listening(friends, backlog=4096) as (listener, port):
        streams = []
        with trio.fail_after(TIMEOUT):
            for _ in range(count):
                streams.append(await fst.open_tcp_stream(LOCALHOST, port, friends=friends))
                streams.append(await listener.accept())
        try:
            assert len({stream.socket.getsockname() for stream in streams[::2]}) == count
            if friends:
                assert len(descriptors(collected=True) - before_fds) < 10  # the listening sockets
                assert friendsock.stats().links_alive - before.links_alive == count
        finally:
            for stream in streams:
                await trio.aclose_forcefully(stream)
    gc.collect()
    assert friendsock.stats().links_alive == before.links_alive
    assert not descriptors(collected=True) - before_fds
    assert friendsock.stats().links_made - before.links_made == (count if friends else 0)
