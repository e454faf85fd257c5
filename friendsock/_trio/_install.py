"""``friendsock.trio.install()``: unchanged trio code pairs.

trio has no event loop object to patch, so the patches are process-wide,
on trio's socket layer, and ``uninstall()`` puts back exactly what was
there. Everything of trio's that makes TCP connections goes through its
socket class, so patching that one place reaches ``trio.open_tcp_stream``,
``trio.serve_tcp``, ``trio.open_tcp_listeners``, ``trio.SocketListener``
over sockets made elsewhere (hypercorn's), anyio's trio backend, and any
trio function a module imported by name before ``install()``:

- ``listen()``, and ``trio.socket.from_stdlib_socket`` of a listening
  socket, register the socket for pairing; ``close()`` forgets it;
- ``connect()`` and ``accept()`` pair the socket itself: it becomes a
  :class:`FriendTrioSocket`, the same object, still a ``trio.socket``
  socket, so the streams trio and anyio build over it are their own
  (``type(stream) is trio.SocketStream``, as libraries check);
- ``trio.SocketStream.receive_some``/``send_all`` over a friend socket take
  a shorter way through the link (any other socket: trio's own code).
"""

from __future__ import annotations

import contextvars
import socket
import threading
import weakref
from types import ModuleType
from typing import Any, Callable, Dict, List, Optional, Tuple, cast

import trio

from ._across import accept_across, connect_across, drop_held, held_connection, may_cross
from .._blocking._capable import listen_unregistered
from .._blocking._listen import listener_passed_on, take_listener
from .._blocking._paired import as_plain_socket
from .._core._registry import registry
from .._core._stats import Fallback, counters
from .._core._switch import is_enabled
from .._handshake import (ConnectAttempt, Entry, forget_listener, forget_when_collected, is_bound,
                          is_listening, is_tcp_socket, offer_for_reuse, register_listener,
                          users_sockname)
from .._host._payoff import worth_an_offer
from .._host._ports import keep_published, stop_publishing
from .._imports import when_imported
from .._kept_options import carry_options, restore_options_set_before_connect, set_as_a_new_socket
from .._reuse import reused_connect
from .._socketless import socketless_connect, socketless_entry
from . import _pairing
from ._backlog import SocketlessBacklog
from ._pairing import _pair, accept_connection, claim_connection, claimed, native_calls, not_a_friend
from ._run import run_state
from ._socket import (
    FriendTrioSocket,
    TrioSocketType,
    become_friend,
    socketless_trio_socket,
    stream_receive_some,
    stream_send_all,
    stream_wait_send_all_might_not_block,
)

_SocketType = TrioSocketType

_MISSING = object()
# Where a trio socket registered as a listener keeps its registry entry,
# and the socketless links given to it.
_ENTRY = "_friendsock_listener"
_BACKLOG = "_friendsock_backlog"

_lock = threading.Lock()
_saved: Optional[Dict[Tuple[Any, str], Any]] = None  # None: not installed
_cancel_anyio_hook: Optional[Callable[[], None]] = None

# Set while anyio's create_tcp_listener runs: it makes its listening sockets
# itself, in this process, and hands them to from_stdlib_socket at once, so
# they are registered as trio's own are (exclusive unless SO_REUSEPORT says
# not): its clients pair from connect() on instead of waiting for a claim.
_anyio_makes_listeners: "contextvars.ContextVar[bool]" = contextvars.ContextVar(
    "friendsock_anyio_makes_listeners", default=False)


def _native(owner: Any, name: str) -> Any:
    """trio's own ``owner.name``, as saved at install."""
    saved = _saved
    if saved is not None:
        value = saved.get((owner, name), _MISSING)
        if value is not _MISSING:
            return value
    return getattr(owner, name)


# -- listeners ------------------------------------------------------------------


def listener_entry(trio_sock: Any, exclusive: bool = False) -> Optional[Entry]:
    """The registry entry of the listening trio socket ``trio_sock``,
    registered on first use (in a run; None outside one, for a socket that
    is no TCP listener, or with pairing switched off). ``exclusive``: the
    socket was made by trio in this process without SO_REUSEPORT (see
    ListenerEntry); one made elsewhere may be shared with another process."""
    entry = trio_sock.__dict__.get(_ENTRY)
    if entry is not None or native_calls.get() or not is_enabled():
        return entry
    sock = trio_sock._sock
    try:
        if not is_tcp_socket(sock) or not is_listening(sock):
            return None
        if exclusive and getattr(socket, "SO_REUSEPORT", None) is not None:
            exclusive = not sock.getsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT)
        state = run_state()
    except (OSError, RuntimeError):  # closed, or not in a run
        return None
    # A weak proxy: the registry must not keep its user's socket open.
    entry = register_listener(cast(socket.socket, weakref.proxy(sock)), state, owner=state.token,
                              exclusive=exclusive)
    trio_sock.__dict__[_ENTRY] = entry
    trio_sock.__dict__[_BACKLOG] = SocketlessBacklog.serving(entry, state.token)
    state.listeners[id(trio_sock)] = entry
    forget_when_collected(trio_sock, entry)
    return entry


def _forget(trio_sock: Any) -> None:
    stop_publishing(trio_sock)
    drop_held(trio_sock)
    entry = trio_sock.__dict__.pop(_ENTRY, None)
    if entry is not None:
        forget_listener(entry)


def _socket_listen(self: Any, *args: Any) -> None:
    listen_unregistered(self._sock, *args)
    # Made and bound by trio here: exclusive unless SO_REUSEPORT says not;
    # and accepted from by trio's accept, friendsock's: other processes'
    # connects may wait for its offer from its first.
    if listener_entry(self, exclusive=True) is not None:
        keep_published(self, self._sock)


def _socket_close(self: Any) -> None:
    _forget(self)
    _native(_SocketType, "close")(self)


def _socket_exit(self: Any, *exc_info: Any) -> None:
    # ``with sock:`` looks up __exit__ as it enters, before a connect in
    # the block makes the socket a friend: trio's own would close only the
    # real socket underneath, and the link's end would stay open.
    if type(self) is FriendTrioSocket:
        return self.__exit__(*exc_info)
    return _native(_SocketType, "__exit__")(self, *exc_info)


def _from_stdlib_socket(sock: socket.socket) -> Any:
    as_plain_socket(sock, "trio.socket.from_stdlib_socket()")
    # A blocking listener of the patched class goes on accepting here,
    # through friendsock: the connects already in its backlog (a client
    # quicker than the server's thread) stay friends, claimed by trio's
    # accept, instead of being reset as by a listener passed on.
    taken: Optional[Entry] = take_listener(sock)
    entry = None
    try:
        trio_sock = _pairing._trio_from_stdlib_socket(sock)
        if is_tcp_socket(sock):
            entry = listener_entry(trio_sock, exclusive=_anyio_makes_listeners.get() or
                                   (taken is not None and taken.exclusive))
    finally:
        if taken is not None and not (entry is not None and registry.move_listener(taken, entry)):
            listener_passed_on(taken)
    return trio_sock


_anyio_create_tcp_listener_native: Any = None  # anyio's own, found at the patch


async def _anyio_create_tcp_listener(*args: Any, **kwargs: Any) -> Any:
    token = _anyio_makes_listeners.set(True)
    try:
        return await _anyio_create_tcp_listener_native(*args, **kwargs)
    finally:
        _anyio_makes_listeners.reset(token)


def _patch_anyio(anyio: ModuleType) -> None:
    """The anyio patch, once anyio is imported (at install, if it was)."""
    global _anyio_create_tcp_listener_native
    with _lock:
        if _saved is not None and (anyio, "create_tcp_listener") not in _saved:
            # anyio's package finds its names lazily (a module __getattr__):
            # what to put back is "nothing", what to call is what it finds.
            _saved[(anyio, "create_tcp_listener")] = vars(anyio).get("create_tcp_listener", _MISSING)
            _anyio_create_tcp_listener_native = anyio.create_tcp_listener
            anyio.create_tcp_listener = _anyio_create_tcp_listener  # type: ignore[attr-defined]


# -- sockets that connect and accept themselves --------------------------------------


async def _socket_accept(self: Any) -> Tuple[Any, Any]:
    if not is_tcp_socket(self._sock) or native_calls.get():
        return await _native(_SocketType, "accept")(self)
    entry = listener_entry(self)
    published = keep_published(self, self._sock) if entry is not None else None
    held = await held_connection(self)  # (what a cancelled accept left, first)
    if held is not None:
        moved, conn, address = held
        if moved is not None:
            return moved, address
        not_a_friend(entry)
        return _pairing._trio_from_stdlib_socket(conn), address
    conn, address, link = await accept_connection(self._sock, entry, self.__dict__.get(_BACKLOG))
    if link is not None:  # socketless
        trio_sock = socketless_trio_socket(conn)
        become_friend(trio_sock, link.server, conn.getsockname(), address, run_state())
        return trio_sock, address
    pending, sockname = claim_connection(conn, address, entry)
    if pending is None:
        moved = None if published is None else await accept_across(self, conn, address, published)
        if moved is not None:
            return moved, address
        not_a_friend(entry)
    trio_sock = _pairing._trio_from_stdlib_socket(conn)
    if pending is not None:
        become_friend(trio_sock, pending.link.server, sockname, address, run_state())
        claimed(pending)
    return trio_sock, address


async def _socket_connect(self: Any, address: Any) -> None:
    native = _native(_SocketType, "connect")
    sock = self._sock
    if native_calls.get() or not is_enabled() or not is_tcp_socket(sock):
        return await native(self, address)
    try:
        await _pair_socket(self, sock, address, native)
    except trio.Cancelled:
        # As trio's own: a connect cut short leaves the socket in no state
        # to use, so it is closed.
        self._sock.close()
        raise


def _friend_in_place_of(self: Any, sock: socket.socket, made: Any) -> None:
    """The trio socket ``self`` becomes the client end of ``made`` (a link
    with a socket of its own: a socketless one's stand-in, or a kept
    connection's): the socket object stays the caller's, and its
    descriptor ``sock`` goes."""
    self._sock = made.handle.sock
    sock.close()
    client = made.handle
    become_friend(self, made.link.client, client.sockname, client.peername, run_state())


async def _pair_socket(self: Any, sock: socket.socket, address: Any, native: Any) -> None:
    resolved = await self._resolve_address_nocp(address, local=False)
    if not registry.has_port(resolved[1]):
        reason = Fallback.NO_LISTENER
        if may_cross(sock, resolved):
            if not worth_an_offer(resolved[1]):
                reason = Fallback.SHORT_LIVED
            elif await connect_across(self, resolved, native):
                return  # (to another friendsock process: moved off TCP, or not offered)
        counters.fallback(reason, resolved)
        return await native(self, resolved)
    sockname = users_sockname(sock)
    attempt = ConnectAttempt(resolved, source=None if sockname is None else sockname[0])
    if attempt.entry is None or sockname is None:  # None: closed, the native connect says so
        counters.fallback(Fallback.NO_LISTENER, resolved)
        return await native(self, resolved)
    attempt.sock = sock
    token = trio.lowlevel.current_trio_token()
    if socketless_entry(attempt.entry, is_bound(sockname)):
        await trio.lowlevel.checkpoint_if_cancelled()
        made = socketless_connect(attempt.entry, attempt.address,
                                  threaded=attempt.entry.owner is not token)
        _friend_in_place_of(self, sock, made)
        await trio.lowlevel.cancel_shielded_checkpoint()
        return
    # A connection a finished link left its listener (of this run) serves,
    # for a socket its user left as a new one (options that can be given
    # back aside, which go over with it): as for a socketless connect, the
    # socket object stays the caller's, and its descriptor goes.
    as_new = attempt.entry.owner is token and not is_bound(sockname) and set_as_a_new_socket(sock)
    if as_new:
        await trio.lowlevel.checkpoint_if_cancelled()
        reused = reused_connect(attempt.entry, attempt.address)
        if reused is not None:
            carry_options(sock, reused.handle.sock, reused.link.on_done)
            _friend_in_place_of(self, sock, reused)
            await trio.lowlevel.cancel_shielded_checkpoint()
            return
    attempt.bind_users_socket(sockname)
    if attempt.entry is None:  # not an address of ours
        counters.fallback(attempt.fallback, resolved)
        return await native(self, resolved)
    paired = await _pair(attempt, token, close_on_error=False)
    if paired is None:  # the listener just went away: nothing connected yet
        return await native(self, resolved)
    if paired:
        pending = attempt.pending
        assert pending is not None
        if as_new:
            # Its connection may be kept once the link is done, as a new
            # socket's: the options set before connect() are given back.
            restore_options_set_before_connect(sock, pending.link.on_done)
            offer_for_reuse(pending)
        client = pending.handle
        become_friend(self, pending.link.client, client.sockname, client.peername, run_state())


# -- install / uninstall ----------------------------------------------------------------


async def _stream_receive_some(self: trio.SocketStream, max_bytes: Optional[int] = None) -> bytes:
    sock = self.socket
    if type(sock) is FriendTrioSocket:
        return await stream_receive_some(sock, max_bytes)
    return await _native(trio.SocketStream, "receive_some")(self, max_bytes)


async def _stream_send_all(self: trio.SocketStream, data: Any) -> None:
    sock = self.socket
    if type(sock) is FriendTrioSocket:
        return await stream_send_all(self, sock, data)
    return await _native(trio.SocketStream, "send_all")(self, data)


async def _stream_wait_send_all_might_not_block(self: trio.SocketStream) -> None:
    sock = self.socket
    if type(sock) is FriendTrioSocket:
        return await stream_wait_send_all_might_not_block(self, sock)
    return await _native(trio.SocketStream, "wait_send_all_might_not_block")(self)


def _patches() -> List[Tuple[Any, str, Any]]:
    return [
        (trio.SocketStream, "receive_some", _stream_receive_some),
        (trio.SocketStream, "send_all", _stream_send_all),
        (trio.SocketStream, "wait_send_all_might_not_block", _stream_wait_send_all_might_not_block),
        (trio.socket, "from_stdlib_socket", _from_stdlib_socket),
        (_SocketType, "listen", _socket_listen),
        (_SocketType, "close", _socket_close),
        (_SocketType, "__exit__", _socket_exit),
        (_SocketType, "connect", _socket_connect),
        (_SocketType, "accept", _socket_accept),
    ]


def is_installed() -> bool:
    """Whether :func:`install` is in force."""
    return _saved is not None


def install() -> None:
    """From now on, in this process, unchanged trio code pairs: trio's own
    functions and sockets, and what is built on them (anyio's trio backend,
    hypercorn's trio worker, httpx on trio). Idempotent."""
    global _saved, _cancel_anyio_hook
    with _lock:
        if _saved is not None:
            return
        saved: Dict[Tuple[Any, str], Any] = {}
        for owner, name, value in _patches():
            saved[(owner, name)] = vars(owner).get(name, _MISSING)
            setattr(owner, name, value)
        _saved = saved
    # anyio is patched when the program imports it (now, if it has).
    _cancel_anyio_hook = when_imported("anyio", _patch_anyio)


def uninstall() -> None:
    """Undo :func:`install`: trio's own objects are back, exactly. Listeners
    registered meanwhile stop pairing as they close; links already made stay
    friends until closed."""
    global _saved, _cancel_anyio_hook
    cancel, _cancel_anyio_hook = _cancel_anyio_hook, None
    if cancel is not None:
        cancel()
    with _lock:
        saved = _saved
        if saved is None:
            return
        for (owner, name), value in saved.items():
            if value is _MISSING:
                delattr(owner, name)
            else:
                setattr(owner, name, value)
        _saved = None
