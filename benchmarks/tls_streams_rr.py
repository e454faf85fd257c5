"""CPU and wall time per 64 B round trip through asyncio streams over TLS on
uvloop: a StreamReader/StreamWriter echo server (``ssl=``) and a client
writing 64 B and reading them back, 20,000 times after 500 of warm-up, over
uvloop's TCP or a friend link (the benchmark tool's certificates).

    python benchmarks/tls_streams_rr.py friends
    python benchmarks/tls_streams_rr.py tcp
"""

from __future__ import annotations

import asyncio
import sys
import time

import uvloop

import friendsock
from friendsock._bench._transports import HOST, TLS_HOSTNAME, tls_contexts

ROUND_TRIPS = 20_000
MESSAGE = b"x" * 64


async def echo(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    while data := await reader.read(65536):
        writer.write(data)
    writer.close()


async def main(mode: str) -> None:
    server_tls, client_tls = tls_contexts()
    friends = mode != "tcp"
    server = await friendsock.start_server(echo, HOST, 0, ssl=server_tls, friends=friends)
    port = server.sockets[0].getsockname()[1]
    reader, writer = await friendsock.open_connection(HOST, port, ssl=client_tls,
                                                      server_hostname=TLS_HOSTNAME, friends=friends)
    assert friendsock.is_friend(writer) is friends

    async def round_trips(count: int) -> None:
        for _ in range(count):
            writer.write(MESSAGE)
            await reader.readexactly(len(MESSAGE))

    await round_trips(500)
    cpu, wall = time.process_time(), time.perf_counter()
    await round_trips(ROUND_TRIPS)
    cpu = (time.process_time() - cpu) / ROUND_TRIPS * 1e6
    wall = (time.perf_counter() - wall) / ROUND_TRIPS * 1e6
    print(f"{mode}: CPU {cpu:.2f} us, wall {wall:.2f} us per round trip")
    writer.close()
    server.close()


if __name__ == "__main__":
    uvloop.run(main(sys.argv[1]))
