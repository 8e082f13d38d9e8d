"""verify_lazyop's dtype rules (issue 14, item 3): ALU operands share a dtype (CAST and BITCAST are the only
conversions), comparisons give bool, WHERE takes a bool condition and branches of one dtype, a STORE's value has the
buffer's dtype, a CONST's value is representable in its dtype, WMMA takes its declared input dtype, and an image LOAD
has its base dtype. Each violation is a VerifyError naming the op and the dtypes; the explicit CAST the error asks for
computes numpy's numbers on CPU and PYTHON alike."""
import math
import numpy as np
import pytest
from catalogue import alu, buf, cast, const, kernel, reduce, store, view
from kernopt.dtype import dtypes
from kernopt.errors import VerifyError
from kernopt.kernel import Kernel
from kernopt.ops import (BinaryOps, BufferOps, LazyOp, MemBuffer, MetaOps, ReduceOps, TernaryOps, UnaryOps, WMMAArg,
                         verify_lazyop)
from kernopt.runtime import Buffer, Device, cpu

F, I, B = dtypes.float32, dtypes.int32, dtypes.bool
DEVICES = ["PYTHON"] + (["CPU"] if cpu.CPUDevice.availability()[0] else [])

def _bad(ast: LazyOp, match: str) -> None:
  with pytest.raises(VerifyError, match=match): verify_lazyop(ast)
  with pytest.raises(VerifyError, match=match): Kernel(ast)

def _run(ast: LazyOp, device: str, out: tuple[int, np.dtype], *ins: np.ndarray) -> np.ndarray:
  k = Kernel(ast, opts=Device[device].renderer).required_optimizations().hand_coded_optimizations()
  runner = Device[device].compile(k.to_program())
  o = Buffer(device, out[0], dtypes.from_name(np.dtype(out[1]).name))
  runner(o, *[Buffer(device, x.size, dtypes.from_name(x.dtype.name)).copyin(x) for x in ins])
  return o.numpy()

# ***** the examples *****

def test_float_value_stored_into_int32_needs_a_cast():
  x = buf(1, (8,), F)
  _bad(kernel(store(x, dtype=I)),
       r"STORE to buffer 0 of dtypes.int32 from BufferOps.LOAD of dtypes.float32: CAST the value to dtypes.int32")
  ok = kernel(store(cast(x, I)))
  vals = np.array([1.5, -1.5, 2.99, -2.99, 0.0, 7.0, 100.25, -0.5], np.float32)
  for d in DEVICES:   # converted by value (truncation), not the float's bit pattern (1.5 -> 1069547520)
    np.testing.assert_array_equal(_run(ok, d, (8, np.int32), vals), vals.astype(np.int32))

def test_add_of_float_and_int32_needs_a_cast():
  a, b = buf(1, (8,), F), buf(2, (8,), I)
  _bad(kernel(store(alu(BinaryOps.ADD, a, b))),
       r"BinaryOps.ADD operands disagree in dtype: BufferOps.LOAD of dtypes.float32 and BufferOps.LOAD of "
       r"dtypes.int32; CAST one of them")
  _bad(kernel(store(alu(BinaryOps.ADD, b, a))), r"ADD operands disagree in dtype: .*int32 and .*float32")
  ok = kernel(store(alu(BinaryOps.ADD, a, cast(b, F))))
  av = np.linspace(-3, 3, 8, dtype=np.float32)
  bv = np.arange(-4, 4, dtype=np.int32) * 1000003
  for d in DEVICES: np.testing.assert_array_equal(_run(ok, d, (8, np.float32), av, bv), av + bv.astype(np.float32))

# ***** one test per rule *****

@pytest.mark.parametrize("op", [BinaryOps.MUL, BinaryOps.IDIV, BinaryOps.MAX, BinaryOps.MOD, BinaryOps.XOR,
                                BinaryOps.SHL, BinaryOps.SHR, BinaryOps.AND, BinaryOps.OR])
def test_binary_operands_agree(op):
  _bad(kernel(store(alu(op, buf(1, (4,), I), buf(2, (4,), dtypes.int64)))),
       rf"BinaryOps.{op.name} operands disagree in dtype: BufferOps.LOAD of dtypes.int32 and .*int64")

def test_mulacc_operands_agree():
  a, h = buf(1, (4,), F), buf(2, (4,), dtypes.half)
  _bad(kernel(store(alu(TernaryOps.MULACC, a, a, h))), r"MULACC operands disagree in dtype: .*float32 and .*float32 "
       r"and .*float16")

@pytest.mark.parametrize("op", [BinaryOps.CMPLT, BinaryOps.CMPNE])
def test_comparisons_give_bool(op):
  a, b = buf(1, (4,), F), buf(2, (4,), F)
  cmp = alu(op, a, b)
  assert cmp.dtype == B and verify_lazyop(kernel(store(cmp)))
  _bad(kernel(store(cmp, dtype=F)), rf"STORE to buffer 0 of dtypes.float32 from BinaryOps.{op.name} of dtypes.bool")
  _bad(kernel(store(alu(op, a, buf(2, (4,), dtypes.half)))), rf"{op.name} operands disagree in dtype")
  # a comparison is a bool operand: adding it to a float needs the CAST
  _bad(kernel(store(alu(BinaryOps.ADD, cmp, a))), r"ADD operands disagree in dtype: BinaryOps.\w+ of dtypes.bool and")

def test_where_condition_is_bool_and_branches_agree():
  c, a, b = buf(1, (4,), I), buf(2, (4,), F), buf(3, (4,), F)
  _bad(kernel(store(alu(TernaryOps.WHERE, c, a, b))), r"WHERE needs a bool condition, got BufferOps.LOAD of "
       r"dtypes.int32")
  cond = alu(BinaryOps.CMPNE, c, const(0, (4,), I))
  _bad(kernel(store(alu(TernaryOps.WHERE, cond, a, buf(3, (4,), dtypes.half)))),
       r"WHERE operands disagree in dtype: BufferOps.LOAD of dtypes.float32 and BufferOps.LOAD of dtypes.float16")
  sel = alu(TernaryOps.WHERE, cond, a, b)
  assert sel.dtype == F and verify_lazyop(kernel(store(sel)))

def test_unary_ops_and_conversions():
  """A unary op has nothing to agree with; CAST converts anything, BITCAST keeps the item size."""
  x = buf(1, (4,), I)
  assert verify_lazyop(kernel(store(alu(UnaryOps.NEG, x))))
  assert verify_lazyop(kernel(store(cast(x, dtypes.half))))
  assert verify_lazyop(kernel(store(LazyOp(UnaryOps.BITCAST, (x,), F))))
  _bad(kernel(store(alu(UnaryOps.NEG, x), dtype=F)), r"STORE to buffer 0 of dtypes.float32 from UnaryOps.NEG of "
       r"dtypes.int32")

def test_reduce_keeps_its_input_dtype():
  r = reduce(ReduceOps.SUM, buf(1, (4, 8), I), (1,))
  assert r.dtype == I and verify_lazyop(kernel(store(r)))
  _bad(kernel(store(r, dtype=F)), r"STORE to buffer 0 of dtypes.float32 from ReduceOps.SUM of dtypes.int32")
  _bad(kernel(store(alu(BinaryOps.ADD, r, buf(2, (4, 1), F)))), r"ADD operands disagree in dtype: ReduceOps.SUM of "
       r"dtypes.int32 and BufferOps.LOAD of dtypes.float32")

def test_wmma_takes_its_input_dtype():
  wa = WMMAArg("WMMA_8_16_16_half_float", (8, 16, 16), dtypes.half, F, (8, 4, 4), "CUDA", (2, 3, 3), (2,))
  h, f = buf(1, (16, 8, 16), dtypes.half), buf(2, (16, 8, 16), F)
  assert verify_lazyop(kernel(store(LazyOp(ReduceOps.WMMA, (h, buf(2, (16, 8, 16), dtypes.half)), wa))))
  _bad(kernel(store(LazyOp(ReduceOps.WMMA, (h, f), wa))),
       r"WMMA of dtypes.float16 takes sources of dtypes.float16 and dtypes.float32")

@pytest.mark.parametrize("val,dt,msg", [
  (math.nan, I, r"CONST nan is not representable in dtypes.int32: only float types hold it"),
  (math.inf, dtypes.uint8, r"CONST inf is not representable in dtypes.uint8"),
  (2.5, I, r"CONST 2.5 is not representable in dtypes.int32"),
  (2 ** 31, I, r"CONST 2147483648 is out of range for dtypes.int32 \[-2147483648, 2147483647\]"),
  (-1, dtypes.uint32, r"CONST -1 is out of range for dtypes.uint32 \[0, 4294967295\]"),
  (256, dtypes.uint8, r"CONST 256 is out of range for dtypes.uint8"),
  (-2 ** 63 - 1, dtypes.int64, r"out of range for dtypes.int64"),
  (2, B, r"CONST 2 is not a dtypes.bool \(True, False, 0 or 1\)"),
  (1.0, B, r"CONST 1.0 is not a dtypes.bool"),
  (math.nan, B, r"CONST nan is not a dtypes.bool"),
  (1e300, F, r"CONST 1e\+300 overflows dtypes.float32"),
  (70000.0, dtypes.half, r"CONST 70000.0 overflows dtypes.float16"),
])
def test_const_not_representable(val, dt, msg):
  _bad(kernel(store(const(val, (4,), dt))), msg)

@pytest.mark.parametrize("val,dt", [(math.nan, F), (-math.inf, dtypes.half), (math.inf, dtypes.bfloat16),
                                    (1e300, dtypes.double), (3, F), (True, F), (-2 ** 31, I),
                                    (2 ** 64 - 1, dtypes.uint64), (7.0, dtypes.int8), (True, B), (0, B), (1, B),
                                    (False, I)])
def test_const_representable(val, dt):
  assert verify_lazyop(kernel(store(const(val, (4,), dt))))

def test_image_load_has_its_base_dtype():
  shp = (4, 8, 4)
  img = buf(1, shp, dtypes.imagef((4, 8, 4)))
  assert verify_lazyop(kernel(store(alu(BinaryOps.MUL, img, const(2.0, shp, F)))))
  _bad(kernel(store(alu(BinaryOps.MUL, img, const(2.0, shp, dtypes.half)))),
       r"MUL operands disagree in dtype: BufferOps.LOAD of dtypes.float32 and BufferOps.CONST of dtypes.float16")
  assert verify_lazyop(kernel(store(buf(2, shp, F), dtype=dtypes.imagef((4, 8, 4)))))
  _bad(kernel(store(buf(2, shp, dtypes.half), dtype=dtypes.imagef((4, 8, 4)))),
       r"STORE to buffer 0 of dtypes.imagef\(\(4, 8, 4\)\) from BufferOps.LOAD of dtypes.float16: CAST the value to "
       r"dtypes.float32")

@pytest.mark.parametrize("op", [BinaryOps.XOR, BinaryOps.AND, BinaryOps.OR, BinaryOps.SHL, BinaryOps.SHR])
def test_bitwise_ops_take_ints_and_shifts_no_bools(op):
  """Found by tests/test_fuzz_front.py: XOR of two float CONSTs was accepted and crashed constant folding."""
  _bad(kernel(store(alu(op, const(0.0, (4,)), const(0.0, (4,))))), rf"{op} needs int")
  if op in (BinaryOps.SHL, BinaryOps.SHR):
    _bad(kernel(store(alu(op, const(True, (4,), B), const(True, (4,), B)), dtype=B)), rf"{op} needs int operands")
  a, b = np.array([5, -3, 12, 7], np.int32), np.array([3, 1, 2, 0], np.int32)
  want = {BinaryOps.XOR: a ^ b, BinaryOps.AND: a & b, BinaryOps.OR: a | b, BinaryOps.SHL: a << b, BinaryOps.SHR: a >> b}
  ok = kernel(store(alu(op, buf(1, (4,), I), buf(2, (4,), I)), dtype=I))
  for d in DEVICES: np.testing.assert_array_equal(_run(ok, d, (4, np.int32), a, b), want[op])

def test_a_buffer_has_one_dtype_and_an_output_is_never_loaded():
  """Found by an independent tester: buffer 1 loaded as float32 and as int32 (C compilers failed on the duplicate
  parameter, the PYTHON device read both as int32), and an in-place flip buf1[i] = buf1[7 - i] (the compiled devices
  overwrote elements before reading them) were accepted."""
  _bad(kernel(store(alu(BinaryOps.ADD, buf(1, (4,), F), cast(buf(1, (4,), I), F)))),
       r"buffer 1 is accessed as dtypes.(float32|int32) and as dtypes.(int32|float32)")
  flip = LazyOp(BufferOps.STORE, (buf(1, (8,), F, st=view((8,), (-1,), 7)),), MemBuffer(1, F, view((8,), (1,))))
  _bad(LazyOp(MetaOps.KERNEL, (flip,)), r"buffer 1 is both stored and loaded: in-place kernels are not supported")
  assert verify_lazyop(kernel(store(alu(BinaryOps.ADD, buf(1, (4,), F), buf(2, (4,), F)))))

def test_a_store_writes_each_element_at_most_once():
  """Found by an independent tester: a STORE through strides (1, 1) over (8, 8) (element (i, j) -> address i + j)
  was accepted, and which of the colliding values landed differed by device and Opts. Overlapping or broadcast store
  views are refused; a permuted or flipped layout, and one whose colliding axis is masked to one position, pass."""
  def st(shape, strides, offset=0, mask=None): return view(shape, strides, offset, mask)
  val = buf(1, (8, 8), F)
  def k(s): return LazyOp(MetaOps.KERNEL, (LazyOp(BufferOps.STORE, (val,), MemBuffer(0, F, s)),))
  _bad(k(st((8, 8), (1, 1))), r"STORE to buffer 0 .* writes some element more than once \(strides \(1, 1\)")
  _bad(k(st((8, 8), (8, 7))), r"more than once")
  _bad(k(st((8, 8), (0, 1))), r"more than once")
  for ok in (st((8, 8), (1, 8)), st((8, 8), (-8, 1), 56), st((8, 8), (8, 1)), st((8, 8), (1, 1), 0, ((0, 8), (3, 4)))):
    assert verify_lazyop(k(ok))
