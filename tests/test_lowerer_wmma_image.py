"""Lowering of tensor cores (WMMA), images and GROUP reduces, run on the PYTHON device (emulating CUDA, Metal and
AMD for tensor cores; its generic OpenCL-like profile for images) and compared with numpy."""
import numpy as np
import pytest
from catalogue import _matmul_ast, alu, buf, const, kernel, reduce, store, view
from kernopt.dtype import dtypes
from kernopt.errors import UnsupportedError
from kernopt.kernel import Kernel, Opt, OptOps
from kernopt.ops import BinaryOps, ReduceOps, UnaryOps
from kernopt.renderers import get_renderer
from kernopt.runtime import Buffer, Device
from kernopt.shape.shapetracker import ShapeTracker
from kernopt.uops import UOps

FRAGMENTS = {"CUDA": (8, 4, 4), "METAL": (2, 2, 2), "AMD": (16, 16, 8)}

def _run(dev, k, inputs, out_numel, out_dtype=dtypes.float):
  """Run Kernel k on dev with buffer 0 the output; inputs maps buffer index -> numpy array."""
  prg = k.to_program()
  dts = {a.idx: a.dtype for a in prg.args}
  bufs = {0: Buffer(dev.name, out_numel, out_dtype)}
  for i, x in inputs.items(): bufs[i] = Buffer(dev.name, x.size, dts[i]).copyin(np.ascontiguousarray(x).reshape(-1))
  dev.compile(prg)(*[bufs[a.idx] for a in prg.args])
  return prg, bufs[0].numpy()

def _tc_kernel(device, M, N, K, extra_opts=None):
  dev = Device.open("PYTHON", emulate=device)
  k = Kernel(_matmul_ast(M, N, K, dtypes.half, dtypes.float), opts=dev.renderer).required_optimizations()
  assert k.apply_tensor_cores(1, extra_opts=extra_opts), f"no tensor core on {device}"
  return dev, k

def _half_inputs(M, N, K, seed=0):
  r = np.random.default_rng(seed)
  a, b = r.uniform(-1, 1, (M, K)).astype(np.float16), r.uniform(-1, 1, (K, N)).astype(np.float16)
  return a, b, a.astype(np.float32) @ b.astype(np.float32)

# ***** WMMA *****

@pytest.mark.parametrize("device", ["CUDA", "METAL", "AMD"])
def test_wmma_uops_fragments_and_accumulators(device):
  _, k = _tc_kernel(device, 32, 32, 64)
  uops = k.linearize().uops
  na, nb, nc = FRAGMENTS[device]
  wmmas = [u for u in uops if u.op is UOps.WMMA]
  assert wmmas
  for w in wmmas:
    a, b, c = w.src
    assert (a.dtype, b.dtype, c.dtype, w.dtype) == (dtypes.half.vec(na), dtypes.half.vec(nb), dtypes.float.vec(nc),
                                                   dtypes.float.vec(nc))
    assert a.op is UOps.VECTORIZE and b.op is UOps.VECTORIZE
  # C of each chain's first WMMA is its accumulators, read inside the reduce loop; D's lanes update them
  first = [w for w in wmmas if w.src[2].op is UOps.VECTORIZE]
  assert first and all(s.op is UOps.DEFINE_ACC for w in first for s in w.src[2].src)
  pos = {u: i for i, u in enumerate(uops)}
  loop = next(u for u in uops if u.op is UOps.RANGE and u.arg[1])
  assert all(pos[w.src[2]] > pos[loop] for w in first)
  phis = [u for u in uops if u.op is UOps.PHI]
  assert phis and all(p.src[1].op is UOps.GEP and p.src[1].src[0].op is UOps.WMMA for p in phis)
  assert len(phis) == sum(w.dtype.count for w in wmmas if not any(w in s.src for s in wmmas))

@pytest.mark.parametrize("device", ["CUDA", "METAL", "AMD"])
@pytest.mark.parametrize("mnk", [(32, 32, 48), (16, 32, 16)], ids=["loop", "one_k_block"])
def test_wmma_matmul_matches_numpy(device, mnk):
  M, N, K = mnk
  dev, k = _tc_kernel(device, M, N, K)
  a, b, want = _half_inputs(M, N, K)
  prg, got = _run(dev, k, {1: a, 2: b}, M * N)
  assert any(u.op is UOps.WMMA for u in prg.uops)
  if K == {"CUDA": 16, "METAL": 8, "AMD": 16}[device]:  # a single K block: C is zero, no accumulator
    assert not any(u.op is UOps.DEFINE_ACC for u in prg.uops)
  np.testing.assert_allclose(got.reshape(M, N), want, rtol=1e-3, atol=1e-3)

def test_wmma_float_inputs_on_metal():
  dev = Device.open("PYTHON", emulate="METAL")
  M, N, K = 16, 24, 32
  k = Kernel(_matmul_ast(M, N, K), opts=dev.renderer).required_optimizations()
  assert k.apply_tensor_cores(1)
  r = np.random.default_rng(1)
  a, b = r.standard_normal((M, K)).astype(np.float32), r.standard_normal((K, N)).astype(np.float32)
  _, got = _run(dev, k, {1: a, 2: b}, M * N)
  np.testing.assert_allclose(got.reshape(M, N), a @ b, rtol=1e-4, atol=1e-4)

def test_wmma_with_mismatched_fragments_refused():
  from dataclasses import replace
  from kernopt.lowerer import lower
  from kernopt.ops import LazyOp
  dev, k = _tc_kernel("METAL", 16, 16, 16)
  def swap(op):
    arg = replace(op.arg, upcast_axes=(op.arg.upcast_axes[0] - 1,) * 3) if op.op is ReduceOps.WMMA else op.arg
    return LazyOp(op.op, tuple(swap(s) for s in op.src), arg)
  with pytest.raises(UnsupportedError, match="fragments"): lower(swap(k.get_optimized_ast()), dev.renderer)

# ***** images *****

H, W = 4, 6
IMG = dtypes.imagef((H, W, 4))
PY = Device.open("PYTHON")

def _img(seed=2):
  return np.random.default_rng(seed).uniform(-1, 1, (H, W, 4)).astype(np.float32)

def test_image_load_as_texels():
  shp = (H, W, 4)
  k = Kernel(kernel(store(alu(BinaryOps.MUL, buf(1, shp, IMG), const(2.0, shp)))), opts=PY.renderer)
  k.required_optimizations().hand_coded_optimizations()
  x = _img()
  prg, got = _run(PY, k, {1: x}, x.size)
  loads = [u for u in prg.uops if u.op is UOps.LOAD]
  assert loads and all(u.dtype == dtypes.float.vec(4) and u.src[1].dtype == dtypes.int32.vec(2) for u in loads)
  np.testing.assert_array_equal(got.reshape(shp), x * 2)

def test_image_load_of_a_variable_component():
  """A transposed read: each thread's component idx % 4 is not constant, so it is selected by a WHERE chain."""
  st = ShapeTracker.from_shape((H, W, 4)).permute((2, 1, 0))
  k = Kernel(kernel(store(buf(1, (4, W, H), IMG, st=st), 0, dtype=dtypes.float)), opts=PY.renderer)
  x = _img(3)
  prg, got = _run(PY, k, {1: x}, x.size)
  assert any(u.op is UOps.ALU and u.arg.name == "WHERE" and u.dtype == dtypes.float for u in prg.uops)
  np.testing.assert_array_equal(got.reshape(4, W, H), x.transpose(2, 1, 0))

def test_image_load_constant_component_uses_gep():
  st = ShapeTracker.from_shape((H, W, 4)).shrink(((0, H), (0, W), (2, 3)))   # component 2 of every texel
  k = Kernel(kernel(store(buf(1, (H, W, 1), IMG, st=st), 0, dtype=dtypes.float)), opts=PY.renderer)
  x = _img(4)
  prg, got = _run(PY, k, {1: x}, H * W)
  assert any(u.op is UOps.GEP and u.arg == 2 and u.src[0].op is UOps.LOAD for u in prg.uops)
  np.testing.assert_array_equal(got.reshape(H, W), x[:, :, 2])

@pytest.mark.parametrize("hand_coded", [False, True], ids=["unoptimized", "hand_coded"])
def test_padded_image_load(hand_coded):
  """Unoptimized, each thread's load is guarded; hand-coded, the padded axis is upcast and the guards fold away."""
  st = ShapeTracker.from_shape((H, W, 4)).pad(((1, 1), (0, 0), (0, 0)))
  shp = (H + 2, W, 4)
  k = Kernel(kernel(store(alu(BinaryOps.ADD, buf(1, shp, IMG, st=st), const(1.0, shp)))), opts=PY.renderer)
  if hand_coded: k.required_optimizations().hand_coded_optimizations()
  x = _img(5)
  prg, got = _run(PY, k, {1: x}, int(np.prod(shp)))
  assert any(u.op is UOps.LOAD and len(u.src) == 4 for u in prg.uops) != hand_coded
  np.testing.assert_array_equal(got.reshape(shp), np.pad(x, ((1, 1), (0, 0), (0, 0))) + 1)

def test_image_store_writes_texels():
  shp = (H, W, 4)
  k = Kernel(kernel(store(alu(BinaryOps.ADD, buf(1, shp), buf(2, shp)), 0, dtype=IMG)), opts=PY.renderer)
  k.required_optimizations().hand_coded_optimizations()
  x, y = _img(6), _img(7)
  prg, got = _run(PY, k, {1: x, 2: y}, x.size, IMG)
  stores = [u for u in prg.uops if u.op is UOps.STORE]
  assert stores and all(u.src[1].dtype == dtypes.int32.vec(2) and u.src[2].dtype == dtypes.float.vec(4) for u in stores)
  np.testing.assert_array_equal(got.reshape(shp), x + y)

def test_image_reduce_into_image():
  """Sum over a reduce axis into an image output; the image's width axis is split across threads."""
  shp, full = (H, W, 4, 1), (H, W, 4, 8)
  src = buf(1, full, st=view(full, (W * 32, 32, 8, 1)))
  k = Kernel(kernel(store(reduce(ReduceOps.SUM, src, (3,)), 0, dtype=IMG, st=ShapeTracker.from_shape(shp))),
             opts=PY.renderer)
  k.required_optimizations().hand_coded_optimizations()
  x = np.random.default_rng(8).uniform(-1, 1, full).astype(np.float32)
  _, got = _run(PY, k, {1: x}, H * W * 4, IMG)
  np.testing.assert_allclose(got.reshape(H, W, 4), x.sum(3), rtol=1e-5, atol=1e-5)

def test_image_store_without_texel_lanes_refused():
  shp = (H, W, 4)
  k = Kernel(kernel(store(buf(1, shp), 0, dtype=IMG)), opts=PY.renderer)   # no required_optimizations
  with pytest.raises(UnsupportedError, match="imagef"): k.to_program()

def test_image_kernels_render_on_opencl():
  shp = (H, W, 4)
  cl = get_renderer("OPENCL")
  k = Kernel(kernel(store(alu(BinaryOps.MUL, buf(1, shp, IMG), buf(2, shp)), 0, dtype=IMG)), opts=cl)
  src = k.required_optimizations().hand_coded_optimizations().to_program().src
  assert "read_imagef(data1, smp, " in src and "write_imagef(data0, " in src

# ***** GROUP reduces: every thread of a group runs the second stage, the first one stores *****

@pytest.mark.parametrize("emulate", [None, "CUDA"], ids=str)
@pytest.mark.parametrize("opts", [
  [Opt(OptOps.GROUPTOP, 0, 16)],
  [Opt(OptOps.GROUP, 0, 8), Opt(OptOps.LOCAL, 0, 4), Opt(OptOps.UPCAST, 0, 4)],
  [Opt(OptOps.GROUP, 0, 4), Opt(OptOps.UNROLL, 1, 4), Opt(OptOps.UPCAST, 0, 2)],
], ids=["grouptop", "group_local_upcast", "group_unroll_upcast"])
def test_group_reduce_then_elementwise(opts, emulate):
  dev = Device.open("PYTHON", emulate=emulate)
  N, K = 32, 128
  x = np.random.default_rng(9).uniform(-1, 1, (N, K)).astype(np.float32)
  red = reduce(ReduceOps.SUM, buf(1, (N, K)), (1,))
  out = alu(BinaryOps.ADD, alu(BinaryOps.MUL, red, const(2.0, (N, 1))), alu(UnaryOps.SQRT, buf(2, (N, 1))))
  k = Kernel(kernel(store(out)), opts=dev.renderer)
  for o in opts: k.apply_opt(o)
  y = np.random.default_rng(10).uniform(0, 1, (N, 1)).astype(np.float32)
  prg, got = _run(dev, k, {1: x, 2: y}, N)
  assert any(u.op is UOps.BARRIER for u in prg.uops) and any(u.op is UOps.IF for u in prg.uops)
  np.testing.assert_allclose(got, (x.astype(np.float64).sum(1) * 2 + np.sqrt(y[:, 0])), rtol=1e-4, atol=1e-4)
