"""The descriptor a blocking friend socket hands to ``select``/``poll``.

A friend socket's bytes do not go through its TCP descriptor, so that one
never becomes readable. Each friend socket owns one end (``user``) of an
AF_UNIX socket pair instead, kept in step with its link:

- readable while the link has bytes, EOF or a reset for it: the friend's
  write (the channel's reader hook, on the friend's thread) sends a token
  from the other end (``signal``); the reader takes the tokens back once it
  has read everything;
- writable while the link has room: when a send finds no room left, the
  writer fills ``user``'s tiny send buffer (one write makes it unwritable),
  and the friend's read that makes room (the writer hook) drains it.

The socket's own blocking calls wait on the same descriptor with ``poll``,
so there is one source of truth, and code that polls the socket itself
(urllib3 before reusing a connection, selectors) sees what ``recv``/``send``
would do.
"""

from __future__ import annotations

import _socket
import os
import select
import socket
import threading
from typing import Optional, Set

_POLLIN = select.POLLIN
_POLLOUT = select.POLLOUT
_FILL = bytes(4096)  # enough to make a minimal AF_UNIX send buffer unwritable
_TOKEN = b"r"

# The inodes of live readiness descriptors: ``socket.fromfd`` of one (a
# friend socket's fileno()) is refused rather than handing out a socket
# that is not the connection.
readiness_inodes: Set[int] = set()
_inodes_lock = threading.Lock()


def _forked() -> None:
    # Another thread may have held the lock at fork(); the child's friend
    # sockets are its parent's, stale: nothing to refuse for them.
    global _inodes_lock
    _inodes_lock = threading.Lock()
    readiness_inodes.clear()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_forked)


class Readiness:
    """One friend socket's readiness descriptor (see the module doc)."""

    __slots__ = ("user", "signal", "fd", "inode")

    def __init__(self) -> None:
        user, signal = _socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
        user.setblocking(False)
        signal.setblocking(False)
        # The smallest send buffer the kernel allows: one fill makes it
        # unwritable (an AF_UNIX socket is writable below a quarter of it).
        user.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, 1)
        self.user = user
        self.signal = signal
        self.fd = user.fileno()
        self.inode = os.fstat(self.fd).st_ino
        with _inodes_lock:
            readiness_inodes.add(self.inode)

    # -- readable: tokens in ``user`` ------------------------------------
    def set_readable(self) -> None:
        """Called on any thread (the friend's write, our own shutdown)."""
        try:
            self.signal.send(_TOKEN)
        except OSError:  # full: readable already; closed: nobody watches
            pass

    def clear_readable(self) -> None:
        """Take every token back (the reader's thread, the link empty)."""
        recv = self.user.recv
        try:
            while len(recv(4096)) == 4096:
                pass
        except OSError:
            pass

    # -- writable: ``user``'s send buffer not filled ----------------------
    def clear_writable(self) -> None:
        """The writer found no room: fill ``user``'s send buffer."""
        try:
            self.user.send(_FILL)
        except OSError:  # filled already, or closed
            pass

    def set_writable(self) -> None:
        """Room was made (the friend's read, on its thread), or the writer
        found room after all: drain what the fill put in."""
        recv = self.signal.recv
        try:
            while len(recv(65536)) == 65536:
                pass
        except OSError:
            pass

    # -- waiting ----------------------------------------------------------
    def wait(self, writable: bool, timeout: Optional[float]) -> bool:
        """Until readable (or ``writable``), at most ``timeout`` seconds
        (None: no limit); whether it became so. A poll object per wait:
        a reader and a writer thread may wait at once."""
        poller = select.poll()
        poller.register(self.fd, _POLLOUT if writable else _POLLIN)
        if timeout is None:
            return bool(poller.poll())
        return bool(poller.poll(max(0, int(timeout * 1000 + 0.999))))

    def close(self) -> None:
        """Closing ``signal`` first wakes a thread still polling ``user``
        (it finds the socket closed)."""
        with _inodes_lock:
            readiness_inodes.discard(self.inode)
        self.signal.close()
        self.user.close()
