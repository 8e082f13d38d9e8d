"""Verification of a kernel AST (`verify_lazyop`: every op's ShapeTracker, its sources' shapes and dtypes, its
constants' ranges) and its cost (`get_lazyop_info`: output shape and dtype, flops, bytes per buffer).
Imports dtype, errors, helpers, shape/, lazyop and alu."""
from __future__ import annotations
import math
from dataclasses import dataclass
from typing import Any, Optional, Union
from kernopt.alu import truncate_float
from kernopt.dtype import DType, ImageDType, dtypes
from kernopt.errors import VerifyError
from kernopt.helpers import prod
from kernopt.lazyop import (BinaryOps, BufferOps, ConstBuffer, KernelInfo, LazyOp, MemBuffer, MetaOps, ReduceOps,
                            TernaryOps, UnaryOps, WMMAArg, shape_str, walk_ops)
from kernopt.shape import symbolic
from kernopt.shape.shapetracker import ShapeTracker

# ***** verification: every op's ShapeTracker *****

_ARITY: dict[type, int] = {UnaryOps: 1, BinaryOps: 2, TernaryOps: 3}

def _reduced(shape: tuple[Any, ...], axes: Any, op: LazyOp) -> tuple[Any, ...]:
  if not isinstance(axes, tuple) or not all(isinstance(a, int) and not isinstance(a, bool) for a in axes):
    raise VerifyError(f"{op.op} needs a tuple of int axes, got {axes!r}")
  if len(set(axes)) != len(axes): raise VerifyError(f"{op.op} repeats an axis in {axes} over shape {shape_str(shape)}")
  for a in axes:
    if not 0 <= a < len(shape): raise VerifyError(f"{op.op} axis {a} is out of range for shape {shape_str(shape)}")
  return tuple(1 if i in axes else s for i, s in enumerate(shape))

MAX_ELEMENTS = 2**63 - 1   # the most elements a kernel's iteration space may span: its indices are int64 at most
_WALKED = frozenset((UnaryOps, BinaryOps, TernaryOps, ReduceOps))

class _Verifier:
  """Walks an AST once, children first, recording each op's ShapeTracker in `sts`."""
  def __init__(self) -> None: self.sts: dict[LazyOp, ShapeTracker] = {}

  def visit(self, op: Any, local_ok: bool = False) -> ShapeTracker:
    if not isinstance(op, LazyOp): raise VerifyError(f"an AST source must be a LazyOp, got {type(op).__name__} {op!r}")
    if (st := self.sts.get(op)) is not None: return st
    if type(op.op) in _WALKED:
      # the elementwise and reduce ops below op first, children before parents, so that the checks' own visits of
      # sources find them done: a 10,000-deep chain costs no Python recursion
      sts = self.sts
      for x in walk_ops(op, lambda x: type(x.op) in _WALKED and x not in sts)[:-1]: self._visit_one(x, False)
    return self._visit_one(op, local_ok)

  def _visit_one(self, op: LazyOp, local_ok: bool) -> ShapeTracker:
    if not isinstance(op.src, tuple):
      raise VerifyError(f"{op.op} needs a tuple of sources, got {type(op.src).__name__}")
    for x in op.src:
      if not isinstance(x, LazyOp):
        raise VerifyError(f"{op.op} has a source that is not a LazyOp: {type(x).__name__} {x!r}")
    st = self._check(op, local_ok)
    self.sts[op] = st
    return st

  def _buffer_arg(self, op: LazyOp, kind: type[Union[MemBuffer, ConstBuffer]]) -> Any:
    arg = op.arg
    if not isinstance(arg, kind):
      raise VerifyError(f"{op.op} needs a {kind.__name__} arg, got {type(arg).__name__} {arg!r}")
    if not isinstance(arg.st, ShapeTracker): raise VerifyError(f"{op.op} buffer has no ShapeTracker: {arg.st!r}")
    if not isinstance(arg.dtype, DType): raise VerifyError(f"{op.op} buffer has no DType: {arg.dtype!r}")
    if isinstance(arg, MemBuffer) and (isinstance(arg.idx, bool) or not isinstance(arg.idx, int) or arg.idx < -1):
      raise VerifyError(f"{op.op} buffer index must be an int >= -1, got {arg.idx!r}")
    if (n := prod(d for d in arg.st.shape if isinstance(d, int))) > MAX_ELEMENTS:
      raise VerifyError(f"{op.op} of shape {shape_str(arg.st.shape)} spans {n} elements, more than int64 indices "
                        f"address ({MAX_ELEMENTS})")
    return arg

  def _check(self, op: LazyOp, local_ok: bool) -> ShapeTracker:
    if op.op is MetaOps.KERNEL: raise VerifyError("a KERNEL can only be the root of an AST")
    if op.op is BufferOps.CONST:
      buf = self._buffer_arg(op, ConstBuffer)
      if op.src: raise VerifyError(f"CONST takes no sources, got {len(op.src)}")
      if isinstance(buf.val, symbolic.Node): _check_symbolic_const(buf)
      elif not isinstance(buf.val, (int, float)): raise VerifyError(f"CONST value must be a number, got {buf.val!r}")
      else: _check_const(buf)
      return buf.st
    if op.op is BufferOps.LOAD: return self._load(op)
    if op.op is BufferOps.STORE: return self._store(op, local_ok)
    if op.op is ReduceOps.WMMA:
      if not isinstance(op.arg, WMMAArg): raise VerifyError(f"WMMA needs a WMMAArg, got {op.arg!r}")
      shape = self._same_shapes(op, 2)
      if (dts := [_value_dtype(x) for x in op.src]) != [op.arg.dtype_in] * 2:
        raise VerifyError(f"WMMA of {op.arg.dtype_in} takes sources of {dts[0]} and {dts[1]}")
      return ShapeTracker.from_shape(_reduced(shape, tuple(op.arg.reduce_axes), op))
    if op.op in ReduceOps:
      if len(op.src) != 1: raise VerifyError(f"{op.op} takes 1 source, got {len(op.src)}")
      return ShapeTracker.from_shape(_reduced(self.visit(op.src[0]).shape, op.arg, op))
    if type(op.op) in _ARITY:
      if op.op in (UnaryOps.CAST, UnaryOps.BITCAST) and not isinstance(op.arg, DType):
        raise VerifyError(f"{op.op} needs a DType arg, got {op.arg!r}")
      self._same_shapes(op, _ARITY[type(op.op)])
      if op.op is UnaryOps.BITCAST and (src_dt := op.src[0].dtype) is not None and src_dt.itemsize != op.arg.itemsize:
        raise VerifyError(f"BITCAST from {src_dt} to {op.arg} changes the item size")
      if op.op not in (UnaryOps.CAST, UnaryOps.BITCAST): _check_alu_dtypes(op)
      return self.sts[op.src[0]]
    raise VerifyError(f"unknown op {op.op!r}")

  def _same_shapes(self, op: LazyOp, arity: int) -> tuple[Any, ...]:
    if len(op.src) != arity: raise VerifyError(f"{op.op} takes {arity} source{'s' * (arity > 1)}, got {len(op.src)}")
    shapes = [self.visit(x).shape for x in op.src]
    for x, s in zip(op.src[1:], shapes[1:]):
      if s != shapes[0]:
        raise VerifyError(f"{op.op} sources disagree in shape: "
                          f"{op.src[0].op} {shape_str(shapes[0])} != {x.op} {shape_str(s)}")
    return shapes[0]

  def _load(self, op: LazyOp) -> ShapeTracker:
    buf = self._buffer_arg(op, MemBuffer) if not isinstance(op.arg, ConstBuffer) else None
    if buf is None: raise VerifyError("LOAD of a ConstBuffer: use CONST")
    if buf.idx >= 0:
      if op.src: raise VerifyError(f"LOAD of buffer {buf.idx} takes no sources, got {len(op.src)}")
      return buf.st
    # a local buffer is loaded right after the STORE that fills it; the load has the stored value's shape
    if len(op.src) != 1 or op.src[0].op is not BufferOps.STORE or op.src[0].arg != buf:
      raise VerifyError("LOAD of a local buffer (idx -1) needs exactly one source: the STORE of that same buffer")
    self.visit(op.src[0], local_ok=True)
    return self.sts[op.src[0].src[0]]

  def _store(self, op: LazyOp, local_ok: bool) -> ShapeTracker:
    buf = self._buffer_arg(op, MemBuffer)
    if len(op.src) != 1: raise VerifyError(f"STORE to buffer {buf.idx} takes 1 source, got {len(op.src)}")
    if (buf.idx == -1) != local_ok:
      where = "directly under the KERNEL" if not local_ok else "inside the AST"
      raise VerifyError(f"STORE to buffer {buf.idx} is not allowed {where}")
    val = self.visit(op.src[0]).shape
    shape = buf.st.shape
    # a local buffer may be 1 on axes its workgroup doesn't own (the global axes)
    ok = val == shape if buf.idx >= 0 else len(val) == len(shape) and all(s == v or s == 1 for s, v in zip(shape, val))
    if not ok:
      raise VerifyError(f"STORE to buffer {buf.idx} of shape {shape_str(shape)} "
                        f"from {op.src[0].op} of shape {shape_str(val)}")
    if buf.idx >= 0 and (why := _collides(buf.st)) is not None:
      raise VerifyError(f"STORE to buffer {buf.idx} through {buf.st} writes some element more than once ({why}): "
                        f"which value lands there would depend on the device and the Opts")
    if _value_dtype(op.src[0]) != (base := buf.dtype.base if isinstance(buf.dtype, ImageDType) else buf.dtype):
      raise VerifyError(f"STORE to buffer {buf.idx} of {buf.dtype} from {op.src[0].op} of {op.src[0].dtype}: "
                        f"CAST the value to {base}")
    return buf.st

def _collides(st: ShapeTracker) -> Optional[str]:
  """Why some two valid positions of st address one element, or None when no view of it can: each view's axes of
  more than one valid position, sorted by |stride|, must each step past everything the smaller ones span (a
  permuted, flipped or padded layout passes; a broadcast or overlapping one does not). Symbolic strides or extents
  are not judged."""
  for v in st.views:
    spans: list[tuple[int, int]] = []
    for i, (size, stride) in enumerate(zip(v.shape, v.strides)):
      n = v.mask[i][1] - v.mask[i][0] if v.mask is not None else size
      if not (isinstance(n, int) and isinstance(stride, int)): return None
      if n <= 0: return None   # no valid position at all: nothing is written
      if n > 1: spans.append((abs(stride), n))
    reach = 0
    for stride, n in sorted(spans):
      if stride <= reach: return f"strides {v.strides} over shape {v.shape} overlap"
      reach += stride * (n - 1)
  return None

def _value_dtype(op: LazyOp) -> Optional[DType]:
  """The dtype of op's values: an image's base type for the LOAD of an image."""
  return op.dtype.base if isinstance(op.dtype, ImageDType) else op.dtype

_BITWISE = (BinaryOps.XOR, BinaryOps.AND, BinaryOps.OR)
_SHIFTS = (BinaryOps.SHL, BinaryOps.SHR)

def _check_alu_dtypes(op: LazyOp) -> None:
  """ALU operands share one dtype (CAST and BITCAST are the only conversions); WHERE's condition is bool; XOR, AND and
  OR take ints or bools, SHL and SHR ints."""
  vals = op.src
  if op.op is TernaryOps.WHERE:
    if (c := _value_dtype(op.src[0])) != dtypes.bool:
      raise VerifyError(f"WHERE needs a bool condition, got {op.src[0].op} of {c}")
    vals = op.src[1:]
  dts = [_value_dtype(x) for x in vals]
  if any(d != dts[0] for d in dts[1:]):
    got = " and ".join(f"{x.op} of {d}" for x, d in zip(vals, dts))
    raise VerifyError(f"{op.op} operands disagree in dtype: {got}; CAST one of them")
  if (dt := dts[0]) is None: return
  if op.op in _BITWISE and not (dtypes.is_int(dt.scalar()) or dt.scalar() == dtypes.bool):
    raise VerifyError(f"{op.op} needs int or bool operands, got {dt}")
  if op.op in _SHIFTS and not dtypes.is_int(dt.scalar()):
    raise VerifyError(f"{op.op} needs int operands, got {dt}")

def _check_const(buf: ConstBuffer) -> None:
  """A CONST's value is representable in its dtype: NaN and inf only for floats, ints in range, bools 0 or 1."""
  val, dt = buf.val, buf.dtype.scalar()
  if dtypes.is_float(dt):
    if isinstance(val, float) and math.isfinite(val) and math.isinf(truncate_float(val, dt)):
      raise VerifyError(f"CONST {val!r} overflows {buf.dtype}")
    return
  if dt == dtypes.bool:
    if not isinstance(val, bool) and not (type(val) is int and val in (0, 1)):
      raise VerifyError(f"CONST {val!r} is not a {buf.dtype} (True, False, 0 or 1)")
    return
  if isinstance(val, float) and not (math.isfinite(val) and val.is_integer()):
    raise VerifyError(f"CONST {val!r} is not representable in {buf.dtype}: only float types hold it")
  if dtypes.is_int(dt) and not dtypes.min(dt) <= val <= dtypes.max(dt):
    raise VerifyError(f"CONST {val!r} is out of range for {buf.dtype} [{dtypes.min(dt)}, {dtypes.max(dt)}]")

def _check_symbolic_const(buf: ConstBuffer) -> None:
  """A symbolic CONST is an int expression of Variables (symbolic nodes only divide non-negative values): its value
  in an int dtype, that value converted in a float one; its whole range must fit the dtype."""
  val, dt = buf.val, buf.dtype.scalar()
  assert isinstance(val, symbolic.Node)
  if dt == dtypes.bool or not (dtypes.is_int(dt) or dtypes.is_float(dt)):
    raise VerifyError(f"a symbolic CONST {val!r} needs an int or float dtype, got {buf.dtype}")
  stack: list[Any] = [val]
  while stack:
    n = stack.pop()
    if isinstance(n, (symbolic.LtNode, symbolic.AndNode)):
      raise VerifyError(f"a symbolic CONST {val!r} can't hold a comparison ({n!r})")
    if isinstance(n, symbolic.SumNode): stack.extend(n.nodes)
    elif isinstance(n, (symbolic.MulNode, symbolic.DivNode, symbolic.ModNode)):
      stack.extend(x for x in (n.a, n.b) if isinstance(x, symbolic.Node))
  if dtypes.is_int(dt) and not (dtypes.min(dt) <= val.min and val.max <= dtypes.max(dt)):
    raise VerifyError(f"CONST {val!r} in [{val.min}, {val.max}] is out of range for {buf.dtype} "
                      f"[{dtypes.min(dt)}, {dtypes.max(dt)}]")
  if dtypes.is_float(dt) and any(math.isinf(truncate_float(float(b), dt)) for b in (val.min, val.max)):
    raise VerifyError(f"CONST {val!r} in [{val.min}, {val.max}] overflows {buf.dtype}")

def verify_lazyop(ast: LazyOp) -> dict[LazyOp, ShapeTracker]:
  """Check that `ast` is a well-formed KERNEL and return the ShapeTracker of each op under it.
  Buffer ops have their buffer's st; elementwise ops the (common) shape of their sources; a reduce the shape of its
  source with the reduced axes set to 1; the LOAD of a local buffer (idx -1) the shape of the value its STORE wrote.
  The KERNEL's sources are STOREs to distinct buffers idx >= 0 whose shapes are all equal. Raises VerifyError."""
  if not isinstance(ast, LazyOp) or ast.op is not MetaOps.KERNEL:
    raise VerifyError(f"the root of an AST must be a KERNEL LazyOp, got {getattr(ast, 'op', type(ast).__name__)}")
  if ast.arg is not None and not isinstance(ast.arg, KernelInfo):
    raise VerifyError(f"KERNEL arg must be KernelInfo, got {ast.arg!r}")
  if not isinstance(ast.src, tuple) or not ast.src: raise VerifyError("a KERNEL needs at least one STORE")
  v = _Verifier()
  seen: dict[int, LazyOp] = {}
  for out in ast.src:
    if not isinstance(out, LazyOp) or out.op is not BufferOps.STORE:
      raise VerifyError(f"every source of a KERNEL must be a STORE, got {getattr(out, 'op', type(out).__name__)}")
    st = v.visit(out)
    if out.arg.idx in seen: raise VerifyError(f"two STOREs write buffer {out.arg.idx}")
    seen[out.arg.idx] = out
    first = ast.src[0].arg.st.shape
    if st.shape != first:
      raise VerifyError(f"KERNEL outputs disagree in shape: {shape_str(first)} != {shape_str(st.shape)}")
  _check_buffers(v.sts, seen)
  _check_variables(v.sts)
  return v.sts

def _check_variables(ops: dict[LazyOp, ShapeTracker]) -> None:
  """One range per Variable name: the name is the kernel's parameter and the launch's var_vals key (two Variables
  'q' of different ranges would be two Program.vars for one parameter)."""
  by_name: dict[str, Any] = {}
  for op in ops:
    if op.op not in (BufferOps.LOAD, BufferOps.STORE, BufferOps.CONST): continue
    found = set(op.arg.st.vars())
    if op.op is BufferOps.CONST and isinstance(op.arg.val, symbolic.Node): found |= op.arg.val.vars()
    for var in found:
      if ((other := by_name.setdefault(var.expr, var)).min, other.max) != (var.min, var.max):
        raise VerifyError(f"two Variables named {var.expr!r} with different ranges: [{other.min}, {other.max}] and "
                          f"[{var.min}, {var.max}]")

def _check_buffers(ops: dict[LazyOp, ShapeTracker], stored: dict[int, LazyOp]) -> None:
  """One dtype per global buffer index (its parameter has one type), and no LOAD of a buffer the kernel STOREs: its
  elements would be read by some lanes or threads after others wrote them (in-place kernels are not supported)."""
  dts: dict[int, DType] = {}
  for op in ops:
    if op.op not in (BufferOps.LOAD, BufferOps.STORE) or op.arg.idx < 0: continue
    idx, dt = op.arg.idx, op.arg.dtype
    if dts.setdefault(idx, dt) != dt: raise VerifyError(f"buffer {idx} is accessed as {dts[idx]} and as {dt}")
    if op.op is BufferOps.LOAD and idx in stored:
      raise VerifyError(f"buffer {idx} is both stored and loaded: in-place kernels are not supported (load a "
                        f"copy under another index)")

# ***** cost: flops and memory of an AST *****

@dataclass(frozen=True)
class LazyOpInfo:
  """The output `shape` and `dtype` of an AST, the scalar ALU operations it performs (`flops`) and the bytes each
  global buffer spans (`mem`: buffer idx -> real_size * itemsize; a buffer seen several times counts its widest
  view)."""
  shape: tuple[Any, ...]
  dtype: Optional[DType]
  flops: Any
  mem: dict[int, int]

FlopCounter = LazyOpInfo

def _op_flops(op: LazyOp, sts: dict[LazyOp, ShapeTracker]) -> Any:
  if op.op in (UnaryOps.CAST, UnaryOps.BITCAST) or op.op in BufferOps or op.op is MetaOps.KERNEL: return 0
  if op.op is ReduceOps.WMMA: return 2 * prod(sts[op.src[0]].shape)
  if op.op in ReduceOps: return prod(sts[op.src[0]].shape)
  return (2 if op.op is TernaryOps.MULACC else 1) * prod(sts[op].shape)

def _itemsize(dt: DType) -> int: return dt.base.itemsize if isinstance(dt, ImageDType) else dt.itemsize

def get_lazyop_info(ast: LazyOp) -> LazyOpInfo:
  """Cost of an AST (a KERNEL or any sub-tree of a valid one); each distinct op counts once.
  An elementwise op costs prod(its shape) (MULACC: twice that; CAST, BITCAST and buffer ops: nothing); a reduce costs
  prod(its source's shape), one combine per input element; WMMA costs 2*prod(its sources' shape). So SUM(MUL(a, b))
  over K with output M x N costs M*N*K + M*N*K = 2*M*N*K."""
  root = ast if ast.op is MetaOps.KERNEL else LazyOp(MetaOps.KERNEL, (ast,)) if ast.op is BufferOps.STORE else None
  if root is not None: sts = verify_lazyop(root)
  else:
    v = _Verifier()
    v.visit(ast)
    sts = v.sts
  flops: Any = 0
  mem: dict[int, int] = {}
  for op in ast.lazyops:
    flops = flops + _op_flops(op, sts)
    if op.op in (BufferOps.LOAD, BufferOps.STORE) and op.arg.idx >= 0:
      mem[op.arg.idx] = max(mem.get(op.arg.idx, 0), op.arg.st.real_size() * _itemsize(op.arg.dtype))
  out = ast.src[0] if ast.op is MetaOps.KERNEL else ast
  dtype = out.arg.dtype if out.op is BufferOps.STORE else out.dtype
  return LazyOpInfo(tuple(sts[out].shape), dtype, flops, mem)
