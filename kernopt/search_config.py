"""What a search is asked and what it reports: `SearchConfig` (beam width, budget, validation, repeats, limits, the
build workers), `SearchStats` (what it built, timed, validated, rejected, pruned) and `SearchResult` (the best kernel
and its time against the standard protocol's). Imports helpers and kernel."""
from __future__ import annotations
import concurrent.futures as cf
from dataclasses import dataclass, field
from typing import Optional
from kernopt.helpers import getconfig
from kernopt.kernel import Kernel

@dataclass(frozen=True)
class SearchConfig:
  """How a search runs. `beam` (None: the BEAM knob, else 2) candidates survive each round; the search stops when a
  round improves the best time by less than `min_progress` (relative; with a time budget, only when `patience` + 1
  rounds in a row do so, the last round's winners being the next beam), after `max_rounds`, or when `time_budget_s`
  (None: unlimited) is spent, returning the best kernel found so far. Each candidate runs `repeats` times (the
  minimum counts; more runs while they span under `min_time_s`), once when its first run is over `cutoff` times the
  best so far. With `validate`, a candidate can only win after its outputs on seeded random inputs match the
  unoptimized kernel's. Candidates are rendered and compiled by `executor` when given, else by a private pool of
  `workers` processes (0: in this process)."""
  beam: Optional[int] = None
  time_budget_s: Optional[float] = None
  validate: bool = True
  repeats: int = 3
  max_rounds: Optional[int] = None   # None: 12 without a time budget, no limit but the budget with one
  executor: Optional[cf.Executor] = field(default=None, compare=False)
  workers: int = 2
  progress: bool = False   # a progress bar (tqdm when installed, else a line per round) on stderr
  cutoff: float = 3.0
  min_time_s: float = 0.003
  compile_timeout_s: float = 10.0   # a candidate whose build takes longer is dropped (a CPU compiler is killed)
  min_progress: float = 0.01
  patience: int = 2   # with a time budget, rounds in a row that may fail to improve without ending the search
  max_upcast_size: int = 256    # product of the upcasted axes
  max_local_size: int = 1024    # threads in a workgroup (also capped by the dialect's max_local_size)
  seed: int = 0

  @property
  def width(self) -> int: return self.beam if self.beam is not None else (getconfig().BEAM or 2)

@dataclass
class SearchStats:
  """What a search did: candidates compiled, timed, validated, rejected by validation, failed to build or run,
  pruned by device limits; rounds; wall seconds; whether the budget cut it short."""
  compiled: int = 0
  timed: int = 0
  validated: int = 0
  rejected: int = 0
  failed: int = 0
  pruned: int = 0
  rounds: int = 0
  wall_s: float = 0.0
  out_of_budget: bool = False

@dataclass(frozen=True)
class SearchResult:
  """The best kernel found and its time; `baseline_s` is the standard protocol's (hand-coded) time in the same
  search (inf when the search started from a kernel that already had opts)."""
  kernel: Kernel
  time_s: float
  baseline_s: float
  validated: bool
  stats: SearchStats
