"""Run a function once a module is imported, without importing it.

Switching friendsock on process-wide (``run``, ``FRIENDSOCK_INSTALL``, the
pytest plugin) must cover trio when the program uses it, and must not make
every program pay for importing trio: the trio patches go in as trio itself
is imported (at once when it already was).
"""

from __future__ import annotations

import importlib.machinery
import sys
import threading
from types import ModuleType
from typing import TYPE_CHECKING, Any, Callable, Dict, List, Optional, Sequence, cast

if TYPE_CHECKING:
    import importlib.abc

Hook = Callable[[ModuleType], None]

_lock = threading.RLock()
_hooks: Dict[str, List[Hook]] = {}


# The finder and the loader below are not importlib.abc's subclasses: that
# module imports importlib.resources, tempfile and shutil (some 4 ms) into
# every process friendsock is switched on in.
class _HookedLoader:
    """The module's own loader, and the hooks once it has run."""

    def __init__(self, loader: Any, name: str) -> None:
        self._loader = loader
        self._name = name

    def create_module(self, spec: importlib.machinery.ModuleSpec) -> Optional[ModuleType]:
        return self._loader.create_module(spec)

    def exec_module(self, module: ModuleType) -> None:
        # The module's own loader, as if nobody had been watching.
        module.__loader__ = module.__spec__.loader = self._loader  # type: ignore[union-attr]
        self._loader.exec_module(module)
        _run_hooks(self._name, module)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._loader, name)


class _Finder:
    def find_spec(self, fullname: str, path: Optional[Sequence[str]],
                  target: Optional[ModuleType] = None) -> Optional[importlib.machinery.ModuleSpec]:
        if fullname not in _hooks:
            return None
        for finder in sys.meta_path:
            if finder is self or not hasattr(finder, "find_spec"):
                continue
            spec = finder.find_spec(fullname, path, target)
            if spec is not None:
                if spec.loader is not None and hasattr(spec.loader, "exec_module"):
                    spec.loader = cast("importlib.abc.Loader", _HookedLoader(spec.loader, fullname))
                return spec
        return None


_finder = _Finder()


def _run_hooks(name: str, module: ModuleType) -> None:
    with _lock:
        hooks = _hooks.pop(name, [])
        if not _hooks and _finder in sys.meta_path:
            sys.meta_path.remove(_finder)
    for hook in hooks:
        hook(module)


def when_imported(name: str, hook: Hook) -> Callable[[], None]:
    """Call ``hook(module)`` once the module ``name`` is imported: now, if it
    is already. Returns a function that cancels a hook not yet called."""
    with _lock:
        module = sys.modules.get(name)
        if module is None:
            _hooks.setdefault(name, []).append(hook)
            if _finder not in sys.meta_path:
                sys.meta_path.insert(0, _finder)
    if module is not None:
        hook(module)

    def cancel() -> None:
        with _lock:
            waiting = _hooks.get(name, [])
            if hook in waiting:
                waiting.remove(hook)
                if not waiting:
                    del _hooks[name]
            if not _hooks and _finder in sys.meta_path:
                sys.meta_path.remove(_finder)

    return cancel
