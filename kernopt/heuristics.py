"""The spec's hand-coded heuristics: which Opts a Kernel gets when nobody searched. Each rule is a function of the
kernel that applies Opts through `Kernel.apply_opt`, so every choice passes its checks. Imports helpers, errors,
dtype, ops and opt; the Kernel is passed in."""
from __future__ import annotations
import itertools
from typing import TYPE_CHECKING, Any, Optional, TypeGuard
from kernopt.dtype import ImageDType
from kernopt.errors import KernelOptError
from kernopt.helpers import all_int, getconfig, prod
from kernopt.ops import BinaryOps, BufferOps, ReduceOps
from kernopt.opt import Opt, OptOps

if TYPE_CHECKING: from kernopt.kernel import Kernel

def _is_int(x: Any) -> TypeGuard[int]: return type(x) is int
def _divides(size: Any, amt: int) -> bool:
  """amt divides size (for a symbolic size: provably, e.g. 64*n by 4)."""
  return amt > 0 and size % amt == 0
def _stride_key(s: Any) -> int: return s if _is_int(s) else (s.max if s is not None else 0)

def hand_coded(k: Kernel) -> None:
  """The spec's heuristics, in order: matvec; GROUPTOP of small outputs; image float4 upcasts; masked-axis
  upcasts; upcasts of broadcast axes while the output is large; reduce unrolling; a default upcast; locals."""
  if _matvec(k): return
  out = k.sts[0]
  if k.opts.has_local and k.opts.has_shared and all_int(out.shape[:k.first_reduce]):
    _group_small_outputs(k)
  _upcast_images(k)
  if k.group_for_reduces: return
  _upcast_masked(k)
  _upcast_broadcasts(k)
  _unroll_reduce(k)
  if k.upcasted == 0 and k.full_unupcasted_shape and _divides(k.full_unupcasted_shape[-1], 4):
    k.apply_opt(Opt(OptOps.UPCAST, len(k.full_unupcasted_shape) - 1, 4))
  if k.opts.has_local: _add_locals(k)

def _matvec(k: Kernel) -> bool:
  """Matrix-vector heuristic: group the contiguous reduce across threads, block the rows. True if applied."""
  cfg = getconfig()
  bs, tpr, rpt = cfg.MV_BLOCKSIZE, cfg.MV_THREADS_PER_ROW, cfg.MV_ROWS_PER_THREAD
  r = k.reduceop
  if not (k.opts.has_local and k.opts.has_shared and cfg.MV != 0 and (bs > 1 or tpr > 1 or rpt > 1) and
          r is not None and r.op is ReduceOps.SUM and k.shape_len >= 2 and len(k.reduceops) == 1): return False
  mul = r.src[0]
  if not (mul.op is BinaryOps.MUL and all(s.op is BufferOps.LOAD for s in mul.src[:2]) and len(mul.src) == 2):
    return False
  st0, st1 = k.sts[k.bufs.index(mul.src[0].arg)], k.sts[k.bufs.index(mul.src[1].arg)]
  s0, s1 = st0.real_strides(), st1.real_strides()
  def expanded(shape: tuple, strides: tuple) -> bool:
    return any(st == 0 and not (_is_int(s) and s <= 1) for s, st in zip(shape, strides))
  fr = k.first_reduce
  if s0[fr] != 1 or (expanded(st0.shape, s0) and expanded(st1.shape, s1)): return False
  for g in range(k.global_dims):
    if _divides(k.full_shape[fr], tpr) and _divides(k.full_shape[g], bs * rpt):
      if cfg.DEBUG >= 3: print(f"MATVEC: full_shape={k.full_shape} first_reduce={fr} {s0=} {bs=} {tpr=} {rpt=}")
      if tpr > 1: k.apply_opt(Opt(OptOps.GROUP, 0, tpr))
      if bs > 1: k.apply_opt(Opt(OptOps.LOCAL, g, bs))
      if rpt > 1: k.apply_opt(Opt(OptOps.UPCAST, g, rpt))
      return True
  return False

def _group_small_outputs(k: Kernel) -> None:
  fr, out = k.first_reduce, k.sts[0]
  n_out = prod(out.shape[:fr])
  if not k.float4_axis(0) and fr <= 2 and fr + 1 <= k.shape_len and n_out <= 2048:
    for sz in ((256, 16) if n_out <= 32 else (16,)):
      if all(_divides(st.shape[fr], sz) or st.shape[fr] == 1 for st in k.sts):
        try:
          k.apply_opt(Opt(OptOps.GROUPTOP, 0, sz))
          break
        except KernelOptError: pass
  out = k.sts[0]
  if k.bufs[0].dtype.name.startswith("image") and not k.float4_axis(0) and k.group_for_reduces and \
     k.first_reduce <= 2 and all_int(out.shape) and prod(out.shape) > 1:
    axes = out.unit_stride_axes()
    if len(axes) == 1 and _divides(out.shape[axes[0]], 4): k.apply_opt(Opt(OptOps.UPCASTMID, axes[0], 4))

def _upcast_images(k: Kernel) -> None:
  for i, buf in enumerate(k.bufs):
    if not isinstance(buf.dtype, ImageDType): continue
    st = k.sts[i]
    axes = [a for a in st.unit_stride_axes(ignore_valid=True) if _divides(st.shape[a], 4)]
    end = k.shape_len - k.upcasted
    if axes and all(a < end for a in axes) and axes[0] not in k.upcast_in_mid_reduce_axes:
      if axes[0] < k.first_reduce: k.apply_opt(Opt(OptOps.UPCAST, axes[0], 4))
      else: k.apply_opt(Opt(OptOps.UNROLL, axes[0] - k.first_reduce, 4))

def _upcast_masked(k: Kernel) -> None:
  """Fully upcast small masked axes (e.g. from a stack or a pad), leading axes first, up to 49 lanes in all."""
  chosen: list[int] = []
  for axis in range(k.first_reduce):
    size = k.full_shape[axis]
    if _is_int(size) and size <= 7 and any(st.axis_is_masked(axis) for st in k.sts) and \
       prod(k.full_shape[k.shape_len - k.upcasted:]) * prod(k.full_shape[j] for j in chosen) * size <= 49:
      if getconfig().DEBUG >= 4: print(f"upcasting masked axis : {axis}")
      chosen.append(axis)
  for axis in reversed(chosen): k.apply_opt(Opt(OptOps.UPCAST, axis, 0))

def _upcast_broadcasts(k: Kernel) -> None:
  """While the output has >= 1024 elements, upcast by 3 or 4 an axis some buffer broadcasts (stride 0), preferring
  axes few buffers walk and with small strides."""
  done: set[int] = set()
  while all_int(k.sts[0].shape[:k.first_reduce]) and prod(k.sts[0].shape[:k.first_reduce]) >= 1024:
    choices = []
    for axis, amt in itertools.product(range(k.first_reduce), (3, 4)):
      if axis in done or not _is_int(k.full_shape[axis]) or k.full_shape[axis] % amt: continue
      if any(st.views[-1].strides[axis] == 0 and not any(x[1] == 0 for x in k.upcasted_axis(i))
             for i, st in enumerate(k.sts)):
        strides = [st.views[-1].strides[axis] for st in k.sts]
        choices.append((sum(_stride_key(s) > 0 for s in strides), sum(_stride_key(s) for s in strides), axis, amt))
    if not choices: break
    _, _, axis, amt = min(choices)
    if getconfig().DEBUG >= 4: print(f"float4 merging axis : {sorted(choices)}")
    k.apply_opt(Opt(OptOps.UPCAST, axis, amt))
    done.add(axis)

def _unroll_reduce(k: Kernel) -> None:
  """Unroll a small last reduce axis entirely (and a second one if both are <= 3), else by 4."""
  if k.first_reduce >= k.shape_len - k.upcasted: return
  lanes = prod(k.sts[k.full_buf_index].shape[k.shape_len - k.upcasted:]) if k.upcasted else 1
  if not (lanes <= 4 or not any(r for _, _, r in k.upcasted_axis(k.full_buf_index))): return
  if k.upcasted and not prod(k.full_shape[-k.upcasted:]) < 64: return
  last = len(k.full_unupcasted_shape) - 1
  s = k.full_unupcasted_shape[-1]
  if _is_int(s) and s <= 32:
    k.apply_opt(Opt(OptOps.UNROLL, last - k.first_reduce, 0))
    s2 = k.full_unupcasted_shape[-1] if k.full_unupcasted_shape else None
    if k.first_reduce < k.shape_len - k.upcasted and s <= 3 and _is_int(s2) and s2 <= 3:
      k.apply_opt(Opt(OptOps.UNROLL, len(k.full_unupcasted_shape) - 1 - k.first_reduce, 0))
  elif _divides(s, 4):
    k.apply_opt(Opt(OptOps.UNROLL, last - k.first_reduce, 4))

def _add_locals(k: Kernel) -> None:
  """Make up to three global axes local, broadcast axes and later axes first, at most 128 threads in all."""
  if getconfig().NOLOCALS and k.local_dims == 0 and not k.group_for_reduces:
    k.apply_opt(Opt(OptOps.NOLOCALS))
    return
  ranking = [(any(st.views[-1].strides[axis] == 0 for st in k.sts), axis) for axis in range(k.first_reduce)]
  to_local: list[tuple[int, int]] = []
  for _, axis in sorted(ranking, key=lambda x: (-x[0], -x[1])):
    threads = prod(sz for _, sz in to_local)
    sz = next((x for x in ([32] if axis == 0 else []) + [16, 8, 4, 3, 2]
               if _divides(k.full_shape[axis], x) and threads * x <= 128), None)
    if sz is not None: to_local.append((axis, sz))
  removed = 0
  for axis, sz in sorted(to_local[:3]):
    axis -= removed
    whole = sz == k.full_shape[axis]
    k.apply_opt(Opt(OptOps.LOCAL, axis, sz))
    if whole: removed += 1

# ***** shared by the device-profile heuristics (heuristics_cpu, heuristics_opencl) *****

def strides(k: Kernel, i: int) -> tuple:
  """Buffer i's stride on each axis (None where it is not one), ignoring validity masks."""
  return k.sts[i].real_strides(ignore_valid=True)

def output_bufs(k: Kernel) -> list[int]:
  stored = {x.arg for x in k.ast.src}
  return [i for i, b in enumerate(k.bufs) if b in stored]

def input_bufs(k: Kernel) -> list[int]:
  outs = output_bufs(k)
  return [i for i in range(len(k.bufs)) if i not in outs]

def try_opt(k: Kernel, op: OptOps, axis: int, amt: int) -> bool:
  """Apply Opt(op, axis, amt) if the kernel accepts it; False (and k unchanged) if not."""
  try:
    k.apply_opt(Opt(op, axis, amt))
    return True
  except KernelOptError: return False

def vector_axis(k: Kernel, width: int) -> Optional[int]:
  """The last output axis that width divides, unit-stride in every output and unit-stride or broadcast in every
  input (some input streaming it): its lanes are contiguous loads and stores."""
  outs, ins = output_bufs(k), input_bufs(k)
  for axis in reversed(range(k.first_reduce)):
    size = k.full_shape[axis]
    if not _is_int(size) or size % width: continue
    if all(strides(k, i)[axis] == 1 for i in outs) and all(strides(k, i)[axis] in (0, 1) for i in ins) and \
       any(strides(k, i)[axis] == 1 for i in ins):
      return axis
  return None

