"""``install()``: route a loop's ``create_connection``/``create_server``
(and so ``asyncio.open_connection``, ``asyncio.start_server`` and every
library built on them) through friendsock, its ``start_tls`` (so
``StreamWriter.start_tls()`` and STARTTLS libraries work over friend links,
uvloop's included), and its ``sock_connect``/``sock_accept``/
``connect_accepted_socket`` (so sockets that libraries connect or accept
themselves pair too, see ``_adoption``).

A loop is patched on the instance, so ``uninstall()`` restores it exactly by
removing what was set; the pytest plugin patches loop classes instead, so
every loop a test session creates is covered. Either way friendsock's own
fallbacks reach the loop's original methods through :func:`native`.
"""

from __future__ import annotations

import asyncio
from asyncio import selector_events
import contextlib
import functools
from typing import Any, Callable, Coroutine, Dict, Iterator, List, Optional, Union

from ._adoption import adopt_connected, connect_accepted_socket, sock_accept, sock_connect
from ._anyio import watch_anyio
from ._api import create_connection_on, create_server_on
from ._native import (
    _INSTANCE_SAVED,
    _MISSING,
    _PATCHED,
    _class_patches,
    _ClassPatch,
    in_class_wrapper,
    is_class_patched,
    native,
    routes_through_friendsock,
)
from ._tls import start_tls as start_tls_on

def _create_connection(loop: asyncio.AbstractEventLoop, protocol_factory: Any,
                       host: Any = None, port: Any = None, **kwargs: Any) -> Coroutine[Any, Any, Any]:
    # (The coroutine of the call that serves it, not one more around it:
    # every connect to a peer without friendsock goes through here.)
    sock = kwargs.get("sock")
    if sock is not None and host is None and port is None:
        return _create_connection_with(loop, protocol_factory, sock, kwargs)
    return create_connection_on(loop, protocol_factory, host, port, **kwargs)


async def _create_connection_with(loop: asyncio.AbstractEventLoop, protocol_factory: Any,
                                  sock: Any, kwargs: Dict[str, Any]) -> Any:
    """``create_connection(sock=)``: the socket's link if it was connected
    through this loop's ``sock_connect``, else as any other."""
    adopted = await adopt_connected(loop, protocol_factory, sock, kwargs)
    if adopted is not None:
        return adopted
    return await create_connection_on(loop, protocol_factory, None, None, **kwargs)


# What each patched method runs, as ``implementation(loop, *args, **kwargs)``.
_IMPLEMENTATIONS: Dict[str, Callable[..., Coroutine[Any, Any, Any]]] = {
    "create_connection": _create_connection,
    "create_server": create_server_on,
    "start_tls": start_tls_on,
    "sock_connect": sock_connect,
    "sock_accept": sock_accept,
    "connect_accepted_socket": connect_accepted_socket,
}
assert set(_IMPLEMENTATIONS) == set(_PATCHED)


def _installed_methods(loop: asyncio.AbstractEventLoop) -> Dict[str, Any]:
    def method_for(name: str, implementation: Callable[..., Coroutine[Any, Any, Any]]) -> Any:
        @functools.wraps(native(loop, name))
        async def method(*args: Any, **kwargs: Any) -> Any:
            return await implementation(loop, *args, **kwargs)

        return method

    return {name: method_for(name, implementation) for name, implementation in _IMPLEMENTATIONS.items()}


def _resolve(loop: Optional[asyncio.AbstractEventLoop], action: str) -> asyncio.AbstractEventLoop:
    if loop is None:
        try:
            return asyncio.get_running_loop()
        except RuntimeError:
            raise RuntimeError(
                f"friendsock.{action}() needs a running event loop: call it from a "
                f"coroutine, or pass the loop (friendsock.{action}(loop))"
            ) from None
    if not isinstance(loop, asyncio.AbstractEventLoop):
        raise TypeError(
            f"friendsock.{action}() takes an asyncio event loop, not {type(loop).__name__!r}"
        )
    return loop


def is_installed(loop: Optional[asyncio.AbstractEventLoop] = None) -> bool:
    """Whether ``loop`` (the running one by default) routes through friendsock."""
    return routes_through_friendsock(_resolve(loop, "is_installed"))


def install(loop: Optional[asyncio.AbstractEventLoop] = None) -> asyncio.AbstractEventLoop:
    """Make ``loop`` (the running one by default) pair friend links for every
    library on it. Idempotent; returns the loop."""
    loop = _resolve(loop, "install")
    if loop.is_closed():
        raise RuntimeError(f"friendsock.install() on a closed event loop: {loop!r}")
    instance_dict = getattr(loop, "__dict__", None)
    if instance_dict is None:
        raise TypeError(
            f"friendsock.install() can not patch {type(loop).__name__!r} instances (no __dict__); "
            f"use friendsock.create_connection/create_server instead"
        )
    if _INSTANCE_SAVED in instance_dict:
        return loop
    watch_anyio()
    saved = {name: instance_dict.get(name, _MISSING) for name in _PATCHED}
    methods = _installed_methods(loop)
    instance_dict[_INSTANCE_SAVED] = saved
    instance_dict.update(methods)
    return loop


def uninstall(loop: Optional[asyncio.AbstractEventLoop] = None) -> None:
    """Undo :func:`install` on ``loop``; a loop never installed is left alone."""
    loop = _resolve(loop, "uninstall")
    instance_dict = getattr(loop, "__dict__", {})
    saved = instance_dict.pop(_INSTANCE_SAVED, None)
    if saved is None:
        return
    for name, value in saved.items():
        if value is _MISSING:
            instance_dict.pop(name, None)
        else:
            instance_dict[name] = value


def new_event_loop(
    base: Union[None, type, Callable[[], asyncio.AbstractEventLoop]] = None,
) -> asyncio.AbstractEventLoop:
    """A new loop with friendsock installed: ``base`` is a loop class or
    factory (``asyncio.new_event_loop`` by default, ``uvloop.new_event_loop``
    for uvloop). Fits ``asyncio.Runner(loop_factory=...)`` and ``asyncio.run``
    (``loop_factory=`` on 3.12+)."""
    if base is not None and not callable(base):
        raise TypeError(
            f"friendsock.new_event_loop() takes a loop class or factory, not {type(base).__name__!r}"
        )
    loop = (base or asyncio.new_event_loop)()
    try:
        return install(loop)
    except BaseException:
        close = getattr(loop, "close", None)
        if callable(close):
            close()
        raise


@contextlib.contextmanager
def installed(loop: Optional[asyncio.AbstractEventLoop] = None) -> Iterator[asyncio.AbstractEventLoop]:
    """``with friendsock.installed():`` installs on entry, restores on exit
    (a loop that was already installed stays installed)."""
    loop = _resolve(loop, "installed")
    was_installed = _INSTANCE_SAVED in getattr(loop, "__dict__", {})
    install(loop)
    try:
        yield loop
    finally:
        if not was_installed:
            uninstall(loop)


def install_class(klass: type) -> None:
    """Patch a loop class, so every loop of it pairs (the pytest plugin's
    ``--friendsock``). Idempotent."""
    if not (isinstance(klass, type) and issubclass(klass, asyncio.AbstractEventLoop)):
        raise TypeError(f"friendsock.install_class() takes an event loop class, not {klass!r}")
    if klass in _class_patches:
        return
    watch_anyio()
    patch = _ClassPatch(klass)

    def method_for(name: str, implementation: Callable[..., Coroutine[Any, Any, Any]]) -> Any:
        @functools.wraps(patch.originals[name])
        async def method(self: Any, *args: Any, **kwargs: Any) -> Any:
            return await in_class_wrapper(implementation(self, *args, **kwargs), self, klass)

        return method

    _class_patches[klass] = patch
    for name, implementation in _IMPLEMENTATIONS.items():
        setattr(klass, name, method_for(name, implementation))


def uninstall_class(klass: type) -> None:
    """Undo :func:`install_class`; a class never patched is left alone."""
    patch = _class_patches.pop(klass, None)
    if patch is None:
        return
    for name, value in patch.own.items():
        if value is _MISSING:
            delattr(klass, name)
        else:
            setattr(klass, name, value)


def loop_classes() -> List[type]:
    """The loop classes that cover every asyncio loop a program can make:
    the stdlib's selector loops and ``uvloop.Loop`` when uvloop is
    installed. ``BaseSelectorEventLoop``, not ``BaseEventLoop``: it defines
    its own ``sock_connect``/``sock_accept``, which a patch of its base
    would never reach."""
    classes: List[type] = [selector_events.BaseSelectorEventLoop]
    try:
        import uvloop
    except ImportError:
        pass
    else:
        classes.append(uvloop.Loop)
    return classes


def every_loop_installed() -> bool:
    """Whether every loop the process can make routes through friendsock
    (:func:`install_classes`): none of them takes a socket over natively.
    (The stdlib's class first: no import of uvloop where it is not.)"""
    return is_class_patched(selector_events.BaseSelectorEventLoop) and \
        all(is_class_patched(klass) for klass in loop_classes())


def install_classes() -> List[type]:
    """Patch every loop class of :func:`loop_classes` (:func:`install_class`),
    so every loop the process makes pairs, in any thread, however made
    (``asyncio.run``, ``asyncio.Runner``, uvloop's ``run``/``install``).
    Returns the classes this call patched (:func:`uninstall_class` undoes)."""
    patched = []
    for klass in loop_classes():
        if not is_class_patched(klass):
            install_class(klass)
            patched.append(klass)
    return patched
