"""One asyncio (or uvloop) event loop, driven one step at a time from the
runner's thread under a timeout and the watchdog, and the asyncio workload
each table's cell runs on it.

A step whose callback never returns cannot time out: the watchdog
interrupts it, the loop's tasks are cancelled, and the loop is given up if
even that hangs. ``_trio_runner`` is the same for the trio and anyio loops;
:func:`make_loop_runner` picks between the two.
"""

from __future__ import annotations

import asyncio
from typing import Any, Coroutine, Dict, List

from ._blocking_workloads import BlockingFloorWorkload, BlockingWorkload
from ._crr_workloads import CRRWorkload
from ._floor import FloorEndpoint
from ._memory import IdleWorkload
from ._plan import MULTI_RR_SIZE, MULTI_STREAM_SIZE, Case
from ._process_workloads import make_process_workload
from ._rr_workloads import RRWorkload, StreamsRRWorkload
from ._stream_workloads import StreamWorkload
from ._transports import Endpoint, is_trio_loop, loop_factory, tls_contexts
from ._watchdog import Hung, Watchdog
from ._workloads import Workload

# Extra time the watchdog gives a step beyond its own timeout.
WATCHDOG_GRACE = 5.0


class LoopRunner:
    """One event loop, driven one step at a time from this thread."""

    def __init__(self, kind: str, watchdog: Watchdog) -> None:
        self.kind = kind
        self.watchdog = watchdog
        self.loop = loop_factory(kind)()
        self.loop.set_exception_handler(self.record_exception)
        self.exceptions: List[Dict[str, Any]] = []
        self._taken = 0
        self.broken = False

    def make_workload(self, case: Case, param: int, transport: str, tmpdir: str,
                      server_side: Any) -> Workload:
        endpoint: Any
        if case.test == "processes":
            return make_process_workload(case, param, transport, server_side)
        if transport == "memory":
            endpoint = FloorEndpoint()
        else:
            endpoint = Endpoint(transport, tmpdir, tls_contexts() if case.tls else None)
        return make_workload(case, param, endpoint, server_side, self.kind)

    def take_exceptions(self) -> List[Dict[str, Any]]:
        """What the loops reported since the last call."""
        new = self.exceptions[self._taken:]
        self._taken += len(new)
        return new

    def record_exception(self, loop: Any, context: Dict[str, Any]) -> None:
        # May be called from the server thread's loop too (list.append is
        # atomic).
        self.exceptions.append(context)

    def run(self, coro: Coroutine[Any, Any, Any], timeout: float) -> Any:
        if self.broken:
            coro.close()
            raise Hung("skipped: this event loop hung earlier in the run")
        watchdog = self.watchdog
        try:
            watchdog.arm(timeout + WATCHDOG_GRACE)
            try:
                return self.loop.run_until_complete(asyncio.wait_for(coro, timeout))
            finally:
                watchdog.disarm()
        except KeyboardInterrupt:
            if not watchdog.fired:
                raise
            watchdog.fired = False
            self._recover()
            raise Hung(f"hung: the event loop was blocked for over {timeout + WATCHDOG_GRACE:.0f} s "
                       "(a callback never returned)") from None
        except asyncio.TimeoutError as exc:
            if str(exc):
                raise
            raise TimeoutError(f"timed out after {timeout:.0f} s") from None

    def _recover(self) -> None:
        """Cancel what the hung step left behind; give up the loop if even
        that hangs."""
        for task in asyncio.all_tasks(self.loop):
            task.cancel()
        try:
            self.watchdog.arm(WATCHDOG_GRACE)
            try:
                self.loop.run_until_complete(asyncio.sleep(0.01))
            finally:
                self.watchdog.disarm()
        except KeyboardInterrupt:
            if not self.watchdog.fired:
                raise
            self.watchdog.fired = False
            self.broken = True

    def close(self) -> None:
        loop = self.loop
        try:
            if not self.broken:
                tasks = asyncio.all_tasks(loop)
                for task in tasks:
                    task.cancel()
                if tasks:
                    self.run(asyncio.gather(*tasks, return_exceptions=True), 10)  # type: ignore[arg-type]
                self.run(loop.shutdown_asyncgens(), 10)
        except Exception:  # the loop is going away: nothing left to report to
            pass
        finally:
            loop.close()


def make_loop_runner(kind: str, watchdog: Watchdog) -> Any:
    """A :class:`LoopRunner`, or for trio (and anyio on trio) a
    ``_trio_runner.TrioRunner`` (same interface); ImportError when trio is
    missing."""
    if is_trio_loop(kind):
        from ._trio_runner import TrioRunner

        return TrioRunner(watchdog, grace=WATCHDOG_GRACE, kind=kind)
    return LoopRunner(kind, watchdog)


def make_workload(case: Case, param: int, endpoint: Endpoint, server_side: Any,
                  loop_kind: str) -> Workload:
    key = case.key
    if key in ("stream", "stream-tls", "threads-stream"):
        return StreamWorkload(endpoint, size=param, server_side=server_side)
    if key in ("rr", "rr-tls", "threads-rr"):
        return RRWorkload(endpoint, size=param, server_side=server_side)
    if key == "crr":
        return CRRWorkload(endpoint, size=param)
    if key == "streams-rr":
        return StreamsRRWorkload(endpoint, size=param)
    if key == "multi-rr":
        return RRWorkload(endpoint, size=MULTI_RR_SIZE, conns=param)
    if key == "multi-stream":
        return StreamWorkload(endpoint, size=MULTI_STREAM_SIZE, conns=param, per_round=True)
    if key.startswith("blocking-"):
        if endpoint.transport == "memory":
            return BlockingFloorWorkload(endpoint, size=param, stream=key.endswith("-stream"),
                                         threads=key.startswith("blocking-threads-"))
        return BlockingWorkload(endpoint, size=param, stream=key.endswith("-stream"),
                                threads=key.startswith("blocking-threads-"))
    if key in ("memory-heap", "memory-rss"):
        return IdleWorkload(endpoint, conns=param, heap=key == "memory-heap", loop_kind=loop_kind)
    raise ValueError(f"unknown case {key!r}")
