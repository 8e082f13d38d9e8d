"""Lowering of an optimized AST (Kernel.get_optimized_ast) to a UOp graph: axes become SPECIAL thread indices,
RANGE loops or expanded lanes; buffers become guarded LOADs/STOREs; reduces become accumulators. On a profile that
packs lanes into vectors (kernopt.lower_vectors) the lanes that would be packed are built as vector UOps directly.
The parts live beside it: index rendering (lower_index), reduces (lower_reduce), vector lanes (lower_vectors) and the
GPU's float4 and image accesses (lower_float4). Imports dtype, errors, helpers, ops, renderers, shape/, uops,
lower_index, lower_vectors, lower_reduce and lower_float4."""
from __future__ import annotations
import functools, itertools
from operator import itemgetter
from typing import Any, Optional, Sequence
from kernopt.dtype import DType, ImageDType, dtypes
from kernopt.errors import UnsupportedError, VerifyError
from kernopt.helpers import all_int, dedup, prod
from kernopt.lower_float4 import Float4Lanes
from kernopt.lower_index import (I32, I64, INT32_MAX, INT32_MIN, RENDER_OPS, Wide, alu, as_bool, fold_dims, index_const,
                                 linear, upper, value_dtype)
from kernopt.lower_reduce import ReduceLowering, reduce_paths
from kernopt.lower_vectors import Lanes, Scalar, VectorLowering, VectorPlan, Vecs, plan, vector_sink
from kernopt.ops import BinaryOps, BufferOps, KernelInfo, LazyOp, MemBuffer, MetaOps, ReduceOps, TernaryOps, UnaryOps
from kernopt.renderers import var_dtype
from kernopt.shape.shapetracker import ShapeTracker
from kernopt.shape.symbolic import AndNode, LtNode, MulNode, Node, NumNode, SumNode, Variable
from kernopt.uops import UOp, UOps

# Axis groups of the optimized AST, left to right: global (threads of the grid, or loops on CPU) | local (threads
# of a workgroup) | group (workgroup threads that a reduce splits across, combined through local memory) | reduce
# loops | upcasted (expanded into lanes: one UOp per combination of their indices).

# enum members as module constants: an attribute of an Enum class costs ~0.15 us on Python 3.11
_ALU, _CONST, _LOAD, _STORE = UOps.ALU, UOps.CONST, UOps.LOAD, UOps.STORE
_ADD, _AND, _WHERE = BinaryOps.ADD, BinaryOps.AND, TernaryOps.WHERE
_ELEMENTWISE = (UnaryOps, BinaryOps, TernaryOps)
_UNSET: Any = object()

def _conjuncts(n: Node) -> list[Node]:
  """The nodes a valid is the AND of (none for a constant)."""
  return list(n.nodes) if isinstance(n, AndNode) else [] if isinstance(n, NumNode) else [n]

def lane_substitute(c: Node, vals: dict[Variable, int]) -> Node:
  """c.substitute(vals), without building the substituted nodes for a comparison Σ terms < b (b an int, each term a
  constant, a Variable or a Variable times an int) that the bounds of the substituted sum decide: its maximum below
  b gives 1, its minimum at least b gives 0, as `_lt` decides first (Node.sum only narrows those bounds by merging
  like terms). A gate's conjuncts are mostly decided so at every lane but the border ones; for those, only the terms
  of substituted Variables are rebuilt (as constants), not the others."""
  if type(c) is LtNode and type(c.b) is int:
    lo = hi = 0
    terms: list[Node] = []
    for t in (c.a.nodes if type(c.a) is SumNode else (c.a,)):
      v, k = (t.a, t.b) if type(t) is MulNode and type(t.b) is int else (t, 1)
      if type(v) is NumNode:
        lo, hi = lo + v.b * k, hi + v.b * k
        terms.append(t)
      elif type(v) is not Variable: break
      elif (x := vals.get(v)) is not None:
        lo, hi = lo + x * k, hi + x * k
        terms.append(NumNode(x * k))
      else:
        lo, hi = lo + t.min, hi + t.max
        terms.append(t)
    else:
      if hi < c.b: return NumNode(1)
      if lo >= c.b: return NumNode(0)
      # substitute's result: each term of the sum substituted (a term without a value is itself), summed, compared
      if type(c.a) is SumNode: return Node.sum(terms).lt(c.b)
  return c.substitute({v: NumNode(x) for v, x in vals.items()})

class _Lowerer(ReduceLowering, VectorLowering, Float4Lanes):
  def __init__(self, ast: LazyOp, opts: Any, idx_dt: DType = I32, vectors: bool = True):
    # index arithmetic in int32 unless some index, loop bound or Variable is not proved to fit (then Wide)
    self.idx_dt = idx_dt
    if ast.op is not MetaOps.KERNEL or not ast.src or any(s.op is not BufferOps.STORE for s in ast.src):
      raise VerifyError(f"lower needs a KERNEL op over STOREs, got {ast.op}")
    self.opts = opts
    self.info: KernelInfo = ast.arg if isinstance(ast.arg, KernelInfo) else KernelInfo()
    bufops = [x for x in ast.lazyops if x.op in BufferOps]
    if any(isinstance(x.arg.dtype, ImageDType) for x in bufops) and not opts.caps.supports_images:
      raise UnsupportedError(f"{opts.caps.device} has no images")
    sts: list[ShapeTracker] = [x.arg.st for x in bufops]
    self.shape_len = n = len(sts[0].shape)
    if any(len(st.shape) != n for st in sts):
      raise VerifyError(f"buffers have different ranks: {[st.shape for st in sts]}")
    self.full_shape = tuple(next((st.shape[i] for st in sts if st.shape[i] != 1), 1) for i in range(n))
    out_shape = ast.src[0].arg.st.shape
    self.first_upcast = fu = n - self.info.upcasted
    self.first_reduce = fr = next((i for i in range(fu) if out_shape[i] != self.full_shape[i]), fu)
    group = sorted({a for x in ast.lazyops if x.op in ReduceOps and x.src[0].op is BufferOps.LOAD
                    and x.src[0].arg.idx == -1 for a in x.arg})
    if group != list(range(fr, fr + len(group))):
      raise UnsupportedError(f"group reduce axes {group} are not the axes after first_reduce={fr}")
    self.group = group
    if any(out_shape[a] == self.full_shape[a] != 1 for a in group):
      raise UnsupportedError(f"an upcast among the group axes {group} (UPCASTMID) is not supported")
    gd = fr - self.info.local_dims
    if gd < 0: raise VerifyError(f"{self.info.local_dims} local dims but first_reduce is {fr}")
    self.var_uops: dict[str, UOp] = {}
    self.define_vars: dict[str, UOp] = {}
    # the lowerer's own index variables start with one more "_" than any of the AST's: they can't share its names
    self.ip = "_" * (1 + max((len(v.expr) - len(v.expr.lstrip("_")) for v in ast.vars()), default=0))
    self.up_vars: dict[Variable, int] = {}
    self.render_cache: dict[Node, UOp] = {}
    self.idxs: list[Node] = [NumNode(0)] * n
    self.range_of: dict[int, UOp] = {}
    self.vp: Optional[VectorPlan] = None
    if any(s == 0 for s in out_shape):  # an empty output: no loop, no thread, no store
      for v in ast.vars(): self.var_uop(v)
      self.sink = UOp(UOps.SINK, None, tuple(self.define_vars[v.expr] for v in ast.vars()))
      return
    caps = opts.caps
    use_locals = caps.has_local and not self.info.dont_use_locals
    if caps.has_local:
      gend = gd if use_locals else fr + len(group)
      if not use_locals and group: raise UnsupportedError("a GROUP reduce needs local memory, but locals are off")
      self._grid("gidx", range(gend), caps.global_max)
      # a warp's lanes are the first local axes, axis 0 fastest: the tensor-core layouts assume it
      has_wmma = any(x.op is ReduceOps.WMMA for x in ast.lazyops)
      if use_locals: self._grid("lidx", range(gd, fr + len(group)), caps.local_max, first_fastest=has_wmma)
    else:
      if group: raise UnsupportedError(f"GROUP reduce over axes {group} needs a device with local threads")
      for a in range(fr): self.idxs[a] = self._loop(a, False)
    for a in range(fr + len(group), fu): self.idxs[a] = self._loop(a, True)
    self.ridxs = list(self.idxs)
    for a in group: self.ridxs[a] = self._loop(a, True, "g")
    # upcasted axes: one lane per combination of their indices
    up_sizes = self.full_shape[fu:]
    if not all_int(up_sizes): raise UnsupportedError(f"cannot upcast symbolic sizes {up_sizes}")
    self.up_vars = {Variable(f"{self.ip}up{a}", 0, s - 1): a - fu for a, s in enumerate(up_sizes, start=fu)}
    for v, j in self.up_vars.items(): self.idxs[fu + j] = self.ridxs[fu + j] = v
    self.lanes: list[tuple[int, ...]] = list(itertools.product(*[range(s) for s in up_sizes]))
    self.lane_of = {ln: i for i, ln in enumerate(self.lanes)}
    self.up_sizes: tuple[int, ...] = up_sizes
    self.writable = {x.arg.idx for x in ast.src if x.arg.idx >= 0}
    self.memo: dict[LazyOp, Lanes] = {}
    self.exprs: dict[LazyOp, tuple[Node, Node]] = {}
    self.store_ops = [x for x in ast.src if x.arg.idx >= 0]
    self.store_conds: Optional[set[Node]] = None   # the conjuncts of every store's valid (unstored)
    self.linears: dict[Node, Any] = {}
    self.folds: dict[UOp, bool] = {}
    self.paths = reduce_paths(ast)
    self.range_owner: dict[int, tuple] = {}
    self.own_ranges: dict[tuple[int, tuple], UOp] = {}
    self.reduced: dict[tuple, Lanes] = {}
    self.vstores: dict[LazyOp, list[list[UOp]]] = {}
    self.acc_n = 0
    self.local_n = 0
    if vectors: self.vp = plan(self, ast)
    stores = [u for s in ast.src for u in self.lanes_of(s)]
    # every variable of the AST is a kernel parameter, even one only the launch size uses
    for v in ast.vars(): self.var_uop(v)
    params = [self.define_vars[v.expr] for v in ast.vars()]
    if self.vp is None: self.sink = UOp(UOps.SINK, None, tuple(dedup(stores + params)))
    else: self.sink = vector_sink([(self.vstores.get(s), self.lanes_of(s)) for s in ast.src], self.vp, params)

  # ***** index variables *****

  def var_uop(self, v: Variable) -> UOp:
    if (u := self.var_uops.get(v.expr)) is not None: return u
    if v in self.up_vars: raise AssertionError(f"upcast variable {v.expr} left in an index")
    unbound = Variable(v.expr, v.min, v.max)
    # the parameter is as wide as the Variable's range (the signature's VarArg); its uses as wide as the indices
    dv = self.define_vars[v.expr] = UOp(UOps.DEFINE_VAR, var_dtype(v), (), unbound)
    return self.var_uops.setdefault(v.expr, dv if dv.dtype is self.idx_dt else UOp(UOps.CAST, self.idx_dt, (dv,)))

  def render(self, n: Any) -> UOp: return self.const(n) if isinstance(n, int) else n.render(RENDER_OPS, self)

  def const(self, v: int) -> UOp:
    if self.idx_dt is I64: return index_const(v, I64)
    if not INT32_MIN <= v <= INT32_MAX: raise Wide
    return index_const(v)

  def check(self, n: Node) -> None:
    """Raise Wide unless n, and every partial sum of a SumNode, fits int32."""
    if n.min < INT32_MIN or n.max > INT32_MAX: raise Wide
    if isinstance(n, SumNode) and (sum(min(0, x.min) for x in n.nodes) < INT32_MIN or
                                   sum(max(0, x.max) for x in n.nodes) > INT32_MAX): raise Wide

  def _grid(self, prefix: str, axes: range, maxes: Optional[Sequence[int]], first_fastest: bool = False) -> None:
    sizes = [self.full_shape[a] for a in axes]
    for d, g in enumerate(fold_dims(sizes, maxes)):
      size = prod(sizes[i] for i in g)
      var = Variable(f"{self.ip}{prefix}{d}", 0, upper(size) - 1)
      if var.max > INT32_MAX: raise UnsupportedError(f"launch dimension {d} of size {size} exceeds int32 thread ids")
      special = UOp(UOps.SPECIAL, I32, (), (d, f"{prefix}{d}", size))
      self.var_uops[var.expr] = special if self.idx_dt is I32 else UOp(UOps.CAST, self.idx_dt, (special,))
      # the flat index of the group, split back into its axes (last axis fastest, or first with first_fastest)
      rest: Node = var
      for k, i in enumerate(g if first_fastest else reversed(g)):
        self.idxs[axes[i]] = rest if k == len(g) - 1 else rest % sizes[i]
        if k != len(g) - 1: rest = rest // sizes[i]

  def _loop(self, a: int, is_reduce: bool, prefix: str = "r") -> Node:
    size = self.full_shape[a]
    if size == 0: return NumNode(0)  # a reduce over it is its identity; nothing else iterates it (output not empty)
    var = Variable(f"{self.ip}{prefix}{a}", 0, upper(size) - 1)
    rng = UOp(UOps.RANGE, self.idx_dt, (self.const(0), self.render(size)), (a, is_reduce))
    self.var_uops[var.expr] = self.range_of[a] = rng
    return var

  # ***** per-lane index expressions *****

  def _expr(self, st: ShapeTracker, idxs: list[Node]) -> tuple[Node, Node]:
    """st.expr_idxs at idxs, with index 0 on st's size-1 axes: a reduce's output (and whatever is computed from it)
    has size 1 on the reduce axes, so its index and mask must not depend on the reduce loops or unrolled lanes."""
    if any(s == 1 and not (isinstance(i, NumNode) and i.b == 0) for s, i in zip(st.shape, idxs)):
      idxs = [NumNode(0) if s == 1 else i for s, i in zip(st.shape, idxs)]
    return st.expr_idxs(idxs)

  def node_expr(self, x: LazyOp) -> tuple[Node, Node]:
    """(index, valid) of buffer op x (a global buffer's, or a CONST's) over the lanes, computed once; a load's or
    CONST's valid without the conjuncts `unstored` finds."""
    if (ret := self.exprs.get(x)) is None:
      ret = self._expr(x.arg.st, self.idxs)
      if x.op is not BufferOps.STORE and not isinstance(ret[1], NumNode): ret = (ret[0], self.unstored(*ret))
      self.exprs[x] = ret
    return ret

  def unstored(self, idx: Node, valid: Node) -> Node:
    """valid without each conjunct c that every store's valid has (a PADTO'd output axis: the lanes where c fails
    are never stored) and whose variables neither idx nor the conjuncts kept read: the address is then one that some
    stored lane reads too, and the lane's value only ever reaches the stores that c closes. A broadcast operand of a
    padded tile (matmul's A along its PADTO'd columns) is then one value per group, not a gather of gated lanes."""
    if self.store_conds is None:
      conds = [set(_conjuncts(self.node_expr(s)[1])) for s in self.store_ops]
      self.store_conds = set.intersection(*conds) if conds else set()
    cs = _conjuncts(valid)
    drop = [c for c in cs if c in self.store_conds]
    if not drop: return valid
    while True:
      read = idx.vars().union(*(c.vars() for c in cs if c not in drop))
      still = [c for c in drop if not (c.vars() & read)]
      if len(still) == len(drop): break
      drop = still
    return Node.ands([c for c in cs if c not in drop]) if drop else valid

  def linear_of(self, node: Node) -> Optional[tuple[Node, dict[int, int]]]:
    """lower_index.linear(node) in the upcast variables, computed once per node."""
    if (ret := self.linears.get(node, _UNSET)) is _UNSET: ret = self.linears[node] = linear(node, self.up_vars)
    return ret  # type: ignore[return-value]

  def lane_offsets(self, strides: dict[int, int]) -> list[int]:
    """Each lane's offset Σ stride_j·u_j (lanes are the product of the upcast ranges, last axis fastest)."""
    offs = [0]
    for j, size in enumerate(self.up_sizes):
      st = strides.get(j, 0)
      offs = [o + st * k for o in offs for k in range(size)]
    return offs

  def offset_index(self, base: Node, b: UOp, o: int) -> UOp:
    """The UOp of index base + o, b being base's."""
    if base.min == base.max: return self.const(base.min + o)
    if b.op is _ALU and b.arg is _ADD and b.src[1].op is _CONST:
      # (x + c) + o built as x + (c+o): what the rewrites would make of it, without rebuilding every user
      x, c = b.src[0], b.src[1].arg
      return b if o == 0 else x if c + o == 0 else UOp(_ALU, b.dtype, (x, self.const(c + o)), _ADD)
    return b if o == 0 else UOp(_ALU, self.idx_dt, (b, self.const(o)), _ADD)

  def base_key(self, base: Node) -> tuple[Optional[UOp], int]:
    """(the part of base's UOp a lane's index UOp adds its constant to, base's constant): the vectorize pass's key."""
    if base.min == base.max: return None, base.min
    b = self.render(base)
    if b.op is _ALU and b.arg is _ADD and b.src[1].op is _CONST: return b.src[0], b.src[1].arg
    return b, 0

  def lane_groups(self, j: int, w: int) -> list[list[int]]:
    """The lanes of each aligned run of w along upcast axis j, in lane order (lane i's index along j is
    i // stride % size: the lanes are the product of the upcast ranges, last axis fastest)."""
    stride, size = prod(self.up_sizes[j + 1:]), self.up_sizes[j]
    return [[i + t * stride for t in range(w)] for i in range(len(self.lanes)) if i // stride % size % w == 0]

  def per_lane(self, node: Node, is_bool: bool = False) -> list[UOp]:
    """The UOp of node for each lane (upcast variables replaced by the lane's indices)."""
    if self.idx_dt is I32: self.check(node)   # lanes' values lie in node's bounds
    node_vars = node.vars()
    vs = [j for v, j in self.up_vars.items() if v in node_vars]
    def fix(u: UOp) -> UOp:
      if not is_bool: return u
      return as_bool(u) if u.op is not _CONST else UOp.const(dtypes.bool, u.arg)
    if not vs: return [fix(self.render(node))] * len(self.lanes)
    if not is_bool and (lin := self.linear_of(node)) is not None:
      base, strides = lin
      b = self.render(base)
      offs = self.lane_offsets(strides)
      # one UOp per distinct offset (lanes along a broadcast axis share theirs): interning would return the same
      # node for a repeated offset anyway, this only skips building it again
      by_off: dict[int, Any] = dict.fromkeys(offs)
      for o in by_off: by_off[o] = self.offset_index(base, b, o)
      return [by_off[o] for o in offs]
    inv = {j: v for v, j in self.up_vars.items()}
    key_of = itemgetter(*vs)   # a lane's values of the upcast variables node reads (one int when it reads one)
    keys = list(map(key_of, self.lanes))
    reps = dict(zip(keys, self.lanes))   # a lane of each distinct key (their values of vs are the same)
    cache: dict[Any, UOp] = {}
    if not isinstance(node, AndNode):
      for key, ln in reps.items(): cache[key] = fix(self.render(lane_substitute(node, {inv[j]: ln[j] for j in vs})))
      return list(map(cache.__getitem__, keys))
    # a conjunction is substituted conjunct by conjunct, each once per value of the upcast variables it reads, and
    # its UOp built from theirs: the render of Node.ands of the substituted conjuncts, without building that node
    parts = [(i, c, itemgetter(*cj), cj) if (cj := [j for j in vs if inv[j] in c.vars()]) else
             (i, lane_substitute(c, {}), None, cj) for i, c in enumerate(node.nodes)]
    done: dict[tuple, Node] = {}
    for key, ln in reps.items():
      terms: list[Node] = []
      for i, c, get, cj in parts:
        n: Optional[Node] = c if get is None else done.get(k := (i, get(ln)))
        if n is None: n = done[k] = lane_substitute(c, {inv[j]: ln[j] for j in cj})
        for m in (n.nodes if type(n) is AndNode else (n,)):   # Node.ands
          if m.min > 0 or m.max < 0: continue
          if m.min == m.max:
            terms = [NumNode(0)]
            break
          if m not in terms: terms.append(m)
        else: continue
        break
      if not terms: u = fix(self.const(1))
      elif len(terms) == 1 and terms[0].min >= 0 and terms[0].max <= 1: u = fix(self.render(terms[0]))
      else: u = functools.reduce(lambda a, b: alu(_AND, dtypes.bool, a, b),
                                 [as_bool(self.render(t)) for t in terms])
      cache[key] = u
    return list(map(cache.__getitem__, keys))

  # ***** lowering of AST nodes, each to one UOp per lane (or one vector per group of lanes) *****

  def lower(self, x: LazyOp) -> Lanes:
    if (ret := self.memo.get(x)) is None:
      if type(x.op) in _ELEMENTWISE: ret = self._lower_elementwise(x)
      else: ret = self.memo[x] = self._lower(x)
    return ret

  def lanes_of(self, x: LazyOp) -> list[UOp]:
    """lower(x) for a reader of x's scalar lanes (the vector plan lowers no node it reads as vectors)."""
    ret = self.lower(x)
    if type(ret) is Vecs: raise AssertionError(f"{x.op} is lowered as vectors but read lane by lane")
    return ret  # type: ignore[return-value]

  def _lower_elementwise(self, root: LazyOp) -> Lanes:
    """lower(root) for an elementwise root, from an explicit stack instead of recursion (an AST may be a chain of
    10,000 ALU ops), in recursion's order: each source in turn, an elementwise one after its own sources, then the
    op. Buffer ops and reduces are lowered where they are met, so their side effects (loop owners, accumulator and
    local-buffer numbers) happen in the same order."""
    memo = self.memo
    stack: list[tuple[LazyOp, int]] = [(root, 0)]
    while stack:
      x, i = stack[-1]
      if i < len(x.src):
        stack[-1] = (x, i + 1)
        if (s := x.src[i]) in memo: continue
        if type(s.op) in _ELEMENTWISE: stack.append((s, 0))
        else: memo[s] = self._lower(s)
      else:
        stack.pop()
        memo[x] = self._elementwise(x, [memo[s] for s in x.src])
    return memo[root]

  def _lower(self, x: LazyOp) -> Lanes:
    if x.op is BufferOps.CONST: return self._const_buf(x)
    if x.op is BufferOps.LOAD: return self._load(x)
    if x.op is BufferOps.STORE: return self._store(x)
    if x.op is ReduceOps.WMMA: return self._wmma(x, (), [])
    if x.op in ReduceOps: return self._reduce(x)
    return self._elementwise(x, [self.lower(s) for s in x.src])

  def _elementwise(self, x: LazyOp, src: list[Lanes]) -> Lanes:
    """The lanes of ALU (or CAST, BITCAST) op x from its sources' lanes."""
    if self.vp is not None and x in self.vp.vector: return self._vector_alu(x, value_dtype(x.dtype), src)
    lanes: list[list[UOp]] = src  # type: ignore[assignment]   # the plan lowers no source of a scalar op as vectors
    if x.op in (UnaryOps.CAST, UnaryOps.BITCAST):
      kind = UOps.CAST if x.op is UnaryOps.CAST else UOps.BITCAST
      return [UOp(kind, x.arg, (s,)) for s in lanes[0]]
    if x.op is MetaOps.KERNEL: raise VerifyError("nested KERNEL op")
    dt, op = value_dtype(x.dtype), x.op
    if len(lanes) == 2: return [UOp(_ALU, dt, (a, b), op) for a, b in zip(lanes[0], lanes[1])]
    return [UOp(_ALU, dt, tuple([s[i] for s in lanes]), op) for i in range(len(self.lanes))]

  def _symbolic_const(self, val: Node, dt: DType) -> UOp:
    """A CONST holding an int expression of Variables: rendered from the DEFINE_VARs like an index, then converted."""
    u = self.render(val)
    return u if u.dtype == dt else UOp(UOps.CAST, dt, (u,))

  def _const_buf(self, x: LazyOp) -> list[UOp]:
    dt = x.arg.dtype
    c = UOp.const(dt, x.arg.val) if not isinstance(x.arg.val, Node) else self._symbolic_const(x.arg.val, dt)
    _, valid = self.node_expr(x)
    if valid.min == 1: return [c] * len(self.lanes)
    zero = UOp.const(dt, 0)
    return [alu(TernaryOps.WHERE, dt, v, c, zero) if v.op is not UOps.CONST else (c if v.arg else zero)
            for v in self.per_lane(valid, True)]

  def _buf(self, mb: MemBuffer) -> UOp:
    if mb.idx >= 0: return UOp(UOps.DEFINE_GLOBAL, mb.dtype, (), (mb.idx, f"data{mb.idx}", mb.idx in self.writable))
    return UOp(UOps.DEFINE_LOCAL, mb.dtype, (), (f"temp{self.local_n}", upper(mb.st.size)))

  def _load(self, x: LazyOp) -> Lanes:
    mb: MemBuffer = x.arg
    dt = mb.dtype
    if mb.idx < 0:
      stores = dedup(self.lanes_of(x.src[0]))
      buf = stores[0].src[0]
      barrier = UOp(UOps.BARRIER, None, tuple(stores))
      idx, valid = self._expr(mb.st, self.ridxs)
      if valid.min != 1: raise UnsupportedError("a masked local buffer load is not supported")
      return [UOp(UOps.LOAD, dt, (buf, i, barrier)) for i in self.per_lane(idx)]
    if self.vp is not None and x in self.vp.vector: return self._vector_load(x)
    return self._scalar_load(x)

  def _scalar_load(self, x: LazyOp) -> list[UOp]:
    mb: MemBuffer = x.arg
    dt = mb.dtype
    buf = self._buf(mb)
    idx, valid = self.node_expr(x)
    if isinstance(dt, ImageDType): return self._image_load(dt, buf, idx, valid)
    idxs, valids = self.per_lane(idx), self.per_lane(valid, True)
    zero = UOp.const(dt, 0)
    def one(i: UOp, v: UOp, ldt: DType, alt: UOp) -> UOp:
      if v.op is _CONST: return UOp(_LOAD, ldt, (buf, i)) if v.arg else alt
      return UOp(_LOAD, ldt, (buf, UOp(_ALU, i.dtype, (v, i, self.const(0)), _WHERE), v, alt))
    if (vec := self._vector_axis(mb, idx, valid)) is None:
      # one LOAD per distinct (index, guard) pair: lanes along an axis the buffer broadcasts read the same element
      made: dict[tuple[UOp, UOp], Any] = dict.fromkeys(zip(idxs, valids))
      for iv in made: made[iv] = one(iv[0], iv[1], dt, zero)
      return [made[iv] for iv in zip(idxs, valids)]
    j, w = vec
    out: list[UOp] = [zero] * len(self.lanes)
    vzero = UOp(UOps.VECTORIZE, dt.vec(w), (zero,) * w)
    for first, members in self._groups(j, w):
      ld = one(idxs[first], valids[first], dt.vec(w), vzero)
      for t, m in enumerate(members): out[m] = UOp(UOps.GEP, dt, (ld,), t)
    return out

  def _store(self, x: LazyOp) -> list[UOp]:
    mb: MemBuffer = x.arg
    src = self.lower(x.src[0])
    if type(src) is Vecs:
      per_group = self.vstores[x] = self._vector_store(x, src)
      return [st for sts in per_group for st in sts]
    vals: list[UOp] = src  # type: ignore[assignment]
    if mb.idx < 0:
      buf = self._buf(mb)
      self.local_n += 1
      idx, valid = self._expr(mb.st, self.idxs)
      if valid.min != 1: raise UnsupportedError("a masked local buffer store is not supported")
      return [UOp(UOps.STORE, None, (buf, i, v)) for i, v in zip(self.per_lane(idx), vals)]
    buf = self._buf(mb)
    idx, valid = self.node_expr(x)
    idxs, valids = self.per_lane(idx), self.per_lane(valid, True)
    if self.group:  # only the first thread of each group writes the combined result
      firsts = [alu(BinaryOps.CMPLT, dtypes.bool, self.render(self.idxs[a]), self.const(1)) for a in self.group]
      gate = functools.reduce(lambda a, b: alu(BinaryOps.AND, dtypes.bool, a, b), firsts)
      valids = [gate if v.op is UOps.CONST and v.arg else alu(BinaryOps.AND, dtypes.bool, v, gate) for v in valids]
    if isinstance(mb.dtype, ImageDType): return self._image_store(x, buf, idx, valid, vals, valids)
    def one(i: UOp, val: UOp, v: UOp) -> Optional[UOp]:
      if v.op is _CONST: return UOp(_STORE, None, (buf, i, val)) if v.arg else None
      return UOp(_STORE, None, (buf, UOp(_ALU, i.dtype, (v, i, self.const(0)), _WHERE), val, v))
    if (vec := self._vector_axis(mb, idx, valid)) is None:
      return [s for s in map(one, idxs, vals, valids) if s is not None]
    j, w = vec
    out = []
    for first, members in self._groups(j, w):
      vv = UOp(UOps.VECTORIZE, mb.dtype.vec(w), tuple(vals[m] for m in members))
      if (s := one(idxs[first], vv, valids[first])) is not None: out.append(s)
    return out

def lower(ast: LazyOp, opts: Any, vectors: bool = True) -> UOp:
  """The SINK of the UOp graph of an optimized AST (see the axis groups above) for a dialect `opts`. Index arithmetic
  is int32 where the symbolic bounds of every index, partial sum, loop bound and Variable prove it enough, else
  int64 for the whole kernel (thread ids stay int32, widened where used). With `vectors` (the default) a profile that
  packs lanes gets the lanes the vectorize pass would pack as vector UOps; without, every upcast lane is a scalar."""
  try: return _lower(ast, opts, I32, vectors)
  except Wide: return _lower(ast, opts, I64, vectors)

def _lower(ast: LazyOp, opts: Any, idx_dt: DType, vectors: bool) -> UOp:
  try: return _Lowerer(ast, opts, idx_dt, vectors).sink
  except Scalar: return _Lowerer(ast, opts, idx_dt, False).sink

__all__ = ["lower", "fold_dims", "RENDER_OPS"]
