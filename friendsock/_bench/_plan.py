"""What a run runs: the tables (cases) and their parameters, the two modes,
the configuration a command line makes, and how a row's parameter reads.

A *case* is one table (``stream``, ``multi-rr``, ...); a *row* is one
parameter of a case on one event loop; a *cell* is one transport in a row.
"""

from __future__ import annotations

import dataclasses
from typing import List, Optional, Tuple

KiB = 1024
MiB = 1024 * KiB

TESTS = ("stream", "rr", "crr", "streams-rr", "multi", "threads", "blocking", "processes",
         "memory")

# The per-connection message sizes of the multi test (netperf's "32KB I/O x N"
# for streams; a small request for request/response).
MULTI_RR_SIZE = 64
MULTI_STREAM_SIZE = 32 * KiB


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
             tests=("stream", "rr", "crr", "streams-rr", "threads", "blocking", "processes"),
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
        # In this order: after a run of short connections to a server, a
        # friendsock client sends its next connections there over TCP for
        # a while, so crr comes last.
        Case("processes-rr", "processes",
             "two processes, client and server: request/response",
             "trans/s", "bytes", (64,), sized=True),
        Case("processes-stream", "processes", "two processes, client and server: stream",
             "Mbit/s", "bytes", (64 * KiB,), sized=True),
        Case("processes-agg", "processes",
             f"two processes: N connections, aggregate request/response ({MULTI_RR_SIZE} B)",
             "trans/s", "connections", (64,)),
        Case("processes-crr", "processes",
             "two processes: connect/request/response/close",
             "trans/s", "bytes", (64,), sized=True),
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


def format_param(case: Case, value: int) -> str:
    if case.param == "bytes":
        return format_size(value)
    return f"{value}"


def format_size(size: int) -> str:
    for unit, scale in (("MiB", MiB), ("KiB", KiB)):
        if size >= scale and size % scale == 0:
            return f"{size // scale} {unit}"
    return f"{size} B"
