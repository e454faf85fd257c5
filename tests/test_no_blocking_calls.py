"""friendsock makes no blocking call on an event loop: aiohttp's and
anyio's suites run blockbuster, which fails any, and a program's loop must
not stall in friendsock's set-up. Each check runs in a fresh interpreter
(one-time work, such as what the first connect needs, is part of it), on
both loops, friend links on and off."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

_PROGRAM = r'''
import asyncio, socket, sys
from blockbuster import blockbuster_ctx
import friendsock

async def echo(reader, writer):
    writer.write(await reader.read(100))
    await writer.drain()
    writer.close()

async def exchange(reader, writer):
    writer.write(b"ping")
    assert await reader.read() == b"ping"
    writer.close()
    await writer.wait_closed()

async def main():
    friendsock.install()
    loop = asyncio.get_running_loop()
    server = await asyncio.start_server(echo, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    for _ in range(2):  # (the second over the connection the first left)
        await exchange(*await asyncio.open_connection("127.0.0.1", port))
    sock = socket.socket()
    sock.setblocking(False)
    await loop.sock_connect(sock, ("127.0.0.1", port))  # as aiohttp's client connects
    await exchange(*await asyncio.open_connection(sock=sock))
    server.close()
    await server.wait_closed()
    print(friendsock.stats().links_made)

with blockbuster_ctx("friendsock"):
    if sys.argv[1] == "uvloop":
        import uvloop
        uvloop.run(main())
    else:
        asyncio.run(main())
'''


@pytest.mark.parametrize("friends", [True, False], ids=["friend", "tcp"])
@pytest.mark.parametrize("loop", ["asyncio", "uvloop"])
def test_connects_make_no_blocking_call_on_the_loop(loop, friends):
    environment = dict(os.environ, FRIENDSOCK="1" if friends else "0")
    result = subprocess.run([sys.executable, "-c", _PROGRAM, loop], capture_output=True,
                            text=True, timeout=60, env=environment)
    assert result.returncode == 0, result.stderr
    assert int(result.stdout) == (3 if friends else 0)
