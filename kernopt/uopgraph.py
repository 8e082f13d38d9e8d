"""The UOp graph's rewrite rules (constant folding through the op-semantics table, algebraic identities, integer
value bounds and the rules they decide) and `linearize`, the rules applied and the result placed in execution order.
The rewrite engine is kernopt.patterns, the placement kernopt.linearizer; both are re-exported here.
Imports dtype, alu, lazyop, uops, patterns and linearizer."""
from __future__ import annotations
import math
from typing import Any, Optional
from kernopt.alu import cast_value, exec_alu
from kernopt.dtype import DType, dtypes
from kernopt.lazyop import BinaryOps, TernaryOps, UnaryOps
from kernopt.linearizer import order_uops
from kernopt.patterns import PatternMatcher, Rule, UPat, compile_upat, graph_rewrite, toposort
from kernopt.uops import UOp, UOps

# an enum member as a module constant: an attribute of an Enum class costs ~0.15 us on Python 3.11
_CONST, _STORE = UOps.CONST, UOps.STORE

# ***** value bounds of integer UOps *****

def bounds(u: UOp) -> tuple[Any, Any]:
  """(vmin, vmax) of an int or bool UOp's value over every execution; the dtype's range when unknown."""
  if (b := u.__dict__.get("_bounds")) is not None: return b
  # sources first, from an explicit stack: the bounds of an int chain of 10,000 ops need no recursion
  stack = [u]
  while stack:
    x = stack[-1]
    if "_bounds" in x.__dict__:
      stack.pop()
      continue
    if x.op in _READS_SOURCE_BOUNDS and _has_bounds(x.dtype) and \
       (todo := [s for s in x.src if "_bounds" not in s.__dict__]):
      stack.extend(todo)
      continue
    stack.pop()
    x.__dict__["_bounds"] = _bounds(x)
  return u.__dict__["_bounds"]

_READS_SOURCE_BOUNDS = (UOps.ALU, UOps.RANGE)
def _has_bounds(dt: Optional[DType]) -> bool:
  return dt is not None and dt.count == 1 and (dtypes.is_int(dt) or dt == dtypes.bool)

def vmin(u: UOp) -> Any: return bounds(u)[0]
def vmax(u: UOp) -> Any: return bounds(u)[1]

def _int_bound(x: Any, default: Any) -> Any: return x if isinstance(x, int) else getattr(x, "max", default)

def _bounds(u: UOp) -> tuple[Any, Any]:
  dt = u.dtype
  if dt is None or dt.count != 1 or not (dtypes.is_int(dt) or dt == dtypes.bool): return (None, None)
  full = (dtypes.min(dt), dtypes.max(dt))
  if u.op is UOps.CONST: return (u.arg, u.arg)
  if u.op is UOps.SPECIAL: return (0, _int_bound(u.arg[2], full[1]) - 1)
  if u.op is UOps.RANGE: return (vmin(u.src[0]), vmax(u.src[1]) - 1)
  if u.op is UOps.DEFINE_VAR: return (u.arg.min, u.arg.max)
  if u.op is not UOps.ALU: return full
  s = [bounds(x) for x in u.src]
  if any(lo is None for lo, _ in s): return full
  op = u.arg
  ret: Optional[tuple[Any, Any]] = None
  if op is BinaryOps.ADD: ret = (s[0][0] + s[1][0], s[0][1] + s[1][1])
  elif op is BinaryOps.MUL:
    c = [a * b for a in s[0] for b in s[1]]
    ret = (min(c), max(c))
  elif op is BinaryOps.IDIV and s[1][0] == s[1][1] and s[1][0] > 0:
    d = s[1][0]
    ret = (exec_alu(op, dt, (s[0][0], d)), exec_alu(op, dt, (s[0][1], d)))
  elif op is BinaryOps.MOD and s[1][0] == s[1][1] and s[1][0] > 0:
    d = s[1][0]
    if s[0][0] >= 0: ret = (0 if s[0][1] >= d else s[0][0], min(s[0][1], d - 1))
    else: ret = (-(d - 1), d - 1)
  elif op is BinaryOps.MAX: ret = (max(s[0][0], s[1][0]), max(s[0][1], s[1][1]))
  elif op is BinaryOps.CMPLT: ret = (s[0][1] < s[1][0], s[0][0] < s[1][1])
  elif op is BinaryOps.CMPNE and s[0][0] == s[0][1] == s[1][0] == s[1][1]: ret = (False, False)
  elif op is BinaryOps.AND and dt == dtypes.bool: ret = (s[0][0] and s[1][0], s[0][1] and s[1][1])
  elif op is TernaryOps.WHERE: ret = (min(s[1][0], s[2][0]), max(s[1][1], s[2][1]))
  elif op is UnaryOps.NEG and dt != dtypes.bool: ret = (-s[0][1], -s[0][0])
  if ret is None: return full
  if dt == dtypes.bool: return (bool(ret[0]), bool(ret[1]))
  # a result that may wrap is unknown
  return ret if full[0] <= ret[0] and ret[1] <= full[1] else full

# ***** the rules *****

def _c(u: UOp, v: Any) -> UOp: return UOp.const(u.dtype, v)  # type: ignore[arg-type]
def _is_const(u: UOp, v: Any) -> bool: return u.op is _CONST and type(u.arg) is not bool and u.arg == v
def _add(a: UOp, b: UOp) -> UOp: return UOp(UOps.ALU, a.dtype, (a, b), BinaryOps.ADD)
def _mul(a: UOp, b: UOp) -> UOp: return UOp(UOps.ALU, a.dtype, (a, b), BinaryOps.MUL)

def fold_alu(x: UOp) -> Optional[UOp]:
  for s in x.src:
    if s.op is not _CONST: return None
  if x.dtype is None or x.dtype.count != 1: return None
  return _c(x, exec_alu(x.arg, x.dtype, tuple(s.arg for s in x.src)))

def fold_cast(x: UOp, c: UOp) -> Optional[UOp]:
  dt = x.dtype
  if dt is None or dt.count != 1: return None
  return _c(x, cast_value(c.arg, dt))

def add_zero(x: UOp, z: UOp) -> Optional[UOp]:
  if not _is_const(z, 0) or x.dtype != z.dtype: return None
  # for floats only -0.0 is the additive identity: -0.0 + 0.0 is +0.0
  return x if not isinstance(z.arg, float) or math.copysign(1.0, z.arg) < 0 else None
def mul_one(x: UOp, o: UOp) -> Optional[UOp]: return x if _is_const(o, 1) and x.dtype == o.dtype else None
def mul_zero(x: UOp, z: UOp) -> Optional[UOp]: return z if _is_const(z, 0) and x.dtype == z.dtype else None
def div_one(x: UOp, o: UOp) -> Optional[UOp]: return x if _is_const(o, 1) else None
def mod_one(x: UOp, o: UOp) -> Optional[UOp]: return _c(x, 0) if _is_const(o, 1) else None
def where_const(c: UOp, a: UOp, b: UOp) -> UOp: return a if c.arg else b
def where_same(a: UOp, b: UOp) -> Optional[UOp]: return a if a is b else None
def and_true(x: UOp, t: UOp) -> Optional[UOp]: return x if t.arg is True else t

def cmplt_bounds(x: UOp, a: UOp, b: UOp) -> Optional[UOp]:
  (alo, ahi), (blo, bhi) = bounds(a), bounds(b)
  if alo is None or blo is None: return None
  if ahi < blo: return _c(x, True)
  if alo >= bhi: return _c(x, False)
  return None

def max_bounds(a: UOp, b: UOp) -> Optional[UOp]:
  (alo, ahi), (blo, bhi) = bounds(a), bounds(b)
  if alo is None or blo is None: return None
  if alo >= bhi: return a
  if blo >= ahi: return b
  return None

def div_small(x: UOp, c: UOp) -> Optional[UOp]:
  lo, hi = bounds(x)
  return _c(x, 0) if lo is not None and c.arg > 0 and 0 <= lo and hi < c.arg else None

def mod_small(x: UOp, c: UOp) -> Optional[UOp]:
  lo, hi = bounds(x)
  return x if lo is not None and c.arg > 0 and 0 <= lo and hi < c.arg else None

def _split_multiple(s: UOp, c: int) -> Optional[tuple[UOp, UOp]]:
  """s == q*c + r with q, r >= 0: (q, r) when one addend of s is a multiple of c (or s itself is)."""
  if s.op is UOps.ALU and s.arg is BinaryOps.MUL and s.src[1].op is UOps.CONST and s.src[1].arg % c == 0:
    if vmin(s.src[0]) is None or vmin(s.src[0]) < 0 or s.src[1].arg < 0: return None
    return (_mul(s.src[0], _c(s, s.src[1].arg // c)) if s.src[1].arg != c else s.src[0]), _c(s, 0)
  if s.op is UOps.CONST and s.arg % c == 0 and s.arg >= 0: return _c(s, s.arg // c), _c(s, 0)
  if s.op is UOps.ALU and s.arg is BinaryOps.ADD:
    for i in (0, 1):
      lo = vmin(s.src[1 - i])
      if lo is not None and lo >= 0 and (qr := _split_multiple(s.src[i], c)) is not None:
        return qr[0], s.src[1 - i] if qr[1].op is UOps.CONST and qr[1].arg == 0 else _add(qr[1], s.src[1 - i])
  return None

def div_split(x: UOp, s: UOp, c: UOp) -> Optional[UOp]:
  if c.arg <= 0 or (qr := _split_multiple(s, c.arg)) is None: return None
  return _add(qr[0], UOp(UOps.ALU, x.dtype, (qr[1], c), BinaryOps.IDIV))

def mod_split(x: UOp, s: UOp, c: UOp) -> Optional[UOp]:
  if c.arg <= 0 or (qr := _split_multiple(s, c.arg)) is None: return None
  return UOp(UOps.ALU, x.dtype, (qr[1], c), BinaryOps.MOD)

def add_consts(x: UOp, c1: UOp, c2: UOp) -> UOp:
  return _add(x, _c(x, exec_alu(BinaryOps.ADD, x.dtype, (c1.arg, c2.arg))))  # type: ignore[arg-type]
def mul_consts(x: UOp, c1: UOp, c2: UOp) -> UOp:
  return _mul(x, _c(x, exec_alu(BinaryOps.MUL, x.dtype, (c1.arg, c2.arg))))  # type: ignore[arg-type]

def load_valid(ld: UOp, buf: UOp, idx: UOp, v: UOp, alt: UOp) -> UOp:
  if v.arg: return UOp(UOps.LOAD, ld.dtype, (buf, idx.src[1] if _is_where_guard(idx, v) else idx))
  if alt.dtype == ld.dtype: return alt
  return UOp(UOps.VECTORIZE, ld.dtype, (alt,) * ld.dtype.count)  # type: ignore[union-attr]

def masked_load_const(ld: UOp, buf: UOp, idx: UOp, m: UOp) -> Optional[UOp]:
  assert ld.dtype is not None
  if m.arg == (1 << ld.dtype.count) - 1: return UOp(UOps.LOAD, ld.dtype, (buf, idx))
  return UOp(UOps.VECTORIZE, ld.dtype, (UOp.const(ld.dtype.scalar(), 0.0),) * ld.dtype.count) if m.arg == 0 else None

def _is_where_guard(idx: UOp, v: UOp) -> bool:
  return idx.op is UOps.ALU and idx.arg is TernaryOps.WHERE and idx.src[0] is v

def store_valid(buf: UOp, idx: UOp, val: UOp, v: UOp) -> Optional[UOp]:
  if v.dtype != dtypes.bool:   # a masked vector store's int32 lane mask: every lane open is a plain store
    return UOp(UOps.STORE, None, (buf, idx, val)) if val.dtype is not None and v.arg == (1 << val.dtype.count) - 1 \
      else None
  return UOp(UOps.STORE, None, (buf, idx.src[1] if _is_where_guard(idx, v) else idx, val)) if v.arg else None

def _dead_store(x: UOp) -> bool:
  """A STORE whose guard is constant false, or whose lane mask is constant 0."""
  return x.op is _STORE and len(x.src) == 4 and x.src[3].op is _CONST and \
    (x.src[3].dtype == dtypes.bool or x.src[3].arg == 0)

def sink_drop_dead(s: UOp) -> Optional[UOp]:
  keep = tuple(x for x in s.src if not _dead_store(x))
  return UOp(UOps.SINK, None, keep) if len(keep) != len(s.src) else None

def gep_vectorize(g: UOp, v: UOp) -> UOp: return v.src[g.arg]

_I = lambda name=None: UPat(name=name, dtype="int")  # noqa: E731
_CI = lambda name: UPat(UOps.CONST, name=name, dtype="int")  # noqa: E731
def _alu(op: Any, *src: UPat, name: Optional[str] = None, comm: bool = False, dtype: Any = None) -> UPat:
  return UPat(UOps.ALU, op, tuple(src), name, dtype, comm)

RULES: list[Rule] = [
  # an ALU op of constants is the constant exec_alu computes (one pattern per arity: the sources' ops then rule out
  # every other ALU before anything is called)
  *[(UPat(UOps.ALU, src=(UPat(UOps.CONST),) * n, name="x"), fold_alu) for n in (1, 2, 3)],
  # a CAST of a constant is the converted constant
  (UPat(UOps.CAST, src=(UPat(UOps.CONST, name="c"),), name="x"), fold_cast),
  # x + 0 -> x (ints and bools; x + -0.0 -> x for floats)
  (_alu(BinaryOps.ADD, UPat(name="x"), UPat(UOps.CONST, name="z"), comm=True), add_zero),
  # x * 1 -> x
  (_alu(BinaryOps.MUL, UPat(name="x"), UPat(UOps.CONST, name="o"), comm=True), mul_one),
  # x * 0 -> 0 for ints only (NaN * 0 is NaN)
  (_alu(BinaryOps.MUL, _I("x"), _CI("z"), comm=True), mul_zero),
  # x // 1 -> x for ints
  (_alu(BinaryOps.IDIV, _I("x"), _CI("o")), div_one),
  # x % 1 -> 0 for ints
  (_alu(BinaryOps.MOD, _I("x"), _CI("o")), mod_one),
  # WHERE on a constant condition selects a branch
  (_alu(TernaryOps.WHERE, UPat(UOps.CONST, name="c"), UPat(name="a"), UPat(name="b")), where_const),
  # WHERE(c, a, a) -> a
  (_alu(TernaryOps.WHERE, UPat(), UPat(name="a"), UPat(name="b")), where_same),
  # x AND True -> x; x AND False -> False (bools)
  (_alu(BinaryOps.AND, UPat(name="x"), UPat(UOps.CONST, name="t", dtype="bool"), comm=True), and_true),
  # a < b is constant when the bounds of a and b do not overlap
  (_alu(BinaryOps.CMPLT, _I("a"), _I("b"), name="x"), cmplt_bounds),
  # MAX(a, b) is a (or b) when the bounds say so
  (_alu(BinaryOps.MAX, _I("a"), _I("b")), max_bounds),
  # x // c -> 0 when 0 <= x < c
  (_alu(BinaryOps.IDIV, _I("x"), _CI("c"), dtype="int"), div_small),
  # x % c -> x when 0 <= x < c
  (_alu(BinaryOps.MOD, _I("x"), _CI("c"), dtype="int"), mod_small),
  # (q*c + r) // c -> q + r//c when q, r >= 0
  (_alu(BinaryOps.IDIV, _I("s"), _CI("c"), name="x"), div_split),
  # (q*c + r) % c -> r % c when q, r >= 0
  (_alu(BinaryOps.MOD, _I("s"), _CI("c"), name="x"), mod_split),
  # (x + c1) + c2 -> x + (c1+c2) for ints
  (_alu(BinaryOps.ADD, _alu(BinaryOps.ADD, _I("x"), _CI("c1")), _CI("c2")), add_consts),
  # (x * c1) * c2 -> x * (c1*c2) for ints
  (_alu(BinaryOps.MUL, _alu(BinaryOps.MUL, _I("x"), _CI("c1")), _CI("c2")), mul_consts),
  # a guarded LOAD with a constant guard is a plain LOAD or its alternative value
  (UPat(UOps.LOAD, src=(UPat(name="buf"), UPat(name="idx"), UPat(UOps.CONST, name="v"), UPat(name="alt")), name="ld"),
   load_valid),
  # a masked vector LOAD whose lane mask is constant: every lane open is a plain LOAD, none open is +0.0
  (UPat(UOps.LOAD, src=(UPat(name="buf"), UPat(name="idx"), UPat(UOps.CONST, name="m", dtype="int")), name="ld"),
   masked_load_const),
  # a guarded STORE with a true guard (a masked one with every lane open) is a plain STORE
  (UPat(UOps.STORE, src=(UPat(name="buf"), UPat(name="idx"), UPat(name="val"), UPat(UOps.CONST, name="v"))),
   store_valid),
  # a STORE whose guard is constant false (lane mask 0) is dropped from the SINK
  (UPat(UOps.SINK, name="s"), sink_drop_dead),
  # GEP of a VECTORIZE is the lane
  (UPat(UOps.GEP, src=(UPat(UOps.VECTORIZE, name="v"),), name="g"), gep_vectorize),
]
simplifier = PatternMatcher(RULES)

def linearize(sink: UOp, opts: Any = None) -> list[UOp]:
  """The program of `sink` in execution order: the rules applied, then each UOp placed in the innermost loop it
  depends on (loop invariants hoisted), accumulators before their loop, guarded stores inside IF/ENDIF."""
  return order_uops(graph_rewrite(sink, simplifier))

__all__ = ["UPat", "PatternMatcher", "compile_upat", "graph_rewrite", "RULES", "simplifier", "bounds", "vmin", "vmax",
           "linearize", "order_uops", "toposort"]
