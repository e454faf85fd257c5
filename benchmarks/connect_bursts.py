"""Connection bursts: N clients connect at once to one server (listen
backlog 100), each echoes 8 bytes of its own, and the time until all are
done is printed, friends vs real TCP, on asyncio, uvloop and trio. Then
``--held`` connections are opened one after another and kept (a pool
warming up).

    python benchmarks/connect_bursts.py [--count 2000] [--held 300]

A client that never completes counts as not done after ``--limit`` seconds.
"""

from __future__ import annotations

import argparse
import asyncio
import functools
import time
from typing import Callable, Tuple

import trio
import uvloop

import friendsock
import friendsock.trio as fst

Result = Tuple[int, float, float]  # echoes done, burst seconds, held seconds


async def _asyncio_burst(count: int, held: int, friends: bool, limit: float) -> Result:
    handlers = set()

    async def handler(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        handlers.add(asyncio.current_task())
        try:
            writer.write(await reader.readexactly(8))
            await writer.drain()
        except asyncio.IncompleteReadError:
            pass
        finally:
            writer.close()

    server = await friendsock.start_server(handler, "127.0.0.1", 0, backlog=100, friends=friends)
    port = server.sockets[0].getsockname()[1]

    async def echo(number: int) -> None:
        reader, writer = await friendsock.open_connection("127.0.0.1", port, friends=friends)
        payload = number.to_bytes(8, "big")
        writer.write(payload)
        assert await reader.readexactly(8) == payload
        writer.close()

    start = time.perf_counter()
    tasks = [asyncio.ensure_future(echo(n)) for n in range(count)]
    done, pending = await asyncio.wait(tasks, timeout=limit)
    burst = time.perf_counter() - start
    for task in pending:
        task.cancel()
    await asyncio.gather(*pending, return_exceptions=True)
    start = time.perf_counter()
    writers = [(await friendsock.open_connection("127.0.0.1", port, friends=friends))[1]
               for _ in range(held)]
    held_time = time.perf_counter() - start
    for writer in writers:
        writer.close()
    server.close()
    await asyncio.wait(handlers, timeout=limit)
    return sum(1 for task in done if task.exception() is None), burst, held_time


async def _trio_burst(count: int, held: int, friends: bool, limit: float) -> Result:
    async def handler(stream: trio.abc.Stream) -> None:
        async with stream:
            data = b""
            while len(data) < 8:
                chunk = await stream.receive_some(8 - len(data))
                if not chunk:
                    return
                data += chunk
            await stream.send_all(data)

    done = 0

    async def echo(port: int, number: int) -> None:
        nonlocal done
        async with await fst.open_tcp_stream("127.0.0.1", port, friends=friends) as stream:
            payload = number.to_bytes(8, "big")
            await stream.send_all(payload)
            assert await stream.receive_some(8) == payload
        done += 1

    async with trio.open_nursery() as nursery:
        listeners = await nursery.start(functools.partial(
            fst.serve_tcp, handler, 0, host="127.0.0.1", backlog=100, friends=friends))
        port = listeners[0].socket.getsockname()[1]
        start = time.perf_counter()
        with trio.move_on_after(limit):
            async with trio.open_nursery() as clients:
                for number in range(count):
                    clients.start_soon(echo, port, number)
        burst = time.perf_counter() - start
        start = time.perf_counter()
        streams = [await fst.open_tcp_stream("127.0.0.1", port, friends=friends) for _ in range(held)]
        held_time = time.perf_counter() - start
        for stream in streams:
            await stream.aclose()
        nursery.cancel_scope.cancel()
    return done, burst, held_time


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--count", type=int, default=2000)
    parser.add_argument("--held", type=int, default=300)
    parser.add_argument("--limit", type=float, default=10.0)
    args = parser.parse_args()
    runners: dict = {
        "asyncio": lambda c: asyncio.run(c),
        "uvloop": lambda c: uvloop.run(c),
    }
    print(f"{args.count} concurrent echoes at backlog 100, then {args.held} held connects")
    print(f"{'loop':8} {'path':8} {'done':>6} {'burst s':>8} {'held s':>7}")
    for loop, run in runners.items():
        for friends in (False, True):
            done, burst, held = run(_asyncio_burst(args.count, args.held, friends, args.limit))
            print(f"{loop:8} {'friends' if friends else 'tcp':8} {done:6} {burst:8.2f} {held:7.2f}")
    for friends in (False, True):
        run_trio: Callable = trio.run
        done, burst, held = run_trio(_trio_burst, args.count, args.held, friends, args.limit)
        print(f"{'trio':8} {'friends' if friends else 'tcp':8} {done:6} {burst:8.2f} {held:7.2f}")


if __name__ == "__main__":
    main()
