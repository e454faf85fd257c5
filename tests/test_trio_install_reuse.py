"""Reused connections for unchanged trio code and anyio on trio
(``friendsock.trio.install()``): a ``trio.socket`` socket that connects to
a listener of its own run takes the connection a finished link left
there, if its user left it as a new socket (options that can be given
back aside, which go over with it). Each test runs installed and on real
TCP (not installed), the reference."""

from __future__ import annotations

import functools
import socket

import anyio
import pytest
import trio

from support import descriptors_open
from test_trio_install import installed  # noqa: F401 (a fixture)
from trio_support import LOCALHOST, TIMEOUT, nothing_left_behind, receive_until_eof  # noqa: F401

pytestmark = pytest.mark.trio




async def _echo(stream) -> None:
    async with stream:
        await stream.send_all((await stream.receive_some(100)).upper())
        await stream.send_eof()


async def _exchanges(port: int, count: int, before_connect=None, use_stream=None):
    """``count`` connections with unchanged trio code (``trio.open_tcp_stream``
    underneath: a ``trio.socket`` socket), one after another: each client's
    address. ``before_connect`` is called with each socket before it
    connects, ``use_stream`` with each stream."""
    addresses = []
    for round_ in range(count):
        with trio.fail_after(TIMEOUT):
            sock = trio.socket.socket()
            if before_connect is not None:
                before_connect(sock)
            await sock.connect((LOCALHOST, port))
            stream = trio.SocketStream(sock)
            async with stream:
                if use_stream is not None:
                    use_stream(stream)
                await stream.send_all(b"ping %d" % round_)
                assert await receive_until_eof(stream) == b"PING %d" % round_
                addresses.append(sock.getsockname())
    return addresses


@pytest.fixture
async def echo_port(installed):
    async with trio.open_nursery() as nursery:
        listeners = await nursery.start(functools.partial(trio.serve_tcp, _echo, 0, host=LOCALHOST))
        yield listeners[0].socket.getsockname()[1]
        nursery.cancel_scope.cancel()


async def test_the_next_connect_goes_over_the_connection_a_finished_link_left(installed, echo_port):
    """One connect after another, unchanged trio code on both ends: the
    second (and every later one) goes over the connection the first left,
    with its client address, and no descriptor more."""
    before = descriptors_open()
    addresses = await _exchanges(echo_port, 4)
    assert (len(set(addresses[1:])) == 1) is installed
    if installed:
        assert descriptors_open() - before == 2  # the kept connection's two ends


async def _anyio_exchanges(count: int, use_stream):
    """``count`` anyio connects on trio to an anyio listener of this run, one
    after another: each client's address, with what ``use_stream(round_,
    stream)`` gave for it."""

    async def handle(stream):
        async with stream:
            await stream.send(await stream.receive())

    listener = await anyio.create_tcp_listener(local_host=LOCALHOST)
    port = listener.extra(anyio.abc.SocketAttribute.local_port)
    seen = []
    async with listener, anyio.create_task_group() as tasks:
        tasks.start_soon(listener.serve, handle)
        for round_ in range(count):
            with trio.fail_after(TIMEOUT):
                stream = await anyio.connect_tcp(LOCALHOST, port)
                async with stream:
                    used = use_stream(round_, stream)
                    await stream.send(b"x")
                    assert await stream.receive() == b"x"
                    seen.append((stream.extra(anyio.abc.SocketAttribute.local_address), used))
        tasks.cancel_scope.cancel()
    return seen


def _raw_socket(stream) -> socket.socket:
    return stream.extra(anyio.abc.SocketAttribute.raw_socket)


async def test_anyio_connects_go_over_kept_connections(installed):
    """anyio on trio (``connect_tcp``, which sets TCP_NODELAY before it
    connects) to its own listener: its connects after the first reuse a
    connection, whose socket has TCP_NODELAY as anyio set it."""
    seen = await _anyio_exchanges(3, lambda round_, stream: _raw_socket(stream).getsockopt(
        socket.IPPROTO_TCP, socket.TCP_NODELAY))
    assert all(nodelay for _, nodelay in seen)
    assert (len({address for address, _ in seen[1:]}) == 1) is installed


@pytest.mark.parametrize("before", ["rcvbuf", "tos"])
async def test_a_socket_given_options_before_its_connect_makes_a_new_connection(installed, echo_port,
                                                                               before):
    """A socket whose user set an option before connect() that a kept
    connection would not have (a buffer size, IP_TOS) makes its own
    connection, as over TCP, and has the option."""
    option = ((socket.SOL_SOCKET, socket.SO_RCVBUF, 1 << 14) if before == "rcvbuf"
              else (socket.IPPROTO_IP, socket.IP_TOS, 0x10))
    seen = []
    addresses = await _exchanges(echo_port, 1)
    addresses += await _exchanges(echo_port, 1, lambda sock: sock.setsockopt(*option),
                                  lambda stream: seen.append(stream.socket.getsockopt(*option[:2])))
    assert addresses[1] != addresses[0]
    with socket.socket() as reference:
        reference.setsockopt(*option)
        assert seen == [reference.getsockopt(*option[:2])]


async def test_a_connection_whose_descriptor_was_seen_is_not_kept(installed, echo_port):
    """A socket's descriptor handed out (``fileno()``, anyio's raw socket's
    too) ends its connection with the link."""
    addresses = await _exchanges(echo_port, 2, use_stream=lambda stream: stream.socket.fileno())
    assert addresses[1] != addresses[0]


async def test_anyio_hands_out_a_stdlib_socket_over_a_kept_connection(installed):
    """anyio's raw socket of a stream whose connect reused a connection is
    a ``socket.socket``, as over TCP, and it is watched as a new
    connection's: its descriptor handed out ends the connection with the
    link (the next connect makes a connection of its own)."""

    def use_stream(round_, stream):
        raw = _raw_socket(stream)
        assert isinstance(raw, socket.socket)
        assert type(raw.family) is socket.AddressFamily
        if round_ == 1:
            assert raw.fileno() >= 0

    addresses = [address for address, _ in await _anyio_exchanges(3, use_stream)]
    if installed:
        assert addresses[1] == addresses[0]  # reused
        assert addresses[2] != addresses[1]  # not kept: its descriptor was seen
