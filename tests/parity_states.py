"""The states the parity tests put a connection's end in before they make
their calls: each named once, with what it means, and the kinds of end that
cannot be put in it, each with why.

Each parity test has a driver of its own, a step per state that puts its
kind of end (the client's; the server's is the peer) in that state, and
builds it through ``driver()``: one step for every state its kind can be
in, and none for another, or the test module does not import. The test
then runs over ``states_of(kind)``.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Dict, Iterable, List, Mapping, TypeVar

# The kinds of end, one a parity test (two for the transports').
BLOCKING = "blocking"  # a socket.socket, patched (test_blocking_parity)
TRANSPORT = "transport"  # an asyncio transport and its protocol (test_transport_parity)
TLS_TRANSPORT = "transport over TLS"  # the same with TLS over the connection
STREAMS = "streams"  # asyncio's StreamReader and StreamWriter (test_streams_parity)
THREADS = "threads"  # asyncio streams, the peer's on a loop in another thread (test_threads_parity)
TRIO = "trio"  # a trio.socket socket (test_trio_parity)
ANYIO = "anyio"  # an anyio SocketStream on trio (test_anyio_parity)
KINDS = (BLOCKING, TRANSPORT, TLS_TRANSPORT, STREAMS, THREADS, TRIO, ANYIO)

ASYNCIO = (TRANSPORT, TLS_TRANSPORT, STREAMS, THREADS)
SOCKETS = (BLOCKING, TRIO)  # ends that are a socket, with its own calls


@dataclass(frozen=True)
class State:
    meaning: str
    not_for: Mapping[str, str] = field(default_factory=dict)  # kind of end: why it cannot be put in it


def _each(kinds: Iterable[str], why: str) -> Dict[str, str]:
    return dict.fromkeys(kinds, why)


_NO_EOF_OVER_TLS = {TLS_TRANSPORT: "asyncio's TLS transports cannot write_eof()"}
_NO_MODE = {
    **_each(ASYNCIO, "its socket is its loop's, non-blocking always"),
    **_each((TRIO, ANYIO), "trio's sockets are non-blocking always: a call waits on trio"),
}
_NO_HALF_READING = _each(ASYNCIO + (ANYIO,), "no call of its shuts reading alone")
_NO_WRITE_BUFFER = {
    **_each(SOCKETS + (ANYIO,), "no write buffer of its own: a send waits, or says so, when the socket's is full"),
    **_each((STREAMS, THREADS), "its calls read the write buffer's exact size, which is what the socket buffers "
                                "left over: the kernel's sizing (or the link's), not the state"),
}

STATES: Dict[str, State] = {
    "fresh": State("connected: nothing sent, nothing done, either way"),
    "bytes to read": State(
        "the peer sent bytes, which have come: unread (a transport has handed them to its protocol)"),
    "peer shut writing": State(
        "the peer is done sending (shutdown(SHUT_WR), write_eof(), send_eof()), and its FIN has come",
        _NO_EOF_OVER_TLS),
    "peer sent, then shut writing": State("bytes from the peer, then its FIN, have come; the bytes unread",
                                          _NO_EOF_OVER_TLS),
    "peer closed": State("the peer closed its end, with nothing of ours unread: its FIN has come"),
    "peer reset": State(
        "the peer closed (or aborted) its end with bytes of ours unread: its reset has come"),
    "peer closed with SO_LINGER 0": State(
        "the peer closed its end with SO_LINGER 0, nothing of ours unread: its reset has come",
        {TLS_TRANSPORT: "its ends have no socket of their own to set SO_LINGER on"}),
    "we shut writing": State(
        "we are done sending (shutdown(SHUT_WR), write_eof(), send_eof()); reading still open",
        _NO_EOF_OVER_TLS),
    "we shut reading": State("we shut our reading (shutdown(SHUT_RD)); writing still open", _NO_HALF_READING),
    "we shut reading, then bytes came": State("as 'we shut reading', and then the peer sent bytes",
                                              _NO_HALF_READING),
    "we shut both ways": State(
        "shutdown(SHUT_RDWR): the connection finished, the end still open",
        {**_each(ASYNCIO, "its only way to shut both ways is close()"),
         ANYIO: "its only way to shut both ways is aclose()"}),
    "non-blocking, nothing to read": State("setblocking(False), nothing come", _NO_MODE),
    "non-blocking, bytes to read": State("setblocking(False), and bytes from the peer have come", _NO_MODE),
    "non-blocking, peer closed": State("setblocking(False), and the peer's FIN has come", _NO_MODE),
    "short timeout": State("settimeout(0.01) on a fresh connection", _NO_MODE),
    "reading paused": State(
        "pause_reading(): what comes stays in the kernel",
        _each(SOCKETS + (ANYIO,), "no reading to pause: it reads when called, only")),
    "write buffer full": State(
        "the peer reads nothing and we wrote more than the socket buffers take: our write buffer holds "
        "the rest", _NO_WRITE_BUFFER),
    "closing, write buffer full": State("as 'write buffer full', and then close(): closing, not yet lost",
                                        _NO_WRITE_BUFFER),
    "closed": State("we closed our end (close(), aclose()); a transport's connection_lost() has come"),
    "aborted": State(
        "we aborted our end (abort()); its connection_lost() has come",
        {**_each(SOCKETS, "no abort(): close() is all a socket has (SO_LINGER 0 changes only what the "
                          "peer sees: 'peer closed with SO_LINGER 0')"),
         ANYIO: "no abort(): aclose() is all its stream has"}),
}


def states_of(kind: str) -> List[str]:
    """The states an end of ``kind`` can be put in, in the table's order."""
    assert kind in KINDS, kind
    return [name for name, state in STATES.items() if kind not in state.not_for]


Step = TypeVar("Step")


def driver(kind: str, steps: Mapping[str, Step]) -> Dict[str, Step]:
    """``steps``, a kind's driver: checked to have a step for every state of
    ``kind`` and for no other, in the table's order."""
    wanted = states_of(kind)
    assert set(steps) == set(wanted), (
        f"{kind}'s driver: no step for {sorted(set(wanted) - set(steps))}; "
        f"a step for a state it cannot be in: {sorted(set(steps) - set(wanted))}")
    return {name: steps[name] for name in wanted}
