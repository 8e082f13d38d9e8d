"""Fitting a tensor core to the loop nest: which reduce of products matches one of the dialect's tensor cores (its N,
M and K axes, its operand buffers), the padding and the tensor core's own Opt sequence that shape it into the warp's
threads and each thread's fragment, and the permutation that puts each operand where the vendor's instruction reads
it. The vendor knowledge (dims, Opt sequence, layout) is the dialect's TensorCore data. Imports helpers, debug,
errors, shape/, ops, renderers, opt, loop_nest and shape_opts."""
from __future__ import annotations
import itertools
from types import MappingProxyType
from typing import Any, Optional
from kernopt import debug, shape_opts
from kernopt.errors import KernelOptError, ShapeError, UnsupportedError
from kernopt.helpers import all_same
from kernopt.loop_nest import LoopNest, divides, fmt, is_int
from kernopt.ops import BinaryOps, BufferOps, LazyOp, ReduceOps, UnaryOps
from kernopt.opt import Opt, OptOps, TensorCoreOptions
from kernopt.renderers import Perm, TCLayout, TensorCore
from kernopt.shape.shapetracker import ShapeTracker
from kernopt.shape.view import View
from kernopt.shape_opts import refuse

def reduce_free(op: LazyOp) -> bool: return all(x.op not in ReduceOps for x in op.lazyops)

def fix_tc_st(layout: TCLayout, perm: Perm, wd: int, tcd: int, st: ShapeTracker) -> ShapeTracker:
  """st with its warp axes (from wd) and fragment axes (from tcd) permuted into the vendor's register layout."""
  if st.shape[wd:wd + len(layout.warp)] != layout.warp or st.shape[tcd:tcd + len(layout.tcd)] != layout.tcd:
    raise UnsupportedError(f"tensor-core layout: shape {st.shape} lacks warp dims {layout.warp} at {wd} or "
                           f"fragment dims {layout.tcd} at {tcd}")
  expanded = st.shape[:tcd] + layout.tcd_expand + st.shape[tcd + len(layout.tcd):]
  def place(pairs: tuple) -> list[int]: return [i + (wd if grp == 0 else tcd) for grp, i in pairs]
  order = [*range(wd), *place(perm[0]), *range(wd + len(layout.warp), tcd), *place(perm[1]),
           *range(tcd + len(layout.tcd_expand), len(expanded))]
  return st.reshape(expanded).simplify().permute(tuple(order)).reshape(st.shape).simplify()

def unmask_broadcast(st: ShapeTracker, axis: int) -> ShapeTracker:
  """st with its mask on `axis` dropped when its one view broadcasts that axis (stride 0): after a tensor core pads an
  output axis (N or M), such an operand then reads the same in-bounds element at the padded positions too. Those
  positions only reach the padded outputs, whose stores stay masked; and AMD's WMMA needs lanes 16-31 (a thread split
  of N) to hold the same A as lanes 0-15, which a mask on N would zero."""
  if len(st.views) != 1 or (v := st.views[0]).mask is None or v.strides[axis] != 0: return st
  mask = tuple((0, s) if i == axis else m for i, (m, s) in enumerate(zip(v.mask, v.shape)))
  return ShapeTracker((View.create(v.shape, v.strides, v.offset, mask),))

def match(k: LoopNest, reduceop: LazyOp, tc: TensorCore, axis: int, level: int,
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
    return k.buf_index.get(x.arg) if x.op is BufferOps.LOAD else None
  if (b0 := operand(src.src[0])) is None or (b1 := operand(src.src[1])) is None:
    return no(f"an operand is not a load of {tc.dtype_in.name}" + (" or a cast of one" if level >= 1 else ""))
  fr = k.first_reduce
  st0, st1 = k.sts[b0].real_strides(), k.sts[b1].real_strides()
  n_axes = [i for i in range(fr) if st0[i] == 0]
  m_axes = [i for i in range(fr) if st1[i] == 0]
  if not (n_axes and m_axes): return no("no output axis broadcasts each operand (no N and M)")
  if not (k.shape_len - fr == 1 or level >= 1): return no("several reduce axes need TC_OPT >= 1")
  choices = list(itertools.product(n_axes, m_axes, range(fr, k.shape_len)))
  if axis >= len(choices): return no(f"axis choice {axis} of {len(choices)} (N, M, K) candidates")
  nmk = choices[-(axis + 1)]
  pads = tuple((x, tc.dims[i]) for i, x in enumerate(nmk) if not divides(k.full_shape[x], tc.dims[i]))
  if pads and level < 2: return no(f"N, M, K {tuple(fmt(k.full_shape[x]) for x in nmk)} are no multiples of "
                                   f"{tc.dims}: padding needs TC_OPT >= 2")
  return TensorCoreOptions(axes=nmk, axes_exist=(True, True), axis_pads=pads), (b0, b1)

def apply_tc(k: LoopNest, opt: Opt, use_tc: int, tried: Optional[list[tuple[str, str]]] = None) -> TensorCore:
  """Apply the TC Opt opt to k (applied_opts is the caller's), all or nothing: match the first tensor core that fits
  the reduce, pad, shape it (the inner Opts are not recorded); the one applied. Each tensor core that does not match
  is appended to `tried` with the reason."""
  snap = k.snapshot()
  try: return _apply_tc(k, opt, use_tc, tried)
  except KernelOptError:
    k.restore(snap)
    raise
  except ShapeError as e:
    k.restore(snap)
    raise KernelOptError(f"{opt} on shape {k.full_shape}: {e}") from e

def _apply_tc(k: LoopNest, opt: Opt, use_tc: int, tried: Optional[list[tuple[str, str]]]) -> TensorCore:
  def need(cond: Any, why: str) -> None:
    if not cond: raise refuse(k, opt, why)
  need(not k.applied_opts, "tensor cores must be the first Opt")
  if not (is_int(opt.axis) and is_int(opt.amt) and opt.axis >= 0 and opt.amt >= 0):
    raise refuse(k, opt, "TC needs int axis and level")
  need(use_tc == 2 or k.opts.caps.tensor_cores, f"{k.opts.caps.device} has no tensor cores and USE_TC != 2")
  r = k.reduceop
  need(use_tc and k.opts.caps.has_local and r is not None and r.op is ReduceOps.SUM,
       "needs USE_TC, a SUM reduce and a dialect with locals")
  need(all(reduce_free(red.src[0]) for red in k.reduceops), "a reduce is nested in another")
  need(0 not in k.full_shape, "an axis has size 0")
  for tc in k.opts.caps.tensor_cores:
    why: list[str] = []
    matches = [match(k, red, tc, opt.axis, opt.amt, why) for red in k.reduceops]
    if matches[0] is None or not all_same([m[0] if m else None for m in matches]):
      if tried is not None: tried.append((str(tc), why[0] if why else "the reduces match it on different axes"))
      continue
    snap = k.snapshot()
    k.tensor_core_opts = matches[0][0]
    k.bufs_for_tensor_core = MappingProxyType({red: m[1] for red, m in zip(k.reduceops, matches) if m})
    try:
      for ax, dim in k.tensor_core_opts.axis_pads:
        shape_opts.apply(k, Opt(OptOps.PADTO, ax, dim))
        if ax < k.first_reduce: k.sts = tuple(unmask_broadcast(st, ax) for st in k.sts)
    except KernelOptError as e:
      k.restore(snap)
      if tried is not None: tried.append((str(tc), f"padding refused: {e}"))
      continue
    debug.log(3, f"TENSOR CORES {k.tensor_core_opts} {tc}")
    _shape_for(k, tc)
    if use_tc == 1: k.tensor_core = tc
    return tc
  raise refuse(k, opt, "no tensor core matches")

def _shape_for(k: LoopNest, tc: TensorCore) -> None:
  """tc's Opt sequence: each step's dim is the N (0), M (1) or K (2) axis as tensor_core_opts places it after the
  steps before (an UNROLL counts it from first_reduce); MERGE joins the last two upcasted axes."""
  if not tc.opts or tc.layout is None:
    raise KernelOptError(f"{tc} on {k.opts.caps.device} has no Opt sequence or layout")
  for name, dim, amt in tc.opts:
    tco, op = k.tensor_core_opts, OptOps[name]
    assert tco is not None, "a tensor core is shaped after its match"
    if op is OptOps.MERGE: axis = k.shape_len - 2
    else:
      assert dim is not None, f"{name} of a tensor core's Opt sequence needs its dim"
      axis = tco.axes[dim] - (k.first_reduce if op is OptOps.UNROLL else 0)
    shape_opts.apply(k, Opt(op, axis, amt))
