"""UOp graph rewriting as data: a pattern (`UPat`) and a named function make a rule, a `PatternMatcher` indexes an
ordered list of them, and `graph_rewrite` applies them bottom-up until none matches; `toposort` orders a graph
sources first. Imports dtype and uops."""
from __future__ import annotations
from dataclasses import dataclass
from enum import Enum
from typing import Any, Callable, Optional, Union
from kernopt.dtype import DType, dtypes
from kernopt.uops import UOp, UOps

# an enum member as a module constant: an attribute of an Enum class costs ~0.15 us on Python 3.11
_ALU = UOps.ALU

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

# ***** sources before users *****

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
