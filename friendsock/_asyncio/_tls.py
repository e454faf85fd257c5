"""TLS over a friend link: ``ssl=`` connections and servers, and
``loop.start_tls``, on the stdlib loop and on uvloop.

TLS is above TCP, so the record layer runs over the friend transport as over
a socket: nothing is skipped because the peer is in this process.

``ssl=`` (:class:`TLSOptions`, :func:`start_tls_end`): the loop's own
record layer goes between a friend end and its protocol before the end
starts, as the loop puts it over a socket: asyncio's
``sslproto.SSLProtocol`` on the stdlib loop, uvloop's ``SSLProtocol`` (in
C) on uvloop, and on another loop asyncio's in uvloop's order of events
(:class:`_SSLProtocol`).

STARTTLS (:func:`start_tls`): the stdlib loop upgrades any transport that
declares ``_start_tls_compatible`` (:class:`FriendTransport` does), so there
the loop's own ``start_tls`` does the work. uvloop's ``start_tls`` accepts
only uvloop's own transports (its TLS transports among them, over whatever
they run); for a friend end the same steps run here, with uvloop's
``SSLProtocol``. Every other transport goes to the loop's own ``start_tls``.
"""

from __future__ import annotations

import asyncio
import functools
from asyncio import sslproto
from dataclasses import dataclass
from typing import Any, Dict, Optional, Tuple

try:
    import ssl
except ImportError:  # pragma: no cover - a Python built without ssl
    ssl = None  # type: ignore[assignment]
# For methods whose ssl= argument hides the module.
_ssl = ssl

from ._across import AcrossTransport
from ._native import native
from ._transport import FRIEND_END_INFO, FriendTransport

# How many TLS layers deep a friend link is looked for (TLS in TLS in ...).
_MAX_LAYERS = 8


def rides_friend_link(transport: Any) -> bool:
    """Whether ``transport`` is a friend end (in this process or moved
    between processes), or an asyncio TLS transport (friendsock's own
    STARTTLS) running over one: what friendsock's
    ``start_tls`` upgrades itself on uvloop (whose own takes uvloop's TLS
    transports, over whatever they run)."""
    for _ in range(_MAX_LAYERS):
        if isinstance(transport, (FriendTransport, AcrossTransport)):
            return True
        if not isinstance(transport, sslproto._SSLProtocolTransport):
            return False
        transport = getattr(getattr(transport, "_ssl_protocol", None), "_transport", None)
    return False


def over_friend_link(transport: Any) -> bool:
    """Whether ``transport`` is a friend end, or a TLS transport (asyncio's
    or uvloop's, TLS in TLS too) over one: their ``get_extra_info`` asks
    the transport underneath for what they do not know."""
    try:
        return isinstance(transport.get_extra_info(FRIEND_END_INFO), FriendTransport)
    except Exception:  # not a transport, or one that cannot tell
        return False


class _SSLProtocol(sslproto.SSLProtocol):
    """asyncio's SSLProtocol, with uvloop's order of events after the
    handshake: the caller of start_tls() holds the new transport before the
    protocol's first data_received().

    asyncio reads the application bytes that came with the end of the
    handshake at once, before the waiting start_tls() resumes; uvloop reads
    them a loop turn later, after it. A friend end delivers a burst in one
    loop callback, so here the reads wait (the bytes stay in the incoming
    BIO) until that turn has come.
    """

    _finishing_handshake = False
    _hold_reads = False

    def _on_handshake_complete(self, handshake_exc: Optional[BaseException]) -> None:
        self._finishing_handshake = True
        try:
            super()._on_handshake_complete(handshake_exc)
        finally:
            self._finishing_handshake = False

    def _do_read(self) -> None:
        if self._finishing_handshake:  # its read: after the waiter's wake-up
            self._finishing_handshake = False
            self._hold_reads = True
            self._loop.call_soon(self._release_reads)
            return
        # Closing reads at once: what came in goes to the protocol before
        # the close_notify, as in asyncio.
        if self._hold_reads and self._state is sslproto.SSLProtocolState.WRAPPED:  # type: ignore[attr-defined]
            return
        super()._do_read()  # type: ignore[misc]  # (not in typeshed's stub)

    def _release_reads(self) -> None:
        self._hold_reads = False
        self._do_read()


def _layer_class(loop: asyncio.AbstractEventLoop) -> Any:
    """The record layer the loop's own TLS runs: asyncio's SSLProtocol on
    the stdlib loop, uvloop's (in C) on uvloop; on another loop, asyncio's
    in uvloop's order of events (:class:`_SSLProtocol`)."""
    if isinstance(loop, asyncio.BaseEventLoop):
        return sslproto.SSLProtocol
    uvloop_tls = _uvloop_tls()
    if uvloop_tls is not None and isinstance(loop, uvloop_tls[0]):
        return uvloop_tls[1]
    return _SSLProtocol


@functools.lru_cache(maxsize=None)
def _uvloop_tls() -> Optional[Tuple[type, type]]:
    """uvloop's loop class and its SSLProtocol (with an instance dict, for
    :func:`_hold_reading_past_handshake`); None without uvloop."""
    try:
        from uvloop import Loop
        from uvloop.loop import SSLProtocol  # type: ignore[attr-defined]
    except ImportError:  # pragma: no cover - no uvloop, or one without it
        return None

    class FriendLinkSSLProtocol(SSLProtocol):
        __slots__ = ("__dict__",)

    return Loop, FriendLinkSSLProtocol


def _hold_reading_past_handshake(loop: asyncio.AbstractEventLoop, layer: Any, transport: asyncio.BaseTransport,
                     waiter: "asyncio.Future[None]") -> None:
    """uvloop's TLS hands the new transport to the caller of start_tls()
    before the protocol's first data_received(): the bytes that came with
    the end of the handshake wait a loop turn, after the waiter's wake-up.
    Over a socket one read ends there; a friend end delivers a whole burst
    in one callback, and the records after that read would reach the
    protocol at once. So once the handshake is done, the end under the
    layer stops reading until the next loop turn."""
    if not _is_uvloops(layer):
        return
    own = layer.buffer_updated  # (uvloop's takes no data_received())

    def buffer_updated(nbytes: int) -> None:
        own(nbytes)
        if waiter.done():
            _unhook(layer)
            if not transport.is_closing():
                transport.pause_reading()  # type: ignore[attr-defined]
                loop.call_soon(_read_on, transport)

    layer.buffer_updated = buffer_updated
    waiter.add_done_callback(lambda _: _unhook(layer))  # (a failed handshake too)


def _unhook(layer: Any) -> None:
    vars(layer).pop("buffer_updated", None)


def _read_on(transport: asyncio.BaseTransport) -> None:
    if not transport.is_closing():
        transport.resume_reading()  # type: ignore[attr-defined]


def _is_uvloops(layer: Any) -> bool:
    uvloop_tls = _uvloop_tls()
    return uvloop_tls is not None and isinstance(layer, uvloop_tls[1])


def _app_transport(layer: Any, transport: FriendTransport) -> asyncio.Transport:
    """The TLS transport of ``layer``, over the friend end ``transport``:
    uvloop's makes it when asked, to run its protocol's callbacks in the
    underlying transport's context, as over its own sockets."""
    if _is_uvloops(layer):
        return layer._get_app_transport(transport._context)
    return layer._app_transport


# asyncio's and uvloop's TLS layers read up to 256 KiB at a time into a new
# bytes object and shrink it to what came. glibc serves a block that large
# with mmap() and the shrink with munmap(), two system calls and page faults
# per read, until a block of that size has once been freed: from then on its
# heap serves them. Over TCP the handshake's reads free one early; over a
# friend link they may not, which tripled a small TLS round trip. So one is
# freed before the first TLS layer starts.
_TLS_READ_BLOCK = 512 * 1024
_read_block_freed = False


def _free_a_read_sized_block() -> None:
    global _read_block_freed
    if not _read_block_freed:
        _read_block_freed = True
        bytes(_TLS_READ_BLOCK)  # made and freed at once


def _shutdown_keyword(ssl_shutdown_timeout: Optional[float]) -> Dict[str, float]:
    # Python 3.10 has no shutdown timeout (nor the keyword) in its
    # start_tls(), SSLProtocol and create_connection(): passed on only when given.
    return {} if ssl_shutdown_timeout is None else {"ssl_shutdown_timeout": ssl_shutdown_timeout}


def _check_positive(name: str, value: Optional[float]) -> None:
    # SSLProtocol's check and words; asyncio makes it only once connected.
    if value is not None and value <= 0:
        raise ValueError(f"{name} should be a positive number, got {value}")


def only_with_ssl(**given: Any) -> None:
    """ValueError, in the loop's words, for a TLS option given without ``ssl``."""
    for name, value in given.items():
        if value is not None:
            raise ValueError(f"{name} is only meaningful with ssl")


@dataclass(frozen=True)
class TLSOptions:
    """The TLS one end runs (``ssl=`` and its keywords), checked and
    defaulted as ``loop.create_connection``/``create_server`` do. A timeout
    left None is the ``SSLProtocol`` default."""

    sslcontext: "ssl.SSLContext"
    server_side: bool = False
    server_hostname: Optional[str] = None
    ssl_handshake_timeout: Optional[float] = None
    ssl_shutdown_timeout: Optional[float] = None

    @classmethod
    def for_client(
        cls,
        ssl: Any,
        host: Any,
        server_hostname: Optional[str],
        ssl_handshake_timeout: Optional[float],
        ssl_shutdown_timeout: Optional[float],
    ) -> Optional["TLSOptions"]:
        """``create_connection``'s TLS keywords; None without ``ssl``. As
        asyncio: ``server_hostname`` defaults to ``host`` (``''`` skips the
        hostname check), ``ssl=True`` is ``ssl.create_default_context()``."""
        if not ssl:
            only_with_ssl(server_hostname=server_hostname, ssl_handshake_timeout=ssl_handshake_timeout,
                          ssl_shutdown_timeout=ssl_shutdown_timeout)
            return None
        if server_hostname is None:
            if not host:
                raise ValueError("You must set server_hostname when using ssl without a host")
            server_hostname = host
        # Checked before connecting, so a bad value leaves no connection behind.
        _check_positive("ssl_handshake_timeout", ssl_handshake_timeout)
        _check_positive("ssl_shutdown_timeout", ssl_shutdown_timeout)
        if isinstance(ssl, bool):
            ssl = sslproto._create_transport_context(False, server_hostname)
        return cls(ssl, False, server_hostname, ssl_handshake_timeout, ssl_shutdown_timeout)

    @classmethod
    def for_server(
        cls,
        ssl: Any,
        ssl_handshake_timeout: Optional[float],
        ssl_shutdown_timeout: Optional[float],
    ) -> Optional["TLSOptions"]:
        """``create_server``'s TLS keywords; None without ``ssl``. Timeouts
        are taken as given: as in asyncio, a bad one fails each handshake."""
        if ssl is None:
            only_with_ssl(ssl_handshake_timeout=ssl_handshake_timeout, ssl_shutdown_timeout=ssl_shutdown_timeout)
            return None
        if _ssl is None or not isinstance(ssl, _ssl.SSLContext):
            raise TypeError("ssl argument must be an SSLContext or None")
        return cls(ssl, True, None, ssl_handshake_timeout, ssl_shutdown_timeout)

    def timeouts(self) -> Dict[str, Optional[float]]:
        """The timeout keywords of SSLProtocol and the loop's TLS calls."""
        return {"ssl_handshake_timeout": self.ssl_handshake_timeout,
                **_shutdown_keyword(self.ssl_shutdown_timeout)}

    def connect_keywords(self) -> Dict[str, Any]:
        """``loop.create_connection(sock=...)``'s keywords for this TLS: the
        same connection over the loop's own transport."""
        return {"ssl": self.sslcontext, "server_hostname": self.server_hostname, **self.timeouts()}


def begin_tls_end(
    loop: asyncio.AbstractEventLoop, transport: FriendTransport, tls: TLSOptions
) -> Tuple["asyncio.Future[None]", asyncio.Transport]:
    """Start ``transport`` (made, not started) as a TLS end: the record layer
    goes between it and its protocol, and its handshake begins (the end's
    ``connection_made``). Returns the handshake's future and the TLS
    transport, whose protocol is told ``connection_made`` once the
    handshake is done; on a failed handshake the end is closed already.
    Raises, with the end gone unseen by its protocol, when the layer
    cannot be made (a server's bad timeout, a bad ``server_hostname``)."""
    _free_a_read_sized_block()
    app_protocol = transport.get_protocol()
    waiter = loop.create_future()
    try:
        layer = _layer_class(loop)(loop, app_protocol, tls.sslcontext, waiter, tls.server_side,
                                   tls.server_hostname, **tls.timeouts())
        app_transport = _app_transport(layer, transport)
        _hold_reading_past_handshake(loop, layer, transport, waiter)
    except BaseException:
        # Nothing ran on this end yet: it goes away as an abort, so its
        # friend sees it go and the link is released.
        transport.set_protocol(asyncio.Protocol())
        transport.start()
        transport.abort()
        raise
    transport.set_protocol(layer)
    transport.start()
    return waiter, app_transport


async def start_tls_end(
    loop: asyncio.AbstractEventLoop, transport: FriendTransport, tls: TLSOptions
) -> asyncio.Transport:
    """Start ``transport`` (made, not started, with the app protocol) as a
    TLS end (:func:`begin_tls_end`) and await its handshake: the TLS
    transport, as ``create_connection(ssl=...)`` returns it. A failed or
    cancelled handshake closes the transport and raises its error."""
    handshake, app_transport = begin_tls_end(loop, transport, tls)
    try:
        await handshake
    except BaseException:
        app_transport.close()
        raise
    return app_transport


async def start_tls(
    loop: asyncio.AbstractEventLoop,
    transport: asyncio.BaseTransport,
    protocol: asyncio.BaseProtocol,
    sslcontext: "ssl.SSLContext",
    *,
    server_side: bool = False,
    server_hostname: Optional[str] = None,
    ssl_handshake_timeout: Optional[float] = None,
    ssl_shutdown_timeout: Optional[float] = None,
) -> asyncio.Transport:
    """``loop.start_tls(transport, ...)``: upgrade ``transport`` to TLS and
    return the new transport ``protocol`` uses from now on."""
    shutdown = _shutdown_keyword(ssl_shutdown_timeout)
    on_friend_link = rides_friend_link(transport)
    if on_friend_link:
        _free_a_read_sized_block()
    if isinstance(loop, asyncio.BaseEventLoop) or not on_friend_link:
        # The stdlib loop takes friend transports as they are; anything not
        # on a friend link is the loop's own business, errors included.
        return await native(loop, "start_tls")(
            transport,
            protocol,
            sslcontext,
            server_side=server_side,
            server_hostname=server_hostname,
            ssl_handshake_timeout=ssl_handshake_timeout,
            **shutdown,
        )
    # From here on, BaseEventLoop.start_tls step by step (its checks, in its
    # order, with uvloop's identical messages).
    if ssl is None:  # pragma: no cover
        raise RuntimeError("Python ssl module is not available")
    if not isinstance(sslcontext, ssl.SSLContext):
        raise TypeError(
            f"sslcontext is expected to be an instance of ssl.SSLContext, got {sslcontext!r}"
        )
    waiter = loop.create_future()
    ssl_protocol = _layer_class(loop)(
        loop,
        protocol,
        sslcontext,
        waiter,
        server_side,
        server_hostname,
        ssl_handshake_timeout=ssl_handshake_timeout,
        call_connection_made=False,
        **shutdown,
    )
    # Pause first, so SSLProtocol.data_received() cannot run before its
    # connection_made().
    transport.pause_reading()  # type: ignore[attr-defined]
    transport.set_protocol(ssl_protocol)
    conmade_cb = loop.call_soon(ssl_protocol.connection_made, transport)
    resume_cb = loop.call_soon(transport.resume_reading)  # type: ignore[attr-defined]
    app_transport = _app_transport(ssl_protocol, transport)  # type: ignore[arg-type]
    _hold_reading_past_handshake(loop, ssl_protocol, transport, waiter)
    try:
        await waiter
    except BaseException:
        # Each loop's own way: uvloop closes the TLS transport, asyncio the one under it.
        (app_transport if _is_uvloops(ssl_protocol) else transport).close()
        conmade_cb.cancel()
        resume_cb.cancel()
        raise
    return app_transport
