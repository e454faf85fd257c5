"""TLS on a paired blocking socket: ``SSLContext.wrap_socket`` of a friend
socket (``http.client``'s and urllib3's HTTPS, a TLS ``socketserver``).

The stdlib's ``SSLSocket`` hands OpenSSL its socket's descriptor, and a
friend socket's bytes do not go through any descriptor. So a friend socket
is wrapped in a :class:`FriendSSLSocket` instead: an ``ssl.SSLSocket`` (what
callers check for) whose TLS object is an ``ssl.SSLObject`` over memory
BIOs, fed from the friend socket and flushed to it, blocking as the socket's
timeout says (:class:`LinkTLS`). Every ``SSLSocket`` method that goes
through its TLS object works unchanged; what would reach a descriptor
goes to the friend socket instead.
"""

from __future__ import annotations

import _socket
import errno
import os
import socket
import ssl
import sys
from typing import Any, Callable, Optional, TypeVar

from ._capable import _ENTRY, FriendCapableSocket, _may_pair, named_as, pairing_classes, steps
from ._descriptor import OriginalSocket
from ._paired import FriendBlockingSocket

_T = TypeVar("_T")
_RECORD_HEADER = 5  # content type, version, length (two bytes)
# A reset under a TLS socket: what its reads and writes raise. Over
# OpenSSL 3 the ssl module of Pythons before 3.13 reports it as the
# stream's end cut short (SSLEOFError, which a read with
# suppress_ragged_eofs turns into b""); 3.13's (gh-115627), and any over
# OpenSSL 1.1, as the socket's error.
_RESET_IS_TLS_EOF = ssl.OPENSSL_VERSION_INFO >= (3,) and sys.version_info < (3, 13)


def _transport_error(exc: OSError) -> OSError:
    """``exc``, from the friend socket under the TLS object, as a real TLS
    socket's call reports it."""
    if _RESET_IS_TLS_EOF and isinstance(exc, (ConnectionResetError, BrokenPipeError)):
        eof = ssl.SSLEOFError(int(ssl.SSL_ERROR_EOF), "EOF occurred in violation of protocol")
        eof.__cause__ = exc
        return eof
    return exc


class LinkTLS:
    """What ``SSLSocket`` keeps as ``_sslobj`` (the C TLS object of a real
    socket): the same calls, run over an ``ssl.SSLObject`` whose records
    move through the friend socket ``raw``."""

    __slots__ = ("_obj", "_incoming", "_outgoing", "_raw", "_owner", "_unsent", "_cut_short",
                 "_header", "_record_left")

    def __init__(self, context: ssl.SSLContext, raw: FriendBlockingSocket, owner: "FriendSSLSocket",
                 server_side: bool, server_hostname: Optional[str], session: Any) -> None:
        self._incoming = ssl.MemoryBIO()
        self._outgoing = ssl.MemoryBIO()
        self._obj = context.wrap_bio(self._incoming, self._outgoing, server_side=server_side,
                                     server_hostname=server_hostname, session=session)
        self._raw = raw
        self._owner = owner
        self._unsent = b""  # records a non-blocking socket could not send yet
        # A write whose records are not all sent (SSLWantWriteError): its
        # count, returned once they are, by the retry OpenSSL asks for.
        self._cut_short: Optional[int] = None
        # Where the incoming stream is: the next record's header so far, or
        # the bytes left of the current record's body.
        self._header = b""
        self._record_left = 0

    def _run(self, step: Callable[..., _T], *args: Any, must_send: bool = True) -> _T:
        """``step`` on the TLS object, as often as it takes: what it writes is
        sent, what it waits for received (blocking as ``raw``'s timeout
        says; non-blocking, SSLWantReadError/SSLWantWriteError as a real
        TLS socket raises). ``must_send=False``: records a non-blocking
        socket cannot take now wait for a later call, and the step's result
        is returned (a read's plaintext is not lost to a full link)."""
        while True:
            try:
                result = step(*args)
            except ssl.SSLWantReadError:
                self._flush(must_send)
                self._fill()
                continue
            except ssl.SSLError:
                # What the failure queued (an alert: "unknown ca") goes out
                # first, as a real TLS socket's does.
                try:
                    self._flush(must_send=False)
                except OSError:
                    pass
                raise
            self._flush(must_send)
            return result

    def _flush(self, must_send: bool = True) -> None:
        """Send the records not sent yet. Non-blocking, what the socket does
        not take is kept (sent first at the next call): SSLWantWriteError
        if ``must_send``."""
        data = self._unsent + self._outgoing.read()
        self._unsent = b""
        if not data:
            return
        try:
            if self._raw.gettimeout() != 0.0:
                self._raw.sendall(data)
                return
            view = memoryview(data)
            while view:
                try:
                    view = view[self._raw.send(view):]
                except BlockingIOError:
                    # The TLS object took these bytes already: never made again.
                    self._unsent = view.tobytes()
                    if must_send:
                        raise ssl.SSLWantWriteError(ssl.SSL_ERROR_WANT_WRITE,
                                                    "The operation did not complete (write)") from None
                    return
        except (ConnectionResetError, BrokenPipeError) as exc:
            raise _transport_error(exc) from None

    def _fill(self) -> None:
        """Take from the link what the TLS object waits for, no more: the
        rest of a record's header, or of its body, as OpenSSL reads a
        socket. What is left stays in the link, where select() sees it,
        and a close over it resets, as over TCP."""
        left = self._record_left
        try:
            data = self._raw.recv(left if left else _RECORD_HEADER - len(self._header))
        except BlockingIOError:
            raise ssl.SSLWantReadError(ssl.SSL_ERROR_WANT_READ,
                                       "The operation did not complete (read)") from None
        except ConnectionResetError as exc:
            raise _transport_error(exc) from None
        if not data:
            self._incoming.write_eof()
            return
        self._incoming.write(data)
        if left:
            self._record_left = left - len(data)
            return
        header = self._header + data
        if len(header) < _RECORD_HEADER:
            self._header = header
            return
        self._header = b""
        self._record_left = int.from_bytes(header[3:5], "big")

    # -- the C object's calls that move records ----------------------------------
    def do_handshake(self) -> None:
        self._run(self._obj.do_handshake)

    def read(self, len: int = 1024, buffer: Any = None) -> Any:
        # As OpenSSL's SSL_read: records an earlier write left unsent do not
        # hold a read up (the write's retry sends them).
        if buffer is None:
            return self._run(self._obj.read, len, must_send=False)
        return self._run(self._obj.read, len, buffer, must_send=False)

    def write(self, data: Any) -> int:
        """As OpenSSL's SSL_write on a non-blocking socket: records it cannot
        send yet raise SSLWantWriteError, and the retry (with the same data,
        as OpenSSL asks) sends them and returns the count, without
        encrypting the data again."""
        if self._cut_short is None:
            self._cut_short = self._run(self._obj.write, data, must_send=False)
        try:
            self._flush()
        except ssl.SSLWantWriteError:
            raise
        except BaseException:
            self._cut_short = None  # failed for good: no retry will finish it
            raise
        written, self._cut_short = self._cut_short, None
        return written

    def shutdown(self) -> "FriendSSLSocket":
        """The TLS close (``SSLSocket.unwrap``): the socket, plain from here
        on, is returned; bytes past the peer's close_notify stay readable."""
        self._run(self._obj.unwrap)
        self._owner._plain_leftover = self._incoming.read()
        return self._owner

    # -- the rest, as the C object answers ---------------------------------------
    def pending(self) -> int:
        return self._obj.pending()

    def getpeercert(self, binary_form: bool = False) -> Any:
        return self._obj.getpeercert(binary_form)

    def __getattr__(self, name: str) -> Any:
        # cipher, shared_ciphers, version, selected_alpn_protocol,
        # compression, get_channel_binding, session, session_reused, ...
        return getattr(self._obj, name)

    def __setattr__(self, name: str, value: Any) -> None:
        if name in LinkTLS.__slots__:
            object.__setattr__(self, name, value)
        else:  # session, as SSLSocket.session's setter sets it
            setattr(self._obj, name, value)


def _still_connected(sock: FriendBlockingSocket) -> bool:
    """SSLSocket._create's check, in its words: a connection the peer
    reset before the handshake is not connected, and one whose data is
    still unread is refused, so that data cannot pass for TLS."""
    try:
        sock.getpeername()
        return True
    except OSError as exc:
        if exc.errno != errno.ENOTCONN:
            raise
    timeout = sock.gettimeout()
    sock.setblocking(False)
    try:
        data = sock.recv(1)
    except OSError:
        data = b""
    finally:
        sock.settimeout(timeout)
    if data:
        reason = "Closed before TLS handshake with data in recv buffer."
        error = ssl.SSLError(errno.ENOTCONN, reason)
        error.reason = reason
        error.library = None  # type: ignore[assignment]
        raise error
    return False


class FriendSSLSocket(ssl.SSLSocket):
    """``ssl.SSLSocket`` over a paired blocking socket (see the module doc).
    Its own descriptor is a duplicate of the friend socket's TCP one (for
    what ``socket.socket`` asks of a descriptor); its bytes, its readiness
    (``fileno()``), its options, timeout, shutdown and close are the friend
    socket's."""

    _raw: FriendBlockingSocket
    _plain_leftover: bytes
    # The stdlib's, undeclared in its stubs.
    _closed: bool
    _checkClosed: Callable[[], None]

    @classmethod
    def _create(cls, sock: Any, server_side: bool = False, do_handshake_on_connect: bool = True,
                suppress_ragged_eofs: bool = True, server_hostname: Optional[str] = None,
                context: Optional[ssl.SSLContext] = None, session: Any = None) -> "FriendSSLSocket":
        assert context is not None
        # The checks of SSLSocket._create, in its words.
        if server_side:
            if server_hostname:
                raise ValueError("server_hostname can only be specified in server mode")
            if session is not None:
                raise ValueError("session can only be specified in client mode")
        if context.check_hostname and not server_hostname:
            raise ValueError("check_hostname requires server_hostname")
        fd = os.dup(sock._descriptor.fileno())
        self: Any  # what SSLSocket._create sets, undeclared there
        try:
            self = cls.__new__(cls, family=sock.family, type=sock.type,  # type: ignore[call-arg]
                               proto=sock.proto, fileno=fd)
            OriginalSocket.__init__(self, sock.family, sock.type, sock.proto, fd)
        except BaseException:
            os.close(fd)
            raise
        # As the stdlib's detaches the socket it wraps: closing that one
        # afterwards leaves the connection to the TLS socket.
        raw: FriendBlockingSocket = sock.dup()
        sock._close_friend()
        sock = self._raw = raw
        sock._under_tls = True
        _socket.socket.settimeout(self, sock.gettimeout())  # its ``timeout`` attribute
        self._plain_leftover = b""
        self._context = context
        self._session = session
        self._closed = False
        self._sslobj = None
        self.server_side = server_side
        self.server_hostname = context._encode_hostname(server_hostname)  # type: ignore[attr-defined]
        self.do_handshake_on_connect = do_handshake_on_connect
        self.suppress_ragged_eofs = suppress_ragged_eofs
        try:
            self._connected = _still_connected(sock)
            if self._connected:
                self._sslobj = LinkTLS(context, sock, self, server_side, self.server_hostname,
                                       session)
                if do_handshake_on_connect:
                    if sock.gettimeout() == 0.0:
                        raise ValueError("do_handshake_on_connect should not be specified for "
                                         "non-blocking sockets")
                    self.do_handshake()
        except BaseException:
            self.close()
            raise
        return self

    def __repr__(self) -> str:
        return named_as(super().__repr__(), "ssl.SSLSocket", friend=not self._closed)

    # -- what is the friend socket's -------------------------------------------
    def fileno(self) -> int:
        # Closed is its own descriptor closed: close() with a makefile()
        # still open leaves the socket usable, as the stdlib's.
        return -1 if _socket.socket.fileno(self) == -1 else self._raw.fileno()

    def gettimeout(self) -> Optional[float]:
        return self._raw.gettimeout()

    def settimeout(self, value: Optional[float]) -> None:
        self._raw.settimeout(value)
        _socket.socket.settimeout(self, value)

    def setblocking(self, flag: bool) -> None:
        self._raw.setblocking(flag)
        _socket.socket.setblocking(self, flag)

    def getsockopt(self, *args: Any) -> Any:
        return self._raw.getsockopt(*args)

    def setsockopt(self, *args: Any) -> None:
        self._raw.setsockopt(*args)

    def getpeername(self) -> Any:
        return self._raw.getpeername()

    def getsockname(self) -> Any:
        return self._raw.getsockname()

    def detach(self) -> int:
        raise OSError(errno.EOPNOTSUPP, "detach() is not supported on a friend socket: its "
                                        "bytes do not go through the descriptor")

    def shutdown(self, how: int) -> None:
        self._checkClosed()
        self._sslobj = None
        self._raw.shutdown(how)

    def _real_close(self) -> None:
        self._sslobj = None
        try:
            self._raw.close()
        finally:
            super()._real_close()  # type: ignore[misc]

    # -- once unwrapped: plain bytes, through the friend socket ---------------------
    def _take_leftover(self, size: int) -> bytes:
        data, self._plain_leftover = self._plain_leftover[:size], self._plain_leftover[size:]
        return data

    def recv(self, buflen: int = 1024, flags: int = 0) -> bytes:
        if self._sslobj is not None:
            return super().recv(buflen, flags)
        self._checkClosed()
        if self._plain_leftover and not flags:
            return self._take_leftover(buflen)
        return self._raw.recv(buflen, flags)

    def recv_into(self, buffer: Any, nbytes: Optional[int] = None, flags: int = 0) -> int:
        if self._sslobj is not None:
            return super().recv_into(buffer, nbytes, flags)
        self._checkClosed()
        if self._plain_leftover and not flags:
            view = memoryview(buffer).cast("B")
            data = self._take_leftover(min(nbytes or len(view), len(view)))
            view[:len(data)] = data
            return len(data)
        return self._raw.recv_into(buffer, nbytes or 0, flags)

    def send(self, data: Any, flags: int = 0) -> int:
        if self._sslobj is not None:
            return super().send(data, flags)
        self._checkClosed()
        return self._raw.send(data, flags)

    def sendall(self, data: Any, flags: int = 0) -> None:
        if self._sslobj is not None:
            return super().sendall(data, flags)
        self._checkClosed()
        return self._raw.sendall(data, flags)

    def sendfile(self, file: Any, offset: int = 0, count: Optional[int] = None) -> int:
        return self._sendfile_use_send(file, offset, count)  # type: ignore[attr-defined]


_native_wrap_socket = ssl.SSLContext.wrap_socket


class FriendSSLListener(ssl.SSLSocket, FriendCapableSocket):  # type: ignore[misc]
    """A TLS listener: ``context.wrap_socket(listener, server_side=True)`` of
    a socket of the patched class (http.server's HTTPS recipe wraps it
    after ``listen()``, anyio's tests before). It listens and accepts as
    the patched class does, so a client of this process pairs; and
    ``SSLSocket.accept`` wraps what it accepted, a friend socket in a
    :class:`FriendSSLSocket`, TLS over the link."""

    def __repr__(self) -> str:
        return named_as(OriginalSocket.__repr__(self), "ssl.SSLSocket")


pairing_classes.add(FriendSSLListener)


def _wrap_socket(self: ssl.SSLContext, sock: socket.socket, *args: Any, **kwargs: Any) -> ssl.SSLSocket:
    if type(sock) is FriendBlockingSocket:
        return wrap_friend(self, sock, *args, **kwargs)
    if type(sock) is FriendCapableSocket and self.sslsocket_class is ssl.SSLSocket and \
            _wraps_a_listener(sock, *args, **kwargs):
        return _wrap_listener(self, sock, *args, **kwargs)
    return _native_wrap_socket(self, sock, *args, **kwargs)


def _wraps_a_listener(sock: socket.socket, server_side: bool = False, *args: Any, **kwargs: Any) -> bool:
    """A server's socket, not connected: one that listens, or will."""
    if not server_side:
        return False
    try:
        sock.getpeername()
    except OSError:
        return True
    return False


def wrap_friend(context: ssl.SSLContext, sock: FriendBlockingSocket, *args: Any,
                **kwargs: Any) -> FriendSSLSocket:
    """``context.wrap_socket(sock, ...)`` for a friend socket."""
    return _wrap_as(FriendSSLSocket, context, sock, *args, **kwargs)


def _wrap_listener(context: ssl.SSLContext, sock: FriendCapableSocket, *args: Any,
                   **kwargs: Any) -> FriendSSLListener:
    """``context.wrap_socket(sock, server_side=True, ...)`` for a socket that
    listens (or will): a :class:`FriendSSLListener`, registered if ``sock``
    was (the wrapping detaches ``sock``, which passes it on)."""
    listening = _ENTRY in sock.__dict__
    wrapped = _wrap_as(FriendSSLListener, context, sock, *args, **kwargs)
    if listening and _may_pair(wrapped):
        steps.register_listener(wrapped)
    return wrapped


_SSLSocketT = TypeVar("_SSLSocketT", bound=ssl.SSLSocket)


def _wrap_as(cls: "type[_SSLSocketT]", context: ssl.SSLContext, sock: socket.socket,
             server_side: bool = False, do_handshake_on_connect: bool = True,
             suppress_ragged_eofs: bool = True, server_hostname: Optional[str] = None,
             session: Any = None) -> _SSLSocketT:
    """``context.wrap_socket(sock, ...)``, as a ``cls``."""
    return cls._create(sock=sock, server_side=server_side,  # type: ignore[attr-defined]
                       do_handshake_on_connect=do_handshake_on_connect,
                       suppress_ragged_eofs=suppress_ragged_eofs,
                       server_hostname=server_hostname, context=context,
                       session=session)


def patch_ssl() -> None:
    ssl.SSLContext.wrap_socket = _wrap_socket  # type: ignore[method-assign]


def unpatch_ssl() -> None:
    ssl.SSLContext.wrap_socket = _native_wrap_socket  # type: ignore[method-assign]
