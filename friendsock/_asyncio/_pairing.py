"""The connecting end of pairing on asyncio: ``create_connection`` to a friendsock server.

The client registers its pending connect before the ``connect()`` syscall;
the server (``_server``) claims it on accept. A connection that does not
pair goes to the loop's own transport (``create_connection(sock=...)``), so
uvloop's is used on uvloop. With ``ssl=`` either way is TLS: a friend end
runs the record layer over the link (``_tls``).
"""

from __future__ import annotations

import asyncio
import errno
import socket
from typing import Any, Awaitable, Callable, List, Optional, Tuple, cast

from .. import _handshake
from .._core._stats import Fallback, counters
from .._handshake import (
    ConnectAttempt,
    Entry,
    Pending,
    abandon_connect,
    call_on_claim,
    confirmed,
    first_host,
    numeric_address_infos,
    offer_for_reuse,
    start_connect,
    RoomWait,
)
from .._reuse import reused_connect
from .._socketless import socketless_connect, socketless_entry
from .._host import is_loopback
from .._host._ports import serves
from ._across import connect_across, end_wait, expect_offer
from ._native import native
from ._loop_state import LoopState, loop_state, post_to_loop
from ._tls import TLSOptions, start_tls_end
from ._transport import FriendTransport

ProtocolFactory = Callable[[], asyncio.BaseProtocol]


# -- connecting -------------------------------------------------------------


def _combined_error(exceptions: List[OSError], all_errors: bool) -> BaseException:
    # As asyncio's create_connection reports failed attempts.
    if all_errors:
        return ExceptionGroup("create_connection failed", exceptions)  # type: ignore[name-defined,unused-ignore]  # noqa: F821
    if len(exceptions) == 1:
        return exceptions[0]
    model = str(exceptions[0])
    if all(str(exc) == model for exc in exceptions):
        return exceptions[0]
    return OSError("Multiple exceptions: {}".format(", ".join(str(exc) for exc in exceptions)))


async def connect(
    loop: asyncio.AbstractEventLoop,
    protocol_factory: ProtocolFactory,
    host: Any,
    port: Any,
    kwargs: dict,
    tls: Optional[TLSOptions] = None,
    across: bool = False,
) -> Tuple[asyncio.BaseTransport, asyncio.BaseProtocol]:
    """``create_connection`` to a port that a friendsock server listens on;
    ``tls``: its ``ssl=`` (checked, see :meth:`TLSOptions.for_client`).
    ``across``: one that serves it in another process of this host."""
    family = kwargs.get("family", 0)
    proto = kwargs.get("proto", 0)
    flags = kwargs.get("flags", 0)
    local_addr = kwargs.get("local_addr")
    infos = numeric_address_infos(host, port, family, proto) or await loop.getaddrinfo(
        host, port, family=family, type=socket.SOCK_STREAM, proto=proto, flags=flags
    )
    if not infos:
        raise OSError("getaddrinfo() returned empty list")
    local_infos = None
    if local_addr is not None:
        local_infos = await loop.getaddrinfo(*local_addr, family=family, type=socket.SOCK_STREAM,
                                             proto=proto, flags=flags)
        if not local_infos:
            raise OSError("getaddrinfo() returned empty list")

    exceptions: List[OSError] = []
    for af, socktype, sproto, _, address in infos:
        # A transport cannot go on over TCP: a listener not proven yet is confirmed.
        attempt = ConnectAttempt(address, can_go_over_tcp=False,
                                 source=first_host(local_infos, af))
        if socketless_entry(attempt.entry, local_addr is not None or kwargs.get("sock") is not None):
            assert attempt.entry is not None
            made = socketless_connect(attempt.entry, attempt.address,
                                      threaded=attempt.entry.owner is not loop)
            # A listener on this loop was handed its end with call_soon():
            # it accepts before the connection_made turn ends.
            return await start_client_end(loop, made, made.handle.sock, protocol_factory, tls,
                                          accept_to_come=made.link.threaded)
        if attempt.entry is not None and attempt.entry.owner is loop and local_addr is None:
            reused = reused_connect(attempt.entry, attempt.address)
            if reused is not None:
                # As a socketless connect: the server end comes with call_soon().
                return await start_client_end(loop, reused, reused.handle.sock, protocol_factory, tls)
        wait = None
        # Another process on this host: a loopback destination (whatever it
        # was named); any other goes as it would have.
        crossing = across and is_loopback(attempt.address[0]) and \
            serves(attempt.address[0], attempt.address[1], af)
        try:
            sock = attempt.open(af, socktype, sproto)
            attempt.bind(af, local_infos, crossing)
            entry = attempt.entry
            if entry is not None:
                while (started := attempt.start(loop)) is None:
                    await _room_made(loop, entry)
                err = started
            if attempt.pending is None:
                if crossing:
                    wait = expect_offer(loop, sock, attempt.address[1])
                err = start_connect(sock, address)
            await _connected(loop, sock, address, err)
            attempt.connected()
        except OSError as exc:
            attempt.give_up()
            end_wait(loop, wait)
            exceptions.append(exc)
            continue
        except BaseException:
            attempt.give_up()
            end_wait(loop, wait)
            raise
        pending = attempt.pending
        if pending is None:
            fallback = attempt.fallback
            if wait is not None:
                moved = await connect_across(loop, protocol_factory, sock, wait)
                if moved is not None:
                    return moved
                fallback = Fallback.NOT_OFFERED
            counters.fallback(fallback, attempt.address)
            return await _native_connection(loop, protocol_factory, sock, tls)
        # The socket is ours alone: its descriptor is seen only if asked for,
        # and its connection may be reused once the link is done.
        if not pending.link.threaded:
            pending.link.client.fd_hidden = True
            offer_for_reuse(pending)
        if attempt.optimistic:
            return await start_client_end(loop, pending, sock, protocol_factory, tls,
                                          accept_to_come=True)
        return await _confirm(loop, pending, sock, protocol_factory, tls)
    raise _combined_error(exceptions, kwargs.get("all_errors", False))


async def _room_made(loop: asyncio.AbstractEventLoop, entry: Entry) -> None:
    """Wait for the listener's accept queue to have room made: until its
    server accepts, the listener goes away, or a while has passed (for room
    made by an accept friendsock did not see)."""
    woken = loop.create_future()

    def wake_here() -> None:  # on our loop
        if not woken.done():
            try:
                woken.set_result(None)
            except RuntimeError:  # our loop closed: nobody waits any more
                pass

    def post(settle: Callable[[], None]) -> None:  # on the accepting thread
        post_to_loop(loop, settle)

    wait = RoomWait(entry, wake_here, None if entry.owner is loop else post)
    if not wait.begin():
        await asyncio.sleep(0)
        return
    # Not asyncio.wait_for: before 3.12 it can swallow a cancellation that
    # comes as the future completes.
    recheck = loop.call_later(_handshake.ROOM_RECHECK, wake_here)
    taken = False
    try:
        await woken
        taken = True
    finally:
        recheck.cancel()
        wait.end(taken)


async def _connected(loop: asyncio.AbstractEventLoop, sock: socket.socket, address: Any, err: int) -> None:
    """The rest of ``loop.sock_connect`` after :func:`start_connect` said ``err``."""
    if err == errno.EINPROGRESS:
        try:
            await native(loop, "sock_connect")(sock, address)  # registered already: not to adopt
        except OSError as exc:
            # Its connect() again raises the kernel's error as it is; the
            # loop's own connect names the address, as asyncio's does.
            if exc.errno and isinstance(loop, asyncio.BaseEventLoop):
                raise OSError(exc.errno, f"Connect call failed {address}") from None
            raise
    elif err:
        raise OSError(err, f"Connect call failed {address}")


def _native_connection(
    loop: asyncio.AbstractEventLoop,
    protocol_factory: ProtocolFactory,
    sock: socket.socket,
    tls: Optional[TLSOptions],
) -> Awaitable[Tuple[asyncio.Transport, asyncio.BaseProtocol]]:
    """The connection on ``sock`` over the loop's own transport (TLS too)."""
    keywords = {} if tls is None else tls.connect_keywords()
    return native(loop, "create_connection")(protocol_factory, sock=sock, **keywords)


async def start_client_end(
    loop: asyncio.AbstractEventLoop,
    pending: Pending,
    sock: socket.socket,
    protocol_factory: ProtocolFactory,
    tls: Optional[TLSOptions],
    accept_to_come: bool = False,
) -> Tuple[asyncio.Transport, asyncio.BaseProtocol]:
    """The client end of the claimed (or established) connect ``pending``
    on ``sock``: plain, or TLS over the link once its handshake is done
    (``tls``), as ``create_connection`` returns it. A failed TLS handshake
    raises its error with the end closed. ``accept_to_come``: a server on
    this loop may not have accepted the connection yet (see
    :func:`_accept_turn`)."""
    if tls is None:
        if accept_to_come and not loop_state(loop).polls_after_callbacks:
            await _accept_turn(pending)
        transport, protocol = _start_client(loop, pending, sock, protocol_factory)
        return await connection_made_turn(transport, protocol)
    try:
        protocol = protocol_factory()
    except BaseException:
        pending.link.client.close()  # the server end sees us go
        raise
    transport = _client_transport(loop, pending, sock, protocol)
    # The handshake needs the server's answers: it has accepted by then.
    return await start_tls_end(loop, transport, tls), protocol


async def _accept_turn(pending: Pending) -> None:
    """On asyncio's loops, before the client end starts: a connect its
    server has not accepted yet. A TCP connect takes the turn in which its
    socket becomes writable, and in it a server on this loop accepts; so
    the program sees the same state when ``create_connection`` returns (a
    ``server.close()`` right after finds the connection accepted, not in
    its backlog). asyncio's loops poll at the start of a turn, so a server
    here accepts in the next turn, after what is due already: that turn
    comes first, and ``connection_made`` in it, which leaves the one turn
    between ``connection_made`` and the return that TCP gives (a task the
    protocol starts there takes one step before the caller resumes, not
    two). uvloop polls right after the callback that connected, in the
    same turn: there nothing waits. Cancelled meanwhile, the server end
    sees the client go."""
    try:
        await asyncio.sleep(0)
    except BaseException:
        pending.link.client.close()
        raise


async def connection_made_turn(
    transport: FriendTransport, protocol: asyncio.BaseProtocol,
) -> Tuple[asyncio.Transport, asyncio.BaseProtocol]:
    """As the loop's ``create_connection`` (and ``connect_accepted_socket``)
    returns, for a ``transport`` started without reading: a turn after
    ``connection_made``, once what it scheduled ran (the ``connection_lost``
    of an ``abort()`` in it, say), and before any ``data_received``.
    Cancelled meanwhile, the transport is closed, as the loop closes its own."""
    try:
        await asyncio.sleep(0)
    except BaseException:
        transport.close()
        raise
    transport.start_reading()
    return transport, protocol


def _start_client(
    loop: asyncio.AbstractEventLoop,
    pending: Pending,
    sock: socket.socket,
    protocol_factory: ProtocolFactory,
) -> Tuple[FriendTransport, asyncio.BaseProtocol]:
    """The plain client end (:func:`start_client_end` without TLS), not reading yet."""
    try:
        protocol = protocol_factory()
        if protocol is None and not isinstance(loop, asyncio.BaseEventLoop):  # uvloop refuses it
            raise TypeError("protocol is required")
    except BaseException:
        pending.link.client.close()  # as the loop closes the socket: the server end sees EOF
        raise
    transport = _client_transport(loop, pending, sock, protocol)
    try:
        transport.start(reading=False)  # (connection_made_turn starts it)
    except BaseException:  # (asyncio's: a protocol without connection_made)
        transport.discard()
        raise
    return transport, protocol


def _client_transport(
    loop: asyncio.AbstractEventLoop,
    pending: Pending,
    sock: socket.socket,
    protocol: asyncio.BaseProtocol,
) -> FriendTransport:
    """The client end's transport, not started yet."""
    client = pending.handle
    link = pending.link
    listener = pending.listener.handle
    state = loop_state(loop) if link.threaded else cast(LoopState, listener.state)  # one loop: the same
    return FriendTransport(loop, link.client, sock, protocol,
                           client.sockname, client.peername, state=state)


async def _confirm(
    loop: asyncio.AbstractEventLoop,
    pending: Pending,
    sock: socket.socket,
    protocol_factory: ProtocolFactory,
    tls: Optional[TLSOptions] = None,
) -> Tuple[asyncio.BaseTransport, asyncio.BaseProtocol]:
    """A shared listener: pair only once this process claims the connect.

    Anything arriving on the real socket (data, EOF, reset) means another
    process accepted it; so does silence past the deadline.
    """
    decided: asyncio.Future = loop.create_future()

    def settle(claimed: bool) -> None:
        if not decided.done():
            decided.set_result(claimed)

    def claimed_elsewhere() -> None:  # on the server's thread
        post_to_loop(loop, settle, True)

    call_on_claim(pending, lambda: settle(True), claimed_elsewhere)
    fd = sock.fileno()
    loop.add_reader(fd, settle, False)
    # Not asyncio.wait_for: before 3.12 it can swallow a cancellation that
    # comes as the future completes.
    deadline = loop.call_later(_handshake.CONFIRM_TIMEOUT, settle, False)
    try:
        try:
            claimed = await decided
        finally:
            deadline.cancel()
            loop.remove_reader(fd)
    except BaseException:
        # Withdrawn: the socket closes; claimed meanwhile: the server end
        # sees us go away.
        abandon_connect(pending, sock)
        raise
    if confirmed(pending, claimed):
        return await start_client_end(loop, pending, sock, protocol_factory, tls)
    return await _native_connection(loop, protocol_factory, sock, tls)
