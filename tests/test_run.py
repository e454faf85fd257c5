"""``python -m friendsock run`` and ``FRIENDSOCK_INSTALL=1``: unchanged
programs, each run in a subprocess, pair on every loop they make; the
report at exit (and in ``pytest --friendsock``'s summary) says what paired.
"""

from __future__ import annotations

import itertools
import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any, Dict, List, Optional

import pytest

from support import run_inner_pytest

pytest_plugins = ["pytester"]

TIMEOUT = 60

# Imported by every program below (from sys.path[0]: the script's folder,
# or the working directory for -m and -c). Plain asyncio: two connects
# that can pair, one that passes its own socket (sock=), one to a port
# nobody listens on.
EXCHANGE = '''
import asyncio
import json
import socket
import sys

import friendsock


async def handle(reader, writer):
    writer.write(await reader.readline())
    await writer.drain()
    writer.close()


async def exchange():
    server = await asyncio.start_server(handle, "127.0.0.1", 0)
    host, port = server.sockets[0].getsockname()[:2]
    paired = []
    for own_socket in (False, False, True):
        if own_socket:
            sock = socket.create_connection((host, port))
            sock.setblocking(False)
            reader, writer = await asyncio.open_connection(sock=sock)
        else:
            reader, writer = await asyncio.open_connection(host, port)
        writer.write(b"ping\\n")
        assert await reader.readline() == b"ping\\n"
        paired.append(friendsock.is_friend(writer))
        writer.close()
        await writer.wait_closed()
    server.close()
    await server.wait_closed()
    unused = socket.socket()
    unused.bind(("127.0.0.1", 0))
    closed_port = unused.getsockname()[1]
    unused.close()
    try:
        await asyncio.open_connection("127.0.0.1", closed_port)
    except OSError:
        pass
    return {"paired": paired, "port": port, "closed_port": closed_port,
            "loop": type(asyncio.get_running_loop()).__module__.split(".")[0]}


def stats():
    s = friendsock.stats()
    return {"links_made": s.links_made, "links_alive": s.links_alive,
            "bytes_moved": s.bytes_moved, "fallbacks": dict(s.fallbacks), "pending": s.pending,
            "listeners": {address: {"links_made": l.links_made, "fallbacks": dict(l.fallbacks)}
                          for address, l in s.listeners.items()},
            "cross_process": s.cross_process,
            "cross_process_peers": {str(pid): n for pid, n in s.cross_process_peers.items()}}


def done(result, name, **more):
    """Print what the program saw; ``name``: its ``__name__``."""
    main_file = getattr(sys.modules["__main__"], "__file__", None)
    result.update(more, argv=sys.argv, path0=sys.path[0], name=name, main_file=main_file,
                  stats=stats())
    print(json.dumps(result))
'''


def _env(**extra: str) -> Dict[str, str]:
    env = {k: v for k, v in os.environ.items()
           if k not in ("FRIENDSOCK", "FRIENDSOCK_INSTALL", "FRIENDSOCK_REPORT", "FRIENDSOCK_SOCKETS")}
    env.update(extra)
    return env


def _run(cwd: Path, *args: str, env: Optional[Dict[str, str]] = None,
         python: bool = False) -> subprocess.CompletedProcess:
    command: List[str] = [sys.executable, *args] if python else [
        sys.executable, "-m", "friendsock", "run", *args]
    return subprocess.run(command, cwd=cwd, capture_output=True, text=True, timeout=TIMEOUT,
                          env=env or _env())


def _result(done: subprocess.CompletedProcess) -> Dict[str, Any]:
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout.strip().splitlines()[-1])  # type: ignore[no-any-return]


@pytest.fixture
def project(tmp_path: Path) -> Path:
    (tmp_path / "exchange_lib.py").write_text(EXCHANGE)
    return tmp_path


def _expected_listeners(result: Dict[str, Any]) -> Dict[str, Any]:
    """Per listener: two links, the sock= client and the server's accept of
    it as fallbacks; the closed port's connect under that address."""
    return {
        f"127.0.0.1:{result['port']}": {"links_made": 2, "fallbacks": {"sock": 1, "peer-not-friend": 1}},
        f"127.0.0.1:{result['closed_port']}": {"links_made": 0, "fallbacks": {"no-listener": 1}},
    }


def test_script_with_asyncio_run_and_its_report(project: Path) -> None:
    (project / "app.py").write_text(textwrap.dedent("""
        import asyncio
        import exchange_lib

        exchange_lib.done(asyncio.run(exchange_lib.exchange()), __name__)
    """))
    report = project / "report.json"
    done = _run(project, "--report", "stderr", "--report", f"json={report}", "app.py", "one", "two")
    result = _result(done)
    assert result["paired"] == [True, True, False]
    assert result["argv"] == ["app.py", "one", "two"]
    assert result["path0"] == str(project) and result["name"] == "__main__"
    assert result["main_file"] == str(project / "app.py")
    stats = result["stats"]
    assert stats["links_made"] == 2 and stats["links_alive"] == 0
    assert stats["fallbacks"] == {"sock": 1, "peer-not-friend": 1, "no-listener": 1}
    assert stats["listeners"] == _expected_listeners(result)
    # The report at exit: the same figures as the program's own stats().
    assert json.loads(report.read_text()) == stats
    lines = [line for line in done.stderr.splitlines() if line.startswith("friendsock: ")]
    assert lines[0] == "friendsock: links made:  2"
    assert f"bytes moved: {stats['bytes_moved']:,} bytes" in lines[1]
    assert lines[2] == "friendsock: fell back:   3 to real TCP (no-listener 1, peer-not-friend 1, sock 1)"
    rows = [line.split() for line in lines[4:]]
    assert rows == [
        ["friendsock:", f"127.0.0.1:{result['port']}", "2", "2", "peer-not-friend", "1,", "sock", "1"],
        ["friendsock:", f"127.0.0.1:{result['closed_port']}", "0", "1", "no-listener", "1"],
    ]


def test_module_with_arguments_on_uvloop_runner(project: Path) -> None:
    (project / "pkg").mkdir()
    (project / "pkg" / "__init__.py").write_text("")
    (project / "pkg" / "server.py").write_text(textwrap.dedent("""
        import asyncio
        import sys

        import uvloop

        import exchange_lib

        if sys.version_info >= (3, 11):
            with asyncio.Runner(loop_factory=uvloop.new_event_loop) as runner:
                result = runner.run(exchange_lib.exchange())
        else:
            uvloop.install()
            result = asyncio.run(exchange_lib.exchange())
        exchange_lib.done(result, __name__, spec=__spec__.name)
    """))
    report = project / "report.json"
    done = _run(project, f"--report=json={report}", "-m", "pkg.server", "--port", "8000")
    result = _result(done)
    assert result["loop"] == "uvloop" and result["paired"] == [True, True, False]
    module_file = str(project / "pkg" / "server.py")
    assert result["argv"] == [module_file, "--port", "8000"] and result["main_file"] == module_file
    assert result["spec"] == "pkg.server" and result["name"] == "__main__"
    assert result["path0"] == str(project)
    assert result["stats"]["listeners"] == _expected_listeners(result)
    # A report to a file replaces the one on stderr.
    assert json.loads(report.read_text()) == result["stats"] and "friendsock:" not in done.stderr


def test_code_with_a_loop_in_a_thread(project: Path) -> None:
    code = textwrap.dedent("""
        import asyncio, threading
        import exchange_lib

        results = []
        thread = threading.Thread(target=lambda: results.append(asyncio.run(exchange_lib.exchange())))
        thread.start()
        thread.join()
        exchange_lib.done(results[0], __name__)
    """)
    done = _run(project, "-q", "-c", code, "arg")
    result = _result(done)
    assert result["paired"] == [True, True, False]
    assert result["argv"] == ["-c", "arg"] and result["path0"] == "" and result["name"] == "__main__"
    assert "friendsock:" not in done.stderr  # -q


@pytest.mark.parametrize("program, status, stderr", [
    ("import sys; sys.exit(3)", 3, ""),
    ("raise SystemExit('bye')", 1, "bye\n"),
    ("def fail():\n    raise ValueError('broken')\nfail()", 1,
     "Traceback (most recent call last):\n"
     '  File "{script}", line 3, in <module>\n'
     "    fail()\n"
     '  File "{script}", line 2, in fail\n'
     "    raise ValueError('broken')\n"
     "ValueError: broken\n"),
])
def test_exit_status_and_exceptions_pass_through(tmp_path: Path, program: str, status: int,
                                                 stderr: str) -> None:
    script = tmp_path / "prog.py"
    script.write_text(program + "\n")
    done = _run(tmp_path, "--quiet", str(script))
    assert done.returncode == status
    # As plain python prints it (3.13's with carets under the calls): the
    # program's frames only.
    plain = _run(tmp_path, str(script), python=True)
    assert done.stderr == plain.stderr
    assert [line for line in done.stderr.splitlines() if line.strip(" ^~")] == \
        stderr.format(script=script).splitlines()


TORNADO_APP = """
import asyncio, json, sys
from tornado import httpserver, netutil, simple_httpclient, web


class Hello(web.RequestHandler):
    def get(self):
        self.write(b"hello " * 1000)


async def main():
    sockets = netutil.bind_sockets(0, "127.0.0.1")
    server = httpserver.HTTPServer(web.Application([("/", Hello)]))
    server.add_sockets(sockets)
    port = sockets[0].getsockname()[1]
    client = simple_httpclient.SimpleAsyncHTTPClient(force_instance=True)
    bodies = [(await client.fetch(f"http://127.0.0.1:{port}/")).body for _ in range(3)]
    client.close()
    server.stop()
    await server.close_all_connections()
    print(json.dumps({"port": port, "intact": all(b == b"hello " * 1000 for b in bodies)}))


asyncio.run(main())
"""


@pytest.mark.parametrize("sockets", [True, False])
@pytest.mark.parametrize("door", ["run", "FRIENDSOCK_INSTALL"])
def test_sockets_option_pairs_a_tornado_app_unchanged(tmp_path: Path, door: str, sockets: bool) -> None:
    """``run --sockets``, or ``FRIENDSOCK_INSTALL=1`` with
    ``FRIENDSOCK_SOCKETS=1``: tornado's own non-blocking sockets (its
    server's listener and its client's connects) pair, with no change to
    the app, from the first request on (every loop installed, the
    listener, made non-blocking, is the app's own loop's); without the
    option they are TCP, as before."""
    (tmp_path / "app.py").write_text(TORNADO_APP)
    report = tmp_path / "report.json"
    if door == "run":
        options = ["--sockets"] if sockets else []
        done = _run(tmp_path, *options, f"--report=json={report}", "app.py")
    else:
        switches = {"FRIENDSOCK_SOCKETS": "1"} if sockets else {}
        done = _run(tmp_path, "app.py", python=True,
                    env=_env(FRIENDSOCK_INSTALL="1", FRIENDSOCK_REPORT=f"json={report}", **switches))
    result = _result(done)
    assert result["intact"]
    listener = json.loads(report.read_text())["listeners"].get(f"127.0.0.1:{result['port']}")
    assert (listener or {}).get("links_made", 0) == (3 if sockets else 0)


def test_a_server_in_another_process_is_reported(tmp_path: Path) -> None:
    """A program run unchanged against a friendsock server in another
    process: its connection moves off TCP, and the report says so."""
    peer = Path(__file__).with_name("cross_process_peer.py")
    server = subprocess.Popen([sys.executable, str(peer), "serve", "asyncio", "api"],
                              stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, env=_env())
    try:
        assert server.stdout is not None
        port = int(server.stdout.readline())
        (tmp_path / "app.py").write_text(textwrap.dedent(f"""
            import asyncio
            import friendsock

            async def main():
                reader, writer = await asyncio.open_connection("127.0.0.1", {port})
                writer.write(b"ping")
                writer.write_eof()
                assert await reader.read() == b"ping"
                print(friendsock.is_friend(writer))
                writer.close()

            asyncio.run(main())
        """))
        report = tmp_path / "report.json"
        done = _run(tmp_path, "--report", "stderr", "--report", f"json={report}", "app.py")
        assert done.returncode == 0, done.stderr
    finally:
        server.communicate("", timeout=TIMEOUT)
    assert done.stdout.split() == ["True"]
    result = json.loads(report.read_text())
    assert result["cross_process"] == 1 and result["links_made"] == 0 and result["fallbacks"] == {}
    assert result["cross_process_peers"] == {str(server.pid): 1}
    assert f"friendsock: between processes: 1 moved off TCP (pid {server.pid}: 1)" in done.stderr.splitlines()


def test_bad_input_exits_2_with_pythons_words(tmp_path: Path) -> None:
    missing = tmp_path / "missing.py"
    done = _run(tmp_path, str(missing))
    python = _run(tmp_path, str(missing), python=True)
    assert (done.returncode, done.stderr) == (2, python.stderr)
    assert done.stderr == f"{sys.executable}: can't open file {str(missing)!r}: " \
                          f"[Errno 2] No such file or directory\n"
    done = _run(tmp_path, "-m", "no_such_module_here", "x")
    assert (done.returncode, done.stderr) == (2, f"{sys.executable}: No module named no_such_module_here\n")
    done = _run(tmp_path, "--frobnicate", "app.py")
    assert done.returncode == 2
    assert done.stderr == "python -m friendsock run: unknown option --frobnicate (see --help)\n"


def test_friendsock_install_in_the_environment_of_plain_python(project: Path) -> None:
    (project / "app.py").write_text(textwrap.dedent("""
        import asyncio
        import exchange_lib

        exchange_lib.done(asyncio.run(exchange_lib.exchange()), __name__)
    """))
    report = project / "report-{pid}.json"
    done = _run(project, "app.py", python=True,
                env=_env(FRIENDSOCK_INSTALL="1", FRIENDSOCK_REPORT=f"stderr,json={report}"))
    result = _result(done)
    assert result["paired"] == [True, True, False], "friendsock.pth did not install friendsock"
    assert "friendsock: links made:  2" in done.stderr
    [written] = project.glob("report-*.json")
    assert json.loads(written.read_text()) == result["stats"]
    # Without the variable, python is python.
    result = _result(_run(project, "app.py", python=True))
    assert result["paired"] == [False, False, False]


SESSION_TEST = """
import asyncio


async def echo(reader, writer):
    writer.write(await reader.read(100))
    await writer.drain()
    writer.close()


def test_echo():
    async def main():
        server = await asyncio.start_server(echo, "127.0.0.1", 0)
        reader, writer = await asyncio.open_connection(*server.sockets[0].getsockname()[:2])
        writer.write(b"hi")
        assert await reader.read(100) == b"hi"
        writer.close()
        await writer.wait_closed()
        server.close()
        await server.wait_closed()

    asyncio.run(main())
"""


def test_pytest_summary_under_the_option_only(pytester: pytest.Pytester) -> None:
    pytester.makepyfile(test_session=SESSION_TEST)
    result = run_inner_pytest(pytester, "--friendsock", timeout=TIMEOUT)
    result.assert_outcomes(passed=1)
    result.stdout.fnmatch_lines([
        "*= friendsock =*",
        "links made:  1",
        "bytes moved: 4 bytes",
        "fell back:   0",
        "listener * paired  fell back",
        "127.0.0.1:* 1 * 0",
    ])
    result = run_inner_pytest(pytester, timeout=TIMEOUT)
    result.assert_outcomes(passed=1)
    assert "= friendsock =" not in result.stdout.str() and "links made" not in result.stdout.str()


# -- the per-listener figures, in this process --------------------------------

async def _echo(reader: Any, writer: Any) -> None:
    writer.write(await reader.readline())
    await writer.drain()
    writer.close()


async def _echo_once(host: str, port: int, friends: Optional[bool] = None) -> None:
    import friendsock

    reader, writer = await friendsock.open_connection(host, port, friends=friends)
    writer.write(b"x\n")
    assert await reader.readline() == b"x\n"
    writer.close()
    await writer.wait_closed()


async def test_stats_per_listener_asyncio() -> None:
    import friendsock
    from friendsock._report import since

    before = friendsock.stats()
    server = await friendsock.start_server(_echo, "127.0.0.1", 0)
    host, port = server.sockets[0].getsockname()[:2]
    for friends in (None, None, False):
        await _echo_once(host, port, friends)
    server.close()
    await server.wait_closed()
    with pytest.raises(OSError):  # nobody listens there any more
        await friendsock.open_connection(host, port)
    delta = since(before, friendsock.stats())
    [listener] = delta.listeners.values()
    assert listener.address == f"127.0.0.1:{port}"
    assert listener.links_made == 2 and delta.links_made == 2
    assert dict(listener.fallbacks) == {"opted-out": 1, "peer-not-friend": 1, "no-listener": 1}
    assert listener.fell_back == 3 and dict(delta.fallbacks) == dict(listener.fallbacks)


_host_numbers = itertools.count()  # (each run its own hosts: none counted before)


async def test_stats_per_listener_after_more_addresses_than_kept() -> None:
    """A long session (a server on a new port for each test, clients of
    many hosts) still counts its latest listener under its own address:
    the addresses not used lately make room."""
    import friendsock
    from friendsock._core._stats import MAX_PLACES
    from friendsock._report import since

    before = friendsock.stats()
    for _ in range(MAX_PLACES + 16):  # refused at once: nobody listens on port 1
        number = next(_host_numbers)
        host = f"127.{number // 62500 % 250 + 1}.{number // 250 % 250}.{number % 250 + 1}"
        with pytest.raises(OSError):
            await friendsock.open_connection(host, 1)
    server = await friendsock.start_server(_echo, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    await _echo_once("127.0.0.1", port)
    server.close()
    await server.wait_closed()
    delta = since(before, friendsock.stats())
    assert delta.links_made == 1 and delta.fallbacks["no-listener"] == MAX_PLACES + 16
    assert delta.listeners[f"127.0.0.1:{port}"].links_made == 1
    assert dict(delta.listeners[f"{host}:1"].fallbacks) == {"no-listener": 1}


@pytest.mark.trio
async def test_stats_per_listener_trio() -> None:
    import trio

    import friendsock
    import friendsock.trio as ftrio
    from friendsock._report import since

    before = friendsock.stats()
    [listener] = await ftrio.open_tcp_listeners(0, host="127.0.0.1")
    port = listener.socket.getsockname()[1]
    accepted = []
    async with trio.open_nursery() as nursery:
        async def accept_all() -> None:
            while True:
                stream = await listener.accept()
                accepted.append(stream)
                await stream.aclose()

        nursery.start_soon(accept_all)
        for friends in (None, False):
            stream = await ftrio.open_tcp_stream("127.0.0.1", port, friends=friends)
            await stream.aclose()
        with trio.fail_after(10):
            while len(accepted) < 2:
                await trio.sleep(0.001)
        nursery.cancel_scope.cancel()
    await listener.aclose()
    counts = since(before, friendsock.stats()).listeners[f"127.0.0.1:{port}"]
    assert counts.links_made == 1
    assert dict(counts.fallbacks) == {"opted-out": 1, "peer-not-friend": 1}


_IMPORT_ORDER_PROGRAM = '''
import importlib, sys
for name in sys.argv[1].split(","):
    importlib.import_module(name)
import asyncio, uvloop, trio
import friendsock, friendsock.trio

async def main():
    listeners = await trio.open_tcp_listeners(0, host="127.0.0.1")
    async with trio.open_nursery() as nursery:
        async def serve():
            async with await listeners[0].accept() as stream:
                await stream.send_all(b"hi")
        nursery.start_soon(serve)
        async with await trio.open_tcp_stream("127.0.0.1", listeners[0].socket.getsockname()[1]) as s:
            assert await s.receive_some(2) == b"hi"
            paired = friendsock.is_friend(s)
    await listeners[0].aclose()
    return paired

print(friendsock.trio.is_installed(), friendsock.is_installed(asyncio.new_event_loop()),
      friendsock.is_installed(uvloop.new_event_loop()), trio.run(main))
'''


@pytest.mark.parametrize("how", ["variable", "run"])
@pytest.mark.parametrize("order", [
    ",".join(first + list(middle) + last)
    for middle in itertools.permutations(["friendsock", "friendsock.trio", "trio"])
    for first, last in ((["asyncio", "uvloop"], []), ([], ["uvloop", "asyncio"]))
])
def test_every_import_order_starts_switched_on(tmp_path: Path, order: str, how: str) -> None:
    # friendsock.trio imports trio, whose import installs friendsock's trio
    # patches while friendsock.trio is still half made.
    program = tmp_path / "program.py"
    program.write_text(_IMPORT_ORDER_PROGRAM)
    if how == "variable":
        done = _run(tmp_path, str(program), order, python=True, env=_env(FRIENDSOCK_INSTALL="1"))
    else:
        done = _run(tmp_path, str(program), order)
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == ["True", "True", "True", "True"]
