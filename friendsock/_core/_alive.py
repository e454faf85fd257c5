"""The links established and not done yet, by weak reference, from the
moment they are established until their last end closes: the table must
not keep an abandoned link's transports alive (their collection is what
closes them). ``friendsock.links()`` reports them (``_live``)."""

from __future__ import annotations

import weakref
from typing import Dict, Generic, List, TypeVar

LinkT = TypeVar("LinkT")


class LiveLinks(Generic[LinkT]):
    """Established links with an end still open, in the order they were
    established. Adding and removing are single dict operations, atomic
    under the GIL, so ends on any thread need no lock."""

    __slots__ = ("_refs",)

    def __init__(self) -> None:
        self._refs: Dict[int, "weakref.ref[LinkT]"] = {}

    def add(self, link: LinkT) -> None:
        self._refs[id(link)] = weakref.ref(link)

    def discard(self, link: LinkT) -> None:
        ref = self._refs.get(id(link))
        if ref is not None and ref() is link:
            self._refs.pop(id(link), None)

    def links(self) -> List[LinkT]:
        found = []
        for key, ref in list(self._refs.items()):
            link = ref()
            if link is None:  # collected without closing (its process forked, say)
                if self._refs.get(key) is ref:
                    self._refs.pop(key, None)
            else:
                found.append(link)
        return found

    def _reset_after_fork(self) -> None:
        # The parent's links are not alive in a child (see Counters).
        self._refs = {}
