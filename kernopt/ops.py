"""The kernel AST: op enums, `LazyOp`, buffers, and the one table of op semantics (`exec_alu`) that constant
folding, the PYTHON interpreter and the renderers all follow. Imports dtype, helpers, errors and shape/."""
from __future__ import annotations
import functools
import hashlib
import json
import math
import numbers
import os
import reprlib
import struct
import sys
from dataclasses import dataclass, fields
from enum import Enum, auto
from typing import Any, Callable, Optional, TextIO, Union
from kernopt.dtype import ConstType, DType, ImageDType, dtypes, storage_dtype_error
from kernopt.errors import VerifyError
from kernopt.helpers import prod
from kernopt.shape import symbolic
from kernopt.shape.shapetracker import ShapeTracker
from kernopt.shape.view import View

class UnaryOps(Enum):
  EXP2 = auto(); LOG2 = auto(); CAST = auto(); BITCAST = auto() # noqa: E702
  SIN = auto(); SQRT = auto(); RECIP = auto(); NEG = auto() # noqa: E702
class BinaryOps(Enum):
  ADD = auto(); MUL = auto(); IDIV = auto(); MAX = auto(); MOD = auto(); CMPLT = auto(); CMPNE = auto() # noqa: E702
  XOR = auto(); SHL = auto(); SHR = auto(); AND = auto(); OR = auto() # noqa: E702
class TernaryOps(Enum):
  WHERE = auto(); MULACC = auto() # noqa: E702
class ReduceOps(Enum):
  SUM = auto(); MAX = auto(); WMMA = auto() # noqa: E702
class BufferOps(Enum):
  LOAD = auto(); CONST = auto(); STORE = auto() # noqa: E702
class MetaOps(Enum):
  KERNEL = auto()

for _e in (UnaryOps, BinaryOps, TernaryOps, ReduceOps, BufferOps, MetaOps):
  _e.__hash__ = object.__hash__  # type: ignore[method-assign]  # members are singletons: hash by identity
del _e
Op = Union[UnaryOps, BinaryOps, TernaryOps, ReduceOps, BufferOps, MetaOps]
_OP_TYPES = frozenset((UnaryOps, BinaryOps, TernaryOps, ReduceOps, BufferOps, MetaOps))
ALUOp = Union[UnaryOps, BinaryOps, TernaryOps]

# ops whose value at 0 is not 0: a reduce over padded (zero-filled) elements is wrong through them
UNSAFE_PAD_OPS = frozenset({UnaryOps.RECIP, UnaryOps.LOG2, UnaryOps.EXP2, BinaryOps.IDIV, BinaryOps.CMPNE})

def _brief(x: Any) -> str: return f"{type(x).__name__} {reprlib.repr(x)}"

def _check_buffer(what: str, dtype: Any, st: Any) -> None:
  if (why := storage_dtype_error(dtype)) is not None: raise VerifyError(f"{what} dtype: {why}")
  if not isinstance(st, ShapeTracker): raise VerifyError(f"{what} st must be a ShapeTracker, got {_brief(st)}")

@dataclass(frozen=True)
class MemBuffer:
  """Buffer `idx` of the kernel's arguments (-1: a workgroup-local buffer), viewed through `st`."""
  idx: int
  dtype: DType
  st: ShapeTracker

  def __post_init__(self) -> None:
    idx = self.idx
    if type(idx) is not int:
      if isinstance(idx, bool) or not isinstance(idx, numbers.Integral):
        raise VerifyError(f"MemBuffer idx must be an int >= -1, got {_brief(idx)}")
      object.__setattr__(self, "idx", idx := int(idx))
    if not -1 <= idx < 1 << 31: raise VerifyError(f"MemBuffer idx must be an int in [-1, 2**31), got {idx}")
    _check_buffer(f"MemBuffer {idx}", self.dtype, self.st)

@dataclass(frozen=True)
class ConstBuffer:
  """A constant broadcast to the shape of `st`."""
  val: ConstType
  dtype: DType
  st: ShapeTracker

  def __post_init__(self) -> None:
    _check_buffer("ConstBuffer", self.dtype, self.st)
    val = self.val
    if type(val) not in (int, float, bool) and not isinstance(val, symbolic.Node):
      if isinstance(val, numbers.Integral) and not isinstance(val, bool): val = int(val)
      elif isinstance(val, numbers.Real): val = float(val)
      elif type(val).__name__ == "bool_": val = bool(val)   # numpy's bool
      else: raise VerifyError(f"ConstBuffer val must be a bool, int, float or symbolic node, got {_brief(val)}")
      object.__setattr__(self, "val", val)
    if type(val) is int and dtypes.is_float(self.dtype) and not -_FLOAT_MAX <= val <= _FLOAT_MAX:
      raise VerifyError(f"ConstBuffer val {reprlib.repr(val)} is too large for any float ({self.dtype})")

_FLOAT_MAX = int(sys.float_info.max)

@dataclass(frozen=True)
class KernelInfo:
  """What the Kernel decided, attached to the optimized AST's KERNEL op for the lowerer."""
  local_dims: int = 0
  upcasted: int = 0
  dont_use_locals: bool = False

@dataclass(frozen=True)
class WMMAArg:
  """The tensor-core instruction of a WMMA op: `upcast_axes` are the (A, B, C) axes whose lanes form each
  thread's fragment, `reduce_axes` the axes the instruction consumes."""
  name: str
  dims: tuple[int, int, int]
  dtype_in: DType
  dtype_out: DType
  thread_local_sizes: tuple[int, int, int]
  device: str
  upcast_axes: tuple[int, int, int]
  reduce_axes: tuple[int, ...]

@dataclass(frozen=True, eq=False)
class LazyOp:
  """One node of a kernel's AST. Immutable; hashing is cached and equality is structural."""
  op: Op
  src: tuple[LazyOp, ...] = ()
  arg: Any = None

  def __post_init__(self) -> None:
    if type(self.op) not in _OP_TYPES:
      raise VerifyError(f"LazyOp op must be a member of an op enum (e.g. BinaryOps.ADD), got {_brief(self.op)}")
    if type(self.src) is not tuple:
      raise VerifyError(f"{self.op} src must be a tuple of LazyOps, got {type(self.src).__name__}")
    for x in self.src:
      if not isinstance(x, LazyOp): raise VerifyError(f"{self.op} has a source that is not a LazyOp: {_brief(x)}")
      if x.op is MetaOps.KERNEL or (x.op is BufferOps.STORE and self.op is not BufferOps.LOAD and
                                    self.op is not MetaOps.KERNEL):
        raise VerifyError(f"{x.op} can't be a source of {self.op} (only a KERNEL, or the LOAD of a local buffer, takes "
                          "a STORE; nothing takes a KERNEL)")
    try: self._hash
    except TypeError:
      raise VerifyError(f"{self.op} arg must be hashable (a tuple, not a list), got {_brief(self.arg)}") from None

  @functools.cached_property
  def _hash(self) -> int: return hash((self.op, self.src, self.arg))
  def __hash__(self) -> int: return self._hash
  def __eq__(self, other: object) -> bool:
    if self is other: return True
    if not isinstance(other, LazyOp) or self._hash != other._hash: return False
    return _same_tree(self, other)

  @functools.cached_property
  def dtype(self) -> Optional[DType]:
    """The dtype this op produces (None for STORE and KERNEL): its own for buffer ops, casts, comparisons and WMMA,
    else its value source's (WHERE's src[1], otherwise the last source)."""
    # walk down the chain of ops that take a source's dtype (no recursion: the chain may be 10,000 ops long), then
    # cache the dtype found on every op passed
    chain: list[LazyOp] = []
    x = self
    while (dt := x.__dict__.get("dtype", _UNSET)) is _UNSET and (s := _dtype_source(x)) is not None:
      chain.append(x)
      x = s
    if dt is _UNSET: dt = _own_dtype(x)
    for y in chain: y.__dict__["dtype"] = dt
    return dt

  @functools.cached_property
  def lazyops(self) -> list[LazyOp]:
    """Every op of the tree, each once, children before parents: a depth-first walk, sources in order, each op
    placed after the last of its sources (an explicit stack: a 10,000-deep tree needs no Python recursion)."""
    return walk_ops(self)

  def vars(self) -> list[Any]:
    """The symbolic Variables in the shapes of this tree's buffers and in its symbolic CONSTs, sorted by name."""
    found = {v for x in self.lazyops if x.op in BufferOps for v in x.arg.st.vars()}
    found |= {v for x in self.lazyops if x.op is BufferOps.CONST and isinstance(x.arg.val, symbolic.Node)
              for v in x.arg.val.vars()}
    return sorted(found, key=lambda v: v.expr)

  def __repr__(self) -> str:
    """`LazyOp(op, src=(...), arg=...)`, sources nested. An op that is a source more than once is spelled once, at
    its first place, as `#k=LazyOp(...)`, and as `#k` at the others (so the text grows with the number of ops, not
    of paths). Written from an explicit stack of pending text, without recursion."""
    uses: dict[LazyOp, int] = {}
    for op in self.lazyops:
      for s in op.src: uses[s] = uses.get(s, 0) + 1
    labels: dict[LazyOp, str] = {}
    out: list[str] = []
    stack: list[Union[LazyOp, str]] = [self]
    while stack:
      x = stack.pop()
      if isinstance(x, str):
        out.append(x)
        continue
      if (label := labels.get(x)) is not None:
        out.append(label)
        continue
      if uses.get(x, 0) > 1:
        labels[x] = label = f"#{len(labels) + 1}"
        out.append(f"{label}=")
      out.append(f"LazyOp({x.op}, src=(")
      stack.append(f"{',' if len(x.src) == 1 else ''}), arg={x.arg!r})")
      for i in range(len(x.src) - 1, -1, -1):
        stack.append(x.src[i])
        if i: stack.append(", ")
    return "".join(out)

_UNSET: Any = object()

def walk_ops(root: LazyOp, accept: Optional[Callable[[LazyOp], bool]] = None) -> list[LazyOp]:
  """root and the ops under it that `accept` (all, without it), reached through accepted ops only, each once,
  children before parents (sources in order). An explicit stack, so that a pass can visit a 10,000-deep tree
  bottom-up without recursion."""
  order: list[LazyOp] = []
  seen = {root}
  stack: list[tuple[LazyOp, int]] = [(root, 0)]
  while stack:
    op, i = stack[-1]
    if i < len(op.src):
      stack[-1] = (op, i + 1)
      if (s := op.src[i]) not in seen and (accept is None or accept(s)):
        seen.add(s)
        stack.append((s, 0))
    else:
      stack.pop()
      order.append(op)
  return order

_OWN_DTYPE = frozenset((*BufferOps, UnaryOps.CAST, UnaryOps.BITCAST, BinaryOps.CMPLT, BinaryOps.CMPNE, MetaOps.KERNEL,
                        ReduceOps.WMMA))

def _dtype_source(op: LazyOp) -> Optional[LazyOp]:
  """The source whose dtype op produces, or None where op's dtype is its own."""
  o = op.op
  if o in _OWN_DTYPE or not op.src: return None
  return op.src[1] if o is TernaryOps.WHERE and len(op.src) > 1 else op.src[-1]

def _own_dtype(op: LazyOp) -> Optional[DType]:
  o = op.op
  if o is BufferOps.LOAD or o is BufferOps.CONST: return op.arg.dtype
  if o is UnaryOps.CAST or o is UnaryOps.BITCAST: return op.arg
  if o is ReduceOps.WMMA: return op.arg.dtype_out
  if o is BinaryOps.CMPLT or o is BinaryOps.CMPNE: return dtypes.bool
  return None

def _same_tree(a: LazyOp, b: LazyOp) -> bool:
  """a and b are equal trees: the same op, arg and (equal) sources at every node; each pair compared once."""
  stack, seen = [(a, b)], set()
  while stack:
    x, y = stack.pop()
    if x is y: continue
    if x._hash != y._hash or x.op is not y.op or len(x.src) != len(y.src) or not x.arg == y.arg: return False
    if (key := (id(x), id(y))) in seen: continue
    seen.add(key)
    stack.extend(zip(x.src, y.src))
  return True

# ***** op semantics: one definition of each ALU op *****

def _trunc_div(a: int, b: int) -> int:
  if b == 0: return 0
  q = abs(a) // abs(b)
  return q if (a < 0) == (b < 0) else -q

def _trunc_mod(a: int, b: int) -> int:
  return 0 if b == 0 else a - b * _trunc_div(a, b)

def _fdiv(a: float, b: float) -> float:
  if b != 0: return a / b
  if a == 0 or math.isnan(a): return math.nan
  return math.copysign(math.inf, a) * math.copysign(1.0, b)

def _safe(fn: Callable[[float], float], bad: float) -> Callable[[float], float]:
  def ret(x: float) -> float:
    try: return fn(x)
    except (ValueError, OverflowError): return bad
  return ret

def _exp2(x: float) -> float:
  try: return 2.0 ** x
  except OverflowError: return math.inf

def _log2(x: float) -> float:
  if math.isnan(x) or x < 0: return math.nan
  return -math.inf if x == 0 else math.log2(x)

def _sqrt(x: float) -> float: return math.nan if math.isnan(x) or x < 0 else math.sqrt(x)
def _sin(x: float) -> float: return math.nan if math.isinf(x) or math.isnan(x) else math.sin(x)
def _recip(x: float) -> float: return _fdiv(1.0, x)

def _shift_count(b: int, dt: DType) -> int: return b % (8 * dt.itemsize)

def _idiv(a: Any, b: Any, dt: DType) -> Any: return _fdiv(a, b) if dtypes.is_float(dt) else _trunc_div(a, b)
def _fmod(a: float, b: float) -> float: return math.nan if math.isinf(a) or math.isnan(b) else math.fmod(a, b)
def _mod(a: Any, b: Any, dt: DType) -> Any: return _fmod(a, b) if dtypes.is_float(dt) and b != 0 else _trunc_mod(a, b)

# python evaluator of each op on scalars of its input dtype; results are wrapped to the output dtype by exec_alu
PYTHON_ALU: dict[ALUOp, Callable[..., Any]] = {
  UnaryOps.EXP2: lambda dt, x: _exp2(x), UnaryOps.LOG2: lambda dt, x: _log2(x), UnaryOps.SIN: lambda dt, x: _sin(x),
  UnaryOps.SQRT: lambda dt, x: _sqrt(x),
  UnaryOps.RECIP: lambda dt, x: _recip(x) if dtypes.is_float(dt) else _idiv(1, x, dt),
  UnaryOps.NEG: lambda dt, x: (not x) if dt == dtypes.bool else -x,
  BinaryOps.ADD: lambda dt, a, b: a + b, BinaryOps.MUL: lambda dt, a, b: a * b,
  BinaryOps.IDIV: lambda dt, a, b: _idiv(a, b, dt), BinaryOps.MOD: lambda dt, a, b: _mod(a, b, dt),
  BinaryOps.MAX: lambda dt, a, b: a if a > b else b,
  BinaryOps.CMPLT: lambda dt, a, b: a < b, BinaryOps.CMPNE: lambda dt, a, b: a != b,
  BinaryOps.XOR: lambda dt, a, b: a ^ b, BinaryOps.AND: lambda dt, a, b: a & b, BinaryOps.OR: lambda dt, a, b: a | b,
  BinaryOps.SHL: lambda dt, a, b: a << _shift_count(b, dt), BinaryOps.SHR: lambda dt, a, b: a >> _shift_count(b, dt),
  TernaryOps.WHERE: lambda dt, c, a, b: a if c else b, TernaryOps.MULACC: lambda dt, a, b, c: a * b + c,
}

# the contract's name for the one table of ALU semantics
OP_SEMANTICS = PYTHON_ALU

def truncate_float(x: float, dt: DType) -> float:
  """x rounded to the precision of the float type dt (round to nearest even)."""
  if dt == dtypes.float64 or math.isnan(x) or math.isinf(x): return x
  if dt == dtypes.float32:
    try: return struct.unpack("f", struct.pack("f", x))[0]
    except OverflowError: return math.copysign(math.inf, x)
  if dt == dtypes.float16:
    try: return struct.unpack("e", struct.pack("e", x))[0]
    except OverflowError: return math.copysign(math.inf, x)
  if dt == dtypes.bfloat16:
    bits = struct.unpack("I", struct.pack("f", truncate_float(x, dtypes.float32)))[0]
    bits = (bits + 0x7FFF + ((bits >> 16) & 1)) & 0xFFFF0000
    return struct.unpack("f", struct.pack("I", bits))[0]
  raise ValueError(f"{dt} is not a float type")

def alu_result_dtype(op: ALUOp, src_dtypes: tuple[DType, ...]) -> DType:
  """The dtype an ALU op produces from operands of src_dtypes (comparisons give bool; WHERE its branches' type)."""
  if op in (BinaryOps.CMPLT, BinaryOps.CMPNE): return dtypes.bool
  if op is TernaryOps.WHERE: return src_dtypes[1]
  return src_dtypes[-1]

_I32, _BOOL = dtypes.int32, dtypes.bool

def exec_alu(op: ALUOp, dtype: DType, operands: tuple[Any, ...]) -> Any:
  """The value of `op` applied to Python scalars, producing a value of `dtype` (DESIGN.md's op semantics:
  IDIV/MOD truncate and give 0 on a zero divisor; integers wrap; MAX is a > b ? a : b)."""
  # the dtype argument of an evaluator only matters for IDIV/MOD/RECIP/NEG/shifts, whose output is their input type
  ret = PYTHON_ALU[op](dtype, *operands)
  # the common index case, already what the conversion below gives: an in-range int32 (or a bool for bool)
  if dtype is _I32:
    if type(ret) is int and -0x80000000 <= ret <= 0x7FFFFFFF: return ret
  elif dtype is _BOOL and type(ret) is bool: return ret
  # a non-finite float result in an integer type is unspecified (DESIGN.md); give 0 rather than raise
  if isinstance(ret, float) and not math.isfinite(ret) and not dtypes.is_float(dtype): return dtypes.as_const(0, dtype)
  return dtypes.as_const(ret, dtype) if not dtypes.is_float(dtype) else truncate_float(float(ret), dtype.scalar())

# ***** verification: every op's ShapeTracker *****

_ARITY: dict[type, int] = {UnaryOps: 1, BinaryOps: 2, TernaryOps: 3}

def _shape_str(shape: tuple[Any, ...]) -> str:
  return "(" + ", ".join(str(s) for s in shape) + ("," if len(shape) == 1 else "") + ")"

def _reduced(shape: tuple[Any, ...], axes: Any, op: LazyOp) -> tuple[Any, ...]:
  if not isinstance(axes, tuple) or not all(isinstance(a, int) and not isinstance(a, bool) for a in axes):
    raise VerifyError(f"{op.op} needs a tuple of int axes, got {axes!r}")
  if len(set(axes)) != len(axes): raise VerifyError(f"{op.op} repeats an axis in {axes} over shape {_shape_str(shape)}")
  for a in axes:
    if not 0 <= a < len(shape): raise VerifyError(f"{op.op} axis {a} is out of range for shape {_shape_str(shape)}")
  return tuple(1 if i in axes else s for i, s in enumerate(shape))

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
                          f"{op.src[0].op} {_shape_str(shapes[0])} != {x.op} {_shape_str(s)}")
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
      raise VerifyError(f"STORE to buffer {buf.idx} of shape {_shape_str(shape)} "
                        f"from {op.src[0].op} of shape {_shape_str(val)}")
    if _value_dtype(op.src[0]) != (base := buf.dtype.base if isinstance(buf.dtype, ImageDType) else buf.dtype):
      raise VerifyError(f"STORE to buffer {buf.idx} of {buf.dtype} from {op.src[0].op} of {op.src[0].dtype}: "
                        f"CAST the value to {base}")
    return buf.st

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
      raise VerifyError(f"KERNEL outputs disagree in shape: {_shape_str(first)} != {_shape_str(st.shape)}")
  return v.sts

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

# ***** printing *****

def _arg_str(op: LazyOp) -> str:
  a = op.arg
  if isinstance(a, MemBuffer):
    return f"buf{a.idx} {a.dtype} {_shape_str(a.st.shape)}" + ("" if a.st.contiguous else f" {a.st.views}")
  if isinstance(a, ConstBuffer): return f"const {a.val!r} {a.dtype} {_shape_str(a.st.shape)}"
  return "" if a is None else repr(a)

_MAX_INDENT = 64

def _indent(depth: int) -> str:
  return "  " * depth if depth <= _MAX_INDENT else "  " * _MAX_INDENT + f"[depth {depth}] "

def format_tree(ast: LazyOp) -> str:
  """One line per op, indented by depth: `#id op arg`; a shared sub-tree is printed once and then named by its #id.
  Past 64 levels the indent stops growing and the line starts with `[depth d]`."""
  ids: dict[LazyOp, int] = {}
  lines: list[str] = []
  stack: list[tuple[LazyOp, int]] = [(ast, 0)]
  while stack:
    op, depth = stack.pop()
    if op in ids:
      lines.append(f"{_indent(depth)}#{ids[op]} (shared)")
      continue
    ids[op] = len(ids)
    lines.append(f"{_indent(depth)}#{ids[op]} {str(op.op).split('.')[-1]} {_arg_str(op)}".rstrip())
    stack.extend((x, depth + 1) for x in reversed(op.src))
  return "\n".join(lines)

def print_tree(ast: LazyOp, file: Optional[TextIO] = None) -> None:
  """Print format_tree(ast) to `file` (default stdout)."""
  print(format_tree(ast), file=sys.stdout if file is None else file)

# ***** canonical serialization *****

AST_FORMAT_VERSION = 1
_ENUMS: dict[str, type[Op]] = {e.__name__: e for e in
                                 (UnaryOps, BinaryOps, TernaryOps, ReduceOps, BufferOps, MetaOps)}
_Record = Union[MemBuffer, ConstBuffer, KernelInfo, WMMAArg]
_RECORDS: dict[str, type[_Record]] = {c.__name__: c for c in (MemBuffer, ConstBuffer, KernelInfo, WMMAArg)}
_SYM_BIN = ("MulNode", "DivNode", "ModNode", "LtNode")
_SYM_LIST = ("SumNode", "AndNode")

def _enc_node(n: symbolic.Node) -> dict[str, Any]:
  name = type(n).__name__
  if isinstance(n, symbolic.NumNode): return {"t": name, "b": n.b}
  if isinstance(n, symbolic.Variable): return {"t": name, "expr": n.expr, "min": n.min, "max": n.max, "val": n.val}
  if isinstance(n, (symbolic.MulNode, symbolic.DivNode, symbolic.ModNode, symbolic.LtNode)):
    return {"t": name, "a": _enc(n.a), "b": _enc(n.b)}
  if isinstance(n, (symbolic.SumNode, symbolic.AndNode)): return {"t": name, "nodes": [_enc(x) for x in n.nodes]}
  raise VerifyError(f"cannot serialize symbolic node {name}")

def _enc_dtype(dt: DType) -> dict[str, Any]:
  if isinstance(dt, ImageDType): return {"t": "image", "name": dt.name, "shape": list(dt.shape)}
  return {"t": "dtype", "name": dt.scalar().name, "count": dt.count}

def _enc(x: Any) -> Any:
  if x is None or isinstance(x, (bool, str)): return x
  if isinstance(x, int): return int(x)
  if isinstance(x, float): return x if math.isfinite(x) else {"t": "float", "v": repr(x)}
  if isinstance(x, tuple): return {"t": "tuple", "v": [_enc(y) for y in x]}
  if isinstance(x, DType): return _enc_dtype(x)
  if isinstance(x, symbolic.Node): return _enc_node(x)
  if isinstance(x, Enum) and type(x).__name__ in _ENUMS: return {"t": "enum", "v": f"{type(x).__name__}.{x.name}"}
  if isinstance(x, ShapeTracker):
    return {"t": "st", "views": [{"shape": _enc(v.shape), "strides": _enc(v.strides), "offset": _enc(v.offset),
                                  "mask": _enc(v.mask)} for v in x.views]}
  if type(x).__name__ in _RECORDS and isinstance(x, _RECORDS[type(x).__name__]):
    return {"t": type(x).__name__, **{f.name: _enc(getattr(x, f.name)) for f in fields(x)}}
  raise VerifyError(f"cannot serialize a {type(x).__name__} in an AST: {x!r}")

def _dec_node(d: dict[str, Any]) -> symbolic.Node:
  t = d["t"]
  if t == "NumNode": return symbolic.NumNode(d["b"])
  if t == "Variable":
    v = symbolic.Variable(d["expr"], d["min"], d["max"])
    return v if d["val"] is None else v.bind(d["val"])
  if t in _SYM_BIN: return getattr(symbolic, t)(_dec(d["a"]), _dec(d["b"]))
  return getattr(symbolic, t)([_dec(x) for x in d["nodes"]])

def _dec_view(d: dict[str, Any]) -> View:
  shape, strides, offset, mask = _dec(d["shape"]), _dec(d["strides"]), _dec(d["offset"]), _dec(d["mask"])
  v = View.create(shape, strides, offset, mask)
  # View.create's caches can't tell a bound Variable from its unbound self: keep the bound values we were given
  flat = (*shape, *strides, offset, *(b for m in (mask or ()) for b in m))
  if any(u.val is not None for x in flat if isinstance(x, symbolic.Node) for u in x.vars()):
    v = View(shape, strides, offset, mask, v.contiguous)
  return v

def _dec(x: Any) -> Any:
  if not isinstance(x, dict): return x
  t = x["t"]
  if t == "float": return math.nan if x["v"] == "nan" else float(x["v"])  # one nan object keeps equal args equal
  if t == "tuple": return tuple(_dec(y) for y in x["v"])
  if t == "dtype":
    dt = dtypes.from_name(x["name"])
    return dt.vec(x["count"]) if x["count"] != 1 else dt
  if t == "image": return {"imagef": dtypes.imagef, "imageh": dtypes.imageh}[x["name"]](tuple(x["shape"]))
  if t in ("NumNode", "Variable") or t in _SYM_BIN or t in _SYM_LIST: return _dec_node(x)
  if t == "enum":
    cls, name = x["v"].split(".")
    return _ENUMS[cls][name]
  if t == "st": return ShapeTracker(tuple(_dec_view(v) for v in x["views"]))
  if t in _RECORDS: return _RECORDS[t](**{k: _dec(v) for k, v in x.items() if k != "t"})
  raise VerifyError(f"unknown tag {t!r} in a serialized AST")

def ast_to_json(ast: LazyOp) -> dict[str, Any]:
  """A JSON-compatible dict for `ast`: {"version": 1, "nodes": [...], "root": i}. Each distinct op is one entry of
  `nodes` (children before parents, sources by index), so shared sub-trees are stored once. Non-JSON values are
  tagged dicts {"t": kind, ...}: tuples, non-finite floats, dtypes, ShapeTrackers (views with shape, strides, offset,
  mask), symbolic nodes (by structure), enums and the arg records."""
  index: dict[LazyOp, int] = {}
  nodes: list[dict[str, Any]] = []
  for op in ast.lazyops:
    index[op] = len(nodes)
    nodes.append({"op": f"{type(op.op).__name__}.{op.op.name}", "src": [index[s] for s in op.src], "arg": _enc(op.arg)})
  return {"version": AST_FORMAT_VERSION, "nodes": nodes, "root": len(nodes) - 1}

def ast_from_json(d: dict[str, Any]) -> LazyOp:
  """The LazyOp that ast_to_json turned into `d`. Raises VerifyError on an unknown version or a malformed dict."""
  if not isinstance(d, dict) or d.get("version") != AST_FORMAT_VERSION:
    raise VerifyError(f"unsupported serialized AST version {d.get('version') if isinstance(d, dict) else d!r}, "
                      f"expected {AST_FORMAT_VERSION}")
  try:
    built: list[LazyOp] = []
    for i, n in enumerate(d["nodes"]):
      if any(not isinstance(s, int) or not 0 <= s < i for s in n["src"]):
        raise VerifyError(f"node {i} has bad sources {n['src']}")
      cls, name = n["op"].split(".")
      built.append(LazyOp(_ENUMS[cls][name], tuple(built[s] for s in n["src"]), _dec(n["arg"])))
    return built[d["root"]]
  except VerifyError: raise
  except (KeyError, IndexError, TypeError, ValueError, AttributeError) as e:
    raise VerifyError(f"malformed serialized AST: {type(e).__name__}: {e}") from e

def ast_dumps(ast: LazyOp) -> str:
  """The canonical JSON text of `ast` (sorted keys, no whitespace)."""
  return json.dumps(ast_to_json(ast), sort_keys=True, separators=(",", ":"), allow_nan=False)

def ast_digest(ast: LazyOp) -> str:
  """sha256 hex digest of ast_dumps(ast): the same in every process and Python version with the same format version."""
  return hashlib.sha256(ast_dumps(ast).encode()).hexdigest()

def value_to_json(x: Any) -> Any:
  """x (ints, floats, strings, tuples, dtypes, symbolic nodes, ShapeTrackers, enums, arg records) as tagged JSON data,
  as ast_to_json stores an op's arg."""
  return _enc(x)

def value_from_json(d: Any) -> Any:
  """The value value_to_json turned into d."""
  return _dec(d)

# ***** AST files: the canonical JSON of ops.ast_dumps, one kernel per file *****

def save_ast(ast: LazyOp, path: Union[str, os.PathLike]) -> str:
  """Write `ast` to `path` as its canonical JSON (written whole or not at all). A directory as `path` names the
  file `<digest>.json` inside it. Returns the path written."""
  if not isinstance(ast, LazyOp): raise VerifyError(f"save takes a LazyOp, got {type(ast).__name__}")
  path = os.fspath(path)
  if os.path.isdir(path): path = os.path.join(path, f"{ast_digest(ast)}.json")
  tmp = f"{path}.{os.getpid()}.tmp"
  with open(tmp, "w", encoding="utf-8") as f: f.write(ast_dumps(ast))
  os.replace(tmp, path)
  return path

def load_ast(path: Union[str, os.PathLike]) -> LazyOp:
  """The AST `save_ast` wrote to `path`, verified. A file that is not a serialized AST raises VerifyError naming it."""
  try:
    with open(path, encoding="utf-8") as f: d = json.load(f)
  except (OSError, UnicodeDecodeError, ValueError) as e:
    raise VerifyError(f"cannot read an AST from {os.fspath(path)!r}: {e}") from e
  try: ast = ast_from_json(d)
  except VerifyError as e: raise VerifyError(f"{os.fspath(path)!r}: {e}") from e
  verify_lazyop(ast)
  return ast

def save_if_asked(ast: LazyOp, directory: str) -> None:
  """SAVE_ASTS=dir: every AST a Kernel is built from lands in `directory` once, as `<digest>.json`."""
  os.makedirs(directory, exist_ok=True)
  path = os.path.join(directory, f"{ast_digest(ast)}.json")
  if not os.path.exists(path): save_ast(ast, path)
