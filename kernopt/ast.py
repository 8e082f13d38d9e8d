"""Builders for kernel ASTs, the public way to write what a framework hands kernopt (docs/ast.md).

An AST is one KERNEL (the SINK) whose sources are STOREs of the same shape. Every op has a shape: a LOAD or CONST
its ShapeTracker's, an elementwise op its sources' (which must all be equal), a reduce its source's with the reduced
axes kept as 1. So an op that consumes a reduce works at the reduce's keep-dims shape: after `sum(x, 1)` over
(4, 8), add a bias loaded as (4, 1), not (4, 8) or (4,). Nothing broadcasts implicitly; movement ops
(`reshape`, `permute`, `expand`, `pad`, `shrink`, `stride`, `compose`) change the views of loads and consts.

    from kernopt import ast as A, dtypes
    x = A.load(1, dtypes.float, (4, 8))
    out = A.kernel(A.store(0, A.add(A.sum(x, 1), A.load(2, dtypes.float, (4, 1)))))

Builders check shapes and dtypes as they go and raise VerifyError naming the op and both shapes or dtypes; `kernel`
runs `verify_lazyop` on the whole tree. Python numbers may stand for operands of ALU ops: they become CONSTs of the
other operand's dtype and shape. Imports dtype, errors, ops and shape/; no numpy."""
from __future__ import annotations
import dataclasses
import math
import weakref
from typing import Any, Callable, Optional, Sequence, Union
from kernopt.dtype import DType, ImageDType, dtypes
from kernopt.errors import ShapeError, VerifyError
from kernopt.ops import (BinaryOps, BufferOps, ConstBuffer, LazyOp, MemBuffer, MetaOps, ReduceOps, TernaryOps, UnaryOps,
                         load_ast as load_file, print_tree, save_ast as save,
                         verify_lazyop)
from kernopt.shape.shapetracker import ShapeTracker
from kernopt.shape.symbolic import Node, Variable, sint
from kernopt.shape.view import View

__all__ = ["view", "shape_of", "load", "const", "store", "kernel", "sink", "alu", "neg", "exp2", "log2", "sin",
           "sqrt", "recip", "add", "sub", "mul", "div", "idiv", "mod", "maximum", "cmplt", "cmpne", "xor", "and_",
           "or_", "shl", "shr", "where", "mulacc", "cast", "bitcast", "reduce", "sum", "max", "reshape", "permute",
           "expand", "pad", "shrink", "stride", "compose", "save", "load_file", "print_tree",
           "LazyOp", "ShapeTracker", "View", "Variable",
           "dtypes"]

ShapeLike = Union[Sequence[sint], ShapeTracker]
Operand = Union[LazyOp, bool, int, float, Node]
Axis = Union[int, Sequence[int]]

def _fmt(shape: tuple[Any, ...]) -> str:
  return "(" + ", ".join(str(s) for s in shape) + ("," if len(shape) == 1 else "") + ")"

def view(shape: Sequence[sint], strides: Optional[Sequence[sint]] = None, offset: sint = 0,
         mask: Optional[Sequence[tuple[sint, sint]]] = None) -> ShapeTracker:
  """A one-view ShapeTracker with explicit strides (None: contiguous; 0 broadcasts an axis), offset and mask (per axis
  [begin, end) of the valid positions; elsewhere a load reads 0)."""
  return ShapeTracker((View.create(tuple(shape), None if strides is None else tuple(strides), offset,
                                   None if mask is None else tuple((b, e) for b, e in mask)),))

def _st(shape_or_st: ShapeLike, what: str) -> ShapeTracker:
  if isinstance(shape_or_st, ShapeTracker): return shape_or_st
  if isinstance(shape_or_st, (str, bytes)) or not isinstance(shape_or_st, Sequence):
    raise VerifyError(f"{what} needs a shape (a tuple of ints or Variables) or a ShapeTracker, got {shape_or_st!r}")
  return ShapeTracker.from_shape(tuple(shape_or_st))

def _dtype(dtype: Any, what: str) -> DType:
  if not isinstance(dtype, DType): raise VerifyError(f"{what} needs a DType (e.g. dtypes.float), got {dtype!r}")
  return dtype

def _buffer_idx(idx: Any, what: str) -> int:
  if isinstance(idx, bool) or not isinstance(idx, int) or idx < 0:
    raise VerifyError(f"{what} needs a buffer index >= 0, got {idx!r}")
  return idx

def shape_of(x: LazyOp) -> tuple[sint, ...]:
  """The shape of op x: its buffer's for LOAD/CONST/STORE, its first source's for an elementwise op, and its
  source's with the reduced axes set to 1 for a reduce."""
  if not isinstance(x, LazyOp): raise VerifyError(f"expected a LazyOp, got {type(x).__name__} {x!r}")
  # down the first sources to an op whose shape is known, then back up; remembered per op, so building a chain of
  # n ops op by op costs O(n), without recursion
  path: list[LazyOp] = []
  while (shape := _SHAPES.get(x)) is None:
    if x.op in BufferOps and not (x.op is BufferOps.LOAD and x.src):
      shape = x.arg.st.shape
      break
    if not x.src or (x.op is BufferOps.LOAD and not x.src[0].src): raise VerifyError(f"{x.op} has no sources")
    path.append(x)
    x = x.src[0].src[0] if x.op is BufferOps.LOAD else x.src[0]  # a local buffer: its stored value's shape
  for y in reversed(path):
    if y.op in ReduceOps:
      axes = y.arg.reduce_axes if y.op is ReduceOps.WMMA else y.arg
      shape = tuple(1 if i in axes else s for i, s in enumerate(shape))
    _SHAPES[y] = shape
  return shape

_SHAPES: weakref.WeakKeyDictionary[LazyOp, tuple[sint, ...]] = weakref.WeakKeyDictionary()

def _value_dtype(x: LazyOp) -> Any:
  """The dtype of x's values: an image's base type for a LOAD of an image."""
  return x.dtype.base if isinstance(x.dtype, ImageDType) else x.dtype

def _has_reduce(x: LazyOp) -> bool: return any(y.op in ReduceOps for y in x.lazyops)

# ***** buffers *****

def load(idx: int, dtype: DType, shape_or_st: ShapeLike) -> LazyOp:
  """LOAD of buffer `idx` (a kernel argument) of `dtype`, viewed contiguously as a shape or through a ShapeTracker."""
  mb = MemBuffer(_buffer_idx(idx, "load"), _dtype(dtype, "load"), _st(shape_or_st, "load"))
  return LazyOp(BufferOps.LOAD, (), mb)

def _const_val(val: Any, dtype: DType) -> Any:
  if isinstance(val, Node): return val
  if not isinstance(val, (bool, int, float)):
    raise VerifyError(f"const value must be a bool, int, float or symbolic node, got {type(val).__name__} {val!r}")
  dt = dtype.scalar()
  if dtypes.is_float(dt):
    try: return float(val)
    except OverflowError: raise VerifyError(f"const {str(val)[:40]}... does not fit a float {dt}") from None
  if dt == dtypes.bool:
    if val not in (0, 1): raise VerifyError(f"const {val!r} is not a bool")
    return bool(val)
  if isinstance(val, float) and not (math.isfinite(val) and val.is_integer()):
    raise VerifyError(f"const {val!r} is not an integer: it cannot be a {dt} (cast a float const instead)")
  if not dtypes.min(dt) <= int(val) <= dtypes.max(dt):
    raise VerifyError(f"const {val!r} is out of range for {dt} [{dtypes.min(dt)}, {dtypes.max(dt)}]")
  return int(val)

def const(val: Union[bool, int, float, Node], dtype: DType, shape_or_st: ShapeLike) -> LazyOp:
  """CONST `val` of `dtype`, broadcast (stride 0) to a shape, or viewed through a given ShapeTracker.
  `val` may be a symbolic expression of the kernel's Variables (`Variable("n", 1, 64)`, `n * 2`), e.g. the 1/n of a
  mean over a symbolic axis (`recip(cast(const(n, dtypes.int32, shape), dtypes.float))`, or `const(n, dtypes.float,
  shape)`: the float value of n). It renders from the launch's var_vals (docs/fusion.md)."""
  dtype = _dtype(dtype, "const")
  if isinstance(shape_or_st, ShapeTracker): st = shape_or_st
  else:
    shape = _st(shape_or_st, "const").shape
    st = view(shape, (0,) * len(shape))
  return LazyOp(BufferOps.CONST, (), ConstBuffer(_const_val(val, dtype), dtype, st))

def store(idx: int, value: LazyOp, shape_or_st: Optional[ShapeLike] = None, dtype: Optional[DType] = None) -> LazyOp:
  """STORE of `value` into buffer `idx`: contiguous in value's shape by default, else through the given shape or
  ShapeTracker (whose shape must equal value's). `dtype` defaults to value's; a different one is refused (cast the
  value first) except an image type whose base is value's dtype."""
  idx = _buffer_idx(idx, "store")
  if not isinstance(value, LazyOp) or value.op in (BufferOps.STORE, MetaOps.KERNEL):
    raise VerifyError(f"store to buffer {idx} needs a value op (a load, const, ALU op or reduce), got {value!r}")
  shape = shape_of(value)
  st = ShapeTracker.from_shape(shape) if shape_or_st is None else _st(shape_or_st, "store")
  if st.shape != shape:
    hint = " (a reduce keeps its reduced axes as 1)" if _has_reduce(value) else ""
    raise VerifyError(f"store to buffer {idx} of shape {_fmt(st.shape)} from {_name(value.op)} of shape "
                      f"{_fmt(shape)}{hint}")
  dt = _value_dtype(value) if dtype is None else _dtype(dtype, "store")
  base = dt.base if isinstance(dt, ImageDType) else dt
  if base != _value_dtype(value):
    raise VerifyError(f"store to buffer {idx} of {dt} from a {value.dtype} value: cast it first (cast(value, {dt}))")
  return LazyOp(BufferOps.STORE, (value,), MemBuffer(idx, dt, st))

def kernel(*stores: LazyOp, verify: bool = True) -> LazyOp:
  """The KERNEL (SINK) of one or more STOREs to distinct buffers, all of the same shape; checked with
  `verify_lazyop` unless verify=False."""
  for s in stores:
    if not isinstance(s, LazyOp) or s.op is not BufferOps.STORE:
      got = s.op if isinstance(s, LazyOp) else type(s).__name__
      raise VerifyError(f"kernel takes STOREs (wrap a value with store(idx, value)), got {got}")
  ast = LazyOp(MetaOps.KERNEL, tuple(stores))
  if verify: verify_lazyop(ast)
  return ast

sink = kernel

# ***** ALU ops *****

_BITWISE = (BinaryOps.XOR, BinaryOps.AND, BinaryOps.OR, BinaryOps.SHL, BinaryOps.SHR)
_ALU = (UnaryOps, BinaryOps, TernaryOps)
_ARITY = {UnaryOps: 1, BinaryOps: 2, TernaryOps: 3}

def _name(op: Any) -> str: return op.name.lower()

def _operands(op: Any, srcs: tuple[Operand, ...]) -> tuple[LazyOp, ...]:
  """srcs with Python numbers (and symbolic nodes) turned into CONSTs of the other operands' shape and dtype."""
  ops = [s for s in srcs if isinstance(s, LazyOp)]
  if not ops: raise VerifyError(f"{_name(op)} needs at least one LazyOp operand, got {srcs!r}")
  for s in srcs:
    if not isinstance(s, (LazyOp, bool, int, float, Node)):
      raise VerifyError(f"{_name(op)} operands are LazyOps, numbers or symbolic nodes, got {type(s).__name__} {s!r}")
    if isinstance(s, LazyOp) and (s.op in (BufferOps.STORE, MetaOps.KERNEL)):
      raise VerifyError(f"{_name(op)} cannot take a {s.op} as an operand")
  shape = shape_of(ops[0])
  if op is TernaryOps.WHERE:
    branch = next((s for s in srcs[1:] if isinstance(s, LazyOp)), None)
    dts = [dtypes.bool] + [_value_dtype(branch) if branch is not None else dtypes.default_float] * 2
  else: dts = [_value_dtype(ops[0])] * len(srcs)
  return tuple(s if isinstance(s, LazyOp) else const(s, dt, shape) for s, dt in zip(srcs, dts))

def _check_shapes(op: Any, srcs: tuple[LazyOp, ...]) -> None:
  shapes = [shape_of(s) for s in srcs]
  for s, sh in zip(srcs[1:], shapes[1:]):
    if sh == shapes[0]: continue
    a, b = shapes[0], sh
    msg = f"{_name(op)}: operands disagree in shape: {_name(srcs[0].op)} {_fmt(a)} != {_name(s.op)} {_fmt(b)}"
    reduced = next((x for x in (srcs[0], s) if _has_reduce(x)), None)
    if reduced is not None:
      ks = _fmt(shape_of(reduced))
      msg += (f"; ops after a reduce work at its keep-dims shape {ks} (reduced axes kept as 1): load, reshape or "
              f"reduce the other operand to {ks}")
    elif len(a) != len(b): msg += f"; ranks differ ({len(a)} vs {len(b)}): reshape one to the other's rank"
    else: msg += "; nothing broadcasts implicitly: expand() the size-1 axes to the other shape"
    raise VerifyError(msg)

def _check_dtypes(op: Any, srcs: tuple[LazyOp, ...]) -> None:
  vals = srcs[1:] if op is TernaryOps.WHERE else srcs
  if op is TernaryOps.WHERE and _value_dtype(srcs[0]) != dtypes.bool:
    raise VerifyError(f"where: the condition must be bool, got {srcs[0].dtype} (compare it: cmpne(c, 0))")
  dts = [_value_dtype(s) for s in vals]
  if len(set(dts)) > 1:
    raise VerifyError(f"{_name(op)}: operands disagree in dtype: {' and '.join(map(str, dts))}; cast() one of them")
  if op in _BITWISE and not (dtypes.is_int(dts[0]) or dts[0] == dtypes.bool):
    raise VerifyError(f"{_name(op)} needs integer or bool operands, got {dts[0]}")

def alu(op: Union[UnaryOps, BinaryOps, TernaryOps], *srcs: Operand) -> LazyOp:
  """Elementwise `op` of srcs (same shape, same dtype; WHERE's condition bool). CAST/BITCAST: use cast/bitcast."""
  if type(op) not in _ALU or op in (UnaryOps.CAST, UnaryOps.BITCAST):
    raise VerifyError(f"alu takes a UnaryOps/BinaryOps/TernaryOps member other than CAST and BITCAST, got {op!r}")
  if len(srcs) != _ARITY[type(op)]:
    raise VerifyError(f"{_name(op)} takes {_ARITY[type(op)]} operand(s), got {len(srcs)}")
  lops = _operands(op, srcs)
  _check_shapes(op, lops)
  _check_dtypes(op, lops)
  return LazyOp(op, lops)

def neg(x: LazyOp) -> LazyOp:
  """-x (logical not on bool; wraps on unsigned ints)."""
  return alu(UnaryOps.NEG, x)
def exp2(x: LazyOp) -> LazyOp: return alu(UnaryOps.EXP2, x)
def log2(x: LazyOp) -> LazyOp: return alu(UnaryOps.LOG2, x)
def sin(x: LazyOp) -> LazyOp: return alu(UnaryOps.SIN, x)
def sqrt(x: LazyOp) -> LazyOp: return alu(UnaryOps.SQRT, x)
def recip(x: LazyOp) -> LazyOp: return alu(UnaryOps.RECIP, x)

def add(a: Operand, b: Operand) -> LazyOp: return alu(BinaryOps.ADD, a, b)
def mul(a: Operand, b: Operand) -> LazyOp: return alu(BinaryOps.MUL, a, b)

def sub(a: Operand, b: Operand) -> LazyOp:
  """a - b, built as ADD(a, NEG(b)) (there is no SUB op); refused on bool, where NEG is logical not."""
  a, b = _operands(BinaryOps.ADD, (a, b))
  if b.dtype == dtypes.bool: raise VerifyError("sub of bool operands: NEG of a bool is logical not; cast them first")
  return add(a, neg(b))

def idiv(a: Operand, b: Operand) -> LazyOp:
  """IDIV: IEEE true division on floats; on ints it truncates toward zero, and x / 0 gives 0."""
  return alu(BinaryOps.IDIV, a, b)
div = idiv

def mod(a: Operand, b: Operand) -> LazyOp:
  """MOD: on ints the remainder takes the dividend's sign and x % 0 gives 0; on floats it is C's fmod."""
  return alu(BinaryOps.MOD, a, b)

def maximum(a: Operand, b: Operand) -> LazyOp:
  """Elementwise MAX: a > b ? a : b. (`max(x, axis)` is the reduce.)"""
  return alu(BinaryOps.MAX, a, b)
def cmplt(a: Operand, b: Operand) -> LazyOp:
  """a < b, a bool."""
  return alu(BinaryOps.CMPLT, a, b)
def cmpne(a: Operand, b: Operand) -> LazyOp:
  """a != b, a bool."""
  return alu(BinaryOps.CMPNE, a, b)
def xor(a: Operand, b: Operand) -> LazyOp: return alu(BinaryOps.XOR, a, b)
def and_(a: Operand, b: Operand) -> LazyOp: return alu(BinaryOps.AND, a, b)
def or_(a: Operand, b: Operand) -> LazyOp: return alu(BinaryOps.OR, a, b)
def shl(a: Operand, b: Operand) -> LazyOp:
  """a << b, the count taken modulo a's bit width."""
  return alu(BinaryOps.SHL, a, b)
def shr(a: Operand, b: Operand) -> LazyOp:
  """a >> b (arithmetic on signed ints), the count taken modulo a's bit width."""
  return alu(BinaryOps.SHR, a, b)

def where(cond: Operand, a: Operand, b: Operand) -> LazyOp:
  """cond ? a : b; cond is bool, a and b share a dtype."""
  return alu(TernaryOps.WHERE, cond, a, b)
def mulacc(a: Operand, b: Operand, c: Operand) -> LazyOp:
  """a * b + c."""
  return alu(TernaryOps.MULACC, a, b, c)

def cast(x: LazyOp, dtype: DType) -> LazyOp:
  """x converted to dtype by value (float -> int truncates; out of range is unspecified)."""
  shape_of(x)
  return LazyOp(UnaryOps.CAST, (x,), _dtype(dtype, "cast"))

def bitcast(x: LazyOp, dtype: DType) -> LazyOp:
  """x's bits reinterpreted as dtype, which must have the same item size."""
  shape_of(x)
  dtype = _dtype(dtype, "bitcast")
  src = _value_dtype(x)
  if src is not None and src.itemsize != dtype.itemsize:
    raise VerifyError(f"bitcast from {src} ({src.itemsize} bytes) to {dtype} ({dtype.itemsize} bytes) "
                      "changes the item size")
  return LazyOp(UnaryOps.BITCAST, (x,), dtype)

# ***** reduces *****

def reduce(op: ReduceOps, x: LazyOp, axis: Axis) -> LazyOp:
  """Reduce x over `axis` (an int or a sequence; negative counts from the end). The result keeps x's rank, with
  the reduced axes 1: sum over axis 1 of (m, n) has shape (m, 1), and ops that consume it work at that shape."""
  if op not in (ReduceOps.SUM, ReduceOps.MAX): raise VerifyError(f"reduce takes ReduceOps.SUM or MAX, got {op!r}")
  if isinstance(axis, LazyOp):
    raise VerifyError(f"{_name(op)}(x, axis) reduces over axes; for elementwise MAX of two ops use maximum(a, b)")
  shape = shape_of(x)
  axes = (axis,) if isinstance(axis, int) else tuple(axis) if isinstance(axis, Sequence) else None
  if axes is None or not axes or any(isinstance(a, bool) or not isinstance(a, int) for a in axes):
    raise VerifyError(f"{_name(op)} needs an int axis or a non-empty sequence of them, got {axis!r}")
  for a in axes:
    if not -len(shape) <= a < len(shape):
      raise VerifyError(f"{_name(op)}: axis {a} is out of range for shape {_fmt(shape)}")
  norm = tuple(sorted(a % len(shape) for a in axes))
  if len(set(norm)) != len(norm): raise VerifyError(f"{_name(op)}: axis {axis!r} repeats an axis of {_fmt(shape)}")
  return LazyOp(op, (x,), norm)

def sum(x: LazyOp, axis: Axis) -> LazyOp:
  """SUM of x over axis, keeping dims (see reduce)."""
  return reduce(ReduceOps.SUM, x, axis)

def max(x: LazyOp, axis: Axis) -> LazyOp:
  """MAX of x over axis, keeping dims (see reduce); elementwise MAX is maximum(a, b)."""
  return reduce(ReduceOps.MAX, x, axis)

# ***** movement ops on views *****

def _move(x: LazyOp, name: str, fn: Callable[[ShapeTracker], ShapeTracker], masks: bool = False) -> LazyOp:
  """x with fn applied to the view of each of its loads and consts, through elementwise ops unless fn `masks`."""
  memo: dict[LazyOp, LazyOp] = {}
  def walk(y: LazyOp) -> LazyOp:
    if (r := memo.get(y)) is not None: return r
    if y.op in (BufferOps.LOAD, BufferOps.CONST) and not y.src:
      r = LazyOp(y.op, (), dataclasses.replace(y.arg, st=fn(y.arg.st)))
    elif type(y.op) in _ALU and not masks: r = LazyOp(y.op, tuple(walk(s) for s in y.src), y.arg)
    elif type(y.op) in _ALU:
      raise VerifyError(f"{name} applies to loads and consts, not to a computed {_name(y.op)} (padding must give 0, "
                        "but padding its loads computes the op on 0): pad the loads, then compute")
    elif y.op in ReduceOps:
      raise VerifyError(f"{name} of a reduce: its keep-dims shape {_fmt(shape_of(y))} is fixed inside a kernel; move "
                        "the reduce's input before reducing, and load other operands at the reduce's shape")
    else: raise VerifyError(f"{name} applies to loads, consts and elementwise ops of them, not to a {y.op}")
    memo[y] = r
    return r
  return walk(x)

def _pairs(arg: Any, name: str, st: ShapeTracker) -> tuple[tuple[sint, sint], ...]:
  if isinstance(arg, Sequence) and all(isinstance(p, Sequence) and len(p) == 2 for p in arg):
    return tuple((p[0], p[1]) for p in arg)
  raise ShapeError(f"{name} needs one (begin, end) pair per axis of {_fmt(st.shape)}, got {arg!r}")

def compose(x: LazyOp, st: ShapeTracker) -> LazyOp:
  """x viewed through `st`, which indexes x's elements in C order (`x_st + st`: views stack, then simplify). Reads
  a sliding window, for one: over a (n,) load, view((n - 2, 3), (1, 1)) gives (i, k) -> x[i + k]. A masked `st`
  pads, so like pad it applies to a load or const only."""
  if not isinstance(st, ShapeTracker): raise VerifyError(f"compose needs a ShapeTracker, got {st!r}")
  masked, hi = any(v.mask is not None for v in st.views), st.real_size()
  def fn(base: ShapeTracker) -> ShapeTracker:
    if type(base.size) is int and hi > base.size:
      raise ShapeError(f"compose: a view of shape {_fmt(st.shape)} reads element {hi - 1} of a view of shape "
                       f"{_fmt(base.shape)} (size {base.size})")
    return base + st
  return _move(x, "compose with a mask" if masked else "compose", fn, masked)

def reshape(x: LazyOp, shape: Sequence[sint]) -> LazyOp:
  """x's elements in C order over `shape` (same size). Acts on the views of x's loads and consts."""
  return _move(x, "reshape", lambda st: st.reshape(shape))

def permute(x: LazyOp, order: Sequence[int]) -> LazyOp:
  """New axis i is x's axis order[i]."""
  return _move(x, "permute", lambda st: st.permute(order))

def expand(x: LazyOp, shape: Sequence[sint]) -> LazyOp:
  """Broadcast x's size-1 axes to `shape` (stride 0); other axes keep their size."""
  return _move(x, "expand", lambda st: st.expand(shape))

def pad(x: LazyOp, padding: Sequence[tuple[sint, sint]]) -> LazyOp:
  """(before, after) positions added around each axis, where a load reads 0. Only on a load or const."""
  return _move(x, "pad", lambda st: st.pad(_pairs(padding, "pad", st)), True)

def shrink(x: LazyOp, arg: Sequence[tuple[sint, sint]]) -> LazyOp:
  """Keep positions [begin, end) of each axis."""
  return _move(x, "shrink", lambda st: st.shrink(_pairs(arg, "shrink", st)))

def stride(x: LazyOp, mul: Sequence[int]) -> LazyOp:
  """Every |mul[i]|-th position of axis i, from the end when mul[i] < 0 (stride -1 flips an axis)."""
  return _move(x, "stride", lambda st: st.stride(mul))


