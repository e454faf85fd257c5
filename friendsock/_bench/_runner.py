"""The run's schedule: which rows run on which loop, in which order, and
what a failure or a hang leaves in a cell.

For each row the runner sets up every transport, then runs the rounds with
the transports interleaved (and their order rotated each round), so drift in
the machine's load hits them alike.

Every step runs under a timeout, and under a watchdog thread for a callback
that never returns (then no timeout can fire; see ``_loop_runner``): a
transport that fails or hangs gets ``error: ...`` in its cell and the run
goes on.

The trio loop runs only some tables (``TRIO_CASES``) and has one more
transport (``memory``); its runner and workloads live in ``_trio_runner``
and ``_trio_workloads`` (they import trio, ``_loop_runner`` asyncio), imported
only when the trio loop runs.
"""

from __future__ import annotations

import dataclasses
import resource
import sys
import tempfile
import time
from typing import Any, Dict, List, Optional, Sequence, Set, Tuple

from ._loop_runner import make_loop_runner
from ._memory import DESCRIPTOR_TRANSPORTS, FD_MARGIN, raise_fd_limit
from ._plan import TESTS, Case, Config, format_param, plan, rounds_for
from ._results import Cell, Run
from ._server_process import ServerProcess
from ._transports import loop_factory, loop_runs, loop_transports
from ._watchdog import Hung, Watchdog
from ._workloads import LoopThread, SameLoop, Workload

# What a round may take beyond its warm-up and measured time (draining,
# stopping) before it counts as failed.
MEASURE_SLACK = 10.0


class Progress:
    """What the runner tells about its advance; this one tells nobody."""

    def start(self, total: int) -> None:
        pass

    def describe(self, text: str) -> None:
        pass

    def advance(self, steps: int = 1) -> None:
        pass


def describe_error(exc: BaseException) -> str:
    text = str(exc) or type(exc).__name__
    if not isinstance(exc, (Hung, TimeoutError)) and type(exc).__name__ not in text:
        text = f"{type(exc).__name__}: {text}"
    return " ".join(text.split())


def _connections(case: Case, param: int) -> int:
    return param if case.param != "bytes" else 1


# -- the run ---------------------------------------------------------------


class Runner:
    """Runs a :class:`Config`; the results fill ``self.run`` as they come."""

    def __init__(self, config: Config, progress: Optional[Progress] = None) -> None:
        self.config = config
        self.progress = progress or Progress()
        self.run = Run(config, plan(config))
        # (test, loop, transport) that hung: not tried again in that test,
        # each try would cost the watchdog's whole wait.
        self._hung: Set[Tuple[str, str, str]] = set()
        # The most idle connections that fit the descriptor limit (memory).
        self._descriptor_fit = sys.maxsize

    def total_steps(self) -> int:
        config = self.config
        return sum(len(case.params) * rounds_for(case, config)
                   * len(loop_transports(kind, config.transports, case.key))
                   for case in self.run.cases for kind in config.loops
                   if loop_runs(kind, case.key))

    def execute(self) -> Run:
        """Run everything; on KeyboardInterrupt the results so far stay in
        ``self.run`` (marked interrupted) and the interrupt propagates."""
        run = self.run
        started = time.perf_counter()
        # Both ends of every connection are ours: multi's 256 connections
        # on three transports already pass the usual soft limit of 1024.
        for note in raise_fd_limit(0)[1]:
            run.note(note)
        memory = [c for c in run.cases if c.test == "memory"]
        if memory:
            self._fit_memory(memory)
        self.progress.start(self.total_steps())
        watchdog = Watchdog()
        try:
            with tempfile.TemporaryDirectory(prefix="fsbench-") as tmpdir:
                for test in TESTS:
                    cases = [c for c in run.cases if c.test == test]
                    if not any(loop_runs(kind, c.key) for c in cases
                               for kind in self.config.loops):
                        continue
                    test_started = time.perf_counter()
                    try:
                        for kind in self.config.loops:
                            on_loop = [c for c in cases if loop_runs(kind, c.key)]
                            if on_loop and loop_transports(kind, self.config.transports):
                                self._run_test(on_loop, kind, tmpdir, watchdog)
                    finally:
                        run.timings[test] = time.perf_counter() - test_started
        except KeyboardInterrupt:
            run.interrupted = True
            raise
        finally:
            watchdog.close()
            run.elapsed = time.perf_counter() - started
        return run

    def _fit_memory(self, cases: List[Case]) -> List[Case]:
        """Idle counts that do not fit the descriptor limit: shrunk for the
        transports that hold descriptors (a row of its own), kept for
        socketless links, which hold none (their cells of the other
        transports say why they were not measured)."""
        socketless = "socketless" in self.config.transports
        fitted = []
        for case in cases:
            params = []
            for count in case.params:
                fit, notes = raise_fd_limit(count)
                for note in notes:
                    self.run.note(note)
                if fit < count:
                    self._descriptor_fit = min(self._descriptor_fit, fit)
                    if socketless:
                        params.append(count)
                        self.run.note(f"socketless links hold no descriptor: measured at {count} too")
                params.append(fit)
            fitted.append(dataclasses.replace(case, params=tuple(sorted(set(params)))))
        # The tables show what was measured.
        self.run.cases = [next((f for f in fitted if f.key == c.key), c) for c in self.run.cases]
        return fitted

    def _run_test(self, cases: List[Case], kind: str, tmpdir: str, watchdog: Watchdog) -> None:
        try:
            runner = make_loop_runner(kind, watchdog)
        except Exception as exc:
            self._fail_all(cases, kind, f"could not create the {kind} loop: {describe_error(exc)}")
            return
        server_side: Any = SameLoop()
        try:
            if cases[0].test == "threads":
                try:
                    server_side = LoopThread(loop_factory(kind), runner.record_exception)
                except Exception as exc:
                    self._fail_all(cases, kind, "could not start the server thread: "
                                   + describe_error(exc))
                    return
            elif cases[0].test == "processes":
                try:
                    server_side = ServerProcess(kind, tmpdir)
                except Exception as exc:
                    self._fail_all(cases, kind, "could not start the server process: "
                                   + describe_error(exc))
                    return
            for case in cases:
                for param in case.params:
                    self._run_row(runner, case, param, tmpdir, server_side)
        finally:
            if isinstance(server_side, LoopThread):
                server_side.stop()
            elif isinstance(server_side, ServerProcess):
                failure = server_side.stop()
                if failure is not None:
                    self.run.note(f"{cases[0].test} on {kind}: the server process exited "
                                  f"with {failure[0]}: {failure[1]}")
            runner.close()
            self._report_loop_exceptions(runner, cases[0].test)

    def _fail_all(self, cases: Sequence[Case], kind: str, error: str) -> None:
        for case in cases:
            transports = loop_transports(kind, self.config.transports, case.key)
            for param in case.params:
                for transport in transports:
                    self.run.cells[(case.key, param, kind, transport)] = Cell(error=error)
                self.progress.advance(rounds_for(case, self.config) * len(transports))

    def _run_row(self, runner: Any, case: Case, param: int, tmpdir: str,
                 server_side: Any) -> None:
        config = self.config
        progress = self.progress
        rounds = rounds_for(case, config)
        kind = runner.kind
        label = f"{case.key} {format_param(case, param)} {kind}"
        conns = _connections(case, param)
        setup_timeout = 20 + conns * 0.05
        measure_timeout = config.warmup + config.seconds + MEASURE_SLACK + (
            30 + conns * 0.02 if case.test == "memory" else 0)
        workloads: Dict[str, Workload] = {}
        cells: Dict[str, Cell] = {}
        for transport in loop_transports(kind, config.transports, case.key):
            cell = cells[transport] = Cell()
            self.run.cells[(case.key, param, kind, transport)] = cell
            if (case.test, kind, transport) in self._hung:
                cell.error = "skipped: hung earlier in this test"
                progress.advance(rounds)
                continue
            if case.test == "memory" and transport in DESCRIPTOR_TRANSPORTS and \
                    param > self._descriptor_fit:
                cell.error = (f"not measured: {param} idle connections need "
                              f"{2 * param + FD_MARGIN} descriptors (RLIMIT_NOFILE "
                              f"{resource.getrlimit(resource.RLIMIT_NOFILE)[0]})")
                progress.advance(rounds)
                continue
            progress.describe(f"{label} {transport}: setting up")
            try:
                workload = runner.make_workload(case, param, transport, tmpdir, server_side)
            except Exception as exc:
                cell.error = describe_error(exc)
                progress.advance(rounds)
                continue
            try:
                runner.run(workload.setup(), setup_timeout)
            except Exception as exc:
                cell.error = describe_error(exc)
                if isinstance(exc, Hung):
                    self._hung.add((case.test, kind, transport))
                progress.advance(rounds)
                self._close(runner, workload, cell)
                continue
            finally:
                _attach_exceptions(runner, cell)
            workloads[transport] = workload
        order = list(workloads)
        for index in range(rounds):
            shift = index % len(order) if order else 0
            for transport in order[shift:] + order[:shift]:
                cell = cells[transport]
                if cell.error is not None:
                    continue
                progress.describe(f"{label} {transport}: round {index + 1}/{rounds}")
                try:
                    sample = runner.run(workloads[transport].measure(config.seconds, config.warmup),
                                        measure_timeout)
                except Exception as exc:
                    cell.error = describe_error(exc)
                    if isinstance(exc, Hung):
                        self._hung.add((case.test, kind, transport))
                    progress.advance(rounds - index)
                    continue
                finally:
                    _attach_exceptions(runner, cell)
                cell.add(sample)
                progress.advance(1)
        for transport, workload in workloads.items():
            self._close(runner, workload, cells[transport])

    @staticmethod
    def _close(runner: Any, workload: Workload, cell: Cell) -> None:
        try:
            runner.run(workload.close(abort=cell.error is not None), 30)
        except Exception as exc:
            cell.notes.append(f"clean-up failed: {describe_error(exc)}")
        finally:
            _attach_exceptions(runner, cell)

    def _report_loop_exceptions(self, runner: Any, test: str) -> None:
        # Whatever came after the last step (loop and thread shut-down).
        for context in runner.take_exceptions():
            self.run.note(f"{test} on {runner.kind}: event loop reported: "
                          + describe_context(context))


def _attach_exceptions(runner: Any, cell: Cell) -> None:
    for context in runner.take_exceptions():
        note = "event loop reported: " + describe_context(context)
        if note not in cell.notes:
            cell.notes.append(note)


def describe_context(context: Dict[str, Any]) -> str:
    message = context.get("message", "")
    exc = context.get("exception")
    if exc is not None:
        message = f"{message}: {describe_error(exc)}" if message else describe_error(exc)
    return " ".join(str(message).split())


__all__ = ["Runner", "Progress"]
