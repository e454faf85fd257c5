"""A trio socket's connection to another process of this host.

As a blocking socket's (``_blocking._across``, whose thread takes the
offers for trio's connects too): a connect to a loopback port that another
friendsock process serves binds first, waits for that process's offer once
trio's own connect is done, and takes it. The socket under the trio socket
becomes an ``AcrossSocket`` on the same descriptor number, now the pair's
end, so trio's reads, writes and waits are its own there, and the names
and options are the TCP connection's.

A trio listener's accept offers a connection whose client, in another
friendsock process, waits for one, as a blocking server's accept does
(the offer and its answer on a worker thread), and hands out the trio
socket moved the same way (:func:`accept_across`).
"""

from __future__ import annotations

import collections
import socket
import threading
from typing import Any, Awaitable, Callable, Deque, Optional, Tuple, cast

import trio

from .._blocking._across import (Rendezvous, TakenOffer, expect_offer, move_onto_pair,
                                 offer_accepted)
from .._blocking._capable import FriendCapableSocket
from .._core._stats import Fallback, counters
from .._handshake._tcp_info import family_of
from .._host._offers import OFFER_TIMEOUT, Peer, reset_offered
from .._host._ports import connect_slot, served_elsewhere
from ._socket import TrioSocketType

NativeConnect = Callable[[Any, Any], Awaitable[None]]
_from_stdlib_socket = trio.socket.from_stdlib_socket  # (trio's own, whatever install() patches)


def may_cross(sock: socket.socket, resolved: Any) -> bool:
    """Whether a connect of ``sock`` to ``resolved`` (no listener of this
    process there) is one to another friendsock process of this host."""
    return served_elsewhere(resolved[0], resolved[1], family_of(sock))


async def connect_across(trio_sock: Any, resolved: Any, native: NativeConnect) -> bool:
    """trio's ``connect()`` (``native``) of ``trio_sock`` to ``resolved``, a
    loopback port another friendsock process serves, made, and the
    connection moved off TCP if that process offers it in time (True,
    either way); False, nothing done, where it is not to be tried."""
    sock = trio_sock._sock
    expecting = expect_offer(sock, resolved)
    if expecting is None:
        return False
    rendezvous, wait = expecting
    settled = trio.Event()
    token = trio.lowlevel.current_trio_token()
    wait.on_settled = lambda: token.run_sync_soon(settled.set)
    try:
        await native(trio_sock, resolved)
        # A caller's deadline nearer than the offer's: half of what is
        # left of it, so that the connect returns, TCP's, before it, with
        # time left for what the caller does with the connection.
        left = trio.current_effective_deadline() - trio.current_time()
        with trio.move_on_after(max(0.0, min(OFFER_TIMEOUT, left / 2))) as waiting:
            async with trio.open_nursery() as nursery:
                # Anything on the TCP socket (a reset, EOF, bytes): the
                # process that accepted it offers nothing, and TCP's it is.
                nursery.start_soon(_until_readable, sock, waiting)
                await settled.wait()
                waiting.cancel()
    except BaseException:
        # Cancelled or failed: an offer taken meanwhile ends (EOF on the
        # pair), as the connection does (trio closes a socket whose
        # connect was cut short).
        taken = rendezvous.end_wait(wait)
        if taken is not None:
            taken.close()
        raise
    taken = rendezvous.end_wait(wait)
    if taken is None:
        counters.fallback(Fallback.NOT_OFFERED, resolved)
        return True
    _take(trio_sock, taken, wait.names(), wait.peer, rendezvous, client=True)
    return True


async def _until_readable(sock: socket.socket, scope: trio.CancelScope) -> None:
    await trio.lowlevel.wait_readable(sock)
    scope.cancel()


async def accept_across(listener: Any, conn: socket.socket, address: Any,
                        listener_port: int) -> Any:
    """The trio socket of ``conn``, which ``listener`` (what keeps its port
    ``listener_port`` published) accepted from ``address``, moved onto the
    pair if a friendsock process of this host connected it and took the
    offer; None for TCP (``conn`` reset where the offer went wrong, as a
    blocking server's accept: ``_blocking._across.offer_accepted``).
    Cancelled while the answer is awaited, the connection is held for the
    listener's next accept (:func:`held_connection`), as the kernel's
    backlog keeps a connection no accept took."""
    if connect_slot(address, listener_port) is None:  # (the usual case: no thread)
        return None
    offer = _Offer(conn, address, listener_port)
    try:
        taken = await trio.to_thread.run_sync(offer.make, address, listener_port, abandon_on_cancel=True)
    except trio.Cancelled:
        offer.hold()
        listener.__dict__.setdefault(_HELD, collections.deque()).append(offer)
        raise
    return _moved(conn, taken)


async def held_connection(listener: Any) -> Optional[Tuple[Any, socket.socket, Any]]:
    """The first connection a cancelled accept of ``listener`` left, once
    its offer is answered: its trio socket if it moved (None for TCP), the
    connection and its address; None if none is held. Cancelled, it stays
    held."""
    held: Optional[Deque[_Offer]] = listener.__dict__.get(_HELD)
    if not held:
        return None
    offer = held[0]
    assert offer.finished is not None
    await offer.finished.wait()
    held.popleft()
    return _moved(offer.conn, offer.taken), offer.conn, offer.address


def drop_held(listener: Any) -> None:
    """``listener`` closes: the connections its accepts left are reset, as
    the kernel resets its backlog."""
    held: Deque[_Offer] = listener.__dict__.pop(_HELD, collections.deque())
    while held:
        held.popleft().abandon()


def _moved(conn: socket.socket, taken: Optional[TakenOffer]) -> Any:
    if taken is None:
        return None
    trio_sock = _from_stdlib_socket(conn)
    _take(trio_sock, taken.pair_end, taken.names, taken.peer, taken.rendezvous, client=False)
    return trio_sock


_HELD = "_friendsock_held_offers"


class _Offer:
    """An offer made on a worker thread for a trio task, which may leave it
    (cancelled): held for a later accept, woken as the answer comes, or
    abandoned, whichever of the two finishes last undoing what it came to."""

    def __init__(self, conn: socket.socket, address: Any, listener_port: int) -> None:
        self.conn = conn
        self.address = address
        self.listener_port = listener_port
        self.lock = threading.Lock()
        self.abandoned = False
        self.started = False  # (made once, by whichever thread begins first)
        self.done = False
        self.taken: Optional[TakenOffer] = None
        # Held: set, in the trio run (``wake``), once the answer is in.
        self.finished: Optional[trio.Event] = None
        self.wake: Optional[trio.lowlevel.TrioToken] = None

    def make(self, address: Any, listener_port: int) -> Optional[TakenOffer]:
        with self.lock:
            if self.started:
                return None
            self.started = True
        taken = offer_accepted(self.conn, address, listener_port)
        with self.lock:
            self.done, self.taken = True, taken
            if self.abandoned:
                self._undo()
            wake = self.wake
        if wake is not None:
            try:
                wake.run_sync_soon(self._finish)
            except trio.RunFinishedError:  # nobody left to accept it
                self.abandon()
        return taken

    def hold(self) -> None:
        """Left by its accept, in the trio run: a later one takes it."""
        self.finished = trio.Event()
        with self.lock:
            if self.done:
                self.finished.set()
                return
            self.wake = trio.lowlevel.current_trio_token()
            started = self.started
        if not started:
            # Cancelled before trio began its thread (it checks first), or
            # just after: a thread of its own makes the offer, once.
            threading.Thread(target=self.make, args=(self.address, self.listener_port),
                             name="friendsock-offer", daemon=True).start()

    def _finish(self) -> None:
        assert self.finished is not None
        self.finished.set()

    def abandon(self) -> None:
        with self.lock:
            self.abandoned = True
            if self.done:
                self._undo()

    def _undo(self) -> None:
        taken, self.taken = self.taken, None
        if taken is not None:
            taken.pair_end.close()  # (the other end reads EOF, and the reset)
        reset_offered(self.conn)


def _take(trio_sock: Any, pair_end: socket.socket, names: Any, peer: Peer, rendezvous: Rendezvous,
          client: bool) -> None:
    """``trio_sock`` goes on over ``pair_end``: its socket, a stdlib one,
    is made again as friendsock's class on the same descriptor (whose
    number stays), and moved."""
    sock = trio_sock._sock
    timeout = sock.gettimeout()  # (trio's: 0.0, its descriptor non-blocking)
    try:
        capable = FriendCapableSocket(sock.family, sock.type, sock.proto, fileno=sock.detach())
        capable.settimeout(timeout)
        try:
            move_onto_pair(capable, pair_end, names, peer, rendezvous, client, scheduler="trio")
        except BaseException:
            capable.close()
            raise
    finally:
        pair_end.close()
    trio_sock._sock = capable
    trio_sock.__class__ = MovedTrioSocket


class MovedTrioSocket(TrioSocketType):
    """A trio socket whose connection moved to another process: trio's own,
    but a read that finds EOF where the other end aborted raises its reset
    (and one that raises a reset is noted: writes fail after it),
    and reads and writes are counted for ``friendsock.links()`` (trio calls
    the stdlib class's methods, not the socket's)."""

    async def recv(self, bufsize: int, flags: int = 0) -> bytes:
        return cast(bytes, await self._read("recv", bufsize, flags))

    async def recv_into(self, buffer: Any, nbytes: int = 0, flags: int = 0) -> int:
        return cast(int, await self._read("recv_into", buffer, nbytes, flags))

    async def recvfrom(self, bufsize: int, flags: int = 0) -> Any:
        return await self._read("recvfrom", bufsize, flags)

    async def recvfrom_into(self, buffer: Any, nbytes: int = 0, flags: int = 0) -> Any:
        return await self._read("recvfrom_into", buffer, nbytes, flags)

    async def recvmsg(self, bufsize: int, *args: Any) -> Any:
        return await self._read("recvmsg", bufsize, *args)

    async def _read(self, read: str, *args: Any) -> Any:
        """Trio's read named ``read`` on the pair end: what it answers, as
        the blocking socket's (AcrossSocket.pair_read, AcrossSocket.answer)."""
        sock = self._sock
        with sock.pair_read(may_wait=True) as pair_read:
            if pair_read.finds_shut:
                await trio.lowlevel.checkpoint()
            else:
                pair_read.found = await getattr(TrioSocketType, read)(self, *args)
        return sock.answer(read, pair_read.found, args)

    # A write the pair refuses is answered as TCP's (see written_after_close).
    async def send(self, data: Any, flags: int = 0) -> int:
        try:
            count: int = await TrioSocketType.send(self, data, flags)  # type: ignore[attr-defined]
        except BrokenPipeError as exc:
            count = self._sock.written_after_close(exc, memoryview(data).nbytes)
        self._sock.sent(count, data)
        return count

    async def sendmsg(self, buffers: Any, *args: Any) -> int:
        if self._sock.capturing() or not isinstance(buffers, (list, tuple)):
            buffers = list(buffers)  # (an iterable, read twice)
        try:
            count: int = await TrioSocketType.sendmsg(self, buffers, *args)  # type: ignore[attr-defined]
        except BrokenPipeError as exc:
            count = self._sock.written_after_close(exc, sum(memoryview(data).nbytes for data in buffers))
        self._sock.sent(count, buffers)
        return count

    def dup(self) -> Any:
        # (trio's own dup() takes only the stdlib's class; the copy keeps this one's)
        copy = object.__new__(MovedTrioSocket)
        copy._sock = self._sock.dup()
        copy._did_shutdown_SHUT_WR = False
        return copy


def wrap_moved(trio_sock: Any, sock: socket.socket) -> None:
    """``trio_sock`` made of ``sock``, a blocking socket moved to another
    process (``trio.socket.from_stdlib_socket()``): trio's socket on it, as
    trio's own init makes one (which takes the exact class ``socket.socket``
    only), its reads and writes by the moved socket's rules."""
    sock.setblocking(False)
    trio_sock._sock = sock
    trio_sock._did_shutdown_SHUT_WR = False
    trio_sock.__class__ = MovedTrioSocket


def is_moved_stream(stream: Any) -> bool:
    """Whether ``stream`` (a ``trio.SocketStream``, or its socket) carries a
    connection moved to another process."""
    if isinstance(stream, trio.SocketStream):
        stream = stream.socket
    return type(stream) is MovedTrioSocket and stream.fileno() >= 0
