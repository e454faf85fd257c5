"""The bench's watchdog: interrupts a step that never gives its loop back
(asyncio's and trio's runners both use it)."""

from __future__ import annotations

import _thread
import sys
import threading
import time
from typing import Optional


class Hung(Exception):
    """A step did not give the event loop back."""


class Watchdog:
    """Interrupts the main thread when a step overruns its deadline.

    A callback that never returns starves the loop, so no asyncio timeout
    can fire; a KeyboardInterrupt raised in the main thread still lands.
    Only works when the runner runs in the main thread; elsewhere it is off.
    """

    def __init__(self) -> None:
        self.enabled = threading.current_thread() is threading.main_thread()
        self.fired = False
        self._cond = threading.Condition()
        self._deadline: Optional[float] = None
        self._closed = False
        self._thread: Optional[threading.Thread] = None
        if self.enabled:
            self._thread = threading.Thread(target=self._watch, name="friendsock-bench-watchdog",
                                            daemon=True)
            self._thread.start()

    def arm(self, seconds: float) -> None:
        with self._cond:
            self.fired = False
            self._deadline = time.monotonic() + seconds
            self._cond.notify()

    def disarm(self) -> None:
        """(Called as the step ends, in the runner's handler for the
        interrupt.)"""
        with self._cond:
            self._deadline = None
            self._cond.notify()
        if self.fired and not _interrupt_in_flight():
            # The deadline passed as the step returned: the interrupt is
            # pending, and must land here, where the runner catches it, not
            # in whatever runs after it returned.
            end = time.monotonic() + 1.0
            while time.monotonic() < end:
                time.sleep(0.001)

    def close(self) -> None:
        with self._cond:
            self._closed = True
            self._cond.notify()
        if self._thread is not None:
            self._thread.join()

    def _watch(self) -> None:
        with self._cond:
            while not self._closed:
                if self._deadline is None:
                    self._cond.wait()
                    continue
                remaining = self._deadline - time.monotonic()
                if remaining > 0:
                    self._cond.wait(remaining)
                    continue
                # Under the lock: disarm() cannot return before the
                # interrupt is pending, so it lands inside LoopRunner.run.
                self._deadline = None
                self.fired = True
                _thread.interrupt_main()


def _interrupt_in_flight() -> bool:
    """Whether the interrupt has landed already: the step's finally runs
    as it goes by (alone, or in trio's exception group)."""
    exc = sys.exc_info()[1]
    if isinstance(exc, KeyboardInterrupt):
        return True
    subgroup = getattr(exc, "subgroup", None)
    return subgroup is not None and subgroup(KeyboardInterrupt) is not None
