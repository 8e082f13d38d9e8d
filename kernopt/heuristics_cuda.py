"""Hand-coded optimizations for the CUDA device's profile (`CUDARenderer(heuristics="cuda_gpu")`, what
`Device["CUDA"]` renders with), used by `Kernel.hand_coded_optimizations` before the spec's rules: thread blocks of
whole warps, row reductions split across a block, and wider per-thread matmul tiles on big grids. A kernel no rule
fits gets the spec's heuristics. Measured on an H200 (2026-11-30, benchmarks/bench_opts.py, medians of 21
interleaved launches; docs/cuda.md). Imports ops, opt and the spec heuristics; the Kernel is passed in."""
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
MIN_BLOCKS = 512          # thread blocks a matmul's grid needs before its per-thread tile is widened

def hand_coded_cuda(k: Kernel) -> bool:
  """Apply the CUDA profile's rules to k; False (k untouched) when none fits, so the spec's heuristics run."""
  if k.upcasted or k.local_dims or k.group_for_reduces or not k.bufs or k.opts.has_local is False: return False
  if k.reduceop is None: return _elementwise(k)
  return _row_reduce(k) or _wider_output_tile(k)

def _wider_output_tile(k: Kernel) -> bool:
  """The spec's register tile of a reduce with two local axes (a matmul: 4x4 outputs per thread in 8x16-thread
  blocks), widened along the second local axis by 2 (4x8 outputs per thread: each loaded value feeds twice the
  products; both the 512^3 and 1024^3 matmul searches on the H200 added it), when the grid has at least MIN_BLOCKS
  blocks: matmul 1024^3 (512 blocks) 6869 -> 11247 GFLOP/s, while 512^3 (128 blocks, fewer than the H200's 132 SMs)
  went 3574 -> 3469 and keeps the spec's tile."""
  snap = k._snapshot()
  hand_coded(k)
  tile, blocks = k.first_reduce - 1, 1
  for n in k.full_shape[:k.global_dims]: blocks *= n if isinstance(n, int) else 0
  if k.local_dims == 2 and not k.group_for_reduces and k.upcasted >= 2 and blocks >= MIN_BLOCKS and \
     isinstance(n := k.full_shape[tile], int) and n >= 8 and n % 2 == 0 and try_opt(k, OptOps.UPCAST, tile, 2):
    return True
  k._restore(snap)
  return False

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
