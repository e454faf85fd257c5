"""anyio's TCP listeners on an installed loop pair from their first
connection.

anyio makes its listening socket itself and accepts with
``loop.sock_accept``, then ``connect_accepted_socket``: friendsock would
learn of the listener at its first accept, and a client that connects as
soon as the listener exists (the usual test, and the usual start-up)
would get TCP. A listener anyio's asyncio backend makes for
``anyio.create_tcp_listener`` (a socket anyio bound itself) accepts no
other way, so on a loop that routes through friendsock it is registered
as it is made (see ``_adoption.listener_for_sock_accept``), its port
published for friendsock clients of other processes, which its accepts
offer their connections to, and forgotten (and withdrawn) as it closes. A socket anyio only wraps (``SocketListener.from_socket``:
a pre-fork parent's, a supervisor's) may be shared with another process:
it is left to its first accept, as any listener friendsock did not see
made.
"""

from __future__ import annotations

import asyncio
import functools
import threading
from types import ModuleType
from typing import Any

from .._imports import when_imported
from ._adoption import forget_sock_accept_listener, listener_for_sock_accept
from ._native import routes_through_friendsock

_lock = threading.Lock()
_watching = False


def watch_anyio() -> None:
    """Patch anyio's asyncio backend once it is imported (now, if it is).
    For the process's life: on a loop friendsock is not installed on, the
    patch does nothing."""
    global _watching
    with _lock:
        if _watching:
            return
        _watching = True
    when_imported("anyio._backends._asyncio", _patch_backend)


def _patch_backend(module: ModuleType) -> None:
    backend = getattr(module, "AsyncIOBackend", None)
    listener = getattr(module, "TCPSocketListener", None)
    made = getattr(backend, "__dict__", {}).get("create_tcp_listener")
    native_aclose = getattr(listener, "aclose", None)
    if not isinstance(made, classmethod) or native_aclose is None or \
            getattr(made.__func__, "_friendsock_native", None) is not None:
        return  # not the anyio this was written against, or patched already
    native_make = made.__func__

    @functools.wraps(native_make)
    def create_tcp_listener(cls: Any, sock: Any) -> Any:
        made_listener = native_make(cls, sock)
        loop = asyncio.get_running_loop()  # (anyio's listener needs one)
        if routes_through_friendsock(loop):
            listener_for_sock_accept(loop, sock)
        return made_listener

    @functools.wraps(native_aclose)
    async def aclose(self: Any) -> None:
        raw = getattr(self, "_raw_socket", None)
        if raw is not None:
            forget_sock_accept_listener(raw)
        await native_aclose(self)

    create_tcp_listener._friendsock_native = native_make  # type: ignore[attr-defined]
    setattr(backend, "create_tcp_listener", classmethod(create_tcp_listener))
    setattr(listener, "aclose", aclose)
