"""The package ships its type hints (``py.typed``): they check clean, so a
user's type checker sees what the code does."""

from __future__ import annotations

import pathlib
import subprocess
import sys

import friendsock


def test_the_package_type_checks_clean(tmp_path):
    package = pathlib.Path(friendsock.__file__).parent
    assert (package / "py.typed").exists()
    result = subprocess.run(
        [sys.executable, "-m", "mypy", "--cache-dir", str(tmp_path), str(package)],
        capture_output=True, text=True, timeout=120,
        cwd=package.parent,  # (the project's settings: pyproject.toml)
    )
    assert result.returncode == 0, result.stdout + result.stderr
