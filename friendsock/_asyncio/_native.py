"""The loop's own methods behind friendsock's patches: what :func:`native`
returns, and the record of every patch (instance and class) it reads.

Fallbacks everywhere reach the loop through here, so this module imports
nothing of friendsock's: the patches' wrappers (``_install``) call into the
API, and the API calls back through this, with no import circle."""

from __future__ import annotations

import asyncio
import contextvars
import types
from typing import Any, Callable, Coroutine, Dict, Generator, Optional, Tuple

_PATCHED = ("create_connection", "create_server", "start_tls", "sock_connect", "sock_accept",
            "connect_accepted_socket")
_MISSING = object()
# Per patched loop: what its instance dict held before (usually nothing).
_INSTANCE_SAVED = "_friendsock_saved"


class _ClassPatch:
    """What :func:`install_class` replaced on one class."""

    __slots__ = ("klass", "originals", "own")

    def __init__(self, klass: type) -> None:
        self.klass = klass
        # What the class resolved each name to when patched (maybe inherited).
        self.originals: Dict[str, Any] = {name: getattr(klass, name) for name in _PATCHED}
        # What the class's own __dict__ held, so uninstall_class restores it
        # exactly (an inherited method must not become an own attribute).
        self.own: Dict[str, Any] = {name: klass.__dict__.get(name, _MISSING) for name in _PATCHED}

    def original(self, name: str) -> Any:
        """The method the class would have without the patch. An inherited
        one is looked up now, not when patched: a base class's method
        replaced later (a test's ``mock.patch.object(asyncio.BaseEventLoop,
        'create_connection')``) must be what the loop's fallback calls."""
        own = self.own[name]
        if own is not _MISSING:
            return own
        for base in self.klass.__mro__[1:]:
            patch = _class_patches.get(base)
            if patch is not None:
                return patch.original(name)
            if name in base.__dict__:
                return base.__dict__[name]
        return self.originals[name]


_class_patches: Dict[type, _ClassPatch] = {}

# Set while a class-level wrapper runs for (loop, patched class): a subclass
# that overrides create_connection and calls super() lands in that wrapper,
# and its fallback must go on to the patched class's original, not back to
# the subclass's override (which would recurse without end).
_class_wrapper_context: contextvars.ContextVar[Optional[Tuple[Any, type]]] = contextvars.ContextVar(
    "friendsock_class_wrapper", default=None
)


@types.coroutine
def in_class_wrapper(coro: Coroutine[Any, Any, Any], loop: Any, klass: type) -> Generator[Any, Any, Any]:
    """Await ``coro``, a class-level wrapper's implementation, with
    ``_class_wrapper_context`` set during each of its steps, not across
    them: a coroutine driven by hand (``coro.send()`` from a callback) may
    be resumed in another Context than the one it started in, where a
    token from the first can not be reset, and the first must not keep
    the setting."""
    value = (loop, klass)
    sent: Any = None
    error: Optional[BaseException] = None
    while True:
        token = _class_wrapper_context.set(value)
        try:
            yielded = coro.send(sent) if error is None else coro.throw(error)
        except StopIteration as stop:
            return stop.value
        finally:
            # Not kept: a traceback through this frame would hold the error
            # it carries (a cycle that keeps every frame's locals alive).
            error = None
            _class_wrapper_context.reset(token)
        try:
            sent, error = (yield yielded), None
        except GeneratorExit:
            coro.close()
            raise
        except BaseException as exc:
            sent, error = None, exc
        # Nor the future it passed on: done with an error, it holds that
        # error, whose traceback holds this frame.
        yielded = None


def _bound(attribute: Any, loop: Any) -> Callable[..., Any]:
    """``attribute``, found in a class's ``__dict__``, as ``loop.<name>``
    would give it: bound if a descriptor, as it is if not (a mock)."""
    if type(attribute) is types.FunctionType:  # (asyncio's own: the common case, made quick)
        return types.MethodType(attribute, loop)
    get = getattr(type(attribute), "__get__", None)
    return attribute if get is None else get(attribute, loop, type(loop))


def native(loop: asyncio.AbstractEventLoop, name: str) -> Callable[..., Any]:
    """The loop's own method ``name``, whatever friendsock patched."""
    instance = getattr(loop, "__dict__", {})
    saved = instance.get(_INSTANCE_SAVED)
    if saved is not None and saved.get(name, _MISSING) is not _MISSING:
        return saved[name]
    if not _class_patches:
        # The class's own, as the walk below finds it (looked up now: a test
        # may mock it), by the interpreter's cached lookup: every connect to
        # a peer without friendsock comes through here.
        if name not in instance:
            return getattr(loop, name)
        return _bound(getattr(type(loop), name), loop)
    current = _class_wrapper_context.get()
    if current is not None and current[0] is loop:
        patch = _class_patches.get(current[1])
        if patch is not None:
            return _bound(patch.original(name), loop)
    for klass in type(loop).__mro__:
        patch = _class_patches.get(klass)
        if patch is not None:
            return _bound(patch.original(name), loop)
        if name in klass.__dict__:
            return _bound(klass.__dict__[name], loop)
    return getattr(loop, name)


def is_class_patched(klass: type) -> bool:
    """Whether :func:`install_class` patched ``klass`` itself."""
    return klass in _class_patches


def routes_through_friendsock(loop: Any) -> bool:
    """Whether ``loop`` is installed: itself, or by its class."""
    return _INSTANCE_SAVED in getattr(loop, "__dict__", {}) or bool(_class_patches) and any(
        klass in _class_patches for klass in type(loop).__mro__
    )


def is_uvloop(loop: Any) -> bool:
    """Whether ``loop`` is uvloop's (or of a subclass defined there)."""
    return type(loop).__module__.partition(".")[0] == "uvloop"


# Loop class -> whether its own create_connection may call the loop's
# sock_connect (asyncio's does, in Python; uvloop's connects in C).
_own_connect_calls_sock_connect: Dict[type, bool] = {}


def own_connect_calls_sock_connect(loop: Any) -> bool:
    """Whether ``loop``'s own ``create_connection`` may call its (installed)
    ``sock_connect``; any loop but uvloop's may."""
    calls = _own_connect_calls_sock_connect.get(type(loop))
    if calls is None:
        calls = _own_connect_calls_sock_connect[type(loop)] = not is_uvloop(loop)
    return calls


# Set while friendsock runs the loop's own create_connection: the loop's
# inner sock_connect is its own business, not a socket to adopt later.
_own_connects: contextvars.ContextVar[bool] = contextvars.ContextVar(
    "friendsock_loop_own_connects", default=False
)


class loop_own_connects:
    """Around a call of the loop's own ``create_connection``. (A class, not
    a generator: it is around every connect to a peer without friendsock.)"""

    __slots__ = ("_token",)

    def __enter__(self) -> None:
        self._token = _own_connects.set(True)

    def __exit__(self, *exc_info: Any) -> None:
        try:
            _own_connects.reset(self._token)
        except ValueError:
            # The connect's coroutine closed outside its task's context (by
            # the garbage collector, say): that context is gone with it.
            pass


def in_loop_own_connect() -> bool:
    return _own_connects.get()
