"""Index rendering for the lowerer: symbolic index Nodes become int32 (or int64) UOps through RENDER_OPS, constants
are built once, launch axes fold into the dialect's grid dimensions (`fold_dims`), and an index splits into a base
and the strides of the upcast variables (`linear`); `value_dtype` is the dtype values read from a buffer are
computed in. Imports dtype, errors, helpers, ops, shape/ and uops."""
from __future__ import annotations
import functools, itertools
from typing import Any, Optional, Sequence
from kernopt.dtype import DType, ImageDType, dtypes
from kernopt.errors import UnsupportedError
from kernopt.helpers import prod
from kernopt.ops import BinaryOps
from kernopt.shape.symbolic import AndNode, DivNode, LtNode, ModNode, MulNode, Node, NumNode, SumNode, Variable
from kernopt.uops import UOp, UOps

I32, I64 = dtypes.int32, dtypes.int64
INT32_MIN, INT32_MAX = -2**31, 2**31 - 1

_CONSTS: dict[tuple[int, DType], UOp] = {}
def index_const(v: int, dt: DType = I32) -> UOp:
  """The index constant v of dt (int32, or int64 in a kernel lowered with int64 indices), built once."""
  if (u := _CONSTS.get((v, dt))) is None:
    if len(_CONSTS) > 8192: _CONSTS.clear()
    u = _CONSTS[(v, dt)] = UOp.const(dt, v)
  return u

class Wide(Exception):
  """An index, a loop bound or a Variable that int32 can't hold: the kernel is lowered again with int64 indices."""

# an enum member as a module constant: an attribute of an Enum class costs ~0.15 us on Python 3.11
_ALU = UOps.ALU
_ADD, _MUL, _AND, _CMPLT = BinaryOps.ADD, BinaryOps.MUL, BinaryOps.AND, BinaryOps.CMPLT
def alu(op: Any, dt: Optional[DType], *src: UOp) -> UOp: return UOp(_ALU, dt, src, op)

def _operand(b: Any, ops: Any, ctx: Any) -> UOp: return ctx.const(b) if isinstance(b, int) else b.render(ops, ctx)

def _cached(fn: Any) -> Any:
  def wrapper(n: Node, ops: Any, ctx: Any) -> UOp:
    if (u := ctx.render_cache.get(n)) is None:
      if ctx.idx_dt is I32: ctx.check(n)
      u = ctx.render_cache[n] = fn(n, ops, ctx)
    return u
  return wrapper

def as_bool(u: UOp) -> UOp:
  if u.dtype == dtypes.bool or u.dtype is None: return u
  return alu(BinaryOps.CMPNE, dtypes.bool, u, index_const(0) if u.dtype is I32 else UOp.const(u.dtype, 0))

# the renderer of each Node kind; ctx is the lowerer (its const, var_uop, idx_dt, render_cache and check)
RENDER_OPS: dict[type, Any] = {
  Variable: _cached(lambda n, ops, ctx: ctx.var_uop(n)),
  NumNode: lambda n, ops, ctx: ctx.const(n.b),
  MulNode: _cached(lambda n, ops, ctx: alu(_MUL, ctx.idx_dt, n.a.render(ops, ctx), _operand(n.b, ops, ctx))),
  DivNode: _cached(lambda n, ops, ctx: alu(BinaryOps.IDIV, ctx.idx_dt, n.a.render(ops, ctx), _operand(n.b, ops, ctx))),
  ModNode: _cached(lambda n, ops, ctx: alu(BinaryOps.MOD, ctx.idx_dt, n.a.render(ops, ctx), _operand(n.b, ops, ctx))),
  LtNode: _cached(lambda n, ops, ctx: alu(_CMPLT, dtypes.bool, n.a.render(ops, ctx),
                                          _operand(n.b, ops, ctx))),
  SumNode: _cached(lambda n, ops, ctx: functools.reduce(lambda a, b: alu(_ADD, ctx.idx_dt, a, b),
                                                        [x.render(ops, ctx) for x in n.nodes])),
  AndNode: _cached(lambda n, ops, ctx: functools.reduce(lambda a, b: alu(_AND, dtypes.bool, a, b),
                                                        [as_bool(x.render(ops, ctx)) for x in n.nodes])),
}

def value_dtype(dt: Any) -> Any:
  """The dtype of a value computed from dt's loads: an image's elements are read as float."""
  return dtypes.float if isinstance(dt, ImageDType) else dt

def upper(x: Any) -> int: return x if isinstance(x, int) else x.max

def fold_dims(sizes: Sequence[Any], maxes: Optional[Sequence[int]]) -> list[list[int]]:
  """Contiguous groups of axes, one group per launch dimension (at most len(maxes), 3 without maxes), each
  group's size within its dimension's maximum. Preferred: one axis per dimension, extra leading axes merged
  into dimension 0 (the dimension with the largest limit on every dialect)."""
  n = len(sizes)
  if n == 0: return []
  lim = list(maxes) if maxes else [None] * 3
  def fits(groups: list[list[int]]) -> bool:
    return all((m := lim[d]) is None or upper(prod(sizes[a] for a in g)) <= m for d, g in enumerate(groups))
  for k in range(min(n, len(lim)), 0, -1):
    for cuts in reversed(list(itertools.combinations(range(1, n), k - 1))):
      bounds = (0,) + cuts + (n,)
      groups = [list(range(bounds[i], bounds[i + 1])) for i in range(k)]
      if fits(groups): return groups
  raise UnsupportedError(f"launch dimensions {tuple(sizes)} don't fit the device's maxima {tuple(lim)}")

def linear(node: Node, upvars: dict[Variable, int]) -> Optional[tuple[Node, dict[int, int]]]:
  """node == base + Σ stride_j·u_j for the upcast variables u_j, or None when an upcast variable sits inside a
  nonlinear term."""
  terms = node.nodes if isinstance(node, SumNode) else [node]
  base: list[Node] = []
  strides: dict[int, int] = {}
  for t in terms:
    tt = type(t)
    if tt is Variable:
      if t in upvars: strides[upvars[t]] = strides.get(upvars[t], 0) + 1   # type: ignore[index]
      else: base.append(t)
    elif tt is MulNode and type(t.a) is Variable and isinstance(t.b, int):   # type: ignore[attr-defined]
      if (a := t.a) in upvars: strides[upvars[a]] = strides.get(upvars[a], 0) + t.b   # type: ignore[attr-defined]
      else: base.append(t)
    elif tt is NumNode or not (t.vars() & upvars.keys()): base.append(t)
    else: return None
  return Node.sum(base), strides

def divisible(n: Node, w: int) -> bool:
  """n is a multiple of w for every value of its variables."""
  if isinstance(n, NumNode): return n.b % w == 0
  if isinstance(n, MulNode): return (isinstance(n.b, int) and n.b % w == 0) or divisible(n.a, w)
  if isinstance(n, SumNode): return all(divisible(x, w) for x in n.nodes)
  return False

__all__ = ["RENDER_OPS", "fold_dims", "linear", "divisible", "index_const", "as_bool", "alu", "upper", "value_dtype",
           "Wide", "I32", "I64", "INT32_MIN", "INT32_MAX"]
