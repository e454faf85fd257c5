"""Channels: one direction of a friend link each, and their accounting.

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
uses a ``LockedChannel`` (``_locked_channel``): one writer thread and one reader thread per
channel, every change under a small lock, the hooks called after it is
released."""

from __future__ import annotations

import collections
import enum
import threading
from typing import Callable, Deque, NoReturn, Optional, Tuple

from ._errors import ChannelShutdownError, PeerResetError
from ._stats import Shard, counters

Hook = Optional[Callable[[], None]]


class ChannelState(enum.Enum):
    OPEN = "open"  # the writer may write
    EOF = "eof"  # the writer shut down; the reader gets EOF after the bytes
    RESET = "reset"  # the reader gets a reset after the bytes kept
    TCP = "tcp"  # the connection went on over TCP (Link.go_on_over_tcp): ends use their sockets

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

    def room(self) -> int:
        """What the writer may still queue before its own buffer grows:
        ``sndbuf + friend rcvbuf - queued`` (negative once it has)."""
        return self.sndbuf + self.rcvbuf - self.queued

    def write_buffer_size(self) -> int:
        """Bytes beyond ``sndbuf + friend rcvbuf``: the writer's own buffer."""
        over = -self.room()
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
        on over TCP (:meth:`go_on_over_tcp`, on another thread): the EOF is the
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
        self.closed_with_backlog = self.room() < 0
        self.reader_closed = True
        self._queue = _NO_QUEUE  # type: ignore[assignment]
        self._head_offset = 0
        self.queued = 0
        self._writer_wake_at = None
        return had_unread

    def capacity_changed(self) -> None:
        """A buffer size changed: wake a writer whose threshold now holds."""
        self._consumed(0)

    def take_for_tcp(self) -> Tuple[bytes, bool]:
        """The connection goes on over TCP (:meth:`Link.go_on_over_tcp`, which
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

    def after_over_tcp(self) -> None:
        """Returns once a move to TCP (:meth:`Link.go_on_over_tcp`) has put what was
        queued on the socket: the writer's own sends come after it."""

    # -- internals --------------------------------------------------------
    def cut_off(self) -> None:
        """In a forked child, for a link whose other end is the parent's
        (``Link.forked_away``): reset, empty, and nobody to notify."""
        self.notify_readable = self.notify_writable = None
        self._queue = _NO_QUEUE  # type: ignore[assignment]
        self._head_offset = self.queued = 0
        self._writer_wake_at = None
        self.reset_after_fin = False
        self.state = CHANNEL_RESET

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
