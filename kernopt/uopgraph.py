"""Graph rewrites on UOps (rules are data: a pattern and a named function), integer value bounds, and
linearization of a SINK into an ordered list with RANGE/ENDRANGE and IF/ENDIF bracketing.
Imports dtype, ops, uops (and may read a renderer's capabilities)."""
from __future__ import annotations
import heapq
from dataclasses import dataclass
from enum import Enum
from typing import Any, Callable, Optional, Union
from kernopt.dtype import DType, dtypes
from kernopt.ops import BinaryOps, TernaryOps, UnaryOps, exec_alu, truncate_float
from kernopt.uops import UOp, UOps

# enum members as module constants: an attribute of an Enum class costs ~0.15 us on Python 3.11
_ALU, _CONST = UOps.ALU, UOps.CONST

# ***** patterns *****

@dataclass(frozen=True)
class UPat:
  """Matches a UOp whose op is `op` (or one of them), whose arg equals `arg` (when given), whose dtype satisfies
  `dtype` ("int", "float", "bool" or a DType), and whose sources match `src` in order (or in either order when
  `commutative`); a match captures the UOp under `name`."""
  op: Union[UOps, tuple[UOps, ...], None] = None
  arg: Any = None
  src: Optional[tuple[UPat, ...]] = None
  name: Optional[str] = None
  dtype: Union[str, DType, None] = None
  commutative: bool = False

  def match(self, u: UOp, caps: dict[str, UOp]) -> bool:
    if self.op is not None and (u.op is not self.op if isinstance(self.op, UOps) else u.op not in self.op): return False
    if self.arg is not None and u.arg != self.arg: return False
    if self.dtype is not None and not _dtype_ok(u.dtype, self.dtype): return False
    if self.name is not None:
      if self.name in caps and caps[self.name] is not u: return False
      caps[self.name] = u
    if self.src is None: return True
    if len(self.src) != len(u.src): return False
    if _match_all(self.src, u.src, caps): return True
    return self.commutative and len(u.src) == 2 and _match_all(self.src, (u.src[1], u.src[0]), caps)

def _match_all(pats: tuple[UPat, ...], srcs: tuple[UOp, ...], caps: dict[str, UOp]) -> bool:
  for p, s in zip(pats, srcs):  # cheap rejection on ops and args before copying the captures
    if p.op is not None and (s.op is not p.op if isinstance(p.op, UOps) else s.op not in p.op): return False
    if p.arg is not None and s.arg != p.arg: return False
  trial = dict(caps)
  if all(p.match(s, trial) for p, s in zip(pats, srcs)):
    caps.update(trial)
    return True
  return False

def _dtype_ok(dt: Optional[DType], want: Union[str, DType]) -> bool:
  if dt is None: return False
  if want == "int": return dtypes.is_int(dt) and dt.count == 1
  if want == "float": return dtypes.is_float(dt)
  if want == "bool": return dt == dtypes.bool
  return dt == want

Rule = tuple[UPat, Callable[..., Optional[UOp]]]
Matcher = Callable[[UOp, dict], bool]

_INT_NAMES = frozenset(dt.name for dt in (dtypes.int8, dtypes.int16, dtypes.int32, dtypes.int64, dtypes.uint8,
                                          dtypes.uint16, dtypes.uint32, dtypes.uint64))

def _dtype_check(want: Union[str, DType]) -> Callable[[Optional[DType]], bool]:
  if want == "int": return lambda dt: dt is not None and dt.count == 1 and dt.name in _INT_NAMES
  return lambda dt: _dtype_ok(dt, want)

def _head(ops: Optional[frozenset], arg: Any, name: Optional[str], dcheck: Optional[Callable]) -> Matcher:
  """The test of one pattern node's own op, arg, dtype and capture, leaving out the checks it doesn't have."""
  if arg is None and dcheck is None and name is None:
    return (lambda u, caps: True) if ops is None else (lambda u, caps: u.op in ops)

  def named(u: UOp, caps: dict) -> bool:
    if ops is not None and u.op not in ops: return False
    if (prev := caps.get(name)) is not None and prev is not u: return False
    caps[name] = u
    return True
  if arg is None and dcheck is None: return named

  def full(u: UOp, caps: dict) -> bool:
    if ops is not None and u.op not in ops: return False
    if arg is not None and u.arg != arg: return False
    if dcheck is not None and not dcheck(u.dtype): return False
    if name is not None:
      if (prev := caps.get(name)) is not None and prev is not u: return False
      caps[name] = u
    return True
  return full

def compile_upat(p: UPat) -> Matcher:
  """A closure doing p.match(u, caps) (same captures, same order of tries) without interpreting the pattern."""
  ops = None if p.op is None else frozenset([p.op] if isinstance(p.op, UOps) else p.op)
  arg, name, dcheck = p.arg, p.name, (None if p.dtype is None else _dtype_check(p.dtype))
  subs = None if p.src is None else tuple(compile_upat(x) for x in p.src)
  n, comm = (0 if subs is None else len(subs)), p.commutative

  head = _head(ops, arg, name, dcheck)
  if subs is None: return head

  def srcs(fs: tuple[Matcher, ...], us: tuple[UOp, ...], caps: dict) -> bool:
    trial = dict(caps)
    for f, x in zip(fs, us):
      if not f(x, trial): return False
    caps.update(trial)
    return True

  def match(u: UOp, caps: dict) -> bool:
    if not head(u, caps) or len(u.src) != n: return False
    if srcs(subs, u.src, caps): return True
    return n == 2 and srcs(subs, (u.src[1], u.src[0]), caps)

  def match_ordered(u: UOp, caps: dict) -> bool:
    # without a second order to try, a failure fails the whole match: the captures need no copy (a commutative
    # ancestor matches into a copy of its own)
    if not head(u, caps) or len(u.src) != n: return False
    for f, x in zip(subs, u.src):
      if not f(x, caps): return False
    return True
  return match if comm else match_ordered

class PatternMatcher:
  """An ordered list of rules, indexed by the op each pattern's root matches (and by its arg for ALU roots)."""
  def __init__(self, rules: list[Rule]):
    self.rules = rules
    self.by_op: dict[UOps, list[tuple[UPat, Matcher, Callable]]] = {}
    for pat, fn in rules:
      ops = list(UOps) if pat.op is None else ([pat.op] if isinstance(pat.op, UOps) else list(pat.op))
      m = compile_upat(pat)
      for op in ops: self.by_op.setdefault(op, []).append((pat, m, fn))
    self._by_key: dict[tuple[UOps, Any], list[tuple[Matcher, Callable, tuple[frozenset, ...], Optional[int]]]] = {}
    self._cands: dict[tuple[UOps, Any, tuple[UOps, ...]], list[tuple[Matcher, Callable]]] = {}

  def _rules(self, op: UOps, arg: Any) -> list[tuple[Matcher, Callable, tuple[frozenset, ...], Optional[int]]]:
    """(matcher, function, the ops some source must have, the number of sources or None for any) of each rule
    that can match a root with this op and (hashable) arg, in order."""
    key = (op, arg if arg.__hash__ is not None else None)
    if (ret := self._by_key.get(key)) is None:
      ret = self._by_key[key] = [(m, f, _src_needs(p), None if p.src is None else len(p.src))
                                 for p, m, f in self.by_op.get(op, ()) if p.arg is None or p.arg == key[1]]
    return ret

  def candidates(self, op: UOps, arg: Any, src_ops: tuple[UOps, ...]) -> list[tuple[Matcher, Callable]]:
    """The rules worth matching on a root with this op, (ALU) arg and these source ops: a cheap necessary
    condition: a pattern with sources needs as many, and each source pattern that names ops a source with one of
    them."""
    ret = [(m, f) for m, f, needs, n_src in self._rules(op, arg)
           if (n_src is None or n_src == len(src_ops)) and all(any(o in n for o in src_ops) for n in needs)]
    if arg is None or isinstance(arg, Enum): self._cands[(op, arg, src_ops)] = ret  # members hash by identity
    return ret

  def rewrite(self, u: UOp) -> Optional[UOp]:
    """The first rule's replacement of u, or None."""
    op = u.op
    if op not in self.by_op: return None
    arg = u.arg if op is _ALU else None
    src_ops = tuple([s.op for s in u.src])
    rules = self._cands.get((op, arg, src_ops))  # an ALU arg is an op enum member: its identity is its value
    if rules is None: rules = self.candidates(op, arg, src_ops)
    for m, fn in rules:
      caps: dict[str, UOp] = {}
      if m(u, caps) and (ret := fn(**caps)) is not None and ret is not u: return ret
    return None

def _src_needs(p: UPat) -> tuple[frozenset, ...]:
  """For each source pattern of p's root that names ops: those ops (some source of a match has one of them)."""
  if p.src is None: return ()
  return tuple(frozenset([x.op] if isinstance(x.op, UOps) else x.op) for x in p.src if x.op is not None)

def graph_rewrite(root: UOp, pm: PatternMatcher) -> UOp:
  """root with every rule applied bottom-up until none matches; each UOp is visited once (memoized)."""
  memo: dict[UOp, UOp] = {}
  rewrite = pm.rewrite

  def settle(n: UOp) -> UOp:
    """n (whose sources are settled) rewritten until no rule matches; new nodes' sources are settled first."""
    while (r := rewrite(n)) is not None:
      if (done := memo.get(r)) is not None: n = done
      else:
        src = tuple(memo.get(s) or settle_new(s) for s in r.src)
        n = r if src == r.src else UOp(r.op, r.dtype, src, r.arg)
        if (done := memo.get(n)) is not None: return done
        continue
      break
    memo[n] = n
    return n

  def settle_new(u: UOp) -> UOp:
    src = tuple(memo.get(s) or settle_new(s) for s in u.src)
    ret = memo[u] = settle(u if src == u.src else UOp(u.op, u.dtype, src, u.arg))
    return ret

  by_op = pm.by_op
  for u in toposort(root):
    if u in memo: continue
    for s in u.src:
      if memo[s] is not s:
        n = UOp(u.op, u.dtype, tuple([memo[x] for x in u.src]), u.arg)
        memo[u] = memo[n] if n in memo else settle(n)
        break
    else: memo[u] = u if u.op not in by_op or rewrite(u) is None else settle(u)  # the common case: no settle loop
  return memo[root]

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
  if dtypes.is_float(dt): return _c(x, truncate_float(float(c.arg), dt))
  if isinstance(c.arg, float) and (c.arg != c.arg or abs(c.arg) == float("inf")): return None
  return _c(x, int(c.arg) if dt != dtypes.bool else bool(c.arg))

def add_zero(x: UOp, z: UOp) -> Optional[UOp]: return x if _is_const(z, 0) and x.dtype == z.dtype else None
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

def _is_where_guard(idx: UOp, v: UOp) -> bool:
  return idx.op is UOps.ALU and idx.arg is TernaryOps.WHERE and idx.src[0] is v

def store_valid(buf: UOp, idx: UOp, val: UOp, v: UOp) -> Optional[UOp]:
  return UOp(UOps.STORE, None, (buf, idx.src[1] if _is_where_guard(idx, v) else idx, val)) if v.arg else None

def sink_drop_dead(s: UOp) -> Optional[UOp]:
  keep = tuple(x for x in s.src if not (x.op is UOps.STORE and len(x.src) == 4 and x.src[3].op is UOps.CONST))
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
  # x + 0 -> x
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
  # a guarded STORE with a true guard is a plain STORE
  (UPat(UOps.STORE, src=(UPat(name="buf"), UPat(name="idx"), UPat(name="val"), UPat(UOps.CONST, name="v"))),
   store_valid),
  # a STORE whose guard is constant false is dropped from the SINK
  (UPat(UOps.SINK, name="s"), sink_drop_dead),
  # GEP of a VECTORIZE is the lane
  (UPat(UOps.GEP, src=(UPat(UOps.VECTORIZE, name="v"),), name="g"), gep_vectorize),
]
simplifier = PatternMatcher(RULES)

# ***** linearization *****

_FIRST = {UOps.DEFINE_GLOBAL: 0, UOps.DEFINE_VAR: 1, UOps.DEFINE_LOCAL: 2, UOps.SPECIAL: 3, UOps.CONST: 4}

def _param_key(u: UOp) -> tuple:
  if u.op is UOps.DEFINE_GLOBAL: return (u.arg[0],)
  if u.op is UOps.DEFINE_VAR: return (u.arg.expr,)
  if u.op is UOps.SPECIAL: return (u.arg[1],)
  return ()

def toposort(root: UOp) -> list[UOp]:
  """Every UOp reachable from root, sources before users (iterative DFS, deterministic; kept on root, so the
  linearizer reuses the rewrite's order when no rule changed the graph)."""
  if (done := root.__dict__.get("_toposort")) is not None: return [*done, root]
  order = _toposort(root)
  root.__dict__["_toposort"] = tuple(order[:-1])  # without root itself: no reference cycle (see uops._sweep)
  return order

def _toposort(root: UOp) -> list[UOp]:
  order: list[UOp] = []
  state: dict[UOp, bool] = {}   # False: its sources are being visited, True: placed in order
  stack = [root]
  while stack:
    u = stack.pop()
    if (st := state.get(u)) is not None:
      # in a DAG a node met again while its sources are pending is its own second entry: place it
      if not st:
        state[u] = True
        order.append(u)
      continue
    state[u] = False
    stack.append(u)
    stack.extend([s for s in reversed(u.src) if s not in state])
  return order

def linearize(sink: UOp, opts: Any = None) -> list[UOp]:
  """The program of `sink` in execution order: the rules applied, then each UOp placed in the innermost loop it
  depends on (loop invariants hoisted), accumulators before their loop, guarded stores inside IF/ENDIF."""
  return order_uops(graph_rewrite(sink, simplifier))

def order_uops(sink: UOp) -> list[UOp]:
  """Linearize without rewriting. Loop nesting: non-reduce RANGEs nest by axis, outermost first; the reduce
  RANGEs of an accumulator nest by axis inside all non-reduce RANGEs; a PHI's value is read after its loops."""
  topo = toposort(sink)
  pos = {u: i for i, u in enumerate(topo)}
  # enum members as locals: an attribute of an Enum class costs ~0.15 us on Python 3.11
  RANGE, DEFINE_ACC, PHI, STORE, SINK = UOps.RANGE, UOps.DEFINE_ACC, UOps.PHI, UOps.STORE, UOps.SINK
  ranges = [u for u in topo if u.op is RANGE]
  parent: dict[UOp, Optional[UOp]] = {}
  outer = sorted((u for u in ranges if not u.arg[1]), key=lambda r: r.arg[0])
  for i, r in enumerate(outer): parent[r] = outer[i - 1] if i else None
  innermost_outer = outer[-1] if outer else None
  accs = [u for u in topo if u.op is DEFINE_ACC]
  if len({a.src for a in accs}) > 1: _nest_accumulators(topo, accs, parent)
  for acc in accs:
    rs = sorted(acc.src, key=lambda r: r.arg[0])
    for i, r in enumerate(rs): parent.setdefault(r, rs[i - 1] if i else innermost_outer)
  for u in ranges: parent.setdefault(u, innermost_outer)
  depth: dict[Optional[UOp], int] = {None: 0}
  for r in sorted(parent, key=lambda r: pos[r]): _depth(r, parent, depth)

  def up_to(b: Optional[UOp], d: int) -> Optional[UOp]:
    while depth[b] > d: b = parent[b]  # type: ignore[index]
    return b

  after: dict[UOp, Optional[UOp]] = {}   # the innermost loop u's value is available in
  block: dict[UOp, Optional[UOp]] = {}   # the block u is an item of: a RANGE's parent, else the loop u runs in
  items: dict[Optional[UOp], list[UOp]] = {}
  # the items of u's block that must come before u (a list: a repeated entry counts in the in-degree as often as it
  # releases it, and the emission order depends only on the keys). Both ends of every entry are items of the same
  # block: a source in another block is replaced by the items the two are inside of in their common one.
  deps: dict[UOp, list[UOp]] = {}
  params_first = _FIRST
  # one pass in topological order: a UOp's placement needs only its sources' (and the loop tree)
  for u in topo:
    op = u.op
    if op is RANGE:
      after[u] = u
      bu = block[u] = parent[u]
    elif op is DEFINE_ACC:
      sc: Optional[UOp] = parent[min(u.src, key=depth.__getitem__)]
      # an accumulator's running value is read inside its loops (e.g. as a WMMA's C operand), its final one after
      after[u] = max(u.src, key=depth.__getitem__) if u.src else sc
      bu = block[u] = sc
    else:
      sc, d = None, 0
      for x in u.src:  # the deepest loop among the sources' (the first one on ties)
        if (ax := after[x]) is not None and (dx := depth[ax]) > d: sc, d = ax, dx
      if op is PHI:
        r = max(u.src[0].src, key=depth.__getitem__)
        if depth[r] > d: sc = r
        after[u] = parent[min(u.src[0].src, key=depth.__getitem__)]
      else: after[u] = sc
      bu = block[u] = sc
      if op is SINK: continue
    if (its := items.get(bu)) is None: items[bu] = [u]
    else: its.append(u)
    du = deps.get(u)
    if du is None: du = deps[u] = []
    if op is DEFINE_ACC: continue
    for s in u.src:
      # a parameter or constant (no sources, keys 0-4, in the outermost block) is placed before every UOp that has
      # sources anyway: no entry needed
      if s.op in params_first and not s.src: continue
      bs = block[s]
      if bs is bu:  # the same block (s can't be a loop u is inside: that RANGE is an item of an outer block)
        if s is not u: du.append(s)
        continue
      if s.op is RANGE and up_to(bu, depth[s]) is s: continue  # u is inside loop s
      # walk both positions up to their common block, then order the items there
      a, b = bu, bs
      ia, ib = u, s
      while depth[a] > depth[b]: ia, a = a, parent[a]  # type: ignore[assignment,index]
      while depth[b] > depth[a]: ib, b = b, parent[b]  # type: ignore[assignment,index]
      while a is not b: ia, a, ib, b = a, parent[a], b, parent[b]  # type: ignore[assignment,index]
      if ia is not ib:
        if (di := deps.get(ia)) is None: di = deps[ia] = [ib]
        else: di.append(ib)

  out: list[UOp] = []
  first = _FIRST
  def key(u: UOp) -> tuple:
    # parameters first, in argument order; stores last (gated ones grouped by guard, to share one IF). Every key
    # ends with pos[u], so keys are unique and a heap entry (key, u) never compares UOps
    op = u.op
    if op is STORE: return (10, pos[u.src[3]] if len(u.src) == 4 else -1, pos[u])
    if op in first: return (first[op],) + _param_key(u) + (pos[u],)
    return (9, pos[u])
  heappop, heappush = heapq.heappop, heapq.heappush
  ENDRANGE, IF, ENDIF = UOps.ENDRANGE, UOps.IF, UOps.ENDIF
  def put(u: UOp) -> None:
    op = u.op
    if op is RANGE:
      out.append(u)
      emit(u)
      out.append(UOp(ENDRANGE, None, (u,)))
    elif op is STORE and len(u.src) == 4:
      cond = UOp(IF, None, (u.src[3],))
      end = UOp(ENDIF, None, (cond,))
      if out and out[-1] is end: out.insert(len(out) - 1, UOp(STORE, None, u.src[:3]))  # same guard: one IF
      else: out.extend([cond, UOp(STORE, None, u.src[:3]), end])
    else: out.append(u)
  def emit(blk: Optional[UOp]) -> None:
    """The items of blk, each after its dependencies, the smallest key first among those whose dependencies are
    out (Kahn's algorithm on a heap)."""
    mine = items.get(blk, [])
    # in key order: parameters and constants (keys 0-4), the rest in list order (9, pos: items are listed in
    # topological order), stores (10)
    params, plain, stores = [], [], []
    for u in mine:
      op = u.op
      if op is STORE: stores.append(u)
      elif op in first: params.append(u)
      else: plain.append(u)
    if params: params = [u for _, u in sorted([(key(u), u) for u in params])]
    if stores: stores = [u for _, u in sorted([(key(u), u) for u in stores])]
    ordered = params + plain + stores
    # Kahn's algorithm, smallest key first. ordered is in key order, so an item's index is its key; every released
    # item (one that waited) has a smaller index than the next unread one. Items are taken in list order while their
    # dependencies are out; one that isn't is set aside until its last dependency is placed, then enters a heap
    placed: set[UOp] = set()
    waiting: dict[int, int] = {}         # index of an item set aside -> its dependencies not placed yet
    users: dict[UOp, list[int]] = {}     # an unplaced dependency -> the indices of the items waiting on it
    ready: list[int] = []                # heap of the indices of released items
    i, n, done = 0, len(ordered), 0
    while True:
      if ready: u = ordered[heappop(ready)]
      elif i < n:
        u = ordered[i]
        i += 1
        wait = False
        for d in deps[u]:
          if d not in placed:
            wait = True
            break
        if wait:
          c = 0
          for d in deps[u]:
            if d not in placed:
              c += 1
              if (us := users.get(d)) is None: users[d] = [i - 1]
              else: us.append(i - 1)
          waiting[i - 1] = c
          continue
      else: break
      placed.add(u)
      done += 1
      put(u)
      if users and (ws := users.pop(u, None)) is not None:
        for j in ws:
          waiting[j] -= 1
          if waiting[j] == 0: heappush(ready, j)
    if done != n:  # an internal invariant: the lowerer builds no graph whose placement needs this
      raise AssertionError(f"cycle in the UOp graph while linearizing ({n - done} UOps left in a block)")
  emit(None)
  return out

def _nest_accumulators(topo: list[UOp], accs: list[UOp], parent: dict[UOp, Optional[UOp]]) -> None:
  """Accumulators over different loops (several reduces, nested ones): each accumulator's loops nest in the deepest
  loop its update reads besides its own, so a reduce that reads another's loop index runs (and restarts) inside it,
  and one that reads no output loop's index is computed once, before those loops."""
  rdeps: dict[UOp, frozenset] = {}
  for u in topo:
    if u.op is UOps.RANGE: rdeps[u] = frozenset((u,))
    elif u.op is UOps.DEFINE_ACC: rdeps[u] = frozenset()
    elif u.op is UOps.PHI: rdeps[u] = rdeps[u.src[1]] - set(u.src[0].src)
    else: rdeps[u] = frozenset().union(*(rdeps[s] for s in u.src)) if u.src else frozenset()
  update = {u.src[0]: u.src[1] for u in topo if u.op is UOps.PHI}
  # accumulators over the same loops (the lanes of one reduce, sibling reduces) share them: the deepest need wins
  needs: dict[tuple[UOp, ...], frozenset] = {}
  for a in accs:
    rs = tuple(sorted(a.src, key=lambda r: r.arg[0]))
    needs[rs] = needs.get(rs, frozenset()) | (rdeps[update[a]] - set(rs) if a in update else frozenset())
  def depth(r: Optional[UOp]) -> int: return 0 if r is None else 1 + depth(parent[r])
  pending = list(needs)
  while pending:
    ready = [rs for rs in pending if all(r in parent for r in needs[rs])] or pending[:1]
    for rs in ready:
      placed = [r for r in needs[rs] if r in parent]
      enclosing = max(placed, key=depth) if placed else None
      for i, r in enumerate(rs):
        want = rs[i - 1] if i else enclosing
        if parent.setdefault(r, want) is not want:
          raise AssertionError(f"loop {r.arg} of two accumulators nested differently")
      pending.remove(rs)

def _depth(r: Optional[UOp], parent: dict[UOp, Optional[UOp]], depth: dict[Optional[UOp], int]) -> int:
  if r not in depth: depth[r] = _depth(parent[r], parent, depth) + 1  # type: ignore[index]
  return depth[r]

__all__ = ["UPat", "PatternMatcher", "graph_rewrite", "RULES", "simplifier", "bounds", "vmin", "vmax",
           "linearize", "order_uops", "toposort"]
