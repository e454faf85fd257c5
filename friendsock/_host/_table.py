"""The host's port table: which local ports a friendsock process listens
on, and which connects from this host wait for a rendezvous.

One file per user in ``/dev/shm``, mapped by each friendsock process of that
user, so a lookup is a memory read and a connect to a process without
friendsock costs no system call more. It is a hint only: any process of the
user can write it, so a slot can at most start a rendezvous, whose proof
(``_proof``) decides. A file that is not the user's own, or open to
others, is not used at all.

Two regions of one slot per port number, each slot
``pid, port, loop token, CLOCK_MONOTONIC ns``:

- ``LISTENERS[port]``: a friendsock process serves a listener on ``port``;
- ``CONNECTS[port]``: a connect from ``port`` (bound before ``connect()``)
  to the slot's port waits for the process that accepts it to offer a
  rendezvous on the slot's loop token.
"""

from __future__ import annotations

import mmap
import os
import stat
import struct
import sys
import time
from typing import NamedTuple, Optional

_SLOT = struct.Struct("<iHHq")  # pid, port, loop token, monotonic ns
_PID = struct.Struct("<i")  # a slot's first field alone
_PORTS = 1 << 16
_REGION = _SLOT.size * _PORTS
LISTENERS, CONNECTS = range(2)
_SIZE = 2 * _REGION


# The map keeps no descriptor of its own where Python lets it (3.13+); before
# that it keeps one, for the process's life.
_NO_FD_KEPT = {"trackfd": False} if sys.version_info >= (3, 13) else {}


class Slot(NamedTuple):
    pid: int
    port: int
    token: int
    written_ns: int


class PortTable:
    """The mapped table (see the module's text)."""

    def __init__(self, memory: mmap.mmap) -> None:
        self._memory = memory

    @classmethod
    def open(cls, directory: str = "/dev/shm") -> Optional["PortTable"]:
        """This user's table, made if missing; None where there is no
        shared memory directory or the file is not safely this user's."""
        path = os.path.join(directory, f"friendsock-{os.getuid()}.ports")
        flags = os.O_RDWR | os.O_CREAT | os.O_CLOEXEC | os.O_NOFOLLOW
        try:
            fd = os.open(path, flags, 0o600)
        except OSError:
            return None
        try:
            info = os.fstat(fd)
            if (not stat.S_ISREG(info.st_mode) or info.st_uid != os.getuid()
                    or info.st_mode & 0o077):
                return None  # another user's, or one others may write
            if info.st_size < _SIZE:
                os.ftruncate(fd, _SIZE)
            return cls(mmap.mmap(fd, _SIZE, mmap.MAP_SHARED, mmap.PROT_READ | mmap.PROT_WRITE,
                                 **_NO_FD_KEPT))
        except (OSError, ValueError):
            return None
        finally:
            os.close(fd)

    def read(self, region: int, port: int) -> Slot:
        return Slot(*_SLOT.unpack_from(self._memory, region * _REGION + port * _SLOT.size))

    def pid(self, region: int, port: int) -> int:
        """The slot's pid alone (0: empty): every connect asks this first."""
        return _PID.unpack_from(self._memory, region * _REGION + port * _SLOT.size)[0]

    def write(self, region: int, port: int, pid: int, to_port: int = 0, token: int = 0) -> None:
        _SLOT.pack_into(self._memory, region * _REGION + port * _SLOT.size,
                        pid, to_port, token, time.monotonic_ns())

    def clear(self, region: int, port: int, pid: int) -> None:
        """Empty the slot if ``pid`` still holds it."""
        if self.read(region, port).pid == pid:
            _SLOT.pack_into(self._memory, region * _REGION + port * _SLOT.size, 0, 0, 0, 0)
