"""Socketless links (opt-in): a connect to a friendsock listener of this
process that makes its link with no kernel socket at all — no descriptor,
no handshake, no port taken from the kernel, no TIME_WAIT.

Loop-free: the link, its two ends' stand-in socket objects and their
addresses. An adapter whose listener can take a link this way sets
``ListenerHandle.socketless_accept`` (the asyncio server does); a client
adapter asks :func:`socketless_entry` whether the listener it reaches can.
"""

from __future__ import annotations

import errno
import socket
import sys
import threading
from typing import Any, Dict, Iterator, Optional, Set, Tuple, Union

from ._core._addresses import flow_key
from ._core._link import Link, LinkEnd
from ._core._registry import PendingConnect
from ._core._switch import is_socketless
from ._handshake import ClientEnd, Entry, Pending
from ._core._tap import tap_for
from ._friend_socket import copy_buffer_sizes
from ._socket_errors import bad_descriptor, invalid_argument

# Ports a socketless client end gets: the kernel's default ephemeral range
# (net.ipv4.ip_local_port_range).
_PORTS = range(32768, 61000)

_SNDBUF = (socket.SOL_SOCKET, socket.SO_SNDBUF)
_RCVBUF = (socket.SOL_SOCKET, socket.SO_RCVBUF)
_FLAGS = frozenset({(socket.SOL_SOCKET, socket.SO_KEEPALIVE), (socket.IPPROTO_TCP, socket.TCP_NODELAY)})
_FIXED = {(socket.SOL_SOCKET, socket.SO_TYPE): socket.SOCK_STREAM, (socket.SOL_SOCKET, socket.SO_ERROR): 0}

# Linux's floor and doubling for SO_SNDBUF/SO_RCVBUF (sock_setsockopt).
_SNDBUF_MIN = 4608
_RCVBUF_MIN = 2304


class SocketlessSocket:
    """What a socketless end has instead of a kernel socket: its two
    addresses and its options. ``fileno()`` is -1; ``SO_SNDBUF``/
    ``SO_RCVBUF`` (doubled, as Linux does) are kept and answered; any other
    option is kept as set and read back as set (``TCP_NODELAY`` and
    ``SO_KEEPALIVE`` as 0 or 1), there being no kernel socket for it to
    change; one never set and not known here reads as ``ENOPROTOOPT``."""

    __slots__ = ("family", "_sockname", "_peername", "_sndbuf", "_rcvbuf", "_options", "end")

    type = socket.SOCK_STREAM
    proto = socket.IPPROTO_TCP

    def __init__(self, family: int, sockname: Any, peername: Any, sndbuf: int, rcvbuf: int) -> None:
        # Slots, and the options set in one dict made when first set: many
        # idle links are the point of going socketless.
        self.family = family
        self._sockname = sockname
        self._peername = peername
        self._sndbuf = sndbuf
        self._rcvbuf = rcvbuf
        self._options: Optional[Dict[Tuple[int, int], Union[int, bytes]]] = None
        # The link end it stands under: closed, it answers as a closed
        # socket; after the friend's reset, as a reset one.
        self.end: Optional[LinkEnd] = None

    def __repr__(self) -> str:
        return f"<friendsock socketless laddr={self._sockname!r} raddr={self._peername!r}>"

    def __enter__(self) -> "SocketlessSocket":
        return self

    def __exit__(self, *exc_info: Any) -> None:
        self.close()

    def fileno(self) -> int:
        return -1

    def getsockname(self) -> Any:
        self._check_open()
        return self._sockname

    def getpeername(self) -> Any:
        self._check_open()
        error = self.end.peername_error() if self.end is not None else None
        if error is not None:
            raise error.as_os_error()
        return self._peername

    def _check_open(self) -> None:
        if self.end is not None and self.end.closed:
            raise bad_descriptor()

    def getsockopt(self, level: int, option: int, buflen: Optional[int] = None) -> Any:
        key = (level, option)
        value: Union[int, bytes]
        if key == _SNDBUF:
            value = self._sndbuf
        elif key == _RCVBUF:
            value = self._rcvbuf
        elif key in _FIXED:
            value = _FIXED[key]
        elif self._options is not None and key in self._options:
            value = self._options[key]
        elif key in _FLAGS:
            value = 0
        else:
            raise OSError(errno.ENOPROTOOPT, "Protocol not available on a socketless link")
        if buflen is not None and not 0 < buflen <= 1024:
            raise OSError("getsockopt buflen out of range")
        if type(value) is bytes:
            if buflen is None:  # as the kernel: the option's bytes read as an int
                return int.from_bytes(value[:4].ljust(4, b"\0"), sys.byteorder, signed=True)
            return value[:buflen]
        if buflen is None:
            return value
        # As the kernel: the option's int, as many of its bytes as asked.
        return value.to_bytes(4, sys.byteorder, signed=True)[:buflen]  # type: ignore[union-attr]

    def setsockopt(self, level: int, option: int, value: Any, *optlen: int) -> None:
        key = (level, option)
        if key == _SNDBUF or key == _RCVBUF:
            if key == _SNDBUF:
                self._sndbuf = max(2 * int(value), _SNDBUF_MIN)
            else:
                self._rcvbuf = max(2 * int(value), _RCVBUF_MIN)
            if self.end is not None:  # set here itself (anyio's raw_socket): the accounting's too
                copy_buffer_sizes(self, self.end)
                self.end.outgoing.capacity_changed()
            return
        if key in _FIXED:
            raise OSError(errno.ENOPROTOOPT, "Protocol not available")  # read-only, as Linux
        kept: Union[int, bytes]
        if optlen:  # (level, option, None, optlen): as many zero bytes
            if value is not None:
                raise TypeError("setsockopt() takes None and an option length, or a value")
            kept = bytes(optlen[0])
        elif isinstance(value, int):
            kept = (1 if value else 0) if key in _FLAGS else value
        else:
            kept = bytes(value)
        if self._options is None:
            self._options = {}
        self._options[key] = kept

    def get_inheritable(self) -> bool:
        return False

    def set_inheritable(self, inheritable: bool) -> None:
        pass  # no descriptor to pass on

    def bind(self, address: Any) -> None:
        raise invalid_argument()  # as a connected socket's

    def dup(self) -> socket.socket:
        raise OSError(errno.EOPNOTSUPP, "a socketless link has no descriptor to duplicate")

    def close(self) -> None:
        pass

    def give_back_port(self) -> None:
        """A client end's, once its link is done: the port is free again
        (a bound method, not a closure per link: idle links stay small)."""
        _ports.give_back(self._sockname[0], self._peername[:2], self._sockname[1])


class _PortPool:
    """Client addresses in use, taken and given back under a lock (ends on
    several threads connect at once). As with TCP, what must be unique is the
    four-tuple: a port is unique per (client address, server endpoint). A
    loopback client whose ports toward one server ran out goes on from the
    next loopback address (127.0.0.2, ...), as a client bound there would."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._used: Dict[Tuple[str, Any], Set[int]] = {}
        # Where the next port is looked for (not itertools.cycle: it keeps a
        # copy of every port it has handed out, 28,000 ints).
        self._cursor = 0

    def take(self, host: str, server: Any) -> Tuple[str, int]:
        with self._lock:
            for client_host in _client_hosts(host):
                used = self._used.setdefault((client_host, server), set())
                if len(used) < len(_PORTS):
                    while True:
                        port = _PORTS[self._cursor]
                        self._cursor = (self._cursor + 1) % len(_PORTS)
                        if port not in used:
                            used.add(port)
                            return client_host, port
        raise OSError(errno.EADDRNOTAVAIL, "Cannot assign requested address")

    def give_back(self, host: str, server: Any, port: int) -> None:
        with self._lock:
            used = self._used.get((host, server))
            if used is not None:
                used.discard(port)
                if not used:
                    del self._used[(host, server)]


def _client_hosts(host: str) -> Iterator[str]:
    yield host
    if host.startswith("127."):
        for last in range(2, 255):
            candidate = f"127.0.0.{last}"
            if candidate != host:
                yield candidate


_ports = _PortPool()


def socketless_entry(entry: Optional[Entry], real_socket_asked: bool) -> bool:
    """Whether a connect to the listener ``entry`` goes socketless: switched
    on, a listener that takes links that way, and nothing asked of a real
    socket (``real_socket_asked``: a local address, a socket of the
    caller's)."""
    return (entry is not None and not real_socket_asked and is_socketless()
            and entry.handle.socketless_accept is not None)


def socketless_connect(entry: Entry, address: Any, threaded: bool) -> Pending:
    """A link to the listener ``entry`` at ``address``, established, with
    stand-in sockets on both ends; the server end is handed to the
    listener's ``socketless_accept`` (which runs it on its own scheduler).
    The returned connect (not registered anywhere) holds the client end:
    its ``handle`` is the client's :class:`ClientEnd`."""
    handle = entry.handle
    family = socket.AF_INET6 if len(address) == 4 else socket.AF_INET
    server = (address[0], address[1])
    host, port = _ports.take(address[0], server)
    sockname = (host, port) if family == socket.AF_INET else (host, port, 0, address[3])
    sndbuf, rcvbuf = handle.sndbuf, handle.rcvbuf
    client_sock = SocketlessSocket(family, sockname, address, sndbuf, rcvbuf)
    server_sock = SocketlessSocket(family, address, sockname, sndbuf, rcvbuf)
    link = Link(sndbuf, rcvbuf, sndbuf, rcvbuf, threaded=threaded, listener=entry.endpoint,
                addresses=(sockname, address), tap=tap_for(sockname, address))
    link.on_done = client_sock.give_back_port
    link.sizes_settled = True
    client_sock.end, server_sock.end = link.client, link.server
    pending: Pending = PendingConnect(flow_key(sockname, address), link, entry,
                                      ClientEnd(client_sock, sockname, address))  # type: ignore[arg-type]
    link.establish()
    accept = handle.socketless_accept
    if accept is None:  # the listener went away meanwhile: as its backlog, reset
        link.server.reset()
    else:
        accept(link, server_sock, sockname)
    return pending
