"""The ``processes`` test's server: a second Python process on this host, on
a loop of the client's kind, as a local service runs.

It serves two services on each transport: ``echo`` (every byte back) and
``sink`` (counts what comes until EOF, then answers the count as 8 bytes
and closes). ``tcp`` is the loop's own TCP server, friendsock not asked;
``unix`` the loop's AF_UNIX server; ``friends`` ``friendsock.create_server``,
whose connections from a friendsock client move off TCP. Its addresses
come back on its stdout as one JSON line; it stops at EOF on its stdin.

Run here as ``python -m friendsock._bench._server_process KIND DIRECTORY``
by :class:`ServerProcess`, the client's handle on it.
"""

from __future__ import annotations

import asyncio
import json
import os
import selectors
import struct
import subprocess
import sys
import tempfile
from typing import Any, Dict, Optional, Tuple

import friendsock

from ._transports import BACKLOG, HOST, Endpoint, loop_factory

SERVICES = ("echo", "sink")
PROCESS_TRANSPORTS = ("tcp", "unix", "friends")
COUNT = struct.Struct("!Q")
# How long the server may take to start (an interpreter, friendsock, a loop).
START_TIMEOUT = 30.0


# -- in the server process ---------------------------------------------------


class EchoService(asyncio.Protocol):
    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport: Any = transport

    def data_received(self, data: bytes) -> None:
        self.transport.write(data)


class SinkService(asyncio.Protocol):
    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport: Any = transport
        self.count = 0

    def data_received(self, data: bytes) -> None:
        self.count += len(data)

    def eof_received(self) -> bool:
        self.transport.write(COUNT.pack(self.count))
        self.transport.close()
        return True


_FACTORIES = {"echo": EchoService, "sink": SinkService}


async def _serve(directory: str) -> None:
    loop = asyncio.get_running_loop()
    servers = []
    addresses: Dict[str, Dict[str, Any]] = {transport: {} for transport in PROCESS_TRANSPORTS}
    for service in SERVICES:
        factory = _FACTORIES[service]
        tcp = await loop.create_server(factory, HOST, 0, backlog=BACKLOG)
        path = os.path.join(directory, f"{os.getpid()}-{service}.sock")
        unix = await loop.create_unix_server(factory, path, backlog=BACKLOG)
        friends = await friendsock.create_server(factory, HOST, 0, backlog=BACKLOG)
        servers += [tcp, unix, friends]
        addresses["tcp"][service] = tcp.sockets[0].getsockname()[1]
        addresses["unix"][service] = path
        addresses["friends"][service] = friends.sockets[0].getsockname()[1]  # type: ignore[attr-defined]
    print(json.dumps(addresses), flush=True)
    # Until the client closes our stdin (or goes away).
    await loop.run_in_executor(None, sys.stdin.read)
    for server in servers:
        server.close()


def main(argv: list) -> None:
    kind, directory = argv
    loop = loop_factory(kind)()
    try:
        loop.run_until_complete(_serve(directory))
    finally:
        loop.close()


# -- in the client process ---------------------------------------------------


class ServerProcess:
    """The client's handle on a server process of loop ``kind``; its
    sockets' files go in ``directory``."""

    def __init__(self, kind: str, directory: str) -> None:
        self.kind = kind
        self._directory = directory
        # A file, not a pipe: a server that says much cannot block on it.
        self._errors = tempfile.TemporaryFile(dir=directory)
        self._process = subprocess.Popen(
            [sys.executable, "-m", __name__, kind, directory],
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=self._errors)
        try:
            self._addresses = json.loads(self._first_line())
        except BaseException:
            self.stop()
            raise

    @property
    def pid(self) -> int:
        return self._process.pid

    def _first_line(self) -> str:
        stdout = self._process.stdout
        assert stdout is not None
        with selectors.DefaultSelector() as selector:
            selector.register(stdout, selectors.EVENT_READ)
            if not selector.select(START_TIMEOUT):
                raise TimeoutError(f"the {self.kind} server process did not start "
                                   f"within {START_TIMEOUT:.0f} s")
        line = stdout.readline()
        if not line:
            self._process.wait(10)
            raise RuntimeError(f"the {self.kind} server process exited "
                               f"({self._process.returncode}): {self._stderr()}")
        return line.decode()

    def _stderr(self) -> str:
        self._errors.seek(0)
        text = self._errors.read().decode(errors="replace")
        return " ".join(text.strip().splitlines()[-1:]) or "no message"

    def endpoint(self, transport: str, service: str) -> Endpoint:
        """How a client of this loop reaches ``service`` over ``transport``."""
        if transport not in PROCESS_TRANSPORTS:
            raise ValueError(f"no {transport} server in another process")
        endpoint = Endpoint(transport, self._directory)
        address = self._addresses[transport][service]
        if transport == "unix":
            endpoint.path = address
        else:
            endpoint.port = address
        return endpoint

    def stop(self, timeout: float = 10.0) -> Optional[Tuple[int, str]]:
        """Stop the server; its exit status and last words if it failed."""
        process = self._process
        if process.stdin is not None and not process.stdin.closed:
            try:
                process.stdin.close()
            except OSError:  # it is gone already
                pass
        try:
            process.wait(timeout)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()
        failure = None if process.returncode == 0 else (process.returncode, self._stderr())
        if process.stdout is not None:
            process.stdout.close()
        self._errors.close()
        return failure


if __name__ == "__main__":
    main(sys.argv[1:])
