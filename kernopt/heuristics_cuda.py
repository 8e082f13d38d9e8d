"""Hand-coded optimizations for the CUDA device's profile (`CUDARenderer(heuristics="cuda_gpu")`, what
`Device["CUDA"]` renders with), used by `Kernel.hand_coded_optimizations` before the spec's rules: thread blocks of
whole warps, row reductions split across a block, wider per-thread matmul tiles, and reduces split across threads
on small grids. A kernel no rule fits gets the spec's heuristics. Measured on an H200 (2026-11-30,
benchmarks/bench_opts.py, medians of 21 interleaved launches; docs/cuda.md). Imports ops, opt and the spec
heuristics; the Kernel is passed in."""
from __future__ import annotations
from typing import TYPE_CHECKING
from kernopt.heuristics import hand_coded, input_bufs, strides, try_opt, vector_axis
from kernopt.ops import ReduceOps
from kernopt.opt import OptOps

if TYPE_CHECKING: from kernopt.kernel import Kernel

ELEMENTWISE_LANES = 4     # a float4 per thread, as the spec's rules choose
ELEMENTWISE_BLOCK = 128   # threads per block of an elementwise kernel (spec: 32): a+b 4096^2 2348 -> 3977 GB/s
ROW_GROUP = 128           # threads splitting one row's reduction: sum(axis=1) 4096^2 743 -> 2368 GB/s with ROW_UNROLL
ROW_UNROLL = 4
MANY_OUTPUTS = 2048       # the spec splits reductions of at most this many outputs itself (GROUPTOP 16)
MIN_BLOCKS = 512          # thread blocks below which a tiled reduce is also split across threads, on the H200's
MEASURED_SMS = 132        # 132 SMs; a device reporting its SM count scales it (the measure is blocks per SM)
SPLIT = 4                 # threads of a block sharing one reduce on a small grid

def hand_coded_cuda(k: Kernel) -> bool:
  """Apply the CUDA profile's rules to k; False (k untouched) when none fits, so the spec's heuristics run."""
  if k.upcasted or k.local_dims or k.group_for_reduces or not k.bufs or k.opts.has_local is False: return False
  if k.reduceop is None: return _elementwise(k)
  return _row_reduce(k) or _tile_and_split(k)

def _tile_and_split(k: Kernel) -> bool:
  """After the spec's rules chose a 2-D register tile and two or three local axes (a matmul, a conv): a matmul's tile
  widened along its second local axis by 2 (4x8 outputs per thread: each loaded value feeds twice the products),
  and, on a grid of fewer than MIN_BLOCKS blocks, the reduce split across SPLIT threads of a block (GROUPTOP), so
  the SMs get enough threads. Both are what the H200 searches added first. Interleaved there: matmul 1024^3 (512
  blocks) 6869 -> 11247 GFLOP/s widened (splitting too: 11334); matmul 512^3 (128 blocks) 3735 -> 7921 widened and
  split (3469 widened alone, 5699 split alone); conv2d 64->64 56^2 (98 blocks) 2458 -> 5605 split (4201 by 2)."""
  snap = k._snapshot()
  hand_coded(k)
  if k.group_for_reduces or k.local_dims not in (2, 3) or k.upcasted < 2 or k.first_reduce >= k.shape_len:
    k._restore(snap)
    return False
  blocks = 1
  for n in k.full_shape[:k.global_dims]: blocks *= n if isinstance(n, int) else 0
  tile = k.first_reduce - 1
  widened = k.local_dims == 2 and isinstance(n := k.full_shape[tile], int) and n >= 8 and n % 2 == 0 and \
    try_opt(k, OptOps.UPCAST, tile, 2)
  split = blocks < min_blocks(k) and try_opt(k, OptOps.GROUPTOP, 0, SPLIT)
  if widened or split: return True
  k._restore(snap)
  return False

def min_blocks(k: Kernel) -> int:
  """MIN_BLOCKS scaled to the renderer's `sm_count` (None: the measured GPU's)."""
  sms = getattr(k.opts, "sm_count", None)
  return MIN_BLOCKS if not sms else -(-MIN_BLOCKS * sms // MEASURED_SMS)

def _elementwise(k: Kernel) -> bool:
  """A float4 per thread along the contiguous output axis, in blocks of ELEMENTWISE_BLOCK threads (4 warps: a block
  of one warp caps an SM at half its threads)."""
  axis = vector_axis(k, ELEMENTWISE_LANES)
  if axis is None: return False
  size, per_block = k.full_shape[axis], ELEMENTWISE_LANES * ELEMENTWISE_BLOCK
  if not isinstance(size, int) or size % per_block or size < 2 * per_block: return False
  snap = k._snapshot()
  if try_opt(k, OptOps.UPCAST, axis, ELEMENTWISE_LANES) and try_opt(k, OptOps.LOCAL, axis, ELEMENTWISE_BLOCK):
    return True
  k._restore(snap)
  return False

def _row_reduce(k: Kernel) -> bool:
  """More than MANY_OUTPUTS rows each reduced along one axis that is unit-stride in every input (a row sum): ROW_GROUP
  threads of a block split each row (GROUPTOP: neighbouring threads read neighbouring elements, so loads coalesce,
  and every SM gets blocks), each unrolling ROW_UNROLL steps of its share."""
  if k.reduceop is None or k.reduceop.op not in (ReduceOps.SUM, ReduceOps.MAX): return False
  if k.shape_len - k.first_reduce != 1: return False
  outputs = 1
  for n in k.full_shape[:k.first_reduce]:
    if not isinstance(n, int): return False
    outputs *= n
  size = k.full_shape[k.first_reduce]
  if outputs <= MANY_OUTPUTS or not isinstance(size, int) or size % (ROW_GROUP * ROW_UNROLL): return False
  if not all(strides(k, i)[k.first_reduce] == 1 for i in input_bufs(k)): return False
  snap = k._snapshot()
  if try_opt(k, OptOps.GROUPTOP, 0, ROW_GROUP) and try_opt(k, OptOps.UNROLL, 1, ROW_UNROLL): return True
  k._restore(snap)
  return False
