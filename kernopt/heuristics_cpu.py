"""Hand-coded optimizations for the native CPU profile (renderers/native.py), used by `Kernel.hand_coded_optimizations`
when the renderer's `heuristics` is "cpu_native". They shape register tiles for the lane packer: a vector axis of
`vector_width` contiguous lanes, broadcast rows upcast into independent accumulators, contiguous reduces unrolled into
vector accumulators. Only existing OptOps are used, so every choice is checked like any other. Imports heuristics,
heuristics_registry, opt and kernel; the Kernel only as a type (it is passed in), and this module registers
hand_coded_cpu as the "cpu_native" profile. Every step records a Decision (heuristics.decide/apply) naming a rule
of RULES."""
from __future__ import annotations
from typing import TYPE_CHECKING, Optional, TypeGuard
from kernopt.heuristics import buffer_strides, decide, input_bufs, strides, try_apply, vector_axis
from kernopt.heuristics_registry import register_heuristics
from kernopt.opt import Opt, OptOps

if TYPE_CHECKING: from kernopt.kernel import Kernel

def _int(x: object) -> TypeGuard[int]: return type(x) is int


RULES: dict[str, str] = {
  "cpu.profile": "the native CPU rules need a kernel with nothing upcast, local or grouped and a vector width >= 2",
  "cpu.elementwise": "elementwise: UPCAST the contiguous vector axis by the vector width",
  "cpu.tile_columns": "a reduce with a vector axis: UPCAST it by two vectors (with a row axis) or one",
  "cpu.tile_rows": "UPCAST the row axis (broadcasting a streamed input) so the tile holds 8 vector accumulators",
  "cpu.window_unroll": "UNROLL the last reduce axes of at most 3 while the tile stays within WINDOW_LANES lanes",
  "cpu.contiguous_reduce": "a reduce unit-stride in an input: UNROLL it by two vectors, else one",
  "cpu.multi_reduce": "several reduces: UNROLL each reduce axis unit-stride in an input by two vectors (else one), "
                      "then UPCAST the vector axis by the vector width",
}


def row_axis(k: Kernel, vaxis: int) -> Optional[int]:
  """An output axis along which an input that streams the vector axis is broadcast: upcasting it reuses that input's
  vector for several rows of accumulators."""
  streamed = [i for i in input_bufs(k) if strides(k, i)[vaxis] == 1]
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
  if vaxis is not None: return _reduce_tile(k, vaxis, width)
  return _unroll_contiguous_reduce(k, width)

def _reduce_tile(k: Kernel, vaxis: int, width: int) -> bool:
  """A register tile of 8 vector accumulators: 4 rows x 2 vectors (matmul) or 8 rows x 1 vector (conv, whose output
  row of 56 is no multiple of 16). Eight independent chains keep both FMA pipes busy through the 4-cycle latency."""
  rows = row_axis(k, vaxis)
  cols = 2 * width if rows is not None and k.full_shape[vaxis] % (2 * width) == 0 and \
    2 * width <= k.opts.caps.max_upcast else width
  facts = {"axis": vaxis, "size": k.full_shape[vaxis], "buffer_strides": buffer_strides(k, vaxis),
           "vector_width": width, "row_axis": rows, "max_upcast": k.opts.caps.max_upcast}
  if not try_apply(k, "cpu.tile_columns", Opt(OptOps.UPCAST, vaxis, cols),
                   f"{cols // width} vector(s) of accumulators along the contiguous axis", **facts):
    decide(k, "cpu.tile_columns", f"UPCAST of axis {vaxis} by {cols} refused: the spec's rules decide", **facts)
    return False
  if rows is not None:
    # conv, 1 thread, interleaved medians (13:02 UTC, a slow moment): 8 rows 20.6 vs 4 rows 15.6 GF/s, codegen 7.1 vs
    # 8.3 ms; before fused accumulation the two were even (25.9 vs 25.0)
    for amt in (8 * width // cols, 4, 2):
      if _int(k.full_shape[rows]) and k.full_shape[rows] % amt == 0 and \
         try_apply(k, "cpu.tile_rows", Opt(OptOps.UPCAST, rows, amt), f"{amt} rows of {cols // width} vector(s): "
                   "the broadcast input's vectors feed every row", axis=rows, size=k.full_shape[rows],
                   buffer_strides=buffer_strides(k, rows)): break
    else: decide(k, "cpu.tile_rows", f"no row upcast of {8 * width // cols}, 4 or 2 divides axis {rows} or was "
                 "accepted", axis=rows, size=k.full_shape[rows])
  else: decide(k, "cpu.tile_rows", "no output axis broadcasts an input that streams the vector axis")
  _unroll_small_reduces(k)
  return True

# most lanes (upcast x unroll) a window may be unrolled into: each lane is an op through lowering, linearizing and
# packing, so a conv's 3x3 window over a 64-lane tile (576 lanes, 5x the codegen time) was measured no faster
WINDOW_LANES = 64

def _unroll_small_reduces(k: Kernel) -> None:
  """Fully unroll reduce axes of at most 3 (a conv's window), last first, as the spec does, while the tile stays
  within WINDOW_LANES lanes."""
  rule = "cpu.window_unroll"
  for _ in range(2):
    end = k.shape_len - k.upcasted
    if k.first_reduce >= end:
      decide(k, rule, "no reduce axis left in loops")
      return
    s = k.full_shape[end - 1]
    lanes = 1
    for x in k.full_shape[end:]: lanes *= x if isinstance(x, int) else 1
    facts = {"axis": end - 1, "size": s, "lanes": lanes, "limit": WINDOW_LANES}
    if not (isinstance(s, int) and s <= 3 and lanes * s <= WINDOW_LANES):
      decide(k, rule, f"the last reduce axis is over 3 or would make the tile of {lanes} lanes over WINDOW_LANES",
             **facts)
      return
    if not try_apply(k, rule, Opt(OptOps.UNROLL, end - 1 - k.first_reduce, 0),
                     f"a window axis of {s}: the tile stays within WINDOW_LANES", **facts):
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
