"""Every way of naming this host, through every door: both ends agree.

A connection pairs only when both ends name it alike by the kernel's own
names of it (``getsockname()``/``getpeername()`` of the real sockets),
whatever address the client passed: the wildcard addresses (which Linux
takes to this host), ``localhost``, other loopback addresses, IPv4-mapped
ones, this host's own non-loopback addresses, a chosen source address.

Each case is a listener address, a destination and an optional source
address that the kernel connects over plain sockets (probed when this
module is collected: a form the kernel refuses is no case). Each runs
through each door on both paths: real TCP (friendsock switched off, the
same code) and the friend path, where it must pair and both ends must say
so. The server speaks first, then reads; every wait is bounded, so an end
that waits on a link nobody reads fails the test instead of hanging it.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import errno
import fcntl
import functools
import os
import selectors
import socket
import struct
import subprocess
import sys
import threading
from typing import Any, Callable, Dict, Iterator, List, Optional, Tuple

import pytest
import trio
import uvloop
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import friendsock
import friendsock.trio
import friendsock._core._link
from friendsock import _handshake
from friendsock._core._errors import PairingCheckError
from friendsock._blocking._descriptor import OriginalSocket
from friendsock._core._registry import registry
from support import every_loop_installed

GREETING = b"220 hello from the server\n"
REQUEST = b"HELO from the client\n"
WAIT = 5  # seconds any one step may take


# -- the addresses this host has -----------------------------------------------


def _own_ipv4() -> List[str]:
    """This host's non-loopback IPv4 addresses (SIOCGIFADDR per interface)."""
    found = []
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as probe:
        for _, name in socket.if_nameindex():
            try:
                answer = fcntl.ioctl(probe.fileno(), 0x8915, struct.pack("256s", name.encode()[:15]))
            except OSError:
                continue
            address = socket.inet_ntoa(answer[20:24])
            if not address.startswith("127."):
                found.append(address)
    return found


def _own_ipv6() -> List[str]:
    """This host's global IPv6 addresses (no loopback, no link-local)."""
    found = []
    try:
        with open("/proc/net/if_inet6") as table:
            for line in table:
                raw, _, _, scope = line.split()[:4]
                if scope != "00":  # global scope only
                    continue
                found.append(socket.inet_ntop(socket.AF_INET6, bytes.fromhex(raw)))
    except OSError:
        pass
    return found


OWN_V4 = _own_ipv4()[:1]
OWN_V6 = _own_ipv6()[:1]

# Listeners: (name, family, bind address, IPV6_V6ONLY); "dual" is an IPv6
# wildcard listener that takes IPv4 too, which asyncio makes only from a
# socket handed in (sock=).
LISTENERS: List[Tuple[str, int, str, Optional[int]]] = [
    ("0.0.0.0", socket.AF_INET, "0.0.0.0", None),
    ("127.0.0.1", socket.AF_INET, "127.0.0.1", None),
    ("::", socket.AF_INET6, "::", 1),
    ("::1", socket.AF_INET6, "::1", 1),
    ("dual", socket.AF_INET6, "::", 0),
] + [(a, socket.AF_INET, a, None) for a in OWN_V4] + [(a, socket.AF_INET6, a, 1) for a in OWN_V6]

DESTINATIONS = ["0.0.0.0", "::", "127.0.0.1", "127.0.0.2", "localhost", "::1",
                "::ffff:127.0.0.1", "::ffff:0.0.0.0"] + OWN_V4 + OWN_V6
SOURCES = [None, "127.0.0.1", "127.0.0.2", "::1"] + OWN_V4 + OWN_V6


def _listening_socket(listener: str, blocking: bool = True,
                      make: Optional[Callable[..., socket.socket]] = None) -> socket.socket:
    _, family, host, v6only = next(spec for spec in LISTENERS if spec[0] == listener)
    sock = (make or socket.socket)(family, socket.SOCK_STREAM)
    try:
        if v6only is not None:
            sock.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, v6only)
        sock.setblocking(blocking)
        sock.bind((host, 0))
        sock.listen(16)
    except BaseException:
        sock.close()
        raise
    return sock


@functools.lru_cache(maxsize=None)
def _kernel_connects(listener: str, destination: str, source: Optional[str]) -> bool:
    """Whether plain sockets connect there (a source of the other family
    than every address the destination has is no case either; nor is one
    the kernel leaves unanswered, as a loopback source to a non-loopback
    destination: a loopback handshake is done within the connect call)."""
    with _listening_socket(listener) as server:
        port = server.getsockname()[1]
        # Bounded: a connect that reached something else (a client whose
        # ephemeral port happened to be the destination's, connected to
        # itself) leaves nothing here to accept.
        server.settimeout(5)
        try:
            with socket.create_connection(
                (destination, port), timeout=0.5,
                source_address=None if source is None else (source, 0),
            ):
                conn, _ = server.accept()
                conn.close()
        except OSError:
            return False
    return True


def _cases() -> List[Tuple[str, str, Optional[str]]]:
    cases = []
    for listener, *_ in LISTENERS:
        for destination in DESTINATIONS:
            for source in SOURCES:
                # Every destination from no source address; a chosen source
                # only with the wildcard and this host's own destinations.
                if source is not None and destination not in ("0.0.0.0", "::", "127.0.0.1", "::1",
                                                              *OWN_V4, *OWN_V6):
                    continue
                if _kernel_connects(listener, destination, source):
                    cases.append((listener, destination, source))
    return cases


CASES = _cases()


# -- one exchange through each door ---------------------------------------------


@dataclasses.dataclass
class Outcome:
    client_got: bytes
    server_got: bytes
    client_friend: bool
    server_friend: bool


def _local(source: Optional[str]) -> Optional[Tuple[str, int]]:
    return None if source is None else (source, 0)


async def _connect_own_socket(destination: str, port: int, source: Optional[str]) -> Any:
    """As aiohttp's client connects: a socket of its own, ``loop.sock_connect``,
    then ``open_connection(sock=)``."""
    loop = asyncio.get_running_loop()
    family, _, _, _, address = (await loop.getaddrinfo(destination, port, type=socket.SOCK_STREAM))[0]
    sock = socket.socket(family, socket.SOCK_STREAM)
    try:
        sock.setblocking(False)
        if source is not None:
            sock.bind((source, 0))
        await loop.sock_connect(sock, address)
    except BaseException:
        sock.close()
        raise
    return await asyncio.open_connection(sock=sock)


async def _asyncio_exchange(listener: str, destination: str, source: Optional[str],
                            explicit: bool, own_socket: bool = False) -> Outcome:
    if not explicit:
        friendsock.install()
    start_server = friendsock.start_server if explicit else asyncio.start_server
    open_connection = friendsock.open_connection if explicit else asyncio.open_connection
    seen: asyncio.Future = asyncio.get_running_loop().create_future()

    async def serve(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            writer.write(GREETING)
            await writer.drain()
            line = await asyncio.wait_for(reader.readline(), WAIT)
            seen.set_result((line, friendsock.is_friend(writer)))
        except BaseException as exc:
            seen.set_exception(exc)
        finally:
            writer.close()

    if listener == "dual":
        server = await start_server(serve, sock=_listening_socket(listener))
    else:
        server = await start_server(serve, next(s[2] for s in LISTENERS if s[0] == listener), 0)
    try:
        port = server.sockets[0].getsockname()[1]
        connecting = _connect_own_socket(destination, port, source) if own_socket else \
            open_connection(destination, port, local_addr=_local(source))
        reader, writer = await asyncio.wait_for(connecting, WAIT)
        try:
            got = await asyncio.wait_for(reader.readline(), WAIT)
            writer.write(REQUEST)
            server_got, server_friend = await asyncio.wait_for(seen, WAIT)
            return Outcome(got, server_got, friendsock.is_friend(writer), server_friend)
        finally:
            writer.close()
            with contextlib.suppress(ConnectionError):
                await asyncio.wait_for(writer.wait_closed(), WAIT)
    finally:
        server.close()
        await asyncio.wait_for(server.wait_closed(), WAIT)


def _run_asyncio(loop_factory: Callable[[], asyncio.AbstractEventLoop], explicit: bool,
                 socketless: bool = False, own_socket: bool = False) -> Callable[..., Outcome]:
    def run(listener: str, destination: str, source: Optional[str]) -> Outcome:
        loop = loop_factory()
        friendsock.set_socketless(socketless)
        try:
            return loop.run_until_complete(
                _asyncio_exchange(listener, destination, source, explicit, own_socket))
        finally:
            friendsock.set_socketless(False)
            friendsock.uninstall(loop)
            loop.close()
    return run


async def _trio_exchange(listener: str, destination: str, source: Optional[str],
                         explicit: bool) -> Outcome:
    if listener == "dual":
        sock = _listening_socket(listener)
        sock.setblocking(False)
        listeners: List[Any] = [friendsock.trio.FriendListener(sock) if explicit
                                else trio.SocketListener(trio.socket.from_stdlib_socket(sock))]
    else:
        host = next(s[2] for s in LISTENERS if s[0] == listener)
        open_listeners = friendsock.trio.open_tcp_listeners if explicit else trio.open_tcp_listeners
        listeners = await open_listeners(0, host=host)
    open_stream = friendsock.trio.open_tcp_stream if explicit else trio.open_tcp_stream
    port = listeners[0].socket.getsockname()[1]
    try:
        with trio.fail_after(WAIT):
            async with trio.open_nursery() as nursery:
                accepted: Dict[str, Any] = {}

                async def serve() -> None:
                    stream = await listeners[0].accept()
                    async with stream:
                        await stream.send_all(GREETING)
                        accepted["got"] = await _receive_line(stream)
                        accepted["friend"] = friendsock.is_friend(stream)

                nursery.start_soon(serve)
                stream = await open_stream(destination, port, local_address=source)
                async with stream:
                    got = await _receive_line(stream)
                    await stream.send_all(REQUEST)
                    client_friend = friendsock.is_friend(stream)
        return Outcome(got, accepted["got"], client_friend, accepted["friend"])
    finally:
        for each in listeners:
            await each.aclose()


async def _receive_line(stream: Any) -> bytes:
    line = b""
    while not line.endswith(b"\n"):
        chunk = await stream.receive_some(1024)
        if not chunk:
            break
        line += chunk
    return line


def _run_trio(explicit: bool) -> Callable[..., Outcome]:
    def run(listener: str, destination: str, source: Optional[str]) -> Outcome:
        if not explicit:
            friendsock.trio.install()
        try:
            return trio.run(_trio_exchange, listener, destination, source, explicit)
        finally:
            if not explicit:
                friendsock.trio.uninstall()
    return run


def _with_patched_socket(exchange: Callable[..., Outcome]) -> Callable[..., Outcome]:
    """A door under ``patch_socket()``: ``exchange`` with the socket module
    patched, and put back after."""
    def run(listener: str, destination: str, source: Optional[str]) -> Outcome:
        friendsock.patch_socket()
        try:
            return exchange(listener, destination, source)
        finally:
            friendsock.unpatch_socket()
    return run


def _handed_over_listener(listener: str) -> socket.socket:
    """A listener made of a descriptor handed over, as a supervisor's is
    (systemd's socket activation): the stdlib's socket listens, and the
    server makes its own of the descriptor (the patched class, if patched)."""
    with _listening_socket(listener, make=OriginalSocket) as supervisors:
        return socket.socket(fileno=os.dup(supervisors.fileno()))


def _blocking_exchange(listener: str, destination: str, source: Optional[str],
                       handed_over: bool = False) -> Outcome:
    # The patched class: made after patch_socket().
    server = _handed_over_listener(listener) if handed_over else _listening_socket(listener)
    server.settimeout(WAIT)
    accepted: Dict[str, Any] = {}

    def serve() -> None:
        try:
            conn, _ = server.accept()
            with conn:
                conn.settimeout(WAIT)
                conn.sendall(GREETING)
                accepted["got"] = _read_line(conn)
                accepted["friend"] = friendsock.is_friend(conn)
        except BaseException as exc:
            accepted["error"] = exc

    thread = threading.Thread(target=serve)
    thread.start()
    try:
        port = server.getsockname()[1]
        with socket.create_connection((destination, port), timeout=WAIT,
                                      source_address=_local(source)) as client:
            got = _read_line(client)
            client.sendall(REQUEST)
            client_friend = friendsock.is_friend(client)
            thread.join(WAIT)
    finally:
        thread.join(WAIT)
        server.close()
    assert not thread.is_alive(), "the server thread is stuck"
    if "error" in accepted:
        raise accepted["error"]
    return Outcome(got, accepted["got"], client_friend, accepted["friend"])


def _with_every_loop(exchange: Callable[..., Outcome]) -> Callable[..., Outcome]:
    """A door with every loop installed (``run``, ``FRIENDSOCK_INSTALL``,
    the pytest plugin), around ``exchange``."""
    def run(listener: str, destination: str, source: Optional[str]) -> Outcome:
        with every_loop_installed():
            return exchange(listener, destination, source)
    return run


def _nonblocking_exchange(listener: str, destination: str, source: Optional[str],
                          first: bool = False) -> Outcome:
    """Both ends non-blocking on one thread, driven by a selector, as
    tornado's and Twisted's are: connect_ex() (EINPROGRESS), writable,
    accept, then the greeting and the request; after a first connection
    (under ``patch_socket()`` alone a non-blocking connect pairs once its
    listener has accepted), or on the ``first`` one (every loop installed)."""
    server = _listening_socket(listener, blocking=False)
    with server, selectors.DefaultSelector() as selector:
        family, _, _, _, address = socket.getaddrinfo(destination, server.getsockname()[1],
                                                      type=socket.SOCK_STREAM)[0]

        def wait(sock: socket.socket, event: int) -> None:
            selector.register(sock, event)
            try:
                assert selector.select(WAIT), f"{sock!r} not ready"
            finally:
                selector.unregister(sock)

        def connected() -> Tuple[socket.socket, socket.socket]:
            client = socket.socket(family, socket.SOCK_STREAM)
            client.setblocking(False)
            if source is not None:
                client.bind((source, 0))
            assert client.connect_ex(address) in (0, errno.EINPROGRESS)
            wait(client, selectors.EVENT_WRITE)
            assert client.getsockopt(socket.SOL_SOCKET, socket.SO_ERROR) == 0
            wait(server, selectors.EVENT_READ)
            return client, server.accept()[0]

        if not first:
            for sock in connected():
                sock.close()
        client, conn = connected()
        with client, conn:
            conn.setblocking(False)
            conn.send(GREETING)
            wait(client, selectors.EVENT_READ)
            got = client.recv(1024)
            client.send(REQUEST)
            wait(conn, selectors.EVENT_READ)
            return Outcome(got, conn.recv(1024), friendsock.is_friend(client),
                           friendsock.is_friend(conn))


def _read_line(sock: socket.socket) -> bytes:
    line = b""
    while not line.endswith(b"\n"):
        chunk = sock.recv(1024)
        if not chunk:
            break
        line += chunk
    return line


DOORS: Dict[str, Callable[..., Outcome]] = {
    "asyncio-install": _run_asyncio(asyncio.new_event_loop, explicit=False),
    "uvloop-install": _run_asyncio(uvloop.new_event_loop, explicit=False),
    "asyncio-api": _run_asyncio(asyncio.new_event_loop, explicit=True),
    "uvloop-api": _run_asyncio(uvloop.new_event_loop, explicit=True),
    "asyncio-socketless": _run_asyncio(asyncio.new_event_loop, explicit=False, socketless=True),
    "asyncio-sock-connect": _run_asyncio(asyncio.new_event_loop, explicit=False, own_socket=True),
    "uvloop-sock-connect": _run_asyncio(uvloop.new_event_loop, explicit=False, own_socket=True),
    "trio-api": _run_trio(explicit=True),
    "trio-install": _run_trio(explicit=False),
    "blocking": _with_patched_socket(_blocking_exchange),
    "blocking-handed-over": _with_patched_socket(functools.partial(_blocking_exchange,
                                                                   handed_over=True)),
    "nonblocking": _with_patched_socket(_nonblocking_exchange),
    "nonblocking-every-loop": _with_every_loop(_with_patched_socket(
        functools.partial(_nonblocking_exchange, first=True))),
}


@contextlib.contextmanager
def _switched(on: bool) -> Iterator[None]:
    was = friendsock.is_enabled()
    friendsock.set_enabled(on)
    try:
        yield
    finally:
        friendsock.set_enabled(was)


def _exchange(door: str, path: str, listener: str, destination: str,
              source: Optional[str]) -> Outcome:
    with _switched(path == "friend"):
        return DOORS[door](listener, destination, source)


def _check(outcome: Outcome, path: str) -> None:
    assert (outcome.client_got, outcome.server_got) == (GREETING, REQUEST)
    # Both ends say the same: a friend link, or TCP on both.
    assert outcome.client_friend == outcome.server_friend, outcome
    assert outcome.client_friend == (path == "friend"), outcome


def _case_id(case: Tuple[str, str, Optional[str]]) -> str:
    listener, destination, source = case
    return f"{listener}<-{destination}" + ("" if source is None else f"@{source}")


@pytest.mark.parametrize("door", sorted(DOORS))
@pytest.mark.parametrize("case", CASES, ids=[_case_id(c) for c in CASES])
def test_every_door_pairs_every_name_of_this_host(door: str, case: Tuple[str, str, Optional[str]],
                                                  path: str) -> None:
    _check(_exchange(door, path, *case), path)


def test_the_matrix_has_the_forms_that_lost_bytes() -> None:
    # The wildcard destinations (which a listener's own getsockname() hands
    # its clients) to the wildcard and loopback listeners, IPv4-mapped
    # to a dual-stack one, and localhost.
    for case in [("0.0.0.0", "0.0.0.0", None), ("127.0.0.1", "0.0.0.0", None),
                 ("::", "::", None), ("::1", "::", None), ("dual", "::ffff:127.0.0.1", None),
                 ("dual", "0.0.0.0", None), ("0.0.0.0", "localhost", None),
                 ("0.0.0.0", "127.0.0.2", None), ("0.0.0.0", "0.0.0.0", "127.0.0.2")]:
        assert case in CASES


# Every listener, destination and source plain sockets connect with: a
# fifth of all the combinations, so they are drawn from this list rather
# than drawn from all and most thrown away.
CONNECTING = [(listener, destination, source) for listener, *_ in LISTENERS
              for destination in DESTINATIONS for source in SOURCES
              if _kernel_connects(listener, destination, source)]


def _door_and_case(door: str) -> Any:
    # (A socketless connect takes no source address.)
    return st.tuples(st.just(door), st.sampled_from(
        [case for case in CONNECTING if door != "asyncio-socketless" or case[2] is None]))


# Drawn: any listener, destination and source this host accepts, any door.
@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(drawn=st.sampled_from(sorted(DOORS)).flatmap(_door_and_case))
def test_drawn_names_agree_on_both_ends(drawn: Tuple[str, Tuple[str, str, Optional[str]]]) -> None:
    door, (listener, destination, source) = drawn
    # Over plain TCP first, the same door with pairing off: the oracle.
    _check(_exchange(door, "tcp", listener, destination, source), "tcp")
    _check(_exchange(door, "friend", listener, destination, source), "friend")


@pytest.fixture
def mistaken_destination(monkeypatch) -> None:
    """Connects to 127.0.0.2 registered as if to 127.0.0.1."""
    real = _handshake._connect.kernel_destination

    def mistaken(address: Any, source: Optional[str] = None) -> Any:
        if address[0] == "127.0.0.2":
            return ("127.0.0.1",) + tuple(address[1:])
        return real(address, source)

    monkeypatch.setattr(_handshake._connect, "kernel_destination", mistaken)


@pytest.mark.parametrize("door", sorted(set(DOORS) - {"asyncio-socketless"}))
@pytest.mark.usefixtures("mistaken_destination")
def test_a_connect_the_kernel_names_otherwise_stays_tcp_on_both_ends(door: str, path: str) -> None:
    # As if a rule on the way (NAT) took the connection elsewhere than its
    # client worked out before connect(): the client registers it under
    # 127.0.0.1, the kernel connects it to 127.0.0.2. The accepting side,
    # by its own names, finds nothing to claim; the client, by its own
    # names after connect(), withdraws before its end is handed out.
    before = friendsock.stats().fallbacks.get("names-differ", 0)
    _check(_exchange(door, path, "0.0.0.0", "127.0.0.2", None), "tcp")
    differ = friendsock.stats().fallbacks.get("names-differ", 0) - before
    # Counted by each end that finds it: the client always; its server too
    # when it accepts before the client looks (on another thread).
    assert differ in ((1, 2) if path == "friend" else (0,))


def test_the_pairing_check_is_switched_on_by_its_variable() -> None:
    code = "import friendsock._core._link as link, friendsock; print(link.first_push_check is not None)"
    for value, on in (("1", "True"), ("0", "False"), ("", "False")):
        env = dict(os.environ, FRIENDSOCK_CHECK_PAIRING=value)
        answer = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True,
                                text=True, timeout=60, check=True)
        assert answer.stdout.strip() == on


@pytest.mark.parametrize("loop_factory", [asyncio.new_event_loop, uvloop.new_event_loop],
                         ids=["asyncio", "uvloop"])
@pytest.mark.usefixtures("mistaken_destination")
def test_the_pairing_check_raises_at_the_first_byte_of_a_misnamed_link(loop_factory,
                                                                       monkeypatch) -> None:
    # A link built on names the kernel does not give its sockets (as if
    # connected() missed a case): with the check on, the client's first
    # byte raises, where it would otherwise go to an end nobody runs.
    monkeypatch.setattr(_handshake.ConnectAttempt, "connected", lambda self: self.pending is not None)
    monkeypatch.setattr(registry, "take_misnamed", lambda key, peer: None)
    monkeypatch.setattr(friendsock._core._link, "first_push_check", _handshake.check_link_names)

    accepted: asyncio.Queue = asyncio.Queue()

    async def client_writes_first() -> None:
        server = await friendsock.start_server(lambda r, w: accepted.put_nowait(w), "0.0.0.0", 0)
        try:
            port = server.sockets[0].getsockname()[1]
            _, writer = await asyncio.wait_for(friendsock.open_connection("127.0.0.2", port), WAIT)
            try:
                with pytest.raises(PairingCheckError, match="would not agree"):
                    writer.write(REQUEST)
            finally:
                writer.transport.abort()
                # The accepting side, on TCP as its names say.
                server_end = await asyncio.wait_for(accepted.get(), WAIT)
                assert not friendsock.is_friend(server_end)
                server_end.close()
                await server_end.wait_closed()
        finally:
            server.close()
            await server.wait_closed()

    loop = loop_factory()
    try:
        loop.run_until_complete(client_writes_first())
    finally:
        loop.close()


def _leaf(error: BaseException, kind: type) -> bool:
    """Whether ``error`` is of ``kind``, or holds one (a group, a cause)."""
    if isinstance(error, kind):
        return True
    inner = list(getattr(error, "exceptions", ())) + [error.__cause__, error.__context__]
    return any(each is not None and _leaf(each, kind) for each in inner)


@pytest.mark.parametrize("door", sorted(set(DOORS) - {"asyncio-socketless"}))
def test_a_connection_its_server_names_otherwise_fails_its_paired_client_at_once(
        door: str, monkeypatch) -> None:
    # As if a rule on the way (NAT) showed the accepting side other names
    # than its client's: the client paired from connect() on, the server's
    # accept finds nothing under its own names. The server goes on as TCP
    # and speaks first; the client, paired with nobody, must not wait for
    # ever on the link: it is reset, as the kernel resets a connection.
    made = _handshake.ListenerHandle.__init__

    def misnaming(self: Any, *args: Any, **kwargs: Any) -> None:
        made(self, *args, **kwargs)
        if self.accepted_sockname is not None:
            self.accepted_sockname = ("127.0.0.9",) + tuple(self.accepted_sockname[1:])

    monkeypatch.setattr(_handshake.ListenerHandle, "__init__", misnaming)
    before = friendsock.stats().fallbacks.get("names-differ", 0)
    if door.endswith("sock-connect") or door == "blocking-handed-over":
        # Connected by the loop's sock_connect, the client end is not
        # friendsock's until adopted; a listener handed over may be shared
        # with other processes. Either way it pairs only once claimed: it
        # goes on over TCP, with every byte.
        _check(_exchange(door, "friend", "127.0.0.1", "127.0.0.1", None), "tcp")
    else:
        with pytest.raises(BaseException) as raised:
            _exchange(door, "friend", "127.0.0.1", "127.0.0.1", None)
        assert _leaf(raised.value, ConnectionResetError), repr(raised.value)
    assert friendsock.stats().fallbacks.get("names-differ", 0) - before == 1
