"""The spec's hand-coded heuristics: which Opts a Kernel gets when nobody searched. Each rule is a function of the
kernel that applies Opts through `Kernel.apply_opt`, so every choice passes its checks, and records a `Decision`
(kernopt.decisions, re-exported here) in the kernel's trace, which `Kernel.explain()` returns. Sits below the Kernel
and uses only its public API. Imports helpers, errors, dtype, ops, opt, decisions, heuristics_registry and kernel; the
Kernel only as a type (it is passed in), and this module registers spec_rules as the "spec" profile."""
from __future__ import annotations
import itertools
from typing import TYPE_CHECKING, Any, Optional, TypeGuard
from kernopt.decisions import Decision, Explanation, apply, decide, try_apply
from kernopt.decisions import show as _show
from kernopt.dtype import ImageDType
from kernopt.errors import KernelOptError
from kernopt.helpers import all_int, getconfig, prod
from kernopt.ops import BinaryOps, BufferOps, ReduceOps
from kernopt.heuristics_registry import register_heuristics
from kernopt.opt import Opt, OptOps

if TYPE_CHECKING: from kernopt.kernel import Kernel

__all__ = ["Decision", "Explanation", "apply", "decide", "try_apply", "RULES", "hand_coded", "spec_rules", "strides",
           "buffer_strides", "output_bufs", "input_bufs", "vector_axis", "view_strides"]

def view_strides(k: Kernel, axis: int) -> tuple:
  """Every tracker's last-view stride on axis (the spec's broadcast test reads these)."""
  return tuple(st.views[-1].strides[axis] for st in k.sts)

# each rule's name, as Decisions cite it, and what it does
RULES: dict[str, str] = {
  "spec.matvec": "a SUM of a contiguous row times a vector: GROUP the reduce over MV_THREADS_PER_ROW threads, LOCAL "
                 "MV_BLOCKSIZE rows, UPCAST MV_ROWS_PER_THREAD rows",
  "spec.grouptop": "at most 2048 outputs: GROUPTOP the reduce over 256 (at most 32 outputs) or 16 threads",
  "spec.upcastmid": "an image output of a grouped reduce: UPCASTMID its single unit-stride axis by 4",
  "spec.image_upcast": "each image buffer: UPCAST (UNROLL on a reduce axis) its first unit-stride axis by 4",
  "spec.grouped": "a reduce grouped in shared memory gets nothing more",
  "spec.masked_upcast": "UPCAST whole masked axes of at most 7, while the upcast lanes stay within 49",
  "spec.broadcast_upcast": "while at least 1024 outputs: UPCAST by 3 or 4 an axis some buffer broadcasts",
  "spec.reduce_unroll": "UNROLL a last reduce axis of at most 32 entirely (a second too when both are at most 3), "
                        "else by 4",
  "spec.default_upcast": "nothing upcast yet: UPCAST the last axis by 4",
  "spec.nolocals": "the NOLOCALS knob: turn locals off",
  "spec.locals": "LOCAL up to three global axes, broadcast ones and later ones first, at most 128 threads",
}

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
  if k.opts.caps.has_local and k.opts.caps.has_shared and all_int(out.shape[:k.first_reduce]):
    _group_small_outputs(k)
  else:
    why = "no local threads" if not k.opts.caps.has_local else "no shared memory" if not k.opts.caps.has_shared else \
      "the output shape is symbolic"
    decide(k, "spec.grouptop", why, has_local=k.opts.caps.has_local, has_shared=k.opts.caps.has_shared)
  _upcast_images(k)
  if k.group_for_reduces:
    decide(k, "spec.grouped", "the reduce is grouped in shared memory: no more upcasts or locals",
           group_for_reduces=k.group_for_reduces)
    return
  _upcast_masked(k)
  _upcast_broadcasts(k)
  _unroll_reduce(k)
  _default_upcast(k)
  if k.opts.caps.has_local: _add_locals(k)
  else: decide(k, "spec.locals", f"{k.opts.caps.device} has no local threads", has_local=False)

def _matvec(k: Kernel) -> bool:
  """Matrix-vector heuristic: group the contiguous reduce across threads, block the rows. True if applied."""
  cfg = getconfig()
  bs, tpr, rpt = cfg.MV_BLOCKSIZE, cfg.MV_THREADS_PER_ROW, cfg.MV_ROWS_PER_THREAD
  def no(why: str, **facts: Any) -> bool:
    decide(k, "spec.matvec", why, **facts)
    return False
  c = k.opts.caps
  if not (c.has_local and c.has_shared):
    return no("needs local threads and shared memory", has_local=c.has_local, has_shared=c.has_shared)
  if not (cfg.MV != 0 and (bs > 1 or tpr > 1 or rpt > 1)):
    return no("turned off by the MV knobs", MV=cfg.MV, MV_BLOCKSIZE=bs, MV_THREADS_PER_ROW=tpr, MV_ROWS_PER_THREAD=rpt)
  r = k.reduceop
  if not (r is not None and r.op is ReduceOps.SUM and k.shape_len >= 2 and len(k.reduceops) == 1):
    return no("needs exactly one SUM reduce and at least 2 axes", reduces=tuple(x.op.name for x in k.reduceops),
              shape_len=k.shape_len)
  mul = r.src[0]
  if not (mul.op is BinaryOps.MUL and all(s.op is BufferOps.LOAD for s in mul.src[:2]) and len(mul.src) == 2):
    return no(f"the reduce is over {mul.op.name}, not a MUL of two loads")
  b0, b1 = k.bufs.index(mul.src[0].arg), k.bufs.index(mul.src[1].arg)
  st0, st1 = k.sts[b0], k.sts[b1]
  s0, s1 = st0.real_strides(), st1.real_strides()
  def expanded(shape: tuple, strides: tuple) -> bool:
    return any(st == 0 and not (_is_int(s) and s <= 1) for s, st in zip(shape, strides))
  fr = k.first_reduce
  facts = {"first_reduce": fr, "operands": (b0, b1), "operand_strides": (s0, s1)}
  if s0[fr] != 1: return no(f"the first operand's stride on the first reduce axis is {_show(s0[fr])}, not 1", **facts)
  if expanded(st0.shape, s0) and expanded(st1.shape, s1): return no("both operands are broadcast", **facts)
  for g in range(k.global_dims):
    if _divides(k.full_shape[fr], tpr) and _divides(k.full_shape[g], bs * rpt):
      knobs = {"MV_BLOCKSIZE": bs, "MV_THREADS_PER_ROW": tpr, "MV_ROWS_PER_THREAD": rpt}
      facts |= {"reduce_size": k.full_shape[fr], **knobs}
      if tpr > 1: apply(k, "spec.matvec", Opt(OptOps.GROUP, 0, tpr), "a contiguous row times a vector: the reduce "
                        "split over MV_THREADS_PER_ROW threads", **facts)
      if bs > 1: apply(k, "spec.matvec", Opt(OptOps.LOCAL, g, bs), "MV_BLOCKSIZE rows per work-group", axis=g,
                       size=k.full_shape[g], **knobs)
      if rpt > 1: apply(k, "spec.matvec", Opt(OptOps.UPCAST, g, rpt), "MV_ROWS_PER_THREAD rows per thread", axis=g,
                        size=k.full_shape[g], **knobs)
      return True
  return no(f"no global axis divisible by MV_BLOCKSIZE*MV_ROWS_PER_THREAD={bs * rpt} with the reduce divisible by "
            f"MV_THREADS_PER_ROW={tpr}", **facts)

def _group_small_outputs(k: Kernel) -> None:
  fr, out = k.first_reduce, k.sts[0]
  n_out = prod(out.shape[:fr])
  facts = {"outputs": n_out, "limit": 2048, "first_reduce": fr}
  if k.float4_axis(0): decide(k, "spec.grouptop", "the output already has an upcast float4 axis", **facts)
  elif fr > 2: decide(k, "spec.grouptop", "the reduce starts after axis 2", **facts)
  elif fr + 1 > k.shape_len: decide(k, "spec.grouptop", "no reduce axis", **facts)
  elif n_out > 2048: decide(k, "spec.grouptop", f"{n_out} outputs is over 2048", **facts)
  else:
    sizes = (256, 16) if n_out <= 32 else (16,)
    for sz in sizes:
      if all(_divides(st.shape[fr], sz) or st.shape[fr] == 1 for st in k.sts):
        try:
          apply(k, "spec.grouptop", Opt(OptOps.GROUPTOP, 0, sz), f"{n_out} outputs: the reduce split over {sz} threads",
                **facts, axis=fr, size=k.full_shape[fr])
          break
        except KernelOptError: pass
    else: decide(k, "spec.grouptop", f"no GROUPTOP of {sizes} divides the reduce in every tracker or was accepted",
                 **facts, axis=fr, size=k.full_shape[fr])
  out = k.sts[0]
  if k.bufs[0].dtype.name.startswith("image"):
    if not k.float4_axis(0) and k.group_for_reduces and k.first_reduce <= 2 and all_int(out.shape) and \
       prod(out.shape) > 1:
      axes = out.unit_stride_axes()
      if len(axes) == 1 and _divides(out.shape[axes[0]], 4):
        apply(k, "spec.upcastmid", Opt(OptOps.UPCASTMID, axes[0], 4), "the image output's one unit-stride axis",
              axis=axes[0], size=k.full_shape[axes[0]])
      else: decide(k, "spec.upcastmid", "the output has no single unit-stride axis divisible by 4",
                   unit_stride_axes=tuple(axes))
    else: decide(k, "spec.upcastmid", "needs a grouped reduce of at most 2 output axes into an image without a float4 "
                 "axis", group_for_reduces=k.group_for_reduces, first_reduce=k.first_reduce)

def _upcast_images(k: Kernel) -> None:
  for i, buf in enumerate(k.bufs):
    if not isinstance(buf.dtype, ImageDType): continue
    st = k.sts[i]
    axes = [a for a in st.unit_stride_axes(ignore_valid=True) if _divides(st.shape[a], 4)]
    end = k.shape_len - k.upcasted
    facts = {"buffer": i, "unit_stride_axes": tuple(axes), "first_reduce": k.first_reduce}
    if axes and all(a < end for a in axes) and axes[0] not in k.upcast_in_mid_reduce_axes:
      facts |= {"axis": axes[0], "size": k.full_shape[axes[0]]}
      if axes[0] < k.first_reduce:
        apply(k, "spec.image_upcast", Opt(OptOps.UPCAST, axes[0], 4), f"image buffer {i}: float4 texels", **facts)
      else: apply(k, "spec.image_upcast", Opt(OptOps.UNROLL, axes[0] - k.first_reduce, 4),
                  f"image buffer {i}: float4 texels along a reduce axis", **facts)
    else: decide(k, "spec.image_upcast", f"image buffer {i} has no unit-stride axis divisible by 4 left in loops",
                 **facts)

def _upcast_masked(k: Kernel) -> None:
  """Fully upcast small masked axes (e.g. from a stack or a pad), leading axes first, up to 49 lanes in all."""
  chosen: list[int] = []
  for axis in range(k.first_reduce):
    size = k.full_shape[axis]
    if _is_int(size) and size <= 7 and any(st.axis_is_masked(axis) for st in k.sts) and \
       prod(k.full_shape[k.shape_len - k.upcasted:]) * prod(k.full_shape[j] for j in chosen) * size <= 49:
      chosen.append(axis)
  if not chosen: decide(k, "spec.masked_upcast", "no masked output axis of at most 7 fits within 49 lanes",
                        limit=7, lanes=49)
  for axis in reversed(chosen):
    apply(k, "spec.masked_upcast", Opt(OptOps.UPCAST, axis, 0), f"axis {axis} is masked and at most 7",
          axis=axis, size=k.full_shape[axis], limit=7, lanes=49)

def _upcast_broadcasts(k: Kernel) -> None:
  """While the output has >= 1024 elements, upcast by 3 or 4 an axis some buffer broadcasts (stride 0), preferring
  axes few buffers walk and with small strides."""
  done: set[int] = set()
  rule = "spec.broadcast_upcast"
  while all_int(k.sts[0].shape[:k.first_reduce]) and (n_out := prod(k.sts[0].shape[:k.first_reduce])) >= 1024:
    choices = []
    for axis, amt in itertools.product(range(k.first_reduce), (3, 4)):
      if axis in done or not _is_int(k.full_shape[axis]) or k.full_shape[axis] % amt: continue
      if any(st.views[-1].strides[axis] == 0 and not any(x[1] == 0 for x in k.upcasted_axis(i))
             for i, st in enumerate(k.sts)):
        strides = [st.views[-1].strides[axis] for st in k.sts]
        choices.append((sum(_stride_key(s) > 0 for s in strides), sum(_stride_key(s) for s in strides), axis, amt))
    if not choices:
      decide(k, rule, "no axis left that 3 or 4 divides and some buffer broadcasts", outputs=n_out, limit=1024)
      return
    _, _, axis, amt = min(choices)
    apply(k, rule, Opt(OptOps.UPCAST, axis, amt), f"{n_out} outputs: the broadcast axis fewest buffers walk, "
          "smallest strides first", outputs=n_out, limit=1024, axis=axis, size=k.full_shape[axis],
          strides=view_strides(k, axis), choices=tuple(sorted(choices)))
    done.add(axis)
  decide(k, rule, "fewer than 1024 outputs (or a symbolic output)", outputs=prod(k.sts[0].shape[:k.first_reduce]),
         limit=1024)

def _unroll_reduce(k: Kernel) -> None:
  """Unroll a small last reduce axis entirely (and a second one if both are <= 3), else by 4."""
  rule = "spec.reduce_unroll"
  if k.first_reduce >= k.shape_len - k.upcasted:
    decide(k, rule, "no reduce axis left in loops")
    return
  lanes = prod(k.sts[k.full_buf_index].shape[k.shape_len - k.upcasted:]) if k.upcasted else 1
  if not (lanes <= 4 or not any(r for _, _, r in k.upcasted_axis(k.full_buf_index))):
    decide(k, rule, f"{lanes} upcast lanes (over 4) already include an unrolled reduce", lanes=lanes)
    return
  if k.upcasted and not (upcast := prod(k.full_shape[-k.upcasted:])) < 64:
    decide(k, rule, f"the upcast axes already hold {upcast} lanes (at least 64)", lanes=upcast)
    return
  last = len(k.full_unupcasted_shape) - 1
  s = k.full_unupcasted_shape[-1]
  if _is_int(s) and s <= 32:
    apply(k, rule, Opt(OptOps.UNROLL, last - k.first_reduce, 0), f"the last reduce axis of {s} is at most 32",
          axis=last, size=s, limit=32)
    s2 = k.full_unupcasted_shape[-1] if k.full_unupcasted_shape else None
    if k.first_reduce < k.shape_len - k.upcasted and s <= 3 and _is_int(s2) and s2 <= 3:
      axis = len(k.full_unupcasted_shape) - 1
      apply(k, rule, Opt(OptOps.UNROLL, axis - k.first_reduce, 0), f"it was at most 3 and the next one of {s2} is too",
            axis=axis, size=s2, limit=3)
  elif _divides(s, 4):
    apply(k, rule, Opt(OptOps.UNROLL, last - k.first_reduce, 4), f"the last reduce axis of {_show(s)} is over 32: by 4",
          axis=last, size=s, limit=32)
  else: decide(k, rule, f"the last reduce axis of {_show(s)} is over 32 and 4 does not divide it", axis=last, size=s,
               limit=32)

def _default_upcast(k: Kernel) -> None:
  rule, fus = "spec.default_upcast", k.full_unupcasted_shape
  if k.upcasted: decide(k, rule, f"{k.upcasted} axes are upcast already", upcasted=k.upcasted)
  elif not fus: decide(k, rule, "no axis")
  elif _divides(fus[-1], 4):
    apply(k, rule, Opt(OptOps.UPCAST, len(fus) - 1, 4), "nothing is upcast and 4 divides the last axis",
          axis=len(fus) - 1, size=fus[-1])
  else: decide(k, rule, f"4 does not divide the last axis of {_show(fus[-1])}", axis=len(fus) - 1, size=fus[-1])

def _add_locals(k: Kernel) -> None:
  """Make up to three global axes local, broadcast axes and later axes first, at most 128 threads in all."""
  if getconfig().NOLOCALS and k.local_dims == 0 and not k.group_for_reduces:
    apply(k, "spec.nolocals", Opt(OptOps.NOLOCALS), "the NOLOCALS knob is set", NOLOCALS=getconfig().NOLOCALS)
    return
  ranking = [(any(st.views[-1].strides[axis] == 0 for st in k.sts), axis) for axis in range(k.first_reduce)]
  to_local: list[tuple[int, int]] = []
  for _, axis in sorted(ranking, key=lambda x: (-x[0], -x[1])):
    threads = prod(sz for _, sz in to_local)
    sz = next((x for x in ([32] if axis == 0 else []) + [16, 8, 4, 3, 2]
               if _divides(k.full_shape[axis], x) and threads * x <= 128), None)
    if sz is not None: to_local.append((axis, sz))
  if not to_local: decide(k, "spec.locals", "no global axis divisible by 32, 16, 8, 4, 3 or 2 within 128 threads",
                          first_reduce=k.first_reduce, limit=128)
  removed = 0
  for axis, sz in sorted(to_local[:3]):
    broadcast = ranking[axis][0]
    axis -= removed
    whole = sz == k.full_shape[axis]
    apply(k, "spec.locals", Opt(OptOps.LOCAL, axis, sz), f"{'broadcast ' if broadcast else ''}axis: the largest of "
          "32 (axis 0), 16, 8, 4, 3, 2 dividing it within 128 threads", axis=axis, size=k.full_shape[axis],
          strides=view_strides(k, axis), limit=128)
    if whole: removed += 1

# ***** shared by the device-profile heuristics (heuristics_cpu, heuristics_opencl) *****

def strides(k: Kernel, i: int) -> tuple:
  """Buffer i's stride on each axis (None where it is not one), ignoring validity masks."""
  return k.sts[i].real_strides(ignore_valid=True)

def buffer_strides(k: Kernel, axis: int) -> tuple:
  """Every buffer's real stride on axis, ignoring validity masks (None where it has none)."""
  return tuple(strides(k, i)[axis] for i in range(len(k.bufs)))

def output_bufs(k: Kernel) -> list[int]:
  stored = {x.arg for x in k.ast.src}
  return [i for i, b in enumerate(k.bufs) if b in stored]

def input_bufs(k: Kernel) -> list[int]:
  outs = output_bufs(k)
  return [i for i in range(len(k.bufs)) if i not in outs]

def contiguous_axis(k: Kernel, axis: int) -> bool:
  """Whether axis is unit-stride in every output and unit-stride or broadcast in every input, some input streaming
  it: its lanes are contiguous loads and stores."""
  ins = input_bufs(k)
  return all(strides(k, i)[axis] == 1 for i in output_bufs(k)) and all(strides(k, i)[axis] in (0, 1) for i in ins) \
    and any(strides(k, i)[axis] == 1 for i in ins)

def vector_axis(k: Kernel, width: int) -> Optional[int]:
  """The last contiguous output axis (contiguous_axis) that width divides."""
  for axis in reversed(range(k.first_reduce)):
    size = k.full_shape[axis]
    if _is_int(size) and size % width == 0 and contiguous_axis(k, axis): return axis
  return None

def is_conv(k: Kernel) -> bool:
  """A reduce with a window: some reduce axis of at most 3 elements (a 3x3 kernel's ky, kx)."""
  return any(_is_int(s) and s <= 3 for s in k.full_shape[k.first_reduce:k.shape_len - k.upcasted])

def window_row_axis(k: Kernel, vaxis: int) -> Optional[int]:
  """An output axis other than vaxis along which a window slides: some input has on it the same nonzero stride as
  on a window axis (a reduce axis of at most 3 still in loops), so neighbouring outputs along it read overlapping
  rows (a depthwise conv's output rows: 4 rows upcast read 6 image rows instead of 12). The last such axis."""
  end = k.shape_len - k.upcasted
  window = [r for r in range(k.first_reduce, end) if _is_int(s := k.full_shape[r]) and s <= 3]
  for axis in reversed(range(k.first_reduce)):
    if axis == vaxis or not _is_int(size := k.full_shape[axis]) or size < 2: continue
    for i in input_bufs(k):
      st = strides(k, i)
      if _is_int(st[axis]) and st[axis] != 0 and any(st[r] == st[axis] for r in window): return axis
  return None

def strided_vector_axis(k: Kernel, width: int) -> Optional[int]:
  """The last output axis that width divides, unit-stride in every output and broadcast in some input (the weights),
  at a constant stride in every input: a strided convolution's output columns, whose image lanes are gathered."""
  outs, ins = output_bufs(k), input_bufs(k)
  for axis in reversed(range(k.first_reduce)):
    size = k.full_shape[axis]
    if not _is_int(size) or size % width: continue
    if all(strides(k, i)[axis] == 1 for i in outs) and all(_is_int(strides(k, i)[axis]) for i in ins) and \
       any(strides(k, i)[axis] == 0 for i in ins):
      return axis
  return None

PAD_WASTE = 1 / 8   # most padding pad_axis allows, as a share of the axis

def pad_axis(k: Kernel, width: int) -> Optional[int]:
  """The last contiguous output axis (contiguous_axis) over two vectors that no width divides and that padding to a
  multiple of 2*width grows by at most PAD_WASTE: matmul 1000x1000x999's N. The CPU profiles pad it to 2*width and
  tile it (rules cpu.pad_columns, opencl.pad_columns): 1 thread, this host, native 4.6 -> 39.6 GF/s (the edge tile
  versioned by passes/borders.py); PoCL 3.7 -> 11.7."""
  for axis in reversed(range(k.first_reduce)):
    size = k.full_shape[axis]
    if not _is_int(size) or size <= 2 * width or size % width == 0 or -size % (2 * width) > size * PAD_WASTE:
      continue
    if contiguous_axis(k, axis): return axis
  return None

def spec_rules(k: Kernel) -> bool:
  """The spec's heuristics as a profile (caps.heuristics "spec", and every other profile's fallback): always
  chooses."""
  hand_coded(k)
  return True

register_heuristics("spec", spec_rules)
