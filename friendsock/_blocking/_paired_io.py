"""A paired blocking socket's reads and writes: the link's bytes, with the
socket's own semantics in blocking, timeout and non-blocking modes.
``send`` takes what fits in ``sndbuf + friend rcvbuf``, ``recv`` returns
b"" at EOF, failures are the ``OSError`` the kernel gives. Its blocking
calls sleep on locks the link's hooks release (``_readiness``).

:class:`PairedIO` is a part of ``FriendBlockingSocket`` (``_paired``),
which owns the socket's life: becoming a friend, duplicates, closing.
"""

from __future__ import annotations

import operator
import socket
import time
from typing import TYPE_CHECKING, Any, List, Optional, Tuple

from .._core._channel import (CHANNEL_OPEN, SEEN_DATA, SEEN_EOF, SEEN_NOTHING, SEEN_RESET, SEEN_TCP,
                              Channel, Seen)
from .._core._errors import FriendError, LinkBrokenError
from .._core._link import LinkEnd
from .._paired_calls import recvmsg_size, recvmsg_views, scatter, sendmsg_data
from .._socket_errors import bad_descriptor, check_flags, no_urgent_data, recv_into_view, would_block
from ._descriptor import _ss
from ._readiness import Signals, leave, parker, sleep

_MAX_JOIN = 64 * 1024
# Plain ints: the socket module's are IntFlag members, whose ``&`` and ``~``
# run in Python (some microseconds a call).
_PEEK = int(socket.MSG_PEEK)
_OOB = int(socket.MSG_OOB)
_DONTWAIT = int(socket.MSG_DONTWAIT)
_WAITALL = int(socket.MSG_WAITALL)
_SUPPORTED_RECV_FLAGS = _PEEK | _DONTWAIT | _WAITALL
# MSG_MORE holds a segment back for more to come: a link has no segments.
_SUPPORTED_SEND_FLAGS = (_DONTWAIT | int(getattr(socket, "MSG_NOSIGNAL", 0))
                         | int(getattr(socket, "MSG_MORE", 0)))


# What the mixin is mixed into, as the type checker sees it.
if TYPE_CHECKING:
    _Socket = socket.socket
else:
    _Socket = object


class PairedIO(_Socket):
    """The data calls of a paired blocking socket (a mixin of
    ``FriendBlockingSocket``: the attributes below are set as it pairs)."""

    _end: LinkEnd
    _in: Channel
    _out: Channel
    _signals: Signals
    _read_shut: bool
    _friend_closed: bool

    def _check_open(self) -> None:
        if self._friend_closed:
            raise bad_descriptor()

    # -- waiting ---------------------------------------------------------------
    def _wait_deadline(self, timeout: Optional[float], deadline: Optional[float]) -> Optional[float]:
        """The deadline of a wait (set on its first sleep). Non-blocking:
        BlockingIOError (or, the descriptor its user polls closed behind
        its back, as a call on a closed descriptor fails: EBADF); past the
        timeout: TimeoutError."""
        if timeout is None:
            return None
        if timeout == 0.0:
            ready = self._signals.ready
            if ready is not None:
                ready.check_still_open()
            raise would_block()
        if deadline is None:
            return time.monotonic() + timeout
        if time.monotonic() >= deadline:
            raise TimeoutError("timed out")
        return deadline

    # -- receiving -------------------------------------------------------------
    def _drained(self) -> None:
        """The link is empty: the readiness descriptor is unreadable until
        the next write (a write that raced in is seen, and keeps it
        readable)."""
        self._in.begin_drain()
        ready = self._signals.ready
        if ready is not None:
            self._signals.sync_readable(ready)

    def _readable(self, timeout: Optional[float], at_least: int = 1) -> Seen:
        """Wait until the link has something for us: DATA (``at_least``
        bytes of it, unless the friend is done writing), EOF or RESET."""
        channel = self._in
        signals = self._signals
        deadline = None
        while True:
            if self._friend_closed:
                raise bad_descriptor()
            seen = channel.seen()
            if seen is not SEEN_NOTHING and (
                    seen is not SEEN_DATA or channel.queued >= at_least or channel.state is not CHANNEL_OPEN):
                return seen
            if self._read_shut:  # Linux still reads what comes (then EOF, not a wait)
                return SEEN_EOF
            if timeout is not None:
                deadline = self._wait_deadline(timeout, deadline)
            me = parker()
            readers = signals.readers
            readers.append(me)
            # The reader's hook is armed only now: a reader that never
            # waits costs the writer nothing.
            if signals.ready is None:
                channel.begin_drain()
            else:
                self._drained()  # and a token that raced in is taken back
            if channel.queued >= at_least or channel.state is not CHANNEL_OPEN or self._read_shut or \
                    self._friend_closed:
                leave(readers, me)
            else:
                sleep(readers, me, deadline)

    def recv(self, bufsize: int, flags: int = 0) -> bytes:
        channel = self._in
        if type(bufsize) is int and bufsize > 0 and not flags:  # the common case
            if channel.queued and not self._friend_closed:
                seen = SEEN_DATA
            else:
                seen = self._readable(self.gettimeout())
        else:
            bufsize = operator.index(bufsize)
            if bufsize < 0:
                raise ValueError("negative buffersize in recv")
            if bufsize == 0:  # the C call's answer before any other check
                return b""
            if flags & _OOB:
                timeout = self.gettimeout()
                if timeout:  # the stdlib waits for readiness first in timeout mode
                    self._readable(timeout)
                else:
                    self._check_open()
                raise no_urgent_data()
            timeout = self._flags_timeout(flags, _SUPPORTED_RECV_FLAGS)
            self._check_open()
            if flags & _WAITALL and timeout is None:
                return self._recv_waiting_for_all(bufsize, flags)
            # (In timeout mode the stdlib polls, then reads what is there:
            # MSG_WAITALL changes nothing, as it changes nothing here.)
            seen = self._readable(timeout)
        while seen is SEEN_DATA:
            peek = flags & _PEEK
            data = channel.peek(bufsize) if peek else channel.pull(bufsize, _MAX_JOIN)
            if data:
                if not peek and not channel.queued and self._signals.ready is not None:
                    self._drained()
                return data
            # Taken by a duplicate's reader, or moved to TCP (a fork),
            # since we looked.
            seen = self._readable(self._flags_timeout(flags, _SUPPORTED_RECV_FLAGS) if flags
                                  else self.gettimeout())
        if seen is SEEN_EOF:
            return b""
        if seen is SEEN_TCP:
            return _ss.recv(self, bufsize, flags)
        self._read_reset()
        return b""

    def _recv_waiting_for_all(self, bufsize: int, flags: int) -> bytes:
        """A blocking ``recv(bufsize, MSG_WAITALL)``, as Linux answers it:
        ``bufsize`` bytes, or fewer once the friend is done writing (EOF, or
        its reset, which the next call reports when bytes came first). With
        MSG_PEEK, once ``bufsize`` bytes are there, they stay there."""
        channel = self._in
        if flags & _PEEK:
            seen = self._readable(None, at_least=bufsize)
            if seen is SEEN_DATA:
                return channel.peek(bufsize)
            if seen is SEEN_TCP:
                return _ss.recv(self, bufsize, flags)
            if seen is SEEN_RESET:
                self._read_reset()
            return b""
        parts: List[bytes] = []
        wanted = bufsize
        while wanted:
            # Pulled as it comes, making room for the friend's writes: more
            # may be asked for than the link holds at once.
            seen = self._readable(None)
            if seen is SEEN_DATA:
                data = channel.pull(wanted, _MAX_JOIN)
                parts.append(data)
                wanted -= len(data)
            elif seen is SEEN_TCP:
                parts.append(_ss.recv(self, wanted, flags))
                break
            else:
                if seen is SEEN_RESET and not parts:
                    self._read_reset()
                break
        if not channel.queued and self._signals.ready is not None:
            self._drained()
        return b"".join(parts)

    def recv_into(self, buffer: Any, nbytes: int = 0, flags: int = 0) -> int:
        view = recv_into_view(buffer, nbytes)
        if flags:
            data = self.recv(len(view), flags)
            view[:len(data)] = data
            return len(data)
        self._check_open()
        if not view:
            return 0
        channel = self._in
        seen = SEEN_DATA if channel.queued else self._readable(self.gettimeout())
        while seen is SEEN_DATA:
            copied = channel.pull_into(view)
            if copied:
                if not channel.queued and self._signals.ready is not None:
                    self._drained()
                return copied
            seen = self._readable(self.gettimeout())  # (see recv)
        if seen is SEEN_EOF:
            return 0
        if seen is SEEN_TCP:
            return _ss.recv_into(self, view)
        self._read_reset()
        return 0

    def _read_reset(self) -> None:
        """A read found the friend's reset and nothing left: its error, the
        first time (raised); EOF after that (returns)."""
        error = self._end.take_error()
        if error is not None:
            raise error.as_os_error()

    def recvfrom(self, bufsize: int, flags: int = 0) -> Tuple[bytes, None]:
        # A connected stream socket's recvfrom() gives no address.
        return self.recv(bufsize, flags), None

    def recvfrom_into(self, buffer: Any, nbytes: int = 0, flags: int = 0) -> Tuple[int, None]:
        return self.recv_into(buffer, nbytes, flags), None

    # recvmsg/sendmsg: scatter/gather reads and writes (see recvmsg_size).
    def recvmsg(self, bufsize: int, ancbufsize: int = 0, flags: int = 0) -> Tuple[bytes, list, int, None]:
        return self.recv(recvmsg_size(bufsize, ancbufsize), flags), [], 0, None

    def recvmsg_into(self, buffers: Any, ancbufsize: int = 0, flags: int = 0) -> Tuple[int, list, int, None]:
        views = recvmsg_views(buffers, ancbufsize)
        return scatter(self.recv(sum(len(view) for view in views), flags), views), [], 0, None

    def _flags_timeout(self, flags: int, supported: int) -> Optional[float]:
        """The timeout a call with ``flags`` waits for. MSG_DONTWAIT makes a
        blocking socket's call non-blocking; in timeout mode the stdlib
        waits for readiness before the call, so the flag changes nothing."""
        check_flags(flags, supported)
        timeout = self.gettimeout()
        return 0.0 if flags & _DONTWAIT and timeout is None else timeout

    # -- sending ----------------------------------------------------------------
    def _sync_writable(self) -> None:
        """Make the readiness descriptor (there is one) writable exactly
        while the link has room (the friend's read that makes room drains
        it)."""
        ready = self._signals.ready
        if ready is None:
            return
        out = self._out
        if out.wake_writer_at(-1):
            ready.set_writable()
            return
        ready.clear_writable()
        if out.wake_writer_at(-1):  # room made meanwhile, its wake-up maybe before the fill
            ready.set_writable()

    def _send_some(self, data: bytes) -> int:
        try:
            sent = self._end.send_some(data)
        except LinkBrokenError as exc:
            raise exc.as_os_error() from None
        out = self._out
        if sent and out.room() <= 0 and self._signals.ready is not None:
            self._sync_writable()
        return sent

    def _wait_writable(self, timeout: Optional[float], deadline: Optional[float]) -> Optional[float]:
        """Sleep until the link has room (or the friend's reader went away,
        or this socket is shut or closed); the deadline."""
        out = self._out
        if out.wake_writer_at(-1):
            return deadline  # room already: try again
        deadline = self._wait_deadline(timeout, deadline)
        signals = self._signals
        writers = signals.writers
        me = parker()
        writers.append(me)
        ready = signals.ready
        if out.wake_writer_at(-1) or out.state is not CHANNEL_OPEN or out.reader_closed or \
                self._friend_closed:
            leave(writers, me)
            if ready is not None:
                ready.set_writable()
            return deadline
        if ready is not None:
            ready.clear_writable()
            if out.wake_writer_at(-1):  # room made meanwhile, its wake-up maybe before the fill
                ready.set_writable()
                leave(writers, me)
                return deadline
        sleep(writers, me, deadline)
        return deadline

    def _push_whole(self, data: bytes) -> bool:
        """The common case: all of ``data`` (bytes) fits; queued by reference."""
        out = self._out
        if self._friend_closed or out.state is not CHANNEL_OPEN or out.reader_closed or \
                len(data) > out.room():
            return False
        try:
            out.push(data)
        except FriendError:  # the friend went away meanwhile: the slow way says how
            return False
        if out.room() <= 0 and self._signals.ready is not None:
            self._sync_writable()
        return True

    def send(self, data: Any, flags: int = 0) -> int:
        if type(data) is not bytes:
            data = memoryview(data).tobytes()  # the caller may reuse its buffer
        if not flags and data and self._push_whole(data):
            return len(data)
        timeout = self._flags_timeout(flags, _SUPPORTED_SEND_FLAGS)
        if timeout is None:
            self._send_all(data, None)  # a blocking send() returns once all is queued
            return len(data)
        deadline = None
        while True:
            self._check_open()
            sent = self._send_some(data)
            if sent < 0:
                return _ss.send(self, data, flags)
            if sent or not data:
                return sent
            deadline = self._wait_writable(timeout, deadline)

    def sendall(self, data: Any, flags: int = 0) -> None:
        if type(data) is bytes and not flags and data and self._push_whole(data):
            return
        timeout = self._flags_timeout(flags, _SUPPORTED_SEND_FLAGS)
        self._send_all(data, timeout)

    def _send_all(self, data: Any, timeout: Optional[float]) -> None:
        """Queue all of ``data``, a piece at a time as room is made. Past the
        timeout, TimeoutError: what was queued stays queued, and arrives."""
        view = memoryview(data).cast("B")
        total = len(view)
        self._check_open()
        if not total:  # a send of nothing is checked as any send is
            if self._send_some(b"") < 0:
                _ss.sendall(self, b"")
            return
        offset = 0
        deadline = None
        out = self._out
        while offset < total:
            self._check_open()
            room = out.room()
            if room <= 0 and out.state is CHANNEL_OPEN and not out.reader_closed:
                deadline = self._wait_writable(timeout, deadline)
                continue
            size = total - offset if room <= 0 else min(room, total - offset)
            chunk = data if size == total and type(data) is bytes else view[offset:offset + size].tobytes()
            sent = self._send_some(chunk)
            if sent < 0:
                _ss.sendall(self, view[offset:])
                return
            offset += sent

    def sendto(self, data: Any, *args: Any) -> int:
        # A connected stream socket ignores the address, as Linux's TCP does.
        if len(args) not in (1, 2):
            raise TypeError(f"sendto() takes 2 or 3 arguments ({len(args) + 1} given)")
        return self.send(data, args[0] if len(args) == 2 else 0)

    def sendmsg(self, buffers: Any, ancdata: Any = (), flags: int = 0, address: Any = None) -> int:
        return self.send(sendmsg_data(buffers, ancdata, address), flags)

