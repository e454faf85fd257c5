"""The asyncio front door: drop-in stand-ins for the loop methods and stream helpers.

Each takes one extra keyword, ``friends``.
"""

from __future__ import annotations

import asyncio
import inspect
import os
import socket
import sys
from typing import Any, Awaitable, Callable, Dict, Optional, Tuple, Union

from .._blocking._listen import take_listener
from .._core._registry import registry
from .._core._stats import Fallback, counters
from .._handshake import fallback_address, is_tcp_socket, why_not_friends
from .._host._payoff import worth_an_offer
from .._host._ports import listener_elsewhere
from ._across import AcrossTransport
from ._adoption import adopt_paired_socket
from ._native import loop_own_connects, native, own_connect_calls_sock_connect, routes_through_friendsock
from ._pairing import connect
from ._server import FriendServer
from ._tls import TLSOptions, over_friend_link, start_tls as start_tls_on

# create_server keywords that asyncio ignores when given sock= (keep_alive
# exists from 3.13 on).
_BINDING_ONLY = ("family", "flags", "reuse_address", "reuse_port") + (
    ("keep_alive",) if sys.version_info >= (3, 13) else ()
)
# asyncio.streams' default buffer limit.
_DEFAULT_LIMIT = 2 ** 16

ProtocolFactory = Callable[[], asyncio.BaseProtocol]


async def create_connection(
    protocol_factory: ProtocolFactory,
    host: Optional[str] = None,
    port: Optional[int] = None,
    *,
    friends: Optional[bool] = None,
    **kwargs: Any,
) -> Tuple[asyncio.Transport, asyncio.BaseProtocol]:
    """``loop.create_connection`` that pairs with a friendsock server of this
    process; any other peer gets the loop's own TCP transport.

    ``friends=False`` opts this connection out of pairing.
    """
    return await create_connection_on(
        asyncio.get_running_loop(), protocol_factory, host, port, friends=friends, **kwargs
    )


async def create_connection_on(
    loop: asyncio.AbstractEventLoop,
    protocol_factory: ProtocolFactory,
    host: Optional[str] = None,
    port: Optional[int] = None,
    *,
    friends: Optional[bool] = None,
    **kwargs: Any,
) -> Tuple[asyncio.Transport, asyncio.BaseProtocol]:
    sock = kwargs.get("sock")
    if sock is not None and host is None and port is None:
        # A blocking socket that paired already (friends=False or not: it is
        # a link, whose descriptor carries nothing): its link goes on here.
        adopted = await adopt_paired_socket(loop, protocol_factory, sock, kwargs)
        if adopted is not None:
            return adopted
    reason = why_not_friends(friends, kwargs)
    across = False
    number = _port_number(port)
    if reason is None and (host is None or not _has_listener_port(number)):
        # Served by another friendsock process of this host: TCP's handshake,
        # then the bytes move (not under TLS, which stays on TCP).
        across = host is not None and not kwargs.get("ssl") and listener_elsewhere(number)
        if not across:
            reason = Fallback.NO_LISTENER
        elif not worth_an_offer(number):
            reason = Fallback.SHORT_LIVED
    if reason is not None:
        # (Every connect to a peer without friendsock comes this way: what it
        # costs, it costs them all.)
        if sock is None or is_tcp_socket(sock):  # (a Unix socket's is no TCP connection)
            counters.fallback(reason, _destination(host, port, sock))
        own_create_connection = native(loop, "create_connection")
        if not routes_through_friendsock(loop) or not own_connect_calls_sock_connect(loop):
            return await own_create_connection(protocol_factory, host, port, **kwargs)
        with loop_own_connects():  # its inner sock_connect is not to adopt
            return await own_create_connection(protocol_factory, host, port, **kwargs)
    tls = None
    if kwargs:
        tls = _check_connection_arguments(loop, protocol_factory, host, port, kwargs)
    return await connect(loop, protocol_factory, host, port, kwargs, tls,  # type: ignore[return-value]
                         across=across)


def _has_listener_port(number: Any) -> bool:
    """A listener of ours on port ``number`` (from :func:`_port_number`);
    anything but a number (a service name, what getaddrinfo refuses) is the
    loop's own create_connection's to answer."""
    return isinstance(number, int) and registry.has_port(number)


def _port_number(port: Any) -> Any:
    """``port`` as a number where it is its digits; else as it is."""
    if isinstance(port, (str, bytes)) and port.isascii() and port.isdigit():
        return int(port)
    return port


def _destination(host: Any, port: Any, sock: Any) -> Any:
    """Where a connect that does not try to pair is counted (see
    :func:`fallback_address`); a ``sock=`` by its peer."""
    if sock is not None:
        try:
            host, port = sock.getpeername()[:2]
        except (OSError, AttributeError, TypeError, ValueError):
            return None
    if host is None or port is None:
        return None
    return fallback_address(host, port)


_signatures: Dict[Tuple[type, str], inspect.Signature] = {}


def _bind(loop: asyncio.AbstractEventLoop, method: str, *args: Any, **kwargs: Any) -> None:
    """TypeError, as the loop's own ``method`` raises it, for a keyword it
    does not take (3.10's create_server has no ssl_shutdown_timeout)."""
    signature = _signatures.get((type(loop), method))
    if signature is None:
        signature = _signatures[type(loop), method] = inspect.signature(native(loop, method))
    signature.bind(*args, **kwargs)


def _check_connection_arguments(
    loop: asyncio.AbstractEventLoop, protocol_factory: Any, host: Any, port: Any, kwargs: dict
) -> Optional[TLSOptions]:
    """The friend path takes what the loop's own create_connection takes,
    and refuses the rest with the loop's errors (TypeError for a keyword this
    loop does not know, ValueError for TLS options without ``ssl`` ...).
    Returns the connection's TLS, if any."""
    _bind(loop, "create_connection", protocol_factory, host, port, **kwargs)
    return TLSOptions.for_client(kwargs.get("ssl"), host, kwargs.get("server_hostname"),
                                 kwargs.get("ssl_handshake_timeout"), kwargs.get("ssl_shutdown_timeout"))


async def create_server(
    protocol_factory: ProtocolFactory,
    host: Any = None,
    port: Optional[int] = None,
    *,
    friends: Optional[bool] = None,
    **kwargs: Any,
) -> asyncio.AbstractServer:
    """``loop.create_server`` whose connections pair with friendsock clients
    of this process; every other client is served over real TCP.

    With ``sock=`` (a listener other processes may share) clients pair only
    once this process has claimed their connection. With ``ssl=`` every
    connection is TLS, over a friend link or not. ``friends=False`` gives
    the loop's own server.
    """
    return await create_server_on(
        asyncio.get_running_loop(), protocol_factory, host, port, friends=friends, **kwargs
    )


async def create_server_on(
    loop: asyncio.AbstractEventLoop,
    protocol_factory: ProtocolFactory,
    host: Any = None,
    port: Optional[int] = None,
    *,
    friends: Optional[bool] = None,
    **kwargs: Any,
) -> asyncio.AbstractServer:
    given = kwargs.get("sock")
    if friends is False or why_not_friends(friends, {}) is not None or \
            (given is not None and not is_tcp_socket(given)):
        # (A Unix socket's server is no TCP listener; a datagram socket gets
        # the loop's own error.)
        return await native(loop, "create_server")(protocol_factory, host, port, **kwargs)
    _bind(loop, "create_server", protocol_factory, host, port, **kwargs)
    start_serving = kwargs.pop("start_serving", True)
    backlog = kwargs.pop("backlog", 100)
    sock = kwargs.pop("sock", None)
    tls = TLSOptions.for_server(kwargs.pop("ssl", None), kwargs.pop("ssl_handshake_timeout", None),
                                kwargs.pop("ssl_shutdown_timeout", None))
    taken = None
    if sock is None:
        # The loop resolves and binds exactly as it always does; we take the
        # bound sockets over so our accept loop sees every connection.
        bound = await native(loop, "create_server")(protocol_factory, host, port, backlog=backlog,
                                         start_serving=False, **kwargs)
        sockets = [socket.socket(fileno=os.dup(s.fileno())) for s in bound.sockets]
        bound.close()
        exclusive = not kwargs.get("reuse_port")
    else:
        if host is not None or port is not None:
            raise ValueError("host/port and sock can not be specified at the same time")
        if sock.type != socket.SOCK_STREAM:
            raise ValueError(f"A Stream Socket was expected, got {sock!r}")
        # As asyncio: what only shapes binding is ignored for a given socket;
        # anything else is not create_server's.
        for key in _BINDING_ONLY:
            kwargs.pop(key, None)
        if kwargs:
            raise TypeError(f"create_server() got an unexpected keyword argument {next(iter(kwargs))!r}")
        sockets = [sock]
        exclusive = False  # a handed-in listener may be shared: confirm first
        # A blocking listener of the patched class goes on accepting here,
        # through friendsock: the connects already in its backlog (a client
        # quicker than the server's thread) stay friends, claimed by this
        # server's accept, instead of being reset as by a listener passed on.
        taken = take_listener(sock)
    for s in sockets:
        s.setblocking(False)
    server = FriendServer(loop, sockets, protocol_factory, backlog, exclusive, tls, taken=taken)
    if start_serving:
        await server.start_serving()
    return server


async def open_connection(
    host: Optional[str] = None,
    port: Optional[int] = None,
    *,
    limit: int = _DEFAULT_LIMIT,
    friends: Optional[bool] = None,
    **kwargs: Any,
) -> Tuple[asyncio.StreamReader, asyncio.StreamWriter]:
    """``asyncio.open_connection`` over :func:`create_connection`."""
    loop = asyncio.get_running_loop()
    reader = asyncio.StreamReader(limit=limit, loop=loop)
    protocol = asyncio.StreamReaderProtocol(reader, loop=loop)
    transport, _ = await create_connection(lambda: protocol, host, port, friends=friends, **kwargs)
    writer = asyncio.StreamWriter(transport, protocol, reader, loop)
    return reader, writer


ClientConnected = Callable[[asyncio.StreamReader, asyncio.StreamWriter], Union[None, Awaitable[None]]]


async def start_server(
    client_connected_cb: ClientConnected,
    host: Any = None,
    port: Optional[int] = None,
    *,
    limit: int = _DEFAULT_LIMIT,
    friends: Optional[bool] = None,
    **kwargs: Any,
) -> asyncio.AbstractServer:
    """``asyncio.start_server`` over :func:`create_server`."""
    loop = asyncio.get_running_loop()

    def factory() -> asyncio.StreamReaderProtocol:
        reader = asyncio.StreamReader(limit=limit, loop=loop)
        return asyncio.StreamReaderProtocol(reader, client_connected_cb, loop=loop)

    return await create_server(factory, host, port, friends=friends, **kwargs)


def is_friend(obj: Any) -> bool:
    """Whether a transport (or a ``StreamWriter``'s) is a friend link end,
    or a TLS transport over one, or a connection to another process of this
    host moved off TCP."""
    if isinstance(obj, asyncio.StreamWriter):
        obj = obj.transport
    return isinstance(obj, AcrossTransport) or over_friend_link(obj)


async def start_tls(
    transport: asyncio.BaseTransport,
    protocol: asyncio.BaseProtocol,
    sslcontext: Any,
    *,
    server_side: bool = False,
    server_hostname: Optional[str] = None,
    ssl_handshake_timeout: Optional[float] = None,
    ssl_shutdown_timeout: Optional[float] = None,
) -> asyncio.Transport:
    """``loop.start_tls`` on the running loop that also upgrades a friend
    link on uvloop (whose own start_tls takes only uvloop's transports),
    without ``install()``. Any other transport gets the loop's own."""
    return await start_tls_on(
        asyncio.get_running_loop(),
        transport,
        protocol,
        sslcontext,
        server_side=server_side,
        server_hostname=server_hostname,
        ssl_handshake_timeout=ssl_handshake_timeout,
        ssl_shutdown_timeout=ssl_shutdown_timeout,
    )
