"""The CPU device's binary cache: a shared object is loaded only when the cache's record of it (sha256 of the source and
of the binary) matches, so a truncated, random, empty or swapped binary is rebuilt (and a second failure is a
CompileError); a binary in a directory that is not private is never loaded; temporary files of a writer that is gone
(killed mid-compile) are removed by the next write, a live one's never; the probe and binary keys name the host's
CPU."""
import os
import shutil
import signal
import subprocess
import sys
import time
import warnings
import numpy as np
import pytest
from kernopt import helpers
from kernopt.dtype import dtypes
from kernopt.errors import CompileError
from kernopt.helpers import config_override
from kernopt.runtime import Buffer, CompiledRunner, Device, cpu
from test_runtime_cpu import ROOT, scale_program

pytestmark = pytest.mark.skipif(not cpu.CPUDevice.availability()[0], reason="no C compiler")

def run_scale(dev, prg) -> np.ndarray:
  out = Buffer("CPU", 16, dtypes.float32).copyin(np.zeros(16, np.float32))
  inp = Buffer("CPU", 16, dtypes.float32).copyin(np.arange(16, dtype=np.float32))
  dev.compile(prg)(out, inp, var_vals={"n": 16}, wait=True)
  return out.numpy()

def built(dev, prg) -> str:
  """prg's shared object built into the cache (and recorded) without loading it: dlopen would keep the mapping of a
  path it has seen, and this test changes the file behind it."""
  path = dev.so_path(prg.src)
  os.makedirs(os.path.dirname(path), exist_ok=True)
  return dev._build(prg.src, path, prg.name)

@pytest.mark.parametrize("damage", ["truncated", "random", "empty", "swapped", "missing record"])
def test_a_damaged_binary_is_rebuilt(tmp_path, damage, compiler_runs):
  with config_override(CACHE_DIR=str(tmp_path)):
    dev = cpu.CPUDevice()
    prg = scale_program(f"scale_{damage.replace(' ', '_')}", 3.0)
    path = built(dev, prg)
    data = open(path, "rb").read()
    if damage == "truncated": data = data[:len(data) // 2]
    elif damage == "random": data = np.random.default_rng(0).bytes(len(data))
    elif damage == "empty": data = b""
    elif damage == "swapped":   # a valid binary of another kernel with the same function name
      data = open(built(dev, scale_program(prg.name, 5.0)), "rb").read()
    elif damage == "missing record": helpers.diskcache_put("cpu_binary", os.path.basename(path), None)
    with open(path, "wb") as f: f.write(data)
    before = compiler_runs["compile"]
    np.testing.assert_array_equal(run_scale(dev, prg), np.arange(16, dtype=np.float32) * 3)
    assert compiler_runs["compile"] == before + 1
    assert helpers.verified_binary("cpu_binary", path, prg.src) is not None
    np.testing.assert_array_equal(run_scale(cpu.CPUDevice(), prg), np.arange(16, dtype=np.float32) * 3)
    assert compiler_runs["compile"] == before + 1, "the rebuilt binary is a cache hit"

def test_a_binary_that_never_loads_is_a_compile_error(tmp_path, monkeypatch, compiler_runs):
  """A verified binary that fails to load is rebuilt once; the rebuilt one failing too is a CompileError."""
  with config_override(CACHE_DIR=str(tmp_path)):
    dev, prg = cpu.CPUDevice(), scale_program("scale_noload", 2.0)
    built(dev, prg)
    def refuse(path, mode=0): raise OSError(f"{path}: cannot open shared object file")
    monkeypatch.setattr(cpu.ctypes, "CDLL", refuse)
    before = compiler_runs["compile"]
    with pytest.raises(CompileError, match="does not load"): dev.compile(prg)
    assert compiler_runs["compile"] == before + 1

def test_a_binary_planted_in_an_open_directory_is_never_loaded(tmp_path):
  with config_override(CACHE_DIR=str(tmp_path)):
    dev, prg = cpu.CPUDevice(), scale_program("scale_planted", 3.0)
    path = built(dev, prg)
    shutil.copy(built(dev, scale_program("scale_planted", 7.0)), path)   # the attacker's library, a valid record
    helpers.record_binary("cpu_binary", path, prg.src, open(path, "rb").read())
    os.chmod(os.path.dirname(path), 0o777)
    with warnings.catch_warnings(record=True) as rec:
      warnings.simplefilter("always")
      np.testing.assert_array_equal(run_scale(dev, prg), np.arange(16, dtype=np.float32) * 3)
  msgs = [str(w.message) for w in rec]
  assert len(msgs) == 1 and os.path.dirname(path) in msgs[0] and "writable by group or others" in msgs[0]

def _dead_pid() -> int:
  p = subprocess.Popen(["true"])
  p.wait()
  return p.pid

def test_stale_tmp_files_of_gone_writers_are_removed(tmp_path):
  with config_override(CACHE_DIR=str(tmp_path)):
    folder = helpers.cache_subdir("cpu")
    host = helpers._host_tag()
    live = subprocess.Popen(["sleep", "30"])
    try:
      names = {"dead": f"x.so.{host}.{_dead_pid()}.abc123.tmp", "live": f"x.so.{host}.{live.pid}.abc123.tmp",
               "mine": f"x.so.{host}.{os.getpid()}.abc123.tmp", "other host": f"x.so.0badc0de.{_dead_pid()}.a.tmp",
               "not ours": "notes.tmp"}
      for n in names.values(): open(os.path.join(folder, n), "w").close()
      run_scale(cpu.CPUDevice(), scale_program("scale_stale", 2.0))
      left = set(os.listdir(folder))
    finally: live.kill()
    assert names["dead"] not in left and {names[k] for k in ("live", "mine", "other host", "not ours")} <= left
    assert not [n for n in left if n.endswith(".tmp") and f".{os.getpid()}." in n and n != names["mine"]]

_KILLED = """
import sys
sys.path.insert(0, {root!r}); sys.path.insert(0, {tests!r})
from kernopt.runtime import cpu
from test_runtime_cpu import scale_program
dev = cpu.CPUDevice(extra_flags=("-DHANG",))
dev._cc = {cc!r}
dev.compile(scale_program("scale_killed", 2.0))
"""

def test_kill_9_mid_compile_leaves_no_tmp_after_the_next_write(tmp_path):
  cc = tmp_path / "hangcc"
  cc.write_text('#!/bin/sh\ncase "$*" in *" -o "*) exec sleep 60;; *--version*) echo "hangcc 1.0";; esac\n')
  cc.chmod(0o755)
  cache = tmp_path / "cache"
  env = {**os.environ, "CACHE_DIR": str(cache)}
  env.pop("DISABLE_CACHE", None)
  src = _KILLED.format(root=ROOT, tests=os.path.join(ROOT, "tests"), cc=str(cc))
  child = subprocess.Popen([sys.executable, "-c", src], env=env, start_new_session=True, stderr=subprocess.PIPE)
  folder = cache / "cpu"
  deadline = time.time() + 60
  while time.time() < deadline and not (folder.exists() and any(n.endswith(".tmp") for n in os.listdir(folder))):
    assert child.poll() is None, child.stderr.read().decode()
    time.sleep(0.1)
  os.killpg(child.pid, signal.SIGKILL)
  child.wait()
  stale = [n for n in os.listdir(folder) if n.endswith(".tmp")]
  assert len(stale) == 1 and f".{child.pid}." in stale[0]
  with config_override(CACHE_DIR=str(cache)): run_scale(cpu.CPUDevice(), scale_program("scale_after_kill", 2.0))
  assert not [n for n in os.listdir(folder) if n.endswith(".tmp")]

def test_probe_and_binary_keys_name_the_host_cpu(tmp_path, monkeypatch, compiler_runs):
  ident = cpu.host_cpu_id()
  assert len(ident) == 16 and int(ident, 16) >= 0 and cpu.host_cpu_id.__wrapped__() == ident
  with config_override(CACHE_DIR=str(tmp_path)):
    dev = cpu.CPUDevice()
    cc, path = dev.cc, dev.so_path(scale_program().src)
    cpu.toolchain.cache_clear()
    cpu.toolchain(cc)
    probes = compiler_runs["probe"]
    cpu.toolchain.cache_clear()
    cpu.toolchain(cc)
    assert compiler_runs["probe"] == probes, "the same host: a disk cache hit"
    monkeypatch.setattr(cpu, "host_cpu_id", lambda: "another-cpu-0001")
    try:
      cpu.toolchain.cache_clear()
      cpu.toolchain(cc)
      assert compiler_runs["probe"] > probes, "another CPU probes again"
      assert dev.so_path(scale_program().src) != path
    finally: cpu.toolchain.cache_clear()

def _cl_program(amount: float):
  from kernopt.renderers import BufferArg, Program
  src = ("__kernel void addk(__global float* data0, __global const float* data1) "
         f"{{ int i = get_group_id(0); data0[i] = data1[i] + {amount}f; }}")
  args = (BufferArg(0, dtypes.float, 8, True), BufferArg(1, dtypes.float, 8, False))
  return Program("addk", src, "OPENCL", (8,), None, args=args)

def test_opencl_binaries_are_verified_too(tmp_path):
  if "OPENCL" not in Device.available(): pytest.skip("no OpenCL device")
  dev = Device["OPENCL"]
  one, two = _cl_program(1.0), _cl_program(2.0)
  with config_override(CACHE_DIR=str(tmp_path)):
    assert not dev._compile(one).from_cache and dev._compile(one).from_cache
    dev._compile(two)
    shutil.copy(dev._cache_path(two.src), dev._cache_path(one.src))   # another kernel's binary, the same name
    lib = dev._compile(one)
    assert not lib.from_cache
    o = Buffer("OPENCL", 8, dtypes.float)
    CompiledRunner(dev, one, lib)(o, Buffer("OPENCL", 8, dtypes.float).copyin(np.arange(8, dtype=np.float32)))
    assert o.numpy().tolist() == [i + 1.0 for i in range(8)]
    with open(dev._cache_path(one.src), "r+b") as f: f.truncate(100)
    assert not dev._compile(one).from_cache and dev._compile(one).from_cache
  assert not [n for n in os.listdir(tmp_path / "opencl") if n.endswith(".tmp")]
