"""Two processes on one host, one connection between them, its bytes carried
by each candidate path, on asyncio and uvloop: which kernel path a pair
across processes should move a connection onto after its TCP handshake.

Paths (``--paths``):

- ``tcp``: real TCP over loopback, the baseline;
- ``socketpair``: an AF_UNIX ``socketpair()``, one end handed to the server
  process with SCM_RIGHTS, then spoken over the loop's own transport
  (``create_unix_connection(sock=)``, ``connect_accepted_socket``);
- ``shm``: a shared-memory byte ring per direction (one memfd mapped by
  both, handed over with SCM_RIGHTS), eventfd wake-ups sent only to a side
  that said it waits: ``RingTransport`` below, in Python;
- ``unix`` (only when asked for): an AF_UNIX stream socket connected the
  ordinary way, socketpair's kernel path.

Tests (``--tests``):

- ``rr``: 64 B round trips per second, one outstanding; the server's
  Protocol echoes in data_received, the client writes the next request on
  each response and checks it equals its request;
- ``stream``: 64 KiB writes one way, pause_writing/resume_writing honoured;
  the server counts bytes, the rate is its count over its clock between two
  marks. Timed rounds hash nothing (SHA-256 runs here at about the transfer's
  speed); after a cell's rounds each path carries 32 MiB hashed at both
  ends, wrapping the ring 32 times through full and empty;
- ``connect`` (once, blocking sockets): time until a new connection is
  usable at both ends (the server wrote a byte the client read): TCP
  loopback connect+accept against a socketpair end handed to the running
  server over a pre-established AF_UNIX rendezvous socket.

Any mismatch aborts with an error. A cell is a warm-up round per path, then
``--rounds`` rounds of ``--seconds``, the paths interleaved in each round so
that machine noise hits all alike; printed: the median, min-max (connect:
p10-p90), and the median over TCP's on the same loop (connect's is a time:
lower is better). Client and server each want a core; the load is printed.

    python benchmarks/cross_process_paths.py [--loops asyncio,uvloop]
        [--tests rr,stream,connect] [--paths tcp,socketpair,shm]
        [--seconds 0.5] [--rounds 5] [--connects 1000]
        [--ring-bytes 1048576] [--pair-sndbuf BYTES]

Linux, Python >= 3.10 (os.eventfd, socket.send_fds).

Measured with the defaults on a KVM guest with 2 vCPUs (x86-64, Linux 6.18,
CPython 3.11.7, uvloop 0.23.0), no other work running (load average 1.2-1.4,
this script's own two processes); three runs agreed within a few percent
but for the stream cells' min-max:

    loop     test     path              median                min-max  x TCP
    asyncio  rr       tcp            10,258 /s           9,791-10,360   1.00
    asyncio  rr       socketpair     12,227 /s          11,805-12,477   1.19
    asyncio  rr       shm            17,240 /s          17,149-17,583   1.68
    asyncio  stream   tcp           2,165 MB/s            1,789-3,162   1.00
    asyncio  stream   socketpair    5,725 MB/s            2,030-6,324   2.64
    asyncio  stream   shm          11,758 MB/s           9,547-11,906   5.43
    uvloop   rr       tcp            17,088 /s          16,833-17,249   1.00
    uvloop   rr       socketpair     20,128 /s          19,682-20,468   1.18
    uvloop   rr       shm            18,489 /s          18,411-18,869   1.08
    uvloop   stream   tcp           2,629 MB/s            2,169-2,743   1.00
    uvloop   stream   socketpair    6,764 MB/s            6,212-6,877   2.57
    uvloop   stream   shm          11,606 MB/s          11,480-11,688   4.41
    -        connect  tcp              73.8 us      p10-p90 72.4-78.8   1.00
    -        connect  socketpair       63.0 us      p10-p90 61.7-67.2   0.85

Every message wakes a halted vCPU here, which bounds rr. With the vCPUs kept
awake (other work, or busy loops at nice 19) rr rises 1.5-4x but comes out
bimodal round by round, and connect takes 48-52 us over TCP against 32-36 us
handed over. asyncio's socket transports on 3.11 read with recv(256 KiB),
which glibc serves with mmap, mremap and munmap each time: three system
calls a read, which the ring does not make; much of shm's lead on asyncio's
rr is that.
"""

from __future__ import annotations

import argparse
import asyncio
import hashlib
import json
import mmap
import multiprocessing
import os
import shutil
import socket
import statistics
import tempfile
import threading
import time
from contextlib import suppress
from typing import Any, Callable, Dict, List, Optional, Sequence, Tuple, Union

Message = Dict[str, Any]
Results = Dict[Tuple[str, str, str], List[float]]  # (loop, test, path): per round

HOST = "127.0.0.1"
RR_SIZE, CHUNK = 64, 64 * 1024
VERIFY_BYTES = 32 << 20
WARM_UP_SECONDS = 0.2
TIMEOUT = 30.0  # a lost wake-up fails the run instead of hanging it
RING_CAPACITY = 1 << 20  # the default; a power of two: a position is a counter masked
RING_HEADER = 4096  # a page of counters before each ring's bytes
HIGH_WATER, LOW_WATER = 64 * 1024, 16 * 1024  # asyncio's own defaults
# One delivery at most. 64 KiB, not a socket read's 256 KiB: glibc serves a
# 256 KiB bytes object by growing the heap and trims it on free, so each
# delivery faulted fresh pages in (a quarter of the throughput here).
READ_MAX = 64 * 1024
READ_BUDGET = 1 << 20  # delivered per loop turn before the loop's other work
# Indexes of a ring's 8-byte counters: HEAD, bytes ever written; TAIL, bytes
# ever read; each side's own counters on a cache line of their own.
HEAD, READER_WAITING, TAIL, WRITER_WAITING = 0, 1, 8, 9

# Memory ordering. Each process has its own GIL and runs on its own CPU, so
# only the hardware orders one process's stores against the other's loads.
# 1. Writer: the bytes, then HEAD (store-store). mmap slice assignment is a
#    memcpy; HEAD is then stored through a native "Q" memoryview cast, one
#    aligned 8-byte store, never seen half-written (struct.pack_into's "<Q"
#    may be eight byte stores). x86-64 does not reorder stores with stores.
# 2. Reader: HEAD, then the bytes (load-load); the bytes copied out before
#    TAIL is stored (load-store). x86-64 reorders neither.
# 3. Wake-ups: a side stores its WAITING flag, then loads the other side's
#    counter; the other stores that counter, then loads the flag (store-load,
#    Dekker's pattern). x86-64 does reorder those, so each has a full fence
#    between: threading.Lock's acquire and release (glibc's sem_wait and
#    sem_post) are LOCK-prefixed instructions, which drain the store buffer.
# That is adequate for this measurement on x86-64 (this machine). ARM reorders
# all of these and a lock's acquire/release is no store-load fence there: a
# production version needs atomics (release stores of HEAD and TAIL, acquire
# loads, sequentially consistent fences around the flags) from a small C
# helper, or a futex/eventfd handshake per batch, the kernel ordering it.
_fence_lock = threading.Lock()


def _full_fence() -> None:
    _fence_lock.acquire()
    _fence_lock.release()


class RingTransport(asyncio.Transport):
    """One end of a shared-memory connection: reads one ring, writes the other.
    A side about to sleep on its eventfd sets its WAITING flag in the ring; the
    other side signals that eventfd only when it finds the flag set."""

    def __init__(self, loop: asyncio.AbstractEventLoop, protocol: asyncio.Protocol,
                 shared: mmap.mmap, capacity: int, rx: Tuple[int, Sequence[int]],
                 tx: Tuple[int, Sequence[int]]):
        super().__init__()
        self._loop, self._protocol, self._shared = loop, protocol, shared
        self._capacity = capacity
        self._rx_counters = memoryview(shared)[rx[0]:rx[0] + 128].cast("Q")
        self._tx_counters = memoryview(shared)[tx[0]:tx[0] + 128].cast("Q")
        self._rx_base, self._tx_base = rx[0] + RING_HEADER, tx[0] + RING_HEADER
        self._rx_data_fd, self._rx_space_fd = rx[1]  # waits on data, signals space
        self._tx_data_fd, self._tx_space_fd = tx[1]  # signals data, waits on space
        self._pending = bytearray()  # written while the ring was full
        self._paused = self._closed = False
        loop.add_reader(self._rx_data_fd, self._on_data)
        loop.add_reader(self._tx_space_fd, self._on_space)
        protocol.connection_made(self)
        loop.call_soon(self._drain)  # bytes may be in the ring already

    def _on_data(self) -> None:
        with suppress(BlockingIOError):
            os.eventfd_read(self._rx_data_fd)
        self._drain()

    def _drain(self) -> None:
        counters, shared, base = self._rx_counters, self._shared, self._rx_base
        delivered = 0
        while not self._closed:
            tail = counters[TAIL]
            available = counters[HEAD] - tail
            if not available:
                counters[READER_WAITING] = 1
                _full_fence()
                if counters[HEAD] == tail:
                    return  # asleep: the writer's next HEAD store signals the eventfd
                counters[READER_WAITING] = 0
                continue
            if delivered >= READ_BUDGET:
                self._loop.call_soon(self._drain)
                return
            size = min(available, READ_MAX)
            start = tail & (self._capacity - 1)
            first = min(size, self._capacity - start)
            data = shared[base + start:base + start + first]
            if first < size:
                data += shared[base:base + size - first]
            counters[TAIL] = tail + size  # after the copy: the writer may reuse the space
            _full_fence()
            if counters[WRITER_WAITING]:
                counters[WRITER_WAITING] = 0
                os.eventfd_write(self._rx_space_fd, 1)
            delivered += size
            self._protocol.data_received(data)

    def _put(self, data: memoryview) -> int:
        """Copies what fits of data into the ring; returns how much did."""
        counters, shared, base = self._tx_counters, self._shared, self._tx_base
        head = counters[HEAD]
        size = min(len(data), self._capacity - (head - counters[TAIL]))
        if size <= 0:
            return 0
        start = head & (self._capacity - 1)
        first = min(size, self._capacity - start)
        shared[base + start:base + start + first] = data[:first]
        if first < size:
            shared[base:base + size - first] = data[first:size]
        counters[HEAD] = head + size  # after the bytes
        _full_fence()
        if counters[READER_WAITING]:
            counters[READER_WAITING] = 0
            os.eventfd_write(self._tx_data_fd, 1)
        return size

    def write(self, data: Union[bytes, bytearray, memoryview]) -> None:
        if self._pending:
            self._pending += data
        else:
            view = memoryview(data)
            written = self._put(view)
            if written == len(view):
                return
            self._pending += view[written:]
            self._wait_for_space()
        if not self._paused and len(self._pending) > HIGH_WATER:
            self._paused = True
            self._protocol.pause_writing()

    def _wait_for_space(self) -> None:
        counters = self._tx_counters
        counters[WRITER_WAITING] = 1
        _full_fence()
        if counters[HEAD] - counters[TAIL] < self._capacity:  # freed meanwhile
            counters[WRITER_WAITING] = 0
            self._loop.call_soon(self._on_space)

    def _on_space(self) -> None:
        with suppress(BlockingIOError):
            os.eventfd_read(self._tx_space_fd)
        if self._closed or not self._pending:
            return
        with memoryview(self._pending) as view:
            written = self._put(view)
        del self._pending[:written]
        if self._pending:
            self._wait_for_space()
        if self._paused and len(self._pending) <= LOW_WATER:
            self._paused = False
            self._protocol.resume_writing()

    def is_closing(self) -> bool:
        return self._closed

    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        self._loop.remove_reader(self._rx_data_fd)
        self._loop.remove_reader(self._tx_space_fd)
        for fd in (self._rx_data_fd, self._rx_space_fd, self._tx_data_fd, self._tx_space_fd):
            os.close(fd)
        self._rx_counters.release()
        self._tx_counters.release()
        self._shared.close()
        self._loop.call_soon(self._protocol.connection_lost, None)


def ring_fds(capacity: int) -> List[int]:
    """A memfd for two rings of ``capacity`` bytes each and their four
    eventfds: what the peer is sent."""
    memfd = os.memfd_create("rings", os.MFD_CLOEXEC)
    os.ftruncate(memfd, 2 * (RING_HEADER + capacity))
    return [memfd] + [os.eventfd(0, os.EFD_NONBLOCK | os.EFD_CLOEXEC) for _ in range(4)]


def ring_transport(loop: asyncio.AbstractEventLoop, protocol: asyncio.Protocol,
                   fds: Sequence[int], client: bool) -> RingTransport:
    size = os.fstat(fds[0]).st_size  # (the capacity the client chose)
    shared = mmap.mmap(fds[0], size)
    os.close(fds[0])  # the mapping keeps the memory
    span = size // 2
    to_server, to_client = (0, fds[1:3]), (span, fds[3:5])
    rx, tx = (to_client, to_server) if client else (to_server, to_client)
    return RingTransport(loop, protocol, shared, span - RING_HEADER, rx, tx)


def new_loop(name: str) -> asyncio.AbstractEventLoop:
    if name == "uvloop":
        import uvloop
        return uvloop.new_event_loop()
    return asyncio.new_event_loop()


def send_message(sock: socket.socket, message: Message, fds: Sequence[int] = ()) -> None:
    data = json.dumps(message).encode()
    if fds:
        socket.send_fds(sock, [data], list(fds))
    else:
        sock.send(data)


def checked(data: bytes) -> Message:
    reply: Message = json.loads(data)
    if "error" in reply:
        raise SystemExit(f"server: {reply['error']}")
    return reply


# The server process: an event loop serving the control socket's requests.

class Echo(asyncio.Protocol):
    def connection_made(self, transport: Any) -> None:
        self.write = transport.write

    def data_received(self, data: bytes) -> None:
        self.write(data)


class Counter(asyncio.Protocol):
    """Counts what arrives, hashes it while hasher is set, calls waiter at a total."""
    count = 0
    hasher: Optional[Any] = None
    waiter: Optional[Tuple[int, Callable[[], None]]] = None

    def data_received(self, data: bytes) -> None:
        self.count += len(data)
        if self.hasher is not None:
            self.hasher.update(data)
        if self.waiter is not None and self.count >= self.waiter[0]:
            self.waiter[1]()


class Server:
    def __init__(self, loop: asyncio.AbstractEventLoop, ctrl: socket.socket) -> None:
        self.loop, self.ctrl = loop, ctrl
        self.conns: Dict[str, Any] = {}
        self.done = loop.create_future()
        self.tmp = tempfile.mkdtemp()

    def reply(self, **fields: Any) -> None:
        send_message(self.ctrl, fields)

    def on_ctrl(self) -> None:
        try:
            data, fds, _, _ = socket.recv_fds(self.ctrl, 65536, 8)
        except BlockingIOError:
            return
        if data:
            self.loop.create_task(self.handle(json.loads(data), fds))
        elif not self.done.done():
            self.done.set_result(None)

    async def handle(self, message: Message, fds: List[int]) -> None:
        try:
            await getattr(self, "op_" + message["op"])(message, fds)
        except Exception as exc:  # the client raises it
            self.reply(error=repr(exc))

    async def op_open(self, message: Message, fds: List[int]) -> None:
        protocol = Echo() if message["test"] == "rr" else Counter()
        self.conns[message["id"]] = protocol
        path = message["path"]
        if path == "shm":
            ring_transport(self.loop, protocol, fds, client=False)
            return self.reply(ok=True)
        if path == "socketpair":
            sock = socket.socket(fileno=fds[0])
            self.reply(ok=True)
        else:
            listener = self.listener(path, message["id"])
            listener.setblocking(False)
            self.reply(address=listener.getsockname())
            sock, _ = await self.loop.sock_accept(listener)
            listener.close()
            if path == "tcp":
                sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        await self.loop.connect_accepted_socket(lambda: protocol, sock)

    def listener(self, path: str, name: str) -> socket.socket:
        if path == "tcp":
            return socket.create_server((HOST, 0), backlog=128)
        sock = socket.socket(socket.AF_UNIX)
        sock.bind(os.path.join(self.tmp, name))
        sock.listen(128)
        return sock

    async def op_mark(self, message: Message, fds: List[int]) -> None:
        self.reply(count=self.conns[message["id"]].count, time=time.perf_counter())

    async def op_hash(self, message: Message, fds: List[int]) -> None:
        self.conns[message["id"]].hasher = hashlib.sha256()
        self.reply(ok=True)

    async def op_wait(self, message: Message, fds: List[int]) -> None:
        counter: Counter = self.conns[message["id"]]

        def answer() -> None:
            digest = counter.hasher.hexdigest() if counter.hasher else None
            counter.waiter = counter.hasher = None
            self.reply(count=counter.count, digest=digest)

        counter.waiter = (message["total"], answer)
        if counter.count >= message["total"]:
            answer()

    async def op_connect(self, message: Message, fds: List[int]) -> None:
        """Blocking: serves the client's connects in its order, a byte on each."""
        rendezvous = socket.socket(fileno=fds[0])
        tcp, unix = self.listener("tcp", "tcp"), self.listener("unix", "connect")
        self.reply(tcp=tcp.getsockname(), unix=unix.getsockname())
        for _ in range(message["count"]):
            for kind in message["kinds"]:
                if kind == "socketpair":
                    sock = socket.socket(fileno=socket.recv_fds(rendezvous, 16, 1)[1][0])
                else:
                    sock = (tcp if kind == "tcp" else unix).accept()[0]
                sock.send(b"x")
                sock.close()
        for sock in (rendezvous, tcp, unix):
            sock.close()
        self.reply(ok=True)

    async def op_quit(self, message: Message, fds: List[int]) -> None:
        self.done.set_result(None)


def serve(ctrl: socket.socket, loop_name: str) -> None:
    loop = new_loop(loop_name)
    server = Server(loop, ctrl)
    ctrl.setblocking(False)
    loop.add_reader(ctrl.fileno(), server.on_ctrl)
    try:
        loop.run_until_complete(server.done)
    finally:
        shutil.rmtree(server.tmp)


# The client: this process.

class Control:
    """The client's end of the control socket, one request outstanding."""

    def __init__(self, loop: asyncio.AbstractEventLoop, sock: socket.socket) -> None:
        self.loop, self.sock = loop, sock

    async def call(self, message: Message, fds: Sequence[int] = ()) -> Message:
        send_message(self.sock, message, fds)
        return checked(await asyncio.wait_for(self.loop.sock_recv(self.sock, 65536), TIMEOUT))


class End(asyncio.Protocol):
    """The client's end of one connection, for one test over one path."""

    def __init__(self, loop: asyncio.AbstractEventLoop, ctrl: Control, name: str) -> None:
        self.loop, self.ctrl, self.name = loop, ctrl, name

    def connection_made(self, transport: Any) -> None:
        self.transport = transport

    async def round(self, seconds: float) -> float:
        raise NotImplementedError

    async def verify(self) -> None:
        pass


class RoundTrips(End):
    """rr: writes the next 64 B request on each response, checked equal to its
    request. Requests differ, so a stale or misplaced response shows."""
    requests = [os.urandom(RR_SIZE) for _ in range(1021)]
    expected = partial = b""
    count = 0
    running = False

    def data_received(self, data: bytes) -> None:
        if self.partial or len(data) != RR_SIZE:  # a response in pieces
            data = self.partial + data
            self.partial = data if len(data) < RR_SIZE else b""
            if self.partial:
                return
        if data != self.expected:
            self.running = False
            if not self.done.done():
                self.done.set_exception(SystemExit(f"rr: got {data!r}, sent {self.expected!r}"))
            return
        self.count += 1
        if self.running:
            self.expected = self.requests[self.count % 1021]
            self.transport.write(self.expected)
        else:
            self.done.set_result(time.perf_counter())

    def stop(self) -> None:
        self.running = False

    async def round(self, seconds: float) -> float:
        self.count, self.running = 0, True
        self.done: asyncio.Future[float] = self.loop.create_future()
        self.loop.call_later(seconds, self.stop)
        start = time.perf_counter()
        self.expected = self.requests[0]
        self.transport.write(self.expected)
        end: float = await asyncio.wait_for(self.done, seconds + TIMEOUT)
        return self.count / (end - start)


class Stream(End):
    """stream: writes 64 KiB chunks until sent reaches limit, pausing as told.
    17 distinct chunks, prime to the power of two a ring holds: stale bytes would differ."""
    chunks = [os.urandom(CHUNK) for _ in range(17)]
    index = sent = limit = 0
    paused = scheduled = False
    hasher: Optional[Any] = None

    def schedule(self) -> None:
        if not self.scheduled:
            self.scheduled = True
            self.loop.call_soon(self.pump)

    def pump(self) -> None:
        self.scheduled = False
        for _ in range(16):  # then the loop's other callbacks run
            if self.paused or self.sent >= self.limit:
                return
            chunk = self.chunks[self.index]
            self.index = (self.index + 1) % 17
            if self.hasher is not None:
                self.hasher.update(chunk)
            self.sent += CHUNK
            self.transport.write(chunk)
        self.schedule()

    def pause_writing(self) -> None:
        self.paused = True

    def resume_writing(self) -> None:
        self.paused = False
        self.schedule()

    async def settle(self) -> Message:
        """Waits until the server has all that is to be sent; checks the count."""
        reply = await self.ctrl.call({"op": "wait", "id": self.name, "total": self.limit})
        if reply["count"] != self.limit or self.sent != self.limit:
            raise SystemExit(f"stream {self.name}: server got {reply['count']} of {self.limit}")
        return reply

    async def round(self, seconds: float) -> float:
        first = await self.ctrl.call({"op": "mark", "id": self.name})
        self.limit = 1 << 62
        self.schedule()
        await asyncio.sleep(seconds)
        last = await self.ctrl.call({"op": "mark", "id": self.name})
        self.limit = self.sent
        await self.settle()
        rate: float = (last["count"] - first["count"]) / (last["time"] - first["time"])
        return rate

    async def verify(self) -> None:
        await self.ctrl.call({"op": "hash", "id": self.name})
        self.hasher = hashlib.sha256()
        self.limit = self.sent + VERIFY_BYTES
        self.schedule()
        if (await self.settle())["digest"] != self.hasher.hexdigest():
            raise SystemExit(f"stream {self.name}: SHA-256 of the bytes received differs")
        self.hasher = None


async def open_end(loop: asyncio.AbstractEventLoop, ctrl: Control, test: str, path: str,
                   args: argparse.Namespace) -> End:
    name = f"{test}-{path}"
    end = (RoundTrips if test == "rr" else Stream)(loop, ctrl, name)
    message = {"op": "open", "id": name, "test": test, "path": path}
    if path == "shm":
        fds = ring_fds(args.ring_bytes)
        await ctrl.call(message, fds)
        ring_transport(loop, end, fds, client=True)
        return end
    if path == "socketpair":
        sock, peer = socket.socketpair()
        if args.pair_sndbuf:  # (the kernel doubles what it is given)
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, args.pair_sndbuf // 2)
        await ctrl.call(message, [peer.fileno()])
        peer.close()
    else:
        address = (await ctrl.call(message))["address"]
        sock = socket.socket(socket.AF_INET if path == "tcp" else socket.AF_UNIX)
        sock.connect(tuple(address) if path == "tcp" else address)
    sock.setblocking(False)
    if path == "tcp":
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        await loop.create_connection(lambda: end, sock=sock)
    else:
        await loop.create_unix_connection(lambda: end, sock=sock)
    return end


async def measure(loop: asyncio.AbstractEventLoop, ctrl: Control, loop_name: str,
                  args: argparse.Namespace, results: Results) -> None:
    for test in args.tests:
        if test == "connect":
            continue
        ends = {path: await open_end(loop, ctrl, test, path, args) for path in args.paths}
        for end in ends.values():
            await end.round(WARM_UP_SECONDS)
        for _ in range(args.rounds):
            for path, end in ends.items():  # interleaved, round by round
                rate = await end.round(args.seconds)
                results.setdefault((loop_name, test, path), []).append(rate)
        for end in ends.values():
            await end.verify()
            end.transport.close()


def measure_connects(ctrl: socket.socket, args: argparse.Namespace, results: Results) -> None:
    kinds = [path for path in args.paths if path != "shm"]
    count = 100 + args.connects  # the first 100 of each are warm-up
    rendezvous, peer = socket.socketpair()
    send_message(ctrl, {"op": "connect", "count": count, "kinds": kinds}, [peer.fileno()])
    peer.close()
    addresses = checked(ctrl.recv(65536))
    for index in range(count):
        for kind in kinds:
            start = time.perf_counter()
            if kind == "socketpair":
                sock, peer = socket.socketpair()
                socket.send_fds(rendezvous, [b"c"], [peer.fileno()])
                peer.close()
            else:
                sock = socket.socket(socket.AF_INET if kind == "tcp" else socket.AF_UNIX)
                sock.connect(tuple(addresses["tcp"]) if kind == "tcp" else addresses["unix"])
            if sock.recv(1) != b"x":
                raise SystemExit(f"connect {kind}: no byte from the server")
            elapsed = time.perf_counter() - start
            sock.close()
            if index >= 100:
                results.setdefault(("-", "connect", kind), []).append(elapsed)
    checked(ctrl.recv(65536))
    rendezvous.close()


def run_server(loop_name: str, args: argparse.Namespace, results: Results) -> None:
    """One server process on loop_name, for the connect test or every other one."""
    ctrl, server_end = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    process = multiprocessing.get_context("spawn").Process(
        target=serve, args=(server_end, loop_name), daemon=True)
    process.start()
    server_end.close()
    try:
        if loop_name == "-":
            measure_connects(ctrl, args, results)
        else:
            loop = new_loop(loop_name)
            ctrl.setblocking(False)
            try:
                control = Control(loop, ctrl)
                loop.run_until_complete(measure(loop, control, loop_name, args, results))
            finally:
                loop.close()
        send_message(ctrl, {"op": "quit"})
        process.join(TIMEOUT)
    finally:
        if process.is_alive():
            process.terminate()
        ctrl.close()


def print_table(results: Results) -> None:
    print(f"{'loop':8s} {'test':8s} {'path':11s} {'median':>12s} {'min-max':>22s} {'x TCP':>6s}")
    units = {"rr": (1.0, "/s", "{:,.0f}"), "stream": (1e-6, "MB/s", "{:,.0f}"),
             "connect": (1e6, "us", "{:.1f}")}
    for (loop_name, test, path), values in results.items():
        scale, unit, form = units[test]
        median = statistics.median(values)
        tcp = statistics.median(results.get((loop_name, test, "tcp"), [float("nan")]))
        ends = [min(values), max(values)]
        if test == "connect":
            ends = statistics.quantiles(values, n=10)[::8]
        spread = ("p10-p90 " if test == "connect" else "") + "-".join(
            form.format(value * scale) for value in ends)
        cell = f"{form.format(median * scale)} {unit}"
        print(f"{loop_name:8s} {test:8s} {path:11s} {cell:>12s} {spread:>22s} {median / tcp:6.2f}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--loops", default="asyncio,uvloop")
    parser.add_argument("--tests", default="rr,stream,connect")
    parser.add_argument("--paths", default="tcp,socketpair,shm", help="of tcp,socketpair,shm,unix")
    parser.add_argument("--seconds", type=float, default=0.5, help="per round")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--connects", type=int, default=1000, help="connects per path (median)")
    parser.add_argument("--ring-bytes", type=int, default=RING_CAPACITY,
                        help="each shm ring's size, a power of two")
    parser.add_argument("--pair-sndbuf", type=int, default=0,
                        help="the client's socketpair end's SO_SNDBUF as read back (default: the kernel's)")
    args = parser.parse_args()
    for option in ("loops", "tests", "paths"):
        setattr(args, option, getattr(args, option).split(","))
    if args.ring_bytes < 4096 or args.ring_bytes & (args.ring_bytes - 1):
        parser.error("--ring-bytes: a power of two of at least 4096")
    print("load average at start: {:.2f} {:.2f} {:.2f}".format(*os.getloadavg()))
    results: Results = {}
    for loop_name in args.loops:
        if set(args.tests) - {"connect"}:
            run_server(loop_name, args, results)
    if "connect" in args.tests:
        run_server("-", args, results)
    print("load average at end:   {:.2f} {:.2f} {:.2f}".format(*os.getloadavg()))
    print_table(results)


if __name__ == "__main__":
    main()
