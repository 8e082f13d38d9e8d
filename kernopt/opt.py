"""Opt, the unit of optimization a Kernel applies, its kinds (OptOps), and where a tensor core's axes sit
(TensorCoreOptions). Plain immutable data. Imports errors."""
from __future__ import annotations
import functools
import operator
from dataclasses import dataclass, replace
from enum import Enum, auto
from typing import Optional

from kernopt.errors import KernelOptError

_MAX = 1 << 31

class OptOps(Enum):
  """The kinds of Opt. Each moves part of an axis into another group of the loop nest (see Kernel.colors)."""
  TC = auto(); UPCAST = auto(); UPCASTMID = auto(); UNROLL = auto(); LOCAL = auto() # noqa: E702
  GROUP = auto(); GROUPTOP = auto(); NOLOCALS = auto(); PADTO = auto(); MERGE = auto() # noqa: E702
  def __lt__(self, other: OptOps) -> bool: return self.value < other.value

OptOps.__hash__ = object.__hash__  # type: ignore[method-assign]  # members are singletons: hash by identity

def _opt_key(o: Opt) -> tuple:
  op = o.op.value if isinstance(o.op, OptOps) else -1
  return (op, -1 if o.axis is None else o.axis, -1 if o.amt is None else o.amt)

@functools.total_ordering
@dataclass(frozen=True)
class Opt:
  """One optimization: `op` applied to `axis` (counted from the first reduce axis for UNROLL, from the first
  ungrouped reduce axis for GROUP/GROUPTOP; `Kernel.real_axis` resolves it) with amount `amt` (0: the whole axis)."""
  op: OptOps
  axis: Optional[int] = None
  amt: Optional[int] = None

  def __post_init__(self) -> None:
    if type(self.op) is not OptOps:
      raise KernelOptError(f"Opt op must be an OptOps member (e.g. OptOps.UPCAST), got {type(self.op).__name__} "
                           f"{self.op!r}")
    for name in ("axis", "amt"):
      v = getattr(self, name)
      if v is None or (type(v) is int and 0 <= v < _MAX): continue
      if isinstance(v, bool) or not hasattr(type(v), "__index__") or not 0 <= operator.index(v) < _MAX:
        raise KernelOptError(f"Opt {name} must be None or a non-negative int below 2**31, got {type(v).__name__} {v!r}")
      object.__setattr__(self, name, operator.index(v))

  def __repr__(self) -> str:
    return f"Opt(op=OptOps.{getattr(self.op, 'name', self.op)}, axis={self.axis}, amt={self.amt})"
  def __lt__(self, other: Opt) -> bool: return _opt_key(self) < _opt_key(other)

@dataclass(frozen=True)
class TensorCoreOptions:
  """Where the tensor core's N, M and K axes sit in the full shape; `axes_exist` says whether N and M still exist
  (an axis of size 1 is dropped), `axis_pads` the (axis, multiple) pads the match needed."""
  axes: tuple[int, ...]
  axes_exist: tuple[bool, ...]
  axis_pads: tuple[tuple[int, int], ...]

  def fix_axes(self, removed_axis: int) -> TensorCoreOptions:
    """The options after axis `removed_axis` was dropped from the shape."""
    axes, exist = list(self.axes), list(self.axes_exist)
    for d in range(2):
      if not exist[d]: continue
      if removed_axis < axes[d]: axes[d] -= 1
      elif removed_axis == axes[d]: exist[d] = False
    return replace(self, axes=tuple(axes), axes_exist=tuple(exist))
