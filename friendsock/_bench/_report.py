"""Everything a run hands out: the header, the tables (the kernel patch's
form: Baseline TCP | AF_UNIX (% of TCP) | Friends (% of TCP) | Friends as %
of AF_UNIX; with trio rows also Memory pair | Friends as % of it), the
targets, the progress bar, the JSON file and the plot."""

from __future__ import annotations

import dataclasses
import datetime
import os
import platform
import sys
from typing import Any, Dict, List, Optional, Tuple

from rich import box
from rich.console import Console
from rich.progress import (
    BarColumn,
    MofNCompleteColumn,
    Progress as RichProgressBar,
    TextColumn,
    TimeElapsedColumn,
    TimeRemainingColumn,
)
from rich.table import Table
from rich.text import Text

import friendsock

from ._plan import Case, Config, default_cases, format_param, rounds_for
from ._results import Cell, Run
from ._runner import Progress
from ._transports import FRIEND_TRANSPORTS, LOOPLESS_CASES, loop_runs

JSON_FORMAT = "friendsock-bench/1"
PARAM_LABELS = {"bytes": "size", "connections": "N", "idle connections": "idle"}
_ERROR_WIDTH = 28  # an error in a cell is cut here; the full text is a note


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


# -- tables -----------------------------------------------------------------

# What each transport is, said once above the tables (the columns only name
# them).
TRANSPORT_LEGEND = {
    "tcp": "TCP: the loop's own TCP transport over loopback, the baseline",
    "unix": "AF_UNIX: the loop's own Unix-socket transport",
    "memory": "floor: a naive in-memory transport, what any in-process transport "
              "costs at least (call_soon(peer.data_received) on asyncio and uvloop, "
              "trio.testing.memory_stream_pair() on trio)",
    "friends": "Friends: friendsock's friend links, both ends in this process",
    "socketless": "Socketless: friend links with no kernel socket "
                  "(friendsock.set_socketless(True))",
}
COLUMN_LABELS = {"tcp": "TCP", "unix": "AF_UNIX", "memory": "floor", "friends": "Friends",
                 "socketless": "Socketless"}
COLUMN_ORDER = ("tcp", "unix", "memory", "friends", "socketless")


def format_value(value: Optional[float], unit: str) -> str:
    if value is None:
        return "-"
    if unit == "bytes/conn" or abs(value) >= 1000:
        return f"{value:,.0f}"
    if abs(value) >= 100:
        return f"{value:.0f}"
    if abs(value) >= 10:
        return f"{value:.1f}"
    return f"{value:.2f}"


def format_ratio(ratio: float) -> str:
    return f"{ratio:.1f}×" if ratio >= 10 else f"{ratio:.2f}×"


class _Footnotes:
    """Notes of one table, each listed once with the cells it concerns."""

    def __init__(self) -> None:
        self.notes: Dict[str, List[str]] = {}

    def add(self, text: str, where: str) -> int:
        places = self.notes.setdefault(text, [])
        if where not in places:
            places.append(where)
        return list(self.notes).index(text) + 1

    def render(self) -> List[str]:
        return [f"[{n}] {', '.join(places)}: {text}"
                for n, (text, places) in enumerate(self.notes.items(), 1)]


def _value_cell(case: Case, cell: Optional[Cell], transport: str, base: Optional[float],
                footnotes: _Footnotes, where: str, spread: bool) -> Text:
    """The median, its ratio to TCP's on the same loop below it, and with
    ``spread`` the rounds' min–max below that."""
    if cell is None:
        return Text("-")
    marks = [footnotes.add(note, where) for note in cell.notes]
    if cell.error is not None:
        # The whole message is a footnote and in the closing summary.
        n = footnotes.add(cell.error, where)
        return Text(f"{cell.error.split(':')[0]} [{n}]", style="red")
    unit = case.unit
    text = Text(format_value(cell.median, unit), style="bold")
    if transport in FRIEND_TRANSPORTS and cell.friend_verified is False:
        text.append(" †", style="bold yellow")
    if marks:
        text.append(" " + "".join(f"[{n}]" for n in marks), style="yellow")
    median = cell.median
    if transport != "tcp" and median is not None and base:
        ratio = median / base
        worse = transport == "friends" and _worse(case, median, base)
        text.append("\n" + format_ratio(ratio) + (" ▼" if worse else ""),
                    style="bold red" if worse else "cyan")
    if spread and len(cell.values) > 1:
        text.append(f"\n{format_value(cell.min, unit)}–{format_value(cell.max, unit)}",
                    style="dim")
    return text


def _has_cells(run: Run, case: Case, transport: str) -> bool:
    return any(key == case.key and t == transport for (key, _, _, t) in run.cells)


def _caption(run: Run, case: Case, has: Dict[str, bool], spread: bool) -> List[str]:
    rounds = rounds_for(case, run.config)
    caption = [f"{case.unit}, median of {rounds} round{'s' if rounds > 1 else ''}"
               + (" (min–max below)" if spread and rounds > 1 else "")
               + ("; lower is better" if not case.higher_is_better else "")
               + ("; ×: ratio to TCP on the same loop" if has["tcp"] else "")
               + ("; ▼: Friends below TCP" if has["friends"] and has["tcp"] else "")]
    if case.key in ("stream", "multi-stream") and has["friends"]:
        caption.append("friends hand each written bytes object to the receiver by reference; "
                       "the receiver only counts bytes")
    if case.test == "threads" and any(
            _fell_back(c) for (key, _, _, t), c in run.cells.items()
            if key == case.key and t == "friends"):
        caption.append("friends fell back to real TCP across threads (†): this friendsock "
                       "pairs only ends on one event loop, so the Friends column is TCP")
    if case.test == "blocking":
        caption.append("Friends: blocking sockets made under friendsock.patch_socket(); TCP and "
                       "AF_UNIX: plain blocking sockets"
                       + ("; no event loop in the path (measured once, in the asyncio row)"
                          if case.key in LOOPLESS_CASES else ""))
    if case.tls:
        caption.append("every transport runs TLS (ssl=): the loop's own TLS over TCP, AF_UNIX "
                       "and the friend link (uvloop's in C on uvloop)")
    if has["memory"] and case.test == "blocking":
        caption.append("floor: a naive hand-over between threads, no sockets (a "
                       "call_soon_threadsafe to the loop, a queue.SimpleQueue back)")
    elif has["memory"] and case.test == "threads":
        caption.append("floor: the naive in-memory transport between the two loops "
                       "(the other loop's call_soon_threadsafe(peer.data_received))")
    return caption


def build_table(run: Run, case: Case, spread: bool = False) -> Tuple[Table, List[str]]:
    config = run.config
    transports = config.transports
    loops = [loop for loop in config.loops if loop_runs(loop, case.key)]
    footnotes = _Footnotes()
    has = {t: t in transports for t in ("tcp", "unix", "friends")}
    # Socketless links and the floor exist in some tables only.
    for transport in ("socketless", "memory"):
        has[transport] = transport in transports and _has_cells(run, case, transport)
    table = Table(title=f"[bold]{case.key}[/bold] — {case.title}",
                  caption="\n".join(_caption(run, case, has, spread)),
                  box=box.SIMPLE_HEAVY, title_justify="left", caption_justify="left")
    table.add_column(PARAM_LABELS[case.param], justify="right", no_wrap=True)
    table.add_column("loop", no_wrap=True)
    shown = [t for t in COLUMN_ORDER if has[t]]
    for transport in shown:
        # Folded, never cut: a narrow terminal gets taller cells.
        table.add_column(COLUMN_LABELS[transport], justify="right", overflow="fold")
    for param in case.params:
        for i, loop in enumerate(loops):
            tcp = _median(run.cell(case.key, param, loop, "tcp"))
            row: List[Any] = [format_param(case, param) if i == 0 else "", loop]
            where = f"{format_param(case, param)} {loop}"
            for transport in shown:
                row.append(_value_cell(case, run.cell(case.key, param, loop, transport),
                                       transport, tcp, footnotes,
                                       f"{where} {COLUMN_LABELS[transport]}", spread))
            table.add_row(*row, end_section=i == len(loops) - 1)
    notes = footnotes.render()
    if any(c is not None and c.friend_verified is False
           for (key, _, _, t), c in run.cells.items()
           if key == case.key and t in FRIEND_TRANSPORTS):
        notes.insert(0, "† not from friend links: the connection fell back to real TCP")
    return table, notes


def _worse(case: Case, friends: Optional[float], tcp: Optional[float]) -> bool:
    """Whether the Friends figure is worse than Baseline TCP's."""
    if friends is None or tcp is None:
        return False
    return friends < tcp if case.higher_is_better else friends > tcp


def below_tcp(run: Run) -> List[Dict[str, Any]]:
    """Every cell where friends did worse than real TCP on the same loop in
    this run (a user must never lose by switching friendsock on)."""
    found = []
    for case in run.cases:
        for param in case.params:
            for loop in run.config.loops:
                friends = _median(run.cell(case.key, param, loop, "friends"))
                tcp = _median(run.cell(case.key, param, loop, "tcp"))
                if friends is not None and tcp is not None and _worse(case, friends, tcp):
                    found.append({"test": case.key, "param": param, "loop": loop,
                                  "friends": friends, "tcp": tcp,
                                  "ratio": friends / tcp if tcp else None})
    return found


def print_legend(console: Console, run: Run) -> None:
    """What each column is, once, above the tables."""
    for transport in COLUMN_ORDER:
        if transport in run.config.transports:
            console.print(Text(TRANSPORT_LEGEND[transport], style="dim"))
    console.print()


def print_tables(console: Console, run: Run, spread: bool = False) -> None:
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


# -- targets ----------------------------------------------------------------


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
)


def _median(cell: Optional[Cell]) -> Optional[float]:
    return cell.median if cell is not None and cell.error is None else None


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
        value, base_value = _median(cell), _median(base)
        ratio = value / base_value if value is not None and base_value else None
        # Where the table has a floor: what a transport with nothing in it
        # reaches against the same baseline (a target above it asks more
        # than handing bytes over in memory gives).
        floor = (None if target.baseline == "memory" else
                 _median(run.cell(target.case, target.param, target.loop, "memory")))
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


# -- plot -------------------------------------------------------------------


def _fell_back(cell: Optional[Cell]) -> bool:
    return cell is not None and cell.friend_verified is False

PLOT_SUFFIXES = (".png", ".svg", ".pdf")


# Friend links first: the picture is about them.
PLOT_ORDER = ("friends", "socketless", "unix", "memory")
def _short_param(case: Case, value: int) -> str:
    """A size as a tick has room for: 64, 1K, 64K, 1M."""
    return format_param(case, value).replace(" KiB", "K").replace(" MiB", "M").replace(" B", "")


LOOP_COLORS = {"asyncio": "tab:blue", "uvloop": "tab:orange", "trio": "tab:green",
               "anyio": "tab:purple"}


def plot(run: Run, path: str) -> None:
    """Draw the picture (:func:`draw`) to ``path``."""
    import matplotlib.pyplot as plt

    fig = draw(run)
    try:
        fig.savefig(path, dpi=110)
    finally:
        plt.close(fig)


def draw(run: Run) -> Any:
    """The picture, a matplotlib figure. One panel per table: bars of each transport's median as a ratio to
    TCP's on the same loop, grouped by transport (and size), one colour a
    loop; absolute figures when TCP was not run. One legend for the figure,
    above the panels: the loops and TCP's line."""
    import matplotlib

    matplotlib.use("Agg")  # files only; no display needed
    import matplotlib.pyplot as plt

    cases = [c for c in run.cases if any(k == c.key for k, *_ in run.cells)]
    if not cases:
        raise ValueError("nothing was measured")
    relative = "tcp" in run.config.transports
    ncols = min(3, len(cases))
    nrows = (len(cases) + ncols - 1) // ncols
    fig, axes = plt.subplots(nrows, ncols, figsize=(5.4 * ncols, 3.4 * nrows + 0.8),
                             squeeze=False, layout="constrained")
    loops_drawn: List[str] = []
    any_fell_back = False
    for ax, case in zip(axes.flat, cases):
        loops = [loop for loop in run.config.loops if loop_runs(loop, case.key)]
        width = 0.8 / max(1, len(loops))
        x = 0.0
        ticks: List[float] = []
        labels: List[str] = []
        values: List[float] = []
        bars = []
        # Several sizes: a tick a size, the transport's name once under its group.
        sized = len(case.params) > 1
        groups: List[Tuple[float, str]] = []
        for transport in PLOT_ORDER:
            if relative and transport == "tcp":
                continue
            params = [p for p in case.params
                      if any(run.cell(case.key, p, loop, transport) is not None
                             for loop in loops)]
            for param in params:
                for i, loop in enumerate(loops):
                    cell = run.cell(case.key, param, loop, transport)
                    value = _median(cell)
                    if relative and value is not None:
                        base = _median(run.cell(case.key, param, loop, "tcp"))
                        value = value / base if base else None
                    if value is None:
                        continue
                    fell_back = transport in FRIEND_TRANSPORTS and _fell_back(cell)
                    any_fell_back |= fell_back
                    bars += ax.bar(x + (i - (len(loops) - 1) / 2) * width, value, width * 0.92,
                                   color=LOOP_COLORS.get(loop, "tab:gray"),
                                   hatch="///" if fell_back else None,
                                   edgecolor="white" if fell_back else None)
                    values.append(value)
                    if loop not in loops_drawn:
                        loops_drawn.append(loop)
                ticks.append(x)
                labels.append(_short_param(case, param) if sized else COLUMN_LABELS[transport])
                x += 1.0
            if params:
                groups.append((x - (len(params) + 1) / 2, COLUMN_LABELS[transport]))
            x += 0.4  # a gap between transports
        if len(bars) <= 16:  # a figure on each bar, where they fit
            for bar in bars:
                ax.annotate(f"{bar.get_height():.3g}", (bar.get_x() + bar.get_width() / 2,
                                                        bar.get_height()),
                            ha="center", va="bottom", fontsize=7)
        if relative:
            ax.axhline(1.0, color="black", linewidth=1, linestyle="--")
            ax.set_ylabel("× TCP")
            if values and max(values) / max(min(values), 1e-9) > 20:
                ax.set_yscale("log")
        else:
            ax.set_ylabel(case.unit)
        ax.set_xticks(ticks)
        ax.set_xticklabels(labels, fontsize=8 if len(labels) <= 8 else 7)
        if sized:
            names = ax.secondary_xaxis("bottom")
            names.set_xticks([center for center, _ in groups])
            names.set_xticklabels([name for _, name in groups], fontsize=8)
            names.tick_params(length=0, pad=14)
            names.spines["bottom"].set_visible(False)
        sizes = "" if len(case.params) > 1 else f" {format_param(case, case.params[0])}"
        ax.set_title(f"{case.key}{sizes} ({case.unit}"
                     f"{', lower is better' if not case.higher_is_better else ''})", fontsize=10)
        ax.grid(True, axis="y", alpha=0.3)
    for ax in list(axes.flat)[len(cases):]:
        ax.set_visible(False)
    handles: List[Any] = [
        matplotlib.patches.Patch(color=LOOP_COLORS.get(loop, "tab:gray"), label=loop)
        for loop in loops_drawn]
    if relative:
        handles.append(matplotlib.lines.Line2D([], [], color="black", linestyle="--",
                                               label="TCP = 1"))
    fig.legend(handles=handles, loc="outside lower center", ncols=len(handles), frameon=False)
    title = (f"friendsock bench ({run.config.mode.name}, {os.cpu_count()} CPUs): "
             + ("each transport's figure over TCP's on the same loop" if relative
                else "medians"))
    if any_fell_back:
        title += "; hatched: fell back to TCP"
    fig.suptitle(title, fontsize=11)
    return fig


__all__ = ["collect_header", "make_console", "print_header", "print_tables", "print_summary",
           "print_targets", "evaluate_targets", "problem_cells", "RichProgress", "to_json",
           "plot"]
