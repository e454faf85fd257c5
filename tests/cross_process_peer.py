"""The other process of ``test_cross_process``: an echo server, or a client.

    python tests/cross_process_peer.py serve LOOP DOOR
    python tests/cross_process_peer.py connect LOOP DOOR PORT SIZE SEED
    python tests/cross_process_peer.py connect - trio|trio-install PORT SIZE SEED
    python tests/cross_process_peer.py answer - HOW PORT
    python tests/cross_process_peer.py starttls LOOP - PORT CA_FILE
    python tests/cross_process_peer.py shared LOOP -

LOOP is ``asyncio`` or ``uvloop``. DOOR is how friendsock is switched on:
``api`` (``friendsock.start_server`` / ``open_connection``), ``plain``
(asyncio's own calls, with whatever ``FRIENDSOCK_INSTALL`` did); ``serve``
also takes ``both`` (``api``, a server on 127.0.0.1 and one on ::1, on
one port) and
``abort`` (``api``: echoes 4 bytes, then aborts with SO_LINGER {1, 0});
``eof-abort`` (the same, but it sends EOF after the 4 bytes and aborts
once it read 4 more); ``eof-abort-late`` (it reads until EOF, then aborts);
``blocking`` and ``blocking-abort`` are the same served by a blocking
server (``socketserver``'s threading TCP server, under ``patch_socket()``;
LOOP ``-``; ``blocking-timeout``, its listener with a timeout of 0.5 s),
and ``blocking-select`` by a select() loop on a non-blocking listener; ``trio`` and ``trio-install`` by a trio server
(``friendsock.trio.serve_tcp``, or trio's own under ``install()``;
``trio-timeout``, ``trio-install-timeout``: its accepts each under a deadline;
``trio-close``: one accept under a deadline, then its listener closes);
``closing`` and ``speaking`` by a published listener that offers nothing;
``anyio`` by anyio's own listener on LOOP (with ``FRIENDSOCK_INSTALL=1``;
``anyio-timeout``: its accepts each under a deadline).

``serve`` prints its port, echoes each connection until EOF and then
finishes it, and prints one JSON line per connection as it ends: the
transport's class, whether payload crossed its TCP socket (TCP_INFO), the
SHA-256 of what it echoed, what ``friendsock.links()`` lists for it
(before its EOF is sent back) and the counts per other process. It exits when its standard input closes.

``connect`` sends SIZE bytes (a seeded random stream) with EOF, reads the
echo and prints the same JSON line, with ``sent``: the SHA-256 it sent.

``answer`` is a process that does not play by the rules: it connects to a
friendsock server on PORT with a plain socket, writes the port table's
connect slot for it as a friendsock client would, and answers the offer
it gets as HOW says: ``late`` (TAKEN with its own socket, as a friendsock
client does, but 1.3 s late), ``pipe`` (TAKEN, handing a pipe over as its socket),
``other`` (TAKEN, handing a socket of another connection), ``none`` (TAKEN,
handing nothing), ``declined``, ``silent`` (no answer: it prints
``offered`` and waits to be killed), or ``squatted`` (its slot names the
pid of its parent, whose channel name it squats on). Then it sends
``ping``, and prints what it reads back (or the error's errno name).
"""

from __future__ import annotations

import asyncio
import errno
import functools
import hashlib
import json
import os
import random
import signal
import socket
import sys

import friendsock
from friendsock._handshake._tcp_info import payload_moved


def _report(writer: asyncio.StreamWriter, digest: str, **extra) -> str:
    return _report_of(type(writer.transport).__name__, writer.get_extra_info("socket"),
                      writer.get_extra_info("sockname"), writer.get_extra_info("peername"),
                      digest, **extra)


def _report_of(kind: str, sock, sockname, peername, digest: str, **extra) -> str:
    sockname = list(sockname)
    return json.dumps({
        "transport": kind,
        "payload_moved": payload_moved(sock),
        "sockname": sockname,
        "peername": list(peername),
        "sha256": digest,
        "nodelay": sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY),
        "link": _link_of(sockname),
        "peers": {str(pid): count for pid, count in friendsock.stats().cross_process_peers.items()},
        **extra,
    })


def _link_of(sockname: list) -> "dict | None":
    """What friendsock.links() says of the connection whose end here is
    ``sockname``, if it lists it."""
    for link in friendsock.links():
        if sockname in (list(link.client.address), list(link.server.address)):
            return {"peer_pid": link.peer_pid, "client": list(link.client.address),
                    "server": list(link.server.address), "listener": link.listener,
                    "to_server": [link.to_server.state, link.to_server.queued, link.to_server.moved],
                    "to_client": [link.to_client.state, link.to_client.queued, link.to_client.moved]}
    return None


async def _reset(writer: asyncio.StreamWriter) -> None:
    """An abort with SO_LINGER {1, 0}, reported once its sockets are closed."""
    writer.get_extra_info("socket").setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, b"\x01\0\0\0\0\0\0\0")
    writer.transport.abort()
    await writer.wait_closed()
    print(json.dumps({"aborted": True}), flush=True)


async def _hold(writer: asyncio.StreamWriter) -> None:
    """The connection held open until the server process ends."""
    try:
        await asyncio.Event().wait()
    finally:
        writer.close()


async def serve(door: str) -> None:
    told = asyncio.Event()  # (SIGUSR1: the test's go-ahead)
    asyncio.get_running_loop().add_signal_handler(signal.SIGUSR1, told.set)

    async def echo(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        digest = hashlib.sha256()
        if door == "abort":
            writer.write(await reader.readexactly(4))
            await writer.drain()
            await _reset(writer)
            return
        if door == "abort-later":  # the answer, then a reset once 4 more bytes came
            writer.write(await reader.readexactly(4))
            await reader.readexactly(4)
            await _reset(writer)
            return
        if door == "eof-abort":  # the answer and EOF, then a reset once 4 more bytes came
            writer.write(await reader.readexactly(4))
            writer.write_eof()
            await reader.readexactly(4)
            await _reset(writer)
            return
        if door == "eof-abort-late":  # the client's EOF read, then a reset
            await reader.read()
            await _reset(writer)
            return
        if door == "eof-hold":  # EOF read, then the connection held open while the server runs
            print(json.dumps({"eof": await reader.read() == b""}), flush=True)
            await _hold(writer)
        if door == "eof-late":  # what ends the connection read only once told, then held open
            writer.transport.pause_reading()
            print(json.dumps({"accepted": True}), flush=True)
            await told.wait()
            writer.transport.resume_reading()
            try:
                print(json.dumps({"eof": await reader.read() == b""}), flush=True)
            except ConnectionError as exc:
                print(json.dumps({"error": type(exc).__name__}), flush=True)
            await _hold(writer)
        if door == "eof-unread":  # EOF at once, nothing read, then held open
            writer.transport.pause_reading()
            writer.write_eof()
            print(json.dumps({"eof_sent": True}), flush=True)
            await _hold(writer)
        if door == "close":  # the answer, then a close while the client still writes
            writer.write(await reader.readexactly(4))
            writer.close()
            await writer.wait_closed()
            print(json.dumps({"closed": True}), flush=True)
            return
        try:
            while data := await reader.read(1 << 16):
                digest.update(data)
                writer.write(data)
                await writer.drain()
            report = _report(writer, digest.hexdigest())
            writer.write_eof()
        except ConnectionError as exc:
            report = json.dumps({"error": type(exc).__name__})
        print(report, flush=True)
        writer.close()

    start = asyncio.start_server if door == "plain" else friendsock.start_server
    for _ in range(20):
        server = await start(echo, "127.0.0.1", 0)
        port = server.sockets[0].getsockname()[1]
        if door != "both":
            servers = [server]
            break
        try:
            servers = [server, await start(echo, "::1", port)]
            break
        except OSError as exc:  # (the port taken on ::1 meanwhile: another one)
            if exc.errno != errno.EADDRINUSE:
                raise
            server.close()
    else:
        raise OSError(errno.EADDRINUSE, "no port free on both 127.0.0.1 and ::1")
    print(port, flush=True)
    stdin_closed = asyncio.get_running_loop().run_in_executor(None, sys.stdin.read)
    await stdin_closed
    for server in servers:
        server.close()


async def serve_aiohttp() -> None:
    """An aiohttp server on an installed loop: ``POST /echo`` answers the
    body it was sent, with whether its connection moved off TCP here."""
    from aiohttp import web

    friendsock.install()

    async def echo(request: web.Request) -> web.Response:
        body = await request.read()
        transport = request.transport
        assert transport is not None
        return web.Response(body=body, headers={
            "x-friend": str(friendsock.is_friend(transport)),
            "x-payload-moved": str(payload_moved(transport.get_extra_info("socket")))})

    app = web.Application(client_max_size=1 << 30)
    app.router.add_post("/echo", echo)
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    print(runner.addresses[0][1], flush=True)
    await asyncio.get_running_loop().run_in_executor(None, sys.stdin.read)
    await runner.cleanup()


def serve_offering_nothing(door: str) -> None:
    """``serve`` by a listener whose port is published, as a friendsock
    server's, that offers nothing: ``closing`` closes it as soon as a
    connect is in its backlog (a server shutting down: the kernel resets
    that connection); ``speaking`` accepts and says ``hello`` over TCP (a
    server without friendsock sharing the port, one that speaks first);
    ``silent`` accepts and answers what it reads (one that reads first)."""
    import select

    from friendsock._host._ports import publish_listener

    listener = socket.create_server(("127.0.0.1", 0))
    publish_listener(listener)
    print(listener.getsockname()[1], flush=True)
    if door == "closing":
        select.select([listener], [], [])
        listener.close()
        print(json.dumps({"closed": True}), flush=True)
    elif door == "silent":  # (it answers what it reads, over TCP)
        conn, _ = listener.accept()
        conn.sendall(conn.recv(4))
        print(json.dumps({"answered": True}), flush=True)
    else:
        conn, _ = listener.accept()
        conn.sendall(b"hello")
        print(json.dumps({"said": "hello"}), flush=True)
    sys.stdin.read()


def serve_blocking(door: str) -> None:
    """``serve`` by a blocking server: socketserver's, one thread per
    connection, its sockets made by the patched class; or (``blocking-select``)
    a listener made non-blocking after it listens, its accepts driven by
    ``select()`` with no event loop, as gunicorn's sync workers drive theirs."""
    import select
    import socketserver
    import threading

    friendsock.patch_socket()
    printing = threading.Lock()

    def say(line: str) -> None:
        with printing:
            print(line, flush=True)

    def echo(sock: socket.socket) -> None:
        if door == "blocking-abort":
            ping = b""
            while len(ping) < 4:
                ping += sock.recv(4 - len(ping))
            sock.sendall(ping)
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, b"\x01\0\0\0\0\0\0\0")
            sock.close()
            say(json.dumps({"aborted": True}))
            return
        if door in ("blocking-close-unread", "blocking-eof-close-unread", "blocking-eof-close-unread-fin"):
            # the answer (and EOF), then a close with what came next unread
            # (-fin: once the client's EOF came behind it too)
            sock.sendall(sock.recv(4))
            if door != "blocking-close-unread":
                sock.shutdown(socket.SHUT_WR)
            poller = select.poll()
            poller.register(sock, select.POLLRDHUP if door.endswith("-fin") else select.POLLIN)
            poller.poll(20_000)
            sock.close()
            say(json.dumps({"closed": True}))
            return
        digest = hashlib.sha256()
        try:
            while data := sock.recv(1 << 16):
                digest.update(data)
                sock.sendall(data)
            report = _report_of(type(sock).__name__, sock, sock.getsockname(), sock.getpeername(),
                                digest.hexdigest(), friend=friendsock.is_friend(sock))
        except ConnectionError as exc:
            report = json.dumps({"error": type(exc).__name__})
        say(report)

    if door == "blocking-select":
        listener = socket.create_server(("127.0.0.1", 0))
        listener.setblocking(False)
        stop_r, stop_w = os.pipe()

        def accepting() -> None:
            while select.select([listener, stop_r], [], [])[0] != [stop_r]:
                try:
                    conn, _ = listener.accept()
                except BlockingIOError:
                    continue
                conn.setblocking(True)
                threading.Thread(target=lambda: (echo(conn), conn.close()), daemon=True).start()

        say(str(listener.getsockname()[1]))
        thread = threading.Thread(target=accepting)
        thread.start()
        sys.stdin.read()
        os.write(stop_w, b"x")
        thread.join()
        listener.close()
        return

    class Echo(socketserver.BaseRequestHandler):
        def handle(self) -> None:
            echo(self.request)

    server = socketserver.ThreadingTCPServer(("127.0.0.1", 0), Echo)
    server.daemon_threads = True
    if door == "blocking-timeout":
        server.socket.settimeout(0.5)
    elif door == "blocking-short-timeout":  # (shorter than the confirm deadline)
        server.socket.settimeout(0.05)
    say(str(server.server_address[1]))
    threading.Thread(target=server.serve_forever, daemon=True).start()
    sys.stdin.read()
    server.shutdown()
    server.server_close()


def serve_trio(door: str) -> None:
    """``serve`` by a trio server: ``friendsock.trio``'s listeners (door
    ``trio``), or trio's own under ``friendsock.trio.install()``."""
    import trio

    import friendsock.trio

    async def echo(stream: trio.SocketStream) -> None:
        digest = hashlib.sha256()
        sock = stream.socket
        try:
            async with stream:
                while data := await stream.receive_some(1 << 16):
                    digest.update(data)
                    await stream.send_all(data)
                report = _report_of(type(sock).__name__, sock, sock.getsockname(), sock.getpeername(),
                                    digest.hexdigest(), friend=friendsock.is_friend(stream))
                await stream.send_eof()
        except trio.BrokenResourceError as exc:
            report = json.dumps({"error": type(exc.__cause__).__name__})
        print(report, flush=True)

    async def accepting(listener, nursery) -> None:
        while True:
            with trio.move_on_after(0.3):
                nursery.start_soon(echo, await listener.accept())

    async def main() -> None:
        if door.startswith("trio-install"):
            friendsock.trio.install()
            listeners = await trio.open_tcp_listeners(0, host="127.0.0.1")
        else:
            listeners = await friendsock.trio.open_tcp_listeners(0, host="127.0.0.1")
        print(listeners[0].socket.getsockname()[1], flush=True)
        if door == "trio-close":
            # One accept, cut short while its offer waits; then the listener closes.
            await trio.lowlevel.wait_readable(listeners[0].socket)  # (a connect is in)
            with trio.move_on_after(0.3):
                await listeners[0].accept()
            await listeners[0].aclose()
            print(json.dumps({"closed": True}), flush=True)
            await trio.to_thread.run_sync(sys.stdin.read)
            return
        async with trio.open_nursery() as nursery:
            if door.endswith("-timeout"):
                nursery.start_soon(accepting, listeners[0], nursery)
            else:
                nursery.start_soon(trio.serve_listeners, echo, listeners)
            await trio.to_thread.run_sync(sys.stdin.read)
            nursery.cancel_scope.cancel()

    trio.run(main)


def serve_anyio(door: str) -> None:
    """``serve`` by anyio's own TCP listener on asyncio (its accepts are
    ``loop.sock_accept``'s), switched on by ``FRIENDSOCK_INSTALL=1``;
    ``anyio-timeout``: each accept under a 0.3 s deadline, in a loop."""
    import anyio
    from anyio.abc import SocketAttribute

    async def echo(stream) -> None:
        digest = hashlib.sha256()
        transport = stream._transport  # (anyio's own; what is_friend() looks at)
        try:
            async with stream:
                while True:
                    try:
                        data = await stream.receive(1 << 16)
                    except anyio.EndOfStream:
                        break
                    digest.update(data)
                    await stream.send(data)
                report = _report_of(type(transport).__name__, stream.extra(SocketAttribute.raw_socket),
                                    stream.extra(SocketAttribute.local_address),
                                    stream.extra(SocketAttribute.remote_address),
                                    digest.hexdigest(), friend=friendsock.is_friend(transport))
                await stream.send_eof()
        except anyio.BrokenResourceError as exc:
            report = json.dumps({"error": type(exc.__cause__).__name__})
        print(report, flush=True)

    async def main() -> None:
        listener = await anyio.create_tcp_listener(local_host="127.0.0.1")
        print(listener.extra(SocketAttribute.local_port), flush=True)
        async def accepting() -> None:
            while True:
                with anyio.move_on_after(0.3):
                    group.start_soon(echo, await listener.listeners[0].accept())

        async with listener, anyio.create_task_group() as group:
            group.start_soon(accepting if door == "anyio-timeout" else functools.partial(listener.serve, echo))
            await anyio.to_thread.run_sync(sys.stdin.read)
            group.cancel_scope.cancel()

    anyio.run(main, backend="asyncio")


async def connect(door: str, port: int, size: int, seed: int) -> None:
    payload = random.Random(seed).randbytes(size)
    open_connection = friendsock.open_connection if door == "api" else asyncio.open_connection
    reader, writer = await open_connection("127.0.0.1", port)
    writer.write(payload)
    writer.write_eof()
    digest = hashlib.sha256()
    while data := await reader.read(1 << 16):
        digest.update(data)
    print(_report(writer, digest.hexdigest(), sent=hashlib.sha256(payload).hexdigest()), flush=True)
    writer.close()
    await writer.wait_closed()


def short_of_descriptors(door: str, port: int, free: int, warm: bool) -> None:
    """A client with ``free`` descriptors left (``warm``: after a first
    connection to the server, whose channel to this process is open then)
    sends "ping" and reads the echo: asyncio's (``api``, on a loop that
    runs already: its own descriptors are not counted) or a blocking
    socket's (``blocking``)."""
    import resource

    def run_short() -> None:
        _, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
        resource.setrlimit(resource.RLIMIT_NOFILE, (256, hard))
        held = []
        while True:
            try:
                held.append(os.open(os.devnull, os.O_RDONLY))
            except OSError:
                break
        for _ in range(free):
            os.close(held.pop())

    if door == "blocking":
        friendsock.patch_socket()

        def ping() -> bytes:
            with socket.create_connection(("127.0.0.1", port), timeout=15) as sock:
                sock.sendall(b"ping")
                sock.shutdown(socket.SHUT_WR)
                return sock.recv(10)

        if warm:
            assert ping() == b"ping"
        run_short()
        print(json.dumps({"echo": ping().decode()}), flush=True)
        return

    async def ping_once() -> bytes:
        reader, writer = await friendsock.open_connection("127.0.0.1", port)
        writer.write(b"ping")
        writer.write_eof()
        try:
            return await asyncio.wait_for(reader.read(10), 15)
        finally:
            writer.close()

    async def main() -> None:
        # (the loop's own first TCP connect: uvloop makes a descriptor more for it)
        _, writer = await asyncio.open_connection("127.0.0.1", port)
        writer.close()
        await writer.wait_closed()
        if warm:
            assert await ping_once() == b"ping"
        run_short()
        print(json.dumps({"echo": (await ping_once()).decode()}), flush=True)

    asyncio.run(main())


async def echoed_over_trio(stream, payload: bytes) -> str:
    """``payload`` and EOF sent over the trio ``stream`` while its echo is
    read to EOF: the echo's SHA-256."""
    import trio

    digest = hashlib.sha256()

    async def send() -> None:
        await stream.send_all(payload)
        await stream.send_eof()

    async with trio.open_nursery() as nursery:
        nursery.start_soon(send)
        while data := await stream.receive_some(1 << 16):
            digest.update(data)
    return digest.hexdigest()


def connect_trio(door: str, port: int, size: int, seed: int) -> None:
    """``connect`` on trio: ``friendsock.trio.open_tcp_stream`` (door
    ``trio``), or trio's own under ``friendsock.trio.install()``
    (``trio-install``)."""
    import trio

    import friendsock.trio

    async def exchange() -> None:
        payload = random.Random(seed).randbytes(size)
        if door == "trio-install":
            friendsock.trio.install()
            stream = await trio.open_tcp_stream("127.0.0.1", port)
        else:
            stream = await friendsock.trio.open_tcp_stream("127.0.0.1", port)
        sock = stream.socket
        names = {"sockname": list(sock.getsockname()), "peername": list(sock.getpeername())}
        async with stream:
            echoed = await echoed_over_trio(stream, payload)
            print(json.dumps({
                "transport": type(stream).__name__, "friend": friendsock.is_friend(stream),
                "payload_moved": payload_moved(sock),  # type: ignore[arg-type]
                "sha256": echoed, "sent": hashlib.sha256(payload).hexdigest(),
                **names,
            }), flush=True)

    trio.run(exchange)


async def starttls(port: int, ca_file: str) -> None:
    """A client that upgrades its connection to TLS after a plaintext
    exchange (STARTTLS), through friendsock's start_tls."""
    import ssl

    got: "asyncio.Queue[bytes]" = asyncio.Queue()

    class Client(asyncio.Protocol):
        def data_received(self, data: bytes) -> None:
            got.put_nowait(data)

    protocol = Client()
    transport, _ = await friendsock.create_connection(lambda: protocol, "127.0.0.1", port)
    kind = type(transport).__name__
    transport.write(b"STARTTLS\n")
    assert await got.get() == b"GO\n"
    context = ssl.create_default_context(cafile=ca_file)
    tls = await friendsock.start_tls(transport, protocol, context, server_hostname="localhost")
    tls.write(b"secret\n")
    answer = b""
    while not answer.endswith(b"\n"):
        answer += await got.get()
    print(json.dumps({"transport": kind, "answer": answer.decode(),
                      "cipher": bool(tls.get_extra_info("cipher"))}), flush=True)
    tls.close()


TOKEN = 65000  # a loop token no loop of a process takes before its 65000th


def answer(how: str, port: int) -> None:
    import os
    import socket
    import time

    from friendsock._host._proof import Message, What, channel_address, received
    from friendsock._host._table import CONNECTS, PortTable

    table = PortTable.open()
    assert table is not None
    named = os.getppid() if how == "squatted" else os.getpid()
    channel = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    channel.bind(channel_address(named, TOKEN))
    channel.listen(1)
    client = socket.socket()
    client.bind(("127.0.0.1", 0))
    client_port = client.getsockname()[1]
    table.write(CONNECTS, client_port, named, port, TOKEN)
    client.connect(("127.0.0.1", port))
    if how != "squatted":
        offers, _ = channel.accept()
        message, handed = received(offers)
        assert message is not None and message.what is What.OFFER and len(handed) == 2, message
        if how == "silent":
            print("offered", flush=True)
            time.sleep(60)
        fds = []
        if how == "pipe":
            fds = [os.pipe()[0]]
        elif how == "other":
            other = socket.create_connection(("127.0.0.1", port))
            fds = [other.fileno()]
        elif how == "late":
            # Running, but slow to answer (its GIL or loop busy elsewhere):
            # past the offer's second, and every accept deadline of the doors.
            time.sleep(1.3)
            fds = [client.fileno()]
        what = What.DECLINED if how == "declined" else What.TAKEN
        socket.send_fds(offers, [Message(what, message.client_port, message.serial).encode()], fds)
        if how == "late":  # taken with its proof: the pair is the connection now
            os.dup2(handed[1].fileno(), client.fileno())
    client.settimeout(10)
    try:
        client.sendall(b"ping")
        client.shutdown(socket.SHUT_WR)
        got = b""
        while data := client.recv(100):
            got += data
        print(json.dumps({"read": got.decode()}), flush=True)
    except OSError as exc:
        print(json.dumps({"error": errno.errorcode.get(exc.errno or 0, type(exc).__name__)}), flush=True)
    table.clear(CONNECTS, client_port, named)  # (its own name is the pair's once it took one)


def shared() -> None:
    """Two processes serving one listening socket, as a pre-fork server's
    workers do: this one and a child forked after the socket was made,
    which starts serving (publishing the port) last. Prints the port and
    both pids; ``stop`` on standard input stops the child's server and
    the child, this one serving on until EOF."""
    listener = socket.create_server(("127.0.0.1", 0))
    go_r, go_w = os.pipe()  # here to the child: serve now
    started_r, started_w = os.pipe()  # the child to here: serving
    stop_r, stop_w = os.pipe()  # here to the child: stop
    child = os.fork()
    if child == 0:
        async def serve_in_child() -> None:
            loop = asyncio.get_running_loop()
            await loop.run_in_executor(None, os.read, go_r, 1)
            server = await friendsock.start_server(_echo_with_pid, sock=listener)
            os.write(started_w, b"x")
            await loop.run_in_executor(None, os.read, stop_r, 1)
            server.close()
            await server.wait_closed()

        try:
            asyncio.run(serve_in_child())
        finally:
            os._exit(0)

    async def serve_here() -> None:
        loop = asyncio.get_running_loop()
        server = await friendsock.start_server(_echo_with_pid, sock=listener)
        os.write(go_w, b"x")
        await loop.run_in_executor(None, os.read, started_r, 1)
        print(json.dumps({"port": listener.getsockname()[1], "first": os.getpid(), "last": child}),
              flush=True)
        while line := await loop.run_in_executor(None, sys.stdin.readline):
            if line.strip() == "stop":
                os.write(stop_w, b"x")
                await loop.run_in_executor(None, os.waitpid, child, 0)
                print("stopped", flush=True)
        server.close()

    asyncio.run(serve_here())


async def _echo_with_pid(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    """Each line back, after this process's id."""
    while line := await reader.readline():
        writer.write(f"{os.getpid()} ".encode() + line)
    writer.close()


def pool_echo(port: int, seed: int) -> dict:
    """A process pool's task: 1 MiB (seeded) to the echo server on
    ``port`` with a blocking socket, then EOF; the echo's SHA-256, this
    process's id and whether payload crossed the TCP socket."""
    import threading

    from friendsock._handshake._tcp_info import payload_moved

    payload = random.Random(seed).randbytes(1 << 20)
    with socket.create_connection(("127.0.0.1", port), timeout=20) as sock:

        def send() -> None:
            sock.sendall(payload)
            sock.shutdown(socket.SHUT_WR)

        sender = threading.Thread(target=send)  # (while this one reads the echo)
        sender.start()
        digest = hashlib.sha256()
        while data := sock.recv(1 << 16):
            digest.update(data)
        sender.join(20)
        return {"sha256": digest.hexdigest(), "pid": os.getpid(), "payload_moved": payload_moved(sock)}


def handed_echo(pipe, payload_size: int) -> None:
    """A spawned process handed a connected blocking socket over ``pipe``
    (multiprocessing's): as the connecting end (``payload_size`` > 0), it
    sends that many bytes (seeded) with EOF and reads the echo; as the
    accepting end (0), it echoes until EOF. What it moved and saw goes
    back over ``pipe``."""
    import threading

    sock = pipe.recv()
    sock.settimeout(20)
    with sock:
        names = {"sockname": list(sock.getsockname()), "peername": list(sock.getpeername())}
        digest = hashlib.sha256()
        if payload_size:
            payload = random.Random(7).randbytes(payload_size)

            def send() -> None:
                sock.sendall(payload)
                sock.shutdown(socket.SHUT_WR)

            writer = threading.Thread(target=send)  # (while this one reads the echo)
            writer.start()
            while data := sock.recv(1 << 16):
                digest.update(data)
            writer.join(20)
        else:
            while data := sock.recv(1 << 16):
                digest.update(data)
                sock.sendall(data)
            sock.shutdown(socket.SHUT_WR)
        pipe.send({"sha256": digest.hexdigest(), "friend": friendsock.is_friend(sock),
                     "payload_moved": payload_moved(sock), "family": int(sock.family),
                     "nodelay": sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY), **names})


def main() -> None:
    role, loop_name, door, *rest = sys.argv[1:]
    if loop_name == "uvloop":
        import uvloop

        asyncio.set_event_loop_policy(uvloop.EventLoopPolicy())
    if role == "answer":
        answer(door, int(rest[0]))
    elif role == "starttls":
        asyncio.run(starttls(int(rest[0]), rest[1]))
    elif role == "serve" and door in ("closing", "speaking", "silent"):
        serve_offering_nothing(door)
    elif role == "serve" and door.startswith("blocking"):
        serve_blocking(door)
    elif role == "serve" and door.startswith("trio"):
        serve_trio(door)
    elif role == "serve" and door == "aiohttp":
        asyncio.run(serve_aiohttp())
    elif role == "serve" and door.startswith("anyio"):
        serve_anyio(door)
    elif role == "serve":
        asyncio.run(serve(door))
    elif role == "shared":
        shared()
    elif role == "short":
        port, free, warm = (int(arg) for arg in rest)
        short_of_descriptors(door, port, free, bool(warm))
    else:
        port, size, seed = (int(arg) for arg in rest)
        if door.startswith("trio"):
            connect_trio(door, port, size, seed)
        else:
            asyncio.run(connect(door, port, size, seed))


if __name__ == "__main__":
    main()
