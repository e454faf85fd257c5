"""A friendsock server: ``asyncio.Server``'s behaviour over its own accept loop.

Its own accept loop is what lets it look every accepted socket up in the
registry: a claimed connect becomes a friend link, anything else goes to the
loop's native ``connect_accepted_socket``.
"""

from __future__ import annotations

import asyncio
import errno
import socket
import sys
from asyncio import trsock
from typing import Any, Callable, List, Optional, Tuple

from .._core._registry import ListenerEntry, PendingConnect, registry
from .._core._stats import counters
from .._handshake import ListenerHandle, adopt_accepted, claim_accepted
from ._transport import FriendTransport, loop_state

# As asyncio: how long to stop accepting after running out of descriptors.
_ACCEPT_RETRY_DELAY = 1.0
_RESOURCE_ERRNOS = (errno.EMFILE, errno.ENFILE, errno.ENOBUFS, errno.ENOMEM)
# 3.12.1 made wait_closed() wait for the connections even after close().
_WAIT_CLOSED_WAITS_FOR_CONNECTIONS = sys.version_info >= (3, 12, 1)


class FriendServer(asyncio.AbstractServer):
    """Behaves as the ``asyncio.Server`` that ``loop.create_server`` returns."""

    def __init__(
        self,
        loop: asyncio.AbstractEventLoop,
        sockets: List[socket.socket],
        protocol_factory: Callable[[], asyncio.BaseProtocol],
        backlog: int,
        exclusive: bool,
    ) -> None:
        self._loop = loop
        self._sockets: Optional[List[socket.socket]] = sockets
        self._entries: List[ListenerEntry] = []
        self._protocol_factory = protocol_factory
        self._backlog = backlog
        self._exclusive = exclusive  # sockets we bound ourselves, no SO_REUSEPORT
        self._active_count = 0
        self._waiters: Optional[List[asyncio.Future]] = []
        self._serving = False
        self._serving_forever_fut: Optional[asyncio.Future] = None
        self._state = loop_state(loop)
        self._state.servers.add(self)

    def __repr__(self) -> str:
        return f"<{self.__class__.__name__} sockets={self.sockets!r}>"

    # -- connection bookkeeping (called by transports) ---------------------
    def _attach(self) -> None:
        self._active_count += 1

    def _detach(self) -> None:
        self._active_count -= 1
        if self._active_count == 0 and self._sockets is None:
            self._wakeup()

    def _wakeup(self) -> None:
        waiters = self._waiters
        self._waiters = None
        for waiter in waiters or ():
            if not waiter.done():
                waiter.set_result(None)

    # -- serving -----------------------------------------------------------
    def _start_serving(self) -> None:
        if self._serving or self._sockets is None:
            return
        self._serving = True
        for sock in self._sockets:
            sock.listen(self._backlog)
            v6only = False
            if sock.family == socket.AF_INET6:
                v6only = bool(sock.getsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY))
            entry = ListenerEntry(
                sock.getsockname(),
                v6only=v6only,
                exclusive=self._exclusive,
                owner=self._loop,
                handle=ListenerHandle(sock, self._state),
            )
            registry.add_listener(entry)
            self._entries.append(entry)
            self._loop.add_reader(sock.fileno(), self._accept_ready, sock)

    def _accept_ready(self, sock: socket.socket) -> None:
        for _ in range(self._backlog):
            try:
                conn, address = sock.accept()
            except (BlockingIOError, InterruptedError, ConnectionAbortedError):
                return
            except OSError as exc:
                if exc.errno not in _RESOURCE_ERRNOS:
                    raise
                self._loop.call_exception_handler({
                    "message": "socket.accept() out of system resource",
                    "exception": exc,
                    "socket": trsock.TransportSocket(sock),
                })
                self._loop.remove_reader(sock.fileno())
                self._loop.call_later(_ACCEPT_RETRY_DELAY, self._resume_accepting, sock)
                return
            conn.setblocking(False)
            self._accepted(conn, address)

    def _resume_accepting(self, sock: socket.socket) -> None:
        if self._sockets is not None and self._serving:
            self._loop.add_reader(sock.fileno(), self._accept_ready, sock)

    def _accepted(self, conn: socket.socket, address: Any) -> None:
        pending, sockname = claim_accepted(conn, address)
        if pending is None:
            counters.fallback("peer-not-friend")
            self._loop.create_task(self._accept_native(conn))
            return
        self._accept_friend(conn, sockname, address, pending)

    def _accept_friend(self, conn: socket.socket, sockname: Any, address: Any,
                       pending: PendingConnect) -> None:
        link = pending.link
        adopt_accepted(conn, pending)
        try:
            protocol = self._protocol_factory()
        except (SystemExit, KeyboardInterrupt):
            raise
        except BaseException as exc:
            self._loop.call_exception_handler({
                "message": "Error on transport creation for incoming connection",
                "exception": exc,
            })
            link.server.close()
        else:
            FriendTransport(self._loop, link.server, conn, protocol, sockname, address,
                            server=self, state=self._state).start()
        if pending.on_claimed is not None:
            pending.on_claimed()

    async def _accept_native(self, conn: socket.socket) -> None:
        try:
            await self._loop.connect_accepted_socket(
                self._protocol_factory, conn
            )
        except (SystemExit, KeyboardInterrupt):
            raise
        except BaseException as exc:
            conn.close()
            self._loop.call_exception_handler({
                "message": "Error on transport creation for incoming connection",
                "exception": exc,
            })

    # -- asyncio.AbstractServer -------------------------------------------
    def close(self) -> None:
        sockets = self._sockets
        if sockets is None:
            return
        self._sockets = None
        for sock in sockets:
            if self._serving:
                self._loop.remove_reader(sock.fileno())
        self._forget_listeners()
        for sock in sockets:
            sock.close()
        self._serving = False
        if self._serving_forever_fut is not None and not self._serving_forever_fut.done():
            self._serving_forever_fut.cancel()
            self._serving_forever_fut = None
        if self._active_count == 0:
            self._wakeup()

    def _forget_listeners(self) -> None:
        for entry in self._entries:
            for orphan in registry.remove_listener(entry):
                # The kernel resets what still waits in a closing backlog. A
                # confirmed connect (not established) watches its own socket
                # instead: a listener shared with another process stays open
                # there, and the connect goes on over TCP.
                if orphan.link.established:
                    orphan.link.server.reset()
        self._entries = []

    def _loop_gone(self) -> None:
        """Our loop closed while we listened (called on the closing thread):
        stop listening without touching the loop. Clients on other loops
        must not pair with an accept loop that will never run again."""
        sockets = self._sockets
        if sockets is None:
            return
        self._sockets = None
        self._serving = False
        self._forget_listeners()
        for sock in sockets:
            sock.close()

    def get_loop(self) -> asyncio.AbstractEventLoop:
        return self._loop

    def is_serving(self) -> bool:
        return self._serving

    @property
    def sockets(self) -> Tuple[trsock.TransportSocket, ...]:
        if self._sockets is None:
            return ()
        return tuple(trsock.TransportSocket(s) for s in self._sockets)

    async def start_serving(self) -> None:
        self._start_serving()
        # One loop iteration, so the add_reader calls take effect (as asyncio).
        await asyncio.sleep(0)

    async def serve_forever(self) -> None:
        if self._serving_forever_fut is not None:
            raise RuntimeError(f"server {self!r} is already being awaited on serve_forever()")
        if self._sockets is None:
            raise RuntimeError(f"server {self!r} is closed")
        self._start_serving()
        self._serving_forever_fut = self._loop.create_future()
        try:
            await self._serving_forever_fut
        except asyncio.CancelledError:
            try:
                self.close()
                await self.wait_closed()
            finally:
                raise
        finally:
            self._serving_forever_fut = None

    async def wait_closed(self) -> None:
        if self._waiters is None:
            return
        if self._sockets is None and not _WAIT_CLOSED_WAITS_FOR_CONNECTIONS:
            return
        waiter = self._loop.create_future()
        self._waiters.append(waiter)
        await waiter
