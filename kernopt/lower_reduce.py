"""Reduces for the lowerer: each reduce's loops (shared by the reduces of one nesting, copied for the others), its
accumulators (independent ones per lane, up to max_accs, to break the loop-carried chain; one vector accumulator per
group when its source is lowered as vectors) and tensor-core WMMA instructions. `ReduceLowering` is the lowerer's
part that does it. Imports dtype, errors, ops, lower_index, lower_vectors and uops."""
from __future__ import annotations
import functools
from typing import TYPE_CHECKING, Any, Callable, Optional
from kernopt.dtype import DType, dtypes
from kernopt.errors import UnsupportedError
from kernopt.lower_index import alu, value_dtype
from kernopt.lower_vectors import Lanes, Scalar, VectorPlan, Vecs
from kernopt.ops import BinaryOps, LazyOp, ReduceOps, TernaryOps, WMMAArg
from kernopt.uops import UOp, UOps

_F32 = dtypes.float32
# enum members as module constants: an attribute of an Enum class costs ~0.1 us on Python 3.11
_ALU, _DEFINE_ACC, _PHI = UOps.ALU, UOps.DEFINE_ACC, UOps.PHI
_ADD, _MUL, _MULACC = BinaryOps.ADD, BinaryOps.MUL, TernaryOps.MULACC
STORAGE_FLOATS = (dtypes.half, dtypes.bfloat16)   # reduced in float32 (see _reduce)
MAX_ACCS = 32   # independent accumulator lanes of one reduce, at most (CPU registers; see max_accs)

def max_accs(vector_width: int) -> int:
  """Accumulator lanes one reduce may have: MAX_ACCS scalars, or four of the target's vectors where that is more (at
  width 16, four rows of an upcast row sum each keep one 16-lane vector accumulator, not eight scalars)."""
  return max(MAX_ACCS, 4 * vector_width)

def accs_per_group(lanes: int, n_groups: int, vector_width: int) -> int:
  """Independent scalar accumulators for an output lane group of `lanes` source lanes, when n_groups share a reduce:
  past MAX_ACCS in all only when every group's accumulators then fill whole vectors the vectorize pass can pack."""
  wide = min(lanes, max_accs(vector_width) // n_groups)
  if vector_width > 1 and wide > MAX_ACCS // n_groups and wide % vector_width == 0: return wide
  return max(1, min(lanes, MAX_ACCS // n_groups))

class ReduceLowering:
  """The reduce and WMMA lowering of `kernopt.lowerer._Lowerer` (which sets these attributes)."""
  opts: Any
  lanes: list[tuple[int, ...]]
  lane_of: dict[tuple[int, ...], int]
  up_sizes: tuple[int, ...]
  first_upcast: int
  full_shape: tuple[Any, ...]
  group: list[int]
  range_of: dict[int, UOp]
  range_owner: dict[int, tuple]
  own_ranges: dict[tuple[int, tuple], UOp]
  reduced: dict[tuple, Lanes]
  paths: dict[LazyOp, tuple]
  acc_n: int
  vp: Optional[VectorPlan]
  if TYPE_CHECKING:
    lower: Callable[[LazyOp], Lanes]
    lanes_of: Callable[[LazyOp], list[UOp]]

  def _reduce_loops(self, x: LazyOp) -> tuple[tuple[UOp, ...], dict[UOp, UOp]]:
    """The RANGEs x accumulates over, and the shared RANGEs its source must be rebuilt with instead. Reduces over
    the same axes at the same nesting share their loops (one pass); a reduce over other axes, or nested differently,
    that also reduces an axis gets its own RANGE of that axis, so each loop nest completes on its own."""
    key = (tuple(x.arg), self.paths.get(x, ()))
    loops: list[UOp] = []
    sub: dict[UOp, UOp] = {}
    for a in sorted(x.arg):
      if a >= self.first_upcast: continue
      base = self.range_of[a]
      if self.range_owner.setdefault(a, key) == key:
        loops.append(base)
        continue
      if (rng := self.own_ranges.get((a, key))) is None:
        rng = self.own_ranges[(a, key)] = UOp(UOps.RANGE, base.dtype, base.src, base.arg + (len(self.own_ranges) + 1,))
      loops.append(rng)
      sub[base] = rng
    return tuple(loops), sub

  def _rebased(self, roots: list[UOp], sub: dict[UOp, UOp]) -> dict[UOp, UOp]:
    """sub (shared loops -> this reduce's own copies) extended for a source lowered under the shared loops: a reduce
    nested in that source whose value depends on a substituted loop (or on a loop copied here) gets its own
    accumulator and its own copies of its loops, so that its copy runs inside the new loops rather than sharing the
    first copy's (whose loops are nested in the shared ones: the two nests would form a cycle)."""
    sub = dict(sub)
    nodes = _toposort(roots)
    while True:
      dep = set(sub)
      for u in nodes:
        if u not in dep and any(s in dep for s in u.src): dep.add(u)
      copied = False
      for u in nodes:
        if u.op is not UOps.PHI or u not in dep or (acc := u.src[0]).op is not UOps.DEFINE_ACC or acc in sub: continue
        for r in acc.src:
          if r.op is UOps.RANGE and r not in sub:
            n = len(self.own_ranges) + 1
            sub[r] = self.own_ranges[(r.arg[0], ("nested copy", n))] = UOp(UOps.RANGE, r.dtype, r.src, r.arg + (n,))
        sub[acc] = UOp(UOps.DEFINE_ACC, acc.dtype, tuple(sub.get(r, r) for r in acc.src), (acc.arg[0], self.acc_n))
        self.acc_n += 1
        copied = True
      if not copied: return sub

  def _reduce(self, x: LazyOp) -> Lanes:
    fu = self.first_upcast
    ups = [a - fu for a in x.arg if a >= fu]
    if x.src[0].op is ReduceOps.WMMA:
      if x.op is not ReduceOps.SUM: raise UnsupportedError(f"{x.op} over a WMMA (only SUM accumulates tensor cores)")
      return self._wmma(x.src[0], tuple(self.range_of[a] for a in sorted(x.arg) if a < fu), ups)
    out_dt = value_dtype(x.dtype)
    # a half or bfloat16 SUM accumulates in float and is rounded once, at the end (DESIGN: storage floats are
    # computed in float); rounding the accumulator after every addition loses the small terms of a long sum
    dt = _F32 if x.op is ReduceOps.SUM and out_dt in STORAGE_FLOATS else out_dt
    op = {ReduceOps.SUM: BinaryOps.ADD, ReduceOps.MAX: BinaryOps.MAX}[x.op]  # type: ignore[index]
    init = dtypes.as_const(0 if x.op is ReduceOps.SUM else dtypes.min(dt), dt)
    if any(self.full_shape[a] == 0 for a in x.arg): return [UOp.const(out_dt, init)] * len(self.lanes)  # identity
    # loops claimed before the source is lowered: a reduce nested in this one over the same axis loops its own copy
    loops, sub = self._reduce_loops(x)
    vector = self.vp is not None and x in self.vp.vector
    src: Lanes = self.lower(x.src[0]) if vector else self.lanes_of(x.src[0])
    # a reduce equal to one already lowered (the same op over the same axes of the same source lanes, before its own
    # loops are substituted) is that one: softmax's row max feeds both its sum and its output, through two views
    key = (x.op, x.dtype, tuple(x.arg), tuple(src.vecs) if isinstance(src, Vecs) else tuple(src))
    if (done := self.reduced.get(key)) is None:
      if isinstance(src, Vecs): done = self._vector_reduce(op, dt, init, loops, sub, ups, src)
      elif dt != out_dt:
        done = [u.cast(out_dt) for u in self._scalar_reduce(op, dt, init, loops, sub, ups, [u.cast(dt) for u in src])]
      else: done = self._scalar_reduce(op, dt, init, loops, sub, ups, src)
      self.reduced[key] = done
    return done

  def _scalar_reduce(self, op: BinaryOps, dt: DType, init: Any, loops: tuple[UOp, ...], sub: dict[UOp, UOp],
                     ups: list[int], src: list[UOp]) -> list[UOp]:
    """A reduce of scalar source lanes over `loops` and the upcast axes `ups`, accumulated in dt."""
    if sub:
      memo: dict[UOp, UOp] = {}
      sub = self._rebased(src, sub)
      src = [substitute(u, sub, memo) for u in src]
    combine = lambda xs: functools.reduce(lambda a, b: alu(op, dt, a, b), xs)  # noqa: E731
    by_out: dict[tuple[int, ...], list[int]] = {}
    for i, ln in enumerate(self.lanes):
      by_out.setdefault(tuple(0 if j in ups else v for j, v in enumerate(ln)), []).append(i)
    done: dict[tuple[UOp, ...], UOp] = {}
    out: list[UOp] = [src[0]] * len(self.lanes)
    # the max_accs budget is shared by the distinct lane groups: an output lane group that reads the same values as
    # another (a reduce broadcast along an upcast or unrolled axis of a sibling) shares its accumulators
    n_groups = len({tuple(src[m] for m in members) for members in by_out.values()})
    for members in by_out.values():
      key = tuple(src[m] for m in members)
      if key not in done:
        # no loop (a reduce axis of 1, or wholly unrolled): the lanes combined from the identity, as an accumulator
        # would be (a float SUM of -0.0s is +0.0 either way; the simplifier folds an int identity away)
        if not loops: done[key] = combine((UOp.const(dt, init),) + key if op is BinaryOps.ADD else key)
        else:
          # independent accumulators, one per (output lane, unrolled lane) up to max_accs per reduce: they break
          # the loop-carried dependency chain; the partial results are combined after the loop
          per = accs_per_group(len(key), n_groups, self.opts.caps.vector_width)
          phis = []
          for c in range(per):
            acc = UOp(UOps.DEFINE_ACC, dt, loops, (init, self.acc_n))
            self.acc_n += 1
            phis.append(UOp(UOps.PHI, dt, (acc, self._accumulate(op, dt, acc, combine(key[c::per])))))
          done[key] = combine(phis)
      for m in members: out[m] = done[key]
    return out

  def _vector_reduce(self, op: BinaryOps, dt: DType, init: Any, loops: tuple[UOp, ...], sub: dict[UOp, UOp],
                     ups: list[int], src: Lanes) -> Lanes:
    """A reduce over loops of a source lowered as vectors: vector accumulators numbered as the scalar lanes' would be
    (lane order), so that each is the one the vectorize pass would pack. Over loops only, one accumulator per
    distinct source vector, and vector lanes out. Also over the vector axis (an unrolled reduce), an accumulator per
    lane as for scalar lanes (Scalar when max_accs would make fewer), each output lane group combining its lanes
    after the loop, read back from the vectors."""
    vp = self.vp
    assert vp is not None and loops and isinstance(src, Vecs)
    vecs = src.vecs
    if sub:
      memo: dict[UOp, UOp] = {}
      sub = self._rebased(vecs, sub)
      vecs = [substitute(u, sub, memo) for u in vecs]
    vdt = dt.vec(vp.w)
    def accumulate(v: UOp, n: int) -> UOp:
      acc = UOp(_DEFINE_ACC, vdt, loops, (init, n))
      return UOp(_PHI, vdt, (acc, self._accumulate(op, vdt, acc, v)))
    if not ups:
      if len(set(vecs)) == len(vecs):   # every lane its own value: lane l's accumulator is number acc_n + l
        firsts = [self.acc_n + g[0] for g in vp.groups]
        self.acc_n += len(vp.group_of)
        return Vecs([accumulate(v, n) for v, n in zip(vecs, firsts)])
      num: dict[tuple[UOp, int], int] = {}
      for g, t in zip(vp.group_of, vp.lane_t):
        if (k := (vecs[g], t)) not in num:
          num[k] = self.acc_n
          self.acc_n += 1
      done: dict[UOp, UOp] = {}
      for v in vecs:
        if v not in done: done[v] = accumulate(v, num[(v, 0)])
      return Vecs([done[v] for v in vecs])
    by_out: dict[tuple[int, ...], list[int]] = {}
    for i, ln in enumerate(self.lanes):
      by_out.setdefault(tuple(0 if j in ups else v for j, v in enumerate(ln)), []).append(i)
    keys = {m: tuple((vecs[vp.group_of[i]], vp.lane_t[i]) for i in members) for m, members in by_out.items()}
    n_groups = len(set(keys.values()))
    out: list[UOp] = [vecs[0]] * len(self.lanes)
    made: dict[tuple, UOp] = {}
    for m, members in by_out.items():
      key = keys[m]
      if key not in made:
        if max(1, min(len(key), max_accs(vp.w) // n_groups)) != len(key) or len(set(key)) != len(key): raise Scalar
        phis = {v: accumulate(v, self.acc_n + c) for c, (v, t) in enumerate(key) if t == 0}
        if len(phis) * vp.w != len(key): raise Scalar
        self.acc_n += len(key)
        lanes = [UOp(UOps.GEP, dt, (phis[v],), t) for v, t in key]
        made[key] = functools.reduce(lambda a, b: alu(op, dt, a, b), lanes)
      for i in members: out[i] = made[key]
    return out

  def _accumulate(self, op: BinaryOps, dt: DType, acc: UOp, x: UOp) -> UOp:
    """acc op x; acc + a*b as MULACC(a, b, acc) when the dialect fuses float32 accumulation."""
    if op is _ADD and x.op is _ALU and x.arg is _MUL and dt.scalar() == dtypes.float32 and \
       self.opts.caps.fused_accumulate:
      return UOp(_ALU, dt, (x.src[0], x.src[1], acc), _MULACC)
    return alu(op, dt, acc, x)

  def _wmma(self, w: LazyOp, loops: tuple[UOp, ...], ups: list[int]) -> list[UOp]:
    """Tensor-core instructions: D = A·B + C per combination of the upcast axes the instruction doesn't consume.
    A (B) is the vector of the lanes along upcast_axes[0] ([1]) with the other consumed axes at 0, C and D the
    lanes along upcast_axes[2]; instances differing in the reduced upcast axes `ups` chain through C, and across
    the reduce `loops` C is the accumulators, which take D's lanes."""
    arg: WMMAArg = w.arg
    fu = self.first_upcast
    ua, ub, uc = (a - fu for a in arg.upcast_axes)
    red = {a - fu for a in arg.reduce_axes}
    na, nb, nc = arg.thread_local_sizes
    n_up = len(self.up_sizes)
    if not all(0 <= a < n_up for a in (ua, ub, uc, *red)) or \
       (self.up_sizes[ua], self.up_sizes[ub], self.up_sizes[uc]) != (na, nb, nc) or uc in red or \
       not {ua, ub} <= red | {uc}:
      raise UnsupportedError(f"WMMA {arg.name}: upcast axes {arg.upcast_axes} / reduce axes {arg.reduce_axes} don't "
                             f"hold fragments {arg.thread_local_sizes} in upcast sizes {self.up_sizes} (first {fu})")
    if self.group: raise UnsupportedError(f"WMMA {arg.name} inside a GROUP reduce")
    a_vals, b_vals = self.lanes_of(w.src[0]), self.lanes_of(w.src[1])
    dt = arg.dtype_out
    def at(ln: tuple[int, ...], fixed: dict[int, int]) -> int:
      return self.lane_of[tuple(fixed.get(j, v) for j, v in enumerate(ln))]
    def frag(vals: list[UOp], ln: tuple[int, ...], axis: int, n: int) -> UOp:
      zero = {j: 0 for j in red | {uc}}
      return UOp(UOps.VECTORIZE, arg.dtype_in.vec(n), tuple(vals[at(ln, {**zero, axis: i})].cast(arg.dtype_in)
                                                            for i in range(n)))
    # one C vector per output: the lanes with the consumed, reduced and C axes at 0
    outs: dict[tuple[int, ...], list[tuple[int, ...]]] = {}
    for ln in self.lanes:
      if any(ln[j] for j in red | {uc}): continue
      outs.setdefault(tuple(0 if j in ups else v for j, v in enumerate(ln)), []).append(ln)
    out: list[Optional[UOp]] = [None] * len(self.lanes)
    for key, instances in outs.items():
      if loops:
        accs = [UOp(UOps.DEFINE_ACC, dt, loops, (dtypes.as_const(0, dt), self.acc_n + i)) for i in range(nc)]
        self.acc_n += nc
      else: accs = [UOp.const(dt, 0)] * nc
      c = UOp(UOps.VECTORIZE, dt.vec(nc), tuple(accs))
      for ln in instances:
        c = UOp(UOps.WMMA, dt.vec(nc), (frag(a_vals, ln, ua, na), frag(b_vals, ln, ub, nb), c), arg)
      res = [UOp(UOps.GEP, dt, (c,), i) for i in range(nc)]
      if loops: res = [UOp(UOps.PHI, dt, (acc, r)) for acc, r in zip(accs, res)]
      for i, r in enumerate(res): out[at(key, {uc: i})] = r
    # lanes along the consumed and reduced axes share their output's value
    return [out[at(ln, {j: 0 for j in red | set(ups)})] for ln in self.lanes]  # type: ignore[misc]

def reduce_paths(ast: LazyOp) -> dict[LazyOp, tuple]:
  """The reduce axes of the reduces enclosing each reduce of ast (outermost first), on its first path from a STORE."""
  paths: dict[LazyOp, tuple] = {}
  seen: set[tuple[LazyOp, tuple]] = set()
  stack: list[tuple[LazyOp, tuple]] = [(ast, ())]   # depth first, sources in order (no recursion: deep ASTs)
  while stack:
    op, path = stack.pop()
    if (op, path) in seen: continue
    seen.add((op, path))
    if op.op in ReduceOps:
      paths.setdefault(op, path)
      path = path + (tuple(op.arg) if isinstance(op.arg, tuple) else (),)
    stack.extend([(s, path) for s in reversed(op.src)])
  return paths

def _toposort(roots: list[UOp]) -> list[UOp]:
  """Every UOp reachable from roots, sources before users (iterative)."""
  order: list[UOp] = []
  seen: set[UOp] = set()
  for root in roots:
    stack: list[tuple[UOp, bool]] = [(root, False)]
    while stack:
      u, ready = stack.pop()
      if ready:
        order.append(u)
        continue
      if u in seen: continue
      seen.add(u)
      stack.append((u, True))
      stack.extend([(s, False) for s in reversed(u.src) if s not in seen])
  return order

def substitute(u: UOp, sub: dict[UOp, UOp], memo: dict[UOp, UOp]) -> UOp:
  """u with every UOp in sub replaced (only the UOps that depend on one are rebuilt)."""
  stack: list[tuple[UOp, bool]] = [(u, False)]   # sources before users, without recursion
  while stack:
    x, ready = stack.pop()
    if x in memo: continue
    if x in sub: memo[x] = sub[x]
    elif not x.src: memo[x] = x
    elif not ready:
      stack.append((x, True))
      stack.extend([(s, False) for s in x.src if s not in memo])
    else:
      srcs = tuple([memo[s] for s in x.src])
      memo[x] = x if all(a is b for a, b in zip(srcs, x.src)) else UOp(x.op, x.dtype, srcs, x.arg)
  return memo[u]

__all__ = ["ReduceLowering", "MAX_ACCS", "accs_per_group", "max_accs", "reduce_paths", "substitute"]
