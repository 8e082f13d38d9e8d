"""The PYTHON device's values and ALU: numpy register types (bfloat16 held as float32 rounded to bfloat16), storage
conversions, and `alu`, the op-semantics table (kernopt.alu) as numpy kernels, one per op and operand kind of its
domain, checked against exec_alu op by op in tests/test_python_alu.py. Also EmulationError, the base of what the
device reports. Imports dtype, errors, alu, lazyop and runtime."""
from __future__ import annotations
from typing import Any, Callable
import numpy as np
from kernopt.alu import KINDS, operand_kind
from kernopt.dtype import DType, dtypes
from kernopt.errors import KernoptError, UnsupportedError
from kernopt.lazyop import ALUOp, BinaryOps, TernaryOps, UnaryOps
from kernopt.runtime import bf16_bits, bf16_from_bits, np_dtype, round_bf16

class EmulationError(KernoptError):
  """A kernel did something that is undefined on the hardware it targets (caught by the PYTHON device)."""

# ***** values: numpy arrays of shape () (uniform) or (T,), with a trailing lane axis for vectors *****

def reg_dtype(dt: DType) -> np.dtype:
  """The numpy type that holds values of dt in the interpreter (bfloat16 as float32 values rounded to bfloat16)."""
  dt = dt.scalar()
  return np.dtype(np.float32) if dt == dtypes.bfloat16 else np_dtype(dt)

def to_reg(x: Any, dt: DType) -> np.ndarray:
  """x converted to dt's register type as the op table's CAST (alu.cast_value) does: floats round to nearest even,
  ints wrap, and a float whose truncation dt cannot hold (or NaN, inf) becomes the int 0."""
  if dt.scalar() == dtypes.bfloat16: return round_bf16(np.asarray(x).astype(np.float32))
  if dt.scalar() == dtypes.bool: return np.asarray(x) != 0
  a = np.asarray(x)
  if a.dtype.kind == "f" and dtypes.is_int(dt.scalar()):
    bits = 8 * dt.scalar().itemsize
    lo = 0.0 if dtypes.is_unsigned(dt.scalar()) else -2.0 ** (bits - 1)
    t = np.trunc(a.astype(np.float64))
    with np.errstate(invalid="ignore"):
      ok = (t >= lo) & (t < lo + 2.0 ** bits)   # exact in float64 at every width; False for NaN
    return np.where(ok, t, 0).astype(reg_dtype(dt))
  return a.astype(reg_dtype(dt))

def to_storage(x: Any, dt: DType) -> np.ndarray:
  return bf16_bits(x) if dt.scalar() == dtypes.bfloat16 else np.asarray(x).astype(np_dtype(dt))

def from_storage(x: Any, dt: DType) -> np.ndarray:
  return bf16_from_bits(x) if dt.scalar() == dtypes.bfloat16 else np.asarray(x)

# ***** ALU: a numpy kernel for each (op, operand kind) of the op table's domain *****

def _idiv_int(a: np.ndarray, b: np.ndarray) -> np.ndarray:
  zero = b == 0
  bs = np.where(zero, 1, b).astype(b.dtype)
  q = a // bs
  q = q + ((q * bs != a) & ((a < 0) != (bs < 0))).astype(q.dtype)  # floor -> truncation toward zero
  return np.where(zero, 0, q).astype(a.dtype)

def _mod_int(a: np.ndarray, b: np.ndarray) -> np.ndarray:
  return np.where(b == 0, 0, a - b * _idiv_int(a, b)).astype(a.dtype)

def _shift_count(b: np.ndarray, a: np.ndarray) -> np.ndarray:
  return np.mod(b, 8 * a.dtype.itemsize).astype(a.dtype)

Kernel = Callable[..., np.ndarray]   # (result dtype, *operands) -> the result in its register type

def _f64(fn: Callable[..., Any]) -> Kernel:
  """Computed in float64, then rounded once to the result type, as exec_alu does."""
  return lambda dt, *xs: to_reg(fn(*(x.astype(np.float64) for x in xs)), dt)

def _rounded(fn: Callable[..., Any]) -> Kernel:
  """Correctly rounded in the operand type (rounding it again to the result type changes nothing)."""
  return lambda dt, *xs: to_reg(fn(*xs), dt)

def _wrapped(fn: Callable[..., Any]) -> Kernel:
  """Integer arithmetic in the operand type: wraps in two's complement."""
  return lambda dt, *xs: np.asarray(fn(*xs)).astype(reg_dtype(dt))

def _as_is(fn: Callable[..., Any]) -> Kernel: return lambda dt, *xs: fn(*xs)

def _max(a: np.ndarray, b: np.ndarray) -> np.ndarray: return np.where(a > b, a, b)
def _mulacc(a: np.ndarray, b: np.ndarray, c: np.ndarray) -> np.ndarray: return a * b + c

NUMPY_ALU: dict[tuple[ALUOp, str], Kernel] = {
  **{(op, kind): fn for kind in KINDS for op, fn in (
    (BinaryOps.CMPLT, _as_is(np.less)), (BinaryOps.CMPNE, _as_is(np.not_equal)),
    (TernaryOps.WHERE, _wrapped(np.where)), (BinaryOps.MAX, _wrapped(_max)))},
  **{(op, "float"): fn for op, fn in (
    (UnaryOps.EXP2, _f64(np.exp2)), (UnaryOps.LOG2, _f64(np.log2)), (UnaryOps.SIN, _f64(np.sin)),
    (TernaryOps.MULACC, _f64(_mulacc)), (BinaryOps.ADD, _rounded(np.add)), (BinaryOps.MUL, _rounded(np.multiply)),
    (BinaryOps.IDIV, _rounded(np.true_divide)), (UnaryOps.SQRT, _rounded(np.sqrt)),
    (UnaryOps.NEG, _rounded(np.negative)), (UnaryOps.RECIP, _rounded(lambda x: np.asarray(1, x.dtype) / x)),
    (BinaryOps.MOD, _rounded(lambda a, b: np.where(b == 0, 0, np.fmod(a, b)))))},
  **{(op, "int"): _wrapped(fn) for op, fn in (
    (BinaryOps.ADD, np.add), (BinaryOps.MUL, np.multiply), (BinaryOps.IDIV, _idiv_int), (BinaryOps.MOD, _mod_int),
    (BinaryOps.XOR, np.bitwise_xor), (BinaryOps.AND, np.bitwise_and), (BinaryOps.OR, np.bitwise_or),
    (BinaryOps.SHL, lambda a, b: np.left_shift(a, _shift_count(b, a))),
    (BinaryOps.SHR, lambda a, b: np.right_shift(a, _shift_count(b, a))), (UnaryOps.NEG, np.negative),
    (UnaryOps.RECIP, lambda x: _idiv_int(np.ones_like(x), x)), (TernaryOps.MULACC, _mulacc))},
  **{(op, "bool"): fn for op, fn in (
    (BinaryOps.ADD, _as_is(np.logical_or)), (BinaryOps.MUL, _as_is(np.logical_and)),
    (UnaryOps.NEG, _wrapped(np.logical_not)), (BinaryOps.XOR, _wrapped(np.bitwise_xor)),
    (BinaryOps.AND, _wrapped(np.bitwise_and)), (BinaryOps.OR, _wrapped(np.bitwise_or)))},
}

def _refuse(op: ALUOp, dtype: DType) -> Kernel:
  def refuse(dt: DType, *xs: Any) -> np.ndarray: raise UnsupportedError(f"ALU op {op} is not defined on {dtype}")
  return refuse

def alu_kernel(op: ALUOp, dtype: DType) -> Kernel:
  """The numpy kernel of op giving dtype (a comparison: bool), called as kernel(dtype, *operands) on numpy operands
  in their dtypes' register types; outside the op's domain one that raises UnsupportedError."""
  return NUMPY_ALU.get((op, operand_kind(dtype))) or _refuse(op, dtype)

def alu(op: ALUOp, dtype: DType, operands: tuple[Any, ...]) -> np.ndarray:
  """op applied elementwise to numpy operands holding values of their dtypes' register types, giving dtype's
  register type: the vectorised exec_alu (IDIV/MOD truncate, zero divisors give 0, integers wrap, MAX is
  a > b ? a : b, shift counts are taken modulo the width). UnsupportedError outside the op's domain."""
  with np.errstate(all="ignore"): return alu_kernel(op, dtype)(dtype, *(np.asarray(x) for x in operands))
