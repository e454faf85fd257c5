"""Everything a run hands out, put together: the header, the tables with
the targets under them (``_tables``, ``_targets``), the closing summary,
the progress bar and the JSON file. The picture is ``_plot``'s."""

from __future__ import annotations

import datetime
import os
import platform
import sys
from typing import Any, Dict, List, Optional, Tuple

from rich.console import Console
from rich.progress import (
    BarColumn,
    MofNCompleteColumn,
    Progress as RichProgressBar,
    TextColumn,
    TimeElapsedColumn,
    TimeRemainingColumn,
)
from rich.text import Text

import friendsock

from ._plan import Case, Config, default_cases, format_param
from ._results import Run
from ._runner import Progress
from ._tables import COLUMN_LABELS, below_tcp, build_table, print_legend
from ._targets import evaluate_targets, print_targets
from ._transports import FRIEND_TRANSPORTS, loop_runs

JSON_FORMAT = "friendsock-bench/1"


def _version(module: str) -> Optional[str]:
    try:
        from importlib.metadata import version

        return version(module)
    except Exception:  # not installed, or no metadata
        return None


def cpu_counts() -> Tuple[Optional[int], Optional[int]]:
    """(CPUs in the machine, CPUs this process may run on)."""
    try:
        usable: Optional[int] = len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        usable = None
    return os.cpu_count(), usable


def collect_header(config: Config, command: str) -> Dict[str, Any]:
    cpus, usable = cpu_counts()
    return {
        "command": command,
        "started": datetime.datetime.now().astimezone().isoformat(timespec="seconds"),
        "python": f"{platform.python_implementation()} {platform.python_version()}",
        "friendsock": friendsock.__version__,
        "uvloop": _version("uvloop"),
        "trio": _version("trio"),
        "anyio": _version("anyio"),
        "platform": platform.platform(),
        "cpus": cpus,
        "cpus_usable": usable,
        "mode": config.mode.name,
        "seconds": config.seconds,
        "warmup": config.warmup,
        "rounds": config.rounds,
        "memory_rounds": config.memory_rounds,
        "transports": list(config.transports),
        "loops": list(config.loops),
        "tls": config.tls,
    }


def make_console() -> Console:
    # Piped to a file, rich would assume 80 columns; the tables are made
    # to fold into 100, and COLUMNS (which rich reads) says otherwise.
    fixed = not sys.stdout.isatty() and not os.environ.get("COLUMNS")
    return Console(width=100 if fixed else None, highlight=False)


def print_header(console: Console, header: Dict[str, Any], run: Run) -> None:
    cpus = header["cpus"]
    if header["cpus_usable"] not in (None, cpus):
        cpus = f"{cpus} ({header['cpus_usable']} usable)"
    console.print(Text("friendsock bench", style="bold"))
    console.print(f"command:    {header['command']}")
    console.print(f"python:     {header['python']}   friendsock: {header['friendsock']}   "
                  f"uvloop: {header['uvloop'] or 'not installed'}   "
                  f"trio: {header.get('trio') or 'not installed'}   CPUs: {cpus}")
    console.print(f"platform:   {header['platform']}   started: {header['started']}")
    console.print(f"mode:       {describe_mode(run)}")
    console.print()


def describe_mode(run: Run) -> str:
    config = run.config
    memory = ""
    if any(c.test == "memory" for c in run.cases):
        memory = f" (memory: {config.memory_rounds} round{'s' if config.memory_rounds > 1 else ''})"
    parts = [f"{config.mode.name}: {config.seconds:g} s per cell after a {config.warmup:g} s "
             f"warm-up, median of {config.rounds} round{'s' if config.rounds > 1 else ''}{memory}"]
    trimmed = [c for c in run.cases if c.params != _full_params(c)
               and any(loop_runs(loop, c.key) for loop in config.loops)]
    if trimmed:
        parts.append("; rows limited to: " + "; ".join(
            f"{c.key} " + ", ".join(format_param(c, p) for p in c.params) for c in trimmed))
    return "".join(parts)


def _full_params(case: Case) -> Tuple[int, ...]:
    for default in default_cases():
        if default.key == case.key:
            return default.params
    return case.params


# -- the tables and targets -------------------------------------------------


def print_tables(console: Console, run: Run, spread: bool = False) -> None:
    """The legend, a table per case the run reached, and the targets under
    them."""
    printed = False
    for case in run.cases:
        if not any(key == case.key for key, *_ in run.cells):
            continue  # never reached (interrupted)
        if not printed:
            print_legend(console, run)
            printed = True
        table, notes = build_table(run, case, spread)
        console.print(table)
        for note in notes:
            console.print(Text("  " + note, style="yellow"))
        console.print()
    print_targets(console, run)

# -- the closing summary ----------------------------------------------------


def problem_cells(run: Run) -> List[Tuple[str, str]]:
    """Every cell with no figure, or fewer rounds than asked (an error, a
    hang, a time-out, a cell skipped or not measured): (where, why)."""
    found = []
    for case in run.cases:
        for param in case.params:
            for loop in run.config.loops:
                for transport in run.config.transports:
                    cell = run.cell(case.key, param, loop, transport)
                    if cell is not None and cell.error is not None:
                        found.append((f"{case.key} {format_param(case, param)} {loop} "
                                      f"{COLUMN_LABELS[transport]}", cell.error))
    return found


def print_summary(console: Console, run: Run, exit_zero: bool = False) -> int:
    """The closing summary: time, targets, cells below TCP, every cell that
    failed; returns the exit status it implies (1 when a cell failed,
    unless ``exit_zero``)."""
    console.print(Text("summary", style="bold"))
    for note in run.notes:
        console.print(Text("note: " + note, style="yellow"))
    state = "interrupted after" if run.interrupted else "finished in"
    per_test = ", ".join(f"{test} {seconds:.1f} s" for test, seconds in run.timings.items())
    console.print(f"{state} {run.elapsed:.1f} s" + (f" ({per_test})" if per_test else ""))
    targets = evaluate_targets(run)
    if targets:
        counts = {"met": 0, "missed": 0, "not measured": 0}
        for result in targets:
            counts["not measured" if result["met"] is None
                   else "met" if result["met"] else "missed"] += 1
        console.print(f"targets: {counts['met']} met, {counts['missed']} missed"
                      + (f", {counts['not measured']} not measured"
                         if counts["not measured"] else "") + f" (of {len(targets)})")
    print_below_tcp(console, run)
    fell_back = sum(1 for (_, _, _, t), c in run.cells.items()
                    if t in FRIEND_TRANSPORTS and c.friend_verified is False)
    if fell_back:
        console.print(Text(f"not from friend links (†): {fell_back} cells", style="yellow"))
    problems = problem_cells(run)
    if not problems:
        if run.cells:
            console.print(Text("every cell measured", style="green"))
        return 0
    console.print(Text(f"cells with no figure ({len(problems)}):", style="bold red"))
    for where, why in problems:
        console.print(Text(f"  {where}: {why}", style="red"))
    if exit_zero:
        console.print("exit status 0 (--exit-zero)")
        return 0
    console.print("exit status 1 (--exit-zero keeps 0, for exploratory runs)")
    return 1


def print_below_tcp(console: Console, run: Run) -> None:
    if not any(run.cell(case.key, param, loop, "friends") is not None
               and run.cell(case.key, param, loop, "tcp") is not None
               for case in run.cases for param in case.params for loop in run.config.loops):
        return  # nothing compared
    found = below_tcp(run)
    if not found:
        console.print(Text("friends below TCP: none", style="green"))
    else:
        cases = {case.key: case for case in run.cases}
        cells = ", ".join(f"{f['test']} {format_param(cases[f['test']], f['param'])} {f['loop']} "
                          f"({100 * f['ratio']:.0f}%)" for f in found if f["ratio"] is not None)
        console.print(Text(f"friends below TCP ({len(found)}): {cells}", style="bold red"))


# -- progress ---------------------------------------------------------------


class RichProgress(Progress):
    """A progress bar on stderr, gone when the run ends."""

    def __init__(self) -> None:
        self._bar = RichProgressBar(
            TextColumn("{task.description}", style="cyan"),
            BarColumn(),
            MofNCompleteColumn(),
            TimeElapsedColumn(),
            TimeRemainingColumn(),
            console=Console(stderr=True),
            transient=True,
        )
        self._task: Any = None

    def start(self, total: int) -> None:
        self._task = self._bar.add_task("starting", total=total)
        self._bar.start()

    def describe(self, text: str) -> None:
        if self._task is not None:
            self._bar.update(self._task, description=text)

    def advance(self, steps: int = 1) -> None:
        if self._task is not None:
            self._bar.advance(self._task, steps)

    def stop(self) -> None:
        self._bar.stop()


# -- JSON -------------------------------------------------------------------


def to_json(run: Run, header: Dict[str, Any]) -> Dict[str, Any]:
    """The machine-readable form; its shape is documented in docs/benchmarks.md."""
    tests: Dict[str, Any] = {}
    for case in run.cases:
        if not any(loop_runs(loop, case.key) for loop in run.config.loops):
            continue  # no selected loop has this table (--loops trio)
        rounds = run.config.memory_rounds if case.test == "memory" else run.config.rounds
        results: Dict[str, Any] = {}
        for param in case.params:
            per_loop: Dict[str, Any] = {}
            for loop in run.config.loops:
                per_transport = {}
                for transport in run.config.transports:
                    cell = run.cell(case.key, param, loop, transport)
                    if cell is None:
                        continue
                    per_transport[transport] = {
                        "median": cell.median,
                        "min": cell.min,
                        "max": cell.max,
                        "rounds": list(cell.values),
                        "unit": case.unit,
                        "friend_verified": cell.friend_verified,
                        "error": cell.error,
                        "notes": list(cell.notes),
                    }
                if per_transport:
                    per_loop[loop] = per_transport
            if per_loop:
                results[str(param)] = per_loop
        tests[case.key] = {
            "test": case.test,
            "title": case.title,
            "unit": case.unit,
            "param": case.param,
            "higher_is_better": case.higher_is_better,
            "rounds": rounds,
            "results": results,
        }
    return {
        "format": JSON_FORMAT,
        "header": dict(header, elapsed_s=round(run.elapsed, 3), interrupted=run.interrupted,
                       test_elapsed_s={t: round(v, 3) for t, v in run.timings.items()}),
        "notes": list(run.notes),
        "targets": evaluate_targets(run),
        "below_tcp": below_tcp(run),
        "tests": tests,
    }


__all__ = ["collect_header", "make_console", "print_header", "print_tables", "print_summary",
           "problem_cells", "RichProgress", "to_json"]
