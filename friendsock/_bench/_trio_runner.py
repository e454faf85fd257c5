"""The trio loop's runner: every step (a workload's setup, one round, its
close) is one ``trio.run`` in this thread, under the step's timeout and the
run's watchdog, as ``_loop_runner.LoopRunner`` does for asyncio loops.

Imports trio and not asyncio (the house rule); ``_loop_runner`` imports this
module lazily, only when the trio loop runs (and this one not
``_loop_runner``).
"""

from __future__ import annotations

import sys
from typing import Any, Coroutine, Dict, List

import trio

if sys.version_info < (3, 11):
    from exceptiongroup import BaseExceptionGroup

from ._transports import TRIO_CASES
from ._trio_workloads import TrioWorkload, make_workload
from ._watchdog import Hung, Watchdog


def _leaf(exc: BaseException) -> BaseException:
    """The one exception inside nested single-member groups (nurseries wrap
    what their tasks raise)."""
    while isinstance(exc, BaseExceptionGroup) and len(exc.exceptions) == 1:
        exc = exc.exceptions[0]
    return exc


def _has_interrupt(exc: BaseException) -> bool:
    if isinstance(exc, KeyboardInterrupt):
        return True
    return isinstance(exc, BaseExceptionGroup) and exc.subgroup(KeyboardInterrupt) is not None


class TrioRunner:
    """Runs coroutines of trio workloads, one ``trio.run`` each. Nothing
    outlives a step, so a hung step leaves nothing behind to recover."""

    cases = TRIO_CASES

    def __init__(self, watchdog: Watchdog, grace: float, kind: str = "trio") -> None:
        self.kind = kind  # "trio", or "anyio": anyio's API on its trio backend
        self.watchdog = watchdog
        self.grace = grace  # how long past its timeout a step may hold the thread

    def make_workload(self, case: Any, param: int, transport: str, tmpdir: str,
                      server_side: Any = None) -> TrioWorkload:
        return make_workload(case.key, param, transport, tmpdir, api=self.kind)

    def take_exceptions(self) -> List[Dict[str, Any]]:
        # trio has no exception handler to report to: a task's error fails
        # its nursery, and so the step.
        return []

    def run(self, coro: Coroutine[Any, Any, Any], timeout: float) -> Any:
        watchdog = self.watchdog
        grace = self.grace

        async def step() -> Any:
            with trio.fail_after(timeout):
                return await coro

        try:
            watchdog.arm(timeout + grace)
            try:
                return trio.run(step)
            finally:
                watchdog.disarm()
        except BaseException as exc:
            if _has_interrupt(exc):
                if not watchdog.fired:
                    if isinstance(exc, KeyboardInterrupt):
                        raise
                    raise KeyboardInterrupt from exc  # the user's ^C
                watchdog.fired = False
                raise Hung(
                    f"hung: trio was blocked for over {timeout + grace:.0f} s "
                    "(a task never yielded)") from None
            leaf = _leaf(exc)
            if isinstance(leaf, trio.TooSlowError):
                raise TimeoutError(f"timed out after {timeout:.0f} s") from None
            if leaf is not exc and isinstance(leaf, Exception):
                raise leaf from None
            raise
        finally:
            coro.close()  # never started when trio.run failed early

    def close(self) -> None:
        pass
