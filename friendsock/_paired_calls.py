"""The calls a paired socket object (a trio socket, or a blocking socket,
whose connection paired) answers from its link end rather than its
descriptor, shared by every kind: addresses, options, ``shutdown()``, and
the arguments of ``recvmsg()``/``sendmsg()`` checked as the C calls check
them.
"""

from __future__ import annotations

import operator
import socket
import sys
from typing import Any, List

from ._core._channel import CHANNEL_TCP
from ._core._link import LinkEnd
from ._friend_socket import FriendSocket, shut_write
from ._socket_errors import check_how

# recvmsg()/sendmsg() on a TCP connection: scatter/gather reads and writes;
# no ancillary data comes (TCP ignores what sendmsg gives). Their arguments,
# checked as the C calls check them, for every kind of paired socket.
def recvmsg_size(bufsize: Any, ancbufsize: Any) -> int:
    bufsize = operator.index(bufsize)
    if bufsize < 0:
        raise ValueError("negative buffer size in recvmsg()")
    _check_ancillary_size(ancbufsize)
    return bufsize


def _check_ancillary_size(ancbufsize: Any) -> None:
    if operator.index(ancbufsize) < 0:
        raise ValueError("invalid ancillary data buffer length")  # the C call's words


def recvmsg_views(buffers: Any, ancbufsize: Any) -> List[memoryview]:
    """``recvmsg_into()``'s buffers, as byte views to fill in turn."""
    views = [memoryview(buffer).cast("B") for buffer in buffers]
    if any(view.readonly for view in views):
        raise TypeError("recvmsg_into() argument 1 must be an iterable of single-segment "
                        "read-write buffers")
    _check_ancillary_size(ancbufsize)
    return views


def scatter(data: bytes, views: List[memoryview]) -> int:
    """``data`` into ``views`` in turn; its size."""
    offset = 0
    for view in views:
        piece = data[offset:offset + len(view)]
        view[:len(piece)] = piece
        offset += len(piece)
    return len(data)


def sendmsg_data(buffers: Any, ancdata: Any, address: Any) -> bytes:
    """What ``sendmsg()`` sends: its buffers joined. Its ancillary data and
    address are checked as the C call does, then ignored, as TCP does on a
    connected socket."""
    data = b"".join(memoryview(buffer).cast("B") for buffer in buffers)
    for item in ancdata:
        if not isinstance(item, tuple) or len(item) != 3:
            raise TypeError("sendmsg() ancillary data items must be (level, type, data) tuples")
        operator.index(item[0]), operator.index(item[1]), memoryview(item[2])
    if address is not None and not isinstance(address, tuple):
        raise TypeError(f"sendmsg() address must be a tuple, not {type(address).__name__}")
    return data


class PairedSocketCalls:
    """The calls a paired socket object (a trio socket, or a blocking
    socket, whose connection paired) answers from its link end rather than
    its descriptor: the addresses known at pairing, and the options through
    its :class:`FriendSocket` (``_options``), so buffer sizes feed the
    accounting. ``_check_open`` raises what the call on a closed socket
    raises."""

    _sockname: Any
    _peername: Any
    _options: FriendSocket
    _end: LinkEnd
    _read_shut: bool

    def _check_open(self) -> None:
        raise NotImplementedError

    def getsockname(self) -> Any:
        self._check_open()
        return self._sockname

    def getpeername(self) -> Any:
        self._check_open()
        error = self._end.peername_error()
        if error is not None:
            raise error.as_os_error()
        return self._peername

    def getsockopt(self, *args: Any) -> Any:
        self._check_open()
        value = self._options.getsockopt(*args)
        if args[:2] == (socket.SOL_SOCKET, socket.SO_ERROR):
            error = self._end.take_error()  # the friend's reset, pending: reported once
            if error is not None:
                number = error.errno
                return number if type(value) is int else number.to_bytes(4, sys.byteorder)[:len(value)]
        return value

    def setsockopt(self, *args: Any) -> None:
        self._check_open()
        self._options.setsockopt(*args)

    def _shutdown_end(self, how: int) -> bool:
        """``shutdown(how)`` on the link: EOF to the friend for SHUT_WR and
        SHUT_RDWR (the link's errno as an OSError), EOF for later reads for
        SHUT_RD and SHUT_RDWR, as on Linux. Returns whether the writing side
        was shut."""
        # Bound now: a hand-over meanwhile may give this object its real
        # socket's class (a trio socket's: trio's own).
        shutdown_on_tcp, show_own_fin = self._shutdown_on_tcp, self._show_fin
        self._check_open()
        check_how(how)
        # The link may go on over TCP meanwhile (a fork on another thread),
        # too early for its hand-over to carry this shutdown: the socket
        # makes it then.
        if how != socket.SHUT_RD:
            shut_write(self._end, show_own_fin, shutdown_on_tcp)
        if how != socket.SHUT_WR:
            self._read_shut = True
            if self._end.incoming.state is CHANNEL_TCP:  # (a second one is harmless)
                shutdown_on_tcp(socket.SHUT_RD)
        return how != socket.SHUT_RD

    def _shutdown_on_tcp(self, how: int) -> None:
        """``shutdown(how)`` on the real socket (the link went on over TCP)."""
        raise NotImplementedError

    def _show_fin(self) -> None:
        """Done writing on the link: the real socket's FIN, by the link's
        rule (:func:`show_fin`)."""
        raise NotImplementedError
