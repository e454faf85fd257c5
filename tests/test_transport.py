"""Transport conformance: every test runs on {friend path, real TCP} x
{asyncio, uvloop}. Whatever TCP does here is what the friend path must do;
exact byte thresholds are asserted on the friend path only, where the
accounting is ours (``sndbuf + friend rcvbuf``)."""

from __future__ import annotations

import array
import asyncio
import contextlib
import errno
import gc
import logging
import os
import random
import select
import socket
import struct
import sys
import weakref
from typing import Any, AsyncIterator, List, Optional

import pytest
import uvloop

import friendsock
from support import (
    LOCALHOST,
    ContextRecorder,
    answer_then_finish,
    Recorder,
    chunked,
    connected_pair,
    cyclic_garbage_of_ours,
    port_of,
    request_var,
)

TIMEOUT = 10
MiB = 1 << 20


async def wait(aw, timeout: float = TIMEOUT):
    return await asyncio.wait_for(aw, timeout)


def buffer_sizes(writer: asyncio.Transport, reader: asyncio.Transport) -> "tuple[int, int]":
    """The writer's SO_SNDBUF and the reader's SO_RCVBUF, as their sockets say."""
    sndbuf = writer.get_extra_info("socket").getsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF)
    rcvbuf = reader.get_extra_info("socket").getsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF)
    return sndbuf, rcvbuf


async def arrived(friends: bool, reader: asyncio.Transport) -> None:
    """Until bytes written to ``reader`` have reached its end of the connection.

    On the friend path a write queues on the friend at once. On TCP, watch a
    duplicate of the reader's socket (the transport's own fd is the loop's)
    until the kernel holds something to read.
    """
    if friends:
        return
    loop = asyncio.get_running_loop()
    fd = os.dup(reader.get_extra_info("socket").fileno())
    try:
        ready = loop.create_future()
        loop.add_reader(fd, lambda: ready.done() or ready.set_result(None))
        try:
            await wait(ready)
        finally:
            loop.remove_reader(fd)
    finally:
        os.close(fd)


class FlowRecorder(Recorder):
    """A Recorder that also records pause_writing/resume_writing, with the
    transport's write buffer size at each call."""

    def __init__(self, eof_keep_open: bool = False) -> None:
        super().__init__(eof_keep_open)
        self.flow: List[str] = []
        self.flow_sizes: List[int] = []
        loop = asyncio.get_running_loop()
        self.paused = loop.create_future()
        self.resumed = loop.create_future()

    def pause_writing(self) -> None:
        self.flow.append("pause")
        self.flow_sizes.append(self.transport.get_write_buffer_size())
        if not self.paused.done():
            self.paused.set_result(None)

    def resume_writing(self) -> None:
        self.flow.append("resume")
        self.flow_sizes.append(self.transport.get_write_buffer_size())
        if not self.resumed.done():
            self.resumed.set_result(None)


class BufferedRecorder(asyncio.BufferedProtocol):
    """A BufferedProtocol reader with a fixed-size buffer, recording like
    Recorder."""

    def __init__(self, size: int, eof_keep_open: bool = False) -> None:
        self.buffer = bytearray(size)
        self.events: List[str] = []
        self.data = bytearray()
        self.sizes: List[int] = []
        self.transport: Optional[asyncio.Transport] = None
        self.eof_keep_open = eof_keep_open
        loop = asyncio.get_running_loop()
        self.made = loop.create_future()
        self.eof = loop.create_future()
        self.lost = loop.create_future()

    def connection_made(self, transport) -> None:
        self.events.append("made")
        self.transport = transport
        self.made.set_result(None)

    def get_buffer(self, sizehint: int) -> bytearray:
        return self.buffer

    def buffer_updated(self, nbytes: int) -> None:
        assert 0 < nbytes <= len(self.buffer)
        if self.events[-1] != "data":
            self.events.append("data")
        self.sizes.append(nbytes)
        self.data += self.buffer[:nbytes]

    def eof_received(self):
        self.events.append("eof")
        self.eof.set_result(None)
        return self.eof_keep_open

    def connection_lost(self, exc) -> None:
        self.events.append("lost")
        self.lost.set_result(exc)


class EchoUntilEof(asyncio.Protocol):
    """Writes back what it reads; at EOF closes (after the echo is flushed)."""

    transport: Optional[asyncio.Transport] = None

    def connection_made(self, transport) -> None:
        self.transport = transport

    def data_received(self, data: bytes) -> None:
        self.transport.write(data)

    def eof_received(self):
        return False

    def connection_lost(self, exc) -> None:
        # Done: keep connected_pair's cleanup abort() off this transport
        # (asyncio 3.11's abort() fails once a flushing close() finished).
        self.transport = None


# -- callback order -----------------------------------------------------------


@pytest.mark.parametrize("side", ["client", "server"])
@pytest.mark.parametrize("how", ["close", "write_eof", "abort"])
async def test_callback_order(friends, how, side):
    async with connected_pair(friends) as (transport, client, server):
        transport.write(b"hello")
        assert await wait(server.wait_bytes(5)) == b"hello"
        server.transport.write(b"world")
        assert await wait(client.wait_bytes(5)) == b"world"
        ender, other = (client, server) if side == "client" else (server, client)
        getattr(ender.transport, how)()
        assert await wait(ender.lost) is None
        assert await wait(other.lost) is None
        # One more round of callbacks: nothing may follow connection_lost.
        for _ in range(3):
            await asyncio.sleep(0)
        if how == "write_eof":
            # The other end's eof_received() returns false: it closes, and
            # its FIN reaches the half-closed end as EOF.
            assert ender.events == ["made", "data", "eof", "lost"]
        else:
            assert ender.events == ["made", "data", "lost"]
        assert other.events == ["made", "data", "eof", "lost"]


@pytest.mark.parametrize("side", ["client", "server"])
@pytest.mark.parametrize("writer", ["task", "reply"])
async def test_protocol_callbacks_run_in_their_transports_context(friends, side, writer):
    """A reader's callbacks run in its transport's own context, whatever
    context the friend wrote from (a task of its own, or a reply in its
    data_received): the loop's transports copy one as they are made.
    uvloop runs every callback of a transport in that one context; asyncio
    runs connection_made in a copy of its own, and connection_lost in a
    copy of the context of whoever closed."""
    replies = writer == "reply"
    made = {"server": lambda: ContextRecorder(replies and side == "client"),
            "client": lambda: ContextRecorder(replies and side == "server")}
    async with connected_pair(friends, server_protocol=made["server"],
                              client_protocol=made["client"]) as (_, client, server):
        reader, other = (client, server) if side == "client" else (server, client)

        async def send(request: str, data: bytes) -> None:
            request_var.set(request)  # the writer's context: never the reader's
            if replies:
                reader.transport.write(data)  # the other end answers with it
            else:
                other.transport.write(data)

        for count, data in enumerate([b"1", b"2"], 1):
            await asyncio.create_task(send(f"write {count}", data))
            assert await wait(reader.wait_bytes(count)) == b"12"[:count]

        async def finish() -> None:
            request_var.set("eof")
            other.transport.write_eof()

        await asyncio.create_task(finish())
        await wait(reader.lost)  # its eof_received returns False: it closes
    one_context = isinstance(asyncio.get_running_loop(), uvloop.Loop)
    request = "made" if one_context else "none"
    assert reader.seen == [("data", request, 1), ("data", request, 2),
                           ("eof", request, 3), ("lost", request, 4)]


async def test_a_servers_ends_are_made_in_the_servers_context(friends):
    """The loops' servers accept in their listeners' reader callbacks: a
    server's ends (and a stream server's handler task) are made in a copy of
    the context it started serving in, never in the connecting client's."""
    seen: dict = {}
    protocols: List[Recorder] = []

    class Server(Recorder):
        def connection_made(self, transport) -> None:
            seen["made"] = request_var.get()
            protocols.append(self)
            super().connection_made(transport)

        def data_received(self, data: bytes) -> None:
            seen.setdefault("data", []).append(request_var.get())
            super().data_received(data)

    async def handler(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        seen["handler"] = request_var.get()
        writer.write(await reader.readexactly(1))
        writer.close()

    async def serve() -> tuple:
        request_var.set("server")
        return (await friendsock.create_server(Server, LOCALHOST, 0, friends=friends),
                await friendsock.start_server(handler, LOCALHOST, 0, friends=friends))

    async def connect() -> asyncio.BaseTransport:
        request_var.set("client")
        transport, _ = await friendsock.create_connection(
            asyncio.Protocol, LOCALHOST, port_of(server), friends=friends)
        transport.write(b"x")
        reader, writer = await friendsock.open_connection(LOCALHOST, port_of(streams), friends=friends)
        writer.write(b"y")
        assert await reader.read() == b"y"
        writer.close()
        await writer.wait_closed()
        return transport

    server, streams = await asyncio.create_task(serve())
    try:
        transport = await wait(asyncio.create_task(connect()))
        try:
            assert await wait(protocols[0].wait_bytes(1)) == b"x"
        finally:
            transport.close()
        await wait(protocols[0].lost)
    finally:
        server.close()
        streams.close()
    assert seen == {"made": "server", "data": ["server"], "handler": "server"}


async def test_a_close_that_flushed_loses_the_connection_in_the_transports_context(friends):
    """A close that waits for the buffer to flush: once the reader made
    room, uvloop's transports call connection_lost in the transport's own
    context, never in the reader's."""
    async with connected_pair(friends, client_protocol=ContextRecorder) as (transport, client, server):
        server.transport.pause_reading()
        payload = random.Random(11).randbytes(sum(buffer_sizes(transport, server.transport)) + 4 * MiB)
        transport.write(payload)
        transport.close()
        assert not client.lost.done()

        async def make_room() -> None:
            request_var.set("reader")
            server.transport.resume_reading()

        await asyncio.create_task(make_room())
        assert await wait(client.lost) is None
        assert await wait(server.wait_bytes(len(payload))) == payload
    ((what, request, _),) = client.seen
    assert what == "lost" and request != "reader"
    if isinstance(asyncio.get_running_loop(), uvloop.Loop):
        assert request == "made"


async def test_a_closed_transports_protocol_goes_without_the_garbage_collector(friends):
    """As with the loop's own: once connection_lost has run, dropping the
    transport frees its protocol (and what that holds: a TLS context, say)
    at once, the cycle collector not needed."""
    loop = asyncio.get_running_loop()
    lost = loop.create_future()

    class Client(asyncio.Protocol):
        def connection_lost(self, exc: Optional[BaseException]) -> None:
            lost.set_result(exc)

    server = await friendsock.create_server(asyncio.Protocol, "127.0.0.1", 0, friends=friends)
    try:
        port = server.sockets[0].getsockname()[1]
        transport, protocol = await friendsock.create_connection(Client, "127.0.0.1", port,
                                                                 friends=friends)
        protocol_ref = weakref.ref(protocol)
        gc.disable()
        try:
            transport.close()
            del transport, protocol
            await wait(lost)
            await asyncio.sleep(0)  # the turn that ran connection_lost is over
            assert protocol_ref() is None
        finally:
            gc.enable()
    finally:
        server.close()


class RaisingRecorder(Recorder):
    """A Recorder whose connection_made fails (after recording)."""

    error = ZeroDivisionError("in connection_made")

    def connection_made(self, transport) -> None:
        super().connection_made(transport)
        raise self.error


class AbortingRecorder(Recorder):
    """A Recorder that aborts its transport in connection_made."""

    def connection_made(self, transport) -> None:
        super().connection_made(transport)
        transport.abort()


@pytest.mark.parametrize("side", ["client", "server"])
async def test_connection_made_raising_keeps_the_connection(friends, side):
    """As the loop's own transports, whose connection_made is a loop
    callback: its exception goes to the exception handler as an "Exception
    in callback", and the connection stays. The stdlib loop reads on
    (uvloop starts reading only once connection_made returned); a later
    close() gives connection_lost(None)."""
    loop = asyncio.get_running_loop()
    reports: List[dict] = []
    loop.set_exception_handler(lambda _loop, context: reports.append(context))
    raising = {"client_protocol": RaisingRecorder} if side == "client" else {"server_protocol": RaisingRecorder}
    async with connected_pair(friends, **raising) as (transport, client, server):
        failed, other = (client, server) if side == "client" else (server, client)
        await wait(failed.made)
        await asyncio.sleep(0)  # a callback's exception is reported once it ran
        assert [r["exception"] for r in reports] == [RaisingRecorder.error]
        assert reports[0]["message"].startswith("Exception in callback")
        assert not failed.transport.is_closing()
        reading = isinstance(loop, asyncio.BaseEventLoop)
        assert failed.transport.is_reading() is reading
        if reading:  # (unread bytes would make the close below a reset)
            other.transport.write(b"still here")
            assert await wait(failed.wait_bytes(10)) == b"still here"
        failed.transport.write(b"me too")
        assert await wait(other.wait_bytes(6)) == b"me too"
        failed.transport.close()
        assert await wait(failed.lost) is None
        await wait(other.eof)
    assert len(reports) == 1


async def test_abort_in_connection_made(friends):
    """create_connection returns a turn after connection_made, so an abort()
    there has run its connection_lost(None) by then. On uvloop the
    transport then has no socket to give (its socket object is made when
    first asked for); the stdlib loop's keeps the closed one."""
    async with connected_pair(friends, client_protocol=AbortingRecorder) as (transport, client, server):
        assert client.events == ["made", "lost"] and client.lost_exc is None
        sock = transport.get_extra_info("socket")
        if isinstance(asyncio.get_running_loop(), asyncio.BaseEventLoop):
            assert sock is not None
        else:
            assert sock is None
        await wait(server.lost)


class Greeter(Recorder):
    """A server protocol that writes as soon as it is connected."""

    def connection_made(self, transport) -> None:
        super().connection_made(transport)
        transport.write(b"hello")


async def test_the_server_accepted_when_create_connection_returns(friends):
    """A loopback connect takes a loop turn in which a server on the same
    loop accepts: when create_connection returns, the server end exists
    (a server.close() right after finds it accepted, not in its backlog)."""
    made: List[asyncio.BaseTransport] = []

    class Server(asyncio.Protocol):
        def connection_made(self, transport: asyncio.BaseTransport) -> None:
            made.append(transport)

    server = await friendsock.create_server(Server, "127.0.0.1", 0, friends=friends)
    try:
        port = server.sockets[0].getsockname()[1]
        transport, _ = await friendsock.create_connection(asyncio.Protocol, "127.0.0.1", port,
                                                          friends=friends)
        assert len(made) == 1
        transport.close()
        made[0].close()
    finally:
        server.close()
        await wait(server.wait_closed())


async def test_a_task_started_in_connection_made_takes_one_step_before_the_caller_resumes(friends):
    """Over TCP one loop turn lies between the client's connection_made and
    the return of create_connection (a server on the same loop accepting
    meanwhile): a task the protocol starts there takes one step before the
    caller resumes. aiorpcX's client starts its receive loop so, and its
    tests count on the caller's read being queued before that loop's."""
    steps: List[int] = []

    class Client(asyncio.Protocol):
        returned = False

        def connection_made(self, transport: asyncio.BaseTransport) -> None:
            asyncio.get_running_loop().create_task(self.count_steps())

        async def count_steps(self) -> None:
            for step in range(5):
                if self.returned:
                    steps.append(step)
                    return
                await asyncio.sleep(0)

    server = await friendsock.create_server(asyncio.Protocol, "127.0.0.1", 0, friends=friends)
    try:
        transport, client = await friendsock.create_connection(Client, "127.0.0.1", port_of(server),
                                                               friends=friends)
        client.returned = True
        for _ in range(6):
            await asyncio.sleep(0)
        assert steps == [1]
        transport.close()
    finally:
        server.close()
        await wait(server.wait_closed())


async def test_no_data_received_before_create_connection_returns(friends):
    """However soon the server writes, the client's create_connection
    returns before its protocol's first data_received on the stdlib loop
    (its transport reads only after its waiter woke the caller; uvloop's
    own TCP may deliver first)."""
    returned: List[bool] = []

    class Client(Recorder):
        def data_received(self, data: bytes) -> None:
            returned.append(bool(seen))
            super().data_received(data)

    seen: List[asyncio.Transport] = []
    server = await friendsock.create_server(Greeter, "127.0.0.1", 0, friends=friends)
    try:
        transport, client = await friendsock.create_connection(
            Client, "127.0.0.1", server.sockets[0].getsockname()[1], friends=friends)
        seen.append(transport)
        try:
            assert await wait(client.wait_bytes(5)) == b"hello"
            stdlib_loop = isinstance(asyncio.get_running_loop(), asyncio.BaseEventLoop)
            assert returned == [True] or not stdlib_loop
        finally:
            transport.close()
            await wait(client.lost)
    finally:
        server.close()


# -- echo ---------------------------------------------------------------------


@pytest.mark.parametrize("size", [0, 1, 100_003, 16 * MiB])
async def test_echo_byte_exact(friends, size):
    rng = random.Random(size)
    payload = rng.randbytes(size)
    async with connected_pair(friends, server_protocol=EchoUntilEof) as (transport, client, _):
        for chunk in chunked(payload, rng, largest=max(1, size // 64)):
            transport.write(chunk)
        transport.write_eof()
        assert await wait(client.lost) is None
        assert client.data == payload
        expected = ["made", "data", "eof", "lost"] if size else ["made", "eof", "lost"]
        assert client.events == expected


@pytest.mark.parametrize("size", [0, 100_003, 3 * MiB])
async def test_loop_sendfile(friends, size, tmp_path):
    """``loop.sendfile(transport, file)`` (aiohttp's FileResponse): the
    file's bytes from the offset on, in order, the protocol back in place
    and its writing state kept; where the loop has no sendfile for its own
    transports (uvloop), the friend path refuses it alike."""
    payload = random.Random(size).randbytes(size)
    path = tmp_path / "payload"
    path.write_bytes(payload)
    loop = asyncio.get_running_loop()
    async with connected_pair(friends, server_protocol=EchoUntilEof) as (transport, client, _):
        with open(path, "rb") as file:
            try:
                sent = await wait(loop.sendfile(transport, file, offset=1 if size else 0))
            except NotImplementedError:
                assert isinstance(loop, uvloop.Loop)
                return
            assert sent == max(size - 1, 0)
            assert file.tell() == size
        assert transport.get_protocol() is client and transport.is_reading()
        transport.write(b"and after")
        transport.write_eof()
        assert await wait(client.lost) is None
        assert client.data == payload[1:] + b"and after"


async def test_a_transport_method_replaced_on_one_instance(friends):
    """Test code patches one transport's method (``mock.patch.object``), as
    it can on asyncio's own socket transport."""
    async with connected_pair(friends) as (transport, client, server):
        if isinstance(asyncio.get_running_loop(), uvloop.Loop) and not friends:
            with pytest.raises(AttributeError):  # a C type: uvloop's own refuses it
                transport.write = print
            return
        written = []
        transport.write = written.append
        transport.write(b"not sent")
        assert written == [b"not sent"]
        del transport.write
        transport.write(b"sent")
        assert await wait(server.wait_bytes(4)) == b"sent"


# -- half-close ---------------------------------------------------------------


def keep_open() -> Recorder:
    return Recorder(eof_keep_open=True)


@pytest.mark.parametrize("first", ["client", "server"])
async def test_half_close(friends, first):
    async with connected_pair(friends, server_protocol=keep_open, client_protocol=keep_open) as (
        _, client, server
    ):
        a, b = (client, server) if first == "client" else (server, client)
        assert a.transport.can_write_eof() and b.transport.can_write_eof()
        a.transport.write(b"before eof")
        a.transport.write_eof()
        await wait(b.eof)
        assert b.data == b"before eof"
        assert not b.transport.is_closing()
        # The other direction still works.
        b.transport.write(b"reply")
        b.transport.write(b" after eof")
        assert await wait(a.wait_bytes(15)) == b"reply after eof"
        b.transport.write_eof()
        await wait(a.eof)
        assert not a.lost.done() and not b.lost.done()
        a.transport.close()
        b.transport.close()
        assert await wait(a.lost) is None
        assert await wait(b.lost) is None
        assert a.events == ["made", "data", "eof", "lost"]
        assert b.events == ["made", "data", "eof", "lost"]


@pytest.mark.parametrize("keep", [False, True])
async def test_eof_received_return_value(friends, keep):
    async with connected_pair(
        friends, server_protocol=lambda: Recorder(eof_keep_open=keep), client_protocol=keep_open
    ) as (transport, client, server):
        transport.write_eof()
        await wait(server.eof)
        if keep:
            assert not server.transport.is_closing()
            server.transport.write(b"still open")
            assert await wait(client.wait_bytes(10)) == b"still open"
            assert not server.lost.done()
            server.transport.close()
        else:
            assert server.transport.is_closing()
        assert await wait(server.lost) is None
        # Either way the client then sees the server's FIN.
        await wait(client.eof)
        assert server.events == ["made", "eof", "lost"]


# -- close and abort ----------------------------------------------------------


async def test_close_delivers_everything_then_eof(friends):
    payload = random.Random(1).randbytes(4 * MiB)
    async with connected_pair(friends) as (_, client, server):
        closer = server.transport
        for chunk in chunked(payload, random.Random(2), largest=256 * 1024):
            closer.write(chunk)
        closer.close()
        assert closer.is_closing()
        assert await wait(client.lost) is None
        assert client.data == payload
        assert client.events == ["made", "data", "eof", "lost"]
        assert await wait(server.lost) is None
        assert server.events == ["made", "lost"]
        # Keep connected_pair's cleanup abort() off it (asyncio 3.11's
        # abort() fails once a flushing close() finished).
        server.transport = None


async def test_abort_keeps_what_is_in_the_buffers(friends):
    async with connected_pair(friends) as (transport, client, server):
        sndbuf, rcvbuf = buffer_sizes(transport, server.transport)
        payload = random.Random(3).randbytes(sndbuf + rcvbuf + 4 * MiB)  # more than the buffers take
        for chunk in chunked(payload, random.Random(4), largest=256 * 1024):
            transport.write(chunk)
        transport.abort()
        assert transport.is_closing()
        assert await wait(client.lost) is None
        assert await wait(server.lost) is None
        received = bytes(server.data)
        assert payload.startswith(received)
        if friends:
            # Exactly what sat in sndbuf + friend rcvbuf; the own buffer is dropped.
            assert len(received) == sndbuf + rcvbuf
        expected = ["made", "data", "eof", "lost"] if received else ["made", "eof", "lost"]
        assert server.events == expected
        assert client.events == ["made", "lost"]


@pytest.mark.parametrize("peer_reading", [True, False])
async def test_abort_with_unread_bytes_resets_the_peer(friends, peer_reading):
    payload = random.Random(5).randbytes(2 * MiB)
    async with connected_pair(friends) as (transport, client, server):
        _, rcvbuf = buffer_sizes(transport, server.transport)
        transport.pause_reading()
        if not peer_reading:
            server.transport.pause_reading()
        server.transport.write(b"never read")
        await arrived(friends, transport)
        for chunk in chunked(payload, random.Random(6), largest=256 * 1024):
            transport.write(chunk)
        transport.abort()
        assert await wait(client.lost) is None
        if not peer_reading:
            # The reset is sent; what the peer still gets sat in its rcvbuf.
            server.transport.resume_reading()
        assert isinstance(await wait(server.lost), ConnectionResetError)
        received = bytes(server.data)
        assert payload.startswith(received)
        if not peer_reading:
            assert len(received) <= rcvbuf
            if friends:
                assert len(received) == rcvbuf
        assert "eof" not in server.events
        assert client.events == ["made", "lost"]


@pytest.mark.parametrize("how", ["close", "abort"])
async def test_an_abortive_close_resets_the_peer(friends, how):
    """SO_LINGER {1, 0} set on the transport's socket makes its close a
    reset, as the kernel's: the peer, which had what was sent before, then
    gets connection_lost(ConnectionResetError), never EOF."""
    async with connected_pair(friends) as (transport, client, server):
        transport.write(b"before the reset")
        assert await wait(server.wait_bytes(16)) == b"before the reset"
        transport.get_extra_info("socket").setsockopt(
            socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
        getattr(transport, how)()
        assert await wait(client.lost) is None
        assert isinstance(await wait(server.lost), ConnectionResetError)
        assert server.events == ["made", "data", "lost"]


async def test_a_finished_connection_leaves_no_cycle(friends):
    """Used and closed on both ends, a connection is freed by its last
    reference: nothing of it waits for the cyclic collector."""
    with cyclic_garbage_of_ours() as garbage:
        async with connected_pair(friends) as (transport, client, server):
            transport.write(b"ping")
            await wait(server.wait_bytes(4))
            server.transport.write(b"pong")
            await wait(client.wait_bytes(4))
            transport.close()
            await wait(server.lost)
            await wait(client.lost)
        del transport, client, server
    assert garbage == []


# -- flow control -------------------------------------------------------------


class Filler:
    """Writes a deterministic stream and remembers what it wrote."""

    def __init__(self, transport: asyncio.Transport, seed: int) -> None:
        self.transport = transport
        self.block = random.Random(seed).randbytes(MiB + 4096)
        self.sent = bytearray()

    def write(self, size: int) -> None:
        while size:
            start = len(self.sent) % 4096
            piece = self.block[start:start + min(size, MiB)]
            self.transport.write(piece)
            self.sent += piece
            size -= len(piece)

    def until_paused(self, writer: FlowRecorder, limit: int = 256 * MiB) -> None:
        """TCP: write until the protocol is paused (the kernel buffers fill)."""
        while not writer.flow and len(self.sent) < limit:
            self.write(64 * 1024)
        assert writer.flow == ["pause"]


async def test_pause_resume_writing(friends):
    async with connected_pair(friends, client_protocol=FlowRecorder) as (transport, client, server):
        server.transport.pause_reading()
        sndbuf, rcvbuf = buffer_sizes(transport, server.transport)
        capacity = sndbuf + rcvbuf
        low, high = transport.get_write_buffer_limits()
        filler = Filler(transport, seed=7)
        if friends:
            rng = random.Random(8)
            while len(filler.sent) < capacity:
                filler.write(min(rng.randint(1, 64 * 1024), capacity - len(filler.sent)))
                assert transport.get_write_buffer_size() == 0
            while len(filler.sent) < capacity + high:
                filler.write(min(rng.randint(1, 8 * 1024), capacity + high - len(filler.sent)))
                assert transport.get_write_buffer_size() == len(filler.sent) - capacity
            assert client.flow == []
            filler.write(1)
            assert client.flow == ["pause"]
            assert client.flow_sizes == [high + 1]
            assert transport.get_write_buffer_size() == high + 1
            # Paused protocols may still write; the buffer just grows.
            filler.write(1000)
            assert transport.get_write_buffer_size() == high + 1001
        else:
            filler.until_paused(client)
            assert transport.get_write_buffer_size() > high
        server.transport.resume_reading()
        await wait(client.resumed)
        assert client.flow == ["pause", "resume"]
        assert client.flow_sizes[1] <= low
        assert await wait(server.wait_bytes(len(filler.sent))) == filler.sent
        assert client.flow == ["pause", "resume"]


class ContextFlowRecorder(FlowRecorder):
    """A FlowRecorder that notes the request its context names in
    pause_writing and resume_writing; connection_made names "made"."""

    def __init__(self) -> None:
        super().__init__()
        self.contexts: List[tuple] = []

    def connection_made(self, transport) -> None:
        request_var.set("made")
        super().connection_made(transport)

    def pause_writing(self) -> None:
        self.contexts.append(("pause", request_var.get()))
        super().pause_writing()

    def resume_writing(self) -> None:
        self.contexts.append(("resume", request_var.get()))
        super().resume_writing()


async def test_flow_control_callbacks_run_in_the_loops_context(friends):
    """uvloop's transports call pause_writing and resume_writing in a copy
    of the transport's context; asyncio's call pause_writing in the write()
    that filled the buffer, and resume_writing in a copy of that context.
    Neither in the context of the reader that made room."""
    async with connected_pair(friends, client_protocol=ContextFlowRecorder) as (transport, client, server):
        server.transport.pause_reading()
        filler = Filler(transport, seed=9)

        async def fill() -> None:
            request_var.set("writer")
            filler.until_paused(client)

        await asyncio.create_task(fill())

        async def make_room() -> None:
            request_var.set("reader")
            server.transport.resume_reading()

        await asyncio.create_task(make_room())
        await wait(client.resumed)
        assert await wait(server.wait_bytes(len(filler.sent))) == filler.sent
    expected = "made" if isinstance(asyncio.get_running_loop(), uvloop.Loop) else "writer"
    assert client.contexts == [("pause", expected), ("resume", expected)]


@pytest.mark.parametrize("new_rcvbuf", [32 * 1024, MiB])
async def test_setsockopt_rcvbuf_moves_pause_point(friends, new_rcvbuf):
    async with connected_pair(friends, client_protocol=FlowRecorder) as (transport, client, server):
        server.transport.pause_reading()
        sndbuf, before = buffer_sizes(transport, server.transport)
        server.transport.get_extra_info("socket").setsockopt(
            socket.SOL_SOCKET, socket.SO_RCVBUF, new_rcvbuf
        )
        _, rcvbuf = buffer_sizes(transport, server.transport)
        assert rcvbuf != before
        _, high = transport.get_write_buffer_limits()
        filler = Filler(transport, seed=9)
        if friends:
            filler.write(sndbuf + rcvbuf + high)
            assert client.flow == []
            assert transport.get_write_buffer_size() == high
            filler.write(1)
            assert client.flow == ["pause"]
        else:
            filler.until_paused(client)
        server.transport.resume_reading()
        await wait(client.resumed)
        assert await wait(server.wait_bytes(len(filler.sent))) == filler.sent
        assert client.flow == ["pause", "resume"]


async def test_write_buffer_limits_start_as_the_loops_own(friends):
    """A new transport's limits are its loop's defaults: uvloop's own start
    with a low-water mark of 16 bytes; set_write_buffer_limits() with no
    argument sets 16 KiB and 64 KiB on both loops."""
    async with connected_pair(friends) as (transport, _, server):
        uvloop_loop = isinstance(asyncio.get_running_loop(), uvloop.Loop)
        default = (16 if uvloop_loop else 16 * 1024, 64 * 1024)
        assert transport.get_write_buffer_limits() == default
        assert server.transport.get_write_buffer_limits() == default
        transport.set_write_buffer_limits()
        assert transport.get_write_buffer_limits() == (16 * 1024, 64 * 1024)


async def test_write_buffer_limits_zero(friends):
    async with connected_pair(friends, client_protocol=FlowRecorder) as (transport, client, server):
        server.transport.pause_reading()
        transport.set_write_buffer_limits(0)
        assert transport.get_write_buffer_limits() == (0, 0)
        sndbuf, rcvbuf = buffer_sizes(transport, server.transport)
        filler = Filler(transport, seed=10)
        if friends:
            filler.write(sndbuf + rcvbuf)
            assert client.flow == []
            assert transport.get_write_buffer_size() == 0
            filler.write(1)
            assert client.flow == ["pause"]
            assert client.flow_sizes == [1]
        else:
            filler.until_paused(client)
            assert transport.get_write_buffer_size() > 0
        server.transport.resume_reading()
        await wait(client.resumed)
        assert client.flow == ["pause", "resume"]
        assert client.flow_sizes[1] == 0
        assert await wait(server.wait_bytes(len(filler.sent))) == filler.sent


async def test_write_buffer_limits_invalid(friends):
    async with connected_pair(friends) as (transport, client, server):
        with pytest.raises(ValueError):
            transport.set_write_buffer_limits(high=1, low=2)
        with pytest.raises(ValueError):
            transport.set_write_buffer_limits(high=-1)
        with pytest.raises(ValueError):
            transport.set_write_buffer_limits(low=-1)
        transport.set_write_buffer_limits(high=1000, low=10)
        assert transport.get_write_buffer_limits() == (10, 1000)
        transport.set_write_buffer_limits(high=1000)
        assert transport.get_write_buffer_limits() == (250, 1000)


async def test_pause_resume_reading(friends):
    async with connected_pair(friends) as (transport, client, server):
        reader = server.transport
        assert reader.is_reading()
        reader.pause_reading()
        assert not reader.is_reading()
        reader.pause_reading()  # idempotent
        transport.write(b"held back")
        await arrived(friends, reader)
        # A round trip the other way lets the loop run the reader's turn.
        reader.write(b"ping")
        assert await wait(client.wait_bytes(4)) == b"ping"
        assert server.data == b""
        assert server.events == ["made"]
        reader.resume_reading()
        assert reader.is_reading()
        reader.resume_reading()  # idempotent
        assert await wait(server.wait_bytes(9)) == b"held back"
        transport.write_eof()
        await wait(server.eof)
        assert server.data == b"held back"


class Streamer(asyncio.Protocol):
    """Writes ``total`` bytes as fast as flow control lets it: refills from
    resume_writing(), as producers do, then sends EOF."""

    def __init__(self, total: int) -> None:
        self.block = random.Random(12).randbytes(64 * 1024)
        self.left = total
        self.paused = False
        self.transport: Optional[asyncio.Transport] = None

    def connection_made(self, transport) -> None:
        self.transport = transport

    def pump(self) -> None:
        while self.left > 0 and not self.paused:
            piece = self.block[:min(self.left, len(self.block))]
            self.left -= len(piece)
            self.transport.write(piece)
        if self.left == 0:
            self.transport.write_eof()
            self.left = -1

    def pause_writing(self) -> None:
        self.paused = True

    def resume_writing(self) -> None:
        self.paused = False
        self.pump()


async def test_streaming_writer_does_not_starve_the_loop(friends):
    loop = asyncio.get_running_loop()
    turns = 0
    ticking = True

    def tick() -> None:  # one count per loop iteration
        nonlocal turns
        turns += 1
        if ticking:
            loop.call_soon(tick)

    seen = set()

    class Reader(Recorder):
        def data_received(self, data: bytes) -> None:
            seen.add(turns)
            super().data_received(data)

    async with connected_pair(
        friends, server_protocol=Reader, client_protocol=lambda: Streamer(0)
    ) as (transport, client, server):
        # Many times what the writer may queue before it pauses.
        sndbuf, rcvbuf = buffer_sizes(transport, server.transport)
        total = client.left = 8 * (sndbuf + rcvbuf + transport.get_write_buffer_limits()[1])
        tick()
        try:
            client.pump()
            await wait(server.eof)
        finally:
            ticking = False
        assert len(server.data) == total
        assert server.data[:64 * 1024] == client.block
        # Delivery spread over many loop iterations, other callbacks between.
        assert len(seen) > 4


# -- BufferedProtocol ----------------------------------------------------------


@pytest.mark.parametrize("bufsize", [100, 65536])
async def test_buffered_protocol(friends, bufsize):
    rng = random.Random(bufsize)
    payload = rng.randbytes(MiB)
    async with connected_pair(friends, server_protocol=lambda: BufferedRecorder(bufsize)) as (
        transport, client, server
    ):
        transport.write(payload)  # one large write
        tail = rng.randbytes(5000)
        for chunk in chunked(tail, rng, largest=300):
            transport.write(chunk)
        transport.write_eof()
        assert await wait(server.lost) is None
        assert server.data == payload + tail
        assert max(server.sizes) <= bufsize
        assert server.events == ["made", "data", "eof", "lost"]
        await wait(client.lost)


class DuckBuffered:
    """A protocol with get_buffer()/buffer_updated() (and data_received())
    that is neither an asyncio.BufferedProtocol nor an asyncio.Protocol:
    uvloop's transports fill it through get_buffer(), with libuv's
    suggested size; asyncio's call its data_received()."""

    def __init__(self) -> None:
        self.calls: List[Any] = []
        self.data = bytearray()
        self.buffer = bytearray(1000)
        self.lost = asyncio.get_running_loop().create_future()

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        pass

    def get_buffer(self, sizehint: int) -> bytearray:
        if not self.calls or self.calls[-1][0] != "get_buffer":
            self.calls.append(("get_buffer", sizehint))
        return self.buffer

    def buffer_updated(self, nbytes: int) -> None:
        self.data += self.buffer[:nbytes]

    def data_received(self, data: bytes) -> None:
        if "data_received" not in self.calls:
            self.calls.append("data_received")
        self.data += data

    def eof_received(self) -> None:
        pass

    def connection_lost(self, exc: Optional[BaseException]) -> None:
        self.lost.set_result(exc)


async def test_which_protocols_are_filled_through_get_buffer_is_the_loops_rule(friends):
    """The loop's own rule for which protocols read through get_buffer():
    asyncio's, a BufferedProtocol only; uvloop's, any protocol with a
    get_buffer() that is no asyncio.Protocol (its own TLS layer among
    them), asked for 64 KiB at a time."""
    async with connected_pair(friends, server_protocol=DuckBuffered) as (transport, client, server):
        payload = random.Random(7).randbytes(5000)
        transport.write(payload)
        transport.write_eof()
        assert await wait(server.lost) is None
        assert server.data == payload
        if isinstance(asyncio.get_running_loop(), asyncio.BaseEventLoop):
            assert server.calls == ["data_received"]
        else:
            assert server.calls == [("get_buffer", 65536)]
        await wait(client.lost)


class FailingBufferedRecorder(BufferedRecorder):
    """A BufferedRecorder whose ``get_buffer`` or ``buffer_updated`` raises."""

    def __init__(self, failing: str) -> None:
        super().__init__(100)
        self.failing = failing
        self.error = ValueError("the protocol failed")

    def get_buffer(self, sizehint: int) -> bytearray:
        if self.failing == "get_buffer":
            raise self.error
        return super().get_buffer(sizehint)

    def buffer_updated(self, nbytes: int) -> None:
        if self.failing == "buffer_updated":
            raise self.error
        super().buffer_updated(nbytes)


def caused_by(exc: Optional[BaseException], cause: BaseException) -> bool:
    while exc is not None:
        if exc is cause:
            return True
        exc = exc.__cause__ or exc.__context__
    return False


@pytest.mark.parametrize("failing", ["get_buffer", "buffer_updated"])
async def test_buffered_protocol_failure_is_reported_as_its_own(friends, failing):
    """A failing get_buffer()/buffer_updated() goes to the loop's exception
    handler as that call's failure (not as data_received()'s, which a
    buffered protocol does not have), and ends the connection with it."""
    loop = asyncio.get_running_loop()
    reports: List[dict] = []
    loop.set_exception_handler(lambda _loop, context: reports.append(context))
    async with connected_pair(friends, server_protocol=lambda: FailingBufferedRecorder(failing)) as (
        transport, client, server
    ):
        transport.write(b"x" * 10)
        lost = await wait(server.lost)
        assert len(reports) == 1
        report = reports[0]
        # The protocol's own error, or (uvloop's TCP get_buffer()) one that
        # names the call: either way, the call that failed.
        for exc in (lost, report["exception"]):
            assert caused_by(exc, server.error) or failing in str(exc)
        assert "data_received" not in report["message"]
        assert server.data == b""


# -- streams -------------------------------------------------------------------


@contextlib.asynccontextmanager
async def streams_server(handler: Any, friends: bool, host: str = "127.0.0.1") -> AsyncIterator[Any]:
    """``friendsock.start_server(handler)`` on ``host``, closed (and waited
    for) on the way out."""
    server = await friendsock.start_server(handler, host, 0, friends=friends)
    try:
        yield server
    finally:
        server.close()
        await wait(server.wait_closed())


async def test_stream_drain_waits_for_slow_reader(friends):
    accepted: asyncio.Future = asyncio.get_running_loop().create_future()

    def on_client(reader, writer):
        accepted.set_result((reader, writer))

    async with streams_server(on_client, friends) as server:
        port = server.sockets[0].getsockname()[1]
        c_reader, c_writer = await friendsock.open_connection("127.0.0.1", port, friends=friends)
        s_reader, s_writer = await wait(accepted)
        assert friendsock.is_friend(c_writer) is friends
        try:
            # Far more than any socket buffers hold, so the writer pauses and
            # only the reader can unpause it.
            sndbuf, rcvbuf = buffer_sizes(c_writer.transport, s_writer.transport)
            payload = random.Random(11).randbytes(max(32 * MiB, 8 * (sndbuf + rcvbuf)))
            c_writer.write(payload)
            drain = asyncio.ensure_future(c_writer.drain())
            # Let the loop run a while (a round trip the other way).
            s_writer.write(b"!")
            assert await wait(c_reader.readexactly(1)) == b"!"
            assert not drain.done()
            assert c_writer.transport.get_write_buffer_size() > 0
            received = await wait(s_reader.readexactly(len(payload)))
            await wait(drain)
            assert received == payload
        finally:
            c_writer.close()
            s_writer.close()
            await wait(c_writer.wait_closed())
            await wait(s_writer.wait_closed())


class _RecordingReader(asyncio.StreamReader):
    """A StreamReader of the user's own: its feed_data is user code."""

    def __init__(self, writing: List[bool]) -> None:
        super().__init__()
        self.inside_write: List[bool] = []
        self._writing = writing

    def feed_data(self, data: bytes) -> None:
        self.inside_write.append(self._writing[0])
        super().feed_data(data)


class _RecordingStreamProtocol(asyncio.StreamReaderProtocol):
    """A StreamReaderProtocol subclass: its data_received is user code."""

    def __init__(self, writing: List[bool]) -> None:
        self.reader = asyncio.StreamReader()  # the protocol holds it weakly
        super().__init__(self.reader)
        self.inside_write: List[bool] = []
        self._writing = writing

    def data_received(self, data: bytes) -> None:
        self.inside_write.append(self._writing[0])
        super().data_received(data)


@pytest.mark.parametrize("kind", ["protocol", "reader"])
async def test_user_code_never_runs_inside_the_friends_write(friends, kind):
    """A protocol or reader, asyncio's own or the user's, is called from
    the loop, as over TCP, never inside the friend's write()."""
    writing = [False]
    if kind == "protocol":
        protocol = _RecordingStreamProtocol(writing)
        reader = protocol.reader
        records = protocol
    else:
        reader = records = _RecordingReader(writing)
        protocol = asyncio.StreamReaderProtocol(reader)
    async with connected_pair(friends, server_protocol=lambda: protocol) as (transport, _, server):
        for _ in range(3):
            writing[0] = True
            transport.write(b"ping")
            writing[0] = False
            assert await wait(reader.readexactly(4)) == b"ping"
        transport.write_eof()
        assert await wait(reader.read()) == b""
        protocol.transport = reader._transport  # for connected_pair's clean-up
    assert records.inside_write == [False, False, False]


async def test_a_reader_learns_of_bytes_no_sooner_than_over_tcp(friends):
    """The writer's next step after write() (an await that waits for no
    I/O) runs before the reader's task sees the bytes, as over TCP, where
    the reader learns of them at the loop's next poll (asyncio's loops give
    the writer two such steps, uvloop one). aioftp's server answers QUIT,
    then frees its data port a step later; its tests read the answer and
    count on the port being free."""
    steps: List[int] = []

    async def answer_then_go_on(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await reader.readline()
        writer.write(b"221 bye\r\n")
        await writer.drain()  # (waits for nothing: the buffer is empty)
        for step in range(3):
            await asyncio.sleep(0)
            steps.append(step)
        writer.close()

    async with streams_server(answer_then_go_on, friends) as server:
        reader, writer = await friendsock.open_connection(*server.sockets[0].getsockname()[:2],
                                                          friends=friends)
        assert friendsock.is_friend(writer) is friends
        writer.write(b"QUIT\r\n")
        # Awaited directly: wait_for()'s task of its own would add a turn.
        # (Bounded by the test's timeout.)
        assert await reader.readline() == b"221 bye\r\n"
        assert len(steps) >= 1
        writer.close()
        await wait(writer.wait_closed())


@pytest.mark.parametrize("host, wildcard", [("127.0.0.1", "0.0.0.0"), ("::1", "::")], ids=["ipv4", "ipv6"])
async def test_a_connect_from_the_wildcard_address_pairs_and_delivers(friends, host, wildcard):
    """``local_addr=("0.0.0.0", 0)``: the socket is bound to the wildcard
    address with a port before it connects; its connection's address is
    the route's, which the server sees and claims it by."""
    async def echo_five(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        writer.write(await reader.readexactly(5))
        writer.close()

    async with streams_server(echo_five, friends, host=host) as server:
        port = server.sockets[0].getsockname()[1]
        reader, writer = await friendsock.open_connection(host, port, local_addr=(wildcard, 0),
                                                          friends=friends)
        assert friendsock.is_friend(writer) is friends
        assert writer.get_extra_info("sockname")[0] == host
        writer.write(b"hello")
        assert await wait(reader.readexactly(5)) == b"hello"
        writer.close()
        await wait(writer.wait_closed())


@pytest.mark.parametrize("asked", ["before", "after"])
@pytest.mark.parametrize("how", ["close", "write_eof"])
async def test_the_socket_polls_readable_once_the_peer_is_done_writing(friends, how, asked):
    """httpcore checks a pooled connection by polling the descriptor of its
    ``get_extra_info('socket')``: readable means its server closed it, and
    the connection is dropped, not reused. As over TCP, the descriptor
    polls readable once the peer closed or shut down writing, not before;
    also when it is first asked for only after that (``asked``: before or
    after the peer is done)."""
    go_on = asyncio.Event()

    def polled(wait_ms: int) -> bool:
        fd = writer.get_extra_info("socket").fileno()
        # A socketless link has no descriptor to poll (as docs/socketless.md says).
        assert (fd == -1) is (friends and friendsock.is_socketless())
        if fd < 0:
            return True
        poller = select.poll()
        poller.register(fd, select.POLLIN)
        return poller.poll(wait_ms) != []

    async with streams_server(lambda r, w: answer_then_finish(r, w, how, go_on.wait), friends) as server:
        reader, writer = await friendsock.open_connection(*server.sockets[0].getsockname()[:2],
                                                          friends=friends)
        assert friendsock.is_friend(writer) is friends
        writer.write(b"hi\n")
        assert await wait(reader.readline()) == b"OK\n"
        if asked == "before":
            assert not polled(0) or friendsock.is_socketless()  # answered, still open
        go_on.set()
        assert await wait(reader.read()) == b""
        assert polled(int(TIMEOUT * 1000))
        writer.close()
        await wait(writer.wait_closed())


async def test_the_socket_of_a_closed_transport_has_no_descriptor(friends):
    """``get_extra_info('socket')``, taken while open, gives -1 from
    ``fileno()`` once its transport closed, as the loop's own (anyio's
    ``aclose_forcefully`` tests check it), though the friend, still open,
    keeps the link and its real sockets."""
    accepted: asyncio.Future = asyncio.get_running_loop().create_future()
    async with streams_server(lambda r, w: accepted.set_result(w), friends) as server:
        reader, writer = await friendsock.open_connection(*server.sockets[0].getsockname()[:2],
                                                          friends=friends)
        server_writer = await wait(accepted)
        sock = writer.get_extra_info("socket")
        assert sock.fileno() >= 0 or friendsock.is_socketless()
        writer.transport.abort()
        await wait(writer.wait_closed())
        assert sock.fileno() == -1
        assert not server_writer.is_closing()  # the friend is still open
        server_writer.close()
        await wait(server_writer.wait_closed())


async def test_stream_reader_sees_everything_in_order(friends):
    """Writes of every size, then EOF, through asyncio's own streams: all
    of it, in order."""
    accepted: asyncio.Future = asyncio.get_running_loop().create_future()
    async with streams_server(lambda r, w: accepted.set_result((r, w)), friends) as server:
        port = server.sockets[0].getsockname()[1]
        c_reader, c_writer = await friendsock.open_connection("127.0.0.1", port, friends=friends)
        s_reader, s_writer = await wait(accepted)
        rng = random.Random(12)
        payload = rng.randbytes(3 * MiB)
        for piece in chunked(payload, rng, 256 * 1024):
            c_writer.write(piece)
        c_writer.write_eof()
        assert await wait(s_reader.read()) == payload
        s_writer.write(b"bye")
        s_writer.close()
        assert await wait(c_reader.read()) == b"bye"
        c_writer.close()
        await wait(c_writer.wait_closed())
        await wait(s_writer.wait_closed())


# -- many connections ----------------------------------------------------------


async def test_200_concurrent_echoes(friends):
    server = await friendsock.create_server(
        EchoUntilEof, "127.0.0.1", 0, friends=friends, backlog=512
    )
    try:
        port = server.sockets[0].getsockname()[1]

        async def one(i: int) -> None:
            payload = random.Random(i).randbytes(16 * 1024 + i)
            transport, client = await friendsock.create_connection(
                Recorder, "127.0.0.1", port, friends=friends
            )
            try:
                assert friendsock.is_friend(transport) is friends
                transport.write(payload)
                transport.write_eof()
                assert await wait(client.lost) is None
                assert client.data == payload
            finally:
                transport.abort()

        await wait(asyncio.gather(*(one(i) for i in range(200))), 30)
    finally:
        server.close()
        await wait(server.wait_closed())


# -- errors --------------------------------------------------------------------


async def test_write_errors(friends):
    async with connected_pair(friends, server_protocol=keep_open) as (transport, client, server):
        with pytest.raises(TypeError):
            transport.write("text")  # type: ignore[arg-type]
        with pytest.raises(TypeError):
            transport.writelines(["text"])  # type: ignore[list-item]
        transport.write(b"")  # empty writes are fine
        transport.write(b"last")
        transport.write_eof()
        transport.write_eof()  # idempotent
        with pytest.raises(RuntimeError):
            transport.write(b"more")
        await wait(server.eof)
        assert server.data == b"last"
        # Writes after the connection was lost (abort) do not raise.
        server.transport.abort()
        server.transport.write(b"into the void")
        assert await wait(server.lost) is None


class CallsWhenLost(Recorder):
    """Calls ``call`` (one of _WRITES) on its transport in connection_lost;
    ``error``: what it raised."""

    def __init__(self, call: str, eof_keep_open: bool = False) -> None:
        super().__init__(eof_keep_open)
        self.call = call
        self.error: Optional[BaseException] = None

    def connection_lost(self, exc) -> None:
        try:
            _WRITES[self.call](self.transport)
        except Exception as error:  # noqa: BLE001 - what it raised is the result
            self.error = error
        super().connection_lost(exc)


_WRITES = {
    "write": lambda transport: transport.write(b"x"),
    "write(b'')": lambda transport: transport.write(b""),
    "writelines": lambda transport: transport.writelines([b"x"]),
    "write_eof": lambda transport: transport.write_eof(),
    "set_write_buffer_limits": lambda transport: transport.set_write_buffer_limits(1024),
}


# The stdlib's writelines() of 3.12 and 3.13.0 fails once close() was
# called (CPython gh-136234: it does not look for a lost connection).
WRITELINES_FAILS_ONCE_CLOSED = sys.version_info >= (3, 12) and \
    "_conn_lost" not in asyncio.selector_events._SelectorSocketTransport.writelines.__code__.co_names


@pytest.mark.parametrize("call", list(_WRITES))
async def test_writes_once_connection_lost_returned(friends, call):
    """Inside connection_lost every loop's transport takes a write (and
    drops it). Once it has returned, uvloop's refuse it, RuntimeError (the
    handler is closed); asyncio's still take it. The stdlib's writelines()
    where it fails once closed: TypeError, both times."""
    async with connected_pair(friends, client_protocol=lambda: CallsWhenLost(call)) as (transport, client, _):
        transport.close()
        assert await wait(client.lost) is None
        if isinstance(asyncio.get_running_loop(), uvloop.Loop):
            assert client.error is None
            with pytest.raises(RuntimeError, match="the handler is closed"):
                _WRITES[call](transport)
        elif call == "writelines" and WRITELINES_FAILS_ONCE_CLOSED:
            assert isinstance(client.error, TypeError)
            with pytest.raises(TypeError):
                _WRITES[call](transport)
        else:
            assert client.error is None
            _WRITES[call](transport)


async def test_writes_to_a_lost_connection_are_logged_as_the_loops_own(friends, caplog):
    """asyncio's transports count writes to a lost connection and log each
    one from the fifth on, on asyncio's logger (writelines() before 3.12 as
    one write of the joined bytes); uvloop's count them and log nothing."""
    async with connected_pair(friends) as (transport, client, server):
        transport.abort()  # lost: connection_lost is still to come
        with caplog.at_level(logging.WARNING):
            for _ in range(6):
                transport.write(b"x")
            transport.writelines([b"a", b"b"])
        warnings = [(record.name, record.getMessage()) for record in caplog.records]
        if isinstance(asyncio.get_running_loop(), uvloop.Loop):
            expected = 0
        else:
            expected = 2 + (sys.version_info < (3, 12))
        assert warnings == [("asyncio", "socket.send() raised exception.")] * expected
        assert await wait(client.lost) is None


async def test_write_eof_on_a_closing_transport(friends):
    """A transport closing with bytes still queued: asyncio's ignores a
    write_eof() then, and takes a write(), which goes before the close's
    EOF; uvloop's takes the write_eof(), and a write() after it raises."""
    async with connected_pair(friends) as (transport, client, server):
        # More than the buffers take (the kernel may have grown SO_SNDBUF
        # past 4 MiB for loopback, from metrics it keeps per destination).
        payload = random.Random(5).randbytes(sum(buffer_sizes(transport, server.transport)) + 4 * MiB)
        server.transport.pause_reading()
        transport.write(payload)
        transport.close()
        transport.write_eof()
        if isinstance(asyncio.get_running_loop(), uvloop.Loop):
            with pytest.raises(RuntimeError, match="write_eof"):
                transport.write(b"!")
            expected = payload
        else:
            transport.write(b"!")
            expected = payload + b"!"
        server.transport.resume_reading()
        assert await wait(client.lost) is None
        await wait(server.eof)
        assert server.data == expected


async def test_connect_refused(friends):
    server = await friendsock.create_server(Recorder, "127.0.0.1", 0, friends=friends)
    port = server.sockets[0].getsockname()[1]
    server.close()
    await wait(server.wait_closed())
    # Held, not listening: a server of another test (another worker) cannot
    # take the port meanwhile and answer the connect.
    with socket.socket() as held:
        held.bind(("127.0.0.1", port))
        with pytest.raises(ConnectionRefusedError):
            await wait(friendsock.create_connection(Recorder, "127.0.0.1", port, friends=friends))


async def test_unresolvable_host(friends):
    async with connected_pair(friends) as (transport, client, server):
        port = transport.get_extra_info("peername")[1]
        with pytest.raises(socket.gaierror):
            await wait(friendsock.create_connection(
                Recorder, "nonexistent.invalid", port, friends=friends
            ))


async def test_write_after_peer_closed_fails(friends):
    def client_protocol() -> Recorder:
        return CallsWhenLost("write", eof_keep_open=True)  # the connection is gone by then

    async with connected_pair(friends, client_protocol=client_protocol) as (
        transport, client, server
    ):
        server.transport.close()
        await wait(server.lost)
        await wait(client.eof)
        assert not transport.is_closing()

        async def keep_writing() -> None:
            # Each write may still be taken (TCP answers the first with a
            # reset); one of the next fails the transport.
            while not client.lost.done():
                transport.write(b"x" * 1000)
                await asyncio.sleep(0)

        await wait(keep_writing())
        exc = client.lost.result()
        assert isinstance(exc, (ConnectionResetError, BrokenPipeError)), exc
        assert client.events == ["made", "eof", "lost"]
        assert client.error is None  # its write from connection_lost was taken
        assert transport.is_closing()
        # asyncio's transports drop writes after the loss; uvloop's raise
        # RuntimeError once connection_lost ran.
        if isinstance(asyncio.get_running_loop(), uvloop.Loop):
            with pytest.raises(RuntimeError, match="the handler is closed"):
                transport.write(b"after connection_lost")
        else:
            transport.write(b"after connection_lost")


# -- introspection -------------------------------------------------------------


async def test_extra_info_and_protocol(friends):
    async with connected_pair(friends) as (transport, client, server):
        peer = server.transport
        assert transport.get_extra_info("peername") == peer.get_extra_info("sockname")
        assert transport.get_extra_info("sockname") == peer.get_extra_info("peername")
        sock = transport.get_extra_info("socket")
        assert transport.get_extra_info("socket") is sock  # made once
        assert sock.getsockname() == transport.get_extra_info("sockname")
        assert sock.getpeername() == transport.get_extra_info("peername")
        assert sock.family == socket.AF_INET and sock.type == socket.SOCK_STREAM
        assert peer.get_extra_info("socket").getpeername() == sock.getsockname()
        assert transport.get_extra_info("no-such-key", "dflt") == "dflt"

        assert transport.get_protocol() is client
        other = Recorder()
        transport.set_protocol(other)
        assert transport.get_protocol() is other
        peer.write(b"to the new protocol")
        assert await wait(other.wait_bytes(19)) == b"to the new protocol"
        assert client.data == b""

        before = repr(transport)
        assert type(transport).__name__ in before
        assert not transport.is_closing()
        transport.pause_reading()
        paused = repr(transport)
        assert paused != before
        transport.close()
        assert transport.is_closing()
        assert not transport.is_reading()
        await wait(other.lost)
        assert transport.is_closing()
        closed = repr(transport)
        assert closed not in (before, paused)
        if friends:
            assert "read=polling" in before and "read=idle" in paused and "closed" in closed


# -- what the loop's own transport answers, on its loop ---------------------------


def _on_uvloop() -> bool:
    return not isinstance(asyncio.get_running_loop(), asyncio.BaseEventLoop)


async def test_its_socket_shut_for_writing_sends_eof(friends):
    """asyncio's transport socket passes shutdown() on: the peer reads what
    came before, then EOF, and a later write fails the connection with
    EPIPE. uvloop's refuses the call, and the connection goes on."""
    async with connected_pair(friends, server_protocol=lambda: Recorder(eof_keep_open=True)) as (
            transport, client, server):
        transport.write(b"before")
        sock = transport.get_extra_info("socket")
        if _on_uvloop():
            with pytest.raises(TypeError, match=r"do not support shutdown\(\)"):
                sock.shutdown(socket.SHUT_WR)
            transport.write(b" and after")
            assert await wait(server.wait_bytes(16)) == b"before and after"
            assert server.events == ["made", "data"]
            return
        sock.shutdown(socket.SHUT_WR)
        await wait(server.eof)
        assert bytes(server.data) == b"before"
        transport.write(b"after")
        assert type(await wait(client.lost)) is BrokenPipeError
        # The other direction stayed open until then.
        assert server.events == ["made", "data", "eof"]


@pytest.mark.asyncio(loop_factories=["asyncio"])  # (uvloop's transport socket refuses shutdown())
async def test_a_shutdown_once_both_directions_finished_fails(friends):
    """The server closes, the client reads its EOF and shuts its socket's
    writing down: both directions finished, TCP's socket is closed, and a
    second shutdown, or the transport's write_eof(), fails with ENOTCONN."""
    async with connected_pair(friends, client_protocol=lambda: Recorder(eof_keep_open=True)) as (
            transport, client, server):
        server.transport.close()
        await wait(client.eof)
        sock = transport.get_extra_info("socket")
        sock.shutdown(socket.SHUT_WR)
        await wait(server.lost)
        with pytest.raises(OSError) as by_socket:
            sock.shutdown(socket.SHUT_WR)
        with pytest.raises(OSError) as by_transport:
            transport.write_eof()
    assert by_socket.value.errno == by_transport.value.errno == errno.ENOTCONN


@pytest.mark.asyncio(loop_factories=["asyncio"])  # (uvloop's transport socket refuses shutdown())
@pytest.mark.parametrize("keep_open", [True, False])
async def test_a_read_shutdown_delivers_eof_after_what_came(friends, keep_open):
    """``get_extra_info('socket').shutdown(SHUT_RD)``, as over TCP: what
    came before is delivered, then ``eof_received()``; the transport reads
    no more (the server's later bytes are not delivered, while writing
    goes on), or closes if its protocol does not keep it open."""
    async with connected_pair(friends, client_protocol=lambda: Recorder(eof_keep_open=keep_open)) as (
            transport, client, server):
        server.transport.write(b"before")
        await wait(client.wait_bytes(6))
        transport.get_extra_info("socket").shutdown(socket.SHUT_RD)
        await wait(client.eof)
        if not keep_open:
            assert await wait(client.lost) is None
            assert client.events == ["made", "data", "eof", "lost"]
            return
        server.transport.write(b"after")
        transport.write(b"ping")
        assert await wait(server.wait_bytes(4)) == b"ping"
        assert client.events == ["made", "data", "eof"] and bytes(client.data) == b"before"


async def test_a_buffer_that_is_not_bytes_is_written_as_the_loop_writes_it(friends):
    """uvloop's write() sends the bytes of any contiguous buffer (an
    array); asyncio's takes bytes, bytearray and memoryview only."""
    async with connected_pair(friends) as (transport, client, server):
        numbers = array.array("i", [1, 2, 3])
        if _on_uvloop():
            transport.write(numbers)
            numbers[0] = 7  # taken when written, as uvloop's own
            assert await wait(server.wait_bytes(12)) == array.array("i", [1, 2, 3]).tobytes()
        else:
            with pytest.raises(TypeError, match="not 'array'"):
                transport.write(numbers)
            transport.write(memoryview(numbers))
            assert await wait(server.wait_bytes(12)) == numbers.tobytes()


async def test_a_strided_memoryview_is_refused_as_the_loop_refuses_it(friends, loop_guard):
    """Not contiguous: uvloop's write() raises TypeError; asyncio's socket
    send() fails the connection with BufferError (reported to the loop's
    exception handler), and the peer gets EOF, none of its bytes."""
    strided = memoryview(b"abcde")[::2]
    async with connected_pair(friends) as (transport, client, server):
        transport.write(b"first ")
        assert await wait(server.wait_bytes(6)) == b"first "
        if _on_uvloop():
            with pytest.raises(TypeError, match="C-contiguous"):
                transport.write(strided)
            transport.write(b"then")
            assert await wait(server.wait_bytes(10)) == b"first then"
            return
        transport.write(strided)
        assert type(await wait(client.lost)) is BufferError
        await wait(server.eof)
        assert bytes(server.data) == b"first "
        assert [type(context["exception"]) for context in loop_guard] == [BufferError]
        loop_guard.clear()


async def test_paused_reads_as_the_loops_own_transports(friends):
    """``_paused``, the loop's own transports' private flag (uvloop's tests
    read it): set by pause_reading(), unset by resume_reading()."""
    async with connected_pair(friends) as (transport, client, server):
        assert transport._paused is False
        transport.pause_reading()
        transport.pause_reading()
        assert transport._paused is True
        transport.resume_reading()
        assert transport._paused is False
        transport.close()
        assert transport._paused is (True if _on_uvloop() else False)
        await wait(client.lost)
