"""The scheduler: which nodes become kernel outputs, the kernopt AST of each kernel, and running them.

A kernel computes one node (its root) from BUFFERs and from nodes other kernels compute. Everything between them is
fused, along docs/fusion.md: the root's shape is extended by one axis per reduced axis of every reduce the kernel
holds (the kernel's full shape), and each node is lowered at a ShapeTracker from that space to its elements. A
reduce is lowered by giving its reduced axes those extra axes, so a reduce's result may be used anywhere in the
kernel, moved or broadcast: softmax (a max nested in a sum, both broadcast back over the row) is one kernel.

A node is computed by a kernel of its own (realized) when fusing it would be wrong or wasteful:
- an ALU op or reduce seen through a masked view (a pad): padding a value gives 0, padding its loads does not;
- a reduce whose value would be recomputed: it is used where it doesn't depend on some axis (broadcast) that a loop
  runs inside the loops it does depend on, so the kernel cannot compute it once and keep it (a matmul feeding a
  matmul). A reduce that depends only on outer loops is computed once per their iteration (softmax's row max)."""
from __future__ import annotations
import math
from dataclasses import dataclass, field
from typing import Any
import kernopt
from kernopt import ShapeTracker, View, ast as A
from examples.tensor.lazy import Lazy, merge_vars, upper

class _Refuse(Exception):
  """Lowering found a node that must be realized first."""
  def __init__(self, node: Lazy): self.node = node

@dataclass
class ScheduledKernel:
  out: Lazy
  ast: Any
  inputs: list[Lazy]                   # by buffer index 1..
  var_vals: dict[str, int] = field(default_factory=dict)

def _contiguous_strides(shape: tuple[Any, ...]) -> tuple[Any, ...]:
  out, acc = [], 1
  for s in reversed(shape):
    out.append(acc if not (isinstance(s, int) and s == 1) else 0)
    acc = acc * s
  return tuple(reversed(out))

def _masked(st: ShapeTracker) -> bool: return any(v.mask is not None for v in st.views)

def _is_one(x: Any) -> bool: return isinstance(x, int) and x == 1

def _recomputed(st: ShapeTracker) -> bool:
  """Whether a value read through st (shape: the kernel's index space, in loop order) would be recomputed: some axis
  it doesn't depend on lies inside an axis it does depend on."""
  strides = st.real_strides()
  axes = list(enumerate(zip(strides, st.shape)))
  deps = [i for i, (s, n) in axes if not _is_one(n) and not (isinstance(s, int) and s == 0)]
  bcast = [i for i, (s, n) in enumerate(zip(strides, st.shape)) if not _is_one(n) and isinstance(s, int) and s == 0]
  return bool(deps and bcast) and max(deps) > min(bcast)

def _reduce_view(st: ShapeTracker, slots: tuple[int, ...], src_shape: tuple[Any, ...],
                 axes: tuple[int, ...]) -> ShapeTracker:
  """st maps the index space to a reduce's (keep-dims) elements; the result maps the same space, with the `slots`
  axes grown to the reduced sizes, to the reduce's source elements (slot k walks reduced axis axes[k])."""
  red = tuple(src_shape[a] for a in axes)
  size = math.prod(red)
  red_strides = _contiguous_strides(red)
  views = []
  for i, v in enumerate(st.views):
    if i < len(st.views) - 1:   # an inner view: indexed by the flat position above it, now times `size` plus the slot
      views.append(View.create(v.shape + (size,), tuple(s * size for s in v.strides) + (1,), v.offset * size,
                               None if v.mask is None else tuple(v.mask) + ((0, size),)))
      continue
    shape, strides = list(v.shape), [s * size for s in v.strides]
    mask = list(v.mask) if v.mask is not None else None
    for slot, n, s in zip(slots, red, red_strides):
      shape[slot], strides[slot] = n, s
      if mask is not None: mask[slot] = (0, n)
    views.append(View.create(tuple(shape), tuple(strides), v.offset * size, None if mask is None else tuple(mask)))
  keep = tuple(1 if i in axes else s for i, s in enumerate(src_shape))
  src_strides = _contiguous_strides(src_shape)
  to_src = View.create(keep + red, tuple(0 if i in axes else s for i, s in enumerate(src_strides)) +
                       tuple(src_strides[a] for a in axes))
  return ShapeTracker((to_src,)) + ShapeTracker(tuple(views))

def _count_slots(node: Lazy, stop: set[int], root: Lazy) -> int:
  if node is not root and (node.realized or id(node) in stop): return 0
  own = len(node.arg[1]) if node.op == "REDUCE" else 0
  return own + sum(_count_slots(s, stop, root) for s in node.srcs)

class _Lowerer:
  """Builds the AST of one kernel computing `root`; nodes in `stop` (and BUFFERs) are its inputs."""
  def __init__(self, root: Lazy, stop: set[int], rank: int):
    self.root, self.stop, self.rank = root, stop, rank
    self.inputs: list[Lazy] = []
    self.idx: dict[int, int] = {}
    self.memo: dict[tuple[int, ShapeTracker], Any] = {}
    self.next_slot = len(root.shape)
    self.var_vals = dict(root.var_vals)

  def input(self, node: Lazy) -> int:
    if id(node) not in self.idx:
      self.idx[id(node)] = len(self.inputs) + 1
      self.inputs.append(node)
      self.var_vals = merge_vars(self.var_vals, node.var_vals)
    return self.idx[id(node)]

  def lower(self, node: Lazy, st: ShapeTracker) -> Any:
    key = (id(node), st)
    if key not in self.memo: self.memo[key] = self._lower(node, st)
    return self.memo[key]

  def _lower(self, node: Lazy, st: ShapeTracker) -> Any:
    if node is not self.root and (node.realized or id(node) in self.stop):
      return A.load(self.input(node), node.dtype, st)
    if node.op == "CONST":
      return A.const(node.arg, node.dtype, A.view(node.shape, (0,) * len(node.shape)) + st)
    if node.op == "VIEW": return self.lower(node.srcs[0], node.arg + st)
    if _masked(st): raise _Refuse(node)
    if node.op == "ALU":
      srcs = [self.lower(s, st) for s in node.srcs]
      if isinstance(node.arg, tuple): return A.cast(srcs[0], node.arg[1])
      return getattr(A, node.arg)(*srcs)
    assert node.op == "REDUCE", node.op
    if node is not self.root and _recomputed(st): raise _Refuse(node)
    op, axes = node.arg
    slots = tuple(range(self.next_slot, self.next_slot + len(axes)))
    self.next_slot += len(axes)
    src = self.lower(node.srcs[0], _reduce_view(st, slots, node.srcs[0].shape, axes))
    return getattr(A, op)(src, slots)

  def kernel(self, verify: bool = True) -> Any:
    full = self.root.shape + (1,) * (self.rank - len(self.root.shape))
    value = self.lower(self.root, ShapeTracker.from_shape(self.root.shape).reshape(full))
    return A.kernel(A.store(0, value), verify=verify)

def _lower_kernel(root: Lazy, stop: set[int]) -> tuple[Any, _Lowerer]:
  # first with room for every reduce instance, then with as many extra axes as the shared (memoized) ones used
  first = _Lowerer(root, stop, len(root.shape) + _count_slots(root, stop, root))
  first.kernel(verify=False)
  low = _Lowerer(root, stop, first.next_slot)
  return low.kernel(), low

def schedule(outs: list[Lazy]) -> list[ScheduledKernel]:
  """The kernels computing `outs`, each after the kernels computing its inputs. A node found to need a kernel of its
  own is added to `stop` and the kernel being built is lowered again (kernels built before it stay correct: they
  compute that node themselves)."""
  stop = {id(o) for o in outs if not o.realized}
  order: list[ScheduledKernel] = []
  done: set[int] = set()
  def visit(node: Lazy) -> None:
    if node.realized or id(node) in done: return
    done.add(id(node))
    while True:
      try:
        ast, low = _lower_kernel(node, stop)
        break
      except _Refuse as r: stop.add(id(r.node))
    for i in low.inputs: visit(i)
    order.append(ScheduledKernel(node, ast, low.inputs, low.var_vals))
  for o in outs: visit(o)
  return order

# ***** running a schedule *****

_RUNNERS: dict[tuple[str, str], Any] = {}
COUNTS = {"kernels_run": 0, "compiled": 0}

def _key(ast: Any, device: str) -> tuple[str, str]: return (device, repr(ast))

def compile_schedule(kernels: list[ScheduledKernel], device: str) -> list[Any]:
  """The runners of the kernels, building every one not built before with one kernopt.compile_many call."""
  todo = list({_key(k.ast, device): k.ast for k in kernels if _key(k.ast, device) not in _RUNNERS}.items())
  if todo:
    built = kernopt.compile_many([ast for _, ast in todo], device)
    for (key, ast), runner in zip(todo, built):
      if isinstance(runner, kernopt.KernoptError): raise runner
      _RUNNERS[key] = runner
    COUNTS["compiled"] += len(todo)
  return [_RUNNERS[_key(k.ast, device)] for k in kernels]

def realize(outs: list[Lazy]) -> list[ScheduledKernel]:
  """Compute outs (and what they need): schedule, compile in one call, run in order. Returns the schedule."""
  outs = [o for o in outs if not o.realized]
  if not outs: return []
  device = outs[0].device
  kernels = schedule(outs)
  runners = compile_schedule(kernels, device)
  for k, runner in zip(kernels, runners):
    out = kernopt.Buffer(device, max(1, upper(math.prod(k.out.shape))), k.out.dtype)
    runner(out, *[i.buffer for i in k.inputs], var_vals=k.var_vals, wait=True)
    COUNTS["kernels_run"] += 1
    k.out.become_buffer(out)
  return kernels

def fused_shape(ast: Any) -> tuple[Any, ...]:
  """The full shape of a kernel: per axis, the size of any load or const that is not 1 there."""
  shapes = [op.arg.st.shape for op in ast.lazyops if op.op.name in ("LOAD", "CONST")] or [ast.src[0].arg.st.shape]
  return tuple(next((s for s in col if not _is_one(s)), 1) for col in zip(*shapes))

__all__ = ["schedule", "realize", "compile_schedule", "fused_shape", "ScheduledKernel", "COUNTS"]
