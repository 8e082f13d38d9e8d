"""The shape Opts (every OptOp but TC): what each checks before it moves the loop nest, and the move. `apply` is all
or nothing: a refused Opt raises KernelOptError naming the check and leaves the loop nest exactly as it was.
Imports dtype, helpers, errors, ops, renderers, opt and loop_nest."""
from __future__ import annotations
from typing import Any, Callable, Optional, cast
from kernopt import ops
from kernopt.dtype import ImageDType
from kernopt.errors import KernelOptError, ShapeError
from kernopt.helpers import all_int, prod, round_up
from kernopt.loop_nest import LoopNest, divides, is_int
from kernopt.ops import ReduceOps
from kernopt.opt import Opt, OptOps
from kernopt.renderers import TensorCore

_LOCAL_OPS = (OptOps.LOCAL, OptOps.GROUP, OptOps.GROUPTOP, OptOps.UPCASTMID)

def refuse(k: LoopNest, opt: Opt, why: str) -> KernelOptError:
  """The error that refuses opt on k, naming the shape it saw and why."""
  return KernelOptError(f"{opt.op.name} axis={opt.axis} amt={opt.amt} refused on full shape {k.full_shape} "
                        f"(first_reduce={k.first_reduce}, upcasted={k.upcasted}): {why}")

def apply(k: LoopNest, opt: Opt) -> None:
  """Apply the shape Opt opt to k (applied_opts is the caller's), all or nothing."""
  snap = k.snapshot()
  try:
    if opt.op not in _MOVES: raise refuse(k, opt, "not a shape Opt")
    _apply(k, opt)
  except KernelOptError:
    k.restore(snap)
    raise
  except ShapeError as e:
    k.restore(snap)
    raise KernelOptError(f"{opt} on shape {k.full_shape}: {e}") from e

def layout_intact(k: LoopNest, tc: Optional[TensorCore]) -> bool:
  """tc's warp axes still start at the first local axis and its fragment axes at the first upcasted one."""
  layout, gd, tcd = tc.layout if tc is not None else None, k.global_dims, k.shape_len - k.upcasted
  return layout is not None and k.full_shape[gd:gd + len(layout.warp)] == layout.warp and \
         k.full_shape[tcd:tcd + len(layout.tcd)] == layout.tcd

def _apply(k: LoopNest, opt: Opt) -> None:
  def need(cond: Any, why: str) -> None:
    if not cond: raise refuse(k, opt, why)
  need(not (k.dont_use_locals and opt.op in _LOCAL_OPS), "locals are off (NOLOCALS was applied)")
  if opt.op is OptOps.NOLOCALS: need(opt.axis is None and opt.amt is None, "NOLOCALS takes no axis or amount")
  elif opt.op is OptOps.MERGE: need(opt.amt is None, "MERGE takes no amount")
  else: need(opt.amt is not None, f"{opt.op.name} needs an amount")
  if opt.op is not OptOps.NOLOCALS:
    need(is_int(opt.axis) and opt.axis >= 0, "axis must be a non-negative int")
  axis = k.real_axis(opt)
  need(axis < k.shape_len, f"axis {axis} out of range")
  need(opt.amt is None or k.full_shape[axis] != 0, f"axis {axis} has size 0: there is nothing to split")
  amt = -1
  if opt.amt is not None:
    need(is_int(opt.amt) and opt.amt >= 0, "amount must be a non-negative int")
    full = opt.amt if opt.amt != 0 else k.full_shape[axis]
    if not (is_int(full) and full != 1): raise refuse(k, opt, f"amount {full} is 1 or symbolic")
    amt = full
    if opt.op is not OptOps.PADTO: need(divides(k.full_shape[axis], amt), f"{amt} does not divide the axis")
    _check_shared_memory(k, opt, amt)
    if opt.op in (OptOps.LOCAL, OptOps.GROUP, OptOps.GROUPTOP):
      fr = k.first_reduce
      workgroup = prod(k.full_shape[fr - k.local_dims:fr + k.group_for_reduces])
      need(workgroup * amt <= k.opts.caps.max_local_size, f"workgroup of {workgroup * amt} threads exceeds "
                                                     f"{k.opts.caps.max_local_size}")
  _MOVES[opt.op](k, opt, axis, amt, need)
  if opt.op is OptOps.PADTO and k.opts.caps.has_local:
    # padding a local or grouped axis grows the workgroup (the GPU fuzzer's GROUP(0, 0) then PADTO(0, 3) of a
    # 4096-element sum: 4098 threads, which the lowerer could not launch)
    fr = k.first_reduce
    workgroup = prod(k.full_shape[fr - k.local_dims:fr + k.group_for_reduces])
    need(is_int(workgroup) and workgroup <= k.opts.caps.max_local_size,
         f"workgroup of {workgroup} threads exceeds {k.opts.caps.max_local_size}")
  if k.simplify_ones() and k.tensor_core_opts is not None:
    k.tensor_core_opts = k.tensor_core_opts.fix_axes(axis)
  need(k.tensor_core is None or layout_intact(k, k.tensor_core),
       "it would break the tensor core's warp or fragment axes")

def group_buffer_bytes(k: LoopNest) -> Any:
  """Bytes of the local buffer a GROUP reduce of k stages its partial results in, as the Opts stand: the reduce's
  itemsize x the upcast lanes the output keeps x the local and group threads (0 without a reduce). An Opt of amount
  amt about to split these axes makes it amt times as large: the shared-memory check, and the search's limit."""
  if k.reduceop is None: return 0
  dt = k.reduceop.dtype
  assert dt is not None, "a reduce op always has a dtype"
  acc_sz = dt.base.itemsize if isinstance(dt, ImageDType) else dt.itemsize
  start = k.shape_len - k.upcasted
  upcast_sz = prod(f for f, o in zip(k.full_shape[start:], k.sts[0].shape[start:]) if f == o)
  local_sz = prod(k.full_shape[k.first_reduce - k.local_dims:k.first_reduce + k.group_for_reduces])
  return acc_sz * upcast_sz * local_sz

def _check_shared_memory(k: LoopNest, opt: Opt, amt: int) -> None:
  if k.reduceop is None: return
  if not (opt.op in (OptOps.GROUP, OptOps.GROUPTOP) or
          (k.group_for_reduces and opt.op not in (OptOps.NOLOCALS, OptOps.PADTO))): return
  need = amt * group_buffer_bytes(k)
  if not is_int(need) or need > k.opts.caps.shared_max:
    raise refuse(k, opt, f"needs {need} bytes of shared memory, the dialect has {k.opts.caps.shared_max}")

# ***** each OptOp's own checks and move; `need(cond, why)` refuses the Opt when cond is false *****

def _local(k: LoopNest, opt: Opt, axis: int, amt: int, need: Callable) -> None:
  need(k.opts.caps.has_local, f"{k.opts.caps.device} has no local threads")
  need(axis < k.global_dims, "LOCAL splits a global axis")
  k.shift_to(axis, amt, insert_before=k.first_reduce)
  k.local_dims += 1

def _group(k: LoopNest, opt: Opt, axis: int, amt: int, need: Callable) -> None:
  need(k.opts.caps.has_local and k.opts.caps.has_shared, f"{k.opts.caps.device} has no local threads or shared memory")
  need(k.first_reduce + k.group_for_reduces <= axis < k.shape_len - k.upcasted,
       "GROUP splits an ungrouped reduce axis")
  need(k.tensor_core is None, "can't group with tensor cores")
  need(len(k.reduceops) == 1, "can't group several reduces")
  k.shift_to(axis, amt, top=opt.op is OptOps.GROUPTOP, insert_before=k.first_reduce + k.group_for_reduces)
  k.group_for_reduces += 1

def _unroll(k: LoopNest, opt: Opt, axis: int, amt: int, need: Callable) -> None:
  need(axis < k.shape_len - k.upcasted, "axis is already upcasted")
  need(amt <= k.opts.caps.max_unroll, f"unroll of {amt} exceeds {k.opts.caps.max_unroll}")
  # a whole-axis unroll leaves size 1 behind; when that axis sits at first_reduce simplify_ones would count
  # it as a local axis, and a fully unrolled grouped axis is no longer grouped
  if k.full_shape[axis] == amt and axis == k.first_reduce: k.local_dims += 1
  if k.full_shape[axis] == amt and axis < k.first_reduce + k.group_for_reduces: k.group_for_reduces -= 1
  k.shift_to(axis, amt)
  k.upcast()

def _upcast(k: LoopNest, opt: Opt, axis: int, amt: int, need: Callable) -> None:
  need(axis < k.first_reduce, "UPCAST is for non-reduce axes")
  tc = k.tensor_core
  need(not (tc and k.global_dims <= axis < k.global_dims + len(tc.threads)), "can't upcast tensor-core locals")
  need(amt <= k.opts.caps.max_upcast, f"upcast of {amt} exceeds {k.opts.caps.max_upcast}")
  k.shift_to(axis, amt)
  k.upcast()

def _upcastmid(k: LoopNest, opt: Opt, axis: int, amt: int, need: Callable) -> None:
  out = k.sts[0]
  need(k.bufs[0].dtype.name.startswith("image") and not k.float4_axis(0) and k.group_for_reduces and
       k.first_reduce <= 2 and all_int(out.shape) and prod(out.shape) > 1,
       "UPCASTMID needs a grouped reduce into an image without float4 output")
  axes = out.unit_stride_axes()
  need(len(axes) == 1, f"output needs exactly one unit-stride axis, has {axes}")
  need(axes[0] == axis, f"UPCASTMID must use the unit-stride axis {axes[0]}")
  need(amt == 4, "UPCASTMID amount must be 4")
  k.shift_to(axis, amt, insert_before=k.first_reduce + k.group_for_reduces)
  k.group_for_reduces += 1

def _nolocals(k: LoopNest, opt: Opt, axis: int, amt: int, need: Callable) -> None:
  need(k.opts.caps.has_local and not k.dont_use_locals, "no locals to turn off")
  need(k.local_dims == 0 and k.group_for_reduces == 0, "locals are already in use")
  k.dont_use_locals = True

def _merge(k: LoopNest, opt: Opt, axis: int, amt: int, need: Callable) -> None:
  need(axis >= k.shape_len - k.upcasted, "MERGE is for upcasted axes")
  need(axis + 1 < k.shape_len, "MERGE needs two upcasted axes")
  need(k.full_shape[axis:axis + 2] == k.output_shape[axis:axis + 2], "can't merge reduce axes")
  k.reshape_and_permute(None, (*range(axis), axis + 1, axis, *range(axis + 2, k.shape_len)))
  k.reshape_and_permute(lambda s: s[:axis] + (s[axis] * s[axis + 1],) + s[axis + 2:], None)
  k.upcasted -= 1

def _padto(k: LoopNest, opt: Opt, axis: int, amt: int, need: Callable) -> None:
  need(not k.vars, "PADTO does not work with symbolic shapes")
  need(axis < k.shape_len - k.upcasted, "can't pad an upcasted axis")
  if axis >= k.first_reduce:
    # padding a reduce axis adds zeros to the sum: only sound when every op below it maps 0 to 0
    need(all(r.op is ReduceOps.SUM and not any(ops.pad_unsafe(x) for x in r.src[0].lazyops)
             for r in k.reduceops), "reduce is not a SUM of pad-safe ops")
  padded, new = False, list(k.sts)
  for i, st in enumerate(k.sts):
    size = cast(int, st.shape[axis])  # no variables (checked above), so every shape entry is an int
    if size == 1: continue
    need(size > amt // 4, f"padding {size} to a multiple of {amt} more than quadruples the work")
    if extra := round_up(size, amt) - size:
      new[i] = st.pad(tuple((0, extra) if j == axis else (0, 0) for j in range(len(st.shape))))
      padded = True
  need(padded, "nothing to pad")
  k.sts = tuple(new)

_MOVES: dict[OptOps, Callable[[LoopNest, Opt, int, int, Callable], None]] = {
  OptOps.LOCAL: _local, OptOps.GROUP: _group, OptOps.GROUPTOP: _group, OptOps.UNROLL: _unroll,
  OptOps.UPCAST: _upcast, OptOps.UPCASTMID: _upcastmid, OptOps.NOLOCALS: _nolocals, OptOps.MERGE: _merge,
  OptOps.PADTO: _padto}
