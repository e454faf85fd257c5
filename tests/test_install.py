"""install()/uninstall(): patching a loop so every library on it pairs.

Every async test here runs on asyncio and on uvloop (see conftest).
"""

from __future__ import annotations

import asyncio
import contextlib
import contextvars
import errno
import gc
import socket
import ssl
import sys
import unittest.mock
from asyncio import selector_events
from typing import AsyncIterator, List, Tuple

import pytest
import trustme
import uvloop

import friendsock
from friendsock._asyncio._install import install_class, native, uninstall_class
from friendsock._asyncio._native import _class_wrapper_context
from support import Recorder, run_on

PATCHED = ("create_connection", "create_server")


def own_methods_are_the_class(loop: asyncio.AbstractEventLoop) -> bool:
    """The loop's create_connection/create_server are its class's again."""
    return all(
        name not in vars(loop) and getattr(loop, name) == getattr(type(loop), name).__get__(loop)
        for name in PATCHED
    )


async def echo_handler(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    try:
        while data := await reader.read(65536):
            writer.write(data)
            await writer.drain()
    finally:
        writer.close()


@contextlib.asynccontextmanager
async def stream_server(**kwargs) -> AsyncIterator[Tuple[asyncio.AbstractServer, int, List[asyncio.StreamWriter]]]:
    """asyncio.start_server on 127.0.0.1:0; yields (server, port, server-side writers)."""
    writers: List[asyncio.StreamWriter] = []

    async def handler(reader, writer):
        writers.append(writer)
        await echo_handler(reader, writer)

    server = await asyncio.start_server(handler, "127.0.0.1", 0, **kwargs)
    try:
        yield server, server.sockets[0].getsockname()[1], writers
    finally:
        server.close()
        for writer in writers:
            writer.close()


async def roundtrip(reader: asyncio.StreamReader, writer: asyncio.StreamWriter, payload: bytes) -> None:
    writer.write(payload)
    await writer.drain()
    assert await asyncio.wait_for(reader.readexactly(len(payload)), 10) == payload


async def close_writer(writer: asyncio.StreamWriter) -> None:
    writer.close()
    with contextlib.suppress(ConnectionError):
        await asyncio.wait_for(writer.wait_closed(), 10)


# -- pairing once installed --------------------------------------------------


async def test_install_pairs_stream_helpers():
    loop = friendsock.install()
    try:
        assert loop is asyncio.get_running_loop()
        assert friendsock.is_installed()
        before = friendsock.stats().links_made
        async with stream_server() as (_, port, writers):
            reader, writer = await asyncio.open_connection("127.0.0.1", port)
            try:
                assert friendsock.is_friend(writer)
                await roundtrip(reader, writer, b"hello friend" * 1000)
                assert len(writers) == 1 and friendsock.is_friend(writers[0])
            finally:
                await close_writer(writer)
        assert friendsock.stats().links_made == before + 1
    finally:
        friendsock.uninstall()


async def test_install_pairs_loop_methods():
    loop = asyncio.get_running_loop()
    friendsock.install(loop)
    try:
        server_protocols: List[Recorder] = []
        accepted = loop.create_future()

        def factory():
            server_protocols.append(Recorder())
            if not accepted.done():
                accepted.set_result(server_protocols[-1])
            return server_protocols[-1]

        server = await loop.create_server(factory, "127.0.0.1", 0)
        try:
            port = server.sockets[0].getsockname()[1]
            transport, client = await loop.create_connection(Recorder, "127.0.0.1", port)
            try:
                assert friendsock.is_friend(transport)
                transport.write(b"ping")
                await asyncio.wait_for(client.made, 10)
                server_side = await asyncio.wait_for(accepted, 10)
                assert await asyncio.wait_for(server_side.wait_bytes(4), 10) == b"ping"
                assert friendsock.is_friend(server_side.transport)
            finally:
                transport.close()
                for protocol in server_protocols:
                    protocol.transport.close()
        finally:
            server.close()
    finally:
        friendsock.uninstall(loop)


async def test_an_opted_out_connect_of_an_installed_loop_stays_tcp_at_both_ends():
    """``create_connection(friends=False)`` on an installed loop, to a
    friendsock server of this loop: the loop's own connect serves it,
    whose inner ``sock_connect`` (asyncio's calls the installed one) does
    not pair it either; both ends are TCP's, nothing is left pending."""
    loop = asyncio.get_running_loop()
    friendsock.install(loop)
    try:
        accepted: "asyncio.Future[Recorder]" = loop.create_future()

        def factory() -> Recorder:
            protocol = Recorder()
            if not accepted.done():
                accepted.set_result(protocol)
            return protocol

        server = await loop.create_server(factory, "127.0.0.1", 0)
        try:
            port = server.sockets[0].getsockname()[1]
            transport, client = await loop.create_connection(Recorder, "127.0.0.1", port, friends=False)
            try:
                transport.write(b"ping")
                server_side = await asyncio.wait_for(accepted, 10)
                assert await asyncio.wait_for(server_side.wait_bytes(4), 10) == b"ping"
                assert not friendsock.is_friend(transport)
                assert not friendsock.is_friend(server_side.transport)
                assert friendsock.stats().pending == 0
            finally:
                transport.close()
                server_side.transport.close()
        finally:
            server.close()
    finally:
        friendsock.uninstall(loop)


async def test_install_is_idempotent():
    loop = asyncio.get_running_loop()
    original = dict(vars(loop))
    assert friendsock.install() is loop
    once = dict(vars(loop))
    assert friendsock.install(loop) is loop  # a no-op
    assert vars(loop).keys() == once.keys()
    assert all(vars(loop)[key] is value for key, value in once.items())
    friendsock.uninstall()  # one uninstall undoes it
    assert not friendsock.is_installed()
    assert vars(loop) == original


async def test_uninstall_restores_the_loop_exactly():
    loop = asyncio.get_running_loop()
    original = dict(vars(loop))
    assert own_methods_are_the_class(loop)
    friendsock.install()
    assert not own_methods_are_the_class(loop)
    friendsock.uninstall()
    assert vars(loop).keys() == original.keys()
    assert all(vars(loop)[key] is value for key, value in original.items())
    assert own_methods_are_the_class(loop)
    assert not friendsock.is_installed()
    # ... and the loop no longer pairs.
    async with stream_server() as (_, port, _writers):
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        try:
            assert not friendsock.is_friend(writer)
            await roundtrip(reader, writer, b"plain tcp")
        finally:
            await close_writer(writer)


async def test_uninstall_restores_an_instance_override():
    """A create_connection the user set on the loop instance before install()
    is what friendsock's fallbacks call, and it is back after uninstall()."""
    loop = asyncio.get_running_loop()
    calls = []
    original_method = loop.create_connection

    async def traced(*args, **kwargs):
        calls.append(kwargs.get("sock") is not None or args[1:3])
        return await original_method(*args, **kwargs)

    loop.create_connection = traced
    try:
        friendsock.install()
        assert native(loop, "create_connection") is traced
        plain = await friendsock.start_server(echo_handler, "127.0.0.1", 0, friends=False)
        try:
            port = plain.sockets[0].getsockname()[1]
            reader, writer = await asyncio.open_connection("127.0.0.1", port)
            try:
                assert not friendsock.is_friend(writer)
                await roundtrip(reader, writer, b"x")
            finally:
                await close_writer(writer)
        finally:
            plain.close()
        assert calls == [("127.0.0.1", port)]
        friendsock.uninstall()
        assert loop.create_connection is traced
    finally:
        del loop.create_connection
    assert own_methods_are_the_class(loop)


async def test_uninstall_of_a_never_installed_loop_is_a_no_op():
    loop = asyncio.get_running_loop()
    original = dict(vars(loop))
    assert not friendsock.is_installed()
    friendsock.uninstall()
    friendsock.uninstall(loop)
    assert vars(loop) == original
    assert own_methods_are_the_class(loop)


@pytest.mark.parametrize("factory", [asyncio.new_event_loop, uvloop.new_event_loop], ids=["asyncio", "uvloop"])
def test_install_and_uninstall_a_loop_that_is_not_running(factory):
    loop = factory()
    try:
        original = dict(vars(loop))
        friendsock.uninstall(loop)  # never installed: a no-op
        assert vars(loop) == original
        assert friendsock.install(loop) is loop
        assert friendsock.is_installed(loop)
        friendsock.uninstall(loop)
        assert vars(loop) == original
        assert own_methods_are_the_class(loop)
    finally:
        loop.close()


# -- errors -----------------------------------------------------------------


def test_install_rejects_what_is_not_a_loop():
    for func in (friendsock.install, friendsock.uninstall, friendsock.is_installed):
        with pytest.raises(TypeError, match=r"takes an asyncio event loop, not 'object'"):
            func(object())


@pytest.mark.parametrize("factory", [asyncio.new_event_loop, uvloop.new_event_loop], ids=["asyncio", "uvloop"])
def test_install_on_a_closed_loop(factory):
    loop = factory()
    loop.close()
    with pytest.raises(RuntimeError, match=r"install\(\) on a closed event loop"):
        friendsock.install(loop)
    assert not friendsock.is_installed(loop)


def test_install_without_a_running_loop():
    for func in (friendsock.install, friendsock.uninstall, friendsock.is_installed):
        with pytest.raises(RuntimeError, match=r"needs a running event loop.*pass the loop"):
            func()
    with pytest.raises(RuntimeError, match=r"installed\(\) needs a running event loop"):
        with friendsock.installed():
            pass  # pragma: no cover


def test_new_event_loop_rejects_a_loop_instance():
    loop = asyncio.new_event_loop()
    try:
        with pytest.raises(TypeError, match="takes a loop class or factory"):
            friendsock.new_event_loop(loop)  # type: ignore[arg-type]
    finally:
        loop.close()


# -- new_event_loop() and asyncio.Runner --------------------------------------


async def _paired_echo() -> Tuple[str, bool]:
    loop = asyncio.get_running_loop()
    assert friendsock.is_installed()
    async with stream_server() as (_, port, writers):
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        try:
            await roundtrip(reader, writer, b"runner")
            return type(loop).__module__, friendsock.is_friend(writer) and friendsock.is_friend(writers[0])
        finally:
            await close_writer(writer)


@pytest.mark.parametrize(
    "loop_factory, module",
    [
        (friendsock.new_event_loop, "asyncio.unix_events"),
        (lambda: friendsock.new_event_loop(uvloop.new_event_loop), "uvloop"),
        (lambda: friendsock.new_event_loop(uvloop.Loop), "uvloop"),
        (lambda: friendsock.new_event_loop(asyncio.SelectorEventLoop), "asyncio.unix_events"),
    ],
    ids=["default", "uvloop-factory", "uvloop-class", "selector-class"],
)
def test_new_event_loop_with_runner(loop_factory, module):
    made = []

    def factory():
        made.append(loop_factory())
        return made[-1]

    loop_module, paired = run_on(factory, _paired_echo())
    assert made[0].__class__.__module__ == module == loop_module
    assert paired


# -- installed() -------------------------------------------------------------


async def test_installed_context_manager():
    loop = asyncio.get_running_loop()
    original = dict(vars(loop))
    with friendsock.installed() as installed_loop:
        assert installed_loop is loop and friendsock.is_installed()
        async with stream_server() as (_, port, _writers):
            reader, writer = await asyncio.open_connection("127.0.0.1", port)
            try:
                assert friendsock.is_friend(writer)
                await roundtrip(reader, writer, b"inside")
            finally:
                await close_writer(writer)
    # (I/O ran meanwhile, so the loop's own counters may differ.)
    assert not friendsock.is_installed()
    assert vars(loop).keys() == original.keys() and own_methods_are_the_class(loop)

    original = dict(vars(loop))
    with pytest.raises(KeyError):
        with friendsock.installed(loop):
            raise KeyError("restored on error too")
    assert vars(loop) == original


async def test_installed_keeps_an_earlier_install():
    loop = friendsock.install()
    try:
        with friendsock.installed():
            assert friendsock.is_installed()
        assert friendsock.is_installed()  # installed before: stays installed
    finally:
        friendsock.uninstall(loop)
    assert not friendsock.is_installed()


# -- class patching (what the pytest plugin does) ------------------------------


class OverridingLoop(asyncio.SelectorEventLoop):
    """A loop subclass that wraps create_connection and calls super()."""

    calls = 0

    async def create_connection(self, *args, **kwargs):
        type(self).calls += 1
        return await super().create_connection(*args, **kwargs)


def test_class_patch_with_a_subclass_override_does_not_recurse():
    async def main():
        plain = await friendsock.start_server(echo_handler, "127.0.0.1", 0, friends=False)
        paired = await asyncio.start_server(echo_handler, "127.0.0.1", 0)
        try:
            results = []
            for server in (plain, paired):
                reader, writer = await asyncio.open_connection(*server.sockets[0].getsockname()[:2])
                try:
                    await roundtrip(reader, writer, b"sub")
                    results.append(friendsock.is_friend(writer))
                finally:
                    await close_writer(writer)
            return results
        finally:
            plain.close()
            paired.close()

    OverridingLoop.calls = 0
    install_class(asyncio.BaseEventLoop)
    try:
        assert run_on(OverridingLoop, main()) == [False, True]
    finally:
        uninstall_class(asyncio.BaseEventLoop)
    assert OverridingLoop.calls == 2


@pytest.mark.parametrize("as_mock", [True, False], ids=["mock", "function"])
def test_a_base_class_method_replaced_after_the_patch_is_what_the_fallback_calls(as_mock):
    """The plugin patches BaseSelectorEventLoop, which inherits
    create_connection; a test that then replaces BaseEventLoop's (asyncssh's
    suite does, to make connects time out) must see its replacement called
    for a connect that does not pair, as without friendsock."""
    calls = []

    async def replacement(*args, **kwargs):
        calls.append(args[-2:])
        raise TimeoutError("from the replacement")

    new = unittest.mock.AsyncMock(side_effect=replacement) if as_mock else replacement

    async def main():
        with socket.socket() as unused:
            unused.bind(("127.0.0.1", 0))
            port = unused.getsockname()[1]
            with unittest.mock.patch.object(asyncio.BaseEventLoop, "create_connection", new):
                with pytest.raises(TimeoutError, match="from the replacement"):
                    await asyncio.open_connection("127.0.0.1", port)
            # And the loop's own method once the replacement is gone.
            with pytest.raises(ConnectionRefusedError):
                await asyncio.open_connection("127.0.0.1", port)
            return port

    install_class(selector_events.BaseSelectorEventLoop)
    try:
        port = run_on(asyncio.SelectorEventLoop, main())
    finally:
        uninstall_class(selector_events.BaseSelectorEventLoop)
    assert calls == [("127.0.0.1", port)]


def test_uninstall_class_restores_the_class_exactly():
    before = {klass: dict(vars(klass)) for klass in (asyncio.BaseEventLoop, uvloop.Loop)}
    for klass in before:
        install_class(klass)
        install_class(klass)  # idempotent
    loop = uvloop.new_event_loop()
    try:
        assert friendsock.is_installed(loop)
    finally:
        for klass in before:
            uninstall_class(klass)
        uninstall_class(asyncio.BaseEventLoop)  # not patched any more: a no-op
    assert not friendsock.is_installed(loop)
    loop.close()
    for klass, saved in before.items():
        assert vars(klass).keys() == saved.keys()
        assert all(vars(klass)[key] is value for key, value in saved.items())


async def _drive_by_hand(coro):
    """Run ``coro`` as a protocol callback may drive a loop coroutine (uvloop's
    tests do, with start_tls): each step from a callback in a fresh Context,
    not in a task."""
    value = None
    while True:
        try:
            yielded = contextvars.copy_context().run(coro.send, value)
        except StopIteration as stop:
            return stop.value
        if yielded is None:
            await asyncio.sleep(0)
        else:
            await asyncio.wait([yielded])


@pytest.mark.parametrize("factory, klass", [(asyncio.new_event_loop, asyncio.BaseEventLoop),
                                            (uvloop.new_event_loop, uvloop.Loop)], ids=["asyncio", "uvloop"])
def test_class_patch_with_a_coroutine_driven_by_hand(factory, klass):
    """A patched method's coroutine resumed in another Context than it
    started in (a ContextVar token from the first can not be reset there)
    completes, and leaves no setting behind in either."""
    async def main():
        server = await asyncio.start_server(echo_handler, "127.0.0.1", 0)
        try:
            loop = asyncio.get_running_loop()
            coro = loop.create_connection(asyncio.Protocol, *server.sockets[0].getsockname()[:2])
            transport, _ = await _drive_by_hand(coro)
            try:
                assert friendsock.is_friend(transport)
            finally:
                transport.close()
            assert _class_wrapper_context.get() is None
        finally:
            server.close()

    install_class(klass)
    try:
        run_on(factory, main())
    finally:
        uninstall_class(klass)


@pytest.mark.parametrize("installed", [True, False], ids=["friend", "tcp"])
@pytest.mark.parametrize("factory, klass", [(asyncio.new_event_loop, asyncio.BaseEventLoop),
                                            (uvloop.new_event_loop, uvloop.Loop)], ids=["asyncio", "uvloop"])
def test_a_refused_connect_leaves_no_reference_cycle(factory, klass, installed):
    """As the loop's own connect (anyio's suite checks it): once caught, the
    error of a refused connect is held by nothing else, not by a patched
    method's frame through the future that carried it (a cycle that keeps
    every frame's locals alive until a collection)."""
    async def main():
        with socket.socket() as holder:  # a port nobody listens on
            holder.bind(("127.0.0.1", 0))
            port = holder.getsockname()[1]
            error = None
            try:
                await asyncio.get_running_loop().create_connection(asyncio.Protocol, "127.0.0.1", port)
            except ConnectionRefusedError as exc:
                error = exc
            assert error is not None
            await asyncio.sleep(0)  # the loop's handle that woke us holds the future till then
            # (Not this frame, whose local it is: 3.10's running frames are
            # objects the collector sees.)
            here = sys._getframe()
            return [r for r in gc.get_referrers(error) if r is not here]

    if installed:
        install_class(klass)
    try:
        assert run_on(factory, main()) == []
    finally:
        uninstall_class(klass)


@pytest.mark.parametrize("installed", [True, False], ids=["friend", "tcp"])
async def test_create_connection_sock_cancelled_a_turn_later(installed):
    """create_connection(sock=) on a socket connected with sock_connect is
    still waiting a turn after it started (as the loop's own waits for
    connection_made); cancelled then, it raises CancelledError and the
    server end sees the connection close, on either path."""
    loop = asyncio.get_running_loop()
    with friendsock.installed() if installed else contextlib.nullcontext():
        async with stream_server() as (server, port, writers):
            sock = socket.socket()
            sock.setblocking(False)
            await loop.sock_connect(sock, ("127.0.0.1", port))
            task = loop.create_task(loop.create_connection(Recorder, sock=sock))
            await asyncio.sleep(0)
            task.cancel()
            with pytest.raises(asyncio.CancelledError):
                await task
            for _ in range(100):
                if writers:
                    break
                await asyncio.sleep(0.01)
            # The echo handler ends at EOF and closes its side.
            await asyncio.wait_for(writers[0].wait_closed(), 10)
            assert sock.fileno() == -1  # closed with the transport

# The abandoned connect leaves the loop's own transport unclosed (on either
# path): its ResourceWarning is the stdlib's, collected here.
@pytest.mark.filterwarnings("ignore::pytest.PytestUnraisableExceptionWarning")
@pytest.mark.parametrize("installed", [True, False], ids=["friend", "tcp"])
def test_a_pending_connect_closed_outside_its_context_raises_nothing(installed):
    """A create_connection(sock=, ssl=) coroutine left pending (its loop
    stopped, a server that never answers the handshake), then closed from
    another context, as the garbage collector may: nothing raises. (The
    stdlib loop only: uvloop cannot close a loop whose transport is still
    handshaking.)"""
    context = ssl.create_default_context()
    context.check_hostname = False
    context.verify_mode = ssl.CERT_NONE
    loop = asyncio.new_event_loop()
    task = coro = None
    try:
        with friendsock.installed(loop) if installed else contextlib.nullcontext(), \
                socket.create_server(("127.0.0.1", 0)) as silent, \
                socket.create_connection(silent.getsockname()) as sock:
            coro = loop.create_connection(asyncio.Protocol, sock=sock, ssl=context, server_hostname="")
            task = loop.create_task(coro)
            for _ in range(3):
                loop.run_until_complete(asyncio.sleep(0))
            assert not task.done()
            unraisable: List[BaseException] = []
            hook, sys.unraisablehook = sys.unraisablehook, lambda u: unraisable.append(u.exc_value)
            try:
                contextvars.Context().run(coro.close)
            finally:
                sys.unraisablehook = hook
            assert unraisable == []
    finally:
        loop.close()
        del task, coro
        gc.collect()


# -- keyword arguments friendsock does not handle keep their meaning ------------


async def _outcome(call):
    try:
        transport, _ = await call()
    except Exception as exc:  # noqa: BLE001 - compared below
        return type(exc), str(exc)
    try:
        return "ok", transport.get_extra_info("peername"), friendsock.is_friend(transport)
    finally:
        transport.close()


async def test_happy_eyeballs_and_interleave_to_a_plain_server():
    """On a connection to a server that is not friendsock's the loop's own
    create_connection handles them: asyncio races the addresses, uvloop has
    no such keywords (TypeError) -- installed or not, the same outcome."""
    loop = asyncio.get_running_loop()
    # One refusing address first, then the plain listener.
    with socket.socket() as closed:
        closed.bind(("127.0.0.1", 0))
        refused_port = closed.getsockname()[1]
    plain = await friendsock.create_server(asyncio.Protocol, "127.0.0.1", 0, friends=False)
    try:
        port = plain.sockets[0].getsockname()[1]
        infos = [
            (socket.AF_INET, socket.SOCK_STREAM, socket.IPPROTO_TCP, "", ("127.0.0.1", refused_port)),
            (socket.AF_INET, socket.SOCK_STREAM, socket.IPPROTO_TCP, "", ("127.0.0.1", port)),
        ]
        host = "two-addresses.invalid"

        async def getaddrinfo(h, p, *args, **kwargs):
            assert h == host
            return infos

        loop.getaddrinfo = getaddrinfo
        try:
            for kwargs in ({"happy_eyeballs_delay": 0.25}, {"happy_eyeballs_delay": 0.25, "interleave": 2},
                           {"interleave": 1}):
                native_outcome = await _outcome(lambda: loop.create_connection(asyncio.Protocol, host, 80, **kwargs))
                with friendsock.installed():
                    installed_outcome = await _outcome(
                        lambda: loop.create_connection(asyncio.Protocol, host, 80, **kwargs)
                    )
                assert installed_outcome == native_outcome, kwargs
                if isinstance(loop, uvloop.Loop):
                    assert native_outcome[0] is TypeError
                else:
                    assert native_outcome == ("ok", ("127.0.0.1", port), False)
        finally:
            del loop.getaddrinfo
    finally:
        plain.close()


async def test_reuse_port_servers_share_a_port():
    loop = friendsock.install()
    try:
        served: List[int] = []

        def handler_for(index):
            async def handler(reader, writer):
                served.append(index)
                await echo_handler(reader, writer)
            return handler

        first = await asyncio.start_server(handler_for(0), "127.0.0.1", 0, reuse_port=True)
        try:
            port = first.sockets[0].getsockname()[1]
            second = await asyncio.start_server(handler_for(1), "127.0.0.1", port, reuse_port=True)
            try:
                assert second.sockets[0].getsockname()[1] == port
                # Without reuse_port the port is taken, as without friendsock.
                with pytest.raises(OSError) as info:
                    await loop.create_server(asyncio.Protocol, "127.0.0.1", port)
                assert info.value.errno == errno.EADDRINUSE
                for n in range(4):
                    reader, writer = await asyncio.open_connection("127.0.0.1", port)
                    try:
                        await roundtrip(reader, writer, b"reuse %d" % n)
                        assert friendsock.is_friend(writer)
                    finally:
                        await close_writer(writer)
                assert len(served) == 4 and set(served) <= {0, 1}
            finally:
                second.close()
        finally:
            first.close()
    finally:
        friendsock.uninstall(loop)


@pytest.fixture(scope="module")
def tls() -> Tuple[ssl.SSLContext, ssl.SSLContext]:
    ca = trustme.CA()
    server_ctx = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    ca.issue_cert("localhost", "127.0.0.1").configure_cert(server_ctx)
    client_ctx = ssl.create_default_context()
    ca.configure_trust(client_ctx)
    return server_ctx, client_ctx


async def test_ssl_handshake_timeout_with_ssl(tls):
    server_ctx, client_ctx = tls
    loop = friendsock.install()
    try:
        before = friendsock.stats().fallbacks.get("ssl", 0)
        async with stream_server(ssl=server_ctx, ssl_handshake_timeout=30) as (server, port, writers):
            reader, writer = await asyncio.open_connection(
                "127.0.0.1", port, ssl=client_ctx, ssl_handshake_timeout=30
            )
            try:
                await roundtrip(reader, writer, b"over tls" * 4096)
                assert writer.get_extra_info("ssl_object") is not None
                assert writer.get_extra_info("peercert")["subjectAltName"]
                assert friendsock.is_friend(writer)
                assert friendsock.is_friend(writers[0])
            finally:
                await close_writer(writer)
        assert friendsock.stats().fallbacks.get("ssl", 0) == before
        # The loop's own validation still applies: same error, same words.
        with pytest.raises(ValueError) as installed_error:
            await loop.create_server(asyncio.Protocol, "127.0.0.1", 0, ssl_handshake_timeout=30)
        with pytest.raises(ValueError) as native_error:
            await native(loop, "create_server")(asyncio.Protocol, "127.0.0.1", 0, ssl_handshake_timeout=30)
        assert str(installed_error.value) == str(native_error.value)
    finally:
        friendsock.uninstall(loop)
