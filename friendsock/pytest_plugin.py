"""The pytest plugin (registered through the ``pytest11`` entry point).

- ``--friendsock`` (or ``friendsock = true`` in the ini file) pairs friend
  links on every asyncio and uvloop loop the session creates, with no change
  to the tests;
- the ``friendsock`` fixture installs on the test's loop and exposes the
  counters, with assertions that connections paired or fell back;
- ``@pytest.mark.real_tcp`` forces real TCP for one test;
- ``friendsock_server`` starts friendsock servers on ``127.0.0.1:0`` and
  closes them after the test.
"""

from __future__ import annotations

import asyncio
import inspect
from typing import Any, AsyncIterator, Awaitable, Callable, Iterator, List, Optional, Tuple

import pytest

from ._asyncio._api import create_server, is_friend, start_server
from ._asyncio._install import install, install_class, uninstall, uninstall_class
from ._core._stats import FriendStats
from ._core._switch import is_enabled, set_enabled

try:
    import pytest_asyncio

    _async_fixture = pytest_asyncio.fixture
except ImportError:  # pragma: no cover - the fixtures then say what is missing
    pytest_asyncio = None
    _async_fixture = pytest.fixture


def pytest_addoption(parser: pytest.Parser) -> None:
    group = parser.getgroup("friendsock", "friendsock: in-process TCP friend links")
    group.addoption(
        "--friendsock",
        action="store_true",
        default=None,
        help="pair in-process TCP connections as friend links on every asyncio loop",
    )
    parser.addini(
        "friendsock",
        type="bool",
        default=False,
        help="pair in-process TCP connections as friend links (as --friendsock)",
    )


def _loop_classes() -> List[type]:
    classes: List[type] = [asyncio.BaseEventLoop]
    try:
        import uvloop
    except ImportError:
        pass
    else:
        classes.append(uvloop.Loop)
    return classes


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line("markers", "real_tcp: this test's connections use real TCP, never friend links")
    option = config.getoption("friendsock")
    if option or (option is None and config.getini("friendsock")):
        classes = _loop_classes()
        for klass in classes:
            install_class(klass)

        def restore() -> None:
            for klass in classes:
                uninstall_class(klass)

        config.add_cleanup(restore)


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


class FriendsockFixture:
    """What the ``friendsock`` fixture gives a test."""

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        from . import stats

        self.loop = loop
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
    def fallbacks(self) -> dict:
        """Connections that took real TCP since the test started, by reason."""
        now = self._stats().fallbacks
        return {
            reason: count - self.baseline.fallbacks.get(reason, 0)
            for reason, count in now.items()
            if count != self.baseline.fallbacks.get(reason, 0)
        }

    def assert_paired(self, connection: Any) -> None:
        """``connection`` (a transport or a StreamWriter) is a friend link."""
        if not is_friend(connection):
            raise AssertionError(f"{connection!r} is not a friend link (fallbacks: {self.fallbacks})")

    def assert_fell_back(self, connection: Any, reason: Optional[str] = None) -> None:
        """``connection`` took real TCP (for ``reason``, when given)."""
        if is_friend(connection):
            raise AssertionError(f"{connection!r} is a friend link, expected real TCP")
        if reason is not None and reason not in self.fallbacks:
            raise AssertionError(f"no fallback for {reason!r} in this test: {self.fallbacks}")


def _need_pytest_asyncio() -> None:
    if pytest_asyncio is None:
        raise pytest.UsageError("the friendsock fixtures need pytest-asyncio")


@_async_fixture
async def friendsock() -> AsyncIterator[FriendsockFixture]:
    """Friend links on this test's loop, and its counters."""
    _need_pytest_asyncio()
    loop = asyncio.get_running_loop()
    already = "_friendsock_saved" in loop.__dict__
    install(loop)
    try:
        yield FriendsockFixture(loop)
    finally:
        if not already:
            uninstall(loop)


ServerFactory = Callable[..., Awaitable[Tuple[str, int]]]


@_async_fixture
async def friendsock_server() -> AsyncIterator[ServerFactory]:
    """``await friendsock_server(handler)`` starts a friendsock server on
    ``127.0.0.1:0`` and returns its ``(host, port)``; ``handler`` is a
    protocol factory, or an ``async def handler(reader, writer)`` for
    streams. Every server is closed after the test."""
    _need_pytest_asyncio()
    servers: List[asyncio.AbstractServer] = []

    async def start(handler: Callable[..., Any], **kwargs: Any) -> Tuple[str, int]:
        if inspect.iscoroutinefunction(handler):
            server = await start_server(handler, "127.0.0.1", 0, **kwargs)
        else:
            server = await create_server(handler, "127.0.0.1", 0, **kwargs)
        servers.append(server)
        host, port = server.sockets[0].getsockname()[:2]
        return host, port

    try:
        yield start
    finally:
        for server in servers:
            server.close()
