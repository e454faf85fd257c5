"""Both sides of pairing on asyncio: the connecting end and the accepting end.

The client registers its pending connect before the ``connect()`` syscall;
the server claims it on accept. Everything that does not pair goes to the
loop's own transports (``create_connection(sock=...)``,
``connect_accepted_socket``), so uvloop's are used on uvloop.
"""

from __future__ import annotations

import asyncio
import errno
import os
import socket
import struct
from typing import Any, Callable, List, Optional, Tuple

from .._core._addresses import flow_key
from .._core._link import Link
from .._core._registry import ListenerEntry, PendingConnect, PendingState, registry
from .._core._stats import counters
from .._core._switch import is_enabled
from .._friend_socket import read_buffer_sizes
from ._install import native
from ._transport import FriendTransport, LoopState, loop_state

# How long a confirmed connect (a listener that other processes may share)
# waits for this process to claim it before it goes on as plain TCP.
CONFIRM_TIMEOUT = 0.25

_LINGER_ABORT = struct.pack("ii", 1, 0)


class _Process:
    """This process's id, kept current across fork() without a getpid()
    syscall per connection."""

    pid = os.getpid()

    @classmethod
    def _forked(cls) -> None:
        cls.pid = os.getpid()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_Process._forked)


def current_pid() -> int:
    return _Process.pid


def release_sockets(pid: int, *socks: socket.socket) -> None:
    """Close the real sockets of a finished link without TIME_WAIT.

    Both ends are ours and done; an abortive close (SO_LINGER 0) ends the
    connection at once, so connect/close-heavy work cannot use up ports.
    ``pid``: the process that made the link. A forked child that somehow
    finishes an inherited link only drops its copies of the descriptors:
    SO_LINGER would act on the sockets it shares with the parent.
    """
    inherited = _Process.pid != pid
    for sock in socks:
        if not inherited:
            try:
                sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, _LINGER_ABORT)
            except OSError:
                pass
        sock.close()


class ListenerHandle:
    """What the registry keeps of an asyncio listener for its clients."""

    __slots__ = ("sndbuf", "rcvbuf", "state")

    def __init__(self, listen_sock: socket.socket, state: LoopState) -> None:
        # Accepted sockets inherit the listener's buffer sizes.
        self.sndbuf, self.rcvbuf = read_buffer_sizes(listen_sock)
        self.state = state  # its loop's: a client on that loop shares it


class ClientEnd:
    """What a pending connect keeps of its client: the real socket and its
    addresses (known before connect(), so no syscall asks for them again)."""

    __slots__ = ("sock", "sockname", "peername")

    def __init__(self, sock: socket.socket, sockname: Any, peername: Any) -> None:
        self.sock = sock
        self.sockname = sockname
        self.peername = peername


def why_not_friends(friends: Optional[bool], kwargs: dict) -> Optional[str]:
    """The fallback reason that applies before any address is looked at."""
    if friends is False:
        return "opted-out"
    if not is_enabled():
        return "disabled"
    if kwargs.get("ssl"):
        return "ssl"
    if kwargs.get("sock") is not None:
        return "sock"
    return None


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
    infos = _numeric_address_infos(host, port, family, proto) or await loop.getaddrinfo(
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
                _bind_local(sock, af, local_infos)
            elif entry is not None:
                # Bind first so the 4-tuple is known before connect(); binding
                # to the destination IP also proves it is an address of ours.
                try:
                    sock.bind((address[0], 0))
                except OSError:
                    entry, reason = None, "not-local"
            if entry is not None:
                pending = _register(sock, address, entry, only_one, threaded=entry.owner is not loop)
            await _connect_socket(loop, sock, address)
        except OSError as exc:
            if pending is not None:
                _withdraw_failed(pending)
            if sock is not None:
                sock.close()
            exceptions.append(exc)
            continue
        except BaseException:
            if pending is not None:
                _withdraw_failed(pending)
            if sock is not None:
                sock.close()
            raise
        if pending is None:
            counters.fallback(reason)
            return await native(loop, "create_connection")(protocol_factory, sock=sock)
        if pending.listener.exclusive and only_one:
            return _start_client(loop, pending, sock, protocol_factory)
        return await _confirm(loop, pending, sock, protocol_factory)
    raise _combined_error(exceptions, kwargs.get("all_errors", False))


async def _connect_socket(loop: asyncio.AbstractEventLoop, sock: socket.socket, address: Any) -> None:
    """``loop.sock_connect``, minus the wait when the handshake is already
    done: on loopback it completes inside the connect() call, though a
    non-blocking connect still says EINPROGRESS."""
    err = sock.connect_ex(address)
    if err == errno.EINPROGRESS:
        try:
            sock.getpeername()
            return
        except OSError:
            await loop.sock_connect(sock, address)  # still in progress: wait
    elif err:
        raise OSError(err, f"Connect call failed {address}")


def _numeric_address_infos(host: Any, port: Any, family: int, proto: int) -> Optional[list]:
    """getaddrinfo's answer for a numeric IP, without the resolver thread
    (asyncio skips it the same way); None when the host needs resolving."""
    if not isinstance(host, str) or "%" in host:
        return None
    try:
        port = int(port)
    except (TypeError, ValueError):
        return None
    for af in (socket.AF_INET, socket.AF_INET6):
        if family not in (0, af):
            continue
        try:
            # Canonical text, as getsockname() reports it: the flow key
            # must be the one the accepting side computes.
            host = socket.inet_ntop(af, socket.inet_pton(af, host))
        except OSError:
            continue
        address = (host, port) if af == socket.AF_INET else (host, port, 0, 0)
        return [(af, socket.SOCK_STREAM, proto or socket.IPPROTO_TCP, "", address)]
    return None


def _bind_local(sock: socket.socket, af: int, local_infos: list) -> None:
    error: Optional[OSError] = None
    for laf, _, _, _, laddr in local_infos:
        if laf != af:
            continue
        try:
            sock.bind(laddr)
            return
        except OSError as exc:
            error = OSError(exc.errno, f"error while attempting to bind on address "
                                       f"{laddr!r}: {exc.strerror.lower()}")
    raise error or OSError(f"no matching local address with family={af} found")


def _register(sock: socket.socket, address: Any, entry: ListenerEntry, only_one: bool,
              threaded: bool) -> PendingConnect:
    """``threaded``: the listener's loop (which accepts, and runs the server
    end) is not ours; known now, so a link on one loop never pays for locks."""
    handle: ListenerHandle = entry.handle  # type: ignore[assignment]
    client_sndbuf, client_rcvbuf = read_buffer_sizes(sock)
    link = Link(client_sndbuf, client_rcvbuf, handle.sndbuf, handle.rcvbuf, threaded=threaded)
    sockname = sock.getsockname()
    pending = PendingConnect(flow_key(sockname, address), link, entry)
    pending.handle = ClientEnd(sock, sockname, address)
    pid = _Process.pid
    link.on_done = lambda: release_sockets(pid, sock)
    if entry.exclusive and only_one:
        link.establish()  # optimistic: the link exists from connect() on
    registry.add_pending(pending)
    return pending


def _withdraw_failed(pending: PendingConnect) -> None:
    # connect() failed, so nobody can have accepted it.
    registry.withdraw(pending)
    pending.link.on_done = None


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
    try:
        try:
            claimed = await asyncio.wait_for(decided, CONFIRM_TIMEOUT)
        except asyncio.TimeoutError:
            claimed = False
    except BaseException:
        loop.remove_reader(fd)
        if registry.withdraw(pending):
            sock.close()
        else:  # claimed meanwhile: the server end sees us go away
            pending.link.client.close()
        raise
    loop.remove_reader(fd)
    if claimed or not registry.withdraw(pending):
        return _start_client(loop, pending, sock, protocol_factory)
    pending.link.on_done = None
    counters.fallback("unconfirmed")
    return await native(loop, "create_connection")(protocol_factory, sock=sock)
