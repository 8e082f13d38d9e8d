"""The kernel AST: op enums, `LazyOp`, buffers, and the one table of op semantics (`exec_alu`) that constant
folding, the PYTHON interpreter and the renderers all follow. Imports dtype, helpers, errors and shape/."""
from __future__ import annotations
import math, struct
from dataclasses import dataclass
from enum import Enum, auto
from typing import Any, Callable, Optional, Union
import functools
from kernopt.dtype import ConstType, DType, dtypes
from kernopt.helpers import dedup
from kernopt.shape.shapetracker import ShapeTracker

class UnaryOps(Enum):
  EXP2 = auto(); LOG2 = auto(); CAST = auto(); BITCAST = auto(); SIN = auto(); SQRT = auto(); RECIP = auto(); NEG = auto() # noqa: E702
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

Op = Union[UnaryOps, BinaryOps, TernaryOps, ReduceOps, BufferOps, MetaOps]
ALUOp = Union[UnaryOps, BinaryOps, TernaryOps]

# ops whose value at 0 is not 0: a reduce over padded (zero-filled) elements is wrong through them
UNSAFE_PAD_OPS = frozenset({UnaryOps.RECIP, UnaryOps.LOG2, UnaryOps.EXP2, BinaryOps.IDIV, BinaryOps.CMPNE})

@dataclass(frozen=True)
class MemBuffer:
  """Buffer `idx` of the kernel's arguments (-1: a workgroup-local buffer), viewed through `st`."""
  idx: int
  dtype: DType
  st: ShapeTracker

@dataclass(frozen=True)
class ConstBuffer:
  """A constant broadcast to the shape of `st`."""
  val: ConstType
  dtype: DType
  st: ShapeTracker

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

  @functools.cached_property
  def _hash(self) -> int: return hash((self.op, self.src, self.arg))
  def __hash__(self) -> int: return self._hash
  def __eq__(self, other: object) -> bool:
    if self is other: return True
    if not isinstance(other, LazyOp) or self._hash != other._hash: return False
    return self.op is other.op and self.arg == other.arg and self.src == other.src

  @functools.cached_property
  def dtype(self) -> Optional[DType]:
    """The dtype this op produces (None for STORE and KERNEL)."""
    if self.op in (BufferOps.LOAD, BufferOps.CONST): return self.arg.dtype
    if self.op in (UnaryOps.CAST, UnaryOps.BITCAST): return self.arg
    if self.op in (BufferOps.STORE, MetaOps.KERNEL): return None
    if self.op is ReduceOps.WMMA: return self.arg.dtype_out
    if self.op in (BinaryOps.CMPLT, BinaryOps.CMPNE): return dtypes.bool
    if self.op is TernaryOps.WHERE: return self.src[1].dtype
    return self.src[-1].dtype

  @functools.cached_property
  def lazyops(self) -> list[LazyOp]:
    """Every op of the tree, each once, children before parents."""
    return dedup([x for s in self.src for x in s.lazyops] + [self])

  def vars(self) -> list[Any]:
    """The symbolic Variables in the shapes of this tree's buffers, sorted by name."""
    found = {v for x in self.lazyops if x.op in BufferOps for v in x.arg.st.vars()}
    return sorted(found, key=lambda v: v.expr)

  def __repr__(self) -> str: return f"LazyOp({self.op}, src={self.src!r}, arg={self.arg!r})"

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
def _mod(a: Any, b: Any, dt: DType) -> Any: return math.fmod(a, b) if dtypes.is_float(dt) and b != 0 else _trunc_mod(a, b)

# python evaluator of each op on scalars of its input dtype; results are wrapped to the output dtype by exec_alu
PYTHON_ALU: dict[ALUOp, Callable[..., Any]] = {
  UnaryOps.EXP2: lambda dt, x: _exp2(x), UnaryOps.LOG2: lambda dt, x: _log2(x), UnaryOps.SIN: lambda dt, x: _sin(x),
  UnaryOps.SQRT: lambda dt, x: _sqrt(x), UnaryOps.RECIP: lambda dt, x: _recip(x) if dtypes.is_float(dt) else _idiv(1, x, dt),
  UnaryOps.NEG: lambda dt, x: (not x) if dt == dtypes.bool else -x,
  BinaryOps.ADD: lambda dt, a, b: a + b, BinaryOps.MUL: lambda dt, a, b: a * b,
  BinaryOps.IDIV: lambda dt, a, b: _idiv(a, b, dt), BinaryOps.MOD: lambda dt, a, b: _mod(a, b, dt),
  BinaryOps.MAX: lambda dt, a, b: a if a > b else b,
  BinaryOps.CMPLT: lambda dt, a, b: a < b, BinaryOps.CMPNE: lambda dt, a, b: a != b,
  BinaryOps.XOR: lambda dt, a, b: a ^ b, BinaryOps.AND: lambda dt, a, b: a & b, BinaryOps.OR: lambda dt, a, b: a | b,
  BinaryOps.SHL: lambda dt, a, b: a << _shift_count(b, dt), BinaryOps.SHR: lambda dt, a, b: a >> _shift_count(b, dt),
  TernaryOps.WHERE: lambda dt, c, a, b: a if c else b, TernaryOps.MULACC: lambda dt, a, b, c: a * b + c,
}

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

def exec_alu(op: ALUOp, dtype: DType, operands: tuple[Any, ...]) -> Any:
  """The value of `op` applied to Python scalars, producing a value of `dtype` (DESIGN.md's op semantics:
  IDIV/MOD truncate and give 0 on a zero divisor; integers wrap; MAX is a > b ? a : b)."""
  # the dtype argument of an evaluator only matters for IDIV/MOD/RECIP/NEG/shifts, whose output is their input type
  ret = PYTHON_ALU[op](dtype, *operands)
  return dtypes.as_const(ret, dtype) if not dtypes.is_float(dtype) else truncate_float(float(ret), dtype.scalar())
