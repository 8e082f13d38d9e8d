"""Hand-coded optimizations for the CUDA device's profile (`CUDARenderer(heuristics="cuda_gpu")`, what
`Device["CUDA"]` renders with), used by `Kernel.hand_coded_optimizations` before the spec's rules: thread blocks of
whole warps, row reductions split across a block, wider per-thread matmul tiles, and reduces split across threads
on small grids. A kernel no rule fits gets the spec's heuristics. Measured on an H200 (2026-11-30,
benchmarks/bench_opts.py, medians of 21 interleaved launches; docs/cuda.md). Imports ops, opt, heuristics,
heuristics_registry and kernel; the Kernel only as a type (it is passed in), and this module registers
hand_coded_cuda as the "cuda_gpu" profile. Every step records a Decision naming a rule of RULES."""
from __future__ import annotations
from typing import TYPE_CHECKING
from kernopt.heuristics import buffer_strides, decide, hand_coded, input_bufs, strides, try_apply, vector_axis
from kernopt.ops import ReduceOps
from kernopt.heuristics_registry import register_heuristics
from kernopt.opt import Opt, OptOps

if TYPE_CHECKING: from kernopt.kernel import Kernel

ELEMENTWISE_LANES = 4     # a float4 per thread, as the spec's rules choose
ELEMENTWISE_BLOCK = 128   # threads per block of an elementwise kernel (spec: 32): a+b 4096^2 2348 -> 3977 GB/s
ROW_GROUP = 128           # threads splitting one row's reduction: sum(axis=1) 4096^2 743 -> 2368 GB/s with ROW_UNROLL
ROW_UNROLL = 4
MANY_OUTPUTS = 2048       # the spec splits reductions of at most this many outputs itself (GROUPTOP 16)
MIN_BLOCKS = 512          # thread blocks below which a tiled reduce is also split across threads, on the H200's
MEASURED_SMS = 132        # 132 SMs; a device reporting its SM count scales it (the measure is blocks per SM)
SPLIT = 4                 # threads of a block sharing one reduce on a small grid

RULES: dict[str, str] = {
  "cuda.profile": "the CUDA rules need a kernel with nothing upcast, local or grouped on a dialect with locals",
  "cuda.elementwise": "elementwise: a float4 per thread (UPCAST 4) in blocks of ELEMENTWISE_BLOCK threads (LOCAL)",
  "cuda.row_reduce": "over MANY_OUTPUTS rows reduced along one contiguous axis: GROUPTOP ROW_GROUP, UNROLL ROW_UNROLL",
  "cuda.tile_and_split": "a 2-D register tile and 2 or 3 local axes from the spec's rules, then widened or split",
  "cuda.tile_widen": "a matmul's tile: UPCAST its second local axis by 2 (4x8 outputs per thread)",
  "cuda.split": "fewer than MIN_BLOCKS blocks (scaled by sm_count): GROUPTOP the reduce over SPLIT threads",
}

def hand_coded_cuda(k: Kernel) -> bool:
  """Apply the CUDA profile's rules to k; False (k untouched) when none fits, so the spec's heuristics run."""
  if k.upcasted or k.local_dims or k.group_for_reduces or not k.bufs or k.opts.caps.has_local is False:
    decide(k, "cuda.profile", "something is upcast, local or grouped already, or no locals: the spec's rules decide",
           upcasted=k.upcasted, local_dims=k.local_dims, group_for_reduces=k.group_for_reduces,
           has_local=k.opts.caps.has_local)
    return False
  if k.reduceop is None: return _elementwise(k)
  return _row_reduce(k) or _tile_and_split(k)

def _tile_and_split(k: Kernel) -> bool:
  """After the spec's rules chose a 2-D register tile and two or three local axes (a matmul, a conv): a matmul's tile
  widened along its second local axis by 2 (4x8 outputs per thread: each loaded value feeds twice the products),
  and, on a grid of fewer than MIN_BLOCKS blocks, the reduce split across SPLIT threads of a block (GROUPTOP), so
  the SMs get enough threads. Both are what the H200 searches added first. Interleaved there: matmul 1024^3 (512
  blocks) 6869 -> 11247 GFLOP/s widened (splitting too: 11334); matmul 512^3 (128 blocks) 3735 -> 7921 widened and
  split (3469 widened alone, 5699 split alone); conv2d 64->64 56^2 (98 blocks) 2458 -> 5605 split (4201 by 2)."""
  rule = "cuda.tile_and_split"
  snap = k.snapshot()
  hand_coded(k)
  if k.group_for_reduces or k.local_dims not in (2, 3) or k.upcasted < 2 or k.first_reduce >= k.shape_len:
    # what the spec's rules gave, before they are undone
    facts = {"spec_grouped": k.group_for_reduces, "spec_local_dims": k.local_dims, "spec_upcasted": k.upcasted}
    k.restore(snap)
    decide(k, rule, "the spec's rules gave no ungrouped 2-D tile with 2 or 3 local axes: they decide alone", **facts)
    return False
  blocks = 1
  for n in k.full_shape[:k.global_dims]: blocks *= n if isinstance(n, int) else 0
  tile = k.first_reduce - 1
  widened = k.local_dims == 2 and isinstance(n := k.full_shape[tile], int) and n >= 8 and n % 2 == 0 and \
    try_apply(k, "cuda.tile_widen", Opt(OptOps.UPCAST, tile, 2), "2 local axes (a matmul): each loaded value feeds "
              "twice the products", axis=tile, size=n, local_dims=k.local_dims)
  if not widened: decide(k, "cuda.tile_widen", "needs 2 local axes, the last at least 8 and even, and an accepted "
                         "UPCAST", axis=tile, size=k.full_shape[tile], local_dims=k.local_dims)
  limit = min_blocks(k)
  split = blocks < limit and try_apply(k, "cuda.split", Opt(OptOps.GROUPTOP, 0, SPLIT), f"{blocks} blocks, under "
                                       f"{limit}: more threads per SM", blocks=blocks, limit=limit)
  if not split: decide(k, "cuda.split", f"{blocks} blocks (limit {limit}), or the GROUPTOP was refused",
                       blocks=blocks, limit=limit)
  if widened or split: return True
  k.restore(snap)
  decide(k, rule, "neither widened nor split: the spec's rules decide alone", blocks=blocks, limit=limit)
  return False

def min_blocks(k: Kernel) -> int:
  """MIN_BLOCKS scaled to the renderer's `sm_count` (None: the measured GPU's)."""
  sms = k.opts.caps.sm_count
  return MIN_BLOCKS if not sms else -(-MIN_BLOCKS * sms // MEASURED_SMS)

def _elementwise(k: Kernel) -> bool:
  """A float4 per thread along the contiguous output axis, in blocks of ELEMENTWISE_BLOCK threads (4 warps: a block
  of one warp caps an SM at half its threads)."""
  rule = "cuda.elementwise"
  axis = vector_axis(k, ELEMENTWISE_LANES)
  if axis is None:
    decide(k, rule, f"no output axis of a multiple of {ELEMENTWISE_LANES} is unit-stride in every output and streamed "
           "by an input: the spec's rules decide")
    return False
  size, per_block = k.full_shape[axis], ELEMENTWISE_LANES * ELEMENTWISE_BLOCK
  facts = {"axis": axis, "size": size, "per_block": per_block, "buffer_strides": buffer_strides(k, axis)}
  if not isinstance(size, int) or size % per_block or size < 2 * per_block:
    decide(k, rule, f"the axis is no multiple of {per_block} of at least 2 blocks: the spec's rules decide", **facts)
    return False
  snap = k.snapshot()
  if try_apply(k, rule, Opt(OptOps.UPCAST, axis, ELEMENTWISE_LANES), "a float4 per thread", **facts) and \
     try_apply(k, rule, Opt(OptOps.LOCAL, axis, ELEMENTWISE_BLOCK), f"blocks of {ELEMENTWISE_BLOCK} threads",
               axis=axis, size=k.full_shape[axis]):
    return True
  k.restore(snap)
  decide(k, rule, "the UPCAST or LOCAL was refused: the spec's rules decide", **facts)
  return False

def _row_reduce(k: Kernel) -> bool:
  """More than MANY_OUTPUTS rows each reduced along one axis that is unit-stride in every input (a row sum): ROW_GROUP
  threads of a block split each row (GROUPTOP: neighbouring threads read neighbouring elements, so loads coalesce,
  and every SM gets blocks), each unrolling ROW_UNROLL steps of its share."""
  rule = "cuda.row_reduce"
  if k.reduceop is None or k.reduceop.op not in (ReduceOps.SUM, ReduceOps.MAX):
    decide(k, rule, "not a SUM or MAX reduce")
    return False
  if k.shape_len - k.first_reduce != 1:
    decide(k, rule, f"{k.shape_len - k.first_reduce} reduce axes, not 1", first_reduce=k.first_reduce)
    return False
  outputs = 1
  for n in k.full_shape[:k.first_reduce]:
    if not isinstance(n, int):
      decide(k, rule, "a symbolic output axis")
      return False
    outputs *= n
  size = k.full_shape[k.first_reduce]
  facts = {"outputs": outputs, "limit": MANY_OUTPUTS, "axis": k.first_reduce, "size": size,
           "buffer_strides": buffer_strides(k, k.first_reduce)}
  if outputs <= MANY_OUTPUTS or not isinstance(size, int) or size % (ROW_GROUP * ROW_UNROLL):
    decide(k, rule, f"at most {MANY_OUTPUTS} outputs, or a reduce axis no multiple of {ROW_GROUP * ROW_UNROLL}",
           **facts)
    return False
  if not all(strides(k, i)[k.first_reduce] == 1 for i in input_bufs(k)):
    decide(k, rule, "the reduce axis is not unit-stride in every input", **facts)
    return False
  snap = k.snapshot()
  if try_apply(k, rule, Opt(OptOps.GROUPTOP, 0, ROW_GROUP), f"{ROW_GROUP} threads split each row", **facts) and \
     try_apply(k, rule, Opt(OptOps.UNROLL, 1, ROW_UNROLL), f"each unrolls {ROW_UNROLL} steps of its share",
               axis=k.first_reduce + 1, size=k.full_shape[k.first_reduce + 1]):
    return True
  k.restore(snap)
  decide(k, rule, "the GROUPTOP or UNROLL was refused", **facts)
  return False

register_heuristics("cuda_gpu", hand_coded_cuda)
