"""mkdocs hook: the build fails (under --strict) when a public name of
friendsock has no docstring, so the API reference never shows a blank."""

from __future__ import annotations

import inspect
import logging
from typing import Any, Iterator, Tuple

log = logging.getLogger("mkdocs.plugins.friendsock")

# The modules whose __all__ the API reference documents.
PUBLIC_MODULES = ("friendsock", "friendsock.trio")


def undocumented() -> Iterator[Tuple[str, str]]:
    """(module, name) of every public name, and every public member a
    public class of friendsock defines, without a docstring (its own or
    the one it overrides)."""
    import importlib

    for module_name in PUBLIC_MODULES:
        module = importlib.import_module(module_name)
        for name in module.__all__:
            obj = getattr(module, name)
            if not inspect.getdoc(obj):
                yield module_name, name
            if inspect.isclass(obj) and obj.__module__.startswith("friendsock"):
                for member in vars(obj):
                    if member.startswith("_"):
                        continue
                    value = getattr(obj, member)
                    if (callable(value) or isinstance(vars(obj)[member], property)) \
                            and not inspect.getdoc(value):
                        yield module_name, f"{name}.{member}"


def on_pre_build(config: Any) -> None:
    for module_name, name in undocumented():
        log.warning("%s.%s is public and has no docstring", module_name, name)
