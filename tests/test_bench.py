"""The benchmark tool: every test, transport and loop runs (for a moment), the
JSON has its documented shape, friend figures come from friend links, and
bad arguments exit 2. No test asserts a speed.

Plain sync tests: the tool makes and runs its own event loops (asyncio,
uvloop, and trio through ``trio.run``). This module does not import trio
(no module imports both asyncio and trio): the trio workloads are patched
through ``_trio_workloads``.
"""

from __future__ import annotations

import argparse
import asyncio
import importlib.util
import json
import os
import resource
import subprocess
import sys
import time

import pytest
from rich.console import Console

import friendsock
from friendsock._bench import (
    _cli, _loop_runner, _plan, _plot, _results, _rr_workloads, _runner, _server_process,
    _tables, _targets, _transports,
)
from friendsock._bench._cli import main, parse_size

HAVE_MATPLOTLIB = importlib.util.find_spec("matplotlib") is not None
HAVE_TRIO = _cli._trio_installed()
if HAVE_TRIO:
    from friendsock._bench import _trio_workloads
needs_trio = pytest.mark.skipif(not HAVE_TRIO, reason="trio is not installed")
CASE_KEYS = {
    "stream", "rr", "crr", "streams-rr", "multi-rr", "multi-stream",
    "threads-rr", "threads-stream", "memory-heap", "memory-rss",
    "blocking-rr", "blocking-stream", "blocking-threads-rr", "blocking-threads-stream",
    "processes-rr", "processes-stream", "processes-agg", "processes-crr",
}
# Blocking sockets at both ends: no event loop, one (asyncio) row.
LOOPLESS_CASE_KEYS = {"blocking-threads-rr", "blocking-threads-stream"}
TRIO_CASE_KEYS = {"stream", "rr", "crr"}
MEMORY_CASE_KEYS = {"stream", "rr", "crr", "streams-rr", "threads-rr", "threads-stream",
                    "blocking-rr", "blocking-stream", "blocking-threads-rr", "blocking-threads-stream"}
SOCKETLESS_CASE_KEYS = {"rr", "crr", "streams-rr", "memory-heap", "memory-rss"}
LOOPS = ["asyncio", "uvloop"] + (["trio", "anyio"] if HAVE_TRIO else [])
CELL_KEYS = {"median", "min", "max", "rounds", "unit", "friend_verified", "error", "notes"}
TINY = ["--seconds", "0.02", "--rounds", "1", "--no-progress", "--no-plot"]


def _run_json(tmp_path, argv, status=0):
    path = tmp_path / "out.json"
    assert main([*argv, "--json", str(path)]) == status
    return json.loads(path.read_text())


def _words(text):
    """The output as words: lines are wrapped to the terminal's width."""
    return " ".join(text.split())


@pytest.fixture(autouse=True)
def switches_left_as_found():
    """A run leaves the process-wide switches as it found them (the
    socketless transport turns socketless links on for its connects)."""
    yield
    assert friendsock.is_enabled() and not friendsock.is_socketless()


@pytest.mark.timeout(240)  # every test on every transport and loop: 16 s alone, far more on a busy machine
def test_every_test_transport_and_loop(tmp_path, capsys):
    plot = tmp_path / "out.png"
    argv = [*TINY, "--tests", "all", "--sizes", "64,64K", "--conns", "1,3", "--idle", "20"]
    if HAVE_MATPLOTLIB:
        argv += ["--plot", str(plot)]
    data = _run_json(tmp_path, argv)
    out = _words(capsys.readouterr().out)

    assert data["format"] == "friendsock-bench/1"
    header = data["header"]
    for key in ("command", "python", "friendsock", "uvloop", "trio", "anyio", "cpus", "mode", "seconds",
                "rounds", "transports", "loops", "elapsed_s", "interrupted"):
        assert key in header
    assert header["loops"] == LOOPS
    assert header["transports"] == ["tcp", "unix", "friends", "socketless", "memory"]
    assert set(data["tests"]) == CASE_KEYS

    fell_back = False
    for key, test in data["tests"].items():
        assert {"test", "title", "unit", "param", "higher_is_better", "rounds",
                "results"} <= set(test)
        assert test["results"], key
        for param, per_loop in test["results"].items():
            assert int(param) > 0
            loops = (set(LOOPS) if key in TRIO_CASE_KEYS else {"asyncio"} if key in LOOPLESS_CASE_KEYS
                     else {"asyncio", "uvloop"})
            assert set(per_loop) == loops, (key, param)
            for loop, per_transport in per_loop.items():
                # The memory floor: some tables, not on anyio.
                floor = loop != "anyio" and key in MEMORY_CASE_KEYS
                socketless = key in SOCKETLESS_CASE_KEYS
                transports = ({"tcp", "unix", "friends"} | ({"memory"} if floor else set())
                              | ({"socketless"} if socketless else set()))
                assert set(per_transport) == transports, (key, param, loop)
                for transport, cell in per_transport.items():
                    where = (key, param, loop, transport)
                    assert set(cell) == CELL_KEYS, where
                    assert cell["error"] is None, (where, cell["error"])
                    assert len(cell["rounds"]) == 1, where
                    assert cell["min"] <= cell["median"] <= cell["max"], where
                    # No speed: a 20 ms window may see nothing (a thread
                    # waiting for the GIL); RSS grows by whole pages.
                    assert cell["median"] >= 0 or key == "memory-rss", where
                    assert cell["unit"] == test["unit"]
                    if transport not in ("friends", "socketless"):
                        assert cell["friend_verified"] is None, where
                    elif key == "processes-crr" and cell["friend_verified"] is False:
                        # After a few connections this short, a friendsock
                        # client connects to that server over TCP; no other
                        # reason to stay on TCP is taken.
                        assert cell["notes"] == [_SHORT_LIVED_NOTE], where
                    elif test["test"] == "threads" and cell["friend_verified"] is False:
                        # Where cross-thread friends do not exist, they fall
                        # back, and the cell says so.
                        assert any("fell back" in note and "other-loop" in note
                                   for note in cell["notes"]), where
                        fell_back = True
                    else:
                        assert cell["friend_verified"] is True, (where, cell["notes"])

    for title in ("stream", "rr", "crr", "streams-rr", "multi-rr", "multi-stream",
                  "threads-rr", "threads-stream", "memory-heap", "memory-rss",
                  "blocking-rr", "blocking-stream", "blocking-threads-rr", "blocking-threads-stream",
                  "processes-rr", "processes-stream", "processes-agg", "processes-crr"):
        assert f"{title} — " in out
    assert "the baseline" in out and "AF_UNIX" in out and "Friends" in out
    assert ("friends fell back to real TCP across threads" in out) == fell_back
    assert "uvloop" in out and "CPUs" in out and "command:" in out
    if HAVE_TRIO:
        assert "floor: a naive in-memory transport" in out and "targets — " in out
        assert "trio and anyio run stream, rr, crr only: no trio or anyio rows in" in out
        _check_targets(data, met_known=True, loops=("trio", "anyio", "asyncio", "uvloop"))
    if HAVE_MATPLOTLIB:
        assert plot.read_bytes().startswith(b"\x89PNG")


TARGET_RATIOS = {
    ("rr", 64, "trio", "friends", "tcp"): 3.0, ("rr", 64, "trio", "friends", "memory"): 0.75,
    ("rr", 64, "anyio", "friends", "tcp"): 2.5,
    ("streams-rr", 64, "asyncio", "friends", "tcp"): 3.0,
    ("streams-rr", 64, "uvloop", "friends", "tcp"): 2.5,
    ("streams-rr", 64, "asyncio", "friends", "memory"): 1.0,
    ("streams-rr", 64, "uvloop", "friends", "memory"): 1.0,
    ("crr", 64, "asyncio", "friends", "tcp"): 2.5, ("crr", 64, "uvloop", "friends", "tcp"): 1.3,
    ("crr", 64, "asyncio", "socketless", "tcp"): 10.0,
    ("crr", 64, "uvloop", "socketless", "tcp"): 10.0,
    ("threads-rr", 64, "asyncio", "friends", "tcp"): 1.5,
    ("threads-rr", 64, "uvloop", "friends", "tcp"): 1.4,
    ("blocking-rr", 64, "asyncio", "friends", "tcp"): 1.5,
    ("blocking-threads-rr", 64, "asyncio", "friends", "tcp"): 2.0,
    ("blocking-stream", 65536, "asyncio", "friends", "tcp"): 3.0,
    ("blocking-threads-stream", 65536, "asyncio", "friends", "tcp"): 3.0,
    **{target: ratio for loop in ("asyncio", "uvloop") for target, ratio in {
        ("processes-rr", 64, loop, "friends", "tcp"): 1.4,
        ("processes-rr", 64, loop, "friends", "unix"): 1.0,
        ("processes-stream", 65536, loop, "friends", "tcp"): 1.5,
        ("processes-stream", 65536, loop, "friends", "unix"): 1.0,
        ("processes-agg", 64, loop, "friends", "unix"): 1.0,
        ("processes-crr", 64, loop, "friends", "tcp"): 1.2,
    }.items()},
}
_SHORT_LIVED_NOTE = ("not every connection moved; fallbacks: short-lived (a connection this "
                     "short is not moved: the move would not pay)")


def _check_targets(data, met_known, loops=("trio", "anyio")):
    """The targets whose cells ran (in ``loops``), each with its ratio."""
    targets = {(t["test"], t["param"], t["loop"], t["transport"], t["baseline"]): t
               for t in data["targets"]}
    assert set(targets) == {key for key in TARGET_RATIOS
                            if key[2] in loops and key[0] in data["tests"]
                            and str(key[1]) in data["tests"][key[0]]["results"]}
    for key, target in targets.items():
        assert target["required_ratio"] == TARGET_RATIOS[key]
        if met_known and target["baseline_value"]:
            # No speed: only that a verdict came out of two figures (a
            # 20 ms window may see nothing, and then there is no ratio).
            assert target["met"] in (True, False)
            assert target["ratio"] == pytest.approx(target["value"] / target["baseline_value"])
        # The floor's own ratio to the baseline, where the table has a floor
        # that is not the baseline itself.
        floor = data["tests"][key[0]]["results"][str(key[1])][key[2]].get("memory")
        if key[4] == "memory" or floor is None or floor["error"] is not None:
            assert target["floor_ratio"] is None, key
        else:
            assert target["floor_ratio"] == pytest.approx(floor["median"] / target["baseline_value"])


def test_selection_and_order(tmp_path):
    data = _run_json(tmp_path, [*TINY, "--tests", "rr", "--sizes", "1K", "--loops", "asyncio",
                                "--transports", "friends,tcp"])
    assert list(data["tests"]) == ["rr"]
    assert list(data["tests"]["rr"]["results"]) == ["1024"]
    cells = data["tests"]["rr"]["results"]["1024"]["asyncio"]
    assert list(cells) == ["tcp", "friends"]
    assert cells["friends"]["friend_verified"] is True


def test_blocking_tables(tmp_path, capsys):
    """The blocking test: a blocking client thread to a server on each
    asyncio loop, and blocking sockets at both ends (one row: no loop in
    the path); friends are sockets made under patch_socket(), verified as
    friend links; the patch is undone after."""
    data = _run_json(tmp_path, [*TINY, "--tests", "blocking", "--sizes", "64,64K",
                                "--loops", "asyncio,uvloop"])
    out = capsys.readouterr().out
    assert set(data["tests"]) == {"blocking-rr", "blocking-stream", "blocking-threads-rr",
                                  "blocking-threads-stream"}
    for key, test in data["tests"].items():
        assert test["test"] == "blocking"
        for param, per_loop in test["results"].items():
            loops = ["asyncio"] if key in LOOPLESS_CASE_KEYS else ["asyncio", "uvloop"]
            assert list(per_loop) == loops, (key, param)
            for loop, cells in per_loop.items():
                assert list(cells) == ["tcp", "unix", "friends", "memory"], (key, param, loop)
                for transport, cell in cells.items():
                    assert cell["error"] is None, (key, param, loop, transport, cell["error"])
                    assert cell["median"] >= 0
                assert cells["friends"]["friend_verified"] is True, (key, cells["friends"]["notes"])
                assert (cells["tcp"]["friend_verified"] is cells["unix"]["friend_verified"]
                        is cells["memory"]["friend_verified"] is None)
    _check_targets(data, met_known=True, loops=("asyncio",))
    assert len(data["targets"]) == 4
    assert all(target["floor_ratio"] is not None for target in data["targets"])
    assert "blocking-threads-rr — " in out and "patch_socket()" in out
    words = _words(out)
    assert "no event loop in the path" in words
    assert "a naive hand-over between threads" in words and "the floor's own ratio" in words
    assert not friendsock.is_socket_patched()


def test_blocking_friends_that_did_not_pair_are_marked(tmp_path, capsys):
    friendsock.set_enabled(False)  # every friends connection falls back
    try:
        data = _run_json(tmp_path, [*TINY, "--tests", "blocking", "--sizes", "64",
                                    "--loops", "asyncio", "--transports", "tcp,friends"])
    finally:
        friendsock.set_enabled(True)
    for key, test in data["tests"].items():
        cell = test["results"]["64"]["asyncio"]["friends"]
        assert cell["error"] is None and cell["median"] >= 0, key
        assert cell["friend_verified"] is False, key
        assert any("fell back" in note for note in cell["notes"]), (key, cell["notes"])
    assert "†" in capsys.readouterr().out


@pytest.fixture
def server_processes(monkeypatch):
    """The pids of the server processes the run starts."""
    pids = []
    start = _server_process.ServerProcess.__init__

    def recording(self, *args, **kwargs):
        start(self, *args, **kwargs)
        pids.append(self.pid)

    monkeypatch.setattr(_server_process.ServerProcess, "__init__", recording)
    return pids


def _gone(pid):
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    return False


def test_processes_tables(tmp_path, capsys, server_processes):
    """The processes test: a server process of each loop's kind; friends
    are connections moved off TCP to that process (verified by its pid),
    TCP and AF_UNIX are not; the server processes are gone after."""
    data = _run_json(tmp_path, [*TINY, "--tests", "processes", "--loops", "asyncio,uvloop"])
    assert list(data["tests"]) == ["processes-rr", "processes-stream", "processes-agg",
                                   "processes-crr"]
    assert len(server_processes) == 2 and all(map(_gone, server_processes))
    for key, test in data["tests"].items():
        [param] = test["results"]
        assert param == {"processes-stream": "65536", "processes-agg": "64"}.get(key, "64")
        for loop in ("asyncio", "uvloop"):
            cells = test["results"][param][loop]
            assert list(cells) == ["tcp", "unix", "friends"], (key, loop)
            for transport, cell in cells.items():
                assert cell["error"] is None and cell["median"] >= 0, (key, loop, transport)
            assert cells["tcp"]["friend_verified"] is None
            assert cells["unix"]["friend_verified"] is None
            friends = cells["friends"]
            if key == "processes-crr" and friends["friend_verified"] is False:
                assert friends["notes"] == [_SHORT_LIVED_NOTE], loop
            else:
                assert friends["friend_verified"] is True, (key, loop, friends["notes"])
    out = _words(capsys.readouterr().out)
    assert "the server in a second process on this host" in out
    assert "processes-agg 64, uvloop: Friends ≥ AF_UNIX" in out
    assert "every cell measured" in out


def test_processes_friends_that_did_not_move_are_marked(tmp_path, monkeypatch, capsys):
    """A server process with moves between processes switched off: the
    friends cells are TCP's connections, marked, with the reason."""
    monkeypatch.setenv("FRIENDSOCK_CROSS_PROCESS", "0")  # read as the server starts
    data = _run_json(tmp_path, [*TINY, "--tests", "processes", "--loops", "asyncio"])
    for key, test in data["tests"].items():
        [cells] = [row["asyncio"] for row in test["results"].values()]
        friends = cells["friends"]
        assert friends["error"] is None and friends["median"] >= 0, key
        assert friends["friend_verified"] is False, key
        assert any("no-listener" in note for note in friends["notes"]), (key, friends["notes"])
    assert "†" in capsys.readouterr().out


def test_a_server_process_that_cannot_start_is_reported(tmp_path, monkeypatch, capsys):
    def refuse(self, kind, directory):
        raise OSError(f"no {kind} server today")

    monkeypatch.setattr(_server_process.ServerProcess, "__init__", refuse)
    data = _run_json(tmp_path, [*TINY, "--tests", "processes,rr", "--sizes", "64",
                                "--loops", "asyncio"], status=1)
    for key in ("processes-rr", "processes-crr"):
        for cell in data["tests"][key]["results"]["64"]["asyncio"].values():
            assert cell["error"] == ("could not start the server process: "
                                     "OSError: no asyncio server today"), key
    assert data["tests"]["rr"]["results"]["64"]["asyncio"]["friends"]["error"] is None
    assert "cells with no figure" in capsys.readouterr().out


def test_friends_that_did_not_pair_are_marked(tmp_path, capsys):
    friendsock.set_enabled(False)  # every friends connection falls back
    try:
        data = _run_json(tmp_path, [*TINY, "--tests", "rr,crr", "--sizes", "64",
                                    "--loops", "asyncio"])
    finally:
        friendsock.set_enabled(True)
    for key in ("rr", "crr"):
        cell = data["tests"][key]["results"]["64"]["asyncio"]["friends"]
        assert cell["error"] is None and cell["median"] >= 0
        assert cell["friend_verified"] is False
        assert any("disabled" in note for note in cell["notes"]), cell["notes"]
    out = capsys.readouterr().out
    assert "†" in out and "not from friend links" in out


def _summary(out):
    """The lines of the closing summary."""
    return out[out.rindex("\nsummary\n"):].splitlines()[2:]


def test_failing_transport_is_reported_and_the_run_goes_on(tmp_path, monkeypatch, capsys):
    measure = _rr_workloads.RRWorkload.measure

    async def failing(self, seconds, warmup):
        if self.transport == "friends":
            raise RuntimeError("boom")
        return await measure(self, seconds, warmup)

    monkeypatch.setattr(_rr_workloads.RRWorkload, "measure", failing)
    argv = [*TINY, "--tests", "rr,crr", "--sizes", "64", "--loops", "asyncio"]
    data = _run_json(tmp_path, argv, status=1)
    rr = data["tests"]["rr"]["results"]["64"]["asyncio"]
    assert "boom" in rr["friends"]["error"]
    assert rr["friends"]["median"] is None
    assert rr["tcp"]["error"] is None and rr["tcp"]["median"] > 0
    crr = data["tests"]["crr"]["results"]["64"]["asyncio"]
    assert crr["friends"]["error"] is None and crr["friends"]["friend_verified"] is True
    # The closing summary names the cell and why, and the exit status says so.
    summary = _summary(capsys.readouterr().out)
    assert "cells with no figure (1):" in summary
    assert "  rr 64 B asyncio Friends: RuntimeError: boom" in summary
    assert summary[-1].startswith("exit status 1")
    # --exit-zero keeps 0 for exploratory runs; the summary still lists it.
    assert main([*argv, "--exit-zero"]) == 0
    summary = _summary(capsys.readouterr().out)
    assert "  rr 64 B asyncio Friends: RuntimeError: boom" in summary
    assert summary[-1] == "exit status 0 (--exit-zero)"


def test_a_clean_run_says_so_and_exits_0(capsys):
    assert main([*TINY, "--tests", "rr", "--sizes", "64", "--loops", "asyncio"]) == 0
    summary = _summary(capsys.readouterr().out)
    assert summary[-1] == "every cell measured"
    assert not any("no figure" in line or "exit status" in line for line in summary)


def test_a_hung_loop_is_reported_and_the_run_goes_on(tmp_path, monkeypatch, capsys):
    monkeypatch.setattr(_loop_runner, "WATCHDOG_GRACE", 0.3)
    # Enough for a healthy cell on a loaded machine; a stuck one is given up on then.
    monkeypatch.setattr(_runner, "MEASURE_SLACK", 2.0)
    measure = _rr_workloads.RRWorkload.measure

    def spin() -> None:  # a callback that never returns
        while True:
            time.sleep(0.001)

    async def hanging(self, seconds, warmup):
        if self.transport == "unix":
            asyncio.get_running_loop().call_soon(spin)
            await asyncio.sleep(1)
        return await measure(self, seconds, warmup)

    monkeypatch.setattr(_rr_workloads.RRWorkload, "measure", hanging)
    data = _run_json(tmp_path, [*TINY, "--tests", "rr", "--sizes", "64,1K",
                                "--loops", "asyncio"], status=1)
    rr = data["tests"]["rr"]["results"]
    assert rr["64"]["asyncio"]["unix"]["error"].startswith("hung")
    assert rr["1024"]["asyncio"]["unix"]["error"].startswith("skipped")
    for size in ("64", "1024"):
        assert rr[size]["asyncio"]["tcp"]["median"] > 0
        assert rr[size]["asyncio"]["friends"]["friend_verified"] is True
    # Both the hang and the cell it skipped are in the closing summary.
    summary = _summary(capsys.readouterr().out)
    assert "cells with no figure (2):" in summary
    assert any(line.startswith("  rr 64 B asyncio AF_UNIX: hung: ") for line in summary)
    assert "  rr 1 KiB asyncio AF_UNIX: skipped: hung earlier in this test" in summary
    assert summary[-1].startswith("exit status 1")


def test_tls_cells(tmp_path, capsys):
    """--tls adds stream-tls and rr-tls for the selected tests: every
    transport with ssl=, friends verified as friend links; no trio rows."""
    loops = ",".join(LOOPS)
    data = _run_json(tmp_path, [*TINY, "--tls", "--tests", "rr,stream", "--sizes", "64",
                                "--loops", loops])
    assert data["header"]["tls"] is True
    assert list(data["tests"]) == ["stream", "stream-tls", "rr", "rr-tls"]
    for key in ("stream-tls", "rr-tls"):
        per_loop = data["tests"][key]["results"]["64"]
        assert list(per_loop) == ["asyncio", "uvloop"]
        for loop, cells in per_loop.items():
            assert list(cells) == ["tcp", "unix", "friends"], (key, loop)
            for transport, cell in cells.items():
                assert cell["error"] is None, (key, loop, transport, cell["error"])
                assert cell["median"] >= 0 and cell["notes"] == [], (key, loop, transport)
            assert cells["friends"]["friend_verified"] is True, (key, loop)
    out = _words(capsys.readouterr().out)
    assert "stream-tls — " in out and "rr-tls — " in out and "every transport runs TLS" in out
    if HAVE_TRIO:
        assert "no trio or anyio rows in stream-tls, rr-tls" in out


def test_tls_without_trustme_is_one_line_and_exit_2(monkeypatch, capsys):
    real = importlib.util.find_spec
    monkeypatch.setattr(_cli.importlib.util, "find_spec",
                        lambda name, *a: None if name == "trustme" else real(name, *a))
    assert main([*TINY, "--tests", "rr", "--tls"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "trustme" in err[0]


@needs_trio
def test_trio_loop_alone(tmp_path, capsys):
    data = _run_json(tmp_path, [*TINY, "--loops", "trio", "--sizes", "64"])
    out = capsys.readouterr().out
    assert data["header"]["loops"] == ["trio"]
    # Only the tables trio has; the rest are not in the JSON at all.
    assert set(data["tests"]) == TRIO_CASE_KEYS
    for key, test in data["tests"].items():
        cells = test["results"]["64"]["trio"]
        socketless = ["socketless"] if key in SOCKETLESS_CASE_KEYS else []
        assert list(cells) == ["tcp", "unix", "friends", *socketless, "memory"]
        for transport, cell in cells.items():
            assert cell["error"] is None, (key, transport, cell["error"])
            assert cell["median"] >= 0 and len(cell["rounds"]) == 1
        for transport in ["friends", *socketless]:
            assert cells[transport]["friend_verified"] is True, (key, transport, cells[transport]["notes"])
        assert cells["memory"]["friend_verified"] is None
    _check_targets(data, met_known=True, loops=("trio",))
    for title in ("stream — ", "rr — ", "crr — ", "targets"):
        assert title in out
    for title in ("streams-rr — ", "multi-rr — ", "threads-rr — ", "memory-heap — "):
        assert title not in out
    assert "streams-rr" not in out.split("mode:")[1].split("\n")[0]  # no trimmed rows told


@needs_trio
def test_anyio_loop_alone(tmp_path, capsys):
    """anyio's API on trio: friends is the same code under
    friendsock.trio.install(), verified as friend links; trio's own
    objects are back once the run is over."""
    import friendsock.trio

    data = _run_json(tmp_path, [*TINY, "--loops", "anyio", "--sizes", "64"])
    assert data["header"]["loops"] == ["anyio"]
    assert set(data["tests"]) == TRIO_CASE_KEYS
    for key, test in data["tests"].items():
        cells = test["results"]["64"]["anyio"]
        socketless = ["socketless"] if key in SOCKETLESS_CASE_KEYS else []
        assert list(cells) == ["tcp", "unix", "friends", *socketless]
        for transport, cell in cells.items():
            assert cell["error"] is None, (key, transport, cell["error"])
            assert cell["median"] >= 0 and len(cell["rounds"]) == 1
        for transport in ["friends", *socketless]:
            assert cells[transport]["friend_verified"] is True, (key, transport, cells[transport]["notes"])
        assert cells["tcp"]["friend_verified"] is None
    _check_targets(data, met_known=True, loops=("anyio",))
    assert not friendsock.trio.is_installed()
    assert "anyio runs stream, rr, crr only: no anyio rows in streams-rr" in _words(
        capsys.readouterr().out)


@needs_trio
def test_trio_selection_without_memory(tmp_path, capsys):
    data = _run_json(tmp_path, [*TINY, "--tests", "rr", "--sizes", "1K",
                                "--loops", "asyncio,trio", "--transports", "friends,tcp"])
    per_loop = data["tests"]["rr"]["results"]["1024"]
    assert list(per_loop) == ["asyncio", "trio"]
    assert list(per_loop["trio"]) == ["tcp", "friends"]
    assert per_loop["trio"]["friends"]["friend_verified"] is True
    assert data["targets"] == []  # rr 64 B was not run
    out = capsys.readouterr().out
    assert "floor" not in out and "targets" not in out


@needs_trio
def test_memory_floor_alone(tmp_path, capsys):
    """The floor on its own: the naive call_soon transport on asyncio and
    uvloop (between two loops in the threads tables, with its flow control
    across them: 1 MiB writes pause the writer), memory_stream_pair on trio,
    none on anyio; streams too."""
    data = _run_json(tmp_path, [*TINY, "--tests", "rr,streams-rr,crr,threads", "--sizes", "64,1M",
                                "--loops", "asyncio,uvloop,trio,anyio", "--transports", "memory"])
    assert list(data["tests"]["rr"]["results"]["64"]) == ["asyncio", "uvloop", "trio"]
    for key in ("streams-rr", "threads-rr", "threads-stream"):
        assert list(data["tests"][key]["results"]["64"]) == ["asyncio", "uvloop"], key
    for key in ("rr", "streams-rr", "crr", "threads-rr", "threads-stream"):
        for size, by_loop in data["tests"][key]["results"].items():
            for loop, cells in by_loop.items():
                assert list(cells) == ["memory"]
                assert cells["memory"]["error"] is None, (key, size, loop, cells["memory"]["error"])
                assert cells["memory"]["median"] > 0, (key, size, loop)
    out = _words(capsys.readouterr().out)
    assert "floor: a naive in-memory transport" in out and "call_soon_threadsafe" in out
    assert data["below_tcp"] == []  # nothing compared


def test_cells_below_tcp_are_flagged():
    """Every cell where friends did worse than TCP on its loop is listed
    (higher is better in rr, lower in memory tables), and marked in the table."""
    config = _plan.Config(tests=["rr", "memory"], transports=["tcp", "friends"],
                          loops=["asyncio", "uvloop"], mode=_plan.QUICK, seconds=1.0,
                          rounds=1, memory_rounds=1, sizes=[64], idle=[100])
    run = _results.Run(config, _plan.plan(config))
    figures = {("rr", "asyncio"): (100.0, 300.0), ("rr", "uvloop"): (200.0, 150.0),
               ("memory-heap", "asyncio"): (10.0, 5.0), ("memory-heap", "uvloop"): (10.0, 20.0)}
    for (key, loop), (tcp, friends) in figures.items():
        param = 64 if key == "rr" else 100
        run.cells[(key, param, loop, "tcp")] = _results.Cell(values=[tcp])
        run.cells[(key, param, loop, "friends")] = _results.Cell(values=[friends], friend_verified=True)
    found = {(f["test"], f["loop"]) for f in _tables.below_tcp(run)}
    assert found == {("rr", "uvloop"), ("memory-heap", "uvloop")}
    case = next(c for c in run.cases if c.key == "rr")
    table, _ = _tables.build_table(run, case)
    console = Console(width=200, record=True)
    console.print(table)
    text = console.export_text()
    assert text.count("▼") == 1 + 1  # the uvloop row, and the caption's legend


@needs_trio
def test_trio_friends_that_did_not_pair_are_marked(tmp_path, capsys):
    friendsock.set_enabled(False)  # every friends connection falls back
    try:
        data = _run_json(tmp_path, [*TINY, "--tests", "stream,rr,crr", "--sizes", "64",
                                    "--loops", "trio"])
    finally:
        friendsock.set_enabled(True)
    for key in ("stream", "rr", "crr"):
        cell = data["tests"][key]["results"]["64"]["trio"]["friends"]
        assert cell["error"] is None and cell["median"] >= 0
        assert cell["friend_verified"] is False
        assert any("disabled" in note for note in cell["notes"]), cell["notes"]
    target = next(t for t in data["targets"] if t["baseline"] == "tcp")
    assert target["friend_verified"] is False and target["met"] is False
    out = capsys.readouterr().out
    assert "†" in out and "not from friend links" in out


@needs_trio
def test_trio_failing_and_stuck_transports_are_reported(tmp_path, monkeypatch):
    # Enough for a healthy cell on a loaded machine; a stuck one is given up on then.
    monkeypatch.setattr(_runner, "MEASURE_SLACK", 2.0)
    measure = _trio_workloads.TrioRRWorkload.measure

    async def failing(self, seconds, warmup):
        if self.transport == "friends":
            raise RuntimeError("boom")
        if self.transport == "memory":  # awaits (trio's timeout can fire), never ends
            await _trio_workloads.until(lambda: False, "the sky to fall", timeout=3600)
        return await measure(self, seconds, warmup)

    monkeypatch.setattr(_trio_workloads.TrioRRWorkload, "measure", failing)
    data = _run_json(tmp_path, [*TINY, "--tests", "rr,crr", "--sizes", "64", "--loops", "trio"],
                     status=1)
    rr = data["tests"]["rr"]["results"]["64"]["trio"]
    assert "boom" in rr["friends"]["error"] and rr["friends"]["median"] is None
    assert rr["memory"]["error"].startswith("timed out")
    for transport in ("tcp", "unix"):
        assert rr[transport]["error"] is None and rr[transport]["median"] > 0
    target = next(t for t in data["targets"] if t["baseline"] == "tcp")
    assert target["met"] is None  # a failed cell: no verdict
    crr = data["tests"]["crr"]["results"]["64"]["trio"]
    assert crr["friends"]["error"] is None and crr["friends"]["friend_verified"] is True


@needs_trio
def test_a_hung_trio_step_is_reported_and_the_run_goes_on(tmp_path, monkeypatch):
    monkeypatch.setattr(_loop_runner, "WATCHDOG_GRACE", 0.3)
    # Enough for a healthy cell on a loaded machine; a stuck one is given up on then.
    monkeypatch.setattr(_runner, "MEASURE_SLACK", 2.0)
    measure = _trio_workloads.TrioRRWorkload.measure

    async def hanging(self, seconds, warmup):
        if self.transport == "unix":
            while True:  # a task that never yields: no trio timeout can fire
                time.sleep(0.001)
        return await measure(self, seconds, warmup)

    monkeypatch.setattr(_trio_workloads.TrioRRWorkload, "measure", hanging)
    data = _run_json(tmp_path, [*TINY, "--tests", "rr", "--sizes", "64,1K",
                                "--loops", "asyncio,trio"], status=1)
    rr = data["tests"]["rr"]["results"]
    assert rr["64"]["trio"]["unix"]["error"].startswith("hung")
    assert rr["1024"]["trio"]["unix"]["error"].startswith("skipped")
    for size in ("64", "1024"):
        assert rr[size]["trio"]["tcp"]["median"] > 0
        assert rr[size]["trio"]["memory"]["median"] > 0
        assert rr[size]["trio"]["friends"]["friend_verified"] is True
        assert rr[size]["asyncio"]["unix"]["error"] is None  # only trio's unix hung


def test_trio_missing_is_skipped_with_a_note(tmp_path, monkeypatch, capsys):
    monkeypatch.setattr(_cli, "_trio_installed", lambda: False)
    data = _run_json(tmp_path, [*TINY, "--tests", "rr", "--sizes", "64"])
    assert "trio" not in data["header"]["loops"]
    assert "trio" not in data["tests"]["rr"]["results"]["64"]
    assert "trio is not installed: no trio rows" in data["notes"]
    capsys.readouterr()
    assert main([*TINY, "--loops", "trio"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "trio is not installed" in err[0]


@pytest.mark.parametrize("argv", [
    ["--tests", "nope"],
    ["--tests", "stream,"],
    ["--sizes", "64X"],
    ["--sizes", "0"],
    ["--sizes", "1G"],
    ["--rounds", "0"],
    ["--seconds", "-1"],
    ["--seconds", "soon"],
    ["--transports", "pigeon"],
    ["--loops", "tokio"],
    ["--conns", "0"],
    ["--idle", "many"],
    ["--quick", "--full"],
    ["--bogus"],
    ["stray"],
])
def test_bad_arguments_exit_2(argv, capsys):
    with pytest.raises(SystemExit) as exc:
        main(argv)
    assert exc.value.code == 2
    err = capsys.readouterr().err
    assert len([line for line in err.splitlines() if "error:" in line]) == 1


def test_missing_matplotlib_is_one_line_and_exit_2(tmp_path, monkeypatch, capsys):
    real = importlib.util.find_spec
    monkeypatch.setattr(_cli.importlib.util, "find_spec",
                        lambda name, *a: None if name == "matplotlib" else real(name, *a))
    assert main([*TINY, "--tests", "rr", "--plot", str(tmp_path / "x.png")]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "matplotlib" in err[0]


def test_unwritable_output_exit_2(tmp_path, capsys):
    assert main([*TINY, "--json", str(tmp_path / "no" / "such" / "dir.json")]) == 2
    assert "cannot write" in capsys.readouterr().err


@pytest.mark.parametrize("text, size", [
    ("64", 64), ("64B", 64), ("1K", 1024), ("1k", 1024), ("8KiB", 8192), ("64KB", 65536),
    ("1M", 1 << 20), ("1MiB", 1 << 20), (" 2m ", 2 << 20),
])
def test_parse_size(text, size):
    assert parse_size(text) == size


@pytest.mark.parametrize("text", ["", "K", "1.5K", "-1", "1T", "0", "65M", "1 KK"])
def test_parse_size_rejects(text):
    with pytest.raises(argparse.ArgumentTypeError):
        parse_size(text)


def _python_m(*args, timeout=60, descriptors=None):
    """``python -m friendsock ARGS``; with ``descriptors``, under that
    RLIMIT_NOFILE (soft and hard: the bench cannot raise it)."""
    env = dict(os.environ)
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [root, env.get("PYTHONPATH")]))
    limit = None if descriptors is None else (
        lambda: resource.setrlimit(resource.RLIMIT_NOFILE, (descriptors, descriptors)))
    return subprocess.run([sys.executable, "-m", "friendsock", *args], capture_output=True,
                          text=True, timeout=timeout, env=env, preexec_fn=limit)


def test_socketless_idle_links_past_the_descriptor_limit(tmp_path):
    """More idle connections than the descriptors allow: the transports
    that hold descriptors are measured at what fits (a row of its own) and
    say why not at the count asked for; socketless links, which hold none,
    are measured at that count too."""
    path = tmp_path / "out.json"
    done = _python_m("bench", *TINY, "--tests", "memory", "--idle", "300", "--loops", "asyncio",
                     "--transports", "tcp,friends,socketless", "--json", str(path), descriptors=256)
    # The cells not measured at 300 are in the summary, and the status says so.
    assert done.returncode == 1, done.stderr
    assert "memory-heap 300 asyncio TCP: not measured: 300 idle connections need 664" \
        in done.stdout
    data = json.loads(path.read_text())
    fit = str((256 - 64) // 2)
    for key in ("memory-heap", "memory-rss"):
        # (RSS moves by whole pages: a hundred connections may not move it.)
        measured = (lambda cell: cell["median"] > 0) if key == "memory-heap" else (lambda cell: True)
        rows = data["tests"][key]["results"]
        assert list(rows) == [fit, "300"], key
        for transport in ("tcp", "friends", "socketless"):
            cell = rows[fit]["asyncio"][transport]
            assert cell["error"] is None and measured(cell), (key, transport, cell)
        for transport in ("tcp", "friends"):
            assert "need 664 descriptors (RLIMIT_NOFILE 256)" in rows["300"]["asyncio"][transport]["error"]
        cell = rows["300"]["asyncio"]["socketless"]
        assert cell["error"] is None and measured(cell) and cell["friend_verified"], (key, cell)
    assert "socketless links hold no descriptor: measured at 300 too" in _words(done.stdout)


def test_python_m_friendsock():
    done = _python_m()
    assert done.returncode == 2 and "usage:" in done.stderr
    done = _python_m("frobnicate")
    assert done.returncode == 2 and "unknown subcommand" in done.stderr
    done = _python_m("bench", "--tests", "nope")
    assert done.returncode == 2 and "error:" in done.stderr
    loops = "asyncio,trio" if HAVE_TRIO else "asyncio"
    done = _python_m("bench", *TINY, "--tests", "rr", "--sizes", "64", "--loops", loops)
    assert done.returncode == 0, done.stderr
    assert "rr — " in done.stdout and "finished in" in done.stdout
    if HAVE_TRIO:
        assert "trio" in done.stdout and "targets" in done.stdout


def test_the_quick_default_measures_every_target():
    """Quick runs the headline cells: every target's cells, on every loop
    that has them, and no test beyond those."""
    parser = _cli.build_parser()
    args = parser.parse_args([])
    assert args.tests is None and args.mode is None
    config = _plan.Config(tests=list(_plan.QUICK.tests), transports=list(_transports.TRANSPORTS),
                          loops=LOOPS, mode=_plan.QUICK, seconds=0.1, rounds=1,
                          memory_rounds=1)
    planned = {(case.key, param) for case in _plan.plan(config) for param in case.params}
    wanted = {(target.case, target.param) for target in _targets.TARGETS}
    assert wanted <= planned
    assert {key for key, _ in planned} == {key for key, _ in wanted} | {"stream", "threads-stream"}
    assert len(planned) == len({key for key, _ in planned})  # one size a table


def test_the_tables_fit_100_columns(monkeypatch, capsys):
    """Every line of the output fits a 100-column terminal, with every
    figure whole (folded, never cut), the rounds' min-max included."""
    monkeypatch.setenv("COLUMNS", "100")
    assert main([*TINY, "--rounds", "2", "--spread", "--tests", "rr,crr,blocking",
                 "--sizes", "64"]) == 0
    out = capsys.readouterr().out
    assert max(len(line.rstrip()) for line in out.splitlines()) <= 100
    assert "…" not in out
    assert "targets — " in out and "(why it is set there)" in out


def test_the_picture_comes_with_the_run(tmp_path, monkeypatch, capsys):
    """With matplotlib installed, a run without --plot draws
    friendsock-bench.png in the working directory; --no-plot draws none."""
    monkeypatch.chdir(tmp_path)
    argv = ["--seconds", "0.02", "--rounds", "1", "--no-progress", "--tests", "rr",
            "--sizes", "64", "--loops", "asyncio,uvloop"]
    assert main(argv) == 0
    assert (tmp_path / "friendsock-bench.png").read_bytes().startswith(b"\x89PNG")
    assert "wrote friendsock-bench.png" in capsys.readouterr().out
    (tmp_path / "friendsock-bench.png").unlink()
    assert main([*argv, "--no-plot"]) == 0
    assert not (tmp_path / "friendsock-bench.png").exists()


def test_the_picture_reads_at_a_glance():
    """One panel per table, bars (no lines), one colour a loop, one legend
    of at most five entries under the panels, none inside them, and the
    figure's title clear of every panel's."""
    import matplotlib.pyplot as plt

    config = _plan.Config(tests=["rr", "blocking"], transports=list(_transports.TRANSPORTS),
                          loops=LOOPS, mode=_plan.QUICK, seconds=1.0, rounds=1,
                          memory_rounds=1, sizes=[64, 1024])
    run = _results.Run(config, _plan.plan(config))
    for case in run.cases:
        for param in case.params:
            for loop in LOOPS:
                if _transports.loop_runs(loop, case.key):
                    for transport in _transports.loop_transports(loop, config.transports, case.key):
                        run.cells[(case.key, param, loop, transport)] = _results.Cell(
                            values=[100.0 if transport == "tcp" else 250.0])
    fig = _plot.draw(run)
    try:
        panels = [ax for ax in fig.axes if ax.get_visible()]
        assert [ax.get_title().split()[0] for ax in panels] == [c.key for c in run.cases]
        assert all(ax.get_legend() is None and ax.patches and not ax.get_lines()[1:]
                   for ax in panels)  # bars, and TCP's line only
        (legend,) = fig.legends
        labels = [text.get_text() for text in legend.get_texts()]
        assert labels == [*LOOPS, "TCP = 1"] and len(labels) <= 5
        fig.canvas.draw()
        renderer = fig.canvas.get_renderer()
        title = fig._suptitle.get_window_extent(renderer)
        for ax in panels:
            assert not title.overlaps(ax.title.get_window_extent(renderer)), ax.get_title()
            assert not legend.get_window_extent(renderer).overlaps(ax.get_window_extent(renderer))
    finally:
        plt.close(fig)
