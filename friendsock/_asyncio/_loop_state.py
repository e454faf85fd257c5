"""What friendsock keeps per asyncio loop (drain queues, the ends and
servers living on it), and how it learns that the loop closed."""

from __future__ import annotations

import asyncio
import logging
import os
import sys
import threading
import weakref
from asyncio.selector_events import _SelectorSocketTransport  # type: ignore[attr-defined]
from typing import Any, List, Optional, Protocol

from .._core._finalizing import close_when_safe
from .._core._link import live_links
from ._native import is_uvloop
from ._wakeups import DrainQueue, RemoteDrainQueue

logger = logging.getLogger("friendsock")


class LoopEnd(Protocol):
    """A friend end living on a loop, as :meth:`LoopState.loop_closed` finds
    it (its link end's ``owner``) and tears it down."""

    _state: "LoopState"
    _closed: bool

    def _unhook(self) -> None:
        """Stop taking the friend's wake-ups."""

    def _loop_gone(self) -> None:
        """The loop closed with this end open."""

# A transport's write buffer high-water mark until set_write_buffer_limits()
# says otherwise (asyncio's and uvloop's), and what a call without one sets.
DEFAULT_HIGH_WATER = 64 * 1024


class LoopState:
    """What friendsock keeps per event loop: its drain queues, and the friend
    transports and servers living on it, to tear down if the loop closes
    with them open (their friends, on other loops, must not hang)."""

    __slots__ = ("drains", "pid", "_loop", "_remote", "_lock", "servers",
                 "polls_after_callbacks", "one_context_per_transport",
                 "refuses_writes_once_lost", "default_write_limits", "lists_server_sockets",
                 "checks_state_before_type", "takes_any_buffer", "extends_a_bytearray",
                 "stops_reading_at_eof", "warns_of_lost_writes", "joins_writelines",
                 "writelines_fails_once_closed", "buffered_by_duck_type", "buffer_size_hint",
                 "across", "__weakref__")

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self.drains = DrainQueue(loop)
        # A forked child inherits the object, not the loop or the links:
        # nothing of it may be torn down there (locks another thread held,
        # sockets shared with the parent).
        self.pid = os.getpid()
        self._loop = loop
        self._remote: Optional[RemoteDrainQueue] = None
        # For loop_closed(), which the closing thread and a friend's thread
        # (finding the loop closed) may both call.
        self._lock = threading.Lock()
        self.servers: "weakref.WeakSet[Any]" = weakref.WeakSet()
        # Its side of the rendezvous with other processes (_across), once used.
        self.across: Any = None
        # uvloop runs a turn's callbacks, then polls its descriptors in the
        # same turn (libuv's idle phase, then its poll); asyncio's loops poll
        # first. See connection_made_turn.
        on_uvloop = is_uvloop(loop)
        self.polls_after_callbacks = on_uvloop
        # uvloop calls all of a transport's protocol callbacks in one
        # context (copied as the transport is made); asyncio's loops call
        # connection_made in a copy of its own, and connection_lost in a
        # copy of close()'s caller's.
        self.one_context_per_transport = on_uvloop
        # uvloop's transports refuse writes once connection_lost has
        # returned (their handle is closed); asyncio's take and drop them.
        self.refuses_writes_once_lost = on_uvloop
        # A new transport's write buffer limits (low, high): uvloop's own
        # start with a low-water mark of 16 bytes (its 64 KiB constant,
        # divided by 4 before the KiB are counted), until
        # set_write_buffer_limits() is called.
        self.default_write_limits = (16 if on_uvloop else DEFAULT_HIGH_WATER // 4, DEFAULT_HIGH_WATER)
        # uvloop's Server.sockets is a list; asyncio's a tuple.
        self.lists_server_sockets = on_uvloop
        # uvloop's write() looks at the transport's state (past write_eof(),
        # lost) before the data's type; asyncio's at the type first.
        self.checks_state_before_type = on_uvloop
        # uvloop's write() takes any contiguous buffer (an array, a ctypes
        # array); asyncio's only bytes, bytearray and memoryview.
        self.takes_any_buffer = on_uvloop
        # asyncio's socket transports before 3.12 keep what the socket did
        # not take in a bytearray, whose extend() refuses a strided view
        # (TypeError) where their send() would fail the connection.
        self.extends_a_bytearray = not on_uvloop and sys.version_info < (3, 12)
        # uvloop's streams stop reading at EOF (is_reading() is False from
        # then on); asyncio's stay "reading".
        self.stops_reading_at_eof = on_uvloop
        # asyncio's transports log each write to a lost connection past a
        # threshold; uvloop's count them and say nothing.
        self.warns_of_lost_writes = not on_uvloop
        # asyncio's socket transports before 3.12 have no writelines() of
        # their own: WriteTransport's writes the joined bytes (so a str
        # among them is a TypeError before any state is looked at).
        self.joins_writelines = not on_uvloop and "writelines" not in _SelectorSocketTransport.__dict__
        # The writelines() of 3.12 and 3.13.0 (CPython gh-136234) looks at
        # no lost connection: once close() was called it raises TypeError,
        # once the connection is lost AttributeError, where write() drops.
        self.writelines_fails_once_closed = not on_uvloop and not self.joins_writelines and \
            "_conn_lost" not in _SelectorSocketTransport.writelines.__code__.co_names
        # Which protocols a transport fills through get_buffer() and
        # buffer_updated(): asyncio's, a BufferedProtocol; uvloop's, also any
        # protocol with a get_buffer() that is no asyncio.Protocol (uvloop's
        # own SSLProtocol among them).
        self.buffered_by_duck_type = on_uvloop
        # The size get_buffer() is asked for: asyncio's transports ask for
        # -1 (any), uvloop's for libuv's suggested size.
        self.buffer_size_hint = 65536 if on_uvloop else -1

    def remote(self) -> RemoteDrainQueue:
        """The queue other threads hand this loop's callbacks to (made on
        the loop's own thread, by the first end whose friend is elsewhere)."""
        remote = self._remote
        if remote is None:
            remote = RemoteDrainQueue(self._loop, self.loop_closed)
            with self._lock:
                self._remote = remote
        return remote

    def _ends_here(self) -> "List[LoopEnd]":
        """The open ends living on this loop, found through the live links
        (their transports are their ends' ``owner``): no registry of ends
        per loop, whose entries would weigh on every idle link."""
        found = []
        for link in live_links.links():
            for end in (link.client, link.server):
                if end is None:  # done meanwhile (on another thread)
                    break
                owner = end.owner
                if owner is not None and owner._state is self and not owner._closed:
                    found.append(owner)
        return found

    def loop_closed(self) -> None:
        """The loop closed (on whatever thread): every friend end on it goes
        away as if its process died; servers stop listening."""
        if self.pid != os.getpid():
            return
        with self._lock:
            transports = self._ends_here()
            # Unhooked first, all of them: a friend on this same loop must
            # not try to schedule anything on it; and a second caller finds
            # them no more (an unhooked end has no owner).
            for transport in transports:
                transport._unhook()
            servers = list(self.servers)
            self.servers = weakref.WeakSet()
        for server in servers:
            server._loop_gone()
        for transport in transports:
            transport._loop_gone()
        with self._lock:
            remote, self._remote = self._remote, None
            across, self.across = self.across, None
        if remote is not None:
            remote.close()
        if across is not None:
            across.close()


# Per loop, weakly both ways: the state lives as long as the loop is open
# (its close watch holds it), and never keeps a loop alive.
_states: "weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, weakref.ref[LoopState]]" = (
    weakref.WeakKeyDictionary()
)
# Far enough never to matter; re-armed should it ever fire.
_WATCH_DELAY = 1e6


def post_to_loop(loop: asyncio.AbstractEventLoop, callback: Any, *args: Any) -> None:
    """``callback(*args)`` on ``loop``'s thread, from any other thread;
    nothing once the loop closed (nobody waits there any more)."""
    try:
        loop.call_soon_threadsafe(callback, *args)
    except RuntimeError:
        pass


def loop_name(loop: asyncio.AbstractEventLoop) -> str:
    """The loop as ``friendsock.links()`` names an end's scheduler."""
    return f"{type(loop).__module__}.{type(loop).__qualname__} at {id(loop):#x}"


def loop_state(loop: asyncio.AbstractEventLoop) -> LoopState:
    """The loop's state, made on first use (on the loop's own thread)."""
    ref = _states.get(loop)
    state = ref() if ref is not None else None
    if state is None:
        state = LoopState(loop)
        _states[loop] = weakref.ref(state)
        _CloseWatch(state).arm(loop)
    return state


class _CloseWatch:
    """Learns that a loop closed, without touching the loop object.

    Neither asyncio nor uvloop tells anyone that a loop closed, and patching
    ``close`` on the instance would leave a trace ``uninstall()`` must not
    leave. But both drop their pending timers on ``close()`` (and with the
    loop, if it is collected unclosed): this object waits in one far-off
    timer, and its ``__del__`` is the notice.
    """

    __slots__ = ("_state",)

    def __init__(self, state: LoopState) -> None:
        self._state = state

    def arm(self, loop: asyncio.AbstractEventLoop) -> None:
        loop.call_later(_WATCH_DELAY, _rearm, loop, self)

    def __del__(self) -> None:
        close_when_safe(self._tear_down)

    def _tear_down(self) -> None:
        try:
            self._state.loop_closed()
        except Exception:  # noqa: BLE001 - a finalizer must not raise
            logger.exception("friendsock: tearing down a closed loop's links failed")


def _rearm(loop: asyncio.AbstractEventLoop, watch: _CloseWatch) -> None:
    watch.arm(loop)
