"""Hand-coded optimizations for the CPU profile of the OpenCL renderer (a PoCL pthread device), used by
`Kernel.hand_coded_optimizations` when the renderer's `heuristics` is "opencl_cpu": register tiles whose contiguous
lanes the renderer packs into floatN ops, and work-groups big enough that PoCL's per-group cost is amortized. Only
existing OptOps are used, so every choice is checked like any other; a kernel no rule fits gets the spec's
heuristics. Every step records a Decision (heuristics.decide/apply) naming a rule of RULES. Imports dtype,
heuristics, heuristics_registry, ops, opt, passes.vectorize and kernel; the Kernel only as a type (it is passed in),
and this module registers hand_coded_opencl as the "opencl_cpu" profile."""
from __future__ import annotations
from typing import TYPE_CHECKING, Optional, TypeGuard
from kernopt.dtype import ImageDType, dtypes
from kernopt.heuristics import (buffer_strides, decide, input_bufs, is_conv, output_bufs, pad_axis,
                                strided_vector_axis, strides, try_apply, vector_axis, window_row_axis)
from kernopt.heuristics_registry import register_heuristics
from kernopt.ops import UnaryOps
from kernopt.opt import Opt, OptOps
from kernopt.passes.vectorize import half_width

if TYPE_CHECKING: from kernopt.kernel import Kernel

ELEMENTWISE_LANES = 4    # scalar lanes per work-item of an elementwise kernel: PoCL vectorizes across work-items
ELEMENTWISE_GROUP = 64   # work-items per work-group of an elementwise kernel
TILE_ROWS = 32           # rows of a register-tiled reduce per work-group (its row blocks run back to back)
STREAM_GROUP = 1024      # work-items per work-group of a kernel with fenced non-temporal stores: one sfence each

def _int(x: object) -> TypeGuard[int]: return type(x) is int


RULES: dict[str, str] = {
  "opencl.profile": "the OpenCL CPU rules need float32 buffers (no images), nothing upcast, local or grouped and a "
                    "vector width >= 2",
  "opencl.elementwise": "elementwise: UPCAST ELEMENTWISE_LANES scalar lanes along a contiguous axis (the vector width, "
                        "packed, when the kernel has exp2, log2 or sin, or an input broadcast along the row)",
  "opencl.group": "LOCAL the last global axis into work-groups of up to ELEMENTWISE_GROUP (STREAM_GROUP when "
                  "stores stream) items: the largest power of two, or the whole axis, leaving 2 groups in all",
  "opencl.half_width": "a convolution at width 16 with no output axis of a multiple of 16: the tile, with vectors "
                       "of 8",
  "opencl.tile_columns": "a reduce with a vector axis: UPCAST it by two vectors (with a row axis) or one",
  "opencl.tile_rows": "UPCAST the row axis so the tile holds 8 (8 x 2 on a long reduce) vector accumulators",
  "opencl.tile_unroll": "UNROLL the tile's last reduce axis: whole when at most 3, by 2 under an 8 x 2 tile, else by 4",
  "opencl.row_blocks": "LOCAL row blocks so one work-group covers TILE_ROWS rows",
  "opencl.window_rows": "a convolution with no broadcast row axis (depthwise): UPCAST the axis its window slides "
                        "along by 4, else 2, then unroll the whole window",
  "opencl.window_group": "after window_rows: LOCAL the column vectors of an output row (up to 16) into a work-group",
  "opencl.strided_conv": "a convolution whose output columns are strided in the image: UPCAST 8 (else 4, 2) output "
                         "channels, then one vector of columns, the window's last axis whole, and LOCAL 4 output rows",
  "opencl.pad_columns": "a reduce whose contiguous output axis no vector width divides: PADTO it to two vectors when "
                        "that adds at most an eighth (heuristics.pad_axis), then the register tile",
  "opencl.contiguous_reduce": "a reduce unit-stride in an input: UNROLL it by two vectors, else one",
  "opencl.contiguous_rows": "after a contiguous-reduce unroll: UPCAST the last output axis by 4 or 2 rows",
}


def row_axis(k: Kernel, vaxis: int) -> Optional[int]:
  """An output axis along which every input streaming the vector axis is broadcast, so that upcasting it reuses
  their vectors for several rows of accumulators (divisible by 8, then by 4, preferred)."""
  streamed = [i for i in input_bufs(k) if strides(k, i)[vaxis] == 1]
  best: Optional[tuple[int, int]] = None
  for axis in range(k.first_reduce):
    size = k.full_shape[axis]
    if axis == vaxis or not _int(size) or size < 2: continue
    if streamed and all(strides(k, i)[axis] == 0 for i in streamed):
      key = (size % 8 == 0) * 2 + (size % 4 == 0)
      if best is None or key > best[0]: best = (key, axis)
  return best[1] if best is not None else None

def hand_coded_opencl(k: Kernel) -> bool:
  """Apply the OpenCL CPU heuristics to k; False (k untouched) when none fits, so the spec's heuristics run."""
  if k.upcasted or k.local_dims or k.group_for_reduces or not k.bufs:
    decide(k, "opencl.profile", "something is upcast, local or grouped already: the spec's rules decide",
           upcasted=k.upcasted, local_dims=k.local_dims, group_for_reduces=k.group_for_reduces)
    return False
  if any(isinstance(b.dtype, ImageDType) or b.dtype != dtypes.float32 for b in k.bufs):
    decide(k, "opencl.profile", "a buffer is an image or not float32: the spec's rules decide",
           dtypes=tuple(b.dtype.name for b in k.bufs))
    return False
  width = k.opts.caps.vector_width
  if width < 2:
    decide(k, "opencl.profile", f"vector width {width} is under 2: the spec's rules decide", vector_width=width)
    return False
  if k.reduceop is None: return _elementwise(k, width)
  vaxis = vector_axis(k, width)
  if vaxis is not None: return _reduce_tile(k, vaxis, width)
  if is_conv(k) and (saxis := strided_vector_axis(k, width)) is not None: return _strided_conv(k, saxis, width)
  if is_conv(k) and (half := half_width(width)) and (vaxis := vector_axis(k, half)) is not None:
    # the reference's 64x56 conv on PoCL at width 16: 15.6 ms with the spec's tile, 7.8 with float8 lanes
    decide(k, "opencl.half_width", f"no output axis of a multiple of {width} vectorizes: vectors of {half}",
           axis=vaxis, size=k.full_shape[vaxis], vector_width=width)
    return _reduce_tile(k, vaxis, half)
  if (paxis := pad_axis(k, width)) is not None and \
     try_apply(k, "opencl.pad_columns", Opt(OptOps.PADTO, paxis, 2 * width), f"padded to a multiple of {2 * width}",
               axis=paxis, size=k.full_shape[paxis], buffer_strides=buffer_strides(k, paxis), vector_width=width):
    return _reduce_tile(k, paxis, width)
  decide(k, "opencl.tile_columns", f"no output axis of a multiple of {width} is unit-stride in every output and "
         "streamed by an input", vector_width=width)
  return _contiguous_reduce(k, width)

def _elementwise(k: Kernel, width: int) -> bool:
  """A few scalar lanes per work-item (fewer than the packed width, so they stay scalar and PoCL's work-item loop
  vectorizer sees contiguous accesses across work-items) and work-groups of ELEMENTWISE_GROUP items; of STREAM_GROUP
  when the output is big enough for the renderer to stream it (its sfence per work-group, interleaved on PoCL:
  a+b 4096^2 31.4 GB/s with groups of 1024 as without the fence, 14.2 with groups of 64 and an mfence). A kernel
  with exp2, log2 or sin gets packed lanes of the vector width instead: the reference's softmax exp-and-scale
  (4096 x 1024) on PoCL, 30 interleaved rounds, 27.0 ms with 4 scalar lanes, 3.8 with float8 lanes."""
  rule = "opencl.elementwise"
  lanes = ELEMENTWISE_LANES if ELEMENTWISE_LANES < width else 1
  axis = vector_axis(k, lanes) if lanes > 1 else None
  if (calls := _library_calls(k)) and (vaxis := vector_axis(k, width)) is not None:
    # PoCL's work-item loop vectorizer leaves exp2/log2/sin as one scalar call per element; packed floatN lanes call
    # its vector builtins instead
    lanes, axis = width, vaxis
  elif (vaxis := vector_axis(k, width)) is not None and (calls := _row_broadcasts(k, vaxis)):
    # a per-row value (layernorm's mean and 1/std) read by every item of a row: packed lanes read it once a vector.
    # The reference's layernorm normalize (4096 x 1024) on PoCL on an AVX-512 Xeon: 1.75-1.92 ms with 4 scalar lanes
    # at widths 8 and 16, 1.28-1.49 with packed lanes (and a work-group per row)
    lanes, axis = width, vaxis
  if axis is None:
    outs = output_bufs(k)
    axis = next((a for a in reversed(range(k.first_reduce)) if all(strides(k, i)[a] == 1 for i in outs)), None)
    if axis is None:
      decide(k, rule, "no axis is unit-stride in every output: the spec's rules decide", vector_width=width)
      return False
    decide(k, rule, f"vector width {width} leaves no scalar lanes" if lanes == 1 else
           f"no contiguous axis of a multiple of {lanes}: no lanes", lanes=lanes, vector_width=width)
  elif not try_apply(k, rule, Opt(OptOps.UPCAST, axis, lanes),
                     f"{lanes} packed lanes: {', '.join(calls)}" if lanes == width else
                     f"{lanes} scalar lanes, fewer than the vector width",
                     axis=axis, size=k.full_shape[axis], buffer_strides=buffer_strides(k, axis), vector_width=width):
    decide(k, rule, f"UPCAST of axis {axis} by {lanes} refused: the spec's rules decide", axis=axis)
    return False
  items = 1
  for n in k.full_shape: items *= n if _int(n) else 0
  streamed = k.opts.caps.stream_stores and items >= k.opts.caps.stream_min
  threads = STREAM_GROUP if streamed else ELEMENTWISE_GROUP if lanes > 1 else ELEMENTWISE_GROUP * 4
  _group(k, threads, f"{items} items, streamed stores: one sfence per group" if streamed else
         f"{items} items, {'lanes' if lanes > 1 else 'no lanes'}: PoCL's per-group cost amortized")
  return True

LIBRARY_CALLS = (UnaryOps.EXP2, UnaryOps.LOG2, UnaryOps.SIN)   # ops PoCL computes by a call to its builtins

def _library_calls(k: Kernel) -> tuple[str, ...]:
  """The names of the LIBRARY_CALLS ops in k's AST, each as a vector builtin ("EXP2 as a vector builtin")."""
  ops = {x.op for x in k.ast.lazyops}
  return tuple(f"{op.name} as a vector builtin" for op in LIBRARY_CALLS if op in ops)

def _row_broadcasts(k: Kernel, vaxis: int) -> tuple[str, ...]:
  """The inputs broadcast along vaxis that vary along another axis (a per-row value), named for a decision."""
  return tuple(f"input {i} broadcast along the row" for i in input_bufs(k)
               if strides(k, i)[vaxis] == 0 and any(st != 0 for st in strides(k, i)))

def _reduce_tile(k: Kernel, vaxis: int, width: int) -> bool:
  """A register tile of rows x (one or two vectors) accumulators, then the last reduce axis unrolled, then row blocks
  grouped so that a work-group covers TILE_ROWS rows. A long reduce axis (K of a matmul) with two-vector rows gets
  8 x 2 vector accumulators (each streamed vector feeds 8 rows: +10-30% over 4 x 2) and an unroll of 2 (PoCL,
  2026-11-30 14:40 UTC, interleaved medians over two runs: 1024^3 69.4/66.7 vs 60.7/60.5 GF/s for an unroll of 4;
  512^3 95.5/72.3 vs 99.6/71.9; an unroll of 8 was slower on both); otherwise 8 vector accumulators and the axis
  unrolled by 4, or entirely when it is at most 3 (a conv's window column)."""
  rows = row_axis(k, vaxis)
  two = 2 * width <= k.opts.caps.max_upcast and k.full_shape[vaxis] % (2 * width) == 0
  cols = 2 * width if rows is not None and two else width
  last = k.full_shape[k.shape_len - k.upcasted - 1] if k.first_reduce < k.shape_len - k.upcasted else None
  long_k = _int(last) and last > 3 and last % 2 == 0
  wide = cols == 2 * width and long_k
  facts = {"axis": vaxis, "size": k.full_shape[vaxis], "buffer_strides": buffer_strides(k, vaxis),
           "vector_width": width, "row_axis": rows, "last_reduce": last, "max_upcast": k.opts.caps.max_upcast}
  if not try_apply(k, "opencl.tile_columns", Opt(OptOps.UPCAST, vaxis, cols),
                   f"{cols // width} vector(s) of accumulators along the contiguous axis", **facts):
    decide(k, "opencl.tile_columns", f"UPCAST of axis {vaxis} by {cols} refused: the spec's rules decide", **facts)
    return False
  row_amt = 1
  if rows is not None:
    want = 8 if wide else 8 * width // cols
    for amt in (want, 4, 2):
      if amt <= want and k.full_shape[rows] % amt == 0 and \
         try_apply(k, "opencl.tile_rows", Opt(OptOps.UPCAST, rows, amt), f"{amt} rows of {cols // width} vector(s)" +
                   (" (a long reduce: 8 x 2)" if wide else ""), axis=rows, size=k.full_shape[rows], wide=wide):
        row_amt = amt
        break
    else: decide(k, "opencl.tile_rows", f"no row upcast of at most {want} divides axis {rows} or was accepted",
                 axis=rows, size=k.full_shape[rows])
  else: decide(k, "opencl.tile_rows", "no output axis broadcasts every input that streams the vector axis")
  window = rows is None and is_conv(k) and _window_rows(k, vaxis)
  _tile_unroll(k, wide, row_amt)
  if window:
    _tile_unroll(k, wide, row_amt)   # the window's other axis too: the rows share its loads
    _window_group(k, vaxis)
    return True
  if rows is not None and k.opts.caps.has_local and rows < k.first_reduce and _int(n := k.full_shape[rows]):
    # neighbouring row blocks share the streamed input: one work-group runs them one after another on one core
    most = max(1, TILE_ROWS // row_amt)
    for amt in (8, 4, 2):
      if amt <= most and n % amt == 0 and n // amt >= 2 and \
         try_apply(k, "opencl.row_blocks", Opt(OptOps.LOCAL, rows, amt), f"{amt} row blocks of {row_amt} per "
                   "work-group share the streamed input", axis=rows, size=n, limit=TILE_ROWS): break
    else: decide(k, "opencl.row_blocks", f"no 8, 4 or 2 row blocks within {most} leave 2 groups", axis=rows, size=n)
  else: decide(k, "opencl.row_blocks", "no row axis left among the global axes, or no local threads", row_axis=rows,
               has_local=k.opts.caps.has_local)
  return True

def _window_rows(k: Kernel, vaxis: int) -> bool:
  """A convolution with no broadcast row axis (depthwise): UPCAST the axis the window slides along by 4, else 2, so
  neighbouring output rows share the image rows they load. The reference's depthwise 64x56x56 3x3 conv on PoCL, 15
  interleaved rounds: one vector of columns with the window's last axis unrolled 0.94 ms; 4 rows with the whole
  window unrolled 0.54; the window unrolled and a work-group per row of column vectors, without the rows, 0.71; both
  0.44. (The native CPU profile gains nothing from the rows: 0.206 vs 0.214 ms, so it has no such rule.)"""
  rule, axis = "opencl.window_rows", window_row_axis(k, vaxis)
  if axis is None:
    decide(k, rule, "no output axis that a window slides along")
    return False
  size = k.full_shape[axis]
  if any(_int(size) and size % amt == 0 and
         try_apply(k, rule, Opt(OptOps.UPCAST, axis, amt), f"{amt} rows share the image rows of their windows",
                   axis=axis, size=size, buffer_strides=buffer_strides(k, axis)) for amt in (4, 2)): return True
  decide(k, rule, f"no UPCAST of 4 or 2 divides axis {axis} or was accepted", axis=axis, size=size)
  return False

def _window_group(k: Kernel, vaxis: int) -> None:
  """After window_rows: the vector axis's column vectors (a row of the output) make one work-group, up to 16."""
  rule, size = "opencl.window_group", k.full_shape[vaxis]
  if not k.opts.caps.has_local or not _int(size) or size < 2 or vaxis >= k.first_reduce:
    decide(k, rule, "no local threads, or no column vectors left in the global axes", has_local=k.opts.caps.has_local)
    return
  for amt in (size, 16, 8, 4, 2):
    if amt <= 16 and size % amt == 0 and \
       try_apply(k, rule, Opt(OptOps.LOCAL, vaxis, amt), f"{amt} column vectors of a row per work-group", axis=vaxis,
                 size=size): return
  decide(k, rule, f"no group of at most 16 divides axis {vaxis}", axis=vaxis, size=size)

def _strided_conv(k: Kernel, vaxis: int, width: int) -> bool:
  """A stride-2 convolution: no input streams its output columns contiguously, so _reduce_tile finds no row axis.
  Rows of output channels (where the image is broadcast) are upcast first, then one vector of columns (its image
  lanes gathered), the window's last axis unrolled and 4 output rows made one work-group. The reference's
  8x16x32x32 -> 32 conv at stride 2 on PoCL, interleaved rounds: the spec's choice 13.5 GF/s, this tile 41.1."""
  rule = "opencl.strided_conv"
  ins = input_bufs(k)
  rows = next((a for a in range(k.first_reduce) if a != vaxis and _int(n := k.full_shape[a]) and n >= 2 and
               all(strides(k, i)[a] == 0 for i in ins if strides(k, i)[vaxis] != 0)), None)
  if rows is not None:
    size = k.full_shape[rows]
    for amt in (8, 4, 2):
      if size % amt == 0 and try_apply(k, rule, Opt(OptOps.UPCAST, rows, amt), f"{amt} output channels",
                                       axis=rows, size=size, buffer_strides=buffer_strides(k, rows)):
        if amt == size and vaxis > rows: vaxis -= 1   # a whole-axis UPCAST leaves no axis of size 1 behind
        break
  else: decide(k, rule, "no output axis broadcasts the image")
  if not try_apply(k, rule, Opt(OptOps.UPCAST, vaxis, width), "one vector of output columns", axis=vaxis,
                   size=k.full_shape[vaxis], buffer_strides=buffer_strides(k, vaxis), vector_width=width):
    decide(k, rule, f"UPCAST of axis {vaxis} by {width} refused", axis=vaxis)
  end = k.shape_len - k.upcasted
  if k.first_reduce < end and _int(s := k.full_shape[end - 1]) and s <= 3:
    try_apply(k, rule, Opt(OptOps.UNROLL, end - 1 - k.first_reduce, 0), f"the window's last axis of {s}: whole",
              axis=end - 1, size=s)
  if k.opts.caps.has_local:
    for a in reversed(range(k.first_reduce)):
      if _int(n := k.full_shape[a]) and n % 4 == 0 and n // 4 >= 2 and \
         try_apply(k, rule, Opt(OptOps.LOCAL, a, 4), "4 output rows per work-group", axis=a, size=n): break
  return True

def _tile_unroll(k: Kernel, wide: bool, row_amt: int) -> None:
  rule, end = "opencl.tile_unroll", k.shape_len - k.upcasted
  if not (k.first_reduce < end and _int(s := k.full_shape[end - 1])):
    decide(k, rule, "no concrete reduce axis left in loops")
    return
  facts = {"axis": end - 1, "size": s, "wide": wide, "rows": row_amt}
  axis = end - 1 - k.first_reduce
  if s <= 3: done = try_apply(k, rule, Opt(OptOps.UNROLL, axis, 0), f"a window axis of {s}: whole", **facts)
  elif wide and row_amt == 8:
    done = try_apply(k, rule, Opt(OptOps.UNROLL, axis, 2), "by 2 under an 8 x 2 tile", **facts)
  elif s % 4 == 0: done = try_apply(k, rule, Opt(OptOps.UNROLL, axis, 4), "by 4", **facts)
  else:
    decide(k, rule, f"the last reduce axis of {s} is over 3 and no multiple of 4", **facts)
    return
  if not done: decide(k, rule, "the UNROLL was refused", **facts)

def _contiguous_reduce(k: Kernel, width: int) -> bool:
  """A reduce whose last axis is unit-stride in an input (a row sum): unrolled by two vectors (vector
  accumulators) and an output axis upcast by 4 or 2 (that many rows streamed at once; fewer than the vector width, so
  the lanes are packed along the rows, not across them)."""
  rule = "opencl.contiguous_reduce"
  end = k.shape_len - k.upcasted
  if k.first_reduce >= end:
    decide(k, rule, "no reduce axis in loops: the spec's rules decide")
    return False
  axis = end - 1
  size = k.full_shape[axis]
  facts = {"axis": axis, "size": size, "buffer_strides": buffer_strides(k, axis), "vector_width": width,
           "max_unroll": k.opts.caps.max_unroll}
  if not any(strides(k, i)[axis] == 1 for i in input_bufs(k)):
    decide(k, rule, "the last reduce axis is unit-stride in no input: the spec's rules decide", **facts)
    return False
  if not _int(size) or not any(size % amt == 0 and try_apply(k, rule, Opt(OptOps.UNROLL, axis - k.first_reduce, amt),
                                                             f"{amt // width} vector(s) of accumulators", **facts)
                               for amt in (2 * width, width) if amt <= k.opts.caps.max_unroll):
    decide(k, rule, f"neither {2 * width} nor {width} divides the reduce axis within max_unroll: the spec's rules "
           "decide", **facts)
    return False
  for out_axis in reversed(range(k.first_reduce)):
    if _int(n := k.full_shape[out_axis]) and n >= 2:
      if any(n % amt == 0 and try_apply(k, "opencl.contiguous_rows", Opt(OptOps.UPCAST, out_axis, amt),
                                        f"{amt} rows streamed at once", axis=out_axis, size=n, vector_width=width)
             for amt in (4, 2) if amt < width): break
  else: decide(k, "opencl.contiguous_rows", "no output axis takes an UPCAST by 4 or 2", vector_width=width)
  return True

def _group(k: Kernel, threads: int, why: str) -> None:
  """Make up to `threads` work-items of the last global axis one work-group (PoCL runs a group's items as a loop
  on one core), keeping at least 2 groups in all so every core gets work. A whole row per group where it fits: the
  reference's layernorm normalize (4096 rows of 1024, streamed) on PoCL, 40 interleaved rounds: 128 items (half a
  row, when each axis had to keep 2 groups) 4.84 ms, 256 (the row) 3.24."""
  rule = "opencl.group"
  if not k.opts.caps.has_local:
    decide(k, rule, "no local threads", has_local=False)
    return
  for axis in reversed(range(k.first_reduce)):
    size = k.full_shape[axis]
    if not _int(size) or size < 4: continue
    others = 1
    for a in range(k.first_reduce):
      if a != axis: others *= n if _int(n := k.full_shape[a]) else 1
    # the largest power of two (or the whole axis) within threads that leaves at least 2 groups in all
    for amt in sorted({size, *(1 << p for p in range(1, threads.bit_length()))}, reverse=True):
      if amt <= threads and size % amt == 0 and size // amt * others >= 2 and \
         try_apply(k, rule, Opt(OptOps.LOCAL, axis, amt), why, axis=axis, size=size, threads=threads): return
    decide(k, rule, f"no group of at most {threads} divides axis {axis} leaving 2 groups", axis=axis, size=size,
           threads=threads)
    return
  decide(k, rule, "no concrete global axis of at least 4", threads=threads)

register_heuristics("opencl_cpu", hand_coded_opencl)
