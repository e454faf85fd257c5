"""The report of what paired: printed at exit by ``python -m friendsock run``
and under ``FRIENDSOCK_INSTALL=1``, and in ``pytest --friendsock``'s
terminal summary. Built from :class:`FriendStats` snapshots only."""

from __future__ import annotations

import atexit
import json
import os
import sys
import types
from typing import Any, Dict, Iterable, List, Mapping, Optional, Sequence, Tuple

from ._core._stats import FriendStats, ListenerStats, listener_stats

# How many listeners the text report lists (the JSON report has them all).
TOP_LISTENERS = 10


def since(before: FriendStats, after: FriendStats) -> FriendStats:
    """What happened between two snapshots (``links_alive`` and ``pending``
    are ``after``'s own: they are states, not counts)."""
    listeners = []
    for address, now in after.listeners.items():
        then = before.listeners.get(address)
        old_parts = then.parts if then is not None else {}
        # Part by part: a part missing from ``before`` began after it (its
        # address's counts had been dropped for more recently used ones,
        # see MAX_PLACES), so all it has came since.
        parts = {}
        for serial, (made, fallbacks) in now.parts.items():
            old_made, old_fallbacks = old_parts.get(serial, (0, {}))
            parts[serial] = (made - old_made, _minus(fallbacks, old_fallbacks))
        listener = listener_stats(address, parts)
        if listener.links_made or listener.fallbacks:
            listeners.append(listener)
    listeners.sort(key=lambda s: (-s.links_made, -s.fell_back, s.address))
    return FriendStats(
        links_made=after.links_made - before.links_made,
        links_alive=after.links_alive,
        bytes_moved=after.bytes_moved - before.bytes_moved,
        fallbacks=_minus(after.fallbacks, before.fallbacks),
        pending=after.pending,
        listeners=types.MappingProxyType({s.address: s for s in listeners}),
        cross_process=after.cross_process - before.cross_process,
        cross_process_peers=_by_count({
            pid: count - before.cross_process_peers.get(pid, 0)
            for pid, count in after.cross_process_peers.items()
        }),
    )


def _by_count(counts: Mapping[int, int]) -> Mapping[int, int]:
    """Per-process counts, the most first, those above zero only."""
    ordered = sorted(((pid, n) for pid, n in counts.items() if n > 0), key=lambda item: (-item[1], item[0]))
    return types.MappingProxyType(dict(ordered))


def _minus(now: Mapping[str, int], then: Mapping[str, int]) -> Mapping[str, int]:
    return types.MappingProxyType(
        {reason: count - then.get(reason, 0) for reason, count in now.items()
         if count != then.get(reason, 0)}
    )


def as_dict(stats: FriendStats) -> Dict[str, Any]:
    """The report as JSON: every field of ``stats``, every listener."""
    return {
        "links_made": stats.links_made,
        "links_alive": stats.links_alive,
        "bytes_moved": stats.bytes_moved,
        "fallbacks": dict(stats.fallbacks),
        "pending": stats.pending,
        "listeners": {
            address: {"links_made": s.links_made, "fallbacks": dict(s.fallbacks)}
            for address, s in stats.listeners.items()
        },
        "cross_process": stats.cross_process,
        "cross_process_peers": {str(pid): count for pid, count in stats.cross_process_peers.items()},
    }


def from_dict(data: Mapping[str, Any]) -> FriendStats:
    """The report :func:`as_dict` gave, back (from another process)."""
    listeners = {
        address: ListenerStats(address, entry["links_made"], types.MappingProxyType(dict(entry["fallbacks"])))
        for address, entry in data["listeners"].items()
    }
    return FriendStats(
        links_made=data["links_made"],
        links_alive=data["links_alive"],
        bytes_moved=data["bytes_moved"],
        fallbacks=types.MappingProxyType(dict(data["fallbacks"])),
        pending=data["pending"],
        listeners=types.MappingProxyType(listeners),
        cross_process=data.get("cross_process", 0),
        cross_process_peers=_by_count({int(pid): count for pid, count
                                       in data.get("cross_process_peers", {}).items()}),
    )


def combined(parts: Sequence[FriendStats]) -> FriendStats:
    """Several processes' reports as one (pytest-xdist's workers): every
    count summed, per listener too."""
    by_address: Dict[str, List[ListenerStats]] = {}
    for part in parts:
        for address, s in part.listeners.items():
            by_address.setdefault(address, []).append(s)
    listeners = sorted((ListenerStats(address, sum(s.links_made for s in group),
                                      _summed(s.fallbacks for s in group))
                        for address, group in by_address.items()),
                       key=lambda s: (-s.links_made, -s.fell_back, s.address))
    return FriendStats(
        links_made=sum(part.links_made for part in parts),
        links_alive=sum(part.links_alive for part in parts),
        bytes_moved=sum(part.bytes_moved for part in parts),
        fallbacks=_summed(part.fallbacks for part in parts),
        pending=sum(part.pending for part in parts),
        listeners=types.MappingProxyType({s.address: s for s in listeners}),
        cross_process=sum(part.cross_process for part in parts),
        cross_process_peers=_by_count(_summed(part.cross_process_peers for part in parts)),
    )


def _summed(counts: Iterable[Mapping[Any, int]]) -> Mapping[Any, int]:
    total: Dict[Any, int] = {}
    for each in counts:
        for reason, count in each.items():
            total[reason] = total.get(reason, 0) + count
    return types.MappingProxyType(total)


def _size(count: int) -> str:
    if count < 1024:
        return f"{count:,} bytes"
    value = count / 1024
    units = ["KiB", "MiB", "GiB", "TiB"]
    while value >= 1024 and len(units) > 1:
        value /= 1024
        units.pop(0)
    return f"{value:,.1f} {units[0]}"


def _reasons(fallbacks: Mapping[str, int]) -> str:
    ordered = sorted(fallbacks.items(), key=lambda item: (-item[1], item[0]))
    return ", ".join(f"{reason} {count:,}" for reason, count in ordered)


def text_lines(stats: FriendStats, top: int = TOP_LISTENERS) -> List[str]:
    """The report for people: totals, then the listeners with most links."""
    fell_back = sum(stats.fallbacks.values())
    if not stats.links_made and not fell_back and not stats.cross_process:
        return ["no TCP connection went through friendsock"]
    lines = [
        f"links made:  {stats.links_made:,}"
        + (f" ({stats.links_alive:,} still open)" if stats.links_alive else ""),
        f"bytes moved: {_size(stats.bytes_moved)}",
        f"fell back:   {fell_back:,}" + (f" to real TCP ({_reasons(stats.fallbacks)})" if fell_back else ""),
    ]
    if stats.cross_process:
        lines.insert(1, f"between processes: {stats.cross_process:,} moved off TCP"
                     + _peer_list(stats.cross_process_peers))
    listeners = list(stats.listeners.values())
    if listeners:
        shown = listeners[:top]
        width = max(len("listener"), *(len(s.address) for s in shown))
        lines.append(f"{'listener':<{width}}  {'paired':>9}  {'fell back':>9}")
        for s in shown:
            why = f"  {_reasons(s.fallbacks)}" if s.fallbacks else ""
            lines.append(f"{s.address:<{width}}  {s.links_made:>9,}  {s.fell_back:>9,}{why}")
        if len(listeners) > top:
            lines.append(f"... and {len(listeners) - top:,} more addresses (a JSON report lists them all)")
    return lines


def _peer_list(peers: Mapping[int, int], top: int = 5) -> str:
    """`` (pid 4242: 20, pid 4243: 18)``: the other ends' processes."""
    if not peers:
        return ""
    shown = ", ".join(f"pid {pid}: {count:,}" for pid, count in list(peers.items())[:top])
    more = f", {len(peers) - top:,} more" if len(peers) > top else ""
    return f" ({shown}{more})"


# -- the report at exit ------------------------------------------------------

Target = Tuple[str, Optional[str]]  # ("stderr", None) or ("json", path)


def parse_target(text: str) -> Target:
    """``stderr`` or ``json=FILE``; ``ValueError`` for anything else."""
    text = text.strip()
    if text == "stderr":
        return ("stderr", None)
    kind, equals, path = text.partition("=")
    if kind == "json" and equals and path:
        return ("json", path)
    raise ValueError(f"unknown report target {text!r} (use stderr or json=FILE)")


class _AtExit:
    """What the report at exit does; set by the last caller of
    :func:`report_at_exit` (``run``'s options win over the environment's)."""

    registered = False
    targets: Sequence[Target] = ()
    only_if_used = False
    baseline: Optional[FriendStats] = None
    pid = 0


def report_at_exit(targets: Sequence[Target], *, only_if_used: bool = False) -> None:
    """Report what paired from now until the process exits to ``targets``.
    ``only_if_used``: print nothing on stderr when no connection went
    through friendsock (many processes started with the variable set never
    open one)."""
    from . import stats

    _AtExit.targets = tuple(targets)
    _AtExit.only_if_used = only_if_used
    _AtExit.baseline = stats()
    _AtExit.pid = os.getpid()
    if not _AtExit.registered:
        _AtExit.registered = True
        atexit.register(_report)


def leave_stderr_out_at_exit() -> None:
    """What would go to stderr at exit goes elsewhere (pytest's terminal
    summary): the report at exit leaves stderr out (``FRIENDSOCK_INSTALL=1``
    under ``pytest --friendsock``); its JSON files stay."""
    _AtExit.targets = tuple(target for target in _AtExit.targets if target[0] != "stderr")


def _report() -> None:
    from . import stats

    if os.getpid() != _AtExit.pid or _AtExit.baseline is None:
        return  # a forked child: its parent reports
    report = since(_AtExit.baseline, stats())
    for kind, path in _AtExit.targets:
        if kind == "json" and path is not None:
            path = path.replace("{pid}", str(_AtExit.pid))
            try:
                with open(path, "w", encoding="utf-8") as file:
                    json.dump(as_dict(report), file, indent=2)
                    file.write("\n")
            except OSError as exc:
                _say([f"could not write the report to {path}: {exc}"])
        elif not (_AtExit.only_if_used and not report.links_made and not report.fallbacks
                  and not report.cross_process):
            _say(text_lines(report))


def _say(lines: List[str]) -> None:
    try:
        sys.stderr.write("".join(f"friendsock: {line}\n" for line in lines))
        sys.stderr.flush()
    except (OSError, ValueError, AttributeError):  # stderr closed or gone
        pass


def targets_from_environment(value: Optional[str]) -> List[Target]:
    """``FRIENDSOCK_REPORT``: ``stderr`` (unset: the default), ``off``, or
    ``json=FILE``, several comma-separated. A value it does not understand
    is reported once and taken as the default."""
    if value is None or not value.strip():
        return [("stderr", None)]
    if value.strip().lower() in ("off", "0", "no", "false", "quiet"):
        return []
    try:
        return [parse_target(part) for part in value.split(",")]
    except ValueError as exc:
        _say([f"FRIENDSOCK_REPORT: {exc}; reporting to stderr"])
        return [("stderr", None)]
