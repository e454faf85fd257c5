"""Pairing on trio, both ends: listeners that claim, connects that register.

Same steps as on asyncio (``friendsock._handshake``): the client registers
its pending connect before ``connect()``, the listener claims it on accept.
What does not pair is a ``trio.SocketStream`` over the same socket, so a
peer outside friendsock sees plain TCP.
"""

from __future__ import annotations

import contextvars
import errno
import os
import socket
import sys
from typing import Any, Awaitable, Callable, List, Optional, Tuple, Union

import trio

from .. import _handshake
from .._blocking._capable import listen_unregistered
from .._core._registry import registry
from .._core._link import Link
from .._core._stats import Fallback, counters
from .._host._payoff import worth_an_offer
from .._host._ports import (listener_elsewhere, keep_published, published_port, republish_if_cleared,
                             stop_publishing)
from .._handshake import (
    ConnectAttempt,
    Entry,
    Pending,
    abandon_connect,
    accept_from,
    adopt_accepted,
    call_on_claim,
    claim_accepted,
    confirmed,
    fallback_address,
    first_host,
    forget_listener,
    numeric_address_infos,
    make_room,
    offer_for_reuse,
    register_listener,
    RoomWait,
    why_not_friends,
)
from .._reuse import reused_connect
from .._socketless import socketless_connect, socketless_entry
from ._across import accept_across, connect_across, drop_held, held_connection, may_cross
from ._backlog import SocketlessBacklog
from ._run import RunState, post_to_run, run_state
from ._stream import FriendStream

if sys.version_info < (3, 11):  # trio depends on the backport there
    from exceptiongroup import ExceptionGroup

# As trio: how long a connect attempt waits before the next one starts.
DEFAULT_DELAY = 0.250

AnyStream = Union[FriendStream, trio.SocketStream]

# As trio.SocketListener: accept() errors that concern one connection only.
_IGNORABLE_ACCEPT_ERRNOS = frozenset(
    getattr(errno, name)
    for name in (
        "EPERM", "ECONNABORTED", "EPROTO", "ENETDOWN", "ENOPROTOOPT", "EHOSTDOWN", "ENONET",
        "EHOSTUNREACH", "EOPNOTSUPP", "ENETUNREACH", "ENOSR", "ESOCKTNOSUPPORT",
        "EPROTONOSUPPORT", "ETIMEDOUT", "ECONNRESET",
    )
    if hasattr(errno, name)
)
_CLOSED_ERRNOS = frozenset({errno.EBADF, errno.ENOTSOCK})


# trio's own functions, as they were before anything patched them: the
# fallbacks are trio's plain TCP, and make sockets that pair no more
# (``native_calls``).
_trio_from_stdlib_socket = trio.socket.from_stdlib_socket
_trio_open_tcp_stream = trio.open_tcp_stream
_trio_open_tcp_listeners = trio.open_tcp_listeners

# Set while friendsock runs trio's own code for plain TCP: trio sockets it
# makes then connect and listen natively, even under install().
native_calls: "contextvars.ContextVar[bool]" = contextvars.ContextVar(
    "friendsock_trio_native_calls", default=False)


def _socket_stream(sock: socket.socket) -> trio.SocketStream:
    return trio.SocketStream(_trio_from_stdlib_socket(sock))


# -- listening ----------------------------------------------------------------


class FriendListener(trio.abc.Listener[trio.abc.HalfCloseableStream]):
    """A TCP listener, as ``trio.SocketListener``, whose ``accept()`` returns a
    :class:`FriendStream` for a friendsock client in this process and a
    ``trio.SocketStream`` for anyone else. ``socket`` is the trio socket."""

    def __init__(self, sock: socket.socket) -> None:
        self._sock = sock  # the real listening socket, non-blocking
        self.socket = _trio_from_stdlib_socket(sock)
        self._state = state = run_state()
        # Bound by us without SO_REUSEPORT: a connect to it can only land here.
        self._entry: Optional[Entry] = register_listener(sock, state, owner=state.token,
                                                         exclusive=True)
        self._backlog = SocketlessBacklog.serving(self._entry, state.token)
        state.listeners[id(self)] = self._entry
        # Its accepts are friendsock's: other processes' connects may wait for its offer.
        keep_published(self, sock)

    def __repr__(self) -> str:
        return f"<friendsock.trio.FriendListener {self.socket!r}>"

    async def accept(self) -> trio.abc.HalfCloseableStream:
        return await accept_stream(self._sock, self._entry, self._backlog, self._state,
                                   published_port(self), self)

    async def aclose(self) -> None:
        self._forget()
        self.socket.close()
        await trio.lowlevel.checkpoint()

    def _forget(self) -> None:
        stop_publishing(self)
        drop_held(self)
        entry = self._entry
        if entry is not None:
            self._entry = None
            self._state.listeners.pop(id(self), None)
            forget_listener(entry)


async def accept_stream(listen_sock: socket.socket, entry: Optional[Entry],
                        backlog: SocketlessBacklog, state: RunState,
                        published: Optional[int] = None,
                        listener: Any = None) -> trio.abc.HalfCloseableStream:
    """``trio.SocketListener.accept`` on ``listen_sock``: a
    :class:`FriendStream` for a friendsock client of this process (a connect
    to the listener ``entry``, or a socketless link from ``backlog``), a
    ``trio.SocketStream`` for anyone else, moved off TCP for a friendsock
    client of another process where the port is ``published`` (by
    ``listener``, which holds what a cancelled accept left: handed out
    first)."""
    held = None if listener is None else await held_connection(listener)
    if held is not None:
        moved, conn, _ = held
        if moved is not None:
            return trio.SocketStream(moved)
        not_a_friend(entry)
        return _socket_stream(conn)
    while True:
        try:
            conn, address, link = await accept_connection(listen_sock, entry, backlog)
        except OSError as exc:
            if exc.errno in _CLOSED_ERRNOS:
                raise trio.ClosedResourceError from None
            if exc.errno not in _IGNORABLE_ACCEPT_ERRNOS:
                raise
        else:
            if link is not None:
                stream = FriendStream(link.server, conn, conn.getsockname(), address, state)
                stream.start()
                return stream
            pending, sockname = claim_connection(conn, address, entry)
            if pending is None:
                return await _stream_of_another(listen_sock, conn, address, entry, published,
                                                listener)
            stream = FriendStream(pending.link.server, conn, sockname, address, state)
            stream.start()
            claimed(pending)
            return stream


async def _stream_of_another(listen_sock: socket.socket, conn: socket.socket, address: Any,
                             entry: Optional[Entry], published: Optional[int],
                             listener: Any) -> trio.SocketStream:
    """The stream of ``conn``, a connection from no friendsock client of
    this process: moved off TCP if another friendsock process connected
    it; its TCP's else."""
    if published is not None:
        republish_if_cleared(listen_sock, published)
        moved = await accept_across(listener, conn, address, published)
        if moved is not None:
            return trio.SocketStream(moved)
    not_a_friend(entry)
    return _socket_stream(conn)


async def accept_connection(listen_sock: socket.socket, entry: Optional[Entry],
                            backlog: Optional[SocketlessBacklog]) -> Tuple[Any, Any, Optional[Link]]:
    """``accept()`` on the real listening socket, as trio's socket does it
    (a checkpoint; closing the socket wakes it with ClosedResourceError):
    the connection, non-blocking, its address and None; connects held back
    by the listener ``entry``'s full accept queue may go on now. Or a
    socketless link waiting in ``backlog``: its server end's stand-in
    socket, the client's address and the link."""
    await trio.lowlevel.checkpoint_if_cancelled()
    parked = False
    while True:
        if backlog is not None and (arrived := backlog.take()) is not None:
            if not parked:
                await trio.lowlevel.cancel_shielded_checkpoint()
            return arrived
        try:
            if entry is None:
                conn, address = listen_sock.accept()
            else:
                conn, address = accept_from(listen_sock, entry.handle)
            break
        except BlockingIOError:
            if backlog is None:
                await trio.lowlevel.wait_readable(listen_sock)
            else:
                await backlog.wait_readable(listen_sock)
            parked = True
        except OSError:
            # A failed accept is a checkpoint too, as trio's own (closed
            # underfoot: EBADF after the checkpoint).
            if not parked:
                await trio.lowlevel.cancel_shielded_checkpoint()
            raise
    if entry is not None:
        make_room(entry)
    if not parked:
        await trio.lowlevel.cancel_shielded_checkpoint()
    conn.setblocking(False)
    return conn, address, None


def claim_connection(conn: socket.socket, address: Any,
                     entry: Optional[Entry]) -> Tuple[Optional[Pending], Any]:
    """The pending connect an accepted connection belongs to, claimed and
    adopted (its link established), with the socket's own address; None
    for a peer that is no friend here (see :func:`not_a_friend`)."""
    pending, sockname = claim_accepted(conn, address,
                                       listener=entry.handle if entry is not None else None)
    if pending is None:
        return None, None
    # A client in this run, on a socket of friendsock's: the connection is
    # kept for a later connect once the link is done (see offer_for_reuse).
    adopt_accepted(conn, pending, keeper=None if pending.link.threaded else pending.listener.handle)
    return pending, sockname


def not_a_friend(entry: Optional[Entry]) -> None:
    """An accepted connection goes on over TCP: its listener's fallback."""
    counters.fallback(Fallback.PEER_NOT_FRIEND, entry.endpoint if entry is not None else None)


def claimed(pending: Pending) -> None:
    """The server end is ready: tell a client waiting for the claim."""
    if pending.on_claimed is not None:
        pending.on_claimed()


def _compute_backlog(backlog: Optional[int]) -> int:
    # As trio.open_tcp_listeners.
    if not isinstance(backlog, int) and backlog is not None:
        raise TypeError(f"backlog must be an int or None, not {backlog!r}")
    if backlog is None:
        return 0xFFFF
    return min(backlog, 0xFFFF)


async def open_tcp_listeners(
    port: int,
    *,
    host: Union[str, bytes, None] = None,
    backlog: Optional[int] = None,
    friends: Optional[bool] = None,
) -> List[Any]:
    """``trio.open_tcp_listeners``, returning :class:`FriendListener` objects
    (``trio.SocketListener`` objects with ``friends=False``)."""
    if why_not_friends(friends, {}) is not None:
        token = native_calls.set(True)
        try:
            return await _trio_open_tcp_listeners(port, host=host, backlog=backlog)
        finally:
            native_calls.reset(token)
    if not isinstance(port, int):
        raise TypeError(f"port must be an int not {port!r}")
    computed_backlog = _compute_backlog(backlog)
    addresses = await trio.socket.getaddrinfo(
        host, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE
    )
    socks: List[socket.socket] = []
    unsupported: List[OSError] = []
    try:
        for family, type_, proto, _, sockaddr in addresses:
            try:
                sock = socket.socket(family, type_, proto)
            except OSError as exc:
                if exc.errno == errno.EAFNOSUPPORT:
                    unsupported.append(exc)
                    continue
                raise
            socks.append(sock)
            sock.setblocking(False)
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            if family == socket.AF_INET6:
                sock.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 1)
            sock.bind(sockaddr)
            listen_unregistered(sock, computed_backlog)
        if unsupported and not socks:
            message = "This system doesn't support any of the kinds of socket that that address could use"
            raise OSError(errno.EAFNOSUPPORT, message) from ExceptionGroup(message, unsupported)
        await trio.lowlevel.checkpoint()
    except BaseException:
        for sock in socks:
            sock.close()
        raise
    return [FriendListener(sock) for sock in socks]


async def serve_tcp(
    handler: Callable[[Any], Awaitable[object]],
    port: int,
    *,
    host: Union[str, bytes, None] = None,
    backlog: Optional[int] = None,
    handler_nursery: Optional[trio.Nursery] = None,
    task_status: Any = trio.TASK_STATUS_IGNORED,
    friends: Optional[bool] = None,
) -> None:
    """``trio.serve_tcp`` over :func:`open_tcp_listeners`."""
    listeners = await open_tcp_listeners(port, host=host, backlog=backlog, friends=friends)
    await trio.serve_listeners(handler, listeners, handler_nursery=handler_nursery,
                               task_status=task_status)


# -- connecting ---------------------------------------------------------------


async def open_tcp_stream(
    host: Union[str, bytes],
    port: int,
    *,
    happy_eyeballs_delay: Optional[float] = DEFAULT_DELAY,
    local_address: Optional[str] = None,
    friends: Optional[bool] = None,
) -> AnyStream:
    """``trio.open_tcp_stream``: a :class:`FriendStream` when a friendsock
    listener in this process accepts, a ``trio.SocketStream`` otherwise."""
    if not isinstance(host, (str, bytes)):
        raise ValueError(f"host must be str or bytes, not {host!r}")
    if not isinstance(port, int):
        raise TypeError(f"port must be int, not {port!r}")
    reason = why_not_friends(friends, {})
    if reason is None and not registry.has_port(port):
        reason = Fallback.NO_LISTENER
        if listener_elsewhere(port):
            if not worth_an_offer(port):
                reason = Fallback.SHORT_LIVED
            else:
                moved = await _connect_across(host, port, local_address)
                if moved is not None:
                    return moved
    if reason is None:
        stream = await _connect(host, port, local_address)
        if stream is not None:
            return stream
    else:
        counters.fallback(reason, fallback_address(host, port))
    token = native_calls.set(True)
    try:
        return await _trio_open_tcp_stream(host, port, happy_eyeballs_delay=happy_eyeballs_delay,
                                           local_address=local_address)
    finally:
        native_calls.reset(token)


async def _connect_across(host: Union[str, bytes], port: int,
                          local_address: Optional[str]) -> Optional[trio.SocketStream]:
    """A stream to another friendsock process of this host serving ``port``
    on a loopback address ``host`` names (from ``local_address``, if
    given), its connection moved off TCP where that process offers it;
    None when there is none to try (trio's own connect takes over). Where
    every address was tried and failed, the error trio's own raises: a
    connect that reached the server is not made a second time."""
    infos = numeric_address_infos(host, port) or await trio.socket.getaddrinfo(
        host, port, type=socket.SOCK_STREAM)
    failed: List[OSError] = []
    for af, socktype, proto, _, address in infos:
        trio_sock = trio.socket.socket(af, socktype, proto)
        if not may_cross(trio_sock._sock, address):  # type: ignore[attr-defined]
            trio_sock.close()
            continue
        token = native_calls.set(True)  # (an installed connect: trio's own)
        try:
            if local_address is not None:
                await trio_sock.bind((local_address, 0))
            moved = await connect_across(trio_sock, address, type(trio_sock).connect)
        except OSError as exc:
            trio_sock.close()
            failed.append(exc)
            continue
        except BaseException:
            trio_sock.close()
            raise
        finally:
            native_calls.reset(token)
        if moved:
            return trio.SocketStream(trio_sock)
        trio_sock.close()
    if failed and len(failed) == len(infos):
        # As trio.open_tcp_stream reports it.
        text = host.decode("ascii") if isinstance(host, bytes) else host
        message = f"all attempts to connect to {f'[{text}]' if ':' in text else text}:{port} failed"
        raise OSError(message) from ExceptionGroup(message, failed)
    return None


async def _connect(host: Union[str, bytes], port: int,
                   local_address: Optional[str]) -> Optional[AnyStream]:
    """Connect to a friendsock listener if ``host`` names one; else None,
    the fallback counted (nothing connected: trio's own connect takes over).

    Only addresses with a listener are tried. Unlike on asyncio, a friend
    connect that fails raises nothing: trio's own connect tries again, and
    reports its own errors (``Fallback.CONNECT_FAILED``).
    """
    infos = numeric_address_infos(host, port) or await trio.socket.getaddrinfo(
        host, port, type=socket.SOCK_STREAM
    )
    local_infos = None
    if local_address is not None:
        local_infos = await trio.socket.getaddrinfo(local_address, 0, type=socket.SOCK_STREAM)
    token = trio.lowlevel.current_trio_token()
    reason = Fallback.NO_LISTENER
    where: Any = (host, port)  # where the fallback is counted
    for af, socktype, proto, _, address in infos:
        attempt = ConnectAttempt(address, source=first_host(local_infos, af))
        entry = attempt.entry
        if entry is None:
            continue
        if socketless_entry(entry, local_address is not None):
            await trio.lowlevel.checkpoint_if_cancelled()
            made = socketless_connect(entry, attempt.address, threaded=entry.owner is not token)
            stream = _start_client(made, made.handle.sock)
            await trio.lowlevel.cancel_shielded_checkpoint()
            return stream
        if entry.owner is token and local_address is None:
            await trio.lowlevel.checkpoint_if_cancelled()
            reused = reused_connect(entry, attempt.address)
            if reused is not None:  # (its server end is in the listener's backlog)
                stream = _start_client(reused, reused.handle.sock)
                await trio.lowlevel.cancel_shielded_checkpoint()
                return stream
        where = entry.endpoint
        sock = attempt.open(af, socktype, proto)  # socket() errors are raised: no fallback
        try:
            attempt.bind(af, local_infos)
        except OSError:
            attempt.give_up()
            reason = Fallback.CONNECT_FAILED
            continue
        except BaseException:
            attempt.give_up()
            raise
        if attempt.entry is None:  # not an address of ours
            attempt.give_up()
            reason, where = attempt.fallback, address
            continue
        try:
            paired = await _pair(attempt, token)
        except OSError:  # given up
            reason = Fallback.CONNECT_FAILED
            continue
        if paired is None:  # the listener just went away
            attempt.give_up()
            continue
        if paired:
            pending = attempt.pending
            assert pending is not None
            if not pending.link.threaded:
                # The socket is ours alone: its connection may be reused
                # once the link is done.
                offer_for_reuse(pending)
            return _start_client(pending, sock)
        return _socket_stream(sock)
    counters.fallback(reason, where)
    return None


async def _pair(attempt: ConnectAttempt, token: trio.lowlevel.TrioToken,
                close_on_error: bool = True) -> Optional[bool]:
    """Register and make the connect of ``attempt`` (its socket open and
    bound): True once it is a friend link, False when it went on as plain TCP
    (connected, unconfirmed), None when the listener went away before
    anything was connected. A failed connect raises its ``OSError``; the
    attempt is given up (its socket closed unless not ``close_on_error``),
    and so is a cancelled one (its socket closed, as trio does)."""
    entry = attempt.entry
    assert entry is not None and attempt.sock is not None
    sock = attempt.sock
    try:
        await trio.lowlevel.checkpoint_if_cancelled()
        while (err := attempt.start(token)) is None:
            await _room_made(entry, token)
        pending = attempt.pending
        if pending is None:
            return None
        await _connected(sock, attempt.requested, err)
    except OSError:
        attempt.give_up(close=close_on_error)
        raise
    except BaseException:
        attempt.give_up()
        raise
    if not attempt.connected():  # named otherwise by the kernel: plain TCP
        counters.fallback(attempt.fallback, attempt.address)
        return False
    if attempt.optimistic:
        return True
    return await _confirm(pending, sock, token)


async def _room_made(entry: Entry, token: trio.lowlevel.TrioToken) -> None:
    """Wait for the listener's accept queue to have room made: until its
    listener accepts, goes away, or a while has passed (for room made by an
    accept friendsock did not see)."""
    woken = trio.Event()

    def post(settle: Callable[[], None]) -> None:  # on the accepting thread
        post_to_run(token, settle)

    wait = RoomWait(entry, woken.set, None if entry.owner is token else post)
    if not wait.begin():
        await trio.lowlevel.checkpoint()
        return
    taken = False
    try:
        with trio.move_on_after(_handshake.ROOM_RECHECK):
            await woken.wait()
        taken = True
    finally:
        wait.end(taken)


async def _connected(sock: socket.socket, address: Any, err: int) -> None:
    """The rest of a connect after :func:`start_connect` said ``err``: no
    wait when the loopback handshake is already done."""
    if err == errno.EINPROGRESS:
        await trio.lowlevel.wait_writable(sock)
        err = sock.getsockopt(socket.SOL_SOCKET, socket.SO_ERROR)
    else:  # done or failed at once: a checkpoint all the same, as trio's
        await trio.lowlevel.cancel_shielded_checkpoint()
    if err:  # worded as trio words it
        raise OSError(err, f"Error connecting to {address}: {os.strerror(err)}")


def _start_client(pending: Pending, sock: socket.socket) -> FriendStream:
    client = pending.handle
    stream = FriendStream(pending.link.client, sock, client.sockname, client.peername, run_state())
    stream.start()
    return stream


async def _confirm(pending: Pending, sock: socket.socket, token: trio.lowlevel.TrioToken) -> bool:
    """A listener other processes may share: pair only once this process
    claims the connect (True). Anything arriving on the real socket means
    another process accepted it; so does silence past the deadline (False:
    the connection goes on as plain TCP)."""
    claimed = waiting = False

    def on_claim() -> None:
        nonlocal claimed
        claimed = True
        if waiting:
            # One wait, on the real socket, which the claim cuts short with
            # trio's own wake-up of a socket's waiter (cheaper than
            # cancelling a scope).
            trio.lowlevel.notify_closing(sock)

    def claimed_elsewhere() -> None:  # on the accepting thread
        post_to_run(token, on_claim)

    call_on_claim(pending, on_claim, claimed_elsewhere)
    try:
        with trio.move_on_after(_handshake.CONFIRM_TIMEOUT):
            if not claimed:
                waiting = True
                try:
                    await trio.lowlevel.wait_readable(sock)
                except trio.ClosedResourceError:
                    if not claimed:  # its user closed it
                        raise
                finally:
                    waiting = False
    except BaseException:
        # Withdrawn: the socket closes; claimed meanwhile: the server end
        # sees us go away.
        abandon_connect(pending, sock)
        raise
    return confirmed(pending, claimed)
