"""A connect's socket bound before ``connect()``: numeric hosts, the local
address, a port as the kernel's ``connect()`` takes one, so the
connection's 4-tuple is known before it exists."""

from __future__ import annotations

import errno
import random
import socket
import sys
from typing import Any, Dict, Optional, Set, Tuple

from .._core._addresses import is_ipv4, is_unspecified


def numeric_address_infos(host: Any, port: Any, family: int = 0, proto: int = 0) -> Optional[list]:
    """getaddrinfo's answer for a numeric IP, without the resolver thread
    (asyncio and trio skip it the same way); None when the host needs
    resolving."""
    if isinstance(host, bytes):
        try:
            host = host.decode("ascii")
        except UnicodeDecodeError:
            return None
    if not isinstance(host, str) or "%" in host:
        return None
    try:
        port = int(port)
    except (TypeError, ValueError):
        return None
    known = _numeric_hosts.get((host, family))
    if known is None:
        known = _numeric_host(host, family)
        if len(_numeric_hosts) < 1024:
            _numeric_hosts[(host, family)] = known
    if not known:
        return None
    af, host = known
    # One tuple per place, not per connect: ends keep it as their peer's name.
    address = _numeric_addresses.get((host, port))
    if address is None:
        address = (host, port) if af == socket.AF_INET else (host, port, 0, 0)
        if len(_numeric_addresses) < 1024:
            _numeric_addresses[(host, port)] = address
    return [(af, socket.SOCK_STREAM, proto or socket.IPPROTO_TCP, "", address)]


# (host text, family asked) -> (family, canonical text), or () for a name
# to resolve: a program connects to a handful of hosts, again and again.
_numeric_hosts: Dict[Tuple[str, int], Tuple[Any, ...]] = {}
# (canonical host, port) -> the socket address.
_numeric_addresses: Dict[Tuple[str, int], Tuple[Any, ...]] = {}


def _numeric_host(host: str, family: int) -> Tuple[Any, ...]:
    for af in (socket.AF_INET, socket.AF_INET6):
        if family not in (0, af):
            continue
        try:
            # Canonical text, as getsockname() reports it: the flow key
            # must be the one the accepting side computes.
            return af, sys.intern(socket.inet_ntop(af, socket.inet_pton(af, host)))
        except OSError:
            continue
    return ()


def first_host(local_infos: Optional[list], af: int) -> Optional[str]:
    """The IP :func:`bind_local` tries first for the family ``af``, if any."""
    for laf, _, _, _, laddr in local_infos or ():
        if laf == af:
            return laddr[0]
    return None


def bind_local(sock: socket.socket, af: int, local_infos: list) -> None:
    """Bind to the first of ``local_infos`` of the socket's family."""
    error: Optional[OSError] = None
    for laf, _, _, _, laddr in local_infos:
        if laf != af:
            continue
        try:
            sock.bind(laddr)
            return
        except OSError as exc:
            error = OSError(exc.errno, f"error while attempting to bind on address "
                                       f"{laddr!r}: {(exc.strerror or '').lower()}")
    raise error or OSError(f"no matching local address with family={af} found")


# Linux's "bind an address now, the port at connect()" (Python names it
# from 3.12 on).
_IP_BIND_ADDRESS_NO_PORT = getattr(socket, "IP_BIND_ADDRESS_NO_PORT",
                                   24 if sys.platform == "linux" else None)


class _EphemeralPorts:
    """The ports a kernel connect() takes: the even ones of
    ``net.ipv4.ip_local_port_range`` less ``ip_local_reserved_ports`` (Linux
    takes even ports for connect() first, and odd ones for bind() to port 0,
    so that a port a program picks with ``bind(("", 0))`` and closes, to
    listen on later, is not taken by a client meanwhile), read once; from a
    random start, each connect the next."""

    def __init__(self) -> None:
        try:
            with open("/proc/sys/net/ipv4/ip_local_port_range") as text:
                low, high = (int(n) for n in text.read().split())
            reserved: Set[int] = set()
            with open("/proc/sys/net/ipv4/ip_local_reserved_ports") as text:
                for part in text.read().strip().split(","):
                    if part:
                        first, _, last = part.partition("-")
                        reserved.update(range(int(first), int(last or first) + 1))
        except (OSError, ValueError):
            low, high, reserved = 32768, 60999, set()
        self.first = low + low % 2
        self.count = max((high - self.first) // 2 + 1, 0)
        self.reserved = reserved
        self.cursor = random.randrange(self.count) if self.count else 0
        # Per local address, the connects left that bind to port 0 straight
        # away: TIME_WAIT on one address's ports says nothing of another's.
        self.skips: Dict[str, int] = {}

    def bind(self, sock: socket.socket, host: str) -> None:
        """Bind ``sock`` to ``host`` and the next of these ports free there;
        to port 0, the kernel's choice, if the next two are not. A port in
        TIME_WAIT (which a connect() may take again, but a bind() may not)
        is not free: where TCP connections left most of these ports in
        TIME_WAIT, the next connects bind to port 0 at once, for a while."""
        count = self.count
        skips = self.skips
        skip = skips.get(host)
        if skip:
            skips[host] = skip - 1
        else:
            for _ in range(min(count, _PORT_TRIES)):
                self.cursor = cursor = (self.cursor + 1) % count
                port = self.first + 2 * cursor
                if port in self.reserved:
                    continue
                try:
                    sock.bind((host, port))
                    return
                except OSError as exc:
                    if exc.errno != errno.EADDRINUSE:
                        raise
                # Out of a run of ports in use: elsewhere next time.
                self.cursor = random.randrange(count)
            if len(skips) >= _SKIPPING_HOSTS:
                skips.clear()
            skips[host] = _PORT_SKIPS
        sock.bind((host, 0))


# Ports tried before the kernel's choice is taken instead, and how many
# connects take it at once after that.
_PORT_TRIES = 2
_PORT_SKIPS = 16
_SKIPPING_HOSTS = 64  # local addresses whose skips are remembered at once
# Read as friendsock is imported, not at a first connect: that one runs on
# an event loop, where a file read is a blocking call (blockbuster, which
# aiohttp's and anyio's suites run, fails it).
_ephemeral_ports = _EphemeralPorts()


def bind_as_connect_would(sock: socket.socket, host: str) -> None:
    """Bind ``sock`` to ``host`` and a port that a connect() of the kernel's
    would take (see :class:`_EphemeralPorts`), so the connection's 4-tuple
    is known before connect()."""
    _ephemeral_ports.bind(sock, host)


def bind_port_now(sock: socket.socket, host: str) -> None:
    """Bind a socket with no port yet to ``host`` and a port, now, even if
    its user asked for the port at connect() (``IP_BIND_ADDRESS_NO_PORT``,
    Linux's only way to bind without a port, which also lets this second
    bind() happen); the option stays as its user set it."""
    option = _IP_BIND_ADDRESS_NO_PORT
    no_port = 0
    if option is not None:
        no_port = sock.getsockopt(socket.IPPROTO_IP, option)
        if no_port:
            sock.setsockopt(socket.IPPROTO_IP, option, 0)
    try:
        bind_as_connect_would(sock, host)
    finally:
        if no_port:
            sock.setsockopt(socket.IPPROTO_IP, option, no_port)  # type: ignore[arg-type]


def is_local_address(host: str) -> bool:
    """Whether ``host`` is an address of this host: a socket can bind it."""
    family = socket.AF_INET if is_ipv4(host) else socket.AF_INET6
    try:
        with socket.socket(family, socket.SOCK_DGRAM) as probe:
            probe.bind((host, 0))
    except OSError:
        return False
    return True


def port_before_connect(sock: socket.socket, destination: str) -> bool:
    """Give ``sock`` a port before its connect() to the IP ``destination``
    (the accepting process of another connect finds it by that port), if
    it has none yet: on the address it is bound to, or on ``destination``
    if none. False when it cannot be (closed, or not an address here)."""
    try:
        host, port = sock.getsockname()[:2]
        if not port:
            bind_port_now(sock, destination if is_unspecified(host) else host)
    except OSError:
        return False
    return True


def users_sockname(sock: socket.socket) -> Optional[Any]:
    """The address of a socket made elsewhere; None when it is closed."""
    try:
        return sock.getsockname()
    except OSError:
        return None


def is_bound(sockname: Any) -> bool:
    """Whether a socket at ``sockname`` was bound by its user (an address or
    a port of its own)."""
    return bool(sockname[1]) or not is_unspecified(sockname[0])
