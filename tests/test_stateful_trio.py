"""A trio client moved off TCP against one on TCP, under random sequences.

``test_stateful_blocking``'s machine, its client a ``trio.socket``
socket that ``friendsock.trio.open_tcp_stream()`` connected: trio's own
reads, sends, ``shutdown()`` and ``close()`` over a moved connection,
which have code of their own (``friendsock._trio._across``), answer as
over TCP. Trio runs on a thread of its own, which makes each of the
machine's calls; a read that would wait is cancelled once nothing else
can run, as a non-blocking socket's read gives up (BlockingIOError).
"""

from __future__ import annotations

import errno
import os
import threading
from typing import Any, Awaitable, Callable, List, Tuple

import pytest
import trio
import trio.testing

import friendsock
import friendsock.trio

from test_stateful import QUIET_LIMIT
from test_stateful_blocking import BlockingVsTcp, _read_now, run_against_a_server_process


class TrioThread:
    """A trio run on a thread of its own, making the calls handed to it."""

    def __init__(self) -> None:
        self._started = threading.Event()
        self._thread = threading.Thread(target=trio.run, args=(self._main,), daemon=True)
        self._thread.start()
        assert self._started.wait(QUIET_LIMIT), "trio did not start"

    async def _main(self) -> None:
        self._stop = trio.Event()
        self.token = trio.lowlevel.current_trio_token()
        self._started.set()
        await self._stop.wait()

    def run(self, afn: Callable[..., Awaitable[Any]], *args: Any) -> Any:
        return trio.from_thread.run(afn, *args, trio_token=self.token)

    def run_sync(self, fn: Callable[..., Any], *args: Any) -> Any:
        return trio.from_thread.run_sync(fn, *args, trio_token=self.token)

    def stop(self) -> None:
        self.run_sync(self._stop.set)
        self._thread.join(QUIET_LIMIT)
        assert not self._thread.is_alive(), "trio did not stop"


async def _without_waiting(call: Callable[..., Awaitable[Any]], *args: Any) -> Any:
    """``await call(*args)``, given up once it waits and nothing else can
    run: BlockingIOError then, as a non-blocking socket's call."""
    outcome: List[Tuple[bool, Any]] = []

    async def attempt() -> None:
        try:
            outcome.append((True, await call(*args)))
        except OSError as exc:
            outcome.append((False, exc))

    async with trio.open_nursery() as nursery:
        nursery.start_soon(attempt)
        await trio.testing.wait_all_tasks_blocked()
        nursery.cancel_scope.cancel()
    if not outcome:
        raise BlockingIOError(errno.EAGAIN, os.strerror(errno.EAGAIN))
    done, found = outcome[0]
    if not done:
        raise found
    return found


class TrioClient:
    """A ``trio.socket`` socket whose calls the machine makes as it makes a
    blocking socket's, each on the trio thread; its reads do not wait."""

    def __init__(self, runner: TrioThread, sock: Any) -> None:
        self._runner = runner
        self.sock = sock

    def _now(self, name: str, *args: Any) -> Any:
        return self._runner.run(_without_waiting, getattr(self.sock, name), *args)

    def _sync(self, name: str, *args: Any) -> Any:
        return self._runner.run_sync(getattr(self.sock, name), *args)

    def recv(self, *args: Any) -> Any:
        return self._now("recv", *args)

    def recv_into(self, *args: Any) -> Any:
        return self._now("recv_into", *args)

    def recvfrom(self, *args: Any) -> Any:
        return self._now("recvfrom", *args)

    def recvfrom_into(self, *args: Any) -> Any:
        return self._now("recvfrom_into", *args)

    def recvmsg(self, *args: Any) -> Any:
        return self._now("recvmsg", *args)

    def sendall(self, data: bytes) -> None:
        async def send_all() -> None:
            view = memoryview(data)
            while True:  # (once for no bytes, as sendall())
                view = view[await self.sock.send(view):]
                if not view:
                    return

        self._runner.run(send_all)

    def shutdown(self, how: int) -> None:
        self._sync("shutdown", how)

    def getpeername(self) -> Any:
        return self._sync("getpeername")

    def getsockname(self) -> Any:
        return self._sync("getsockname")

    def getsockopt(self, *args: Any) -> Any:
        return self._sync("getsockopt", *args)

    def setsockopt(self, *args: Any) -> None:
        self._sync("setsockopt", *args)

    def fileno(self) -> int:
        return int(self._sync("fileno"))

    def close(self) -> None:
        self._sync("close")


class TrioVsTcp(BlockingVsTcp):
    trio_thread: TrioThread  # set by the test function

    def _open(self, port: int) -> TrioClient:
        async def connect() -> Any:
            return (await friendsock.trio.open_tcp_stream("127.0.0.1", port)).socket

        return TrioClient(self.trio_thread, self.trio_thread.run(connect))

    def _moved(self, sock: Any) -> bool:
        return friendsock.is_friend(sock.sock)

    def _read(self, sock: Any, how: str, size: int) -> bytes:
        return _read_now(sock, how, size)


@pytest.mark.timeout(600)  # only a failing run, shrinking, takes long
@pytest.mark.parametrize("server_loop", ["asyncio", "uvloop"])
def test_a_trio_client_moved_between_processes_behaves_as_tcp(server_loop):
    TrioVsTcp.trio_thread = TrioThread()
    try:
        run_against_a_server_process(TrioVsTcp, server_loop)
    finally:
        TrioVsTcp.trio_thread.stop()
