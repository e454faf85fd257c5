"""What ``fork()`` does to friendsock: one registration with the
interpreter (``os.register_at_fork``), calling each part that holds
process state, in the order :class:`Part` gives.

A part registers its hooks with :func:`on_fork` as its module is imported;
the order does not depend on which module is imported first. After the
fork, parent and child run the parts in :class:`Part`'s order (what later
parts rely on comes first: the child's own pid before anything that asks
whose a socket is); before it, the reverse. As the interpreter does for
each callable registered with it, a hook that raises has its error printed
and the others still run.
"""

from __future__ import annotations

import enum
import os
import sys
import traceback
from typing import Callable, Dict, Optional, Tuple

Hook = Optional[Callable[[], None]]


class Part(enum.IntEnum):
    """The parts, in the order their hooks run after a fork."""

    # The counters (stats()): a child counts from zero.
    STATS = 1
    # The live links (links()): none of them is the child's.
    LIVE_LINKS = 2
    # Listeners and pending connects: a child pairs with none it inherited;
    # the parent's listeners are shared with the child from now on.
    REGISTRY = 3
    # The pid that owns the real sockets (whose close is whose).
    PROCESS = 4
    # The thread that closes what the collector finds: the parent's.
    FINALIZING = 5
    # Blocking sockets' readiness descriptors and the parkers' wake-ups.
    READINESS = 6
    # Links between blocking sockets: moved to TCP before the fork
    # (its lock held through it), their stale ends cut off in the child.
    BLOCKING = 7
    # Capture files: a child writes nothing into its parent's.
    CAPTURE = 8
    # The ends of links to other processes (links()): the child's copies
    # are the parent's connections, not the child's.
    LIVE_ACROSS = 9
    # Blocking sockets' rendezvous with other processes: its thread is not
    # the child's, and its sockets are copies the child closes.
    ACROSS_THREAD = 10


_hooks: Dict[Part, Tuple[Hook, Hook, Hook]] = {}


def on_fork(part: Part, *, before: Hook = None, after_in_parent: Hook = None,
            after_in_child: Hook = None) -> None:
    """Have ``part``'s hooks run at every fork (as ``os.register_at_fork``'s
    arguments of the same names), in its place in :class:`Part`'s order."""
    _hooks[part] = (before, after_in_parent, after_in_child)


def _run(which: int, reverse: bool = False) -> None:
    for part in sorted(_hooks, reverse=reverse):
        hook = _hooks[part][which]
        if hook is None:
            continue
        try:
            hook()
        except BaseException:  # as the interpreter reports an at-fork callable's
            print(f"Exception ignored in friendsock's fork hook {part.name}:", file=sys.stderr)
            traceback.print_exc()


def _before() -> None:
    _run(0, reverse=True)


def _after_in_parent() -> None:
    _run(1)


def _after_in_child() -> None:
    _run(2)


if hasattr(os, "register_at_fork"):
    os.register_at_fork(before=_before, after_in_parent=_after_in_parent,
                        after_in_child=_after_in_child)
