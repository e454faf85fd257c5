"""CPU time per connect/request/response/close for unchanged trio code and
anyio on trio, over real TCP and with ``friendsock.trio.install()``: a
client connects (``trio.open_tcp_stream``, or ``anyio.connect_tcp``), writes
64 B, reads the 64 B answer and closes, N times in a row, to a server of the
same run (``trio.serve_tcp``, or an anyio listener). CPU time, not wall
time; TCP and friends alternate in one process, round by round, so load on
the machine moves both alike. With friendsock, each connect after the first
goes over the connection the one before left (a reused connection, see the
README).

    python benchmarks/trio_crr_cpu.py --api trio --rounds 7
"""

from __future__ import annotations

import argparse
import functools
import statistics
import time
from typing import Awaitable, Callable, Dict, List

import anyio
import anyio.abc
import trio

import friendsock
import friendsock.trio

SIZE = 64


async def _trio_round(count: int) -> float:
    async def handler(stream: trio.SocketStream) -> None:
        async with stream:
            await stream.send_all(await stream.receive_some(SIZE))

    async with trio.open_nursery() as nursery:
        listeners = await nursery.start(functools.partial(trio.serve_tcp, handler, 0, host="127.0.0.1"))
        port = listeners[0].socket.getsockname()[1]

        async def one() -> None:
            stream = await trio.open_tcp_stream("127.0.0.1", port)
            async with stream:
                await stream.send_all(b"x" * SIZE)
                await stream.receive_some(SIZE)

        elapsed = await _timed(one, count)
        nursery.cancel_scope.cancel()
    return elapsed


async def _anyio_round(count: int) -> float:
    async def handler(stream: anyio.abc.SocketStream) -> None:
        async with stream:
            await stream.send(await stream.receive(SIZE))

    listener = await anyio.create_tcp_listener(local_host="127.0.0.1")
    port = listener.extra(anyio.abc.SocketAttribute.local_port)
    async with listener, anyio.create_task_group() as tasks:
        tasks.start_soon(listener.serve, handler)

        async def one() -> None:
            stream = await anyio.connect_tcp("127.0.0.1", port)
            async with stream:
                await stream.send(b"x" * SIZE)
                await stream.receive(SIZE)

        elapsed = await _timed(one, count)
        tasks.cancel_scope.cancel()
    return elapsed


async def _timed(one: Callable[[], Awaitable[None]], count: int) -> float:
    for _ in range(count // 10):  # warm-up (and, with friends, a connection to reuse)
        await one()
    start = time.process_time()
    for _ in range(count):
        await one()
    return (time.process_time() - start) / count


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--api", choices=("trio", "anyio"), default="trio")
    parser.add_argument("--count", type=int, default=2000, help="connections per round")
    parser.add_argument("--rounds", type=int, default=5, help="rounds per transport (median)")
    args = parser.parse_args()
    round_ = _trio_round if args.api == "trio" else _anyio_round
    samples: Dict[str, List[float]] = {"tcp": [], "friends": []}
    for number in range(args.rounds):
        for mode in (("tcp", "friends") if number % 2 == 0 else ("friends", "tcp")):
            if mode == "friends":
                friendsock.trio.install()
            try:
                samples[mode].append(trio.run(round_, args.count))
            finally:
                if mode == "friends":
                    friendsock.trio.uninstall()
    median = {mode: statistics.median(values) * 1e6 for mode, values in samples.items()}
    for mode, values in samples.items():
        spread = ", ".join(f"{value * 1e6:.0f}" for value in sorted(values))
        print(f"{args.api:6} {mode:8} {median[mode]:7.1f} µs CPU per connection  (rounds: {spread})")
    print(f"{args.api:6} friends: {median['tcp'] / median['friends']:.2f}x TCP; "
          f"links made: {friendsock.stats().links_made}")


if __name__ == "__main__":
    main()
