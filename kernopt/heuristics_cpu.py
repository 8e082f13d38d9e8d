"""Hand-coded optimizations for the native CPU profile (renderers/native.py), used by `Kernel.hand_coded_optimizations`
when the renderer's `heuristics` is "cpu_native". They shape register tiles for the lane packer: a vector axis of
`vector_width` contiguous lanes, broadcast rows upcast into independent accumulators, contiguous reduces unrolled into
vector accumulators. Only existing OptOps are used, so every choice is checked like any other. Imports heuristics,
heuristics_registry, opt, passes.vectorize and kernel; the Kernel only as a type (it is passed in), and this module
registers hand_coded_cpu as the "cpu_native" profile. Every step records a Decision (heuristics.decide/apply) naming a
rule of RULES."""
from __future__ import annotations
from typing import TYPE_CHECKING, Optional, TypeGuard
from kernopt.heuristics import (buffer_strides, contiguous_axis, decide, input_bufs, is_conv, pad_axis,
                                strided_vector_axis, strides, try_apply, vector_axis, window_row_axis)
from kernopt.heuristics_registry import register_heuristics
from kernopt.opt import Opt, OptOps
from kernopt.passes.vectorize import half_width

if TYPE_CHECKING: from kernopt.kernel import Kernel

def _int(x: object) -> TypeGuard[int]: return type(x) is int


RULES: dict[str, str] = {
  "cpu.profile": "the native CPU rules need a kernel with nothing upcast, local or grouped and a vector width >= 2",
  "cpu.elementwise": "elementwise: UPCAST the contiguous vector axis by the vector width",
  "cpu.tile_columns": "a reduce with a vector axis: UPCAST it by two vectors (four at width 16 where they divide "
                       "it) with a row axis, else one",
  "cpu.tile_rows": "UPCAST the row axis (broadcasting a streamed input) so the tile holds tile_accumulators(width) "
                   "vector accumulators (8; 16 at width 16), in at most 8 rows",
  "cpu.six_rows": "a tile of two vectors on 16 vector registers (width 4 or 8) whose row axis 6 divides: UPCAST the "
                  "rows by 6 before the columns (12 accumulators, each broadcast row dying after its two FMAs)",
  "cpu.conv_tile": "a convolution (a reduce axis of 3 or less, its window): UPCAST the row axis by 8 (else 4, 2) "
                   "first, then the vector axis by one vector; the vector axis may be strided in the image (stride 2)",
  "cpu.half_width": "a convolution at width 16 with no output axis of a multiple of 16: its tile uses vectors of 8 "
                    "and two output rows along the window's slide",
  "cpu.window_rows": "a depthwise convolution (no row axis): UPCAST the axis its window slides along by 4, else 2, "
                     "then unroll the whole window (up to DEPTHWISE_LANES)",
  "cpu.narrow_columns": "a reduce whose contiguous output axis is under two vectors and no multiple of the width (a "
                        "skinny matmul's N): UPCAST it whole, then UNROLL a unit-stride reduce axis by 4, else 2",
  "cpu.dot_lanes": "a skinny matmul (narrow_columns) whose broadcast input is unit-stride along a reduce axis the "
                   "streamed one walks with a stride: UNROLL that axis by the vector width (vector accumulators "
                   "along it; panel packing lays the streamed input's panel out along it), then UPCAST the columns "
                   "by 2 and the rows by 2, else the rows by 4",
  "cpu.pad_columns": "a reduce whose contiguous output axis no vector width divides: PADTO it to two vectors when that "
                     "adds at most an eighth, then the register tile (the borders pass versions the edge tile)",
  "cpu.window_unroll": "UNROLL the last reduce axes of at most 3 while the tile stays within window_lanes(width)",
  "cpu.contiguous_reduce": "a reduce unit-stride in an input: UNROLL it by two vectors, else one",
  "cpu.multi_reduce": "several reduces: UNROLL each reduce axis unit-stride in an input by two vectors (else one), "
                      "then UPCAST the vector axis by the vector width",
}


def row_axis(k: Kernel, vaxis: int, strided: bool = False) -> Optional[int]:
  """An output axis along which an input that streams the vector axis is broadcast: upcasting it reuses that input's
  vector for several rows of accumulators. `strided`: an input at any stride but 0 along the vector axis streams it."""
  streamed = [i for i in input_bufs(k) if (strides(k, i)[vaxis] != 0 if strided else strides(k, i)[vaxis] == 1)]
  best: Optional[tuple[int, int]] = None
  for axis in range(k.first_reduce):
    size = k.full_shape[axis]
    if axis == vaxis or not isinstance(size, int) or size < 2: continue
    if any(strides(k, i)[axis] == 0 for i in streamed):
      key = (size % 8 == 0) * 2 + (size % 4 == 0)
      if best is None or key > best[0]: best = (key, axis)
  return best[1] if best is not None else None


def hand_coded_cpu(k: Kernel) -> bool:
  """Apply the native CPU heuristics to k; False (k untouched) when none fits, so the spec's heuristics run."""
  if k.upcasted or k.local_dims or k.group_for_reduces or not k.bufs:
    decide(k, "cpu.profile", "something is upcast, local or grouped already: the spec's rules decide",
           upcasted=k.upcasted, local_dims=k.local_dims, group_for_reduces=k.group_for_reduces)
    return False
  width = k.opts.caps.vector_width
  if width < 2:
    decide(k, "cpu.profile", f"vector width {width} is under 2: the spec's rules decide", vector_width=width)
    return False
  vaxis = vector_axis(k, width)
  if len(k.reduceops) > 1: return _multi_reduce(k, vaxis, width)
  if k.reduceop is None:
    if vaxis is None:
      decide(k, "cpu.elementwise", f"no output axis of a multiple of {width} is unit-stride in every output and "
             "streamed by an input: the spec's rules decide", vector_width=width)
      return False
    # elementwise: one vector per iteration (memory-bound; more lanes only cost codegen time)
    if try_apply(k, "cpu.elementwise", Opt(OptOps.UPCAST, vaxis, width), "one vector per iteration",
                 axis=vaxis, size=k.full_shape[vaxis], buffer_strides=buffer_strides(k, vaxis), vector_width=width):
      return True
    decide(k, "cpu.elementwise", f"UPCAST of axis {vaxis} by {width} refused", axis=vaxis, vector_width=width)
    return False
  if is_conv(k):
    if vaxis is None: vaxis = strided_vector_axis(k, width)
    if vaxis is None and (half := half_width(width)):
      # a 56-column output row at width 16: half-width vectors (the vectorize pass packs them), not scalar lanes
      vaxis = vector_axis(k, half)
      if vaxis is None: vaxis = strided_vector_axis(k, half)
      if vaxis is not None:
        decide(k, "cpu.half_width", f"no output axis of a multiple of {width} vectorizes: vectors of {half}",
               axis=vaxis, size=k.full_shape[vaxis], vector_width=width)
        width = half
    if vaxis is not None: return _conv_tile(k, vaxis, width, slide=width != k.opts.caps.vector_width)
  elif vaxis is not None: return _reduce_tile(k, vaxis, width)
  elif (naxis := narrow_axis(k, width)) is not None and (_dot_tile(k, naxis, width) or _narrow_tile(k, naxis, width)):
    return True
  elif (paxis := pad_axis(k, width)) is not None and \
      try_apply(k, "cpu.pad_columns", Opt(OptOps.PADTO, paxis, 2 * width), f"padded to a multiple of {2 * width}",
                axis=paxis, size=k.full_shape[paxis], buffer_strides=buffer_strides(k, paxis), vector_width=width):
    return _reduce_tile(k, paxis, width)
  return _unroll_contiguous_reduce(k, width)

def tile_accumulators(width: int) -> int:
  """Vector accumulators of a matmul's register tile: 8 (half of AVX2's 16 registers), 16 at width 16 (AVX-512's 32
  registers: 8 rows x 2 vectors; 1000x1000x999, 1 thread, on a Xeon: 25.8 -> 19.9 ms)."""
  return 16 if width >= 16 else 8

def _reduce_tile(k: Kernel, vaxis: int, width: int) -> bool:
  """A register tile of tile_accumulators(width) vector accumulators, at most 8 rows: 4 rows x 2 vectors (matmul; at
  width 16 4 x 4 where 64 divides the columns, else 8 x 2) or 8 rows x 1 vector (conv, whose output row of 56 is no
  multiple of 16). Eight independent chains keep both FMA pipes busy through the 4-cycle latency. At width 16 the
  4 x 4 tile loads 4 vectors and 4 broadcasts per 16 FMAs (8 x 2: 2 and 8): the reference's 1024^3, 1 thread, AMD EPYC
  Zen 4, alternated: 20.3-20.8 -> 19.2-19.5 ms; 512^3 and 64x784x256 within noise, 2 threads the same."""
  rows = row_axis(k, vaxis)
  cols = next((n * width for n in ((4, 2) if tile_accumulators(width) == 16 else (2,))
               if rows is not None and k.full_shape[vaxis] % (n * width) == 0 and n * width <= k.opts.caps.max_upcast),
              width)
  facts = {"axis": vaxis, "size": k.full_shape[vaxis], "buffer_strides": buffer_strides(k, vaxis),
           "vector_width": width, "row_axis": rows, "max_upcast": k.opts.caps.max_upcast}
  whole = rows is not None and k.full_shape[rows] == 6   # a whole-axis UPCAST leaves no axis of size 1 behind
  if rows is not None and cols == 2 * width and tile_accumulators(width) == 8 and _six_rows(k, rows):
    if whole and rows < vaxis: vaxis -= 1
    facts["axis"] = vaxis
    if not try_apply(k, "cpu.tile_columns", Opt(OptOps.UPCAST, vaxis, cols), "2 vectors of accumulators along the "
                     "contiguous axis, after the 6 rows", **facts):
      decide(k, "cpu.tile_columns", f"UPCAST of axis {vaxis} by {cols} refused after the 6 rows", **facts)
    _unroll_small_reduces(k)
    return True
  if not try_apply(k, "cpu.tile_columns", Opt(OptOps.UPCAST, vaxis, cols),
                   f"{cols // width} vector(s) of accumulators along the contiguous axis", **facts):
    decide(k, "cpu.tile_columns", f"UPCAST of axis {vaxis} by {cols} refused: the spec's rules decide", **facts)
    return False
  if rows is not None:
    # conv, 1 thread, interleaved medians (13:02 UTC, a slow moment): 8 rows 20.6 vs 4 rows 15.6 GF/s, codegen 7.1 vs
    # 8.3 ms; before fused accumulation the two were even (25.9 vs 25.0)
    want = min(8, tile_accumulators(width) * width // cols)
    for amt in (want, 4, 2):
      if _int(k.full_shape[rows]) and k.full_shape[rows] % amt == 0 and \
         try_apply(k, "cpu.tile_rows", Opt(OptOps.UPCAST, rows, amt), f"{amt} rows of {cols // width} vector(s): "
                   "the broadcast input's vectors feed every row", axis=rows, size=k.full_shape[rows],
                   buffer_strides=buffer_strides(k, rows)): break
    else: decide(k, "cpu.tile_rows", f"no row upcast of {want}, 4 or 2 divides axis {rows} or was "
                 "accepted", axis=rows, size=k.full_shape[rows])
  else: decide(k, "cpu.tile_rows", "no output axis broadcasts an input that streams the vector axis")
  _unroll_small_reduces(k)
  return True

def _six_rows(k: Kernel, rows: int) -> bool:
  """cpu.six_rows: UPCAST the row axis by 6 when 6 divides it. The lane order follows the Opts, so the rows come
  first: the vectorize pass then emits each row's broadcast and its two FMAs together, and gcc 12 keeps the 12
  accumulators, the two streamed vectors and one broadcast in 15 of the 16 registers (columns first, it loads the six
  broadcasts at once and spills three accumulators). 1 thread, Zen 3, the standard protocol against these Opts in one
  run: 768^3 59.6 -> 68.9 GF/s, 1536x512x512 60.9 -> 68.0, 384x3072x768 58.7 -> 67.9; at width 4 (SSE lanes)
  768^3 31.1 -> 33.3. Rows 6 does not divide are not padded to it: the kernels would be 1.05-1.13x faster (1024^3,
  512^3, 256^3, 64x784x256; the borders pass splits the tile loop at the padded tile), but the padded tile's two
  versions cost 2.4x the codegen time (512^3: 3.4 -> 8.4 ms), against issue 16's budget."""
  size = k.full_shape[rows]
  if not _int(size) or size % 6: return False
  return try_apply(k, "cpu.six_rows", Opt(OptOps.UPCAST, rows, 6), "6 rows, before the columns: 12 accumulators",
                   axis=rows, size=size, buffer_strides=buffer_strides(k, rows))

def _conv_tile(k: Kernel, vaxis: int, width: int, slide: bool = False) -> bool:
  """8 rows (output channels, where the image is broadcast) x 1 vector of output columns, rows upcast first. The
  reference's convolution ASTs, 1 thread, interleaved rounds on this host: 64x56 (rows 8 x 1 vector before, columns
  first) 1.10x; 8x16x32x32 -> 32 (4 rows x 2 vectors before) 1.42x; the same at stride 2 (the spec's 4 x 4 with the
  window unrolled before) 2.8x."""
  rule, rows = "cpu.conv_tile", row_axis(k, vaxis, strided=True)
  if rows is not None:
    size = k.full_shape[rows]
    for amt in (8, 4, 2):
      if _int(size) and size % amt == 0 and \
         try_apply(k, rule, Opt(OptOps.UPCAST, rows, amt), f"{amt} rows: the image's lanes feed every row", axis=rows,
                   size=size, buffer_strides=buffer_strides(k, rows)):
        if amt == size and vaxis > rows: vaxis -= 1   # a whole-axis UPCAST leaves no axis of size 1 behind
        break
    else: decide(k, rule, f"no row upcast of 8, 4 or 2 divides axis {rows} or was accepted", axis=rows,
                 size=k.full_shape[rows])
  else: decide(k, rule, "no output axis broadcasts an input that streams the vector axis")
  facts = {"axis": vaxis, "size": k.full_shape[vaxis], "buffer_strides": buffer_strides(k, vaxis),
           "vector_width": width}
  if not try_apply(k, rule, Opt(OptOps.UPCAST, vaxis, width), "one vector of output columns", **facts):
    decide(k, rule, f"UPCAST of axis {vaxis} by {width} refused", **facts)
  elif slide and rows is not None and (wr := window_row_axis(k, vaxis)) is not None and _int(k.full_shape[wr]) and \
       k.full_shape[wr] % 2 == 0:
    # half-width vectors leave half the register file free: two output rows along the window's slide share the
    # image rows they overlap in (64x56 at width 16: 3.1-3.2 -> 2.6-2.7 ms, 1 thread; a depthwise conv, with no
    # channel rows, is slower so: 0.16 -> 0.21 ms)
    try_apply(k, "cpu.half_width", Opt(OptOps.UPCAST, wr, 2), "2 output rows along the window's slide", axis=wr,
              size=k.full_shape[wr], buffer_strides=buffer_strides(k, wr))
  # a depthwise conv's rows along the window's slide share its loads only with the whole window unrolled
  _unroll_small_reduces(k, limit=DEPTHWISE_LANES if rows is None and _window_rows(k, vaxis) else None)
  return True

DEPTHWISE_LANES = 4 * 8 * 9   # a depthwise tile's lane budget: 4 rows x 8 columns x a 3x3 window

def _window_rows(k: Kernel, vaxis: int) -> bool:
  """A depthwise conv (no output axis broadcasts the image): UPCAST the axis its window slides along by 4, else 2, so
  neighbouring output rows share the image rows they load (each tap one unaligned vector load). The reference's
  64x56x56 depthwise conv, 1 thread, on an AVX-512 Xeon: 0.117 ms with one row at widths 8 and 16, 0.065-0.071 with
  4 rows (8 rows the same); at width 4 0.193 -> 0.103."""
  rule, axis = "cpu.window_rows", window_row_axis(k, vaxis)
  if axis is None:
    decide(k, rule, "no output axis that the window slides along")
    return False
  size = k.full_shape[axis]
  for amt in (4, 2):
    if _int(size) and size % amt == 0 and \
       try_apply(k, rule, Opt(OptOps.UPCAST, axis, amt), f"{amt} rows share the image rows of their windows", axis=axis,
                 size=size, buffer_strides=buffer_strides(k, axis)): return True
  decide(k, rule, f"no UPCAST of 4 or 2 divides axis {axis} or was accepted", axis=axis, size=size)
  return False

def narrow_axis(k: Kernel, width: int) -> Optional[int]:
  """The last contiguous output axis (heuristics.contiguous_axis) of 2 to 2*width - 1 elements, no multiple of width:
  a skinny matmul's N (an MLP's last layer)."""
  for axis in reversed(range(k.first_reduce)):
    size = k.full_shape[axis]
    if not _int(size) or not 2 <= size < 2 * width or size % width == 0 or size > k.opts.caps.max_upcast: continue
    if contiguous_axis(k, axis): return axis
  return None

def _dot_tile(k: Kernel, axis: int, width: int) -> bool:
  """A skinny matmul's dot products as vectors along the reduce: UNROLL by the width the reduce axis r along which the
  input broadcast over the narrow columns (A) is unit-stride and the streamed one (B) is strided; lane t accumulates
  a[k+t] * b[k+t, j] on its own (the vectorize pass's dot lanes: A's vector times a gather of B), and panel packing
  copies B's panel so each gather is one load. Then 2 columns x 2 rows (4 vector accumulators), else 4 rows.
  Only where the columns stay a loop (the loop interchange puts it outside the rows and packing then applies) and
  the panel fits caps.panel_elements. The reference's 64x256x10, 1 thread, AMD EPYC (Zen 3, width 8), same run:
  cpu.narrow_columns' 10 columns x UNROLL 4 0.0124 ms, this 0.0081 (2 x 2; 4 rows 0.0086), numpy 0.0083."""
  rule, n = "cpu.dot_lanes", k.full_shape[axis]
  caps, ins = k.opts.caps, input_bufs(k)
  rows = row_axis(k, axis)
  cols = 2 if _int(n) and n % 2 == 0 and n > 2 else 1
  for r in range(k.first_reduce, k.shape_len - k.upcasted):
    size = k.full_shape[r]
    if not _int(size) or size % width or not _int(n) or n < 2: continue
    bcast = [i for i in ins if strides(k, i)[r] == 1 and strides(k, i)[axis] == 0]
    walked = [i for i in ins if strides(k, i)[axis] == 1 and _int(st := strides(k, i)[r]) and abs(st) > 1]
    if not bcast or not walked or size * cols > caps.panel_elements or n // cols < 2 or rows is None: continue
    if not try_apply(k, rule, Opt(OptOps.UNROLL, r - k.first_reduce, width),
                     f"the reduce by {width}: vector accumulators along it", axis=r, size=size,
                     buffer_strides=buffer_strides(k, r), vector_width=width, panel_elements=caps.panel_elements):
      return False
    m = k.full_shape[rows]
    if cols == 2 and _int(m) and m % 2 == 0 and \
       try_apply(k, rule, Opt(OptOps.UPCAST, axis, 2), "2 columns", axis=axis, size=n,
                 buffer_strides=buffer_strides(k, axis)):
      try_apply(k, rule, Opt(OptOps.UPCAST, rows, 2), "2 rows: 4 vector accumulators", axis=rows, size=m,
                buffer_strides=buffer_strides(k, rows))
    elif _int(m) and m % 4 == 0:
      try_apply(k, rule, Opt(OptOps.UPCAST, rows, 4), "4 rows", axis=rows, size=m,
                buffer_strides=buffer_strides(k, rows))
    return True
  decide(k, rule, "no reduce axis is unit-stride in the broadcast input and strided in the streamed one, a multiple "
         "of the width, with a panel that fits", axis=axis, size=n, vector_width=width)
  return False

def _narrow_tile(k: Kernel, axis: int, width: int) -> bool:
  """The whole narrow axis as the tile's columns (its loads are one contiguous row of the streamed input, packed into
  a vector and scalar lanes), and the reduce unrolled by 4, else 2, along an input's unit stride: independent
  accumulator chains without a row upcast, whose rows' lanes the packer would mix into gathered vectors (a 40-lane
  4 x 10 tile packs as 5 vectors across rows). The reference's 64x256x10 (an MLP's last layer), 1 thread, on an
  AVX-512 Xeon: 10 x 4 rows (the rule before) 0.036 ms at width 16 / 0.029 at width 8; 10 columns 0.016; 10 columns
  with the reduce unrolled by 4 0.008 / 0.010 (by 2 0.009, by 8 0.009-0.012; numpy about 0.006)."""
  rule, size = "cpu.narrow_columns", k.full_shape[axis]
  if not _int(size): return False   # narrow_axis chose an int axis
  facts = {"axis": axis, "size": size, "buffer_strides": buffer_strides(k, axis), "vector_width": width,
           "max_upcast": k.opts.caps.max_upcast}
  if not try_apply(k, rule, Opt(OptOps.UPCAST, axis, size), f"all {size} columns in the tile", **facts):
    decide(k, rule, f"UPCAST of axis {axis} by {size} refused", **facts)
    return False
  ins = input_bufs(k)
  unit = [r for r in range(k.first_reduce, k.shape_len - k.upcasted) if any(strides(k, i)[r] == 1 for i in ins)]
  if not unit: decide(k, rule, "no reduce axis in loops is unit-stride in an input: nothing to unroll")
  else:
    r, n = unit[-1], k.full_shape[unit[-1]]
    for amt in (4, 2):
      if _int(n) and n % amt == 0 and \
         try_apply(k, rule, Opt(OptOps.UNROLL, r - k.first_reduce, amt), f"the reduce unrolled by {amt}: independent "
                   "accumulator chains", axis=r, size=n, buffer_strides=buffer_strides(k, r)): break
    else: decide(k, rule, f"no UNROLL of 4 or 2 divides reduce axis {r} or was accepted", axis=r, size=n)
  _unroll_small_reduces(k)
  return True

# most lanes (upcast x unroll) a window may be unrolled into: each lane is an op through lowering, linearizing and
# packing, so a conv's 3x3 window over a 64-lane tile (576 lanes, 5x the codegen time) was measured no faster; but a
# whole 3x3 window over one vector is (a depthwise conv, 1 thread: 72 lanes 1.35x the 24 of kx alone)
WINDOW_LANES = 64

def window_lanes(width: int) -> int:
  """The lane budget of cpu.window_unroll: WINDOW_LANES, or a 3x3 window over one vector of `width` if more."""
  return max(WINDOW_LANES, 9 * width)

def _unroll_small_reduces(k: Kernel, limit: Optional[int] = None) -> None:
  """Fully unroll reduce axes of at most 3 (a conv's window), last first, as the spec does, while the tile stays
  within `limit` lanes (default window_lanes(vector width))."""
  rule, limit = "cpu.window_unroll", limit if limit is not None else window_lanes(k.opts.caps.vector_width)
  for _ in range(2):
    end = k.shape_len - k.upcasted
    if k.first_reduce >= end:
      decide(k, rule, "no reduce axis left in loops")
      return
    s = k.full_shape[end - 1]
    lanes = 1
    for x in k.full_shape[end:]: lanes *= x if isinstance(x, int) else 1
    facts = {"axis": end - 1, "size": s, "lanes": lanes, "limit": limit}
    if not (isinstance(s, int) and s <= 3 and lanes * s <= limit):
      decide(k, rule, f"the last reduce axis is over 3 or would make the tile of {lanes} lanes over {limit}",
             **facts)
      return
    if not try_apply(k, rule, Opt(OptOps.UNROLL, end - 1 - k.first_reduce, 0),
                     f"a window axis of {s}: the tile stays within {limit} lanes", **facts):
      decide(k, rule, "the whole-axis UNROLL was refused", **facts)
      return

def _unroll_contiguous_reduce(k: Kernel, width: int) -> bool:
  """A reduce whose last axis is unit-stride in an input: unroll it into 2 vectors of accumulators (memory-bound: 2
  independent vector adds per iteration outrun the memory; 4 doubled the codegen time for nothing)."""
  rule = "cpu.contiguous_reduce"
  end = k.shape_len - k.upcasted
  if k.first_reduce >= end:
    decide(k, rule, "no vector axis and no reduce axis in loops: the spec's rules decide", vector_width=width)
    return False
  axis = end - 1
  facts = {"axis": axis, "size": k.full_shape[axis], "buffer_strides": buffer_strides(k, axis), "vector_width": width,
           "max_unroll": k.opts.caps.max_unroll}
  if not any(strides(k, i)[axis] == 1 for i in input_bufs(k)):
    decide(k, rule, "no vector axis, and the last reduce axis is unit-stride in no input: the spec's rules decide",
           **facts)
    return False
  size = k.full_shape[axis]
  for amt in (2 * width, width):
    if amt <= k.opts.caps.max_unroll and _int(size) and size % amt == 0 and \
       try_apply(k, rule, Opt(OptOps.UNROLL, axis - k.first_reduce, amt), f"{amt // width} vector(s) of accumulators",
                 **facts): return True
  decide(k, rule, f"neither {2 * width} nor {width} divides the reduce axis within max_unroll: the spec's rules decide",
         **facts)
  return False

def _multi_reduce(k: Kernel, vaxis: Optional[int], width: int) -> bool:
  """Several reduces (softmax, layernorm: docs/fusion.md): each reduce axis that an input streams is unrolled into 2
  vectors of accumulators (else 1), every reduce over it gets them, then the output axis is upcast by one vector.
  Only the reduces' axes are unrolled, so each reduce's lanes are its own axis's contiguous elements."""
  rule = "cpu.multi_reduce"
  applied = False
  for axis in reversed(range(k.first_reduce, k.shape_len - k.upcasted)):
    size = k.full_shape[axis]
    facts = {"axis": axis, "size": size, "buffer_strides": buffer_strides(k, axis), "vector_width": width,
             "max_unroll": k.opts.caps.max_unroll, "reduces": len(k.reduceops)}
    if not any(strides(k, i)[axis] == 1 for i in input_bufs(k)):
      decide(k, rule, f"reduce axis {axis} is unit-stride in no input", **facts)
      continue
    for amt in (2 * width, width):
      if amt <= k.opts.caps.max_unroll and _int(size) and size % amt == 0 and \
         try_apply(k, rule, Opt(OptOps.UNROLL, axis - k.first_reduce, amt), f"{amt // width} vector(s) of "
                   f"accumulators for every reduce over axis {axis}", **facts):
        applied = True
        break
    else: decide(k, rule, f"neither {2 * width} nor {width} divides reduce axis {axis} within max_unroll", **facts)
  if vaxis is None: decide(k, rule, f"no output axis of a multiple of {width} is unit-stride in every output and "
                           "streamed by an input", vector_width=width)
  elif try_apply(k, rule, Opt(OptOps.UPCAST, vaxis, width), "one vector of outputs per iteration", axis=vaxis,
                 size=k.full_shape[vaxis], buffer_strides=buffer_strides(k, vaxis), vector_width=width):
    applied = True
  else: decide(k, rule, f"UPCAST of axis {vaxis} by {width} refused", axis=vaxis, vector_width=width)
  if not applied: decide(k, rule, "no Opt applied: the spec's rules decide")
  return applied

register_heuristics("cpu_native", hand_coded_cpu)
