"""The optimized AST a Kernel hands the lowerer: each buffer viewed through its optimized tracker, reduce args set to
the reduced axes, GROUP reduces split through a local buffer, tensor-core reduces replaced by WMMA over operands
permuted into the vendor's layout, and KernelInfo on the KERNEL. Imports dtype, errors, shape/, ops, renderers,
helpers, loop_nest and tensor_core_fit."""
from __future__ import annotations
import functools
from dataclasses import replace
from typing import Callable, Optional
from kernopt import ops
from kernopt.dtype import dtypes
from kernopt.errors import UnsupportedError
from kernopt.helpers import prod
from kernopt.loop_nest import LoopNest
from kernopt.ops import BinaryOps, BufferOps, KernelInfo, LazyOp, MemBuffer, MetaOps, ReduceOps, UnaryOps
from kernopt.renderers import TensorCore
from kernopt.shape.shapetracker import ShapeTracker
from kernopt.tensor_core_fit import fix_tc_st

def optimized_ast(k: LoopNest) -> LazyOp:
  """k's AST as its Opts shaped it (Kernel.get_optimized_ast caches it per state)."""
  memo: dict[tuple[LazyOp, int], LazyOp] = {}
  fixes: dict[int, Optional[Callable[[ShapeTracker], ShapeTracker]]] = {0: None}
  reduce_index = {r: i for i, r in enumerate(k.reduceops)}

  def fix(op: LazyOp, which: int = 0) -> LazyOp:
    if (key := (op, which)) not in memo:
      if type(op.op) is not ReduceOps:
        # the ops under op up to the next reduces first, children before parents: a chain costs no recursion
        below = ops.walk_ops(op, lambda x: type(x.op) is not ReduceOps and (x, which) not in memo)
        for x in below[:-1]: memo[(x, which)] = rebuild(x, which)
      memo[key] = rebuild(op, which)
    return memo[key]

  def rebuild(op: LazyOp, which: int) -> LazyOp:
    if op.op in BufferOps:
      st = k.sts[k.buf_index[op.arg]]
      fn = fixes[which]
      return LazyOp(op.op, tuple(fix(s, which) for s in op.src), replace(op.arg, st=fn(st) if fn else st))
    if op.op is MetaOps.KERNEL:
      return LazyOp(op.op, tuple(fix(s, which) for s in op.src),
                    KernelInfo(k.local_dims, k.upcasted, k.dont_use_locals))
    if op.op not in ReduceOps: return LazyOp(op.op, tuple(fix(s, which) for s in op.src), op.arg)
    base = len(k.bufs) + 2 * reduce_index[op]
    out_st, in_st = k.sts[base], k.sts[base + 1]
    axes = tuple(i for i in range(k.first_reduce + k.group_for_reduces, k.shape_len)
                 if out_st.shape[i] != in_st.shape[i])
    if (tc := k.tensor_core) is not None and op in k.bufs_for_tensor_core:
      return wmma(op, tc, axes, which)
    first = LazyOp(op.op, tuple(fix(s, which) for s in op.src), axes)
    if not k.group_for_reduces: return first
    return group(op, first)

  def wmma(op: LazyOp, tc: TensorCore, axes: tuple[int, ...], which: int) -> LazyOp:
    if which != 0: raise UnsupportedError("nested tensor-core reduces are not supported")
    layout = tc.layout
    if layout is None: raise UnsupportedError(f"{tc} on {k.opts.caps.device} has no tensor-core layout")
    mul = op.src[0].src[0] if op.src[0].op is UnaryOps.CAST else op.src[0]
    assert mul.op is BinaryOps.MUL, f"tensor-core reduce over {mul.op}"
    wd, tcd = k.global_dims, k.shape_len - k.upcasted
    fixes[1] = functools.partial(fix_tc_st, layout, layout.perm_a, wd, tcd)
    fixes[2] = functools.partial(fix_tc_st, layout, layout.perm_b, wd, tcd) if layout.perm_b else None
    reduce_axes = tuple(tcd + r for r in layout.reduce)
    ua, ub, uc = layout.upcast
    arg = ops.WMMAArg(name=str(tc), dims=tc.dims, dtype_in=tc.dtype_in, dtype_out=tc.dtype_out,
                      thread_local_sizes=tuple(prod(x) for x in tc.thread_local_sizes), device=k.opts.caps.device,
                      upcast_axes=(tcd + ua, tcd + ub, tcd + uc), reduce_axes=reduce_axes)
    ret = LazyOp(ReduceOps.WMMA, (fix(mul.src[0], 1), fix(mul.src[1], 2)), arg)
    rest = tuple(i for i in axes if i not in reduce_axes)
    return LazyOp(op.op, (ret,), rest) if rest else ret

  def group(op: LazyOp, first: LazyOp) -> LazyOp:
    gd, ld, gfr, fr = k.global_dims, k.local_dims, k.group_for_reduces, k.first_reduce
    reduce_loops = k.shape_len - k.upcasted - gfr - fr
    local_shape = (1,) * gd + k.full_shape[gd:gd + ld + gfr] + (1,) * reduce_loops + \
                  tuple(x[0] for x in k.upcasted_axis(0))
    dt = first.dtype
    assert dt is not None, "a reduce op always has a dtype"
    # a half or bfloat16 SUM's partial sums stay float32 through the local buffer, rounded once at the end as without
    # the GROUP (lower_reduce): a partial rounded to half overflows where the whole sum doesn't
    wide = op.op is ReduceOps.SUM and dt in (dtypes.half, dtypes.bfloat16)
    if wide: first = LazyOp(op.op, (LazyOp(UnaryOps.CAST, first.src, dtypes.float32),), first.arg)
    local = MemBuffer(-1, dtypes.float32 if wide else dt, ShapeTracker.from_shape(local_shape))
    store = LazyOp(BufferOps.STORE, (first,), local)
    ret = LazyOp(op.op, (LazyOp(BufferOps.LOAD, (store,), local),), tuple(range(fr, fr + gfr)))
    return LazyOp(UnaryOps.CAST, (ret,), dt) if wide else ret

  return fix(k.ast)
