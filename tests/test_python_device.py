"""The PYTHON device on hand-built linearized UOp lists, compared with numpy (its ALU against the op table:
tests/test_python_alu.py)."""
import numpy as np
import pytest
from kernopt.dtype import dtypes
from kernopt.errors import LaunchError
from kernopt.ops import BinaryOps, exec_alu, truncate_float
from kernopt.runtime import Buffer, Device, cpu, np_dtype
from kernopt.runtime.python import EmulationError, OutOfBoundsError, RaceError, make_program
from kernopt.uops import UOp, UOps
from test_python_alu import SCALARS, values

i32, f32 = dtypes.int32, dtypes.float32

class Prog:
  """Collects uops in execution order: p(op, dtype, src, arg) builds, appends and returns a UOp."""
  def __init__(self) -> None: self.uops: list[UOp] = []
  def __call__(self, op: UOps, dtype=None, src=(), arg=None) -> UOp:
    u = UOp(op, dtype, tuple(src), arg)
    if u not in self.uops: self.uops.append(u)  # uops are interned: a repeated CONST is the same node
    return u
  def const(self, v, dt=i32) -> UOp: return self(UOps.CONST, dt, (), v)
  def alu(self, op, *src, dtype=None) -> UOp:
    dt = dtype or (dtypes.bool if op in (BinaryOps.CMPLT, BinaryOps.CMPNE) else src[-1].dtype)
    return self(UOps.ALU, dt, src, op)
  def buf(self, idx, dt, writable=False) -> UOp: return self(UOps.DEFINE_GLOBAL, dt, (), (idx, f"data{idx}", writable))
  def special(self, name, size) -> UOp: return self(UOps.SPECIAL, i32, (), (int(name[-1]), name, size))

def launch(dev, name, p, gsz, lsz, arrays, dts, min_sizes=None, var_vals=None):
  prg = make_program(name, p.uops, gsz, lsz, min_sizes or {}, emulate=getattr(dev, "emulate", None))
  bufs = [Buffer(dev.name, a.size, dt).copyin(a) if a is not None else None for a, dt in zip(arrays, dts)]
  dev.compile(prg)(*bufs, var_vals=var_vals or {}, wait=True)
  return [b.numpy() for b in bufs]

@pytest.fixture(scope="module")
def dev(): return Device.open("PYTHON")

def test_elementwise_specials_and_workgroups(dev):
  p = Prog()
  out, a, b = p.buf(0, f32, True), p.buf(1, f32), p.buf(2, f32)
  g0, g1, l0 = p.special("gidx0", 3), p.special("gidx1", 2), p.special("lidx0", 4)
  gid = p.alu(BinaryOps.ADD, p.alu(BinaryOps.MUL, g1, p.const(3)), g0)
  idx = p.alu(BinaryOps.ADD, p.alu(BinaryOps.MUL, gid, p.const(4)), l0)
  twice = p.alu(BinaryOps.MUL, p(UOps.LOAD, f32, (a, idx)), p.const(2.0, f32))
  x = p.alu(BinaryOps.ADD, twice, p(UOps.LOAD, f32, (b, idx)))
  p(UOps.STORE, None, (out, idx, x))
  rng = np.random.default_rng(0)
  av, bv = rng.standard_normal(24).astype(np.float32), rng.standard_normal(24).astype(np.float32)
  res = launch(dev, "elementwise", p, (3, 2), (4,), [np.zeros(24, np.float32), av, bv], [f32] * 3,
               {0: 24, 1: 24, 2: 24})
  np.testing.assert_array_equal(res[0], av * 2 + bv)

def _reduce_rows(p, a, row, n):
  """acc = sum_j a[row*n + j] as DEFINE_ACC / RANGE / PHI / ENDRANGE; returns the PHI."""
  acc = p(UOps.DEFINE_ACC, f32, (), 0.0)
  r = p(UOps.RANGE, i32, (p.const(0), n), (1, True))
  x = p(UOps.LOAD, f32, (a, p.alu(BinaryOps.ADD, p.alu(BinaryOps.MUL, row, n), r)))
  phi = p(UOps.PHI, f32, (acc, p.alu(BinaryOps.ADD, acc, x)))
  p(UOps.ENDRANGE, None, (r,))
  return phi

def test_reduce_loop_acc_phi(dev):
  p = Prog()
  out, a = p.buf(0, f32, True), p.buf(1, f32)
  g = p.special("gidx0", 6)
  phi = _reduce_rows(p, a, g, p.const(10))
  p(UOps.STORE, None, (out, g, phi))
  av = np.arange(60, dtype=np.float32) * 0.5
  res = launch(dev, "reduce_rows", p, (6,), None, [np.zeros(6, np.float32), av], [f32, f32], {0: 6, 1: 60})
  np.testing.assert_allclose(res[0], av.reshape(6, 10).sum(1), rtol=1e-6)

def test_range_bounds_from_variable_and_thread(dev):
  from kernopt.shape.symbolic import Variable
  p = Prog()
  out, a = p.buf(0, f32, True), p.buf(1, f32)
  g = p.special("gidx0", 8)
  n = p(UOps.DEFINE_VAR, i32, (), Variable("n", 1, 16))
  acc = p(UOps.DEFINE_ACC, f32, (), 0.0)
  end = p.alu(BinaryOps.ADD, g, n)      # trip counts differ between threads: out[g] = sum a[0 : g + n]
  r = p(UOps.RANGE, i32, (p.const(0), end), (1, True))
  phi = p(UOps.PHI, f32, (acc, p.alu(BinaryOps.ADD, acc, p(UOps.LOAD, f32, (a, r)))))
  p(UOps.ENDRANGE, None, (r,))
  p(UOps.STORE, None, (out, g, phi))
  av = np.arange(32, dtype=np.float32)
  res = launch(dev, "triangle", p, (8,), None, [np.zeros(8, np.float32), av], [f32, f32], {0: 8, 1: 32}, {"n": 5})
  np.testing.assert_array_equal(res[0], [av[:g + 5].sum() for g in range(8)])

def _group_reduce(with_barrier: bool) -> Prog:
  """Each of 16 threads of a workgroup sums 4 elements into temp[lidx]; thread 0 sums temp into out[gidx]."""
  p = Prog()
  out, a = p.buf(0, f32, True), p.buf(1, f32)
  g, lid = p.special("gidx0", 3), p.special("lidx0", 16)
  tmp = p(UOps.DEFINE_LOCAL, f32, (), ("temp", 16))
  part = _reduce_rows(p, a, p.alu(BinaryOps.ADD, p.alu(BinaryOps.MUL, g, p.const(16)), lid), p.const(4))
  st = p(UOps.STORE, None, (tmp, lid, part))
  bar = p(UOps.BARRIER, None, (st,)) if with_barrier else None
  cond = p.alu(BinaryOps.CMPLT, lid, p.const(1))
  iff = p(UOps.IF, None, (cond, bar) if bar is not None else (cond,))
  acc = p(UOps.DEFINE_ACC, f32, (), 1.0)  # a distinct accumulator (interned uops): start at 1 and subtract below
  r = p(UOps.RANGE, i32, (p.const(0), p.const(16)), (2, True))
  x = p(UOps.LOAD, f32, (tmp, r, bar) if bar is not None else (tmp, r))
  phi = p(UOps.PHI, f32, (acc, p.alu(BinaryOps.ADD, acc, x)))
  p(UOps.ENDRANGE, None, (r,))
  p(UOps.STORE, None, (out, g, p.alu(BinaryOps.ADD, phi, p.const(-1.0, f32))))
  p(UOps.ENDIF, None, (iff,))
  return p

def test_group_reduce_through_local_memory(dev):
  av = np.random.default_rng(1).integers(-8, 8, 192).astype(np.float32)
  res = launch(dev, "group_reduce", _group_reduce(True), (3,), (16,), [np.zeros(3, np.float32), av], [f32, f32],
               {0: 3, 1: 192})
  np.testing.assert_array_equal(res[0], av.reshape(3, 64).sum(1))

def test_missing_barrier_is_a_race(dev):
  av = np.ones(192, np.float32)
  with pytest.raises(RaceError, match=r"group_reduce_nobarrier.*temp\[1\].*written by thread 1"):
    launch(dev, "group_reduce_nobarrier", _group_reduce(False), (3,), (16,), [np.zeros(3, np.float32), av],
           [f32, f32], {0: 3, 1: 192})

def test_barrier_in_divergent_code(dev):
  p = Prog()
  out = p.buf(0, f32, True)
  lid = p.special("lidx0", 4)
  tmp = p(UOps.DEFINE_LOCAL, f32, (), ("temp", 4))
  iff = p(UOps.IF, None, (p.alu(BinaryOps.CMPLT, lid, p.const(2)),))
  st = p(UOps.STORE, None, (tmp, lid, p.const(1.0, f32)))
  p(UOps.BARRIER, None, (st,))
  p(UOps.STORE, None, (out, lid, p.const(2.0, f32)))
  p(UOps.ENDIF, None, (iff,))
  with pytest.raises(EmulationError, match="divergent: BARRIER reached by only some threads of workgroup 0"):
    launch(dev, "divergent", p, (1,), (4,), [np.zeros(4, np.float32)], [f32], {0: 4})

def test_use_before_definition_is_a_compile_error(dev):
  from kernopt.errors import CompileError
  p = Prog()
  out, g = p.buf(0, f32, True), p.special("gidx0", 2)
  st = UOp(UOps.STORE, None, (out, g, p.const(1.0, f32)))
  p.uops.insert(0, st)
  with pytest.raises(CompileError, match="STORE at 0 uses a DEFINE_GLOBAL"):
    dev.compile(make_program("early", p.uops, (2,), None, {0: 2}))

def test_renderer_profiles():
  from kernopt.errors import UnsupportedError
  from kernopt.renderers import get_renderer
  for name in ("CUDA", "METAL", "AMD"):
    r, ref = Device.open("PYTHON", emulate=name).renderer.caps, get_renderer(name).caps
    assert (r.device, r.tensor_cores, r.local_max, r.shared_max) == (ref.device, ref.tensor_cores, ref.local_max,
                                                                     ref.shared_max)
  r = Device.open("PYTHON").renderer
  assert (r.caps.device, r.caps.has_local, r.caps.supports_images, r.caps.tensor_cores) == ("PYTHON", True, True, ())
  p = Prog()
  p(UOps.STORE, None, (p.buf(0, f32, True), p.special("gidx0", 2), p.const(1.0, f32)))
  assert "STORE" in r.render("k", p.uops) and "gidx0" in r.render("k", p.uops)
  with pytest.raises(UnsupportedError): Device.open("PYTHON", emulate="VULKAN")

def test_vector_load_store_gep_vectorize(dev):
  p = Prog()
  f4 = f32.vec(4)
  out, a = p.buf(0, f32, True), p.buf(1, f32)
  base = p.alu(BinaryOps.MUL, p.special("gidx0", 5), p.const(4))
  v = p(UOps.LOAD, f4, (a, base))
  lanes = [p(UOps.GEP, f32, (v,), i) for i in range(4)]
  rev = p(UOps.VECTORIZE, f4, tuple(reversed(lanes)))
  p(UOps.STORE, None, (out, base, p.alu(BinaryOps.MUL, rev, p.const(3.0, f4))))
  av = np.arange(20, dtype=np.float32)
  res = launch(dev, "vec4", p, (5,), (1,), [np.zeros(20, np.float32), av], [f32, f32], {0: 20, 1: 20})
  np.testing.assert_array_equal(res[0], av.reshape(5, 4)[:, ::-1].reshape(-1) * 3)

def test_guarded_load_does_not_fault(dev):
  p = Prog()
  out, a = p.buf(0, f32, True), p.buf(1, f32)
  t = p.special("lidx0", 8)
  src = p.alu(BinaryOps.ADD, t, p.const(-1))                          # a[t-1], 0 for t == 0
  valid = p.alu(BinaryOps.CMPLT, p.const(0), t)
  p(UOps.STORE, None, (out, t, p(UOps.LOAD, f32, (a, src, valid, p.const(0.0, f32)))))
  av = np.arange(1, 9, dtype=np.float32)
  res = launch(dev, "shift", p, (1,), (8,), [np.zeros(8, np.float32), av], [f32, f32], {0: 8, 1: 8})
  np.testing.assert_array_equal(res[0], np.concatenate([[0], av[:-1]]))

def test_out_of_bounds_names_kernel_buffer_index(dev):
  p = Prog()
  out = p.buf(0, f32, True)
  t = p.special("gidx0", 8)
  p(UOps.STORE, None, (out, p.alu(BinaryOps.ADD, t, p.const(1)), p.const(1.0, f32)))
  with pytest.raises(OutOfBoundsError, match=r"oob_store: thread 0 of workgroup 7 stores data0\[8\]"):
    launch(dev, "oob_store", p, (8,), None, [np.zeros(8, np.float32)], [f32], {0: 8})

def test_masked_off_threads_do_not_fault(dev):
  p = Prog()
  out, a = p.buf(0, f32, True), p.buf(1, f32)
  t = p.special("gidx0", 8)
  iff = p(UOps.IF, None, (p.alu(BinaryOps.CMPLT, t, p.const(4)),))
  x = p(UOps.LOAD, f32, (a, p.alu(BinaryOps.MUL, t, p.const(2))))  # index 8..14 only where the IF is false
  p(UOps.STORE, None, (out, t, x))
  p(UOps.ENDIF, None, (iff,))
  av = np.arange(8, dtype=np.float32)
  res = launch(dev, "masked", p, (8,), None, [np.full(8, -1, np.float32), av], [f32, f32], {0: 8, 1: 8})
  np.testing.assert_array_equal(res[0], [0, 2, 4, 6, -1, -1, -1, -1])

def test_too_small_buffer_is_a_launch_error(dev):
  p = Prog()
  out = p.buf(0, f32, True)
  p(UOps.STORE, None, (out, p.special("gidx0", 8), p.const(1.0, f32)))
  with pytest.raises(LaunchError, match="addresses 8"):
    launch(dev, "small", p, (8,), None, [np.zeros(4, np.float32)], [f32], {0: 8})

def test_store_to_readonly_buffer(dev):
  p = Prog()
  out = p.buf(0, f32, False)
  p(UOps.STORE, None, (out, p.special("gidx0", 2), p.const(1.0, f32)))
  with pytest.raises(EmulationError, match="read-only buffer data0"):
    launch(dev, "ro", p, (2,), None, [np.zeros(2, np.float32)], [f32], {0: 2})

def test_cast_to_half_and_bfloat16_rounds_to_nearest_even(dev):
  p = Prog()
  oh, ob, oi, a = p.buf(0, dtypes.half, True), p.buf(1, dtypes.bfloat16, True), p.buf(2, i32, True), p.buf(3, f32)
  t = p.special("gidx0", 64)
  x = p(UOps.LOAD, f32, (a, t))
  p(UOps.STORE, None, (oh, t, p(UOps.CAST, dtypes.half, (x,))))
  p(UOps.STORE, None, (ob, t, p(UOps.CAST, dtypes.bfloat16, (x,))))
  p(UOps.STORE, None, (oi, t, p(UOps.BITCAST, i32, (x,))))
  av = np.random.default_rng(2).standard_normal(64).astype(np.float32) * 100
  av[:4] = [1 + 2 ** -8, 1 + 3 * 2 ** -8, 65519.0, 70000.0]  # bf16 ties (to even: down, up); half max rounding
  outs = [np.zeros(64, np.float16), np.zeros(64, np.uint16), np.zeros(64, np.int32)]
  res = launch(dev, "casts", p, (64,), None, outs + [av], [dtypes.half, dtypes.bfloat16, i32, f32],
               {0: 64, 1: 64, 2: 64, 3: 64})
  with np.errstate(over="ignore"): np.testing.assert_array_equal(res[0], av.astype(np.float16))
  bf = (res[1].astype(np.uint32) << 16).view(np.float32)
  np.testing.assert_array_equal(bf, [truncate_float(float(v), dtypes.bfloat16) for v in av])
  np.testing.assert_array_equal(res[2], av.view(np.int32))

def test_bfloat16_buffer_loads_and_computes():
  dev = Device.open("PYTHON", emulate="CUDA")
  p = Prog()
  out, a = p.buf(0, dtypes.bfloat16, True), p.buf(1, dtypes.bfloat16)
  t = p.special("gidx0", 16)
  x = p(UOps.LOAD, dtypes.bfloat16, (a, t))
  p(UOps.STORE, None, (out, t, p.alu(BinaryOps.MUL, x, p.const(1.0078125, dtypes.bfloat16))))
  vals = np.linspace(-3, 3, 16)
  bits = np.array([np.float32(truncate_float(v, dtypes.bfloat16)).view(np.uint32) >> 16 for v in vals], np.uint16)
  res = launch(dev, "bf16mul", p, (16,), None, [np.zeros(16, np.uint16), bits], [dtypes.bfloat16] * 2, {0: 16, 1: 16})
  got = (res[0].astype(np.uint32) << 16).view(np.float32)
  src = (bits.astype(np.uint32) << 16).view(np.float32)
  np.testing.assert_array_equal(got, [exec_alu(BinaryOps.MUL, dtypes.bfloat16, (float(v), 1.0078125)) for v in src])

@pytest.mark.parametrize("device", ["PYTHON", "CPU"])
def test_bfloat16_copyin_converts_values_and_keeps_bit_patterns(device):
  """Found by an independent tester: copyin of float32 values into a bfloat16 Buffer stored astype(uint16) of the
  values (1.0 became the bits 0x0001). Values are rounded to nearest even (numpy's oracle below: the float32 bits
  rounded at bit 16); uint16 arrays, what numpy() returns, are bit patterns; a kernel x * 2 reads the values."""
  if device == "CPU" and not cpu.CPUDevice.availability()[0]: pytest.skip("no C compiler")
  from kernopt import ast as A
  from kernopt.kernel import Kernel
  vals = np.array([1.0, 2.5, -3.0, 1.00390625, 1.01171875, np.inf, 3.4e38], np.float32)  # ties to even; overflow
  want = np.array([0x3F80, 0x4020, 0xC040, 0x3F80, 0x3F82, 0x7F80, 0x7F80], np.uint16)
  b = Buffer(device, vals.size, dtypes.bfloat16).copyin(vals)
  np.testing.assert_array_equal(b.numpy(), want)
  assert (b.copyin(want).numpy() == want).all() and np.isnan(
    (Buffer(device, 1, dtypes.bfloat16).copyin(np.array([np.nan])).numpy().astype(np.uint32) << 16).view(np.float32))
  dev = Device[device]
  o = Buffer(dev, 3, dtypes.bfloat16)
  x = Buffer(dev, 3, dtypes.bfloat16).copyin(np.array([1.0, 2.5, -3.0]))
  dev.compile(Kernel(A.kernel(A.store(0, A.mul(A.load(1, dtypes.bfloat16, (3,)), 2.0))), opts=dev.renderer)
              .to_program())(o, x, wait=True)
  np.testing.assert_array_equal((o.numpy().astype(np.uint32) << 16).view(np.float32), [2.0, 5.0, -6.0])

def test_image_load_and_store(dev):
  img = dtypes.imagef((3, 4, 4))
  f4, i2 = f32.vec(4), i32.vec(2)
  p = Prog()
  out, src = p.buf(0, img, True), p.buf(1, img)
  x, y = p.special("gidx0", 4), p.special("gidx1", 3)
  xy_in = p(UOps.VECTORIZE, i2, (p.alu(BinaryOps.ADD, x, p.const(1)), y))  # x + 1 reads past the right edge -> 0
  v = p(UOps.LOAD, f4, (src, xy_in))
  p(UOps.STORE, None, (out, p(UOps.VECTORIZE, i2, (x, y)), p.alu(BinaryOps.ADD, v, p.const(1.0, f4))))
  data = np.arange(48, dtype=np.float32).reshape(3, 4, 4)
  res = launch(dev, "image", p, (4, 3), None, [np.zeros(48, np.float32), data.reshape(-1)], [img, img])
  want = np.concatenate([data[:, 1:], np.zeros((3, 1, 4), np.float32)], axis=1) + 1
  np.testing.assert_array_equal(res[0].reshape(3, 4, 4), want)

def test_storage_dtypes_roundtrip(dev):
  for dt in SCALARS:
    vals = np.resize(np.array(values(dt)), 4)
    arr = vals.astype(np_dtype(dt)) if dt != dtypes.bfloat16 else np.arange(4, dtype=np.uint16)
    np.testing.assert_array_equal(Buffer("PYTHON", 4, dt).copyin(arr).numpy(), arr)

# ***** end to end: the catalogue through the standard protocol, on PYTHON emulating each GPU dialect *****

def _catalogue():
  try:
    from catalogue import catalogue
  except ImportError: return []
  return catalogue("small")

def _program(dev, case, use_tc=None):
  from kernopt.errors import UnsupportedError
  from kernopt.helpers import config_override
  from kernopt.kernel import Kernel
  knobs = {} if use_tc is None else {"USE_TC": use_tc}
  try:
    with config_override(**knobs):
      k = Kernel(case.ast, opts=dev.renderer).required_optimizations()
      if not k.apply_tensor_cores(): k.hand_coded_optimizations()
      return k, k.to_program()
  except UnsupportedError as e: pytest.skip(f"codegen does not support this yet: {e}")

def _run_and_check(dev, case, prg):
  from catalogue import bf16_to_f32
  runner = dev.compile(prg)
  inputs = case.inputs(np.random.default_rng(7))
  for var_vals in case.var_vals:
    bufs = {s.idx: Buffer(dev.name, s.numel, s.dtype) for s in case.buffers}
    for idx, arr in inputs.items(): bufs[idx].copyin(arr)
    runner(*[bufs[a.idx] for a in prg.args], var_vals=var_vals)
    want = case.reference(inputs, var_vals)
    for spec in case.outputs:
      w = np.asarray(want[spec.idx]).reshape(-1)
      got = bufs[spec.idx].numpy()[:w.size]
      if spec.dtype == dtypes.bfloat16: got, w = bf16_to_f32(got), bf16_to_f32(w)
      if case.tol == 0 or not dtypes.is_float(spec.dtype): np.testing.assert_array_equal(got, w.astype(got.dtype))
      else:
        scale = max(1.0, float(np.nanmax(np.abs(w.astype(np.float64)), initial=0.0)))
        np.testing.assert_allclose(got.astype(np.float64), w.astype(np.float64), rtol=case.tol, atol=case.tol * scale)

@pytest.mark.parametrize("emulate", [None, "CUDA", "METAL", "AMD"], ids=str)
@pytest.mark.parametrize("case", _catalogue(), ids=lambda c: c.name)
def test_catalogue_on_emulated_dialects(case, emulate):
  dev = Device.open("PYTHON", emulate=emulate)
  if "image" in case.tags and emulate is not None:
    from kernopt.errors import UnsupportedError
    from kernopt.kernel import Kernel
    with pytest.raises(UnsupportedError, match="image"):  # DESIGN.md: only OpenCL (and generic PYTHON) have images
      k = Kernel(case.ast, opts=dev.renderer).required_optimizations().hand_coded_optimizations()
      k.to_program()
    return
  _, prg = _program(dev, case)
  _run_and_check(dev, case, prg)

@pytest.mark.parametrize("name,emulate", [("matmul_half", "CUDA"), ("matmul_bf16", "CUDA"), ("matmul_half", "METAL"),
                                          ("matmul_64", "METAL"), ("matmul_half", "AMD")])
def test_tensor_core_shapes_without_wmma(name, emulate):
  """USE_TC=2: the tensor core's axis permutations without the WMMA instruction must still compute the matmul."""
  cases = {c.name: c for c in _catalogue()}
  if name not in cases: pytest.skip("no catalogue")
  dev = Device.open("PYTHON", emulate=emulate)
  k, prg = _program(dev, cases[name], use_tc=2)
  assert any(o.op.name == "TC" for o in k.applied_opts), k.applied_opts
  _run_and_check(dev, cases[name], prg)

@pytest.mark.parametrize("tc_opt", [0, 1, 2])
@pytest.mark.parametrize("name,emulate", [("matmul_half", "CUDA"), ("matmul_bf16", "CUDA"), ("matmul_half", "METAL"),
                                          ("matmul_64", "METAL"), ("matmul_half", "AMD")])
def test_tensor_cores_with_wmma_at_every_tc_opt_level(name, emulate, tc_opt):
  """USE_TC=1: the emulated WMMA with each vendor's fragment layout; the catalogue's matmuls are square multiples
  of every tensor core's dims, so the spec applies them at each TC_OPT level."""
  from kernopt.helpers import config_override
  from kernopt.ops import ReduceOps
  cases = {c.name: c for c in _catalogue()}
  dev = Device.open("PYTHON", emulate=emulate)
  with config_override(TC_OPT=tc_opt):
    k, prg = _program(dev, cases[name], use_tc=1)
  assert k.tensor_core is not None and k.applied_opts[0].op.name == "TC"
  assert any(op.op is ReduceOps.WMMA for op in k.get_optimized_ast().lazyops)
  assert any(u.op is UOps.WMMA for u in prg.uops)
  _run_and_check(dev, cases[name], prg)

def _without_barriers(uops):
  """The same program with every BARRIER dropped (and the loads that waited on one rebuilt without it)."""
  new: dict = {}
  def rebuild(u):  # sources first: a DEFINE_ACC names RANGEs that come later in the list
    if u not in new: new[u] = UOp(u.op, u.dtype, tuple(rebuild(s) for s in u.src if s.op is not UOps.BARRIER), u.arg)
    return new[u]
  return [rebuild(u) for u in uops if u.op is not UOps.BARRIER]

def test_missing_barrier_in_a_group_kernel_is_reported():
  """A GROUPTOP reduction from the Kernel, with its barrier removed: the second stage reads partial sums that other
  threads wrote with no barrier in between, which the emulator reports naming the kernel and the local buffer."""
  import dataclasses
  from kernopt.kernel import OptOps
  case = {c.name: c for c in _catalogue()}["sum_axis1"]
  dev = Device.open("PYTHON")
  k, prg = _program(dev, case)
  assert any(o.op is OptOps.GROUPTOP for o in k.applied_opts)
  _run_and_check(dev, case, prg)  # with its barrier it is right
  assert any(u.op is UOps.BARRIER for u in prg.uops)
  broken = dataclasses.replace(prg, uops=tuple(_without_barriers(prg.uops)), src=prg.src + "// no barrier")
  with pytest.raises(RaceError, match=rf"{prg.name}.*temp"):
    _run_and_check(dev, case, broken)
