"""Socketless links (``FRIENDSOCK_SOCKETLESS=1`` / ``set_socketless(True)``):
the transport conformance tests, the TLS tests and the tests across loops
in two threads again with no kernel socket under the friend path (real TCP
stays the reference), and what is particular to them:
no descriptor, addresses, options, many links, what stays real."""

from __future__ import annotations

import asyncio
import gc
import os
import socket
import struct
import subprocess
import sys
import textwrap

import pytest

import friendsock
from support import connected_pair, descriptors
from test_threads import *  # noqa: F401,F403 (across loops in two threads, run again here)
from test_tls import *  # noqa: F401,F403 (TLS over the link, run again here)
from test_transport import *  # noqa: F401,F403 (the conformance tests, run again here)


@pytest.fixture(autouse=True)
def socketless():
    """Every friend connect of the test is socketless."""
    assert not friendsock.is_socketless()
    friendsock.set_socketless(True)
    try:
        yield
    finally:
        friendsock.set_socketless(False)




async def test_a_socketless_end_has_no_descriptor_and_plausible_addresses(friends):
    async with connected_pair(friends) as (transport, client, server):
        sock = transport.get_extra_info("socket")
        server_transport = server.transport
        sockname, peername = transport.get_extra_info("sockname"), transport.get_extra_info("peername")
        assert server_transport.get_extra_info("peername") == sockname
        assert server_transport.get_extra_info("sockname") == peername
        assert sockname[0] == "127.0.0.1" and 1024 <= sockname[1] < 65536
        assert (sock.fileno() == -1) is friends
        for level, option in ((socket.SOL_SOCKET, socket.SO_SNDBUF), (socket.SOL_SOCKET, socket.SO_RCVBUF)):
            sock.setsockopt(level, option, 65536)
            assert sock.getsockopt(level, option) == 131072  # doubled, as Linux does
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        assert sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY) == 1
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_KEEPALIVE, 1)
        assert sock.getsockopt(socket.SOL_SOCKET, socket.SO_KEEPALIVE) == 1
        # Any other option a program sets is kept and read back as set.
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_KEEPIDLE, 30)
        assert sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_KEEPIDLE) == 30
        sock.setsockopt(socket.IPPROTO_IP, socket.IP_TOS, 0x10)
        assert sock.getsockopt(socket.IPPROTO_IP, socket.IP_TOS) == 0x10
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_KEEPINTVL, struct.pack("i", 7))
        assert sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_KEEPINTVL) == 7
        assert sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_KEEPINTVL, 4) == struct.pack("i", 7)
        with pytest.raises(OSError):
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_TYPE, 1)  # read-only
        assert sock.getsockopt(socket.SOL_SOCKET, socket.SO_TYPE) == socket.SOCK_STREAM


async def test_many_links_use_no_descriptors_and_leave_nothing_behind(friends):
    """2,000 links open at once (no descriptor each on the friend path, two
    on TCP), unique addresses, then all closed: no live link, descriptors and
    ports back."""
    count = 2000 if friends else 200
    async with connected_pair(friends):
        pass  # the loop makes what it makes on first use (uvloop: a descriptor)
    await asyncio.sleep(0)
    before_fds = descriptors()
    before = friendsock.stats()
    server_ends = []

    class Server(asyncio.Protocol):
        def connection_made(self, transport):
            server_ends.append(transport)

    server = await friendsock.create_server(Server, "127.0.0.1", 0, friends=friends, backlog=4096)
    try:
        port = server.sockets[0].getsockname()[1]
        clients = [(await friendsock.create_connection(asyncio.Protocol, "127.0.0.1", port,
                                                         friends=friends))[0]
                   for _ in range(count)]
        await asyncio.sleep(0)
        assert len({t.get_extra_info("sockname") for t in clients}) == count
        if friends:
            # The listening socket and the loop's own; over TCP: 4,000 more.
            assert len(descriptors() - before_fds) < 10
            assert friendsock.stats().links_alive - before.links_alive == count
        for transport in clients + server_ends:
            transport.close()
        for _ in range(3):
            await asyncio.sleep(0)
    finally:
        server.close()
        await server.wait_closed()
    gc.collect()
    assert friendsock.stats().links_alive == before.links_alive
    assert not descriptors() - before_fds
    assert friendsock.stats().links_made - before.links_made == (count if friends else 0)


async def test_100000_links_opened_and_closed_leave_nothing_behind(friends):
    """100,000 socketless links (1,000 open at a time), each closed by both
    ends: no live link, no descriptor, and nothing kept per link: the heap
    after the second 50,000 is where it was after the first (whatever
    Python's own caches took by then). TCP, the reference, runs a few
    hundred: its ports would sit in TIME_WAIT."""
    total, batch = (100_000, 1_000) if friends else (400, 100)
    server_ends = []

    class Server(asyncio.Protocol):
        def connection_made(self, transport):
            server_ends.append(transport)

    server = await friendsock.create_server(Server, "127.0.0.1", 0, friends=friends, backlog=4096)
    port = server.sockets[0].getsockname()[1]

    async def open_and_close(count: int) -> None:
        clients = [(await friendsock.create_connection(asyncio.Protocol, "127.0.0.1", port,
                                                         friends=friends))[0]
                   for _ in range(count)]
        await asyncio.sleep(0)
        assert len(server_ends) == count
        for transport in clients + server_ends:
            transport.close()
        server_ends.clear()
        for _ in range(3):
            await asyncio.sleep(0)

    try:
        await open_and_close(batch)  # what the first links make once
        gc.collect()
        before_fds = descriptors()
        before = friendsock.stats()
        blocks = []
        for _half in range(2):
            for _ in range(total // batch // 2):
                await open_and_close(batch)
            gc.collect()
            blocks.append(sys.getallocatedblocks())
        assert friendsock.stats().links_alive == before.links_alive
        assert friendsock.stats().links_made - before.links_made == (total if friends else 0)
        assert not descriptors() - before_fds
        if friends:
            assert blocks[1] - blocks[0] < 100, blocks
    finally:
        server.close()
        await server.wait_closed()


async def test_a_connect_with_a_socket_of_its_own_stays_real(friends):
    """``local_addr=`` asks for a real socket: such a connect is a friend
    link over real sockets (or TCP), never socketless."""
    async with connected_pair(friends) as (transport, _client, _server):
        port = transport.get_extra_info("peername")[1]
        other, _ = await friendsock.create_connection(asyncio.Protocol, "127.0.0.1", port,
                                                      local_addr=("127.0.0.1", 0), friends=friends)
        try:
            assert other.get_extra_info("socket").fileno() >= 0
            assert friendsock.is_friend(other) is friends
        finally:
            other.close()


def test_the_variable_switches_it_on_and_another_process_stays_tcp(tmp_path):
    """FRIENDSOCK_SOCKETLESS=1: a program's own connects go socketless; a
    peer in another process gets real TCP."""
    program = tmp_path / "program.py"
    program.write_text(textwrap.dedent("""
        import asyncio, socket, subprocess, sys
        import friendsock

        async def main():
            assert friendsock.is_socketless()
            async def echo(reader, writer):
                writer.write(await reader.read(100))
                await writer.drain()
                writer.close()

            server = await friendsock.start_server(echo, "127.0.0.1", 0)
            port = server.sockets[0].getsockname()[1]
            reader, writer = await friendsock.open_connection("127.0.0.1", port)
            writer.write(b"here")
            assert await reader.read() == b"here"
            assert writer.get_extra_info("socket").fileno() == -1
            writer.close()
            peer = await asyncio.create_subprocess_exec(
                sys.executable, "-c",
                "import socket,sys; s=socket.create_connection(('127.0.0.1', int(sys.argv[1])));"
                "s.sendall(b'there'); print(s.recv(100).decode())", str(port),
                stdout=subprocess.PIPE)
            out, _ = await peer.communicate()
            assert out == b"there\\n", out
            server.close()
            await server.wait_closed()
            stats = friendsock.stats()
            print(stats.links_made, stats.fallbacks.get("peer-not-friend", 0))

        asyncio.run(main())
    """))
    env = {k: v for k, v in os.environ.items() if not k.startswith("FRIENDSOCK")}
    env["FRIENDSOCK_SOCKETLESS"] = "1"
    result = subprocess.run([sys.executable, str(program)], capture_output=True, text=True,
                            timeout=60, env=env)
    assert result.returncode == 0, result.stderr
    assert result.stdout.split() == ["1", "1"]


def test_a_socketless_connect_to_a_listener_gone_meanwhile_is_reset():
    """A listener forgotten between a client's look-up and its connect
    (closed on another thread) no longer takes links: the connect is reset,
    as a closing listener resets its backlog, and the forgotten listener's
    hooks keep nothing of its server."""
    from friendsock._core._channel import Seen
    from friendsock._handshake import forget_listener, register_listener
    from friendsock._socketless import socketless_connect

    with socket.create_server(("127.0.0.1", 0)) as listener:
        entry = register_listener(listener, None, owner=object(), exclusive=True)
        entry.handle.socketless_accept = lambda *args: pytest.fail("accepted after the listener went")
        forget_listener(entry)
        assert entry.handle.socketless_accept is None
        made = socketless_connect(entry, listener.getsockname(), threaded=False)
        assert made.link.client.incoming.seen() is Seen.RESET
        made.link.client.close()
        assert made.link.done
