"""anyio's TCP listeners on an installed loop pair from their first
connection.

anyio makes its listening socket itself and accepts with
``loop.sock_accept``, then ``connect_accepted_socket``: friendsock would
learn of the listener at its first accept, and a client that connects as
soon as the listener exists (the usual test, and the usual start-up)
would get TCP. Its asyncio backend's listener is known to accept only that
way, so it is registered as it is made, on a loop that routes through
friendsock (see ``_adoption.listener_for_sock_accept``).
"""

from __future__ import annotations

import asyncio
import functools
import threading
from types import ModuleType
from typing import Any

from .._imports import when_imported
from ._adoption import listener_for_sock_accept
from ._native import routes_through_friendsock

_lock = threading.Lock()
_watching = False


def watch_anyio() -> None:
    """Patch anyio's asyncio listener once it is imported (now, if it is).
    For the process's life: on a loop friendsock is not installed on, the
    patch does nothing."""
    global _watching
    with _lock:
        if _watching:
            return
        _watching = True
    when_imported("anyio._backends._asyncio", _patch_listener)


def _patch_listener(module: ModuleType) -> None:
    listener = getattr(module, "TCPSocketListener", None)
    native = getattr(listener, "__init__", None)
    if native is None or getattr(native, "_friendsock_native", None) is not None:
        return  # not the anyio this was written against, or patched already

    @functools.wraps(native)
    def __init__(self: Any, raw_socket: Any, *args: Any, **kwargs: Any) -> None:
        native(self, raw_socket, *args, **kwargs)
        try:
            loop = asyncio.get_running_loop()
        except RuntimeError:
            return
        if routes_through_friendsock(loop):
            listener_for_sock_accept(loop, raw_socket)

    __init__._friendsock_native = native  # type: ignore[attr-defined]
    setattr(listener, "__init__", __init__)
