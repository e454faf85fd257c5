"""``install()``: route a loop's ``create_connection``/``create_server``
(and so ``asyncio.open_connection``, ``asyncio.start_server`` and every
library built on them) through friendsock.

A loop is patched on the instance, so ``uninstall()`` restores it exactly by
removing what was set; the pytest plugin patches loop classes instead, so
every loop a test session creates is covered. Either way friendsock's own
fallbacks reach the loop's original methods through :func:`native`.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
from typing import Any, Callable, Dict, Iterator, Optional, Union

_PATCHED = ("create_connection", "create_server")
_MISSING = object()
# Per patched loop: what its instance dict held before (usually nothing).
_INSTANCE_SAVED = "_friendsock_saved"
# Per patched class: its original methods.
_class_originals: Dict[type, Dict[str, Any]] = {}


def native(loop: asyncio.AbstractEventLoop, name: str) -> Callable[..., Any]:
    """The loop's own method ``name``, whatever friendsock patched."""
    saved = loop.__dict__.get(_INSTANCE_SAVED) if hasattr(loop, "__dict__") else None
    if saved is not None and saved.get(name, _MISSING) is not _MISSING:
        return saved[name]
    for klass in type(loop).__mro__:
        originals = _class_originals.get(klass)
        if originals is not None and name in originals:
            return originals[name].__get__(loop)
        if name in klass.__dict__:
            return klass.__dict__[name].__get__(loop)
    return getattr(loop, name)


def _installed_methods(loop: asyncio.AbstractEventLoop) -> Dict[str, Any]:
    from ._api import create_connection_on, create_server_on

    @functools.wraps(native(loop, "create_connection"))
    async def create_connection(protocol_factory: Any, host: Any = None, port: Any = None, **kwargs: Any) -> Any:
        return await create_connection_on(loop, protocol_factory, host, port, **kwargs)

    @functools.wraps(native(loop, "create_server"))
    async def create_server(protocol_factory: Any, host: Any = None, port: Any = None, **kwargs: Any) -> Any:
        return await create_server_on(loop, protocol_factory, host, port, **kwargs)

    return {"create_connection": create_connection, "create_server": create_server}


def _resolve(loop: Optional[asyncio.AbstractEventLoop], action: str) -> asyncio.AbstractEventLoop:
    if loop is None:
        try:
            return asyncio.get_running_loop()
        except RuntimeError:
            raise RuntimeError(
                f"{action}() without a loop needs a running event loop; pass loop="
            ) from None
    if not isinstance(loop, asyncio.AbstractEventLoop):
        raise TypeError(f"{action}() takes an asyncio event loop, not {type(loop).__name__!r}")
    return loop


def is_installed(loop: Optional[asyncio.AbstractEventLoop] = None) -> bool:
    """Whether ``loop`` (the running one by default) routes through friendsock."""
    loop = _resolve(loop, "is_installed")
    return _INSTANCE_SAVED in loop.__dict__ or any(
        klass in _class_originals for klass in type(loop).__mro__
    )


def install(loop: Optional[asyncio.AbstractEventLoop] = None) -> asyncio.AbstractEventLoop:
    """Make ``loop`` (the running one by default) pair friend links for every
    library on it. Idempotent; returns the loop."""
    loop = _resolve(loop, "install")
    if loop.is_closed():
        raise RuntimeError("install() on a closed event loop")
    if _INSTANCE_SAVED in loop.__dict__:
        return loop
    saved = {name: loop.__dict__.get(name, _MISSING) for name in _PATCHED}
    methods = _installed_methods(loop)
    loop.__dict__[_INSTANCE_SAVED] = saved
    for name, method in methods.items():
        setattr(loop, name, method)
    return loop


def uninstall(loop: Optional[asyncio.AbstractEventLoop] = None) -> None:
    """Undo :func:`install` on ``loop``; a loop never installed is left alone."""
    loop = _resolve(loop, "uninstall")
    saved = loop.__dict__.pop(_INSTANCE_SAVED, None)
    if saved is None:
        return
    for name, value in saved.items():
        if value is _MISSING:
            loop.__dict__.pop(name, None)
        else:
            setattr(loop, name, value)


def new_event_loop(
    base: Union[None, type, Callable[[], asyncio.AbstractEventLoop]] = None,
) -> asyncio.AbstractEventLoop:
    """A new loop with friendsock installed: ``base`` is a loop class or
    factory (``asyncio.new_event_loop`` by default, ``uvloop.new_event_loop``
    for uvloop). Fits ``asyncio.Runner(loop_factory=...)`` and ``asyncio.run``
    (``loop_factory=`` on 3.12+)."""
    loop = (base or asyncio.new_event_loop)()
    return install(loop)


@contextlib.contextmanager
def installed(loop: Optional[asyncio.AbstractEventLoop] = None) -> Iterator[asyncio.AbstractEventLoop]:
    """``with friendsock.installed():`` installs on entry, restores on exit
    (a loop that was already installed stays installed)."""
    loop = _resolve(loop, "installed")
    was_installed = _INSTANCE_SAVED in loop.__dict__
    install(loop)
    try:
        yield loop
    finally:
        if not was_installed:
            uninstall(loop)


def install_class(klass: type) -> None:
    """Patch a loop class, so every loop of it pairs (the pytest plugin's
    ``--friendsock``). Idempotent."""
    if klass in _class_originals:
        return
    from ._api import create_connection_on, create_server_on

    originals = {name: getattr(klass, name) for name in _PATCHED}
    _class_originals[klass] = originals

    @functools.wraps(originals["create_connection"])
    async def create_connection(self: Any, protocol_factory: Any, host: Any = None, port: Any = None, **kwargs: Any) -> Any:
        return await create_connection_on(self, protocol_factory, host, port, **kwargs)

    @functools.wraps(originals["create_server"])
    async def create_server(self: Any, protocol_factory: Any, host: Any = None, port: Any = None, **kwargs: Any) -> Any:
        return await create_server_on(self, protocol_factory, host, port, **kwargs)

    klass.create_connection = create_connection  # type: ignore[attr-defined]
    klass.create_server = create_server  # type: ignore[attr-defined]


def uninstall_class(klass: type) -> None:
    originals = _class_originals.pop(klass, None)
    if originals is None:
        return
    for name, method in originals.items():
        setattr(klass, name, method)
