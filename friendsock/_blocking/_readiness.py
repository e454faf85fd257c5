"""How a blocking friend socket waits, and the descriptor ``select``/``poll`` see.

:class:`Signals` is where the link's hooks land (on the friend's thread):
they wake the threads sleeping in this socket's own ``recv``/``send``
(each on its thread's :class:`Parker`: one write to wake it, one read
to sleep, no descriptor per socket), and nothing more
until somebody asks for the socket's ``fileno()``.

A friend socket's bytes do not go through its TCP descriptor, so that one
never becomes readable. Once ``fileno()`` is asked (``select``, ``poll``,
``selectors``, urllib3's check before reusing a connection), the socket
gets one end (``user``) of an AF_UNIX socket pair, a :class:`Readiness`,
kept in step with its link from then on:

- readable while the link has bytes, EOF or a reset for it: the friend's
  write (the channel's reader hook, on the friend's thread) sends a token
  from the other end (``signal``); the reader takes the tokens back once it
  has read everything;
- writable while the link has room: when a send finds no room left, the
  writer fills ``user``'s tiny send buffer (one write makes it unwritable),
  and the friend's read that makes room (the writer hook) drains it.

Keeping it in step costs a few system calls per message, which is why
sockets nobody polls never get one.
"""

from __future__ import annotations

import _socket
import os
import select
import socket
import threading
import time
import weakref
from typing import Any, Callable, Dict, List, Optional

from .._core._fork import Part, on_fork
from .._core._channel import CHANNEL_EOF, CHANNEL_RESET
from .._socket_errors import bad_descriptor

_FILL = bytes(4096)  # enough to make a minimal AF_UNIX send buffer unwritable
_TOKEN = b"r"
# How far the connection's shutdown shows on a readiness descriptor.
_OPEN, _READ_DONE, _HUNG_UP = 0, 1, 2
# How long a move to TCP waits for the threads asleep on a readiness
# descriptor to wake and let go of it (a woken select() needs no GIL:
# microseconds, unless its CPU is busy).
_SLEEPERS_LET_GO_MS = 500

# The inodes of live readiness descriptors, and whose each is: a socket
# made of one (``socket.fromfd(friend.fileno())``, ``socket.socket(fileno=
# ...)``) is that friend socket's connection, not the descriptor.
readiness_owners: Dict[int, Callable[[], Any]] = {}
_inodes_lock = threading.Lock()


def _forked() -> None:
    # Another thread may have held the lock at fork(); the child's friend
    # sockets are its parent's, stale: nothing to refuse for them. The
    # parkers' descriptors are shared with the parent: the child's threads
    # make their own (the inherited copies close as they are collected).
    global _inodes_lock, _per_thread
    _inodes_lock = threading.Lock()
    readiness_owners.clear()
    _per_thread = threading.local()


on_fork(Part.READINESS, after_in_child=_forked)


def _nobody() -> None:
    return None


class Readiness:
    """One friend socket's readiness descriptor (see the module doc)."""

    __slots__ = ("user", "signal", "fd", "inode", "ended")

    def __init__(self, owner: Any = None) -> None:
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
        self.ended = _OPEN
        with _inodes_lock:
            readiness_owners[self.inode] = weakref.ref(owner) if owner is not None else _nobody

    def check_still_open(self) -> None:
        """OSError(EBADF) if the number handed out no longer names this
        descriptor (its user closed it, ``os.close(sock.fileno())``, and
        maybe opened another file there), as a call on the closed
        descriptor of a TCP socket fails."""
        try:
            inode = os.fstat(self.fd).st_ino
        except OSError:
            inode = None
        if inode != self.inode:
            raise bad_descriptor()

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

    def show(self, readable: bool) -> None:
        """Readable or not, as the link is (under its lock: see
        ``Channel.synced``)."""
        if readable:
            self.set_readable()
        else:
            self.clear_readable()

    def show_end(self, ended: int) -> None:
        """The connection's shutdown as TCP's poll() shows it, for good:
        _READ_DONE (nothing more to come: the friend's FIN, or our SHUT_RD)
        adds POLLRDHUP, as ``signal`` shut for writing does; _HUNG_UP (that,
        and our SHUT_WR; or a reset) adds POLLHUP too, as ``signal`` shut
        both ways does. (Not POLLERR: only a close gives an AF_UNIX socket
        that, and ``signal`` is used on other threads.)"""
        if ended <= self.ended:
            return
        self.ended = ended
        try:
            self.signal.shutdown(socket.SHUT_RDWR if ended == _HUNG_UP else socket.SHUT_WR)
        except OSError:  # closed meanwhile
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

    def become(self, fd: int) -> int:
        """The socket's connection went on over TCP (a fork): wake whoever
        waits on this descriptor, and make its number a duplicate of ``fd``,
        the connection's, for whoever holds the number (``fileno()`` was
        asked: a ``select()`` to come). Returns the number, no longer ours.

        A ``select()``/``poll()`` asleep on the number watches the file it
        found there on its first look; woken, it looks at the number again
        and, finding it not ready, sleeps watching nothing new. So the
        number first shows a stand-in that is always ready, until every
        such sleeper has let go of ``user`` (``signal`` then hangs up),
        and only then the connection (a sleeper that wakes to the stand-in
        reports the socket ready, as a select may: its call finds out)."""
        self.set_readable()
        self.set_writable()
        with _inodes_lock:
            readiness_owners.pop(self.inode, None)
        number = self.user.detach()
        stand_in, gone = _socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
        gone.close()  # ``stand_in`` reads EOF: readable, and writable
        os.dup2(stand_in.fileno(), number, inheritable=False)  # closes our end of ``user``
        stand_in.close()
        hung_up = select.poll()
        hung_up.register(self.signal.fileno(), 0)  # reports POLLHUP (or an error) only
        # Bounded: one asleep for exceptional conditions only is not woken.
        hung_up.poll(_SLEEPERS_LET_GO_MS)
        os.dup2(fd, number, inheritable=False)
        self.signal.close()
        return number

    def close(self) -> None:
        """Closing ``signal`` first wakes a thread still polling ``user``
        (it finds the socket closed)."""
        with _inodes_lock:
            readiness_owners.pop(self.inode, None)
        self.signal.close()
        self.user.close()


class Parker:
    """What one thread sleeps on: a pipe. Waking is one write, sleeping one
    read, both with the GIL released, as a TCP socket's send and recv. A
    lock would be no system call at all, but its release hands the GIL over
    badly: the woken thread wakes to a GIL its waker still holds, and
    sleeps again (a ping-pong between two threads: 18 us a round trip on
    locks, 7.6 on eventfds, as much on pipes). A pipe, not an eventfd: its
    write end alone is non-blocking, so a waker (an event loop's thread,
    for a friend of a loop's transport) never makes a blocking call, which
    asyncio debug tools such as blockbuster refuse; a full pipe is a
    thread woken already. Sleeping takes every wake that came at once."""

    __slots__ = ("read_fd", "write_fd", "_poller", "__weakref__")

    def __init__(self) -> None:
        self.read_fd, self.write_fd = os.pipe()
        os.set_blocking(self.write_fd, False)
        self._poller: Optional[select.poll] = None

    def sleep_until(self, deadline: float) -> bool:
        """Until woken or past ``deadline``; whether woken."""
        poller = self._poller
        if poller is None:
            poller = self._poller = select.poll()
            poller.register(self.read_fd, select.POLLIN)
        left = deadline - time.monotonic()
        if left <= 0 or not poller.poll(int(left * 1000) + 1):
            return False
        self.take_wakes()
        return True

    def take_wakes(self) -> None:
        """Take every wake that came (blocking until one has)."""
        os.read(self.read_fd, _WAKES)

    def close(self) -> None:
        if self.read_fd >= 0:
            os.close(self.read_fd)
            os.close(self.write_fd)
            self.read_fd = self.write_fd = -1

    def __del__(self) -> None:  # its thread ended, or the process forked
        self.close()


_ONE = b"w"  # a wake
_WAKES = 4096  # a sleeper takes every wake that came, at once
_per_thread = threading.local()


def parker() -> Parker:
    """The calling thread's parker."""
    try:
        return _per_thread.parker
    except AttributeError:
        made = _per_thread.parker = Parker()
        return made


# A list of sleepers: the threads sleeping until one thing happens (bytes,
# EOF or a reset to read; room to write). A sleeper appends its parker
# before it looks at the link one last time, so a wake that comes between
# the look and the sleep is not lost; a wake that comes after it gave up
# is stale, and costs it one look more on its next sleep.
Sleepers = List[Parker]


def sleep(sleepers: Sleepers, me: Parker, deadline: Optional[float]) -> None:
    """Sleep on ``me`` (appended to ``sleepers``) until woken, maybe by a
    stale wake, or past ``deadline`` (None: no limit); the caller looks
    again either way. Interrupted by a signal handler's exception as a
    socket call is."""
    try:
        if deadline is None:
            me.take_wakes()
            return
        if me.sleep_until(deadline):
            return
    except BaseException:
        leave(sleepers, me)
        raise
    leave(sleepers, me)


def leave(sleepers: Sleepers, me: Parker) -> None:
    """``me`` does not sleep after all (or is done sleeping)."""
    try:
        sleepers.remove(me)
    except ValueError:  # woken meanwhile: that wake is stale now
        pass


def wake(sleepers: Sleepers) -> None:
    """Wake every sleeper there is when called (any thread). ``pop`` hands
    each parker to one waker only.

    Not the sleepers that come meanwhile: they look at the link after they
    come, and find what this wake is for. Woken too, a thread that went to
    sleep for its next message while this one's write let go of the GIL
    would be woken for nothing, look, sleep again, be woken again ... for
    as long as the waker's loop ran, which its peer's every turn kept going
    (a storm of eventfd writes and reads per message). Taken from the
    front, so those that came first are the ones woken."""
    for _ in range(len(sleepers)):
        try:
            sleeper = sleepers.pop(0)
        except IndexError:  # another waker took the last one
            return
        try:
            os.write(sleeper.write_fd, _ONE)
        except OSError:  # the counter is full (woken already), or closed
            pass


class Signals:
    """Where a friend socket's link hooks land: wake its sleepers, and keep
    its readiness descriptor (``ready``, once ``fileno()`` made one) in
    step. Holds no reference to the socket: a friend socket its user drops
    is collected (and closed) as a real one is."""

    __slots__ = ("readers", "writers", "ready", "incoming", "read_shut", "write_shut")

    def __init__(self, incoming: Any) -> None:
        self.readers: Sleepers = []
        self.writers: Sleepers = []
        self.ready: Optional[Readiness] = None
        self.incoming = incoming  # the channel read from
        self.read_shut = False  # shutdown(SHUT_RD): readable for good
        self.write_shut = False  # shutdown(SHUT_WR)

    def readable(self) -> None:
        """The friend wrote, shut down or reset (or we shut our reading).
        The descriptor first: a woken reader that drains at once must find
        its token there to take back. It shows the link as it is when the
        notice lands: a reader on another thread may have taken the bytes
        meanwhile."""
        ready = self.ready
        if ready is not None:
            self.sync_readable(ready)
        if self.readers:
            wake(self.readers)

    def sync_readable(self, ready: Readiness) -> None:
        incoming = self.incoming
        if self.read_shut:
            ready.set_readable()
        else:
            incoming.synced(ready.show)
        state = incoming.state
        if state is CHANNEL_RESET:
            ready.show_end(_HUNG_UP)
        elif state is CHANNEL_EOF or self.read_shut:
            ready.show_end(_HUNG_UP if self.write_shut else _READ_DONE)

    def writable(self) -> None:
        """Room was made, or the friend's reader went away (or we shut our
        writing): a send goes on, or fails at once. The descriptor first,
        as for :meth:`readable`."""
        ready = self.ready
        if ready is not None:
            ready.set_writable()
        if self.writers:
            wake(self.writers)

    def close(self) -> None:
        """The socket is closed: its sleepers wake (and find it closed)."""
        wake(self.readers)
        wake(self.writers)
        ready = self.ready
        if ready is not None:
            ready.close()
