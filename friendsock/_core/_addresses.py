"""Normalized socket addresses and the direction-independent flow key."""

from __future__ import annotations

import sys
from typing import Any, Tuple

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


def is_unspecified(host: str) -> bool:
    return host in ("0.0.0.0", "::")


def is_ipv4(host: str) -> bool:
    return ":" not in host
