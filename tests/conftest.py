"""Every transport test runs on {friend path, real TCP} x {asyncio, uvloop}.

Teardown fails a test on any exception that reached the loop's exception
handler and on any transport left unclosed (ResourceWarning is an error).

pytest-asyncio runs in strict mode so that pytest-trio can run the tests
marked ``trio``; every other coroutine test is an asyncio test, as in auto
mode (see ``pytest_pycollect_makeitem``).
"""

from __future__ import annotations

import asyncio
import gc
import inspect
import os
import signal
import sys
import warnings

import pytest
import pytest_asyncio
import uvloop

# The suite interrupts its own main thread (the benchmark's watchdog) and
# stops servers it started with SIGINT, as ^C would. Started with SIGINT
# ignored (as a background job of a non-interactive shell is, and every
# process it starts after it), both would wait for good: the default is
# put back, for this process and those it starts.
if signal.getsignal(signal.SIGINT) is signal.SIG_IGN:
    signal.signal(signal.SIGINT, signal.default_int_handler)


def _new_uvloop() -> asyncio.AbstractEventLoop:
    """A uvloop loop whose close() reports what it finds left open.

    With ResourceWarning an error, uvloop's close() would spin forever in C
    on an unclosed handle (no timeout can stop it); here the warnings are
    collected and turned into one failure instead.
    """
    loop = uvloop.new_event_loop()
    close = loop.close

    def close_and_report() -> None:
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always", ResourceWarning)
            close()
        leaked = [str(w.message) for w in caught if issubclass(w.category, ResourceWarning)]
        if leaked:
            raise AssertionError(f"left open when the loop closed: {leaked}")

    loop.close = close_and_report
    return loop


@pytest.hookimpl(hookwrapper=True)
def pytest_pycollect_makeitem(collector, name, obj):
    # Marks go on the function before pytest-asyncio sees it (it reads them
    # while generating the items, for the loop parametrization).
    if (
        inspect.iscoroutinefunction(obj)
        and collector.get_closest_marker("trio") is None
        and not any(mark.name == "trio" for mark in getattr(obj, "pytestmark", ()))
    ):
        pytest.mark.usefixtures("loop_guard")(obj)
        pytest.mark.asyncio(obj)
    yield


def pytest_xdist_auto_num_workers(config):
    # Two workers a core (-n auto; --maxprocesses caps it): the tests with
    # other processes, timers or threads spend much of their time waiting.
    return (os.cpu_count() or 1) * 2


def pytest_configure(config):
    if sys.version_info < (3, 11):
        # 3.10's asyncio TLS transport says it is open once its connection
        # is lost under it (see support.OLD_ASYNCIO_TLS), and warns when
        # collected: over TCP as over friend links.
        config.addinivalue_line(
            "filterwarnings", "ignore:unclosed transport <asyncio.sslproto._SSLProtocolTransport:ResourceWarning")


def pytest_asyncio_loop_factories(config, item):
    return {"asyncio": asyncio.new_event_loop, "uvloop": _new_uvloop}


@pytest.fixture(params=["friend", "tcp"])
def path(request) -> str:
    """Which path the connection under test takes."""
    return request.param


@pytest.fixture
def friends(path) -> bool:
    """The ``friends=`` keyword for the path under test."""
    return path == "friend"


@pytest_asyncio.fixture
async def loop_guard():
    """Fail on unhandled loop exceptions; collect garbage so an unclosed
    transport's ResourceWarning is raised inside this test."""
    loop = asyncio.get_running_loop()
    errors = []
    loop.set_exception_handler(lambda _loop, context: errors.append(context))
    yield errors
    # Let connection_lost callbacks scheduled by the test's last close() run.
    for _ in range(3):
        await asyncio.sleep(0)
    gc.collect()
    loop.set_exception_handler(None)
    if errors:
        pytest.fail(f"unhandled loop exceptions: {errors!r}")


# Modules that run other modules' tests again under a mode that changes
# friend connects alone (socketless links, links over kept connections):
# there those tests run on the friend path; on the TCP path they would be
# their home module's runs once more.
FRIEND_MODE_MODULES = frozenset({"test_socketless", "test_reuse", "test_trio_socketless", "test_trio_reuse"})


def pytest_collection_modifyitems(config, items):
    again_over_tcp = [
        item for item in items
        if isinstance(item, pytest.Function) and item.module.__name__ in FRIEND_MODE_MODULES
        and item.function.__module__ != item.module.__name__
        and getattr(item, "callspec", None) is not None and item.callspec.params.get("path") == "tcp"]
    if again_over_tcp:
        config.hook.pytest_deselected(items=again_over_tcp)
        dropped = set(again_over_tcp)
        items[:] = [item for item in items if item not in dropped]


def pytest_collection_finish(session):
    # Every coroutine test ends with a gc.collect() (loop_guard). What the
    # imports and the collection made lives for the whole session: moved
    # out of the collector's sight, a collect() looks at what the tests made.
    gc.freeze()
