"""The command line: ``python -m friendsock bench`` / ``friendsock-bench``."""

from __future__ import annotations

import argparse
import importlib
import importlib.util
import json
import os
import re
import shlex
import sys
from typing import Callable, List, Optional, Sequence, TypeVar

from ._plan import FULL, MODES, QUICK, TESTS, Config, Mode, default_cases, format_size
from ._runner import Runner
from ._transports import LOOPS, TRANSPORTS, TRIO_CASES

T = TypeVar("T")

MAX_SIZE = 64 * 1024 * 1024
MAX_CONNS = 10_000
MAX_IDLE = 100_000
_SIZE = re.compile(r"^\s*(\d+)\s*(?:([kKmM])(?:i?[bB])?|[bB])?\s*$")


def parse_size(text: str) -> int:
    """``64``, ``64B``, ``1K``, ``8KiB``, ``1M``, ``1MiB`` -> bytes (binary units)."""
    match = _SIZE.match(text)
    if not match:
        raise argparse.ArgumentTypeError(f"invalid size {text!r} (use e.g. 64, 1K, 64KiB, 1M)")
    size = int(match.group(1)) * {None: 1, "k": 1024, "m": 1024 * 1024}[
        match.group(2).lower() if match.group(2) else None]
    if not 1 <= size <= MAX_SIZE:
        raise argparse.ArgumentTypeError(f"size {text!r} out of range (1 B to 64 MiB)")
    return size


def _list_of(item: Callable[[str], T], what: str) -> Callable[[str], List[T]]:
    """A comma-separated list, each element parsed by ``item``; no duplicates."""

    def parse(text: str) -> List[T]:
        parts = [p.strip() for p in text.split(",")]
        if not all(parts):
            raise argparse.ArgumentTypeError(f"empty element in {what} list {text!r}")
        values = [item(p) for p in parts]
        return list(dict.fromkeys(values))

    return parse


def _choice(choices: Sequence[str], what: str, allow_all: bool = True) -> Callable[[str], List[str]]:
    def parse(text: str) -> List[str]:
        names = [p.strip().lower() for p in text.split(",")]
        if allow_all and names == ["all"]:
            return list(choices)
        unknown = [n for n in names if n not in choices]
        if unknown or not names:
            raise argparse.ArgumentTypeError(
                f"unknown {what} {', '.join(map(repr, unknown)) or repr(text)} "
                f"(choose from {', '.join(choices)}{', all' if allow_all else ''})")
        # Keep the canonical order: tables come out in a stable order.
        return [c for c in choices if c in names]

    return parse


def _count(low: int, high: int, what: str) -> Callable[[str], int]:
    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"invalid {what} {text!r} (a whole number)") from None
        if not low <= value <= high:
            raise argparse.ArgumentTypeError(f"{what} {value} out of range ({low} to {high})")
        return value

    return parse


def _seconds(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"invalid duration {text!r} (seconds, e.g. 0.5)") from None
    if not 0 < value <= 3600:
        raise argparse.ArgumentTypeError(f"duration {text!r} out of range (0 to 3600 s)")
    return value


DEFAULT_PLOT = "friendsock-bench.png"


def _trims(mode: Mode) -> str:
    return ", ".join(f"{key} at {'/'.join(format_size(p) for p in params)}"
                     for key, params in mode.trims)


def build_parser(prog: Optional[str] = None) -> argparse.ArgumentParser:
    cases = default_cases()
    sizes_help = "; ".join(f"{c.key}: {','.join(format_size(p).replace(' ', '') for p in c.params)}"
                           for c in cases if c.sized)
    parser = argparse.ArgumentParser(
        prog=prog or "friendsock-bench",
        description=(
            "netperf-style comparison of real TCP, AF_UNIX and friendsock's friend links on "
            "asyncio, uvloop, trio (also: trio.testing.memory_stream_pair) and anyio on trio "
            "(friends: unchanged anyio code under friendsock.trio.install()), printed "
            "in the form of the kernel TCP friends patch's tables."),
        epilog=(
            f"Quick (the default): the headline cells, those the targets judge "
            f"({', '.join(QUICK.tests)}; {_trims(QUICK)}), {QUICK.seconds:g} s per cell, "
            f"median of {QUICK.rounds} rounds: under a minute on 2 cores. Full: every test "
            f"and size, {FULL.seconds:g} s per cell, {FULL.rounds} rounds (memory: "
            f"{FULL.memory_rounds}). Default sizes: {sizes_help}. "
            f"The trio and anyio loops run {', '.join(TRIO_CASES)}. "
            "Exit status: 0, or 1 when a cell has no figure (an error, a hang, a time-out: "
            "each in the closing summary) unless --exit-zero, 2 for bad arguments, 130 when "
            "interrupted. See docs/benchmarks.md for the JSON shape."),
    )
    mode = parser.add_mutually_exclusive_group()
    mode.add_argument("--quick", dest="mode", action="store_const", const="quick",
                      help="the headline cells, short, for a first look (the default)")
    mode.add_argument("--full", dest="mode", action="store_const", const="full",
                      help="every test and size, longer cells and more rounds, for figures "
                           "to publish")
    parser.add_argument("--tests", type=_choice(TESTS, "test"), metavar="LIST",
                        help=f"comma-separated: {','.join(TESTS)}, or all (default: quick "
                             f"{','.join(QUICK.tests)}; full all)")
    parser.add_argument("--sizes", type=_list_of(parse_size, "size"), metavar="LIST",
                        help="message/write sizes for stream, rr, crr, streams-rr, threads and blocking, "
                             "e.g. 64,1K,64K,1M")
    parser.add_argument("--transports", type=_choice(TRANSPORTS, "transport"),
                        default=list(TRANSPORTS), metavar="LIST",
                        help=f"comma-separated: {','.join(TRANSPORTS)} (default all; memory: "
                             "the floor, a naive in-memory transport, on asyncio and uvloop; "
                             "trio.testing.memory_stream_pair on trio)")
    parser.add_argument("--loops", type=_choice(LOOPS, "loop"), metavar="LIST",
                        help=f"comma-separated: {','.join(LOOPS)} (default all installed; "
                             f"trio and anyio run {','.join(TRIO_CASES)})")
    parser.add_argument("--seconds", type=_seconds, metavar="S",
                        help="measured time per cell and round")
    parser.add_argument("--rounds", type=_count(1, 1000, "round count"), metavar="N",
                        help="rounds per cell (the figure is their median)")
    parser.add_argument("--conns", type=_list_of(_count(1, MAX_CONNS, "connection count"),
                                                 "connection count"),
                        metavar="LIST", help="connection counts for multi (default 1,16,64,256)")
    parser.add_argument("--idle", type=_list_of(_count(1, MAX_IDLE, "idle connection count"),
                                                "idle connection count"),
                        metavar="LIST", help="idle connection counts for memory (default 1000,5000)")
    parser.add_argument("--tls", action="store_true",
                        help="also run the stream and rr tests over TLS (tables stream-tls, "
                             "default 64 KiB, and rr-tls, default 64 B; --sizes applies): "
                             "Friends+TLS vs TCP+TLS vs AF_UNIX+TLS, on the asyncio loops only "
                             "(trio has no TLS rows); needs trustme for the certificates")
    parser.add_argument("--json", metavar="FILE", help="also write the results as JSON")
    parser.add_argument("--plot", metavar="FILE.png",
                        help=f"where to draw each table's ratios to TCP (default {DEFAULT_PLOT} "
                             "when matplotlib is installed; .png, .svg or .pdf)")
    parser.add_argument("--no-plot", action="store_true",
                        help=f"no {DEFAULT_PLOT} (an explicit --plot is still drawn)")
    parser.add_argument("--spread", action="store_true",
                        help="show each cell's min–max over its rounds under its median")
    parser.add_argument("--exit-zero", action="store_true",
                        help="exit 0 even when cells have no figure (for exploratory runs); "
                             "they are still listed in the closing summary")
    parser.add_argument("--no-progress", action="store_true", help="no progress bar")
    return parser


def _fail(prog: str, message: str) -> int:
    print(f"{prog}: error: {message}", file=sys.stderr)
    return 2


def _uvloop_installed() -> bool:
    return importlib.util.find_spec("uvloop") is not None


def _trio_installed() -> bool:
    """Whether the trio loop can run: its runner imports trio (not this
    module: no module imports both asyncio and trio)."""
    try:
        importlib.import_module("._trio_runner", __package__)
    except ImportError:
        return False
    return True


def _check_output(path: str) -> Optional[str]:
    directory = os.path.dirname(os.path.abspath(path))
    if not os.path.isdir(directory):
        return f"cannot write {path!r}: no directory {directory!r}"
    if not os.access(directory, os.W_OK):
        return f"cannot write {path!r}: {directory!r} is not writable"
    return None


def main(argv: Optional[Sequence[str]] = None, prog: Optional[str] = None) -> int:
    """Run the benchmark; returns the exit status (1: a cell has no figure,
    unless --exit-zero, or the JSON or picture could not be written;
    2: bad arguments; 130: interrupted)."""
    if argv is None:
        argv = sys.argv[1:]
    argv = list(argv)
    parser = build_parser(prog)
    prog = parser.prog
    args = parser.parse_args(argv)  # exits 2 on bad arguments

    trio_installed = _trio_installed()
    installed = {"asyncio": True, "uvloop": _uvloop_installed(), "trio": trio_installed,
                 "anyio": trio_installed and importlib.util.find_spec("anyio") is not None}
    missing = [] if args.loops is not None else [loop for loop in LOOPS if not installed[loop]]
    if args.loops is None:
        args.loops = [loop for loop in LOOPS if installed[loop]]
    elif "uvloop" in args.loops and not installed["uvloop"]:
        return _fail(prog, "uvloop is not installed (pip install uvloop, or --loops asyncio)")
    elif "trio" in args.loops and not installed["trio"]:
        return _fail(prog, "trio is not installed (pip install trio, or --loops asyncio)")
    elif "anyio" in args.loops and not installed["anyio"]:
        return _fail(prog, "the anyio loop needs anyio and trio (pip install anyio trio, "
                           "or --loops asyncio)")
    if importlib.util.find_spec("rich") is None:
        return _fail(prog, "the benchmark needs rich: pip install 'friendsock[bench]'")
    if args.plot is None and not args.no_plot and importlib.util.find_spec("matplotlib"):
        args.plot = DEFAULT_PLOT  # the picture comes with the run when it can be drawn
    if args.plot is not None:
        if importlib.util.find_spec("matplotlib") is None:
            return _fail(prog, "--plot needs matplotlib, which is not installed "
                               "(pip install matplotlib)")
        from ._plot import PLOT_SUFFIXES

        if not args.plot.lower().endswith(PLOT_SUFFIXES):
            return _fail(prog, f"--plot file must end in {', '.join(PLOT_SUFFIXES)}")
    if args.tls and importlib.util.find_spec("trustme") is None:
        return _fail(prog, "--tls needs trustme for its certificates (pip install trustme)")
    for path in (args.json, args.plot):
        problem = path is not None and _check_output(path)
        if problem:
            return _fail(prog, problem)

    mode = MODES[args.mode or "quick"]
    config = Config(
        tests=args.tests if args.tests is not None else list(mode.tests),
        transports=args.transports,
        loops=args.loops,
        mode=mode,
        seconds=args.seconds if args.seconds is not None else mode.seconds,
        rounds=args.rounds if args.rounds is not None else mode.rounds,
        memory_rounds=args.rounds if args.rounds is not None else mode.memory_rounds,
        sizes=args.sizes,
        conns=args.conns,
        idle=args.idle,
        tls=args.tls,
    )

    from . import _plot, _report

    console = _report.make_console()
    command = " ".join([prog, shlex.join(argv)]) if argv else prog
    progress = None if args.no_progress else _report.RichProgress()
    runner = Runner(config, progress)
    header = _report.collect_header(config, command)
    _report.print_header(console, header, runner.run)
    for loop in missing:
        runner.run.note(f"{loop} is not installed: no {loop} rows")
    kinds = [kind for kind in ("trio", "anyio") if kind in config.loops]
    without = [c.key for c in runner.run.cases if c.key not in TRIO_CASES]
    if kinds and without:
        runner.run.note(f"{' and '.join(kinds)} run{'s' if len(kinds) == 1 else ''} "
                        f"{', '.join(TRIO_CASES)} only: no "
                        f"{' or '.join(kinds)} rows in " + ", ".join(without))
    interrupted = False
    try:
        runner.execute()
    except KeyboardInterrupt:
        interrupted = True
    finally:
        if progress is not None:
            progress.stop()
    run = runner.run
    _report.print_tables(console, run, spread=args.spread)
    # The files first, so the closing summary is the last thing printed.
    written = True
    if args.json is not None:
        try:
            with open(args.json, "w") as f:
                json.dump(_report.to_json(run, header), f, indent=2)
                f.write("\n")
            console.print(f"wrote {args.json}")
        except OSError as exc:
            print(f"{prog}: error: cannot write {args.json!r}: {exc}", file=sys.stderr)
            written = False
    if args.plot is not None:
        try:
            _plot.plot(run, args.plot)
            console.print(f"wrote {args.plot}")
        except Exception as exc:  # a plot must not cost the run's results
            print(f"{prog}: error: cannot plot to {args.plot!r}: {exc}", file=sys.stderr)
            written = False
    if args.json is not None or args.plot is not None:
        console.print()
    status = _report.print_summary(console, run, exit_zero=args.exit_zero)
    if interrupted:
        return 130
    return status or (0 if written else 1)


if __name__ == "__main__":
    sys.exit(main())
