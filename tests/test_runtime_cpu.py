"""The CPU device: compile errors, launch checks before anything runs, and the on-disk shared-object cache."""
import json
import os
import subprocess
import sys
import time
import numpy as np
import pytest
from kernopt.dtype import dtypes
from kernopt.errors import CompileError, LaunchError
from kernopt.helpers import config_override
from kernopt.ops import BinaryOps
from kernopt.renderers import BufferArg, Program
from kernopt.runtime import Buffer, Device
from kernopt.runtime import cpu
from kernopt.shape.symbolic import Variable
from kernopt.uops import UOp, UOps

pytestmark = pytest.mark.skipif(not cpu.CPUDevice.availability()[0], reason="no C compiler")
ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

def scale_program(name: str = "scale", factor: float = 2.0) -> Program:
  """data0[i] = data1[i] * factor for i < n; both buffers hold at least 16 floats."""
  n = Variable("n", 1, 16)
  out = UOp(UOps.DEFINE_GLOBAL, dtypes.float32, (), (0, "data0", True))
  inp = UOp(UOps.DEFINE_GLOBAL, dtypes.float32, (), (1, "data1", False))
  var = UOp(UOps.DEFINE_VAR, dtypes.int32, (), n)
  zero = UOp.const(dtypes.int32, 0)
  rng = UOp(UOps.RANGE, dtypes.int32, (zero, var), (0, False))
  ld = UOp(UOps.LOAD, dtypes.float32, (inp, rng))
  k = UOp.const(dtypes.float32, factor)
  mul = ld.alu(BinaryOps.MUL, k)
  st = UOp(UOps.STORE, None, (out, rng, mul))
  uops = [out, inp, var, zero, rng, ld, k, mul, st, UOp(UOps.ENDRANGE, None, (rng,))]
  src = Device["CPU"].renderer.render(name, uops)
  args = (BufferArg(0, dtypes.float32, 16, True), BufferArg(1, dtypes.float32, 16, False))
  return Program(name, src, "CPU", uops=tuple(uops), args=args, vars=(n,))

def test_runs_and_times():
  runner = Device["CPU"].compile(scale_program())
  out = Buffer("CPU", 16, dtypes.float32)
  inp = Buffer("CPU", 16, dtypes.float32).copyin(np.arange(16, dtype=np.float32))
  out.copyin(np.full(16, -1, np.float32))
  secs = runner(out, inp, var_vals={"n": 10}, wait=True)
  assert isinstance(secs, float) and secs >= 0
  np.testing.assert_array_equal(out.numpy(), np.concatenate([np.arange(10) * 2, np.full(6, -1)]).astype(np.float32))
  assert out._handle.ctypes.data % 64 == 0

def test_compile_error_carries_log_and_source():
  src = "void broken_kernel(float* restrict data0) { data0[0] = ; }\n"
  with pytest.raises(CompileError) as e: Device["CPU"].compile(Program("broken_kernel", src, "CPU"))
  assert "error" in e.value.log and "broken_kernel" in str(e.value) and e.value.src == src

def test_compile_timeout_kills_the_compiler(tmp_path):
  """A compiler that outlives COMPILE_TIMEOUT is killed and the build fails with CompileError (search workers set it
  so an abandoned candidate's compiler doesn't keep running)."""
  cc = tmp_path / "slowcc"
  # answers the toolchain probes at once; hangs on a build (the only call with -o)
  cc.write_text('#!/bin/sh\ncase "$*" in *" -o "*) sleep 30; sleep 30;; *--version*) echo "slowcc 1.0";; esac\n')
  cc.chmod(0o755)
  dev = cpu.CPUDevice(extra_flags=("-DSLOWCC",), profile="static")
  dev._cc = str(cc)
  t0 = time.perf_counter()
  with config_override(COMPILE_TIMEOUT=1, DISABLE_CACHE=1), pytest.raises(CompileError, match="COMPILE_TIMEOUT"):
    dev.compile(Program("slow_kernel", "void slow_kernel(float* restrict data0) { data0[0] = 1.0f; }\n", "CPU"))
  assert time.perf_counter() - t0 < 20

@pytest.mark.parametrize("case", ["missing buffer", "too small", "wrong dtype", "missing var", "var out of range",
                                  "not a buffer"])
def test_launch_errors_before_running(case):
  runner = Device["CPU"].compile(scale_program())
  out = Buffer("CPU", 16, dtypes.float32).copyin(np.zeros(16, np.float32))
  inp = Buffer("CPU", 16, dtypes.float32).copyin(np.ones(16, np.float32))
  args, var_vals = [out, inp], {"n": 16}
  if case == "missing buffer": args = [out]
  elif case == "too small": args = [out, Buffer("CPU", 8, dtypes.float32)]
  elif case == "wrong dtype": args = [out, Buffer("CPU", 16, dtypes.int32)]
  elif case == "missing var": var_vals = {}
  elif case == "var out of range": var_vals = {"n": 17}
  elif case == "not a buffer": args = [out, np.ones(16, np.float32)]
  with pytest.raises(LaunchError): runner(*args, var_vals=var_vals)
  assert not out.numpy().any()  # nothing ran

_CHILD = """
import json, os, sys
sys.path.insert(0, {root!r})
from kernopt.runtime import Device, cpu
sys.path.insert(0, os.path.join({root!r}, "tests"))
from test_runtime_cpu import scale_program
calls = {{"compile": 0, "probe": 0}}
run = cpu._run
def counting(cmd, purpose, *args, **kwargs):
  calls[purpose] += 1
  return run(cmd, purpose, *args, **kwargs)
cpu._run = counting   # every compiler process the device starts, by purpose
prg = scale_program("cached_scale", 3.0)
dev = Device["CPU"]
dev.compile(prg)
path = dev.so_path(prg.src)
print(json.dumps({{"calls": calls, "path": path, "mtime": os.stat(path).st_mtime_ns}}))
"""

def _child(cache_dir: str) -> dict:
  env = {**os.environ, "CACHE_DIR": cache_dir}
  env.pop("DISABLE_CACHE", None)
  out = subprocess.run([sys.executable, "-c", _CHILD.format(root=ROOT)], env=env, capture_output=True, text=True)
  assert out.returncode == 0, out.stderr
  return json.loads(out.stdout.strip().splitlines()[-1])

def test_disk_cache_across_processes_and_flags(tmp_path, compiler_runs):
  first = _child(str(tmp_path))
  assert first["calls"]["compile"] == 1 and first["path"].startswith(str(tmp_path))
  second = _child(str(tmp_path))
  assert second["calls"] == {"compile": 0, "probe": 0}, "a new process must not run the compiler on a cache hit"
  assert second["path"] == first["path"] and second["mtime"] == first["mtime"]
  # other flags: another key, and the compiler runs again
  with config_override(CACHE_DIR=str(tmp_path)):
    dev = cpu.CPUDevice(extra_flags=("-O1",))
    prg = scale_program("cached_scale", 3.0)
    before = compiler_runs["compile"]
    dev.compile(prg)
    assert compiler_runs["compile"] == before + 1
    assert dev.so_path(prg.src) != first["path"] and "-O1" in dev.compiler_id()
    assert sorted(os.listdir(tmp_path / "cpu")) == sorted([os.path.basename(first["path"]),
                                                            os.path.basename(dev.so_path(prg.src))])

def test_compiler_id_names_compiler_flags_and_isa():
  cid = Device["CPU"].compiler_id()
  assert cpu.find_compiler() in cid and "-O2" in cid and "-ffp-contract=off" in cid and "-ffast-math" not in cid

# ***** the launch memo: a program without Variables launched again with the very same Buffers *****

def _add_runner():
  import catalogue
  from kernopt.kernel import Kernel
  dev = Device["CPU"]
  k = Kernel(catalogue.get("add").ast, opts=dev.renderer).required_optimizations().hand_coded_optimizations()
  prg = k.to_program()
  assert not prg.vars
  return dev, dev.compile(prg), [a.min_size for a in prg.args]

def _filled(dev, n, rng, dtype=dtypes.float32):
  return Buffer(dev, n, dtype).copyin(rng.standard_normal(n).astype(np.float32))

def test_a_launch_with_other_buffers_is_checked_again_after_a_passing_one():
  """The runner skips its checks only for the very Buffer objects of its last checked launch: a smaller, a wrongly
  typed or an aliased buffer set right after a passing launch is refused, and the passing set still runs right."""
  dev, runner, sizes = _add_runner()
  rng = np.random.default_rng(3)
  out, a, b = Buffer(dev, sizes[0], dtypes.float32), _filled(dev, sizes[1], rng), _filled(dev, sizes[2], rng)
  for _ in range(3):
    runner(out, a, b, wait=True)
    np.testing.assert_array_equal(out.numpy(), a.numpy() + b.numpy())
  with pytest.raises(LaunchError, match="holds"): runner(Buffer(dev, sizes[0] - 1, dtypes.float32), a, b)
  with pytest.raises(LaunchError, match="dtype"): runner(Buffer(dev, sizes[0], dtypes.int32), a, b)
  with pytest.raises(LaunchError, match="same Buffer"): runner(out, out, b)
  with pytest.raises(LaunchError, match="takes 3 buffers"): runner(out, a)
  runner(out, a, b, wait=True)
  with pytest.raises(LaunchError, match="same Buffer"): runner(out, a, out)
  a.copyin(rng.standard_normal(sizes[1]).astype(np.float32))
  runner(out, b, a, wait=True)   # the same objects in other places: checked, and read in the new order
  np.testing.assert_array_equal(out.numpy(), b.numpy() + a.numpy())
  runner(out, a, b, wait=True)
  np.testing.assert_array_equal(out.numpy(), a.numpy() + b.numpy())

def test_a_runner_keeps_no_buffer_alive():
  import gc
  import weakref
  dev, runner, sizes = _add_runner()
  rng = np.random.default_rng(4)
  bufs = [Buffer(dev, sizes[0], dtypes.float32), _filled(dev, sizes[1], rng), _filled(dev, sizes[2], rng)]
  runner(*bufs, wait=True)
  refs = [weakref.ref(b) for b in bufs]
  del bufs
  gc.collect()
  assert all(r() is None for r in refs)
  # a new set (which may reuse the dead ones' ids) is checked: one too small is refused
  with pytest.raises(LaunchError, match="holds"):
    runner(Buffer(dev, 1, dtypes.float32), _filled(dev, sizes[1], rng), _filled(dev, sizes[2], rng))
