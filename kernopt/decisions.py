"""What a heuristic chose and why: a `Decision` per step (the rule, the values that decided it, the Opt or none, a
reason), the `Explanation` a kernel's trace reads as, and `decide` / `apply` / `try_apply`, which record them.
Plain data and three functions of any kernel that records. Imports errors and opt."""
from __future__ import annotations
from dataclasses import dataclass
from types import MappingProxyType
from typing import Any, Iterator, Mapping, Optional, Protocol
from kernopt.errors import KernelOptError
from kernopt.opt import Opt

@dataclass(frozen=True)
class Decision:
  """One step of a heuristic: `rule` (a name in some module's RULES), `facts` (the values that decided it, taken from
  the kernel before `opt` was applied: full_shape always; axis is an axis of the full shape, size its size there,
  strides every tracker's last-view stride on it, buffer_strides every buffer's real stride on it ignoring masks),
  the Opt applied (None: none) and a one-line reason."""
  rule: str
  facts: Mapping[str, Any]
  opt: Optional[Opt]
  reason: str

  def __post_init__(self) -> None: object.__setattr__(self, "facts", MappingProxyType(dict(self.facts)))
  def __hash__(self) -> int: return hash((self.rule, tuple(self.facts.items()), self.opt, self.reason))

  def __str__(self) -> str:
    opt = "-" if self.opt is None else f"{self.opt.op.name}" + \
      "".join(f" {k}={v}" for k, v in (("axis", self.opt.axis), ("amt", self.opt.amt)) if v is not None)
    facts = " ".join(f"{k}={show(v)}" for k, v in self.facts.items())
    return f"{self.rule:<24} {opt:<22} {self.reason}  [{facts}]"

def show(v: Any) -> str:
  """A fact as a decision prints it: symbolic sizes rendered, tuples without spaces."""
  if isinstance(v, tuple): return "(" + ",".join(show(x) for x in v) + ")"
  return v.render() if hasattr(v, "render") else str(v)

@dataclass(frozen=True)
class Explanation:
  """The decisions that shaped a kernel, in the order they were made. Applying `opts` in order to a fresh Kernel of
  the same AST and renderer gives the same `applied_opts`."""
  decisions: tuple[Decision, ...]

  @property
  def opts(self) -> tuple[Opt, ...]: return tuple(d.opt for d in self.decisions if d.opt is not None)
  @property
  def rules(self) -> tuple[str, ...]: return tuple(d.rule for d in self.decisions)
  def __iter__(self) -> Iterator[Decision]: return iter(self.decisions)
  def __len__(self) -> int: return len(self.decisions)
  def __str__(self) -> str: return "\n".join(str(d) for d in self.decisions)

class Recording(Protocol):
  """What the three functions below need of a kernel (the Kernel is one)."""
  @property
  def full_shape(self) -> tuple[Any, ...]: ...
  def record(self, decision: Decision) -> None: ...
  def apply_opt(self, opt: Opt) -> Any: ...

def decide(k: Recording, rule: str, reason: str, **facts: Any) -> None:
  """Record that `rule` chose no Opt, and why (full_shape is added to facts)."""
  k.record(Decision(rule, {"full_shape": k.full_shape, **facts}, None, reason))

def apply(k: Recording, rule: str, opt: Opt, reason: str, **facts: Any) -> None:
  """Apply opt (KernelOptError propagates, nothing recorded) and record the decision with the facts before it."""
  shape = k.full_shape
  k.apply_opt(opt)
  k.record(Decision(rule, {"full_shape": shape, **facts}, opt, reason))

def try_apply(k: Recording, rule: str, opt: Opt, reason: str, **facts: Any) -> bool:
  """`apply`, False (k unchanged, nothing recorded) when the kernel refuses opt."""
  try: apply(k, rule, opt, reason, **facts)
  except KernelOptError: return False
  return True
