"""A blocking server and a blocking client in two processes (``socketserver``
and ``socket.create_connection``, as threaded services and their sync
clients are), the paths interleaved in each round.

Paths (three servers of one server process, under ``patch_socket()``):

- ``tcp``: a server on a socket of the stdlib's own class: plain TCP;
- ``unix``: an AF_UNIX stream server, the same handler;
- ``friends``: a server on a socket of the patched class, whose
  connections from the client (patched too) move onto a socketpair.

Tests:

- ``rr``: 64 B request/response round trips per second on one connection;
- ``crr``: connect, 64 B request and response, close, per second.

A cell is a warm-up round, then ``--rounds`` rounds of ``--seconds`` per
path; printed: the median, min-max, and the median over TCP's.

    python benchmarks/cross_process_blocking.py [--tests rr,crr] [--seconds 0.5] [--rounds 5]
"""

from __future__ import annotations

import argparse
import os
import socket
import socketserver
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from typing import Any, Callable, Dict, List

import friendsock
from friendsock._blocking._descriptor import OriginalSocket

PATHS = ("tcp", "unix", "friends")
MESSAGE = b"m" * 64


class _Echo(socketserver.BaseRequestHandler):
    def handle(self) -> None:
        sock = self.request
        while data := sock.recv(1 << 16):
            sock.sendall(data)


class _PlainTCPServer(socketserver.ThreadingTCPServer):
    """Its listening socket of the stdlib's class: friendsock never sees it."""

    daemon_threads = True

    def __init__(self, address: Any) -> None:
        socketserver.BaseServer.__init__(self, address, _Echo)
        self.socket = OriginalSocket(socket.AF_INET, socket.SOCK_STREAM)
        self.server_bind()
        self.server_activate()


def serve() -> None:
    """The server process: prints the tcp port, the friends port and the
    unix path; serves until its standard input closes."""
    friendsock.patch_socket()
    socketserver.ThreadingTCPServer.daemon_threads = True
    socketserver.ThreadingUnixStreamServer.daemon_threads = True
    path = os.path.join(tempfile.mkdtemp(), "echo.sock")
    servers = [_PlainTCPServer(("127.0.0.1", 0)),
               socketserver.ThreadingTCPServer(("127.0.0.1", 0), _Echo),
               socketserver.ThreadingUnixStreamServer(path, _Echo)]
    for server in servers:
        threading.Thread(target=server.serve_forever, daemon=True).start()
    print(servers[0].server_address[1], servers[1].server_address[1], path, flush=True)
    sys.stdin.read()


def _connect(address: Any) -> socket.socket:
    if isinstance(address, str):
        sock = socket.socket(socket.AF_UNIX)
        sock.connect(address)
        return sock
    sock = socket.create_connection(address)
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    return sock


def _exchange(sock: socket.socket) -> None:
    sock.sendall(MESSAGE)
    got = 0
    while got < len(MESSAGE):
        got += len(sock.recv(len(MESSAGE) - got))


def rr(address: Any, seconds: float) -> float:
    with _connect(address) as sock:
        count, deadline = 0, time.perf_counter() + seconds
        start = time.perf_counter()
        while time.perf_counter() < deadline:
            _exchange(sock)
            count += 1
        return count / (time.perf_counter() - start)


def crr(address: Any, seconds: float) -> float:
    count, deadline = 0, time.perf_counter() + seconds
    start = time.perf_counter()
    while time.perf_counter() < deadline:
        with _connect(address) as sock:
            _exchange(sock)
        count += 1
    return count / (time.perf_counter() - start)


TESTS: Dict[str, Callable[[Any, float], float]] = {"rr": rr, "crr": crr}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--tests", default="rr,crr")
    parser.add_argument("--seconds", type=float, default=0.5)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--serve", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.serve:
        serve()
        return
    server = subprocess.Popen([sys.executable, __file__, "--serve"], stdin=subprocess.PIPE,
                              stdout=subprocess.PIPE, text=True)
    try:
        assert server.stdout is not None
        tcp_port, friends_port, unix_path = server.stdout.readline().split()
        friendsock.patch_socket()
        addresses = {"tcp": ("127.0.0.1", int(tcp_port)), "unix": unix_path,
                     "friends": ("127.0.0.1", int(friends_port))}
        with _connect(addresses["friends"]) as first:  # (its accept publishes the port)
            _exchange(first)
        with _connect(addresses["friends"]) as sock:
            assert friendsock.is_friend(sock), "the friends path did not move off TCP"
        print(f"{'test':<6} {'path':<8} {'median':>12} {'min-max':>22} {'x TCP':>7}")
        for name in args.tests.split(","):
            test = TESTS[name]
            rates: Dict[str, List[float]] = {path: [] for path in PATHS}
            for path in PATHS:  # warm-up
                test(addresses[path], args.seconds)
            for _ in range(args.rounds):
                for path in PATHS:
                    rates[path].append(test(addresses[path], args.seconds))
            tcp = statistics.median(rates["tcp"])
            for path in PATHS:
                median = statistics.median(rates[path])
                spread = f"{min(rates[path]):,.0f}-{max(rates[path]):,.0f}"
                print(f"{name:<6} {path:<8} {median:>10,.0f}/s {spread:>22} {median / tcp:>6.2f}x")
    finally:
        assert server.stdin is not None
        server.stdin.close()
        server.wait(10)


if __name__ == "__main__":
    main()
