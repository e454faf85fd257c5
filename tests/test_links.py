"""``friendsock.links()``: the live friend links, one typed record each."""

from __future__ import annotations

import asyncio
import socket
import threading

import pytest
import trio

import friendsock
from friendsock.__main__ import main as cli_main
from support import Recorder, connected_pair
from test_threads import Factory, ThreadRecorder, close_server, make_server, other  # noqa: F401
from trio_support import nothing_left_behind, stream_pair  # noqa: F401

TIMEOUT = 10


def link_of(transport: asyncio.BaseTransport) -> friendsock.LinkInfo:
    """The record of the link whose client end is ``transport``."""
    sockname = transport.get_extra_info("sockname")
    found = [link for link in friendsock.links() if link.client.address == sockname]
    assert len(found) == 1, friendsock.links()
    return found[0]


async def test_queued_bytes_grow_under_a_paused_reader(path):
    async with connected_pair(path == "friend") as (transport, client, server):
        if path == "tcp":  # real TCP is the kernel's to show (ss -tni)
            assert all(link.client.address != transport.get_extra_info("sockname")
                       for link in friendsock.links())
            return
        # Small buffers, so the writer's own buffer fills and it pauses.
        transport.get_extra_info("socket").setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, 4096)
        server.transport.get_extra_info("socket").setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
        server.transport.pause_reading()
        info = link_of(transport)
        assert info.to_server.queued == 0 and info.server.paused_reading is True
        assert info.client.paused_reading is False and info.client.paused_writing is False
        for step in (1, 2, 3):
            transport.write(b"x" * 100_000)
            info = link_of(transport)
            assert info.to_server.queued == step * 100_000
            assert info.to_server.moved == 0 and info.to_server.state == "open"
        assert info.client.paused_writing is True  # beyond sndbuf + friend rcvbuf + 64 KiB
        assert info.client.sndbuf == transport.get_extra_info("socket").getsockopt(
            socket.SOL_SOCKET, socket.SO_SNDBUF)
        assert info.server.rcvbuf == server.transport.get_extra_info("socket").getsockopt(
            socket.SOL_SOCKET, socket.SO_RCVBUF)
        assert info.to_client == friendsock.DirectionInfo("open", 0, 0, False)
        server.transport.resume_reading()
        await asyncio.wait_for(server.wait_bytes(300_000), TIMEOUT)
        info = link_of(transport)
        assert (info.to_server.queued, info.to_server.moved) == (0, 300_000)
        assert not info.server.paused_reading and not info.client.paused_writing


async def test_a_link_goes_once_both_ends_closed():
    async with connected_pair(True, server_protocol=lambda: Recorder(eof_keep_open=True)) as (
            transport, client, server):
        info = link_of(transport)
        assert info.client.address == transport.get_extra_info("sockname")
        assert info.server.address[:2] == transport.get_extra_info("peername")[:2]
        assert info.listener == "{}:{}".format(*info.server.address[:2])
        assert info.age >= 0 and not info.threaded and not info.captured
        assert info.client.thread == info.server.thread == threading.current_thread().name
        loop = asyncio.get_running_loop()
        assert info.client.scheduler == info.server.scheduler
        assert type(loop).__name__ in info.client.scheduler
        assert "->" in str(info)
        transport.close()
        await asyncio.wait_for(asyncio.gather(client.lost, server.eof), TIMEOUT)
        info = link_of(transport)  # half gone: the server end is still open
        assert info.client.closed and not info.server.closed
        assert info.to_server.state == "eof" and info.to_server.reader_closed is False
        assert info.to_client.reader_closed is True
        server.transport.close()
        await asyncio.wait_for(server.lost, TIMEOUT)
        sockname = transport.get_extra_info("sockname")
        assert all(link.client.address != sockname for link in friendsock.links())


async def test_ends_on_two_threads_name_their_threads_and_loops(other):
    factory = Factory(ThreadRecorder)
    server = await make_server(other, factory)
    try:
        transport, client = await friendsock.create_connection(ThreadRecorder, "127.0.0.1",
                                                               server.sockets[0].getsockname()[1])
        peer = await other.run(factory.wait_first())
        info = link_of(transport)
        assert info.threaded
        assert info.client.thread == threading.current_thread().name
        assert info.server.thread == other.thread.name
        assert type(other.loop).__name__ in info.server.scheduler
        assert type(asyncio.get_running_loop()).__name__ in info.client.scheduler
        transport.write(b"across")
        await other.run(peer.wait_bytes(6))
        assert link_of(transport).to_server.moved == 6
        transport.close()
        await other.call(peer.transport.close)
        await asyncio.wait_for(client.lost, TIMEOUT)
        await other.run(peer.lost)
    finally:
        await close_server(other, server)
    assert all(link.client.address != transport.get_extra_info("sockname") for link in friendsock.links())


@pytest.mark.trio
async def test_trio_links_are_listed():
    async with stream_pair(True) as (client, server):
        found = [link for link in friendsock.links() if link.client.address == client.getsockname()]
        assert len(found) == 1
        info = found[0]
        assert info.client.thread == info.server.thread == threading.current_thread().name
        assert info.client.scheduler == info.server.scheduler == "trio"
        assert info.client.paused_reading is None and not info.client.paused_writing
        assert info.client.scheduler == info.server.scheduler == "trio"
        assert info.client.paused_reading is None and not info.client.paused_writing
        with trio.fail_after(TIMEOUT):
            await client.send_all(b"t" * 1000)
        info = [link for link in friendsock.links() if link.client.address == client.getsockname()][0]
        assert info.to_server.queued == 1000
        await server.receive_some()
        await client.aclose()
        await server.aclose()
        assert all(link.client.address != client.getsockname() for link in friendsock.links())


def test_the_command_line_help_documents_capture_and_links(capsys):
    assert cli_main(["--help"]) == 0
    text = capsys.readouterr().out
    for word in ("FRIENDSOCK_PCAP=FILE", "FRIENDSOCK_PCAP_MAX", "friendsock.capture", "friendsock.links()"):
        assert word in text
