"""The workloads on the trio loop: ``stream``, ``rr`` and ``crr`` over trio's
own TCP, trio over AF_UNIX, friendsock's trio front door and
``trio.testing.memory_stream_pair()``.

This module imports trio and not asyncio (the house rule: no module imports
both). Each step is one ``trio.run`` (see ``_trio_runner``), so nothing trio
made outlives its run: every round sets up its server and connections,
warms up, measures, and closes them again. The runner still interleaves the
transports' rounds and rotates their order, as on the asyncio loops.

Transports:

- ``tcp``: ``trio.serve_tcp`` / ``trio.open_tcp_stream`` (``trio.SocketStream``);
- ``unix``: a ``trio.SocketListener`` on an AF_UNIX trio socket /
  ``trio.open_unix_socket``;
- ``friends``: ``friendsock.trio.serve_tcp`` / ``friendsock.trio.open_tcp_stream``;
- ``socketless``: the same, its connects socketless (``rr`` and ``crr``);
- ``memory``: ``trio.testing.memory_stream_pair()``, the in-memory stream
  users pick today (both ends are in the process anyway).

The ``anyio`` loop runs the same workloads through anyio's API on its trio
backend (``anyio.create_tcp_listener`` / ``anyio.connect_tcp``, and
``anyio.connect_unix``): ``friends`` there is that same unchanged code with
``friendsock.trio.install()`` in force for the round, as a user switches it
on (``socketless``: and its connects socketless). anyio's streams are driven through a thin adapter (``send_all``,
``receive_some``), the same on every transport.
"""

from __future__ import annotations

import functools
import itertools
import os
import time
from typing import Any, Awaitable, Callable, List, Optional, Tuple

import trio
import trio.testing

try:
    import anyio
    import anyio.abc
except ImportError:  # only the anyio loop needs it
    anyio = None  # type: ignore[assignment]

import friendsock

from ._transports import BACKLOG, FRIEND_TRANSPORTS, HOST, TRANSPORTS, socketless_connects
from ._samples import Sample, fallback_delta, moved_verdict

# How long a round waits for a server end to appear or close.
_SETTLE_TIMEOUT = 10.0

Handler = Callable[[Any], Awaitable[None]]

_socket_names = itertools.count()


def friends_api() -> Any:
    """``friendsock.trio``, or a clear error where it does not import."""
    try:
        import friendsock.trio as api
    except ImportError as exc:
        raise RuntimeError(f"friendsock.trio does not import: {exc}") from None
    return api


async def until(condition: Callable[[], bool], what: str, timeout: float = _SETTLE_TIMEOUT) -> None:
    """Poll ``condition`` (a server task's count) until it holds."""
    with trio.move_on_after(timeout) as scope:
        while not condition():
            await trio.sleep(0.0005)
    if scope.cancelled_caught:
        raise TimeoutError(f"timed out waiting for {what}")


async def _run_handler(handler: Handler, stream: Any) -> None:
    # What trio.serve_listeners does for each accepted connection.
    try:
        await handler(stream)
    finally:
        await trio.aclose_forcefully(stream)


class AnyioStream:
    """An anyio byte stream with the trio stream methods the workloads call
    (EOF as b"")."""

    __slots__ = ("stream", "send_all", "aclose")

    def __init__(self, stream: Any) -> None:
        self.stream = stream
        self.send_all = stream.send
        self.aclose = stream.aclose

    async def receive_some(self, max_bytes: int = 65536) -> bytes:
        try:
            return await self.stream.receive(max_bytes)
        except anyio.EndOfStream:
            return b""


class TrioEndpoint:
    """One server of one transport inside one ``trio.run``, and how clients
    reach it. ``serve`` starts it in ``nursery``; cancelling that nursery
    stops it. ``api``: ``trio``, or ``anyio`` (its API on trio)."""

    def __init__(self, transport: str, tmpdir: str, api: str = "trio") -> None:
        if transport not in TRANSPORTS:
            raise ValueError(f"unknown transport {transport!r}")
        if api == "anyio" and transport == "memory":
            raise ValueError("the anyio loop has no memory transport")
        self.transport = transport
        self.api = api
        self._tmpdir = tmpdir
        self.port: Optional[int] = None
        self.path: Optional[str] = None
        self._api: Any = friends_api() if transport in FRIEND_TRANSPORTS else None
        self._installed = False
        self._nursery: Optional[trio.Nursery] = None
        self._handler: Optional[Handler] = None

    def is_friend(self, stream: Any) -> bool:
        if self._api is None:
            return False
        if isinstance(stream, AnyioStream):  # anyio's trio stream keeps its trio socket
            stream = getattr(stream.stream, "_trio_socket", None)
        return bool(self._api.is_friend(stream))

    async def serve(self, nursery: trio.Nursery, handler: Handler) -> None:
        if self.api == "anyio":
            await self._serve_anyio(nursery, handler)
            return
        transport = self.transport
        if transport == "tcp":
            listeners = await nursery.start(functools.partial(
                trio.serve_tcp, handler, 0, host=HOST, backlog=BACKLOG))
            self.port = listeners[0].socket.getsockname()[1]
        elif transport in FRIEND_TRANSPORTS:
            listeners = await nursery.start(functools.partial(
                self._api.serve_tcp, handler, 0, host=HOST, backlog=BACKLOG))
            self.port = listeners[0].socket.getsockname()[1]
        elif transport == "unix":
            self.path = os.path.join(self._tmpdir, f"t{os.getpid()}-{next(_socket_names)}.sock")
            sock = trio.socket.socket(trio.socket.AF_UNIX, trio.socket.SOCK_STREAM)
            try:
                await sock.bind(self.path)
                sock.listen(BACKLOG)
            except BaseException:
                sock.close()
                raise
            await nursery.start(trio.serve_listeners, handler, [trio.SocketListener(sock)])
        else:  # memory: each connect hands the server half to the handler
            self._nursery = nursery
            self._handler = handler

    async def _serve_anyio(self, nursery: trio.Nursery, handler: Handler) -> None:
        if self.transport in FRIEND_TRANSPORTS:
            self._api.install()
            self._installed = True
        listener: Any
        if self.transport == "unix":
            self.path = os.path.join(self._tmpdir, f"a{os.getpid()}-{next(_socket_names)}.sock")
            listener = await anyio.create_unix_listener(self.path)
        else:
            listener = await anyio.create_tcp_listener(local_host=HOST, backlog=BACKLOG)
            self.port = listener.extra(anyio.abc.SocketAttribute.local_port)

        async def serve_one(stream: Any) -> None:
            await _run_handler(handler, AnyioStream(stream))

        async def serve(task_status: Any = trio.TASK_STATUS_IGNORED) -> None:
            async with listener:
                task_status.started()
                await listener.serve(serve_one)

        await nursery.start(serve)

    async def connect(self) -> Any:
        transport = self.transport
        if self.api == "anyio":
            if transport == "unix":
                assert self.path is not None, "serve() first"
                return AnyioStream(await anyio.connect_unix(self.path))
            assert self.port is not None, "serve() first"
            with socketless_connects(transport):
                return AnyioStream(await anyio.connect_tcp(HOST, self.port))
        if transport == "tcp":
            assert self.port is not None, "serve() first"
            return await trio.open_tcp_stream(HOST, self.port)
        if transport in FRIEND_TRANSPORTS:
            with socketless_connects(transport):
                return await self._api.open_tcp_stream(HOST, self.port)
        if transport == "unix":
            assert self.path is not None, "serve() first"
            return await trio.open_unix_socket(self.path)
        assert self._nursery is not None and self._handler is not None
        client, server = trio.testing.memory_stream_pair()
        self._nursery.start_soon(_run_handler, self._handler, server)
        await trio.lowlevel.checkpoint()
        return client

    def close(self) -> None:
        if self._installed:
            self._api.uninstall()
            self._installed = False
        if self.path is not None:
            try:
                os.unlink(self.path)
            except OSError:
                pass
            self.path = None


class Tally:
    """What the server tasks saw."""

    __slots__ = ("bytes", "ends", "made", "friend_ends", "lost")

    def __init__(self) -> None:
        self.bytes = 0
        self.ends: List[Any] = []
        self.made = 0
        self.friend_ends = 0
        self.lost = 0


class _State:
    __slots__ = ("running", "done", "sent", "opened", "not_friend")

    def __init__(self) -> None:
        self.running = True
        self.done = 0
        self.sent = 0
        self.opened = 0
        self.not_friend = 0


async def _receive_exactly(stream: Any, size: int) -> None:
    got = 0
    while got < size:
        data = await stream.receive_some()
        if not data:
            raise ConnectionError(f"connection closed after {got} of {size} bytes")
        got += len(data)


class TrioWorkload:
    """One transport's part of one table row on the trio loop. ``setup`` and
    ``close`` have nothing to keep: each ``measure`` is a whole round."""

    def __init__(self, transport: str, tmpdir: str, size: int, api: str = "trio") -> None:
        self.transport = transport
        self.tmpdir = tmpdir
        self.size = size
        self.api = api

    def endpoint(self) -> TrioEndpoint:
        return TrioEndpoint(self.transport, self.tmpdir, self.api)

    async def setup(self) -> None:
        # Fails early (the cell says why) where friendsock.trio is missing.
        self.endpoint()
        await trio.lowlevel.checkpoint()

    async def measure(self, seconds: float, warmup: float) -> Sample:
        raise NotImplementedError

    async def close(self, abort: bool = False) -> None:
        await trio.lowlevel.checkpoint()

    async def _timed(self, client: Callable[[_State], Awaitable[None]], state: _State,
                     seconds: float, warmup: float,
                     count: Callable[[], float]) -> Tuple[float, int]:
        """Run ``client`` for a warm-up and the measured time; ``count``'s
        growth per second over the measured time, and ``bytes_moved``
        before it."""
        async with trio.open_nursery() as nursery:
            nursery.start_soon(client, state)
            try:
                await trio.sleep(warmup)
                moved = friendsock.stats().bytes_moved
                before, start = count(), time.perf_counter()
                await trio.sleep(seconds)
                after, elapsed = count(), time.perf_counter() - start
            finally:
                state.running = False  # the client ends its transaction and returns
        return (after - before) / elapsed, moved

    def _links_verdict(self, ends: List[Any], before: friendsock.FriendStats,
                       endpoint: TrioEndpoint) -> Tuple[Optional[bool], Optional[str]]:
        if self.transport not in FRIEND_TRANSPORTS:
            return None, None
        friends = sum(1 for end in ends if endpoint.is_friend(end))
        made = friendsock.stats().links_made - before.links_made
        if ends and friends == len(ends) and made >= len(ends) // 2:
            return True, None
        return False, (f"friends fell back to TCP: {len(ends) - friends} of {len(ends)} "
                       f"connection ends are not friends (fallbacks: {fallback_delta(before)})")


class _OneConnection(TrioWorkload):
    """A round over one connection: serve, connect, run, close."""

    async def _server(self, stream: Any, tally: Tally) -> None:
        raise NotImplementedError

    async def _client(self, stream: Any, state: _State) -> None:
        raise NotImplementedError

    def _count(self, tally: Tally, state: _State) -> float:
        raise NotImplementedError

    async def measure(self, seconds: float, warmup: float) -> Sample:
        endpoint = self.endpoint()
        tally = Tally()

        async def handler(stream: Any) -> None:
            tally.ends.append(stream)
            try:
                await self._server(stream, tally)
            finally:
                tally.lost += 1

        try:
            async with trio.open_nursery() as servers:
                before = friendsock.stats()
                await endpoint.serve(servers, handler)
                stream = await endpoint.connect()
                try:
                    await until(lambda: len(tally.ends) >= 1, "the server to accept")
                    ok, note = self._links_verdict([stream, tally.ends[0]], before, endpoint)
                    state = _State()
                    value, moved = await self._timed(
                        lambda s: self._client(stream, s), state, seconds, warmup,
                        lambda: self._count(tally, state))
                finally:
                    await stream.aclose()
                # The server end sees the EOF (after the bytes still in flight).
                await until(lambda: tally.lost >= 1, "the server end to close")
                servers.cancel_scope.cancel()
        finally:
            endpoint.close()
        ok, note = moved_verdict(ok, note, moved)
        return Sample(value, ok, note)


class TrioStreamWorkload(_OneConnection):
    """TCP_STREAM: ``send_all`` of ``size``-byte writes; the server counts
    bytes; Mbit/s."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.payload = b"x" * self.size

    async def _server(self, stream: Any, tally: Tally) -> None:
        receive = stream.receive_some
        while True:
            data = await receive()
            if not data:
                return
            tally.bytes += len(data)

    async def _client(self, stream: Any, state: _State) -> None:
        send, payload = stream.send_all, self.payload
        while state.running:
            await send(payload)

    def _count(self, tally: Tally, state: _State) -> float:
        return tally.bytes * 8 / 1e6


class TrioRRWorkload(_OneConnection):
    """TCP_RR: a ``size``-byte request, a ``size``-byte response once the
    whole request arrived; one outstanding; trans/s."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.payload = b"q" * self.size

    async def _server(self, stream: Any, tally: Tally) -> None:
        receive, send = stream.receive_some, stream.send_all
        size, response = self.size, self.payload
        got = 0
        while True:
            data = await receive()
            if not data:
                return
            got += len(data)
            while got >= size:
                got -= size
                await send(response)

    async def _client(self, stream: Any, state: _State) -> None:
        receive, send = stream.receive_some, stream.send_all
        size, request = self.size, self.payload
        while state.running:
            await send(request)
            got = 0
            while got < size:
                data = await receive()
                if not data:
                    raise ConnectionError("request/response connection lost mid-round")
                got += len(data)
            state.done += 1

    def _count(self, tally: Tally, state: _State) -> float:
        return state.done


class TrioCRRWorkload(TrioWorkload):
    """TCP_CRR: connect, request, response, close (the client closes after
    the response, the server on EOF); trans/s."""

    async def measure(self, seconds: float, warmup: float) -> Sample:
        endpoint = self.endpoint()
        tally = Tally()
        size = self.size
        payload = b"c" * size

        async def handler(stream: Any) -> None:
            tally.made += 1
            if endpoint.is_friend(stream):
                tally.friend_ends += 1
            try:
                await _receive_exactly(stream, size)
                await stream.send_all(payload)
                while await stream.receive_some():
                    pass
            finally:
                tally.lost += 1

        async def client(state: _State) -> None:
            while state.running:
                stream = await endpoint.connect()
                state.opened += 1
                try:
                    if self.transport in FRIEND_TRANSPORTS and not endpoint.is_friend(stream):
                        state.not_friend += 1
                    await stream.send_all(payload)
                    await _receive_exactly(stream, size)
                finally:
                    await stream.aclose()
                state.done += 1

        state = _State()
        try:
            async with trio.open_nursery() as servers:
                before = friendsock.stats()
                await endpoint.serve(servers, handler)
                value, _ = await self._timed(client, state, seconds, warmup, lambda: state.done)
                await until(lambda: tally.lost >= state.opened, "server ends to close")
                servers.cancel_scope.cancel()
        finally:
            endpoint.close()
        ok: Optional[bool] = None
        note: Optional[str] = None
        if self.transport in FRIEND_TRANSPORTS:
            made = friendsock.stats().links_made - before.links_made
            ok = (state.not_friend == 0 and tally.friend_ends == state.opened
                  and made >= state.opened)
            if not ok:
                note = (f"friends fell back to TCP: {state.not_friend} of {state.opened} client "
                        f"ends and {state.opened - tally.friend_ends} server ends not friends "
                        f"(fallbacks: {fallback_delta(before)})")
        return Sample(value, ok, note)


def make_workload(case_key: str, param: int, transport: str, tmpdir: str,
                  api: str = "trio") -> TrioWorkload:
    if case_key == "stream":
        return TrioStreamWorkload(transport, tmpdir, size=param, api=api)
    if case_key == "rr":
        return TrioRRWorkload(transport, tmpdir, size=param, api=api)
    if case_key == "crr":
        return TrioCRRWorkload(transport, tmpdir, size=param, api=api)
    raise ValueError(f"the trio loop has no {case_key!r} workload")
