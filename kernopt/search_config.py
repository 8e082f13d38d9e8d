"""What a search is asked and what it reports: `SearchConfig` (beam width, budget, validation, repeats, limits, the
build workers), `SearchStats` (what it built, timed, validated, rejected, pruned) and `SearchResult` (the best kernel
and its time against the standard protocol's). Imports errors, helpers and kernel."""
from __future__ import annotations
import math
import concurrent.futures as cf
from dataclasses import dataclass, field
from typing import Optional
from kernopt.errors import VerifyError
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
  max_upcast_size: int = 1024   # product of the upcasted axes (an AVX-512 matmul tile is 256: room to unroll it by 4)
  max_local_size: int = 1024    # threads in a workgroup (also capped by the dialect's max_local_size)
  seed: int = 0

  def __post_init__(self) -> None:
    def need(ok: bool, what: str, v: object) -> None:
      if not ok: raise VerifyError(f"SearchConfig.{what}, got {v!r}")
    def is_int(v: object) -> bool: return type(v) is int
    def is_num(v: object) -> bool: return type(v) in (int, float) and v == v   # (v == v: not NaN)
    need(self.beam is None or is_int(self.beam) and self.beam >= 1, "beam must be None or an int >= 1", self.beam)
    need(self.time_budget_s is None or is_num(self.time_budget_s) and self.time_budget_s > 0,
         "time_budget_s must be None or seconds > 0", self.time_budget_s)
    need(self.max_rounds is None or is_int(self.max_rounds) and self.max_rounds >= 0,
         "max_rounds must be None or an int >= 0", self.max_rounds)
    for name in ("repeats", "max_upcast_size", "max_local_size"):
      need(is_int(v := getattr(self, name)) and v >= 1, f"{name} must be an int >= 1", v)
    for name in ("workers", "patience", "seed"):
      need(is_int(v := getattr(self, name)) and v >= 0, f"{name} must be an int >= 0", v)
    for name in ("cutoff", "min_time_s", "min_progress"):
      need(is_num(v := getattr(self, name)) and v >= 0, f"{name} must be a number >= 0", v)
    need(is_num(v := self.compile_timeout_s) and 0 <= v < math.inf, "compile_timeout_s must be finite seconds >= 0", v)
    need(type(self.validate) is bool, "validate must be a bool", self.validate)
    need(self.executor is None or isinstance(self.executor, cf.Executor), "executor must be a concurrent.futures "
         "Executor or None", self.executor)

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
