"""The benchmark tool: every test, transport and loop runs (for a moment), the
JSON has its documented shape, friend figures come from friend links, and
bad arguments exit 2. No test asserts a speed.

Plain sync tests: the tool makes and runs its own event loops.
"""

from __future__ import annotations

import argparse
import asyncio
import importlib.util
import json
import os
import subprocess
import sys
import time

import pytest

import friendsock
from friendsock._bench import _cli, _runner, _workloads
from friendsock._bench._cli import main, parse_size

HAVE_MATPLOTLIB = importlib.util.find_spec("matplotlib") is not None
CASE_KEYS = {
    "stream", "rr", "crr", "streams-rr", "multi-rr", "multi-stream",
    "threads-rr", "threads-stream", "memory-heap", "memory-rss",
}
CELL_KEYS = {"median", "min", "max", "rounds", "unit", "friend_verified", "error", "notes"}
TINY = ["--seconds", "0.02", "--rounds", "1", "--no-progress"]


def _run_json(tmp_path, argv):
    path = tmp_path / "out.json"
    status = main([*argv, "--json", str(path)])
    assert status == 0
    return json.loads(path.read_text())


def test_every_test_transport_and_loop(tmp_path, capsys):
    plot = tmp_path / "out.png"
    argv = [*TINY, "--sizes", "64,64K", "--conns", "1,3", "--idle", "20"]
    if HAVE_MATPLOTLIB:
        argv += ["--plot", str(plot)]
    data = _run_json(tmp_path, argv)
    out = capsys.readouterr().out

    assert data["format"] == "friendsock-bench/1"
    header = data["header"]
    for key in ("command", "python", "friendsock", "uvloop", "cpus", "mode", "seconds",
                "rounds", "transports", "loops", "elapsed_s", "interrupted"):
        assert key in header
    assert header["loops"] == ["asyncio", "uvloop"]
    assert header["transports"] == ["tcp", "unix", "friends"]
    assert set(data["tests"]) == CASE_KEYS

    fell_back = False
    for key, test in data["tests"].items():
        assert {"test", "title", "unit", "param", "higher_is_better", "rounds",
                "results"} <= set(test)
        assert test["results"], key
        for param, per_loop in test["results"].items():
            assert int(param) > 0
            assert set(per_loop) == {"asyncio", "uvloop"}, (key, param)
            for loop, per_transport in per_loop.items():
                assert set(per_transport) == {"tcp", "unix", "friends"}, (key, param, loop)
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
                    if transport != "friends":
                        assert cell["friend_verified"] is None, where
                    elif test["test"] == "threads" and cell["friend_verified"] is False:
                        # Where cross-thread friends do not exist, they fall
                        # back, and the cell says so.
                        assert any("fell back" in note and "other-loop" in note
                                   for note in cell["notes"]), where
                        fell_back = True
                    else:
                        assert cell["friend_verified"] is True, (where, cell["notes"])

    for title in ("stream", "rr", "crr", "streams-rr", "multi-rr", "multi-stream",
                  "threads-rr", "threads-stream", "memory-heap", "memory-rss"):
        assert f"{title} — " in out
    assert "Baseline TCP" in out and "AF_UNIX" in out and "Friends" in out
    assert ("friends fell back to real TCP across threads" in out) == fell_back
    assert "uvloop" in out and "CPUs" in out and "command:" in out
    if HAVE_MATPLOTLIB:
        assert plot.read_bytes().startswith(b"\x89PNG")


def test_selection_and_order(tmp_path):
    data = _run_json(tmp_path, [*TINY, "--tests", "rr", "--sizes", "1K", "--loops", "asyncio",
                                "--transports", "friends,tcp"])
    assert list(data["tests"]) == ["rr"]
    assert list(data["tests"]["rr"]["results"]) == ["1024"]
    cells = data["tests"]["rr"]["results"]["1024"]["asyncio"]
    assert list(cells) == ["tcp", "friends"]
    assert cells["friends"]["friend_verified"] is True


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


def test_failing_transport_is_reported_and_the_run_goes_on(tmp_path, monkeypatch):
    measure = _workloads.RRWorkload.measure

    async def failing(self, seconds, warmup):
        if self.transport == "friends":
            raise RuntimeError("boom")
        return await measure(self, seconds, warmup)

    monkeypatch.setattr(_workloads.RRWorkload, "measure", failing)
    data = _run_json(tmp_path, [*TINY, "--tests", "rr,crr", "--sizes", "64", "--loops", "asyncio"])
    rr = data["tests"]["rr"]["results"]["64"]["asyncio"]
    assert "boom" in rr["friends"]["error"]
    assert rr["friends"]["median"] is None
    assert rr["tcp"]["error"] is None and rr["tcp"]["median"] > 0
    crr = data["tests"]["crr"]["results"]["64"]["asyncio"]
    assert crr["friends"]["error"] is None and crr["friends"]["friend_verified"] is True


def test_a_hung_loop_is_reported_and_the_run_goes_on(tmp_path, monkeypatch):
    monkeypatch.setattr(_runner, "WATCHDOG_GRACE", 0.3)
    monkeypatch.setattr(_runner, "MEASURE_SLACK", 0.3)
    measure = _workloads.RRWorkload.measure

    def spin() -> None:  # a callback that never returns
        while True:
            time.sleep(0.001)

    async def hanging(self, seconds, warmup):
        if self.transport == "unix":
            asyncio.get_running_loop().call_soon(spin)
            await asyncio.sleep(1)
        return await measure(self, seconds, warmup)

    monkeypatch.setattr(_workloads.RRWorkload, "measure", hanging)
    data = _run_json(tmp_path, [*TINY, "--tests", "rr", "--sizes", "64,1K",
                                "--loops", "asyncio"])
    rr = data["tests"]["rr"]["results"]
    assert rr["64"]["asyncio"]["unix"]["error"].startswith("hung")
    assert rr["1024"]["asyncio"]["unix"]["error"].startswith("skipped")
    for size in ("64", "1024"):
        assert rr[size]["asyncio"]["tcp"]["median"] > 0
        assert rr[size]["asyncio"]["friends"]["friend_verified"] is True


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
    ["--loops", "trio"],
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


def _python_m(*args, timeout=60):
    env = dict(os.environ)
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [root, env.get("PYTHONPATH")]))
    return subprocess.run([sys.executable, "-m", "friendsock", *args], capture_output=True,
                          text=True, timeout=timeout, env=env)


def test_python_m_friendsock():
    done = _python_m()
    assert done.returncode == 2 and "usage:" in done.stderr
    done = _python_m("frobnicate")
    assert done.returncode == 2 and "unknown subcommand" in done.stderr
    done = _python_m("bench", "--tests", "nope")
    assert done.returncode == 2 and "error:" in done.stderr
    done = _python_m("bench", *TINY, "--tests", "rr", "--sizes", "64", "--loops", "asyncio")
    assert done.returncode == 0, done.stderr
    assert "rr — " in done.stdout and "finished in" in done.stdout
