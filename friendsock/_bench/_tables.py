"""The tables, one per case: a row per parameter and loop, a column per
transport (TCP, AF_UNIX, the floor, Friends, Socketless), each cell the
median with its ratio to TCP's on the same loop; the legend above them, the
caption and footnotes of each, and the cells where friends did worse than
TCP."""

from __future__ import annotations

from typing import Any, Dict, List, Optional, Tuple

from rich import box
from rich.console import Console
from rich.table import Table
from rich.text import Text

from ._plan import Case, format_param, rounds_for
from ._results import Cell, Run
from ._transports import FRIEND_TRANSPORTS, LOOPLESS_CASES, loop_runs

PARAM_LABELS = {"bytes": "size", "connections": "N", "idle connections": "idle"}
_ERROR_WIDTH = 28  # an error in a cell is cut here; the full text is a note

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


def cell_median(cell: Optional[Cell]) -> Optional[float]:
    """The cell's figure: its median, None when it is missing or failed."""
    return cell.median if cell is not None and cell.error is None else None


def fell_back_to_tcp(cell: Optional[Cell]) -> bool:
    """Whether a round of the cell was not over friend links (the
    connection fell back to real TCP)."""
    return cell is not None and cell.friend_verified is False


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
            fell_back_to_tcp(c) for (key, _, _, t), c in run.cells.items()
            if key == case.key and t == "friends"):
        caption.append("friends fell back to real TCP across threads (†): this friendsock "
                       "pairs only ends on one event loop, so the Friends column is TCP")
    if case.test == "blocking":
        caption.append("Friends: blocking sockets made under friendsock.patch_socket(); TCP and "
                       "AF_UNIX: plain blocking sockets"
                       + ("; no event loop in the path (measured once, in the asyncio row)"
                          if case.key in LOOPLESS_CASES else ""))
    if case.test == "processes":
        caption.append("the server in a second process on this host, on the same kind of loop; "
                       "Friends: friendsock at both ends, each connection moved off TCP to a "
                       "socketpair between the two processes (in-process friends: the rr, "
                       "stream and crr tables)")
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
            tcp = cell_median(run.cell(case.key, param, loop, "tcp"))
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
                friends = cell_median(run.cell(case.key, param, loop, "friends"))
                tcp = cell_median(run.cell(case.key, param, loop, "tcp"))
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
