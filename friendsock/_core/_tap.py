"""Capture taps: what a link made while capturing writes to the capture.

A link made while a capture runs gets :class:`TappedChannel` (or
:class:`TappedLockedChannel`) instead of the plain channels, so a link made
without one pays nothing at all. Each tapped channel tells its
:class:`DirectionTap` what changed, after the change, and the tap turns it
into the segments TCP would put on the wire (:mod:`._pcap`), handed to the
capture's sink.

What is on the wire: a byte is sent once it fits in the reader's receive
buffer (its position in the channel below ``rcvbuf``): at once when written
into a link with room, else when the reader makes room. The rest is in the
sender's buffers, which an abort or a reset drops unsent, as TCP does. A
FIN follows the last byte sent; a reset is sent at once, and nothing
follows it. Every event takes the sink's lock, which orders the whole file
and each link's sequence numbers across threads: an acknowledgement never
covers bytes the file does not hold yet.
"""

from __future__ import annotations

import collections
import random
import time
from typing import Any, Deque, List, Optional, Protocol, Tuple

from ._errors import PeerResetError
from ._channel import Channel, ChannelState
from ._locked_channel import LockedChannel
from ._pcap import CLIENT, SERVER, Buffer, TcpFlow
from ._stats import Shard


class Sink(Protocol):
    """Where the records go: a capture file (``friendsock._capture``)."""

    # A threading.RLock, held around every event and its write(): an event
    # may come in while another is built (a collected transport aborts).
    lock: Any
    closed: bool  # once True, taps drop their events

    def write(self, records: List[Buffer]) -> None:
        """Store ``records`` (called under ``lock``; never raises)."""

    def link_captured(self) -> None:
        """A link's handshake was written (called under ``lock``)."""


_sink: Optional[Sink] = None  # the capture that links made now write to


def set_sink(sink: Optional[Sink]) -> None:
    """Links made from now on are captured to ``sink`` (None: not captured)."""
    global _sink
    _sink = sink


def current_sink() -> Optional[Sink]:
    return _sink


def tap_for(client: Any, server: Any) -> Optional["LinkTap"]:
    """A tap for a link from ``client`` to ``server`` (socket addresses) if a
    capture is running, else None (the link is made untouched)."""
    sink = _sink
    if sink is None or sink.closed:
        return None
    return LinkTap(sink, client, server)


class LinkTap:
    """The capture of one link: its TCP flow, written to ``sink``."""

    __slots__ = ("sink", "flow", "opened", "dead")

    def __init__(self, sink: Sink, client: Any, server: Any) -> None:
        self.sink = sink
        self.flow = TcpFlow(client, server, random.getrandbits(32), random.getrandbits(32))
        self.opened = False  # the handshake is written
        self.dead = False  # a reset was written: nothing follows it

    def channels(self, client_sndbuf: int, client_rcvbuf: int, server_sndbuf: int,
                 server_rcvbuf: int, threaded: bool, meter: Shard) -> Tuple[Channel, Channel]:
        """The link's channels, client to server and server to client."""
        kind = TappedLockedChannel if threaded else TappedChannel
        to_server = kind(client_sndbuf, server_rcvbuf, meter)
        to_server.tap = DirectionTap(self, CLIENT)
        to_client = kind(server_sndbuf, client_rcvbuf, meter)
        to_client.tap = DirectionTap(self, SERVER)
        return to_server, to_client

    def established(self) -> None:
        """The link is made: its handshake."""
        with self.sink.lock:
            self._open()

    def _open(self) -> bool:
        """Whether events may be written (the handshake first, once);
        called under the sink's lock."""
        sink = self.sink
        if sink.closed or self.dead:
            return False
        if not self.opened:
            self.opened = True
            sink.write(self.flow.handshake(time.time_ns()))
            sink.link_captured()
        return True


class StreamTap:
    """The capture of a link to another process of this host, as this
    process's end sees it (``sender`` below: ``CLIENT`` or ``SERVER``):
    each side's bytes once this end handed them on or read them, each FIN
    and reset as this end learns of it. The other process may capture the
    same link into a file of its own."""

    __slots__ = ("link", "finished")

    def __init__(self, link: LinkTap) -> None:
        self.link = link
        self.finished = [False, False]  # a FIN or reset written, per sender
        link.established()

    def data(self, sender: int, data: Buffer) -> None:
        link = self.link
        with link.sink.lock:
            if link._open() and not self.finished[sender]:
                link.sink.write(link.flow.data(sender, data, time.time_ns()))

    def fin(self, sender: int) -> None:
        link = self.link
        with link.sink.lock:
            if link._open() and not self.finished[sender]:
                self.finished[sender] = True
                link.sink.write(link.flow.fin(sender, time.time_ns()))

    def reset(self, sender: int) -> None:
        link = self.link
        with link.sink.lock:
            if link._open():
                link.dead = True
                link.sink.write(link.flow.reset(sender, time.time_ns()))


def stream_tap_for(client: Any, server: Any) -> Optional[StreamTap]:
    """A tap for a link to another process, from ``client`` to ``server``
    (socket addresses), if a capture is running, else None."""
    link = tap_for(client, server)
    return None if link is None else StreamTap(link)


class DirectionTap:
    """What one channel's writer put on the wire, and what it holds back.

    ``pending``: bytes written but not sent yet (the channel's tail), as
    views of the written buffers.
    """

    __slots__ = ("link", "sender", "pending", "pending_bytes", "fin_pending")

    def __init__(self, link: LinkTap, sender: int) -> None:
        self.link = link
        self.sender = sender
        self.pending: Deque[memoryview] = collections.deque()
        self.pending_bytes = 0
        self.fin_pending = False  # shut down while bytes were held back

    # Each event below runs after the channel's own change, under the
    # sink's lock; reading the channel's counters unlocked is enough: the
    # later of a writer's and a reader's event sees both changes.
    def pushed(self, channel: Channel, data: bytes) -> None:
        link = self.link
        with link.sink.lock:
            if not link._open():
                return
            self.pending.append(memoryview(data))
            self.pending_bytes += len(data)
            self._send(channel)

    def refused(self, data: bytes) -> None:
        """A write to a reader that is gone. Unless the link was reset
        already, TCP sends it, and the friend answers with a reset (no
        acknowledgement): see ``LinkEnd.send_refused``."""
        link = self.link
        with link.sink.lock:
            if link._open():
                link.sink.write(link.flow.data(self.sender, data, time.time_ns(), acked=False))

    def room_made(self, channel: Channel) -> None:
        """The reader consumed, or the receive buffer grew: send what fits."""
        link = self.link
        with link.sink.lock:
            if link._open():
                self._send(channel)

    def shut(self, channel: Channel) -> None:
        """The writer shut down: a FIN once everything before it is sent."""
        link = self.link
        with link.sink.lock:
            if not link._open():
                return
            self.fin_pending = True
            self._send(channel)

    def trimmed(self, dropped: int) -> None:
        """The channel lost its newest ``dropped`` bytes (an abort's loss,
        or the reader went away): what was held back of them is never sent."""
        with self.link.sink.lock:
            self._drop_tail(dropped)

    def reset(self, channel: Channel, dropped: int) -> None:
        """The writer's end reset the link, and the channel lost its newest
        ``dropped`` bytes: what the reader still gets is sent (it sits in
        its receive buffer), the rest never is; a RST, then nothing more."""
        link = self.link
        with link.sink.lock:
            if not link._open():
                return
            self._drop_tail(dropped)
            self._send(channel)
            self._drop_tail(self.pending_bytes)
            self.fin_pending = False
            link.dead = True
            link.sink.write(link.flow.reset(self.sender, time.time_ns()))

    # -- under the sink's lock -------------------------------------------------
    def _send(self, channel: Channel) -> None:
        """Send held-back bytes that now fit in the reader's receive
        buffer, then the FIN if it waits for nothing more."""
        pending = self.pending
        room = channel.rcvbuf - (channel.queued - self.pending_bytes)
        if pending and room > 0:
            records: List[Buffer] = []
            flow = self.link.flow
            now = time.time_ns()
            while pending and room > 0:
                head = pending[0]
                if len(head) <= room:
                    pending.popleft()
                else:
                    pending[0] = head[room:]
                    head = head[:room]
                room -= len(head)
                self.pending_bytes -= len(head)
                records += flow.data(self.sender, head, now)
            self.link.sink.write(records)
        if self.fin_pending and not pending:
            self.fin_pending = False
            link = self.link
            link.sink.write(link.flow.fin(self.sender, time.time_ns()))

    def _drop_tail(self, dropped: int) -> None:
        """The newest ``dropped`` bytes of the channel are gone: those of
        them held back are no longer to send."""
        excess = min(dropped, self.pending_bytes)
        pending = self.pending
        while excess > 0 and pending:
            tail = pending[-1]
            if len(tail) <= excess:
                pending.pop()
            else:
                pending[-1] = tail[:len(tail) - excess]
            cut = min(len(tail), excess)
            excess -= cut
            self.pending_bytes -= cut


class _TapEvents:
    """The channel operations a tap hears of, after the channel's own
    change (mixed into both channel kinds; the ``tap`` slot is theirs)."""

    __slots__ = ()
    tap: DirectionTap

    def push(self, data: bytes) -> None:
        try:
            super().push(data)  # type: ignore[misc]
        except PeerResetError:
            self.tap.refused(data)
            raise
        self.tap.pushed(self, data)  # type: ignore[arg-type]

    def shutdown(self) -> bool:
        was_open = self.state is ChannelState.OPEN  # type: ignore[attr-defined]
        shut: bool = super().shutdown()  # type: ignore[misc]
        if shut and was_open:
            self.tap.shut(self)  # type: ignore[arg-type]
        return shut

    def truncate(self, keep: int) -> None:
        before: int = self.queued  # type: ignore[attr-defined]
        super().truncate(keep)  # type: ignore[misc]
        self.tap.trimmed(before - self.queued)  # type: ignore[attr-defined]

    def reset(self, keep: int) -> None:
        was_reset = self.state is ChannelState.RESET  # type: ignore[attr-defined]
        before: int = self.queued  # type: ignore[attr-defined]
        super().reset(keep)  # type: ignore[misc]
        if not was_reset:
            self.tap.reset(self, before - self.queued)  # type: ignore[arg-type, attr-defined]

    def close_reader(self) -> bool:
        before: int = self.queued  # type: ignore[attr-defined]
        had_unread: bool = super().close_reader()  # type: ignore[misc]
        self.tap.trimmed(before)
        return had_unread

    # The reader's side: only when bytes wait for room.
    def begin_pull(self, limit: int, join_limit: Optional[int] = None) -> Tuple[bytes, int]:
        result: Tuple[bytes, int] = super().begin_pull(limit, join_limit)  # type: ignore[misc]
        if self.tap.pending_bytes:
            self.tap.room_made(self)  # type: ignore[arg-type]
        return result

    def pull(self, limit: int, join_limit: Optional[int] = None) -> bytes:
        data: bytes = super().pull(limit, join_limit)  # type: ignore[misc]
        if self.tap.pending_bytes:
            self.tap.room_made(self)  # type: ignore[arg-type]
        return data

    def pull_into(self, buffer: memoryview) -> int:
        copied: int = super().pull_into(buffer)  # type: ignore[misc]
        if self.tap.pending_bytes:
            self.tap.room_made(self)  # type: ignore[arg-type]
        return copied

    def capacity_changed(self) -> None:
        super().capacity_changed()  # type: ignore[misc]
        if self.tap.pending_bytes:
            self.tap.room_made(self)  # type: ignore[arg-type]


class TappedChannel(_TapEvents, Channel):
    __slots__ = ("tap",)


class TappedLockedChannel(_TapEvents, LockedChannel):
    __slots__ = ("tap",)
