"""What the state machines of ``test_stateful`` write and how an end
records what it gets: shared with the server process of the machine that
runs across processes (``stateful_peer.py``).

Every stream is a slice of one block, at the stream's own offset, so a
lost, repeated or reordered piece shows: an end checks each piece as it
comes against the bytes due at that offset.
"""

from __future__ import annotations

import asyncio
import random
from typing import List, Optional

MiB = 1 << 20
_PERIOD = 65521
_BLOCK = (random.Random(0).randbytes(_PERIOD) * (MiB // _PERIOD + 2))[: MiB + _PERIOD]


def stream_bytes(offset: int, size: int) -> bytes:
    """Bytes ``offset`` to ``offset + size`` of every stream (at most 1 MiB)."""
    start = offset % _PERIOD
    return _BLOCK[start:start + size]


class Rec(asyncio.Protocol):
    """Records callbacks (consecutive data as one "data"), how many bytes
    came, and whether every one was the stream's byte at its offset."""

    def __init__(self, keep_open: bool, changed: asyncio.Event) -> None:
        self.keep_open = keep_open
        self.changed = changed
        self.events: List[str] = []
        self.received = 0
        self.intact = True  # every byte so far the stream's
        self.transport: Optional[asyncio.Transport] = None

    @property
    def lost(self) -> bool:
        return bool(self.events) and self.events[-1].startswith("lost")

    @property
    def eof(self) -> bool:
        return "eof" in self.events

    def note(self) -> None:
        """Something was recorded."""
        self.changed.set()

    def connection_made(self, transport) -> None:
        self.transport = transport
        self.events.append("made")
        self.note()

    def data_received(self, data: bytes) -> None:
        assert isinstance(data, bytes) and data
        if self.events[-1] != "data":
            self.events.append("data")
        if self.intact:
            # (Compared a period at a time: a slice of the block is at most
            # 1 MiB, a read may be more.)
            for start in range(0, len(data), _PERIOD):
                piece = data[start:start + _PERIOD]
                if piece != stream_bytes(self.received + start, len(piece)):
                    self.intact = False
                    break
        self.received += len(data)
        self.note()

    def eof_received(self):
        self.events.append("eof")
        self.note()
        return self.keep_open

    def connection_lost(self, exc) -> None:
        self.events.append(f"lost:{type(exc).__name__ if exc else None}")
        self.note()
