"""The test suite on every Python the project supports, each in a fresh venv.

    nox                   # the suite (README's test command) on 3.10 to 3.13
    nox -s tests-3.12     # one of them
    nox -s stdlib         # scripts/stdlib-suite on each (CPython's own asyncio tests)

Interpreters are found on PATH (python3.10 ...); with pyenv, make them
visible first: ``export PYENV_VERSION=$(pyenv versions --bare | paste -sd:)``.
"""

from __future__ import annotations

import nox

PYTHONS = ["3.10", "3.11", "3.12", "3.13"]

nox.options.sessions = ["tests"]
# One after another: each run takes the machine's cores (pytest-xdist).
nox.options.reuse_venv = "no"
# uv (the matrix extra) makes and fills a session's venv in seconds, where
# pip takes most of a minute; virtualenv and pip where it is missing.
nox.options.default_venv_backend = "uv|virtualenv"
nox.options.download_python = "never"


@nox.session(python=PYTHONS)
def tests(session: nox.Session) -> None:
    # pip compiles what it installs one file at a time (uv does not by
    # default): compiled below on every core instead.
    session.install(*([] if session.venv_backend == "uv" else ["--no-compile"]), "-e", ".[test]")
    # The suite starts hundreds of Python processes that import friendsock,
    # its test peers and their libraries: compiled once here, where
    # PYTHONDONTWRITEBYTECODE would have each of them compile it again.
    site_packages = session.run("python", "-c", "import sysconfig; print(sysconfig.get_path('purelib'))",
                                silent=True)
    session.run("python", "-m", "compileall", "-q", "-j", "0", "friendsock", "tests",
                str(site_packages).strip())
    session.run("python", "-m", "pytest", *session.posargs)


@nox.session(python=PYTHONS)
def stdlib(session: nox.Session) -> None:
    session.install("-e", ".[test]")
    session.run("python", "scripts/stdlib-suite", "-j", "2", *session.posargs)
