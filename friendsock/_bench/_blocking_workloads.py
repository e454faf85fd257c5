"""The ``blocking`` test: blocking sockets in threads, as ``patch_socket()``
pairs them.

Two kinds of table, request/response and stream each:

- ``blocking-rr``, ``blocking-stream``: a blocking client socket in a thread
  of its own, the server a protocol on the event loop (the runner's loop,
  asyncio or uvloop), the way a thread pool calls an asyncio service;
- ``blocking-threads-rr``, ``blocking-threads-stream``: both ends blocking
  sockets, in two threads (no event loop in the path: only the ``asyncio``
  row runs them).

Transports: ``tcp`` (plain blocking sockets, the server with
``friends=False``), ``unix`` (blocking AF_UNIX sockets), ``friends``
(sockets made under ``friendsock.patch_socket()``, which pair) and
``memory``, the floor (:class:`BlockingFloorWorkload`: no sockets, the bare
hand-over between two threads that any in-process transport pays). The
blocking calls run in worker threads (``asyncio.to_thread``) while the loop
serves, so the loop never blocks.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import queue
import socket
import threading
import time
from typing import Any, Callable, Iterator, List, Optional

import friendsock

from ._rr_workloads import Echo
from ._stream_workloads import Sink
from ._transports import FRIEND_TRANSPORTS, HOST, Endpoint
from ._samples import Sample, links_verdict, moved_verdict
from ._workloads import Workload, until

_RECV = 256 * 1024
_SETTLE_TIMEOUT = 10.0
# The floor's bound on sends not yet received (its stream's back-pressure):
# 16 writes of 64 KiB, about a loopback socket pair's buffers.
_FLOOR_IN_FLIGHT = 16
# Cases whose both ends are blocking sockets (no event loop involved).
THREADS_CASES = ("blocking-threads-rr", "blocking-threads-stream")


@contextlib.contextmanager
def _sockets_for(transport: str) -> Iterator[None]:
    """Sockets made inside pair when the transport is a friend one (the
    patch is undone after: they stay friends until closed); plain ones
    otherwise."""
    if transport not in FRIEND_TRANSPORTS or friendsock.is_socket_patched():
        yield
        return
    friendsock.patch_socket()
    try:
        yield
    finally:
        friendsock.unpatch_socket()


def _close_quietly(sock: Optional[socket.socket]) -> None:
    """Wake whoever is blocked on ``sock`` (shutdown), then close it."""
    if sock is None:
        return
    with contextlib.suppress(OSError):
        sock.shutdown(socket.SHUT_RDWR)
    with contextlib.suppress(OSError):
        sock.close()


class _Counters:
    """What the blocking threads did; read from the loop's thread (plain
    ints under the GIL)."""

    __slots__ = ("running", "done", "sent", "received", "error")

    def __init__(self) -> None:
        self.running = False
        self.done = 0  # transactions
        self.sent = 0
        self.received = 0
        self.error: Optional[BaseException] = None


def _request_response(sock: socket.socket, request: bytes, counters: _Counters) -> None:
    """A client's round: one request outstanding, until told to stop."""
    size = len(request)
    sendall, recv = sock.sendall, sock.recv
    while counters.running:
        sendall(request)
        got = 0
        while got < size:
            chunk = recv(_RECV)
            if not chunk:
                raise ConnectionError("the server closed the connection mid-round")
            got += len(chunk)
        counters.done += 1


def _stream(sock: socket.socket, payload: bytes, counters: _Counters) -> None:
    """A client's round: write ``payload`` after ``payload`` until told to stop."""
    sendall = sock.sendall
    size = len(payload)
    while counters.running:
        sendall(payload)
        counters.sent += size


class BlockingWorkload(Workload):
    """One blocking client connection (``self.sock``), its rounds in a
    worker thread; the server on the loop (a protocol) or, for the
    ``threads`` cases, a blocking socket in a thread of its own."""

    def __init__(self, endpoint: Endpoint, size: int, stream: bool, threads: bool) -> None:
        super().__init__(endpoint, size)
        self.stream = stream
        self.threads = threads
        self.sock: Optional[socket.socket] = None
        self.counters = _Counters()
        self.listener: Optional[socket.socket] = None
        self.server_sock: Optional[socket.socket] = None
        self.server_thread: Optional[threading.Thread] = None
        self.server_counters = _Counters()  # the blocking server's bytes (threads cases)
        self._path: Optional[str] = None

    # -- setting up -------------------------------------------------------
    async def setup(self) -> None:
        self.payload = (b"x" if self.stream else b"q") * self.size
        before = friendsock.stats()
        if self.threads:
            await asyncio.to_thread(self._setup_threads)
            ends: List[Any] = [self.sock, self.server_sock]
        else:
            if self.stream:
                await self.serve(lambda: Sink(self.tally))
            else:
                await self.serve(lambda: Echo(self.size, self.payload, self.tally))
            # In a worker thread: a blocking connect must not hold up the
            # loop that accepts it.
            self.sock = await asyncio.to_thread(self._connect, self._address())
            await until(lambda: len(self.tally.ends) >= 1, "the server to accept")
            ends = [self.sock, self.tally.ends[0]]
        self.links_ok, self.links_note = links_verdict(self.transport, ends, before)

    def _address(self) -> Any:
        endpoint = self.endpoint
        return endpoint.path if self.transport == "unix" else (HOST, endpoint.port)

    def _new_socket(self) -> socket.socket:
        family = socket.AF_UNIX if self.transport == "unix" else socket.AF_INET
        return socket.socket(family, socket.SOCK_STREAM)

    def _connect(self, address: Any) -> socket.socket:
        with _sockets_for(self.transport):
            sock = self._new_socket()
            try:
                sock.connect(address)
                if self.transport != "unix":
                    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            except BaseException:
                sock.close()
                raise
        return sock

    def _setup_threads(self) -> None:
        with _sockets_for(self.transport):
            listener = self.listener = self._new_socket()
            if self.transport == "unix":
                self._path = self.endpoint.new_path()
                listener.bind(self._path)
                address: Any = self._path
            else:
                listener.bind((HOST, 0))
                address = listener.getsockname()
            listener.listen(8)
            # The connect pairs (or completes, over the kernel) before the accept.
            self.sock = self._connect(address)
            server, _ = listener.accept()
        self.server_sock = server
        if self.transport != "unix":
            server.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self._start_server_thread()

    def _start_server_thread(self) -> None:
        target = self._sink_forever if self.stream else self._echo_forever
        self.server_thread = threading.Thread(target=target, name="friendsock-bench-blocking",
                                              daemon=True)
        self.server_thread.start()

    # -- the blocking server (threads cases) ---------------------------------
    def _echo_forever(self) -> None:
        sock, counters = self.server_sock, self.server_counters
        assert sock is not None
        size, response = self.size, self.payload
        recv, sendall = sock.recv, sock.sendall
        got = 0
        try:
            while chunk := recv(_RECV):
                got += len(chunk)
                while got >= size:
                    got -= size
                    sendall(response)
        except OSError as exc:
            counters.error = exc

    def _sink_forever(self) -> None:
        sock, counters = self.server_sock, self.server_counters
        assert sock is not None
        recv = sock.recv
        try:
            while chunk := recv(_RECV):
                counters.received += len(chunk)
        except OSError as exc:
            counters.error = exc

    def _received(self) -> int:
        return self.server_counters.received if self.threads else self.tally.bytes

    # -- measuring ------------------------------------------------------------
    async def measure(self, seconds: float, warmup: float) -> Sample:
        sock, counters = self.sock, self.counters
        assert sock is not None
        work: Callable[[socket.socket, bytes, _Counters], None] = (
            _stream if self.stream else _request_response)
        counters.running = True
        worker = asyncio.ensure_future(asyncio.to_thread(work, sock, self.payload, counters))
        try:
            await asyncio.sleep(warmup)
            moved = friendsock.stats().bytes_moved
            done, received, start = counters.done, self._received(), time.perf_counter()
            await asyncio.wait({worker}, timeout=seconds)
            done, received = counters.done - done, self._received() - received
            elapsed = time.perf_counter() - start
        finally:
            counters.running = False
        await worker  # the transaction in progress, and its error if any
        if self.stream:
            # Let the receiver catch up: this round's bytes must not load
            # the next transport's round.
            await until(lambda: self._received() >= counters.sent or
                        self.server_counters.error is not None, "the receiver to catch up")
        if self.server_counters.error is not None:
            raise ConnectionError(f"the blocking server failed: {self.server_counters.error!r}")
        ok, note = moved_verdict(self.links_ok, self.links_note, moved)
        value = received * 8 / elapsed / 1e6 if self.stream else done / elapsed
        return Sample(value, ok, note)

    # -- closing ----------------------------------------------------------------
    async def close(self, abort: bool = False) -> None:
        sock, self.sock = self.sock, None
        _close_quietly(sock)
        if self.threads:
            thread = self.server_thread
            if thread is not None:
                await asyncio.to_thread(thread.join, _SETTLE_TIMEOUT)
            _close_quietly(self.server_sock)
            _close_quietly(self.listener)
            self.server_sock = self.listener = None
            if self._path is not None:
                with contextlib.suppress(OSError):
                    os.unlink(self._path)
        elif sock is not None:
            try:
                await until(lambda: self.tally.lost >= 1, "the connection to close",
                            timeout=2.0 if abort else _SETTLE_TIMEOUT)
            except TimeoutError:
                if not abort:
                    raise
        await super().close(abort)


# -- the floor ----------------------------------------------------------------


def _room() -> "queue.SimpleQueue[None]":
    """Room for _FLOOR_IN_FLIGHT sends: a token taken per send, given back
    per receive (C queues both: the cheapest wait between threads)."""
    room: "queue.SimpleQueue[None]" = queue.SimpleQueue()
    for _ in range(_FLOOR_IN_FLIGHT):
        room.put(None)
    return room


class _FloorEnd:
    """A thread's end of the floor: what it sends goes whole and in order to
    ``deliver`` (the other thread's queue, or the loop), once there is room;
    what it receives waits in its own queue. No buffers, no accounting, no
    copies: the bare hand-over."""

    def __init__(self) -> None:
        self.inbox: "queue.SimpleQueue[bytes]" = queue.SimpleQueue()
        self.room = _room()  # for sends to this end
        self.deliver: Callable[[bytes], None] = self.inbox.put
        self.peer_room = self.room

    def pair(self, other: "_FloorEnd") -> None:
        """Two threads' ends: each sends into the other's queue."""
        self.deliver, self.peer_room = other.inbox.put, other.room
        other.deliver, other.peer_room = self.inbox.put, self.room

    def sendall(self, data: bytes) -> None:
        self.peer_room.get()
        self.deliver(data)

    def recv(self, bufsize: int) -> bytes:
        data = self.inbox.get()
        self.room.put(None)
        return data

    def close(self) -> None:
        """The other end receives b"" (its end of stream), without waiting for room."""
        self.deliver(b"")


class _FloorLoopEnd(asyncio.Transport):
    """The loop's end of the floor, for a server protocol: a thread's sends
    arrive through ``call_soon_threadsafe``; what the protocol writes goes
    straight into the thread's queue."""

    def __init__(self, loop: asyncio.AbstractEventLoop, protocol: asyncio.Protocol,
                 client: _FloorEnd) -> None:
        super().__init__({"sockname": None, "peername": None, "socket": None})
        self._protocol = protocol
        self._client = client
        self._closing = False
        call_soon_threadsafe, arrive = loop.call_soon_threadsafe, self._arrive
        client.deliver = lambda data: call_soon_threadsafe(arrive, data)  # type: ignore[assignment]
        client.peer_room = _room()

    def _arrive(self, data: bytes) -> None:
        self._client.peer_room.put(None)
        if not data:  # the thread closed its end
            self.close()
        elif not self._closing:
            self._protocol.data_received(data)

    def write(self, data: Any) -> None:
        if not self._closing:
            self._client.inbox.put(bytes(data))

    def is_closing(self) -> bool:
        return self._closing

    def close(self) -> None:
        if not self._closing:
            self._closing = True
            self._client.inbox.put(b"")
            self._protocol.connection_lost(None)


class BlockingFloorWorkload(BlockingWorkload):
    """The floor of the blocking tables (the ``memory`` transport): the
    same rounds and the same server code, over the bare hand-over between
    threads (:class:`_FloorEnd`) instead of sockets — a client thread's
    sends reach the loop by ``call_soon_threadsafe`` and the answers come
    back through a ``queue.SimpleQueue``; between two threads, a
    SimpleQueue each way. What any in-process transport between threads
    pays at least: a thread that waits must be woken."""

    async def setup(self) -> None:
        self.payload = (b"x" if self.stream else b"q") * self.size
        client = _FloorEnd()
        if self.threads:
            server = _FloorEnd()
            client.pair(server)
            self.server_sock = server  # type: ignore[assignment]
            self._start_server_thread()
        else:
            protocol = Sink(self.tally) if self.stream else Echo(self.size, self.payload, self.tally)
            protocol.connection_made(_FloorLoopEnd(asyncio.get_running_loop(), protocol, client))
        self.sock = client  # type: ignore[assignment]

    async def close(self, abort: bool = False) -> None:
        client, self.sock = self.sock, None
        if client is None:
            return
        client.close()
        if self.threads:
            thread = self.server_thread
            if thread is not None:
                await asyncio.to_thread(thread.join, _SETTLE_TIMEOUT)
            self.server_sock = None
        else:
            await until(lambda: self.tally.lost >= 1, "the floor's server end to close",
                        timeout=2.0 if abort else _SETTLE_TIMEOUT)
