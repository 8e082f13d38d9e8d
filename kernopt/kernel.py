"""The Kernel: one AST's loop nest as a set of ShapeTrackers with a common shape, the Opts that reshape that
nest (threads, workgroups, upcasts, unrolls, shared-memory reductions, tensor cores), the hand-coded heuristics
that choose them, and the optimized AST handed to the lowerer. Imports dtype, helpers, errors, shape/, ops, uops
and renderers; the lowerer and uopgraph are imported inside `linearize`."""
from __future__ import annotations
import functools
import itertools
from dataclasses import dataclass, replace
from types import MappingProxyType
from typing import Any, Callable, Iterator, Mapping, Optional, Sequence, TypeGuard, Union, cast
from kernopt import debug, heuristics, heuristics_cpu, heuristics_cuda, heuristics_opencl, ops
from kernopt.dtype import ImageDType, dtypes
from kernopt.errors import KernelOptError, ShapeError, UnsupportedError, VerifyError
from kernopt.opt import Opt, OptOps, TensorCoreOptions
from kernopt.helpers import all_int, all_same, ansilen, ansistrip, colored, count, dedup, get_contraction, getconfig, \
                            prod, round_up, to_function_name
from kernopt.ops import BinaryOps, BufferOps, ConstBuffer, KernelInfo, LazyOp, MemBuffer, MetaOps, ReduceOps, UnaryOps
from kernopt.renderers import BufferArg, Program, Renderer, TensorCore, VarArg, get_renderer, var_dtype
from kernopt.shape.shapetracker import ShapeTracker, bounds_union
from kernopt.shape.symbolic import Node, sint
from kernopt.shape.view import View

@dataclass(frozen=True)
class _TCLayout:
  """How one vendor's WMMA wants its operands laid out: the axes (offsets from the first upcasted axis) that hold
  each operand's fragment and that the instruction reduces, and the warp/fragment permutations of A and B."""
  upcast: tuple[int, int, int]
  reduce: tuple[int, ...]
  warp: tuple[int, ...]
  tcd: tuple[int, ...]
  tcd_expand: tuple[int, ...]
  perm_a: tuple[tuple[tuple[int, int], ...], tuple[tuple[int, int], ...]]
  perm_b: Optional[tuple[tuple[tuple[int, int], ...], tuple[tuple[int, int], ...]]]

# the (group, index) pairs of a permutation name an axis of the warp dims (group 0) or of the expanded tcd (group 1)
_TC_LAYOUTS: dict[str, _TCLayout] = {
  "AMD": _TCLayout(upcast=(0, 0, 1), reduce=(0,), warp=(8, 2, 2), tcd=(16, 8), tcd_expand=(16, 2, 4),
                   perm_a=(((1, 2), (0, 2), (1, 1), (0, 1)), ((1, 0), (0, 0))), perm_b=None),
  "METAL": _TCLayout(upcast=(1, 1, 1), reduce=(0,), warp=(2, 4, 2, 2), tcd=(8, 2), tcd_expand=(2, 2, 2, 2),
                     perm_a=(((1, 1), (0, 1), (1, 0), (0, 3)), ((0, 0), (0, 2), (1, 3), (1, 2))),
                     perm_b=(((0, 0), (1, 1), (1, 2), (0, 2), (1, 0)), ((0, 1), (0, 3), (1, 3)))),
  # the PTX m16n8k16 fragment layout
  "CUDA": _TCLayout(upcast=(0, 2, 2), reduce=(0, 1), warp=(2, 2, 2, 2, 2), tcd=(8, 2, 4), tcd_expand=(2,) * 6,
                    perm_a=(((1, 1), (1, 0), (0, 2), (0, 3), (0, 4)),
                            ((1, 3), (1, 4), (1, 2), (0, 0), (0, 1), (1, 5))),
                    perm_b=(((1, 1), (1, 0), (1, 5), (0, 0), (0, 1)),
                            ((0, 4), (0, 2), (1, 4), (0, 3), (1, 3), (1, 2)))),
}
_TC_LAYOUTS["NV"] = _TC_LAYOUTS["CUDA"]

_LOCAL_OPS = (OptOps.LOCAL, OptOps.GROUP, OptOps.GROUPTOP, OptOps.UPCASTMID)
_NEEDS_AMT = (OptOps.UPCAST, OptOps.UPCASTMID, OptOps.UNROLL, OptOps.LOCAL, OptOps.GROUP, OptOps.GROUPTOP, OptOps.PADTO)

_OP_ENUMS = (ops.UnaryOps, ops.BinaryOps, ops.TernaryOps, ops.ReduceOps, ops.BufferOps, ops.MetaOps)

def _is_int(x: Any) -> TypeGuard[int]: return type(x) is int
def _divides(size: sint, amt: int) -> bool:
  """amt divides size (for a symbolic size: provably, e.g. 64*n by 4)."""
  return amt > 0 and size % amt == 0
def _fmt(s: sint) -> str: return s.render() if isinstance(s, Node) else str(s)
def _stride_key(s: Any) -> int: return s if _is_int(s) else (s.max if s is not None else 0)

def _preorder(root: LazyOp) -> list[LazyOp]:
  """Every op under root, parents before children (the order that puts the output buffer first)."""
  seen: dict[LazyOp, None] = {}
  stack = [root]
  while stack:
    op = stack.pop()
    if op in seen: continue
    seen[op] = None
    stack.extend(reversed(op.src))
  return list(seen)

def _reduce_free(op: LazyOp) -> bool: return all(x.op not in ReduceOps for x in op.lazyops)

def _derive_sts(ast: LazyOp) -> dict[LazyOp, ShapeTracker]:
  """The ShapeTracker of every op of a KERNEL: a buffer's own, a reduce's output shape, an ALU op its first
  source's. Raises VerifyError for a malformed tree, UnsupportedError for reduces of different shapes."""
  sts: dict[LazyOp, ShapeTracker] = {}
  for op in ast.lazyops:
    if not isinstance(op.op, _OP_ENUMS): raise VerifyError(f"unknown op {op.op!r}")
    if op.op is MetaOps.KERNEL and op is not ast: raise VerifyError("a KERNEL op can only be the root")
    if op.op is MetaOps.KERNEL:
      if not op.src or any(s.op is not BufferOps.STORE for s in op.src):
        raise VerifyError(f"KERNEL must have only STORE sources, got {[s.op for s in op.src]}")
      if not all_same([sts[s].shape for s in op.src]):
        raise VerifyError(f"the STOREs of a kernel must share a shape: {[sts[s].shape for s in op.src]}")
      continue
    if op.op in BufferOps:
      if not isinstance(op.arg, (MemBuffer, ConstBuffer)):
        raise VerifyError(f"{op.op} needs a MemBuffer or ConstBuffer, got {op.arg!r}")
      if op.op is BufferOps.STORE and (len(op.src) != 1 or sts[op.src[0]].shape != op.arg.st.shape):
        which = op.arg.idx if isinstance(op.arg, MemBuffer) else op.arg
        raise VerifyError(f"STORE of buffer {which}: source shapes {[sts[s].shape for s in op.src]} "
                          f"!= {op.arg.st.shape}")
      if op.op is not BufferOps.STORE and op.src: raise VerifyError(f"{op.op} takes no sources")
      sts[op] = op.arg.st
    elif op.op in (ReduceOps.SUM, ReduceOps.MAX):
      if len(op.src) != 1: raise VerifyError(f"{op.op} takes one source, got {len(op.src)}")
      shape = sts[op.src[0]].shape
      if not isinstance(op.arg, tuple) or any(not _is_int(a) or not 0 <= a < len(shape) for a in op.arg):
        raise VerifyError(f"{op.op}: reduce axes {op.arg!r} invalid for shape {shape}")
      sts[op] = ShapeTracker.from_shape(tuple(1 if i in op.arg else s for i, s in enumerate(shape)))
    elif op.op is ReduceOps.WMMA: raise UnsupportedError(f"{op.op} inside an unoptimized AST")
    else:
      if not op.src: raise VerifyError(f"{op.op} has no sources")
      if not all_same([sts[s].shape for s in op.src]):
        raise VerifyError(f"{op.op}: source shapes differ: {[sts[s].shape for s in op.src]}")
      sts[op] = sts[op.src[0]]
  return sts

def _fix_tc_st(layout: _TCLayout, perm: tuple, wd: int, tcd: int, st: ShapeTracker) -> ShapeTracker:
  """st with its warp axes (from wd) and fragment axes (from tcd) permuted into the vendor's register layout."""
  if st.shape[wd:wd + len(layout.warp)] != layout.warp or st.shape[tcd:tcd + len(layout.tcd)] != layout.tcd:
    raise UnsupportedError(f"tensor-core layout: shape {st.shape} lacks warp dims {layout.warp} at {wd} or "
                           f"fragment dims {layout.tcd} at {tcd}")
  expanded = st.shape[:tcd] + layout.tcd_expand + st.shape[tcd + len(layout.tcd):]
  def place(pairs: tuple) -> list[int]: return [i + (wd if grp == 0 else tcd) for grp, i in pairs]
  order = [*range(wd), *place(perm[0]), *range(wd + len(layout.warp), tcd), *place(perm[1]),
           *range(tcd + len(layout.tcd_expand), len(expanded))]
  return st.reshape(expanded).simplify().permute(tuple(order)).reshape(st.shape).simplify()

# the rules kernel.py itself records (the heuristics modules declare theirs), as Decisions cite them
RULES: dict[str, str] = {
  "direct": "an Opt applied by the caller (apply_opt, apply_tensor_cores' extra_opts, a search), not by a rule",
  "required.image_output": "an image output: UPCAST its first unit-stride axis divisible by 4 (float4 texels)",
  "kernel.empty": "an axis of size 0: no heuristic runs",
  "tc.off": "the dialect has no tensor cores and USE_TC != 2",
  "tc.no_match": "a tensor core tried, and why it does not fit the reduce",
  "tc.refused": "why no tensor core applied: the check that refused it, or an Opt after it that was refused",
  "tc.apply": "the first tensor core that fits: TC with its N, M, K axes and pads",
  "tc.upcast": "after a tensor core: UPCAST M, then N, by their largest divisor of at most 5",
  "tc.local": "after a tensor core: LOCAL N by 4 or 2",
}

def default_renderer() -> Renderer:
  """What `Kernel(ast)` targets without `opts`: with DEVICE unset or CPU, the native CPU profile of this host (its
  vector width, FMA and cores; no device is opened, no numpy imported); with another DEVICE, that dialect's static
  profile. The spec's static C dialect stays `get_renderer("CPU")`."""
  device = (getconfig().DEVICE or "CPU").upper()
  if device == "CPU":
    from kernopt.renderers.native import NativeCRenderer
    return NativeCRenderer()
  return get_renderer(device)


def _unmask_broadcast(st: ShapeTracker, axis: int) -> ShapeTracker:
  """st with its mask on `axis` dropped when its one view broadcasts that axis (stride 0): after a tensor core pads an
  output axis (N or M), such an operand then reads the same in-bounds element at the padded positions too. Those
  positions only reach the padded outputs, whose stores stay masked; and AMD's WMMA needs lanes 16-31 (a thread split
  of N) to hold the same A as lanes 0-15, which a mask on N would zero."""
  if len(st.views) != 1 or (v := st.views[0]).mask is None or v.strides[axis] != 0: return st
  mask = tuple((0, s) if i == axis else m for i, (m, s) in enumerate(zip(v.mask, v.shape)))
  return ShapeTracker((View.create(v.shape, v.strides, v.offset, mask),))

class Kernel:
  """The loop nest of one KERNEL AST. Every buffer (and each reduce's input and output) has a ShapeTracker of the
  same rank; Opts split, move and pad axes of all of them together. The state is a few immutable fields, so
  `copy()` shares them and a refused Opt restores them exactly."""

  def __init__(self, *ast: LazyOp, opts: Optional[Renderer] = None):
    if not ast: raise VerifyError("Kernel needs a KERNEL op or one or more STOREs")
    if any(not isinstance(x, LazyOp) for x in ast):
      raise VerifyError(f"Kernel takes LazyOps, got {[type(x).__name__ for x in ast]}")
    if len(ast) == 1 and ast[0].op is MetaOps.KERNEL: self.ast: LazyOp = ast[0]
    elif all(x.op is BufferOps.STORE for x in ast): self.ast = LazyOp(MetaOps.KERNEL, tuple(ast))
    else: raise VerifyError(f"Kernel takes one KERNEL op or only STOREs, got {[x.op for x in ast]}")
    if opts is not None and not isinstance(opts, Renderer):
      hint = f"{type(opts).__name__}.renderer" if isinstance(getattr(opts, "renderer", None), Renderer) else \
        f"get_renderer({opts!r})" if isinstance(opts, str) else "Device[name].renderer or get_renderer(name)"
      raise UnsupportedError(f"Kernel opts must be a Renderer (e.g. {hint}), got {type(opts).__name__}")
    self.opts: Renderer = opts if opts is not None else default_renderer()
    if (verify := getattr(ops, "verify_lazyop", None)) is not None:
      try: verify(self.ast)
      except AssertionError as e: raise VerifyError(f"invalid AST: {e}") from e
    op_sts = _derive_sts(self.ast)
    if (save_dir := getconfig().SAVE_ASTS): ops.save_if_asked(self.ast, save_dir)

    order = _preorder(self.ast)
    # children first: a nested reduce comes before the reduce that consumes it
    self.reduceops: list[LazyOp] = [x for x in self.ast.lazyops if x.op in ReduceOps]
    self.vars: list[Any] = self.ast.vars()
    self.bufs: list[Union[MemBuffer, ConstBuffer]] = dedup([x.arg for x in order if x.op in BufferOps])
    self._buf_index = {b: i for i, b in enumerate(self.bufs)}
    self.sts: tuple[ShapeTracker, ...] = tuple(b.st for b in self.bufs) + \
      tuple(st for r in self.reduceops for st in (op_sts[r], op_sts[r.src[0]]))
    self.full_buf_index: int = self._full_index()
    self.applied_opts: tuple[Opt, ...] = ()
    self.group_for_reduces: int = 0
    self.upcasted: int = 0
    self.local_dims: int = 0
    self.tensor_core: Optional[TensorCore] = None
    self.tensor_core_opts: Optional[TensorCoreOptions] = None
    self.bufs_for_tensor_core: Mapping[LazyOp, tuple[int, int]] = MappingProxyType({})
    self.dont_use_locals: bool = False
    # (len(applied_opts) when recorded, Decision) for every heuristic step, in order; see explain()
    self.trace: tuple[tuple[int, heuristics.Decision], ...] = ()
    self._opt_ast: Optional[tuple[tuple, LazyOp]] = None

    # reduce axes go last, then size-1 axes vanish and adjacent axes merge where every tracker allows it
    kept = [i for i, (s, o) in enumerate(zip(self.full_shape, self.output_shape)) if s == o]
    self.reshape_and_permute(None, kept + [i for i in range(self.shape_len) if i not in kept])
    self.simplify_ones()
    self.simplify_merge_adjacent()

  def _full_index(self) -> int:
    """The tracker of the full shape (each axis's size where some tracker's isn't 1): the first buffer under the first
    reduce, as in the spec, when it has it; else the first tracker that does (several reduces over different axes);
    else a contiguous tracker of the full shape, appended to sts so that every Opt moves it too."""
    full = tuple(next((st.shape[i] for st in self.sts if st.shape[i] != 1), 1) for i in range(len(self.sts[0].shape)))
    early = [x.arg for x in _preorder(self.reduceops[0]) if x.op in BufferOps] if self.reduceops else []
    first = self._buf_index[early[0]] if early else 0
    if (i := next((i for i in (first, *range(len(self.sts))) if self.sts[i].shape == full), None)) is not None: return i
    self.sts += (ShapeTracker.from_shape(full),)
    return len(self.sts) - 1

  # ***** state *****

  _STATE = ("sts", "applied_opts", "group_for_reduces", "upcasted", "local_dims", "tensor_core", "tensor_core_opts",
            "bufs_for_tensor_core", "dont_use_locals", "trace")
  def _snapshot(self) -> tuple: return tuple(getattr(self, f) for f in Kernel._STATE)
  def _restore(self, snap: tuple) -> None:
    for f, v in zip(Kernel._STATE, snap): setattr(self, f, v)

  def record(self, decision: heuristics.Decision) -> None:
    """Append a heuristic's decision to the trace (after its Opt, if any, was applied)."""
    self.trace += ((len(self.applied_opts), decision),)

  def explain(self) -> heuristics.Explanation:
    """The decisions that chose applied_opts, in order: each heuristic step's rule, the values that decided it and
    its Opt or why none; an Opt applied directly (apply_opt, a search) appears as rule "direct". Applying
    `explain().opts` in order to a fresh Kernel of the same AST and renderer reproduces applied_opts."""
    out: list[heuristics.Decision] = []
    done = 0
    def direct(upto: int) -> None:
      nonlocal done
      for o in self.applied_opts[done:upto]: out.append(heuristics.Decision("direct", {}, o, "applied by the caller"))
      done = max(done, upto)
    for n, d in self.trace:
      direct(n - 1 if d.opt is not None else n)
      out.append(d)
      if d.opt is not None: done += 1
    direct(len(self.applied_opts))
    return heuristics.Explanation(tuple(out))

  def copy(self) -> Kernel:
    """A kernel with the same AST, dialect and optimization state; Opts applied to it leave self unchanged."""
    ret = type(self).__new__(type(self))
    ret.__dict__.update({k: v for k, v in self.__dict__.items() if k not in ("uops", "global_size", "local_size")})
    return ret

  def __repr__(self) -> str: return f"<Kernel {ansistrip(self.name)} opts={list(self.applied_opts)}>"

  @property
  def membufs(self) -> list[MemBuffer]: return [x for x in self.bufs if isinstance(x, MemBuffer)]

  # ***** the shape and its groups of axes *****

  @property
  def shape_len(self) -> int: return len(self.sts[0].shape)
  @property
  def output_shape(self) -> tuple[sint, ...]: return self.sts[0].shape
  @property
  def full_shape(self) -> tuple[sint, ...]: return self.sts[self.full_buf_index].shape
  @property
  def full_unupcasted_shape(self) -> tuple[sint, ...]: return self.full_shape[:self.shape_len - self.upcasted]
  @property
  def reduceop(self) -> Optional[LazyOp]: return self.reduceops[0] if self.reduceops else None

  @property
  def first_reduce(self) -> int:
    """The first unupcasted axis where the output is reduced (shape_len - upcasted when none is)."""
    end = self.shape_len - self.upcasted
    out, full = self.sts[0].shape, self.full_shape
    return next((i for i in range(end) if out[i] != full[i]), end)

  @property
  def global_dims(self) -> int: return self.first_reduce - self.local_dims

  @property
  def upcast_in_mid_reduce_axes(self) -> list[int]:
    return [j for j in range(self.first_reduce, self.first_reduce + self.group_for_reduces)
            if self.full_shape[j] == self.sts[0].shape[j]]

  # Axis groups, left to right, and their colours in names and printouts:
  #   global (blue; BLUE when locals are off) | local (cyan; tensor-core warp axes nearest first_reduce)
  #   | first_reduce | grouped reduce in shared memory (green) or upcast in the middle of it (white)
  #   | reduce loops (red) | upcasted: unrolled reduce (magenta) or upcast output (yellow)
  def colors(self) -> list[str]:
    """The colour of each axis of the full shape (see the legend above)."""
    fr, gfr, end = self.first_reduce, self.group_for_reduces, self.shape_len - self.upcasted
    mid = set(self.upcast_in_mid_reduce_axes)
    ret = ["BLUE" if self.dont_use_locals else "blue"] * self.global_dims + ["cyan"] * self.local_dims
    ret += ["white" if i in mid else "green" for i in range(fr, fr + gfr)]
    ret += ["red"] * (end - fr - gfr)
    ret += ["magenta" if self.full_shape[i] != self.sts[0].shape[i] else "yellow" for i in range(end, self.shape_len)]
    assert len(ret) == self.shape_len, f"colors {ret} do not cover shape {self.full_shape}"
    return ret

  def colored_shape(self, pad: Optional[int] = None, dense: bool = False) -> str:
    """The full shape with each axis in its group's colour, optionally padded to `pad` printed columns."""
    sizes = [f"{s:4d}" if _is_int(s) and not dense else _fmt(s) for s in self.full_shape]
    ret = " ".join(colored(s, c) for s, c in zip(sizes, self.colors()))
    return ret + " " * (pad - ansilen(ret)) if pad else ret

  @property
  def name(self) -> str:
    """'r' (reduce), 'C' (copy: only buffer ops) or 'E' (elementwise), the number of outputs when more than one,
    then the axis sizes, plain text. The same AST and Opts always give the same name."""
    return ansistrip(self.display_name)

  @property
  def display_name(self) -> str:
    """`name` with each axis size coloured by its kind (for a terminal)."""
    kind = "r" if self.reduceop else ("C" if all(x.op in BufferOps for x in self.ast.lazyops[:-1]) else "E")
    outs = f"{len(self.ast.src)}_" if len(self.ast.src) > 1 else "_"
    return kind + outs + colored("_", "BLACK").join(colored(_fmt(s), c) for s, c in zip(self.full_shape, self.colors()))

  # ***** per-buffer views of the upcasted axes *****

  def shape_offsets(self, i: int) -> Iterator[tuple[int, ...]]:
    """Every index into tracker i's upcasted axes, last axis slowest."""
    if self.upcasted == 0: return iter([()])
    upcasted = cast(tuple[int, ...], self.sts[i].shape[self.shape_len - self.upcasted:])  # upcast axes are concrete
    return itertools.product(*[range(s) for s in upcasted[::-1]])

  def float4_axis(self, i: int) -> list[int]:
    """Upcasted unit-stride axes of tracker i whose size is a multiple of 4, counted from the first upcasted axis."""
    start = self.shape_len - self.upcasted
    return [x - start for x in self.sts[i].unit_stride_axes() if x >= start and _divides(self.sts[i].shape[x], 4)]

  def upcasted_axis(self, i: int) -> list[tuple[int, Optional[sint], bool]]:
    """(size, stride, is_reduce) of each upcasted axis of tracker i."""
    start = self.shape_len - self.upcasted
    shape, strides = self.sts[i].shape[start:], self.sts[i].real_strides()[start:]
    assert all_int(shape), f"upcasted axes must be concrete, got {shape}"
    return list(zip(shape, strides, [o != f for o, f in zip(self.sts[0].shape[start:], self.full_shape[start:])]))

  def acc_offsets(self, i: int) -> list[int]:
    """The accumulator slot of each upcast offset of tracker i: reduce lanes share a slot."""
    if self.upcasted == 0: return [0]
    axes = self.upcasted_axis(i)[::-1]
    slot_strides, acc = [], 1
    for size, _, is_reduce in reversed(axes):
      slot_strides.append(0 if is_reduce or size == 1 else acc)
      acc *= 1 if is_reduce else size
    slot_strides.reverse()
    return [sum(t) for t in itertools.product(*[[y * st for y in range(a[0])] for a, st in zip(axes, slot_strides)])]

  def get_float4_upcast_dim(self, i: int) -> list[int]:
    """Upcasted unit-stride axes of buffer i worth loading as vectors (float/half/image on a float4 dialect)."""
    dt = self.bufs[i].dtype
    if not (self.opts.supports_float4 and (dt in (dtypes.float, dtypes.half) or isinstance(dt, ImageDType))): return []
    start = self.shape_len - self.upcasted
    return [x for x in self.sts[i].unit_stride_axes() if x >= start and self.sts[i].shape[x] != 1]

  # ***** movement of every tracker at once *****

  def reshape_and_permute(self, new_shape_fxn: Optional[Callable[[tuple], Sequence[sint]]],
                          axis: Optional[Sequence[int]]) -> None:
    """Reshape every tracker by new_shape_fxn(its shape), then permute every tracker by axis."""
    def move(st: ShapeTracker) -> ShapeTracker:
      if new_shape_fxn is not None: st = st.reshape(tuple(new_shape_fxn(st.shape)))
      return st.permute(tuple(axis)) if axis is not None else st
    self.sts = tuple(move(st) for st in self.sts)

  def upcast(self) -> None:
    """Count the last axis as upcasted."""
    if self.full_shape[-1] == 1: raise KernelOptError(f"can't upcast the size-1 last axis of {self.full_shape}")
    self.upcasted += 1

  def shift_to(self, axis: int, amount: int, top: bool = False, insert_before: Optional[int] = None) -> None:
    """Split axis into (outer, inner) with inner = amount (outer = amount when top): old index = outer*inner_size +
    inner. The part of size amount moves to position insert_before (default: the end); the rest stays at axis."""
    if insert_before is None: insert_before = self.shape_len
    move = axis if top else axis + 1
    if move < insert_before: insert_before += 1
    def split(shape: tuple) -> tuple:
      if shape[axis] == 1: return shape[:axis] + (1, 1) + shape[axis + 1:]
      parts = (amount, shape[axis] // amount) if top else (shape[axis] // amount, amount)
      return shape[:axis] + parts + shape[axis + 1:]
    order = [i for i in range(insert_before) if i != move] + [move] + \
            [i for i in range(insert_before, self.shape_len + 1) if i != move]
    self.reshape_and_permute(split, order)

  def simplify_ones(self) -> bool:
    """Drop axes of size 1 in every tracker; True if any was dropped."""
    if self.shape_len == 0: return False
    ones = [s == 1 for s in self.full_shape]
    if not any(ones): return False
    self.local_dims -= sum(ones[self.first_reduce - self.local_dims:self.first_reduce])
    self.upcasted -= sum(ones[self.shape_len - self.upcasted:])
    self.reshape_and_permute(lambda shape: [s for s, one in zip(shape, ones) if not one], None)
    return True

  def simplify_merge_adjacent(self) -> None:
    """Merge each axis into the one before it when every tracker (and an image output's texel grid) sees the pair
    as one contiguous run; first_reduce is never merged into the axis before it."""
    if self.shape_len == 0: return
    shapes, strides = [st.shape for st in self.sts], [st.real_strides() for st in self.sts]
    if isinstance(dt := self.bufs[0].dtype, ImageDType) and (groups := get_contraction(self.output_shape, dt.shape)):
      # fake strides that restart at each image axis keep merges inside one of them
      from kernopt.shape.view import strides_for_shape
      fake: tuple = ()
      for g in groups: fake += strides_for_shape(tuple(self.output_shape[x] for x in g))
      shapes.append(self.output_shape)
      strides.append(fake)
    first_reduce = self.first_reduce
    merged: list[list[tuple[sint, Any]]] = [[(s[0], st[0])] for s, st in zip(shapes, strides)]
    full, full_run = self.full_shape, self.full_shape[0]
    for i in range(1, len(shapes[0])):
      def can(s: tuple, st: tuple, acc: list) -> bool:
        prev = acc[-1][1]
        if st[i] is None: return False
        return prev == s[i] * st[i] if st[i] != 0 else prev == 0
      # a tracker that is 1 on one axis of the pair but not on the other (the input of a reduce over other axes
      # than a sibling's) would merge to a size that is neither 1 nor the full shape's
      def agree(s: tuple, acc: list) -> bool:
        return (acc[-1][0] == 1 and s[i] == 1) or (acc[-1][0] == full_run and s[i] == full[i])
      joinable = i != first_reduce and all(can(s, st, acc) and agree(s, acc)
                                           for s, st, acc in zip(shapes, strides, merged))
      full_run = full_run * full[i] if joinable else full[i]
      for s, st, acc in zip(shapes, strides, merged):
        if joinable: acc[-1] = (acc[-1][0] * s[i], st[i])
        else: acc.append((s[i], st[i]))
    self.sts = tuple(st.reshape(tuple(x[0] for x in acc)) for st, acc in zip(self.sts, merged))

  # ***** Opts *****

  def apply_opt(self, opt: Opt, append_opt: bool = True) -> Kernel:
    """Apply opt in place and return self. All or nothing: a refused Opt raises KernelOptError and leaves the
    kernel exactly as it was."""
    snap = self._snapshot()
    try:
      if not isinstance(opt, Opt) or not isinstance(opt.op, OptOps):
        raise KernelOptError(f"not an Opt of an OptOps: {opt!r}")
      if opt.op is OptOps.TC: self._apply_tc(opt, getconfig().USE_TC)
      else: self._apply_shape_opt(opt)
      if append_opt: self.applied_opts += (opt,)
    except KernelOptError:
      self._restore(snap)
      raise
    except ShapeError as e:
      self._restore(snap)
      raise KernelOptError(f"{opt} on shape {self.full_shape}: {e}") from e
    return self

  def _refuse(self, opt: Opt, why: str) -> KernelOptError:
    return KernelOptError(f"{opt.op.name} axis={opt.axis} amt={opt.amt} refused on full shape {self.full_shape} "
                          f"(first_reduce={self.first_reduce}, upcasted={self.upcasted}): {why}")

  def _apply_shape_opt(self, opt: Opt) -> None:
    def need(cond: Any, why: str) -> None:
      if not cond: raise self._refuse(opt, why)
    need(not (self.dont_use_locals and opt.op in _LOCAL_OPS), "locals are off (NOLOCALS was applied)")
    if opt.op is OptOps.NOLOCALS: need(opt.axis is None and opt.amt is None, "NOLOCALS takes no axis or amount")
    elif opt.op is OptOps.MERGE: need(opt.amt is None, "MERGE takes no amount")
    else: need(opt.amt is not None, f"{opt.op.name} needs an amount")
    if opt.op is not OptOps.NOLOCALS:
      need(_is_int(opt.axis) and opt.axis >= 0, "axis must be a non-negative int")
    axis = opt.real_axis(self)
    need(axis < self.shape_len, f"axis {axis} out of range")
    need(opt.amt is None or self.full_shape[axis] != 0, f"axis {axis} has size 0: there is nothing to split")
    amt = -1
    if opt.amt is not None:
      need(_is_int(opt.amt) and opt.amt >= 0, "amount must be a non-negative int")
      full = opt.amt if opt.amt != 0 else self.full_shape[axis]
      if not (_is_int(full) and full != 1): raise self._refuse(opt, f"amount {full} is 1 or symbolic")
      amt = full
      if opt.op is not OptOps.PADTO: need(_divides(self.full_shape[axis], amt), f"{amt} does not divide the axis")
      self._check_shared_memory(opt, amt)
      if opt.op in (OptOps.LOCAL, OptOps.GROUP, OptOps.GROUPTOP):
        fr = self.first_reduce
        workgroup = prod(self.full_shape[fr - self.local_dims:fr + self.group_for_reduces])
        need(workgroup * amt <= self.opts.max_local_size, f"workgroup of {workgroup * amt} threads exceeds "
                                                          f"{self.opts.max_local_size}")
    getattr(self, f"_opt_{opt.op.name.lower()}")(opt, axis, amt, need)
    if self.simplify_ones() and self.tensor_core_opts is not None:
      self.tensor_core_opts = self.tensor_core_opts.fix_axes(axis)
    need(self.tensor_core is None or self._tc_layout_intact(), "it would break the tensor core's warp or fragment axes")

  def _tc_layout_intact(self) -> bool:
    """The warp axes still start at the first local axis and the fragment axes at the first upcasted one."""
    layout, gd, tcd = _TC_LAYOUTS.get(self.opts.device), self.global_dims, self.shape_len - self.upcasted
    return layout is not None and self.full_shape[gd:gd + len(layout.warp)] == layout.warp and \
           self.full_shape[tcd:tcd + len(layout.tcd)] == layout.tcd

  def _check_shared_memory(self, opt: Opt, amt: int) -> None:
    if self.reduceop is None: return
    if not (opt.op in (OptOps.GROUP, OptOps.GROUPTOP) or
            (self.group_for_reduces and opt.op not in (OptOps.NOLOCALS, OptOps.PADTO))): return
    dt = self.reduceop.dtype
    assert dt is not None, "a reduce op always has a dtype"
    acc_sz = dt.base.itemsize if isinstance(dt, ImageDType) else dt.itemsize
    start = self.shape_len - self.upcasted
    upcast_sz = prod(f for f, o in zip(self.full_shape[start:], self.sts[0].shape[start:]) if f == o)
    local_sz = prod(self.full_shape[self.first_reduce - self.local_dims:self.first_reduce + self.group_for_reduces])
    need = amt * acc_sz * upcast_sz * local_sz
    if not _is_int(need) or need > self.opts.shared_max:
      raise self._refuse(opt, f"needs {need} bytes of shared memory, the dialect has {self.opts.shared_max}")

  def _opt_local(self, opt: Opt, axis: int, amt: int, need: Callable) -> None:
    need(self.opts.has_local, f"{self.opts.device} has no local threads")
    need(axis < self.global_dims, "LOCAL splits a global axis")
    self.shift_to(axis, amt, insert_before=self.first_reduce)
    self.local_dims += 1

  def _opt_group(self, opt: Opt, axis: int, amt: int, need: Callable) -> None:
    need(self.opts.has_local and self.opts.has_shared, f"{self.opts.device} has no local threads or shared memory")
    need(self.first_reduce + self.group_for_reduces <= axis < self.shape_len - self.upcasted,
         "GROUP splits an ungrouped reduce axis")
    need(self.tensor_core is None, "can't group with tensor cores")
    need(len(self.reduceops) == 1, "can't group several reduces")
    self.shift_to(axis, amt, top=opt.op is OptOps.GROUPTOP, insert_before=self.first_reduce + self.group_for_reduces)
    self.group_for_reduces += 1
  _opt_grouptop = _opt_group

  def _opt_unroll(self, opt: Opt, axis: int, amt: int, need: Callable) -> None:
    need(axis < self.shape_len - self.upcasted, "axis is already upcasted")
    need(amt <= self.opts.max_unroll, f"unroll of {amt} exceeds {self.opts.max_unroll}")
    # a whole-axis unroll leaves size 1 behind; when that axis sits at first_reduce simplify_ones would count
    # it as a local axis, and a fully unrolled grouped axis is no longer grouped
    if self.full_shape[axis] == amt and axis == self.first_reduce: self.local_dims += 1
    if self.full_shape[axis] == amt and axis < self.first_reduce + self.group_for_reduces: self.group_for_reduces -= 1
    self.shift_to(axis, amt)
    self.upcast()

  def _opt_upcast(self, opt: Opt, axis: int, amt: int, need: Callable) -> None:
    need(axis < self.first_reduce, "UPCAST is for non-reduce axes")
    tc = self.tensor_core
    need(not (tc and self.global_dims <= axis < self.global_dims + len(tc.threads)), "can't upcast tensor-core locals")
    need(amt <= self.opts.max_upcast, f"upcast of {amt} exceeds {self.opts.max_upcast}")
    self.shift_to(axis, amt)
    self.upcast()

  def _opt_upcastmid(self, opt: Opt, axis: int, amt: int, need: Callable) -> None:
    out = self.sts[0]
    need(self.bufs[0].dtype.name.startswith("image") and not self.float4_axis(0) and self.group_for_reduces and
         self.first_reduce <= 2 and all_int(out.shape) and prod(out.shape) > 1,
         "UPCASTMID needs a grouped reduce into an image without float4 output")
    axes = out.unit_stride_axes()
    need(len(axes) == 1, f"output needs exactly one unit-stride axis, has {axes}")
    need(axes[0] == axis, f"UPCASTMID must use the unit-stride axis {axes[0]}")
    need(amt == 4, "UPCASTMID amount must be 4")
    self.shift_to(axis, amt, insert_before=self.first_reduce + self.group_for_reduces)
    self.group_for_reduces += 1

  def _opt_nolocals(self, opt: Opt, axis: int, amt: int, need: Callable) -> None:
    need(self.opts.has_local and not self.dont_use_locals, "no locals to turn off")
    need(self.local_dims == 0 and self.group_for_reduces == 0, "locals are already in use")
    self.dont_use_locals = True

  def _opt_merge(self, opt: Opt, axis: int, amt: int, need: Callable) -> None:
    need(axis >= self.shape_len - self.upcasted, "MERGE is for upcasted axes")
    need(axis + 1 < self.shape_len, "MERGE needs two upcasted axes")
    need(self.full_shape[axis:axis + 2] == self.output_shape[axis:axis + 2], "can't merge reduce axes")
    self.reshape_and_permute(None, (*range(axis), axis + 1, axis, *range(axis + 2, self.shape_len)))
    self.reshape_and_permute(lambda s: s[:axis] + (s[axis] * s[axis + 1],) + s[axis + 2:], None)
    self.upcasted -= 1

  def _opt_padto(self, opt: Opt, axis: int, amt: int, need: Callable) -> None:
    need(not self.vars, "PADTO does not work with symbolic shapes")
    need(axis < self.shape_len - self.upcasted, "can't pad an upcasted axis")
    if axis >= self.first_reduce:
      # padding a reduce axis adds zeros to the sum: only sound when every op below it maps 0 to 0
      need(all(r.op is ReduceOps.SUM and all(x.op not in ops.UNSAFE_PAD_OPS for x in r.src[0].lazyops)
               for r in self.reduceops), "reduce is not a SUM of pad-safe ops")
    padded, new = False, list(self.sts)
    for i, st in enumerate(self.sts):
      size = cast(int, st.shape[axis])  # no variables (checked above), so every shape entry is an int
      if size == 1: continue
      need(size > amt // 4, f"padding {size} to a multiple of {amt} more than quadruples the work")
      if extra := round_up(size, amt) - size:
        new[i] = st.pad(tuple((0, extra) if j == axis else (0, 0) for j in range(len(st.shape))))
        padded = True
    need(padded, "nothing to pad")
    self.sts = tuple(new)

  # ***** tensor cores *****

  def _tc_match(self, reduceop: LazyOp, tc: TensorCore, axis: int, level: int,
                why: Optional[list[str]] = None) -> Optional[tuple[TensorCoreOptions, tuple[int, int]]]:
    """The N, M, K axes (and operand buffers) for tc on reduceop, if it is a sum of products of tc.dtype_in loads
    (level >= 1: casts of loads, several reduce axes; level >= 2: sizes padded to tc.dims); else None, with the
    reason appended to `why`."""
    def no(reason: str) -> Any:
      if why is not None: why.append(reason)
      return None
    src = reduceop.src[0]
    if tc.dtype_in != tc.dtype_out:
      if not (src.op is UnaryOps.CAST and src.arg == tc.dtype_out):
        return no(f"it accumulates in {tc.dtype_out.name}: needs a reduce over a CAST to it")
      src = src.src[0]
    if src.op is not BinaryOps.MUL or len(src.src) != 2: return no(f"the reduce is over {src.op.name}, not a MUL")
    def operand(x: LazyOp) -> Optional[int]:
      if level >= 1 and x.op is UnaryOps.CAST and x.arg == tc.dtype_in: x = x.src[0]
      elif x.op is BufferOps.LOAD and x.arg.dtype != tc.dtype_in: return None
      return self._buf_index.get(x.arg) if x.op is BufferOps.LOAD else None
    if (b0 := operand(src.src[0])) is None or (b1 := operand(src.src[1])) is None:
      return no(f"an operand is not a load of {tc.dtype_in.name}" + (" or a cast of one" if level >= 1 else ""))
    fr = self.first_reduce
    st0, st1 = self.sts[b0].real_strides(), self.sts[b1].real_strides()
    n_axes = [i for i in range(fr) if st0[i] == 0]
    m_axes = [i for i in range(fr) if st1[i] == 0]
    if not (n_axes and m_axes): return no("no output axis broadcasts each operand (no N and M)")
    if not (self.shape_len - fr == 1 or level >= 1): return no("several reduce axes need TC_OPT >= 1")
    choices = list(itertools.product(n_axes, m_axes, range(fr, self.shape_len)))
    if axis >= len(choices): return no(f"axis choice {axis} of {len(choices)} (N, M, K) candidates")
    nmk = choices[-(axis + 1)]
    pads = tuple((x, tc.dims[i]) for i, x in enumerate(nmk) if not _divides(self.full_shape[x], tc.dims[i]))
    if pads and level < 2: return no(f"N, M, K {tuple(_fmt(self.full_shape[x]) for x in nmk)} are no multiples of "
                                     f"{tc.dims}: padding needs TC_OPT >= 2")
    return TensorCoreOptions(axes=nmk, axes_exist=(True, True), axis_pads=pads), (b0, b1)

  def _apply_tc(self, opt: Opt, use_tc: int, tried: Optional[list[tuple[str, str]]] = None) -> TensorCore:
    """Match a tensor core and apply its warp layout (the inner Opts are not recorded); the one applied. Each tensor
    core that does not match is appended to `tried` with the reason."""
    def need(cond: Any, why: str) -> None:
      if not cond: raise self._refuse(opt, why)
    need(not self.applied_opts, "tensor cores must be the first Opt")
    if not (_is_int(opt.axis) and _is_int(opt.amt) and opt.axis >= 0 and opt.amt >= 0):
      raise self._refuse(opt, "TC needs int axis and level")
    need(use_tc == 2 or self.opts.tensor_cores, f"{self.opts.device} has no tensor cores and USE_TC != 2")
    r = self.reduceop
    need(use_tc and self.opts.has_local and r is not None and r.op is ReduceOps.SUM,
         "needs USE_TC, a SUM reduce and a dialect with locals")
    need(all(_reduce_free(red.src[0]) for red in self.reduceops), "a reduce is nested in another")
    need(0 not in self.full_shape, "an axis has size 0")
    for tc in self.opts.tensor_cores:
      why: list[str] = []
      matches = [self._tc_match(red, tc, opt.axis, opt.amt, why) for red in self.reduceops]
      if matches[0] is None or not all_same([m[0] if m else None for m in matches]):
        if tried is not None: tried.append((str(tc), why[0] if why else "the reduces match it on different axes"))
        continue
      snap = self._snapshot()
      self.tensor_core_opts = matches[0][0]
      self.bufs_for_tensor_core = MappingProxyType({red: m[1] for red, m in zip(self.reduceops, matches) if m})
      try:
        for ax, dim in self.tensor_core_opts.axis_pads:
          self.apply_opt(Opt(OptOps.PADTO, ax, dim), append_opt=False)
          if ax < self.first_reduce: self.sts = tuple(_unmask_broadcast(st, ax) for st in self.sts)
      except KernelOptError as e:
        self._restore(snap)
        if tried is not None: tried.append((str(tc), f"padding refused: {e}"))
        continue
      debug.log(3, f"TENSOR CORES {self.tensor_core_opts} {tc}")
      self._tc_layout(tc)
      if use_tc == 1: self.tensor_core = tc
      return tc
    raise self._refuse(opt, "no tensor core matches")

  def _tc_layout(self, tc: TensorCore) -> None:
    """Split N, M, K into the warp's threads and each thread's fragment, in the order each vendor needs."""
    def tco() -> TensorCoreOptions:
      assert self.tensor_core_opts is not None
      return self.tensor_core_opts
    def do(op: OptOps, axis: int, amt: Optional[int] = None) -> None:
      self.apply_opt(Opt(op, axis, amt), append_opt=False)
    def unroll_k(amt: int) -> None: do(OptOps.UNROLL, tco().axes[2] - self.first_reduce, amt)
    def threads() -> None:
      for dim, amt in tc.threads: do(OptOps.LOCAL, tco().axes[dim], amt)
    def upcast_rest() -> None:  # the part of N and M the threads don't cover
      for d in range(2):
        sz = prod(amt for dim, amt in tc.threads if dim == d)
        if tc.dims[d] > sz: do(OptOps.UPCAST, tco().axes[d], tc.dims[d] // sz)
    device = self.opts.device
    if device == "AMD":  # AMD wants the locals before the upcasts
      unroll_k(tc.dims[2]); threads(); upcast_rest() # noqa: E702
    elif device == "METAL":
      unroll_k(tc.dims[2]); upcast_rest(); threads() # noqa: E702
    elif device in ("CUDA", "NV"):  # a fixed sequence for m16n8k16 (see DESIGN.md)
      unroll_k(8); unroll_k(2) # noqa: E702
      do(OptOps.UPCAST, tco().axes[0], 2)
      for d in (0, 0, 1, 1, 1): do(OptOps.LOCAL, tco().axes[d], 2)
      do(OptOps.UPCAST, tco().axes[1], 2)
      do(OptOps.MERGE, self.shape_len - 2)  # the fragment must be one upcasted axis
    else: raise KernelOptError(f"no tensor-core layout for device {device}")

  def apply_tensor_cores(self, use_tensor_cores: Optional[int] = None, extra_opts: Optional[list[Opt]] = None,
                         axis: int = 0, tc_opt: Optional[int] = None) -> bool:
    """Try to make the reduce a tensor-core matmul: True if it applied (with extra_opts, or the hand-coded upcasts
    and locals after it), False with the kernel unchanged otherwise (but for the decisions added to its trace).
    use_tensor_cores (default: USE_TC knob): 0 never; 1 tensor cores; 2 their shape Opts without the WMMA op.
    tc_opt (default: TC_OPT knob): 0 one reduce axis and direct loads into a MUL; 1 also several reduce axes and
    casts of loads; 2 also N, M, K that are not multiples of the tensor core's dims (padded)."""
    cfg = getconfig()
    use_tc = cfg.USE_TC if use_tensor_cores is None else use_tensor_cores
    level = cfg.TC_OPT if tc_opt is None else tc_opt
    shape, knobs = self.full_shape, {"USE_TC": use_tc, "TC_OPT": level}
    def note(rule: str, why: str, opt: Optional[Opt] = None, **facts: Any) -> None:
      self.record(heuristics.Decision(rule, {"full_shape": shape, **knobs, **facts}, opt, why))
    if not self.opts.tensor_cores and use_tc != 2:
      note("tc.off", f"{self.opts.device} has no tensor cores and USE_TC != 2")
      return False
    snap = self._snapshot()
    tried: list[tuple[str, str]] = []
    try:
      tc_op = Opt(OptOps.TC, axis, level)
      tc = self._apply_tc(tc_op, use_tc, tried)
      for name, why in tried: note("tc.no_match", why, tensor_core=name)
      tco = self.tensor_core_opts
      assert tco is not None, "a tensor core applied without its options"
      self.applied_opts += (tc_op,)
      note("tc.apply", f"{tc} matches" + (" (its shape Opts only: USE_TC=2)" if use_tc == 2 else ""), tc_op,
           tensor_core=str(tc), axes=tco.axes, pads=tco.axis_pads)
      if extra_opts is not None:
        for o in extra_opts: self.apply_opt(o)
        return True
      for d in (1, 0):  # upcast M, then N, by their largest small divisor
        tco = self.tensor_core_opts
        if tco is not None and tco.axes_exist[d]:
          div = next(u for u in (5, 4, 3, 2, 1) if _divides(self.full_shape[tco.axes[d]], u))
          ax, dim = tco.axes[d], "NM"[d]
          if div != 1: heuristics.apply(self, "tc.upcast", Opt(OptOps.UPCAST, ax, div), f"{dim} by its largest "
                                        "divisor of at most 5", axis=ax, size=self.full_shape[ax])
          else: heuristics.decide(self, "tc.upcast", f"no divisor of at most 5 divides {dim}", axis=ax,
                                  size=self.full_shape[ax])
      tco = self.tensor_core_opts
      if self.tensor_core and tco is not None and tco.axes_exist[0]:
        ax = tco.axes[0]
        if (upc := next((u for u in (4, 2) if _divides(self.full_shape[ax], u)), None)) is not None:
          heuristics.apply(self, "tc.local", Opt(OptOps.LOCAL, ax, upc), "N by 4 or 2", axis=ax,
                           size=self.full_shape[ax])
        else: heuristics.decide(self, "tc.local", "neither 4 nor 2 divides N", axis=ax, size=self.full_shape[ax])
      return True
    except KernelOptError as e:
      self._restore(snap)
      for name, why in tried: note("tc.no_match", why, tensor_core=name)
      note("tc.refused", str(e))
      return False

  # ***** heuristics *****

  def required_optimizations(self) -> Kernel:
    """The Opts a kernel can't run without: an image output is written as float4 texels along a unit-stride axis."""
    if isinstance(self.bufs[0].dtype, ImageDType):
      st = self.sts[0]
      axes = [i for i in st.unit_stride_axes(ignore_valid=True) if _divides(st.shape[i], 4)]
      if not axes: raise UnsupportedError(f"image output {self.bufs[0].dtype} needs a unit-stride axis divisible by 4, "
                                          f"shape {st.shape}")
      if all(x < self.shape_len - self.upcasted for x in axes) and axes[0] not in self.upcast_in_mid_reduce_axes:
        heuristics.apply(self, "required.image_output", Opt(OptOps.UPCAST, axes[0], 4), "the image output is "
                         "written as float4 texels", axis=axes[0], size=self.full_shape[axes[0]])
    return self

  def hand_coded_optimizations(self) -> Kernel:
    """The spec's heuristics (kernopt/heuristics.py), or, for a renderer whose `heuristics` names a device profile
    ("cpu_native", "opencl_cpu", "cuda_gpu"), that profile's rules (heuristics_cpu, heuristics_opencl,
    heuristics_cuda), falling back to the spec's when none fits. Never applies tensor cores."""
    self.required_optimizations()
    if any(s == 0 for s in self.full_shape):  # an empty output or reduce: nothing worth optimizing
      heuristics.decide(self, "kernel.empty", "an axis has size 0")
      return self
    if getattr(self.opts, "heuristics", "spec") == "cpu_native" and heuristics_cpu.hand_coded_cpu(self): return self
    if getattr(self.opts, "heuristics", "spec") == "opencl_cpu" and heuristics_opencl.hand_coded_opencl(self):
      return self
    if getattr(self.opts, "heuristics", "spec") == "cuda_gpu" and heuristics_cuda.hand_coded_cuda(self): return self
    heuristics.hand_coded(self)
    return self

  # ***** the optimized AST *****

  def get_optimized_ast(self) -> LazyOp:
    """The AST with each buffer viewed through its optimized tracker, reduce args set to the reduced axes, GROUP
    reduces split through a local buffer, tensor-core reduces replaced by WMMA, and KernelInfo on the KERNEL."""
    snap = self._snapshot()
    if self._opt_ast is not None and len(self._opt_ast[0]) == len(snap) and \
       all(a is b for a, b in zip(self._opt_ast[0], snap)): return self._opt_ast[1]
    memo: dict[tuple[LazyOp, int], LazyOp] = {}
    fixes: dict[int, Optional[Callable[[ShapeTracker], ShapeTracker]]] = {0: None}
    reduce_index = {r: i for i, r in enumerate(self.reduceops)}

    def fix(op: LazyOp, which: int = 0) -> LazyOp:
      if (key := (op, which)) not in memo:
        if type(op.op) is not ReduceOps:
          # the ops under op up to the next reduces first, children before parents: a chain costs no recursion
          below = ops.walk_ops(op, lambda x: type(x.op) is not ReduceOps and (x, which) not in memo)
          for x in below[:-1]: memo[(x, which)] = rebuild(x, which)
        memo[key] = rebuild(op, which)
      return memo[key]

    def rebuild(op: LazyOp, which: int) -> LazyOp:
      if op.op in BufferOps:
        st = self.sts[self._buf_index[op.arg]]
        fn = fixes[which]
        return LazyOp(op.op, tuple(fix(s, which) for s in op.src), replace(op.arg, st=fn(st) if fn else st))
      if op.op is MetaOps.KERNEL:
        return LazyOp(op.op, tuple(fix(s, which) for s in op.src),
                      KernelInfo(self.local_dims, self.upcasted, self.dont_use_locals))
      if op.op not in ReduceOps: return LazyOp(op.op, tuple(fix(s, which) for s in op.src), op.arg)
      base = len(self.bufs) + 2 * reduce_index[op]
      out_st, in_st = self.sts[base], self.sts[base + 1]
      axes = tuple(i for i in range(self.first_reduce + self.group_for_reduces, self.shape_len)
                   if out_st.shape[i] != in_st.shape[i])
      if (tc := self.tensor_core) is not None and op in self.bufs_for_tensor_core:
        return wmma(op, tc, axes, which)
      first = LazyOp(op.op, tuple(fix(s, which) for s in op.src), axes)
      if not self.group_for_reduces: return first
      return group(op, first)

    def wmma(op: LazyOp, tc: TensorCore, axes: tuple[int, ...], which: int) -> LazyOp:
      if which != 0: raise UnsupportedError("nested tensor-core reduces are not supported")
      layout = _TC_LAYOUTS.get(self.opts.device)
      if layout is None: raise UnsupportedError(f"no tensor-core layout for device {self.opts.device}")
      mul = op.src[0].src[0] if op.src[0].op is UnaryOps.CAST else op.src[0]
      assert mul.op is BinaryOps.MUL, f"tensor-core reduce over {mul.op}"
      wd, tcd = self.global_dims, self.shape_len - self.upcasted
      fixes[1] = functools.partial(_fix_tc_st, layout, layout.perm_a, wd, tcd)
      fixes[2] = functools.partial(_fix_tc_st, layout, layout.perm_b, wd, tcd) if layout.perm_b else None
      reduce_axes = tuple(tcd + r for r in layout.reduce)
      ua, ub, uc = layout.upcast
      arg = ops.WMMAArg(name=str(tc), dims=tc.dims, dtype_in=tc.dtype_in, dtype_out=tc.dtype_out,
                        thread_local_sizes=tuple(prod(x) for x in tc.thread_local_sizes), device=self.opts.device,
                        upcast_axes=(tcd + ua, tcd + ub, tcd + uc), reduce_axes=reduce_axes)
      ret = LazyOp(ReduceOps.WMMA, (fix(mul.src[0], 1), fix(mul.src[1], 2)), arg)
      rest = tuple(i for i in axes if i not in reduce_axes)
      return LazyOp(op.op, (ret,), rest) if rest else ret

    def group(op: LazyOp, first: LazyOp) -> LazyOp:
      gd, ld, gfr, fr = self.global_dims, self.local_dims, self.group_for_reduces, self.first_reduce
      reduce_loops = self.shape_len - self.upcasted - gfr - fr
      local_shape = (1,) * gd + self.full_shape[gd:gd + ld + gfr] + (1,) * reduce_loops + \
                    tuple(x[0] for x in self.upcasted_axis(0))
      dt = first.dtype
      assert dt is not None, "a reduce op always has a dtype"
      local = MemBuffer(-1, dt, ShapeTracker.from_shape(local_shape))
      store = LazyOp(BufferOps.STORE, (first,), local)
      return LazyOp(op.op, (LazyOp(BufferOps.LOAD, (store,), local),), tuple(range(fr, fr + gfr)))

    ret = fix(self.ast)
    self._opt_ast = (snap, ret)
    return ret

  # ***** lowering and rendering *****

  def linearize(self) -> Kernel:
    """Lower the optimized AST to an ordered UOp list (self.uops) and find the launch sizes; returns self."""
    import time
    from kernopt.lowerer import lower
    from kernopt.uopgraph import linearize as linearize_uops
    from kernopt.uops import UOps
    cfg = getconfig()
    st = time.perf_counter()
    modified = self.get_optimized_ast()
    if debug.on(3):
      debug.emit(f"{self.colored_shape()}  {self.display_name}  opts={list(self.applied_opts)}\n"
                 f"{ops.format_tree(modified)}")
      if (explain := getattr(self, "explain", None)) is not None: debug.emit(str(explain()))   # the heuristics' trace
    t_ast = time.perf_counter()
    sink = lower(modified, self.opts)
    t_lower = time.perf_counter()
    self.uops: list[Any] = linearize_uops(sink, self.opts)
    if debug.on(6):
      from kernopt.uopgraph import toposort
      debug.emit(debug.step_line("ast", len(modified.lazyops), t_ast - st))
      debug.emit(debug.step_line("lower", len(toposort(sink)), t_lower - t_ast))
      debug.emit(debug.step_line("linearize", len(self.uops), time.perf_counter() - t_lower))
    count("lowerings")
    self.global_size: Optional[list[sint]] = None
    self.local_size: Optional[list[sint]] = None
    if self.opts.has_local:
      self.global_size, self.local_size = [1, 1, 1], [1, 1, 1]
      for u in self.uops:
        if u.op is UOps.SPECIAL:
          dim, name, size = u.arg
          (self.local_size if name.startswith("l") else self.global_size)[dim] = size
    if debug.on(5): debug.emit("\n".join(f"{i:4d} {u}" for i, u in enumerate(self.uops)))
    if cfg.GRAPHUOPS: self._graph_uops()
    return self

  def _graph_uops(self) -> None:
    """GRAPHUOPS: the UOp graph as `uops_<name>.dot` in the private folder cache_dir/graphs (and an SVG beside it when
    graphviz's dot is installed); one warning, and no file, when that folder is not private."""
    import os, shutil, subprocess
    from kernopt.helpers import cache_subdir
    ids = {u: i for i, u in enumerate(self.uops)}
    lines = [f"digraph {to_function_name(self.name)} {{", "  node [shape=box];"]
    for u, i in ids.items():
      label = f"{i} {u.op.name} {u.dtype}" + (f"\\n{u.arg!r}".replace('"', "'") if u.arg is not None else "")
      lines.append(f'  n{i} [label="{label}"];')
      lines += [f"  n{ids[s]} -> n{i};" for s in u.src if s in ids]
    if (folder := cache_subdir("graphs")) is None: return
    path = os.path.join(folder, f"uops_{to_function_name(self.name)}.dot")
    with open(path, "w") as f: f.write("\n".join(lines + ["}"]) + "\n")
    shown = path
    if (dot := shutil.which("dot")) is not None:
      svg = path[:-4] + ".svg"
      try:
        subprocess.run([dot, "-Tsvg", path, "-o", svg], check=True, capture_output=True, timeout=60)
        shown = f"{path} and {svg}"
      except (OSError, subprocess.SubprocessError) as e: shown = f"{path} (dot failed: {type(e).__name__})"
    debug.log(1, f"GRAPHUOPS {self.name}: {shown}")

  def to_program(self) -> Program:
    """Linearize and render: a renderers.Program carrying the argument signature a runner checks."""
    import time
    from kernopt.uops import UOps, flops_mem
    st = time.perf_counter()
    self.linearize()
    fname = to_function_name(self.name)
    t_render = time.perf_counter()
    src = self.opts.render(fname, self.uops)
    count("renders")
    if debug.on(6): debug.emit(debug.step_line("render", len(self.uops), time.perf_counter() - t_render))
    if debug.on(4): debug.emit(src)
    flops, mem = flops_mem(self.uops)
    stored = {x.arg.idx for x in self.ast.src if x.op is BufferOps.STORE}
    uses: dict[int, list[MemBuffer]] = {}
    for b in self.membufs:
      if b.idx >= 0: uses.setdefault(b.idx, []).append(b)
    # each buffer's address range [lo, hi), checked at every launch; min_size covers every value of the Variables
    bounds = {i: bounds_union([b.st.address_bounds() for b in bs]) for i, bs in uses.items()}
    def min_size(i: int) -> int:
      hi = bounds[i][1]
      return max([0, hi if isinstance(hi, int) else hi.max] + [b.st.real_size() for b in uses[i]])
    # the signature is what was rendered: a buffer whose loads all folded away is no parameter of the source
    rendered = {u.arg[0] for u in self.uops if u.op is UOps.DEFINE_GLOBAL}
    var_dts = {u.arg.expr: u.dtype for u in self.uops if u.op is UOps.DEFINE_VAR}
    args = tuple(BufferArg(i, uses[i][0].dtype, min_size(i) if i in rendered else 0, i in stored, i in rendered)
                 for i in sorted(uses))
    args = tuple(replace(a, lo=bounds[a.idx][0], hi=bounds[a.idx][1]) if a.idx in rendered else a for a in args)
    var_args = tuple(VarArg(v.expr, var_dts.get(v.expr, var_dtype(v))) for v in self.vars)
    gs = tuple(self.global_size) if self.global_size is not None else None
    ls = tuple(self.local_size) if self.local_size is not None else None
    opts = tuple(f"{o.op.name}({o.axis},{o.amt})" for o in self.applied_opts)
    prg = Program(fname, src, self.opts.device, gs, ls, uops=tuple(self.uops), op_estimate=flops, mem_estimate=mem,
                  args=args, vars=tuple(self.vars), var_args=var_args,
                  extra={"display_name": self.display_name, "opts": opts, "codegen_s": time.perf_counter() - st})
    if getconfig().RUN_PROCESS_REPLAY:
      from kernopt import capture
      capture.record(self.ast, self.opts, [[o.op.name, o.axis, o.amt] for o in self.applied_opts], prg)
    return prg
