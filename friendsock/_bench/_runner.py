"""What runs, in which order, and the statistics of what came out.

A *case* is one table (``stream``, ``multi-rr``, ...); a *row* is one
parameter of a case on one event loop; a *cell* is one transport in a row.
For each row the runner sets up every transport, then runs the rounds with
the transports interleaved (and their order rotated each round), so drift in
the machine's load hits them alike. A cell's figure is the median of its
rounds.

Every step runs under a timeout, and under a watchdog thread for a callback
that never returns (then no timeout can fire): a transport that fails or
hangs gets ``error: ...`` in its cell and the run goes on.

The trio loop runs only some tables (``TRIO_CASES``) and has one more
transport (``memory``); its runner and workloads live in ``_trio_runner``
and ``_trio_workloads`` (they import trio, this module asyncio), imported
only when the trio loop runs.
"""

from __future__ import annotations

import asyncio
import dataclasses
import os
import resource
import statistics
import sys
import tempfile
import time
from typing import Any, Coroutine, Dict, List, Optional, Sequence, Set, Tuple

from ._blocking_workloads import BlockingFloorWorkload, BlockingWorkload
from ._floor import FloorEndpoint
from ._memory import DESCRIPTOR_TRANSPORTS, FD_MARGIN, IdleWorkload, raise_fd_limit
from ._transports import (
    LOOPS,
    TRANSPORTS,
    Endpoint,
    is_trio_loop,
    loop_factory,
    loop_runs,
    loop_transports,
    tls_contexts,
)
from ._workloads import (
    CRRWorkload,
    LoopThread,
    RRWorkload,
    SameLoop,
    Sample,
    StreamsRRWorkload,
    StreamWorkload,
    Workload,
)
from ._watchdog import Hung, Watchdog

KiB = 1024
MiB = 1024 * KiB

TESTS = ("stream", "rr", "crr", "streams-rr", "multi", "threads", "blocking", "memory")

# The per-connection message sizes of the multi test (netperf's "32KB I/O x N"
# for streams; a small request for request/response).
MULTI_RR_SIZE = 64
MULTI_STREAM_SIZE = 32 * KiB

# Extra time the watchdog gives a step beyond its own timeout.
WATCHDOG_GRACE = 5.0
# What a round may take beyond its warm-up and measured time (draining,
# stopping) before it counts as failed.
MEASURE_SLACK = 10.0


@dataclasses.dataclass(frozen=True)
class Case:
    """One table of the report."""

    key: str  # the table's name in the output and the JSON
    test: str  # the --tests name that selects it
    title: str
    unit: str
    param: str  # what a row's parameter is: "bytes", "connections", "idle connections"
    params: Tuple[int, ...]
    higher_is_better: bool = True
    sized: bool = False  # --sizes applies
    tls: bool = False  # every transport runs TLS; only with --tls


@dataclasses.dataclass(frozen=True)
class Mode:
    name: str
    seconds: float
    rounds: int
    memory_rounds: int
    # The tests run when --tests is not given.
    tests: Tuple[str, ...] = TESTS
    # Tables whose parameter list this mode trims (when none is given).
    trims: Tuple[Tuple[str, Tuple[int, ...]], ...] = ()


# Quick runs the headline cells, those the targets judge (and stream at
# 64 KiB), on every loop: under a minute on 2 cores. The other sizes,
# multi and memory come with --sizes, --tests or --full.
QUICK = Mode("quick", seconds=0.08, rounds=3, memory_rounds=1,
             tests=("stream", "rr", "crr", "streams-rr", "threads", "blocking"),
             trims=(("stream", (64 * KiB,)), ("rr", (64,)), ("crr", (64,)),
                    ("streams-rr", (64,))))
FULL = Mode("full", seconds=1.0, rounds=5, memory_rounds=3)
MODES = {"quick": QUICK, "full": FULL}


def default_cases() -> List[Case]:
    """Every table, with the full parameter lists."""
    return [
        Case("stream", "stream", "TCP_STREAM: one-way throughput by write size",
             "Mbit/s", "bytes", (64, KiB, 8 * KiB, 64 * KiB, MiB), sized=True),
        Case("stream-tls", "stream", "TCP_STREAM over TLS: one-way throughput by write size",
             "Mbit/s", "bytes", (64 * KiB,), sized=True, tls=True),
        Case("rr", "rr", "TCP_RR: request/response, one outstanding, by size",
             "trans/s", "bytes", (64, KiB, 8 * KiB, 64 * KiB), sized=True),
        Case("rr-tls", "rr", "TCP_RR over TLS: request/response, one outstanding, by size",
             "trans/s", "bytes", (64,), sized=True, tls=True),
        Case("crr", "crr", "TCP_CRR: connect/request/response/close by size",
             "trans/s", "bytes", (64, KiB), sized=True),
        Case("streams-rr", "streams-rr",
             "request/response through StreamReader/StreamWriter by size",
             "trans/s", "bytes", (64, KiB, 8 * KiB, 64 * KiB), sized=True),
        Case("multi-rr", "multi",
             f"N connections, aggregate request/response ({MULTI_RR_SIZE} B)",
             "trans/s", "connections", (1, 16, 64, 256)),
        Case("multi-stream", "multi",
             f"N connections, aggregate stream ({MULTI_STREAM_SIZE // KiB} KiB writes)",
             "Mbit/s", "connections", (1, 16, 64, 256)),
        Case("threads-rr", "threads",
             "client and server loops in two threads: request/response",
             "trans/s", "bytes", (64,), sized=True),
        Case("threads-stream", "threads",
             "client and server loops in two threads: stream",
             "Mbit/s", "bytes", (64 * KiB,), sized=True),
        Case("blocking-rr", "blocking",
             "a blocking client thread to a server on the event loop: request/response",
             "trans/s", "bytes", (64,), sized=True),
        Case("blocking-stream", "blocking",
             "a blocking client thread to a server on the event loop: stream",
             "Mbit/s", "bytes", (64 * KiB,), sized=True),
        Case("blocking-threads-rr", "blocking",
             "blocking sockets at both ends, in two threads: request/response",
             "trans/s", "bytes", (64,), sized=True),
        Case("blocking-threads-stream", "blocking",
             "blocking sockets at both ends, in two threads: stream",
             "Mbit/s", "bytes", (64 * KiB,), sized=True),
        Case("memory-heap", "memory",
             "Python heap (tracemalloc) per idle connection, both ends",
             "bytes/conn", "idle connections", (1000, 5000), higher_is_better=False),
        Case("memory-rss", "memory", "RSS per idle connection, both ends",
             "bytes/conn", "idle connections", (1000, 5000), higher_is_better=False),
    ]


@dataclasses.dataclass
class Config:
    tests: List[str]
    transports: List[str]
    loops: List[str]
    mode: Mode
    seconds: float
    rounds: int
    memory_rounds: int
    sizes: Optional[List[int]] = None  # None: each case's own
    conns: Optional[List[int]] = None
    idle: Optional[List[int]] = None
    tls: bool = False  # also the TLS tables of the selected tests

    @property
    def warmup(self) -> float:
        # Gets the connection's buffers and the allocator going again after
        # the pause between rounds; the first round had its set-up too.
        return min(0.1, self.seconds / 8)


def plan(config: Config) -> List[Case]:
    """The selected tables, with the parameters they will run."""
    cases = []
    for case in default_cases():
        if case.test not in config.tests or (case.tls and not config.tls):
            continue
        params = dict(config.mode.trims).get(case.key, case.params)
        if case.sized and config.sizes:
            params = tuple(config.sizes)
        elif case.param == "connections" and config.conns:
            params = tuple(config.conns)
        elif case.param == "idle connections" and config.idle:
            params = tuple(config.idle)
        cases.append(dataclasses.replace(case, params=params))
    return cases


def rounds_for(case: Case, config: Config) -> int:
    return config.memory_rounds if case.test == "memory" else config.rounds


# -- results ---------------------------------------------------------------


@dataclasses.dataclass
class Cell:
    values: List[float] = dataclasses.field(default_factory=list)
    # None: not the friends transport (or nothing measured); else whether
    # every round's figure came from friend links.
    friend_verified: Optional[bool] = None
    error: Optional[str] = None
    notes: List[str] = dataclasses.field(default_factory=list)

    def add(self, sample: Sample) -> None:
        self.values.append(sample.value)
        if sample.friend_ok is not None:
            self.friend_verified = sample.friend_ok if self.friend_verified is None \
                else self.friend_verified and sample.friend_ok
        if sample.note and sample.note not in self.notes:
            self.notes.append(sample.note)

    @property
    def median(self) -> Optional[float]:
        return statistics.median(self.values) if self.values else None

    @property
    def min(self) -> Optional[float]:
        return min(self.values) if self.values else None

    @property
    def max(self) -> Optional[float]:
        return max(self.values) if self.values else None


CellKey = Tuple[str, int, str, str]  # case key, parameter, loop, transport


@dataclasses.dataclass
class Run:
    config: Config
    cases: List[Case]
    cells: Dict[CellKey, Cell] = dataclasses.field(default_factory=dict)
    notes: List[str] = dataclasses.field(default_factory=list)
    elapsed: float = 0.0
    # Wall time per test (--tests name), both loops together.
    timings: Dict[str, float] = dataclasses.field(default_factory=dict)
    interrupted: bool = False

    def cell(self, case: str, param: int, loop: str, transport: str) -> Optional[Cell]:
        return self.cells.get((case, param, loop, transport))

    def note(self, text: str) -> None:
        if text not in self.notes:
            self.notes.append(text)


class Progress:
    """What the runner tells about its advance; this one tells nobody."""

    def start(self, total: int) -> None:
        pass

    def describe(self, text: str) -> None:
        pass

    def advance(self, steps: int = 1) -> None:
        pass


# -- running steps on a loop -----------------------------------------------


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


def describe_error(exc: BaseException) -> str:
    text = str(exc) or type(exc).__name__
    if not isinstance(exc, (Hung, TimeoutError)) and type(exc).__name__ not in text:
        text = f"{type(exc).__name__}: {text}"
    return " ".join(text.split())


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
            for case in cases:
                for param in case.params:
                    self._run_row(runner, case, param, tmpdir, server_side)
        finally:
            if isinstance(server_side, LoopThread):
                server_side.stop()
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


def format_param(case: Case, value: int) -> str:
    if case.param == "bytes":
        return format_size(value)
    return f"{value}"


def format_size(size: int) -> str:
    for unit, scale in (("MiB", MiB), ("KiB", KiB)):
        if size >= scale and size % scale == 0:
            return f"{size // scale} {unit}"
    return f"{size} B"


def cpu_counts() -> Tuple[Optional[int], Optional[int]]:
    """(CPUs in the machine, CPUs this process may run on)."""
    try:
        usable: Optional[int] = len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        usable = None
    return os.cpu_count(), usable


__all__ = ["TRANSPORTS", "TESTS", "LOOPS", "Config", "Runner", "Run", "Case", "Cell"]
