"""The socket-level pairing steps both adapters share, without a loop:
a connect given up after its listener claimed it, and a listener that goes
away between a client's match and its registration."""

from __future__ import annotations

import socket
from typing import Iterator, Tuple

import pytest

import friendsock
from friendsock._core._link import ChannelState
from friendsock._core._registry import ListenerEntry, registry
from friendsock._handshake import (
    ListenerHandle,
    abandon_connect,
    adopt_accepted,
    claim_accepted,
    register_connect,
)


@pytest.fixture
def listener() -> Iterator[Tuple[socket.socket, ListenerEntry]]:
    listen_sock = socket.socket()
    listen_sock.bind(("127.0.0.1", 0))
    listen_sock.listen(8)
    entry = ListenerEntry(listen_sock.getsockname(), v6only=False, exclusive=True,
                          owner=object(), handle=ListenerHandle(listen_sock, None))
    registry.add_listener(entry)
    try:
        yield listen_sock, entry
    finally:
        registry.remove_listener(entry)
        listen_sock.close()


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
