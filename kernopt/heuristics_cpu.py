"""Hand-coded optimizations for the native CPU profile (renderers/native.py), used by `Kernel.hand_coded_optimizations`
when the renderer's `heuristics` is "cpu_native". They shape register tiles for the lane packer: a vector axis of
`vector_width` contiguous lanes, broadcast rows upcast into independent accumulators, contiguous reduces unrolled into
vector accumulators. Only existing OptOps are used, so every choice is checked like any other. Imports errors and opt;
the Kernel is passed in."""
from __future__ import annotations
from typing import TYPE_CHECKING, Optional, TypeGuard
from kernopt.heuristics import input_bufs, strides, try_opt, vector_axis
from kernopt.opt import OptOps

if TYPE_CHECKING: from kernopt.kernel import Kernel

def _int(x: object) -> TypeGuard[int]: return type(x) is int


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
  if k.upcasted or k.local_dims or k.group_for_reduces or not k.bufs: return False
  width = getattr(k.opts, "vector_width", 4)
  if width < 2: return False
  vaxis = vector_axis(k, width)
  if k.reduceop is None:
    if vaxis is None: return False
    # elementwise: one vector per iteration (memory-bound; more lanes only cost codegen time)
    return try_opt(k, OptOps.UPCAST, vaxis, width)
  if vaxis is not None: return _reduce_tile(k, vaxis, width)
  return _unroll_contiguous_reduce(k, width)

def _reduce_tile(k: Kernel, vaxis: int, width: int) -> bool:
  """A register tile of 8 vector accumulators: 4 rows x 2 vectors (matmul) or 8 rows x 1 vector (conv, whose output
  row of 56 is no multiple of 16). Eight independent chains keep both FMA pipes busy through the 4-cycle latency."""
  rows = row_axis(k, vaxis)
  cols = 2 * width if rows is not None and k.full_shape[vaxis] % (2 * width) == 0 and \
    2 * width <= k.opts.max_upcast else width
  if not try_opt(k, OptOps.UPCAST, vaxis, cols): return False
  if rows is not None:
    # conv, 1 thread, interleaved medians (13:02 UTC, a slow moment): 8 rows 20.6 vs 4 rows 15.6 GF/s, codegen 7.1 vs
    # 8.3 ms; before fused accumulation the two were even (25.9 vs 25.0)
    for amt in (8 * width // cols, 4, 2):
      if _int(k.full_shape[rows]) and k.full_shape[rows] % amt == 0 and try_opt(k, OptOps.UPCAST, rows, amt): break
  _unroll_small_reduces(k)
  return True

# most lanes (upcast x unroll) a window may be unrolled into: each lane is an op through lowering, linearizing and
# packing, so a conv's 3x3 window over a 64-lane tile (576 lanes, 5x the codegen time) was measured no faster
WINDOW_LANES = 64

def _unroll_small_reduces(k: Kernel) -> None:
  """Fully unroll reduce axes of at most 3 (a conv's window), last first, as the spec does, while the tile stays
  within WINDOW_LANES lanes."""
  for _ in range(2):
    end = k.shape_len - k.upcasted
    if k.first_reduce >= end: return
    s = k.full_shape[end - 1]
    lanes = 1
    for x in k.full_shape[end:]: lanes *= x if isinstance(x, int) else 1
    fits = isinstance(s, int) and s <= 3 and lanes * s <= WINDOW_LANES
    if not (fits and try_opt(k, OptOps.UNROLL, end - 1 - k.first_reduce, 0)):
      return

def _unroll_contiguous_reduce(k: Kernel, width: int) -> bool:
  """A reduce whose last axis is unit-stride in an input: unroll it into 2 vectors of accumulators (memory-bound: 2
  independent vector adds per iteration outrun the memory; 4 doubled the codegen time for nothing)."""
  end = k.shape_len - k.upcasted
  if k.first_reduce >= end: return False
  axis = end - 1
  if not any(strides(k, i)[axis] == 1 for i in input_bufs(k)): return False
  size = k.full_shape[axis]
  for amt in (2 * width, width):
    if amt <= k.opts.max_unroll and _int(size) and size % amt == 0 and \
       try_opt(k, OptOps.UNROLL, axis - k.first_reduce, amt): return True
  return False
