"""Connections between processes of this host, on asyncio and uvloop.

After the real TCP handshake, the process that accepted a connection from a
friendsock process offers it a ``socketpair()`` end over a rendezvous
channel (``_host._proof``); taken, both ends speak over the pair with the
loop's own transport, wrapped to answer as the TCP connection
(:class:`AcrossTransport`). The TCP sockets stay open, carrying no payload,
and close with the connection: the handshake and the finish are TCP's, the
bytes are not.

Each loop has one :class:`Rendezvous`: the channel it takes offers on when
it connects, and the channels it made to the processes it offered to, kept
for the next connection between the same two.
"""

from __future__ import annotations

import asyncio
import contextvars
import itertools
import os
import select
import socket
import threading
import time
from asyncio import transports, trsock
from asyncio.constants import _SendfileMode
from typing import Any, Awaitable, Callable, Dict, List, NamedTuple, Optional, Sequence, Tuple, Union, cast

from .._core._link import LinkBrokenError
from .._core._live import AcrossEnd, DirectionInfo, EndInfo, LinkInfo, link_between_processes, live_across
from .._core._pcap import CLIENT, SERVER
from .._friend_socket import call_held, held_weakly, refuse_as_uvloop
from .._core._stats import counters
from .._core._tap import StreamTap, stream_tap_for
from .._core._switch import is_enabled
from .._handshake import CONFIRM_TIMEOUT, is_tcp_socket, payload_moved
from .._handshake._tcp_info import is_plain_socket, other_end_finished
from .._handshake._binding import port_before_connect
from .._handshake._process import close_with_reset, current_pid
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
    answer_offer,
    both_ways_finished,
    bytes_to_read,
    channel_gone,
    channel_listener,
    closes_with_reset,
    directions_shut,
    messages_waiting,
    next_token,
    offer_answered,
    offer_proven,
    open_channel,
    peer_shut_down,
    read_shut_finds_eof,
    refused_with_reset,
    room_like_friends,
    runs,
    send_offer,
    take_offer,
    tcp_error,
)
from .._host._payoff import moved_connection_ended, worth_an_offer
from .._host._ports import served_elsewhere
from .._host._proof import Message
from ._loop_state import loop_name, loop_state
from ._native import native
from ._transport import set_nodelay

class Offered(NamedTuple):
    """An offer the other process took: what the accepting side serves on."""

    pair_end: socket.socket
    peer: Peer
    names: Tuple[Any, Any]  # the TCP socket's own, then its peer's
    rendezvous: "Rendezvous"


class _Wait(ConnectWait):
    """A connect on a loop waiting for its offer."""

    __slots__ = ("decided", "held", "timer")

    def __init__(self, sock: socket.socket, sockname: Any, decided: asyncio.Future) -> None:
        super().__init__(sock, sockname)
        self.decided = decided  # its result: the pair end, or None for TCP
        # For a socket its user connected (Rendezvous.for_users): the offer
        # held, unanswered, until the socket is handed to the loop (see
        # take_held), and the timer that declines it.
        self.held: Optional[Tuple[socket.socket, int, Message, List[socket.socket]]] = None
        self.timer: Optional[asyncio.TimerHandle] = None

    def taken(self) -> Optional[socket.socket]:
        """The pair end of the offer taken, if one was by now."""
        decided = self.decided
        return decided.result() if decided.done() and not decided.cancelled() else None


def _decided(wait: _Wait) -> bool:
    return wait.decided.done()


def _stop_timer(wait: _Wait) -> None:
    if wait.timer is not None:
        wait.timer.cancel()
        wait.timer = None


class _Channel:
    """A channel this loop opened to another process's loop, to offer on."""

    __slots__ = ("sock", "pid", "replies", "serials")

    def __init__(self, sock: socket.socket, pid: int) -> None:
        self.sock = sock
        self.pid = pid
        self.replies: Dict[int, asyncio.Future] = {}
        self.serials = itertools.count(1)


class Rendezvous:
    """One loop's side of the rendezvous (see the module's text)."""

    def __init__(self, loop: asyncio.AbstractEventLoop, table: PortTable) -> None:
        self.loop = loop
        self.table = table
        self.pid = current_pid()
        self.token = next_token()
        self.listener: Optional[socket.socket] = None
        self.waits: Dict[int, _Wait] = {}
        # The waits of sockets their users connected, by socket.
        self.for_users: Dict[socket.socket, _Wait] = {}
        self.channels: Dict[Tuple[int, int], _Channel] = {}
        self.taking: List[socket.socket] = []  # channels offers come in on
        # TCP sockets of this loop's connecting ends, done, until the accepting
        # end's FIN (see release), with the timer that stops waiting.
        self.lingering: Dict[socket.socket, asyncio.TimerHandle] = {}

    # -- the connecting side ----------------------------------------------
    def _listen(self) -> bool:
        if self.listener is not None:
            return True
        sock = channel_listener(self.pid, self.token)
        if sock is None:
            return False
        self.listener = sock
        self.loop.add_reader(sock.fileno(), self._channel_opened)
        return True

    def _channel_opened(self) -> None:
        assert self.listener is not None
        try:
            opened = accept_channel(self.listener)
        except OSError:
            # No descriptor left to accept it with: the listener closes,
            # which resets the channels in its queue (their offers are
            # TCP's at once), where it would stay readable and unanswered.
            # The next connect listens again.
            self.loop.remove_reader(self.listener.fileno())
            self.listener.close()
            self.listener = None
            return
        if opened is not None:
            chan, pid = opened
            self.taking.append(chan)
            self.loop.add_reader(chan.fileno(), self._offers_arrived, chan, pid)

    def _offers_arrived(self, chan: socket.socket, pid: int) -> None:
        for message, handed in messages_waiting(chan):
            if message is None and not handed:  # EOF: that process went away
                self._drop_taking(chan)
                return
            self._offer_arrived(chan, pid, message, handed)

    def _offer_arrived(self, chan: socket.socket, pid: int, message: Optional[Message],
                       handed: List[socket.socket]) -> None:
        wait = self.waits.get(message.client_port) if message is not None else None
        if wait is not None and self.for_users.get(wait.sock) is wait and not wait.decided.done():
            if wait.held is None and message is not None and offer_proven(message, handed, wait):
                # Its user may yet use the socket raw: answered once it is
                # handed to the loop, declined if it is not in time.
                wait.held = (chan, pid, message, handed)
                self._give_up_after(wait, CONFIRM_TIMEOUT)
            else:  # not its offer, or one more: declined, the wait left as it was
                self._decline(chan, pid, message, handed)
            return
        try:
            taken = take_offer(self.waits, _decided, chan, pid, message, handed)
        except OSError:
            # Unanswered, the offering side would wait: it learns no from
            # the channel closing, and so TCP is what both take.
            self._drop_taking(chan)
            return
        if taken is not None:
            wait, pair_end = taken
            wait.decided.set_result(pair_end)

    def _drop_taking(self, chan: socket.socket) -> None:
        if chan in self.taking:
            self.taking.remove(chan)
            self.loop.remove_reader(chan.fileno())
        chan.close()

    def expect_offer(self, sock: socket.socket, to_port: int) -> Optional[_Wait]:
        """Before ``connect()`` on the bound ``sock``: wait for the offer of
        the process that accepts it, which finds the wait by the port."""
        if not self._listen():
            return None
        try:
            sockname = sock.getsockname()
        except OSError:
            return None
        port = sockname[1]
        if not port or port in self.waits:
            return None
        wait = _Wait(sock, sockname, self.loop.create_future())
        self.waits[port] = wait
        wait.publish(self.table, self.pid, to_port, self.token)
        return wait

    async def decided(self, wait: _Wait) -> Optional[socket.socket]:
        """The pair end the connect ``wait`` was offered and took, or None
        for TCP: no offer in time, or anything arriving on the TCP socket
        (a process that accepted it without friendsock)."""
        loop = self.loop
        fd = wait.sock.fileno()

        def on_tcp() -> None:
            if not wait.decided.done():
                wait.decided.set_result(None)

        loop.add_reader(fd, on_tcp)
        deadline = loop.call_later(OFFER_TIMEOUT, on_tcp)
        try:
            return await wait.decided
        finally:
            deadline.cancel()
            loop.remove_reader(fd)
            self.end_wait(wait)

    def end_wait(self, wait: _Wait) -> None:
        """Stop waiting: an offer that comes now is declined, and so is one
        held for the socket's user."""
        if self.pid != os.getpid():
            return  # a forked child's copy: the parent's wait, and its answer
        if self.waits.get(wait.port) is wait:
            del self.waits[wait.port]
        offered = wait.held is not None or wait.taken() is not None
        if not wait.decided.done():
            wait.decided.set_result(None)
        wait.withdraw(self.table, self.pid, offered)
        _stop_timer(wait)
        if self.for_users.get(wait.sock) is wait:
            del self.for_users[wait.sock]
        held, wait.held = wait.held, None
        if held is not None:
            self._decline(*held)

    def _decline(self, chan: socket.socket, pid: int, message: Optional[Message],
                 handed: List[socket.socket]) -> None:
        try:
            answer_offer(chan, pid, message, handed, None)
        except OSError:  # (as in _offer_arrived)
            self._drop_taking(chan)

    # -- sockets their users connect (loop.sock_connect) ------------------------
    def expect_offer_for_user(self, sock: socket.socket, to_port: int) -> Optional[_Wait]:
        """:meth:`expect_offer` for a socket its user connects, and may hand
        to ``create_connection(sock=)`` (aiohttp's client does) or use raw:
        an offer is held for it (see :meth:`take_held`)."""
        wait = self.expect_offer(sock, to_port)
        if wait is not None:
            self.for_users[sock] = wait
        return wait

    def connected_for_user(self, wait: _Wait) -> None:
        """Its connect made: the socket reaches the loop soon (or is used
        raw), an offer comes soon (or none will)."""
        if wait.held is None and not wait.decided.done():
            self._give_up_after(wait, OFFER_TIMEOUT)

    def _give_up_after(self, wait: _Wait, delay: float) -> None:
        _stop_timer(wait)
        wait.timer = self.loop.call_later(delay, self.end_wait, wait)

    async def take_held(self, sock: socket.socket) -> Optional[socket.socket]:
        """``sock``, connected by its user, handed to the loop: the pair end
        of the offer taken for it (held, or awaited as a connect awaits
        it); None for TCP (nothing waits for it, no offer, or payload
        crossed TCP already: moved now, bytes would be lost)."""
        wait = self.for_users.pop(sock, None)
        if wait is None:
            return None
        if wait.decided.done() or payload_moved(sock):
            self.end_wait(wait)
            return None
        held, wait.held = wait.held, None
        if held is None:
            _stop_timer(wait)  # (out of for_users: a connect's wait from now on)
            return await self.decided(wait)
        chan, pid, message, handed = held
        if peer_shut_down(handed[1].fileno()):
            # The offering side gave up waiting (its pair end closed, its
            # connection reset): taken now, neither path would carry it.
            self._decline(*held)
            self.end_wait(wait)
            return None
        try:
            pair_end = answer_offer(chan, pid, message, handed, wait)
        except OSError:
            self._drop_taking(chan)
            pair_end = None
        self.end_wait(wait)
        return pair_end

    # -- the accepting side -----------------------------------------------
    def _channel_to(self, pid: int, token: int) -> Optional[_Channel]:
        chan = self.channels.get((pid, token))
        if chan is not None:
            return chan
        sock = open_channel(pid, token)
        if sock is None:  # gone, full, or a squatter on the name: TCP
            return None
        chan = self.channels[pid, token] = _Channel(sock, pid)
        self.loop.add_reader(sock.fileno(), self._replies_arrived, chan)
        return chan

    def _replies_arrived(self, chan: _Channel) -> None:
        # All that came, before anything else: an answer read late is one
        # its offer's connection waits for.
        for message, handed in messages_waiting(chan.sock):
            if message is None and not handed:  # EOF: every answer before it was read
                self._drop_channel(chan)
                return
            waiter = chan.replies.pop(message.serial, None) if message is not None else None
            if waiter is None or waiter.done():
                for sock in handed:
                    sock.close()
                continue
            waiter.set_result((message, handed))

    def _drop_channel(self, chan: _Channel) -> None:
        for key, known in list(self.channels.items()):
            if known is chan:
                del self.channels[key]
                self.loop.remove_reader(chan.sock.fileno())
        chan.sock.close()
        replies, chan.replies = chan.replies, {}
        for waiter in replies.values():
            if not waiter.done():
                waiter.set_result((None, []))

    async def offer(self, conn: socket.socket, names: Tuple[Any, Any], slot: Slot,
                    bounded: bool = False) -> Union[None, object, Offered]:
        """Offer the accepted ``conn`` (its ``getsockname()`` and
        ``getpeername()``: ``names``) to the process of the connect slot
        ``slot``: the pair end to serve it on and the peer's receive buffer
        if taken; None if declined or unanswerable (TCP); ``RESET`` if the
        answer's proof failed, after the other side took it. ``bounded``:
        for an accept that others wait behind, an answer that does not come
        in time (``ANSWER_TIMEOUT``, or ``OFFER_TIMEOUT`` once that process
        is found stopped) is ``RESET`` too: the other side may take it yet."""
        chan = self._channel_to(slot.pid, slot.token)
        if chan is None:
            return None
        serial = next(chan.serials) & 0xFFFFFFFF
        waiter = self.loop.create_future()
        try:
            ours = send_offer(chan.sock, conn, names[1][1], serial)
        except OSError as exc:
            if channel_gone(exc):
                self._drop_channel(chan)
            return None
        chan.replies[serial] = waiter
        deadline = _AnswerDeadline(self.loop, waiter, chan.pid) if bounded else None
        try:
            answer = await waiter
        except BaseException:
            # Withdrawn while the answer is out (the server closing): the
            # pair end closes, so the other side reads EOF on it if it took
            # the offer, and the TCP socket's close if not; the answer,
            # when it comes, is dropped. The channel stays, for the
            # answers to the other offers on it.
            chan.replies.pop(serial, None)
            ours.close()
            raise
        finally:
            if deadline is not None:
                deadline.cancel()
        if answer is _UNANSWERED:  # (the same way, given up on)
            chan.replies.pop(serial, None)
            ours.close()
            return RESET
        message, handed = answer
        answered = offer_answered(names, chan.pid, ours, message, handed)
        if answered is None or answered is RESET:
            return answered
        pair_end, peer = cast(Tuple[socket.socket, Peer], answered)
        return Offered(pair_end, peer, names, self)

    # -- the end of a connection ----------------------------------------------
    def release(self, tcp: socket.socket, client: bool) -> None:
        """A connection moved off ``tcp`` ended here. The accepting end
        closes its TCP socket (a FIN); the connecting end waits for that
        FIN and answers it with a reset, whichever finished first, so that
        neither socket is left in TIME_WAIT, whose port a connect could
        not bind for a minute (see expect_offer). It closes as it is if no
        FIN comes in time (a server that keeps its end open). Either end
        whose user set SO_LINGER {1, 0} resets at once, as its close does
        over TCP, before the pair's EOF (the connection's last callback
        runs before the loop closes the pair)."""
        if not client or tcp.fileno() < 0 or self.loop.is_closed() or closes_with_reset(tcp):
            tcp.close()
            return
        self.loop.add_reader(tcp.fileno(), self._finished, tcp, True)
        self.lingering[tcp] = self.loop.call_later(RELEASE_TIMEOUT, self._finished, tcp, False)

    def _finished(self, tcp: socket.socket, answered: bool) -> None:
        timer = self.lingering.pop(tcp, None)
        if timer is None:
            return
        timer.cancel()
        self.loop.remove_reader(tcp.fileno())
        if answered and other_end_finished(tcp):  # (not its own SHUT_RD's readable)
            close_with_reset(tcp)
        else:
            tcp.close()

    def close(self) -> None:
        if self.pid != os.getpid():
            return  # a forked child's copy: the parent's to close
        for tcp in list(self.lingering):
            self._finished(tcp, False)
        for wait in list(self.waits.values()):
            self.end_wait(wait)
        for chan in list(self.channels.values()):
            self._drop_channel(chan)
        for taking in list(self.taking):
            self._drop_taking(taking)
        if self.listener is not None:
            self.loop.remove_reader(self.listener.fileno())
            self.listener.close()
            self.listener = None


# What an offer's waiter is given when its answer is given up on.
_UNANSWERED: Tuple[None, List[socket.socket]] = (None, [])


class _AnswerDeadline:
    """Gives up on the answer ``waiter`` waits for from process ``pid``
    (resolved to ``_UNANSWERED``) once ANSWER_TIMEOUT has passed, or at
    the first look, every OFFER_TIMEOUT, that finds the process stopped
    or gone."""

    __slots__ = ("handle", "last", "loop", "pid", "waiter")

    def __init__(self, loop: asyncio.AbstractEventLoop, waiter: asyncio.Future, pid: int) -> None:
        self.loop = loop
        self.waiter = waiter
        self.pid = pid
        self.last = loop.time() + ANSWER_TIMEOUT
        self.handle = loop.call_later(OFFER_TIMEOUT, self._look)

    def _look(self) -> None:
        if self.waiter.done():
            return
        now = self.loop.time()
        if now >= self.last or not runs(self.pid):
            self.waiter.set_result(_UNANSWERED)
        else:
            self.handle = self.loop.call_at(min(now + OFFER_TIMEOUT, self.last), self._look)

    def cancel(self) -> None:
        self.handle.cancel()


def rendezvous(loop: asyncio.AbstractEventLoop) -> Optional[Rendezvous]:
    """The loop's rendezvous, made on first use; None when connections do
    not move between processes (switched off, or no port table)."""
    table = port_table()
    if table is None:
        return None
    state = loop_state(loop)
    found = state.across
    if found is None or found.pid != current_pid():
        found = state.across = Rendezvous(loop, table)
    return found


# -- the connecting side, as create_connection takes it ---------------------


def expect_offer(loop: asyncio.AbstractEventLoop, sock: socket.socket, port: int) -> Optional[_Wait]:
    """Before ``connect()`` on the bound ``sock`` to a loopback ``port``
    served by another friendsock process: the wait for its offer (see
    :meth:`Rendezvous.expect_offer`), or None when it stays TCP's."""
    found = rendezvous(loop)
    return None if found is None else found.expect_offer(sock, port)


def end_wait(loop: asyncio.AbstractEventLoop, wait: Optional[_Wait]) -> None:
    """The connect failed or was withdrawn: no offer is taken for it."""
    found = loop_state(loop).across
    if wait is not None and found is not None:
        found.end_wait(wait)


async def connect_across(
    loop: asyncio.AbstractEventLoop, protocol_factory: Any, sock: socket.socket, wait: _Wait,
) -> Optional[Tuple[asyncio.Transport, asyncio.BaseProtocol]]:
    """The connected ``sock``'s transport and protocol once its offer was
    taken; None for TCP (nothing was moved)."""
    found = loop_state(loop).across
    if found is None:
        return None
    return await _moved(found, protocol_factory, sock, wait, found.decided(wait))


async def _moved(found: Rendezvous, protocol_factory: Any, sock: socket.socket, wait: _Wait,
                 taking: Awaitable[Optional[socket.socket]],
                 ) -> Optional[Tuple[asyncio.Transport, asyncio.BaseProtocol]]:
    """The connecting end's transport over the pair end ``taking`` comes
    to (None: TCP, nothing moved)."""
    try:
        pair_end = await taking
    except BaseException:
        sock.close()  # withdrawn: as a connect cancelled, the socket goes
        taken = wait.taken()
        if taken is not None:
            taken.close()  # (taken in the turn it was withdrawn)
        raise
    if pair_end is None:
        return None
    return await _started(found, protocol_factory, pair_end, sock, wait.names(), wait.peer, client=True)


async def _started(found: Rendezvous, protocol_factory: Any, pair_end: socket.socket, tcp: socket.socket,
                   names: Tuple[Any, Any], peer: Peer, client: bool, newly_moved: bool = True,
                   tap: Optional[StreamTap] = None) -> Tuple[asyncio.Transport, asyncio.BaseProtocol]:
    """The transport of a connection moved onto ``pair_end`` (see
    start_across), with the protocol ``protocol_factory`` makes."""
    try:
        protocol = protocol_factory()
        transport = await start_across(found, pair_end, tcp, names, protocol, peer, client=client,
                                       newly_moved=newly_moved, tap=tap)
    except BaseException:
        pair_end.close()
        tcp.close()  # the other side sees EOF, as from a socket the loop closed
        raise
    return transport, protocol


# -- a socket its user connects (loop.sock_connect) ----------------------------


def expect_offer_for_user(loop: asyncio.AbstractEventLoop, sock: socket.socket,
                          address: Any) -> Optional[_Wait]:
    """Before the loop's ``sock_connect`` of ``sock`` to ``address``, a
    loopback port that another friendsock process serves: bound if it has
    no port yet (the accepting process finds the connect by it), and
    waiting for the offer, held for the socket's user; None when it stays
    TCP's (the usual case, from a read of the port table)."""
    port = address[1]
    # (A socket of its user's subclass does its I/O through its own
    # methods, as in one process: it stays TCP.)
    if not (isinstance(address[0], str) and served_elsewhere(address[0], port, sock.family)
            and is_enabled() and is_tcp_socket(sock) and is_plain_socket(sock)
            and worth_an_offer(port)):
        return None
    found = rendezvous(loop)
    if found is None:
        return None
    if not port_before_connect(sock, address[0]):
        return None
    return found.expect_offer_for_user(sock, port)


def connected_for_user(loop: asyncio.AbstractEventLoop, wait: _Wait) -> None:
    found = loop_state(loop).across
    if found is not None:
        found.connected_for_user(wait)


def end_wait_for_user(loop: asyncio.AbstractEventLoop, sock: socket.socket) -> None:
    """``sock`` goes on over TCP: the offer held for it is declined."""
    found = loop_state(loop).across
    wait = None if found is None or found.pid != os.getpid() else found.for_users.get(sock)
    if wait is not None:
        found.end_wait(wait)


async def connect_across_for_user(
    loop: asyncio.AbstractEventLoop, protocol_factory: Any, sock: socket.socket,
) -> Optional[Tuple[asyncio.Transport, asyncio.BaseProtocol]]:
    """``create_connection(sock=sock)`` of a socket its user connected to
    another friendsock process: the transport over the pair if the offer
    is taken now; None for TCP (the loop's own transport, as for any
    socket handed over)."""
    found = loop_state(loop).across
    if found is None or found.pid != os.getpid() or sock not in found.for_users:
        return None
    # (Not taken: counted as every socket the loop's own transport takes.)
    return await _moved(found, protocol_factory, sock, found.for_users[sock], found.take_held(sock))


# -- the transport ------------------------------------------------------------


class _AcrossSocket(trsock.TransportSocket):
    """A moved connection's ``get_extra_info('socket')``: its TCP socket,
    for names and options, as the loop's own transport hands one out;
    what ends a direction (``shutdown()``) or moves bytes acts on the pair
    end instead, where the connection's bytes go."""

    __slots__ = ("_tcp", "_pair", "_peer_rcvbuf", "_on_read_shut", "tcp_reset")

    def __init__(self, tcp: socket.socket, pair: socket.socket, peer_rcvbuf: int,
                 on_read_shut: Callable[[], None]) -> None:
        super().__init__(tcp)
        self._tcp = tcp
        self._pair = pair
        self._peer_rcvbuf = peer_rcvbuf
        self._on_read_shut = held_weakly(on_read_shut)  # (the transport holds this object)
        self.tcp_reset = TcpReset()

    def getsockopt(self, *args: Any) -> Any:
        if args != (socket.SOL_SOCKET, socket.SO_ERROR) or self._tcp.fileno() < 0:
            return super().getsockopt(*args)
        return self.tcp_reset.socket_error(self._tcp, self._pair)

    def getpeername(self) -> Any:
        closed = self.closed()
        if closed is not None:
            raise closed.as_os_error()
        return super().getpeername()

    def shutdown(self, how: int) -> None:
        reading, writing = directions_shut(how)
        refused = self.closed()
        if refused is not None:
            raise refused.as_os_error()
        if writing:
            self._pair.shutdown(socket.SHUT_WR)
            self.tcp_reset.fin_sent = True
        if reading:
            super().shutdown(socket.SHUT_RD)
            call_held(self._on_read_shut)

    def finished(self) -> bool:
        """Whether TCP's socket would be closed by now (see both_ways_finished)."""
        return both_ways_finished(self._pair.fileno(), self._tcp, self.tcp_reset.fin_sent,
                                  self._peer_rcvbuf)

    def closed(self) -> Optional[LinkBrokenError]:
        """ENOTCONN where TCP's socket would be closed by now: reset (see
        AcrossSocket.closed) or both directions finished. (None once the
        transport closed it: the call itself fails then, EBADF.)"""
        if self._tcp.fileno() < 0 or self._pair.fileno() < 0:
            return None
        return self.tcp_reset.closed(self._tcp, self._pair, self.finished())


def _on_the_pair(name: str) -> Callable[..., Any]:
    def call(self: _AcrossSocket, *args: Any, **kwargs: Any) -> Any:
        self._na(f"{name}() method")  # type: ignore[attr-defined,unused-ignore]
        return getattr(self._pair, name)(*args, **kwargs)
    call.__name__ = name
    return call


# Before 3.11 asyncio's socket still makes these calls, with a warning.
for _name in ("recv", "recv_into", "recvfrom", "recvfrom_into", "recvmsg", "recvmsg_into", "send",
              "sendall", "sendfile", "sendmsg", "sendto"):
    if hasattr(trsock.TransportSocket, _name):
        setattr(_AcrossSocket, _name, _on_the_pair(_name))
del _name


@refuse_as_uvloop
class _UvloopAcrossSocket(_AcrossSocket):
    """On uvloop: what its own transport's socket refuses, refused."""

    __slots__ = ()


class AcrossTransport(transports._FlowControlMixin, AcrossEnd):
    """A connection to another process of this host, moved off TCP: the
    loop's own transport on a socketpair end, answering as the TCP
    connection (its names, its socket for options), which stays open
    without payload until this closes."""

    # asyncio's start_tls() takes it (set_protocol, pause/resume_reading).
    _start_tls_compatible = True
    # loop.sendfile() writes the file through it (asyncio's way for a
    # transport that is not a socket's, which reads _loop and
    # _protocol_paused; uvloop has no sendfile()). The write buffer and
    # its limits are the inner transport's.
    _sendfile_compatible = _SendfileMode.FALLBACK
    # Whether the protocol's writing is paused: _Relay's pause_writing and
    # resume_writing keep it, for sendfile's fallback and links().
    _protocol_paused: bool

    def __init__(self, rendezvous: "Rendezvous", tcp: socket.socket, pair_end: socket.socket,
                 names: Tuple[Any, Any], protocol: asyncio.BaseProtocol, peer: Peer,
                 client: bool) -> None:
        self._sockname, self._peername = names
        self._on_uvloop = not isinstance(rendezvous.loop, asyncio.BaseEventLoop)
        self._socket = (_UvloopAcrossSocket if self._on_uvloop else _AcrossSocket)(
            tcp, pair_end, peer.rcvbuf, self._reading_shut)
        super().__init__(extra={
            "socket": self._socket,
            "sockname": self._sockname,
            "peername": self._peername,
        }, loop=rendezvous.loop)
        self._rendezvous = rendezvous
        # What a TLS layer's callbacks run in, on uvloop (see _tls._app_transport).
        self._context = contextvars.copy_context()
        self._tcp: Optional[socket.socket] = tcp
        self._protocol = protocol
        self._inner: Any = None
        self._relay: Any = None  # what the inner transport calls (_Relay)
        self._on_lost: Optional[Callable[[], Any]] = None
        self._reset: Optional[BaseException] = None
        self._client = client
        # For friendsock.links(): what this end can tell of the link.
        self._peer = peer
        self._born = time.monotonic()
        self._thread = threading.current_thread().name
        self._sent = 0  # bytes given to write()
        self._received = 0  # bytes passed to the protocol
        self._reads = 0  # how often (does the move pay? see _host._payoff)
        self._writes = 0
        self._eof_sent = False
        self._read_shut = False  # its socket's shutdown(SHUT_RD), see _reading_shut
        self._hang_up: Optional[Any] = None  # a poll of the pair end for its other end's close
        self._reset_came: Optional[ConnectionResetError] = None  # see _other_end_reset
        # The capture's tap while one runs (friendsock.capture): this end's
        # side and the other's, as the segments name them.
        self._tap: Optional[StreamTap] = None
        self._side, self._other_side = (CLIENT, SERVER) if client else (SERVER, CLIENT)

    def __repr__(self) -> str:
        state = "closed" if self._tcp is None else (
            "closing" if self._inner is not None and self._inner.is_closing() else "open")
        return (f"<{self.__class__.__name__} {state} sockname={self._sockname!r} "
                f"peername={self._peername!r}>")

    # (the inner transport answers for what it does)
    def write(self, data: Any) -> None:
        if not self._taken_after_close((data,)):
            self._inner.write(data)
        self._writes += 1
        if type(data) is bytes and self._tap is None:
            self._sent += len(data)
        else:
            self._wrote(data)

    def writelines(self, list_of_data: Any) -> None:
        list_of_data = list(list_of_data)  # (an iterator is read once)
        if not self._taken_after_close(list_of_data):
            self._inner.writelines(list_of_data)
        self._writes += 1
        for data in list_of_data:
            self._wrote(data)

    def _taken_after_close(self, buffers: Sequence[Any]) -> bool:
        """Whether this write (of ``buffers``) is answered here, not by the
        pair, once the other end's socket is gone (its pair end closed), whether or not
        its EOF was read here yet (the core's rule,
        :func:`write_refused_across`):

        - a clean close: TCP takes the first write (the other kernel drops
          it and resets), where the pair would refuse it and the
          connection be lost before what came ahead of that EOF is read;
          the next goes to the pair, and fails as TCP's second would;
        - the other end aborted, or closed with bytes unread: a reset,
          which this write fails with, as TCP's.
        """
        if self._socket.tcp_reset.fin_sent or self._inner.is_closing():
            return False  # (after its own write_eof() or shutdown(SHUT_WR), as TCP's)
        if not self._hung_up():
            return False  # (only its writing shut down: it still reads)
        if not any(_has_bytes(data) for data in buffers):
            return False  # (a write of nothing is none, as over TCP)
        reset = self._other_end_reset()
        refused = self._socket.tcp_reset.write_refused(reset is not None, True)
        if refused is None:
            return True
        if reset is None:
            return False  # (the pair refuses it: EPIPE)
        self._reset = refused.as_os_error()
        self._inner.abort()
        return True

    def _hung_up(self) -> bool:
        """Whether the other end's socket is gone (its pair end closed)."""
        hang_up = self._hang_up
        if hang_up is None:
            hang_up = self._hang_up = select.poll()
            hang_up.register(self._socket._pair.fileno(), select.POLLHUP)
        return bool(hang_up.poll(0))

    def _other_end_reset(self) -> Optional[ConnectionResetError]:
        """The reset the other end's socket went with (it aborted, or closed
        with bytes unread here), if it is gone so: taken off the sockets
        once, as TCP's calls take it, and kept for the EOF that follows
        on the pair (see _Relay.eof_received)."""
        if self._reset_came is None and self._hung_up():
            self._reset_came = refused_with_reset(self._tcp, self._socket._pair)
        return self._reset_came

    def _wrote(self, data: Any) -> None:
        """Count what the inner transport took (and capture it)."""
        if type(data) is not bytes:
            view = memoryview(data)
            self._sent += view.nbytes
            if self._tap is not None:
                self._tap.data(self._side, view.tobytes())
            return
        self._sent += len(data)
        if self._tap is not None:
            self._tap.data(self._side, data)

    def can_write_eof(self) -> bool:
        return True

    def write_eof(self) -> None:
        # (Not on the TCP socket: its FIN comes as the connection ends,
        # see Rendezvous.release.)
        if not (self._eof_sent or self._inner.is_closing()):
            refused = self._socket.closed()
            if refused is not None:
                self._write_eof_refused(refused.as_os_error())
                return
        self._inner.write_eof()
        self._eof_sent = self._socket.tcp_reset.fin_sent = True
        if self._tap is not None:
            self._tap.fin(self._side)

    def _write_eof_refused(self, error: OSError) -> None:
        """A write_eof() whose shutdown fails with ``error``, as the loop's
        own transport meets it: asyncio's raises it, its writing done all
        the same; uvloop's loses the connection with it."""
        if self._on_uvloop:
            self._reset = error
            self._inner.abort()
            return
        self._inner.write_eof()
        self._eof_sent = self._socket.tcp_reset.fin_sent = True
        raise error

    def is_closing(self) -> bool:
        return self._inner.is_closing()

    def close(self) -> None:
        self._inner.close()

    def abort(self) -> None:
        # As the loop's abort() on TCP: a close, which is a reset where the
        # socket's user set SO_LINGER {1, 0}. The reset goes first, for the
        # other end to find as it reads EOF on the pair (_Relay.eof_received).
        tcp = self._tcp
        if tcp is not None and closes_with_reset(tcp):
            self._tcp = None
            tcp.close()
            if self._tap is not None:
                self._tap.reset(self._side)
        self._inner.abort()

    def _force_close(self, exc: Optional[BaseException]) -> None:
        # What uvloop's TLS layer calls on a fatal error: an abort whose
        # connection_lost() carries ``exc``.
        if exc is not None and self._reset is None:
            self._reset = exc
            if self._tap is not None:
                self._tap.reset(self._side)
        self.abort()

    def _reading_shut(self) -> None:
        """Its socket's ``shutdown(SHUT_RD)``, which the pair knows nothing
        of: as over TCP, EOF once what came before is delivered, and no
        more reading (the other end's later bytes wait on the pair)."""
        inner = self._inner
        if self._read_shut or self._socket.tcp_reset.fin_read or inner is None or inner.is_closing():
            return
        self._read_shut = True
        self._look_for_read_shut_eof()

    def _look_for_read_shut_eof(self) -> None:
        """After a read shutdown: EOF soon if nothing is left to read on the
        pair (else the relay looks again once it passed those bytes on, or
        the other end's FIN or reset comes as it would)."""
        if read_shut_finds_eof(self._socket._pair):
            self._rendezvous.loop.call_soon(self._read_shut_eof, context=self._context)

    def _read_shut_eof(self) -> None:
        inner = self._inner
        if inner.is_closing() or not inner.is_reading():
            return  # (paused: resume_reading() looks again)
        inner.pause_reading()
        if not self._protocol.eof_received():  # type: ignore[attr-defined]
            self.close()

    def pause_reading(self) -> None:
        self._inner.pause_reading()

    def resume_reading(self) -> None:
        self._inner.resume_reading()
        if self._read_shut:
            self._look_for_read_shut_eof()

    def is_reading(self) -> bool:
        return self._inner.is_reading()

    def set_write_buffer_limits(self, high: Optional[int] = None, low: Optional[int] = None) -> None:
        self._inner.set_write_buffer_limits(high, low)

    def get_write_buffer_limits(self) -> Tuple[int, int]:
        return self._inner.get_write_buffer_limits()

    def get_write_buffer_size(self) -> int:
        return self._inner.get_write_buffer_size()

    def get_protocol(self) -> asyncio.BaseProtocol:
        return self._protocol

    def set_protocol(self, protocol: asyncio.BaseProtocol) -> None:
        self._protocol = protocol
        if self._inner is not None:
            # The relay of the kind the inner transport reads for, which
            # passes either kind of protocol on (uvloop's transports keep
            # the way of reading they started with).
            self._relay = type(self._relay)(self, protocol)
            self._inner.set_protocol(self._relay)

    # -- the TCP socket under it ------------------------------------------
    def _lost(self, exc: Optional[BaseException]) -> None:
        tcp, self._tcp = self._tcp, None
        tap = self._tap
        if tap is not None:
            if exc is not None:  # the other end is gone with bytes unread
                tap.reset(self._other_side)
            elif tcp is not None and closes_with_reset(tcp):  # (see release)
                tap.reset(self._side)
            else:
                tap.fin(self._side)  # (after all this end wrote, as close() flushes)
        if tcp is not None:
            live_across.discard(self)
            counters.read_across(self._received)
            if self._client:
                moved_connection_ended(self._peername[1], max(self._reads, self._writes),
                                       self._sent + self._received)
            self._rendezvous.release(tcp, self._client)

    def link_info(self, now: float) -> Optional[LinkInfo]:
        tcp, inner = self._tcp, self._inner
        if tcp is None or inner is None:
            return None
        try:
            sndbuf = tcp.getsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF)
            rcvbuf = tcp.getsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF)
            waiting = bytes_to_read(inner.get_extra_info("socket"))
        except OSError:  # closed meanwhile
            return None
        closing = inner.is_closing()
        own = EndInfo(address=tuple(self._sockname), sndbuf=sndbuf, rcvbuf=rcvbuf, closed=closing,
                      paused_reading=not closing and not inner.is_reading(),
                      paused_writing=self._protocol_paused, thread=self._thread,
                      scheduler=loop_name(self._rendezvous.loop))
        peer = EndInfo(address=tuple(self._peername), sndbuf=self._peer.sndbuf,
                       rcvbuf=self._peer.rcvbuf, closed=self._socket.tcp_reset.fin_read, paused_reading=None,
                       paused_writing=None, thread=None, scheduler=None)
        unsent = inner.get_write_buffer_size()
        reset = self._reset is not None
        sent = DirectionInfo("reset" if reset else "eof" if self._socket.tcp_reset.fin_sent else "open",
                             unsent, self._sent - unsent, False)
        received = DirectionInfo("reset" if reset else "eof" if self._socket.tcp_reset.fin_read else "open",
                                 waiting, self._received, closing)
        server = self._peername if self._client else self._sockname
        return link_between_processes(client_side=self._client, own=own, peer=peer, sent=sent,
                                      received=received, age=now - self._born,
                                      listener=(server[0], server[1]), peer_pid=self._peer.pid,
                                      captured=self._tap is not None)


def _has_bytes(data: Any) -> bool:
    """Whether a write of ``data`` writes anything: a bytes-like object of
    at least a byte. (A write of nothing is no write, as over TCP, and what
    is not bytes is the inner transport's to refuse.)"""
    if type(data) is bytes:
        return bool(data)
    return isinstance(data, (bytearray, memoryview)) and memoryview(data).nbytes > 0


class _Relay(asyncio.Protocol):
    """What the inner transport calls: passed on to the user's protocol,
    with :class:`AcrossTransport` as its transport."""

    __slots__ = ("outer", "protocol")

    def __init__(self, outer: AcrossTransport, protocol: asyncio.BaseProtocol) -> None:
        self.outer = outer
        self.protocol = protocol

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        if self.outer._inner is None:
            self.outer._inner = transport
        self.protocol.connection_made(self.outer)

    def connection_lost(self, exc: Optional[Exception]) -> None:
        outer = self.outer
        if exc is None and outer._reset is not None:
            exc = outer._reset  # type: ignore[assignment]
        outer._lost(exc)
        try:
            self.protocol.connection_lost(exc)
        finally:
            on_lost, outer._on_lost = outer._on_lost, None
            if on_lost is not None:
                on_lost()

    def pause_writing(self) -> None:
        self.outer._protocol_paused = True
        self.protocol.pause_writing()

    def resume_writing(self) -> None:
        self.outer._protocol_paused = False
        self.protocol.resume_writing()

    def data_received(self, data: bytes) -> None:
        outer = self.outer
        outer._received += len(data)
        outer._reads += 1
        if outer._tap is not None:
            outer._tap.data(outer._other_side, data)
        receive = getattr(self.protocol, "data_received", None)
        if receive is not None:
            receive(data)
        else:
            self._copy_into_buffers(data)
        if outer._read_shut:
            outer._look_for_read_shut_eof()

    def _copy_into_buffers(self, data: bytes) -> None:
        # A protocol that reads into its own buffers, set on a transport
        # that delivers bytes (uvloop keeps a stream's first way of reading).
        view = memoryview(data)
        while view:
            buffer = memoryview(self.protocol.get_buffer(len(view)))  # type: ignore[attr-defined]
            size = min(len(buffer), len(view))
            buffer[:size] = view[:size]
            self.protocol.buffer_updated(size)  # type: ignore[attr-defined]
            view = view[size:]

    def eof_received(self) -> Optional[bool]:
        tcp = self.outer._tcp
        reset = self.outer._reset_came or (None if tcp is None else tcp_error(tcp))
        if reset is not None:  # it aborted (or closed with bytes unread): a reset, not EOF
            self.outer._reset = reset
            self.outer._inner.abort()
            return True
        self.outer._socket.tcp_reset.fin_read = True
        if self.outer._tap is not None:
            self.outer._tap.fin(self.outer._other_side)
        return self.protocol.eof_received()  # type: ignore[attr-defined]


class _BufferedRelay(_Relay, asyncio.BufferedProtocol):
    __slots__ = ("_buffer",)

    def get_buffer(self, sizehint: int) -> Any:
        get_buffer = getattr(self.protocol, "get_buffer", None)
        if get_buffer is not None:
            buffer = get_buffer(sizehint)
            if self.outer._tap is not None:
                self._buffer = buffer  # (what buffer_updated's bytes are read from)
            return buffer
        # A protocol that takes bytes, set on a transport that reads into
        # buffers (see _Relay.data_received).
        self._buffer = bytearray(max(sizehint, 1) if sizehint > 0 else 65536)
        return self._buffer

    def buffer_updated(self, nbytes: int) -> None:
        outer = self.outer
        outer._received += nbytes
        outer._reads += 1
        if outer._tap is not None:
            outer._tap.data(outer._other_side, bytes(memoryview(self._buffer).cast("B")[:nbytes]))
        if hasattr(self.protocol, "buffer_updated"):
            self.protocol.buffer_updated(nbytes)
        else:
            self.protocol.data_received(bytes(self._buffer[:nbytes]))  # type: ignore[attr-defined]
        if outer._read_shut:
            outer._look_for_read_shut_eof()


def _relay_for(outer: AcrossTransport, protocol: asyncio.BaseProtocol) -> _Relay:
    # (uvloop's TLS layer reads into buffers without being a BufferedProtocol)
    if isinstance(protocol, asyncio.BufferedProtocol) or (
            hasattr(protocol, "get_buffer") and not hasattr(protocol, "data_received")):
        return _BufferedRelay(outer, protocol)
    return _Relay(outer, protocol)


# asyncio's selector transports read with recv(max_size), 256 KiB, a bytes
# object glibc allocates above its 128 KiB mmap threshold: mmap, mremap (the
# shrink to what came) and munmap, three system calls on every read, which
# cost a round trip between processes a third of its rate. Below it, the
# heap serves it; a 64 KiB stream write still comes in one read.
_READ_MAX = 124 * 1024


def _read_below_mmap_threshold(inner: asyncio.BaseTransport) -> None:
    """Reads of at most ``_READ_MAX`` on asyncio's transport (uvloop's read
    into a buffer they keep, and have no ``max_size``)."""
    if getattr(inner, "max_size", 0) > _READ_MAX:
        inner.max_size = _READ_MAX  # type: ignore[attr-defined]


async def start_across(rendezvous: Rendezvous, pair_end: socket.socket, tcp: socket.socket,
                       names: Tuple[Any, Any], protocol: asyncio.BaseProtocol, peer: Peer,
                       client: bool, on_lost: Optional[Callable[[], Any]] = None,
                       newly_moved: bool = True, tap: Optional[StreamTap] = None) -> AcrossTransport:
    """The transport of a connection moved onto ``pair_end``, started with
    ``protocol`` (``connection_made`` called once it returns); ``names``:
    the TCP socket's; ``peer``: the other end; ``client``: the connecting
    end; ``on_lost``: called once the connection is lost (its server
    counts it so); ``newly_moved``: counted as a move, and a capture's
    tap made for it (not for a moved blocking socket the loop takes over,
    whose ``tap`` goes on)."""
    loop = rendezvous.loop
    room_like_friends(pair_end, tcp, peer.rcvbuf)
    set_nodelay(loop, tcp)  # (as the loop's own transport would have, on it)
    outer = AcrossTransport(rendezvous, tcp, pair_end, names, protocol, peer, client)
    outer._tap = stream_tap_for(*(names if client else names[::-1])) if newly_moved else tap
    outer._on_lost = on_lost
    relay = outer._relay = _relay_for(outer, protocol)
    try:
        await native(loop, "connect_accepted_socket")(lambda: relay, pair_end)
        _read_below_mmap_threshold(outer._inner)
    except BaseException:
        outer._tcp = None  # (its caller closes it)
        raise
    if newly_moved:
        counters.moved_across(peer.pid)
    live_across.add(outer)
    return outer


async def adopt_moved(loop: asyncio.AbstractEventLoop, protocol_factory: Any, sock: Any,
                      kwargs: Dict[str, Any]) -> Optional[Tuple[asyncio.Transport, asyncio.BaseProtocol]]:
    """``create_connection(sock=)`` or ``connect_accepted_socket()`` of a
    blocking socket moved to another process (``patch_socket()``): its
    connection goes on in this loop's transport over its pair end, as the
    loop's own transport takes a connected socket over. None where the
    loop's own call goes on instead: TLS or another keyword asked for,
    this process moves nothing now, or the socket cannot be given (see
    AcrossSocket.given_to_a_loop)."""
    found = rendezvous(loop)
    if found is None or any(value is not None for key, value in kwargs.items() if key != "sock"):
        return None
    given = sock.given_to_a_loop()
    if given is None:
        return None
    pair_end, tcp, names, peer, client, tap = given
    return await _started(found, protocol_factory, pair_end, tcp, names, peer, client, newly_moved=False,
                          tap=tap)
