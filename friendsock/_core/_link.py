"""Friend links: two channels, their accounting, EOF and reset.

A *channel* is one direction of a link: the bytes one end wrote and the other
has not consumed yet. Its accounting mirrors the kernel's ``sk_friend``:
the writer's capacity before its own buffer grows is ``sndbuf + rcvbuf``
(its own send buffer plus the friend's receive buffer), and ``queued`` is at
once the reader's ``rmem_alloc`` and the writer's ``wmem_queued``.

An adapter supplies two hooks per channel: ``notify_readable`` (called once
per burst: the reader must drain) and ``notify_writable`` (the writer asked to
be woken when the queue falls to a threshold, or the reader went away).
"""

from __future__ import annotations

import collections
import enum
from typing import Callable, Deque, Optional

from ._errors import ChannelShutdownError, PeerResetError
from ._stats import counters

Hook = Optional[Callable[[], None]]


class ChannelState(enum.Enum):
    OPEN = "open"  # the writer may write
    EOF = "eof"  # the writer shut down; the reader gets EOF after the bytes
    RESET = "reset"  # the reader gets a reset after the bytes kept


# The only moves a channel makes: EOF may still turn into a reset (a close
# with unread bytes after write_eof), nothing leaves RESET.
_TRANSITIONS = {
    ChannelState.OPEN: frozenset({ChannelState.EOF, ChannelState.RESET}),
    ChannelState.EOF: frozenset({ChannelState.RESET}),
    ChannelState.RESET: frozenset(),
}


class Channel:
    """One direction of a friend link."""

    __slots__ = (
        "_queue",
        "_head_offset",
        "queued",
        "sndbuf",
        "rcvbuf",
        "state",
        "reader_closed",
        "notify_readable",
        "notify_writable",
        "_reader_notified",
        "_writer_wake_at",
    )

    def __init__(self, sndbuf: int, rcvbuf: int) -> None:
        self._queue: Deque[bytes] = collections.deque()
        self._head_offset = 0  # bytes of _queue[0] already consumed
        self.queued = 0
        self.sndbuf = sndbuf
        self.rcvbuf = rcvbuf
        self.state = ChannelState.OPEN
        self.reader_closed = False
        self.notify_readable: Hook = None
        self.notify_writable: Hook = None
        self._reader_notified = False
        self._writer_wake_at: Optional[int] = None

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
        if self.state is not ChannelState.OPEN:
            raise ChannelShutdownError("the writing end was shut down")
        if self.reader_closed:
            raise PeerResetError("the reading end is closed")
        self._queue.append(data)
        self.queued += len(data)
        if not self._reader_notified and self.notify_readable is not None:
            self._reader_notified = True
            self.notify_readable()

    def wake_writer_at(self, threshold: Optional[int]) -> bool:
        """Ask for ``notify_writable`` once ``write_buffer_size() <= threshold``
        (relative to the capacity, so a ``setsockopt`` moves it too).

        Returns True (and asks nothing) when that already holds.
        """
        if threshold is not None and self.write_buffer_size() <= threshold:
            self._writer_wake_at = None
            return True
        self._writer_wake_at = threshold
        return False

    def shutdown(self) -> None:
        """EOF after the bytes already queued."""
        self._move(ChannelState.EOF)
        self._notify_reader()

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
        if self.state is ChannelState.RESET:
            return
        self.truncate(keep)
        self._move(ChannelState.RESET)
        self._notify_reader()

    # -- reader side ------------------------------------------------------
    def begin_drain(self) -> None:
        """The reader is draining: the next push must notify it again."""
        self._reader_notified = False

    def pull(self, limit: int, join_limit: Optional[int] = None) -> bytes:
        """Up to ``limit`` bytes: whole buffers by reference where they fit,
        a larger one in ``limit``-sized pieces. A TCP read never returns more
        than it asked for, and readers' flow control (a StreamReader pausing
        at its limit) relies on that. Small buffers are joined while the
        result stays within ``join_limit`` (default ``limit``): joining
        saves callbacks, but copying large buffers costs more than it saves.
        """
        queue = self._queue
        head = queue[0]
        start = self._head_offset
        if len(head) - start > limit:
            self._head_offset = start + limit
            self._consumed(limit)
            return head[start:start + limit]
        queue.popleft()
        self._head_offset = 0
        first = head[start:] if start else head
        size = len(first)
        if join_limit is None or join_limit > limit:
            join_limit = limit
        if not queue or size + len(queue[0]) > join_limit:
            self._consumed(size)
            return bytes(first)
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

    def close_reader(self) -> bool:
        """The reader is gone. Returns whether unread bytes were discarded
        (over TCP, closing with unread bytes sends a reset)."""
        had_unread = self.queued > 0
        self.reader_closed = True
        self._queue.clear()
        self._head_offset = 0
        self.queued = 0
        self._writer_wake_at = None
        if self.notify_writable is not None:
            self.notify_writable()
        return had_unread

    def capacity_changed(self) -> None:
        """A buffer size changed: wake a writer whose threshold now holds."""
        self._consumed(0)

    # -- internals --------------------------------------------------------
    def _consumed(self, size: int) -> None:
        self.queued -= size
        counters.bytes_moved += size  # counted per read, not per write: cheaper
        wake_at = self._writer_wake_at
        if wake_at is not None and self.queued - self.sndbuf - self.rcvbuf <= wake_at:
            self._writer_wake_at = None
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


class LinkEnd:
    """One end of a link: what it writes (``outgoing``) and reads (``incoming``)."""

    __slots__ = ("link", "outgoing", "incoming", "closed")

    def __init__(self, link: "Link", outgoing: Channel, incoming: Channel) -> None:
        self.link = link
        self.outgoing = outgoing
        self.incoming = incoming
        self.closed = False

    def shutdown_write(self) -> None:
        """``write_eof()``: EOF after what was written."""
        if self.outgoing.state is ChannelState.OPEN:
            self.outgoing.shutdown()

    def close(self) -> None:
        """The end is done (its socket would be closed now).

        With unread incoming bytes the kernel answers with a reset, which
        keeps only what already sits in the friend's receive buffer;
        otherwise the friend gets the rest, then EOF.
        """
        if self.closed:
            return
        self.closed = True
        out = self.outgoing
        if self.incoming.close_reader():
            out.reset(keep=out.rcvbuf)
        elif out.state is ChannelState.OPEN:
            out.shutdown()
        self.link._end_closed()

    def abort(self) -> None:
        """``abort()``: what fits in ``sndbuf + friend rcvbuf`` is kept."""
        self.outgoing.truncate(self.outgoing.capacity)
        self.close()

    def reset(self) -> None:
        """Close with a reset whatever is unread (a listener that closed
        with this connection still in its backlog)."""
        if self.closed:
            return
        self.closed = True
        self.incoming.close_reader()
        self.outgoing.reset(keep=0)
        self.link._end_closed()


class Link:
    """Two channels and two ends: ``client`` and ``server``."""

    __slots__ = ("client", "server", "_open_ends", "established", "on_done")

    def __init__(
        self,
        client_sndbuf: int,
        client_rcvbuf: int,
        server_sndbuf: int,
        server_rcvbuf: int,
    ) -> None:
        to_server = Channel(sndbuf=client_sndbuf, rcvbuf=server_rcvbuf)
        to_client = Channel(sndbuf=server_sndbuf, rcvbuf=client_rcvbuf)
        self.client = LinkEnd(self, outgoing=to_server, incoming=to_client)
        self.server = LinkEnd(self, outgoing=to_client, incoming=to_server)
        self._open_ends = 2
        self.established = False
        # Called once both ends are closed: the adapter releases the sockets.
        self.on_done: Hook = None

    def establish(self) -> None:
        """Both ends agree this connection is a friend link (counted once)."""
        if not self.established:
            self.established = True
            counters.links_made += 1
            counters.links_alive += 1

    @property
    def done(self) -> bool:
        return self._open_ends == 0

    def _end_closed(self) -> None:
        self._open_ends -= 1
        if self._open_ends == 0:
            if self.established:
                counters.links_alive -= 1
            if self.on_done is not None:
                self.on_done()
