"""The typed snapshot of the live friend links (``friendsock.links()``):
what each end and direction of each link in :data:`live_links` says now,
and of each link to another process of this host in
:data:`live_across` (of which this process holds one end)."""

from __future__ import annotations

import dataclasses
import threading
import time
from typing import Any, List, Optional, Tuple

from ._alive import LiveLinks
from ._channel import Channel
from ._fork import Part, on_fork
from ._link import Link, LinkEnd, live_links
from ._stats import format_address


@dataclasses.dataclass(frozen=True)
class EndInfo:
    """One end of a friend link (see :class:`LinkInfo`).

    ``address``: the end's own socket address; ``sndbuf``/``rcvbuf``: its
    buffer sizes as the link accounts them (the real socket's, following
    ``setsockopt``); ``closed``: the end is done; ``paused_reading``:
    ``pause_reading()`` is in effect (None where the adapter has no such
    state: a trio stream reads when a task receives); ``paused_writing``:
    the writer waits for room (``pause_writing()``, a ``send_all`` blocked);
    ``thread``: the name of the thread the end reads on (None: not reading
    yet); ``scheduler``: its event loop, as its adapter names it.

    An end held by another process (see ``LinkInfo.peer_pid``) shows what
    this process knows of it: its address, its buffers as they were when
    the connection moved off TCP, ``closed`` once its EOF came; its paused
    states, thread and scheduler are None.
    """

    address: Tuple[Any, ...]
    sndbuf: int
    rcvbuf: int
    closed: bool
    paused_reading: Optional[bool]
    paused_writing: Optional[bool]
    thread: Optional[str]
    scheduler: Optional[str]


@dataclasses.dataclass(frozen=True)
class DirectionInfo:
    """One direction of a friend link: ``state`` is ``"open"``, ``"eof"``
    (the writer shut down; the reader gets EOF after the bytes) or
    ``"reset"``; ``queued``: bytes written and not read yet; ``moved``:
    bytes read so far; ``reader_closed``: the reading end is gone.

    Between processes (``LinkInfo.peer_pid``), each side counts at its own
    end. Out of this process: ``queued``, bytes still in its transport's
    buffer; ``moved``, bytes handed on to the kernel (read by the other
    process, or waiting in the kernel for it); ``reader_closed`` False, as
    far as this process can tell. Into it: ``queued``, bytes waiting in its
    socket's receive queue; ``moved``, bytes it read."""

    state: str
    queued: int
    moved: int
    reader_closed: bool


@dataclasses.dataclass(frozen=True)
class LinkInfo:
    """A live friend link, like a line of ``ss -tni`` for friends.

    ``client``/``server``: its ends (:class:`EndInfo`); ``to_server`` and
    ``to_client``: its directions (:class:`DirectionInfo`); ``age``: seconds
    since it was established; ``listener``: the listener address it came
    in on; ``threaded``: its ends run on different threads; ``captured``:
    it is written to a capture (``friendsock.capture``); ``peer_pid``: for
    a link to another process of this host, that process's id (None: both
    ends are this process's).
    """

    client: EndInfo
    server: EndInfo
    to_server: DirectionInfo
    to_client: DirectionInfo
    age: float
    listener: Optional[str]
    threaded: bool
    captured: bool
    peer_pid: Optional[int] = None

    def __str__(self) -> str:
        def end(info: EndInfo) -> str:
            return format_address(tuple(info.address[:2]))

        def flow(info: DirectionInfo) -> str:
            return f"{info.state} queued={info.queued} moved={info.moved}"

        peer = f" peer_pid={self.peer_pid}" if self.peer_pid is not None else ""
        return (f"{end(self.client)} -> {end(self.server)} age={self.age:.1f}s{peer} "
                f"[c->s {flow(self.to_server)}] [s->c {flow(self.to_client)}]")


def _direction(channel: Channel) -> DirectionInfo:
    return DirectionInfo(channel.state.value, channel.queued, channel.moved, channel.reader_closed)


def _end(end: LinkEnd, address: Any) -> EndInfo:
    owner = end.owner
    describe = owner._describe_end if owner is not None else end.describe
    activity = describe() if describe is not None else None
    if activity is None:
        # No adapter word: a writer waiting for room asked to be woken.
        activity = (None, end.outgoing._writer_wake_at is not None, None)
    paused_reading, paused_writing, scheduler = activity
    thread: Optional[threading.Thread] = end.incoming.reader_thread
    return EndInfo(
        address=tuple(address) if address is not None else (),
        sndbuf=end.outgoing.sndbuf,
        rcvbuf=end.incoming.rcvbuf,
        closed=end.closed,
        paused_reading=paused_reading,
        paused_writing=paused_writing,
        thread=thread.name if thread is not None else None,
        scheduler=scheduler,
    )


def _link_info(link: Link, now: float) -> Optional[LinkInfo]:
    """None: the link was done meanwhile (on another thread)."""
    client, server = link.client, link.server
    if client is None or server is None:
        return None
    client_address, server_address = link.addresses or (None, None)
    return LinkInfo(
        client=_end(client, client_address),
        server=_end(server, server_address),
        to_server=_direction(client.outgoing),
        to_client=_direction(server.outgoing),
        age=now - link.born,
        listener=format_address(link.listener) if link.listener is not None else None,
        threaded=link.threaded,
        captured=link.tap is not None,
    )


class AcrossEnd:
    """What an adapter's end of a link to another process answers for
    :func:`snapshot` (its transport, say, registered in :data:`live_across`
    while it is open)."""

    def link_info(self, now: float) -> Optional[LinkInfo]:
        """The link as this end sees it now; None once it is done."""
        raise NotImplementedError


# The ends this process holds of links to other processes (by weak
# reference, as live_links: an abandoned transport's collection closes it).
live_across: "LiveLinks[AcrossEnd]" = LiveLinks()
on_fork(Part.LIVE_ACROSS, after_in_child=live_across._reset_after_fork)


def link_between_processes(*, client_side: bool, own: EndInfo, peer: EndInfo,
                           sent: DirectionInfo, received: DirectionInfo, age: float,
                           listener: Optional[Tuple[str, Any]], peer_pid: int,
                           captured: bool) -> LinkInfo:
    """A link to process ``peer_pid`` as this process's end ``own`` sees
    it: ``client_side``, that end connected; ``sent``/``received``: its
    directions out and in."""
    return LinkInfo(
        client=own if client_side else peer,
        server=peer if client_side else own,
        to_server=sent if client_side else received,
        to_client=received if client_side else sent,
        age=age,
        listener=format_address(listener) if listener is not None else None,
        threaded=False,
        captured=captured,
        peer_pid=peer_pid,
    )


def snapshot() -> List[LinkInfo]:
    """Each live link (:data:`live_links`, :data:`live_across`) as it is
    now, the oldest first."""
    now = time.monotonic()
    found = [info for link in live_links.links() if (info := _link_info(link, now)) is not None]
    across = [info for end in live_across.links() if (info := end.link_info(now)) is not None]
    if across:
        found.extend(across)
        found.sort(key=lambda info: -info.age)  # (stable: links made together keep their order)
    return found
