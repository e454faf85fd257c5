"""Pairing and fallback, on both loops.

A friend link is proven by the kernel's own counters, not assumed: no payload
crosses its real TCP socket (TCP_INFO), while the same test on the TCP path
sees them move. Every way a connection can miss its friend must still work
over real TCP, say ``is_friend`` False, and count its reason in
``friendsock.stats().fallbacks``.
"""

from __future__ import annotations

import asyncio
import contextlib
import ctypes
import gc
import json
import os
import socket
import ssl
import struct
import sys
import threading
import warnings

import pytest
import trustme
import uvloop

import friendsock
from friendsock import _handshake
from support import (  # noqa: F401 (two fixtures)
    DEFAULT_CONFIRM_TIMEOUT,
    LOCALHOST,
    PAYLOAD,
    TCP_TIME_WAIT,
    Echoes,
    Recorder,
    bounded,
    connected_pair,
    echo_and_finish,
    fallbacks_since,
    no_transport_left_open,
    patient_confirm,
    port_of,
    tcp_connections,
    track,
)

pytestmark = pytest.mark.usefixtures("no_transport_left_open", "patient_confirm")

MIB = 1 << 20


# -- the kernel's view: struct tcp_info (linux/tcp.h) -------------------------

TCP_ESTABLISHED = 1
# Offsets in struct tcp_info of the counters of payload the kernel carried.
_TCP_INFO_COUNTERS = {
    "bytes_acked": (120, "Q"),
    "bytes_received": (128, "Q"),
    "data_segs_in": (152, "I"),
    "data_segs_out": (156, "I"),
}


def tcp_info(sock) -> dict:
    raw = sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_INFO, 256)
    assert len(raw) >= 160, "kernel too old for tcpi_data_segs_*"
    info = {name: struct.unpack_from("=" + fmt, raw, offset)[0]
            for name, (offset, fmt) in _TCP_INFO_COUNTERS.items()}
    info["state"] = raw[0]
    return info


async def test_friend_payload_never_crosses_tcp(friends):
    payload = os.urandom(MIB)
    async with connected_pair(friends) as (transport, client, server):
        ends = {
            "client": transport.get_extra_info("socket"),
            "server": server.transport.get_extra_info("socket"),
        }
        before = {name: tcp_info(sock) for name, sock in ends.items()}
        transport.write(payload)
        assert await bounded(server.wait_bytes(MIB)) == payload
        server.transport.write(payload)
        assert await bounded(client.wait_bytes(MIB)) == payload
        after = {name: tcp_info(sock) for name, sock in ends.items()}
    for name in ends:
        # The real connection stays up beside the link.
        assert before[name]["state"] == after[name]["state"] == TCP_ESTABLISHED
        moved = {k: after[name][k] - before[name][k] for k in _TCP_INFO_COUNTERS}
        if friends:
            assert moved == dict.fromkeys(_TCP_INFO_COUNTERS, 0), name
        else:
            assert moved["bytes_received"] >= MIB and moved["data_segs_in"] > 0, (name, moved)
            assert moved["data_segs_out"] > 0, (name, moved)


async def test_stats_count_links_and_bytes(friends):
    before = friendsock.stats()
    async with connected_pair(friends) as (transport, client, server):
        during = friendsock.stats()
        transport.write(b"x" * 1000)
        await bounded(server.wait_bytes(1000))
        server.transport.write(b"y" * 500)
        await bounded(client.wait_bytes(500))
        moved = friendsock.stats().bytes_moved - before.bytes_moved
        transport.close()
        server.transport.close()
        await bounded(asyncio.gather(client.lost, server.lost))
    after = friendsock.stats()
    if friends:
        assert (during.links_made, during.links_alive) == (before.links_made + 1, before.links_alive + 1)
        assert moved == 1500
        assert fallbacks_since(before) == {}
    else:
        assert during.links_made == before.links_made and moved == 0
        assert fallbacks_since(before) == {"opted-out": 1}
    assert after.links_alive == before.links_alive
    assert after.pending == 0


# -- fallbacks: every one works over real TCP ---------------------------------


async def test_plain_asyncio_client_gets_tcp():
    loop = asyncio.get_running_loop()
    echoes = Echoes()
    server = await friendsock.create_server(echoes, LOCALHOST, 0)
    try:
        before = friendsock.stats()
        transport, client = await loop.create_connection(Recorder, LOCALHOST, port_of(server))
        await echo_and_finish(transport, client)
        assert not friendsock.is_friend((await echoes.first).transport)
        await echoes.all_lost()
        assert fallbacks_since(before) == {"peer-not-friend": 1}
    finally:
        server.close()


async def test_client_of_a_plain_asyncio_server_gets_tcp():
    loop = asyncio.get_running_loop()
    echoes = Echoes()
    server = await loop.create_server(echoes, LOCALHOST, 0)
    try:
        before = friendsock.stats()
        transport, client = await friendsock.create_connection(Recorder, LOCALHOST, port_of(server))
        assert not friendsock.is_friend(transport)
        await echo_and_finish(transport, client)
        await echoes.all_lost()
        assert fallbacks_since(before) == {"no-listener": 1}
    finally:
        server.close()


@pytest.mark.parametrize("opted_out", ["client", "server", "both"])
async def test_friends_false_gets_tcp(opted_out):
    echoes = Echoes()
    server = await friendsock.create_server(
        echoes, LOCALHOST, 0, friends=False if opted_out != "client" else None
    )
    try:
        before = friendsock.stats()
        transport, client = await friendsock.create_connection(
            Recorder, LOCALHOST, port_of(server), friends=False if opted_out != "server" else None
        )
        assert not friendsock.is_friend(transport)
        await echo_and_finish(transport, client)
        assert not friendsock.is_friend((await echoes.first).transport)
        await echoes.all_lost()
    finally:
        server.close()
    assert fallbacks_since(before) == {
        "client": {"opted-out": 1, "peer-not-friend": 1},
        "server": {"no-listener": 1},  # a native server registers nothing
        "both": {"opted-out": 1},
    }[opted_out]


async def test_connected_sock_gets_tcp():
    loop = asyncio.get_running_loop()
    echoes = Echoes()
    server = await friendsock.create_server(echoes, LOCALHOST, 0)
    try:
        before = friendsock.stats()
        sock = socket.socket()
        try:
            sock.setblocking(False)
            await loop.sock_connect(sock, (LOCALHOST, port_of(server)))
            transport, client = await friendsock.create_connection(Recorder, sock=sock)
        except BaseException:
            sock.close()
            raise
        assert not friendsock.is_friend(transport)
        await echo_and_finish(transport, client)
        await echoes.all_lost()
        assert fallbacks_since(before) == {"sock": 1, "peer-not-friend": 1}
    finally:
        server.close()


async def test_a_unix_socket_handed_over_is_no_tcp_fallback(friends):
    """``create_connection(sock=)`` with one end of a socket pair (as
    websockets' tests make their connections): the loop's own transport,
    and no connection counted as having fallen back to real TCP."""
    loop = asyncio.get_running_loop()
    here, there = socket.socketpair()
    with there:
        here.setblocking(False)
        before = friendsock.stats()
        transport, client = await friendsock.create_connection(Recorder, sock=here,
                                                               friends=None if friends else False)
        try:
            await loop.sock_sendall(there, b"ping")
            assert await bounded(client.wait_bytes(4)) == b"ping"
            assert not friendsock.is_friend(transport)
        finally:
            transport.close()
        await bounded(client.lost)
        assert fallbacks_since(before) == {}


@pytest.mark.parametrize("server_made", ["before-switch", "after-switch"])
async def test_switch_off_gives_tcp_and_on_pairs_again(server_made):
    echoes = Echoes()
    was = friendsock.is_enabled()
    servers = []
    try:
        if server_made == "before-switch":
            servers.append(await friendsock.create_server(echoes, LOCALHOST, 0))
        friendsock.set_enabled(False)
        if server_made == "after-switch":
            servers.append(await friendsock.create_server(echoes, LOCALHOST, 0))
        port = port_of(servers[0])
        before = friendsock.stats()
        transport, client = await friendsock.create_connection(Recorder, LOCALHOST, port)
        assert not friendsock.is_friend(transport)
        await echo_and_finish(transport, client)
        assert not friendsock.is_friend((await echoes.first).transport)
        await echoes.all_lost()
        assert fallbacks_since(before) == (
            {"disabled": 1, "peer-not-friend": 1} if server_made == "before-switch" else {"disabled": 1}
        )
    finally:
        friendsock.set_enabled(was)
    try:
        if server_made == "after-switch":  # a native server: it stays one
            servers.append(await friendsock.create_server(echoes, LOCALHOST, 0))
            port = port_of(servers[-1])
        transport, client = await friendsock.create_connection(Recorder, LOCALHOST, port)
        assert friendsock.is_friend(transport)
        await echo_and_finish(transport, client)
        await echoes.all_lost()
    finally:
        for server in servers:
            server.close()


async def test_switch_off_keeps_links_already_made():
    async with connected_pair(True) as (transport, client, server):
        friendsock.set_enabled(False)
        try:
            transport.write(b"still friends")
            assert await bounded(server.wait_bytes(13)) == b"still friends"
            assert friendsock.is_friend(transport)
        finally:
            friendsock.set_enabled(True)


# -- peers in other processes -------------------------------------------------

# A child process; argv: loop kind, mode, mode's arguments. It ends by
# printing one JSON report line.
CHILD = r"""
import json, select, socket, sys

PAYLOAD = %(payload)r
GREETING = %(greeting)r


def report(**fields):
    import friendsock
    stats = friendsock.stats()
    fields.update(fallbacks=dict(stats.fallbacks), links_made=stats.links_made,
                  enabled=friendsock.is_enabled())
    print(json.dumps(fields), flush=True)


async def echo(reader, writer):
    while True:
        data = await reader.read(65536)
        if not data:
            break
        writer.write(data)
        await writer.drain()
    writer.close()
    await writer.wait_closed()


async def serve():
    # A friendsock echo server; prints its port, serves one connection.
    import asyncio, friendsock
    done = asyncio.get_running_loop().create_future()

    async def handle(reader, writer):
        friend = friendsock.is_friend(writer)
        await echo(reader, writer)
        done.set_result(friend)

    server = await friendsock.start_server(handle, "127.0.0.1", 0)
    print(server.sockets[0].getsockname()[1], flush=True)
    friend = await done
    server.close()
    await server.wait_closed()
    report(friend=friend)


async def round_trip(port):
    import friendsock
    reader, writer = await friendsock.open_connection("127.0.0.1", port)
    writer.write(PAYLOAD)
    writer.write_eof()
    echoed = await reader.read()
    writer.close()
    await writer.wait_closed()
    return friendsock.is_friend(writer), echoed.decode()


async def connect(port):
    # A friendsock client of a server in the parent.
    friend, echoed = await round_trip(int(port))
    report(friend=friend, echoed=echoed)


async def self_pair():
    # Server and client both in this process: friends unless switched off.
    import friendsock
    server = await friendsock.start_server(echo, "127.0.0.1", 0)
    friend, echoed = await round_trip(server.sockets[0].getsockname()[1])
    server.close()
    await server.wait_closed()
    report(friend=friend, echoed=echoed)


def accept(fd, greet, when):
    # A pre-fork sibling: plain blocking sockets on an inherited listener.
    # The descriptor may share O_NONBLOCK with the parent's: poll, never
    # change its flags.
    listener = socket.socket(fileno=int(fd))
    if when == "on-go" and not sys.stdin.readline():
        print(json.dumps({"accepted": False}), flush=True)
        return
    while True:
        select.select([listener], [], [])
        try:
            conn, _ = listener.accept()
            break
        except BlockingIOError:
            continue
    conn.setblocking(True)
    if greet == "greets":
        conn.sendall(GREETING)
    while True:
        data = conn.recv(65536)
        if not data:
            break
        conn.sendall(data)
    conn.close()
    print(json.dumps({"accepted": True}), flush=True)


def main(kind, mode, *args):
    if mode == "accept":
        return accept(*args)
    import asyncio
    if kind == "uvloop":
        import uvloop
        loop = uvloop.new_event_loop()
    else:
        loop = asyncio.new_event_loop()
    coro = {"serve": serve, "connect": connect, "self": self_pair}[mode](*args)
    try:
        loop.run_until_complete(coro)
    finally:
        loop.close()


main(*sys.argv[1:])
"""

GREETING = b"hello from the sibling\n"
_CHILD_SOURCE = CHILD % {"payload": PAYLOAD, "greeting": GREETING}


def loop_kind() -> str:
    return "uvloop" if isinstance(asyncio.get_running_loop(), uvloop.Loop) else "asyncio"


@contextlib.asynccontextmanager
async def child_process(*args, env=None, pass_fds=()):
    """A CHILD running on the same kind of loop as this test."""
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-c", _CHILD_SOURCE, loop_kind(), *map(str, args),
        stdin=asyncio.subprocess.PIPE, stdout=asyncio.subprocess.PIPE,
        env=env, pass_fds=pass_fds,
    )
    try:
        yield proc
    finally:
        if proc.returncode is None:
            with contextlib.suppress(ProcessLookupError):
                proc.kill()
            await bounded(proc.communicate())


async def child_report(proc) -> dict:
    # EOF on its stdin, by closing it, not by communicate(b""): a child that
    # exited already has closed the pipe, and on uvloop a write to it then
    # raises RuntimeError (asyncio's feed catches only BrokenPipeError).
    proc.stdin.close()
    out, _ = await bounded(proc.communicate())
    assert proc.returncode == 0, out
    return json.loads(out.splitlines()[-1])


def _crossing(cross: bool) -> dict:
    """The other process's environment: with the bypass between processes
    on (as by default), or off."""
    return dict(os.environ, FRIENDSOCK_CROSS_PROCESS="1" if cross else "0")


@pytest.mark.parametrize("cross", [True, False], ids=["cross-process", "cross-process-off"])
async def test_server_in_another_process(cross):
    async with child_process("serve", env=_crossing(cross)) as proc:
        port = int(await bounded(proc.stdout.readline()))
        before = friendsock.stats()
        transport, client = await friendsock.create_connection(Recorder, LOCALHOST, port)
        assert friendsock.is_friend(transport) is cross
        await echo_and_finish(transport, client)
        report = await child_report(proc)
    assert fallbacks_since(before) == ({} if cross else {"no-listener": 1})
    assert friendsock.stats().cross_process == before.cross_process + cross
    assert report["friend"] is cross
    assert report["fallbacks"] == ({} if cross else {"peer-not-friend": 1})


@pytest.mark.parametrize("cross", [True, False], ids=["cross-process", "cross-process-off"])
async def test_client_in_another_process(cross):
    echoes = Echoes()
    server = await friendsock.create_server(echoes, LOCALHOST, 0)
    try:
        before = friendsock.stats()
        async with child_process("connect", port_of(server), env=_crossing(cross)) as proc:
            report = await child_report(proc)
        assert friendsock.is_friend((await echoes.first).transport) is cross
        await echoes.all_lost()
    finally:
        server.close()
    assert fallbacks_since(before) == ({} if cross else {"peer-not-friend": 1})
    assert friendsock.stats().cross_process == before.cross_process + cross
    assert report["friend"] is cross and report["echoed"] == PAYLOAD.decode()
    assert report["fallbacks"] == ({} if cross else {"no-listener": 1})


async def test_environment_switch_in_a_fresh_process():
    async def run(value: str) -> dict:
        async with child_process("self", env=dict(os.environ, FRIENDSOCK=value)) as proc:
            return await child_report(proc)

    off, on = await asyncio.gather(run("0"), run("1"))
    common = {"echoed": PAYLOAD.decode()}
    assert off == dict(common, friend=False, enabled=False, fallbacks={"disabled": 1}, links_made=0)
    assert on == dict(common, friend=True, enabled=True, fallbacks={}, links_made=1)


# -- confirmed mode: a listener handed in with sock= may be shared ------------


def listening_socket(listen=True, reuse_port=False) -> socket.socket:
    sock = socket.socket()
    if reuse_port:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
    sock.bind((LOCALHOST, 0))
    if listen:
        sock.listen()
    return sock


SO_ATTACH_REUSEPORT_CBPF = getattr(socket, "SO_ATTACH_REUSEPORT_CBPF", 51)
_BPF_RET_K = 0x06


def steer_reuseport_group(sock: socket.socket, index: int) -> None:
    """Send every new connection of ``sock``'s SO_REUSEPORT group to its
    member number ``index`` (in listen() order): a one-instruction classic
    BPF program, ``ret #index``. The kernel decides; nothing races."""
    program = ctypes.create_string_buffer(struct.pack("=HBBI", _BPF_RET_K, 0, 0, index))
    fprog = struct.pack("@HP", 1, ctypes.addressof(program))  # struct sock_fprog
    sock.setsockopt(socket.SOL_SOCKET, SO_ATTACH_REUSEPORT_CBPF, fprog)


def hold_accepts(fd: int) -> asyncio.Future:
    """Keep this loop from accepting on listener ``fd`` (as if it were busy):
    the server's accept callback is replaced by one that only resolves the
    returned future once a connection waits in the backlog."""
    loop = asyncio.get_running_loop()
    queued = loop.create_future()

    def on_backlog() -> None:
        loop.remove_reader(fd)
        queued.set_result(None)

    loop.add_reader(fd, on_backlog)
    return queued


@pytest.mark.parametrize("listening", [True, False], ids=["listening", "bound"])
async def test_confirmed_pairs_when_this_process_accepts(listening):
    echoes = Echoes()
    server = await friendsock.create_server(echoes, sock=listening_socket(listen=listening))
    try:
        before = friendsock.stats()
        transport, client = await bounded(
            friendsock.create_connection(Recorder, LOCALHOST, port_of(server))
        )
        assert friendsock.is_friend(transport)
        assert friendsock.is_friend((await echoes.first).transport)
        await echo_and_finish(transport, client)
        await echoes.all_lost()
        after = friendsock.stats()
        assert after.links_made == before.links_made + 1
        assert fallbacks_since(before) == {}
    finally:
        server.close()


@pytest.mark.parametrize("accepts", ["here", "sibling-silent", "sibling-greets"])
async def test_confirmed_shared_reuseport_group(accepts, monkeypatch):
    """Pre-fork workers on one SO_REUSEPORT port: ours listens first (member
    0), a child's second (member 1); BPF steers every connect to one of
    them. Whoever accepts, the client ends up working: paired when it is
    us, real TCP when it is the sibling (by its greeting, or by the
    deadline, CONFIRM_TIMEOUT, when it stays silent)."""
    monkeypatch.setattr(_handshake, "CONFIRM_TIMEOUT", DEFAULT_CONFIRM_TIMEOUT)
    ours = listening_socket(reuse_port=True)
    theirs = socket.socket()
    theirs.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
    theirs.bind(ours.getsockname())
    theirs.listen()
    steer_reuseport_group(theirs, 0 if accepts == "here" else 1)
    greet = "greets" if accepts == "sibling-greets" else "silent"
    echoes = Echoes()
    server = None
    try:
        async with child_process(
            "accept", theirs.fileno(), greet, "on-go" if accepts == "here" else "now",
            pass_fds=[theirs.fileno()],
        ) as proc:
            theirs.close()
            server = await friendsock.create_server(echoes, sock=ours)
            before = friendsock.stats()
            transport, client = await bounded(
                friendsock.create_connection(Recorder, LOCALHOST, port_of(server))
            )
            assert friendsock.is_friend(transport) is (accepts == "here")
            await echo_and_finish(transport, client, prefix=GREETING if greet == "greets" else b"")
            report = await child_report(proc)  # "here": its stdin closes unused
        assert report == {"accepted": accepts != "here"}
        if accepts == "here":
            await echoes.all_lost()
            assert fallbacks_since(before) == {}
        else:
            assert echoes.protocols == []
            assert fallbacks_since(before) == {"unconfirmed": 1}
        assert friendsock.stats().pending == 0
    finally:
        theirs.close()
        if server is not None:
            server.close()
        else:
            ours.close()


@pytest.mark.parametrize("greet", ["silent", "greets"])
async def test_confirmed_connect_survives_our_close_of_a_shared_listener(greet, monkeypatch):
    """One listening socket, inherited by a child. Our server closes while a
    connect waits in the backlog; the child still holds the listener, so the
    kernel resets nothing and the child accepts: the client must go on over
    real TCP (by the greeting or the deadline), not fail."""
    monkeypatch.setattr(_handshake, "CONFIRM_TIMEOUT", DEFAULT_CONFIRM_TIMEOUT)
    listener = listening_socket()
    echoes = Echoes()
    async with child_process("accept", listener.fileno(), greet, "on-go",
                             pass_fds=[listener.fileno()]) as proc:
        server = await friendsock.create_server(echoes, sock=listener)
        queued = hold_accepts(listener.fileno())
        before = friendsock.stats()
        connecting = asyncio.ensure_future(
            friendsock.create_connection(Recorder, LOCALHOST, port_of(server))
        )
        try:
            await bounded(queued)
            server.close()
            proc.stdin.write(b"go\n")
            transport, client = await bounded(connecting)
        finally:
            server.close()
            connecting.cancel()
        assert not friendsock.is_friend(transport)
        await echo_and_finish(transport, client, prefix=GREETING if greet == "greets" else b"")
        assert await child_report(proc) == {"accepted": True}
    assert echoes.protocols == []
    assert fallbacks_since(before) == {"unconfirmed": 1}
    assert friendsock.stats().pending == 0


def test_confirm_deadline_is_short():
    # The silent-sibling cases above wait this long once per run.
    assert 0 < DEFAULT_CONFIRM_TIMEOUT <= 1


async def test_confirmed_mode_for_reuse_port_servers():
    # reuse_port lets other sockets share the port: no optimistic pairing.
    echoes = Echoes()
    server = await friendsock.create_server(echoes, LOCALHOST, 0, reuse_port=True)
    try:
        queued = hold_accepts(server.sockets[0].fileno())
        connecting = asyncio.ensure_future(
            friendsock.create_connection(Recorder, LOCALHOST, port_of(server))
        )
        await bounded(queued)
        assert not connecting.done()  # confirming: waits for the claim
        assert friendsock.stats().pending == 1
        server.close()
        transport, client = await bounded(connecting)
        assert not friendsock.is_friend(transport)
        assert isinstance(await bounded(client.lost), ConnectionResetError)
    finally:
        server.close()


async def test_cancelled_confirmed_connect_leaves_nothing_behind():
    echoes = Echoes()
    sock = listening_socket()
    server = await friendsock.create_server(echoes, sock=sock)
    try:
        queued = hold_accepts(sock.fileno())
        fds = len(os.listdir("/proc/self/fd"))
        before = friendsock.stats()
        connecting = asyncio.ensure_future(
            friendsock.create_connection(Recorder, LOCALHOST, port_of(server))
        )
        await bounded(queued)
        connecting.cancel()
        with pytest.raises(asyncio.CancelledError):
            await connecting
        assert len(os.listdir("/proc/self/fd")) == fds
        after = friendsock.stats()
        assert after.pending == 0
        assert (after.links_made, after.links_alive) == (before.links_made, before.links_alive)
        assert fallbacks_since(before) == {}
    finally:
        server.close()
    assert echoes.protocols == []


# -- a listener that closes with the connect still in its backlog -------------


@pytest.mark.parametrize("listener", ["tcp", "optimistic", "confirmed"])
async def test_listener_closed_with_connect_in_backlog(listener):
    """The server's loop has not accepted yet when the listener closes: the
    kernel resets the queued connection. Measured on real TCP (a bare
    listening socket, a native client), then both friend modes must agree."""
    echoes = Echoes()
    if listener == "optimistic":
        server = await friendsock.create_server(echoes, LOCALHOST, 0)
        sock, close = server.sockets[0], server.close
    else:
        sock = listening_socket()
        close = sock.close
        if listener == "confirmed":
            close = (await friendsock.create_server(echoes, sock=sock)).close
    port = sock.getsockname()[1]
    queued = hold_accepts(sock.fileno())
    before = friendsock.stats()
    connecting = asyncio.ensure_future(friendsock.create_connection(
        Recorder, LOCALHOST, port, friends=False if listener == "tcp" else None
    ))
    try:
        await bounded(queued)
        if listener != "confirmed":  # a confirmed connect returns once settled
            transport, client = await bounded(connecting)
            transport.write(b"never read")
    finally:
        close()
    try:
        transport, client = await bounded(connecting)
        assert isinstance(await bounded(client.lost), ConnectionResetError)
        assert client.events == ["made", "lost"]
        assert friendsock.is_friend(transport) is (listener == "optimistic")
    finally:
        connecting.cancel()
    assert echoes.protocols == []
    after = friendsock.stats()
    assert after.links_made == before.links_made + (listener == "optimistic")
    assert after.links_alive == before.links_alive
    assert after.pending == 0
    assert fallbacks_since(before) == {
        "tcp": {"opted-out": 1}, "optimistic": {}, "confirmed": {"unconfirmed": 1}
    }[listener]


# -- ends on different loops --------------------------------------------------


async def test_server_on_another_loop_pairs():
    """The server's loop runs in another thread: the ends pair all the same,
    each end's callbacks on its own loop (tests/test_threads.py goes on)."""
    new_loop = uvloop.new_event_loop if loop_kind() == "uvloop" else asyncio.new_event_loop
    server_loop = new_loop()
    server_errors = []
    server_loop.set_exception_handler(lambda _loop, context: server_errors.append(context))
    thread = threading.Thread(target=server_loop.run_forever, daemon=True)
    thread.start()

    def on_server_loop(coro):
        return bounded(asyncio.wrap_future(asyncio.run_coroutine_threadsafe(coro, server_loop)))

    async def start():
        echoes = Echoes()
        return echoes, await friendsock.create_server(echoes, LOCALHOST, 0)

    async def finish(echoes, server):
        try:
            await echoes.all_lost()
            return [friendsock.is_friend(p.transport) for p in echoes.protocols]
        finally:
            server.close()
            for protocol in echoes.protocols:  # after a failure: nothing left open
                protocol.transport.abort()

    echoes = server = None
    try:
        echoes, server = await on_server_loop(start())
        before = friendsock.stats()
        transport, client = await bounded(
            friendsock.create_connection(Recorder, LOCALHOST, port_of(server))
        )
        assert friendsock.is_friend(transport)
        await echo_and_finish(transport, client)
        assert await on_server_loop(finish(echoes, server)) == [True]
        assert fallbacks_since(before) == {}
        after = friendsock.stats()
        assert (after.links_made, after.links_alive) == (before.links_made + 1, before.links_alive)
    finally:
        if server is not None and server.is_serving():
            with contextlib.suppress(Exception):
                await on_server_loop(finish(echoes, server))
        server_loop.call_soon_threadsafe(server_loop.stop)
        thread.join(10)
        server_loop.close()
    assert server_errors == []


# -- addresses ----------------------------------------------------------------


async def test_ipv6_loopback_pairs(friends):
    async with connected_pair(friends, host="::1") as (transport, client, server):
        assert transport.get_extra_info("peername")[0] == "::1"
        assert server.transport.get_extra_info("peername")[:2] == transport.get_extra_info("sockname")[:2]
        transport.write(PAYLOAD)
        assert await bounded(server.wait_bytes(len(PAYLOAD))) == PAYLOAD


async def test_ipv4_client_of_dual_stack_listener_pairs(friends):
    sock = socket.socket(socket.AF_INET6, socket.SOCK_STREAM)
    sock.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 0)
    sock.bind(("::", 0))
    echoes = Echoes()
    server = await friendsock.create_server(echoes, sock=sock, friends=friends)
    try:
        transport, client = await bounded(friendsock.create_connection(
            Recorder, LOCALHOST, port_of(server), friends=friends
        ))
        served = await bounded(echoes.first)
        assert friendsock.is_friend(transport) is friends
        assert friendsock.is_friend(served.transport) is friends
        assert served.transport.get_extra_info("peername")[:2] == (
            "::ffff:127.0.0.1", transport.get_extra_info("sockname")[1]
        )
        await echo_and_finish(transport, client)
        await echoes.all_lost()
    finally:
        server.close()


async def test_ipv6_wildcard_listener_is_ipv6_only(friends):
    server = await friendsock.create_server(Echoes(), "::", 0, friends=friends)
    try:
        with pytest.raises(ConnectionRefusedError):
            await friendsock.create_connection(Recorder, LOCALHOST, port_of(server), friends=friends)
    finally:
        server.close()


# -- TLS takes the native path ------------------------------------------------


@pytest.fixture(scope="module")
def tls():
    ca = trustme.CA()
    server_context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    ca.issue_cert("localhost").configure_cert(server_context)
    client_context = ssl.create_default_context()
    ca.configure_trust(client_context)
    return server_context, client_context


async def test_ssl_pairs_and_runs_tls_over_the_link(tls):
    server_context, client_context = tls
    echoes = Echoes()
    server = await friendsock.create_server(echoes, LOCALHOST, 0, ssl=server_context)
    try:
        before = friendsock.stats()
        transport, client = await bounded(friendsock.create_connection(
            Recorder, LOCALHOST, port_of(server), ssl=client_context, server_hostname="localhost"
        ))
        assert friendsock.is_friend(transport)
        assert transport.get_extra_info("ssl_object") is not None
        transport.write(PAYLOAD)
        assert await bounded(client.wait_bytes(len(PAYLOAD))) == PAYLOAD
        transport.close()
        await bounded(client.lost)
        await echoes.all_lost()
        assert fallbacks_since(before) == {}
        assert friendsock.stats().links_made == before.links_made + 1
    finally:
        server.close()


async def test_ssl_streams_pair(tls):
    server_context, client_context = tls
    got = asyncio.get_running_loop().create_future()

    async def handle(reader, writer):
        track(writer.transport)
        line = await reader.readline()
        writer.write(line.upper())
        await writer.drain()
        got.set_result(friendsock.is_friend(writer))
        writer.close()
        await writer.wait_closed()

    async with await friendsock.start_server(handle, LOCALHOST, 0, ssl=server_context) as server:
        reader, writer = await bounded(friendsock.open_connection(
            LOCALHOST, port_of(server), ssl=client_context, server_hostname="localhost"
        ))
        track(writer.transport)
        assert friendsock.is_friend(writer)
        writer.write(PAYLOAD)
        assert await bounded(reader.readline()) == PAYLOAD.upper()
        assert await bounded(got) is True
        writer.close()
        await bounded(writer.wait_closed())


# -- connect/close-heavy work leaves no TIME_WAIT ----------------------------


async def test_connect_close_cycles_leave_no_time_wait(friends):
    # Thousands on the friend path; on TCP a few show that the check sees
    # what the kernel leaves behind.
    cycles = 5000 if friends else 3
    echoes = Echoes()
    server = await friendsock.create_server(echoes, LOCALHOST, 0, friends=friends)
    port = port_of(server)
    try:
        lingering = tcp_connections(port, TCP_TIME_WAIT)
        before = friendsock.stats()
        fds = len(os.listdir("/proc/self/fd"))
        for _ in range(cycles):
            transport, client = await friendsock.create_connection(
                Recorder, LOCALHOST, port, friends=friends
            )
            transport.write(b"ping")
            await bounded(client.wait_bytes(4))
            transport.close()
            await bounded(client.lost)
        await echoes.all_lost()
        # A friendsock listener keeps a few finished links' connections for
        # later connects (two descriptors each); TCP leaves none.
        kept = len(os.listdir("/proc/self/fd")) - fds
        assert 0 <= kept <= 2 * _handshake.KEPT_PER_LISTENER if friends else kept == 0
    finally:
        server.close()
    # Closed, the listener ends what it kept: its own descriptor goes too.
    await server.wait_closed()
    for _ in range(3):  # (uvloop closes a listener's handle at its next turn)
        await asyncio.sleep(0)
    assert len(os.listdir("/proc/self/fd")) == fds - 1
    left = tcp_connections(port, TCP_TIME_WAIT) - lingering
    after = friendsock.stats()
    assert len(echoes.protocols) == cycles
    if friends:
        assert left == set()
        assert after.links_made - before.links_made == cycles
        assert after.links_alive == before.links_alive
        assert after.pending == 0
    else:
        assert len(left) == cycles  # each client closed first: one TIME_WAIT each


# -- streams ------------------------------------------------------------------


async def test_a_client_takes_a_port_as_connect_takes_one(friends):
    """A friend client's port comes from the half of the ephemeral range a
    kernel connect() takes ports from (the even ports; a bind() to port 0
    takes odd ones first), so a port a program picked with bind(("", 0))
    and closed, to listen on later (asyncio's and many suites' "free port"
    helpers), is not taken meanwhile by a client, as over TCP."""
    # An address of its own: TIME_WAIT left on 127.0.0.1's ports by other
    # tests' TCP connections makes those ports no bind()'s (a connect()
    # may take them again), and friend clients then take the kernel's
    # choice of port.
    host = "127.0.0.9"
    picked = []
    for _ in range(20):
        with socket.socket() as probe:
            probe.bind((host, 0))
            picked.append(probe.getsockname()[1])
    echoes = Echoes()
    server = await friendsock.create_server(echoes, host, 0, friends=friends)
    clients = []
    try:
        for _ in range(200):
            transport, _ = await friendsock.create_connection(Recorder, host, port_of(server),
                                                             friends=friends)
            clients.append(transport)
            # (Each a connection of its own: none of them is done yet.)
        ports = [transport.get_extra_info("sockname")[1] for transport in clients]
        assert len(set(ports)) == len(ports)
        assert all(port % 2 == 0 for port in ports)
        assert not set(ports) & set(picked)
    finally:
        for transport in clients:
            transport.close()
        await asyncio.sleep(0)
        server.close()
        await server.wait_closed()


def test_ports_in_use_on_one_address_leave_another_address_alone():
    """Where the ports tried on one local address are in use (TIME_WAIT
    left by TCP connections, say), clients there take the kernel's choice
    for a while; clients on another address still take ports as connect()
    would."""
    busy, other = "127.0.0.10", "127.0.0.11"
    ports = _handshake._EphemeralPorts()
    held = []
    try:
        # Two neighbouring even ports of the range, taken on one address.
        for first in range(ports.first, ports.first + 2 * ports.count - 2, 2):
            try:
                for port in (first, first + 2):
                    sock = socket.socket()
                    held.append(sock)
                    sock.bind((busy, port))
                break
            except OSError:
                for sock in held:
                    sock.close()
                held.clear()
        ports.first, ports.count, ports.cursor = first, 2, 0
        with socket.socket() as client:
            ports.bind(client, busy)
            assert client.getsockname()[1] not in (first, first + 2)
        for _ in range(3):
            with socket.socket() as client:
                ports.bind(client, other)
                assert client.getsockname()[1] in (first, first + 2)
    finally:
        for sock in held:
            sock.close()


async def test_streams_pair(friends):
    served = asyncio.get_running_loop().create_future()

    async def handle(reader, writer):
        track(writer.transport)
        line = await reader.readline()
        writer.write(line.upper())
        await writer.drain()
        rest = await reader.read()
        writer.close()
        await writer.wait_closed()
        served.set_result((writer, rest))

    server = await friendsock.start_server(handle, LOCALHOST, 0, friends=friends)
    async with server:
        reader, writer = await bounded(
            friendsock.open_connection(LOCALHOST, port_of(server), friends=friends)
        )
        track(writer.transport)
        assert friendsock.is_friend(writer) is friends
        writer.write(PAYLOAD)
        await bounded(writer.drain())
        assert await bounded(reader.readline()) == PAYLOAD.upper()
        writer.write(b"and goodbye")
        writer.write_eof()
        server_writer, rest = await bounded(served)
        assert rest == b"and goodbye"
        assert await bounded(reader.read()) == b""
        assert friendsock.is_friend(server_writer) is friends
        assert server_writer.get_extra_info("peername") == writer.get_extra_info("sockname")
        writer.close()
        await bounded(writer.wait_closed())


async def test_a_failing_protocol_factory_ends_the_connection(friends):
    """create_connection raises what the protocol factory raised, and the
    server's end of the connection sees it end (EOF), as over TCP on the
    stdlib loop, which leaves the socket to the collector. (uvloop calls
    the factory before it connects: over TCP nothing is accepted there; a
    friend connection exists before the factory runs, and ends.)"""
    accepted: "asyncio.Future[Recorder]" = asyncio.get_running_loop().create_future()

    def server_protocol() -> Recorder:
        protocol = Recorder()
        accepted.set_result(protocol)
        return protocol

    def failing() -> asyncio.Protocol:
        raise ValueError("no protocol today")

    server = await friendsock.create_server(server_protocol, LOCALHOST, 0, friends=friends)
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", ResourceWarning)  # asyncio's own socket, over TCP
            with pytest.raises(ValueError, match="no protocol today"):
                await bounded(friendsock.create_connection(failing, LOCALHOST, port_of(server),
                                                           friends=friends))
            gc.collect()
        if friends or isinstance(asyncio.get_running_loop(), asyncio.BaseEventLoop):
            server_end = await bounded(accepted)
            await bounded(server_end.eof)
            server_end.transport.close()
            assert await bounded(server_end.lost) is None
    finally:
        server.close()
