"""The op-semantics table: one Python definition of every ALU op on scalars (`OP_SEMANTICS`), the dtypes each op
is defined on (`defined_on`), and `exec_alu`, which applies an op and wraps the result to its dtype. Constant
folding, the interpreters and the renderers follow it. Imports dtype, lazyop."""
from __future__ import annotations
import math
import struct
from typing import Any, Callable
from kernopt.dtype import DType, dtypes
from kernopt.lazyop import ALUOp, BinaryOps, TernaryOps, UnaryOps

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

# the operand kinds each op is not defined on: there every dialect and the PYTHON device refuse it (UnsupportedError)
_UNDEFINED = {
  "float": frozenset({BinaryOps.XOR, BinaryOps.AND, BinaryOps.OR, BinaryOps.SHL, BinaryOps.SHR}),
  "int": frozenset({UnaryOps.EXP2, UnaryOps.LOG2, UnaryOps.SIN, UnaryOps.SQRT}),
  "bool": frozenset({UnaryOps.EXP2, UnaryOps.LOG2, UnaryOps.SIN, UnaryOps.SQRT, UnaryOps.RECIP, BinaryOps.IDIV,
                     BinaryOps.MOD, BinaryOps.SHL, BinaryOps.SHR, TernaryOps.MULACC}),
}
KINDS = ("float", "int", "bool")
# op -> the operand kinds it is defined on (a comparison's operands, WHERE's branches, any other op's result)
DOMAINS: dict[ALUOp, frozenset[str]] = {op: frozenset(k for k in KINDS if op not in _UNDEFINED[k]) for op in PYTHON_ALU}

def operand_kind(dt: DType) -> str:
  """"bool", "float" or "int": which column of DOMAINS a scalar or vector dtype reads."""
  s = dt.scalar()
  return "bool" if s == dtypes.bool else "float" if dtypes.is_float(s) else "int"

def defined_on(op: ALUOp, dt: DType) -> bool:
  """op is defined on operands of dt (see DOMAINS)."""
  return operand_kind(dt) in DOMAINS[op]

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

def cast_value(x: Any, dt: DType) -> Any:
  """The op table's CAST of a Python scalar to dt: to a float rounded to nearest even; to bool x != 0; an int
  wraps to dt's range; a float truncates toward zero, and one whose truncation dt cannot hold (or NaN, inf) gives 0
  (C leaves it undefined; every dialect spells this)."""
  dt = dt.scalar()
  if dtypes.is_float(dt): return truncate_float(float(x), dt)
  if dt == dtypes.bool: return bool(x)
  if isinstance(x, float):
    if not math.isfinite(x): return 0
    t = math.trunc(x)
    return t if dtypes.min(dt) <= t <= dtypes.max(dt) else 0
  return dtypes.as_const(x, dt)

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
