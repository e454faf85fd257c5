"""Friend links everywhere in this process: every asyncio and uvloop loop,
and trio (with anyio on it) as soon as the program imports it. What
``python -m friendsock run``, ``FRIENDSOCK_INSTALL=1`` and the pytest plugin
switch on."""

from __future__ import annotations

from types import ModuleType
from typing import Callable, List

from ._asyncio._install import install_classes, uninstall_class
from ._imports import when_imported


def install_everywhere() -> Callable[[], None]:
    """Switch friendsock on process-wide; returns what switches it back off
    (what was on before stays on)."""
    patched = install_classes()
    trio_patched: List[bool] = []

    def install_trio(_: ModuleType) -> None:
        # The adapter's own module, not the friendsock.trio front door: a
        # program that imports friendsock.trio first imports trio from
        # there, and this runs while that module is still half made.
        from ._trio import _install as trio_install

        if not trio_install.is_installed():
            trio_install.install()
            trio_patched.append(True)

    cancel = when_imported("trio", install_trio)

    def uninstall() -> None:
        cancel()
        for klass in patched:
            uninstall_class(klass)
        if trio_patched:
            from ._trio import _install as trio_install

            trio_install.uninstall()
            trio_patched.clear()

    return uninstall
