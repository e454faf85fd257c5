"""The release installs: ``python -m build`` makes an sdist and, from it, a
wheel; ``twine check`` passes both; the wheel, installed into a fresh
virtual environment outside the source tree, pairs connections, runs
``friendsock run``, loads the pytest plugin through its entry point and
installs itself at start-up from ``friendsock.pth`` under
``FRIENDSOCK_INSTALL=1``. Once per session (pip's cache makes the
environments quick), not per loop."""

from __future__ import annotations

import os
import subprocess
import sys
import tarfile
import textwrap
import zipfile

import pytest

import friendsock

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
# A connection made and checked with plain asyncio calls (so that it pairs
# only when friendsock was installed on the loop some other way).
PLAIN_ECHO = textwrap.dedent("""
    import asyncio, sys

    async def main(open_connection, start_server):
        async def echo(reader, writer):
            writer.write(await reader.read(100))
            await writer.drain()
            writer.close()

        server = await start_server(echo, "127.0.0.1", 0)
        reader, writer = await open_connection(*server.sockets[0].getsockname()[:2])
        writer.write(b"ping")
        assert await reader.read(100) == b"ping"
        import friendsock
        print("friend" if friendsock.is_friend(writer) else "tcp")
        writer.close()
        await writer.wait_closed()
        server.close()
        await server.wait_closed()
""")


def _run(args, cwd, env=None, timeout=300):
    done = subprocess.run(args, cwd=cwd, capture_output=True, text=True, timeout=timeout,
                          env=env)
    assert done.returncode == 0, (args, done.stdout, done.stderr)
    return done


@pytest.fixture(scope="module")
def dist(tmp_path_factory):
    """The sdist and the wheel ``python -m build`` makes (the wheel from
    the sdist, so the sdist is proven complete)."""
    out = tmp_path_factory.mktemp("dist")
    _run([sys.executable, "-m", "build", "--outdir", str(out), ROOT], cwd=ROOT, timeout=600)
    (sdist,) = out.glob("friendsock-*.tar.gz")
    (wheel,) = out.glob("friendsock-*-py3-none-any.whl")
    return sdist, wheel


@pytest.mark.timeout(900)
def test_the_wheel_installs_and_works_outside_the_source_tree(dist, tmp_path):
    sdist, wheel = dist
    version = friendsock.__version__
    assert sdist.name == f"friendsock-{version}.tar.gz"  # one version source
    assert wheel.name == f"friendsock-{version}-py3-none-any.whl"
    _run([sys.executable, "-m", "twine", "check", "--strict", str(sdist), str(wheel)], cwd=tmp_path)
    with zipfile.ZipFile(wheel) as archive:
        names = set(archive.namelist())
        metadata = archive.read(f"friendsock-{version}.dist-info/METADATA").decode()
    assert {"friendsock.pth", "friendsock/py.typed", "friendsock/pytest_plugin.py"} <= names
    for kind in ("asyncio", "uvloop", "trio", "anyio", "blocking sockets"):
        assert kind in metadata.split("Summary:", 1)[1].splitlines()[0], kind
    with tarfile.open(sdist) as archive:
        assert f"friendsock-{version}/setup.py" in archive.getnames()

    # A fresh environment, from the interpreter this venv was made from,
    # with none of the source tree on its path.
    # (A source tree on PYTHONPATH would also have pip take the wheel as
    # installed already.)
    env = {key: value for key, value in os.environ.items()
           if key not in ("PYTHONPATH", "FRIENDSOCK", "FRIENDSOCK_INSTALL", "VIRTUAL_ENV")}
    venv = tmp_path / "venv"
    _run([getattr(sys, "_base_executable", sys.executable), "-m", "venv", str(venv)], cwd=tmp_path)
    python, bin_dir = str(venv / "bin" / "python"), venv / "bin"
    _run([python, "-m", "pip", "install", "--disable-pip-version-check", "-q", str(wheel),
          "pytest>=8"], cwd=tmp_path, env=env)
    work = tmp_path / "work"
    work.mkdir()

    where = _run([python, "-c", "import friendsock, importlib.metadata as m; "
                  "print(friendsock.__file__); print(m.version('friendsock'))"],
                 cwd=work, env=env).stdout.split()
    assert where[0].startswith(str(venv)) and where[1] == version

    # Pairing through the explicit API.
    (work / "echo.py").write_text(PLAIN_ECHO)
    explicit = ("import asyncio, friendsock, echo; "
                "asyncio.run(echo.main(friendsock.open_connection, friendsock.start_server))")
    assert _run([python, "-c", explicit], cwd=work, env=env).stdout.split() == ["friend"]

    # friendsock run: plain asyncio code pairs, and the report says so.
    plain = "import asyncio, echo; asyncio.run(echo.main(asyncio.open_connection, asyncio.start_server))"
    done = _run([str(bin_dir / "friendsock"), "run", "-c", plain], cwd=work, env=env)
    assert done.stdout.split() == ["friend"]
    assert "friendsock: links made:  1" in done.stderr

    # The .pth start-up hook: the same plain program pairs under
    # FRIENDSOCK_INSTALL=1, and is plain TCP without it.
    done = _run([python, "-c", plain], cwd=work, env=dict(env, FRIENDSOCK_INSTALL="1"))
    assert done.stdout.split() == ["friend"]
    assert "friendsock: links made:  1" in done.stderr
    assert _run([python, "-c", plain], cwd=work, env=env).stdout.split() == ["tcp"]

    # The pytest plugin, found through its entry point (nothing imported
    # or named on the command line): plain asyncio code in a test pairs
    # under --friendsock, its fixture counts it, and the summary reports it.
    (work / "test_plugin_smoke.py").write_text(textwrap.dedent("""
        import asyncio

        import echo

        def test_pairs(friendsock):
            asyncio.run(echo.main(asyncio.open_connection, asyncio.start_server))
            assert friendsock.links_made == 1 and friendsock.fallbacks == {}
    """))
    done = _run([python, "-m", "pytest", "-q", "-p", "no:cacheprovider", "--friendsock",
                 "test_plugin_smoke.py"], cwd=work, env=env)
    assert "1 passed" in done.stdout and "links made:  1" in done.stdout
