"""The lazy graph under a Tensor: every op makes a `Lazy` node, nothing runs until `realize` (schedule.py).

A node is a BUFFER (values held in a kernopt Buffer, contiguous in the node's shape), a CONST, an ALU op of nodes
of one shape, a REDUCE (keep-dims: the reduced axes become 1) or a VIEW (a ShapeTracker from its source's shape to
its own; chains of VIEWs fold into one). Shapes may hold `kernopt.Variable`s; `var_vals` carries their values."""
from __future__ import annotations
import math
from typing import Any, Optional, Sequence, Union
import numpy as np
import kernopt
from kernopt import ShapeTracker, Variable, dtypes

Shape = tuple[Any, ...]

def resolve(x: Any, var_vals: dict[str, int]) -> int:
  """The value of an int or symbolic size under var_vals."""
  if isinstance(x, int): return x
  sub = {v: var_vals[v.expr] for v in x.vars()}
  return int(x.substitute(sub).min)

def upper(x: Any) -> int:
  """An int or symbolic size at its Variables' largest values (what a Buffer must hold)."""
  return x if isinstance(x, int) else int(x.max)

def merge_vars(*dicts: dict[str, int]) -> dict[str, int]:
  out: dict[str, int] = {}
  for d in dicts:
    for k, v in d.items():
      if out.setdefault(k, v) != v: raise ValueError(f"variable {k!r} bound to both {out[k]} and {v}")
  return out

class Lazy:
  """One node of the graph. Realizing turns it into a BUFFER in place and drops its sources."""
  def __init__(self, op: str, srcs: tuple[Lazy, ...], arg: Any, shape: Shape, dtype: Any, device: str,
               var_vals: Optional[dict[str, int]] = None):
    self.op, self.srcs, self.arg, self.shape, self.dtype, self.device = op, srcs, arg, tuple(shape), dtype, device
    self.var_vals = merge_vars(var_vals or {}, *(s.var_vals for s in srcs))
    self.buffer: Optional[Any] = None

  def __repr__(self) -> str: return f"<Lazy {self.op} {self.shape} {self.dtype}>"

  @property
  def realized(self) -> bool: return self.op == "BUFFER"

  def become_buffer(self, buffer: Any) -> None:
    self.op, self.srcs, self.arg, self.buffer = "BUFFER", (), None, buffer

  # ***** constructors *****

  @staticmethod
  def from_numpy(data: np.ndarray, device: str, shape: Optional[Sequence[Any]] = None) -> Lazy:
    """A BUFFER holding data; `shape` may name Variables for some axes, bound to data's sizes there."""
    data = np.asarray(data, dtype=np.float32, order="C")   # (not ascontiguousarray: it makes a 0-d array 1-d)
    shape = tuple(data.shape) if shape is None else tuple(shape)
    if len(shape) != data.ndim: raise ValueError(f"shape {shape} for an array of shape {data.shape}")
    var_vals: dict[str, int] = {}
    for s, n in zip(shape, data.shape):
      if isinstance(s, Variable): var_vals = merge_vars(var_vals, {s.expr: n})
      elif s != n: raise ValueError(f"shape {shape} for an array of shape {data.shape}")
    buf = kernopt.Buffer(device, max(1, upper(math.prod(shape))), dtypes.float)
    host = np.zeros(buf.size, np.float32)
    host[:data.size] = data.reshape(-1)
    node = Lazy("BUFFER", (), None, shape, dtypes.float, device, var_vals)
    node.buffer = buf.copyin(host)
    return node

  @staticmethod
  def const(val: Any, shape: Shape, dtype: Any, device: str, var_vals: Optional[dict[str, int]] = None) -> Lazy:
    return Lazy("CONST", (), val, shape, dtype, device, var_vals)

  def const_like(self, val: Any, dtype: Any = None) -> Lazy:
    return Lazy.const(val, self.shape, dtype or self.dtype, self.device, self.var_vals)

  # ***** ops *****

  def alu(self, op: str, *others: Lazy) -> Lazy:
    """Elementwise `op` (a kernopt.ast builder name: add, mul, neg, exp2, cmplt, where, ...) of same-shape nodes."""
    srcs = (self, *others)
    for s in srcs:
      if s.shape != self.shape: raise ValueError(f"{op}: shapes {self.shape} and {s.shape} differ")
    dtype = dtypes.bool if op in ("cmplt", "cmpne") else srcs[-1].dtype if op == "where" else self.dtype
    return Lazy("ALU", srcs, op, self.shape, dtype, self.device)

  def cast(self, dtype: Any) -> Lazy: return Lazy("ALU", (self,), ("cast", dtype), self.shape, dtype, self.device)

  def reduce(self, op: str, axes: Sequence[int]) -> Lazy:
    axes = tuple(sorted(set(a % len(self.shape) for a in axes)))
    if not axes: return self
    shape = tuple(1 if i in axes else s for i, s in enumerate(self.shape))
    return Lazy("REDUCE", (self,), (op, axes), shape, self.dtype, self.device)

  def view(self, fn: Any) -> Lazy:
    """This node seen through fn(tracker), a ShapeTracker built from its current one (e.g. `st + window`)."""
    return self._move(fn)

  def _move(self, fn: Any) -> Lazy:
    base, st = (self.srcs[0], self.arg) if self.op == "VIEW" else (self, ShapeTracker.from_shape(self.shape))
    new = fn(st)
    return Lazy("VIEW", (base,), new, new.shape, self.dtype, self.device)

  def reshape(self, shape: Shape) -> Lazy:
    return self if tuple(shape) == self.shape else self._move(lambda st: st.reshape(tuple(shape)))
  def permute(self, order: Sequence[int]) -> Lazy:
    return self if tuple(order) == tuple(range(len(order))) else self._move(lambda st: st.permute(tuple(order)))
  def expand(self, shape: Shape) -> Lazy:
    return self if tuple(shape) == self.shape else self._move(lambda st: st.expand(tuple(shape)))
  def pad(self, arg: Sequence[tuple[Any, Any]]) -> Lazy:
    return self if all(p == (0, 0) for p in arg) else self._move(lambda st: st.pad(tuple(arg)))
  def shrink(self, arg: Sequence[tuple[Any, Any]]) -> Lazy:
    if all(b == 0 and e == s for (b, e), s in zip(arg, self.shape)): return self
    return self._move(lambda st: st.shrink(tuple(arg)))

def broadcast_shape(*shapes: Shape) -> Shape:
  """numpy's broadcast of shapes (sizes equal or 1, aligned from the right)."""
  rank = max(len(s) for s in shapes)
  padded = [(1,) * (rank - len(s)) + tuple(s) for s in shapes]
  out = []
  for sizes in zip(*padded):
    big = {s for s in sizes if not (isinstance(s, int) and s == 1)}
    if len(big) > 1: raise ValueError(f"cannot broadcast shapes {shapes}")
    out.append(big.pop() if big else 1)
  return tuple(out)

Scalar = Union[int, float]
