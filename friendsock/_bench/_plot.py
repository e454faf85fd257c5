"""The picture: a panel per table of each transport's median over TCP's on
the same loop (or the medians, without TCP), one colour a loop, drawn with
matplotlib (imported only when a picture is drawn)."""

from __future__ import annotations

import os
from typing import Any, List, Tuple

from ._plan import Case, format_param
from ._results import Run
from ._tables import COLUMN_LABELS, cell_median, fell_back_to_tcp
from ._transports import FRIEND_TRANSPORTS, loop_runs

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
                    value = cell_median(cell)
                    if relative and value is not None:
                        base = cell_median(run.cell(case.key, param, loop, "tcp"))
                        value = value / base if base else None
                    if value is None:
                        continue
                    fell_back = transport in FRIEND_TRANSPORTS and fell_back_to_tcp(cell)
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
