"""Socketless links waiting for a trio listener's ``accept()``.

A socketless connect (``friendsock._socketless``) makes its link at once and
hands the server end to the listener; on trio nothing runs until the
listener's task accepts, so the end waits here, as a TCP connection waits in
the kernel's backlog.
"""

from __future__ import annotations

import collections
import threading
from typing import Any, Deque, Optional, Tuple

import trio

from .._core._link import Link
from .._handshake import Entry

Arrived = Tuple[Any, Any, Link]  # the server end's stand-in socket, the client's address, the link


class SocketlessBacklog:
    """Socketless links given to one trio listener and not yet accepted, in
    the order they came. A client on another thread hands its link over
    through the run's token; a listener that goes away (closed, collected,
    its run over) resets what still waits, as the kernel resets a closing
    backlog."""

    __slots__ = ("_token", "_arrived", "_closed", "_lock", "_waiting_on", "_woken")

    def __init__(self, token: trio.lowlevel.TrioToken) -> None:
        self._token = token
        self._arrived: Deque[Arrived] = collections.deque()
        self._closed = False
        # close() may come from another thread (a finalizer).
        self._lock = threading.Lock()
        # The listening socket an accept() waits on, and whether it was woken
        # for a link that arrived here.
        self._waiting_on: Optional[Any] = None
        self._woken = False

    @classmethod
    def serving(cls, entry: Entry, token: trio.lowlevel.TrioToken) -> "SocketlessBacklog":
        """A backlog for the listener ``entry``, which takes socketless links
        from now on."""
        backlog = cls(token)
        entry.handle.socketless_close = backlog.close
        entry.handle.socketless_accept = backlog.arrive
        return backlog

    def arrive(self, link: Link, sock: Any, address: Any) -> None:
        """``ListenerHandle.socketless_accept``: on the client's thread."""
        if not link.threaded:  # a client in this run: on its thread already
            self._queue(link, sock, address)
            return
        try:
            self._token.run_sync_soon(self._queue, link, sock, address)
        except trio.RunFinishedError:  # as a listener gone
            link.server.reset()

    def _queue(self, link: Link, sock: Any, address: Any) -> None:
        with self._lock:
            if not self._closed:
                self._arrived.append((sock, address, link))
                waiting_on = self._waiting_on
                if waiting_on is not None and not self._woken:
                    # trio's own wake-up of a socket's waiter: no cancel scope
                    # to enter and leave on every accept that waits.
                    self._woken = True
                    trio.lowlevel.notify_closing(waiting_on)
                return
        link.server.reset()

    def take(self) -> Optional[Arrived]:
        """The first link waiting, if any (on the run's thread)."""
        if not self._arrived:
            return None
        with self._lock:
            return self._arrived.popleft() if self._arrived else None

    async def wait_readable(self, listen_sock: Any) -> None:
        """``trio.lowlevel.wait_readable(listen_sock)`` for an ``accept()``,
        which also returns once a link arrives here."""
        self._waiting_on = listen_sock
        try:
            await trio.lowlevel.wait_readable(listen_sock)
        except trio.ClosedResourceError:
            if not self._woken:  # really closed
                raise
        finally:
            self._waiting_on = None
            self._woken = False

    def close(self) -> None:
        with self._lock:
            self._closed = True
            waiting, self._arrived = self._arrived, collections.deque()
        for _sock, _address, link in waiting:
            link.server.reset()
