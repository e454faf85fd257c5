"""Whether a connect to another friendsock process of this host is worth
moving off TCP.

A move costs a rendezvous before the first byte: an offer and its answer,
two wake-ups across the processes, and the pair's descriptors made, handed
over and checked. A moved connection pays it back call by call: a read or
a write over the pair saves about as much whatever its size, 64 B to
64 KiB, and a dozen such pay for the rendezvous, as does a megabyte
streamed in fewer, larger calls (``benchmarks/RESULTS.md``). A connection
per request never does: moving each made such a workload 0.4-0.6x TCP's
rate.

So each process keeps, per server (its port, and the process the port
table names for it), how its moved connections there have been ending at
its end (the connecting one): after :data:`SHORT_RUN` in a row that ended
with fewer than :data:`PAYING_CALLS` reads and as many writes, and fewer
than :data:`PAYING_BYTES` moved, its connects there go over TCP at once,
with one in a growing number (up to :data:`PROBE_MOST`) still moved, to
look again; one that pays starts the count over. Only the connecting end
decides, as for every move: the accepting process offers only to a
connect that waits. (No lock: a race between threads miscounts a probe,
no more.)
"""

from __future__ import annotations

from typing import Dict, Tuple

from . import LISTENERS, port_table

# Reads (or writes) at the connecting end that pay for a connection's
# rendezvous; or bytes moved, either way, in fewer calls.
PAYING_CALLS = 12
PAYING_BYTES = 1 << 20
# Moved connections to a server in a row that did not pay, before its
# connects stop waiting for an offer.
SHORT_RUN = 8
# The most connects to such a server that go over TCP for one still moved.
PROBE_MOST = 256
# Servers kept track of, at most (the oldest go first).
MAX_SERVERS = 256


class _Server:
    __slots__ = ("short_run", "probe_every", "until_probe")

    def __init__(self) -> None:
        self.short_run = 0
        self.probe_every = SHORT_RUN
        self.until_probe = SHORT_RUN


_servers: Dict[Tuple[int, int], _Server] = {}  # by (pid, port)


def worth_an_offer(port: int) -> bool:
    """Whether a connect to ``port``, which another friendsock process of
    this host serves, should wait for its offer (False: plain TCP, the
    recent connections there having been too short to pay for a move)."""
    if not _servers:  # (the usual case: no port table read)
        return True
    found = _servers.get(_server(port))
    if found is None or found.short_run < SHORT_RUN:
        return True
    found.until_probe -= 1
    if found.until_probe > 0:
        return False
    found.probe_every = min(found.probe_every * 2, PROBE_MOST)
    found.until_probe = found.probe_every
    return True


def moved_connection_ended(port: int, calls: int, moved: int) -> None:
    """A connection to ``port``, moved off TCP, ended at its connecting end,
    which read or wrote ``calls`` times at most either way, ``moved``
    bytes in all."""
    key = _server(port)
    if calls >= PAYING_CALLS or moved >= PAYING_BYTES:
        _servers.pop(key, None)
        return
    found = _servers.get(key)
    if found is None:
        if len(_servers) >= MAX_SERVERS:
            del _servers[next(iter(_servers))]
        found = _servers[key] = _Server()
    found.short_run += 1


def _server(port: int) -> Tuple[int, int]:
    # (Named by the process the table has for it, as a pre-fork server's
    # workers share it: a server started afresh on the port starts afresh.)
    table = port_table()
    return (0 if table is None else table.read(LISTENERS, port).pid), port
