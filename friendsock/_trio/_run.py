"""What friendsock keeps per trio run (its token, the friend ends and
listeners living in it), and how it learns that the run ended."""

from __future__ import annotations

import os
import threading
import weakref
from typing import Any, Dict, Protocol

import trio

from .._core._registry import ListenerEntry
from .._handshake import forget_listener


class RunEnd(Protocol):
    """A friend end living in a run, as :meth:`RunState.run_finished` tears
    it down."""

    def _run_gone(self) -> None:
        """The run ended with this end open."""


class RunState:
    """What friendsock keeps per trio run: its token (other threads hand
    wake-ups over with it) and the friend ends and listeners living in it,
    torn down when the run ends with them open (their friends, maybe on
    other threads, must not hang)."""

    __slots__ = ("token", "pid", "streams", "listeners", "_lock", "finished", "__weakref__")

    def __init__(self, token: trio.lowlevel.TrioToken) -> None:
        self.token = token
        self.pid = os.getpid()
        # id -> weak reference: an end left open is still collected (and
        # warns). Changed on the run's thread only; the lock is for
        # run_finished(), which a friend's thread may also reach.
        self.streams: "Dict[int, weakref.ref[RunEnd]]" = {}
        self.listeners: "Dict[int, ListenerEntry]" = {}
        self._lock = threading.Lock()
        self.finished = False

    def run_finished(self) -> None:
        """Every friend end still open goes away as if its process died;
        listeners stop pairing."""
        if self.pid != os.getpid():
            return
        with self._lock:
            if self.finished:
                return
            self.finished = True
            streams = [s for s in (ref() for ref in self.streams.values()) if s is not None]
            self.streams = {}
            entries = list(self.listeners.values())
            self.listeners = {}
        for entry in entries:
            forget_listener(entry)
        for stream in streams:
            stream._run_gone()


_run_state: "trio.lowlevel.RunVar[RunState]" = trio.lowlevel.RunVar("friendsock_run_state")


def post_to_run(token: trio.lowlevel.TrioToken, callback: Any) -> None:
    """``callback()`` in the run of ``token``, from any other thread;
    nothing once the run finished (nobody waits there any more)."""
    try:
        token.run_sync_soon(callback)
    except trio.RunFinishedError:
        pass


def run_state() -> RunState:
    """The current run's state, made on first use."""
    try:
        return _run_state.get()
    except LookupError:
        state = RunState(trio.lowlevel.current_trio_token())
        _run_state.set(state)
        trio.lowlevel.spawn_system_task(_watch_run_end, state, name="friendsock run watch")
        return state


async def _watch_run_end(state: RunState) -> None:
    # System tasks are cancelled once the main task is done: the run ends.
    try:
        await trio.sleep_forever()
    finally:
        state.run_finished()
