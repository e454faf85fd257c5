"""``FRIENDSOCK_INSTALL=1``: friendsock on for every asyncio and uvloop loop
(and for trio) of any Python program started in this environment, unchanged.

``friendsock.pth``, which installing friendsock puts in site-packages, is
run by Python's ``site`` module at every start-up; it only looks the
variable up and imports this module when it is set (not ``0``). This
patches the loop classes, and trio once the program imports it (as
``python -m friendsock run`` and the pytest plugin do), before the
program's first line, and reports at exit (on
stderr, unless no connection went through friendsock; ``FRIENDSOCK_REPORT``
says where: ``stderr``, ``json=FILE``, ``off``). ``FRIENDSOCK_SOCKETS=1``
as well patches the socket module too (``patch_socket()``, as ``run
--sockets``): blocking sockets, and tornado's and Twisted's.
"""

from __future__ import annotations

import os

from ._blocking._patch import patch_socket
from ._everywhere import install_everywhere
from ._core._switch import _OFF_VALUES
from ._report import report_at_exit, targets_from_environment


def wanted(name: str = "FRIENDSOCK_INSTALL") -> bool:
    return os.environ.get(name, "").strip().lower() not in _OFF_VALUES | {""}


if wanted():
    install_everywhere()
    if wanted("FRIENDSOCK_SOCKETS"):
        patch_socket()
    report_at_exit(targets_from_environment(os.environ.get("FRIENDSOCK_REPORT")), only_if_used=True)
