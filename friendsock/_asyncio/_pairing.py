"""Both sides of pairing on asyncio: the connecting end and the accepting end.

The client registers its pending connect before the ``connect()`` syscall;
the server claims it on accept. Everything that does not pair goes to the
loop's own transports (``create_connection(sock=...)``,
``connect_accepted_socket``), so uvloop's are used on uvloop.
"""

from __future__ import annotations

import asyncio
import errno
import socket
from typing import Any, Callable, List, Tuple

from .._core._registry import ListenerEntry, PendingConnect, PendingState, registry
from .._core._stats import counters
from .._handshake import (
    ClientEnd,
    ListenerHandle,
    abandon_connect,
    bind_local,
    numeric_address_infos,
    connect_if_room,
    start_connect,
    wait_for_room,
)
from ._install import native
from ._transport import FriendTransport, loop_state

# How long a confirmed connect (a listener that other processes may share)
# waits for this process to claim it before it goes on as plain TCP.
CONFIRM_TIMEOUT = 0.25
# How often a connect held back by a full accept queue looks again, in case
# room was made by an accept friendsock did not see.
ROOM_RECHECK = 1.0


# -- connecting -------------------------------------------------------------


def _combined_error(exceptions: List[OSError], all_errors: bool) -> BaseException:
    # As asyncio's create_connection reports failed attempts.
    if all_errors:
        return ExceptionGroup("create_connection failed", exceptions)  # type: ignore[name-defined]  # noqa: F821
    if len(exceptions) == 1:
        return exceptions[0]
    model = str(exceptions[0])
    if all(str(exc) == model for exc in exceptions):
        return exceptions[0]
    return OSError("Multiple exceptions: {}".format(", ".join(str(exc) for exc in exceptions)))


async def connect(
    loop: asyncio.AbstractEventLoop,
    protocol_factory: Callable[[], asyncio.BaseProtocol],
    host: Any,
    port: Any,
    kwargs: dict,
) -> Tuple[asyncio.BaseTransport, asyncio.BaseProtocol]:
    """``create_connection`` to a port that a friendsock server listens on."""
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
        sock = None
        pending = None
        try:
            sock = socket.socket(af, socktype, sproto)
            sock.setblocking(False)
            entry, only_one = registry.match_listener(address)
            reason = "no-listener"
            if local_infos is not None:
                bind_local(sock, af, local_infos)
            elif entry is not None:
                # Bind first so the 4-tuple is known before connect(); binding
                # to the destination IP also proves it is an address of ours.
                try:
                    sock.bind((address[0], 0))
                except OSError:
                    entry, reason = None, "not-local"
            if entry is not None:
                while (started := connect_if_room(sock, address, entry, only_one,
                                                  threaded=entry.owner is not loop)) is None:
                    await _room_made(loop, entry)
                pending, err = started
            if pending is None:
                err = start_connect(sock, address)
            await _connected(loop, sock, address, err)
            if pending is not None and pending.listener.exclusive and only_one:
                await _turn_after_connect(loop, sock)
        except OSError as exc:
            if pending is not None:
                abandon_connect(pending, sock)  # type: ignore[arg-type]
            elif sock is not None:
                sock.close()
            exceptions.append(exc)
            continue
        except BaseException:
            if pending is not None:
                abandon_connect(pending, sock)  # type: ignore[arg-type]
            elif sock is not None:
                sock.close()
            raise
        if pending is None:
            counters.fallback(reason)
            return await native(loop, "create_connection")(protocol_factory, sock=sock)
        if pending.listener.exclusive and only_one:
            return _start_client(loop, pending, sock, protocol_factory)
        return await _confirm(loop, pending, sock, protocol_factory)
    raise _combined_error(exceptions, kwargs.get("all_errors", False))


async def _room_made(loop: asyncio.AbstractEventLoop, entry: ListenerEntry) -> None:
    """Wait for the listener's accept queue to have room made: until its
    server accepts, the listener goes away, or a while has passed (for room
    made by an accept friendsock did not see)."""
    woken = loop.create_future()

    def settle() -> None:  # on our loop
        if woken.done():  # woken for room we will not take: pass it on
            registry.accept_room_made(entry, 1)
            return
        try:
            woken.set_result(None)
        except RuntimeError:  # our loop closed: nobody waits any more
            pass

    if entry.owner is loop:
        wake = settle
    else:
        def wake() -> None:  # on the accepting thread
            try:
                loop.call_soon_threadsafe(settle)
            except RuntimeError:  # our loop closed: nobody waits any more
                pass

    if not wait_for_room(entry, wake):
        await asyncio.sleep(0)
        return
    # Not asyncio.wait_for: before 3.12 it can swallow a cancellation that
    # comes as the future completes.
    recheck = loop.call_later(ROOM_RECHECK, lambda: woken.done() or woken.set_result(None))
    try:
        await woken
    except BaseException:
        if woken.done() and not woken.cancelled():
            registry.accept_room_made(entry, 1)
        raise
    finally:
        recheck.cancel()
        registry.cancel_wait_for_accept_room(entry, wake)


async def _turn_after_connect(loop: asyncio.AbstractEventLoop, sock: socket.socket) -> None:
    """The turn of the loop a TCP connect takes: ``create_connection`` waits
    for its socket to become writable, and in that turn a server on this
    loop accepts. Taken here too, so the program sees the same state when
    ``create_connection`` returns (a ``server.close()`` right after finds
    the connection accepted, not in its backlog)."""
    writable = loop.create_future()

    def settle() -> None:
        if not writable.done():
            writable.set_result(None)

    fd = sock.fileno()
    loop.add_writer(fd, settle)
    try:
        await writable
    finally:
        loop.remove_writer(fd)


async def _connected(loop: asyncio.AbstractEventLoop, sock: socket.socket, address: Any, err: int) -> None:
    """The rest of ``loop.sock_connect`` after :func:`start_connect` said ``err``."""
    if err == errno.EINPROGRESS:
        await loop.sock_connect(sock, address)
    elif err:
        raise OSError(err, f"Connect call failed {address}")


def _start_client(
    loop: asyncio.AbstractEventLoop,
    pending: PendingConnect,
    sock: socket.socket,
    protocol_factory: Callable[[], asyncio.BaseProtocol],
) -> Tuple[asyncio.BaseTransport, asyncio.BaseProtocol]:
    protocol = protocol_factory()
    client: ClientEnd = pending.handle  # type: ignore[assignment]
    link = pending.link
    listener: ListenerHandle = pending.listener.handle  # type: ignore[assignment]
    state = loop_state(loop) if link.threaded else listener.state  # one loop: the same
    transport = FriendTransport(loop, link.client, sock, protocol,
                                client.sockname, client.peername, state=state)
    transport.start()
    return transport, protocol


async def _confirm(
    loop: asyncio.AbstractEventLoop,
    pending: PendingConnect,
    sock: socket.socket,
    protocol_factory: Callable[[], asyncio.BaseProtocol],
) -> Tuple[asyncio.BaseTransport, asyncio.BaseProtocol]:
    """A shared listener: pair only once this process claims the connect.

    Anything arriving on the real socket (data, EOF, reset) means another
    process accepted it; so does silence past the deadline.
    """
    decided: asyncio.Future = loop.create_future()

    def settle(claimed: bool) -> None:
        if not decided.done():
            decided.set_result(claimed)

    if pending.link.threaded:
        def on_claimed() -> None:  # on the server's thread
            try:
                loop.call_soon_threadsafe(settle, True)
            except RuntimeError:  # our loop closed: nobody waits any more
                pass

        pending.on_claimed = on_claimed
        # Set, then check: the server's thread may have claimed the connect
        # before on_claimed was there to call.
        if pending.state is PendingState.CLAIMED:
            settle(True)
    else:
        pending.on_claimed = lambda: settle(True)
    fd = sock.fileno()
    loop.add_reader(fd, settle, False)
    # Not asyncio.wait_for: before 3.12 it can swallow a cancellation that
    # comes as the future completes.
    deadline = loop.call_later(CONFIRM_TIMEOUT, settle, False)
    try:
        try:
            claimed = await decided
        finally:
            deadline.cancel()
            loop.remove_reader(fd)
    except BaseException:
        if registry.withdraw(pending):
            sock.close()
        else:  # claimed meanwhile: the server end sees us go away
            pending.link.client.close()
        raise
    if claimed or not registry.withdraw(pending):
        return _start_client(loop, pending, sock, protocol_factory)
    pending.link.on_done = None
    counters.fallback("unconfirmed")
    return await native(loop, "create_connection")(protocol_factory, sock=sock)
