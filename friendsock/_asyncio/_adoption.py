"""Adoption on installed asyncio loops: sockets that libraries connect or
accept themselves (``loop.sock_connect`` then ``create_connection(sock=)``,
as aiohttp's client does; ``loop.sock_accept`` then
``connect_accepted_socket``, as anyio's listeners do) pair too.

The rule, whoever made the sockets: a connection pairs when both ends reach
friendsock before any payload crossed the real connection; otherwise it is
TCP, with nothing lost or reordered. So a ``sock_connect`` to a friendsock
listener of this process registers its connect as *adoptable*; the
accepting side claims it and holds it until the socket is handed to
``create_connection`` (adopted), bytes or EOF come over TCP instead (it is
used raw), or the confirmed mode's deadline passes. A listening socket
first seen by ``sock_accept`` is registered as a shared listener (its
clients confirm, as with ``create_server(sock=)``), and what it accepts is
held the same way until ``connect_accepted_socket``.
"""

from __future__ import annotations

import asyncio
import collections
import socket
import weakref
from typing import Any, Callable, Deque, NamedTuple, Optional, Tuple, cast

from .. import _handshake
from .._blocking._across import is_moved, reset_in_place
from .._blocking._listen import listener_passed_on, take_listener
from .._core._registry import PendingState, registry
from .._core._stats import Fallback, counters
from .._core._switch import is_enabled
from .._socket_errors import bad_descriptor
from .._handshake import (
    Entry,
    Pending,
    adopt_accepted,
    adoptable_connecting,
    claim_accepted,
    forget_listener,
    forget_when_collected,
    go_tcp,
    hold_ended,
    make_room,
    named_as_registered,
    payload_moved,
    register_adoptable_connect,
    register_listener,
    settle_held,
)
from .._host import port_table
from .._host._offers import RESET, reset_offered
from .._host._ports import connect_slot, keep_published, published_port, stop_publishing
from ._across import (
    Offered,
    adopt_moved,
    connect_across_for_user,
    connected_for_user,
    end_wait,
    end_wait_for_user,
    expect_offer_for_user,
    rendezvous,
    start_across,
)
from ._loop_state import loop_state, post_to_loop
from ._native import in_loop_own_connect, native
from ._pairing import _confirm, connection_made_turn, start_client_end
from ._tls import TLSOptions, start_tls_end
from ._transport import FriendTransport, set_nodelay

# Sockets between the loop's sock_* call and their adoption: a connected
# socket and its pending connect; an accepted one with its claim and
# addresses. Weak: a socket its user drops is forgotten with it (its peer,
# held, sees the EOF, or the deadline).
_connected: "weakref.WeakKeyDictionary[socket.socket, Pending]" = weakref.WeakKeyDictionary()
_accepted: "weakref.WeakKeyDictionary[socket.socket, Tuple[Pending, Any, Any]]" = (
    weakref.WeakKeyDictionary()
)
# What create_connection(sock=) may add to a socket it adopts.
_TLS_KEYWORDS = frozenset({"ssl", "server_hostname", "ssl_handshake_timeout", "ssl_shutdown_timeout"})
# Accepted sockets whose connection another process took (sock_accept's
# offer), until connect_accepted_socket; each with what closes its pair end
# if the socket is dropped before, and where it came from (see _Across).
_accepted_across: "weakref.WeakKeyDictionary[socket.socket, _Across]" = weakref.WeakKeyDictionary()
# Listening sockets first seen by sock_accept, and their registry entries.
_listeners: "weakref.WeakKeyDictionary[socket.socket, _SharedListener]" = weakref.WeakKeyDictionary()


# -- the connecting end -----------------------------------------------------


async def sock_connect(loop: asyncio.AbstractEventLoop, sock: socket.socket, address: Any) -> None:
    """``loop.sock_connect``; a connect to a friendsock listener of this
    process is registered first, to pair if ``sock`` is adopted."""
    connect = native(loop, "sock_connect")
    pending = None
    if not in_loop_own_connect() and isinstance(address, tuple) and len(address) >= 2:
        pending = register_adoptable_connect(sock, address, owner=loop)
        if pending is None:
            wait = expect_offer_for_user(loop, sock, address)
            if wait is not None:
                return await _connect_for_user(loop, sock, address, wait)
    if pending is None:
        return await connect(sock, address)
    adoptable_connecting.add(sock)
    try:
        await _connect_resolved(loop, sock, address)
    except BaseException:
        go_tcp(pending, None)  # the connect failed: no connection to count
        raise
    finally:
        adoptable_connecting.discard(sock)
    if not named_as_registered(pending) and go_tcp(pending, Fallback.NAMES_DIFFER):
        return  # named otherwise by the kernel: plain TCP
    _connected[sock] = pending


async def _connect_for_user(loop: asyncio.AbstractEventLoop, sock: socket.socket, address: Any,
                            wait: Any) -> None:
    """``sock_connect`` to a port another friendsock process of this host
    serves: the offer for it is held until the socket is handed to the
    loop (:func:`adopt_connected`)."""
    try:
        await _connect_resolved(loop, sock, address)
    except BaseException:
        end_wait(loop, wait)
        raise
    connected_for_user(loop, wait)


async def _connect_resolved(loop: asyncio.AbstractEventLoop, sock: socket.socket, address: Any) -> None:
    """The loop's ``sock_connect`` to an address that is resolved already
    (a friendsock listener's); on uvloop, the same connect without the
    thread pool's ``getaddrinfo`` uvloop asks for every address (about as
    much CPU again as the connect's set-up itself)."""
    if isinstance(loop, asyncio.BaseEventLoop):
        return await native(loop, "sock_connect")(sock, address)
    if loop.get_debug() and sock.gettimeout() != 0:
        raise ValueError("the socket must be non-blocking")
    try:
        sock.connect(address)
        return
    except (BlockingIOError, InterruptedError):
        pass
    connected: asyncio.Future = loop.create_future()
    fd = sock.fileno()

    def writable() -> None:
        if connected.done():
            return
        try:
            error = sock.getsockopt(socket.SOL_SOCKET, socket.SO_ERROR)
            if error:
                raise OSError(error, f"Connect call failed {address}")
        except (BlockingIOError, InterruptedError):
            return  # not yet: keep waiting, as the loop's own does
        except BaseException as exc:
            connected.set_exception(exc)
        else:
            connected.set_result(None)

    loop.add_writer(fd, writable)
    try:
        await connected
    finally:
        loop.remove_writer(fd)


async def adopt_connected(
    loop: asyncio.AbstractEventLoop,
    protocol_factory: Callable[[], asyncio.BaseProtocol],
    sock: socket.socket,
    kwargs: dict,
) -> Optional[Tuple[asyncio.BaseTransport, asyncio.BaseProtocol]]:
    """``create_connection(sock=sock)`` for a socket :func:`sock_connect`
    connected, or :func:`sock_accept` accepted (``asyncio.open_connection
    (sock=)`` after ``sock_accept``): the friend link if it pairs; None
    when it is the loop's own business (nothing adoptable, or TCP: the
    caller goes on natively)."""
    pending = _connected.pop(sock, None)
    if pending is None:
        if sock in _accepted or sock in _accepted_across:
            # The loop makes the transport connect_accepted_socket would,
            # with a client's TLS if asked for.
            return await _adopt_accepted(loop, protocol_factory, sock, kwargs, _client_tls)
        if all(value is None for key, value in kwargs.items() if key != "sock"):
            return await connect_across_for_user(loop, protocol_factory, sock)
        end_wait_for_user(loop, sock)  # (TLS, as every keyword, stays on TCP between processes)
        return None
    # As the loop's own transport sets it on a socket handed over (whose
    # user may look); a friend end sets it on its own ones only once asked.
    set_nodelay(loop, sock)
    adoptable, tls = _adoptable(pending, sock, kwargs, _client_tls)
    if not adoptable:
        return None
    state = registry.adopt(pending, server=False)
    if state is PendingState.CLAIMED:  # the accepting end holds it: pair
        settle_held(pending, state)  # first: a TLS handshake needs both ends
        return await start_client_end(loop, pending, sock, protocol_factory, tls)
    if state is PendingState.WITHDRAWN:  # counted by the end that withdrew
        return None
    # Not accepted yet, or accepted by a socket its user has not adopted
    # yet: wait for the claim, as a confirmed connect does.
    return await _confirm(loop, pending, sock, protocol_factory, tls)


def _client_tls(kwargs: dict) -> Optional[TLSOptions]:
    """The TLS of a ``create_connection(sock=)`` that a friend end takes
    over; TypeError or ValueError for a keyword it does not take, or TLS
    options that do not go together."""
    options = {key: value for key, value in kwargs.items() if value is not None and key != "sock"}
    if set(options) - _TLS_KEYWORDS:
        raise ValueError("not a keyword a socket handed over takes")
    return TLSOptions.for_client(options.get("ssl"), None, options.get("server_hostname"),
                                 options.get("ssl_handshake_timeout"),
                                 options.get("ssl_shutdown_timeout"))


def _server_tls(kwargs: dict) -> Optional[TLSOptions]:
    """The TLS of a ``connect_accepted_socket`` that a friend end takes
    over; TypeError or ValueError as :func:`_client_tls`."""
    options = {key: value for key, value in kwargs.items() if value is not None}
    if set(options) - _TLS_KEYWORDS:
        raise ValueError("not a keyword connect_accepted_socket takes")
    return TLSOptions.for_server(options.get("ssl"), options.get("ssl_handshake_timeout"),
                                 options.get("ssl_shutdown_timeout"))


async def adopt_paired_socket(
    loop: asyncio.AbstractEventLoop,
    protocol_factory: Callable[[], asyncio.BaseProtocol],
    sock: Any,
    kwargs: dict,
    accepted: bool = False,
) -> Optional[Tuple[asyncio.Transport, asyncio.BaseProtocol]]:
    """``create_connection(sock=sock)`` (``connect_accepted_socket`` when
    ``accepted``) for a blocking socket that paired already (connected or
    accepted while ``patch_socket()`` was on): its end of the link goes on
    in a friend transport, as the loop's own transport takes a connected
    socket over. None: not such a socket, or one whose end cannot be
    detached for a loop (the loop's own call then goes on, with its
    errors)."""
    if is_moved(sock):
        return await adopt_moved(loop, protocol_factory, sock, kwargs)
    detach_for_loop = getattr(type(sock), "detach_for_loop", None)
    if detach_for_loop is None:
        return None
    try:
        tls = _server_tls(kwargs) if accepted else _client_tls(kwargs)
    except (TypeError, ValueError):
        return None  # the loop's own call says what is wrong
    given = detach_for_loop(sock)
    if given is None:
        return None
    end, real, sockname, peername = given
    try:
        protocol = protocol_factory()
    except BaseException:
        end.close()  # as the loop closes the socket: the friend sees EOF
        raise
    transport = FriendTransport(loop, end, real, protocol, sockname, peername, state=loop_state(loop))
    if tls is not None:
        return await start_tls_end(loop, transport, tls), protocol
    transport.start(reading=False)
    return await connection_made_turn(transport, protocol)


# -- the accepting end ------------------------------------------------------


class _Across(NamedTuple):
    """An accepted connection another process took, until
    connect_accepted_socket serves it."""

    offered: Offered
    closing: weakref.finalize  # (of its pair end, if the socket is dropped first)
    listener: "_SharedListener"  # (accepted from: the next accept hands it out again)
    address: Any


class _SharedListener:
    """A listening socket friendsock did not make, registered when first
    seen by ``sock_accept``: it may be shared (pre-fork servers), so its
    clients confirm. Forgotten when its loop closes, when it is found closed
    (a client's connect checks), or with the socket. One known to be
    accepted by anyio keeps its port published too (``keep_published``),
    for clients in other processes."""

    __slots__ = ("entry", "held", "__dict__", "__weakref__")

    def __init__(self, entry: Entry) -> None:
        self.entry = entry
        # Connections accepted whose offer an accept, cancelled, left out,
        # or given back by a cancelled connect_accepted_socket (hold_again):
        # handed out first by the next accepts, as the kernel's backlog
        # keeps a connection no accept took.
        self.held: Deque[Tuple[socket.socket, Any, "asyncio.Future[Any]"]] = collections.deque()

    def forget(self) -> None:
        stop_publishing(self)
        forget_listener(self.entry)
        # As the kernel resets its backlog as a listener closes.
        while self.held:
            conn, _, offer = self.held.popleft()
            offer.cancel()
            # (An offer that failed, out of descriptors say, has no pair.)
            if offer.done() and not offer.cancelled() and offer.exception() is None \
                    and isinstance(offer.result(), Offered):
                offer.result().pair_end.close()  # (answered, not handed out yet)
            reset_offered(conn)

    def hold_again(self, conn: socket.socket, address: Any, offered: Offered) -> bool:
        """``conn``, handed out with its pair end ``offered``, goes back to
        be handed out first by the next accept (False, nothing done, if
        this listener is gone)."""
        if not registry.is_listening(self.entry):
            return False
        answered = offered.rendezvous.loop.create_future()
        answered.set_result(offered)
        self.held.appendleft((conn, address, answered))
        return True

    _loop_gone = forget


def _shared_listener(loop: asyncio.AbstractEventLoop, sock: socket.socket,
                     exclusive: bool = False) -> Optional[Entry]:
    listener = _listeners.get(sock)
    if listener is not None:
        if registry.is_listening(listener.entry):
            return listener.entry
        del _listeners[sock]  # forgotten (found closed, or its loop closed)
        stop_publishing(listener)
    if not is_enabled() or sock.type != socket.SOCK_STREAM or \
            sock.family not in (socket.AF_INET, socket.AF_INET6):
        return None
    try:
        sock.getsockname()
    except OSError:
        return None
    # A listener of the patched class registered itself at listen(): it
    # accepts here from now on, its backlog's connects claimed here, and
    # it is as much this process's alone as that listen() found.
    taken = take_listener(sock)
    state = loop_state(loop)
    entry = register_listener(weakref.proxy(sock), state, owner=loop,
                              exclusive=exclusive or (taken is not None and taken.exclusive))
    if taken is not None and not registry.move_listener(taken, entry):
        listener_passed_on(taken)
    listener = _listeners[sock] = _SharedListener(entry)
    state.servers.add(listener)
    forget_when_collected(sock, entry)
    return entry


def listener_for_sock_accept(loop: asyncio.AbstractEventLoop, sock: socket.socket) -> None:
    """``sock`` listens for code known to accept with ``loop.sock_accept``,
    then ``connect_accepted_socket`` (anyio's listeners): registered now,
    not at its first accept, so a client that connects before it pairs.
    This process's alone unless SO_REUSEPORT lets others share the port
    (their clients then confirm, as for any shared listener). Its port is
    published for friendsock clients of other processes, which it offers
    its connections to as it accepts them (:func:`sock_accept`)."""
    try:
        shared = bool(sock.getsockopt(socket.SOL_SOCKET, getattr(socket, "SO_REUSEPORT", -1)))
    except OSError:
        shared = True  # no such option here: assume the worst
    if _shared_listener(loop, sock, exclusive=not shared) is not None:
        keep_published(_listeners[sock], sock)


def forget_sock_accept_listener(sock: socket.socket) -> None:
    """``sock``, registered for ``sock_accept``, is closing: its clients
    waiting in the backlog are reset, as the kernel resets them."""
    listener = _listeners.pop(sock, None)
    if listener is not None:
        listener.forget()


async def sock_accept(loop: asyncio.AbstractEventLoop, sock: socket.socket) -> Tuple[socket.socket, Any]:
    """``loop.sock_accept``; a connection from a friendsock client of this
    process is claimed and held until :func:`connect_accepted_socket`; one
    from a friendsock process of this host, to a listener that published
    its port, is offered there first."""
    entry = _shared_listener(loop, sock)
    listener = None if entry is None else _listeners.get(sock)
    if listener is not None and listener.held:
        return await _held_accepted(listener)
    conn, address = await native(loop, "sock_accept")(sock)
    if entry is not None:
        make_room(entry)
        pending, sockname = claim_accepted(conn, address, ready=False, hold=True,
                                           listener=entry.handle)
        if pending is not None:
            _accepted[conn] = (pending, sockname, address)
        else:
            settled = False
            if listener is not None:
                offer = _offer_across(loop, sock, listener, conn, (sockname or conn.getsockname(), address))
                settled = offer is not None and _offer_settled(
                    conn, await _answer(listener, conn, address, offer), listener, address)
            if not settled:
                counters.fallback(Fallback.PEER_NOT_FRIEND, entry.endpoint)
    return conn, address


def _offer_across(loop: asyncio.AbstractEventLoop, listening: socket.socket,
                  listener: _SharedListener, conn: socket.socket,
                  names: Tuple[Any, Any]) -> "Optional[asyncio.Task[Any]]":
    """The offer of ``conn`` (``names``: its own and its peer's), accepted
    on ``listening``, to the friendsock process of this host that waits
    for it, made (a task: see :func:`_answer`); None if none waits."""
    port = published_port(listener)
    if port is None:
        return None
    if port_table() is None:  # switched off since: its clients must not wait
        stop_publishing(listener)
        return None
    keep_published(listener, listening)  # (again, if a sharing process withdrew it)
    slot = connect_slot(names[1], port)
    across = None if slot is None else rendezvous(loop)
    if across is None:
        return None
    assert slot is not None
    return loop.create_task(across.offer(conn, names, slot, bounded=True))


async def _answer(listener: Any, conn: socket.socket, address: Any,
                  offer: "asyncio.Task[Any]") -> Any:
    """What ``offer`` (of ``conn``, from ``address``) comes to (see
    ``Rendezvous.offer``; a bounded wait). An accept cancelled meanwhile
    leaves the connection to the listener's next accepts, as the kernel's
    backlog keeps one no accept took."""
    try:
        return await asyncio.shield(offer)
    except asyncio.CancelledError:
        listener.held.append((conn, address, offer))
        raise
    except OSError:  # (no descriptor left for the pair, say): not offered, so TCP
        return None


async def _held_accepted(listener: _SharedListener) -> Tuple[socket.socket, Any]:
    """The first connection an accept left to the next (see :func:`_answer`
    and ``_SharedListener.hold_again``), handed out once its offer is
    answered."""
    conn, address, offer = listener.held[0]
    try:
        answer = await asyncio.shield(offer)
    except asyncio.CancelledError:
        if offer.cancelled():  # its listener closed meanwhile, resetting it
            raise bad_descriptor() from None
        # Still held, for the next accept, even when its answer came too:
        # the cancel can land after the answer, before this accept resumes.
        raise
    except OSError:
        answer = None
    if listener.held and listener.held[0][2] is offer:
        listener.held.popleft()
    if not _offer_settled(conn, answer, listener, address):
        counters.fallback(Fallback.PEER_NOT_FRIEND, listener.entry.endpoint)
    return conn, address


def _offer_settled(conn: socket.socket, offered: Any, listener: _SharedListener, address: Any) -> bool:
    """``conn`` (from ``address``, accepted from ``listener``) as its offer's
    answer leaves it (False: TCP's): taken, the pair kept for
    :func:`connect_accepted_socket`; or, the answer without its proof or
    not in time, reset in place, as a connection its client reset."""
    if offered is None:
        return False
    if offered is RESET:
        reset_in_place(conn)
    else:
        pair_end = cast(Offered, offered).pair_end
        _accepted_across[conn] = _Across(cast(Offered, offered), weakref.finalize(conn, pair_end.close),
                                         listener, address)
    return True


async def connect_accepted_socket(
    loop: asyncio.AbstractEventLoop,
    protocol_factory: Callable[[], asyncio.BaseProtocol],
    sock: socket.socket,
    **kwargs: Any,
) -> Tuple[asyncio.BaseTransport, asyncio.BaseProtocol]:
    """``loop.connect_accepted_socket``: the friend link for a connection
    :func:`sock_accept` held, when it pairs; the transport of one it moved
    to another process."""
    if sock in _accepted or sock in _accepted_across:
        adopted = await _adopt_accepted(loop, protocol_factory, sock, kwargs, _server_tls)
    else:
        adopted = await adopt_paired_socket(loop, protocol_factory, sock, kwargs, accepted=True)
    if adopted is not None:
        return adopted
    return await native(loop, "connect_accepted_socket")(
        protocol_factory, sock, **kwargs)


async def _adopt_accepted(
    loop: asyncio.AbstractEventLoop,
    protocol_factory: Callable[[], asyncio.BaseProtocol],
    sock: socket.socket,
    kwargs: dict,
    tls_of: Callable[[dict], Optional[TLSOptions]],
) -> Optional[Tuple[asyncio.BaseTransport, asyncio.BaseProtocol]]:
    """A socket :func:`sock_accept` held (or moved to another process)
    handed to a loop's call: the friend link if it pairs, the transport
    over the moved pair; None when the caller goes on natively (TCP, or
    keywords a friend end does not take: the loop's own errors follow).
    ``tls_of``: the TLS the call asks for, from its keywords."""
    across = _accepted_across.pop(sock, None)
    if across is not None:
        return await _serve_across(loop, protocol_factory, sock, kwargs, tls_of, across)
    pending, sockname, address = _accepted.pop(sock)
    adoptable, tls = _adoptable(pending, sock, kwargs, tls_of)
    if adoptable and await _adopt_accepted_end(loop, sock, pending):
        return await start_server_end(loop, pending, sock, sockname, address,
                                      protocol_factory, tls)
    return None


def _adoptable(pending: Pending, sock: socket.socket, kwargs: dict,
               tls_of: Callable[[dict], Optional[TLSOptions]]) -> Tuple[bool, Optional[TLSOptions]]:
    """Whether ``sock``, handed to a loop's call with ``kwargs``, may go on
    as a friend end, and the TLS the call asks for. Not (its connect gone
    to TCP, counted) for keywords a friend end does not take (the loop's
    own call, and its errors, follow), or a socket used raw."""
    try:
        tls = tls_of(kwargs)
    except (TypeError, ValueError):
        go_tcp(pending, Fallback.SOCK)
        return False, None
    if payload_moved(sock):
        go_tcp(pending, Fallback.USED_RAW)
        return False, None
    return True, tls


async def _serve_across(
    loop: asyncio.AbstractEventLoop,
    protocol_factory: Callable[[], asyncio.BaseProtocol],
    sock: socket.socket,
    kwargs: dict,
    tls_of: Callable[[dict], Optional[TLSOptions]],
    across: _Across,
) -> Optional[Tuple[asyncio.BaseTransport, asyncio.BaseProtocol]]:
    """The transport over the pair ``across.offered`` (taken by the
    client's process) of the accepted ``sock``; with TLS over it if asked
    for (None, the pair closed, for keywords the loop's own call refuses)."""
    offered = across.offered
    across.closing.detach()
    pair_end = offered.pair_end
    try:
        tls = tls_of(kwargs)
    except (TypeError, ValueError):
        pair_end.close()  # (the other process reads EOF) and the loop's own error follows
        return None
    # The accept that handed the connection out may be cancelled while its
    # transport starts (anyio's accept under a deadline: the socket is out
    # of the backlog by then). The loop closes the pair end it was given;
    # this copy keeps the connection, bytes unread and all, for the
    # listener's next accept, as one no accept took.
    kept: Optional[socket.socket] = None
    try:
        kept = pair_end.dup()  # (out of descriptors: the pair end closes below)
        protocol = protocol_factory()
        transport: asyncio.BaseTransport = await start_across(
            offered.rendezvous, pair_end, sock, offered.names, protocol, offered.peer, client=False)
    except BaseException as exc:
        pair_end.close()
        if kept is not None and not (
                isinstance(exc, asyncio.CancelledError)
                and across.listener.hold_again(sock, across.address, offered._replace(pair_end=kept))):
            kept.close()
        raise
    assert kept is not None
    kept.close()
    if tls is not None:
        start_tls: Any = loop.start_tls
        transport = await start_tls(transport, protocol, tls.sslcontext, server_side=tls.server_side,
                                    server_hostname=tls.server_hostname, **tls.timeouts())
    return transport, protocol


async def _adopt_accepted_end(loop: asyncio.AbstractEventLoop, conn: socket.socket,
                              pending: Pending) -> bool:
    """The accepted end is friendsock's now: whether the link forms."""
    state = registry.adopt(pending, server=True)
    if state is PendingState.HELD:  # the connecting end is not adopted yet
        return await hold_for_client(loop, conn, pending)
    return state is PendingState.CLAIMED  # else withdrawn (and counted) already


async def start_server_end(
    loop: asyncio.AbstractEventLoop,
    pending: Pending,
    conn: socket.socket,
    sockname: Any,
    address: Any,
    protocol_factory: Callable[[], asyncio.BaseProtocol],
    tls: Optional[TLSOptions],
) -> Tuple[asyncio.BaseTransport, asyncio.BaseProtocol]:
    """The accepted end of a formed link, outside any friendsock server
    (TLS over it once the handshake is done); the connecting end, if it
    waits, goes on."""
    adopt_accepted(conn, pending)
    set_nodelay(loop, conn)
    try:
        protocol = protocol_factory()
    except BaseException:
        pending.link.server.close()
        _wake_client(pending)
        raise
    transport = FriendTransport(loop, pending.link.server, conn, protocol, sockname, address,
                                state=loop_state(loop))
    if tls is None:
        transport.start(reading=False)
        _wake_client(pending)
        return await connection_made_turn(transport, protocol)
    _wake_client(pending)  # first: the handshake needs both ends
    return await start_tls_end(loop, transport, tls), protocol


def _wake_client(pending: Pending) -> None:
    if pending.on_claimed is not None:
        pending.on_claimed()


async def hold_for_client(loop: asyncio.AbstractEventLoop, conn: socket.socket,
                          pending: Pending) -> bool:
    """The accepted end of a HELD connect waits for the connecting end's
    adoption: True once the link forms; False (the connect withdrawn) when
    TCP bytes or EOF arrive instead (the socket is used raw), or after the
    confirmed mode's deadline. Whatever arrived stays in ``conn``."""
    settled: asyncio.Future = loop.create_future()

    def settle(paired: bool) -> None:
        if not settled.done():
            settled.set_result(paired)

    def on_settled(state: PendingState) -> None:  # on the connecting end's thread
        if pending.link.threaded:
            post_to_loop(loop, settle, state is PendingState.CLAIMED)
        else:
            settle(state is PendingState.CLAIMED)

    pending.on_settled = on_settled
    # Set, then check: the connecting end may have settled it first.
    if pending.state is not PendingState.HELD:
        settle(pending.state is PendingState.CLAIMED)
    try:
        if not settled.done():
            # A turn of the loop first: a library that connected hands the
            # socket over in the step its sock_connect() wakes (aiohttp's
            # connector does), with no reader and no deadline set up for
            # it. (Bytes or EOF that come meanwhile wait in the socket.)
            await asyncio.sleep(0)
        if not settled.done():
            fd = conn.fileno()
            loop.add_reader(fd, settle, False)
            # Not asyncio.wait_for: before 3.12 it can swallow a
            # cancellation that comes as the future completes.
            deadline = loop.call_later(_handshake.CONFIRM_TIMEOUT, settle, False)
            try:
                await settled
            finally:
                deadline.cancel()
                loop.remove_reader(fd)
    except BaseException:
        if not go_tcp(pending, None):  # formed meanwhile: the connecting end sees us go
            pending.link.server.close()
        raise
    finally:
        pending.on_settled = None
    return hold_ended(pending)
