"""The targets: what friendsock aims for in which cell, and why there; each
judged against this run's figures (met, missed, or not measured) and shown
as a table under the others."""

from __future__ import annotations

import dataclasses
from typing import Any, Dict, List, Optional, Tuple

from rich import box
from rich.console import Console
from rich.table import Table
from rich.text import Text

from ._results import Run
from ._tables import cell_median, format_ratio


@dataclasses.dataclass(frozen=True)
class Target:
    """``transport`` >= ``ratio`` x ``baseline`` in one cell of one table;
    ``why`` says what sets it there."""

    name: str
    case: str
    param: int
    loop: str
    transport: str
    baseline: str
    ratio: float
    why: str


_BY_REFERENCE = "a bytes object by reference against two copies through the kernel"
_THREAD_WAKE = ("a round trip between threads is mostly waking the other one, which every "
                "transport pays")
_ACROSS_RR = ("between two processes each round trip still costs two system calls and two "
              "wake-ups; a socketpair spares TCP's stack in both")
_OVER_UNIX = ("a moved connection's bytes go over an AF_UNIX socketpair: only friendsock's "
              "own layer is between the two")


def _across(loop: str) -> Tuple[Target, ...]:
    """The targets between two processes, on ``loop``."""
    return (
        Target(f"processes-rr 64 B, {loop}: Friends ≥ 1.4× TCP", "processes-rr", 64, loop,
               "friends", "tcp", 1.4, _ACROSS_RR),
        Target(f"processes-rr 64 B, {loop}: Friends ≥ AF_UNIX", "processes-rr", 64, loop,
               "friends", "unix", 1.0, _OVER_UNIX),
        Target(f"processes-stream 64 KiB, {loop}: Friends ≥ 1.5× TCP", "processes-stream",
               64 * 1024, loop, "friends", "tcp", 1.5,
               "one copy each way through a socketpair, no segments, no acks"),
        Target(f"processes-stream 64 KiB, {loop}: Friends ≥ AF_UNIX", "processes-stream",
               64 * 1024, loop, "friends", "unix", 1.0, _OVER_UNIX),
        Target(f"processes-agg 64, {loop}: Friends ≥ AF_UNIX", "processes-agg", 64, loop,
               "friends", "unix", 1.0, _OVER_UNIX),
        Target(f"processes-crr 64 B, {loop}: Friends ≥ 1.2× TCP", "processes-crr", 64, loop,
               "friends", "tcp", 1.2, "the move must pay for what it costs at connect"),
    )


TARGETS = (
    Target("trio rr 64 B: Friends ≥ 3× TCP", "rr", 64, "trio", "friends", "tcp", 3.0,
           "no system calls left; trio's scheduler, a checkpoint per call, is what remains"),
    Target("trio rr 64 B: Friends ≥ 75% of the floor", "rr", 64, "trio", "friends", "memory",
           0.75, "memory_stream_pair is what trio users pick for in-process streams today"),
    Target("anyio rr 64 B: Friends ≥ 2.5× TCP", "rr", 64, "anyio", "friends", "tcp", 2.5,
           "trio's bound, less anyio's own layer, which costs the same on every path"),
    Target("streams-rr 64 B, asyncio: Friends ≥ 3× TCP", "streams-rr", 64, "asyncio",
           "friends", "tcp", 3.0, "what StreamReader/StreamWriter code sees; the tasks' "
           "wake-ups stay on every path"),
    Target("streams-rr 64 B, uvloop: Friends ≥ 2.5× TCP", "streams-rr", 64, "uvloop",
           "friends", "tcp", 2.5, "asyncio's reason, lower: uvloop's own TCP is in C"),
    Target("streams-rr 64 B, asyncio: Friends ≥ the floor", "streams-rr", 64, "asyncio",
           "friends", "memory", 1.0, "a link's accounting should cost no more than the "
           "loop turns it saves"),
    Target("streams-rr 64 B, uvloop: Friends ≥ the floor", "streams-rr", 64, "uvloop",
           "friends", "memory", 1.0, "asyncio's reason, on uvloop"),
    Target("crr 64 B, asyncio: Friends ≥ 2.5× TCP", "crr", 64, "asyncio", "friends", "tcp",
           2.5, "a kept connection skips the kernel's connect, accept and close"),
    Target("crr 64 B, uvloop: Friends ≥ 1.3× TCP", "crr", 64, "uvloop", "friends", "tcp", 1.3,
           "uvloop sets a connection up in C; friendsock does it in Python"),
    Target("crr 64 B, asyncio: Socketless ≥ 10× TCP", "crr", 64, "asyncio", "socketless",
           "tcp", 10.0, "no kernel socket at all: near what the floor reaches"),
    Target("crr 64 B, uvloop: Socketless ≥ 10× TCP", "crr", 64, "uvloop", "socketless", "tcp",
           10.0, "asyncio's reason, on uvloop"),
    Target("threads-rr 64 B, asyncio: Friends ≥ 1.5× TCP", "threads-rr", 64, "asyncio",
           "friends", "tcp", 1.5, _THREAD_WAKE),
    Target("threads-rr 64 B, uvloop: Friends ≥ 1.4× TCP", "threads-rr", 64, "uvloop",
           "friends", "tcp", 1.4, _THREAD_WAKE),
    Target("blocking-rr 64 B, thread to asyncio: Friends ≥ 1.5× TCP", "blocking-rr", 64,
           "asyncio", "friends", "tcp", 1.5, _THREAD_WAKE),
    Target("blocking-threads-rr 64 B: Friends ≥ 2× TCP", "blocking-threads-rr", 64, "asyncio",
           "friends", "tcp", 2.0, "AF_UNIX, the kernel's hand-over in C, gets about there"),
    Target("blocking-stream 64 KiB, thread to asyncio: Friends ≥ 3× TCP", "blocking-stream",
           64 * 1024, "asyncio", "friends", "tcp", 3.0, _BY_REFERENCE),
    Target("blocking-threads-stream 64 KiB: Friends ≥ 3× TCP", "blocking-threads-stream",
           64 * 1024, "asyncio", "friends", "tcp", 3.0, _BY_REFERENCE),
    *_across("asyncio"),
    *_across("uvloop"),
)


def evaluate_targets(run: Run) -> List[Dict[str, Any]]:
    """The targets whose cells this run has (measured or failed). ``met`` is
    None when either figure is missing; a figure not from friend links
    (friend_verified false) does not meet a target."""
    results = []
    for target in TARGETS:
        cell = run.cell(target.case, target.param, target.loop, target.transport)
        base = run.cell(target.case, target.param, target.loop, target.baseline)
        if cell is None or base is None:
            continue
        value, base_value = cell_median(cell), cell_median(base)
        ratio = value / base_value if value is not None and base_value else None
        # Where the table has a floor: what a transport with nothing in it
        # reaches against the same baseline (a target above it asks more
        # than handing bytes over in memory gives).
        floor = (None if target.baseline == "memory" else
                 cell_median(run.cell(target.case, target.param, target.loop, "memory")))
        floor_ratio = floor / base_value if floor is not None and base_value else None
        met = None if ratio is None else bool(
            ratio >= target.ratio and cell.friend_verified is not False)
        results.append({
            "target": target.name, "why": target.why, "test": target.case,
            "param": target.param, "loop": target.loop, "transport": target.transport,
            "baseline": target.baseline, "required_ratio": target.ratio, "value": value,
            "baseline_value": base_value, "ratio": ratio, "floor_ratio": floor_ratio,
            "friend_verified": cell.friend_verified, "met": met,
        })
    return results


def _ratio_text(ratio: Optional[float], required: float) -> str:
    if ratio is None:
        return "-"
    return format_ratio(ratio) if required >= 1 else f"{100 * ratio:.0f}%"


def _verdict(result: Dict[str, Any]) -> Text:
    met = result["met"]
    if met is None:
        return Text("not measured", style="yellow")
    if met:
        return Text("met", style="green")
    if result["friend_verified"] is False:
        return Text("missed †", style="red")
    floor = result["floor_ratio"]
    if floor is not None and floor < result["required_ratio"]:
        return Text("missed, above floor" if result["ratio"] >= floor else "missed",
                    style="red")
    return Text("missed", style="red")


def print_targets(console: Console, run: Run) -> None:
    results = evaluate_targets(run)
    if not results:
        return
    table = Table(title="[bold]targets[/bold] — what friendsock aims for, and why there",
                  box=box.SIMPLE_HEAVY, title_justify="left", caption_justify="left",
                  caption=("ratio: this run's figure over its baseline, on the same loop; "
                           "floor: the floor's own ratio to that baseline in this run. "
                           "missed: the ratio came out below the target; where the floor "
                           "is below it too, no in-process transport gets there on this "
                           "machine. † not from friend links. Quick cells are short: "
                           "judge targets by --full."))
    table.add_column("target (why it is set there)", ratio=1)
    table.add_column("ratio", justify="right", no_wrap=True)
    table.add_column("floor", justify="right", no_wrap=True)
    table.add_column("verdict", no_wrap=True)
    for result in results:
        what = Text(result["target"])
        what.append("\n" + result["why"], style="dim")
        table.add_row(what, _ratio_text(result["ratio"], result["required_ratio"]),
                      _ratio_text(result["floor_ratio"], result["required_ratio"]),
                      _verdict(result))
    console.print(table)
    console.print()
