"""The loop nest a Kernel optimizes: one KERNEL AST's buffers (and each reduce's input and output) as ShapeTrackers
of one common rank, the counters that group its axes (global, local, grouped reduce, reduce loops, upcast), and the
moves that reshape every tracker at once. The state is a few immutable fields, so a snapshot is a tuple and
restoring it is exact. Imports dtype, helpers, errors, shape/, ops, renderers, opt and decisions."""
from __future__ import annotations
import itertools
from types import MappingProxyType
from typing import Any, Callable, Iterator, Mapping, Optional, Sequence, TypeGuard, Union, cast
from kernopt import ops
from kernopt.decisions import Decision
from kernopt.dtype import ImageDType, dtypes
from kernopt.errors import KernelOptError, UnsupportedError, VerifyError
from kernopt.helpers import all_int, ansilen, ansistrip, colored, dedup, get_contraction, getconfig
from kernopt.ops import BufferOps, ConstBuffer, LazyOp, MemBuffer, ReduceOps
from kernopt.opt import Opt, OptOps, TensorCoreOptions
from kernopt.renderers import Renderer, TensorCore
from kernopt.shape.shapetracker import ShapeTracker
from kernopt.shape.symbolic import Node, sint

def is_int(x: Any) -> TypeGuard[int]: return type(x) is int
def divides(size: sint, amt: int) -> bool:
  """amt divides size (for a symbolic size: provably, e.g. 64*n by 4)."""
  return amt > 0 and size % amt == 0
def fmt(s: sint) -> str: return s.render() if isinstance(s, Node) else str(s)

def preorder(root: LazyOp) -> list[LazyOp]:
  """Every op under root, parents before children (the order that puts the output buffer first)."""
  seen: dict[LazyOp, None] = {}
  stack = [root]
  while stack:
    op = stack.pop()
    if op in seen: continue
    seen[op] = None
    stack.extend(reversed(op.src))
  return list(seen)

def kernel_trackers(ast: LazyOp) -> dict[LazyOp, ShapeTracker]:
  """The ShapeTracker of every op of a KERNEL, as ops.verify_lazyop computes them (a buffer's own, a reduce's output
  shape, an ALU op its first source's), once the Kernel's own rules hold too: an AST to optimize has no WMMA and no
  local buffer, which only Opts make. Raises VerifyError for a malformed tree, UnsupportedError for a WMMA."""
  try: sts = ops.verify_lazyop(ast)
  except AssertionError as e: raise VerifyError(f"invalid AST: {e}") from e
  for op in sts:
    if op.op is ReduceOps.WMMA: raise UnsupportedError(f"{op.op} inside an unoptimized AST")
    if op.op is BufferOps.LOAD and op.src:
      raise VerifyError(f"LOAD of a local buffer (idx {op.arg.idx}) inside an unoptimized AST: only GROUP Opts "
                        "make one")
  return sts

# a snapshot: the fields an Opt changes, in this order
State = tuple[Any, ...]
_STATE = ("sts", "applied_opts", "group_for_reduces", "upcasted", "local_dims", "tensor_core", "tensor_core_opts",
          "bufs_for_tensor_core", "dont_use_locals", "trace")

class LoopNest:
  """The loop nest of one KERNEL AST. Every buffer (and each reduce's input and output) has a ShapeTracker of the
  same rank; Opts split, move and pad axes of all of them together."""

  def __init__(self, ast: LazyOp, opts: Renderer):
    self.ast, self.opts = ast, opts
    op_sts = kernel_trackers(ast)
    if (save_dir := getconfig().SAVE_ASTS): ops.save_if_asked(ast, save_dir)
    # children first: a nested reduce comes before the reduce that consumes it
    self.reduceops: list[LazyOp] = [x for x in ast.lazyops if x.op in ReduceOps]
    self.vars: list[Any] = ast.vars()
    self.bufs: list[Union[MemBuffer, ConstBuffer]] = dedup([x.arg for x in preorder(ast) if x.op in BufferOps])
    self.buf_index: dict[Union[MemBuffer, ConstBuffer], int] = {b: i for i, b in enumerate(self.bufs)}
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
    # (len(applied_opts) when recorded, Decision) for every heuristic step, in order; see Kernel.explain()
    self.trace: tuple[tuple[int, Decision], ...] = ()

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
    early = [x.arg for x in preorder(self.reduceops[0]) if x.op in BufferOps] if self.reduceops else []
    first = self.buf_index[early[0]] if early else 0
    if (i := next((i for i in (first, *range(len(self.sts))) if self.sts[i].shape == full), None)) is not None: return i
    self.sts += (ShapeTracker.from_shape(full),)
    return len(self.sts) - 1

  # ***** state *****

  def snapshot(self) -> State:
    """Everything an Opt changes, as one immutable value: `restore` of it undoes every Opt applied since."""
    return tuple(getattr(self, f) for f in _STATE)

  def restore(self, state: State) -> None:
    """Put back the state a `snapshot` took (Opts, trace and all)."""
    for f, v in zip(_STATE, state): setattr(self, f, v)

  def record(self, decision: Decision) -> None:
    """Append a heuristic's decision to the trace (after its Opt, if any, was applied)."""
    self.trace += ((len(self.applied_opts), decision),)

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
    sizes = [f"{s:4d}" if is_int(s) and not dense else fmt(s) for s in self.full_shape]
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
    return kind + outs + colored("_", "BLACK").join(colored(fmt(s), c) for s, c in zip(self.full_shape, self.colors()))

  # ***** per-buffer views of the upcasted axes *****

  def shape_offsets(self, i: int) -> Iterator[tuple[int, ...]]:
    """Every index into tracker i's upcasted axes, last axis slowest."""
    if self.upcasted == 0: return iter([()])
    upcasted = cast(tuple[int, ...], self.sts[i].shape[self.shape_len - self.upcasted:])  # upcast axes are concrete
    return itertools.product(*[range(s) for s in upcasted[::-1]])

  def float4_axis(self, i: int) -> list[int]:
    """Upcasted unit-stride axes of tracker i whose size is a multiple of 4, counted from the first upcasted axis."""
    start = self.shape_len - self.upcasted
    return [x - start for x in self.sts[i].unit_stride_axes() if x >= start and divides(self.sts[i].shape[x], 4)]

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
    if not self.opts.caps.supports_float4 or not (dt in (dtypes.float, dtypes.half) or isinstance(dt, ImageDType)):
      return []
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

  def real_axis(self, opt: Opt) -> int:
    """The axis of the full shape `opt` addresses (-1 when it has none): UNROLL counts from first_reduce, GROUP and
    GROUPTOP from the first ungrouped reduce axis."""
    if opt.axis is None: return -1
    if opt.op is OptOps.UNROLL: return self.first_reduce + opt.axis
    if opt.op in (OptOps.GROUP, OptOps.GROUPTOP): return self.first_reduce + self.group_for_reduces + opt.axis
    return opt.axis
