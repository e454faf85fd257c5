"""What a process of this host must show before a connection moves off
TCP to it, and the messages of the rendezvous that shows it.

The accepting process offers (``OFFER``): it hands over its TCP socket and
one end of a ``socketpair()`` with ``SCM_RIGHTS``. The connecting process
takes the offer (``TAKEN``, handing over its own TCP socket) or declines it
(``DECLINED``); it alone decides, so the two never disagree. Each side
checks that the socket it was handed is the other end of its own
connection (:func:`mirrors`): a TCP 4-tuple names one connection in a
network namespace, so only the process holding that end can hand it over.
"""

from __future__ import annotations

import enum
import os
import socket
import struct
from typing import Any, List, NamedTuple, Optional, Tuple

_MESSAGE = struct.Struct("<BxHI")  # what, client port, serial
_CREDENTIALS = struct.Struct("3i")  # pid, uid, gid
MAX_FDS = 2


class What(enum.IntEnum):
    OFFER = 1
    TAKEN = 2
    DECLINED = 3


class Message(NamedTuple):
    what: What
    client_port: int
    serial: int

    def encode(self) -> bytes:
        return _MESSAGE.pack(self.what, self.client_port, self.serial)

    @classmethod
    def decode(cls, data: bytes) -> Optional["Message"]:
        if len(data) != _MESSAGE.size:
            return None
        what, port, serial = _MESSAGE.unpack(data)
        try:
            return cls(What(what), port, serial)
        except ValueError:
            return None


MESSAGE_SIZE = _MESSAGE.size


def channel_address(pid: int, token: int) -> bytes:
    """The abstract ``AF_UNIX`` name a process's loop takes offers on."""
    return f"\0friendsock-{os.getuid()}-{pid}-{token}".encode()


def peer_credentials(sock: socket.socket) -> Tuple[int, int]:
    """The pid and uid of the process at the other end of a Unix socket
    (the kernel's, as it was when the socket connected)."""
    pid, uid, _ = _CREDENTIALS.unpack(
        sock.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, _CREDENTIALS.size))
    return pid, uid


def mirrors(own_names: Tuple[Any, Any], handed: socket.socket) -> bool:
    """Whether ``handed`` is a connected TCP socket whose names are
    ``own_names`` (a socket's ``getsockname()``, ``getpeername()``)
    reversed: the other end of that socket's connection."""
    # (family, type and proto as socket() read them from the descriptor)
    if handed.type != socket.SOCK_STREAM or handed.proto != socket.IPPROTO_TCP:
        return False
    try:
        theirs = (_endpoint(handed.getsockname()), _endpoint(handed.getpeername()))
    except OSError:
        return False
    own = own_names[1], own_names[0]
    return None not in own and theirs == (_endpoint(own[0]), _endpoint(own[1]))


def _endpoint(name: Any) -> Tuple[str, int]:
    """A socket name as (host, port), an IPv4-mapped IPv6 host as IPv4: a
    dual-stack listener's side names an IPv4 client's connection so."""
    host = name[0].removeprefix("::ffff:") if name[0].startswith("::ffff:") and "." in name[0] else name[0]
    return host, name[1]


def is_stream_pair_end(sock: socket.socket) -> bool:
    """Whether ``sock`` is an ``AF_UNIX`` stream socket, as a socketpair end is."""
    return sock.family == socket.AF_UNIX and sock.type == socket.SOCK_STREAM


def received(sock: socket.socket) -> Tuple[Optional[Message], List[socket.socket]]:
    """One message from a rendezvous channel and the sockets it carried
    (each the caller's to close). ``(None, [])`` at EOF; a message that
    does not parse comes back as None with its sockets; one that carried
    anything but sockets, with none."""
    data, fds, _flags, _ = socket.recv_fds(sock, MESSAGE_SIZE + 1, MAX_FDS)
    handed = []
    for fd in fds:
        try:
            handed.append(socket.socket(fileno=fd))
        except OSError:  # no socket at all: nothing handed counts
            os.close(fd)
            fds = []
    if not data or not fds:
        for s in handed:
            s.close()
        handed = []
    return (Message.decode(data) if data else None), handed


def is_loopback(host: str) -> bool:
    """Whether ``host`` (an address as a socket names it) is a loopback
    address: a connection to it stays on this host and its network
    namespace."""
    if host.startswith("::ffff:"):
        host = host[7:]
    return host.startswith("127.") or host == "::1"
