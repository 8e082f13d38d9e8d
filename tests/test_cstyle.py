"""The C-style renderer on hand-built linearized UOp lists, compiled and run on the CPU device against numpy and
against ops.exec_alu (the op-semantics table). Ops are batched: one kernel per dtype."""
import math
import struct
import numpy as np
import pytest
from kernopt.dtype import DType, dtypes
from kernopt.errors import UnsupportedError
from kernopt.ops import BinaryOps, TernaryOps, UnaryOps, exec_alu, truncate_float
from kernopt.renderers import BufferArg, Program
from kernopt.renderers.cstyle import CRenderer, _float_literal
from kernopt.runtime import Buffer, Device, np_dtype
from kernopt.shape.symbolic import Variable
from kernopt.uops import UOp, UOps

pytestmark = pytest.mark.skipif(not Device["CPU"].availability()[0], reason="no C compiler")

class Builder:
  """Appends each UOp the first time it is built, so building in execution order linearizes."""
  def __init__(self):
    self.uops: list[UOp] = []
    self.seen: set[UOp] = set()
  def __call__(self, op, dtype=None, src=(), arg=None) -> UOp:
    u = UOp(op, dtype, tuple(src), arg)
    if u not in self.seen:
      self.seen.add(u)
      self.uops.append(u)
    return u
  def const(self, dt, v): return self(UOps.CONST, dt, (), dtypes.as_const(v, dt))
  def glob(self, idx, dt, writable=False): return self(UOps.DEFINE_GLOBAL, dt, (), (idx, f"data{idx}", writable))
  def alu(self, op, *src, dtype=None):
    out = dtype or (dtypes.bool if op in (BinaryOps.CMPLT, BinaryOps.CMPNE) else src[-1].dtype)
    return self(UOps.ALU, out, src, op)

def run(b: Builder, inputs: dict, outputs: dict, var_vals=None, name="k"):
  """inputs: idx -> numpy array (in storage dtype); outputs: idx -> (dtype, n). Returns idx -> numpy result."""
  src = CRenderer().render(name, b.uops)
  globs = sorted((u for u in b.uops if u.op is UOps.DEFINE_GLOBAL), key=lambda u: u.arg[0])
  sizes = {i: len(a) for i, a in inputs.items()} | {i: n for i, (_, n) in outputs.items()}
  args = tuple(BufferArg(u.arg[0], u.dtype, sizes[u.arg[0]], u.arg[2]) for u in globs)
  variables = tuple(sorted((u.arg for u in b.uops if u.op is UOps.DEFINE_VAR), key=lambda v: v.expr))
  runner = Device["CPU"].compile(Program(name, src, "CPU", args=args, vars=variables))
  bufs = []
  for u in globs:
    buf = Buffer("CPU", sizes[u.arg[0]], u.dtype)
    if u.arg[0] in inputs: buf.copyin(inputs[u.arg[0]])
    else: buf.copyin(np.zeros(sizes[u.arg[0]], np_dtype(u.dtype)))
    bufs.append(buf)
  runner(*bufs, var_vals=var_vals or {}, wait=True)
  return {u.arg[0]: buf.numpy() for u, buf in zip(globs, bufs)}, src

# ***** value conversions between numpy storage and python scalars *****

def bf16_bits(x: float) -> int:
  if math.isnan(x): return 0x7FC0
  return struct.unpack("<I", struct.pack("<f", truncate_float(x, dtypes.bfloat16)))[0] >> 16

def to_py(arr: np.ndarray, dt: DType) -> list:
  if dt == dtypes.bfloat16: return [struct.unpack("<f", struct.pack("<I", int(v) << 16))[0] for v in arr]
  if dt == dtypes.bool: return [bool(v) for v in arr]
  if dtypes.is_float(dt): return [float(v) for v in arr]
  return [int(v) for v in arr]

def to_np(vals: list, dt: DType) -> np.ndarray:
  if dt == dtypes.bfloat16: return np.array([bf16_bits(v) for v in vals], np.uint16)
  return np.array(vals, dtype=np_dtype(dt))

def same(x, y) -> bool:
  if isinstance(x, float) and isinstance(y, float):
    return (math.isnan(x) and math.isnan(y)) or (x == y and math.copysign(1, x) == math.copysign(1, y))
  return x == y

def close(x, y, rtol) -> bool:
  if isinstance(x, float) and (math.isnan(x) or math.isinf(x) or math.isnan(y) or math.isinf(y)): return same(x, y)
  return abs(x - y) <= rtol * max(abs(y), 1e-30) + 1e-37

ALL = [dtypes.bool, dtypes.int8, dtypes.uint8, dtypes.int16, dtypes.uint16, dtypes.int32, dtypes.uint32,
       dtypes.int64, dtypes.uint64, dtypes.half, dtypes.bfloat16, dtypes.float32, dtypes.float64]

def values(dt: DType) -> list:
  if dt == dtypes.bool: return [False, True]
  if dtypes.is_int(dt):
    lo, hi, bits = dtypes.min(dt), dtypes.max(dt), 8 * dt.itemsize
    return sorted({dtypes.as_const(v, dt) for v in (lo, lo + 1, hi, -1, 0, 1, 2, 3, -7, bits, bits + 1, -bits)})
  big = 60000.0 if dt == dtypes.half else 1e30
  raw = (0.0, -0.0, 1.0, -1.5, 2.25, 0.1, 3.0, -7.0, big, math.inf, -math.inf, math.nan)
  return [truncate_float(v, dt) for v in raw]

INT_OPS = [UnaryOps.NEG, UnaryOps.RECIP, BinaryOps.ADD, BinaryOps.MUL, BinaryOps.IDIV, BinaryOps.MOD, BinaryOps.MAX,
           BinaryOps.CMPLT, BinaryOps.CMPNE, BinaryOps.XOR, BinaryOps.AND, BinaryOps.OR, BinaryOps.SHL, BinaryOps.SHR,
           TernaryOps.WHERE, TernaryOps.MULACC]
BOOL_OPS = [UnaryOps.NEG, BinaryOps.ADD, BinaryOps.MUL, BinaryOps.MAX, BinaryOps.CMPLT, BinaryOps.CMPNE, BinaryOps.XOR,
            BinaryOps.AND, BinaryOps.OR, TernaryOps.WHERE]
FLOAT_OPS = [UnaryOps.NEG, UnaryOps.EXP2, UnaryOps.LOG2, UnaryOps.SIN, UnaryOps.SQRT, UnaryOps.RECIP, BinaryOps.ADD,
             BinaryOps.MUL, BinaryOps.IDIV, BinaryOps.MOD, BinaryOps.MAX, BinaryOps.CMPLT, BinaryOps.CMPNE,
             TernaryOps.WHERE, TernaryOps.MULACC]
APPROX = {UnaryOps.EXP2, UnaryOps.LOG2, UnaryOps.SIN}
TOL = {dtypes.half: 1e-3, dtypes.bfloat16: 8e-3, dtypes.float32: 1e-6, dtypes.float64: 1e-14}

def operands(op, a, b, dt):
  if op in (UnaryOps.NEG, UnaryOps.EXP2, UnaryOps.LOG2, UnaryOps.SIN, UnaryOps.SQRT, UnaryOps.RECIP): return (a,)
  if op is TernaryOps.WHERE: return (a < b, a, b)
  if op is TernaryOps.MULACC: return (a, b, a)
  return (a, b)

def expected(op, dt, ops):
  try: return exec_alu(op, dtypes.bool if op in (BinaryOps.CMPLT, BinaryOps.CMPNE) else dt, ops)
  except ValueError: return math.nan  # math.fmod(inf, x) raises where IEEE (and C) give NaN

@pytest.mark.parametrize("dt", ALL, ids=lambda d: d.name)
def test_alu_parity(dt):
  ops = BOOL_OPS if dt == dtypes.bool else FLOAT_OPS if dtypes.is_float(dt) else INT_OPS
  vals = values(dt)
  pairs = [(a, c) for a in vals for c in vals]
  n = len(pairs)
  b = Builder()
  ga, gb = b.glob(0, dt), b.glob(1, dt)
  outs = {op: b.glob(2 + i, dtypes.bool if op in (BinaryOps.CMPLT, BinaryOps.CMPNE) else dt, True)
          for i, op in enumerate(ops)}
  rng = b(UOps.RANGE, dtypes.int32, (b.const(dtypes.int32, 0), b.const(dtypes.int32, n)), (0, False))
  x, y = b(UOps.LOAD, dt, (ga, rng)), b(UOps.LOAD, dt, (gb, rng))
  for op, out in outs.items():
    srcs = (b.alu(BinaryOps.CMPLT, x, y), x, y) if op is TernaryOps.WHERE else operands(op, x, y, dt)
    b(UOps.STORE, None, (out, rng, b.alu(op, *srcs, dtype=out.dtype)))
  b(UOps.ENDRANGE, None, (rng,))
  res, src = run(b, {0: to_np([p[0] for p in pairs], dt), 1: to_np([p[1] for p in pairs], dt)},
                 {2 + i: (outs[op].dtype, n) for i, op in enumerate(ops)}, name=f"parity_{dt.name.replace(' ', '_')}")
  bad = []
  for i, op in enumerate(ops):
    got = to_py(res[2 + i], outs[op].dtype)
    for (a, c), g in zip(pairs, got):
      want = expected(op, dt, operands(op, a, c, dt))
      ok = close(g, want, TOL[dt]) if op in APPROX else same(g, want)
      if not ok: bad.append((op.name, a, c, g, want))
  assert not bad, f"{len(bad)} mismatches, first: {bad[:8]}\n{src}"
  # and the ops numpy spells the same way
  a = np.array([p[0] for p in pairs], dtype=np_dtype(dt) if dt != dtypes.bfloat16 else np.float32)
  c = np.array([p[1] for p in pairs], dtype=a.dtype)
  with np.errstate(all="ignore"):
    ref = {BinaryOps.ADD: a + c, BinaryOps.MUL: a * c, BinaryOps.CMPLT: a < c, BinaryOps.CMPNE: a != c,
           BinaryOps.MAX: np.where(a > c, a, c), TernaryOps.WHERE: np.where(a < c, a, c)}
    if dtypes.is_float(dt): ref[UnaryOps.SQRT] = np.sqrt(a)
    if dtypes.is_int(dt): ref |= {BinaryOps.XOR: a ^ c, BinaryOps.AND: a & c, BinaryOps.OR: a | c}
  for op, want in ref.items():
    if dt in (dtypes.half, dtypes.bfloat16) and op in (BinaryOps.ADD, BinaryOps.MUL, UnaryOps.SQRT): continue
    got = np.array(to_py(res[2 + ops.index(op)], outs[op].dtype))
    np.testing.assert_array_equal(got, want.astype(got.dtype) if dt != dtypes.bool else want, err_msg=op.name)

@pytest.mark.parametrize("dt", ALL, ids=lambda d: d.name)
def test_casts_from(dt):
  vals = values(dt)
  if dtypes.is_float(dt): vals += [truncate_float(v, dt) for v in (100.75, -100.75, 0.5, 200.5)]
  n = len(vals)
  b = Builder()
  g = b.glob(0, dt)
  outs = {dst: b.glob(1 + i, dst, True) for i, dst in enumerate(ALL)}
  rng = b(UOps.RANGE, dtypes.int32, (b.const(dtypes.int32, 0), b.const(dtypes.int32, n)), (0, False))
  x = b(UOps.LOAD, dt, (g, rng))
  for dst, out in outs.items(): b(UOps.STORE, None, (out, rng, b(UOps.CAST, dst, (x,))))
  b(UOps.ENDRANGE, None, (rng,))
  res, src = run(b, {0: to_np(vals, dt)}, {1 + i: (dst, n) for i, dst in enumerate(ALL)}, name="cast")
  src_np = np.array(vals, dtype=np_dtype(dt) if dt != dtypes.bfloat16 else np.float32)
  for i, dst in enumerate(ALL):
    got = to_py(res[1 + i], dst)
    if dst == dtypes.bfloat16:
      want = [truncate_float(float(v), dst) if not (isinstance(v, float) and math.isnan(v)) else math.nan for v in vals]
    else:
      with np.errstate(all="ignore"): want = to_py(src_np.astype(np_dtype(dst)), dst)
    for v, gv, wv in zip(vals, got, want):
      in_range = not dtypes.is_float(dt) or dtypes.is_float(dst) or dst == dtypes.bool or \
        (math.isfinite(v) and dtypes.min(dst) <= math.trunc(v) <= dtypes.max(dst))
      if in_range: assert same(gv, wv), f"cast {dt} {v!r} -> {dst}: got {gv!r}, want {wv!r}\n{src}"

def test_bitcasts():
  groups = [[dtypes.int16, dtypes.uint16, dtypes.half, dtypes.bfloat16], [dtypes.int32, dtypes.uint32, dtypes.float32],
            [dtypes.int64, dtypes.uint64, dtypes.float64], [dtypes.int8, dtypes.uint8]]
  b = Builder()
  bits = {}
  k, cases = 0, []
  storage = {dtypes.bfloat16: np.uint16}
  for grp in groups:
    rng_bits = np.random.default_rng(0).integers(0, 256, size=8 * grp[0].itemsize, dtype=np.uint8)
    raw = np.concatenate([rng_bits, np.frombuffer(struct.pack("<d", 1.5)[:grp[0].itemsize], np.uint8)])
    for s in grp:
      for d in grp:
        if s == d: continue
        arr = raw.view(storage.get(s, np_dtype(s)))
        if s == dtypes.half: arr = np.where(np.isnan(arr), np.float16(1), arr)  # NaN payloads need not survive float
        if s == dtypes.bfloat16: arr = np.where((arr & 0x7FFF) > 0x7F80, 0x3F80, arr).astype(np.uint16)
        gi, go = b.glob(2 * k, s), b.glob(2 * k + 1, d, True)
        rng = b(UOps.RANGE, dtypes.int32, (b.const(dtypes.int32, 0), b.const(dtypes.int32, len(arr))), (k, False))
        b(UOps.STORE, None, (go, rng, b(UOps.BITCAST, d, (b(UOps.LOAD, s, (gi, rng)),))))
        b(UOps.ENDRANGE, None, (rng,))
        bits[2 * k] = arr
        cases.append((k, s, d, arr))
        k += 1
  res, src = run(b, bits, {2 * k + 1: (d, len(arr)) for k, s, d, arr in cases}, name="bitcasts")
  for k, s, d, arr in cases:
    want = arr.view(storage.get(d, np_dtype(d)))
    np.testing.assert_array_equal(res[2 * k + 1].view(np.uint8), want.view(np.uint8), err_msg=f"{s} -> {d}")

def test_storage_rounding():
  xs = np.array([1 + 2**-11, 1 + 3 * 2**-11, 1 + 2**-8, 1 + 3 * 2**-8, 65519.0, 65520.0, 1e-8, -0.0, np.nan,
                 np.inf, 3.4e38, 0.1, -2.5e-6], np.float32)
  b = Builder()
  g, oh, ob = b.glob(0, dtypes.float32), b.glob(1, dtypes.half, True), b.glob(2, dtypes.bfloat16, True)
  rng = b(UOps.RANGE, dtypes.int32, (b.const(dtypes.int32, 0), b.const(dtypes.int32, len(xs))), (0, False))
  x = b(UOps.LOAD, dtypes.float32, (g, rng))
  b(UOps.STORE, None, (oh, rng, b(UOps.CAST, dtypes.half, (x,))))
  b(UOps.STORE, None, (ob, rng, b(UOps.CAST, dtypes.bfloat16, (x,))))
  b(UOps.ENDRANGE, None, (rng,))
  res, _ = run(b, {0: xs}, {1: (dtypes.half, len(xs)), 2: (dtypes.bfloat16, len(xs))})
  with np.errstate(over="ignore"): np.testing.assert_array_equal(res[1], xs.astype(np.float16))
  assert [int(v) for v in res[2]] == [bf16_bits(float(v)) for v in xs]
  assert res[2][0] == 0x3F80 and res[2][3] == 0x3F82 and res[2][8] & 0x7FFF > 0x7F80

def test_elementwise_add_with_variable():
  b = Builder()
  out, x, y = b.glob(0, dtypes.float32, True), b.glob(1, dtypes.float32), b.glob(2, dtypes.float32)
  n = b(UOps.DEFINE_VAR, dtypes.int32, (), Variable("n", 1, 64))
  rng = b(UOps.RANGE, dtypes.int32, (b.const(dtypes.int32, 0), n), (0, False))
  b(UOps.STORE, None, (out, rng, b.alu(BinaryOps.ADD, b(UOps.LOAD, dtypes.float32, (x, rng)),
                                       b(UOps.LOAD, dtypes.float32, (y, rng)))))
  b(UOps.ENDRANGE, None, (rng,))
  xa, ya = np.random.default_rng(1).standard_normal((2, 64)).astype(np.float32)
  res, src = run(b, {1: xa, 2: ya}, {0: (dtypes.float32, 64)}, var_vals={"n": 37})
  assert "int v_n)" in src and "float* restrict data0, const float* restrict data1" in src
  np.testing.assert_array_equal(res[0][:37], xa[:37] + ya[:37])
  assert not res[0][37:].any()

def test_a_renderer_that_rendered_still_pickles():
  """Search sends the renderer to its worker processes: what a render memoizes (spellings are closures) stays off the
  renderer, which pickles after rendering and renders the same source when unpickled."""
  import pickle
  from kernopt.renderers.native import NativeCRenderer
  b = Builder()
  out, x = b.glob(0, dtypes.int32, True), b.glob(1, dtypes.int32)
  rng = b(UOps.RANGE, dtypes.int32, (b.const(dtypes.int32, 0), b.const(dtypes.int32, 8)), (0, False))
  ld = b(UOps.LOAD, dtypes.int32, (x, rng))
  b(UOps.STORE, None, (out, rng, b.alu(BinaryOps.MUL, b.alu(BinaryOps.ADD, ld, rng), ld)))
  b(UOps.ENDRANGE, None, (rng,))
  for r in (CRenderer(), NativeCRenderer(vector_width=8, threads=1)):
    src = r.render("k", b.uops)
    assert "((int32_t)((uint32_t)" in src and pickle.loads(pickle.dumps(r)).render("k", b.uops) == src

def test_reduce_with_acc_and_guarded_load():
  """out[i] = sum_j (i+j < 10 ? x[i+j] : 100) * 0.1f over j in [0, 4), and out stored only where i != 2."""
  b = Builder()
  out, x = b.glob(0, dtypes.float32, True), b.glob(1, dtypes.float32)
  c = lambda v: b.const(dtypes.int32, v)  # noqa: E731
  i = b(UOps.RANGE, dtypes.int32, (c(0), c(8)), (0, False))
  j = b(UOps.RANGE, dtypes.int32, (c(0), c(4)), (1, True))
  acc = b(UOps.DEFINE_ACC, dtypes.float32, (j,), (0.0, 0))
  b.uops.remove(j)
  b.uops.insert(b.uops.index(acc) + 1, j)  # the accumulator is declared before its loop opens
  idx = b.alu(BinaryOps.ADD, i, j)
  val = b(UOps.LOAD, dtypes.float32, (x, idx, b.alu(BinaryOps.CMPLT, idx, c(10)), b.const(dtypes.float32, 100.0)))
  phi = b(UOps.PHI, dtypes.float32, (acc, b.alu(BinaryOps.ADD, acc, val)))
  b(UOps.ENDRANGE, None, (j,))
  scaled = b.alu(BinaryOps.MUL, phi, b.const(dtypes.float32, 0.1))
  b(UOps.STORE, None, (out, i, scaled, b.alu(BinaryOps.CMPNE, i, c(2))))
  b(UOps.ENDRANGE, None, (i,))
  xa = np.arange(10, dtype=np.float32)
  res, src = run(b, {1: xa}, {0: (dtypes.float32, 8)})
  padded = np.concatenate([xa, np.full(4, 100, np.float32)])
  want = np.array([padded[k:k + 4].sum(dtype=np.float32) for k in range(8)], np.float32) * np.float32(0.1)
  want[2] = 0
  np.testing.assert_allclose(res[0], want, rtol=1e-6)
  assert "acc0 = " in src and "?" in src and "if (" in src

def test_vectors_gcc_extensions():
  """A float4 load, GEP of each lane and VECTORIZE + vector store (supports_float4 is off, but the C dialect
  still spells vectors)."""
  b = Builder()
  out, x = b.glob(0, dtypes.float32, True), b.glob(1, dtypes.float32)
  i = b(UOps.RANGE, dtypes.int32, (b.const(dtypes.int32, 0), b.const(dtypes.int32, 3)), (0, False))
  base = b.alu(BinaryOps.ADD, b.alu(BinaryOps.MUL, i, b.const(dtypes.int32, 4)), b.const(dtypes.int32, 1))
  v = b(UOps.LOAD, dtypes.float32.vec(4), (x, base))
  lanes = [b(UOps.GEP, dtypes.float32, (v,), k) for k in (3, 2, 1, 0)]
  vec = b(UOps.VECTORIZE, dtypes.float32.vec(4), lanes)
  b(UOps.STORE, None, (out, b.alu(BinaryOps.MUL, i, b.const(dtypes.int32, 4)), vec))
  b(UOps.ENDRANGE, None, (i,))
  xa = np.arange(13, dtype=np.float32)
  res, src = run(b, {1: xa}, {0: (dtypes.float32, 12)})
  np.testing.assert_array_equal(res[0], xa[1:13].reshape(3, 4)[:, ::-1].reshape(-1))
  assert "vector_size(16)" in src

def test_constants_round_trip():
  consts = [0.1, 1e-45, 3.4028234663852886e38, -0.0, math.inf, -math.inf, math.nan, 1.0, 123456.789, -2.5e-38]
  b = Builder()
  out, outd = b.glob(0, dtypes.float32, True), b.glob(1, dtypes.float64, True)
  for k, v in enumerate(consts):
    b(UOps.STORE, None, (out, b.const(dtypes.int32, k), b.const(dtypes.float32, v)))
    b(UOps.STORE, None, (outd, b.const(dtypes.int32, k), b.const(dtypes.float64, v)))
  res, src = run(b, {}, {0: (dtypes.float32, len(consts)), 1: (dtypes.float64, len(consts))})
  np.testing.assert_array_equal(res[0].view(np.uint32), np.array(consts, np.float32).view(np.uint32))
  np.testing.assert_array_equal(res[1].view(np.uint64), np.array(consts, np.float64).view(np.uint64))
  assert " = 0.1f;" in src and _float_literal(1.0) == "1.0"
  for dt in (dtypes.int8, dtypes.int32, dtypes.int64, dtypes.uint64):
    b = Builder()
    o = b.glob(0, dt, True)
    for k, v in enumerate((dtypes.min(dt), dtypes.max(dt), -1)):
      b(UOps.STORE, None, (o, b.const(dtypes.int32, k), b.const(dt, v)))
    res, _ = run(b, {}, {0: (dt, 3)})
    assert [int(v) for v in res[0]] == [dtypes.min(dt), dtypes.max(dt), dtypes.as_const(-1, dt)]

def test_unsupported():
  r = CRenderer()
  b = Builder()
  g = b.glob(0, dtypes.imagef((4, 4, 4)), True)
  with pytest.raises(UnsupportedError, match="image"): r.render("k", b.uops)
  b = Builder()
  b(UOps.SPECIAL, dtypes.int32, (), (0, "gidx0", 16))
  with pytest.raises(UnsupportedError, match="gidx0"): r.render("k", b.uops)
  b = Builder()
  g = b.glob(0, dtypes.int32, True)
  b(UOps.STORE, None, (g, b.const(dtypes.int32, 0), b.alu(UnaryOps.SQRT, b.const(dtypes.int32, 4))))
  with pytest.raises(UnsupportedError, match="sqrt"): r.render("k", b.uops)
  b = Builder()
  g = b.glob(0, dtypes.half, True)
  b(UOps.LOAD, dtypes.half.vec(4), (g, b.const(dtypes.int32, 0)))
  with pytest.raises(UnsupportedError, match="vector"): r.render("k", b.uops)

def test_dialect_table_fallback():
  """A dialect overrides one spelling; everything else falls back to the base table."""
  class Plain(CRenderer):
    code_for_op = {BinaryOps.ADD: "({0}+{1})", BinaryOps.XOR: None}
  assert Plain().render_alu(BinaryOps.ADD, dtypes.int32, ["a", "b"]) == "(a+b)"
  assert "uint32_t" in CRenderer().render_alu(BinaryOps.ADD, dtypes.int32, ["a", "b"])
  assert Plain().render_alu(BinaryOps.CMPLT, dtypes.int32, ["a", "b"]) == "(a<b)"
  with pytest.raises(UnsupportedError, match="XOR"): Plain().render_alu(BinaryOps.XOR, dtypes.int32, ["a", "b"])
  assert CRenderer().capabilities()["has_local"] is False and CRenderer().caps.global_max is None

# ***** every C compiler on the machine takes the C dialect's half kernels *****

def _c_compilers() -> list[str]:
  import shutil
  names = ["gcc", "clang"] + [f"clang-{v}" for v in range(14, 21)]
  return [p for p in dict.fromkeys(shutil.which(n) for n in names) if p is not None]

@pytest.mark.parametrize("cc", _c_compilers())
def test_half_kernels_compile_with_every_c_compiler(cc, tmp_path):
  """half is _Float16 where the compiler has it and clang's storage-only __fp16 elsewhere (clang 14 on x86 has no
  _Float16): the catalogue's half kernels must compile with each C compiler found, not only the default one."""
  import subprocess
  from catalogue import get
  from kernopt.kernel import Kernel
  srcs = []
  for name in ("matmul_half", "casts"):
    k = Kernel(get(name).ast, opts=CRenderer()).required_optimizations().hand_coded_optimizations()
    srcs.append(k.to_program().src)
  for i, src in enumerate(srcs):
    path = tmp_path / f"k{i}.c"
    path.write_text(src)
    out = subprocess.run([cc, "-O1", "-c", str(path), "-o", str(tmp_path / f"k{i}.o")], capture_output=True, text=True)
    assert out.returncode == 0, f"{cc} rejected the half kernel:\n{out.stderr[-2000:]}"
