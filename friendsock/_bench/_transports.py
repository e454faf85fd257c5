"""The transports under test on the asyncio loops, behind one small interface.

``tcp`` is friendsock with ``friends=False`` (the loop's own TCP transport),
``unix`` is the loop's AF_UNIX transport, ``friends`` is friendsock as a user
gets it. A server may run on another loop (the ``threads`` test): ``serve``
runs on the server's loop, ``connect`` on the client's. With TLS (``--tls``)
each runs ``ssl=`` with a certificate from a throwaway CA (trustme).

The ``trio`` loop has its own endpoints (``_trio_workloads``: that module
imports trio, this one asyncio) and a fourth transport, ``memory``
(``trio.testing.memory_stream_pair()``), and runs only the tests in
``TRIO_CASES``.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import itertools
import os
import ssl
from typing import Any, Callable, Dict, Iterator, List, Optional, Sequence, Tuple

import friendsock

TRANSPORTS = ("tcp", "unix", "friends", "socketless", "memory")
# Transports whose connections must be friend links (verified per round).
FRIEND_TRANSPORTS = ("friends", "socketless")
# Socketless links (friendsock.set_socketless), in these tables (connection
# set-up, request/response, idle links; on trio and anyio, of these: rr and crr).
SOCKETLESS_CASES = ("rr", "crr", "streams-rr", "memory-heap", "memory-rss")
LOOPS = ("asyncio", "uvloop", "trio", "anyio")
# Loops that run under trio.run: trio's own API, and anyio's on its trio
# backend (its friends: unchanged anyio code under friendsock.trio.install()).
TRIO_LOOPS = ("trio", "anyio")
# What the trio loop runs (the tables' keys); the rest of the tables have
# no trio rows. ``memory`` runs only on trio.
TRIO_CASES = ("stream", "rr", "crr")
# Tables with no event loop in the path (both ends blocking sockets in
# threads): measured once, in the asyncio row.
LOOPLESS_CASES = ("blocking-threads-rr", "blocking-threads-stream")
# The in-memory floor (``memory``): trio.testing.memory_stream_pair on trio,
# the naive call_soon transport (``_floor``) on asyncio and uvloop, the bare
# hand-over between threads in the blocking tables; in these tables only
# (anyio has none).
MEMORY_CASES = ("stream", "rr", "crr", "streams-rr", "threads-rr", "threads-stream", "blocking-rr",
                "blocking-stream", "blocking-threads-rr", "blocking-threads-stream")
HOST = "127.0.0.1"
# Large enough that hundreds of concurrent connects never overflow it.
BACKLOG = 1024
# The name TLS clients verify (the certificate also holds HOST).
TLS_HOSTNAME = "localhost"

ProtocolFactory = Callable[[], asyncio.BaseProtocol]
StreamHandler = Callable[[asyncio.StreamReader, asyncio.StreamWriter], Any]

_socket_names = itertools.count()


def loop_transports(kind: str, transports: Sequence[str],
                    case_key: Optional[str] = None) -> List[str]:
    """The selected transports that run on loop ``kind`` (in table
    ``case_key``; without one, in any)."""
    def runs(transport: str) -> bool:
        if transport == "socketless":
            return case_key is None or case_key in SOCKETLESS_CASES
        if transport != "memory":
            return True
        return kind != "anyio" and (case_key is None or case_key in MEMORY_CASES)

    return [t for t in transports if runs(t)]


def is_trio_loop(kind: str) -> bool:
    """Whether loop ``kind`` runs under ``trio.run`` (``_trio_runner``)."""
    return kind in TRIO_LOOPS


def loop_runs(kind: str, case_key: str) -> bool:
    """Whether loop ``kind`` has rows in table ``case_key``."""
    if case_key in LOOPLESS_CASES:
        return kind == "asyncio"
    return kind not in TRIO_LOOPS or case_key in TRIO_CASES


TLSContexts = Tuple[ssl.SSLContext, ssl.SSLContext]


@functools.lru_cache(maxsize=None)
def tls_contexts() -> TLSContexts:
    """(server, client) contexts for TLS_HOSTNAME and HOST, from a CA made
    once per process (trustme: the CLI checks it is installed)."""
    import trustme

    ca = trustme.CA()
    server = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    ca.issue_cert(TLS_HOSTNAME, HOST).configure_cert(server)
    client = ssl.create_default_context()
    ca.configure_trust(client)
    return server, client


# Socketless connects in progress, and the switch before the first of them.
_socketless_connects = 0
_socketless_before = False


@contextlib.contextmanager
def socketless_connects(transport: str) -> Iterator[None]:
    """Socketless connects for the socketless transport (any other: as it
    is): the switch is read as a connect starts, and connects overlap
    (``multi``), so it is on while any of them runs and back as it was
    after the last. On the loop's thread."""
    if transport != "socketless":
        yield
        return
    global _socketless_connects, _socketless_before
    if _socketless_connects == 0:
        _socketless_before = friendsock.is_socketless()
        friendsock.set_socketless(True)
    _socketless_connects += 1
    try:
        yield
    finally:
        _socketless_connects -= 1
        if _socketless_connects == 0:
            friendsock.set_socketless(_socketless_before)


class Endpoint:
    """One server of one transport, and how clients reach it; over TLS
    when given ``tls`` (server and client contexts)."""

    def __init__(self, transport: str, tmpdir: str, tls: Optional[TLSContexts] = None) -> None:
        if transport not in TRANSPORTS or transport == "memory":  # memory: _floor
            raise ValueError(f"unknown transport {transport!r}")
        self.transport = transport
        self._tmpdir = tmpdir
        self._serve_tls: Dict[str, Any] = {} if tls is None else {"ssl": tls[0]}
        self._connect_tls: Dict[str, Any] = {} if tls is None else {
            "ssl": tls[1], "server_hostname": TLS_HOSTNAME}
        self.server: Optional[asyncio.AbstractServer] = None
        self.port: Optional[int] = None
        self.path: Optional[str] = None

    @property
    def friends(self) -> Optional[bool]:
        # None: friendsock decides (it pairs); False: forced real TCP.
        return None if self.transport in FRIEND_TRANSPORTS else False

    async def serve(self, factory: ProtocolFactory) -> None:
        """Start a protocol server on the running loop."""
        if self.transport == "unix":
            self.path = self.new_path()
            loop = asyncio.get_running_loop()
            self.server = await loop.create_unix_server(factory, self.path, backlog=BACKLOG,
                                                        **self._serve_tls)
        else:
            self.server = await friendsock.create_server(
                factory, HOST, 0, friends=self.friends, backlog=BACKLOG, **self._serve_tls
            )
            self.port = self.server.sockets[0].getsockname()[1]  # type: ignore[attr-defined]

    async def serve_streams(self, handler: StreamHandler) -> None:
        """Start a StreamReader/StreamWriter server on the running loop."""
        if self.transport == "unix":
            self.path = self.new_path()
            self.server = await asyncio.start_unix_server(handler, self.path, backlog=BACKLOG,
                                                          **self._serve_tls)
        else:
            self.server = await friendsock.start_server(
                handler, HOST, 0, friends=self.friends, backlog=BACKLOG, **self._serve_tls
            )
            self.port = self.server.sockets[0].getsockname()[1]  # type: ignore[attr-defined]

    async def connect(self, factory: ProtocolFactory) -> Tuple[asyncio.BaseTransport, Any]:
        if self.transport == "unix":
            loop = asyncio.get_running_loop()
            return await loop.create_unix_connection(factory, self.path, **self._connect_tls)
        with socketless_connects(self.transport):
            return await friendsock.create_connection(factory, HOST, self.port,
                                                      friends=self.friends, **self._connect_tls)

    async def open(self) -> Tuple[asyncio.StreamReader, asyncio.StreamWriter]:
        if self.transport == "unix":
            return await asyncio.open_unix_connection(self.path, **self._connect_tls)
        with socketless_connects(self.transport):
            return await friendsock.open_connection(HOST, self.port, friends=self.friends,
                                                    **self._connect_tls)

    async def close(self) -> None:
        """Stop listening (on the server's loop). Connections stay up."""
        server, self.server = self.server, None
        if server is not None:
            server.close()
        if self.path is not None:
            # Python 3.11's unix servers leave their socket file behind.
            try:
                os.unlink(self.path)
            except OSError:
                pass

    def new_path(self) -> str:
        """A fresh AF_UNIX socket path in the run's directory."""
        return os.path.join(self._tmpdir, f"s{next(_socket_names)}.sock")


def loop_factory(kind: str) -> Callable[[], asyncio.AbstractEventLoop]:
    """How to make an event loop of ``kind``."""
    if kind == "asyncio":
        # Not asyncio.new_event_loop(): a policy (uvloop.install()) may
        # have changed what that returns.
        return asyncio.SelectorEventLoop
    if kind == "uvloop":
        import uvloop

        return uvloop.new_event_loop
    if kind in TRIO_LOOPS:
        raise ValueError(f"the {kind} loop is no asyncio loop: it runs in _trio_runner")
    raise ValueError(f"unknown loop {kind!r}")
