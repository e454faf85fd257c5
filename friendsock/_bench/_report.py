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

from ._runner import Case, Cell, Config, Progress, Run, cpu_counts, format_param
from ._transports import FRIEND_TRANSPORTS, LOOPLESS_CASES, loop_runs

JSON_FORMAT = "friendsock-bench/1"
TRANSPORT_LABELS = {"tcp": "Baseline TCP", "unix": "AF_UNIX", "friends": "Friends",
                    "socketless": "Socketless", "memory": "Memory floor"}
PARAM_LABELS = {"bytes": "size", "connections": "N", "idle connections": "idle"}
_ERROR_WIDTH = 28  # an error in a cell is cut here; the full text is a note


def _version(module: str) -> Optional[str]:
    try:
        from importlib.metadata import version

        return version(module)
    except Exception:  # not installed, or no metadata
        return None


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
    # Piped to a file, rich would assume 80 columns and squeeze the tables
    # (the widest, with trio's Memory pair and % mem, needs about 130).
    return Console(width=None if sys.stdout.isatty() else 140, highlight=False)


def print_header(console: Console, header: Dict[str, Any], run: Run) -> None:
    cpus = header["cpus"]
    if header["cpus_usable"] not in (None, cpus):
        cpus = f"{cpus} ({header['cpus_usable']} usable)"
    console.print(Text("friendsock bench", style="bold"))
    console.print(f"command:    {header['command']}", soft_wrap=True)
    console.print(f"python:     {header['python']}   friendsock: {header['friendsock']}   "
                  f"uvloop: {header['uvloop'] or 'not installed'}   "
                  f"trio: {header.get('trio') or 'not installed'}   CPUs: {cpus}")
    console.print(f"platform:   {header['platform']}   started: {header['started']}")
    console.print(f"mode:       {describe_mode(run)}", soft_wrap=True)
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
    from ._runner import default_cases

    for default in default_cases():
        if default.key == case.key:
            return default.params
    return case.params


# -- tables -----------------------------------------------------------------


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


def _percent(value: Optional[float], base: Optional[float]) -> str:
    if value is None or base is None or base <= 0:
        return "-"
    return f"{100 * value / base:.0f}%"


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


def _value_cell(cell: Optional[Cell], transport: str, unit: str, footnotes: _Footnotes,
                where: str) -> Text:
    if cell is None:
        return Text("-")
    marks = [footnotes.add(note, where) for note in cell.notes]
    if cell.error is not None:
        n = footnotes.add("error: " + cell.error, where)
        short = cell.error if len(cell.error) <= _ERROR_WIDTH else cell.error[:_ERROR_WIDTH - 1] + "…"
        return Text(f"error: {short} [{n}]", style="red")
    text = Text(format_value(cell.median, unit), style="bold")
    if transport in FRIEND_TRANSPORTS and cell.friend_verified is False:
        text.append(" †", style="bold yellow")
    if marks:
        text.append(" " + "".join(f"[{n}]" for n in marks), style="yellow")
    if len(cell.values) > 1:
        text.append(f"\n{format_value(cell.min, unit)}–{format_value(cell.max, unit)}", style="dim")
    return text


def _has_cells(run: Run, case: Case, transport: str) -> bool:
    return any(key == case.key and t == transport for (key, _, _, t) in run.cells)


def build_table(run: Run, case: Case) -> Tuple[Table, List[str]]:
    config = run.config
    transports = config.transports
    loops = [loop for loop in config.loops if loop_runs(loop, case.key)]
    footnotes = _Footnotes()
    rounds = config.memory_rounds if case.test == "memory" else config.rounds
    caption = [f"{case.unit}, median of {rounds} round{'s' if rounds > 1 else ''}"
               + (" (min–max below)" if rounds > 1 else "")
               + ("; lower is better" if not case.higher_is_better else "")]
    if case.key in ("stream", "multi-stream") and "friends" in transports:
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
    has = {t: t in transports for t in ("tcp", "unix", "friends")}
    # Socketless links exist on the asyncio loops, in some tables.
    has["socketless"] = "socketless" in transports and _has_cells(run, case, "socketless")
    if has["socketless"]:
        caption.append("Socketless: friend links made with no kernel socket "
                       "(friendsock.set_socketless(True)); % TCP: Socketless as % of TCP")
    # The floor exists in some tables only: a column where it ran.
    has["memory"] = "memory" in transports and _has_cells(run, case, "memory")
    if has["memory"] and case.test == "blocking":
        caption.append("Memory floor: a naive hand-over between threads, no sockets (the client "
                       "thread's sends reach the loop by call_soon_threadsafe, answers come back "
                       "through a queue.SimpleQueue; between two threads a SimpleQueue each way): "
                       "what waking a waiting thread costs, without a transport; % floor: "
                       "Friends as % of it")
    elif has["memory"] and case.test == "threads":
        caption.append("Memory floor: a naive in-memory transport between the two loops, what "
                       "any in-process transport across threads costs at least (two protocols "
                       "handing bytes with the other loop's call_soon_threadsafe("
                       "peer.data_received), no accounting); % floor: Friends as % of it")
    elif has["memory"]:
        caption.append("Memory floor: a naive in-memory transport, what any in-process "
                       "transport costs at least (asyncio, uvloop: two protocols handing bytes "
                       "with call_soon(peer.data_received), no accounting; trio: "
                       "trio.testing.memory_stream_pair()); % floor: Friends as % of it")
    if has["friends"] and has["tcp"]:
        caption.append("▼: Friends below Baseline TCP")
    table = Table(title=f"[bold]{case.key}[/bold] — {case.title}", caption="\n".join(caption),
                  box=box.SIMPLE_HEAVY, title_justify="left", caption_justify="left")
    table.add_column(PARAM_LABELS[case.param], justify="right", no_wrap=True)
    table.add_column("loop", no_wrap=True)
    if has["tcp"]:
        table.add_column("Baseline TCP", justify="right")
    if has["unix"]:
        table.add_column("AF_UNIX", justify="right")
        if has["tcp"]:
            table.add_column("% TCP", justify="right")
    if has["memory"]:
        table.add_column("Memory floor", justify="right")
    if has["friends"]:
        table.add_column("Friends", justify="right")
        if has["tcp"]:
            table.add_column("% TCP", justify="right")
        if has["unix"]:
            table.add_column("% AF_UNIX", justify="right")
        if has["memory"]:
            table.add_column("% floor", justify="right")
    if has["socketless"]:
        table.add_column("Socketless", justify="right")
        if has["tcp"]:
            table.add_column("% TCP", justify="right")
    for param in case.params:
        for i, loop in enumerate(loops):
            cells = {t: run.cell(case.key, param, loop, t) for t in transports}
            medians = {t: (c.median if c is not None and c.error is None else None)
                       for t, c in cells.items()}
            label = format_param(case, param) if i == 0 else ""
            row: List[Any] = [label, loop]
            where = f"{format_param(case, param)} {loop}"
            for transport in ("tcp", "unix", "memory", "friends", "socketless"):
                if not has[transport]:
                    continue
                row.append(_value_cell(cells[transport], transport, case.unit, footnotes,
                                       f"{where} {TRANSPORT_LABELS[transport]}"))
                if transport == "unix" and has["tcp"]:
                    row.append(_percent(medians["unix"], medians["tcp"]))
                if transport == "friends":
                    if has["tcp"]:
                        percent = _percent(medians["friends"], medians["tcp"])
                        if _worse(case, medians["friends"], medians["tcp"]):
                            row.append(Text(percent + " ▼", style="bold red"))
                        else:
                            row.append(percent)
                    if has["unix"]:
                        row.append(_percent(medians["friends"], medians["unix"]))
                    if has["memory"]:
                        row.append(_percent(medians["friends"], medians.get("memory")))
                if transport == "socketless" and has["tcp"]:
                    row.append(_percent(medians["socketless"], medians["tcp"]))
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
        console.print(Text(f"friends below TCP ({len(found)}): {cells}", style="bold red"),
                      soft_wrap=True)
    console.print()


def print_tables(console: Console, run: Run) -> None:
    for case in run.cases:
        if not any(key == case.key for key, *_ in run.cells):
            continue  # never reached (interrupted)
        table, notes = build_table(run, case)
        console.print(table)
        for note in notes:
            console.print(Text("  " + note, style="yellow"), soft_wrap=True)
        console.print()
    print_below_tcp(console, run)
    print_targets(console, run)


# -- targets ----------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class Target:
    """``transport`` >= ``ratio`` x ``baseline`` in one cell of one table."""

    name: str
    case: str
    param: int
    loop: str
    transport: str
    baseline: str
    ratio: float


TARGETS = (
    Target("trio rr 64 B: Friends >= 3x Baseline TCP", "rr", 64, "trio", "friends", "tcp", 3.0),
    Target("trio rr 64 B: Friends >= 75% of Memory pair (memory_stream_pair)",
           "rr", 64, "trio", "friends", "memory", 0.75),
    Target("anyio (on trio) rr 64 B: Friends >= 2.5x Baseline TCP", "rr", 64, "anyio", "friends",
           "tcp", 2.5),
    Target("streams-rr 64 B, asyncio: Friends >= 3x Baseline TCP",
           "streams-rr", 64, "asyncio", "friends", "tcp", 3.0),
    Target("streams-rr 64 B, uvloop: Friends >= 2.5x Baseline TCP",
           "streams-rr", 64, "uvloop", "friends", "tcp", 2.5),
    Target("streams-rr 64 B, asyncio: Friends >= the Memory floor",
           "streams-rr", 64, "asyncio", "friends", "memory", 1.0),
    Target("streams-rr 64 B, uvloop: Friends >= the Memory floor",
           "streams-rr", 64, "uvloop", "friends", "memory", 1.0),
    Target("crr 64 B, asyncio: Friends >= 2.5x Baseline TCP",
           "crr", 64, "asyncio", "friends", "tcp", 2.5),
    Target("crr 64 B, uvloop: Friends >= 1.3x Baseline TCP",
           "crr", 64, "uvloop", "friends", "tcp", 1.3),
    Target("crr 64 B, asyncio: Socketless >= 10x Baseline TCP",
           "crr", 64, "asyncio", "socketless", "tcp", 10.0),
    Target("crr 64 B, uvloop: Socketless >= 10x Baseline TCP",
           "crr", 64, "uvloop", "socketless", "tcp", 10.0),
    Target("threads-rr 64 B, asyncio: Friends >= 1.5x Baseline TCP",
           "threads-rr", 64, "asyncio", "friends", "tcp", 1.5),
    Target("threads-rr 64 B, uvloop: Friends >= 1.4x Baseline TCP",
           "threads-rr", 64, "uvloop", "friends", "tcp", 1.4),
    Target("blocking rr 64 B, client thread to asyncio server: Friends >= 1.5x Baseline TCP",
           "blocking-rr", 64, "asyncio", "friends", "tcp", 1.5),
    Target("blocking rr 64 B, blocking <-> blocking threads: Friends >= 2x Baseline TCP",
           "blocking-threads-rr", 64, "asyncio", "friends", "tcp", 2.0),
    Target("blocking stream 64 KiB, client thread to asyncio server: Friends >= 3x Baseline TCP",
           "blocking-stream", 64 * 1024, "asyncio", "friends", "tcp", 3.0),
    Target("blocking stream 64 KiB, blocking <-> blocking threads: Friends >= 3x Baseline TCP",
           "blocking-threads-stream", 64 * 1024, "asyncio", "friends", "tcp", 3.0),
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
            "target": target.name, "test": target.case, "param": target.param,
            "loop": target.loop, "transport": target.transport, "baseline": target.baseline,
            "required_ratio": target.ratio, "value": value, "baseline_value": base_value,
            "ratio": ratio, "floor_ratio": floor_ratio,
            "friend_verified": cell.friend_verified, "met": met,
        })
    return results


def _ratio_text(ratio: Optional[float], required: float) -> str:
    if ratio is None:
        return "-"
    return f"{ratio:.2f}x" if required >= 1 else f"{100 * ratio:.0f}%"


def print_targets(console: Console, run: Run) -> None:
    results = evaluate_targets(run)
    if not results:
        return
    table = Table(title="[bold]targets[/bold]", box=box.SIMPLE_HEAVY, title_justify="left")
    floors = any(result["floor_ratio"] is not None for result in results)
    columns = [("target", "left"), ("measured", "right"), ("ratio", "right")]
    if floors:
        columns.append(("floor's ratio", "right"))
    for name, justify in columns + [("met", "left")]:
        table.add_column(name, justify=justify)  # type: ignore[arg-type]
    for result in results:
        unit = next((c.unit for c in run.cases if c.key == result["test"]), "")
        measured = (f"{format_value(result['value'], unit)} / "
                    f"{format_value(result['baseline_value'], unit)}")
        met = result["met"]
        verdict = (Text("not measured", style="yellow") if met is None
                   else Text("yes", style="green") if met
                   else Text("no" + (" (not from friend links)"
                                     if result["friend_verified"] is False else ""), style="red"))
        row = [result["target"], measured, _ratio_text(result["ratio"], result["required_ratio"])]
        if floors:
            row.append(_ratio_text(result["floor_ratio"], result["required_ratio"]))
        table.add_row(*row, verdict)
    console.print(table)
    if floors:
        console.print("floor's ratio: the Memory floor against the same baseline, in the same "
                      "run (a target above it asks more than a transport with nothing in it "
                      "reaches)")
    console.print()


def print_footer(console: Console, run: Run) -> None:
    for note in run.notes:
        console.print(Text("note: " + note, style="yellow"), soft_wrap=True)
    state = "interrupted after" if run.interrupted else "finished in"
    per_test = ", ".join(f"{test} {seconds:.1f} s" for test, seconds in run.timings.items())
    console.print(f"{state} {run.elapsed:.1f} s" + (f" ({per_test})" if per_test else ""),
                  soft_wrap=True)


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
    """The machine-readable form; its shape is documented in benchmarks/README.md."""
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


def plot(run: Run, path: str) -> None:
    """One panel per table: each transport's median as a ratio to TCP's
    (absolute figures when TCP was not run)."""
    import matplotlib

    matplotlib.use("Agg")  # files only; no display needed
    import matplotlib.pyplot as plt

    cases = [c for c in run.cases if any(k == c.key for k, *_ in run.cells)]
    if not cases:
        raise ValueError("nothing was measured")
    ncols = min(3, len(cases))
    nrows = (len(cases) + ncols - 1) // ncols
    fig, axes = plt.subplots(nrows, ncols, figsize=(5.2 * ncols, 3.8 * nrows), squeeze=False)
    colors = {"tcp": "tab:gray", "unix": "tab:blue", "friends": "tab:red", "memory": "tab:green",
              "socketless": "tab:purple"}
    styles = {"asyncio": "-", "uvloop": "--", "trio": ":", "anyio": "-."}
    relative = "tcp" in run.config.transports
    for ax, case in zip(axes.flat, cases):
        xs = list(range(len(case.params)))
        ratios: List[float] = []
        for transport in run.config.transports:
            if relative and transport == "tcp":
                continue
            for loop in run.config.loops:
                if not any(run.cell(case.key, p, loop, transport) is not None
                           for p in case.params):
                    continue  # not run on this loop (memory off trio, trio's missing tests)
                ys: List[float] = []
                for param in case.params:
                    cell = run.cell(case.key, param, loop, transport)
                    value = cell.median if cell is not None and cell.error is None else None
                    if relative:
                        base = run.cell(case.key, param, loop, "tcp")
                        base_value = base.median if base is not None and base.error is None else None
                        value = value / base_value if value is not None and base_value else None
                    ys.append(float("nan") if value is None else value)
                ratios += [y for y in ys if y == y]
                label = f"{TRANSPORT_LABELS[transport]} ({loop})"
                fell_back = transport in FRIEND_TRANSPORTS and any(
                    _fell_back(run.cell(case.key, param, loop, transport)) for param in case.params)
                ax.plot(xs, ys, styles.get(loop, "-"), marker="o", color=colors[transport],
                        markerfacecolor="white" if fell_back else colors[transport],
                        label=label + (" - fell back to TCP" if fell_back else ""))
        if relative:
            ax.axhline(1.0, color=colors["tcp"], linewidth=1, label="Baseline TCP")
            ax.set_ylabel("ratio to TCP")
            if ratios and max(ratios) / max(min(ratios), 1e-9) > 20:
                ax.set_yscale("log")
        else:
            ax.set_ylabel(case.unit)
        ax.set_xticks(xs)
        ax.set_xticklabels([format_param(case, p) for p in case.params])
        ax.set_xlabel(PARAM_LABELS[case.param] if case.param != "bytes" else "size")
        ax.set_title(f"{case.key} ({case.unit}{', lower is better' if not case.higher_is_better else ''})",
                     fontsize=10)
        ax.grid(True, alpha=0.3)
        ax.legend(fontsize=7)
    for ax in list(axes.flat)[len(cases):]:
        ax.set_visible(False)
    fig.suptitle(f"friendsock bench ({run.config.mode.name}, {os.cpu_count()} CPUs): "
                 "AF_UNIX and friends relative to TCP" if relative else "friendsock bench")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


__all__ = ["collect_header", "make_console", "print_header", "print_tables", "print_footer",
           "print_targets", "evaluate_targets", "RichProgress", "to_json", "plot"]
