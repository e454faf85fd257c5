"""Every call of a blocking socket, in every state of its connection,
answers on a paired socket as on a TCP one: the same return value, or the
same exception type and errno.

Each state is set up on a fresh pair, once over TCP and once paired, and
each call is made on its own pair (one call's effect never leaks into the
next). Where the two disagree the test prints every differing answer. The
few differences friendsock keeps on purpose are left out, each with why
(see docs/doors/blocking.md).
"""

from __future__ import annotations

import contextlib
import select
import socket
import struct
from typing import Any, Callable, Dict, Iterable, Iterator, Tuple

import pytest

import friendsock
from parity_states import BLOCKING, driver, states_of
from support import WAITED, answers_that_differ, report
from test_blocking import _reset_by_the_peer

LOCALHOST = "127.0.0.1"
TIMEOUT = 10.0
WAIT = 0.05  # how long a call that would block waits: it times out the same on both paths
Pair = Tuple[socket.socket, socket.socket]


def _until_readable(sock: socket.socket) -> None:
    assert select.select([sock], [], [], TIMEOUT)[0] == [sock], "nothing came"


@contextlib.contextmanager
def _pair(paired: bool, wait: float = WAIT) -> Iterator[Pair]:
    """(client, server), the client in timeout mode (``wait``); paired or
    over TCP."""
    if paired:
        friendsock.patch_socket()
    try:
        with socket.create_server((LOCALHOST, 0)) as listener:
            client = socket.create_connection(listener.getsockname(), timeout=wait)
            server, _ = listener.accept()
    finally:
        friendsock.unpatch_socket()
    with client, server:
        server.settimeout(TIMEOUT)
        assert friendsock.is_friend(client) is paired
        yield client, server


# -- the driver: the client's socket into each state of tests/parity_states.py ---
def _peer_sent(client: socket.socket, server: socket.socket) -> None:
    server.sendall(b"hello\nworld")
    _until_readable(client)


def _linger_zero_close(client: socket.socket, server: socket.socket) -> None:
    server.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    server.close()
    _until_readable(client)


def _peer_shut_writing(client: socket.socket, server: socket.socket) -> None:
    server.shutdown(socket.SHUT_WR)
    _until_readable(client)


def _peer_sent_and_shut(client: socket.socket, server: socket.socket) -> None:
    server.sendall(b"bye")
    server.shutdown(socket.SHUT_WR)
    _until_readable(client)


def _peer_closed(client: socket.socket, server: socket.socket) -> None:
    server.close()
    _until_readable(client)


def _shut_reading_then_data(client: socket.socket, server: socket.socket) -> None:
    client.shutdown(socket.SHUT_RD)
    server.sendall(b"late")
    _until_readable(client)


def _non_blocking_with_data(client: socket.socket, server: socket.socket) -> None:
    client.setblocking(False)
    _peer_sent(client, server)


def _peer_closed_non_blocking(client: socket.socket, server: socket.socket) -> None:
    client.setblocking(False)
    _peer_closed(client, server)


DRIVER: Dict[str, Callable[[socket.socket, socket.socket], None]] = driver(BLOCKING, {
    "fresh": lambda client, server: None,
    "bytes to read": _peer_sent,
    "we shut writing": lambda client, server: client.shutdown(socket.SHUT_WR),
    "we shut reading": lambda client, server: client.shutdown(socket.SHUT_RD),
    "we shut reading, then bytes came": _shut_reading_then_data,
    "we shut both ways": lambda client, server: client.shutdown(socket.SHUT_RDWR),
    "peer shut writing": _peer_shut_writing,
    "peer sent, then shut writing": _peer_sent_and_shut,
    "peer closed": _peer_closed,
    "peer reset": _reset_by_the_peer,
    "peer closed with SO_LINGER 0": _linger_zero_close,
    "non-blocking, nothing to read": lambda client, server: client.setblocking(False),
    "non-blocking, bytes to read": _non_blocking_with_data,
    "non-blocking, peer closed": _peer_closed_non_blocking,
    "short timeout": lambda client, server: client.settimeout(0.01),
    "closed": lambda client, server: client.close(),
})


# -- calls ----------------------------------------------------------------------
def _poll_events(sock: socket.socket) -> Any:
    """What select() and poll() report now. POLLERR left out: a paired
    socket's descriptor cannot show a reset's (see docs/doors/blocking.md)."""
    number = sock.fileno()
    readable, writable, _ = select.select([number], [number], [], 0)
    poller = select.poll()
    poller.register(number, select.POLLIN | select.POLLOUT | select.POLLPRI | select.POLLRDHUP)
    found = poller.poll(0)
    return bool(readable), bool(writable), (found[0][1] & ~select.POLLERR) if found else 0


def _recv_into(sock: socket.socket) -> Any:
    buffer = bytearray(5)
    return sock.recv_into(buffer), bytes(buffer)


CALLS: Dict[str, Callable[[socket.socket], Any]] = {
    "recv": lambda sock: sock.recv(10),
    "recv(0)": lambda sock: sock.recv(0),
    "recv MSG_PEEK": lambda sock: sock.recv(10, socket.MSG_PEEK),
    "recv MSG_DONTWAIT": lambda sock: sock.recv(10, socket.MSG_DONTWAIT),
    "recv MSG_WAITALL": lambda sock: sock.recv(10, socket.MSG_WAITALL),
    "recv MSG_OOB": lambda sock: sock.recv(10, socket.MSG_OOB),
    "recv_into": _recv_into,
    "recvfrom": lambda sock: sock.recvfrom(10),
    "recvmsg": lambda sock: sock.recvmsg(10)[0],
    "send": lambda sock: sock.send(b"x"),
    "send(b'')": lambda sock: sock.send(b""),
    "send MSG_MORE": lambda sock: sock.send(b"x", socket.MSG_MORE),
    "sendall": lambda sock: sock.sendall(b"y" * 10),
    "sendall(b'')": lambda sock: sock.sendall(b""),
    "sendmsg": lambda sock: sock.sendmsg([b"a", b"b"]),
    "sendto": lambda sock: sock.sendto(b"z", (LOCALHOST, 9)),
    "SO_ERROR": lambda sock: sock.getsockopt(socket.SOL_SOCKET, socket.SO_ERROR),
    "SO_TYPE": lambda sock: sock.getsockopt(socket.SOL_SOCKET, socket.SO_TYPE),
    "SO_ACCEPTCONN": lambda sock: sock.getsockopt(socket.SOL_SOCKET, socket.SO_ACCEPTCONN),
    "TCP_NODELAY": lambda sock: sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY),
    "getpeername": lambda sock: type(sock.getpeername()).__name__,
    "getsockname": lambda sock: type(sock.getsockname()).__name__,
    "gettimeout": lambda sock: sock.gettimeout(),
    "getblocking": lambda sock: sock.getblocking(),
    "select and poll": _poll_events,
    "shutdown(SHUT_RDWR)": lambda sock: sock.shutdown(socket.SHUT_RDWR),
    "shutdown(SHUT_WR)": lambda sock: sock.shutdown(socket.SHUT_WR),
    "makefile read1": lambda sock: sock.makefile("rb").read1(10),
    "listen": lambda sock: sock.listen(),
    "recv, recv, recv": lambda sock: [_answer(lambda: sock.recv(10)) for _ in range(3)],
    "send, send, recv": lambda sock: [_answer(lambda: sock.send(b"q")), _answer(lambda: sock.send(b"q")),
                                      _answer(lambda: sock.recv(10))],
    "SO_ERROR, send, recv": lambda sock: [
        _answer(lambda: sock.getsockopt(socket.SOL_SOCKET, socket.SO_ERROR)),
        _answer(lambda: sock.send(b"q")), _answer(lambda: sock.recv(10))],
    "shutdown(SHUT_WR), send(b''), send": lambda sock: [
        _answer(lambda: sock.shutdown(socket.SHUT_WR)), _answer(lambda: sock.send(b"")),
        _answer(lambda: sock.send(b"q"))],
}
# Not compared: connect() on a connected socket (the kernel answers 0 once
# after a connect made in timeout mode, friendsock EISCONN) and bind() (after
# a reset the kernel has let the port go, and takes a bind; a paired
# socket's TCP socket is still connected), ioctl(FIONREAD) on the descriptor
# (a paired socket's counts wake-ups), detach() (tested in
# tests/test_blocking.py: it hands the connection over to TCP).


def _answer(call: Callable[[], Any]) -> Any:
    try:
        return "returned", call()
    except TimeoutError:
        return WAITED
    except OSError as exc:
        return type(exc).__name__, exc.errno
    except (TypeError, ValueError) as exc:
        return type(exc).__name__


def _answers(paired: bool, state: str, names: Iterable[str] = CALLS, wait: float = WAIT) -> Dict[str, Any]:
    answers = {}
    for name in names:
        with _pair(paired, wait) as (client, server):
            DRIVER[state](client, server)
            answers[name] = _answer(lambda: CALLS[name](client))
    return answers


@pytest.mark.parametrize("state", states_of(BLOCKING))
def test_every_call_answers_as_over_tcp(state):
    def ask_again(name: str, paired: bool) -> Any:
        return _answers(paired, state, [name], wait=1.0)[name]

    differing = answers_that_differ(_answers(False, state), _answers(True, state), ask_again)
    assert not differing, report(differing)
