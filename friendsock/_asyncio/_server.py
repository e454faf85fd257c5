"""The accepting end of pairing on asyncio: a server that behaves as ``asyncio.Server``.

Its own accept loop is what lets it look every accepted socket up in the
registry: a claimed connect becomes a friend link, anything else goes to the
loop's native transport. A server with ``ssl=`` runs TLS on both: over the
friend link (``_tls``), or the loop's own TLS transport.
"""

from __future__ import annotations

import asyncio
import contextvars
import socket
import sys
import weakref
from asyncio import selector_events, trsock
from functools import partial
from typing import Any, Callable, Dict, List, Optional, Sequence, Tuple

from .._blocking._capable import listen_unregistered
from .._core._link import Link
from .._core._registry import PendingState, registry
from .._core._stats import Fallback, counters
from .._handshake import (
    Entry,
    Pending,
    accept_from,
    adopt_accepted,
    claim_accepted,
    forget_listener,
    make_room,
    register_listener,
)
from .._host import Slot, port_table
from .._host._offers import OUT_OF_RESOURCES, RESET, reset_offered
from .._host._ports import connect_slot, publish_listener, republish_if_cleared, withdraw_listener
from ._across import Offered, rendezvous, start_across
from ._adoption import hold_for_client
from ._loop_state import loop_state
from ._tls import TLSOptions, begin_tls_end
from ._transport import FriendTransport

# As asyncio: how long to stop accepting after running out of descriptors.
_ACCEPT_RETRY_DELAY = 1.0
# 3.12.1 made asyncio.Server.wait_closed() wait for the connections even
# after close(); uvloop's Server does not.
_WAIT_CLOSED_WAITS_FOR_CONNECTIONS = sys.version_info >= (3, 12, 1)
# 3.13 added Server.close_clients() and abort_clients().
_CLOSES_CLIENTS = sys.version_info >= (3, 13)


_MISSING = object()


class _LostCounter:
    """Stands in for a protocol's ``connection_lost`` while the protocol
    serves connections counted in friendsock servers (uvloop's transports
    attach only to uvloop's own servers). A protocol shared by several
    connections has one counter, with one count per connection."""

    __slots__ = ("protocol", "lost", "own", "servers")

    def __init__(self, protocol: asyncio.BaseProtocol) -> None:
        self.protocol = protocol
        self.lost = protocol.connection_lost
        # What the instance itself held, to put back once no count is left.
        self.own = vars(protocol).get("connection_lost", _MISSING)
        self.servers: List["FriendServer"] = []

    @classmethod
    def count(cls, protocol: asyncio.BaseProtocol, server: "FriendServer") -> Optional["_LostCounter"]:
        """Count one connection of ``server`` until ``protocol`` loses one;
        None, and not counted, when the protocol has no ``__dict__`` to
        follow it through."""
        if not hasattr(protocol, "__dict__"):  # __slots__ only (aiohttp's)
            return None
        server._attach()  # (first: refused, nothing is left counted)
        counter = getattr(protocol, "connection_lost", None)
        if not isinstance(counter, cls):
            counter = cls(protocol)
            protocol.connection_lost = counter  # type: ignore[method-assign]
        counter.servers.append(server)
        return counter

    def __call__(self, exc: Optional[BaseException]) -> None:
        try:
            self.lost(exc)  # type: ignore[arg-type]  # (as the transport passes it on)
        finally:
            if self.servers:
                self.uncount(self.servers[0])

    def uncount(self, server: "FriendServer") -> None:
        self.servers.remove(server)
        if not self.servers:
            if self.own is _MISSING:
                vars(self.protocol).pop("connection_lost", None)
            else:
                self.protocol.connection_lost = self.own  # type: ignore[method-assign]
        server._detach()


class FriendServer(asyncio.AbstractServer):
    """Behaves as the ``asyncio.Server`` that ``loop.create_server`` returns."""

    def __init__(
        self,
        loop: asyncio.AbstractEventLoop,
        sockets: List[socket.socket],
        protocol_factory: Callable[[], asyncio.BaseProtocol],
        backlog: int,
        exclusive: bool,
        tls: Optional[TLSOptions] = None,
        taken: Optional[Entry] = None,
    ) -> None:
        self._loop = loop
        self._sockets: Optional[List[socket.socket]] = sockets
        self._entries: List[Entry] = []
        self._published: List[int] = []  # ports in this host's table (_across)
        # The entry of a blocking listener handed in (sock=): its backlog is
        # this server's once it listens (see _start_serving).
        self._taken = taken
        self._protocol_factory = protocol_factory
        self._backlog = backlog
        self._tls = tls
        # As asyncio.Server's, for code that reads them (test helpers do).
        self._ssl_context = tls.sslcontext if tls else None
        self._ssl_handshake_timeout = tls.ssl_handshake_timeout if tls else None
        self._ssl_shutdown_timeout = tls.ssl_shutdown_timeout if tls else None
        self._exclusive = exclusive  # sockets we bound ourselves, no SO_REUSEPORT
        self._active_count = 0
        # The transports of the connections that are not friends, as 3.13's
        # asyncio.Server keeps them (weakly: a transport dropped unclosed
        # still warns), for close_clients() and abort_clients(). Friend
        # ends are found through their links (_friend_ends): no entry per
        # idle link.
        self._clients: "weakref.WeakSet[asyncio.BaseTransport]" = weakref.WeakSet()
        self._waiters: Optional[List[asyncio.Future]] = []
        self._serving = False
        self._serving_forever_fut: Optional[asyncio.Future] = None
        self._accept_context: Optional[contextvars.Context] = None  # set as it starts serving
        self._state = loop_state(loop)
        self._state.servers.add(self)

    def __repr__(self) -> str:
        return f"<{self.__class__.__name__} sockets={self.sockets!r}>"

    # -- connection bookkeeping (called by transports) ---------------------
    # 3.13's transports pass themselves; older ones, uvloop's (see
    # _accept_native) and friend ends do not.
    def _attach(self, transport: Any = None) -> None:
        if self._sockets is None:
            # As asyncio's and uvloop's servers (an assert there): a
            # connection accepted before close() whose transport comes
            # after it gets none, and is closed.
            raise AssertionError("the server is closed")
        self._active_count += 1
        if _CLOSES_CLIENTS and transport is not None:
            self._clients.add(transport)

    def _detach(self, transport: Any = None) -> None:
        if _CLOSES_CLIENTS and transport is not None:
            self._clients.discard(transport)
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
        # What the server's ends are made in: a copy of this context, as
        # the loop's own servers accept in their listeners' reader callbacks.
        self._accept_context = contextvars.copy_context()
        for sock in self._sockets:
            listen_unregistered(sock, self._backlog)
            entry = register_listener(sock, self._state, owner=self._loop, exclusive=self._exclusive)
            # (Not a TLS server's: its clients must do TLS, not move off it.)
            port = publish_listener(sock) if self._tls is None else None
            if port is not None:
                self._published.append(port)
            entry.handle.socketless_accept = self._socketless_accepted
            self._entries.append(entry)
            taken, self._taken = self._taken, None
            if taken is not None:
                registry.move_listener(taken, entry)
            self._loop.add_reader(sock.fileno(), self._accept_ready, sock, entry)

    def _accept_ready(self, sock: socket.socket, entry: Entry) -> None:
        try:
            self._accept_batch(sock, entry)
        finally:
            # Connects held back by a full accept queue may go on now.
            make_room(entry)

    def _accept_batch(self, sock: socket.socket, entry: Entry) -> None:
        handle = entry.handle
        if self._published:
            republish_if_cleared(sock, entry.endpoint[1])
        for _ in range(self._backlog):
            try:
                conn, address = accept_from(sock, handle)
            except (BlockingIOError, InterruptedError, ConnectionAbortedError):
                return
            except OSError as exc:
                if exc.errno not in OUT_OF_RESOURCES:
                    raise
                self._loop.call_exception_handler({
                    "message": "socket.accept() out of system resource",
                    "exception": exc,
                    "socket": trsock.TransportSocket(sock),
                })
                self._loop.remove_reader(sock.fileno())
                self._loop.call_later(_ACCEPT_RETRY_DELAY, self._resume_accepting, sock, entry)
                return
            conn.setblocking(False)
            self._accepted(conn, address, entry)
            if not registry.pending_count():
                # No connect of ours waits: any other connection keeps the
                # listener readable (the loop polls level-triggered), so no
                # accept() that fails closes each batch.
                return

    def _resume_accepting(self, sock: socket.socket, entry: Entry) -> None:
        if self._sockets is not None and self._serving:
            self._loop.add_reader(sock.fileno(), self._accept_ready, sock, entry)

    def _accepted(self, conn: socket.socket, address: Any, entry: Entry) -> None:
        pending, sockname = claim_accepted(conn, address, hold=True, listener=entry.handle)
        if pending is None:
            slot = connect_slot(address, entry.endpoint[1]) if self._published else None
            if slot is None and self._published and port_table() is None:
                self._withdraw()  # switched off since: clients must not wait for an offer
            if slot is not None:
                names = (sockname or entry.handle.accepted_sockname or conn.getsockname(), address)
                self._loop.create_task(self._accept_across(conn, names, slot))
                return
            counters.fallback(Fallback.PEER_NOT_FRIEND, entry.endpoint)
            self._loop.create_task(self._accept_native(conn, address))
        elif pending.state is PendingState.HELD:
            self._loop.create_task(self._accept_held(conn, sockname, address, pending))
        else:
            self._accept_friend(conn, sockname, address, pending)

    async def _accept_held(self, conn: socket.socket, sockname: Any, address: Any,
                           pending: Pending) -> None:
        """A client whose socket its user still holds (the loop's
        sock_connect): a friend once it is adopted, else TCP."""
        if await hold_for_client(self._loop, conn, pending):
            self._accept_friend(conn, sockname, address, pending)
        else:
            await self._accept_native(conn, address)

    def _accept_friend(self, conn: socket.socket, sockname: Any, address: Any,
                       pending: Pending) -> None:
        # The accepted socket is ours alone: its descriptor is seen only if
        # asked for, and with the client's (if that one is too) its
        # connection is kept for a later connect once the link is done.
        threaded = pending.link.threaded
        adopt_accepted(conn, pending, keeper=None if threaded else pending.listener.handle)
        pending.link.server.fd_hidden = not threaded
        self._start_server_end(pending.link, conn, sockname, address)
        if pending.on_claimed is not None:
            pending.on_claimed()

    def _start_server_end(self, link: Link, sock: Any, sockname: Any, address: Any) -> None:
        """The server end of ``link`` on ``sock`` (a real socket, or a
        socketless one's stand-in): its protocol, transport, and TLS."""
        try:
            protocol = self._protocol_factory()
        except (SystemExit, KeyboardInterrupt):
            raise
        except BaseException as exc:
            self._report_accept_error(exc, None, None)
            link.server.close()
            return
        if self._sockets is None:  # closed meanwhile (see _attach)
            self._late_for(protocol, None)
            link.server.close()
            return
        transport = FriendTransport(self._loop, link.server, sock, protocol, sockname, address,
                                    server=self, state=self._state)
        if self._tls is None:
            transport.start()
        else:
            self._start_tls_end(transport, protocol)

    def _socketless_accepted(self, link: Link, sock: Any, address: Any) -> None:
        """A socketless client's link, or one over a connection this
        listener kept (called on the client's thread): its server end is
        accepted on this server's loop, a turn later, as a connection from
        the kernel's backlog would be."""
        loop = self._loop
        try:
            # A link on one loop is not threaded (known when it was made:
            # no get_running_loop(), which costs a getpid() call).
            if not link.threaded:
                loop.call_soon(self._accept_socketless, link, sock, address, context=self._accept_context)
            else:
                loop.call_soon_threadsafe(self._accept_socketless, link, sock, address,
                                          context=self._accept_context)
        except RuntimeError:  # the server's loop closed: as a listener gone
            link.server.reset()

    def _accept_socketless(self, link: Link, sock: Any, address: Any) -> None:
        if not self._serving:  # closed meanwhile: the kernel resets its backlog
            link.server.reset()
            return
        # (Its address is the one the client connected to: a reused
        # connection's real socket is not asked.)
        assert link.addresses is not None
        self._start_server_end(link, sock, link.addresses[1], address)

    def _start_tls_end(self, transport: FriendTransport, protocol: asyncio.BaseProtocol) -> None:
        """The server's TLS over a friend link: the handshake starts now, and
        its outcome is looked at when it is done (no task to wait in)."""
        assert self._tls is not None
        try:
            handshake, app_transport = begin_tls_end(self._loop, transport, self._tls)
        except (SystemExit, KeyboardInterrupt):
            raise
        except BaseException as exc:
            self._handshake_failed(exc, protocol, None)
            return
        handshake.add_done_callback(partial(self._handshake_done, protocol, app_transport))

    def _handshake_done(self, protocol: asyncio.BaseProtocol, app_transport: asyncio.Transport,
                        handshake: "asyncio.Future[None]") -> None:
        exc = None if handshake.cancelled() else handshake.exception()
        if exc is not None:
            app_transport.close()
            self._handshake_failed(exc, protocol, app_transport)

    def _handshake_failed(self, exc: BaseException, protocol: Any, transport: Any) -> None:
        # As the loop's own server: a TLS handshake that fails is the
        # client's business. asyncio reports it in debug mode only, uvloop
        # never (both SSLProtocols log it at debug level).
        if self._loop.get_debug() and isinstance(self._loop, asyncio.BaseEventLoop):
            self._report_accept_error(exc, protocol, transport)

    async def _accept_across(self, conn: socket.socket, names: Tuple[Any, Any], slot: Slot) -> None:
        """A client in another friendsock process of this host, which waits
        for our offer: served over the pair it takes, else over TCP.
        ``names``: the connection's, as ``conn`` has them."""
        across = rendezvous(self._loop)
        try:
            offered = None if across is None else await across.offer(conn, names, slot)
        except OSError:  # no descriptor left for the pair, say: not offered, so TCP
            offered = None
        address = names[1]
        if offered is RESET:  # it took a pair whose proof failed: neither path is safe
            reset_offered(conn)
            return
        await self._accept_native(conn, address, offered)  # type: ignore[arg-type]

    async def _accept_native(self, conn: socket.socket, address: Any,
                             across: Optional[Offered] = None) -> None:
        """A peer that is not a friend: the loop's own transport, counted in
        this server (``wait_closed()`` waits for it as for a friend)."""
        protocol = None
        transport: Optional[asyncio.BaseTransport] = None
        tls = self._tls
        handshaking = False
        try:
            protocol = self._protocol_factory()
            if self._sockets is None:  # refused (see _attach), before a transport half-made
                raise AssertionError("the server is closed")
            if across is not None:
                # Moved to a pair with another process: the transport itself
                # detaches as it is lost, whatever protocol it has by then
                # (STARTTLS replaces it).
                self._attach()
                try:
                    transport = await start_across(across.rendezvous, across.pair_end, conn,
                                                   across.names, protocol, across.peer,
                                                   client=False, on_lost=self._detach)
                except BaseException:
                    across.pair_end.close()
                    self._detach()
                    raise
                if _CLOSES_CLIENTS:
                    self._clients.add(transport)
            elif isinstance(self._loop, selector_events.BaseSelectorEventLoop):
                # What asyncio.Server's own accept does: the transport
                # attaches to the server and detaches when it is lost.
                waiter = self._loop.create_future()
                extra = {"peername": address}
                if tls is None:
                    transport = self._loop._make_socket_transport(  # type: ignore[attr-defined]
                        conn, protocol, waiter=waiter, extra=extra, server=self)
                else:
                    handshaking = True
                    transport = self._loop._make_ssl_transport(  # type: ignore[attr-defined]
                        conn, protocol, tls.sslcontext, waiter, server_side=True, extra=extra,
                        server=self, **tls.timeouts())
                try:
                    await waiter
                except BaseException:
                    transport.close()
                    raise
            else:
                # uvloop's transports only attach to uvloop's own servers:
                # count the connection through its protocol instead.
                counter = _LostCounter.count(protocol, self)
                ssl: Dict[str, Any] = {}
                if tls is not None:
                    handshaking = True
                    ssl = {"ssl": tls.sslcontext, **tls.timeouts()}
                try:
                    transport, _ = await self._loop.connect_accepted_socket(lambda: protocol, conn, **ssl)
                except BaseException:
                    if counter is not None and self in counter.servers:
                        counter.uncount(self)
                    raise
                if _CLOSES_CLIENTS and counter is not None:
                    # (Left here once lost: closing it again does nothing.)
                    self._clients.add(transport)
        except (SystemExit, KeyboardInterrupt):
            raise
        except BaseException as exc:
            if transport is None:
                conn.close()  # (uvloop detaches a socket it took: no double close)
                if across is not None:
                    across.pair_end.close()
            if self._sockets is None and isinstance(exc, AssertionError):
                self._late_for(protocol, transport, exc)
            elif handshaking:
                self._handshake_failed(exc, protocol, transport)
            else:
                self._report_accept_error(exc, protocol, transport)

    def _late_for(self, protocol: Any, transport: Any,
                  exc: Optional[BaseException] = None) -> None:
        """A connection accepted before close() came to its transport after
        it, and was closed: the loops report that in debug mode only."""
        if self._loop.get_debug():
            self._report_accept_error(exc or AssertionError("the server is closed"),
                                      protocol, transport)

    def _report_accept_error(self, exc: BaseException, protocol: Any, transport: Any) -> None:
        context = {
            "message": "Error on transport creation for incoming connection",
            "exception": exc,
        }
        if protocol is not None:
            context["protocol"] = protocol
        if transport is not None:
            context["transport"] = transport
        self._loop.call_exception_handler(context)

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

    if _CLOSES_CLIENTS:
        # On every loop: uvloop's own Server has neither (uvloop 0.23).
        def close_clients(self) -> None:
            for transport in self._connections():
                transport.close()

        def abort_clients(self) -> None:
            for transport in self._connections():
                transport.abort()

        def _connections(self) -> List[asyncio.Transport]:
            friend_ends = [end for end in self._state._ends_here()
                           if isinstance(end, FriendTransport) and end._server is self]
            return [*friend_ends, *self._clients.copy()]  # type: ignore[list-item]

    def _withdraw(self) -> None:
        for port in self._published:
            withdraw_listener(port)
        self._published = []

    def _forget_listeners(self) -> None:
        self._withdraw()
        taken, self._taken = self._taken, None
        for entry in self._entries + ([taken] if taken is not None else []):
            forget_listener(entry)
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
        try:
            self._forget_listeners()
        finally:
            for sock in sockets:
                sock.close()

    def get_loop(self) -> asyncio.AbstractEventLoop:
        return self._loop

    def is_serving(self) -> bool:
        return self._serving

    @property
    def sockets(self) -> Sequence[trsock.TransportSocket]:
        listed = [trsock.TransportSocket(s) for s in self._sockets or ()]
        return listed if self._state.lists_server_sockets else tuple(listed)

    async def start_serving(self) -> None:
        if self._sockets is None:
            # The loops' own servers fail so (iterating None), and say they
            # serve from then on.
            self._serving = True
            raise TypeError(f"{self!r} is closed: it cannot start serving")
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
        if self._sockets is None and not (
            _WAIT_CLOSED_WAITS_FOR_CONNECTIONS and isinstance(self._loop, asyncio.BaseEventLoop)
        ):
            return
        waiter = self._loop.create_future()
        self._waiters.append(waiter)
        await waiter
