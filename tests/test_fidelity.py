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

import importlib.util
import json
import os
import subprocess
import sys

import pytest

SCRIPT = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "scripts", "stdlib-suite")
# The longest first: the two runs of each go on the two cores.
MODULES = ["test_events", "test_sslproto", "test_sock_lowlevel", "test_streams", "test_server",
           "test_buffered_proto"]


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
    out = tmp_path_factory.mktemp("fidelity") / "outcome.json"
    env = {key: value for key, value in os.environ.items() if key != "FRIENDSOCK"}
    run = subprocess.run(
        [sys.executable, SCRIPT, "-j", "2", "--json", str(out), "--test-timeout", "60", *MODULES],
        capture_output=True, text=True, timeout=300, env=env,
    )
    if not out.exists():
        pytest.fail(f"scripts/stdlib-suite wrote no outcome (exit {run.returncode}):\n"
                    f"{run.stdout}\n{run.stderr}", pytrace=False)
    result = json.loads(out.read_text())
    result["output"] = run.stdout + run.stderr
    return result


# The first test runs the script (the module's fixture): ~20 s here.
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
