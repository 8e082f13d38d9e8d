"""Vector UOps from the lowerer, for the profiles whose capabilities pack lanes (vector_width > 1, a loop kernel: the
native CPU). An upcast axis j of the kernel is the vector axis: each aligned run of W lanes along it (a group) is one
vector UOp where the vectorize pass (kernopt/passes/vectorize.py) would pack the W scalar lanes of the same op: a
float32 load or store of unit stride along j, the ADD/MUL/MAX between such values and values uniform over a group
(broadcast), and the accumulators, updates and PHIs of a reduce over loops (or over the vector axis too: its lanes are
combined after the loop). A guarded (padded) load is one masked vector load per group where the profile has them
(caps.masked_loads: the lanes' gates as an int32 lane mask, which the borders pass folds in a window's interior),
else its lanes stay scalar, gathered by a VECTORIZE. Everything else keeps its scalar lanes, and the vectorize pass
still runs after (it finds nothing left to pack in what is lowered as vectors).

The rendered source must compute what the vectorize pass makes of the scalar lanes, lane for lane the same ops in the
same order; it is that source byte for byte except where lanes are gated one by one (a masked load's or store's lane
mask is built here, before the simplifier, there after it, and the linearizer places it), so the list must be the
pass's list (up to where constants and single-read broadcasts sit: both are spelled inline). `plan` decides per AST
node (vector, uniform or scalar lanes) and keeps scalar lanes wherever packing is not certain (Scalar: the whole
kernel). The linearizer orders by a depth-first walk from the SINK, which on scalar lanes meets the lanes one output
lane after another, and the pass puts a packed op at its last lane: `order_hints` computes that order and
`vector_sink` lists its `anchors` in the SINK, so that the walk meets every UOp there.
Imports dtype, lower_index, ops, passes.load_masks, passes.vectorize, shape/, uopgraph and uops."""
from __future__ import annotations
from typing import TYPE_CHECKING, Any, Callable, Optional, Union
from kernopt.dtype import DType, ImageDType, dtypes
from kernopt.lower_index import value_dtype
from kernopt.ops import BinaryOps, BufferOps, LazyOp, MetaOps, ReduceOps, TernaryOps, UnaryOps
from kernopt.passes.load_masks import lane_mask
from kernopt.passes.vectorize import half_width
from kernopt.shape.symbolic import Node, NumNode, Variable
from kernopt.uopgraph import graph_rewrite, simplifier
from kernopt.uops import UOp, UOps

_F32 = dtypes.float32
_ALU, _CONST, _LOAD, _STORE, _VECTORIZE = UOps.ALU, UOps.CONST, UOps.LOAD, UOps.STORE, UOps.VECTORIZE
_PHI, _DEFINE_ACC, _RANGE, _GEP = UOps.PHI, UOps.DEFINE_ACC, UOps.RANGE, UOps.GEP
VECTOR_ALU = frozenset((BinaryOps.ADD, BinaryOps.MUL, BinaryOps.MAX))   # the vectorize pass's, less MULACC (no AST op)
_ELEMENTWISE = (UnaryOps, BinaryOps, TernaryOps)
# lanes of an AST node: one vector per group, one scalar shared by each group's lanes, or any scalar per lane
VEC, UNIFORM, SCALAR = 2, 1, 0

class Scalar(Exception):
  """The kernel turned out not to be packable as planned: it is lowered again with scalar lanes only."""

class Vecs:
  """A value lowered as vectors: vecs[g] holds the W lanes of group g."""
  __slots__ = ("vecs",)
  def __init__(self, vecs: list[UOp]): self.vecs = vecs

Lanes = Union[list[UOp], Vecs]

class VectorPlan:
  """Which AST nodes of a kernel are lowered as vectors along upcast axis j, W lanes a group. groups[g] lists the
  lanes of group g (lane order, t = 0..W-1 along j); group_of[l], lane_t[l] place lane l."""
  def __init__(self, j: int, w: int, groups: list[list[int]], vector: set[LazyOp]):
    self.j, self.w, self.groups, self.vector = j, w, groups, vector
    self.group_of = [0] * sum(len(g) for g in groups)
    self.lane_t = [0] * len(self.group_of)
    for g, members in enumerate(groups):
      for t, ln in enumerate(members): self.group_of[ln], self.lane_t[ln] = g, t

def plan(lw: Any, ast: LazyOp) -> Optional[VectorPlan]:
  """The vector plan of a kernel for lowerer lw, None when nothing is lowered as vectors (then the kernel's lanes are
  scalar, as on every other profile)."""
  c = lw.opts.caps
  w = c.vector_width
  if w < 2 or c.has_local or c.supports_float4 or c.supports_images or len(lw.lanes) < w: return None
  if any(x.op is ReduceOps.WMMA or (x.op in (BufferOps.LOAD, BufferOps.STORE) and
                                    (x.arg.idx < 0 or isinstance(x.arg.dtype, ImageDType))) or
         (x.op is ReduceOps.SUM and x.dtype in (dtypes.half, dtypes.bfloat16)) for x in ast.lazyops):
    return None   # (a storage-float SUM accumulates in float: lower_reduce does it on scalar lanes)
  # (padded loads become masked vector loads, or VECTORIZEs of their gated lanes: the borders pass reads the gates)
  cands = [j for j, s in enumerate(lw.up_sizes) if s % w == 0]
  if not cands and (h := half_width(w)):
    # the vectorize pass's fallback width (AVX-512's 8-lane vectors: a 56-wide conv row's half-width tile), unless
    # the pass packs full vectors across axes (an 8-wide image's two rows are 16 contiguous lanes)
    if any(_contiguous_run(lw, st, w) for st in ast.src): return None
    w, cands = h, [j for j, s in enumerate(lw.up_sizes) if s % h == 0]
  # the axis the outputs are stored along with unit stride first
  def unit_store(j: int) -> bool:
    for s in ast.src:
      lin = lw.linear_of(lw.node_expr(s)[0])
      if lin is None or lin[1].get(j) != 1: return False
    return True
  for j in sorted(cands, key=lambda j: not unit_store(j)):
    if (p := _plan_axis(lw, ast, j, w)) is not None: return p
  return None

def _contiguous_run(lw: Any, st: LazyOp, w: int) -> bool:
  """Whether w of store st's lanes are stored at consecutive offsets."""
  if (lin := lw.linear_of(lw.node_expr(st)[0])) is None: return False
  offs = sorted(set(lw.lane_offsets(lin[1])))
  return any(offs[i + w - 1] - offs[i] == w - 1 for i in range(len(offs) - w + 1))

def _plan_axis(lw: Any, ast: LazyOp, j: int, w: int) -> Optional[VectorPlan]:
  vj = next(v for v, k in lw.up_vars.items() if k == j)
  forced: set[LazyOp] = set()
  nodes = ast.lazyops
  while True:
    cls, need = _classify(lw, nodes, j, vj, forced)
    if not need: break
    forced |= need
  # the nodes lowered as vectors: those with vector lanes, and the reduces of vector sources (uniform or not)
  vector = {x for x, k in cls.items() if k == VEC or (x.op in ReduceOps and cls.get(x.src[0]) == VEC)}
  if not vector: return None
  groups = lw.lane_groups(j, w)
  if not _keys_ok(lw, nodes, vector, groups, j, w) or not _stores_ok(lw, ast, cls, vector, w, groups): return None
  return VectorPlan(j, w, groups, vector)

def _classify(lw: Any, nodes: list[LazyOp], j: int, vj: Variable,
              forced: set[LazyOp]) -> tuple[dict[LazyOp, int], set[LazyOp]]:
  """Each node's lanes (VEC, UNIFORM or SCALAR) with the nodes in `forced` scalar, and the vector nodes some reader
  needs as scalar lanes (they are forced scalar on the next try)."""
  cls: dict[LazyOp, int] = {}
  need: set[LazyOp] = set()
  fu = lw.first_upcast
  def scalar_read(x: LazyOp) -> None:
    for s in x.src:
      if cls.get(s) == VEC: need.add(s)
  for x in nodes:
    op = x.op
    if op is MetaOps.KERNEL: continue
    if op is BufferOps.LOAD or op is BufferOps.CONST:
      idx, valid = lw.node_expr(x)
      if vj not in valid.vars() and (op is BufferOps.CONST or vj not in idx.vars()): k = UNIFORM
      elif op is BufferOps.LOAD and x.arg.dtype == _F32 and x not in forced and \
           (lin := lw.linear_of(idx)) is not None and lin[1].get(j) == 1: k = VEC
      else: k = SCALAR
    elif op is BufferOps.STORE:
      idx, valid = lw.node_expr(x)
      # a guarded store's guard holds for every lane of a group or none (a PADTO'd row's): one guarded vector store;
      # a guard per lane (PADTO'd columns): one masked vector store, where the profile has them
      if cls[x.src[0]] == VEC and not (x.arg.dtype == _F32 and (isinstance(valid, NumNode) or vj not in valid.vars()
                                                                or lw.opts.caps.masked_stores)
                                       and (lin := lw.linear_of(idx)) is not None and lin[1].get(j) == 1):
        need.add(x.src[0])
      continue
    elif op in ReduceOps:
      src, ups = cls[x.src[0]], [a for a in x.arg if a >= fu]
      if any(lw.full_shape[a] == 0 for a in x.arg): k = UNIFORM
      elif src == VEC:
        # vector accumulators: over loops only (vector lanes out), or also over the vector axis (its lanes combined
        # after the loop, uniform out)
        if op in (ReduceOps.SUM, ReduceOps.MAX) and value_dtype(x.dtype) == _F32 and x not in forced and \
           len(ups) < len(x.arg) and (not ups or fu + j in x.arg): k = UNIFORM if ups else VEC
        else:
          need.add(x.src[0])
          k = SCALAR
      else: k = UNIFORM if src == UNIFORM or fu + j in x.arg else SCALAR
    elif type(op) in _ELEMENTWISE:
      srcs = [cls[s] for s in x.src]
      if VEC in srcs:
        if op in VECTOR_ALU and value_dtype(x.dtype) == _F32 and SCALAR not in srcs and x not in forced: k = VEC
        else:
          scalar_read(x)
          k = SCALAR
      else: k = UNIFORM if all(s == UNIFORM for s in srcs) else SCALAR
    else: raise Scalar   # no other op in an optimized AST
    cls[x] = k
  return cls, need

def first_offsets(lanes: list[tuple[int, ...]], groups: list[list[int]], strides: dict[int, int]) -> list[int]:
  """The offset Σ stride_j·u_j of each group's first lane."""
  return [sum(st * lanes[g[0]][j] for j, st in strides.items()) for g in groups]

def _stores_ok(lw: Any, ast: LazyOp, cls: dict[LazyOp, int], vector: set[LazyOp], w: int,
               groups: list[list[int]]) -> bool:
  """The vectorize pass also packs the lanes stored by W contiguous float32 stores, from the stores down through
  their values (along the stores' axis, gathering what isn't contiguous there): such a store of scalar lanes must
  not read a node lowered as vectors (along the vector axis), or the two packings would differ."""
  for st in ast.src:
    # a store the simplifier may drop (a guard it folds to false) must not read vectors: they are listed in the SINK
    if not isinstance(valid := lw.node_expr(st)[1], NumNode) and any(x in vector for x in st.src[0].lazyops) and \
       (cls[st.src[0]] != VEC or _guard_may_close(lw, valid, groups)): return False
    if cls[st.src[0]] == VEC or st.arg.dtype != _F32: continue
    lin = lw.linear_of(lw.node_expr(st)[0])
    if lin is not None:
      offs = sorted(set(lw.lane_offsets(lin[1])))
      if not any(offs[i + w - 1] - offs[i] == w - 1 for i in range(len(offs) - w + 1)): continue
    if any(x in vector for x in st.src[0].lazyops): return False
  return True

def _guard_may_close(lw: Any, valid: Node, groups: list[list[int]]) -> bool:
  """Whether the simplifier folds some group's store guard (its first lane's) to false."""
  gates = lw.per_lane(valid, True)
  for g in groups:
    u = gates[g[0]]
    if u.op is not _CONST: u = graph_rewrite(u, simplifier)
    if u.op is _CONST and not u.arg: return True
  return False

def _keys_ok(lw: Any, nodes: list[LazyOp], vector: set[LazyOp], groups: list[list[int]], j: int, w: int) -> bool:
  """The vectorize pass packs float32 loads of one buffer and index base by runs of W consecutive offsets: every key a
  vector load uses must hold its groups' runs only, disjoint or the same, and no other load's offsets."""
  loads = [x for x in nodes if x.op is BufferOps.LOAD and x.arg.dtype == _F32]
  bufs = {x.arg.idx for x in loads if x in vector}
  runs: dict[tuple, set[int]] = {}
  others: dict[tuple, set[int]] = {}
  for x in loads:
    if x.arg.idx not in bufs: continue   # no vector load of this buffer: nothing to collide with
    lin = lw.linear_of(lw.node_expr(x)[0])
    if lin is None:
      if x in vector: return False
      others.setdefault((x.arg.idx, None), set()).add(0)
      continue
    base, strides = lin
    key, c = lw.base_key(base)
    key = (x.arg.idx, key)
    if x in vector: runs.setdefault(key, set()).update(c + o for o in first_offsets(lw.lanes, groups, strides))
    else: others.setdefault(key, set()).update(c + o for o in lw.lane_offsets(strides))
  for key, starts in runs.items():
    ss = sorted(starts)
    if any(b - a < w for a, b in zip(ss, ss[1:])): return False
    if (key[0], None) in others: return False
    if key in others and any(any(s <= o < s + w for s in ss) for o in others[key]): return False
  return True

# ***** the order the scalar lanes would have had *****

def order_hints(outs: list[tuple[Optional[list[list[UOp]]], list[UOp]]], vp: VectorPlan,
                params: list[UOp]) -> list[UOp]:
  """Every UOp the stores of `outs` read, in the order the linearizer's depth-first walk of the scalar lanes (the SINK
  lists each output's lane stores in lane order) meets them, a vector op where its last lane is met. outs: per output
  its vector stores (one per group; None for a scalar output) and its scalar stores. Lane t of a vector op reads lane
  t of its vector sources and the same scalars for every t, so the walk from the store lane (group g, t) meets the
  same vector ops for every t and new scalars only at t = 0: one walk per group gives both, the scalars taking the
  place of the group's first lane and the vector ops that of its last. A scalar reading lane t of a vector (a GEP:
  lanes combined after a loop) meets the vector's lane 0 first and its last lane at the GEP of lane W-1: the vector
  ops under it are placed there (the list is then no topological order: the SINK's walk places a GEP's vector
  before it, after the scalars under it). Broadcasts and vector constants are left out: the walk meets them just
  before their op, where the vectorize pass emits them."""
  order: list[UOp] = []
  state: dict[UOp, bool] = {}
  deferred: dict[UOp, list[UOp]] = {}
  last = vp.w - 1
  # the loop each UOp is placed in, as the linearizer nests them: non-reduce loops by axis, the reduce loops inside
  # (a RANGE's key), an accumulator in its deepest loop's, a PHI's value after its loops (in the innermost non-reduce
  # loop, resolved at the end). The vectorize pass emits a broadcast beside its op, the linearizer with its scalar:
  # the two places must agree for a broadcast read more than once (the renderer names it where it is placed; one read
  # once is spelled inline)
  after: dict[UOp, tuple] = {}
  bcasts: list[tuple[UOp, tuple, tuple]] = []
  accs: set[tuple[UOp, ...]] = set()
  def place(u: UOp) -> None:
    op, src = u.op, u.src
    if op is _RANGE: a: tuple = (1 if u.arg[1] else 0,) + u.arg[:1] + u.arg[2:]
    elif op is _DEFINE_ACC:
      accs.add(src)
      a = max((after[r] for r in src), default=_NOWHERE)
    elif op is _PHI: a = _AFTER_LOOPS
    else:
      a, bc = _NOWHERE, None
      for x in src:
        xo = x.op
        if xo is _CONST: continue
        if xo is _VECTORIZE:
          if is_gather(x): ax = max([after[m] for m in x.src])
          else:
            ax = after[x.src[0]]
            bc = x if bc is None else bc
        else: ax = after[x]
        if ax > a: a = ax
      if bc is not None:
        for x in src:
          if x.op is _VECTORIZE and not is_gather(x): bcasts.append((x, after[x.src[0]], a))
    after[u] = a
  def walk(root: UOp, scalars: list[UOp], vectors: list[UOp], lanes: Optional[list[list[UOp]]] = None) -> None:
    """kernopt.patterns.toposort's walk from root: scalars (met at lane 0) into `scalars`, vector ops (met at lane
    W-1) into `vectors`, lane t of a gather (0 < t < W-1) into lanes[t]."""
    stack: list[tuple[UOp, list[UOp], list[UOp]]] = [(root, vectors, scalars)]
    pop, push, get = stack.pop, stack.append, state.get
    while stack:
      u, into, scalars = pop()
      op, src = u.op, u.src
      if (st := get(u)) is not None:
        if st is False:
          state[u] = True
          place(u)
          if op is _GEP:
            if u.arg == last: scalars.extend(deferred.pop(src[0], ()))
            scalars.append(u)
          else:
            dt = src[2].dtype if op is _STORE else u.dtype
            (into if dt is not None and dt.count > 1 else scalars).append(u)
        continue
      if not src:   # placed at once: nothing would be pushed after it
        state[u] = True
        after[u] = _NOWHERE
        (into if u.dtype is not None and u.dtype.count > 1 else scalars).append(u)
        continue
      state[u] = False
      push((u, into, scalars))
      if op is _GEP:
        if src[0] not in state: push((src[0], deferred.setdefault(src[0], []), scalars))
      elif op is _ALU and u.dtype is not None and u.dtype.count > 1:
        for s in reversed(src):
          if s.op is _CONST: continue
          if s.op is _VECTORIZE:
            if is_gather(s):   # lane t of the gather is met at lane t: the last with the vector ops
              for t in range(last, -1, -1):
                if (m := s.src[t]) not in state:
                  push((m, into, into if t == last else scalars if t == 0 or lanes is None else lanes[t]))
              continue
            s = s.src[0]
          if s not in state: push((s, into, scalars))
      else:
        for s in reversed(src):
          if s not in state: push((s, into, scalars))
  for vs, ss in outs:
    if vs is None:
      for s in ss: walk(s, order, order)
      continue
    at: list[tuple[int, list[UOp]]] = []
    for g, sts in enumerate(vs):
      lanes: list[list[UOp]] = [[] for _ in range(vp.w)]
      for st in sts: walk(st, lanes[0], lanes[last], lanes)
      at += [(ln, us) for ln, us in zip(vp.groups[g], lanes) if us]
    for _, us in sorted(at, key=lambda x: x[0]): order.extend(us)
  for p in params: walk(p, order, order)
  if any(deferred.values()): raise Scalar   # a vector read back from some lanes only: never built so
  if len(accs) > 1: raise Scalar   # accumulators over different loops: their nesting is the linearizer's choice
  inner = max((a for u, a in after.items() if u.op is _RANGE and a[0] == 0), default=_NOWHERE)
  fix = lambda a: inner if a is _AFTER_LOOPS else a  # noqa: E731
  reads: dict[UOp, int] = {}
  for v, _, _ in bcasts: reads[v] = reads.get(v, 0) + 1
  if any(fix(x) != fix(a) and reads[v] > 1 for v, x, a in bcasts): raise Scalar
  return order

_NOWHERE, _AFTER_LOOPS = (-1,), (0, float("inf"))

def is_gather(v: UOp) -> bool:
  """A VECTORIZE of different lanes (a gather), not one scalar broadcast."""
  src = v.src
  return src[-1] is not src[0] or src.count(src[0]) != len(src)

def vector_sink(outs: list[tuple[Optional[list[list[UOp]]], list[UOp]]], vp: VectorPlan, params: list[UOp]) -> UOp:
  """The SINK of a kernel lowered with vectors: its anchors (see `anchors`) listed in `order_hints`' order, then the
  parameters, so that the linearizer's walk meets each UOp where it met the scalar lanes the vectorize pass would
  pack. outs: per output its stores per group (None for a scalar output) and its scalar stores."""
  hints = anchors(order_hints(outs, vp, params))
  seen = set(hints)
  return UOp(UOps.SINK, None, tuple(hints) + tuple(p for p in params if p not in seen))

_FIXED = (UOps.CONST, UOps.DEFINE_GLOBAL, UOps.DEFINE_VAR)

def anchors(order: list[UOp]) -> list[UOp]:
  """The UOps of `order` to list in the SINK: the stores, the vector ops, and the scalars a vector op or an unguarded
  store reads (an index, a broadcast's scalar, a stored value). No simplifier rule (they run on the SINK before the
  linearizer) stops those readers reading a non-constant source, so each stays in the program; a UOp listed whose
  reader the simplifier rewrites away (folded index math, a load behind a constant guard) would stay too. The
  linearizer's walk from them places the rest (index math below an index, a scalar's sources, the GEPs and lanes
  combined after a loop) as on scalar lanes: each source just before its first reader. Constants and parameters
  are placed by kind, not by the walk."""
  keep: set[UOp] = set()
  for u in order:
    op = u.op
    if op is _STORE: vec = u.src[2].dtype.count > 1   # type: ignore[union-attr]
    elif u.dtype is not None and u.dtype.count > 1: vec = True
    else: continue
    keep.add(u)
    if vec or len(u.src) == 3:
      for s in u.src:
        for x in ((s.src if is_gather(s) else s.src[:1]) if s.op is _VECTORIZE else (s,)):
          if x.op not in _FIXED and (x.dtype is None or x.dtype.count == 1): keep.add(x)
  return [u for u in order if u in keep]

def may_fold(u: UOp, memo: dict[UOp, bool]) -> bool:
  """Whether the simplifier may turn u into a constant: all its sources may (constant folding), or a WHERE's
  condition may (it picks a branch), or a load's guard folds to false (it reads its alternative; one that folds to
  true leaves a plain load: a PADTO'd row's A element). A broadcast of a scalar that may fold is not built: the
  vectorize pass would broadcast the folded constant as a vector constant."""
  if (ret := memo.get(u)) is not None: return ret
  op = u.op
  if op is _CONST: ret = True
  elif op is _LOAD:
    ret = len(u.src) == 4 and (g := graph_rewrite(u.src[2], simplifier)).op is _CONST and not g.arg
  elif op is _ALU or op is UOps.CAST or op is UOps.BITCAST:
    ret = all(may_fold(s, memo) for s in u.src) or (u.arg is TernaryOps.WHERE and may_fold(u.src[0], memo))
  else: ret = False
  memo[u] = ret
  return ret

# ***** the lowerer's vector ops *****

class VectorLowering:
  """The vector loads, stores and ALU ops of `kernopt.lowerer._Lowerer` (which sets these attributes)."""
  vp: Optional[VectorPlan]
  opts: Any
  idx_dt: DType
  up_vars: dict[Variable, int]
  lanes: list[tuple[int, ...]]
  folds: dict[UOp, bool]
  if TYPE_CHECKING:
    node_expr: Callable[[LazyOp], tuple[Node, Node]]
    check: Callable[[Node], None]
    render: Callable[[Any], UOp]
    linear_of: Callable[[Node], Optional[tuple[Node, dict[int, int]]]]
    offset_index: Callable[[Node, UOp, int], UOp]
    _buf: Callable[[Any], UOp]
    _scalar_load: Callable[[LazyOp], list[UOp]]
    per_lane: Callable[..., list[UOp]]
    const: Callable[[int], UOp]

  def _vector_index(self, x: LazyOp) -> list[UOp]:
    """The index of each group's first lane of buffer access x (unit stride along the vector axis)."""
    vp = self.vp
    assert vp is not None
    idx = self.node_expr(x)[0]
    if self.idx_dt is dtypes.int32: self.check(idx)   # lanes' values lie in idx's bounds
    lin = self.linear_of(idx)
    assert lin is not None
    base, strides = lin
    b = self.render(base)
    return [self.offset_index(base, b, o) for o in first_offsets(self.lanes, vp.groups, strides)]

  def _vector_load(self, x: LazyOp) -> Vecs:
    """Each group's vector LOAD. Where lanes are guarded (padding) and the profile has masked loads, the masked
    vector LOAD(buf, index, int32 lane mask), bit t set where lane t's guard holds (passes.load_masks.lane_mask; the
    borders pass folds the mask to every lane open in a window's interior: a plain load); else the VECTORIZE of the
    guarded scalar lanes, which the vectorize pass gathers."""
    vp = self.vp
    assert vp is not None
    vdt = x.arg.dtype.vec(vp.w)
    if not isinstance(valid := self.node_expr(x)[1], NumNode):
      if not self.opts.caps.masked_loads:
        lanes = self._scalar_load(x)
        return Vecs([UOp(_VECTORIZE, vdt, tuple(lanes[m] for m in g)) for g in vp.groups])
      gates = self.per_lane(valid, True)
      buf = self._buf(x.arg)
      zero = UOp(_VECTORIZE, vdt, (UOp.const(x.arg.dtype, 0.0),) * vp.w)
      loads: dict[tuple[UOp, tuple], UOp] = {}   # groups along other upcast axes share their lanes' gates
      out = []
      for g, i in zip(vp.groups, self._vector_index(x)):
        lane_gates = tuple(None if (u := gates[m]).op is _CONST and u.arg else u for m in g)
        if (ld := loads.get((i, lane_gates))) is None:
          if all(u is None for u in lane_gates): ld = UOp(_LOAD, vdt, (buf, i))
          elif all(u is not None and u.op is _CONST for u in lane_gates): ld = zero   # every lane closed
          else: ld = UOp(_LOAD, vdt, (buf, i, lane_mask(lane_gates)))
          loads[(i, lane_gates)] = ld
        out.append(ld)
      return Vecs(out)
    buf = self._buf(x.arg)
    return Vecs([UOp(_LOAD, vdt, (buf, i)) for i in self._vector_index(x)])

  def _vector_store(self, x: LazyOp, vals: Vecs) -> list[list[UOp]]:
    """Each group's vector STORE; a guarded one (the guard the same for every lane of a group: a PADTO'd row) as the
    scalar lanes' are: STORE(buf, WHERE(guard, index, 0), value, guard). Where the guard differs between a group's
    lanes (PADTO'd columns), the masked vector STORE(buf, index, value, int32 lane mask), bit t set where lane t's
    guard holds (passes.load_masks.lane_mask). Per group, its stores (none where the guard is false)."""
    vp = self.vp
    assert vp is not None
    buf = self._buf(x.arg)
    idxs = self._vector_index(x)
    if isinstance(valid := self.node_expr(x)[1], NumNode):
      return [[UOp(_STORE, None, (buf, i, v))] for i, v in zip(idxs, vals.vecs)]
    gates = self.per_lane(valid, True)
    out = []
    for g, i, v in zip(vp.groups, idxs, vals.vecs):
      gate = gates[g[0]]
      if any(gates[m] is not gate for m in g):
        mask = lane_mask(tuple(None if gates[m].op is _CONST and gates[m].arg else gates[m] for m in g))
        out.append([UOp(_STORE, None, (buf, i, v, mask))])
      else: out.append([] if (st := self._gated_store(buf, i, v, gate)) is None else [st])
    return out

  def _gated_store(self, buf: UOp, i: UOp, v: UOp, gate: UOp) -> Optional[UOp]:
    """STORE(buf, i, v), guarded as STORE(buf, WHERE(gate, i, 0), v, gate) unless the gate is a constant (None:
    false)."""
    if gate.op is _CONST: return UOp(_STORE, None, (buf, i, v)) if gate.arg else None
    return UOp(_STORE, None, (buf, UOp(_ALU, i.dtype, (gate, i, self.const(0)), TernaryOps.WHERE), v, gate))

  def _vector_alu(self, x: LazyOp, dt: DType, src: list[Lanes]) -> Vecs:
    """ALU op x of vector sources and sources uniform over each group (broadcast; a constant as a vector
    constant)."""
    vp = self.vp
    assert vp is not None
    vdt, w = dt.vec(vp.w), vp.w
    firsts = [g[0] for g in vp.groups]
    cols: list[list[UOp]] = []
    for s in src:
      if isinstance(s, Vecs):
        cols.append(s.vecs)
        continue
      col = []
      for f in firsts:
        if (u := s[f]).op is _CONST: col.append(UOp(_CONST, vdt, (), u.arg))
        elif may_fold(u, self.folds): raise Scalar
        else: col.append(UOp(_VECTORIZE, vdt, (u,) * w))
      cols.append(col)
    return Vecs([UOp(_ALU, vdt, tuple(c[g] for c in cols), x.op) for g in range(len(firsts))])

__all__ = ["VectorPlan", "VectorLowering", "Vecs", "Lanes", "Scalar", "plan", "order_hints", "vector_sink", "anchors",
           "may_fold"]
