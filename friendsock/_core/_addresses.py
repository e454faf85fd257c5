"""Normalized socket addresses and the direction-independent flow key."""

from __future__ import annotations

import sys
from typing import Any, Optional, Tuple

Endpoint = Tuple[str, int]
FlowKey = Tuple[Endpoint, Endpoint]

_MAPPED_PREFIX = "::ffff:"


def normalize_endpoint(address: Any) -> Endpoint:
    """Fold a socket address to ``(ip, port)``.

    IPv4-mapped IPv6 becomes plain IPv4 and flowinfo/scope are dropped, so a
    dual-stack server and an IPv4 client name the same connection alike.
    Addresses come from ``getsockname``/``getpeername`` (already canonical
    text), so string work is enough and keeps connect/accept cheap.
    """
    host = address[0]
    if "%" in host:
        host = host.split("%", 1)[0]
    if host.startswith(_MAPPED_PREFIX) and "." in host:
        host = host[len(_MAPPED_PREFIX):]
    return host, address[1]


def shared_host(address: Any) -> Any:
    """``address`` with its host text interned: the ends of thousands of
    idle links to one listener share one "127.0.0.1", not one each."""
    if type(address) is not tuple:
        return address
    try:
        host = address[0]
        shared = sys.intern(host)  # (TypeError if not a str)
    except (IndexError, TypeError):
        return address
    return address if shared is host else (shared,) + address[1:]


def flow_key(local: Any, remote: Any) -> FlowKey:
    """The same key for both ends of one connection (the 4-tuple, sorted)."""
    a = normalize_endpoint(local)
    b = normalize_endpoint(remote)
    return (a, b) if a <= b else (b, a)


def kernel_destination(address: Any, source: Optional[str] = None) -> Any:
    """Where Linux's ``connect(address)`` goes, for a socket bound to the IP
    ``source`` (None: not bound to one): ``address`` itself, but for the
    wildcard addresses, which name this host. ``0.0.0.0`` (and
    ``::ffff:0.0.0.0``) is the socket's own source address, or
    ``127.0.0.1`` when it has none; ``::`` is ``::1``, or
    ``::ffff:127.0.0.1`` for a socket bound to an IPv4-mapped address.
    (``ip_route_connect`` and ``tcp_v6_connect``; the kernel's
    ``getpeername()`` then answers this.) A connect's flow key is made
    from it, never from the address its user passed: the accepting side
    sees the kernel's."""
    host = address[0]
    if host == "0.0.0.0":
        host = source if source is not None and is_ipv4(source) and not is_unspecified(source) \
            else "127.0.0.1"
    elif host == "::ffff:0.0.0.0":
        mapped = source is not None and source.startswith(_MAPPED_PREFIX) and "." in source
        host = source if mapped and source != host else "::ffff:127.0.0.1"
    elif host == "::":
        mapped = source is not None and source.startswith(_MAPPED_PREFIX) and "." in source
        host = "::ffff:127.0.0.1" if mapped else "::1"
    else:
        return address
    return (host,) + tuple(address[1:])


def is_unspecified(host: str) -> bool:
    return host in ("0.0.0.0", "::")


def is_ipv4(host: str) -> bool:
    return ":" not in host
