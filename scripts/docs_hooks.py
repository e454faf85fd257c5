"""mkdocs hook: the build fails (under --strict) when a public name of
friendsock has no docstring, so the API reference never shows a blank."""

from __future__ import annotations

import inspect
import logging
from typing import Any, Iterator, Tuple

log = logging.getLogger("mkdocs.plugins.friendsock")

# The modules whose __all__ the API reference documents, and the pytest
# plugin's names it documents besides (the plugin has no __all__: pytest
# reads its hooks by name).
PUBLIC_MODULES = ("friendsock", "friendsock.trio")
PLUGIN_NAMES = ("friendsock", "FriendsockFixture", "friendsock_server")


def undocumented() -> Iterator[Tuple[str, str]]:
    """(module, name) of every public name, and every public member a
    public class of friendsock defines, without a docstring (its own or
    the one it overrides)."""
    import importlib

    modules = [(name, importlib.import_module(name).__all__) for name in PUBLIC_MODULES]
    modules.append(("friendsock.pytest_plugin", PLUGIN_NAMES))
    for module_name, names in modules:
        module = importlib.import_module(module_name)
        for name in names:
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
