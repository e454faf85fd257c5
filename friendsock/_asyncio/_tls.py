"""STARTTLS over a friend link: ``loop.start_tls`` that also upgrades a
friendsock transport, on the stdlib loop and on uvloop.

TLS is above TCP, so the record layer runs over the friend transport as over
a socket: nothing is skipped because the peer is in this process. The stdlib
loop upgrades any transport that declares ``_start_tls_compatible``
(:class:`FriendTransport` does), so there the loop's own ``start_tls`` does
the work. uvloop's ``start_tls`` accepts only uvloop's own transports; for a
friend link (or a TLS transport friendsock made over one) the same steps run
here with asyncio's ``sslproto.SSLProtocol``, which works over any transport
on any loop, in uvloop's order of events (see :class:`_SSLProtocol`). Every
other transport goes to the loop's own ``start_tls``.
"""

from __future__ import annotations

import asyncio
from asyncio import sslproto
from typing import Any, Optional

try:
    import ssl
except ImportError:  # pragma: no cover - a Python built without ssl
    ssl = None  # type: ignore[assignment]

from ._native import native
from ._transport import FriendTransport

# How many TLS layers deep a friend link is looked for (TLS in TLS in ...).
_MAX_LAYERS = 8


def rides_friend_link(transport: Any) -> bool:
    """Whether ``transport`` is a friend end, or an asyncio TLS transport
    (friendsock's own STARTTLS) running over one."""
    for _ in range(_MAX_LAYERS):
        if isinstance(transport, FriendTransport):
            return True
        if not isinstance(transport, sslproto._SSLProtocolTransport):
            return False
        transport = getattr(getattr(transport, "_ssl_protocol", None), "_transport", None)
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
        if self._hold_reads and self._state is sslproto.SSLProtocolState.WRAPPED:
            return
        super()._do_read()

    def _release_reads(self) -> None:
        self._hold_reads = False
        self._do_read()


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
    # Python 3.10 has no shutdown timeout (nor the keyword) in its
    # start_tls() and SSLProtocol: passed on only when given.
    shutdown = {} if ssl_shutdown_timeout is None else {"ssl_shutdown_timeout": ssl_shutdown_timeout}
    if isinstance(loop, asyncio.BaseEventLoop) or not rides_friend_link(transport):
        # The stdlib loop takes friend transports as they are; anything not
        # on a friend link is the loop's own business, errors included.
        return await native(loop, "start_tls")(  # type: ignore[no-any-return]
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
    ssl_protocol = _SSLProtocol(
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
    try:
        await waiter
    except BaseException:
        transport.close()
        conmade_cb.cancel()
        resume_cb.cancel()
        raise
    return ssl_protocol._app_transport  # type: ignore[no-any-return]
