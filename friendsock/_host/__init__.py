"""Between processes of this host: the port table where friendsock
processes find each other (``_table``), and the proof and messages of the
rendezvous that moves a connection off TCP (``_proof``). Neither touches an
event loop; each loop's side of the rendezvous lives with its adapter."""

from __future__ import annotations

from typing import Optional

from .._core._switch import is_cross_process, is_enabled
from ._proof import is_loopback
from ._table import CONNECTS, LISTENERS, PortTable, Slot

_table: Optional[PortTable] = None
_opened = False


def port_table() -> Optional[PortTable]:
    """This user's port table, or None when connections stay in-process:
    switched off, or no safe table to be had."""
    if not (is_enabled() and is_cross_process()):
        return None
    if not _opened:
        _open()
    return _table


def _open() -> None:
    global _table, _opened
    _opened = True
    _table = PortTable.open()


# Opened as friendsock is imported, not at a first connect: that one runs on
# an event loop, where opening a file is a blocking call (blockbuster, which
# aiohttp's and anyio's suites run, fails it).
if is_enabled() and is_cross_process():
    _open()


def opened_table() -> Optional[PortTable]:
    """The table if this process opened it, switched on or not now."""
    return _table


__all__ = ["CONNECTS", "LISTENERS", "PortTable", "Slot", "is_loopback", "opened_table", "port_table"]
