"""Shared test pieces: recording protocols and a connected pair on either path."""

from __future__ import annotations

import asyncio
import contextlib
import contextvars
import gc
import hashlib
import os
import random
import socket
import ssl
import sys
import time
import warnings
from typing import Any, AsyncIterator, Awaitable, Callable, Iterator, List, Optional, Set, Tuple

import pytest
import uvloop

import friendsock
from friendsock import _handshake
from friendsock._core._registry import registry
from friendsock._handshake._listener import forget_collected


class Recorder(asyncio.Protocol):
    """Records every callback in order; ``data`` holds what arrived."""

    def __init__(self, eof_keep_open: bool = False) -> None:
        self.events: List[str] = []
        self.data = bytearray()
        self.transport: Optional[asyncio.Transport] = None
        self.eof_keep_open = eof_keep_open
        self.lost_exc: Optional[BaseException] = None
        loop = asyncio.get_running_loop()
        self.made = loop.create_future()
        self.eof = loop.create_future()
        self.lost = loop.create_future()
        self._waiters: List[Tuple[int, asyncio.Future]] = []

    def connection_made(self, transport) -> None:
        self.events.append("made")
        self.transport = transport
        track(transport)
        self.made.set_result(None)

    def data_received(self, data: bytes) -> None:
        assert isinstance(data, bytes)
        if not self.events or self.events[-1] != "data":
            self.events.append("data")
        self.data += data
        self._wake()

    def eof_received(self):
        self.events.append("eof")
        self.eof.set_result(None)
        return self.eof_keep_open

    def connection_lost(self, exc) -> None:
        self.events.append("lost")
        self.lost_exc = exc
        self.lost.set_result(exc)
        self._wake()

    def _wake(self) -> None:
        for size, fut in list(self._waiters):
            if (len(self.data) >= size or self.lost.done()) and not fut.done():
                fut.set_result(None)

    async def wait_bytes(self, size: int) -> bytes:
        """Until at least ``size`` bytes arrived (or the connection ended)."""
        if len(self.data) < size and not self.lost.done():
            fut = asyncio.get_running_loop().create_future()
            self._waiters.append((size, fut))
            await fut
        return bytes(self.data)


# What ContextRecorder reads in its callbacks' context: the request named
# there, and how many of its callbacks the context has seen.
request_var = contextvars.ContextVar("request", default="none")
calls_var = contextvars.ContextVar("calls", default=0)


class ContextRecorder(Recorder):
    """Notes, per callback after connection_made, the request its context
    names and how many of this protocol's callbacks that context has seen
    (one context for them all counts 1, 2, 3...). connection_made names
    the request "made"; with ``replies``, data_received names "reply" and
    writes the bytes back."""

    def __init__(self, replies: bool = False) -> None:
        super().__init__()
        self.replies = replies
        self.seen: List[tuple] = []

    def _note(self, what: str) -> None:
        calls = calls_var.get() + 1
        calls_var.set(calls)
        self.seen.append((what, request_var.get(), calls))

    def connection_made(self, transport) -> None:
        request_var.set("made")
        super().connection_made(transport)

    def data_received(self, data: bytes) -> None:
        self._note("data")
        if self.replies:
            request_var.set("reply")
            self.transport.write(data)
        super().data_received(data)

    def eof_received(self):
        self._note("eof")
        return super().eof_received()

    def connection_lost(self, exc) -> None:
        self._note("lost")
        super().connection_lost(exc)


@contextlib.contextmanager
def cyclic_garbage_of_ours() -> Iterator[List[str]]:
    """The list fills, as the block ends, with the type names of
    friendsock's objects made in the block that only the cyclic collector
    frees (a connection should go with its last reference, as a socket
    does). Drop the block's references before it ends."""
    found: List[str] = []
    gc.collect()
    gc.disable()
    gc.set_debug(gc.DEBUG_SAVEALL)
    try:
        yield found
        gc.collect()
        found += sorted({f"{type(o).__module__}.{type(o).__qualname__}" for o in gc.garbage
                         if type(o).__module__.startswith("friendsock")})
    finally:
        gc.garbage.clear()
        gc.set_debug(0)
        gc.enable()


def received_exactly(sock: socket.socket, size: int) -> bytes:
    """``size`` bytes from a blocking socket with a timeout, read until
    they are all there (in timeout mode ``MSG_WAITALL`` does not wait:
    the stdlib polls, then reads what is there, as over TCP)."""
    got = bytearray()
    while len(got) < size:
        chunk = sock.recv(size - len(got))
        assert chunk, f"EOF after {len(got)} of {size} bytes"
        got += chunk
    return bytes(got)


def answered_after_the_connect(address: Any, accept: Callable[[], socket.socket], loop_kind: str,
                               paired: bool, timeout: float = 10) -> None:
    """An event loop's client (on asyncio or uvloop) connects to ``address``
    and writes; only then does ``accept()`` run, on a worker thread (anyio's
    tests accept on the client's thread after ``connect_tcp`` returns), and
    answer with the SHA-256 of what came. Checks the answer, and that the
    accepted end is a friend exactly when ``paired``."""
    def serve() -> None:
        server = accept()
        with server:
            assert friendsock.is_friend(server) is paired
            server.setblocking(True)
            server.settimeout(timeout)
            server.sendall(hashlib.sha256(received_exactly(server, 4)).digest())

    async def exchange() -> bytes:
        reader, writer = await asyncio.open_connection(*address)
        try:
            writer.write(b"ping")
            serving = asyncio.get_running_loop().run_in_executor(None, serve)
            answer = await asyncio.wait_for(reader.readexactly(32), timeout)
            await asyncio.wait_for(serving, timeout)
            return answer
        finally:
            writer.close()
            await writer.wait_closed()

    new_loop = asyncio.new_event_loop if loop_kind == "asyncio" else uvloop.new_event_loop
    assert run_on(new_loop, exchange()) == hashlib.sha256(b"ping").digest()


@contextlib.contextmanager
def every_loop_installed() -> Iterator[None]:
    """What ``python -m friendsock run``, ``FRIENDSOCK_INSTALL=1`` and the
    pytest plugin switch on: every loop the process makes is installed."""
    from friendsock._everywhere import install_everywhere

    undo = install_everywhere()
    try:
        yield
    finally:
        undo()


@contextlib.contextmanager
def resource_warnings_raised() -> Iterator[List[BaseException]]:
    """In the block, ResourceWarning is an error (as many suites set it),
    and what finalizers raise is collected in the list (the unraisable
    hook's) rather than reported."""
    raised: List[BaseException] = []
    hook, sys.unraisablehook = sys.unraisablehook, lambda unraisable: raised.append(unraisable.exc_value)
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("error", ResourceWarning)
            yield raised
    finally:
        sys.unraisablehook = hook


@contextlib.asynccontextmanager
async def connected_pair(
    friends: bool,
    server_protocol=None,
    client_protocol=None,
    host: str = "127.0.0.1",
) -> AsyncIterator[Tuple[asyncio.Transport, Recorder, Recorder]]:
    """A server and a client on ``host``; yields (client transport, client
    protocol, server protocol) once both ends saw connection_made."""
    server_protocols: List[asyncio.BaseProtocol] = []
    server_factory = server_protocol or Recorder
    made = asyncio.get_running_loop().create_future()

    def factory():
        protocol = server_factory()
        server_protocols.append(protocol)
        if not made.done():
            made.set_result(protocol)
        return protocol

    server = await friendsock.create_server(factory, host, 0, friends=friends)
    port = server.sockets[0].getsockname()[1]
    try:
        transport, client = await friendsock.create_connection(
            client_protocol or Recorder, host, port, friends=friends
        )
        try:
            server_side = await asyncio.wait_for(made, 10)
            assert friendsock.is_friend(transport) is friends
            yield transport, client, server_side
        finally:
            _abort(transport)
            for protocol in server_protocols:
                if getattr(protocol, "transport", None) is not None:
                    _abort(protocol.transport)
    finally:
        server.close()


def _abort(transport: asyncio.BaseTransport) -> None:
    # Python 3.11's socket transport fails an abort() that follows a close()
    # still flushing its buffer; a closing transport is on its way out anyway.
    if not transport.is_closing():
        transport.abort()


# -- shared by the pairing and server tests -----------------------------------

PAYLOAD = b"hello, friend\n"
LOCALHOST = "127.0.0.1"


def port_of(server) -> int:
    return server.sockets[0].getsockname()[1]


def registered(port: int) -> bool:
    """Whether a listener on ``port`` is registered for pairing. A listener
    collected unclosed stays listed until the next connect or listen (its
    finalizer takes no lock): forgotten first, so that one of an earlier
    test's, on a port the kernel has handed out again since, is not it."""
    forget_collected()
    return registry.has_port(port)


def fallbacks_since(before) -> dict:
    """Fallback reasons counted since the snapshot ``before``."""
    after = friendsock.stats().fallbacks
    moved = {k: after.get(k, 0) - before.fallbacks.get(k, 0) for k in set(after) | set(before.fallbacks)}
    return {k: v for k, v in moved.items() if v}

# The transports made while no_transport_left_open is active.
_tracked: Optional[List[asyncio.BaseTransport]] = None


def track(transport: asyncio.BaseTransport) -> None:
    """Have ``no_transport_left_open`` check ``transport`` (Recorder and Echo
    call this; a test calls it for a stream's transport)."""
    if _tracked is not None:
        _tracked.append(transport)


@pytest.fixture
def no_transport_left_open():
    """Abort, then fail on, any tracked transport a test leaves open.

    A test that fails half-way must not leave a uvloop handle open: with
    ResourceWarning an error, uvloop's loop.close() then spins for ever on
    it, and the whole run hangs instead of reporting the failure.
    """
    global _tracked
    _tracked = []
    try:
        yield
    finally:
        left = [t for t in _tracked if not t.is_closing() and not lost_under_tls(t)]
        _tracked = None
        for transport in left:
            with contextlib.suppress(RuntimeError):  # its loop already closed
                transport.abort()
    if left:
        pytest.fail(f"transports left open: {left!r}")


# -- what 3.10's asyncio TLS layer does differently ----------------------------

# 3.11 made asyncio's TLS layer uvloop's: before, a layer whose connection is
# lost under it (the peer closed) tells its protocol connection_lost()
# without eof_received(), and leaves its transport saying it is open
# (is_closing() False, "unclosed transport" when collected).
OLD_ASYNCIO_TLS = sys.version_info < (3, 11)


def old_tls_layer() -> bool:
    """Whether the running loop's TLS is 3.10's asyncio layer (uvloop has
    its own on every version)."""
    return OLD_ASYNCIO_TLS and isinstance(asyncio.get_running_loop(), asyncio.BaseEventLoop)


def tls_ended(*events: str) -> List[str]:
    """A TLS protocol's ``events`` up to its end, with ``eof`` before
    ``lost`` where the layer tells it (not 3.10's asyncio)."""
    return [*events, *([] if old_tls_layer() else ["eof"]), "lost"]


def shutdown_timeout(seconds: float) -> dict:
    """``ssl_shutdown_timeout=seconds`` where the loop takes it (3.10's
    asyncio has no TLS shutdown timeout)."""
    return {} if old_tls_layer() else {"ssl_shutdown_timeout": seconds}


def lost_under_tls(transport: asyncio.BaseTransport) -> bool:
    """A 3.10 asyncio TLS transport whose connection is gone: closed, though
    it does not say so."""
    return OLD_ASYNCIO_TLS and isinstance(transport, asyncio.sslproto._SSLProtocolTransport) \
        and transport._ssl_protocol._transport is None  # type: ignore[attr-defined]


# States of /proc/net/tcp.
TCP_ESTABLISHED = "01"
TCP_TIME_WAIT = "06"


def tcp_connections(port: int, state: Optional[str] = None) -> set:
    """The kernel's TCP connections (not listeners) with ``port`` at either
    end, as (local, remote) from /proc; only those in ``state`` if given."""
    found = set()
    # (the tables hold every socket of the host: a line without the port
    # is passed over unparsed)
    named = f":{port:04X} "
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        with open(table) as lines:
            next(lines)
            for line in lines:
                if named not in line:
                    continue
                _, local, remote, seen = line.split()[:4]
                ports = {int(local.rsplit(":", 1)[1], 16), int(remote.rsplit(":", 1)[1], 16)}
                if port in ports and seen != "0A" and (state is None or seen == state):
                    found.add((local, remote))
    return found


async def bounded(awaitable, timeout: float = 10):
    """Await with an upper bound, so a bug shows as a failure, not a hang.

    In the calling task, as ``asyncio.wait_for`` from 3.12 on: 3.10's and
    3.11's ran the awaitable in a task of its own, loop turns later, and
    what a test saw happen meanwhile would differ by version."""
    task = asyncio.current_task()
    assert task is not None
    expired = []

    def expire() -> None:
        expired.append(True)
        task.cancel()

    handle = asyncio.get_running_loop().call_later(timeout, expire)
    try:
        return await awaitable
    except asyncio.CancelledError:
        if expired:
            raise asyncio.TimeoutError(f"not done in {timeout} s") from None
        raise
    finally:
        handle.cancel()


class Echo(asyncio.Protocol):
    """A server protocol: echoes what arrives, closes on the peer's EOF."""

    def __init__(self) -> None:
        self.transport: Optional[asyncio.Transport] = None
        loop = asyncio.get_running_loop()
        self.made = loop.create_future()  # (after a TLS handshake, the server's comes last)
        self.lost = loop.create_future()

    def connection_made(self, transport) -> None:
        self.transport = transport
        track(transport)
        self.made.set_result(None)

    def data_received(self, data: bytes) -> None:
        self.transport.write(data)

    def connection_lost(self, exc) -> None:
        self.lost.set_result(exc)


class Echoes:
    """A protocol factory of :class:`Echo` that keeps what it made."""

    def __init__(self) -> None:
        self.protocols: List[Echo] = []
        self.first = asyncio.get_running_loop().create_future()

    def __call__(self) -> Echo:
        protocol = Echo()
        self.protocols.append(protocol)
        if not self.first.done():
            self.first.set_result(protocol)
        return protocol

    async def all_lost(self) -> None:
        await bounded(asyncio.gather(*(p.lost for p in self.protocols)))


async def echo_and_finish(
    transport: asyncio.Transport, client: Recorder, payload: bytes = PAYLOAD, prefix: bytes = b""
) -> None:
    """One echo over ``transport`` (after ``prefix``, anything the server sent
    first), then a half-close the server answers by closing: a clean end."""
    transport.write(payload)
    expected = prefix + payload
    assert await bounded(client.wait_bytes(len(expected))) == expected
    transport.write_eof()
    assert await bounded(client.lost) is None
    assert client.events == ["made", "data", "eof", "lost"]


async def answer_then_finish(reader: asyncio.StreamReader, writer: asyncio.StreamWriter, how: str,
                             go_on: Callable[[], Awaitable[Any]]) -> None:
    """A server's part: answer a line with ``OK``, then, once ``go_on()``
    returns, close (``how`` "close"), or shut down writing and close once
    the client has (any other ``how``)."""
    await reader.readline()
    writer.write(b"OK\n")
    await go_on()
    if how == "close":
        writer.close()
    else:
        writer.write_eof()
        await reader.read()  # until the client closes
        writer.close()


# The library's deadline for a confirmed connect (a listener given with sock=).
DEFAULT_CONFIRM_TIMEOUT = _handshake.CONFIRM_TIMEOUT


@pytest.fixture
def patient_confirm(monkeypatch):
    """Confirmed connects wait long for their claim, so a loaded machine
    cannot turn an expected pairing into a deadline fallback. A test of the
    deadline itself puts DEFAULT_CONFIRM_TIMEOUT back with monkeypatch."""
    monkeypatch.setattr(_handshake, "CONFIRM_TIMEOUT", 10.0)


def chunked(payload: bytes, rng: random.Random, largest: int) -> List[object]:
    """``payload`` cut in random sizes, as a mix of bytes, bytearray and
    memoryview (the friend path takes bytes by reference, copies the rest)."""
    chunks: List[object] = []
    view = memoryview(payload)
    pos = 0
    while pos < len(payload):
        size = rng.randint(1, largest)
        piece = view[pos:pos + size]
        kind = rng.randrange(3)
        chunks.append(bytes(piece) if kind == 0 else bytearray(piece) if kind == 1 else piece)
        pos += size
    return chunks


# -- TLS ------------------------------------------------------------------------


def tls_contexts(ca, *names: str) -> Tuple[ssl.SSLContext, ssl.SSLContext]:
    """(server context with a certificate for ``names``, default
    ``localhost`` and 127.0.0.1; client context that trusts ``ca`` alone,
    verifying the certificate and its host name; ``ca``: a
    ``trustme.CA``). Made as ``ssl.create_default_context`` makes them but
    for the system's CAs, whose loading took most of the time of a test."""
    server = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    ca.issue_cert(*(names or ("localhost", LOCALHOST))).configure_cert(server)
    client = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
    ca.configure_trust(client)
    return server, client


# Plugins of the test extra that inner pytest runs have no use for, left
# out: hypothesis's and pytest-trio's import all of hypothesis (about 2 s
# of the 5 an inner run takes to start), pytest-aiohttp all of aiohttp.
UNUSED_IN_INNER_RUNS = ("hypothesispytest", "trio", "aiohttp")


def run_inner_pytest(pytester: pytest.Pytester, *args: str, timeout: float,
                     needs: Tuple[str, ...] = ()) -> pytest.RunResult:
    """``pytester.runpytest_subprocess`` without the cache and without the
    plugins it does not ``need`` of :data:`UNUSED_IN_INNER_RUNS`."""
    off = [arg for name in UNUSED_IN_INNER_RUNS if name not in needs for arg in ("-p", f"no:{name}")]
    return pytester.runpytest_subprocess("-p", "no:cacheprovider", *off, *args, timeout=timeout)


LOOP_RUNNERS = {"asyncio": asyncio.run, "uvloop": uvloop.run}  # each loop's asyncio.run


def run_on(loop_factory: Callable[[], asyncio.AbstractEventLoop], main: Awaitable[Any]) -> Any:
    """``asyncio.Runner(loop_factory=...).run(main)`` on every Python
    (Runner is 3.11+; on 3.10 its steps: run, then shut the async
    generators and the executor down, and close)."""
    if sys.version_info >= (3, 11):
        with asyncio.Runner(loop_factory=loop_factory) as runner:
            return runner.run(main)
    loop = loop_factory()
    try:
        return loop.run_until_complete(main)
    finally:
        try:
            loop.run_until_complete(loop.shutdown_asyncgens())
            loop.run_until_complete(loop.shutdown_default_executor())
        finally:
            loop.close()


def rendezvous_thread_settled(timeout: float = 10) -> bool:
    """Whether friendsock's thread for blocking and trio connections to
    other processes has closed, within ``timeout``, what it holds for them
    (their TCP sockets, which it closes as the other ends finish; the
    channels other processes opened, as those end): it closes them in the
    background, where another test may be counting descriptors."""
    from friendsock._blocking import _across

    def busy() -> bool:
        found = _across._rendezvous
        return found is not None and bool(found.releasing or found.channels)

    deadline = time.monotonic() + timeout
    while busy() and time.monotonic() < deadline:
        time.sleep(0.01)
    return not busy()


def descriptors_open(collected: bool = False) -> int:
    """How many descriptors this process has open, once friendsock's thread
    has closed what earlier tests left it (:func:`rendezvous_thread_settled`);
    ``collected``: and their garbage (a socket closed by its collection)."""
    return len(descriptors(collected))


def descriptors(collected: bool = False) -> Set[Tuple[int, str]]:
    """The descriptors this process has open (as :func:`descriptors_open`
    counts them), each as its number and what it names: what a test opened
    and left open is what this has that it had not before, whatever
    another thread closed meanwhile."""
    rendezvous_thread_settled()
    if collected:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            gc.collect()
    found = set()
    for name in os.listdir("/proc/self/fd"):
        try:
            target = os.readlink(f"/proc/self/fd/{name}")
        except OSError:  # (the listing's own, closed by now)
            continue
        if not target.endswith("/fd"):  # (the listing's own: any number, another time)
            found.add((int(name), target))
    return found


async def until(condition, timeout: float = 10) -> None:
    """Loop turns, bounded, until ``condition()`` holds (a state that the
    peer's bytes, EOF or reset bring about, which nothing announces)."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    while not condition():
        assert loop.time() < deadline, "the state never came"
        await asyncio.sleep(0)


WAITED = "waits"  # a parity test's answer for a call that was still waiting when given up on


def answers_that_differ(over_tcp: dict, paired: dict, ask_again) -> dict:
    """The calls whose answers differ over TCP and paired: ``{name: (TCP's,
    paired's)}``. A call that waited (WAITED) on one side only, alone or
    in a sequence of calls, is asked again there, through
    ``ask_again(name, paired)``, given longer: a busy machine may take
    longer than the short wait over a loop turn, which is no difference."""
    differing = {}
    for name, answer in over_tcp.items():
        other = paired[name]
        if answer != other and (_waited(answer) or _waited(other)):
            if _waited(answer):
                answer = ask_again(name, False)
            if _waited(other):
                other = ask_again(name, True)
        if answer != other:
            differing[name] = (answer, other)
    return differing


def _waited(answer: Any) -> bool:
    """Whether ``answer`` is WAITED, or a sequence's (``("returned",
    [each call's answer])``) with a call that was."""
    if answer == WAITED:
        return True
    return (isinstance(answer, tuple) and len(answer) == 2 and isinstance(answer[1], list)
            and WAITED in answer[1])


async def returned(value: Any) -> Any:
    """An awaitable of ``value``: a plain call's answer, asked where a
    parity table's calls are awaited (the call made as the lambda runs)."""
    return value


def report(differing: dict) -> str:
    return "\n".join(f"{name}: TCP {tcp!r}, paired {friend!r}" for name, (tcp, friend) in differing.items())


def keep_a_connection(handle: _handshake.ListenerHandle, address) -> None:
    """What a finished link leaves its listener: an established TCP
    connection to it, accepted here before its server (on any loop, or
    trio) looks."""
    client = socket.socket(handle.kind[0], socket.SOCK_STREAM, socket.IPPROTO_TCP)  # as a connect makes it
    client.connect(address)
    server, _ = handle.sock.accept()
    for sock in (client, server):
        sock.setblocking(False)
    sizes = [sock.getsockopt(socket.SOL_SOCKET, option)
             for sock in (client, server) for option in (socket.SO_SNDBUF, socket.SO_RCVBUF)]
    assert handle.keep(server, client, (client.getsockname(), client.getpeername()), tuple(sizes))


def always_over_kept_connections(monkeypatch, module) -> None:
    """Every connect that ``module`` (which calls ``reused_connect``) makes
    to a listener of its own loop or run goes over a connection the
    listener kept: one is made for it when the listener keeps none."""
    reused_connect = module.reused_connect

    def reuse(entry, address):
        if not entry.handle.kept:
            keep_a_connection(entry.handle, address)
        pending = reused_connect(entry, address)
        assert pending is not None
        return pending

    monkeypatch.setattr(module, "reused_connect", reuse)
