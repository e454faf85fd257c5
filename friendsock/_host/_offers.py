"""Both sides of a rendezvous, whatever waits on them (an event loop, a
blocking socket's thread): the channel listener offers come in on, the
connect that waits for one, and the answer to an offer; the channel an
accepting side opens, the offer it sends there, and what the answer says.
No event loop here: each side calls these from its own.
"""

from __future__ import annotations

import _socket
import errno
import fcntl
import itertools
import os
import select
import socket
import struct
import termios
import time
from typing import Any, Callable, Dict, Iterator, List, NamedTuple, Optional, Tuple, TypeVar, Union, cast

from .._core._addresses import is_unspecified
from .._core._errors import LinkBrokenError
from .._core._link import closed_error, fin_arrived, write_refused_across
from .._handshake._process import close_with_reset
from .._socket_errors import check_how
from ._proof import Message, What, channel_address, is_stream_pair_end, mirrors, peer_credentials, received
from ._table import CONNECTS, LISTENERS, PortTable

# Messages read from a channel in one go, at most (the rest wait their turn).
MESSAGES_PER_TURN = 64

# How long a connect waits for the process that accepts it to offer a
# rendezvous; then it is TCP's (an offer that comes later is declined).
OFFER_TIMEOUT = 1.0
# The share of OFFER_TIMEOUT a wait that ran out measures on time.monotonic():
# a loop's timer may fire before it (uvloop's counts from libuv's clock,
# read once each turn of the loop), where an offer or TCP's bytes end a
# wait within milliseconds.
WAITED_OUT = 0.9
# How long an accept waits for the answer of a client process that runs
# but has not answered (its loop, or the GIL, busy elsewhere): it answers
# once it gets to it, and giving up before costs the connection. One that
# is stopped (or gone) is given OFFER_TIMEOUT.
ANSWER_TIMEOUT = 5.0
# How long the connecting end, once done, waits for the accepting end's FIN
# before it closes its TCP socket: the accepting end closes first (a FIN),
# and the connecting end answers with a reset, so that neither socket is
# left in TIME_WAIT, whose port a connect that binds first could not take.
RELEASE_TIMEOUT = 5.0

_tokens = itertools.count(1)  # the rendezvous names of this process's waiting sides


def next_token() -> int:
    """A rendezvous token no other waiting side of this process has (the
    port table's slot keeps 16 bits of it)."""
    return next(_tokens) & 0xFFFF or next(_tokens)


class Peer(NamedTuple):
    """The other end: its process, and its TCP socket's buffer sizes as
    the connection moved (read from the socket it handed over)."""

    pid: int
    sndbuf: int
    rcvbuf: int


def peer_of(pid: int, handed: socket.socket) -> Peer:
    return Peer(pid, handed.getsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF),
                handed.getsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF))


class ConnectWait:
    """A connect from the bound ``sock`` (its address ``sockname``)
    waiting for the offer of the process that accepts it, which finds it
    by its port."""

    __slots__ = ("peer", "port", "sock", "sockname", "to_port", "server_pid", "since")

    def __init__(self, sock: socket.socket, sockname: Any) -> None:
        self.sock = sock
        self.sockname = sockname
        self.port: int = sockname[1]
        self.peer = Peer(0, 0, 0)  # (the offering process, once taken)
        self.to_port = 0
        self.server_pid = 0  # the process the table named for to_port
        self.since = 0.0

    def publish(self, table: PortTable, pid: int, to_port: int, token: int) -> None:
        """Tell the process the table names for ``to_port`` that this
        connect, of process ``pid``'s waiting side ``token``, waits."""
        self.to_port = to_port
        self.server_pid = table.pid(LISTENERS, to_port)
        self.since = time.monotonic()
        table.write(CONNECTS, self.port, pid, to_port, token)

    def withdraw(self, table: PortTable, pid: int, offered: bool) -> None:
        """Stop waiting (``offered``: an offer came). None came within
        OFFER_TIMEOUT, nor anything over TCP: the process the table names
        for the port does not serve it (killed and not yet reaped, or its
        pid now another's), and every connect there would wait as long;
        its slot goes. (A process that does serve it publishes it again
        as it accepts.)"""
        table.clear(CONNECTS, self.port, pid)
        if not offered and self.server_pid and time.monotonic() - self.since >= WAITED_OUT * OFFER_TIMEOUT:
            table.clear(LISTENERS, self.to_port, self.server_pid)

    def names(self) -> Tuple[Any, Any]:
        """The connection's names, as its socket has them (the kernel's)."""
        try:
            if is_unspecified(self.sockname[0]):
                # Bound by its user to the wildcard address: connect()
                # chose the address, which it has only now.
                self.sockname = self.sock.getsockname()
            return self.sockname, self.sock.getpeername()
        except OSError:  # not connected: nothing mirrors it
            return self.sockname, None


# What a process short of descriptors or memory gets from accept() (as
# asyncio's own accept loop counts them).
OUT_OF_RESOURCES = (errno.EMFILE, errno.ENFILE, errno.ENOBUFS, errno.ENOMEM)


def channel_listener(pid: int, token: int) -> Optional[socket.socket]:
    """The listening channel socket of the waiting side ``token`` of
    process ``pid`` (non-blocking); None when its name is taken (whoever
    squats it gets no offer of ours), or no descriptor is left for it."""
    try:
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    except OSError:
        return None
    try:
        sock.bind(channel_address(pid, token))
        sock.listen(64)
        sock.setblocking(False)
    except OSError:
        sock.close()
        return None
    return sock


def accept_channel(listener: socket.socket) -> Optional[Tuple[socket.socket, int]]:
    """A channel another process opened to ``listener``, non-blocking, and
    that process's id; None for nothing to accept, or a process of
    another user (closed at once: never). Raises OSError when this
    process has no descriptor or memory left for it: the channel stays
    in the listener's queue, which stays readable, and the process that
    opened it waits for its answers until the listener closes."""
    try:
        chan, _ = listener.accept()
    except OSError as exc:  # (BlockingIOError, ConnectionAbortedError ...)
        if exc.errno in OUT_OF_RESOURCES:
            raise
        return None
    try:
        pid, uid = peer_credentials(chan)
    except OSError:
        pid, uid = 0, -1
    if uid != os.getuid():
        chan.close()
        return None
    chan.setblocking(False)
    return chan, pid


def messages_waiting(chan: socket.socket) -> Iterator[Tuple[Optional[Message], List[socket.socket]]]:
    """The messages waiting on the non-blocking ``chan`` (at most
    :data:`MESSAGES_PER_TURN`), each with the sockets it carried; at EOF
    (the other process went away), ``(None, [])`` last."""
    for _ in range(MESSAGES_PER_TURN):
        try:
            message, handed = received(chan)
        except (BlockingIOError, InterruptedError):
            return
        except OSError:
            message, handed = None, []
        yield message, handed
        if message is None and not handed:
            return


Wait = TypeVar("Wait", bound=ConnectWait)


def take_offer(waits: Dict[int, Wait], settled: Callable[[Wait], bool], chan: socket.socket,
               pid: int, message: Optional[Message], handed: List[socket.socket]
               ) -> Optional[Tuple[Wait, socket.socket]]:
    """Answer what came on ``chan`` (:func:`answer_offer`) for the connect of
    ``waits`` waiting at its port, unless it is ``settled`` already: that
    wait and the pair end it took, the wait gone from ``waits``; None when
    declined. Raises OSError when the answer cannot be sent."""
    wait = waits.get(message.client_port) if message is not None else None
    if wait is not None and settled(wait):
        wait = None
    pair_end = answer_offer(chan, pid, message, handed, wait)
    if pair_end is None:
        return None
    assert wait is not None
    del waits[wait.port]
    return wait, pair_end


def answer_offer(chan: socket.socket, pid: int, message: Optional[Message],
                 handed: List[socket.socket], wait: Optional[ConnectWait]) -> Optional[socket.socket]:
    """Answer what came on ``chan`` from process ``pid`` (``message`` and
    the sockets ``handed`` with it) for ``wait``, the connect still
    waiting at the message's port (None if none is): the pair end taken,
    its TAKEN sent with the connect's own socket as proof (``wait.peer``
    set); None when declined, the offer not one for ``wait``. An offer
    without its proof (its socket not the other end of ``wait``'s
    connection) is declined and leaves ``wait`` waiting, for the process
    that holds the other end. Raises OSError when the answer cannot be
    sent (nothing taken). Every socket handed is closed but the pair end
    returned."""
    taken: Optional[socket.socket] = None
    try:
        if message is None or message.what is not What.OFFER:
            return None  # not a message of ours: dropped
        # (One whose sockets did not all come, none left here for them, has
        # no proof: declined too, for its process to stop waiting.)
        if wait is not None and offer_proven(message, handed, wait):
            tcp, pair_end = handed
            peer = peer_of(pid, tcp)
            socket.send_fds(chan, [Message(What.TAKEN, message.client_port, message.serial).encode()],
                            [wait.sock.fileno()])
            wait.peer = peer
            taken = pair_end
        else:
            socket.send_fds(chan, [Message(What.DECLINED, message.client_port, message.serial).encode()], [])
        return taken
    finally:
        for sock in handed:
            if sock is not taken:
                sock.close()


def offer_proven(message: Message, handed: List[socket.socket], wait: ConnectWait) -> bool:
    """Whether ``message`` and the sockets ``handed`` with it are an offer
    for ``wait``'s connection: a pair end, and the socket at the other end
    of that connection (its names mirror the connect's own)."""
    return (message.what is What.OFFER and len(handed) == 2 and is_stream_pair_end(handed[1])
            and mirrors(wait.names(), handed[0]))


def directions_shut(how: int) -> Tuple[bool, bool]:
    """What a moved socket's ``shutdown(how)`` ends: (its reading, its
    writing). Each is ended where TCP's would take effect: the writing on
    the pair, whose other end reads EOF; the reading on the TCP socket
    alone, as the pair's would refuse the other end's writes (EPIPE) and
    read to it as this end's FIN. A ``how`` that is none is refused as
    the real call refuses it (:func:`check_how`), before anything else."""
    check_how(how)
    return how != socket.SHUT_WR, how != socket.SHUT_RD


def _polls_now(fd: int, events: int) -> bool:
    """Whether ``fd`` reports any of ``events`` now (or an error or
    hang-up, which poll() tells unasked)."""
    poller = select.poll()
    poller.register(fd, events)
    return bool(poller.poll(0))


def peer_shut_down(fd: int) -> bool:
    """Whether the other end of the pair end ``fd`` shut down its writing
    (or closed): its FIN, as TCP's would have come."""
    return _polls_now(fd, select.POLLRDHUP)


def both_ways_finished(fd: int, tcp: socket.socket, write_shut: bool, peer_rcvbuf: int) -> bool:
    """Whether the TCP socket ``tcp`` of a connection moved onto the pair
    end ``fd`` would be closed by now: its writing shut down
    (``write_shut``), the other end's too, and each FIN arrived
    (:func:`fin_arrived`). What the other end has not read yet is
    measured by ``SIOCOUTQ``: the memory those bytes take, a little more
    than the bytes."""
    return (write_shut and peer_shut_down(fd) and fin_arrived(_sent_unread(fd), peer_rcvbuf)
            and fin_arrived(bytes_to_read(fd), tcp.getsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF)))


def room_like_friends(pair_end: socket.socket, tcp: socket.socket, peer_rcvbuf: int) -> None:
    """The pair end's send buffer as a friend's room: this end's SO_SNDBUF
    plus the peer's SO_RCVBUF (the kernel doubles what it is given, as the
    values read back already are)."""
    try:
        sndbuf = tcp.getsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF)
        pair_end.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, (sndbuf + peer_rcvbuf) // 2)
    except OSError:
        pass


# -- the accepting side ---------------------------------------------------------

# What an offer comes to when the other side took it and then its proof
# failed: the connection is reset, served on neither path.
RESET = object()


def open_channel(pid: int, token: int) -> Optional[socket.socket]:
    """A channel (non-blocking) to the waiting side ``token`` of process
    ``pid``, to offer on; None when that process is gone, its backlog is
    full, or the name is held by another process or user (a squatter)."""
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    try:
        sock.setblocking(False)
        sock.connect(channel_address(pid, token))
        peer_pid, uid = peer_credentials(sock)
    except OSError:
        sock.close()
        return None
    if peer_pid != pid or uid != os.getuid():
        sock.close()
        return None
    return sock


def send_offer(chan: socket.socket, conn: socket.socket, client_port: int, serial: int) -> socket.socket:
    """Offer the accepted ``conn`` (its client's port ``client_port``) on
    ``chan`` as offer ``serial``, handing over ``conn`` and a new pair's
    end: the end this side keeps. Raises OSError when it was not sent: the
    other side never saw it, so TCP is what both take (see
    :func:`channel_gone`)."""
    ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        socket.send_fds(chan, [Message(What.OFFER, client_port, serial).encode()],
                        [conn.fileno(), theirs.fileno()])
    except BaseException:
        ours.close()
        raise
    finally:
        theirs.close()
    return ours


def runs(pid: int) -> bool:
    """Whether process ``pid`` exists and is not stopped (SIGSTOP, a
    debugger's): one that runs answers in the end."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as stat:
            state = stat.read().rpartition(b")")[2].split()[0]
    except (OSError, IndexError):
        return False
    return state not in (b"T", b"t", b"Z", b"X")


def reset_offered(conn: socket.socket) -> None:
    """The accepted ``conn``, offered, reset and closed: neither path is to
    serve it. (Shut down first: the other process holds a copy of the
    socket, handed over with the offer, which a close alone would leave
    open.)"""
    try:
        conn.shutdown(socket.SHUT_RDWR)
    except OSError:
        pass
    close_with_reset(conn)


def channel_gone(exc: OSError) -> bool:
    """Whether an offer that failed to send with ``exc`` leaves its channel
    of no use (the process at the other end gone); a full one still
    carries the answers to the offers sent before."""
    return not isinstance(exc, (BlockingIOError, InterruptedError)) and exc.errno != errno.ENOBUFS


def offer_answered(names: Tuple[Any, Any], pid: int, ours: socket.socket, message: Optional[Message],
                   handed: List[socket.socket]) -> Union[None, object, Tuple[socket.socket, Peer]]:
    """What the answer (``message``, with the sockets ``handed``) of process
    ``pid`` to the offer of the connection named ``names`` (its socket's
    own, then its peer's) comes to: the pair end ``ours`` to serve on and
    the peer, when taken with its proof; None when declined (or no answer:
    ``message`` None); :data:`RESET` when taken without it. Every socket
    handed is closed, and ``ours`` unless it is returned."""
    try:
        if message is None or message.what is not What.TAKEN:
            ours.close()
            return None
        if len(handed) != 1 or not mirrors(names, handed[0]):
            ours.close()
            return RESET
        return ours, peer_of(pid, handed[0])
    finally:
        for sock in handed:
            sock.close()


def read_shut_finds_eof(pair_end: Any) -> bool:
    """Whether a read of a moved connection whose reading its socket's
    ``shutdown(SHUT_RD)`` shut finds EOF at ``pair_end`` (a socket or its
    descriptor; a closed one's, -1, reads EBADF): TCP's read gives what
    came before it, the other end's bytes, FIN or reset, and EOF once
    nothing is left."""
    fd = pair_end if isinstance(pair_end, int) else pair_end.fileno()
    return fd >= 0 and not _polls_now(fd, select.POLLIN)


_QUEUE_SIZE = struct.Struct("i")


def bytes_to_read(pair_end: Any) -> int:
    """Bytes waiting in the receive queue of ``pair_end`` (a socket or its
    descriptor): ``SIOCINQ``."""
    fd = pair_end if isinstance(pair_end, int) else pair_end.fileno()
    return _QUEUE_SIZE.unpack(fcntl.ioctl(fd, termios.FIONREAD, bytes(_QUEUE_SIZE.size)))[0]


def _sent_unread(fd: int) -> int:
    """What the pair end ``fd`` sent that its other end has not read yet:
    ``SIOCOUTQ``, the memory those bytes take."""
    return _QUEUE_SIZE.unpack(fcntl.ioctl(fd, termios.TIOCOUTQ, bytes(_QUEUE_SIZE.size)))[0]


_LINGER = struct.Struct("ii")


def closes_with_reset(tcp: socket.socket) -> bool:
    """Whether ``tcp``'s user set SO_LINGER {1, 0}: its close is a reset,
    which the other end of a moved connection must see first (as the
    abort it is) and then EOF on the pair."""
    try:
        return _LINGER.unpack(tcp.getsockopt(socket.SOL_SOCKET, socket.SO_LINGER, _LINGER.size)) == (1, 0)
    except OSError:
        return False


def refused_with_reset(tcp: Optional[socket.socket], pair: socket.socket) -> Optional[ConnectionResetError]:
    """The reset that a write the ``pair`` end refused (the other end's
    socket gone) meets, as TCP's would: that end aborted (a reset on its
    connection's ``tcp`` socket), or closed with bytes unread here (the
    pair's ECONNRESET, where TCP's close resets). Each is taken off its
    socket, as TCP's send takes its reset. None for a clean close."""
    on_tcp = tcp is not None and isinstance(tcp_error(tcp), ConnectionResetError)
    # (the C class's getsockopt: a moved socket answers for its TCP socket)
    on_pair = _socket.socket.getsockopt(pair, socket.SOL_SOCKET, socket.SO_ERROR) == errno.ECONNRESET
    if on_tcp or on_pair:
        return ConnectionResetError(errno.ECONNRESET, os.strerror(errno.ECONNRESET))
    return None


def was_reset(tcp: socket.socket, pair: socket.socket) -> bool:
    """Whether a reset ended a moved connection: on its ``tcp`` socket
    (the other end aborted: POLLERR while the error waits to be taken,
    POLLHUP as the socket is closed, after too), or on its ``pair`` end
    (the other end closed with bytes unread here: POLLERR). Poll leaves
    the error to the call that takes it, as TCP's shutdown() leaves it.
    (The TCP socket, whose writing is never shut while the connection
    lives, polls POLLHUP only once closed.)"""
    poller = select.poll()
    tcp_fd = tcp.fileno()
    for fd in (tcp_fd, pair.fileno()):
        poller.register(fd, 0)  # (POLLERR and POLLHUP come unasked)
    return any(events & select.POLLERR or (fd == tcp_fd and events & select.POLLHUP)
               for fd, events in poller.poll(0))


def socket_error(tcp: socket.socket, pair: socket.socket) -> int:
    """A moved connection's ``SO_ERROR``, taken as TCP's is: its TCP
    socket's (the other end's abort), else its ``pair`` end's (the other
    end closed with bytes unread here, which TCP's close answers with a
    reset). (The C class's getsockopt: a moved socket answers for its TCP
    socket.)"""
    error: int = _socket.socket.getsockopt(tcp, socket.SOL_SOCKET, socket.SO_ERROR)
    if error or pair.fileno() < 0:
        return error
    return cast(int, _socket.socket.getsockopt(pair, socket.SOL_SOCKET, socket.SO_ERROR))


class TcpReset:
    """What only this end knows of how a moved connection's TCP socket
    would have ended: whether it was reset by now (``seen``: a write taken
    after the other end's clean close, which the other kernel answers
    with a reset; a read that met the other end's reset; ``SO_ERROR``
    that took it), the error it would hold, whether a read found the
    other end's EOF first, and whether this end shut its writing down.
    TCP's writes fail after a reset (EPIPE); its ``shutdown()`` and
    ``getpeername()`` with ENOTCONN. One per connection, shared by an
    end's copies."""

    __slots__ = ("seen", "error", "fin_read", "fin_sent")

    def __init__(self) -> None:
        self.seen = False
        # The error TCP's socket would hold, not taken yet.
        self.error = 0
        # A read here found the other end's EOF: a reset that comes after
        # meets TCP's socket in CLOSE_WAIT, which holds it as EPIPE.
        self.fin_read = False
        # This end shut its writing down (TCP's FIN). With the other end's
        # EOF read, TCP's connection is over: a reset after that, from
        # a close with bytes unread there, is not sent (nothing is left
        # to reset), and TCP's socket holds no error.
        self.fin_sent = False

    def _met_reset(self) -> int:
        """The other end's reset met here: the error TCP's socket holds
        for it (0: none, the connection was over)."""
        self.seen = True
        if not self.fin_read:
            return errno.ECONNRESET
        return 0 if self.fin_sent else errno.EPIPE

    def socket_error(self, tcp: socket.socket, pair: socket.socket) -> int:
        """``SO_ERROR`` (see :func:`socket_error`), taken; a reset, seen."""
        error, self.error = self.error, 0
        if not error:
            error = socket_error(tcp, pair)
        return self._met_reset() if error == errno.ECONNRESET else error

    def closed(self, tcp: socket.socket, pair: socket.socket, finished: bool) -> Optional[LinkBrokenError]:
        """What a call that needs the connection fails with (ENOTCONN), if
        anything (:func:`closed_error`): reset, here or by a reset that
        ``tcp`` or ``pair`` holds (:func:`was_reset`), or both directions
        ``finished``."""
        reset = self.seen or (tcp.fileno() >= 0 and was_reset(tcp, pair))
        return closed_error(reset, finished)

    def write_refused(self, peer_reset: bool, wrote: bool) -> Optional[LinkBrokenError]:
        """What a write the pair refused gets (:func:`write_refused_across`):
        ``peer_reset``, the other end aborted or closed with bytes unread
        here (the write takes that reset); ``wrote``: the write had bytes,
        which TCP takes once and the other kernel resets."""
        error = write_refused_across(peer_reset, self.seen, self.fin_read)
        if error is not None:
            self.error = 0  # (TCP's failing write takes the error it holds)
        elif wrote:
            self.error = errno.EPIPE  # (that reset meets TCP's socket after the FIN)
        if wrote or peer_reset:
            self.seen = True
        return error

    def refused_write(self, tcp: socket.socket, pair: socket.socket, refused: OSError,
                      wrote: bool) -> Optional[OSError]:
        """What a write that the ``pair`` end ``refused`` (EPIPE: the other
        end's socket gone, or this end's writing shut down) answers, as
        TCP's send would: None where TCP takes it (``wrote``: it had
        bytes; see :meth:`write_refused`), else the error it raises."""
        tcp_open = tcp.fileno() >= 0
        reset = refused_with_reset(tcp if tcp_open else None, pair)
        if self.fin_sent:
            # Our own shutdown: EPIPE, as TCP's, but for a reset that came
            # since, which TCP's send takes and raises (where the
            # connection was not over by then).
            return reset if reset is not None and self._met_reset() else refused
        if reset is None and tcp_open and was_reset(tcp, pair):
            self.seen = True  # (a reset whose error a call took: TCP's writes fail)
        error = self.write_refused(reset is not None, wrote)
        return None if error is None else error.as_os_error()

    def read_reset(self) -> bool:
        """A read met the other end's reset; whether it raises it. Not once
        a read found the other end's EOF: TCP's read finds EOF again, its
        socket holding the reset as EPIPE for ``SO_ERROR`` or a write (or
        nothing, the connection over: see ``fin_sent``)."""
        error = self._met_reset()
        if error == errno.ECONNRESET:
            return True
        self.error = error
        return False


def tcp_error(tcp: socket.socket) -> Optional[OSError]:
    """The error pending on a moved connection's TCP socket, if any: a
    reset there is the other end's abort, which its EOF on the pair
    follows."""
    try:
        tcp.recv(1, socket.MSG_PEEK | socket.MSG_DONTWAIT)
    except (BlockingIOError, InterruptedError):
        return None
    except OSError as exc:
        if exc.errno == errno.ECONNRESET:
            return ConnectionResetError(errno.ECONNRESET, os.strerror(errno.ECONNRESET))
        return exc
    return None
