"""The pytest plugin (registered through the ``pytest11`` entry point).

- ``--friendsock-socketless``: as ``--friendsock``, with socketless links
  where the listener takes them (``friendsock.set_socketless(True)``);
- ``--friendsock`` (or ``friendsock = true`` in the ini file) pairs friend
  links on every asyncio and uvloop loop the session creates, and in trio
  (pytest-trio, anyio's plugin on either backend), with no change to the
  tests; ``--no-friendsock`` overrides the ini file;
- the ``friendsock`` fixture pairs friend links for one test, on whatever
  loop the test runs or in trio, and exposes the counters, with assertions
  that connections paired or fell back;
- ``@pytest.mark.real_tcp`` forces real TCP for one test;
- ``friendsock_server`` starts friendsock servers on ``127.0.0.1:0`` and
  closes them after the test;
- ``--friendsock-sockets`` (or ``friendsock_sockets = true``) also patches
  the ``socket`` module (:func:`friendsock.patch_socket`), so blocking
  clients and servers in threads pair too; separate from ``--friendsock``
  because it changes every blocking socket of the test process;
- under ``--friendsock`` or ``--friendsock-sockets``, the terminal summary
  reports what paired in the session (links made, bytes moved, fallbacks
  by reason, top listeners).

The fixtures are plain (synchronous) fixtures whose work happens on the
test's own loop, so they behave the same in pytest-asyncio's strict and auto
modes and whatever the test's ``loop_scope``.
"""

from __future__ import annotations

import asyncio
import inspect
from typing import Any, Callable, Dict, Iterator, List, Mapping, Optional, Tuple

import pytest

from ._asyncio._api import create_server, start_server
from ._blocking._capable import drop_connect_guard
from ._everywhere import install_everywhere
from ._core._stats import FriendStats
from ._core._switch import is_enabled, set_enabled
from ._report import as_dict, combined, from_dict, leave_stderr_out_at_exit, since, text_lines

# The counters when a session-wide --friendsock session started.
_SESSION_BASELINE = pytest.StashKey[FriendStats]()
# Under pytest-xdist: what each worker counted (the controller's), and the
# key of a worker's output it comes in.
_WORKER_COUNTS = pytest.StashKey[List[FriendStats]]()
_WORKER_OUTPUT = "friendsock_counts"
# The session patched the socket module (--friendsock-sockets).
_SOCKETS_PATCHED = pytest.StashKey[bool]()


def pytest_addoption(parser: pytest.Parser) -> None:
    group = parser.getgroup("friendsock", "friendsock: in-process TCP friend links")
    group.addoption(
        "--friendsock",
        action="store_true",
        dest="friendsock",
        default=None,
        help="pair in-process TCP connections as friend links on every asyncio/uvloop loop and in trio",
    )
    group.addoption(
        "--no-friendsock",
        action="store_false",
        dest="friendsock",
        default=None,
        help="do not pair session-wide, whatever the 'friendsock' ini option says",
    )
    group.addoption(
        "--friendsock-sockets",
        action="store_true",
        dest="friendsock_sockets",
        default=None,
        help="also pair blocking sockets in threads (friendsock.patch_socket())",
    )
    group.addoption(
        "--friendsock-socketless",
        action="store_true",
        dest="friendsock_socketless",
        default=False,
        help="--friendsock, with socketless links where the listener takes them "
             "(friendsock.set_socketless(True): no kernel socket per connection)",
    )
    parser.addini(
        "friendsock_sockets",
        type="bool",
        default=False,
        help="also pair blocking sockets in threads (as --friendsock-sockets)",
    )
    parser.addini(
        "friendsock",
        type="bool",
        default=False,
        help="pair in-process TCP connections as friend links (as --friendsock)",
    )


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line(
        "markers", "real_tcp: this test's connections use real TCP, never friend links"
    )
    option = config.getoption("friendsock")
    socketless = config.getoption("friendsock_socketless")
    if socketless:
        from ._core._switch import is_socketless, set_socketless

        if not is_socketless():
            set_socketless(True)
            config.add_cleanup(lambda: set_socketless(False))
    if option or socketless or (option is None and config.getini("friendsock")):
        from . import stats

        config.stash[_SESSION_BASELINE] = stats()
        config.add_cleanup(install_everywhere())
    sockets = config.getoption("friendsock_sockets")
    if sockets or (sockets is None and config.getini("friendsock_sockets")):
        from ._blocking._patch import is_socket_patched, patch_socket, unpatch_socket

        if not is_socket_patched():
            patch_socket()
            config.stash[_SOCKETS_PATCHED] = True
            config.add_cleanup(unpatch_socket)
        if _SESSION_BASELINE not in config.stash:  # the summary tells what paired
            from . import stats

            config.stash[_SESSION_BASELINE] = stats()


def pytest_sessionfinish(session: pytest.Session) -> None:
    config = session.config
    baseline = config.stash.get(_SESSION_BASELINE, None)
    if baseline is not None:
        # The summary tells what paired: not FRIENDSOCK_INSTALL's report too.
        leave_stderr_out_at_exit()
    # A pytest-xdist worker: its counts go to the controller, which reports.
    output = getattr(config, "workeroutput", None)
    if output is not None and baseline is not None:
        from . import stats

        output[_WORKER_OUTPUT] = as_dict(since(baseline, stats()))


@pytest.hookimpl(optionalhook=True)
def pytest_testnodedown(node: Any, error: Any) -> None:
    # pytest-xdist's controller: a worker is done, with its counts.
    counts = getattr(node, "workeroutput", {}).get(_WORKER_OUTPUT)
    if counts is not None:
        node.config.stash.setdefault(_WORKER_COUNTS, []).append(from_dict(counts))


def _patch_sockets_again(config: pytest.Config) -> None:
    # pytest-socket puts its saved socket.socket back after every test (and
    # at a test's setup, for its enable_socket marker).
    if config.stash.get(_SOCKETS_PATCHED, False):
        from ._blocking._patch import patch_again_if_put_back

        patch_again_if_put_back()


def pytest_runtest_setup(item: pytest.Item) -> None:
    # Before the test's fixtures run (they may connect).
    _patch_sockets_again(item.config)


@pytest.hookimpl(trylast=True)
def pytest_runtest_teardown(item: pytest.Item) -> None:
    # After pytest-socket's own teardown: the next test's fixtures pair too,
    # and the guard its allow_hosts set on the patched class for this test
    # guards no other (sockets patched by the option or by the tests).
    drop_connect_guard()
    _patch_sockets_again(item.config)


def pytest_terminal_summary(terminalreporter: Any, exitstatus: int, config: pytest.Config) -> None:
    baseline = config.stash.get(_SESSION_BASELINE, None)
    if baseline is None:
        return
    from . import stats

    counts = combined([since(baseline, stats()), *config.stash.get(_WORKER_COUNTS, [])])
    terminalreporter.ensure_newline()
    terminalreporter.section("friendsock")
    for line in text_lines(counts):
        terminalreporter.write_line(line)


@pytest.fixture(autouse=True)
def _friendsock_real_tcp_marker(request: pytest.FixtureRequest) -> Iterator[None]:
    if request.node.get_closest_marker("real_tcp") is None:
        yield
        return
    was_enabled = is_enabled()
    set_enabled(False)
    try:
        yield
    finally:
        set_enabled(was_enabled)


def _is_friend(connection: Any) -> bool:
    from . import is_friend

    return is_friend(connection)


class FriendsockFixture:
    """What the ``friendsock`` fixture gives a test."""

    def __init__(self) -> None:
        from . import stats

        self._stats = stats
        self.baseline: FriendStats = stats()

    def stats(self) -> FriendStats:
        """The process-wide counters now."""
        return self._stats()

    @property
    def links_made(self) -> int:
        """Friend links paired since the test started."""
        return self._stats().links_made - self.baseline.links_made

    @property
    def fallbacks(self) -> Dict[str, int]:
        """Connections that took real TCP since the test started, by reason."""
        before: Mapping[str, int] = self.baseline.fallbacks
        return {
            reason: count - before.get(reason, 0)
            for reason, count in self._stats().fallbacks.items()
            if count != before.get(reason, 0)
        }

    def assert_paired(self, connection: Any) -> None:
        """``connection`` (a transport or a StreamWriter) is a friend link."""
        if not _is_friend(connection):
            raise AssertionError(
                f"{connection!r} is not a friend link (fallbacks in this test: {self.fallbacks})"
            )

    def assert_fell_back(self, connection: Any, reason: Optional[str] = None) -> None:
        """``connection`` took real TCP (and, when ``reason`` is given, a
        fallback for that reason was counted during this test)."""
        if _is_friend(connection):
            raise AssertionError(f"{connection!r} is a friend link, expected real TCP")
        if reason is not None and reason not in self.fallbacks:
            raise AssertionError(
                f"no fallback for {reason!r} in this test; fallbacks: {self.fallbacks}"
            )


@pytest.fixture
def friendsock() -> Iterator[FriendsockFixture]:
    """Friend links for this test, on every asyncio/uvloop loop (whatever
    the test's loop scope) and in trio, and the counters since the test
    started.

    Request it before fixtures that start servers, so they pair too.
    """
    uninstall = install_everywhere()
    try:
        yield FriendsockFixture()
    finally:
        uninstall()


def _is_stream_handler(handler: Callable[..., Any]) -> bool:
    if inspect.iscoroutinefunction(handler) or inspect.iscoroutinefunction(
        getattr(handler, "__call__", None)
    ):
        return True
    if isinstance(handler, type):
        return False  # a Protocol class
    try:
        signature = inspect.signature(handler)
    except (TypeError, ValueError):
        return False
    try:
        signature.bind()
    except TypeError:
        return True  # needs arguments: (reader, writer)
    return False


ServerFactory = Callable[..., Any]


@pytest.fixture
def friendsock_server() -> Iterator[ServerFactory]:
    """``await friendsock_server(handler)`` starts a friendsock server on
    ``127.0.0.1:0`` on the running loop and returns its ``(host, port)``.

    ``handler`` is a protocol factory, or a ``handler(reader, writer)``
    stream callback (``async def`` or not); ``streams=True/False`` says which
    when guessing from the signature is not enough. Other keywords go to
    ``create_server``/``start_server``. Every server is closed after the test.
    """
    servers: List[Tuple[asyncio.AbstractServer, "asyncio.Task[None]"]] = []

    async def start(
        handler: Callable[..., Any],
        host: str = "127.0.0.1",
        port: int = 0,
        *,
        streams: Optional[bool] = None,
        **kwargs: Any,
    ) -> Tuple[str, int]:
        if streams is None:
            streams = _is_stream_handler(handler)
        if streams:
            server = await start_server(handler, host, port, **kwargs)
        else:
            server = await create_server(handler, host, port, **kwargs)
        # Closed while the loop still runs: a function-scoped loop is closed
        # (its leftover tasks cancelled) before this fixture's teardown.
        servers.append((server, asyncio.get_running_loop().create_task(_close_when_cancelled(server))))
        sockname = server.sockets[0].getsockname()  # type: ignore[attr-defined]  # (an asyncio.Server's)
        return sockname[0], sockname[1]

    try:
        yield start
    finally:
        for server, keeper in servers:
            server.close()
            if not keeper.get_loop().is_closed():
                keeper.cancel()


async def _close_when_cancelled(server: asyncio.AbstractServer) -> None:
    try:
        await asyncio.get_running_loop().create_future()
    finally:
        server.close()
