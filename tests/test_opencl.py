"""The OPENCL device on PoCL (or any OpenCL platform): hand-built UOp lists rendered by OpenCLRenderer and run
against numpy, the compile and launch errors, the on-disk binary cache. Skipped only when no platform exists."""
import os, subprocess, sys, textwrap
import numpy as np
import pytest
from kernopt.dtype import dtypes
from kernopt.errors import CompileError, LaunchError, UnsupportedError
from kernopt.helpers import config_override
from kernopt.kernel import Kernel
from kernopt.ops import BinaryOps, TernaryOps, UnaryOps, exec_alu
from kernopt.renderers import BufferArg, Program
from kernopt.renderers.opencl import OpenCLRenderer
from kernopt.shape.symbolic import Variable
from kernopt.uops import UOp, UOps

pytest.importorskip("pyopencl", reason="pyopencl is not installed (pip install pyopencl pocl-binary-distribution)")
from kernopt.runtime import Buffer, Device  # noqa: E402
from kernopt.runtime.opencl import OpenCLDevice, select_device  # noqa: E402

_ok, _why = OpenCLDevice.availability()
if not _ok: pytest.skip(f"no OpenCL platform: {_why}", allow_module_level=True)

i32, f32 = dtypes.int32, dtypes.float32

@pytest.fixture(scope="module")
def dev():
  return Device["OPENCL"]

@pytest.fixture(autouse=True)
def _cache_dir(tmp_path):
  with config_override(CACHE_DIR=str(tmp_path)): yield

def glob(idx, dt, writable=False): return UOp(UOps.DEFINE_GLOBAL, dt, (), (idx, f"data{idx}", writable))
def const(v, dt=i32): return UOp.const(dt, v)
def special(dim, name, size): return UOp(UOps.SPECIAL, i32, (), (dim, name, size))
def alu(op, *src, dtype=None): return src[0].alu(op, *src[1:], dtype=dtype)
def load(buf, idx, dtype=None, *rest): return UOp(UOps.LOAD, dtype or buf.dtype, (buf, idx, *rest))
def store(buf, idx, val, *valid): return UOp(UOps.STORE, None, (buf, idx, val, *valid))
def rng(start, end, axis): return UOp(UOps.RANGE, i32, (const(start), const(end)), (axis, True))

def lin(uops):
  """uops in the given order, each preceded by its not-yet-listed sources (an accumulator's RANGE excepted)."""
  seen, ret = set(), []
  def visit(u):
    if u in seen: return
    seen.add(u)
    if u.op is not UOps.DEFINE_ACC:
      for s in u.src: visit(s)
    ret.append(u)
  for u in uops: visit(u)
  return ret

def make(dev, name, uops, args, global_size, local_size, renderer=None, vars=()):
  uops = lin(uops)
  src = (renderer or dev.renderer).render(name, uops)
  prg = Program(name, src, "OPENCL", global_size, local_size, tuple(uops), args=tuple(args), vars=tuple(vars))
  return dev.compile(prg)

def OptOps_(name):
  from kernopt.opt import OptOps
  return getattr(OptOps, name)

def vector_access(src, w, kind):
  """Whether src loads or stores a float`w` vector in one access (vloadN/vstoreN, or PoCL's element-aligned casts)."""
  if kind == "load": return f"vload{w}(" in src or f"*((__global const ko_float{w}u*)(" in src
  return f"vstore{w}(" in src or f"*((__global ko_float{w}u*)(" in src

def buf(arr, dt=None):
  arr = np.asarray(arr)
  dt = dt or dtypes.from_name(arr.dtype.name)
  return Buffer("OPENCL", arr.size, dt).copyin(arr)

def test_renderer_static_profile_and_device_profile(dev):
  c = OpenCLRenderer().caps
  assert (c.device, c.has_local, c.has_shared, c.supports_float4) == ("OPENCL", True, True, True)
  assert c.global_max == c.local_max == (0x8FFFFFFF,) * 3 and c.shared_max == 32768 and c.tensor_cores == ()
  assert c.has_fp16 is False and c.supports_images is True
  d, dc = dev.cl_device, dev.renderer.caps
  assert dc.local_max == tuple(d.max_work_item_sizes) and dc.max_local_size == d.max_work_group_size
  assert dc.shared_max == d.local_mem_size
  assert dc.has_fp16 == ("cl_khr_fp16" in d.extensions.split())
  assert "has_fp16" in dev.renderer.capabilities()

def test_select_device():
  import pyopencl as cl
  from kernopt.runtime.opencl import _all_devices, probe
  devs = _all_devices()
  order = [d for d in devs if d.type & cl.device_type.GPU] + [d for d in devs if not d.type & cl.device_type.GPU]
  # the first GPU that runs the probe kernel, else the first other device that does (tests/test_opencl_select.py)
  assert select_device(None).int_ptr == next(d for d in order if probe(d) is None).int_ptr
  name = select_device(0).name
  assert select_device(name[:5]).name == name
  with config_override(CL_DEVICE="0"): assert select_device().name == name
  with pytest.raises(UnsupportedError, match="no OpenCL device matches"): select_device("no-such-device-xyz")
  with pytest.raises(UnsupportedError, match="index 99"): select_device(99)

def _elementwise(n_var):
  """out[i] = a[i] * 2 + b[i] for i < n, with 1-D workgroups of 32 threads."""
  out, a, b = glob(0, f32, True), glob(1, f32), glob(2, f32)
  n = UOp(UOps.DEFINE_VAR, i32, (), n_var)
  g, l = special(0, "gidx0", 32), special(0, "lidx0", 32)
  i = alu(BinaryOps.ADD, alu(BinaryOps.MUL, g, const(32)), l)
  va, vb = load(a, i), load(b, i)
  val = alu(BinaryOps.ADD, alu(BinaryOps.MUL, va, const(2.0, f32)), vb)
  ok = alu(BinaryOps.CMPLT, i, n)
  return [out, a, b, n, g, l, i, ok, va, vb, val, store(out, i, val, ok), UOp(UOps.SINK, None, ())]

def test_elementwise_specials_and_variable(dev):
  nv = Variable("n", 1, 1024)
  uops = _elementwise(nv)
  # a and b are read only where valid, so the loads sit under the store's condition: guard them with valid/alt
  out, a, b, n, g, l, i, ok, va, vb, val, st, sink = uops
  va, vb = load(a, i, f32, ok, const(0.0, f32)), load(b, i, f32, ok, const(0.0, f32))
  val = alu(BinaryOps.ADD, alu(BinaryOps.MUL, va, const(2.0, f32)), vb)
  uops = [out, a, b, n, g, l, i, ok, va, vb, val, store(out, i, val, ok), sink]
  src = dev.renderer.render("ew", lin(uops))
  assert "get_group_id(0)" in src and "get_local_id(0)" in src and src.index("int v_n") > src.index("data2")
  rt = make(dev, "ew", uops, [BufferArg(0, f32, nv, True), BufferArg(1, f32, nv, False), BufferArg(2, f32, nv, False)],
            (32,), (32,), vars=(nv,))
  rng_ = np.random.default_rng(0)
  an, bn = rng_.standard_normal(1000).astype(np.float32), rng_.standard_normal(1000).astype(np.float32)
  ob = buf(np.full(1000, -7, np.float32))
  secs = rt(ob, buf(an), buf(bn), var_vals={"n": 1000}, wait=True)
  assert secs is not None and secs > 0
  np.testing.assert_allclose(ob.numpy(), an * 2 + bn, rtol=1e-6)
  rt(ob, buf(an), buf(bn), var_vals={nv: 10})
  with pytest.raises(LaunchError, match="outside"): rt(ob, buf(an), buf(bn), var_vals={"n": 5000})

def test_group_reduction_through_local_memory(dev):
  """out[g] = sum(a[g*64:(g+1)*64]): 16 threads each sum 4 elements into __local, then thread 0 sums them."""
  out, a = glob(0, f32, True), glob(1, f32)
  g, l = special(0, "gidx0", 8), special(0, "lidx0", 16)
  r0 = rng(0, 4, 1)
  acc = UOp(UOps.DEFINE_ACC, f32, (r0,), (0.0, 0))
  idx = alu(BinaryOps.ADD, alu(BinaryOps.ADD, alu(BinaryOps.MUL, g, const(64)), alu(BinaryOps.MUL, l, const(4))), r0)
  v = load(a, idx)
  phi = UOp(UOps.PHI, f32, (acc, alu(BinaryOps.ADD, acc, v)))
  temp = UOp(UOps.DEFINE_LOCAL, f32, (), ("temp", 16))
  st = store(temp, l, phi)
  bar = UOp(UOps.BARRIER, None, (st,))
  first = alu(BinaryOps.CMPLT, l, const(1))
  iff = UOp(UOps.IF, None, (first, bar))
  r1 = rng(0, 16, 2)
  acc2 = UOp(UOps.DEFINE_ACC, f32, (r1,), (0.0, 1))
  v2 = load(temp, r1, f32, bar)
  phi2 = UOp(UOps.PHI, f32, (acc2, alu(BinaryOps.ADD, acc2, v2)))
  ost = store(out, g, phi2)
  uops = [out, a, temp, g, l, acc, r0, idx, v, phi.src[1], phi, UOp(UOps.ENDRANGE, None, (r0,)), st, bar, first, iff,
          acc2, r1, v2, phi2.src[1], phi2, UOp(UOps.ENDRANGE, None, (r1,)), ost, UOp(UOps.ENDIF, None, (iff,))]
  src = dev.renderer.render("grp", lin(uops))
  assert "__local float temp[16];" in src and "barrier(CLK_LOCAL_MEM_FENCE);" in src
  rt = make(dev, "grp", uops, [BufferArg(0, f32, 8, True), BufferArg(1, f32, 512, False)], (8,), (16,))
  an = np.random.default_rng(1).standard_normal(512).astype(np.float32)
  ob = buf(np.zeros(8, np.float32))
  rt(ob, buf(an), wait=True)
  np.testing.assert_allclose(ob.numpy(), an.reshape(8, 64).sum(1), rtol=1e-5, atol=1e-5)

@pytest.mark.parametrize("profile", ["device", "static"])
def test_float4_load_store_gep_vectorize(dev, profile):
  """out[4i:4i+4] = a[4i:4i+4] * 2 + (0, 1, 2, 3); lanes[i] = a[4i+2] - via float4 loads, stores and GEP: vload4 and
  vstore4 in the static profile, element-aligned float4 dereferences on PoCL (which calls vloadN out of line)."""
  f4 = f32.vec(4)
  out, a, lanes = glob(0, f32, True), glob(1, f32), glob(2, f32, True)
  g = special(0, "gidx0", 16)
  i4 = alu(BinaryOps.MUL, g, const(4))
  v = load(a, i4, f4)
  ramp = UOp(UOps.VECTORIZE, f4, tuple(const(float(k), f32) for k in range(4)))
  val = alu(BinaryOps.ADD, alu(BinaryOps.MUL, v, const(2.0, f4)), ramp)
  lane = UOp(UOps.GEP, f32, (v,), 2)
  uops = [out, a, lanes, g, i4, v, ramp, val.src[0], val, lane, store(out, i4, val), store(lanes, g, lane)]
  renderer = dev.renderer if profile == "device" else OpenCLRenderer()
  src = renderer.render("vec4", lin(uops))
  assert "float4" in src and "(float4)(" in src
  if renderer.caps.clang:
    assert "vload4" not in src and "vstore4" not in src and "*((__global const ko_float4u*)(data1+" in src
  else: assert "vload4" in src and "vstore4" in src
  rt = make(dev, "vec4", uops, [BufferArg(0, f32, 64, True), BufferArg(1, f32, 64, False), BufferArg(2, f32, 16, True)],
            (16,), None, renderer=renderer)
  an = np.arange(64, dtype=np.float32) * 0.5
  ob, lb = buf(np.zeros(64, np.float32)), buf(np.zeros(16, np.float32))
  rt(ob, buf(an), lb)
  np.testing.assert_array_equal(ob.numpy(), an * 2 + np.tile(np.arange(4, dtype=np.float32), 16))
  np.testing.assert_array_equal(lb.numpy(), an[2::4])

@pytest.mark.skipif(not Device["OPENCL"].renderer.caps.clang, reason="not PoCL: vloadN/vstoreN are used")
def test_vector_accesses_to_local_memory_use_the_local_space(dev):
  """Each of 16 work-items copies a float4 into __local, and after a barrier writes its neighbour's float4 out:
  the element-aligned vector casts name the buffer's own address space."""
  f4 = f32.vec(4)
  out, a = glob(0, f32, True), glob(1, f32)
  l = special(0, "lidx0", 16)
  i4 = alu(BinaryOps.MUL, l, const(4))
  temp = UOp(UOps.DEFINE_LOCAL, f32, (), ("temp", 64))
  st = store(temp, i4, load(a, i4, f4))
  bar = UOp(UOps.BARRIER, None, (st,))
  j4 = alu(BinaryOps.MUL, alu(BinaryOps.MOD, alu(BinaryOps.ADD, l, const(1)), const(16)), const(4))
  v = load(temp, j4, f4, bar)
  uops = [out, a, temp, l, i4, st.src[2], st, bar, j4, v, store(out, i4, v)]
  src = dev.renderer.render("nb4", lin(uops))
  assert "*((__local ko_float4u*)(temp+" in src and "*((__local const ko_float4u*)(temp+" in src
  rt = make(dev, "nb4", uops, [BufferArg(0, f32, 64, True), BufferArg(1, f32, 64, False)], (1,), (16,))
  an = np.arange(64, dtype=np.float32)
  ob = buf(np.zeros(64, np.float32))
  rt(ob, buf(an), wait=True)
  np.testing.assert_array_equal(ob.numpy(), np.roll(an, -4))

def test_half_storage_with_float_math(dev):
  """half in, half out, math in float with each result rounded to half (numpy's float16 arithmetic); a CAST to half
  rounds to nearest even; half4 through vload_half4 / vstore_half4_rte."""
  h, h4 = dtypes.half, dtypes.half.vec(4)
  out, a, f_in, f_out, o4 = glob(0, h, True), glob(1, h), glob(2, f32), glob(3, f32, True), glob(4, h, True)
  g = special(0, "gidx0", 64)
  v = load(a, g)
  val = alu(BinaryOps.ADD, alu(BinaryOps.MUL, v, const(3.0, h)), const(0.5, h))
  rounded = UOp(UOps.CAST, f32, (UOp(UOps.CAST, h, (load(f_in, g),)),))
  i4 = alu(BinaryOps.MUL, alu(BinaryOps.IDIV, g, const(4)), const(4))
  v4 = load(a, i4, h4)
  dbl = alu(BinaryOps.MUL, v4, const(2.0, h4))
  first = alu(BinaryOps.CMPNE, alu(BinaryOps.MOD, g, const(4)), const(0))
  notfirst = alu(UnaryOps.NEG, first)
  uops = [out, a, f_in, f_out, o4, g, v, val.src[0], val, store(out, g, val), rounded.src[0].src[0], rounded.src[0],
          rounded, store(f_out, g, rounded), i4.src[0], i4, v4, dbl, first.src[0], first, notfirst,
          store(o4, i4, dbl, notfirst)]
  r = OpenCLRenderer(has_fp16=False)
  src = r.render("halfs", lin(uops))
  assert "vload_half(" in src and "vstore_half_rte(" in src and "vload_half4" in src and "cl_khr_fp16" not in src
  assert "cl_khr_fp16 : enable" in OpenCLRenderer(has_fp16=True).render("halfs", lin(uops))
  sig = ((0, h, True), (1, h, False), (2, f32, False), (3, f32, True), (4, h, True))
  args = [BufferArg(i, dt, 64, w) for i, dt, w in sig]
  rt = make(dev, "halfs", uops, args, (64,), None, renderer=r)
  rng_ = np.random.default_rng(2)
  an = (rng_.standard_normal(64) * 100).astype(np.float16)
  fn = (rng_.standard_normal(64) * 1000).astype(np.float32)
  ob, fo, o4b = buf(np.zeros(64, np.float16)), buf(np.zeros(64, np.float32)), buf(np.zeros(64, np.float16))
  rt(ob, buf(an), buf(fn), fo, o4b)
  np.testing.assert_array_equal(ob.numpy(), an * np.float16(3) + np.float16(0.5))
  np.testing.assert_array_equal(fo.numpy(), fn.astype(np.float16).astype(np.float32))
  np.testing.assert_array_equal(o4b.numpy(), (an.astype(np.float32) * 2).astype(np.float16))

def test_bfloat16_storage(dev):
  bf = dtypes.bfloat16
  out, a = glob(0, bf, True), glob(1, bf)
  g = special(0, "gidx0", 32)
  v = load(a, g)
  val = alu(BinaryOps.MUL, v, const(3.0, bf))
  uops = [out, a, g, v, val, store(out, g, val)]
  rt = make(dev, "bf16", uops, [BufferArg(0, bf, 32, True), BufferArg(1, bf, 32, False)], (32,), None)
  x = np.random.default_rng(3).standard_normal(32).astype(np.float32)
  bits = (x.view(np.uint32) >> 16).astype(np.uint16)          # bfloat16 by truncation: exactly representable
  ob = buf(np.zeros(32, np.uint16), bf)
  rt(ob, buf(bits, bf))
  prod_ = (bits.astype(np.uint32) << 16).view(np.float32) * 3
  u = prod_.view(np.uint32)
  expect = ((u + 0x7FFF + ((u >> 16) & 1)) >> 16).astype(np.uint16)
  np.testing.assert_array_equal(ob.numpy(), expect)

def test_image_read_and_write(dev):
  """out[(y*8+x)*4 : +4] = img[y, x] * 2 and oimg[y, x] = img[y, x] + 1 over an 8x4 imagef."""
  imgdt = dtypes.imagef((4, 8, 4))
  f4, i2 = f32.vec(4), i32.vec(2)
  out, img, oimg = glob(0, f32, True), glob(1, imgdt), glob(2, imgdt, True)
  x, y = special(0, "gidx0", 8), special(1, "gidx1", 4)
  coord = UOp(UOps.VECTORIZE, i2, (x, y))
  t = load(img, coord, f4)
  flat = alu(BinaryOps.MUL, alu(BinaryOps.ADD, alu(BinaryOps.MUL, y, const(8)), x), const(4))
  dbl = alu(BinaryOps.MUL, t, const(2.0, f4))
  inc = alu(BinaryOps.ADD, t, const(1.0, f4))
  uops = [out, img, oimg, x, y, coord, t, flat, dbl, inc,
          store(out, flat, dbl), store(oimg, coord, inc)]
  src = dev.renderer.render("img", lin(uops))
  assert "read_imagef(data1, smp, " in src and "write_imagef(data2, " in src and "CLK_FILTER_NEAREST" in src
  rt = make(dev, "img", uops, [BufferArg(0, f32, 128, True), BufferArg(1, imgdt, 128, False),
                               BufferArg(2, imgdt, 128, True)], (8, 4), None)
  data = np.random.default_rng(4).standard_normal(128).astype(np.float32)
  ob, ib, oib = buf(np.zeros(128, np.float32)), buf(data, imgdt), buf(np.zeros(128, np.float32), imgdt)
  rt(ob, ib, oib)
  np.testing.assert_array_equal(ob.numpy(), data * 2)
  np.testing.assert_array_equal(oib.numpy(), data + 1)
  np.testing.assert_array_equal(ib.numpy(), data)

I32_MIN = -2**31

@pytest.mark.parametrize("op", [BinaryOps.IDIV, BinaryOps.MOD, BinaryOps.SHL, BinaryOps.SHR, BinaryOps.ADD,
                                BinaryOps.MUL, BinaryOps.MAX, UnaryOps.NEG])
def test_integer_ops_follow_the_semantics_table(dev, op):
  """Division by zero, INT_MIN / -1, wrapping and out-of-range shift counts give exec_alu's values, no trap."""
  out, a, b = glob(0, i32, True), glob(1, i32), glob(2, i32)
  g = special(0, "gidx0", 12)
  va, vb = load(a, g), load(b, g)
  r = alu(op, va) if op is UnaryOps.NEG else alu(op, va, vb)
  uops = [out, a, b, g, va, vb, r, store(out, g, r)]
  rt = make(dev, f"int_{op.name.lower()}", uops, [BufferArg(0, i32, 12, True), BufferArg(1, i32, 12, False),
                                                   BufferArg(2, i32, 12, False)], (12,), None)
  an = np.array([7, -7, 7, -7, I32_MIN, I32_MIN, 5, 2**31 - 1, 1, -1, 3, 123456789], np.int32)
  bn = np.array([2, 2, -2, 0, -1, 0, 33, 2, -1, 31, 64, 98765], np.int32)
  ob = buf(np.zeros(12, np.int32))
  rt(ob, buf(an), buf(bn))
  expect = [exec_alu(op, i32, (int(x),) if op is UnaryOps.NEG else (int(x), int(y))) for x, y in zip(an, bn)]
  assert ob.numpy().tolist() == expect

def test_float_where_and_mulacc(dev):
  out, a, b = glob(0, f32, True), glob(1, f32), glob(2, f32)
  g = special(0, "gidx0", 16)
  va, vb = load(a, g), load(b, g)
  w = alu(TernaryOps.WHERE, alu(BinaryOps.CMPLT, va, vb), alu(TernaryOps.MULACC, va, vb, const(1.0, f32)), vb)
  uops = [out, a, b, g, va, vb, w.src[0], w.src[1], w, store(out, g, w)]
  rt = make(dev, "wm", uops, [BufferArg(i, f32, 16, i == 0) for i in range(3)], (16,), None)
  rng_ = np.random.default_rng(5)
  an, bn = rng_.standard_normal(16).astype(np.float32), rng_.standard_normal(16).astype(np.float32)
  ob = buf(np.zeros(16, np.float32))
  rt(ob, buf(an), buf(bn))
  np.testing.assert_allclose(ob.numpy(), np.where(an < bn, an * bn + 1, bn), rtol=1e-6)

def test_compile_error_carries_build_log(dev):
  src = "__kernel void broken(__global float* data0) { data0[0] = undeclared_thing; }\n"
  prg = Program("broken", src, "OPENCL", (1,), (1,), args=(BufferArg(0, f32, 1, True),))
  with pytest.raises(CompileError) as e: dev.compile(prg)
  assert "undeclared_thing" in e.value.log and e.value.src == src and "broken" in str(e.value)

def _copy_kernel(dev, name="copy", size=100):
  out, a = glob(0, f32, True), glob(1, f32)
  g = special(0, "gidx0", size)
  v = load(a, g)
  args = [BufferArg(0, f32, size, True), BufferArg(1, f32, size, False)]
  return make(dev, name, [out, a, g, v, store(out, g, v)], args, (size,), None)

def test_too_small_buffer_is_refused_before_enqueue(dev):
  rt = _copy_kernel(dev)
  ob = buf(np.full(100, 3, np.float32))
  with pytest.raises(LaunchError, match="buffer 1 holds 50 elements"): rt(ob, buf(np.zeros(50, np.float32)))
  with pytest.raises(LaunchError, match="takes 2 buffers"): rt(ob)
  with pytest.raises(LaunchError, match="dtype"): rt(ob, buf(np.zeros(100, np.int32)))
  np.testing.assert_array_equal(ob.numpy(), np.full(100, 3, np.float32))   # nothing ran

def test_launch_beyond_device_limits_is_refused(dev):
  rt = _copy_kernel(dev, "copy_limits")
  lib, prg = rt.lib, rt.program
  too_big = dev.cl_device.max_work_item_sizes[0] + 1
  with pytest.raises(LaunchError, match="exceeds"): dev.launch_sizes(lib, prg, (1,), (too_big,))
  limit = min(dev.cl_device.max_work_group_size, lib.max_group)   # 4096 on PoCL, 8192 on Intel's runtime
  x = min(dev.cl_device.max_work_item_sizes[0], limit)
  with pytest.raises(LaunchError, match="work-group of"): dev.launch_sizes(lib, prg, (1, 1), (x, limit // x + 1))
  with pytest.raises(LaunchError, match="at most 3"): dev.launch_sizes(lib, prg, (1, 1, 1, 1), None)
  assert dev.launch_sizes(lib, prg, (4, 3), (2, 1)) == ((8, 3), (2, 1))
  assert dev.launch_sizes(lib, prg, None, None) == ((1,), (1,))

def test_binary_cache_hit_in_fresh_process(tmp_path):
  script = textwrap.dedent("""
    import numpy as np
    from kernopt.dtype import dtypes
    from kernopt.renderers import BufferArg, Program
    from kernopt.runtime import Buffer, Device
    src = ("__kernel void addone(__global float* data0, __global const float* data1) "
           "{ int i = get_group_id(0); data0[i] = data1[i] + 1.0f; }")
    dev = Device["OPENCL"]
    args = (BufferArg(0, dtypes.float, 8, True), BufferArg(1, dtypes.float, 8, False))
    rt = dev.compile(Program("addone", src, "OPENCL", (8,), None, args=args))
    o = Buffer("OPENCL", 8, dtypes.float)
    rt(o, Buffer("OPENCL", 8, dtypes.float).copyin(np.arange(8, dtype=np.float32)))
    assert o.numpy().tolist() == [float(i + 1) for i in range(8)]
    print("FROM_CACHE", rt.lib.from_cache)
  """)
  root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
  env = {**os.environ, "CACHE_DIR": str(tmp_path), "PYTHONPATH": root}
  runs = [subprocess.run([sys.executable, "-c", script], env=env, capture_output=True, text=True) for _ in range(2)]
  for r in runs: assert r.returncode == 0, r.stderr
  assert "FROM_CACHE False" in runs[0].stdout and "FROM_CACHE True" in runs[1].stdout
  assert len(list((tmp_path / "opencl").glob("*.bin"))) == 1

# ***** end to end: the catalogue, unoptimized and through the standard protocol *****

def _catalogue():
  try:
    from tests.catalogue import catalogue
  except ImportError: return []
  return catalogue("small")

def _check_close(case, spec, got, want):
  if spec.dtype == dtypes.bfloat16:
    from tests.catalogue import bf16_to_f32
    got, want = bf16_to_f32(got), bf16_to_f32(np.asarray(want))
  want = np.asarray(want).reshape(-1)
  got = got[:want.size]   # with symbolic shapes only the first n rows are defined
  if case.tol == 0 or not dtypes.is_float(spec.dtype): np.testing.assert_array_equal(got, want.astype(got.dtype))
  else:
    w = want.astype(np.float64)
    scale = max(1.0, float(np.nanmax(np.abs(w), initial=0.0)))
    np.testing.assert_allclose(got.astype(np.float64), w, rtol=case.tol, atol=case.tol * scale)

def test_an_image_output_needs_the_required_texel_upcast(dev):
  """An image is written a texel (4 lanes) at a time: required_optimizations() upcasts the output's unit-stride axis
  by 4 for exactly this; without it the lowerer refuses the store instead of writing partial texels."""
  from kernopt.kernel import Kernel
  with pytest.raises(UnsupportedError, match="4 upcast lanes"):
    Kernel(_catalogue_case("image_out").ast, opts=dev.renderer).to_program()

def _catalogue_case(name):
  return next(c for c in _catalogue() if c.name == name)

# every case through the standard protocol; unoptimized only where no reduce loop makes it slow (each PoCL build
# costs ~0.5 s, and the CPU device already runs the whole catalogue unoptimized)
# (an image output without required_optimizations has no 4-lane texel store; the test after this one says so)
_E2E = [(c, True) for c in _catalogue()] + [(c, False) for c in _catalogue()
                                           if "reduce" not in c.tags and c.name != "image_out"]

@pytest.mark.parametrize("case,optimize", _E2E, ids=lambda x: x.name if hasattr(x, "name") else
                         ("protocol" if x else "unoptimized"))
def test_catalogue_end_to_end(dev, case, optimize):
  from kernopt.kernel import Kernel
  k = Kernel(case.ast, opts=dev.renderer)
  if optimize:
    k.required_optimizations()
    if not k.apply_tensor_cores(): k.hand_coded_optimizations()
  prg = k.to_program()
  runner = dev.compile(prg)
  inputs = case.inputs(np.random.default_rng(7))
  for var_vals in case.var_vals:
    bufs = {s.idx: Buffer("OPENCL", s.numel, s.dtype) for s in case.buffers}
    for idx, arr in inputs.items(): bufs[idx].copyin(arr)
    runner(*[bufs[a.idx] for a in prg.args], var_vals=var_vals, wait=True)
    want = case.reference(inputs, var_vals)
    for spec in case.outputs: _check_close(case, spec, bufs[spec.idx].numpy(), want[spec.idx])

# ***** the CPU device profile (PoCL): packed lanes and heuristics_opencl, against the static profile *****

def _cpu_profile(dev, width=None):
  """The device's CPU profile, at its own vector width or pinned to `width` (its other capabilities unchanged)."""
  import pyopencl as cl
  if not dev.cl_device.type & cl.device_type.CPU: pytest.skip("the OpenCL device is not a CPU: no CPU profile")
  if width is None or width == dev.renderer.caps.vector_width: return dev.renderer
  r = dev.renderer
  return OpenCLRenderer(local_max=r.caps.local_max, max_local_size=r.caps.max_local_size, shared_max=r.caps.shared_max,
                        has_fp16=r.caps.has_fp16, supports_images=r.caps.supports_images, vector_width=width,
                        stream_stores=r.caps.stream_stores, clang=r.caps.clang)

def alu_ast(op, *srcs):
  from tests.catalogue import alu as calu
  return calu(op, *srcs)

def _mm_ast(M, N, K):
  from tests.catalogue import buf as lbuf, kernel, reduce, store, view
  from kernopt.ops import ReduceOps
  a = lbuf(1, (M, N, K), st=view((M, N, K), (K, 0, 1)))
  b = lbuf(2, (M, N, K), st=view((M, N, K), (0, 1, N)))
  return kernel(store(reduce(ReduceOps.SUM, alu_ast(BinaryOps.MUL, a, b), (2,))))

def _run_ast(dev, ast, renderer, inputs, out_numel, opts=None):
  """(result, applied opts, source) of ast through the standard protocol (or the given opts) on renderer."""
  from kernopt.kernel import Kernel
  from kernopt.opt import Opt
  k = Kernel(ast, opts=renderer).required_optimizations()
  if opts is None: k.hand_coded_optimizations()
  else:
    for o in opts: k.apply_opt(Opt(*o))
  prg = k.to_program()
  bufs = {0: Buffer("OPENCL", out_numel, f32), **{i: buf(a) for i, a in inputs.items()}}
  dev.compile(prg)(*[bufs[a.idx] for a in prg.args], wait=True)
  return bufs[0].numpy(), list(k.applied_opts), prg.src

def test_cpu_profile_departs_from_the_static_profile(dev):
  import pyopencl as cl
  from kernopt.runtime.opencl import cpu_vector_width
  r, static = dev.renderer, OpenCLRenderer()
  s = static.caps
  assert (s.heuristics, s.vector_width, s.supports_float4, s.max_upcast) == ("spec", 1, True, 8)
  if not dev.cl_device.type & cl.device_type.CPU:
    assert r.caps.heuristics == "spec" and r.caps.vector_width == 1
    return
  w = cpu_vector_width(dev.cl_device, cl)
  assert w in (4, 8, 16) and r.caps.vector_width == w and r.caps.heuristics == "opencl_cpu"
  assert r.caps.supports_float4 is False and r.caps.max_upcast == max(8, 2 * w)
  assert r.capabilities()["vector_width"] == w and static.capabilities()["heuristics"] == "spec"
  assert r.capabilities() != static.capabilities() and f"vector_width={w}" in repr(r)
  with pytest.raises(UnsupportedError): OpenCLRenderer(vector_width=3)

def test_static_profile_keeps_the_spec_heuristics():
  from kernopt import heuristics
  from kernopt.kernel import Kernel
  ast = _mm_ast(32, 64, 48)
  k1 = Kernel(ast, opts=OpenCLRenderer()).hand_coded_optimizations()
  k2 = Kernel(ast, opts=OpenCLRenderer()).required_optimizations()
  heuristics.hand_coded(k2)
  assert k1.applied_opts == k2.applied_opts and k1.applied_opts

def test_cpu_profile_matmul_register_tile(dev):
  from kernopt.opt import OptOps
  r = _cpu_profile(dev)
  w = r.caps.vector_width
  M, N, K = 64, 4 * w, 32
  rng = np.random.default_rng(3)
  a, b = rng.standard_normal((M, K), dtype=np.float32), rng.standard_normal((K, N), dtype=np.float32)
  got, opts, src = _run_ast(dev, _mm_ast(M, N, K), r, {1: a, 2: b}, M * N)
  # an 8 x 2w tile of 16 vector accumulators, K unrolled by 2, 32 rows (4 row blocks) per work-group
  assert [(o.op, o.axis, o.amt) for o in opts] == [(OptOps.UPCAST, 1, 2 * w), (OptOps.UPCAST, 0, 8),
                                                   (OptOps.UNROLL, 0, 2), (OptOps.LOCAL, 0, 4)]
  assert f"float{w} acc15" in src and vector_access(src, w, "load") and vector_access(src, w, "store")  # packed
  assert "nontemporal" not in src   # a kernel with a loop keeps plain stores
  np.testing.assert_allclose(got.reshape(M, N), a @ b, rtol=1e-4, atol=1e-4)

def test_cpu_profile_pads_an_odd_output_axis_to_two_vectors(dev):
  """N = 8w - 1 (matmul 1000x1000x999's shape of problem): PADTO to 2w (rule opencl.pad_columns), then the register
  tile; the padded lanes are masked, and the numbers are numpy's."""
  from kernopt.opt import OptOps
  r = _cpu_profile(dev)
  w = r.caps.vector_width
  M, N, K = 24, 8 * w - 1, 20
  rng = np.random.default_rng(5)
  a, b = rng.standard_normal((M, K), dtype=np.float32), rng.standard_normal((K, N), dtype=np.float32)
  got, opts, _ = _run_ast(dev, _mm_ast(M, N, K), r, {1: a, 2: b}, M * N)
  assert (opts[0].op, opts[0].amt) == (OptOps.PADTO, 2 * w) and opts[1].op is OptOps.UPCAST
  np.testing.assert_allclose(got.reshape(M, N), a @ b, rtol=1e-4, atol=1e-4)

@pytest.mark.parametrize("w", [8, 16])
def test_cpu_profile_padded_tile_whose_first_lanes_are_always_stored_keeps_vector_accumulators(dev, w):
  """N = 4w + 7 PADTO'd to 2w (matmul 1000x1000x999's 999 = 31*32 + 7 at width 16): the last tile's first 7 lanes are
  stored by every tile, so their stores are plain while the rest sit under an IF. Seeded from those split stores the
  vectorize pass used to pack lanes 7..7+w-1 and leave 8 x (2w - w) accumulators scalar (999 on PoCL: 128 scalar
  accumulators, 71 ms); packed from the loads first, every accumulator is a vector. numpy's numbers."""
  from kernopt.opt import OptOps
  r = _cpu_profile(dev, w)
  M, N, K = 16, 4 * w + 7, 12
  rng = np.random.default_rng(w + 7)
  a, b = rng.standard_normal((M, K), dtype=np.float32), rng.standard_normal((K, N), dtype=np.float32)
  opts = [(OptOps.PADTO, 1, 2 * w), (OptOps.UPCAST, 1, 2 * w), (OptOps.UPCAST, 0, 8), (OptOps.UNROLL, 0, 2)]
  got, _, src = _run_ast(dev, _mm_ast(M, N, K), r, {1: a, 2: b}, M * N, opts)
  assert "float acc" not in src and f"float{w} acc15" in src
  np.testing.assert_allclose(got.reshape(M, N), a @ b, rtol=1e-4, atol=1e-4)

@pytest.mark.parametrize("w", [4, 8])
def test_cpu_profile_depthwise_conv_upcasts_window_rows(dev, w):
  """A depthwise conv (no broadcast row axis): one vector of columns, 4 output rows of the window's slide (rule
  opencl.window_rows), the whole window unrolled, and a row's column vectors in one work-group; numpy's numbers."""
  from tests.catalogue import dwconv2d_ast, dwconv2d_numpy
  r = _cpu_profile(dev, w)
  N, C, H, W = 1, 3, 8, 2 * w
  rng = np.random.default_rng(w)
  x, wt = rng.standard_normal((N, C, H, W), dtype=np.float32), rng.standard_normal((C, 3, 3), dtype=np.float32)
  got, opts, _ = _run_ast(dev, dwconv2d_ast(N, C, H, W), r, {1: x, 2: wt}, N * C * H * W)
  assert [(o.op.name, o.axis, o.amt) for o in opts] == [("UPCAST", 2, w), ("UPCAST", 1, 4), ("UNROLL", 1, 0),
                                                        ("UNROLL", 0, 0), ("LOCAL", 2, 2)], opts
  np.testing.assert_allclose(got.reshape(N, C, H, W), dwconv2d_numpy(x, wt), rtol=1e-5, atol=1e-5)

def test_cpu_profile_strided_conv_tiles_channels_by_a_gathered_vector(dev):
  """The reference's stride-2 conv (8x16x32x32 -> 32, its own two-View AST): rule opencl.strided_conv's tile, and the
  reference's own outputs."""
  import os
  import sys
  sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "benchmarks", "reference"))
  from kernopt_rows import RowProgram, check_reference
  from translate import load_rows
  ref = load_rows()["conv_16x32_s2"]
  prog = RowProgram(dev, ref, True)
  k = Kernel(ref.kernels[0].ast, opts=dev.renderer).required_optimizations()
  k.hand_coded_optimizations()
  if dev.renderer.caps.heuristics == "opencl_cpu":
    assert "opencl.strided_conv" in [d.rule for d in k.explain()]
  prog.run()
  check_reference(ref, prog.output())

def test_cpu_profile_conv_like_short_reduce_keeps_8_accumulators(dev):
  from kernopt.opt import OptOps
  r = _cpu_profile(dev)
  w = r.caps.vector_width
  M, N, K = 64, 4 * w, 3   # a reduce axis of at most 3 (a conv's window column) is unrolled entirely
  rng = np.random.default_rng(6)
  a, b = rng.standard_normal((M, K), dtype=np.float32), rng.standard_normal((K, N), dtype=np.float32)
  got, opts, _ = _run_ast(dev, _mm_ast(M, N, K), r, {1: a, 2: b}, M * N)
  assert [(o.op, o.axis, o.amt) for o in opts] == [(OptOps.UPCAST, 1, 2 * w), (OptOps.UPCAST, 0, 4),
                                                   (OptOps.UNROLL, 0, 0), (OptOps.LOCAL, 0, 8)]
  np.testing.assert_allclose(got.reshape(M, N), a @ b, rtol=1e-4, atol=1e-4)

def test_cpu_profile_big_elementwise_stores_are_non_temporal_and_fenced(dev):
  """On PoCL/x86-64 a loop-free kernel storing at least STREAM_MIN float32 elements stores them non-temporally, in
  work-groups of STREAM_GROUP items that each end with a barrier and one sfence; the output, filled with NaN first,
  equals numpy's exactly. Small kernels, the static profile and `stream_stores=False` keep plain stores."""
  import platform
  from tests.catalogue import buf as lbuf, kernel, store
  from kernopt.heuristics_opencl import STREAM_GROUP
  from kernopt.kernel import Kernel
  from kernopt.renderers.opencl import STREAM_MIN
  r = _cpu_profile(dev)
  if not (r.caps.clang and platform.machine().lower() in ("x86_64", "amd64")):
    assert not r.caps.stream_stores
    pytest.skip("non-temporal stores need PoCL on x86-64")
  assert r.caps.stream_stores and r.capabilities()["stream_stores"]
  assert not OpenCLRenderer().capabilities()["stream_stores"]
  shp = (STREAM_MIN // 1024, 1024)
  rng = np.random.default_rng(7)
  xs = {i: rng.standard_normal(shp, dtype=np.float32) for i in (1, 2)}
  ast = kernel(store(alu_ast(BinaryOps.ADD, lbuf(1, shp), lbuf(2, shp))))
  k = Kernel(ast, opts=r).required_optimizations().hand_coded_optimizations()
  prg = k.to_program()
  assert "__builtin_nontemporal_store(" in prg.src and prg.local_size[0] == STREAM_GROUP
  tail = prg.src.rstrip().splitlines()[-3:-1]
  assert tail[0].strip() == "barrier(CLK_GLOBAL_MEM_FENCE);" and '__asm__ __volatile__("sfence"' in tail[1]
  out = Buffer("OPENCL", STREAM_MIN, f32).copyin(np.full(STREAM_MIN, np.nan, np.float32))
  dev.compile(prg)(out, buf(xs[1]), buf(xs[2]), wait=True)
  np.testing.assert_array_equal(out.numpy().reshape(shp), xs[1] + xs[2])
  small = kernel(store(alu_ast(BinaryOps.ADD, lbuf(1, (64, 64)), lbuf(2, (64, 64)))))
  plain = OpenCLDevice(stream_stores=False).renderer
  same_width = OpenCLRenderer(vector_width=r.caps.vector_width)
  for rr, a in ((r, small), (OpenCLRenderer(), ast), (same_width, ast), (plain, ast)):
    src = Kernel(a, opts=rr).hand_coded_optimizations().to_program().src
    assert "nontemporal" not in src and "sfence" not in src

@pytest.mark.parametrize("w", [4, 8])
def test_cpu_profile_exp2_elementwise_packs_lanes_of_the_vector_width(dev, w):
  """An elementwise kernel with exp2 gets w packed lanes (rule opencl.elementwise: PoCL's vector builtins instead of
  a scalar call per element), where a plain one keeps ELEMENTWISE_LANES scalar lanes; numpy's exp2(x) * x within
  4 ulp (OpenCL allows exp2 3)."""
  from tests.catalogue import buf as lbuf, kernel, store
  from kernopt.heuristics_opencl import ELEMENTWISE_LANES
  r = _cpu_profile(dev, w)
  shp = (16, 8 * w)
  x = np.random.default_rng(w).uniform(-20, 20, shp).astype(np.float32)
  ast = kernel(store(alu_ast(BinaryOps.MUL, alu_ast(UnaryOps.EXP2, lbuf(1, shp)), lbuf(1, shp))))
  got, opts, src = _run_ast(dev, ast, r, {1: x}, x.size)
  assert (opts[0].op.name, opts[0].amt) == ("UPCAST", w) and f"float{w}" in src, opts
  np.testing.assert_allclose(got.reshape(shp), np.exp2(x.astype(np.float64)) * x, rtol=4 * 2.0 ** -23)
  plain = kernel(store(alu_ast(BinaryOps.MUL, lbuf(1, shp), lbuf(1, shp))))
  _, popts, _ = _run_ast(dev, plain, r, {1: x}, x.size)
  assert popts[0].amt == (ELEMENTWISE_LANES if ELEMENTWISE_LANES < w else popts[0].amt), popts

def test_cpu_profile_streamed_rows_make_a_work_group_each(dev):
  """A big elementwise kernel whose rows don't merge (a per-row input: layernorm's normalize, packed lanes) makes each
  row's work-items one work-group, since the rows leave enough groups (rule opencl.group); its vector stores stay
  plain, with no fence (measured faster than streamed scalar stores); exactly numpy's numbers."""
  from tests.catalogue import buf as lbuf, kernel, store, view
  from kernopt.renderers.opencl import STREAM_MIN
  r = _cpu_profile(dev)
  if not r.caps.stream_stores: pytest.skip("non-temporal stores need PoCL on x86-64")
  R, C = STREAM_MIN // 1024, 1024
  rng = np.random.default_rng(8)
  x, m, sc = (rng.standard_normal(n, dtype=np.float32) for n in (R * C, R, R))
  row = lambda i: lbuf(i, (R, C), st=view((R, C), (1, 0)))  # noqa: E731
  ast = kernel(store(alu_ast(BinaryOps.MUL, alu_ast(BinaryOps.ADD, lbuf(1, (R, C)), alu_ast(UnaryOps.NEG, row(2))),
                             row(3))))
  got, opts, src = _run_ast(dev, ast, r, {1: x, 2: m, 3: sc}, R * C)
  w = r.caps.vector_width
  assert [(o.op.name, o.amt) for o in opts] == [("UPCAST", w), ("LOCAL", C // w)]
  assert "__builtin_nontemporal_store(" not in src and "sfence" not in src
  np.testing.assert_array_equal(got.reshape(R, C), (x.reshape(R, C) - m[:, None]) * sc[:, None])

@pytest.mark.parametrize("opts", [[(OptOps_("UPCAST"), 0, 8), (OptOps_("LOCAL"), 0, 16)],
                                  [(OptOps_("NOLOCALS"), None, None)],
                                  [(OptOps_("UPCAST"), 0, 2), (OptOps_("LOCAL"), 0, 2)]],
                         ids=["vector-stores", "no-locals", "small-groups"])
def test_streamed_kernels_with_other_opts_are_exact(dev, opts):
  """A kernel big enough to stream, under Opts a search could choose (packed vector stores, no local size, groups
  of 2): the barrier and fence at its end keep its non-temporal stores exact, the output filled with NaN first; packed
  vector stores are spelled plain, with no fence."""
  from tests.catalogue import buf as lbuf, kernel, store
  from kernopt.renderers.opencl import STREAM_MIN
  r = _cpu_profile(dev)
  if not r.caps.stream_stores: pytest.skip("non-temporal stores need PoCL on x86-64")
  shp = (STREAM_MIN // 1024, 1024)
  rng = np.random.default_rng(11)
  xs = {i: rng.standard_normal(shp, dtype=np.float32) for i in (1, 2)}
  ast = kernel(store(alu_ast(BinaryOps.ADD, lbuf(1, shp), lbuf(2, shp))))
  from kernopt.kernel import Kernel
  from kernopt.opt import Opt
  k = Kernel(ast, opts=r).required_optimizations()
  for o in opts: k.apply_opt(Opt(*o))
  prg = k.to_program()
  streamed, packed = "__builtin_nontemporal_store(" in prg.src, opts[0] == (OptOps_("UPCAST"), 0, 8)
  assert streamed != packed and ("sfence" in prg.src) == streamed
  out = Buffer("OPENCL", STREAM_MIN, f32).copyin(np.full(STREAM_MIN, np.nan, np.float32))
  dev.compile(prg)(*[{0: out, 1: buf(xs[1]), 2: buf(xs[2])}[a.idx] for a in prg.args], wait=True)
  np.testing.assert_array_equal(out.numpy().reshape(shp), xs[1] + xs[2])

@pytest.mark.parametrize("w", [4, 8, 16])
def test_cpu_profile_row_sum_streams_rows_into_vector_accumulators(dev, w):
  from tests.catalogue import buf as lbuf, kernel, reduce, store
  from kernopt.ops import ReduceOps
  from kernopt.opt import OptOps
  r = _cpu_profile(dev, w)
  R, C = 16, 8 * w
  x = np.random.default_rng(4).standard_normal((R, C), dtype=np.float32)
  got, opts, src = _run_ast(dev, kernel(store(reduce(ReduceOps.SUM, lbuf(1, (R, C)), (1,)))), r, {1: x}, R)
  np.testing.assert_allclose(got, x.sum(axis=1), rtol=1e-4, atol=1e-4)   # the numbers hold at every width
  assert [(o.op, o.amt) for o in opts] == [(OptOps.UNROLL, 2 * w), (OptOps.UPCAST, 4 if w > 4 else 2)]
  assert f"float{w} acc" in src and vector_access(src, w, "load")

@pytest.mark.parametrize("depthwise", [False, True])
def test_cpu_profile_conv_rows_no_multiple_of_16_use_float8_at_width_16(dev, depthwise):
  """Width 16, output rows of 24 columns (the reference's 56 alike): the conv tile takes float8 vectors of columns
  (rule opencl.half_width for a conv whose channels are rows; a depthwise conv's window rows as at width 8), packed by
  the vectorize pass's fallback width; the numbers are numpy's."""
  from tests import catalogue as cat
  N, C, H, W = 1, 8, 4, 24
  rng = np.random.default_rng(8)
  x = rng.standard_normal((N, C, H, W), dtype=np.float32)
  xp = np.pad(x.astype(np.float64), ((0, 0), (0, 0), (1, 1), (1, 1)))
  if depthwise:
    ast, wgt = cat.dwconv2d_ast(N, C, H, W), rng.standard_normal((C, 3, 3), dtype=np.float32)
    ref = cat.dwconv2d_numpy(x, wgt)
  else:
    ast, wgt = cat.conv2d_ast(N, C, H, W, 16), rng.standard_normal((16, C, 3, 3), dtype=np.float32)
    ref = sum(np.einsum("nchw,oc->nohw", xp[:, :, ky:ky + H, kx:kx + W], wgt[:, :, ky, kx]) for ky in range(3)
              for kx in range(3))
  got, opts, src = _run_ast(dev, ast, _cpu_profile(dev, 16), {1: x, 2: wgt}, ref.size)
  np.testing.assert_allclose(got.reshape(ref.shape), ref, rtol=1e-4, atol=1e-4)
  from kernopt.opt import OptOps
  assert (OptOps.UPCAST, 8) in [(o.op, o.amt) for o in opts] and "float8" in src and "float16" not in src

@pytest.mark.parametrize("w", [8, 16])
def test_cpu_profile_elementwise_with_a_per_row_input_packs_lanes(dev, w):
  """(x - mean) * rstd with mean and rstd one value per row (layernorm's normalize): packed float{w} lanes, which read
  the row's value once a vector, and a work-group per row (rule opencl.elementwise); the numbers are numpy's."""
  from tests.catalogue import buf as lbuf, kernel, store, view
  from kernopt.opt import OptOps
  R, C = 8, 4 * w
  rng = np.random.default_rng(9)
  xs = {1: rng.standard_normal((R, C), dtype=np.float32), 2: rng.standard_normal(R, dtype=np.float32),
        3: rng.random(R, dtype=np.float32) + 0.5}
  row = lambda i: lbuf(i, (R, C), st=view((R, C), (1, 0)))  # noqa: E731
  ast = kernel(store(alu_ast(BinaryOps.MUL, alu_ast(BinaryOps.ADD, lbuf(1, (R, C)), alu_ast(UnaryOps.NEG, row(2))),
                             row(3))))
  got, opts, src = _run_ast(dev, ast, _cpu_profile(dev, w), xs, R * C)
  assert [(o.op, o.amt) for o in opts][0] == (OptOps.UPCAST, w) and f"float{w}" in src
  np.testing.assert_allclose(got.reshape(R, C), (xs[1] - xs[2][:, None]) * xs[3][:, None], rtol=1e-6, atol=1e-6)

def test_cpu_profile_elementwise_keeps_lanes_scalar_in_work_groups(dev):
  from tests.catalogue import buf as lbuf, const as lconst, kernel, store
  from kernopt.opt import OptOps
  r = _cpu_profile(dev)
  shp = (64, 64)
  rng = np.random.default_rng(5)
  xs = {i: rng.standard_normal(shp, dtype=np.float32) for i in (1, 2, 3)}
  fma = alu_ast(BinaryOps.ADD, alu_ast(BinaryOps.MUL, lbuf(1, shp), lbuf(2, shp)), lbuf(3, shp))
  ast = kernel(store(alu_ast(BinaryOps.MAX, fma, lconst(0.0, shp))))
  got, opts, src = _run_ast(dev, ast, r, xs, 64 * 64)
  ops = [(o.op, o.amt) for o in opts]
  assert ops[-1][0] is OptOps.LOCAL and (r.caps.vector_width <= 4 or ops[0] == (OptOps.UPCAST, 4))
  assert "vload" not in src and "float4" not in src   # lanes stay scalar: PoCL vectorizes across work-items
  assert "#pragma OPENCL FP_CONTRACT OFF" in src       # a*b+c rounded twice, as numpy does
  np.testing.assert_array_equal(got.reshape(shp), np.maximum(xs[1] * xs[2] + xs[3], np.float32(0)))

def test_cpu_profile_vector_max_is_exact_with_nan(dev):
  from tests.catalogue import buf as lbuf, kernel, store
  from kernopt.opt import OptOps
  r = _cpu_profile(dev)
  w = r.caps.vector_width
  n = 4 * w
  a, b = np.arange(n, dtype=np.float32) - n / 2, np.full(n, 1.5, np.float32)
  a[1], b[2], a[3], b[3] = np.nan, np.nan, -0.0, 0.0
  ast = kernel(store(alu_ast(BinaryOps.MAX, lbuf(1, (n,)), lbuf(2, (n,)))))
  got, _, src = _run_ast(dev, ast, r, {1: a, 2: b}, n, opts=[(OptOps.UPCAST, 0, w)])
  assert "select(" in src and "isgreater(" in src
  want = np.where(a > b, a, b)   # the op table's MAX: a > b ? a : b, so a NaN compare picks b
  np.testing.assert_array_equal(got, want)
  assert np.signbit(got[3]) == np.signbit(want[3])

def test_cpu_profile_falls_back_to_the_spec_for_other_dtypes(dev):
  from tests.catalogue import buf as lbuf, kernel, reduce, store
  from kernopt.heuristics_opencl import hand_coded_opencl
  from kernopt.kernel import Kernel
  from kernopt.ops import ReduceOps
  r = _cpu_profile(dev)
  ast = kernel(store(reduce(ReduceOps.SUM, lbuf(1, (8, 64), dtype=i32), (1,))))
  assert hand_coded_opencl(Kernel(ast, opts=r)) is False
  x = np.arange(8 * 64, dtype=np.int32).reshape(8, 64)
  prg = Kernel(ast, opts=r).hand_coded_optimizations().to_program()
  out = Buffer("OPENCL", 8, i32)
  dev.compile(prg)(*[{0: out, 1: buf(x)}[a.idx] for a in prg.args], wait=True)
  np.testing.assert_array_equal(out.numpy(), x.sum(axis=1))

def _max_tree(depth: int):
  """max(max(max(a, b0), b1) + 1, ...) depth deep over a (4, 8) float tensor: every MAX takes the one before it."""
  from kernopt import ast as A
  a = A.load(1, dtypes.float32, (4, 8))
  x = a
  for i in range(depth): x = A.add(A.maximum(x, A.load(2, dtypes.float32, (4, 8))), float(i % 3))
  return A.kernel(A.store(0, x))

def _max_tree_numpy(depth: int, a: np.ndarray, b: np.ndarray) -> np.ndarray:
  x = a
  for i in range(depth): x = np.maximum(x, b) + np.float32(i % 3)
  return x

def test_a_tree_of_vector_max_renders_linearly_and_matches_numpy():
  """OpenCL spells a vector MAX as select(b, a, isgreater(a, b)), naming each operand twice: inlined operands are
  named instead, so a chain of MAXes renders in source linear in its depth (a generated AST of the fuzzer rendered
  39.9 million characters before), and the numbers stay numpy's."""
  from kernopt.kernel import Kernel, Opt, OptOps
  def src(depth: int) -> str:
    k = Kernel(_max_tree(depth), opts=OpenCLRenderer(vector_width=8))
    k.apply_opt(Opt(OptOps.UPCAST, 0, 8))
    return k.to_program().src
  assert "isgreater" in src(4)
  assert len(src(24)) < 3 * len(src(12))
  if "OPENCL" not in Device.available(): return
  rng = np.random.default_rng(0)
  a, b = rng.standard_normal((4, 8), np.float32), rng.standard_normal((4, 8), np.float32)
  k = Kernel(_max_tree(24), opts=Device["OPENCL"].renderer)
  k.hand_coded_optimizations()
  out = Buffer("OPENCL", 32, dtypes.float32)
  bufs = {0: out, 1: Buffer("OPENCL", 32, dtypes.float32).copyin(a), 2: Buffer("OPENCL", 32, dtypes.float32).copyin(b)}
  prg = k.to_program()
  Device["OPENCL"].compile(prg)(*[bufs[x.idx] for x in prg.args], wait=True)
  np.testing.assert_allclose(out.numpy().reshape(4, 8), _max_tree_numpy(24, a, b), rtol=1e-6)

@pytest.mark.parametrize("w", [4, 8, 16])
def test_cpu_profile_padded_windows_are_masked_vector_loads_bit_for_bit(dev, w):
  """A padded conv's and depthwise conv's gated window lanes become one masked vector load (caps.masked_loads; a plain
  vector load when every lane is open, else only the open lanes read): bit for bit the same results as the gathered
  lanes without masked loads, and numpy's, at widths 4, 8 and 16 (the first and last vector of a row are cut by the
  padding)."""
  from dataclasses import replace
  from tests import catalogue as cat
  N, C, H, W = 1, 4, 5, 2 * w
  rng = np.random.default_rng(w)
  x = rng.standard_normal((N, C, H, W), dtype=np.float32)
  xp = np.pad(x.astype(np.float64), ((0, 0), (0, 0), (1, 1), (1, 1)))
  wd, wc = rng.standard_normal((C, 3, 3), dtype=np.float32), rng.standard_normal((8, C, 3, 3), dtype=np.float32)
  conv = sum(np.einsum("nchw,oc->nohw", xp[:, :, ky:ky + H, kx:kx + W], wc[:, :, ky, kx]) for ky in range(3)
             for kx in range(3))
  r0 = _cpu_profile(dev, w)
  def fresh():   # a renderer of its own (the device's is shared by every test)
    return OpenCLRenderer(local_max=r0.caps.local_max, max_local_size=r0.caps.max_local_size,
                          shared_max=r0.caps.shared_max, has_fp16=r0.caps.has_fp16,
                          supports_images=r0.caps.supports_images, vector_width=w,
                          stream_stores=r0.caps.stream_stores, clang=r0.caps.clang)
  masked, gathered = fresh(), fresh()
  gathered.caps = replace(gathered.caps, masked_loads=False)
  assert masked.caps.masked_loads
  cases = ((cat.dwconv2d_ast(N, C, H, W), wd, cat.dwconv2d_numpy(x, wd)), (cat.conv2d_ast(N, C, H, W, 8), wc, conv))
  for ast, wgt, ref in cases:
    got, opts, src = _run_ast(dev, ast, masked, {1: x, 2: wgt}, ref.size)
    base, _, base_src = _run_ast(dev, ast, gathered, {1: x, 2: wgt}, ref.size,
                                 opts=[(o.op, o.axis, o.amt) for o in opts])
    assert "ko_mload_float" in src and "ko_mload_float" not in base_src
    np.testing.assert_allclose(got.reshape(ref.shape), ref, rtol=1e-4, atol=1e-4)
    assert np.array_equal(got.view(np.uint32), base.view(np.uint32))

def test_masked_loads_are_a_declared_capability_of_the_cpu_profile_only():
  """The static OpenCL profile (GPUs) keeps gathers; a dialect without the spelling refuses a masked LOAD."""
  from kernopt.renderers.cstyle import CRenderer
  assert OpenCLRenderer(vector_width=8).caps.masked_loads and not OpenCLRenderer().caps.masked_loads
  with pytest.raises(UnsupportedError, match="masked"): CRenderer().render_masked_load("b", "0", "3", f32.vec(4))
