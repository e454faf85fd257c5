"""Closing what the garbage collector finds open.

A cyclic collection can start at any allocation, so a finalizer may run on
a thread that holds a link's lock (in the middle of a push, say): closing
the end there would wait for that lock forever. A finalizer that runs
inside a collection hands its close to a thread of its own instead; one
run because the last reference went away closes at once, as a socket's
finalizer closes its descriptor.
"""

from __future__ import annotations

import _thread
import gc
import queue
import sys
import threading
import traceback
from typing import Any, Callable, List, Optional

from ._fork import Part, on_fork

# The thread collecting now, if any (collections do not overlap: the
# collector holds the GIL and does not start another from a callback).
_collecting: Optional[int] = None
# SimpleQueue: its put() is safe in a finalizer, even one that interrupted
# a put() on the same thread.
_closes: "queue.SimpleQueue[Callable[[], Any]]" = queue.SimpleQueue()
# Whether a thread runs the closes (a list: assigned in place, no global
# statement races with itself).
_running: List[bool] = [False]


def _track(phase: str, info: Any) -> None:
    global _collecting
    _collecting = threading.get_ident() if phase == "start" else None


gc.callbacks.append(_track)


def close_when_safe(close: Callable[[], Any]) -> None:
    """Run ``close`` now unless this thread is collecting garbage; then on
    a thread of its own, soon. For finalizers of ends whose close takes
    locks: the close must be callable from any thread."""
    if _collecting != threading.get_ident():
        close()
        return
    _closes.put(close)
    if not _running[0]:
        _running[0] = True
        # A bare thread: threading's bookkeeping takes locks of its own (one
        # the collected thread may hold), and test harnesses that count
        # threads do not see a helper that leaves once it is idle.
        try:
            _thread.start_new_thread(_run_closes, ())
        except RuntimeError:  # the interpreter is shutting down: no thread, no lock held
            _run_closes()


def _run_closes() -> None:
    while True:
        while True:
            try:
                close = _closes.get_nowait()
            except queue.Empty:
                break
            try:
                close()
            except BaseException:  # as an exception in a finalizer: reported, not raised
                print(f"Exception ignored in closing {close!r}:", file=sys.stderr)
                traceback.print_exc()
        _running[0] = False
        # A close queued after the last get() whose finalizer still saw us
        # running: take it (unless a thread was started for it meanwhile).
        if _closes.empty() or _running[0]:
            return
        _running[0] = True


def _forked() -> None:
    # The parent's thread runs the parent's closes; the child starts anew.
    global _closes, _collecting
    _closes = queue.SimpleQueue()
    _running[0] = False
    _collecting = None


on_fork(Part.FINALIZING, after_in_child=_forked)
