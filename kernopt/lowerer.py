"""Lowering of an optimized AST (Kernel.get_optimized_ast) to a UOp graph: axes become SPECIAL thread indices,
RANGE loops or expanded lanes; buffers become guarded LOADs/STOREs; reduces become accumulators.
Imports dtype, errors, helpers, ops, renderers, shape/ and uops."""
from __future__ import annotations
import functools, itertools
from typing import Any, Optional, Sequence
from kernopt.dtype import DType, ImageDType, dtypes
from kernopt.errors import UnsupportedError, VerifyError
from kernopt.helpers import all_int, dedup, prod
from kernopt.ops import (BinaryOps, BufferOps, KernelInfo, LazyOp, MemBuffer, MetaOps, ReduceOps, TernaryOps, UnaryOps,
                         WMMAArg)
from kernopt.renderers import var_dtype
from kernopt.shape.shapetracker import ShapeTracker
from kernopt.shape.symbolic import AndNode, DivNode, LtNode, ModNode, MulNode, Node, NumNode, SumNode, Variable
from kernopt.uops import UOp, UOps

# Axis groups of the optimized AST, left to right: global (threads of the grid, or loops on CPU) | local (threads
# of a workgroup) | group (workgroup threads that a reduce splits across, combined through local memory) | reduce
# loops | upcasted (expanded into lanes: one UOp per combination of their indices).

I32, I64 = dtypes.int32, dtypes.int64
INT32_MIN, INT32_MAX = -2**31, 2**31 - 1
MAX_ACCS = 32   # independent accumulators of one reduce, at most (CPU registers)

_CONSTS: dict[tuple[int, DType], UOp] = {}
def _const(v: int, dt: DType = I32) -> UOp:
  """The index constant v of dt (int32, or int64 in a kernel lowered with int64 indices), built once."""
  if (u := _CONSTS.get((v, dt))) is None:
    if len(_CONSTS) > 8192: _CONSTS.clear()
    u = _CONSTS[(v, dt)] = UOp.const(dt, v)
  return u

class _Wide(Exception):
  """An index, a loop bound or a Variable that int32 can't hold: the kernel is lowered again with int64 indices."""
# enum members as module constants: an attribute of an Enum class costs ~0.15 us on Python 3.11
_ALU, _CONST, _LOAD, _STORE = UOps.ALU, UOps.CONST, UOps.LOAD, UOps.STORE
_ADD, _WHERE = BinaryOps.ADD, TernaryOps.WHERE
_ELEMENTWISE = (UnaryOps, BinaryOps, TernaryOps)
def _alu(op: Any, dt: Optional[DType], *src: UOp) -> UOp: return UOp(_ALU, dt, src, op)

def _operand(b: Any, ops: Any, ctx: Any) -> UOp: return ctx.const(b) if isinstance(b, int) else b.render(ops, ctx)

def _cached(fn: Any) -> Any:
  def wrapper(n: Node, ops: Any, ctx: _Lowerer) -> UOp:
    if (u := ctx.render_cache.get(n)) is None:
      if ctx.idx_dt is I32: ctx.check(n)
      u = ctx.render_cache[n] = fn(n, ops, ctx)
    return u
  return wrapper

def _value_dtype(dt: Any) -> Any:
  """The dtype of a value computed from dt's loads: an image's elements are read as float."""
  return dtypes.float if isinstance(dt, ImageDType) else dt

def _as_bool(u: UOp) -> UOp:
  if u.dtype == dtypes.bool or u.dtype is None: return u
  return _alu(BinaryOps.CMPNE, dtypes.bool, u, _const(0) if u.dtype is I32 else UOp.const(u.dtype, 0))

RENDER_OPS: dict[type, Any] = {
  Variable: _cached(lambda n, ops, ctx: ctx.var_uop(n)),
  NumNode: lambda n, ops, ctx: ctx.const(n.b),
  MulNode: _cached(lambda n, ops, ctx: _alu(BinaryOps.MUL, ctx.idx_dt, n.a.render(ops, ctx), _operand(n.b, ops, ctx))),
  DivNode: _cached(lambda n, ops, ctx: _alu(BinaryOps.IDIV, ctx.idx_dt, n.a.render(ops, ctx), _operand(n.b, ops, ctx))),
  ModNode: _cached(lambda n, ops, ctx: _alu(BinaryOps.MOD, ctx.idx_dt, n.a.render(ops, ctx), _operand(n.b, ops, ctx))),
  LtNode: _cached(lambda n, ops, ctx: _alu(BinaryOps.CMPLT, dtypes.bool, n.a.render(ops, ctx),
                                           _operand(n.b, ops, ctx))),
  SumNode: _cached(lambda n, ops, ctx: functools.reduce(lambda a, b: _alu(BinaryOps.ADD, ctx.idx_dt, a, b),
                                                        [x.render(ops, ctx) for x in n.nodes])),
  AndNode: _cached(lambda n, ops, ctx: functools.reduce(lambda a, b: _alu(BinaryOps.AND, dtypes.bool, a, b),
                                                        [_as_bool(x.render(ops, ctx)) for x in n.nodes])),
}

def fold_dims(sizes: Sequence[Any], maxes: Optional[Sequence[int]]) -> list[list[int]]:
  """Contiguous groups of axes, one group per launch dimension (at most len(maxes), 3 without maxes), each
  group's size within its dimension's maximum. Preferred: one axis per dimension, extra leading axes merged
  into dimension 0 (the dimension with the largest limit on every dialect)."""
  n = len(sizes)
  if n == 0: return []
  lim = list(maxes) if maxes else [None] * 3
  def fits(groups: list[list[int]]) -> bool:
    return all((m := lim[d]) is None or _upper(prod(sizes[a] for a in g)) <= m for d, g in enumerate(groups))
  for k in range(min(n, len(lim)), 0, -1):
    for cuts in reversed(list(itertools.combinations(range(1, n), k - 1))):
      bounds = (0,) + cuts + (n,)
      groups = [list(range(bounds[i], bounds[i + 1])) for i in range(k)]
      if fits(groups): return groups
  raise UnsupportedError(f"launch dimensions {tuple(sizes)} don't fit the device's maxima {tuple(lim)}")

def _upper(x: Any) -> int: return x if isinstance(x, int) else x.max

def _linear(node: Node, upvars: dict[Variable, int]) -> Optional[tuple[Node, dict[int, int]]]:
  """node == base + Σ stride_j·u_j for the upcast variables u_j, or None when an upcast variable sits inside a
  nonlinear term."""
  terms = node.nodes if isinstance(node, SumNode) else [node]
  base: list[Node] = []
  strides: dict[int, int] = {}
  for t in terms:
    if isinstance(t, Variable) and t in upvars: strides[upvars[t]] = strides.get(upvars[t], 0) + 1
    elif isinstance(t, MulNode) and isinstance(t.a, Variable) and t.a in upvars and isinstance(t.b, int):
      strides[upvars[t.a]] = strides.get(upvars[t.a], 0) + t.b
    elif isinstance(t, NumNode) or not (t.vars() & upvars.keys()): base.append(t)
    else: return None
  return Node.sum(base), strides

def _divisible(n: Node, w: int) -> bool:
  """n is a multiple of w for every value of its variables."""
  if isinstance(n, NumNode): return n.b % w == 0
  if isinstance(n, MulNode): return (isinstance(n.b, int) and n.b % w == 0) or _divisible(n.a, w)
  if isinstance(n, SumNode): return all(_divisible(x, w) for x in n.nodes)
  return False

class _Lowerer:
  def __init__(self, ast: LazyOp, opts: Any, idx_dt: DType = I32):
    # index arithmetic in int32 unless some index, loop bound or Variable is not proved to fit (then _Wide)
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
    if any(s == 0 for s in out_shape):  # an empty output: no loop, no thread, no store
      for v in ast.vars(): self.var_uop(v)
      self.sink = UOp(UOps.SINK, None, tuple(self.define_vars[v.expr] for v in ast.vars()))
      return
    use_locals = opts.has_local and not self.info.dont_use_locals
    if opts.has_local:
      gend = gd if use_locals else fr + len(group)
      if not use_locals and group: raise UnsupportedError("a GROUP reduce needs local memory, but locals are off")
      self._grid("gidx", range(gend), opts.global_max)
      # a warp's lanes are the first local axes, axis 0 fastest: the tensor-core layouts assume it
      has_wmma = any(x.op is ReduceOps.WMMA for x in ast.lazyops)
      if use_locals: self._grid("lidx", range(gd, fr + len(group)), opts.local_max, first_fastest=has_wmma)
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
    self.memo: dict[LazyOp, list[UOp]] = {}
    self.paths = _reduce_paths(ast)
    self.range_owner: dict[int, tuple] = {}
    self.own_ranges: dict[tuple[int, tuple], UOp] = {}
    self.acc_n = 0
    self.local_n = 0
    stores = [u for s in ast.src for u in self.lower(s)]
    # every variable of the AST is a kernel parameter, even one only the launch size uses
    for v in ast.vars(): self.var_uop(v)
    params = [self.define_vars[v.expr] for v in ast.vars()]
    self.sink = UOp(UOps.SINK, None, tuple(dedup(stores + params)))

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
    if self.idx_dt is I64: return _const(v, I64)
    if not INT32_MIN <= v <= INT32_MAX: raise _Wide
    return _const(v)

  def check(self, n: Node) -> None:
    """Raise _Wide unless n, and every partial sum of a SumNode, fits int32."""
    if n.min < INT32_MIN or n.max > INT32_MAX: raise _Wide
    if isinstance(n, SumNode) and (sum(min(0, x.min) for x in n.nodes) < INT32_MIN or
                                   sum(max(0, x.max) for x in n.nodes) > INT32_MAX): raise _Wide

  def _grid(self, prefix: str, axes: range, maxes: Optional[Sequence[int]], first_fastest: bool = False) -> None:
    sizes = [self.full_shape[a] for a in axes]
    for d, g in enumerate(fold_dims(sizes, maxes)):
      size = prod(sizes[i] for i in g)
      var = Variable(f"{self.ip}{prefix}{d}", 0, _upper(size) - 1)
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
    var = Variable(f"{self.ip}{prefix}{a}", 0, _upper(size) - 1)
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

  def per_lane(self, node: Node, is_bool: bool = False) -> list[UOp]:
    """The UOp of node for each lane (upcast variables replaced by the lane's indices)."""
    if self.idx_dt is I32: self.check(node)   # lanes' values lie in node's bounds
    node_vars = node.vars()
    vs = [j for v, j in self.up_vars.items() if v in node_vars]
    def fix(u: UOp) -> UOp:
      if not is_bool: return u
      return _as_bool(u) if u.op is not UOps.CONST else UOp.const(dtypes.bool, u.arg)
    if not vs: return [fix(self.render(node))] * len(self.lanes)
    if not is_bool and (lin := _linear(node, self.up_vars)) is not None:
      base, strides = lin
      b = self.render(base)
      offs = [0]
      for j, size in enumerate(self.up_sizes):  # lanes are the product of the upcast ranges, last axis fastest
        st = strides.get(j, 0)
        offs = [o + st * k for o in offs for k in range(size)]
      # one UOp per distinct offset (lanes along a broadcast axis share theirs): interning would return the same
      # node for a repeated offset anyway, this only skips building it again
      by_off: dict[int, Any] = dict.fromkeys(offs)
      if base.min == base.max:
        for o in by_off: by_off[o] = self.const(base.min + o)
      elif b.op is _ALU and b.arg is _ADD and b.src[1].op is _CONST:
        # (x + c) + o built as x + (c+o): what the rewrites would make of it, without rebuilding every user
        x, c = b.src[0], b.src[1].arg
        for o in by_off:
          by_off[o] = b if o == 0 else x if c + o == 0 else UOp(_ALU, b.dtype, (x, self.const(c + o)), _ADD)
      else:
        for o in by_off: by_off[o] = b if o == 0 else UOp(_ALU, self.idx_dt, (b, self.const(o)), _ADD)
      return [by_off[o] for o in offs]
    cache: dict[tuple[int, ...], UOp] = {}
    inv = {j: v for v, j in self.up_vars.items()}
    # a conjunction is substituted conjunct by conjunct, each once per value of the upcast variables it reads
    # (what AndNode.substitute computes, without redoing the conjuncts a lane shares with others)
    parts = [(c, [j for j in vs if inv[j] in c.vars()]) for c in node.nodes] if isinstance(node, AndNode) else None
    done: dict[tuple[int, ...], Node] = {}
    def part(i: int, c: Node, cvs: list[int], ln: tuple[int, ...]) -> Node:
      k = (i,) + tuple(ln[j] for j in cvs)
      if (ret := done.get(k)) is None: ret = done[k] = c.substitute({inv[j]: NumNode(ln[j]) for j in cvs})
      return ret
    out = []
    for ln in self.lanes:
      key = tuple(ln[j] for j in vs)
      if key not in cache:
        if parts is None: sub = node.substitute({inv[j]: NumNode(ln[j]) for j in vs})
        else: sub = Node.ands([part(i, c, cvs, ln) for i, (c, cvs) in enumerate(parts)])
        cache[key] = fix(self.render(sub))
      out.append(cache[key])
    return out

  def _vector_axis(self, mb: MemBuffer, idx: Node, valid: Node) -> Optional[tuple[int, int]]:
    """(upcast axis j, width) along which this buffer's lanes fold into aligned vector accesses, if any."""
    if not self.opts.supports_float4 or mb.idx < 0 or mb.dtype not in (dtypes.float, dtypes.half) or not self.lanes:
      return None
    return self._fold_axis(idx, valid, (4, 2))

  def _fold_axis(self, idx: Node, valid: Node, widths: tuple[int, ...]) -> Optional[tuple[int, int]]:
    """(upcast axis j, width w): idx = base + u_j + (multiples of w) with base a multiple of w, and valid
    independent of u_j, so w consecutive lanes along j are one aligned access."""
    if (lin := _linear(idx, self.up_vars)) is None: return None
    base, strides = lin
    valid_vars = valid.vars()
    for j in sorted(strides, reverse=True):
      if strides[j] != 1 or any(v in valid_vars for v, k in self.up_vars.items() if k == j): continue
      for w in widths:
        if self.up_sizes[j] % w == 0 and _divisible(base, w) and all(s % w == 0 for k, s in strides.items() if k != j):
          return j, w
    return None

  def _texels(self, img: ImageDType, idx: Node) -> list[UOp]:
    """The int2 texel coordinate (x, y) of each lane's element idx of an (H, W, 4) image."""
    w = img.shape[1]
    xs, ys = self.per_lane((idx // 4) % w), self.per_lane(idx // (4 * w))
    if self.idx_dt is not I32: xs, ys = [x.cast(I32) for x in xs], [y.cast(I32) for y in ys]   # small: images
    return [UOp(UOps.VECTORIZE, I32.vec(2), (x, y)) for x, y in zip(xs, ys)]

  def _groups(self, j: int, w: int) -> list[tuple[int, list[int]]]:
    """(first lane, lanes) of each aligned vector along upcast axis j."""
    out = []
    for i, ln in enumerate(self.lanes):
      if ln[j] % w == 0: out.append((i, [self.lane_of[ln[:j] + (ln[j] + t,) + ln[j + 1:]] for t in range(w)]))
    return out

  # ***** lowering of AST nodes, each to one UOp per lane *****

  def lower(self, x: LazyOp) -> list[UOp]:
    if (ret := self.memo.get(x)) is None:
      if type(x.op) in _ELEMENTWISE: ret = self._lower_elementwise(x)
      else: ret = self.memo[x] = self._lower(x)
    return ret

  def _lower_elementwise(self, root: LazyOp) -> list[UOp]:
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

  def _lower(self, x: LazyOp) -> list[UOp]:
    if x.op is BufferOps.CONST: return self._const_buf(x)
    if x.op is BufferOps.LOAD: return self._load(x)
    if x.op is BufferOps.STORE: return self._store(x)
    if x.op is ReduceOps.WMMA: return self._wmma(x, (), [])
    if x.op in ReduceOps: return self._reduce(x)
    return self._elementwise(x, [self.lower(s) for s in x.src])

  def _elementwise(self, x: LazyOp, src: list[list[UOp]]) -> list[UOp]:
    """The lanes of ALU (or CAST, BITCAST) op x from its sources' lanes."""
    if x.op in (UnaryOps.CAST, UnaryOps.BITCAST):
      kind = UOps.CAST if x.op is UnaryOps.CAST else UOps.BITCAST
      return [UOp(kind, x.arg, (s,)) for s in src[0]]
    if x.op is MetaOps.KERNEL: raise VerifyError("nested KERNEL op")
    dt, op = _value_dtype(x.dtype), x.op
    if len(src) == 2: return [UOp(_ALU, dt, (a, b), op) for a, b in zip(src[0], src[1])]
    return [UOp(_ALU, dt, tuple([s[i] for s in src]), op) for i in range(len(self.lanes))]

  def _symbolic_const(self, val: Node, dt: DType) -> UOp:
    """A CONST holding an int expression of Variables: rendered from the DEFINE_VARs like an index, then converted."""
    u = self.render(val)
    return u if u.dtype == dt else UOp(UOps.CAST, dt, (u,))

  def _const_buf(self, x: LazyOp) -> list[UOp]:
    dt = x.arg.dtype
    c = UOp.const(dt, x.arg.val) if not isinstance(x.arg.val, Node) else self._symbolic_const(x.arg.val, dt)
    _, valid = self._expr(x.arg.st, self.idxs)
    if valid.min == 1: return [c] * len(self.lanes)
    zero = UOp.const(dt, 0)
    return [_alu(TernaryOps.WHERE, dt, v, c, zero) if v.op is not UOps.CONST else (c if v.arg else zero)
            for v in self.per_lane(valid, True)]

  def _buf(self, mb: MemBuffer) -> UOp:
    if mb.idx >= 0: return UOp(UOps.DEFINE_GLOBAL, mb.dtype, (), (mb.idx, f"data{mb.idx}", mb.idx in self.writable))
    return UOp(UOps.DEFINE_LOCAL, mb.dtype, (), (f"temp{self.local_n}", _upper(mb.st.size)))

  def _load(self, x: LazyOp) -> list[UOp]:
    mb: MemBuffer = x.arg
    dt = mb.dtype
    if mb.idx < 0:
      stores = dedup(self.lower(x.src[0]))
      buf = stores[0].src[0]
      barrier = UOp(UOps.BARRIER, None, tuple(stores))
      idx, valid = self._expr(mb.st, self.ridxs)
      if valid.min != 1: raise UnsupportedError("a masked local buffer load is not supported")
      return [UOp(UOps.LOAD, dt, (buf, i, barrier)) for i in self.per_lane(idx)]
    buf = self._buf(mb)
    idx, valid = self._expr(mb.st, self.idxs)
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

  def _image_load(self, img: ImageDType, buf: UOp, idx: Node, valid: Node) -> list[UOp]:
    """Each lane's element of a float4 texel: one texel per 4 lanes along a unit-stride upcast axis, else a texel
    per lane and its component idx % 4 (a GEP when constant, else a WHERE chain)."""
    texels, valids = self._texels(img, idx), self.per_lane(valid, True)
    f, f4 = dtypes.float, dtypes.float.vec(4)
    vzero = UOp(UOps.VECTORIZE, f4, (UOp.const(f, 0.0),) * 4)
    def fetch(xy: UOp, v: UOp) -> UOp:
      if v.op is UOps.CONST: return UOp(UOps.LOAD, f4, (buf, xy)) if v.arg else vzero
      return UOp(UOps.LOAD, f4, (buf, xy, v, vzero))
    if (vec := self._fold_axis(idx, valid, (4,))) is not None:
      out: list[UOp] = [vzero] * len(self.lanes)
      for first, members in self._groups(vec[0], 4):
        t = fetch(texels[first], valids[first])
        for k, m in enumerate(members): out[m] = UOp(UOps.GEP, f, (t,), k)
      return out
    out = []
    for xy, v, comp in zip(texels, valids, self.per_lane(idx % 4)):
      t = fetch(xy, v)
      if comp.op is UOps.CONST: out.append(UOp(UOps.GEP, f, (t,), comp.arg))
      else:
        sel = UOp(UOps.GEP, f, (t,), 3)
        for k in (2, 1, 0):
          sel = _alu(TernaryOps.WHERE, f, _alu(BinaryOps.CMPLT, dtypes.bool, comp, self.const(k + 1)),
                     UOp(UOps.GEP, f, (t,), k), sel)
        out.append(sel)
    return out

  def _image_store(self, x: LazyOp, buf: UOp, idx: Node, valid: Node, vals: list[UOp], valids: list[UOp]) -> list[UOp]:
    """float4 texel stores: 4 lanes along a unit-stride upcast axis (Kernel.required_optimizations upcasts it)."""
    img: ImageDType = x.arg.dtype
    if (vec := self._fold_axis(idx, valid, (4,))) is None:
      raise UnsupportedError(f"a store into {img} needs 4 upcast lanes along a unit-stride axis, "
                             f"upcast sizes {self.up_sizes}")
    texels, f = self._texels(img, idx), dtypes.float
    out = []
    for first, members in self._groups(vec[0], 4):
      val = UOp(UOps.VECTORIZE, f.vec(4), tuple(vals[m].cast(f) for m in members))
      v = valids[first]
      if v.op is not UOps.CONST: out.append(UOp(UOps.STORE, None, (buf, texels[first], val, v)))
      elif v.arg: out.append(UOp(UOps.STORE, None, (buf, texels[first], val)))
    return out

  def _store(self, x: LazyOp) -> list[UOp]:
    mb: MemBuffer = x.arg
    vals = self.lower(x.src[0])
    if mb.idx < 0:
      buf = self._buf(mb)
      self.local_n += 1
      idx, valid = self._expr(mb.st, self.idxs)
      if valid.min != 1: raise UnsupportedError("a masked local buffer store is not supported")
      return [UOp(UOps.STORE, None, (buf, i, v)) for i, v in zip(self.per_lane(idx), vals)]
    buf = self._buf(mb)
    idx, valid = self._expr(mb.st, self.idxs)
    idxs, valids = self.per_lane(idx), self.per_lane(valid, True)
    if self.group:  # only the first thread of each group writes the combined result
      firsts = [_alu(BinaryOps.CMPLT, dtypes.bool, self.render(self.idxs[a]), self.const(1)) for a in self.group]
      gate = functools.reduce(lambda a, b: _alu(BinaryOps.AND, dtypes.bool, a, b), firsts)
      valids = [gate if v.op is UOps.CONST and v.arg else _alu(BinaryOps.AND, dtypes.bool, v, gate) for v in valids]
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

  def _reduce(self, x: LazyOp) -> list[UOp]:
    fu = self.first_upcast
    ups = [a - fu for a in x.arg if a >= fu]
    if x.src[0].op is ReduceOps.WMMA:
      if x.op is not ReduceOps.SUM: raise UnsupportedError(f"{x.op} over a WMMA (only SUM accumulates tensor cores)")
      return self._wmma(x.src[0], tuple(self.range_of[a] for a in sorted(x.arg) if a < fu), ups)
    dt = _value_dtype(x.dtype)
    op = {ReduceOps.SUM: BinaryOps.ADD, ReduceOps.MAX: BinaryOps.MAX}[x.op]  # type: ignore[index]
    init = dtypes.as_const(0 if x.op is ReduceOps.SUM else dtypes.min(dt), dt)
    if any(self.full_shape[a] == 0 for a in x.arg): return [UOp.const(dt, init)] * len(self.lanes)  # empty: identity
    loops, sub = self._reduce_loops(x)
    src = self.lower(x.src[0])
    if sub:
      memo: dict[UOp, UOp] = {}
      src = [_substitute(u, sub, memo) for u in src]
    combine = lambda xs: functools.reduce(lambda a, b: _alu(op, dt, a, b), xs)  # noqa: E731
    by_out: dict[tuple[int, ...], list[int]] = {}
    for i, ln in enumerate(self.lanes):
      by_out.setdefault(tuple(0 if j in ups else v for j, v in enumerate(ln)), []).append(i)
    done: dict[tuple[UOp, ...], UOp] = {}
    out: list[UOp] = [src[0]] * len(self.lanes)
    # the MAX_ACCS budget is shared by the distinct lane groups: an output lane group that reads the same values as
    # another (a reduce broadcast along an upcast or unrolled axis of a sibling) shares its accumulators
    n_groups = len({tuple(src[m] for m in members) for members in by_out.values()})
    for members in by_out.values():
      key = tuple(src[m] for m in members)
      if key not in done:
        if not loops: done[key] = combine(key)
        else:
          # independent accumulators, one per (output lane, unrolled lane) up to MAX_ACCS per reduce: they break
          # the loop-carried dependency chain; the partial results are combined after the loop
          per = max(1, min(len(key), MAX_ACCS // n_groups))
          phis = []
          for c in range(per):
            acc = UOp(UOps.DEFINE_ACC, dt, loops, (init, self.acc_n))
            self.acc_n += 1
            phis.append(UOp(UOps.PHI, dt, (acc, self._accumulate(op, dt, acc, combine(key[c::per])))))
          done[key] = combine(phis)
      for m in members: out[m] = done[key]
    return out

  def _accumulate(self, op: BinaryOps, dt: DType, acc: UOp, x: UOp) -> UOp:
    """acc op x; acc + a*b as MULACC(a, b, acc) when the dialect fuses float32 accumulation."""
    if op is BinaryOps.ADD and dt == dtypes.float32 and self.opts.caps.fused_accumulate and \
       x.op is UOps.ALU and x.arg is BinaryOps.MUL:
      return UOp(UOps.ALU, dt, (x.src[0], x.src[1], acc), TernaryOps.MULACC)
    return _alu(op, dt, acc, x)

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
    a_vals, b_vals = self.lower(w.src[0]), self.lower(w.src[1])
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

def _reduce_paths(ast: LazyOp) -> dict[LazyOp, tuple]:
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

def _substitute(u: UOp, sub: dict[UOp, UOp], memo: dict[UOp, UOp]) -> UOp:
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

def lower(ast: LazyOp, opts: Any) -> UOp:
  """The SINK of the UOp graph of an optimized AST (see the axis groups above) for a dialect `opts`. Index arithmetic
  is int32 where the symbolic bounds of every index, partial sum, loop bound and Variable prove it enough, else
  int64 for the whole kernel (thread ids stay int32, widened where used)."""
  try: return _Lowerer(ast, opts).sink
  except _Wide: return _Lowerer(ast, opts, I64).sink

__all__ = ["lower", "fold_dims", "RENDER_OPS"]
