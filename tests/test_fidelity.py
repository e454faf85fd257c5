"""Fidelity against CPython's own asyncio tests: a fast subset of what
``scripts/stdlib-suite`` runs (about 20 s on 2 cores). Each module runs
twice in subprocesses, plain and with friendsock on every loop class; the
tests that fail with friendsock must be exactly those that fail without it,
apart from the script's named exclusions (tests that mock asyncio's
internals).

CPython's ``test`` package is required, not optional: a Python built
without it (some Linux distributions ship it separately, e.g. Debian's
``libpython3.X-testsuite``) fails here with that message rather than
skipping, so the guard can not go missing unnoticed.
"""

from __future__ import annotations

import contextlib
import fcntl
import importlib.util
import json
import os
import subprocess
import sys
import time
from typing import Iterator

import pytest

SCRIPT = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "scripts", "stdlib-suite")
# The longest first: the two runs of each go on the two cores.
MODULES = ["test_events", "test_sslproto", "test_sock_lowlevel", "test_streams", "test_server",
           "test_buffered_proto"]


def _run_script(directory) -> dict:
    """scripts/stdlib-suite's outcome for MODULES (its output under
    "output"); a "failure" message instead when it wrote none."""
    out = directory / "outcome.json"
    env = {key: value for key, value in os.environ.items() if key != "FRIENDSOCK"}
    run = subprocess.run(
        [sys.executable, SCRIPT, "-j", "2", "--json", str(out), "--test-timeout", "60", *MODULES],
        capture_output=True, text=True, timeout=300, env=env,
    )
    if not out.exists():
        return {"failure": f"scripts/stdlib-suite wrote no outcome (exit {run.returncode}):\n"
                           f"{run.stdout}\n{run.stderr}"}
    result = json.loads(out.read_text())
    result["output"] = run.stdout + run.stderr
    return result


@contextlib.contextmanager
def _only_one_at_a_time(path, timeout: float) -> Iterator[None]:
    """An exclusive lock on the file ``path``, waited for ``timeout`` s at most."""
    with open(path, "a") as file:
        deadline = time.monotonic() + timeout
        while True:
            try:
                fcntl.flock(file, fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except BlockingIOError:
                if time.monotonic() > deadline:
                    pytest.fail(f"{path} still locked after {timeout} s", pytrace=False)
                time.sleep(0.1)
        try:
            yield
        finally:
            fcntl.flock(file, fcntl.LOCK_UN)


@pytest.fixture(scope="module")
def outcome(tmp_path_factory):
    try:
        found = importlib.util.find_spec("test.test_asyncio") is not None
    except ImportError:
        found = False
    if not found:
        pytest.fail(
            f"CPython's test package (test.test_asyncio) is missing from this Python; the fidelity job needs "
            f"it: install your distribution's Python test package (Debian/Ubuntu: "
            f"libpython3.{sys.version_info[1]}-testsuite) or use a full CPython build",
            pytrace=False,
        )
    if os.environ.get("PYTEST_XDIST_WORKER") is None:
        result = _run_script(tmp_path_factory.mktemp("fidelity"))
    else:
        # pytest-xdist hands this module's tests to whichever workers are
        # free: each would run the script (two runs of it, each on both
        # cores, side by side). The first runs it for the whole session (the
        # workers' temporary directories share a parent, the session's own);
        # the others wait for it and read what it found.
        shared = tmp_path_factory.getbasetemp().parent
        with _only_one_at_a_time(shared / "fidelity.lock", timeout=330):
            saved = shared / "fidelity.json"
            if saved.exists():
                result = json.loads(saved.read_text())
            else:
                result = _run_script(tmp_path_factory.mktemp("fidelity"))
                saved.write_text(json.dumps(result))
    if "failure" in result:
        pytest.fail(result["failure"], pytrace=False)
    return result


# The first test runs the script (the module's fixture): ~20 s here; the
# first of another worker's may wait as long for it.
pytestmark = pytest.mark.timeout(300)


@pytest.mark.parametrize("module", MODULES)
def test_fails_nothing_plain_asyncio_does_not(outcome, module):
    row = next(r for r in outcome["rows"] if r["module"] == module)
    for mode in ("baseline", "installed"):
        assert "crashed" not in row[mode] and "missing" not in row[mode], outcome["output"]
    assert row["installed"]["run"] == row["baseline"]["run"] > 0
    assert row["only_installed"] == [], outcome["output"]


def test_connections_paired(outcome):
    # test_streams, test_events and test_buffered_proto serve with
    # asyncio.start_server/create_server and connect to it: those pair.
    assert sum(r["installed"].get("links_made", 0) for r in outcome["rows"]) >= 10, outcome["output"]
