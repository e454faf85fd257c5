"""Capture files: ``friendsock.capture(path)``, ``start_capture``/
``stop_capture`` and ``FRIENDSOCK_PCAP=FILE``.

The records come from the links' taps (``_core._tap``); this module owns
the file: opened (or refused, with a clear error) when the capture starts,
written unbuffered so it can be read while it grows, cut into numbered
files at a size limit, and closed whole when the capture stops. A write
that fails later (a full disk) stops the capture with a warning: it never
fails the connection that wrote.
"""

from __future__ import annotations

import atexit
import contextlib
import errno
import logging
import os
import re
import threading
from typing import Iterator, List, Optional, Union

from ._core._fork import Part, on_fork
from ._core import _tap
from ._core._pcap import FILE_HEADER, Buffer

logger = logging.getLogger("friendsock")

PathLike = Union[str, "os.PathLike[str]"]

_IOV_MAX = 1024  # os.writev takes at most this many buffers on Linux
_SIZE = re.compile(r"^\s*(\d+)\s*([kmg]?)(i?b)?\s*$", re.IGNORECASE)
_UNITS = {"": 1, "k": 1 << 10, "m": 1 << 20, "g": 1 << 30}


def parse_size(text: str) -> int:
    """``"1000000"``, ``"64K"``, ``"100M"``, ``"2G"`` (powers of 1024) as bytes."""
    match = _SIZE.match(text)
    if match is None or int(match.group(1)) <= 0:
        raise ValueError(f"not a size: {text!r} (bytes, or a number with K, M or G)")
    return int(match.group(1)) * _UNITS[match.group(2).lower()]


def numbered(path: str, index: int) -> str:
    """The name of a capture's ``index``-th file: the first is ``path``,
    then ``name.1.pcap``, ``name.2.pcap``... (the number before the suffix,
    so each keeps it)."""
    if index == 0:
        return path
    head, tail = os.path.split(path)
    stem, suffix = os.path.splitext(tail)
    return os.path.join(head, f"{stem}.{index}{suffix}")


class Capture:
    """A running (or finished) capture; the sink the links' taps write to.

    ``path``: its first file; ``paths``: every file it wrote, in order (the
    oldest ones removed by ``max_files`` are left out); ``links``: links
    captured; ``packets`` and ``bytes``: records and bytes written;
    ``error``: why it stopped early, if it did.
    """

    def __init__(self, path: PathLike, max_bytes: Optional[int] = None,
                 max_files: Optional[int] = None) -> None:
        if max_bytes is not None and max_bytes < len(FILE_HEADER) + 1:
            raise ValueError(f"max_bytes must leave room for records, not {max_bytes!r}")
        if max_files is not None and max_files < 1:
            raise ValueError(f"max_files must be at least 1, not {max_files!r}")
        self.path = os.fspath(path)
        self.max_bytes = max_bytes
        self.max_files = max_files
        self.paths: List[str] = []
        self.links = 0
        self.packets = 0
        self.bytes = 0
        self.error: Optional[OSError] = None
        self.closed = False
        # Re-entrant: a transport collected while a record is being built
        # (the garbage collector runs in any allocation) aborts, and its
        # link's tap writes too.
        self.lock = threading.RLock()
        self._index = 0
        self._size = 0
        self._fd = -1
        self._open(self.path)

    def __repr__(self) -> str:
        state = "stopped" if self.closed else "running"
        return f"<friendsock.Capture {state} {self.path!r} links={self.links} packets={self.packets}>"

    # -- the sink's side (called under the lock) -----------------------------
    def write(self, records: List[Buffer]) -> None:
        """Append pcap records to the file (the links' taps call this,
        under the capture's lock), rotating first when ``max_bytes`` says so."""
        if self.closed or not records:
            return
        if self.max_bytes is None:
            self._emit(records, sum(len(r) for r in records))
            return
        # Cut between records: one is its headers (bytes), then its payload
        # (a memoryview) if it has one.
        batch: List[Buffer] = []
        size = 0
        count = len(records)
        i = 0
        while i < count:
            first = i
            i += 1
            while i < count and type(records[i]) is not bytes:
                i += 1
            record = records[first:i]
            record_size = sum(len(r) for r in record)
            if self._size + size + record_size > self.max_bytes and self._size + size > len(FILE_HEADER):
                if batch and not self._emit(batch, size):
                    return
                batch, size = [], 0
                if not self._rotate():
                    return
            batch += record
            size += record_size
        self._emit(batch, size)

    def _emit(self, records: List[Buffer], size: int) -> bool:
        try:
            self._write_all(records)
        except OSError as exc:
            self._fail(exc)
            return False
        self._size += size
        self.bytes += size
        self.packets += sum(1 for r in records if type(r) is bytes)
        return True

    def link_captured(self) -> None:
        """Count one more link in this capture (``links``)."""
        self.links += 1

    # -- the file ------------------------------------------------------------
    def close(self) -> None:
        """Stop: the file is complete (every record was written whole)."""
        with self.lock:
            if self.closed:
                return
            self.closed = True
            self._close_fd()

    def _open(self, path: str) -> None:
        try:
            fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_CLOEXEC, 0o644)
        except OSError as exc:
            raise OSError(exc.errno, f"cannot write the capture file {path!r}: {exc.strerror}",
                          path) from None
        self._fd = fd
        try:
            self._write_all([FILE_HEADER])
        except OSError:
            self._close_fd()
            raise
        self._size = len(FILE_HEADER)
        self.bytes += len(FILE_HEADER)
        self.paths.append(path)

    def _rotate(self) -> bool:
        self._close_fd()
        self._index += 1
        try:
            self._open(numbered(self.path, self._index))
        except OSError as exc:
            self._fail(exc)
            return False
        if self.max_files is not None:
            while len(self.paths) > self.max_files:
                with contextlib.suppress(OSError):
                    os.unlink(self.paths.pop(0))
        return True

    def _write_all(self, records: List[Buffer]) -> None:
        fd = self._fd
        for start in range(0, len(records), _IOV_MAX):
            batch = records[start:start + _IOV_MAX]
            left = sum(len(r) for r in batch)
            while left:
                written = os.writev(fd, batch)
                left -= written
                if not left:
                    break
                # A short write (rare on a regular file): go on from there.
                while written >= len(batch[0]):
                    written -= len(batch[0])
                    batch = batch[1:]
                rest: List[Buffer] = [memoryview(batch[0])[written:]]
                batch = rest + batch[1:]

    def _fail(self, exc: OSError) -> None:
        self.error = exc
        self.closed = True
        self._close_fd()
        logger.warning("friendsock: capture to %r stopped: %s", self.path, exc)

    def _close_fd(self) -> None:
        if self._fd >= 0:
            fd, self._fd = self._fd, -1
            with contextlib.suppress(OSError):
                os.close(fd)

    def _forked(self) -> None:
        # A child must not write into its parent's file: its taps go quiet.
        self.lock = threading.RLock()
        self.closed = True
        self._close_fd()


_lock = threading.Lock()  # start and stop, one at a time
_current: Optional[Capture] = None


def start_capture(path: PathLike, *, max_bytes: Optional[int] = None,
                  max_files: Optional[int] = None) -> Capture:
    """Write every friend link made from now on to the pcap file ``path``
    (as the TCP segments its connection would carry), until
    :func:`stop_capture`.

    ``max_bytes``: start a new file (``name.1.pcap``, ``name.2.pcap``...)
    before one grows past this size; ``max_files``: keep only the newest so
    many. A path that cannot be written raises ``OSError`` here; a capture
    already running raises ``RuntimeError``.
    """
    global _current
    with _lock:
        if _current is not None and not _current.closed:
            raise RuntimeError(f"a capture is already running (to {_current.path!r})")
        capture = Capture(path, max_bytes, max_files)
        _current = capture
        _tap.set_sink(capture)
    return capture


def stop_capture() -> Optional[Capture]:
    """Stop the running capture, its last file complete; returns it (None
    when none was running). Links it captured are not captured any more."""
    global _current
    with _lock:
        capture, _current = _current, None
        _tap.set_sink(None)
    if capture is not None:
        capture.close()
    return capture


@contextlib.contextmanager
def capture(path: PathLike, *, max_bytes: Optional[int] = None,
            max_files: Optional[int] = None) -> Iterator[Capture]:
    """``with friendsock.capture("friends.pcap"):`` -- :func:`start_capture`
    on entry, :func:`stop_capture` on exit."""
    running = start_capture(path, max_bytes=max_bytes, max_files=max_files)
    try:
        yield running
    finally:
        if _current is running:
            stop_capture()
        else:
            running.close()


def _forked() -> None:
    global _current
    if _current is not None:
        _current._forked()
        _current = None
    _tap.set_sink(None)


def start_from_environment(environ: Optional[dict] = None) -> Optional[Capture]:
    """``FRIENDSOCK_PCAP=FILE`` (``{pid}`` in it: this process's id):
    capture from now until the program exits; ``FRIENDSOCK_PCAP_MAX=SIZE``
    and ``FRIENDSOCK_PCAP_FILES=N`` as ``max_bytes`` and ``max_files``."""
    env = os.environ if environ is None else environ
    path = env.get("FRIENDSOCK_PCAP", "").strip()
    if not path:
        return None
    path = path.replace("{pid}", str(os.getpid()))
    max_bytes = max_files = None
    if env.get("FRIENDSOCK_PCAP_MAX", "").strip():
        try:
            max_bytes = parse_size(env["FRIENDSOCK_PCAP_MAX"])
        except ValueError as exc:
            raise ValueError(f"FRIENDSOCK_PCAP_MAX: {exc}") from None
    if env.get("FRIENDSOCK_PCAP_FILES", "").strip():
        try:
            max_files = int(env["FRIENDSOCK_PCAP_FILES"])
        except ValueError:
            raise ValueError(f"FRIENDSOCK_PCAP_FILES: not a number: {env['FRIENDSOCK_PCAP_FILES']!r}") \
                from None
    try:
        running = start_capture(path, max_bytes=max_bytes, max_files=max_files)
    except OSError as exc:
        raise OSError(exc.errno or errno.EINVAL, f"FRIENDSOCK_PCAP: {exc.strerror}", path) from None
    atexit.register(stop_capture)
    return running


on_fork(Part.CAPTURE, after_in_child=_forked)
