"""A blocking socket's connection to another process of this host.

A ``connect()`` (under ``patch_socket()``) to a loopback port that a
friendsock process of this host serves binds first, waits for that
process's offer (``_host._offers``) once connected, and takes it: the
socketpair end it was handed takes the socket's descriptor number
(``dup2``), so every call that moves bytes or waits (``recv``,
``sendall``, ``makefile``, ``select``, timeouts) is the kernel's own on the
pair, and the socket answers for the rest as the TCP connection
(:class:`AcrossSocket`), whose socket stays open without payload until
this one closes. A non-blocking socket's connect waits too, briefly
(``NONBLOCKING_OFFER_TIMEOUT``), on a thread with no asyncio loop: its
caller registers the descriptor with its poller once connect() returns,
so the move must be made by then.

A listener's ``accept()`` offers the connections of friendsock processes
waiting for one, in the accepting thread, and the socket it hands out
moves the same way when its offer is taken (:func:`accept_across`).

Offers come in on a thread of this process's own (:class:`Rendezvous`),
which also finishes the TCP sockets of connections that ended, as the
event loops' side does: it waits for the accepting end's FIN and answers
it with a reset, so that no port is left in TIME_WAIT.
"""

from __future__ import annotations

import errno
import heapq
import itertools
import logging
import math
import os
import select as _select
import selectors
import socket
import struct
import threading
import time
import weakref
from typing import Any, Callable, Dict, List, NamedTuple, NoReturn, Optional, Tuple, Union, cast

from .._core._link import LinkBrokenError
from .._core._live import AcrossEnd, DirectionInfo, EndInfo, LinkInfo, link_between_processes, live_across
from .._core._fork import Part, on_fork
from .._core._pcap import CLIENT, SERVER
from .._core._stats import Fallback, counters
from .._core._tap import StreamTap, stream_tap_for
from .._handshake import CONFIRM_TIMEOUT, current_pid
from .._handshake._binding import port_before_connect
from .._handshake._process import close_with_reset
from .._handshake._tcp_info import family_of, is_tcp_socket, other_end_finished
from .._host import PortTable, Slot, port_table
from .._host._offers import (
    ANSWER_TIMEOUT,
    OFFER_TIMEOUT,
    RELEASE_TIMEOUT,
    RESET,
    ConnectWait,
    Peer,
    TcpReset,
    accept_channel,
    both_ways_finished,
    bytes_to_read,
    channel_gone,
    channel_listener,
    closes_with_reset,
    directions_shut,
    messages_waiting,
    next_token,
    offer_answered,
    open_channel,
    peer_shut_down,
    read_shut_finds_eof,
    room_like_friends,
    runs,
    send_offer,
    take_offer,
    tcp_error,
)
from .._host._payoff import moved_connection_ended
from .._host._ports import connect_slot, served_elsewhere
from .._host._proof import Message
from .._socket_errors import already_connected, bad_descriptor
from ._capable import CONNECT_UNREPORTED, FriendCapableSocket, connect_again, moved_pair_ends, running_asyncio_loop
from ._descriptor import OriginalSocket, _ss

logger = logging.getLogger("friendsock")


class Waiting(ConnectWait):
    """A connect waiting on a thread (blocking) or in a trio task: settled
    once its offer was taken, or it stopped waiting; ``on_settled`` (set
    by a waiter that is not a thread) is called then, from any thread."""

    __slots__ = ("settled", "taken", "on_settled")

    def __init__(self, sock: socket.socket, sockname: Any) -> None:
        super().__init__(sock, sockname)
        self.settled = threading.Event()
        self.taken: Optional[socket.socket] = None  # the pair end, once taken
        self.on_settled: Optional[Any] = None

    def settle(self) -> None:
        self.settled.set()
        if self.on_settled is not None:
            self.on_settled()


def _settled(wait: Waiting) -> bool:
    return wait.settled.is_set()


class _OfferChannel:
    """A channel this process opened to another's waiting side, to offer
    on: one offer at a time, its answer read by the thread that offered."""

    __slots__ = ("lock", "pid", "serials", "sock")

    def __init__(self, sock: socket.socket, pid: int) -> None:
        self.sock = sock
        self.pid = pid
        self.lock = threading.Lock()
        self.serials = itertools.count(1)


class Rendezvous:
    """This process's side of the rendezvous for blocking sockets: its
    channel listener, and the thread that serves it; the channels its
    listeners' accepts offer on."""

    def __init__(self, table: PortTable, listener: socket.socket, token: int) -> None:
        self.pid = current_pid()
        self.table = table
        self.listener: Optional[socket.socket] = listener
        self.token = token
        self.listen_again_at = 0.0  # (once the listener closed: see _accept_channel)
        self.lock = threading.Lock()  # waits, and what the thread is handed
        self.waits: Dict[int, Waiting] = {}
        self.to_release: List[Tuple[socket.socket, Optional[float]]] = []
        self.releasing = 0  # TCP sockets handed to release() and not closed yet
        self.channels = 0  # channels other processes opened, still open
        self.selector = selectors.DefaultSelector()
        self.wake_r, self.wake_w = os.pipe2(os.O_NONBLOCK | os.O_CLOEXEC)
        self.selector.register(listener, selectors.EVENT_READ, None)
        self.selector.register(self.wake_r, selectors.EVENT_READ, "wake")
        self.lingering: List[Tuple[float, int, socket.socket]] = []  # by deadline
        self.serials = itertools.count()  # (orders sockets of one deadline)
        self.offering: Dict[Tuple[int, int], _OfferChannel] = {}  # under lock
        self.closed = False
        self.thread = threading.Thread(target=self._serve, name="friendsock-rendezvous", daemon=True)

    def close(self) -> None:
        """Its sockets (this process's copies) closed; its thread, if it
        runs, ends at its next turn."""
        self.closed = True
        for key in list(self.selector.get_map().values()):
            if isinstance(key.fileobj, socket.socket):
                key.fileobj.close()
        self.selector.close()
        for fd in (self.wake_r, self.wake_w):
            os.close(fd)
        with self.lock:
            offering, self.offering = self.offering, {}
        for chan in offering.values():
            chan.sock.close()

    # -- the connecting thread's side ---------------------------------------
    def expect_offer(self, sock: socket.socket, to_port: int) -> Optional[Waiting]:
        try:
            sockname = sock.getsockname()
        except OSError:
            return None
        with self.lock:
            if not sockname[1] or sockname[1] in self.waits or self.listener is None:
                return None
            wait = self.waits[sockname[1]] = Waiting(sock, sockname)
        wait.publish(self.table, self.pid, to_port, self.token)
        return wait

    def wait_for_offer(self, wait: Waiting, timeout: float) -> None:
        """Until the offer ``wait`` expects is taken, or ``timeout`` has
        passed, or its TCP socket reads anything (a reset, EOF, bytes): the
        process that accepted it offers nothing then (a listener that
        closed with the connection in its backlog, a server without
        friendsock sharing the port), and TCP's is the answer at once."""
        try:
            woken = os.eventfd(0, os.EFD_CLOEXEC | os.EFD_NONBLOCK)
        except OSError:  # no descriptor left for it: until settled, or the time is up
            wait.settled.wait(timeout)
            return
        try:
            with self.lock:  # (what settles the wait holds it too)
                if wait.settled.is_set():
                    return
                wait.on_settled = lambda: os.eventfd_write(woken, 1)
            poller = _select.poll()
            poller.register(wait.sock.fileno(), _select.POLLIN)
            poller.register(woken, _select.POLLIN)
            poller.poll(math.ceil(timeout * 1000))
        finally:
            with self.lock:
                wait.on_settled = None
            os.close(woken)

    def end_wait(self, wait: Waiting) -> Optional[socket.socket]:
        """Stop waiting: the pair end taken, or None (an offer that comes
        now is declined)."""
        with self.lock:
            if self.waits.get(wait.port) is wait:
                del self.waits[wait.port]
            wait.settled.set()  # (by the waiter itself: nothing to wake)
            taken = wait.taken
        wait.withdraw(self.table, self.pid, taken is not None)
        return taken

    def release(self, tcp: socket.socket, timeout: Optional[float] = RELEASE_TIMEOUT) -> None:
        """A connection moved off ``tcp`` ended here, on its connecting
        side: its TCP socket closes with a reset once the accepting end's
        FIN comes, or as it is once ``timeout`` has passed (None: never,
        for a connection that goes on where this process cannot see it)."""
        with self.lock:
            self.to_release.append((tcp, timeout))
            self.releasing += 1
        try:
            os.write(self.wake_w, b"x")
        except OSError:  # (the pipe is full: the thread is awake already)
            pass

    # -- the accepting thread's side -----------------------------------------
    def offer(self, conn: socket.socket, names: Tuple[Any, Any], slot: Slot,
              limit: Optional[float] = None) -> Union[None, object, Tuple[socket.socket, Peer]]:
        """Offer the accepted ``conn`` (``names``: its own and its peer's)
        to the connect of ``slot``, and wait here for the answer: see
        :func:`offer_answered`. An offer sent and not answered in time (see
        :func:`_answer_to`; ``limit``, the accept's own bound) is
        :data:`RESET`: the other side may take it yet."""
        key = (slot.pid, slot.token)
        with self.lock:
            chan = self.offering.get(key)
            if chan is None:
                self._drop_offering_to_the_gone()
                sock = open_channel(*key)
                if sock is None:  # gone, full, or a squatter on the name: TCP
                    return None
                chan = self.offering[key] = _OfferChannel(sock, slot.pid)
        with chan.lock:
            serial = next(chan.serials) & 0xFFFFFFFF
            try:
                ours = send_offer(chan.sock, conn, names[1][1], serial)
            except OSError as exc:
                if channel_gone(exc):
                    self._drop_offering(key, chan)
                return None
            try:
                answer = _answer_to(chan, serial, limit)
            except BaseException:
                ours.close()  # (as not answered: the other side reads EOF if it took it)
                raise
        if answer is None:
            ours.close()
            return RESET
        message, handed = answer
        if message is None and not handed:  # that process went away
            self._drop_offering(key, chan)
        return offer_answered(names, chan.pid, ours, message, handed)

    def _drop_offering_to_the_gone(self) -> None:
        """(Under the lock.) The channels to processes that have ended, not
        in use: nothing reads them between offers, so each would stay open
        for good, one per client process a long-lived server has known."""
        for key, chan in list(self.offering.items()):
            try:
                os.kill(chan.pid, 0)
                continue
            except ProcessLookupError:
                pass
            except OSError:  # (alive, another user's: not ours to judge)
                continue
            if chan.lock.acquire(blocking=False):
                del self.offering[key]
                chan.sock.close()
                chan.lock.release()

    def _drop_offering(self, key: Tuple[int, int], chan: _OfferChannel) -> None:
        with self.lock:
            if self.offering.get(key) is chan:
                del self.offering[key]
        chan.sock.close()

    # -- the thread ---------------------------------------------------------
    def _serve(self) -> None:
        while not self.closed:
            try:
                self._turn()
            except Exception:  # one bad socket must not end the thread the others need
                if not self.closed:
                    logger.exception("the rendezvous thread of blocking sockets")

    def _turn(self) -> None:
        """One wait for what is ready, and what it was."""
        timeout = None
        if self.lingering:
            timeout = max(0.0, self.lingering[0][0] - time.monotonic())
        if self.listener is None:
            self._listen_again()
            if self.listener is None:
                timeout = max(0.0, min(timeout if timeout is not None else LISTEN_AGAIN_AFTER,
                                       self.listen_again_at - time.monotonic()))
        for key, _ in self.selector.select(timeout):
            data = key.data
            if key.fileobj is self.listener:
                self._accept_channel(key.fileobj)
            elif data == "wake":
                self._take_released()
            elif data == "finished":
                self._finish(key.fileobj, True)  # type: ignore[arg-type]
            else:
                self._offers_arrived(key.fileobj, data)  # type: ignore[arg-type]
        now = time.monotonic()
        while self.lingering and self.lingering[0][0] <= now:
            _, _, tcp = heapq.heappop(self.lingering)
            self._finish(tcp, False)

    def _accept_channel(self, listener: socket.socket) -> None:
        try:
            opened = accept_channel(listener)
        except OSError:
            # No descriptor left to accept it with: the listener closes,
            # which resets the channels in its queue (their offers are
            # TCP's at once), where it would stay readable and unanswered;
            # connects meanwhile are TCP's.
            self.selector.unregister(listener)
            with self.lock:
                self.listener = None
            listener.close()
            self.listen_again_at = time.monotonic() + LISTEN_AGAIN_AFTER
            return
        if opened is not None:
            self.selector.register(opened[0], selectors.EVENT_READ, opened[1])
            self.channels += 1

    def _listen_again(self) -> None:
        if time.monotonic() < self.listen_again_at:
            return
        listener = channel_listener(self.pid, self.token)
        if listener is None:
            self.listen_again_at = time.monotonic() + LISTEN_AGAIN_AFTER
            return
        self.selector.register(listener, selectors.EVENT_READ, None)
        with self.lock:
            self.listener = listener

    def _take_released(self) -> None:
        try:
            while os.read(self.wake_r, 256):
                pass
        except BlockingIOError:
            pass
        with self.lock:
            released, self.to_release = self.to_release, []
        now = time.monotonic()
        for tcp, timeout in released:
            try:
                self.selector.register(tcp, selectors.EVENT_READ, "finished")
            except (ValueError, OSError):  # closed meanwhile
                self._closed(tcp.close)
                continue
            if timeout is not None:
                heapq.heappush(self.lingering, (now + timeout, next(self.serials), tcp))

    def _finish(self, tcp: socket.socket, answered: bool) -> None:
        if tcp.fileno() < 0:
            return  # (finished already: its deadline came after its FIN)
        self.selector.unregister(tcp)
        # (Readable, but still established: its user shut its reading,
        # and the FIN to answer has not come. It closes as TCP's would.)
        self._closed(lambda: close_with_reset(tcp) if answered and other_end_finished(tcp) else tcp.close())

    def _drop(self, chan: socket.socket) -> None:
        self.selector.unregister(chan)
        chan.close()
        self.channels -= 1

    def _closed(self, close: Any) -> None:
        close()
        with self.lock:
            self.releasing -= 1

    def _offers_arrived(self, chan: socket.socket, pid: int) -> None:
        for message, handed in messages_waiting(chan):
            if message is None and not handed:  # EOF: that process went away
                self._drop(chan)
                return
            with self.lock:
                try:
                    taken = take_offer(self.waits, _settled, chan, pid, message, handed)
                except OSError:
                    # Unanswered: the offering side learns no from the
                    # channel closing, and so TCP is what both take.
                    self._drop(chan)
                    return
                if taken is not None:
                    wait, pair_end = taken
                    wait.taken = pair_end
                    # Nothing of the wait kept past this: the next read
                    # lets the GIL go, and a process whose main thread
                    # then exits finalizes with this thread's frame kept,
                    # holding the user's socket (no ResourceWarning for
                    # one left open, as a TCP one gives).
                    del taken, pair_end
                    wait.settle()
                    del wait


def _answer_to(chan: _OfferChannel, serial: int, limit: Optional[float]
               ) -> Optional[Tuple[Optional[Message], List[socket.socket]]]:
    """The answer to offer ``serial`` on ``chan`` (under its lock), as it
    came with the sockets it carried; ``(None, [])`` at EOF; None when none
    came in time: within :data:`OFFER_TIMEOUT` if that process is stopped
    (or gone), else :data:`ANSWER_TIMEOUT`, or ``limit`` if shorter.
    Answers to offers given up on before are dropped."""
    now = time.monotonic()
    last = now + (ANSWER_TIMEOUT if limit is None else min(limit, ANSWER_TIMEOUT))
    check = min(now + OFFER_TIMEOUT, last)  # (then: is it running at all?)
    poller = _select.poll()
    poller.register(chan.sock, _select.POLLIN)
    while True:
        for message, handed in messages_waiting(chan.sock):
            if message is None and not handed:
                return None, []
            if message is not None and message.serial == serial:
                return message, handed
            for sock in handed:
                sock.close()
        now = time.monotonic()
        if now >= last:
            return None
        if now >= check:
            if not runs(chan.pid):
                return None
            check = min(now + OFFER_TIMEOUT, last)
        poller.poll(math.ceil((check - now) * 1000))


_rendezvous: Optional[Rendezvous] = None
_made = threading.Lock()


def this_process() -> Optional[Rendezvous]:
    """This process's rendezvous for blocking sockets, made on first use;
    None when connections do not move between processes."""
    global _rendezvous
    table = port_table()
    if table is None:
        return None
    found = _rendezvous
    if found is not None:
        return found
    with _made:
        if _rendezvous is None:
            token = next_token()
            listener = channel_listener(current_pid(), token)
            if listener is None:
                return None
            made = Rendezvous(table, listener, token)
            try:
                made.thread.start()
            except BaseException:  # (interrupted: no half-made one stays)
                made.close()
                raise
            _rendezvous = made
        return _rendezvous


def _forked() -> None:
    # The thread is not the child's, nor the waits; the sockets are copies,
    # closed so that the parent's closes still finish its connections.
    global _rendezvous, _made
    _made = threading.Lock()  # (another thread may have held it)
    found, _rendezvous = _rendezvous, None
    if found is not None:
        found.close()


on_fork(Part.ACROSS_THREAD, after_in_child=_forked)


# -- the connect --------------------------------------------------------------


def expect_offer(sock: socket.socket, resolved: Any) -> Optional[Tuple[Rendezvous, Waiting]]:
    """Before ``connect()`` of ``sock`` to ``resolved``: bound if it has no
    port yet (the accepting process finds the connect by it), and waiting
    for its offer on this process's rendezvous; None when it cannot."""
    rendezvous = this_process()
    if rendezvous is None:
        return None
    if not port_before_connect(sock, resolved[0]):
        return None
    wait = rendezvous.expect_offer(sock, resolved[1])
    return None if wait is None else (rendezvous, wait)


# How long a non-blocking socket's connect() to another friendsock process
# may hold its caller (an event loop of its own: tornado's, Twisted's) for
# the handshake and the offer: the move must be made before connect()
# returns, as the caller registers the descriptor with its poller then (a
# registration follows the open file, not the number). Past it, TCP's.
NONBLOCKING_OFFER_TIMEOUT = 0.05
# How long a listener closed for want of descriptors stays closed.
LISTEN_AGAIN_AFTER = 1.0


def connect_across(sock: FriendCapableSocket, resolved: Any, deadline: Optional[float]) -> bool:
    """``connect()`` of ``sock`` to ``resolved`` (numeric, on loopback), a
    port a friendsock process of this host serves: made, and the
    connection moved off TCP if that process offers it in time (True,
    either way); False, nothing connected, where it is not to be tried.
    A non-blocking ``sock`` waits at most NONBLOCKING_OFFER_TIMEOUT; where
    its handshake is not done by then, BlockingIOError (EINPROGRESS): the
    connect goes on over TCP, as the kernel's own."""
    expecting = expect_offer(sock, resolved)
    if expecting is None:
        return False
    rendezvous, wait = expecting
    nonblocking = sock.gettimeout() == 0.0
    try:
        if nonblocking:
            deadline = time.monotonic() + NONBLOCKING_OFFER_TIMEOUT
            if not _connected_by(sock, resolved, deadline):
                if not _take(sock, rendezvous.end_wait(wait), wait, rendezvous):
                    counters.fallback(Fallback.NOT_OFFERED, resolved)
                _in_progress(sock)  # (if taken, as the wait ended: the handshake was done)
        else:
            _ss.connect(sock, resolved)
        left = None if deadline is None else max(0.0, deadline - time.monotonic())
        rendezvous.wait_for_offer(wait, OFFER_TIMEOUT if left is None else min(OFFER_TIMEOUT, left))
    except BlockingIOError:
        raise
    except BaseException:
        # (Interrupted, a signal's handler raising, say: an offer taken
        # meanwhile is still served, so that both ends agree.)
        _take(sock, rendezvous.end_wait(wait), wait, rendezvous)
        raise
    if not _take(sock, rendezvous.end_wait(wait), wait, rendezvous):
        counters.fallback(Fallback.NOT_OFFERED, resolved)
    if nonblocking:
        _in_progress(sock)
    return True


def _in_progress(sock: FriendCapableSocket) -> NoReturn:
    """A non-blocking connect's answer, as the kernel's: BlockingIOError
    (EINPROGRESS), whether it is done or not; a moved socket's next
    connect then says it is done (see connect_again)."""
    if isinstance(sock, AcrossSocket):
        sock.__dict__[CONNECT_UNREPORTED] = True
    raise BlockingIOError(errno.EINPROGRESS, os.strerror(errno.EINPROGRESS))


def _connected_by(sock: FriendCapableSocket, resolved: Any, deadline: float) -> bool:
    """The non-blocking ``sock``'s connect to ``resolved`` made, and its
    handshake done by ``deadline`` (True); False while it goes on, or once
    it failed (its error left in SO_ERROR for its caller to read)."""
    try:
        _ss.connect(sock, resolved)
        return True
    except (BlockingIOError, InterruptedError):
        pass
    poller = _select.poll()
    poller.register(_ss.fileno(sock), _select.POLLOUT)
    events = poller.poll(max(0, math.ceil((deadline - time.monotonic()) * 1000)))
    return bool(events) and not events[0][1] & (_select.POLLERR | _select.POLLHUP)


def _take(sock: FriendCapableSocket, pair_end: Optional[socket.socket], wait: Waiting,
          rendezvous: "Rendezvous") -> bool:
    """``sock`` moved onto ``pair_end`` if one was taken (True)."""
    if pair_end is None:
        return False
    try:
        move_onto_pair(sock, pair_end, wait.names(), wait.peer, rendezvous)
    except BaseException:
        _ss.close(sock)  # served on neither path: as a connect that failed, it goes
        raise
    finally:
        pair_end.close()
    return True


def may_cross(sock: socket.socket, resolved: Any) -> bool:
    """Whether a connect of ``sock`` to ``resolved`` (no listener of this
    process there) is one to another friendsock process of this host (the
    table's word, no system call unless it names one). Not a non-blocking
    one on a thread that runs an asyncio loop: that loop's code may hand
    the socket to a transport that does its I/O in C (uvloop's), and the
    wait for the offer would hold the loop."""
    return (served_elsewhere(resolved[0], resolved[1], family_of(sock)) and is_tcp_socket(sock)
            and (sock.gettimeout() != 0.0 or running_asyncio_loop() is None))


# -- the accept ----------------------------------------------------------------


class TakenOffer(NamedTuple):
    """An accepted connection's offer, taken: the pair end to serve it on."""

    pair_end: socket.socket
    peer: Peer
    names: Tuple[Any, Any]  # the TCP socket's own, then its peer's
    rendezvous: Rendezvous


def offer_accepted(sock: socket.socket, address: Any, listener_port: int,
                   timeout: Optional[float] = None) -> Optional[TakenOffer]:
    """Offer the socket ``sock`` a listener on ``listener_port`` (whose
    ``timeout`` bounds the wait: a non-blocking one's, the offer's
    second) accepted from ``address`` to the friendsock process of this
    host that connected it, if one waits, and wait here for the answer:
    the pair to serve it on, if taken; None when no process waits, or it
    declined (TCP), or when it took the offer without its proof or did
    not answer in time: then ``sock`` is a connection reset
    (:func:`reset_in_place`), as its client's reset would leave it."""
    slot = connect_slot(address, listener_port)
    if slot is None:
        return None
    rendezvous = this_process()
    if rendezvous is None:
        return None
    if timeout is not None:
        # A client that connected its socket on an event loop holds the
        # offer until the socket is handed over, the confirm deadline at
        # most: a shorter listener timeout gives it that, and more for its
        # loop's turn (the accept returns that much later).
        timeout = max(OFFER_TIMEOUT if timeout == 0 else timeout, 2 * CONFIRM_TIMEOUT)
    try:
        names = (sock.getsockname(), address)
        offered = rendezvous.offer(sock, names, slot, timeout)
    except OSError:  # (no descriptor left for the pair, say): not offered, so TCP
        return None
    if offered is None:
        return None
    if offered is RESET:
        reset_in_place(sock)  # neither path is safe
        return None
    pair_end, peer = cast(Tuple[socket.socket, Peer], offered)
    return TakenOffer(pair_end, peer, names, rendezvous)


def reset_in_place(sock: socket.socket) -> None:
    """``sock``'s connection reset, and its descriptor number made a socket
    of the same family whose connection was reset: what TCP hands out for
    a connection its client reset before it was read (ECONNRESET at the
    first read, EOF after; EPIPE on writing; ENOTCONN for its peer's name).
    (Shut down first: the other process may hold a copy of the socket.)"""
    try:
        sock.shutdown(socket.SHUT_RDWR)
    except OSError:
        pass
    tcp = OriginalSocket(sock.family, sock.type, sock.proto, fileno=os.dup(sock.fileno()))
    try:
        reset = _a_reset_connection(sock.family)
        try:
            os.dup2(reset.fileno(), sock.fileno(), inheritable=False)
        finally:
            reset.close()
    except OSError:
        pass  # (no descriptor left: shut down, it reads EOF)
    finally:
        close_with_reset(tcp)


def _a_reset_connection(family: int) -> socket.socket:
    """The accepted end of a loopback connection its client reset."""
    host = "::1" if family == socket.AF_INET6 else "127.0.0.1"
    with OriginalSocket(family, socket.SOCK_STREAM) as listener, \
            OriginalSocket(family, socket.SOCK_STREAM) as client:
        listener.bind((host, 0))
        listener.listen(1)
        client.connect(listener.getsockname())
        fd, _ = _ss._accept(listener)  # type: ignore[attr-defined]
        accepted = OriginalSocket(family, socket.SOCK_STREAM, fileno=fd)
        client.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, _LINGER_RESET)
    poller = _select.poll()  # (on loopback the reset has come already; bounded all the same)
    poller.register(accepted, _select.POLLERR | _select.POLLHUP)
    poller.poll(1000)
    return accepted


_LINGER_RESET = struct.pack("ii", 1, 0)


def accept_across(sock: FriendCapableSocket, address: Any, listener_port: int,
                  timeout: Optional[float] = None) -> bool:
    """The blocking ``sock`` (see :func:`offer_accepted`) moved onto the pair
    if its offer was taken (True); False for TCP."""
    taken = offer_accepted(sock, address, listener_port, timeout)
    if taken is None:
        return False
    try:
        move_onto_pair(sock, taken.pair_end, taken.names, taken.peer, taken.rendezvous, client=False)
    finally:
        taken.pair_end.close()
    return True


# -- the socket once moved ------------------------------------------------------

_STATE = "_friendsock_across"
# Options that bound or shape the reads and writes: on the pair end, where
# those happen, as well as on the TCP socket, which answers for them.
_ON_THE_PAIR = (socket.SO_RCVTIMEO, socket.SO_SNDTIMEO, socket.SO_RCVLOWAT)
_TIMEVAL_SIZE = 16  # (struct timeval; SO_RCVLOWAT's int fits in it)


class _Traffic:
    """What ``friendsock.links()`` tells of a moved connection's end, shared
    by its socket's duplicates: bytes its calls sent and received (a
    trio socket's too), since when, and on what."""

    __slots__ = ("born", "ended", "received", "reads", "scheduler", "sent", "thread", "writes")

    def __init__(self, scheduler: Optional[str]) -> None:
        self.born = time.monotonic()
        self.thread = threading.current_thread().name
        self.scheduler = scheduler
        self.sent = 0
        self.received = 0
        self.reads = 0  # how often (does the move pay? see _host._payoff)
        self.writes = 0
        self.ended = False  # (told, by whichever copy closed first)


class _Reading:
    """The reading of a moved connection's end, shared by its socket's
    duplicates: whether ``shutdown()`` shut it, and the reads that may be
    waiting on the pair (one item each: appends and pops are atomic)."""

    __slots__ = ("shut", "pair_shut", "waiting")

    def __init__(self) -> None:
        self.shut = False
        # The pair end's reading shut too, to wake a waiting read: an EOF
        # read there since is this end's own, not the other end's FIN.
        self.pair_shut = False
        self.waiting: List[None] = []

    def finds_shut(self, fd: int) -> bool:
        """Whether a read of the pair end ``fd`` finds EOF for the shut
        reading (see read_shut_finds_eof)."""
        return self.shut and read_shut_finds_eof(fd)


class PairRead:
    """One read of a moved connection's pair end, in a ``with`` block
    whose read sets ``found``: counted while it may wait (see
    AcrossSocket.shutdown), EOF for a shut reading with nothing left
    (``finds_shut``: then it does not read), and the other end's reset
    raised or read as EOF (see AcrossSocket.reset_read). ``found`` stays
    SHUT, the shut reading's EOF, where the read found none."""

    __slots__ = ("sock", "reading", "waiting", "finds_shut", "found")

    def __init__(self, sock: "AcrossSocket", reading: _Reading, may_wait: bool) -> None:
        self.sock = sock
        self.reading = reading
        self.waiting = reading.waiting if may_wait else None
        self.finds_shut = False
        self.found: Any = SHUT

    def __enter__(self) -> "PairRead":
        if self.waiting is not None:  # (counted before the look at the reading: see shutdown)
            self.waiting.append(None)
        self.finds_shut = self.reading.finds_shut(_ss.fileno(self.sock))
        return self

    def __exit__(self, kind: Any, error: Any, traceback: Any) -> bool:
        if self.waiting is not None:
            self.waiting.pop()
        # (True: the reset is read as EOF)
        return kind is not None and issubclass(kind, ConnectionResetError) and not self.sock.reset_read()


class _Moved:
    """What an :class:`AcrossSocket` answers from: the TCP connection's
    socket and names, the finalizer that lets the TCP socket go, and the
    capture's tap while one runs (``friendsock.capture``)."""

    __slots__ = ("client", "tcp", "names", "peer", "rendezvous", "release", "traffic",
                 "tap", "side", "other_side", "tcp_reset", "reading", "copies")

    def __init__(self, sock: socket.socket, tcp: socket.socket, names: Tuple[Any, Any], peer: Peer,
                 rendezvous: Optional[Rendezvous], client: bool, traffic: _Traffic,
                 tap: Optional[StreamTap], reading: _Reading, copies: "_Copies",
                 tcp_reset: Optional[TcpReset] = None) -> None:
        self.tcp = tcp
        self.names = names
        self.peer = peer
        self.rendezvous = rendezvous
        self.client = client
        self.traffic = traffic
        self.tcp_reset = TcpReset() if tcp_reset is None else tcp_reset
        self.reading = reading
        self.tap = tap  # (shared by the socket's duplicates, as the connection is)
        self.side, self.other_side = (CLIENT, SERVER) if client else (SERVER, CLIENT)
        self.copies = copies
        copies.add(sock)
        # Lets the TCP socket go once the user's is closed, or collected.
        self.release = weakref.finalize(sock, _let_go, tcp, rendezvous, client, copies)


class _Copies:
    """The sockets of this process on one moved connection's end (the
    socket, its duplicates, those made of its descriptor), known by their
    pair end's inode: a socket made of that descriptor is one more."""

    __slots__ = ("inode", "sockets")

    def __init__(self, fd: int) -> None:
        self.inode = os.fstat(fd).st_ino
        self.sockets: "weakref.WeakSet[socket.socket]" = weakref.WeakSet()

    def add(self, sock: socket.socket) -> None:
        self.sockets.add(sock)
        moved_pair_ends[self.inode] = self.open_one

    def open_one(self, besides: Optional[socket.socket] = None) -> Optional[socket.socket]:
        return next((sock for sock in list(self.sockets) if sock is not besides and _ss.fileno(sock) >= 0),
                    None)

    def discard(self, sock: socket.socket) -> None:
        """``sock`` is closed, or its descriptor given away."""
        self.sockets.discard(sock)
        self.forget_if_none_open()

    def forget_if_none_open(self) -> None:
        """Once none is open, a socket made of the descriptor is a plain one."""
        if self.open_one() is None and moved_pair_ends.get(self.inode) == self.open_one:
            moved_pair_ends.pop(self.inode, None)


def move_onto_pair(sock: FriendCapableSocket, pair_end: socket.socket, names: Tuple[Any, Any],
                   peer: Peer, rendezvous: Rendezvous, client: bool = True,
                   scheduler: Optional[str] = None) -> None:
    """``sock`` carries its connection over ``pair_end`` from now on;
    ``client``: it is the connecting end; ``scheduler``: what drives it
    (``"trio"``; None: threads)."""
    fd = sock.fileno()
    tcp = OriginalSocket(sock.family, sock.type, sock.proto, fileno=os.dup(fd))
    try:
        room_like_friends(pair_end, tcp, peer.rcvbuf)
        for option in _ON_THE_PAIR:  # (set before connect(): its reads and writes keep them)
            pair_end.setsockopt(socket.SOL_SOCKET, option,
                                tcp.getsockopt(socket.SOL_SOCKET, option, _TIMEVAL_SIZE))
        os.set_blocking(pair_end.fileno(), os.get_blocking(fd))  # (as the socket's timeout has it)
        os.dup2(pair_end.fileno(), fd, inheritable=False)
    except BaseException:
        tcp.close()
        raise
    tap = stream_tap_for(*(names if client else names[::-1]))
    sock.__dict__[_STATE] = _Moved(sock, tcp, names, peer, rendezvous, client, _Traffic(scheduler), tap,
                                   _Reading(), _Copies(fd))
    sock.__class__ = AcrossSocket
    live_across.add(sock)
    counters.moved_across(peer.pid)


def _let_go(tcp: socket.socket, rendezvous: Optional[Rendezvous], client: bool, copies: _Copies) -> None:
    copies.forget_if_none_open()  # (a socket collected left the set already)
    if not client or closes_with_reset(tcp) or rendezvous is None or rendezvous.pid != os.getpid() or \
            not threading.main_thread().is_alive():
        # The accepting end's FIN, which the other end answers; an abort's
        # reset, already sent or sent now; a child's copy, or a copy handed
        # to a process that moves nothing; or the process exiting, whose
        # thread is past finishing anything.
        tcp.close()
    else:
        rendezvous.release(tcp)


class AcrossSocket(FriendCapableSocket, AcrossEnd):
    """A blocking socket whose connection moved to another process of this
    host: its descriptor is the socketpair end, so its I/O is the kernel's
    own there; its names and options are the TCP connection's. Its calls
    that move bytes count them, for ``friendsock.links()``."""

    def getsockname(self) -> Any:
        self._check_open()
        return self.__dict__[_STATE].names[0]

    def getpeername(self) -> Any:
        self._check_open()
        moved: _Moved = self.__dict__[_STATE]
        if moved.tcp.fileno() >= 0:  # (let go of at exit: the names stay)
            moved.tcp.getpeername()  # (ENOTCONN once the other end's abort reset it)
        closed = self.closed()
        if closed is not None:
            raise closed.as_os_error()
        return moved.names[1]

    def closed(self) -> Optional[LinkBrokenError]:
        """ENOTCONN where TCP's socket would be closed by now: a reset (a
        write taken after the other end's close, which the other kernel
        answers with one; a read that raised one; one waiting to be taken),
        or both directions finished."""
        moved: _Moved = self.__dict__[_STATE]
        return moved.tcp_reset.closed(moved.tcp, self, self.both_ways_finished())

    def both_ways_finished(self) -> bool:
        """Whether TCP's socket would be closed by now (see both_ways_finished)."""
        moved: _Moved = self.__dict__[_STATE]
        if moved.reading.pair_shut:
            # The other end's FIN is hidden, so taken as not arrived: a
            # shutdown may go through where TCP's would fail, never the
            # other way round (see fin_arrived).
            return False
        return both_ways_finished(_ss.fileno(self), moved.tcp, moved.tcp_reset.fin_sent, moved.peer.rcvbuf)

    # A read that finds EOF where the other end aborted raises its reset,
    # which came on the TCP socket first, as TCP's read would; one that
    # raises the pair's (the other end closed with bytes unread) is noted.
    def recv(self, bufsize: int, *args: Any) -> bytes:
        return cast(bytes, self._read(_ss.recv, bufsize, *args))

    def recv_into(self, buffer: Any, nbytes: int = 0, *args: Any) -> int:
        return cast(int, self._read(_ss.recv_into, buffer, nbytes, *args))

    def recvfrom(self, bufsize: int, *args: Any) -> Any:
        return self._read(_ss.recvfrom, bufsize, *args)  # (no address, as TCP's)

    def recvfrom_into(self, buffer: Any, nbytes: int = 0, *args: Any) -> Any:
        return self._read(_ss.recvfrom_into, buffer, nbytes, *args)

    def recvmsg(self, bufsize: int, *args: Any) -> Any:
        return self._read(_ss.recvmsg, bufsize, *args)

    def _read(self, read: Any, *args: Any) -> Any:
        """``read(self, *args)``, a read of the stdlib's class, on the pair
        end: what it answers (see answer)."""
        may_wait = self.gettimeout() != 0 and not _read_flags(read.__name__, args) & socket.MSG_DONTWAIT
        with self.pair_read(may_wait) as pair_read:
            if not pair_read.finds_shut:
                pair_read.found = read(self, *args)
        return self.answer(read.__name__, pair_read.found, args)

    def pair_read(self, may_wait: bool) -> "PairRead":
        """One read of the pair end, as every door's read goes (see
        PairRead); ``may_wait``: it may block (a trio read always may)."""
        return PairRead(self, self.__dict__[_STATE].reading, may_wait)

    def answer(self, read: str, found: Any, args: Tuple[Any, ...]) -> Any:
        """What the read named ``read``, called with ``args`` (its size or
        buffer first), answers where it ``found`` that on the pair (SHUT:
        the shut reading's EOF, in that read's shape); what came counted,
        once (a peek leaves it to the read that takes it)."""
        if found is SHUT:
            return _SHUT_READS[read]
        if read.endswith("_into"):
            buffer = args[0]
            count = found if read == "recv_into" else found[0]
            asked = count > 0 or _arg(args, 1) > 0 or memoryview(buffer).nbytes > 0
        else:
            buffer = found if read == "recv" else found[0]
            count, asked = len(buffer), args[0] > 0
        if not (count and _read_flags(read, args) & socket.MSG_PEEK):
            self.received(count, buffer, asked)
        return found

    def reset_read(self) -> bool:
        """A read met the other end's reset: whether it raises it (see
        TcpReset.read_reset)."""
        return cast(bool, self.__dict__[_STATE].tcp_reset.read_reset())

    def received(self, count: int, data: Any, asked: bool) -> None:
        """``count`` bytes were read, the first of ``data``; none, where
        some were ``asked`` for: EOF, or the other end's reset."""
        moved: _Moved = self.__dict__[_STATE]
        if count:
            traffic = moved.traffic
            traffic.received += count
            traffic.reads += 1
            if moved.tap is not None:
                moved.tap.data(moved.other_side, _first(data, count))
            return
        if not asked:
            # TCP's recv(0) answers b'' and leaves a pending reset to the
            # next read (the check below takes it off the TCP socket).
            return
        reset = tcp_error(moved.tcp)
        if moved.reading.pair_shut and not isinstance(reset, ConnectionResetError):
            return  # (the EOF of its own shutdown, which hides the other end's FIN)
        if moved.tap is not None:
            if isinstance(reset, ConnectionResetError):
                moved.tap.reset(moved.other_side)
            elif not moved.tcp_reset.fin_read:
                moved.tap.fin(moved.other_side)
        if not isinstance(reset, ConnectionResetError):
            moved.tcp_reset.fin_read = True
            return
        if self.reset_read():
            raise reset

    # A write the pair refuses (EPIPE: the other end's socket is gone) is
    # answered as TCP's would be (see written_after_close).
    def send(self, data: Any, *flags: int) -> int:
        try:
            count: int = _ss.send(self, data, *flags)
        except BrokenPipeError as exc:
            count = self.written_after_close(exc, memoryview(data).nbytes)
        self.sent(count, data)
        return count

    def sendall(self, data: Any, *flags: int) -> None:
        size = memoryview(data).nbytes
        try:
            _ss.sendall(self, data, *flags)
        except BrokenPipeError as exc:
            self.written_after_close(exc, size)
        self.sent(size, data)

    def sendmsg(self, buffers: Any, *args: Any) -> int:
        if self.capturing() or not isinstance(buffers, (list, tuple)):
            buffers = list(buffers)  # (an iterable, read twice)
        try:
            count: int = _ss.sendmsg(self, buffers, *args)
        except BrokenPipeError as exc:
            count = self.written_after_close(exc, sum(memoryview(data).nbytes for data in buffers))
        self.sent(count, buffers)
        return count

    def written_after_close(self, refused: BrokenPipeError, size: int) -> int:
        """What a write of ``size`` bytes that the pair ``refused`` answers
        (:meth:`TcpReset.refused_write`): the count TCP's send gives where
        it takes the write, else the error it raises."""
        moved: _Moved = self.__dict__[_STATE]
        error = moved.tcp_reset.refused_write(moved.tcp, self, refused, size > 0)
        if error is None:
            return size
        raise error from None

    def _sendfile_use_sendfile(self, file: Any, offset: int = 0, count: Optional[int] = None) -> int:
        # (socket.sendfile's os.sendfile path: the kernel reads the file)
        total: int = OriginalSocket._sendfile_use_sendfile(self, file, offset, count)  # type: ignore[attr-defined]
        moved: _Moved = self.__dict__[_STATE]
        self.sent(total, os.pread(file.fileno(), total, offset) if moved.tap is not None else b"")
        return total

    def capturing(self) -> bool:
        """Whether what moves is written to a capture too."""
        return self.__dict__[_STATE].tap is not None

    def sent(self, count: int, data: Any) -> None:
        """``count`` bytes were handed to the kernel, the first of ``data``."""
        moved: _Moved = self.__dict__[_STATE]
        traffic = moved.traffic
        traffic.sent += count
        traffic.writes += 1
        if moved.tap is not None and count:
            moved.tap.data(moved.side, _first(data, count))

    def shutdown(self, how: int) -> None:
        self._check_open()  # (EBADF once closed, as TCP's, before anything looks at the pair)
        moved: _Moved = self.__dict__[_STATE]
        reading, writing = directions_shut(how)
        refused = self.closed()
        if refused is not None:
            raise refused.as_os_error()
        if writing:
            _ss.shutdown(self, socket.SHUT_WR)
            moved.tcp_reset.fin_sent = True
            if moved.tap is not None:
                moved.tap.fin(moved.side)
        if reading:  # (reads here find EOF once nothing is left to read, as TCP's)
            moved.tcp.shutdown(socket.SHUT_RD)
            moved.reading.shut = True
        reads = moved.reading
        if reads.shut and moved.tcp_reset.fin_sent and reads.waiting and not reads.pair_shut:
            # A read waits on the pair, on another thread: how threaded
            # services stop a reader, shutting down both ways. TCP's wakes
            # with EOF; the pair's only once its reading is shut too, which
            # the other end meets as it meets this end's close (see the
            # docs' differences). Not while this end still writes: the
            # other end's next write would end its reading with it.
            reads.pair_shut = True
            _ss.shutdown(self, socket.SHUT_RD)

    def getsockopt(self, *args: Any) -> Any:
        self._check_open()
        moved: _Moved = self.__dict__[_STATE]
        if args != (socket.SOL_SOCKET, socket.SO_ERROR):
            return moved.tcp.getsockopt(*args)
        return moved.tcp_reset.socket_error(moved.tcp, self)

    def setsockopt(self, *args: Any) -> None:
        self._check_open()
        moved: _Moved = self.__dict__[_STATE]
        moved.tcp.setsockopt(*args)
        if args[0] == socket.SOL_SOCKET:
            if args[1] in _ON_THE_PAIR:
                _ss.setsockopt(self, *args)
            elif args[1] == socket.SO_SNDBUF:  # (the room grows or shrinks with it)
                room_like_friends(self, moved.tcp, moved.peer.rcvbuf)

    def connect(self, address: Any) -> None:
        if self.connect_ex(address):
            raise already_connected()

    def connect_ex(self, address: Any) -> int:
        self._check_open()
        return connect_again(self)

    def _check_open(self) -> None:
        if _ss.fileno(self) < 0:
            raise bad_descriptor()

    def _real_close(self, _ss: Any = _ss) -> None:
        if _ss.fileno(self) < 0:
            return  # (closed already, or its descriptor given away: nothing is this socket's)
        moved: _Moved = self.__dict__[_STATE]
        traffic = moved.traffic
        if moved.client and not traffic.ended:
            traffic.ended = True
            moved_connection_ended(moved.names[1][1], max(traffic.reads, traffic.writes),
                                   traffic.sent + traffic.received)
        self._leave(moved)
        if closes_with_reset(moved.tcp):
            if moved.tap is not None:
                moved.tap.reset(moved.side)
            moved.release()  # the reset first, for the other end to find at EOF
            _ss.close(self)
        else:
            _ss.close(self)
            if moved.tap is not None:
                moved.tap.fin(moved.side)
            moved.release()

    def detach(self) -> int:
        # The descriptor goes on elsewhere (ssl's wrap_socket takes it so):
        # the TCP socket stays until the connection's end, the other end's FIN.
        moved: _Moved = self.__dict__[_STATE]
        self._leave(moved)
        fd = _ss.detach(self)
        moved.release.detach()
        if moved.rendezvous is not None:
            moved.rendezvous.release(moved.tcp, timeout=None)
        else:  # (no thread here to finish it: it stays open as long as this process)
            _kept_for_detached.append(moved.tcp)
        return fd

    def given_to_a_loop(self) -> Optional[Tuple[socket.socket, socket.socket, Tuple[Any, Any], Peer, bool,
                                                Optional[StreamTap]]]:
        """This socket's connection, for an event loop's transport
        (``create_connection(sock=)``: uvloop's own would do its I/O on the
        pair's descriptor, and refuses it): ``(pair end, TCP socket,
        names, the other end, whether it is the connecting end, the
        capture's tap)``, this
        socket closed as far as its user is concerned, the TCP socket the
        transport's to finish. None, nothing changed, where it cannot:
        closed, or other sockets of this process on the connection too."""
        moved: _Moved = self.__dict__[_STATE]
        if _ss.fileno(self) < 0 or moved.copies.open_one(besides=self) is not None:
            return None
        self._leave(moved)
        moved.release.detach()
        moved.traffic.ended = True  # (how it ends, the transport tells)
        pair_end = OriginalSocket(socket.AF_UNIX, socket.SOCK_STREAM, 0, _ss.detach(self))
        return pair_end, moved.tcp, moved.names, moved.peer, moved.client, moved.tap

    def _leave(self, moved: _Moved) -> None:
        """This socket object is on the connection no more (closed, or its
        descriptor given away): unlisted, and what its reads took counted."""
        live_across.discard(self)
        moved.copies.discard(self)
        counters.read_across(moved.traffic.received)
        moved.traffic.received = 0  # (counted once, whichever copy leaves first)

    def dup(self) -> socket.socket:
        twin = AcrossSocket.__new__(AcrossSocket)
        self.share_with(twin, os.dup(_ss.fileno(self)))
        twin.settimeout(self.gettimeout())
        return twin

    def share_with(self, twin: socket.socket, fileno: int) -> None:
        """Make ``twin``, a socket object not set up yet, one more socket on
        this connection, made of ``fileno``: this socket's pair end
        (``socket.socket(fileno=...)``: the two share it, as the stdlib's
        would) or a duplicate of it (``dup()``, ``socket.fromfd()``)."""
        moved: _Moved = self.__dict__[_STATE]
        tcp = moved.tcp.dup()
        try:
            OriginalSocket.__init__(twin, self.family, self.type, self.proto, fileno)
        except BaseException:
            tcp.close()
            raise
        twin.__class__ = AcrossSocket
        twin.__dict__[_STATE] = _Moved(twin, tcp, moved.names, moved.peer, moved.rendezvous, moved.client,
                                       moved.traffic, moved.tap, moved.reading, moved.copies, moved.tcp_reset)

    def handed_on(self, dup_fd: Callable[[int], Any]) -> Tuple[Callable[..., "AcrossSocket"], Tuple[Any, ...]]:
        """How multiprocessing hands this socket to another process
        (``dup_fd``, its way to hand a descriptor over): with both
        descriptors, the pair end and the TCP socket, and what this end
        knows of the connection, to be a copy there as :meth:`dup` makes one
        here; the connection ends with the last of them, as TCP's does."""
        moved: _Moved = self.__dict__[_STATE]
        known = moved.tcp_reset
        state = (moved.names, tuple(moved.peer), moved.client,
                 (known.seen, known.error, known.fin_read, known.fin_sent),
                 (moved.reading.shut, moved.reading.pair_shut))
        return _handed_over, (dup_fd(_ss.fileno(self)), dup_fd(moved.tcp.fileno()),
                              self.family, self.type, self.proto, state)

    def link_info(self, now: float) -> Optional[LinkInfo]:
        moved: Optional[_Moved] = self.__dict__.get(_STATE)
        fd = _ss.fileno(self)
        if moved is None or fd < 0 or moved.tcp.fileno() < 0:
            return None
        try:
            sndbuf = moved.tcp.getsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF)
            rcvbuf = moved.tcp.getsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF)
            waiting = bytes_to_read(fd)
            peer_done = not moved.reading.pair_shut and peer_shut_down(fd)
        except OSError:  # closed meanwhile
            return None
        traffic = moved.traffic
        reset = isinstance(tcp_error(moved.tcp), ConnectionResetError)
        own = EndInfo(address=tuple(moved.names[0]), sndbuf=sndbuf, rcvbuf=rcvbuf, closed=False,
                      paused_reading=None, paused_writing=None, thread=traffic.thread,
                      scheduler=traffic.scheduler)
        peer = EndInfo(address=tuple(moved.names[1]), sndbuf=moved.peer.sndbuf,
                       rcvbuf=moved.peer.rcvbuf, closed=peer_done, paused_reading=None,
                       paused_writing=None, thread=None, scheduler=None)
        # (Its bytes go to the kernel as they are sent: none wait here.)
        sent = DirectionInfo("reset" if reset else "eof" if moved.tcp_reset.fin_sent else "open",
                             0, traffic.sent, False)
        received = DirectionInfo("reset" if reset else "eof" if peer_done else "open",
                                 waiting, traffic.received, False)
        server = moved.names[1] if moved.client else moved.names[0]
        return link_between_processes(client_side=moved.client, own=own, peer=peer, sent=sent,
                                      received=received, age=now - traffic.born,
                                      listener=(server[0], server[1]), peer_pid=moved.peer.pid,
                                      captured=moved.tap is not None)


# TCP sockets of moved connections whose descriptor a detach() gave away
# in a process without a rendezvous to finish them.
_kept_for_detached: List[socket.socket] = []


def _handed_over(pair_fd: Any, tcp_fd: Any, family: int, type: int, proto: int,
                 state: Tuple[Any, ...]) -> AcrossSocket:
    """A moved socket handed to this process (see AcrossSocket.handed_on):
    ``pair_fd`` and ``tcp_fd`` give its descriptors as multiprocessing's
    ``DupFd`` does."""
    names, peer, client, known, reading_shut = state
    tcp = OriginalSocket(family, type, proto, fileno=tcp_fd.detach())
    sock = AcrossSocket.__new__(AcrossSocket)  # (not __init__'s: no socket here has this pair end yet)
    try:
        OriginalSocket.__init__(sock, family, type, proto, pair_fd.detach())
    except BaseException:
        tcp.close()
        raise
    tcp_reset = TcpReset()
    tcp_reset.seen, tcp_reset.error, tcp_reset.fin_read, tcp_reset.fin_sent = known
    reading = _Reading()
    reading.shut, reading.pair_shut = reading_shut
    # Finished here as where it moved: by this process's rendezvous, if it has one.
    sock.__dict__[_STATE] = _Moved(sock, tcp, tuple(names), Peer(*peer), this_process(), client,
                                   _Traffic(None), None, reading, _Copies(sock.fileno()), tcp_reset)
    live_across.add(sock)
    return sock


# What a read comes to where TCP's finds EOF and the pair does not: its
# reading shut here, or a reset after the other end's FIN (see reset_read).
SHUT = object()
# What each read answers for that EOF, as TCP's does.
_SHUT_READS = {"recv": b"", "recv_into": 0, "recvfrom": (b"", None), "recvfrom_into": (0, None),
               "recvmsg": (b"", [], 0, None)}


# Where each read takes its flags, among its arguments.
_FLAGS_AT = {"recv": 1, "recv_into": 2, "recvfrom": 1, "recvfrom_into": 2, "recvmsg": 2}


def _read_flags(read: str, args: Tuple[Any, ...]) -> int:
    """The flags of the read named ``read``, called with ``args``."""
    return _arg(args, _FLAGS_AT[read])


def _arg(args: Tuple[Any, ...], index: int) -> int:
    """The int argument at ``index`` among ``args``; 0 where not given."""
    return cast(int, args[index]) if len(args) > index else 0


def _first(data: Any, count: int) -> bytes:
    """The first ``count`` bytes of the buffer ``data`` (or of a list of
    them, as sendmsg takes), for the capture."""
    if isinstance(data, list):
        data = b"".join(data)
    return memoryview(data).cast("B")[:count].tobytes()


def is_moved(obj: Any) -> bool:
    """Whether ``obj`` is a blocking socket moved to another process, open."""
    return type(obj) is AcrossSocket and _ss.fileno(obj) >= 0
