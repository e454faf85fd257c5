"""The ``memory`` test: what an idle connection costs, both ends in-process.

Two figures per transport, each from its own set of connections: the Python
heap (``tracemalloc``), measured in this process, and the resident set size
(``/proc/self/statm``), measured in a fresh child process (run as
``python -m friendsock._bench._memory LOOP TRANSPORT COUNT``). A long-running
benchmark's RSS barely grows: the new connections reuse memory that earlier
tests freed but the allocator kept; and tracemalloc's own bookkeeping would
inflate it.
"""

from __future__ import annotations

import asyncio
import ctypes
import ctypes.util
import functools
import gc
import json
import os
import resource
import subprocess
import sys
import tempfile
import tracemalloc
from typing import Any, List, Optional, Sequence, Tuple

import friendsock

from ._transports import FRIEND_TRANSPORTS, Endpoint, loop_factory
from ._samples import Sample, links_verdict
from ._workloads import Tally, Workload, connect_many, until

# Descriptors kept free for everything else (listeners, the loop, files).
FD_MARGIN = 64
_PAGE = os.sysconf("SC_PAGE_SIZE") if hasattr(os, "sysconf") else 4096


def _load_malloc_trim() -> Any:
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
        return libc.malloc_trim
    except (OSError, AttributeError):
        return None


_malloc_trim = _load_malloc_trim()


def rss_bytes() -> Optional[int]:
    """The current resident set size (not the peak that getrusage gives)."""
    try:
        with open("/proc/self/statm") as f:
            return int(f.read().split()[1]) * _PAGE
    except (OSError, ValueError, IndexError):
        return None


def settle_heap() -> None:
    """Collect garbage and give free heap back to the OS, so the baseline
    does not contain room that the new connections would merely reuse."""
    gc.collect()
    if _malloc_trim is not None:
        _malloc_trim(0)


# The transports whose idle connections hold descriptors (two each): a
# socketless link holds none.
DESCRIPTOR_TRANSPORTS = ("tcp", "unix", "friends")


def raise_fd_limit(connections: int) -> Tuple[int, List[str]]:
    """Raise the soft RLIMIT_NOFILE to the hard limit; return how many idle
    connections fit (two descriptors each) and what to tell the reader."""
    notes: List[str] = []
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if hard != resource.RLIM_INFINITY and soft != hard:
        try:
            resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
            notes.append(f"raised the soft RLIMIT_NOFILE from {soft} to the hard limit {hard}")
            soft = hard
        except (ValueError, OSError) as exc:
            notes.append(f"could not raise the soft RLIMIT_NOFILE ({soft}): {exc}")
    elif hard == resource.RLIM_INFINITY and soft != hard:
        try:
            resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
            soft = hard
        except (ValueError, OSError):
            pass
    if soft == resource.RLIM_INFINITY:
        return connections, notes
    fit = max(1, (soft - FD_MARGIN) // 2)
    if fit < connections:
        notes.append(f"RLIMIT_NOFILE ({soft}) bounds the memory test: {connections} idle "
                     f"connections need {2 * connections + FD_MARGIN} descriptors; "
                     f"measured {fit} instead")
        return fit, notes
    return connections, notes


class Idle(asyncio.Protocol):
    """Does nothing; the server's copy counts the ends that come and go."""

    __slots__ = ("transport", "tally")

    def __init__(self, tally: Optional[Tally] = None) -> None:
        self.transport: Optional[asyncio.BaseTransport] = None
        self.tally = tally

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport
        tally = self.tally
        if tally is not None:
            tally.made += 1
            if friendsock.is_friend(transport):
                tally.friend_ends += 1

    def connection_lost(self, exc: Optional[BaseException]) -> None:
        if self.tally is not None:
            self.tally.lost += 1


class IdleWorkload(Workload):
    """``conns`` idle connections; bytes per connection (both ends).

    ``heap=True`` measures tracemalloc's traced size here; else the RSS, in a
    fresh process running this module on a ``loop_kind`` loop.
    """

    def __init__(self, endpoint: Endpoint, conns: int, heap: bool, loop_kind: str = "asyncio",
                 in_child: bool = False) -> None:
        super().__init__(endpoint, size=0, conns=conns)
        self.heap = heap
        self.loop_kind = loop_kind
        self.in_child = in_child

    async def setup(self) -> None:
        if self.heap or self.in_child:
            await self.serve(lambda: Idle(self.tally))

    async def measure(self, seconds: float, warmup: float) -> Sample:
        if self.heap or self.in_child:
            return await self.measure_here()
        return await self._measure_in_child()

    async def _measure_in_child(self) -> Sample:
        package_parent = os.path.dirname(os.path.dirname(os.path.abspath(friendsock.__file__)))
        env = dict(os.environ)
        env["PYTHONPATH"] = os.pathsep.join(filter(None, [package_parent, env.get("PYTHONPATH")]))
        command = [sys.executable, "-m", "friendsock._bench._memory",
                   self.loop_kind, self.transport, str(self.conns)]
        run = functools.partial(subprocess.run, command, capture_output=True, text=True, env=env,
                                timeout=60 + self.conns * 0.02)
        # In a thread: the loop stays responsive (and the watchdog quiet).
        done = await asyncio.get_running_loop().run_in_executor(None, run)
        if done.returncode != 0:
            lines = (done.stderr or done.stdout or "").strip().splitlines()
            raise RuntimeError(f"memory child failed ({done.returncode}): "
                               f"{lines[-1] if lines else 'no output'}")
        result = json.loads(done.stdout.strip().splitlines()[-1])
        return Sample(result["value"], result["friend_ok"], result["note"])

    async def warm_up(self) -> None:
        """Open and close some connections first, so one-time allocations
        (code paths run for the first time) are not counted."""
        count, self.conns = self.conns, min(self.conns, 100)
        try:
            await self.measure_here(settle=False)
        finally:
            self.conns = count

    async def measure_here(self, settle: bool = True) -> Sample:
        tally = self.tally
        made0, friends0, lost0 = tally.made, tally.friend_ends, tally.lost
        count = self.conns
        # Sized up front, so its growth is not counted.
        clients: List[Any] = [None] * count
        opened = 0
        before = friendsock.stats()
        if settle:
            settle_heap()
        if self.heap:
            tracemalloc.start()
            base = tracemalloc.get_traced_memory()[0]
        else:
            rss = rss_bytes()
            if rss is None:
                raise OSError("RSS is not available here (/proc/self/statm)")
            base = rss
        try:
            made = await connect_many(self.endpoint, Idle, count, lambda: tally.made - made0)
            for transport, _ in made:
                clients[opened] = transport
                opened += 1
            del made
            await until(lambda: tally.made - made0 >= count, "the server to accept")
            await asyncio.sleep(0)  # callbacks scheduled by the connects
            gc.collect()
            if self.heap:
                used = tracemalloc.get_traced_memory()[0] - base
            else:
                used = rss_bytes() - base  # type: ignore[operator]
        finally:
            if self.heap:
                tracemalloc.stop()
            ok, note = self._verdict(clients[:opened], tally.friend_ends - friends0, before)
            for transport in clients[:opened]:
                # Teardown is not measured; an abort spares the kernel
                # thousands of TIME_WAIT sockets.
                transport.abort()
            clients.clear()
            await until(lambda: tally.lost - lost0 >= opened, "the idle connections to close")
        return Sample(used / count, ok, note)

    def _verdict(self, clients: List[Any], server_friends: int,
                 before: friendsock.FriendStats) -> Tuple[Optional[bool], Optional[str]]:
        if self.transport not in FRIEND_TRANSPORTS:
            return None, None
        ok, note = links_verdict(self.transport, clients, before, connections=len(clients))
        if ok and server_friends < len(clients):
            return False, (f"friends fell back to TCP: {len(clients) - server_friends} of "
                           f"{len(clients)} server ends are not friends")
        return ok, note


def _child_main(argv: Sequence[str]) -> int:
    """Measure one RSS figure in this fresh process; print it as JSON."""
    if len(argv) != 3:
        print("usage: python -m friendsock._bench._memory LOOP TRANSPORT COUNT", file=sys.stderr)
        return 2
    kind, transport, count = argv[0], argv[1], int(argv[2])
    fit, _ = raise_fd_limit(count)
    if transport in DESCRIPTOR_TRANSPORTS:
        count = fit
    loop = loop_factory(kind)()
    try:
        with tempfile.TemporaryDirectory(prefix="fsbench-") as tmpdir:
            workload = IdleWorkload(Endpoint(transport, tmpdir), count, heap=False, in_child=True)

            async def measure() -> Sample:
                await workload.setup()
                try:
                    await workload.warm_up()
                    return await workload.measure_here()
                finally:
                    await workload.close()

            sample = loop.run_until_complete(measure())
    finally:
        loop.close()
    print(json.dumps({"value": sample.value, "friend_ok": sample.friend_ok, "note": sample.note}))
    return 0


if __name__ == "__main__":
    sys.exit(_child_main(sys.argv[1:]))
