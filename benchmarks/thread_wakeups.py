"""What one round trip between two Python threads costs, by how the waiting
thread is woken: a loopback TCP connection, an AF_UNIX socket pair, an
eventfd, a pipe, a queue.SimpleQueue. One byte each way, one outstanding.

Any in-process transport between two threads pays at least one of these
per message (the thread that waits must be woken), so the ratios here bound
what the benchmark's blocking-threads-rr can show against TCP.

``--python N``: each thread runs N steps of a Python loop between waking
the other and going to sleep itself, as a transport written in Python does
(a friend socket's sendall returns, its recv looks at the link, then
sleeps). The woken thread then wakes to a GIL its waker still holds, and
waits for it: what that costs a round trip, beyond the steps themselves.

    python benchmarks/thread_wakeups.py [--count 30000] [--rounds 5] [--python N]
"""

from __future__ import annotations

import argparse
import os
import queue
import socket
import statistics
import threading
import time
from typing import Callable, Dict, List, Tuple

Step = Callable[[], object]


_python_steps = 0  # --python


def _steps(count: int) -> int:
    total = 0
    for step in range(count):
        total += step
    return total


def _round_trips(count: int, send_a: Step, recv_a: Step, send_b: Step, recv_b: Step) -> float:
    steps = _python_steps

    def echo() -> None:
        for _ in range(count):
            recv_b()
            send_b()
            _steps(steps)

    thread = threading.Thread(target=echo)
    thread.start()
    start = time.perf_counter()
    for _ in range(count):
        send_a()
        _steps(steps)
        recv_a()
    elapsed = time.perf_counter() - start
    thread.join()
    return count / elapsed


def _sockets(a: socket.socket, b: socket.socket) -> Tuple[Step, Step, Step, Step]:
    return (lambda: a.send(b"q"), lambda: a.recv(64), lambda: b.send(b"q"), lambda: b.recv(64))


def tcp(count: int) -> float:
    with socket.create_server(("127.0.0.1", 0)) as listener:
        a = socket.create_connection(listener.getsockname())
        b, _ = listener.accept()
    with a, b:
        for sock in (a, b):
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        return _round_trips(count, *_sockets(a, b))


def unix(count: int) -> float:
    a, b = socket.socketpair()
    with a, b:
        return _round_trips(count, *_sockets(a, b))


def eventfd(count: int) -> float:
    a, b = os.eventfd(0), os.eventfd(0)
    try:
        return _round_trips(count, lambda: os.eventfd_write(b, 1), lambda: os.eventfd_read(a),
                            lambda: os.eventfd_write(a, 1), lambda: os.eventfd_read(b))
    finally:
        os.close(a)
        os.close(b)


def pipe(count: int) -> float:
    a_read, a_write = os.pipe()
    b_read, b_write = os.pipe()
    try:
        return _round_trips(count, lambda: os.write(b_write, b"q"), lambda: os.read(a_read, 64),
                            lambda: os.write(a_write, b"q"), lambda: os.read(b_read, 64))
    finally:
        for fd in (a_read, a_write, b_read, b_write):
            os.close(fd)


def simple_queue(count: int) -> float:
    a: "queue.SimpleQueue[int]" = queue.SimpleQueue()
    b: "queue.SimpleQueue[int]" = queue.SimpleQueue()
    return _round_trips(count, lambda: b.put(1), a.get, lambda: a.put(1), b.get)


WAYS = {"TCP (loopback)": tcp, "AF_UNIX socket pair": unix, "eventfd": eventfd, "pipe": pipe,
        "queue.SimpleQueue": simple_queue}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--count", type=int, default=30000, help="round trips per measurement")
    parser.add_argument("--rounds", type=int, default=5, help="measurements per way (median)")
    parser.add_argument("--python", type=int, default=0, metavar="N",
                        help="steps of a Python loop each thread runs between waking the other "
                             "and sleeping")
    args = parser.parse_args()
    global _python_steps
    _python_steps = args.python
    if args.python:
        start = time.perf_counter()
        for _ in range(1000):
            _steps(args.python)
        print(f"{args.python} Python steps: {(time.perf_counter() - start) * 1000:.2f} us "
              f"(run twice a round trip, once by each thread)")
    results: Dict[str, List[float]] = {}
    for _ in range(args.rounds):  # interleaved: a noisy machine hits every way alike
        for name, way in WAYS.items():
            results.setdefault(name, []).append(way(args.count))
    tcp_median = statistics.median(results["TCP (loopback)"])
    print(f"{'woken by':22s} {'round trips/s':>14s} {'us each':>8s} {'x TCP':>6s}")
    for name, values in results.items():
        median = statistics.median(values)
        print(f"{name:22s} {median:14,.0f} {1e6 / median:8.1f} {median / tcp_median:6.2f}")


if __name__ == "__main__":
    main()
