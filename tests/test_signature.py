"""The kernel signature: one Buffer per MemBuffer index in index order, the source taking only the used ones (a load
folded away must not shift the later buffers), Variables as wide as their ranges, and the launch checks of
CompiledRunner (variable values, aliasing). Numbers are compared with numpy."""
import ctypes
import re
import numpy as np
import pytest
from catalogue import alu, buf, const, kernel, protocol_program, reduce, store, view
from kernopt.dtype import dtypes
from kernopt.errors import LaunchError, UnsupportedError
from kernopt.kernel import Kernel
from kernopt.ops import BinaryOps, ReduceOps, TernaryOps
from kernopt.renderers import get_renderer
from kernopt.renderers.native import NativeCRenderer
from kernopt.runtime import Buffer, Device
from kernopt.runtime.opencl import OpenCLDevice
from kernopt.shape.shapetracker import ShapeTracker
from kernopt.shape.symbolic import Variable
from kernopt.shape.view import View

F, I = dtypes.float, dtypes.int32
opencl_ok, opencl_why = OpenCLDevice.availability()

def _dead_loads() -> dict:
  """name -> (AST, dtype) where buffer 1's load folds away and out = buffer 2."""
  only_pad = ShapeTracker.from_shape((4,)).pad(((4, 0),)).shrink(((0, 4),))
  return {
    "pad_shrink": (kernel(store(alu(BinaryOps.ADD, buf(1, (4,), st=only_pad), buf(2, (4,))))), F),
    "where_false": (kernel(store(alu(BinaryOps.ADD, alu(TernaryOps.WHERE, const(False, (4,), dtypes.bool),
                                                        buf(1, (4,)), const(0.0, (4,))), buf(2, (4,))))), F),
    "int_times_zero": (kernel(store(alu(BinaryOps.ADD, alu(BinaryOps.MUL, buf(1, (4,), I), const(0, (4,), I)),
                                        buf(2, (4,), I)))), I),
  }
DEAD = _dead_loads()

DEVICES = [("CPU", {}), ("CPU", {"profile": "static"}), ("PYTHON", {}), ("OPENCL", {})]
def _open(name: str, options: dict):
  if name == "OPENCL" and not opencl_ok: pytest.skip(f"no OpenCL platform: {opencl_why}")
  return Device.open(name, **options)

@pytest.mark.parametrize("case", sorted(DEAD))
@pytest.mark.parametrize("name,options", DEVICES, ids=lambda x: x if isinstance(x, str) else ",".join(x.values()))
def test_a_dead_load_does_not_shift_the_later_buffers(case, name, options):
  ast, dt = DEAD[case]
  dev = _open(name, options)
  prg = Kernel(ast, opts=dev.renderer).to_program()
  assert [a.used for a in prg.args] == [True, False, True]
  npdt = np.float32 if dt == F else np.int32
  bufs = [Buffer(dev.name, 4, dt), Buffer(dev.name, 1, dt).copyin(np.full(1, 100, npdt)),
          Buffer(dev.name, 4, dt).copyin(np.arange(1, 5, dtype=npdt))]
  dev.compile(prg)(*bufs, wait=True)   # buffer 1 is unused: 1 element is enough (dtype is still checked)
  np.testing.assert_array_equal(bufs[0].numpy(), np.arange(1, 5, dtype=npdt))
  bad = Buffer(dev.name, 4, dtypes.int8 if dt == F else F)
  with pytest.raises(LaunchError, match="dtype"): dev.compile(prg)(bufs[0], bad, bufs[2])
  with pytest.raises(LaunchError, match="takes 3 buffers"): dev.compile(prg)(bufs[0], bufs[2])

# ***** the rendered parameters are the used args, then the variables, on every dialect *****

def _params(src: str, name: str) -> list[str]:
  """The parameter list of the kernel function `name` in src (Metal: the [[buffer(i)]] ones only)."""
  header = next(ln for ln in src.splitlines() if re.search(rf"(?<![\w]){re.escape(name)}\(.*\)\s*{{$", ln))
  inner = header[header.index(f"{name}(") + len(name) + 1:header.rindex(")")]
  params = [p.strip() for p in inner.split(",")]
  return [p for p in params if "[[buffer(" in p] if "[[" in inner else params

def _param_name(p: str) -> str: return re.findall(r"[A-Za-z_]\w*", re.sub(r"\[\[.*?\]\]", "", p))[-1]
def _is_buffer(p: str) -> bool: return "*" in p or "image" in p

def check_signature(prg) -> None:
  params = _params(prg.src, prg.name)
  bufs, vs = [p for p in params if _is_buffer(p)], [p for p in params if not _is_buffer(p)]
  assert params == bufs + vs, f"buffers must come first: {params}"
  assert [int(re.findall(r"\d+$", _param_name(p))[0]) for p in bufs] == [a.idx for a in prg.used_args], params
  assert len(vs) == len(prg.var_args), params   # names may carry the renderer's identifier prefix
  assert all(_param_name(p).endswith(a.name) for p, a in zip(vs, prg.var_args)), params
  for p, a in zip(vs, prg.var_args): assert ("int64" in p or "long" in p) == (a.dtype == dtypes.int64), p

DIALECTS = {"C": lambda: get_renderer("C"), "native": lambda: NativeCRenderer(vector_width=8, threads=2),
            "OPENCL": lambda: get_renderer("OPENCL"), "CUDA": lambda: get_renderer("CUDA"),
            "METAL": lambda: get_renderer("METAL"), "AMD": lambda: get_renderer("AMD")}
CASES = ("add", "pad", "two_outputs", "sum_axis1", "matmul_64", "matmul_half", "sym_add", "sym_sum", "image_in")

@pytest.mark.parametrize("dialect", sorted(DIALECTS))
def test_rendered_parameters_are_the_used_args_in_order(dialect):
  r = DIALECTS[dialect]()
  for ast, _ in DEAD.values():
    check_signature(Kernel(ast, opts=r).to_program())
    check_signature(Kernel(ast, opts=r).hand_coded_optimizations().to_program())
  for name in CASES:
    if name == "image_in" and not r.caps.supports_images: continue
    check_signature(protocol_program(name, r)[0])
  n = Variable("n", 1, 2**40)
  wide = kernel(store(reduce(ReduceOps.SUM, buf(1, (n,)), (0,))))   # a loop: no grid of 2**40 threads
  prg = Kernel(wide, opts=r).to_program()
  assert [a.dtype for a in prg.var_args] == [dtypes.int64]
  check_signature(prg)

# ***** Variables and indices as wide as their bounds need *****

N40 = Variable("n", 1, 2**40)
WIDE_DEVICES = DEVICES + [("PYTHON", {"emulate": "CUDA"}), ("PYTHON", {"emulate": "METAL"})]

def _masked_by_n(reduce_it: bool):
  """out = where(col < n, x, 0) * x over (32, 64), summed over the columns if reduce_it: n is only in a mask."""
  shp = (32, 64)
  x = buf(1, shp, st=view(shp, (64, 1), 0, ((0, 32), (0, N40))))
  y = alu(BinaryOps.MUL, x, buf(2, shp))
  return kernel(store(reduce(ReduceOps.SUM, y, (1,)) if reduce_it else y))

@pytest.mark.parametrize("reduce_it", [False, True], ids=["elementwise", "sum"])
@pytest.mark.parametrize("name,options", WIDE_DEVICES, ids=lambda x: x if isinstance(x, str) else ",".join(x.values()))
def test_a_variable_beyond_int32_is_passed_and_compared_in_64_bits(name, options, reduce_it):
  dev = _open(name, options)
  k = Kernel(_masked_by_n(reduce_it), opts=dev.renderer).hand_coded_optimizations()
  prg = k.to_program()
  assert [a.dtype for a in prg.var_args] == [dtypes.int64]
  x = np.random.default_rng(0).random((32, 64), dtype=np.float32)
  runner = dev.compile(prg)
  for n in (37, 2**32 + 2, 2**40):   # in 32 bits 2**32+2 would be 2 and 2**40 would be 0
    want = np.where(np.arange(64) < n, x, 0) * x
    if reduce_it: want = want.sum(1, keepdims=True)
    out = Buffer(dev.name, want.size, F)
    runner(out, Buffer(dev.name, x.size, F).copyin(x), Buffer(dev.name, x.size, F).copyin(x), var_vals={N40: n})
    np.testing.assert_allclose(out.numpy().reshape(want.shape), want, rtol=1e-5, err_msg=f"n={n}")

@pytest.mark.parametrize("options", [{}, {"profile": "static"}], ids=["native", "static"])
def test_a_sum_of_n_ones_with_n_past_2_to_the_32(options):
  """A loop of 2**32+3 trips: the C compiler folds it to its trip count, so it runs in no time."""
  dev = Device.open("CPU", **options)
  ones = const(1, (N40,), dtypes.int64)
  ast = kernel(store(reduce(ReduceOps.SUM, ones, (0,)), dtype=dtypes.int64, st=ShapeTracker.from_shape((1,))))
  prg = Kernel(ast, opts=dev.renderer).hand_coded_optimizations().to_program()
  runner = dev.compile(prg)
  assert runner.lib.argtypes == [ctypes.c_void_p, ctypes.c_int64]
  out = Buffer("CPU", 1, dtypes.int64)
  runner(out, var_vals={"n": 2**32 + 3}, wait=True)
  assert out.numpy().tolist() == [2**32 + 3]

def test_cuda_packs_each_variable_as_wide_as_its_signature():
  """A fake driver reads the kernel parameters cuLaunchKernel gets: pointers, an int32 and an int64 variable."""
  import kernopt.runtime.cuda as cuda
  seen: list = []
  class FakeDriver:
    def cuCtxSetCurrent(self, ctx): return (0,)
    def cuLaunchKernel(self, fn, gx, gy, gz, bx, by, bz, smem, stream, params, extra):
      ptrs = (ctypes.c_void_p * 4).from_address(params)
      seen.extend([ctypes.c_uint64.from_address(ptrs[0]).value, ctypes.c_uint64.from_address(ptrs[1]).value,
                   ctypes.c_int32.from_address(ptrs[2]).value, ctypes.c_int64.from_address(ptrs[3]).value])
      return (0,)
  dev = cuda.CUDADevice.__new__(cuda.CUDADevice)
  dev.drv, dev.ctx, dev.renderer = FakeDriver(), "ctx", get_renderer("CUDA")
  m, n = Variable("m", 1, 8), Variable("n", 1, 2**40)
  ast = kernel(store(reduce(ReduceOps.SUM, buf(1, (m, n)), (1,)), st=ShapeTracker.from_shape((m, 1))))
  prg = Kernel(ast, opts=dev.renderer).to_program()
  assert [(a.name, a.dtype) for a in prg.var_args] == [("m", I), ("n", dtypes.int64)]
  assert re.search(r"const int \w*m, const long long \w*n\)", prg.src), prg.src
  gsz, lsz = prg.launch_dims({m: 3, n: 2**33 + 5})
  dev._launch(cuda._CUDAKernel("module", "fn", prg.name), prg, [0x1000, 0x2000], [3, 2**33 + 5], gsz, lsz, False)
  assert seen == [0x1000, 0x2000, 3, 2**33 + 5]

def test_metal_binds_each_variable_with_its_width():
  import kernopt.runtime.metal as metal
  calls: list = []
  class Enc:
    def setComputePipelineState_(self, p): pass
    def setBuffer_offset_atIndex_(self, h, off, i): calls.append(("buf", h, i))
    def setBytes_length_atIndex_(self, b, n, i): calls.append(("bytes", b, n, i))
    def dispatchThreadgroups_threadsPerThreadgroup_(self, g, b): pass
    def endEncoding(self): pass
  class Cmd:
    def computeCommandEncoder(self): return Enc()
    def commit(self): pass
  class Lib:
    def maxTotalThreadsPerThreadgroup(self): return 1024
  dev = metal.MetalDevice.__new__(metal.MetalDevice)
  dev.queue = type("Q", (), {"commandBuffer": lambda self: Cmd()})()
  dev.mtl = type("M", (), {"MTLSizeMake": staticmethod(lambda *a: a)})()
  m, n = Variable("m", 1, 8), Variable("n", 1, 2**40)
  ast = kernel(store(reduce(ReduceOps.SUM, buf(1, (m, n)), (1,)), st=ShapeTracker.from_shape((m, 1))))
  prg = Kernel(ast, opts=get_renderer("METAL")).to_program()
  assert re.search(r"constant long& \w*n \[\[buffer\(3\)\]\]", prg.src), prg.src
  dev._launch(Lib(), prg, ["b0", "b1"], [3, 2**33 + 5], (3,), (1,), False)
  assert calls == [("buf", "b0", 0), ("buf", "b1", 1), ("bytes", np.int32(3).tobytes(), 4, 2),
                   ("bytes", np.int64(2**33 + 5).tobytes(), 8, 3)]

def test_indices_past_int32_are_computed_in_int64_on_every_dialect():
  """The issue's View: largest index 2,512,388,095. Nothing is allocated; the source is checked."""
  big = ShapeTracker((View.create((4096, 1024, 599), (613376, 599, 1)),)).permute((1, 0, 2))
  ast = kernel(store(alu(BinaryOps.ADD, buf(1, (1024, 4096, 599), st=big), const(1.0, (1024, 4096, 599)))))
  for dialect, make in DIALECTS.items():
    prg = Kernel(ast, opts=make()).hand_coded_optimizations().to_program()
    idx_dt = {"C": "int64_t", "native": "int64_t", "OPENCL": "long", "CUDA": "long long", "METAL": "long",
              "AMD": "long"}[dialect]
    reads = re.findall(r"data1\[([^\]]*)\]", prg.src)
    assert reads and not any("int32" in r or "(int)" in r for r in reads), (dialect, reads)
    assert re.search(rf"\b{idx_dt} alu\d+ = ", prg.src), (dialect, prg.src)
    assert "int32_t alu" not in prg.src and not re.search(r"\bint alu", prg.src), dialect
    check_signature(prg)
  small = protocol_program("add", get_renderer("C"))[0]
  assert "int64_t" not in small.src   # int64 only where the bounds need it

def test_a_launch_dimension_past_int32_is_refused():
  ast = kernel(store(const(1.0, (2**31 + 5,))))
  with pytest.raises(UnsupportedError, match="int32"): Kernel(ast, opts=get_renderer("OPENCL")).to_program()
  assert "int64_t" in Kernel(ast, opts=get_renderer("C")).to_program().src   # a loop on the CPU

# ***** launch checks: variable values, aliasing *****

def _sym_add(dev):
  n = Variable("n", 1, 8)
  prg = Kernel(kernel(store(alu(BinaryOps.ADD, buf(1, (n,)), buf(2, (n,))))), opts=dev.renderer).to_program()
  return n, dev.compile(prg)

def test_variable_values_must_be_ints_in_range_keyed_by_variable_or_name():
  dev = Device["CPU"]
  n, runner = _sym_add(dev)
  x = np.arange(8, dtype=np.float32)
  out, a, b = Buffer("CPU", 8, F), Buffer("CPU", 8, F).copyin(x), Buffer("CPU", 8, F).copyin(2 * x)
  for vv in ({"n": 5}, {n: 5}, {"n": np.int64(5)}, {n: np.int32(5), "unused": 1.5, Variable("m", 0, 1): True}):
    out.copyin(np.zeros(8, np.float32))
    runner(out, a, b, var_vals=vv)
    np.testing.assert_array_equal(out.numpy(), np.where(np.arange(8) < 5, 3 * x, 0))
  for bad, msg in ((True, "must be an int"), (np.bool_(True), "must be an int"), (5.0, "must be an int"),
                   ("5", "must be an int"), (0, "outside"), (9, "outside"), (2**40, "outside")):
    with pytest.raises(LaunchError, match=msg): runner(out, a, b, var_vals={"n": bad})
  with pytest.raises(LaunchError, match="needs a value"): runner(out, a, b, var_vals={"m": 3})
  with pytest.raises(LaunchError, match="given twice"): runner(out, a, b, var_vals={"n": 3, n: 4})
  # found by an independent tester: an array value given twice made the duplicate check a numpy truth-value error
  for vv in ({"n": np.array([3, 4]), n: 3}, {n: 3, "n": np.array([3, 4])}):
    with pytest.raises(LaunchError, match="given twice"): runner(out, a, b, var_vals=vv)
  runner(out, a, b, var_vals={"n": 5, n: np.int64(5)})   # the same value twice, by name and by Variable, is fine

@pytest.mark.parametrize("name,options", DEVICES[1:3], ids=["CPU-static", "PYTHON"])
def test_a_written_buffer_passed_twice_is_refused(name, options):
  dev = _open(name, options)
  _, runner = _sym_add(dev)
  x = np.arange(8, dtype=np.float32)
  out, a = Buffer(dev.name, 8, F), Buffer(dev.name, 8, F).copyin(x)
  with pytest.raises(LaunchError, match="same Buffer.*written"): runner(a, a, Buffer(dev.name, 8, F), var_vals={"n": 8})
  with pytest.raises(LaunchError, match="same Buffer.*written"): runner(a, Buffer(dev.name, 8, F), a, var_vals={"n": 8})
  np.testing.assert_array_equal(a.numpy(), x)   # refused before anything ran
  runner(out, a, a, var_vals={"n": 8})          # two reads of one buffer are fine
  np.testing.assert_array_equal(out.numpy(), 2 * x)
  ast, _ = DEAD["pad_shrink"]
  prg = Kernel(ast, opts=dev.renderer).to_program()
  o4, b4 = Buffer(dev.name, 4, F), Buffer(dev.name, 4, F).copyin(x[:4])
  dev.compile(prg)(o4, o4, b4)                  # buffer 1 is never read: aliasing it with the output is harmless
  np.testing.assert_array_equal(o4.numpy(), x[:4])
