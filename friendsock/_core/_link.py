"""Friend links: two channels (``_channel``) and two ends, and every rule
of what an end sees (data, EOF, a reset, and which errno a socket call
gets).

The adapters ask, and translate the answer once into their framework:
what a reader finds now (:meth:`Channel.seen`), what a send to a friend that
went away gets (:meth:`LinkEnd.send_refused`), what a send still pending in
the writer's own buffer gets when the friend stops reading
(:meth:`LinkEnd.pending_send_error`), and what a shutdown gets
(:meth:`LinkEnd.shutdown_write`). Failures are :class:`LinkBrokenError`,
carrying the errno the kernel would report.
"""

from __future__ import annotations

import enum
import errno
import threading
import time
from typing import Any, Callable, Optional, Protocol, Tuple, Type, Union

from ._alive import LiveLinks
from ._channel import CHANNEL_EOF, CHANNEL_OPEN, CHANNEL_RESET, CHANNEL_TCP, Channel, Hook
from ._locked_channel import LockedChannel
from ._errors import ChannelShutdownError, FriendError, LinkBrokenError, PeerResetError
from ._fork import Part, on_fork
from ._stats import Shard, counters

# What an adapter says of its end (``LinkEnd.describe``): whether reading
# is paused, whether writing is paused, and the scheduler it runs on.
EndActivity = Tuple[Optional[bool], bool, Optional[str]]
Describe = Optional[Callable[[], Optional[EndActivity]]]


class Tap(Protocol):
    """What a link made while capturing reports to (``_tap.LinkTap``, which
    builds on the channels)."""

    def channels(self, client_sndbuf: int, client_rcvbuf: int, server_sndbuf: int,
                 server_rcvbuf: int, threaded: bool, meter: Shard) -> Tuple[Channel, Channel]: ...

    def established(self) -> None: ...


class Fin(enum.Enum):
    """Where an end's real-socket FIN stands (see :meth:`LinkEnd.fin_to_show`),
    but for an :class:`OwedFin`."""

    NOT_DUE = "not due"  # still writing, or nobody to show it to
    SHOWN = "shown"  # its real socket sent it


FIN_NOT_DUE, FIN_SHOWN = Fin.NOT_DUE, Fin.SHOWN


class OwedFin:
    """An end done writing whose FIN waits for the friend's descriptor to be
    asked for (:meth:`LinkEnd.reveal`), to go from ``sock`` then. Made only
    then, so an idle end carries one slot for its FIN, not two."""

    __slots__ = ("sock",)

    def __init__(self, sock: Any) -> None:
        self.sock = sock


class _FirstPushCheck:
    """A channel that runs ``check`` before its first push: the names check
    of ``FRIENDSOCK_CHECK_PAIRING`` (see :data:`first_push_check`), in its
    own channel kinds so that a link made without it costs nothing."""

    __slots__ = ()
    check: Callable[[], None]

    def push(self, data: bytes) -> None:
        self.check()
        super().push(data)  # type: ignore[misc]


class CheckedChannel(_FirstPushCheck, Channel):
    __slots__ = ("check",)


class CheckedLockedChannel(_FirstPushCheck, LockedChannel):
    __slots__ = ("check",)


def _first_time(check: Callable[["Link", "LinkEnd"], None], link: "Link",
                end: "LinkEnd") -> Callable[[], None]:
    """``check(link, end)`` the first time it is called, then nothing."""
    due = [True]

    def run() -> None:
        if due:
            due.clear()
            check(link, end)
    return run


# Set (by the handshake, which can read the real sockets) when
# FRIENDSOCK_CHECK_PAIRING is on: called with a link and the end about to
# write its first byte, it raises if the link's ends are not named alike.
first_push_check: Optional[Callable[["Link", "LinkEnd"], None]] = None


class LinkEnd:
    """One end of a link: what it writes (``outgoing``) and reads (``incoming``)."""

    __slots__ = ("link", "outgoing", "incoming", "closed", "describe", "owner", "abortive",
                 "over_tcp", "fd_hidden", "fin", "error_taken")

    def __init__(self, link: "Link", outgoing: Channel, incoming: Channel) -> None:
        self.link = link
        self.outgoing = outgoing
        self.incoming = incoming
        self.closed = False
        # The adapter's account of this end for friendsock.links() (paused
        # reading and writing, its loop); None: the core's own guess.
        self.describe: Describe = None
        # Or the adapter's object running this end, which gives that account
        # itself (its ``_describe_end()``), and through which the adapter
        # finds its ends in the live links (asyncio's transport, for a loop
        # that closes with ends open) rather than a registry of its own.
        self.owner: Any = None
        # SO_LINGER {1, 0} set on its socket: its close is a reset.
        self.abortive = False
        # Set by an adapter whose end can go on over its real socket when
        # the link moves to TCP (Link.go_on_over_tcp): gives that socket and
        # the switch to it (see friendsock._blocking._over_tcp); None:
        # it cannot.
        self.over_tcp: Optional[Callable[[], Optional[Tuple[Any, Callable[[], None]]]]] = None
        # Its real socket is friendsock's own, and its descriptor was never
        # asked for: nobody can poll it (see fin_to_show).
        self.fd_hidden = False
        # Our real socket's FIN (the end done writing).
        self.fin: Union[Fin, OwedFin] = FIN_NOT_DUE
        # The friend's reset was reported (see take_error).
        self.error_taken = False

    # -- the real sockets under the link ----------------------------------
    def fin_to_show(self, sock: Any) -> bool:
        """This end is done writing (EOF, or closed): whether ``sock``, its
        real socket, is to send its FIN now, so that the friend's descriptor
        polls readable as a TCP socket's does after the peer's FIN (a pool
        polls an idle connection's descriptor to learn that its server
        closed it). Once only; not to a friend closed. While the friend's
        descriptor is hidden (``fd_hidden``: a system call and a FIN's
        round in the kernel per connection saved, and the connection still
        one to keep), or no adapter runs the friend yet (held: bytes or EOF
        on its real socket would mean that it is used raw), the FIN is owed
        instead, until :meth:`reveal`; asked again meanwhile (a close after
        a shutdown), it goes from ``sock``, where the descriptor may have
        moved."""
        lock = self.link._lock
        if lock is None:
            return self._fin_to_show(sock)
        with lock:  # against the friend's reveal(), on its thread
            return self._fin_to_show(sock)

    def _fin_to_show(self, sock: Any) -> bool:
        if self.fin is FIN_SHOWN:
            return False
        friend = self.link.friend_of(self)
        if friend is None or friend.closed:
            return False
        if friend.fd_hidden or friend.outgoing.notify_writable is None:
            self.fin = OwedFin(sock)
            return False
        self.fin = FIN_SHOWN
        return True

    def reveal(self) -> Any:
        """This end's descriptor is about to be seen (and maybe polled): the
        friend's FIN shows at once from now on. The real socket whose FIN
        the friend owes already, to send now; None if none."""
        lock = self.link._lock
        if lock is None:
            return self._reveal()
        with lock:
            return self._reveal()

    def _reveal(self) -> Any:
        self.fd_hidden = False
        friend = self.link.friend_of(self)
        if friend is None:
            return None
        owed = friend.fin
        if type(owed) is not OwedFin:
            return None
        friend.fin = FIN_SHOWN
        return owed.sock

    # -- what this end's socket calls get ---------------------------------
    def take_error(self) -> Optional[LinkBrokenError]:
        """The friend's reset, as the kernel reports it: once. The reset
        leaves an error pending on the socket (EPIPE when the friend's FIN
        had come in first, CLOSE_WAIT; ECONNRESET otherwise), and the first
        call that reports it clears it (``sock_error()``): a read that
        finds nothing left, a send, ``getsockopt(SO_ERROR)``. After it, a
        read gets EOF and a send EPIPE. None: no error pending."""
        incoming = self.incoming
        if incoming.state is not CHANNEL_RESET or self.error_taken:
            return None
        lock = self.link._lock
        if lock is None:
            self.error_taken = True
        else:
            with lock:  # one caller gets it, as the kernel's xchg() gives it to one
                if self.error_taken:
                    return None
                self.error_taken = True
        return reset_error(incoming.reset_after_fin)

    def send_error(self) -> LinkBrokenError:
        """What a send fails with after the friend's reset: its pending
        error (:meth:`take_error`), then EPIPE (tcp_sendmsg)."""
        return self.take_error() or LinkBrokenError(errno.EPIPE)

    def send_refused(self) -> None:
        """A send found the friend's reader gone (``outgoing.push`` raised
        :class:`PeerResetError`). Returns when TCP still takes this send;
        raises :class:`LinkBrokenError` when the send fails."""
        incoming = self.incoming
        if incoming.state is not CHANNEL_RESET:
            # The friend closed cleanly. TCP takes this first write, and the
            # friend's kernel answers it with a reset, which drops what the
            # friend had not sent yet (beyond our rcvbuf) and fails the next.
            incoming.reset(keep=incoming.rcvbuf)
            return
        raise self.send_error()

    def push_refused(self, refused: FriendError) -> Optional[LinkBrokenError]:
        """What a write gets that its outgoing channel refused (``push``
        raised ``refused``): the error the kernel's send fails with, or
        None where TCP still takes the write (the friend closed cleanly,
        see :meth:`send_refused`). After this end's own shutdown: EPIPE."""
        if isinstance(refused, PeerResetError):
            try:
                self.send_refused()
            except LinkBrokenError as error:
                return error
            return None
        return LinkBrokenError(errno.EPIPE)

    def pending_send_error(self) -> Optional[LinkBrokenError]:
        """The friend stopped reading (``outgoing.reader_closed``): what a
        send still pending in our own buffer gets. The friend closed with
        our bytes unread and reset: over TCP that fails a send whose bytes
        did not fit in sndbuf + friend rcvbuf; an idle end (None here)
        learns of it by reading or writing."""
        if self.outgoing.closed_with_backlog:
            return self.send_error()
        return None

    def send_some(self, data: bytes) -> int:
        """A socket's ``send()``: queue what fits in ``sndbuf + friend rcvbuf``
        now, and return how many bytes that is (0: no room, wait for
        ``wake_writer_at(-1)``; -1: the connection went on over TCP, send
        there). Raises :class:`LinkBrokenError` as the kernel's send fails:
        EPIPE after our own shutdown, the friend's reset (see
        :meth:`send_refused`)."""
        out = self.outgoing
        if out.state is CHANNEL_TCP:
            out.after_over_tcp()
            return -1
        if out.state is CHANNEL_RESET or self.incoming.state is CHANNEL_RESET:
            raise self.send_error()
        if out.state is not CHANNEL_OPEN:
            raise LinkBrokenError(errno.EPIPE)
        if not data:  # checked as any send is, and sends nothing
            return 0
        room = out.room()
        if room <= 0 and not out.reader_closed:
            return 0
        if len(data) > room > 0:
            data = data[:room]
        try:
            out.push(data)
        except PeerResetError:
            self.send_refused()  # TCP takes this one: the friend answers it with a reset
        except ChannelShutdownError:  # reset meanwhile, on the friend's thread
            raise self.send_error() from None
        return len(data)

    def peername_error(self) -> Optional[LinkBrokenError]:
        """What ``getpeername()`` fails with: ENOTCONN once the friend's
        reset came (it closes the kernel's socket, even with bytes left to
        read); None while connected."""
        if self.incoming.state is CHANNEL_RESET:
            return LinkBrokenError(errno.ENOTCONN)
        return None

    def shutdown_write(self) -> bool:
        """``shutdown(SHUT_WR)``: EOF after what was written. After the
        friend's reset, or once both directions finished, the socket is
        closed, and shutdown fails ENOTCONN (:func:`closed_error`).
        False when the connection went on over TCP (:meth:`Link.go_on_over_tcp`,
        maybe while this call began): the shutdown is the socket's own, to
        make now that the move to TCP has sent what was queued."""
        incoming, out = self.incoming, self.outgoing
        finished = (out.state is CHANNEL_EOF and incoming.state is CHANNEL_EOF
                    and fin_arrived(out.queued, out.rcvbuf) and fin_arrived(incoming.queued, incoming.rcvbuf))
        refused = closed_error(incoming.state is CHANNEL_RESET, finished)
        if refused is not None:
            raise refused
        if out.state is CHANNEL_OPEN or out.state is CHANNEL_TCP:
            # (Under the channel's lock: a move to TCP under way has sent
            # what was queued by the time this returns.)
            return out.shutdown()
        return True

    def drop_own_buffer(self) -> None:
        """An abort's loss: what does not fit in ``sndbuf + friend rcvbuf``
        is the writer's own buffer, which an abort drops (as asyncio drops
        its buffer); what the kernel already holds still goes."""
        self.outgoing.truncate(self.outgoing.capacity)

    def close(self) -> None:
        """The end is done (its socket would be closed now).

        With unread incoming bytes the kernel answers with a reset, which
        keeps only what already sits in the friend's receive buffer;
        otherwise the friend gets the rest, then EOF. An abortive close
        (SO_LINGER {1, 0}) always resets.
        """
        if self.abortive:
            self.went_away()
            return
        link = self.link
        if link._lock is None:  # _claim_close(), inlined for one-thread links
            if self.closed:
                return
            self.closed = True
        elif not link._claim_close(self):
            return
        # The friend's reader hears first (its bytes, then EOF or the reset),
        # its writer after: as over TCP, where it reads what came before the
        # FIN/RST before a pending send of its own fails.
        out = self.outgoing
        if self.incoming.queued:
            out.reset(keep=out.rcvbuf)
        elif out.state is CHANNEL_OPEN:
            out.shutdown()
        if self.incoming.close_reader() and out.state is not CHANNEL_RESET:
            out.reset(keep=out.rcvbuf)  # bytes came in meanwhile (another thread)
        link._end_closed()

    def abort(self) -> None:
        """``abort()``: what fits in ``sndbuf + friend rcvbuf`` is kept."""
        self.drop_own_buffer()
        self.close()

    def went_away(self) -> bool:
        """The end went away at once, as a process that dies (its loop or
        run closed, an abortive close): the friend gets what already sits
        in its receive buffer, then the reset. False when the end was
        already closed."""
        return self.reset(keep=self.outgoing.rcvbuf)

    def reset(self, keep: int = 0) -> bool:
        """Close with a reset whatever is unread: the friend gets at most
        ``keep`` more bytes, then the error. ``keep=0``: a listener closed
        with this connection still in its backlog (see also
        :meth:`went_away`). Returns False when the end was already closed."""
        if not self.link._claim_close(self):
            return False
        self.outgoing.reset(keep=keep)
        self.incoming.close_reader()
        self.link._end_closed()
        return True


def _may_go_on_over_tcp(client: LinkEnd, server: LinkEnd, limit: int) -> bool:
    """:meth:`Link.go_on_over_tcp`'s conditions: an end open, or closed with its
    EOF sent (a close over unread bytes reset the friend's direction; one
    still under way, on another thread, has not sent its EOF yet); no
    direction reset, none holding more than ``limit`` bytes."""
    if client.closed and server.closed:
        return False
    for end in (client, server):
        channel = end.outgoing
        if channel.state not in (CHANNEL_OPEN, CHANNEL_EOF) or channel.queued > limit:
            return False
        if channel.queued and end.fin is FIN_SHOWN:  # its bytes cannot follow its FIN
            return False
        if end.closed and not (channel.state is CHANNEL_EOF and end.incoming.reader_closed):
            return False
    return True


def reset_error(after_fin: bool) -> LinkBrokenError:
    """The error a reset leaves pending on the socket: EPIPE where the
    friend's FIN had come in before it (the socket in CLOSE_WAIT),
    ECONNRESET otherwise (tcp_reset)."""
    return LinkBrokenError(errno.EPIPE if after_fin else errno.ECONNRESET)


def write_refused_across(peer_reset: bool, taken_before: bool,
                         after_fin: bool = False) -> Optional[LinkBrokenError]:
    """The rule of :meth:`LinkEnd.send_refused` for a connection moved to
    another process, whose write the kernel refused because the other
    end's socket is gone: what that write gets. The other end's reset
    (it aborted): its error (:func:`reset_error`; ``after_fin``: this end
    read its EOF before). A clean close: TCP takes the first write
    (the other kernel drops it and resets, after which the next fails),
    so None the first time (``taken_before`` False), then EPIPE."""
    if peer_reset:
        return reset_error(after_fin)
    if not taken_before:
        return None
    return LinkBrokenError(errno.EPIPE)


def closed_error(reset: bool, finished: bool = False) -> Optional[LinkBrokenError]:
    """What a call that needs the connection (``shutdown()``, a moved
    socket's ``getpeername()``) fails with, if anything: ENOTCONN once
    TCP's socket is closed, by a ``reset`` (the friend's, or the one the other
    kernel answers the write TCP takes after a clean close with, see
    :func:`write_refused_across`), or with both directions ``finished``
    (this end's FIN sent, the friend's too, and each arrived:
    :func:`fin_arrived`)."""
    return LinkBrokenError(errno.ENOTCONN) if reset or finished else None


def fin_arrived(unread: int, rcvbuf: int) -> bool:
    """Whether TCP's FIN, sent after ``unread`` bytes its reader has not
    read yet, has surely reached the reader's kernel (and been
    acknowledged): a socket is closed once both FINs have. The bytes
    ahead of it go first, and the reader's kernel takes them as far as
    the window it advertises, which holds at least half its SO_RCVBUF
    (``rcvbuf``, as read back; more for large segments). Past that TCP's
    FIN may still wait in the writer's send queue: a friend takes it for
    not arrived then, so that a shutdown goes through where TCP's might
    fail, never the other way round."""
    return unread <= rcvbuf // 2


class Link:
    """Two channels and two ends: ``client`` and ``server``.

    ``threaded``: the ends run on different threads (decided when the link
    is made: a listener's loop is known before connect()); ``listener``: the
    endpoint of the listener it connects to, where ``stats()`` counts it;
    ``addresses``: the client's and the server's socket addresses; ``tap``:
    a capture was running when the link was made (its channels report to it).
    """

    __slots__ = ("client", "server", "threaded", "listener", "_open_ends", "_lock",
                 "established", "on_done", "addresses", "tap", "born", "sizes_settled",
                 "__weakref__")

    def __init__(
        self,
        client_sndbuf: int,
        client_rcvbuf: int,
        server_sndbuf: int,
        server_rcvbuf: int,
        threaded: bool = False,
        listener: Optional[Tuple[str, int]] = None,
        addresses: Optional[Tuple[Any, Any]] = None,
        tap: Optional[Tap] = None,
    ) -> None:
        meter = counters.shard()
        to_server: Channel
        to_client: Channel
        check = first_push_check
        if tap is None and check is None:
            kind: Type[Channel] = LockedChannel if threaded else Channel
            to_server = kind(client_sndbuf, server_rcvbuf, meter)
            to_client = kind(server_sndbuf, client_rcvbuf, meter)
        elif tap is None:
            checked: Type[Any] = CheckedLockedChannel if threaded else CheckedChannel
            to_server = checked(client_sndbuf, server_rcvbuf, meter)
            to_client = checked(server_sndbuf, client_rcvbuf, meter)
        else:
            to_server, to_client = tap.channels(client_sndbuf, client_rcvbuf, server_sndbuf,
                                                server_rcvbuf, threaded, meter)
        self.client = LinkEnd(self, outgoing=to_server, incoming=to_client)
        self.server = LinkEnd(self, outgoing=to_client, incoming=to_server)
        if check is not None and tap is None:
            to_server.check = _first_time(check, self, self.client)  # type: ignore[attr-defined]
            to_client.check = _first_time(check, self, self.server)  # type: ignore[attr-defined]
        self.threaded = threaded
        self.listener = listener
        self.addresses = addresses
        self.tap = tap
        self.born = 0.0  # time.monotonic() when established
        # The channels carry the ends' socket buffer sizes already (a
        # socketless link's, a reused connection's): nothing to read.
        self.sizes_settled = False
        self._open_ends = 2
        # Ends on two threads close on their own threads (or on whichever
        # finds a loop gone): "closed once" and "done once" must hold across
        # them. Ends on one thread need no lock.
        self._lock = threading.Lock() if threaded else None
        self.established = False
        # Called once both ends are closed: the adapter releases the sockets.
        self.on_done: Hook = None

    def establish(self) -> None:
        """Both ends agree this connection is a friend link (counted once).
        Called before the other end can see the link (the registry hands it
        over), so no lock."""
        if not self.established:
            self.established = True
            self.born = time.monotonic()
            live_links.add(self)
            counters.link_made(self.listener)
            if self.tap is not None:
                self.tap.established()

    @property
    def done(self) -> bool:
        return self._open_ends == 0

    def friend_of(self, end: LinkEnd) -> Optional[LinkEnd]:
        """``end``'s friend: the link's other end (None once it is done)."""
        return self.server if end is self.client else self.client

    def can_go_on_over_tcp(self, limit: int) -> bool:
        """Whether :meth:`go_on_over_tcp` would go ahead now (it checks again,
        under the locks)."""
        client, server = self.client, self.server
        return client is not None and server is not None and \
            _may_go_on_over_tcp(client, server, limit)

    def go_on_over_tcp(self, send: Callable[[LinkEnd, bytes, bool], None], limit: int,
                  first: Optional[LinkEnd] = None) -> bool:
        """Go on over TCP: the real connection under the link, which carried
        no payload, carries everything from now on (the process forks, and
        a child may use either end: its copy of the link would be nobody's).
        For each end, ``send(end, data, eof)`` puts what it had queued, and
        its EOF, on its socket: called with the channels locked, so nothing
        written meanwhile overtakes it; it must not block nor touch the link.
        Then every reader finds :attr:`Seen.TCP` and every writer a
        ``send_some()`` of -1, and each is woken to find it. The link is done
        without releasing anything: the sockets are their owners' again.

        An end closed already (with EOF: nothing was unread) goes too: its
        ``send`` puts what it had queued and its EOF on the socket its close
        left, which then closes as the kernel's would have. (An EOF whose
        FIN the socket sent already, :meth:`LinkEnd.fin_to_show`, is not
        sent again; bytes cannot follow it, so a direction with any left
        is not moved to TCP.)

        ``first``: the end moved first, before its reader can find
        TCP (an end whose ``send`` also switches it to its socket, and whose
        reader does not take the locks to look).

        Returns False, nothing changed, when both ends are closed, a
        direction was reset or holds more than ``limit`` bytes (the socket
        might not take them at once)."""
        ends = (self.client, self.server)
        if None in ends:  # done: both ends closed
            return False
        client, server = ends
        channels = (client.outgoing, server.outgoing)
        locks = [lock for lock in (self._lock, *(getattr(c, "_lock", None) for c in channels))
                 if lock is not None]
        for lock in locks:
            lock.acquire()
        try:
            if not _may_go_on_over_tcp(client, server, limit):
                return False
            for end in (ends if first is not server else (server, client)):
                data, eof = end.outgoing.take_for_tcp()
                if eof:
                    shown = end.fin is FIN_SHOWN
                    end.fin = FIN_SHOWN
                    eof = not shown
                send(end, data, eof)
            client.closed = server.closed = True  # a close() from now on is the socket's
            self._open_ends = 0
        finally:
            for lock in reversed(locks):
                lock.release()
        if self.established:
            live_links.discard(self)
            counters.shard().done += 1
        for channel in channels:
            for hook in (channel.notify_readable, channel.notify_writable):
                if hook is not None:
                    hook()
        return True

    def forked_away(self) -> None:
        """In a forked child, a link not moved to TCP (:meth:`go_on_over_tcp`): its
        other end is the parent's, its copy here nobody's. Both directions
        are reset, so this child's ends fail at once instead of waiting
        forever; nothing is notified (whoever waits on them is the
        parent's), and every lock is new (another thread may have held one
        at the fork)."""
        if self.client is None or self.server is None:  # done: nothing left to cut off
            return
        if self._lock is not None:
            self._lock = threading.Lock()
        self.client.outgoing.cut_off()
        self.server.outgoing.cut_off()

    def _claim_close(self, end: LinkEnd) -> bool:
        lock = self._lock
        if lock is None:
            if end.closed:
                return False
            end.closed = True
            return True
        with lock:
            if end.closed:
                return False
            end.closed = True
            return True

    def forget_ends(self) -> None:
        """A link that never formed (its connect withdrawn, plain TCP):
        its ends let go of, as a done link's are, so no cycle is left for
        the collector (tornado's tests look for such garbage)."""
        if not self.established:
            self.client = self.server = None  # type: ignore[assignment]

    def _end_closed(self) -> None:
        lock = self._lock
        if lock is None:
            self._open_ends -= 1
            if self._open_ends:
                return
        else:
            with lock:
                self._open_ends -= 1
                if self._open_ends:
                    return
        if self.established:
            live_links.discard(self)
            counters.shard().done += 1
        on_done, self.on_done = self.on_done, None
        # Done: the ends let go of, so no cycle (link <-> end) is left for
        # the collector, and a finished link goes with its owners' last
        # reference, as a socket does. Nothing asks a done link for them.
        self.client = self.server = None  # type: ignore[assignment]
        if on_done is not None:
            on_done()


# The established links with an end open (friendsock.links() reports them).
live_links: LiveLinks[Link] = LiveLinks()
on_fork(Part.LIVE_LINKS, after_in_child=live_links._reset_after_fork)
