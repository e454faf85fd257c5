"""The pytest plugin, each case an inner pytest run in a subprocess (class
patching from ``--friendsock`` must never leak into this session).

The inner test files are not changed between runs: with ``--friendsock`` (or
the ini option) their plain asyncio client/server pair, without it they do
not -- the same test passes in one run and fails in the other.
"""

from __future__ import annotations

import textwrap

import pytest

from support import run_inner_pytest

pytest_plugins = ["pytester"]

INNER_TIMEOUT = 60

UVLOOP_CONFTEST = """
import uvloop

def pytest_asyncio_loop_factories(config, item):
    return {"uvloop": uvloop.new_event_loop}
"""

# A test suite written against plain asyncio, with no idea friendsock exists.
ZERO_CHANGE_TESTS = """
import asyncio

import pytest
import friendsock

LOOP_MODULE = {loop_module!r}


async def echo_once(reader, writer):
    writer.write(await reader.readexactly(5))
    await writer.drain()
    writer.close()


async def exchange():
    loop = asyncio.get_running_loop()
    assert type(loop).__module__.split(".")[0] == LOOP_MODULE, type(loop)
    server_writers = []

    async def handler(reader, writer):
        server_writers.append(writer)
        await echo_once(reader, writer)

    server = await asyncio.start_server(handler, "127.0.0.1", 0)
    try:
        reader, writer = await asyncio.open_connection(*server.sockets[0].getsockname()[:2])
        writer.write(b"hello")
        assert await reader.readexactly(5) == b"hello"
        client_paired = friendsock.is_friend(writer)
        writer.close()
        await writer.wait_closed()
    finally:
        server.close()
    return client_paired, friendsock.is_friend(server_writers[0])


{mark}
async def test_streams_pair():
    assert await exchange() == (True, True), "not a friend link"


{mark}
async def test_loop_methods_pair():
    loop = asyncio.get_running_loop()
    made = loop.create_future()

    class Server(asyncio.Protocol):
        def connection_made(self, transport):
            made.set_result(transport)

    server = await loop.create_server(Server, "127.0.0.1", 0)
    try:
        transport, _ = await loop.create_connection(
            asyncio.Protocol, "127.0.0.1", server.sockets[0].getsockname()[1]
        )
        server_transport = await asyncio.wait_for(made, 10)
        paired = friendsock.is_friend(transport), friendsock.is_friend(server_transport)
        transport.close()
        server_transport.close()
    finally:
        server.close()
    assert paired == (True, True), "not a friend link"


@pytest.mark.real_tcp
{mark}
async def test_real_tcp_marker_forces_tcp():
    assert await exchange() == (False, False)
"""

# The fixtures; ``fs`` is the module, as the fixture takes the name. Three
# tests (test_must_fail_*) must fail.
FIXTURE_TESTS = """
import asyncio
import socket

import pytest
import friendsock as fs

LOOP_MODULE = {loop_module!r}


async def connect_to_echo_server():
    async def handler(reader, writer):
        writer.write(await reader.readexactly(4))
        await writer.drain()
        writer.close()

    server = await asyncio.start_server(handler, "127.0.0.1", 0)
    reader, writer = await asyncio.open_connection(*server.sockets[0].getsockname()[:2])
    writer.write(b"ping")
    assert await reader.readexactly(4) == b"ping"
    return server, writer


async def finish(server, writer):
    writer.close()
    await writer.wait_closed()
    server.close()


{mark}
async def test_fixture_pairs(friendsock):
    assert type(asyncio.get_running_loop()).__module__.split(".")[0] == LOOP_MODULE
    assert friendsock.links_made == 0 and friendsock.fallbacks == {{}}
    server, writer = await connect_to_echo_server()
    friendsock.assert_paired(writer)
    assert friendsock.links_made == 1
    assert friendsock.fallbacks == {{}}
    await finish(server, writer)


{mark}
async def test_fixture_counts_a_fallback(friendsock):
    with socket.socket() as listener:  # a plain TCP server, not friendsock's
        listener.bind(("127.0.0.1", 0))
        listener.listen()
        reader, writer = await asyncio.open_connection(*listener.getsockname())
        accepted, _ = listener.accept()
        accepted.close()
    friendsock.assert_fell_back(writer, reason="no-listener")
    assert friendsock.fallbacks == {{"no-listener": 1}}
    assert friendsock.links_made == 0
    writer.close()
    await writer.wait_closed()


@pytest.mark.real_tcp
{mark}
async def test_real_tcp_marker_with_fixture(friendsock):
    server, writer = await connect_to_echo_server()
    friendsock.assert_fell_back(writer, reason="disabled")
    assert friendsock.links_made == 0
    await finish(server, writer)


@pytest.mark.real_tcp
{mark}
async def test_must_fail_assert_paired_on_real_tcp(friendsock):
    server, writer = await connect_to_echo_server()
    try:
        friendsock.assert_paired(writer)
    finally:
        await finish(server, writer)


{mark}
async def test_must_fail_assert_fell_back_on_a_friend(friendsock):
    server, writer = await connect_to_echo_server()
    try:
        friendsock.assert_fell_back(writer)
    finally:
        await finish(server, writer)


@pytest.mark.real_tcp
{mark}
async def test_must_fail_assert_fell_back_wrong_reason(friendsock):
    server, writer = await connect_to_echo_server()
    try:
        friendsock.assert_fell_back(writer, reason="ssl")
    finally:
        await finish(server, writer)


class Echo(asyncio.Protocol):
    def connection_made(self, transport):
        self.transport = transport

    def data_received(self, data):
        self.transport.write(data)


async def talk(host, port, opener=asyncio.open_connection):
    reader, writer = await opener(host, port)
    writer.write(b"echo me")
    assert await reader.readexactly(7) == b"echo me"
    return writer


{mark}
async def test_server_with_protocol_factory(friendsock, friendsock_server):
    host, port = await friendsock_server(Echo)
    assert host == "127.0.0.1" and port > 0
    writer = await talk(host, port)
    friendsock.assert_paired(writer)
    writer.close()


{mark}
async def test_server_with_stream_handler(friendsock_server):
    server_side = []

    async def handler(reader, writer):
        server_side.append(fs.is_friend(writer))
        writer.write(await reader.readexactly(7))
        await writer.drain()
        writer.close()

    # Without the fixture: friendsock's own client pairs with it.
    writer = await talk(*await friendsock_server(handler), opener=fs.open_connection)
    assert fs.is_friend(writer) and server_side == [True]
    writer.close()


{mark}
async def test_server_with_sync_stream_handler(friendsock, friendsock_server):
    def handler(reader, writer):
        writer.write(b"greetings")
        writer.close()

    reader, writer = await asyncio.open_connection(*await friendsock_server(handler))
    assert await reader.read() == b"greetings"
    friendsock.assert_paired(writer)
    writer.close()


@pytest.mark.real_tcp
{mark}
async def test_server_under_real_tcp_marker(friendsock, friendsock_server):
    # The server is then the loop's own; it is still closed after the test.
    writer = await talk(*await friendsock_server(Echo))
    friendsock.assert_fell_back(writer, reason="disabled")
    writer.close()


@pytest.mark.asyncio(loop_scope="module")
async def test_module_loop_scope(friendsock, friendsock_server):
    writer = await talk(*await friendsock_server(Echo))
    friendsock.assert_paired(writer)
    writer.close()


@pytest.mark.asyncio(loop_scope="module")
async def test_module_loop_scope_again(friendsock, friendsock_server):
    writer = await talk(*await friendsock_server(Echo))
    friendsock.assert_paired(writer)
    writer.close()
"""

MUST_FAIL = [
    "*FAILED test_fixtures.py::test_must_fail_assert_paired_on_real_tcp* - AssertionError: * is not a friend link*",
    "*FAILED test_fixtures.py::test_must_fail_assert_fell_back_on_a_friend* - AssertionError: * is a friend link, expected real TCP",
    "*FAILED test_fixtures.py::test_must_fail_assert_fell_back_wrong_reason* - AssertionError: no fallback for 'ssl' in this test*",
]


@pytest.fixture(autouse=True)
def wide_terminal(monkeypatch):
    """Whole failure messages in the inner runs' short summaries."""
    monkeypatch.setenv("COLUMNS", "400")


def make_project(pytester: pytest.Pytester, *, mode: str, uvloop: bool, ini_friendsock: bool = False,
                 fixtures: bool = False) -> None:
    ini = f"""
        [pytest]
        asyncio_mode = {mode}
        asyncio_default_fixture_loop_scope = function
        filterwarnings =
            error::ResourceWarning
            error::pytest.PytestUnraisableExceptionWarning
    """
    if ini_friendsock:
        ini += "    friendsock = true\n"
    pytester.makeini(textwrap.dedent(ini))
    if uvloop:
        pytester.makeconftest(UVLOOP_CONFTEST)
    fields = {
        # Auto mode: the file carries no marker at all.
        "mark": "@pytest.mark.asyncio" if mode == "strict" else "",
        "loop_module": "uvloop" if uvloop else "asyncio",
    }
    files = {"test_zero_change": ZERO_CHANGE_TESTS.format(**fields)}
    if fixtures:
        # Collected first: test_zero_change then shows what the fixtures'
        # teardown left behind.
        files["test_fixtures"] = FIXTURE_TESTS.format(**fields)
    pytester.makepyfile(**files)


def run(pytester: pytest.Pytester, *args: str) -> pytest.RunResult:
    return run_inner_pytest(pytester, "-v", *args, timeout=INNER_TIMEOUT)


@pytest.mark.parametrize("mode, uvloop", [("strict", False), ("strict", True), ("auto", False)],
                         ids=["strict-default-loop", "strict-uvloop", "auto-default-loop"])
def test_option_pairs_with_zero_test_changes(pytester, mode, uvloop):
    """(auto mode on uvloop: test_fixtures_with_the_option_on_uvloop.)"""
    make_project(pytester, mode=mode, uvloop=uvloop)
    result = run(pytester, "--friendsock")
    # Each inner test also asserts it ran on the expected loop.
    result.assert_outcomes(passed=3)


# A test whose server runs in a subprocess, switched on as the README says
# for a process that is not under pytest: FRIENDSOCK_INSTALL=1.
SUBPROCESS_SERVER_TEST = """
import asyncio
import os
import sys

import pytest

SERVER = (
    "import asyncio, sys\\n"
    "async def main():\\n"
    "    async def echo(reader, writer):\\n"
    "        writer.write(await reader.read(100))\\n"
    "        await writer.drain()\\n"
    "        writer.close()\\n"
    "    server = await asyncio.start_server(echo, '127.0.0.1', 0)\\n"
    "    print(server.sockets[0].getsockname()[1], flush=True)\\n"
    "    await asyncio.get_running_loop().run_in_executor(None, sys.stdin.read)\\n"
    "asyncio.run(main())\\n"
)


@pytest.mark.asyncio
async def test_a_server_in_a_subprocess(friendsock):
    server = await asyncio.create_subprocess_exec(
        sys.executable, "-c", SERVER, stdin=asyncio.subprocess.PIPE,
        stdout=asyncio.subprocess.PIPE, env=dict(os.environ, FRIENDSOCK_INSTALL="1"))
    try:
        port = int(await asyncio.wait_for(server.stdout.readline(), 20))
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        writer.write(b"ping")
        writer.write_eof()
        assert await asyncio.wait_for(reader.read(), 20) == b"ping"
        friendsock.assert_paired(writer)
        writer.close()
        await writer.wait_closed()
    finally:
        server.stdin.close()
        await asyncio.wait_for(server.wait(), 20)
"""


@pytest.mark.parametrize("uvloop", [False, True], ids=["default-loop", "uvloop"])
def test_a_server_in_a_subprocess_pairs(pytester, uvloop):
    """Between processes: the test's client (paired by the plugin) and its
    server in a subprocess (FRIENDSOCK_INSTALL=1) move the connection off
    TCP; the summary counts it."""
    make_project(pytester, mode="strict", uvloop=uvloop)
    pytester.makepyfile(test_subprocess_server=SUBPROCESS_SERVER_TEST)
    result = run(pytester, "--friendsock", "test_subprocess_server.py")
    result.assert_outcomes(passed=1)
    result.stdout.fnmatch_lines(["*between processes: 1 moved off TCP*"])


@pytest.mark.parametrize("workers", ["0", "2"])
def test_the_summary_is_the_one_report_where_the_variable_is_set_too(pytester, monkeypatch, workers):
    """``FRIENDSOCK_INSTALL=1 pytest --friendsock`` (the variable there for
    a test's server subprocess, say): the session's counts are in the
    summary, not said again at exit, by the run or its xdist workers."""
    monkeypatch.setenv("FRIENDSOCK_INSTALL", "1")
    make_project(pytester, mode="strict", uvloop=False)
    result = run(pytester, "--friendsock", "-n", workers)
    result.assert_outcomes(passed=3)
    result.stdout.fnmatch_lines(["*= friendsock =*", "links made:*"])
    assert not [line for line in result.stderr.lines if line.startswith("friendsock:")], result.stderr.str()


def test_the_summary_counts_every_xdist_worker(pytester):
    """Under pytest-xdist the tests run in worker processes: the summary is
    theirs, summed, the same as without xdist."""
    make_project(pytester, mode="strict", uvloop=False)
    summaries = []
    for workers in ("0", "2"):
        result = run(pytester, "--friendsock", "-n", workers)
        result.assert_outcomes(passed=3)
        lines = result.stdout.lines
        start = next(i for i, line in enumerate(lines) if "friendsock" in line and "===" in line)
        summaries.append([line for line in lines[start + 1:start + 4]])
    assert summaries[0][0].startswith("links made:") and summaries[0][0] != "links made:  0"
    assert summaries[1] == summaries[0]


BLOCKING_SOCKET_TESTS = """
import socket

import pytest
import friendsock


@pytest.fixture
def connection():
    # Made by a fixture, as test suites do: before the test body runs.
    with socket.create_server(("127.0.0.1", 0)) as listener:
        client = socket.create_connection(listener.getsockname(), timeout=10)
        server, _ = listener.accept()
        with client, server:
            yield client


@pytest.mark.parametrize("n", range(3))
def test_blocking_sockets_pair(n, connection):
    assert friendsock.is_friend(connection), "not a friend socket"
"""

def test_the_summary_under_the_sockets_option_alone(pytester):
    """--friendsock-sockets without --friendsock: the summary still tells
    what paired (here, the three tests' blocking links)."""
    pytester.makepyfile(test_blocking=BLOCKING_SOCKET_TESTS)
    result = run(pytester, "--friendsock-sockets")
    result.assert_outcomes(passed=3)
    lines = result.stdout.lines
    start = next(i for i, line in enumerate(lines) if "friendsock" in line and "===" in line)
    assert lines[start + 1].split() == ["links", "made:", "3"]


BLOCKED_SOCKET_TESTS = """
import socket

import pytest
import pytest_socket


@pytest.mark.parametrize("n", range(2))
def test_sockets_stay_blocked(n):
    with pytest.raises(pytest_socket.SocketBlockedError):
        socket.socket()
"""


def test_sockets_stay_patched_beside_pytest_socket(pytester):
    """pytest-socket puts its saved socket.socket back after every test:
    --friendsock-sockets patches again before the next; where pytest-socket
    blocks sockets, they stay blocked."""
    pytester.makepyfile(test_sockets=BLOCKING_SOCKET_TESTS)
    run(pytester, "--friendsock-sockets").assert_outcomes(passed=3)
    pytester.makepyfile(test_sockets=BLOCKED_SOCKET_TESTS)
    run(pytester, "--friendsock-sockets", "--disable-socket").assert_outcomes(passed=2)


ALLOW_HOSTS_TESTS = """
import socket

import pytest
import pytest_socket
import friendsock


def connected_at(host):
    \"\"\"Whether a blocking connection to a listener at ``host`` paired.\"\"\"
    with socket.create_server((host, 0)) as listener:
        client = socket.create_connection(listener.getsockname(), timeout=10)
        server, _ = listener.accept()
        with client, server:
            client.sendall(b"x")
            assert server.recv(1) == b"x"
            return friendsock.is_friend(client)


@pytest.mark.allow_hosts(["127.0.0.1"])
def test_an_allowed_host_connects():
    assert connected_at("127.0.0.1") is friendsock.is_socket_patched()


@pytest.mark.allow_hosts(["127.0.0.1"])
def test_other_hosts_stay_refused():
    with socket.create_server(("127.0.0.2", 0)) as listener:
        with pytest.raises(pytest_socket.SocketConnectBlockedError):
            socket.create_connection(listener.getsockname(), timeout=10)


def test_the_next_test_is_not_guarded():
    assert connected_at("127.0.0.2") is friendsock.is_socket_patched()
"""


@pytest.mark.parametrize("sockets", [True, False], ids=["patched", "not-patched"])
def test_pytest_sockets_allow_hosts_holds_for_its_test_only(pytester, sockets):
    """pytest-socket's allow_hosts guards one test's connects, by setting
    ``socket.socket.connect`` (the patched class) and putting back only the
    class it saved: what it allows pairs, what it refuses stays refused, and
    the next test is not guarded; the same without the patch."""
    pytester.makepyfile(test_allow_hosts=ALLOW_HOSTS_TESTS)
    option = "--friendsock-sockets" if sockets else "--no-friendsock"
    run(pytester, option).assert_outcomes(passed=3)
    if sockets:  # the command line's --allow-hosts, for every test
        pytester.makepyfile(test_sockets=BLOCKING_SOCKET_TESTS)
        run(pytester, option, "--allow-hosts=127.0.0.1", "test_sockets.py").assert_outcomes(passed=3)


SOCKETLESS_TESTS = """
import asyncio

import pytest
import friendsock


@pytest.mark.asyncio
async def test_socketless_pair():
    async def echo(reader, writer):
        writer.write(await reader.readexactly(4))
        await writer.drain()
        writer.close()

    server = await asyncio.start_server(echo, "127.0.0.1", 0)
    try:
        reader, writer = await asyncio.open_connection(*server.sockets[0].getsockname()[:2])
        writer.write(b"ping")
        assert await reader.readexactly(4) == b"ping"
        assert friendsock.is_friend(writer), "not a friend link"
        assert writer.get_extra_info("socket").fileno() == -1, "not socketless"
        writer.close()
        await writer.wait_closed()
    finally:
        server.close()
        await server.wait_closed()
"""


def test_socketless_option(pytester):
    """--friendsock-socketless: --friendsock, with socketless links; the
    switch is off again after the session."""
    pytester.makeini("[pytest]\nasyncio_mode = strict\n")
    pytester.makepyfile(test_socketless=SOCKETLESS_TESTS)
    run(pytester, "--friendsock-socketless").assert_outcomes(passed=1)
    result = run(pytester, "--friendsock")
    result.assert_outcomes(failed=1)
    result.stdout.fnmatch_lines(["*not socketless*"])


def test_ini_option_pairs(pytester):
    make_project(pytester, mode="strict", uvloop=False, ini_friendsock=True)
    run(pytester).assert_outcomes(passed=3)


@pytest.mark.parametrize("ini_friendsock, args", [(False, ()), (True, ("--no-friendsock",))],
                         ids=["no-option", "no-friendsock-overrides-ini"])
def test_without_the_option_nothing_pairs(pytester, ini_friendsock, args):
    make_project(pytester, mode="strict", uvloop=False, ini_friendsock=ini_friendsock)
    result = run(pytester, *args)
    result.assert_outcomes(passed=1, failed=2)
    result.stdout.fnmatch_lines([
        "*FAILED test_zero_change.py::test_streams_pair - AssertionError: not a friend link*",
        "*FAILED test_zero_change.py::test_loop_methods_pair - AssertionError: not a friend link*",
    ], consecutive=False)
    result.stdout.fnmatch_lines(["*test_real_tcp_marker_forces_tcp PASSED*"])


def test_fixtures_without_the_option(pytester):
    """Strict mode, the default loop, no --friendsock: the fixture alone
    pairs, for its own test only (the plain tests after it do not pair)."""
    make_project(pytester, mode="strict", uvloop=False, fixtures=True)
    result = run(pytester, "test_fixtures.py", "test_zero_change.py")
    result.assert_outcomes(passed=9 + 1, failed=3 + 2)
    result.stdout.fnmatch_lines(MUST_FAIL, consecutive=False)
    result.stdout.fnmatch_lines([
        "*FAILED test_zero_change.py::test_streams_pair - AssertionError: not a friend link*",
        "*FAILED test_zero_change.py::test_loop_methods_pair - AssertionError: not a friend link*",
    ], consecutive=False)


def test_fixtures_with_the_option_on_uvloop(pytester):
    """Auto mode, uvloop, --friendsock already on: the fixture keeps working
    and its teardown leaves the session's patching in place."""
    make_project(pytester, mode="auto", uvloop=True, fixtures=True)
    result = run(pytester, "--friendsock", "test_fixtures.py", "test_zero_change.py")
    result.assert_outcomes(passed=9 + 3, failed=3)
    result.stdout.fnmatch_lines(MUST_FAIL, consecutive=False)



# pytest-aiohttp's fixtures, on a plain aiohttp app: its test server listens on
# a socket it binds itself (create_server(sock=...)), its client is aiohttp's
# default connector (loop.sock_connect, then create_connection(sock=...)).
AIOHTTP_CLIENT_TESTS = """
import asyncio
import os

import pytest
from aiohttp import web

import friendsock

LOOP_MODULE = {loop_module!r}


{mark}
async def test_aiohttp_client_pairs(aiohttp_client):
    assert type(asyncio.get_running_loop()).__module__.split(".")[0] == LOOP_MODULE
    server_side = []

    async def echo(request):
        server_side.append(friendsock.is_friend(request.transport))
        return web.Response(body=await request.read())

    app = web.Application(client_max_size=2 ** 21)
    app.router.add_post("/echo", echo)
    before = friendsock.stats()
    client = await aiohttp_client(app)
    body = os.urandom(2 ** 20)
    for _ in range(2):  # one kept-alive connection
        response = await client.post("/echo", data=body)
        assert response.status == 200
        assert await response.read() == body
    after = friendsock.stats()
    fallbacks = {{k: v - before.fallbacks.get(k, 0) for k, v in after.fallbacks.items()
                 if v != before.fallbacks.get(k, 0)}}
    assert server_side == [True, True], f"not a friend link; fallbacks: {{fallbacks}}"
    assert after.links_made == before.links_made + 1
    assert fallbacks == {{}}
"""

# Only the plugins the inner run needs, loaded by module: the entry-point
# autoload would also import pytest-trio and hypothesis, about 1.5 s a run.
AIOHTTP_PLUGINS = ("-p", "pytest_asyncio.plugin", "-p", "pytest_aiohttp.plugin", "-p", "friendsock.pytest_plugin")


def run_aiohttp_project(pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch, *args: str, mode: str,
                        uvloop: bool) -> pytest.RunResult:
    pytester.makeini(textwrap.dedent(f"""
        [pytest]
        asyncio_mode = {mode}
        asyncio_default_fixture_loop_scope = function
        filterwarnings =
            error::ResourceWarning
            error::pytest.PytestUnraisableExceptionWarning
    """))
    if uvloop:
        pytester.makeconftest(UVLOOP_CONFTEST)
    pytester.makepyfile(test_aiohttp_client=AIOHTTP_CLIENT_TESTS.format(
        mark="@pytest.mark.asyncio" if mode == "strict" else "",
        loop_module="uvloop" if uvloop else "asyncio",
    ))
    monkeypatch.setenv("PYTEST_DISABLE_PLUGIN_AUTOLOAD", "1")
    return run(pytester, *AIOHTTP_PLUGINS, *args)


@pytest.mark.parametrize("mode, uvloop", [
    ("strict", False),
    ("strict", True),
    ("auto", False),
], ids=["strict-default-loop", "strict-uvloop", "auto-default-loop"])
def test_pytest_aiohttp_client_pairs(pytester, monkeypatch, mode, uvloop):
    """pytest-aiohttp's ``aiohttp_client`` under ``--friendsock``: its
    connection is a friend link, both ends, with no fallback counted."""
    result = run_aiohttp_project(pytester, monkeypatch, "--friendsock", mode=mode, uvloop=uvloop)
    result.assert_outcomes(passed=1)


def test_pytest_aiohttp_client_without_the_option(pytester, monkeypatch):
    result = run_aiohttp_project(pytester, monkeypatch, mode="strict", uvloop=True)
    result.assert_outcomes(failed=1)
    result.stdout.fnmatch_lines(
        ["*FAILED test_aiohttp_client.py::test_aiohttp_client_pairs - AssertionError: not a friend link*"]
    )
