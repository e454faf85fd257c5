"""Two processes on one host, as local services run: a client process and a
server process, the client's connections carried by each path, on asyncio
and uvloop, the paths interleaved in each round.

Paths:

- ``tcp``: the server's loop's own TCP server (friendsock not asked);
- ``unix``: an AF_UNIX stream server, the same protocol;
- ``friends``: ``friendsock.start_server`` in the server process and
  ``friendsock.create_connection`` in the client: the TCP handshake, then
  the bytes over a socketpair between the two;
- ``in-process``: friendsock's in-process link (a friendsock server in the
  client's own process), for reference;
- ``tcp-via-friendsock`` (only when asked for): friendsock's
  ``create_connection`` to the plain TCP server, which runs no friendsock:
  what friendsock costs a connection to such a process.

Tests:

- ``rr``: 64 B request/response round trips per second, one outstanding;
- ``stream``: 64 KiB writes one way, flow control honoured, for
  ``--seconds``; the rate is the server's count of bytes received (sent
  back at EOF) over the client's clock;
- ``agg``: 64 B round trips per second in all over 64 connections open
  at once, one outstanding on each (the one client process's loop
  driving them all, as a service's pool of kept connections does);
- ``crr``: connect, 64 B request and response, close, per second. Last:
  after a run of such short connections, a client connects to that
  server over TCP at once (their move does not pay), so a pool opened
  after them would stay on TCP (``friendsock._host._payoff``).

A cell is a warm-up round, then ``--rounds`` rounds of ``--seconds`` per
path; printed: the median, min-max, and the median over TCP's.

    python benchmarks/cross_process.py [--loops asyncio,uvloop]
        [--tests rr,stream,agg,crr] [--paths tcp,unix,friends,in-process[,tcp-via-friendsock]]
        [--seconds 0.5] [--rounds 5] [--json FILE]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import socket
import statistics
import struct
import subprocess
import sys
import tempfile
import time
from typing import Any, Callable, Dict, List, Optional, Tuple

import friendsock

PATHS = ("tcp", "unix", "friends", "in-process")  # (and, when asked for, tcp-via-friendsock)
TESTS = ("rr", "stream", "agg", "crr")
AGG_CONNECTIONS = 64
_COUNT = struct.Struct("!Q")
MESSAGE = b"m" * 64
CHUNK = b"s" * (1 << 16)


# -- the server -------------------------------------------------------------


class Serve(asyncio.Protocol):
    """The first byte says what the connection is: ``e``, echo; ``s``, count
    what comes until EOF and answer with the count."""

    def __init__(self) -> None:
        self.transport: Any = None
        self.mode: Optional[bytes] = None
        self.count = 0

    def connection_made(self, transport: Any) -> None:
        self.transport = transport

    def data_received(self, data: bytes) -> None:
        if self.mode is None:
            self.mode, data = data[:1], data[1:]
        if self.mode == b"e":
            if data:
                self.transport.write(data)
        else:
            self.count += len(data)

    def eof_received(self) -> bool:
        if self.mode == b"s":
            self.transport.write(_COUNT.pack(self.count))
        self.transport.close()
        return True


async def _servers(loop: asyncio.AbstractEventLoop, unix_path: str) -> List[Any]:
    tcp = await loop.create_server(Serve, "127.0.0.1", 0)
    unix = await loop.create_unix_server(Serve, unix_path)
    friends = await friendsock.create_server(Serve, "127.0.0.1", 0)
    return [tcp, unix, friends]


async def serve(unix_path: str) -> None:
    loop = asyncio.get_running_loop()
    tcp, unix, friends = await _servers(loop, unix_path)
    print(json.dumps({"tcp": tcp.sockets[0].getsockname()[1],
                      "friends": friends.sockets[0].getsockname()[1]}), flush=True)
    await loop.run_in_executor(None, sys.stdin.read)


# -- the client -------------------------------------------------------------


class Client(asyncio.Protocol):
    def __init__(self) -> None:
        self.transport: Any = None
        self.waiter: Optional[asyncio.Future] = None
        self.expected = 0
        self.got = bytearray()
        self.paused: Optional[asyncio.Future] = None

    def connection_made(self, transport: Any) -> None:
        self.transport = transport

    def data_received(self, data: bytes) -> None:
        self.got += data
        if self.waiter is not None and len(self.got) >= self.expected and not self.waiter.done():
            self.waiter.set_result(None)

    def eof_received(self) -> None:
        if self.waiter is not None and not self.waiter.done():
            self.waiter.set_result(None)

    def pause_writing(self) -> None:
        self.paused = asyncio.get_running_loop().create_future()

    def resume_writing(self) -> None:
        if self.paused is not None:
            self.paused.set_result(None)
            self.paused = None

    async def read(self, size: int) -> bytes:
        self.expected = size
        if len(self.got) < size:
            self.waiter = asyncio.get_running_loop().create_future()
            await self.waiter
        data, self.got = bytes(self.got[:size]), self.got[size:]
        if len(data) != size:
            raise ConnectionError(f"short read: {len(data)} of {size}")
        return data


Connect = Callable[[], "asyncio.Future[Tuple[Any, Client]]"]


async def rr(connect: Connect, seconds: float) -> float:
    transport, client = await connect()
    transport.write(b"e")
    done = 0
    end = time.perf_counter() + seconds
    start = time.perf_counter()
    while time.perf_counter() < end:
        transport.write(MESSAGE)
        if await client.read(64) != MESSAGE:
            raise AssertionError("rr: the response differs from the request")
        done += 1
    elapsed = time.perf_counter() - start
    transport.close()
    return done / elapsed


async def stream(connect: Connect, seconds: float) -> float:
    transport, client = await connect()
    transport.write(b"s")
    start = time.perf_counter()
    end = start + seconds
    sent = 0
    while time.perf_counter() < end:
        transport.write(CHUNK)
        sent += len(CHUNK)
        if client.paused is not None:
            await client.paused
    transport.write_eof()
    count = _COUNT.unpack(await client.read(_COUNT.size))[0]
    elapsed = time.perf_counter() - start
    transport.close()
    if count != sent:
        raise AssertionError(f"stream: {sent} sent, {count} counted")
    return count / elapsed / 1e6


async def crr(connect: Connect, seconds: float) -> float:
    done = 0
    start = time.perf_counter()
    end = start + seconds
    while time.perf_counter() < end:
        transport, client = await connect()
        transport.write(b"e" + MESSAGE)
        if await client.read(64) != MESSAGE:
            raise AssertionError("crr: the response differs from the request")
        transport.close()
        done += 1
    return done / (time.perf_counter() - start)


async def agg(connect: Connect, seconds: float) -> float:
    opened = [await connect() for _ in range(AGG_CONNECTIONS)]
    for transport, _ in opened:
        transport.write(b"e")
    end = time.perf_counter() + seconds

    async def round_trips(transport: Any, client: Client) -> int:
        done = 0
        while time.perf_counter() < end:
            transport.write(MESSAGE)
            if await client.read(64) != MESSAGE:
                raise AssertionError("agg: the response differs from the request")
            done += 1
        return done

    start = time.perf_counter()
    counts = await asyncio.gather(*(round_trips(t, c) for t, c in opened))
    elapsed = time.perf_counter() - start
    for transport, _ in opened:
        transport.close()
    return sum(counts) / elapsed


UNITS = {"rr": "/s", "stream": "MB/s", "crr": "/s", "agg": "/s"}


async def measure(tests: List[str], paths: List[str], seconds: float, rounds: int,
                  unix_path: str, ports: Dict[str, int]) -> Dict[str, Dict[str, List[float]]]:
    loop = asyncio.get_running_loop()
    own = await friendsock.create_server(Serve, "127.0.0.1", 0)
    own_port = own.sockets[0].getsockname()[1]
    connects: Dict[str, Connect] = {
        "tcp": lambda: loop.create_connection(Client, "127.0.0.1", ports["tcp"]),
        "unix": lambda: loop.create_unix_connection(Client, unix_path),
        "friends": lambda: friendsock.create_connection(Client, "127.0.0.1", ports["friends"]),
        "in-process": lambda: friendsock.create_connection(Client, "127.0.0.1", own_port),
        "tcp-via-friendsock": lambda: friendsock.create_connection(Client, "127.0.0.1", ports["tcp"]),
    }
    runs = {"rr": rr, "stream": stream, "crr": crr, "agg": agg}
    results: Dict[str, Dict[str, List[float]]] = {}
    for test in tests:
        cell = results[test] = {path: [] for path in paths}
        for round_ in range(rounds + 1):
            for path in paths:
                value = await runs[test](connects[path], seconds)
                if round_:
                    cell[path].append(value)
        await asyncio.sleep(0.2)  # let closed connections finish
    own.close()
    return results


def run_loop(loop_name: str, tests: List[str], paths: List[str], seconds: float,
             rounds: int) -> Dict[str, Any]:
    with tempfile.TemporaryDirectory() as directory:
        unix_path = os.path.join(directory, "server.sock")
        server = subprocess.Popen([sys.executable, __file__, "--serve", loop_name, unix_path],
                                  stdin=subprocess.PIPE, stdout=subprocess.PIPE)
        try:
            assert server.stdout is not None
            ports = json.loads(server.stdout.readline())
            runner = _runner(loop_name)
            return runner(measure(tests, paths, seconds, rounds, unix_path, ports))
        finally:
            assert server.stdin is not None
            server.stdin.close()
            server.wait(10)


def _runner(loop_name: str) -> Callable[[Any], Any]:
    if loop_name == "uvloop":
        import uvloop

        return lambda coro: uvloop.run(coro) if hasattr(uvloop, "run") else asyncio.run(coro)
    return asyncio.run


def _use_loop(loop_name: str) -> None:
    if loop_name == "uvloop":
        import uvloop

        asyncio.set_event_loop_policy(uvloop.EventLoopPolicy())
    else:
        asyncio.set_event_loop_policy(None)  # (the loop before may have been uvloop's)


def main() -> None:
    if sys.argv[1:2] == ["--serve"]:
        _use_loop(sys.argv[2])
        asyncio.run(serve(sys.argv[3]))
        return
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--loops", default="asyncio,uvloop")
    parser.add_argument("--tests", default=",".join(TESTS))
    parser.add_argument("--paths", default=",".join(PATHS))
    parser.add_argument("--seconds", type=float, default=0.5)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--json", help="write the rounds' values here too")
    args = parser.parse_args()
    tests = [t for t in args.tests.split(",") if t]
    paths = [p for p in args.paths.split(",") if p]
    everything = {}
    print(f"{'loop':8} {'test':7} {'path':11} {'median':>16} {'min-max':>22} {'x TCP':>6}")
    for loop_name in args.loops.split(","):
        _use_loop(loop_name)
        results = run_loop(loop_name, tests, paths, args.seconds, args.rounds)
        everything[loop_name] = results
        for test in tests:
            base = statistics.median(results[test]["tcp"]) if "tcp" in paths else float("nan")
            for path in paths:
                values = results[test][path]
                median = statistics.median(values)
                unit = UNITS[test]
                print(f"{loop_name:8} {test:7} {path:11} {median:>11,.0f} {unit:4} "
                      f"{min(values):>10,.0f}-{max(values):<10,.0f} {median / base:>6.2f}")
    if args.json:
        with open(args.json, "w") as out:
            json.dump(everything, out, indent=1)


if __name__ == "__main__":
    main()
