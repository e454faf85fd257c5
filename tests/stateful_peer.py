"""The server process of ``test_stateful``'s machine across processes.

    python tests/stateful_peer.py LOOP

LOOP is ``asyncio`` or ``uvloop``. Two friendsock servers on 127.0.0.1,
one for each path: ``friend`` (its connections from a friendsock process
move off TCP) and ``tcp`` (``friends=False``: they stay on TCP). It
prints ``{"ports": {"friend": P, "tcp": Q}}``, then reads commands, one
JSON object a line, and answers each with ``{"reply": ID, ...}``:

- ``{"id": ID, "op": "sync"}``: answered after three turns of its loop,
  once what follows at once from what it was told has happened;
- ``{"id": ID, "op": "keep_open", "value": B}``: what ``eof_received``
  returns on the connections accepted from then on;
- ``{"id": ID, "serial": N, "op": "write", "size": S, "kind": K}``: the
  next S bytes of connection N's stream written, as ``bytes``,
  ``bytearray`` or ``memoryview``;
- ``{"id": ID, "serial": N, "op": "call", "method": M, "args": [...]}``:
  the transport's method M called; ``"value"``: what it returned;
- ``{"id": ID, "serial": N, "op": "getsockopt" | "setsockopt" | "shutdown", "args": [...]}``:
  on the transport's socket.

A reply carries ``"error"``: the name of the exception's type, or null.
Every callback of an accepted connection prints its state: ``{"serial":
N, "path": P, "events": [...], "received": R, "intact": B}``; an error
the loop's exception handler gets prints ``{"loop_error": TEXT}``. It
exits when its standard input closes.
"""

from __future__ import annotations

import asyncio
import json
import sys
from typing import Any, Dict

import uvloop

import friendsock

from stateful_streams import Rec, stream_bytes


def say(message: Dict[str, Any]) -> None:
    sys.stdout.write(json.dumps(message) + "\n")
    sys.stdout.flush()


class Told(Rec):
    """A connection's server end, which tells the test process of each callback."""

    def __init__(self, keep_open: bool, serial: int, path: str) -> None:
        super().__init__(keep_open, asyncio.Event())
        self.serial = serial
        self.path = path
        self.written = 0  # bytes write() took

    def note(self) -> None:
        say({"serial": self.serial, "path": self.path, "events": self.events,
             "received": self.received, "intact": self.intact})


class Serving:
    def __init__(self) -> None:
        self.keep_open = False
        self.ends: Dict[int, Told] = {}

    def factory(self, path: str) -> Told:
        end = Told(self.keep_open, len(self.ends) + 1, path)
        self.ends[end.serial] = end
        return end

    def run(self, command: Dict[str, Any]) -> Dict[str, Any]:
        op = command["op"]
        if op == "sync":
            return {}
        if op == "keep_open":
            self.keep_open = command["value"]
            return {}
        end = self.ends[command["serial"]]
        transport: Any = end.transport
        if op == "write":
            raw = stream_bytes(end.written, command["size"])
            kind = command["kind"]
            transport.write(raw if kind == "bytes" else bytearray(raw) if kind == "bytearray"
                            else memoryview(raw))
            end.written += len(raw)
            return {}
        if op == "call":
            return {"value": getattr(transport, command["method"])(*command["args"])}
        sock = transport.get_extra_info("socket")
        return {"value": getattr(sock, op)(*command["args"])}


async def main() -> None:
    loop = asyncio.get_running_loop()
    loop.set_exception_handler(lambda _loop, context: say({"loop_error": repr(context)}))
    serving = Serving()
    servers = {path: await friendsock.create_server(lambda path=path: serving.factory(path),
                                                    "127.0.0.1", 0, friends=path == "friend")
               for path in ("friend", "tcp")}
    say({"ports": {path: server.sockets[0].getsockname()[1] for path, server in servers.items()}})
    commands = asyncio.StreamReader()
    await loop.connect_read_pipe(lambda: asyncio.StreamReaderProtocol(commands), sys.stdin)
    while line := await commands.readline():
        command = json.loads(line)
        if command["op"] == "sync":
            for _ in range(3):  # (what follows at once, done first)
                await asyncio.sleep(0)
        try:
            answer = serving.run(command)
            answer["error"] = None
        except Exception as exc:  # noqa: BLE001 - the test process compares it
            answer = {"error": type(exc).__name__}
        say({"reply": command["id"], **answer})
    for server in servers.values():
        server.close()
    for end in serving.ends.values():
        if end.transport is not None and not end.lost:
            end.transport.abort()


if __name__ == "__main__":
    (uvloop.run if sys.argv[1] == "uvloop" else asyncio.run)(main())
