"""What came out of a run: each cell's rounds and their statistics (a
cell's figure is the median of its rounds), and the run that holds every
cell with the run's notes and timings."""

from __future__ import annotations

import dataclasses
import statistics
from typing import Dict, List, Optional, Tuple

from ._plan import Case, Config
from ._samples import Sample


@dataclasses.dataclass
class Cell:
    values: List[float] = dataclasses.field(default_factory=list)
    # None: not the friends transport (or nothing measured); else whether
    # every round's figure came from friend links.
    friend_verified: Optional[bool] = None
    error: Optional[str] = None
    notes: List[str] = dataclasses.field(default_factory=list)

    def add(self, sample: Sample) -> None:
        self.values.append(sample.value)
        if sample.friend_ok is not None:
            self.friend_verified = sample.friend_ok if self.friend_verified is None \
                else self.friend_verified and sample.friend_ok
        if sample.note and sample.note not in self.notes:
            self.notes.append(sample.note)

    @property
    def median(self) -> Optional[float]:
        return statistics.median(self.values) if self.values else None

    @property
    def min(self) -> Optional[float]:
        return min(self.values) if self.values else None

    @property
    def max(self) -> Optional[float]:
        return max(self.values) if self.values else None


CellKey = Tuple[str, int, str, str]  # case key, parameter, loop, transport


@dataclasses.dataclass
class Run:
    config: Config
    cases: List[Case]
    cells: Dict[CellKey, Cell] = dataclasses.field(default_factory=dict)
    notes: List[str] = dataclasses.field(default_factory=list)
    elapsed: float = 0.0
    # Wall time per test (--tests name), both loops together.
    timings: Dict[str, float] = dataclasses.field(default_factory=dict)
    interrupted: bool = False

    def cell(self, case: str, param: int, loop: str, transport: str) -> Optional[Cell]:
        return self.cells.get((case, param, loop, transport))

    def note(self, text: str) -> None:
        if text not in self.notes:
            self.notes.append(text)
