"""Friend links: two channels, their accounting, and every rule of what an
end sees (data, EOF, a reset, and which errno a socket call gets).

A *channel* is one direction of a link: the bytes one end wrote and the other
has not consumed yet. Its accounting mirrors the kernel's ``sk_friend``:
the writer's capacity before its own buffer grows is ``sndbuf + rcvbuf``
(its own send buffer plus the friend's receive buffer), and ``queued`` is at
once the reader's ``rmem_alloc`` and the writer's ``wmem_queued``.

An adapter supplies two hooks per channel: ``notify_readable`` (called once
per burst: the reader must drain) and ``notify_writable`` (the writer asked to
be woken when the queue falls to a threshold, or the reader went away).

Threads: a link whose ends share one scheduler uses plain channels, with no
locking at all. A link whose ends run on different threads (``threaded``)
uses :class:`LockedChannel`: one writer thread and one reader thread per
channel, every change under a small lock, the hooks called after it is
released.

The adapters ask, and translate the answer once into their framework:
what a reader finds now (:meth:`Channel.seen`), what a send to a friend that
went away gets (:meth:`LinkEnd.send_refused`), what a send still pending in
the writer's own buffer gets when the friend stops reading
(:meth:`LinkEnd.pending_send_error`), and what a shutdown gets
(:meth:`LinkEnd.shutdown_write`). Failures are :class:`LinkBrokenError`,
carrying the errno the kernel would report.
"""

from __future__ import annotations

import collections
import enum
import errno
import threading
import time
from typing import Any, Callable, Deque, NoReturn, Optional, Protocol, Tuple, Type

from ._alive import LiveLinks
from ._errors import ChannelShutdownError, LinkBrokenError, PeerResetError
from ._fork import Part, on_fork
from ._stats import Shard, counters

Hook = Optional[Callable[[], None]]
# What an adapter says of its end (``LinkEnd.describe``): whether reading
# is paused, whether writing is paused, and the scheduler it runs on.
EndActivity = Tuple[Optional[bool], bool, Optional[str]]
Describe = Optional[Callable[[], Optional[EndActivity]]]


class Tap(Protocol):
    """What a link made while capturing reports to (``_tap.LinkTap``, which
    builds on this module's channels)."""

    def channels(self, client_sndbuf: int, client_rcvbuf: int, server_sndbuf: int,
                 server_rcvbuf: int, threaded: bool, meter: Shard) -> Tuple["Channel", "Channel"]: ...

    def established(self) -> None: ...


class ChannelState(enum.Enum):
    OPEN = "open"  # the writer may write
    EOF = "eof"  # the writer shut down; the reader gets EOF after the bytes
    RESET = "reset"  # the reader gets a reset after the bytes kept
    TCP = "tcp"  # the connection went on over TCP (Link.hand_over): ends use their sockets

    # Members are singletons compared by identity: hashed by identity too, in
    # C (Enum's own __hash__ is a Python call, and every move looks one up).
    __hash__ = object.__hash__


class Seen(enum.Enum):
    """What the reader of a channel finds now."""

    DATA = "data"  # bytes are queued: pull them
    NOTHING = "nothing"  # open and empty: wait to be notified
    EOF = "eof"  # every byte was read, then the writer's EOF
    RESET = "reset"  # every byte kept was read, then the reset
    TCP = "tcp"  # the connection went on over TCP: read the socket


# The only moves a channel makes: EOF may still turn into a reset (a close
# with unread bytes after write_eof), nothing leaves RESET.
_TRANSITIONS = {
    ChannelState.OPEN: frozenset({ChannelState.EOF, ChannelState.RESET, ChannelState.TCP}),
    ChannelState.EOF: frozenset({ChannelState.RESET, ChannelState.TCP}),
    ChannelState.RESET: frozenset(),
    ChannelState.TCP: frozenset(),
}


# The states and sightings as module globals, for the hot paths here and in
# the adapters (per write, per read): on 3.11 an enum's class attribute costs
# some 100 ns (its metaclass's __getattr__ hook slows every lookup on the
# class), a global a tenth of that.
CHANNEL_OPEN, CHANNEL_EOF = ChannelState.OPEN, ChannelState.EOF
CHANNEL_RESET, CHANNEL_TCP = ChannelState.RESET, ChannelState.TCP
SEEN_DATA, SEEN_NOTHING, SEEN_EOF = Seen.DATA, Seen.NOTHING, Seen.EOF
SEEN_RESET, SEEN_TCP = Seen.RESET, Seen.TCP

# What a channel nobody has written to holds instead of a deque (an empty
# deque is some 600 bytes): empty, iterable, never appended to.
_NO_QUEUE: Tuple[bytes, ...] = ()


class Channel:
    """One direction of a friend link."""

    __slots__ = (
        "_queue",
        "_head_offset",
        "queued",
        "moved",
        "meter",
        "sndbuf",
        "rcvbuf",
        "state",
        "reader_closed",
        "reset_after_fin",
        "closed_with_backlog",
        "notify_readable",
        "notify_writable",
        "_reader_notified",
        "_writer_wake_at",
        "reader_thread",
    )

    def __init__(self, sndbuf: int, rcvbuf: int, meter: Optional[Shard] = None) -> None:
        # No deque until the first write: an idle direction (most of them,
        # in a process holding many idle connections) costs nothing.
        self._queue: Deque[bytes] = _NO_QUEUE  # type: ignore[assignment]
        self._head_offset = 0  # bytes of _queue[0] already consumed
        self.queued = 0
        self.moved = 0  # bytes consumed over the channel's life
        # Counts the bytes consumed: the reader's thread's counters shard
        # (set again when the reader attaches, maybe on another thread).
        self.meter = meter or counters.shard()
        self.sndbuf = sndbuf
        self.rcvbuf = rcvbuf
        self.state = CHANNEL_OPEN
        self.reader_closed = False
        # The reset came after the FIN had reached the reader's receive
        # buffer: the kernel reports EPIPE then, and the reader still reads
        # the bytes and EOF (tcp_reset() in CLOSE_WAIT).
        self.reset_after_fin = False
        # The reader went away while the writer had bytes beyond sndbuf +
        # rcvbuf, its own buffer: over TCP that pending send fails.
        self.closed_with_backlog = False
        self.notify_readable: Hook = None
        self.notify_writable: Hook = None
        self._reader_notified = False
        self._writer_wake_at: Optional[int] = None
        self.reader_thread: Optional[threading.Thread] = None  # where the reader attached

    def __repr__(self) -> str:
        return (
            f"<Channel {self.state.value} queued={self.queued} "
            f"sndbuf={self.sndbuf} rcvbuf={self.rcvbuf}"
            f"{' reader-closed' if self.reader_closed else ''}>"
        )

    # -- accounting -------------------------------------------------------
    @property
    def capacity(self) -> int:
        return self.sndbuf + self.rcvbuf

    def write_buffer_size(self) -> int:
        """Bytes beyond ``sndbuf + friend rcvbuf``: the writer's own buffer."""
        over = self.queued - self.sndbuf - self.rcvbuf
        return over if over > 0 else 0

    # -- writer side ------------------------------------------------------
    def push(self, data: bytes) -> None:
        """Queue ``data`` (taken by reference: the caller passes ``bytes``)."""
        if self.state is not CHANNEL_OPEN or self.reader_closed:
            self._refuse_push()
        queue = self._queue
        if queue is _NO_QUEUE:
            queue = self._queue = collections.deque()
        queue.append(data)
        self.queued += len(data)
        if not self._reader_notified and self.notify_readable is not None:
            self._reader_notified = True
            self.notify_readable()

    def _refuse_push(self) -> NoReturn:
        if self.state is not CHANNEL_OPEN:
            raise ChannelShutdownError("the writing end was shut down")
        raise PeerResetError("the reading end is closed")

    def attach_reader(self, hook: Hook) -> bool:
        """Install ``notify_readable``; True when something already waits
        (the caller drains: no notification is sent for it)."""
        self.notify_readable = hook
        self.meter = counters.shard()
        self.reader_thread = threading.current_thread()
        if self.queued or self.state is not CHANNEL_OPEN:
            self._reader_notified = True
            return True
        return False

    def attach_writer(self, hook: Hook) -> None:
        self.notify_writable = hook

    def wake_writer_at(self, threshold: Optional[int]) -> bool:
        """Ask for ``notify_writable`` once ``queued - capacity <= threshold``
        (relative to the capacity, so a ``setsockopt`` moves it too): 0 once
        the writer's own buffer is empty, -1 once a byte more fits (a
        socket's writability).

        Returns True (and asks nothing) when that already holds.
        """
        if threshold is not None and self.queued - self.sndbuf - self.rcvbuf <= threshold:
            self._writer_wake_at = None
            return True
        self._writer_wake_at = threshold
        return False

    def shutdown(self) -> bool:
        """EOF after the bytes already queued (once: a direction shut, or
        reset, stays so). False, nothing changed, when the connection went
        on over TCP (:meth:`hand_over`, on another thread): the EOF is the
        writer's socket's to send."""
        state = self.state
        if state is CHANNEL_TCP:
            return False
        if state is CHANNEL_OPEN:
            self._move(CHANNEL_EOF)
            self._notify_reader()
        return True

    def truncate(self, keep: int) -> None:
        """Drop queued bytes beyond the first ``keep`` (an abort's loss)."""
        if self.queued <= keep:
            return
        excess = self.queued - keep
        while excess:
            tail = self._queue[-1]
            usable = len(tail) - (self._head_offset if len(self._queue) == 1 else 0)
            if usable <= excess:
                self._queue.pop()
                excess -= usable
                self.queued -= usable
                if not self._queue:
                    self._head_offset = 0
            else:
                self._queue[-1] = tail[: len(tail) - excess]
                self.queued -= excess
                excess = 0

    def reset(self, keep: int) -> None:
        """A TCP reset: the reader gets at most ``keep`` more bytes, then the
        error (the kernel drops the sender's queue, keeps the receiver's)."""
        if self.state is CHANNEL_RESET:
            return
        self.reset_after_fin = self.state is CHANNEL_EOF and self.queued <= self.rcvbuf
        Channel.truncate(self, keep)  # not the locked override: we hold the lock
        self._move(CHANNEL_RESET)
        self._notify_reader()

    # -- reader side ------------------------------------------------------
    def seen(self) -> Seen:
        """What the reader finds now.

        The state is read before the count: a writer on another thread sets
        EOF/RESET after its last push, so EOF never overtakes bytes. A reset
        that came after the FIN had reached the reader's receive buffer
        leaves the FIN readable (tcp_reset() in CLOSE_WAIT): the reader gets
        EOF, and the reset shows on its next send.
        """
        state = self.state
        if self.queued:
            return SEEN_DATA
        if state is CHANNEL_OPEN:
            return SEEN_NOTHING
        if state is CHANNEL_TCP:
            return SEEN_TCP
        if state is CHANNEL_RESET and not self.reset_after_fin:
            return SEEN_RESET
        return SEEN_EOF

    def begin_drain(self) -> None:
        """The reader is draining: the next push must notify it again."""
        self._reader_notified = False

    def synced(self, show: Callable[[bool], None]) -> None:
        """``show(readable)``: whether the reader finds something now (bytes,
        EOF, a reset), with no push nor pull in between (the lock, on a
        locked channel). A readiness descriptor kept so never shows a
        writer's notice that arrives after the reader took its bytes."""
        show(self.seen() is not SEEN_NOTHING)

    def begin_pull(self, limit: int, join_limit: Optional[int] = None) -> Tuple[bytes, int]:
        """``begin_drain()``, then ``pull()`` if anything is queued (one
        lock round trip for both on a locked channel). Returns the bytes
        and the drain's budget beyond them: what was queued as the drain
        began, less what they took (``b"", 0`` when nothing was)."""
        self._reader_notified = False
        queued = self.queued
        if not queued:
            return b"", 0
        queue = self._queue
        if queued <= limit and len(queue) == 1 and not self._head_offset:
            # One whole buffer (request/response): pull() and _consumed(), inlined.
            first = queue.popleft()
            self.queued = 0
            self.moved += queued
            self.meter.moved += queued
            wake_at = self._writer_wake_at
            if wake_at is not None and -self.sndbuf - self.rcvbuf <= wake_at:
                self._writer_wake_at = None
                self._wake_writer()
            return (first if type(first) is bytes else bytes(first)), 0
        data = self.pull(limit, join_limit)
        return data, queued - len(data)

    def pull(self, limit: int, join_limit: Optional[int] = None) -> bytes:
        """Up to ``limit`` bytes: whole buffers by reference where they fit,
        a larger one in ``limit``-sized pieces. A TCP read never returns more
        than it asked for, and readers' flow control (a StreamReader pausing
        at its limit) relies on that. Small buffers are joined while the
        result stays within ``join_limit`` (default ``limit``): joining
        saves callbacks, but copying large buffers costs more than it saves.
        """
        queue = self._queue
        first = queue[0]
        start = self._head_offset
        size = len(first) - start
        if size > limit:
            self._head_offset = start + limit
            self._consumed(limit)
            return first[start:start + limit]
        queue.popleft()
        if start:
            self._head_offset = 0
            first = first[start:]
        if join_limit is None or join_limit > limit:
            join_limit = limit
        if not queue or size + len(queue[0]) > join_limit:
            # One buffer, by reference (the common case): _consumed(), inlined.
            self.queued = queued = self.queued - size
            self.moved += size
            self.meter.moved += size
            wake_at = self._writer_wake_at
            if wake_at is not None and queued - self.sndbuf - self.rcvbuf <= wake_at:
                self._writer_wake_at = None
                self._wake_writer()
            return first if type(first) is bytes else bytes(first)
        chunks = [first]
        while queue and size + len(queue[0]) <= join_limit:
            chunk = queue.popleft()
            chunks.append(chunk)
            size += len(chunk)
        self._consumed(size)
        return b"".join(chunks)

    def pull_into(self, buffer: memoryview) -> int:
        """Copy queued bytes into ``buffer``; returns how many."""
        queue = self._queue
        room = len(buffer)
        copied = 0
        while queue and copied < room:
            head = queue[0]
            start = self._head_offset
            take = min(len(head) - start, room - copied)
            buffer[copied:copied + take] = head[start:start + take]
            copied += take
            if start + take == len(head):
                queue.popleft()
                self._head_offset = 0
            else:
                self._head_offset = start + take
        self._consumed(copied)
        return copied

    def peek(self, limit: int) -> bytes:
        """Up to ``limit`` queued bytes, left queued (a ``MSG_PEEK`` read)."""
        chunks = []
        size = 0
        start = self._head_offset
        for chunk in self._queue:
            piece = chunk[start:start + limit - size]
            start = 0
            chunks.append(piece)
            size += len(piece)
            if size >= limit:
                break
        return b"".join(chunks)

    def close_reader(self) -> bool:
        """The reader is gone. Returns whether unread bytes were discarded
        (over TCP, closing with unread bytes sends a reset)."""
        had_unread = self._discard_unread()
        if self.notify_writable is not None:
            self.notify_writable()
        return had_unread

    def _discard_unread(self) -> bool:
        had_unread = self.queued > 0
        self.closed_with_backlog = self.queued > self.sndbuf + self.rcvbuf
        self.reader_closed = True
        self._queue = _NO_QUEUE  # type: ignore[assignment]
        self._head_offset = 0
        self.queued = 0
        self._writer_wake_at = None
        return had_unread

    def capacity_changed(self) -> None:
        """A buffer size changed: wake a writer whose threshold now holds."""
        self._consumed(0)

    def hand_over(self) -> Tuple[bytes, bool]:
        """The connection goes on over TCP (:meth:`Link.hand_over`, which
        holds the lock): the bytes still queued, which the writer's socket
        sends before anything else, and whether its EOF follows them."""
        data = Channel.peek(self, self.queued)
        eof = self.state is CHANNEL_EOF
        self._queue = _NO_QUEUE  # type: ignore[assignment]
        self._head_offset = 0
        self.queued = 0
        self._writer_wake_at = None
        self._move(CHANNEL_TCP)
        return data, eof

    def after_hand_over(self) -> None:
        """Returns once a hand-over (:meth:`Link.hand_over`) has put what was
        queued on the socket: the writer's own sends come after it."""

    # -- internals --------------------------------------------------------
    def _consumed(self, size: int) -> None:
        self.queued -= size
        self.moved += size
        self.meter.moved += size  # counted per read, not per write: cheaper
        wake_at = self._writer_wake_at
        if wake_at is not None and self.queued - self.sndbuf - self.rcvbuf <= wake_at:
            self._writer_wake_at = None
            self._wake_writer()

    def _wake_writer(self) -> None:
        if self.notify_writable is not None:
            self.notify_writable()

    def _notify_reader(self) -> None:
        if self.notify_readable is not None:
            self._reader_notified = True
            self.notify_readable()

    def _move(self, state: ChannelState) -> None:
        if state not in _TRANSITIONS[self.state]:
            raise ChannelShutdownError(
                f"channel cannot go from {self.state.value} to {state.value}"
            )
        self.state = state


class LockedChannel(Channel):
    """A channel whose writer and reader run on different threads.

    Each change happens under the channel's lock, so neither side ever sees
    the queue, the byte count or a threshold half-changed, and a wake-up
    cannot be lost: the writer's "append, then notify unless already
    notified" and the reader's "clear the flag, then look" are each atomic,
    as are "set the threshold, then check it" and "consume, then check the
    threshold". The hooks run after the lock is released: they hand a
    callback to the other side's loop, and one that finds that loop gone
    tears the link down, which takes the lock again.
    """

    __slots__ = ("_lock", "_read_due", "_write_due")

    def __init__(self, sndbuf: int, rcvbuf: int, meter: Optional[Shard] = None) -> None:
        super().__init__(sndbuf, rcvbuf, meter)
        self._lock = threading.Lock()
        self._read_due = False  # set and cleared by the writer's thread only
        self._write_due = False  # set and cleared by the reader's thread only

    # The per-write and per-drain paths (push, begin_pull, pull) take the
    # lock with acquire()/release() rather than ``with``, which makes two
    # bound methods per use: some 70 ns, paid about a dozen times (with the
    # loop's remote queue) per request/response across threads.

    # -- writer side ------------------------------------------------------
    def push(self, data: bytes) -> None:
        lock = self._lock
        lock.acquire()
        try:
            if self.state is not CHANNEL_OPEN or self.reader_closed:
                self._refuse_push()
            queue = self._queue
            if queue is _NO_QUEUE:
                queue = self._queue = collections.deque()
            queue.append(data)
            self.queued += len(data)
            hook = self.notify_readable
            if self._reader_notified or hook is None:
                return
            self._reader_notified = True
        finally:
            lock.release()
        hook()

    def attach_writer(self, hook: Hook) -> None:
        with self._lock:
            self.notify_writable = hook

    def wake_writer_at(self, threshold: Optional[int]) -> bool:
        with self._lock:
            return Channel.wake_writer_at(self, threshold)

    def shutdown(self) -> bool:
        with self._lock:
            shut = Channel.shutdown(self)
        self._flush_reader()
        return shut

    def truncate(self, keep: int) -> None:
        with self._lock:
            Channel.truncate(self, keep)

    def after_hand_over(self) -> None:
        with self._lock:  # held by the hand-over while it sends
            pass

    def reset(self, keep: int) -> None:
        with self._lock:
            Channel.reset(self, keep)
        self._flush_reader()

    # -- reader side ------------------------------------------------------
    def attach_reader(self, hook: Hook) -> bool:
        with self._lock:
            return Channel.attach_reader(self, hook)

    def begin_drain(self) -> None:
        with self._lock:
            self._reader_notified = False

    def synced(self, show: Callable[[bool], None]) -> None:
        with self._lock:
            Channel.synced(self, show)

    def begin_pull(self, limit: int, join_limit: Optional[int] = None) -> Tuple[bytes, int]:
        lock = self._lock
        lock.acquire()
        try:
            self._reader_notified = False
            queued = self.queued
            if not queued:
                return b"", 0
            data = Channel.pull(self, limit, join_limit)
        finally:
            lock.release()
        if self._write_due:
            self._flush_writer()
        return data, queued - len(data)

    def pull(self, limit: int, join_limit: Optional[int] = None) -> bytes:
        """As :meth:`Channel.pull`; b"" when the bytes the reader saw were
        handed over to TCP before it took them (it looks again: TCP)."""
        lock = self._lock
        lock.acquire()
        try:
            data = Channel.pull(self, limit, join_limit) if self.queued else b""
        finally:
            lock.release()
        if self._write_due:
            self._flush_writer()
        return data

    def pull_into(self, buffer: memoryview) -> int:
        with self._lock:
            copied = Channel.pull_into(self, buffer)
        if self._write_due:
            self._flush_writer()
        return copied

    def peek(self, limit: int) -> bytes:
        with self._lock:
            return Channel.peek(self, limit)

    def close_reader(self) -> bool:
        with self._lock:
            had_unread = self._discard_unread()
        hook = self.notify_writable
        if hook is not None:
            hook()
        return had_unread

    def capacity_changed(self) -> None:
        with self._lock:
            Channel.capacity_changed(self)
        self._flush_writer()

    # -- internals: hooks are only noted under the lock ------------------
    def _wake_writer(self) -> None:
        self._write_due = True

    def _notify_reader(self) -> None:
        if self.notify_readable is not None:
            self._reader_notified = True
            self._read_due = True

    def _flush_reader(self) -> None:
        if self._read_due:
            self._read_due = False
            hook = self.notify_readable
            if hook is not None:
                hook()

    def _flush_writer(self) -> None:
        if self._write_due:
            self._write_due = False
            hook = self.notify_writable
            if hook is not None:
                hook()


# LinkEnd.fin_owed once the end's real socket sent its FIN.
FIN_SHOWN: Any = object()


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
                 "over_tcp", "fd_hidden", "fin_owed", "error_taken")

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
        # the link is handed over (Link.hand_over): gives that socket and
        # the switch to it (see friendsock._blocking's _hand_over); None:
        # it cannot.
        self.over_tcp: Optional[Callable[[], Optional[Tuple[Any, Callable[[], None]]]]] = None
        # Its real socket is friendsock's own, and its descriptor was never
        # asked for: nobody can poll it (see fin_to_show).
        self.fd_hidden = False
        # Our real socket's FIN (the end done writing): the socket, while
        # the friend's descriptor is hidden and the FIN waits for it to be
        # asked for (reveal); FIN_SHOWN once sent.
        self.fin_owed: Any = None
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
        if self.fin_owed is FIN_SHOWN:
            return False
        friend = self.link.friend_of(self)
        if friend is None or friend.closed:
            return False
        if friend.fd_hidden or friend.outgoing.notify_writable is None:
            self.fin_owed = sock
            return False
        self.fin_owed = FIN_SHOWN
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
        sock = friend.fin_owed
        if sock is None or sock is FIN_SHOWN:
            return None
        friend.fin_owed = FIN_SHOWN
        return sock

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
        return LinkBrokenError(errno.EPIPE if incoming.reset_after_fin else errno.ECONNRESET)

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
            out.after_hand_over()
            return -1
        if out.state is CHANNEL_RESET or self.incoming.state is CHANNEL_RESET:
            raise self.send_error()
        if out.state is not CHANNEL_OPEN:
            raise LinkBrokenError(errno.EPIPE)
        if not data:  # checked as any send is, and sends nothing
            return 0
        room = out.sndbuf + out.rcvbuf - out.queued
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
        friend's reset the socket is closed, and shutdown fails ENOTCONN.
        False when the connection went on over TCP (:meth:`Link.hand_over`,
        maybe while this call began): the shutdown is the socket's own, to
        make now that the hand-over has sent what was queued."""
        if self.incoming.state is CHANNEL_RESET:
            raise LinkBrokenError(errno.ENOTCONN)
        out = self.outgoing
        if out.state is CHANNEL_OPEN or out.state is CHANNEL_TCP:
            # (Under the channel's lock: a hand-over under way has sent
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
            self.reset(keep=self.outgoing.rcvbuf)
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

    def reset(self, keep: int = 0) -> bool:
        """Close with a reset whatever is unread: the friend gets at most
        ``keep`` more bytes, then the error. ``keep=0``: a listener closed
        with this connection still in its backlog; the friend's ``rcvbuf``:
        the end went away at once (its loop closed), as a process that dies.
        Returns False when the end was already closed."""
        if not self.link._claim_close(self):
            return False
        self.outgoing.reset(keep=keep)
        self.incoming.close_reader()
        self.link._end_closed()
        return True


def _may_hand_over(client: LinkEnd, server: LinkEnd, limit: int) -> bool:
    """:meth:`Link.hand_over`'s conditions: an end open, or closed with its
    EOF sent (a close over unread bytes reset the friend's direction; one
    still under way, on another thread, has not sent its EOF yet); no
    direction reset, none holding more than ``limit`` bytes."""
    if client.closed and server.closed:
        return False
    for end in (client, server):
        channel = end.outgoing
        if channel.state not in (CHANNEL_OPEN, CHANNEL_EOF) or channel.queued > limit:
            return False
        if channel.queued and end.fin_owed is FIN_SHOWN:  # its bytes cannot follow its FIN
            return False
        if end.closed and not (channel.state is CHANNEL_EOF and end.incoming.reader_closed):
            return False
    return True


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

    def can_hand_over(self, limit: int) -> bool:
        """Whether :meth:`hand_over` would go ahead now (it checks again,
        under the locks)."""
        client, server = self.client, self.server
        return client is not None and server is not None and \
            _may_hand_over(client, server, limit)

    def hand_over(self, send: Callable[[LinkEnd, bytes, bool], None], limit: int,
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
        is not handed over.)

        ``first``: the end handed over first, before its reader can find
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
            if not _may_hand_over(client, server, limit):
                return False
            for end in (ends if first is not server else (server, client)):
                data, eof = end.outgoing.hand_over()
                if eof:
                    shown, end.fin_owed = end.fin_owed is FIN_SHOWN, FIN_SHOWN
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
        """In a forked child, a link not handed over (:meth:`hand_over`): its
        other end is the parent's, its copy here nobody's. Both directions
        are reset, so this child's ends fail at once instead of waiting
        forever; nothing is notified (whoever waits on them is the
        parent's), and every lock is new (another thread may have held one
        at the fork)."""
        if self.client is None or self.server is None:  # done: nothing left to cut off
            return
        if self._lock is not None:
            self._lock = threading.Lock()
        for channel in (self.client.outgoing, self.server.outgoing):
            if isinstance(channel, LockedChannel):
                channel._lock = threading.Lock()
            channel.notify_readable = channel.notify_writable = None
            channel._queue = _NO_QUEUE  # type: ignore[assignment]
            channel._head_offset = 0
            channel.queued = 0
            channel._writer_wake_at = None
            channel.reset_after_fin = False
            channel.state = CHANNEL_RESET

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
