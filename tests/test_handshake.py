"""The socket-level pairing steps both adapters share, without a loop:
a connect given up after its listener claimed it, and a listener that goes
away between a client's match and its registration."""

from __future__ import annotations

import contextlib
import socket
import subprocess
import sys
from typing import Any, Iterator, Tuple

import pytest

import friendsock

# Linux's (Python names it from 3.12 on).
IP_BIND_ADDRESS_NO_PORT = getattr(socket, "IP_BIND_ADDRESS_NO_PORT", 24)
from friendsock._core._channel import ChannelState
from friendsock._core._registry import ListenerEntry, registry
from friendsock._core._stats import Fallback
from friendsock._handshake import (
    ConnectAttempt,
    ListenerHandle,
    abandon_connect,
    adopt_accepted,
    claim_accepted,
    register_connect,
)


@contextlib.contextmanager
def registered(address: Any, sock: socket.socket) -> Iterator[ListenerEntry]:
    """An exclusive listener entry for ``address`` (its handle's socket
    ``sock``), in the registry for the block."""
    entry = ListenerEntry(address, v6only=False, exclusive=True,
                          owner=object(), handle=ListenerHandle(sock, None))
    registry.add_listener(entry)
    try:
        yield entry
    finally:
        registry.remove_listener(entry)


@pytest.fixture
def listener() -> Iterator[Tuple[socket.socket, ListenerEntry]]:
    with socket.socket() as listen_sock:
        listen_sock.bind(("127.0.0.1", 0))
        listen_sock.listen(8)
        with registered(listen_sock.getsockname(), listen_sock) as entry:
            yield listen_sock, entry


def bound_client(listen_sock: socket.socket) -> Tuple[socket.socket, tuple]:
    sock = socket.socket()
    address = listen_sock.getsockname()
    sock.bind((address[0], 0))
    return sock, address


def test_a_connect_given_up_after_its_claim_closes_the_client_end(listener):
    """Cancelled once the accepting thread had claimed it: the server end
    gets EOF (not silence), and the link releases both sockets when done."""
    listen_sock, entry = listener
    before = friendsock.stats()
    sock, address = bound_client(listen_sock)
    pending = register_connect(sock, address, entry, only_one=True, threaded=True)
    assert pending is not None
    sock.connect(address)
    conn, peer = listen_sock.accept()
    claimed, _ = claim_accepted(conn, peer)
    assert claimed is pending
    adopt_accepted(conn, pending)

    abandon_connect(pending, sock)

    server = pending.link.server
    assert server.incoming.state is ChannelState.EOF
    assert sock.fileno() != -1  # still the link's: the server end is open
    server.close()
    assert pending.link.done
    assert sock.fileno() == -1 and conn.fileno() == -1
    assert friendsock.stats().links_alive == before.links_alive


def test_a_connect_given_up_before_any_claim_leaves_nothing(listener):
    """An optimistic link is counted from registration on; given up, it is
    finished again, the socket closed, nothing left pending."""
    listen_sock, entry = listener
    before = friendsock.stats()
    sock, address = bound_client(listen_sock)
    pending = register_connect(sock, address, entry, only_one=True, threaded=False)
    assert pending is not None and pending.link.established

    abandon_connect(pending, sock)

    assert sock.fileno() == -1
    after = friendsock.stats()
    assert after.links_alive == before.links_alive
    assert after.pending == before.pending
    assert registry.claim(pending.key) is None


def test_no_connect_registers_with_a_listener_already_gone(listener):
    """A listener closed (on another thread) between a client's match and its
    registration: the connect is plain TCP, nothing pending, no link."""
    listen_sock, entry = listener
    before = friendsock.stats()
    registry.remove_listener(entry)
    sock, address = bound_client(listen_sock)
    try:
        assert register_connect(sock, address, entry, only_one=True, threaded=False) is None
    finally:
        sock.close()
    after = friendsock.stats()
    assert after.links_made == before.links_made
    assert after.pending == before.pending


@pytest.mark.parametrize("local_host", ["127.0.0.2", "0.0.0.0"])
def test_a_users_socket_bound_without_a_port_gets_one_before_connect(listener, local_host):
    """Bound with IP_BIND_ADDRESS_NO_PORT (trio's ``local_address=``): its
    address stays (a wildcard one becomes the destination IP, as for an
    unbound socket), a port comes now so the 4-tuple is known before
    connect(), and the option stays as set."""
    listen_sock, entry = listener
    with socket.socket() as sock:
        sock.setsockopt(socket.IPPROTO_IP, IP_BIND_ADDRESS_NO_PORT, 1)
        sock.bind((local_host, 0))
        assert sock.getsockname()[1] == 0
        attempt = ConnectAttempt(listen_sock.getsockname())
        attempt.sock = sock
        attempt.bind_users_socket()
        assert attempt.entry is entry
        host, port = sock.getsockname()
        assert host == ("127.0.0.1" if local_host == "0.0.0.0" else local_host) and port != 0
        assert sock.getsockopt(socket.IPPROTO_IP, IP_BIND_ADDRESS_NO_PORT) == 1


@pytest.fixture
def wildcard_entry() -> Iterator[Tuple[int, ListenerEntry]]:
    """A listener entry on 0.0.0.0 and a port (nothing listens: the
    registry's view is all the steps look at)."""
    with socket.socket() as holder:
        holder.bind(("127.0.0.1", 0))
        port = holder.getsockname()[1]
        with registered(("0.0.0.0", port), holder) as entry:
            yield port, entry


@pytest.mark.parametrize("how", ["local_infos", "bound_by_its_user"])
def test_a_socket_with_its_own_address_pairs_only_with_a_destination_of_ours(wildcard_entry, how):
    """A wildcard listener on the port matches any destination IP: a
    socket bound to an address of its own proves nothing of where it
    connects (an unbound one does, by binding the destination IP), so the
    destination itself must be ours, or the connect leaves this host."""
    port, entry = wildcard_entry
    for destination, ours in (("127.0.0.1", True), ("192.0.2.1", False)):  # TEST-NET-1
        with socket.socket() as sock:
            attempt = ConnectAttempt((destination, port))
            assert attempt.entry is entry
            attempt.sock = sock
            if how == "local_infos":
                attempt.bind(socket.AF_INET, [(socket.AF_INET, socket.SOCK_STREAM, 0, "",
                                               ("127.0.0.2", 0))])
            else:
                sock.bind(("127.0.0.2", 0))
                attempt.bind_users_socket()
            assert (attempt.entry is entry) is ours
            if not ours:
                assert attempt.fallback is Fallback.NOT_LOCAL


COLLECTED_UNDER_THE_LOCK = """
import gc, socket, warnings
import friendsock
from friendsock._core._registry import registry

warnings.simplefilter("ignore", ResourceWarning)  # the listener is left unclosed on purpose
friendsock.patch_socket()
gc.disable()
listener = socket.create_server(("127.0.0.1", 0))
port = listener.getsockname()[1]
assert registry.has_port(port)
cycle = [listener]
cycle.append(cycle)  # only a collection frees it
del listener, cycle
with registry._lock:  # any allocation under the lock may start a collection
    gc.collect()
with socket.create_server(("127.0.0.1", 0)):  # the next use forgets it
    pass
assert not registry.has_port(port)
print("forgotten")
"""


def test_a_listener_collected_while_the_registry_is_locked_is_forgotten_later():
    """A collection runs on whatever thread allocates, maybe one inside
    the registry's lock: a collected listener's callback takes no lock
    (it waited on that one for ever), and the listener is forgotten at the
    next use. In a child process: a deadlock here would hold the lock of
    every later test."""
    result = subprocess.run([sys.executable, "-c", COLLECTED_UNDER_THE_LOCK],
                            capture_output=True, text=True, timeout=20)
    assert result.returncode == 0 and result.stdout.strip() == "forgotten", result.stderr
