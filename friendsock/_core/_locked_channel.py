"""A channel whose writer and reader run on different threads: the
channel of a ``threaded`` link (its ends on two schedulers), each change
under a small lock, the hooks called after it is released."""

from __future__ import annotations

import collections
import threading
from typing import Callable, Optional, Tuple

from ._channel import _NO_QUEUE, CHANNEL_OPEN, Channel, Hook
from ._stats import Shard


class LockedChannel(Channel):
    """A channel whose writer and reader run on different threads.

    Each change happens under the channel's lock, so neither side ever sees
    the queue, the byte count or a threshold half-changed, and a wake-up
    cannot be lost: the writer's "append, then notify unless already
    notified" and the reader's "clear the flag, then look" are each atomic,
    as are "set the threshold, then check it" and "consume, then check the
    threshold". The hooks run after the lock is released: they hand a
    callback to the other side's loop, and one that finds that loop gone
    tears the link down, which takes the lock again.
    """

    __slots__ = ("_lock", "_read_due", "_write_due")

    def __init__(self, sndbuf: int, rcvbuf: int, meter: Optional[Shard] = None) -> None:
        super().__init__(sndbuf, rcvbuf, meter)
        self._lock = threading.Lock()
        self._read_due = False  # set and cleared by the writer's thread only
        self._write_due = False  # set and cleared by the reader's thread only

    # The per-write and per-drain paths (push, begin_pull, pull) take the
    # lock with acquire()/release() rather than ``with``, which makes two
    # bound methods per use: some 70 ns, paid about a dozen times (with the
    # loop's remote queue) per request/response across threads.

    # -- writer side ------------------------------------------------------
    def push(self, data: bytes) -> None:
        lock = self._lock
        lock.acquire()
        try:
            if self.state is not CHANNEL_OPEN or self.reader_closed:
                self._refuse_push()
            queue = self._queue
            if queue is _NO_QUEUE:
                queue = self._queue = collections.deque()
            queue.append(data)
            self.queued += len(data)
            hook = self.notify_readable
            if self._reader_notified or hook is None:
                return
            self._reader_notified = True
        finally:
            lock.release()
        hook()

    def attach_writer(self, hook: Hook) -> None:
        with self._lock:
            self.notify_writable = hook

    def wake_writer_at(self, threshold: Optional[int]) -> bool:
        with self._lock:
            return Channel.wake_writer_at(self, threshold)

    def shutdown(self) -> bool:
        with self._lock:
            shut = Channel.shutdown(self)
        self._flush_reader()
        return shut

    def truncate(self, keep: int) -> None:
        with self._lock:
            Channel.truncate(self, keep)

    def after_over_tcp(self) -> None:
        with self._lock:  # held by a move to TCP while it sends
            pass

    def reset(self, keep: int) -> None:
        with self._lock:
            Channel.reset(self, keep)
        self._flush_reader()

    # -- reader side ------------------------------------------------------
    def attach_reader(self, hook: Hook) -> bool:
        with self._lock:
            return Channel.attach_reader(self, hook)

    def begin_drain(self) -> None:
        with self._lock:
            self._reader_notified = False

    def synced(self, show: Callable[[bool], None]) -> None:
        with self._lock:
            Channel.synced(self, show)

    def begin_pull(self, limit: int, join_limit: Optional[int] = None) -> Tuple[bytes, int]:
        lock = self._lock
        lock.acquire()
        try:
            self._reader_notified = False
            queued = self.queued
            if not queued:
                return b"", 0
            data = Channel.pull(self, limit, join_limit)
        finally:
            lock.release()
        if self._write_due:
            self._flush_writer()
        return data, queued - len(data)

    def pull(self, limit: int, join_limit: Optional[int] = None) -> bytes:
        """As :meth:`Channel.pull`; b"" when the bytes the reader saw were
        moved to TCP before it took them (it looks again: TCP)."""
        lock = self._lock
        lock.acquire()
        try:
            data = Channel.pull(self, limit, join_limit) if self.queued else b""
        finally:
            lock.release()
        if self._write_due:
            self._flush_writer()
        return data

    def pull_into(self, buffer: memoryview) -> int:
        with self._lock:
            copied = Channel.pull_into(self, buffer)
        if self._write_due:
            self._flush_writer()
        return copied

    def peek(self, limit: int) -> bytes:
        with self._lock:
            return Channel.peek(self, limit)

    def close_reader(self) -> bool:
        with self._lock:
            had_unread = self._discard_unread()
        hook = self.notify_writable
        if hook is not None:
            hook()
        return had_unread

    def capacity_changed(self) -> None:
        with self._lock:
            Channel.capacity_changed(self)
        self._flush_writer()

    # -- internals: hooks are only noted under the lock ------------------
    def _wake_writer(self) -> None:
        self._write_due = True

    def _notify_reader(self) -> None:
        if self.notify_readable is not None:
            self._reader_notified = True
            self._read_due = True

    def cut_off(self) -> None:
        self._lock = threading.Lock()  # another thread may have held it at the fork
        super().cut_off()

    def _flush_reader(self) -> None:
        if self._read_due:
            self._read_due = False
            hook = self.notify_readable
            if hook is not None:
                hook()

    def _flush_writer(self) -> None:
        if self._write_due:
            self._write_due = False
            hook = self.notify_writable
            if hook is not None:
                hook()
