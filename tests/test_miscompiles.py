"""The compilers' known miscompiles (runtime/cpu.py MISCOMPILES, docs/cpu.md): each reduced case is a kernopt kernel
run under every C compiler on PATH (one parameter per compiler found: the ids say which ran; a compiler that is
missing is not a parameter, so it never counts as a pass), on the native and the static profile, against numpy."""
import os
import shutil
from dataclasses import replace
import numpy as np
import pytest
from kernopt import ast as A, dtypes
from kernopt.kernel import Kernel, Opt, OptOps
from kernopt.renderers.native import host_cpu_flags
from kernopt.runtime import Buffer, cpu

COMPILERS = [name for name in ("gcc", "clang") if shutil.which(name)]
PROFILES = ("native", "static")
pytestmark = pytest.mark.skipif(not COMPILERS, reason="no gcc or clang on PATH")

def device(compiler: str, profile: str, **options) -> cpu.CPUDevice:
  """A CPU device that builds with `compiler` (not find_compiler()'s choice), one thread."""
  kw = {"threads": 1} if profile == "native" else {}
  dev = cpu.CPUDevice(profile=profile, **kw, **options)
  dev._cc = os.path.realpath(shutil.which(compiler))
  return dev

def run(dev: cpu.CPUDevice, ast, opts: list, inputs: list[np.ndarray], out_size: int, out_dtype) -> np.ndarray:
  k = Kernel(ast, opts=dev.renderer)
  for o in opts: k.apply_opt(o)
  out = Buffer(dev, out_size, out_dtype)
  bufs = [Buffer(dev, x.size, dt).copyin(x) for x, dt in inputs]
  dev.compile(k.to_program())(out, *bufs, wait=True)
  return out.numpy()

# ***** gcc 12: SLP reduction of int accumulators through (uint32_t) casts (GCC PR 107212) *****

INT_SUM = A.kernel(A.store(0, A.sum(A.load(1, dtypes.int32, (16,)), 0)))

def int_sum(dev: cpu.CPUDevice, x: np.ndarray) -> int:
  return int(run(dev, INT_SUM, [Opt(OptOps.UNROLL, 0, 2)], [(x, dtypes.int32)], 1, dtypes.int32)[0])

@pytest.mark.parametrize("profile", PROFILES)
@pytest.mark.parametrize("compiler", COMPILERS)
def test_unrolled_int_sum(compiler, profile):
  """An int32 SUM over 16 elements with UNROLL 2 (two accumulators): gcc 12.2 at -O2 returned 3 / 28 / 56 instead of
  112 for sevens. Wrapping sums check the (uint32_t) arithmetic too."""
  dev = device(compiler, profile)
  big = np.array([2**31 - 1, 5, -7, 2**30] * 4, np.int32)
  for x in (np.full(16, 7, np.int32), np.arange(16, dtype=np.int32) - 3, big):
    assert int_sum(dev, x) == int(x.sum(dtype=np.int32)), (compiler, profile, x)

def test_table_entry_is_still_needed():
  """Where the table applies to this host's gcc, the int-sum case is wrong without the workaround: the entry is
  justified (a gcc release with the fix would fail here, asking to narrow the entry's version range)."""
  if "gcc" not in COMPILERS: pytest.skip("no gcc on PATH")
  cc = os.path.realpath(shutil.which("gcc"))
  if not cpu.workaround_flags(cpu.compiler_identity(cc)): pytest.skip(f"no table entry for {cpu.compiler_identity(cc)}")
  with_fix, without = device("gcc", "static"), device("gcc", "static", workarounds=False)
  assert "-fno-tree-loop-vectorize" in with_fix.flags() and "-fno-tree-loop-vectorize" not in without.flags()
  x = np.full(16, 7, np.int32)
  assert int_sum(with_fix, x) == 112
  assert int_sum(without, x) != 112

# ***** gcc 12: AVX-512VL masked loop vectorization of padded loads *****

PAD_ADD = A.kernel(A.store(0, A.add(A.pad(A.load(1, dtypes.float, (5, 6)), ((1, 2), (3, 0))), 1.0)))
PAD_OPTS = [Opt(OptOps.UPCAST, 0, 2), Opt(OptOps.UPCAST, 1, 3), Opt(OptOps.PADTO, 1, 8), Opt(OptOps.UPCAST, 1, 0)]

def check_pad_add(dev: cpu.CPUDevice) -> None:
  x = np.arange(30, dtype=np.float32).reshape(5, 6) + 10
  got = run(dev, PAD_ADD, PAD_OPTS, [(x.reshape(-1), dtypes.float)], 72, dtypes.float).reshape(8, 9)
  np.testing.assert_array_equal(got, np.pad(x, ((1, 2), (3, 0))) + 1)

@pytest.mark.parametrize("profile", PROFILES)
@pytest.mark.parametrize("compiler", COMPILERS)
def test_padded_add_host_isa(compiler, profile):
  """The padded add at the host's own -march (gcc 12.2 got it right without AVX-512)."""
  check_pad_add(device(compiler, profile))

AVX512 = {"avx512f", "avx512bw", "avx512dq", "avx512vl"}

@pytest.mark.parametrize("profile", PROFILES)
@pytest.mark.parametrize("compiler", COMPILERS)
def test_padded_add_avx512(compiler, profile):
  """At -march=x86-64-v4 gcc 12.2's loop vectorizer gave the pad value for 24 of 72 elements (its code never reads 10
  of the 30 inputs). Runs only where the host can execute AVX-512."""
  if not AVX512 <= host_cpu_flags(): pytest.skip("the host cannot run AVX-512 code (x86-64-v4)")
  check_pad_add(device(compiler, profile, march="x86-64-v4"))

def test_workaround_flags_follow_the_table():
  """workaround_flags reads the table by compiler name and version range (and the target's CPU flags, for an entry
  that needs one), and the flags are in the binary's key."""
  assert cpu.workaround_flags(("gcc", (12, 2, 0))) == ("-fno-tree-loop-vectorize", "-fno-tree-slp-vectorize")
  assert cpu.workaround_flags(("gcc", (12, 2, 0)), frozenset({"avx2", "avx512_fp16"})) == \
    ("-fno-tree-loop-vectorize", "-fno-tree-slp-vectorize", "-mno-avx512fp16")
  assert cpu.workaround_flags(("gcc", (13, 1, 0))) == () and cpu.workaround_flags(("clang", (12, 0, 0))) == ()
  if "gcc" in COMPILERS and cpu.workaround_flags(cpu.compiler_identity(os.path.realpath(shutil.which("gcc")))):
    a, b = device("gcc", "static"), device("gcc", "static", workarounds=False)
    assert a.cache_key("int x;") != b.cache_key("int x;")

# ***** gcc 12: -fmaf(a, b, c) folded into fnmsub, which loses the sign of an exact zero *****

NEG_FMA = A.kernel(A.store(0, A.neg(A.mulacc(A.load(1, dtypes.float, (6,)), A.load(2, dtypes.float, (6,)),
                                             A.load(3, dtypes.float, (6,))))))
# a*b + c is an exact zero in lanes 0-3 (-(a*b + c) is -0.0 there) and -0.0 + -0.0 in lane 5 (+0.0); lane 4 is -7
FMA_A = np.array([-1.0, 1.0, 2.0, -1.0, 3.0, 0.5], np.float32)
FMA_B = np.array([0.0, 0.0, 3.0, -0.0, 2.0, -0.0], np.float32)
FMA_C = np.array([0.0, 0.0, -6.0, -0.0, 1.0, -0.0], np.float32)

def neg_fma_bits(dev: cpu.CPUDevice, caps: dict) -> np.ndarray:
  if caps: dev.renderer.caps = replace(dev.renderer.caps, **caps)
  ins = [(x, dtypes.float) for x in (FMA_A, FMA_B, FMA_C)]
  return run(dev, NEG_FMA, [], ins, 6, dtypes.float).view(np.int32)

def expected_neg_fma_bits() -> np.ndarray:
  exact = FMA_A.astype(np.float64) * FMA_B + FMA_C   # exact in float64 for these operands
  return (-(exact.astype(np.float32))).view(np.int32)

@pytest.mark.parametrize("profile", PROFILES)
@pytest.mark.parametrize("compiler", COMPILERS)
def test_negated_fma_keeps_the_sign_of_zero(compiler, profile):
  """NEG(MULACC(a, b, c)) where a*b + c is an exact zero is -0.0 (found by the AST fuzzer as a BITCAST to int32).
  gcc 12.2 folds `-fmaf(a, b, c)` into vfnmsub, -(a*b) - c, which gives +0.0; the C profiles spell the NEG as a flip
  of the sign bit (passes/sign_bit_negate.py), compared bit for bit here."""
  np.testing.assert_array_equal(neg_fma_bits(device(compiler, profile), {}), expected_neg_fma_bits())

def test_sign_bit_negate_is_still_needed():
  """With the pass off, this host's gcc 12 gets the sign wrong: the pass is justified (a gcc that gets it right
  here fails this test, asking to narrow the pass to the compilers that need it)."""
  if "gcc" not in COMPILERS: pytest.skip("no gcc on PATH")
  name, version = cpu.compiler_identity(os.path.realpath(shutil.which("gcc")))
  if version[0] != 12: pytest.skip(f"seen on gcc 12 only, not checked on gcc {version}")
  got = neg_fma_bits(device("gcc", "static"), {"sign_bit_negate": False})
  assert (got != expected_neg_fma_bits()).any()

# gcc pushes the negation through what lies between the NEG and the fmaf too (the AST fuzzer's seed 45, chunk 1:
# -(c ? 0.0f : fmaf(x, 0.0f, 0.0f)) through a BITCAST to int32), and folds float64's fma the same way
_FMA6 = lambda dt: A.mulacc(*(A.load(i, dt, (6,)) for i in (1, 2, 3)))  # noqa: E731
NEG_FORMS = {
  "where": (A.kernel(A.store(0, A.neg(A.where(A.load(4, dtypes.bool, (6,)), A.load(5, dtypes.float, (6,)),
                                              _FMA6(dtypes.float))))), dtypes.float),
  "neg3": (A.kernel(A.store(0, A.neg(A.neg(A.neg(_FMA6(dtypes.float)))))), dtypes.float),
  "float64": (A.kernel(A.store(0, A.neg(_FMA6(dtypes.float64)))), dtypes.float64),
}
WHERE_C, WHERE_Y = np.array([False, False, True, False, True, False]), np.array([5.0, 5.0, -0.0, 5.0, 0.0, 5.0])

@pytest.mark.parametrize("form", sorted(NEG_FORMS))
@pytest.mark.parametrize("profile", PROFILES)
@pytest.mark.parametrize("compiler", COMPILERS)
def test_a_negation_reaching_an_fma_keeps_the_sign_of_zero(compiler, profile, form):
  """-(c ? y : fma), -(-(-fma)) and a float64 -fma, where a*b + c is an exact zero: bit for bit the exact result
  (a*b + c computed exactly in float64, then numpy's negation and select)."""
  ast, dt = NEG_FORMS[form]
  npdt, bits = (np.float64, np.int64) if dt == dtypes.float64 else (np.float32, np.int32)
  a, b, c = (x.astype(npdt) for x in (FMA_A, FMA_B, FMA_C))
  ins = [(a, dt), (b, dt), (c, dt)] + ([(WHERE_C, dtypes.bool), (WHERE_Y.astype(npdt), dt)] if form == "where" else [])
  exact = (a.astype(np.float64) * b + c).astype(npdt)
  want = -np.where(WHERE_C, WHERE_Y.astype(npdt), exact) if form == "where" else -exact
  got = run(device(compiler, profile), ast, [], ins, 6, dt)
  np.testing.assert_array_equal(got.view(bits), want.astype(npdt).view(bits))

# ***** gcc 12 with AVX512-FP16: SLP vectorization drops the roundings of float -> _Float16 -> float *****

HALF_SUM_SHAPE = (4, 17)
_SCALAR = A.view(HALF_SUM_SHAPE, (0, 0))
HALF_SUM = A.kernel(A.store(0, A.sum(A.mul(A.maximum(A.load(1, dtypes.half, _SCALAR), A.load(3, dtypes.half, _SCALAR)),
                                           A.cast(A.load(2, dtypes.float, HALF_SUM_SHAPE), dtypes.half)), 1)))
HALF_A, HALF_B = np.array([0.359], np.float16), np.array([1.511], np.float16)
HALF_X = np.random.default_rng(0).standard_normal(68).astype(np.float32)

def half_sum(dev: cpu.CPUDevice, opts: list) -> np.ndarray:
  ins = [(HALF_A, dtypes.half), (HALF_X, dtypes.float), (HALF_B, dtypes.half)]
  return run(dev, HALF_SUM, opts, ins, 4, dtypes.half)

def expected_half_sum() -> np.ndarray:
  """DESIGN's storage-float rule: each half op computed in float32 and rounded to half, the SUM accumulated in
  float32 in order and rounded once."""
  s = np.float32(max(HALF_A[0], HALF_B[0]))
  p = (s * HALF_X.astype(np.float16).astype(np.float32)).astype(np.float16).astype(np.float32).reshape(4, 17)
  acc = np.zeros(4, np.float32)
  for j in range(17): acc += p[:, j]
  return acc.astype(np.float16)

HALF_OPTS = {"none": [], "unroll-upcast": [Opt(OptOps.UNROLL, 0, 0), Opt(OptOps.UPCAST, 0, 4)]}

@pytest.mark.parametrize("opts", list(HALF_OPTS))
@pytest.mark.parametrize("profile", PROFILES)
@pytest.mark.parametrize("compiler", COMPILERS)
def test_half_sum_of_rounded_products(compiler, profile, opts):
  """sum_j half(max(a, b) * half(x[i, j])) (found by an independent tester): on an AVX512-FP16 host gcc 12.2 at
  -march=native -funroll-loops vectorizes the products without their two roundings to half (2 of 4 rows off by 3 half
  ulps; right with -mno-avx512fp16, -fno-tree-slp-vectorize or without -funroll-loops; clang 15 right)."""
  np.testing.assert_array_equal(half_sum(device(compiler, profile), HALF_OPTS[opts]), expected_half_sum())

def test_fp16_entry_is_still_needed():
  """On an AVX512-FP16 host the half sum is wrong under this gcc without the workaround (a gcc that gets it right
  fails here, asking to narrow the entry)."""
  if "gcc" not in COMPILERS: pytest.skip("no gcc on PATH")
  if "avx512_fp16" not in host_cpu_flags(): pytest.skip("the host has no AVX512-FP16: the entry does not apply")
  cc = os.path.realpath(shutil.which("gcc"))
  if "-mno-avx512fp16" not in cpu.workaround_flags(cpu.compiler_identity(cc), host_cpu_flags()):
    pytest.skip(f"no table entry for {cpu.compiler_identity(cc)}")
  with_fix, without = device("gcc", "native"), device("gcc", "native", workarounds=False)
  assert "-mno-avx512fp16" in with_fix.flags() and "-mno-avx512fp16" not in without.flags()
  assert (half_sum(with_fix, []) == expected_half_sum()).all()
  assert (half_sum(without, []) != expected_half_sum()).any()

# ***** gcc 12: SLP vectorization of narrow unsigned compare results gives -1 for true *****

U8_RECIP = np.array([0, 1, 6, 0, 2, 0, 3, 1, 6, 2, 0, 0, 8, 7, 6, 0], np.uint8)
U8_RECIP_MAX = A.kernel(A.store(0, A.max(A.idiv(A.cast(A.const(1.0, dtypes.float, (16,)), dtypes.uint8),
                                                A.load(1, dtypes.uint8, (16,))), 0)))
U8_OPTS = {"none": [], "unroll-4": [Opt(OptOps.UNROLL, 0, 4)], "unroll-all": [Opt(OptOps.UNROLL, 0, 0)]}

def u8_recip_max(dev: cpu.CPUDevice, opts: list) -> int:
  return int(run(dev, U8_RECIP_MAX, opts, [(U8_RECIP, dtypes.uint8)], 1, dtypes.uint8)[0])

def expected_u8_recip_max() -> int:
  """max_i 1 // x[i] in uint8, with x / 0 = 0 (kernopt's IDIV): 1, from the ones."""
  return int(max(1 // int(v) if v else 0 for v in U8_RECIP))

@pytest.mark.parametrize("opts", list(U8_OPTS))
@pytest.mark.parametrize("profile", PROFILES)
@pytest.mark.parametrize("compiler", COMPILERS)
def test_uint8_max_of_guarded_reciprocals(compiler, profile, opts):
  """MAX over b == 0 ? 0 : 1 / b, uint8 (the AST fuzzer's seed 31, case 3003, on the static profile): gcc 12.2 folds
  1 / b to b == 1 and SLP-vectorizes the compares, whose true lanes stay -1, so the MAX is 255 instead of 1 at -O2 on
  any x86-64 (plain SSE2 too; uint16 gives 65535; right with -fno-tree-slp-vectorize, and with clang 15)."""
  assert u8_recip_max(device(compiler, profile), U8_OPTS[opts]) == expected_u8_recip_max()

def test_slp_compare_entry_is_still_needed():
  """Without the workaround this host's gcc 12 gives 255 (a gcc that gets it right fails here, asking to narrow the
  entry)."""
  if "gcc" not in COMPILERS: pytest.skip("no gcc on PATH")
  cc = os.path.realpath(shutil.which("gcc"))
  if "-fno-tree-slp-vectorize" not in cpu.workaround_flags(cpu.compiler_identity(cc)):
    pytest.skip(f"no table entry for {cpu.compiler_identity(cc)}")
  with_fix, without = device("gcc", "static"), device("gcc", "static", workarounds=False)
  assert "-fno-tree-slp-vectorize" in with_fix.flags() and "-fno-tree-slp-vectorize" not in without.flags()
  assert u8_recip_max(with_fix, U8_OPTS["unroll-all"]) == expected_u8_recip_max() == 1
  assert u8_recip_max(without, U8_OPTS["unroll-all"]) == 255
