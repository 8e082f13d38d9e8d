"""Every public constructor checks types, ranges and lengths before any cache, and refuses with a kernopt error that
names the argument (issue 15's front-end examples, each one here)."""
import math
import subprocess
import sys
import numpy as np
import pytest
from kernopt.dtype import DType, dtypes
from kernopt.errors import KernelOptError, LaunchError, ShapeError, UnsupportedError, VerifyError
from kernopt.kernel import Kernel, Opt, OptOps
from kernopt.ops import BinaryOps, BufferOps, ConstBuffer, LazyOp, MemBuffer, MetaOps, ReduceOps, UnaryOps
from kernopt.renderers import get_renderer
from kernopt.renderers.native import NativeCRenderer
from kernopt.runtime import Buffer, Device, cpu
from kernopt.shape.shapetracker import ShapeTracker
from kernopt.shape.symbolic import Variable
from kernopt.shape.view import View

ST = ShapeTracker.from_shape((4,))
LD = LazyOp(BufferOps.LOAD, (), MemBuffer(1, dtypes.float, ST))

def kernel(x, dt=dtypes.float):
  return LazyOp(MetaOps.KERNEL, (LazyOp(BufferOps.STORE, (x,), MemBuffer(0, dt, ST)),))

@pytest.mark.parametrize("build,msg", [
  (lambda: LazyOp(BinaryOps.ADD, [LD, LD]), "ADD src must be a tuple of LazyOps, got list"),
  (lambda: LazyOp(ReduceOps.SUM, (LD,), [0]), r"SUM arg must be hashable \(a tuple, not a list\), got list"),
  (lambda: LazyOp("ADD", (LD, LD)), "op must be a member of an op enum .* got str 'ADD'"),
  (lambda: LazyOp(BinaryOps.ADD, (LD, "x")), "source that is not a LazyOp: str 'x'"),
  (lambda: LazyOp(BinaryOps.ADD, (LD, LazyOp(BufferOps.STORE, (LD,), MemBuffer(2, dtypes.float, ST)))),
   "STORE can't be a source of BinaryOps.ADD"),
  (lambda: LazyOp(UnaryOps.NEG, (kernel(LD),)), "KERNEL can't be a source"),
  (lambda: ConstBuffer(10**400, dtypes.float, ST), "too large for any float"),
  (lambda: ConstBuffer("1", dtypes.float, ST), "val must be a bool, int, float or symbolic node, got str"),
  (lambda: ConstBuffer(1.0, "float", ST), "ConstBuffer dtype: str 'float' is not a DType"),
  (lambda: MemBuffer(1, DType(11, 16, "foo4", None, 4), ST), "MemBuffer 1 dtype: .*'foo4'.* not one of kernopt's"),
  (lambda: MemBuffer(True, dtypes.float, ST), "MemBuffer idx must be an int >= -1, got bool"),
  (lambda: MemBuffer(-2, dtypes.float, ST), r"idx must be an int in \[-1, 2\*\*31\), got -2"),
  (lambda: MemBuffer(0, dtypes.float, (4,)), "st must be a ShapeTracker, got tuple"),
])
def test_ast_constructors(build, msg):
  with pytest.raises(VerifyError, match=msg): build()

def test_const_values_numpy_and_nan():
  assert type(ConstBuffer(np.int64(3), dtypes.int32, ST).val) is int
  assert type(ConstBuffer(np.float32(0.5), dtypes.float, ST).val) is float
  assert type(MemBuffer(np.int64(2), dtypes.float, ST).idx) is int
  from kernopt.ops import verify_lazyop
  nan_int = LazyOp(BufferOps.CONST, (), ConstBuffer(math.nan, dtypes.int32, ST))
  with pytest.raises(VerifyError, match="CONST nan is not representable in dtypes.int32"):
    verify_lazyop(kernel(nan_int, dtypes.int32))

@pytest.mark.parametrize("args,msg", [
  (((4, 4), None, 0, ((0, 2),)), r"mask \(\(0, 2\),\) needs one \(begin, end\) pair per axis of shape \(4, 4\)"),
  (((4,), None, 0, ((0, 1, 2),)), "needs one .begin, end. pair per axis"),
  (((4,), None, 0, ((0, 5),)), r"mask .* is outside shape \(4,\)"),
  (((4,), None, 0, (("a", 2),)), "mask bound 'a'"),
  (((4.0,), None, 0, None), "dimension 4.0 .* must be a non-negative int"),
  (((True,), None, 0, None), "dimension True"),
  (((2**63,), None, 0, None), "dimension 9223372036854775808"),
  (((4,), ("a",), 0, None), "strides 'a'"), (((4,), (1, 1), 0, None), "need one entry per axis"),
  (((4,), None, "x", None), "offset 'x'"), (((4,), None, 1.5, None), "offset 1.5"),
])
def test_view_create(args, msg):
  View.create((4,))   # a cache full of the valid forms changes nothing
  View.create((4, 4), None, 0, ((0, 2), (0, 4)))
  with pytest.raises(ShapeError, match=msg): View.create(*args)

def test_view_create_refuses_a_float_shape_in_a_fresh_process_and_after_a_cache_hit():
  code = "from kernopt.shape.view import View\nfor s in [(4.0,), (4,), (4.0,)]:\n  try: View.create(s); print('ok')\n" \
         "  except Exception as e: print(type(e).__name__)\n"
  out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout.split()
  assert out == ["ShapeError", "ok", "ShapeError"]
  View.create((5,))
  with pytest.raises(ShapeError): View.create((5.0,))
  assert View.create((np.int64(5),)) == View.create((5,))

def test_movement_ops_check_before_the_cache():
  st = ShapeTracker.from_shape((4, 3))
  st.permute((1, 0)), st.stride((1, 1)), st.reshape((12,))
  with pytest.raises(ShapeError, match="permute: .* must hold ints"): st.permute((True, False))
  with pytest.raises(ShapeError, match="stride: .* must hold ints"): st.stride((1.0, 1))
  with pytest.raises(ShapeError, match="reshape: dimension 12.0"): st.reshape((12.0,))
  with pytest.raises(ShapeError, match="pad: dimension 0.5"): st.pad(((0.5, 0), (0, 0)))
  with pytest.raises(ShapeError, match="not a sequence"): st.expand(3)
  assert st.permute((np.int64(1), 0)) == st.permute((1, 0))

def test_variable_bounds():
  with pytest.raises(ShapeError, match="bound True must be an int, not bool"): Variable("n", True, 4)
  with pytest.raises(ShapeError, match="bound 1.0 must be an int"): Variable("n", 1.0, 4)
  with pytest.raises(ShapeError, match="int64 bounds"): Variable("n", 0, 2**63)
  with pytest.raises(ShapeError, match="min <= max"): Variable("n", 5, 4)
  assert Variable("n", np.int64(1), np.int32(4)) == Variable("n", 1, 4)
  with pytest.raises(ShapeError, match="cannot bind n to True"): Variable("n", 0, 4).bind(True)
  assert Variable("n", 0, 4).bind(np.int64(3)).val == 3

def test_opt_and_kernel_opts():
  with pytest.raises(KernelOptError, match="op must be an OptOps member"): Opt("UPCAST", 0, 4)
  with pytest.raises(KernelOptError, match="axis must be None or a non-negative int .* bool"):
    Opt(OptOps.UPCAST, True, 4)
  assert Opt(OptOps.UPCAST, np.int64(0), np.int32(4)) == Opt(OptOps.UPCAST, 0, 4)
  with pytest.raises(UnsupportedError, match=r"opts must be a Renderer \(e.g. get_renderer\('CPU'\)\), got str"):
    Kernel(kernel(LD), opts="CPU")
  if cpu.CPUDevice.availability()[0]:
    with pytest.raises(UnsupportedError, match=r"opts must be a Renderer \(e.g. CPUDevice.renderer\)"):
      Kernel(kernel(LD), opts=Device["CPU"])
  assert Kernel(kernel(LD), opts=get_renderer("CPU")).to_program()

def test_threads_and_renderer_options():
  for bad, msg in [("x", r"threads must be an int in \[1, 256\], got str 'x'"), (True, "got bool True"),
                   (2**31, r"threads must be an int in \[1, \d+\].*got 2147483648"), (0, "got 0"), (257, "got 257")]:
    with pytest.raises(UnsupportedError, match=msg): NativeCRenderer(threads=bad)
  with pytest.raises(UnsupportedError, match="vector_width must be a power of two"): NativeCRenderer(vector_width="4")
  with pytest.raises(UnsupportedError, match="min_parallel_work"): NativeCRenderer(min_parallel_work=1.5)
  with pytest.raises(UnsupportedError, match="fused_accumulate"): NativeCRenderer(fused_accumulate=1)
  assert NativeCRenderer(threads=np.int64(2)).caps.threads == 2

needs_cc = pytest.mark.skipif(not cpu.CPUDevice.availability()[0], reason="no C compiler")

@needs_cc
def test_device_open_and_buffers():
  with pytest.raises(UnsupportedError, match=r"threads must be an int in \[1, \d+\].*got 2147483648"):
    Device.open("CPU", threads=2**31)
  with pytest.raises(UnsupportedError, match="threads must be an int .* got str 'x'"): Device.open("CPU", threads="x")
  with pytest.raises(UnsupportedError, match="a device name is a str, got int 3"): Device.open(3)
  with pytest.raises(UnsupportedError, match="does not take these options: .*bogus"): Device.open("CPU", bogus=1)
  with pytest.raises(UnsupportedError, match=r"options must be hashable values: \['threads'\]"):
    Device.open("CPU", threads={})
  assert Device.open("CPU", extra_flags=["-DKERNOPT_FRONT=1"]) is Device.open("CPU", extra_flags=("-DKERNOPT_FRONT=1",))
  with pytest.raises(LaunchError, match="Buffer size must be a non-negative int, got bool True"):
    Buffer("CPU", True, dtypes.float)
  with pytest.raises(LaunchError, match="Buffer size must be a non-negative int, got float"):
    Buffer("CPU", 4.0, dtypes.float)
  with pytest.raises(LaunchError, match=r"Buffer size must be an int in \[0, 2\*\*48\), got -1"):
    Buffer("CPU", -1, dtypes.float)
  with pytest.raises(LaunchError, match="Buffer dtype: str 'float' is not a DType"): Buffer("CPU", 4, "float")
  with pytest.raises(LaunchError, match="Buffer dtype: .*not one of kernopt's dtypes"):
    Buffer("CPU", 4, DType(11, 16, "foo4", None, 4))
  with pytest.raises(UnsupportedError, match="Buffer device must be a device name"): Buffer(None, 4, dtypes.float)
  assert Buffer("CPU", np.int64(4), dtypes.float).size == 4

@needs_cc
def test_runner_calls():
  n = Variable("n", 1, 4)
  s = ShapeTracker.from_shape((n,))
  ast = LazyOp(MetaOps.KERNEL, (LazyOp(BufferOps.STORE, (LazyOp(BufferOps.LOAD, (), MemBuffer(1, dtypes.float, s)),),
                                       MemBuffer(0, dtypes.float, s)),))
  dev = Device.open("CPU", threads=1)
  runner = dev.compile(Kernel(ast, opts=dev.renderer).to_program())
  bufs = [Buffer(dev, 4, dtypes.float).copyin(np.arange(4, dtype=np.float32) * k) for k in (0, 1)]
  for vv, msg in [([("n", 2)], "var_vals must be a dict of Variable or name -> int, got list"),
                  ("n", "var_vals must be a dict .* got str"), ({3: 2}, "var_vals key must be a Variable or its name"),
                  ({"n": True}, "variable n must be an int, got bool"), ({"n": 5}, r"outside \[1, 4\]")]:
    with pytest.raises(LaunchError, match=msg): runner(*bufs, var_vals=vv)
  with pytest.raises(LaunchError, match="wait must be a bool, got str"): runner(*bufs, var_vals={"n": 2}, wait="yes")
  runner(*bufs, var_vals={n: np.int64(3)}, wait=True)
  assert list(bufs[0].numpy()) == [0, 1, 2, 0]

@needs_cc
def test_cpu_extra_flags_and_march(compiler_runs):
  """extra_flags: a list or tuple of single compiler flags (no whitespace, NUL or newline; none that redirects the
  build's output, input language or tools); march: None, 'native' or a known x86-64 level. Each refusal names the
  argument, and nothing reaches the compiler."""
  for bad, msg in [("-O1", "extra_flags must be a list or tuple of str flags, got str"),
                   ([3], "extra_flags entries must be str, got int"), (["O1"], "'O1' is not one compiler flag"),
                   (["-"], "is not one compiler flag"), (["-O1 -g"], "'-O1 -g' is not one compiler flag"),
                   (["-DX=1\n#include"], "is not one compiler flag"), (["-DX\0"], "is not one compiler flag"),
                   (["-o/tmp/x.so"], "'-o/tmp/x.so' is refused"), (["-xc++"], "refused"), (["-E"], "refused"),
                   (["-fplugin=/tmp/p.so"], "refused"), (["-B/tmp"], "refused"), (["-specs=/tmp/s"], "refused"),
                   # each of these writes or reads a file it names (an independent tester wrote files outside the
                   # cache with the first six): preprocessor, assembler and linker options, reports and dumps
                   (["-Wp,-MD,/tmp/x.d"], "refused"), (["-Wa,-adhln=/tmp/x.lst"], "refused"),
                   (["-fopt-info-all=/tmp/x"], "refused"), (["-Wl,-Map=/tmp/x.map"], "refused"),
                   (["-Xlinker"], "refused"), (["--save-temps"], "refused"), (["-da"], "refused"),
                   (["--dump=x"], "refused"), (["-include/etc/passwd"], "refused"), (["-I/tmp"], "refused"),
                   (["-L/tmp"], "refused"), (["-lfoo"], "refused"), (["-fstack-usage"], "refused")]:
    with pytest.raises(UnsupportedError, match=msg): cpu.CPUDevice(extra_flags=bad)
  for bad, msg in [(3, "march must be None or one of .*got int 3"), ("pentium4", "got str 'pentium4'"),
                   ("native; rm", "got str"), (True, "got bool")]:
    with pytest.raises(UnsupportedError, match=msg): cpu.CPUDevice(march=bad)
  with pytest.raises(UnsupportedError, match="march must be None or one of"): Device.open("CPU", march="x86-64-v9")
  with pytest.raises(UnsupportedError, match="extra_flags entry '-o' is refused"):
    Device.open("CPU", extra_flags=["-o"])
  with pytest.raises(UnsupportedError, match="workarounds must be a bool"): cpu.CPUDevice(workarounds=1)
  assert not compiler_runs, f"a refused argument reached the compiler: {compiler_runs}"
  assert cpu.CPUDevice(extra_flags=["-DKERNOPT_FRONT=2", "-Wno-unused"]).extra_flags == ("-DKERNOPT_FRONT=2",
                                                                                         "-Wno-unused")

# ***** found by an independent tester (stop 29) *****

def test_unreadable_ast_and_tuning_files_are_kernopt_errors(tmp_path):
  """A deeply nested JSON file, a device that never ends (/dev/zero) and a directory: kernopt.load raises VerifyError
  and import_cache TuningCacheError, each naming the file, without reading it all (before: RecursionError, and
  MemoryError after 2 GiB of /dev/zero)."""
  import os
  import kernopt
  from kernopt import search
  from kernopt.errors import TuningCacheError
  deep = tmp_path / "deep.json"
  deep.write_text("[" * 10000 + "]" * 10000)
  bad = [str(deep), str(tmp_path)] + (["/dev/zero"] if os.path.exists("/dev/zero") else [])
  for path in bad:
    with pytest.raises(VerifyError, match="deep.json|not a regular file|cannot read"): kernopt.load(path)
  for path in bad[1:]:
    with pytest.raises(TuningCacheError, match="not a regular file|cannot read"): search.import_cache(path)
  with pytest.raises(TuningCacheError, match="nested too deeply"): search.import_cache(str(deep))

def test_float_consts_too_big_for_a_float_are_verify_errors():
  from kernopt import ast as A
  x = A.load(1, dtypes.float, (4,))
  for build in (lambda: A.const(10**400, dtypes.float, (4,)), lambda: A.add(x, 10**400), lambda: A.mul(x, 2**1024)):
    with pytest.raises(VerifyError, match="does not fit a float"): build()

def test_compile_timeouts_that_are_not_finite_positive_mean_no_limit():
  """COMPILE_TIMEOUT inf, NaN or negative is no limit (it raised OverflowError / ValueError in the compile, or a
  CompileError 'took over -1 s'); SearchConfig refuses an infinite compile_timeout_s up front."""
  from kernopt import ast as A
  from kernopt.helpers import config_override
  from kernopt.search import SearchConfig
  with pytest.raises(VerifyError, match="compile_timeout_s must be finite"): SearchConfig(compile_timeout_s=math.inf)
  dev = cpu.CPUDevice(profile="static")
  for i, v in enumerate((math.inf, math.nan, -1.0)):
    ast = A.kernel(A.store(0, A.add(A.load(1, dtypes.float, (8,)), 3.0 + i)))
    with config_override(COMPILE_TIMEOUT=v, DISABLE_CACHE=1):
      runner = dev.compile(Kernel(ast, opts=dev.renderer).to_program())
    out, x = Buffer(dev, 8, dtypes.float), np.arange(8, dtype=np.float32)
    runner(out, Buffer(dev, 8, dtypes.float).copyin(x), wait=True)
    np.testing.assert_array_equal(out.numpy(), x + np.float32(3.0 + i))

def test_two_variables_of_one_name_and_different_ranges_are_refused():
  """The name is the kernel's parameter and the var_vals key: 'q' in [1, 8] and 'q' in [1, 2**40] in one AST were
  two Program.vars for one parameter (OPENCL failed every launch with pyopencl's TypeError)."""
  from kernopt import ast as A
  q1, q2 = Variable("q", 1, 8), Variable("q", 1, 2**40)
  def build(q):
    return A.kernel(A.store(0, A.add(A.load(1, dtypes.float, (q1, 4)),
                                     A.cast(A.const(q, dtypes.int64, (q1, 4)), dtypes.float))))
  with pytest.raises(VerifyError, match="two Variables named 'q'"): build(q2)
  ok = build(Variable("q", 1, 8))
  assert [v.expr for v in Kernel(ok, opts=get_renderer("CPU")).to_program().vars] == ["q"]

def test_buffers_refuse_vector_dtypes_and_copyin_of_non_numbers():
  """A vector-dtype Buffer had nbytes for its lanes but copyin broadcast errors (OPENCL filled a quarter); copyin of a
  str, objects or a dict raised numpy's errors. Both are LaunchErrors now (an independent tester)."""
  with pytest.raises(LaunchError, match="must be a scalar"): Buffer("CPU", 10, dtypes.float.vec(4))
  b = Buffer("CPU", 4, dtypes.float)
  for junk in ("abcd", np.array([object()] * 4), {"a": 1}, None):
    with pytest.raises(LaunchError, match="copyin takes an array of numbers"): b.copyin(junk)
  np.testing.assert_array_equal(b.copyin(np.arange(4)).numpy(), np.arange(4, dtype=np.float32))
