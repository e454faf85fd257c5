"""The documentation site builds with ``mkdocs build --strict``: every link
and anchor resolves, every page is in the navigation, and every public
name has a docstring for the API reference. Built once, not per loop."""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys

import pytest

import friendsock

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _hooks():
    spec = importlib.util.spec_from_file_location(
        "docs_hooks", os.path.join(ROOT, "scripts", "docs_hooks.py"))
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _build(site):
    env = dict(os.environ, NO_MKDOCS_2_WARNING="1")
    return subprocess.run([sys.executable, "-m", "mkdocs", "build", "--strict", "-d", str(site)],
                          cwd=ROOT, capture_output=True, text=True, timeout=240, env=env)


@pytest.mark.timeout(300)
def test_the_site_builds_strict(tmp_path):
    done = _build(tmp_path / "site")
    assert done.returncode == 0, done.stderr
    # One page a front door, and the reference generated from the docstrings.
    for page in ("doors/asyncio", "doors/trio", "doors/blocking", "doors/pytest", "doors/run",
                 "reference", "changelog"):
        assert (tmp_path / "site" / page / "index.html").exists(), page
    reference = (tmp_path / "site" / "reference" / "index.html").read_text()
    for name in friendsock.__all__:
        assert f'id="friendsock.{name}"' in reference, name
    for name in _hooks().PLUGIN_NAMES:
        assert f'id="friendsock.pytest_plugin.{name}"' in reference, name


def test_a_public_name_without_a_docstring_is_caught(monkeypatch):
    hooks = _hooks()
    assert list(hooks.undocumented()) == []
    monkeypatch.setattr(friendsock.is_enabled, "__doc__", None)
    assert list(hooks.undocumented()) == [("friendsock", "is_enabled")]


def test_the_readme_is_short_and_its_links_resolve():
    """The README stays an introduction that points into the docs: at most
    200 lines, the two set-up lines (the benchmark, the tests CI runs), and
    every link to a file of the repository names one that exists."""
    import re

    with open(os.path.join(ROOT, "README.md"), encoding="utf-8") as f:
        text = f.read()
    assert len(text.splitlines()) <= 200
    lines = text.splitlines()
    assert any(line.endswith('pip install -e ".[bench]" && python -m friendsock bench')
               for line in lines)
    assert any(line.endswith('pip install -e ".[test]" && python -m pytest') for line in lines)
    targets = re.findall(r"\]\(([^)#]+)(?:#[^)]*)?\)", text)
    assert targets
    for target in targets:
        if "://" not in target:
            assert os.path.exists(os.path.join(ROOT, target)), target
