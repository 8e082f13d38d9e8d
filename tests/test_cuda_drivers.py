"""The CUDA device's two drivers without a GPU: fake `pycuda.driver` and `cuda.bindings.driver` modules, put in
sys.modules, log every call they get with the context current in the calling thread. One launch sequence is checked on
both (context, module load, kernel parameters packed as the signature declares, launch dims, stream, timing events,
copies, frees), then the automatic choice, a context and stream the caller owns, and wrapped external allocations."""
import concurrent.futures
import ctypes
import dataclasses
import gc
import re
import struct
import subprocess
import sys
import threading
import types
import weakref
import numpy as np
import pytest
from catalogue import alu, buf, const, kernel, reduce, store
import kernopt.runtime.cuda as cuda
from kernopt.dtype import dtypes
from kernopt.errors import CompileError, LaunchError, UnsupportedError
from kernopt.kernel import Kernel
from kernopt.ops import BinaryOps, ReduceOps, TernaryOps
from kernopt.renderers import get_renderer
from kernopt.runtime import Buffer, Device
from kernopt.shape.shapetracker import ShapeTracker
from kernopt.shape.symbolic import Variable

F = dtypes.float32
M, N = Variable("m", 1, 8), Variable("n", 1, 2**34)
BIG_N = 2**33 + 5   # past int32: packed as int64 or the kernel reads garbage
BIG = 8 * 2**34     # elements of data2 the runner wants at the largest m and n (wrapped: nothing is allocated)

def signature_program():
  """out[m] = sum over n of data2[m, n], plus a load of buffer 1 that folds away: buffers 0 and 2 and the variables
  m (int32) and n (int64) are the kernel's parameters, buffer 1 is none."""
  dead = alu(TernaryOps.WHERE, const(False, (M, 1), dtypes.bool), buf(1, (M, 1)), const(0.0, (M, 1)))
  red = reduce(ReduceOps.SUM, buf(2, (M, N)), (1,))
  ast = kernel(store(alu(BinaryOps.ADD, dead, red), st=ShapeTracker.from_shape((M, 1))))
  prg = Kernel(ast, opts=get_renderer("CUDA", arch="sm_90")).to_program()
  assert [a.used for a in prg.args] == [True, False, True]
  assert [(a.name, a.dtype) for a in prg.var_args] == [("m", dtypes.int32), ("n", dtypes.int64)]
  return prg

# ***** the fakes *****

class Memory:
  """Device memory of a fake driver: address -> bytearray, 256-byte aligned as cuMemAlloc's."""
  def __init__(self) -> None: self.blocks, self.next = {}, 0x7f0000000000
  def alloc(self, nbytes: int) -> int:
    addr, self.next = self.next, self.next + (nbytes + 255) // 256 * 256 + 256
    self.blocks[addr] = bytearray(nbytes)
    return addr

class FakeCudaPython:
  """cuda.bindings.driver as far as CUDADevice uses it: each call returns (error, *values)."""
  CUdevice_attribute = types.SimpleNamespace(CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR="major",
                                             CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR="minor",
                                             CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT="sms")
  def __init__(self, devices: int = 1) -> None:
    self.log: list = []
    self.mem, self.devices, self.local, self.widths, self.events = Memory(), devices, threading.local(), [], 0
  def _ctx(self) -> object:
    ctx = getattr(self.local, "ctx", None)
    assert ctx is not None, "a driver call with no current context"
    return ctx
  def cuInit(self, flags): return (0,)
  def cuDeviceGetCount(self): return (0, self.devices)
  def cuDeviceGet(self, i): return (0, f"dev{i}")
  def cuDevicePrimaryCtxRetain(self, dev): self.log.append(("retain", dev)); return (0, "primary")
  def cuCtxSetCurrent(self, ctx): self.local.ctx = ctx; return (0,)
  def cuCtxGetDevice(self): return (0, "dev0")
  def cuDeviceGetAttribute(self, attr, dev): return (0, {"major": 9, "minor": 0, "sms": 132}[attr])
  def cuModuleLoadData(self, image): self.log.append(("load", image, self._ctx())); return (0, "module")
  def cuModuleGetFunction(self, module, name):
    return (0, ("fn", name.decode())) if name.decode().startswith("r_") else (500,)   # CUDA_ERROR_NOT_FOUND
  def cuMemAlloc(self, nbytes):
    addr = self.mem.alloc(nbytes)
    self.log.append(("alloc", nbytes, addr, self._ctx()))
    return (0, addr)
  def cuMemFree(self, addr): self.log.append(("free", addr, self._ctx())); return (0,)
  def cuMemcpyHtoDAsync(self, dst, src, nbytes, stream):
    self.mem.blocks[dst][:nbytes] = ctypes.string_at(src, nbytes)
    self.log.append(("htod", dst, stream, self._ctx()))
    return (0,)
  def cuMemcpyDtoHAsync(self, dst, src, nbytes, stream):
    ctypes.memmove(dst, bytes(self.mem.blocks[src][:nbytes]), nbytes)
    self.log.append(("dtoh", src, stream, self._ctx()))
    return (0,)
  def cuStreamSynchronize(self, stream): return (0,)
  def cuLaunchKernel(self, fn, gx, gy, gz, bx, by, bz, smem, stream, params, extra):
    # the parameter values, read through kernelParams with the widths the test expects the signature to have
    ptrs = (ctypes.c_void_p * len(self.widths)).from_address(params)
    kinds = {(8, False): ctypes.c_uint64, (4, True): ctypes.c_int32, (8, True): ctypes.c_int64}
    vals = [(w, kinds[(w, signed)].from_address(p).value) for (w, signed), p in zip(self.widths, ptrs)]
    self.log.append(("launch", fn[1], (gx, gy, gz), (bx, by, bz), stream, vals, self._ctx()))
    return (0,)
  def cuEventCreate(self, flags):
    self.events += 1
    self.log.append(("event", self._ctx()))
    return (0, f"ev{self.events}")
  def cuEventRecord(self, ev, stream): self.log.append(("record", ev, stream)); return (0,)
  def cuEventSynchronize(self, ev): self.log.append(("wait", ev)); return (0,)
  def cuEventElapsedTime(self, start, end): self.log.append(("elapsed", start, end)); return (0, 2.5)
  def cuEventDestroy(self, ev): self.log.append(("destroy", ev)); return (0,)
  def cuCtxSynchronize(self): self.log.append(("sync", self._ctx())); return (0,)

def fake_pycuda(devices: int = 1) -> types.ModuleType:
  """pycuda.driver as far as CUDADevice uses it, with pycuda's per-thread stack of current contexts."""
  drv = types.ModuleType("pycuda.driver")
  drv.log, drv.mem, local = [], Memory(), threading.local()
  def stack() -> list:
    if not hasattr(local, "stack"): local.stack = []
    return local.stack
  def current() -> str:
    assert stack(), "a driver call with no current context"
    return repr(stack()[-1])
  drv.stack = stack
  class Error(Exception): pass
  class Context:
    def __init__(self, name: str) -> None: self.name = name
    def __repr__(self) -> str: return self.name
    def push(self) -> None: stack().append(self)
    @staticmethod
    def pop() -> None: stack().pop()
    @staticmethod
    def get_current(): return stack()[-1] if stack() else None
    @staticmethod
    def get_device(): current(); return Device(0)
    @staticmethod
    def synchronize() -> None: drv.log.append(("sync", current()))
  class Device:
    def __init__(self, i: int) -> None: self.i = i
    @staticmethod
    def count() -> int: return devices
    def retain_primary_context(self) -> Context:
      drv.log.append(("retain", f"dev{self.i}"))
      return Context("primary")
    def compute_capability(self) -> tuple[int, int]: return (9, 0)
    def get_attribute(self, attr: str) -> int: return {"sms": 132}[attr]
  class DeviceAllocation:
    def __init__(self, addr: int) -> None: self.addr = addr
    def __int__(self) -> int: return self.addr
    def free(self) -> None: drv.log.append(("free", self.addr, current()))
  class Function:
    def __init__(self, name: str) -> None: self.name = name
    def __call__(self, *args, grid, block, stream=None) -> None:
      assert all(isinstance(a, np.number) for a in args), args
      drv.packed = struct.pack("".join(a.dtype.char for a in args), *args)   # as pycuda's _build_arg_buf
      vals = [(a.dtype.itemsize, int(a)) for a in args]
      drv.log.append(("launch", self.name, tuple(grid), tuple(block), stream, vals, current()))
  class Module:
    def get_function(self, name: str) -> Function:
      if not name.startswith("r_"): raise Error(f"cuModuleGetFunction failed: named symbol not found ({name})")
      return Function(name)
  class Event:
    def __init__(self) -> None: drv.log.append(("event", current()))
    def record(self, stream=None) -> "Event": drv.log.append(("record", "ev", stream)); return self
    def synchronize(self) -> "Event": drv.log.append(("wait", "ev")); return self
    def time_since(self, start: "Event") -> float: drv.log.append(("elapsed", "ev", "ev")); return 2.5
  def module_from_buffer(image: bytes) -> Module:
    drv.log.append(("load", image, current()))
    return Module()
  def mem_alloc(nbytes: int) -> DeviceAllocation:
    addr = drv.mem.alloc(nbytes)
    drv.log.append(("alloc", nbytes, addr, current()))
    return DeviceAllocation(addr)
  def memcpy_htod_async(dst, src, stream=None) -> None:
    drv.mem.blocks[int(dst)][:src.nbytes] = src.tobytes()
    drv.log.append(("htod", int(dst), stream, current()))
  def memcpy_dtoh_async(dst, src, stream=None) -> None:
    dst[...] = np.frombuffer(bytes(drv.mem.blocks[int(src)][:dst.nbytes]), dst.dtype).reshape(dst.shape)
    drv.log.append(("dtoh", int(src), stream, current()))
  drv.__dict__.update(Error=Error, Context=Context, Device=Device, DeviceAllocation=DeviceAllocation, Event=Event,
                      device_attribute=types.SimpleNamespace(MULTIPROCESSOR_COUNT="sms"), init=lambda: None,
                      module_from_buffer=module_from_buffer, mem_alloc=mem_alloc, memcpy_htod_async=memcpy_htod_async,
                      memcpy_dtoh_async=memcpy_dtoh_async, memcpy_htod=lambda d, s: memcpy_htod_async(d, s),
                      memcpy_dtoh=lambda d, s: memcpy_dtoh_async(d, s))
  return drv

class FakeStream:
  def __init__(self, name: str, log: list) -> None: self.name, self.log = name, log
  def synchronize(self) -> None: self.log.append(("stream sync", self.name))
  def __repr__(self) -> str: return self.name

def install(monkeypatch, pycuda=None, cuda_python=None) -> None:
  """Make `import pycuda.driver` and `from cuda.bindings import driver` find the fakes (or fail, for None)."""
  if pycuda is None: monkeypatch.setitem(sys.modules, "pycuda", None)
  else:
    pkg = types.ModuleType("pycuda")
    pkg.driver = pycuda
    monkeypatch.setitem(sys.modules, "pycuda", pkg)
    monkeypatch.setitem(sys.modules, "pycuda.driver", pycuda)
  if cuda_python is None: monkeypatch.setitem(sys.modules, "cuda", None)
  else:
    pkg, bindings = types.ModuleType("cuda"), types.ModuleType("cuda.bindings")
    pkg.bindings, bindings.driver = bindings, cuda_python
    monkeypatch.setitem(sys.modules, "cuda", pkg)
    monkeypatch.setitem(sys.modules, "cuda.bindings", bindings)
    monkeypatch.setitem(sys.modules, "cuda.bindings.driver", cuda_python)
  # no compiler runs: the fakes load whatever "cubin" they are given
  monkeypatch.setattr(cuda, "have_compiler", lambda: True)
  monkeypatch.setattr(cuda, "compile_cuda", lambda src, arch, prefer_nvrtc: b"CUBIN " + arch.encode())

@pytest.fixture(params=["pycuda", "cuda-python"])
def driver(request, monkeypatch):
  """(driver name, its fake's call log, the fake) with both fakes installed."""
  pyc, cp = fake_pycuda(), FakeCudaPython()
  install(monkeypatch, pyc, cp)
  fake = pyc if request.param == "pycuda" else cp
  cp.widths = [(8, False), (8, False), (4, True), (8, True)]
  return request.param, fake.log, fake

# ***** the launch sequence *****

def test_launch_sequence(driver):
  name, log, fake = driver
  dev = cuda.CUDADevice(driver=name)
  assert dev.driver_name == name and dev.arch == "sm_90" and dev.sm_count == 132
  assert log == [("retain", "dev0")]
  prg = signature_program()
  runner = dev.compile(prg)
  assert log[-1] == ("load", b"CUBIN sm_90", "primary")
  out, unused = Buffer(dev, 8, F), Buffer(dev, 1, F)
  out.copyin(np.arange(8, dtype=np.float32))
  big = Buffer.from_device_pointer(dev, 0x7e0000000000, BIG, F)
  (_, _, out_addr, _), (_, _, unused_addr, _) = [e for e in log if e[0] == "alloc"]
  del log[:]
  secs = runner(out, unused, big, var_vals={"m": 3, "n": BIG_N}, wait=True)
  assert secs == pytest.approx(2.5e-3)
  stream = None if name == "pycuda" else 0
  params = [(8, out_addr), (8, 0x7e0000000000), (4, 3), (8, BIG_N)]   # the unused buffer 1 is no parameter
  ev = ["ev", "ev"] if name == "pycuda" else ["ev1", "ev2"]
  assert log[:6] == [("event", "primary"), ("event", "primary"), ("record", ev[0], stream),
                     ("launch", prg.name, (3, 1, 1), (1, 1, 1), stream, params, "primary"),
                     ("record", ev[1], stream), ("wait", ev[1])]
  assert log[6][0] == "elapsed" and [e[0] for e in log[7:]] == (["destroy"] * 2 if name == "cuda-python" else [])
  del log[:]
  assert runner(out, unused, big, var_vals={"m": 2, "n": 7}) is None   # wait=False: no events
  assert log == [("launch", prg.name, (2, 1, 1), (1, 1, 1), stream, [*params[:2], (4, 2), (8, 7)], "primary")]
  assert out.numpy().tolist() == list(range(8))
  dev.synchronize()
  assert log[-2:] == [("dtoh", out_addr, stream, "primary"), ("sync", "primary")]
  del out, unused, big
  gc.collect()
  assert sorted(e[1] for e in log if e[0] == "free") == sorted([out_addr, unused_addr])   # not the wrapped one
  if name == "pycuda": assert fake.stack() == []   # every push popped again: pycuda aborts at exit otherwise

def test_pycuda_packs_the_parameter_block_with_c_alignment(monkeypatch):
  """pycuda packs numpy scalars by dtype with native alignment: the int64 after an int32 starts at offset 24."""
  pyc = fake_pycuda()
  install(monkeypatch, pyc, None)
  dev = cuda.CUDADevice(driver="pycuda")
  prg = signature_program()
  dev._launch(dev._compile(prg), prg, [0x1000, 0x2000], [3, BIG_N], (3, 1, 1), (1, 1, 1), False)
  assert len(pyc.packed) == 32
  assert struct.unpack_from("<QQi", pyc.packed) == (0x1000, 0x2000, 3)
  assert struct.unpack_from("<q", pyc.packed, 24) == (BIG_N,)

def test_launch_dims_are_grid_blocks_and_block_threads(driver):
  name, log, _ = driver
  dev = cuda.CUDADevice(driver=name)
  prg = signature_program()
  lib = dev._compile(prg)
  dev._launch(lib, prg, [0x1000, 0x2000], [3, 5], (4, 2), (32, 4, 2), False)
  assert log[-1][2:4] == ((4, 2, 1), (32, 4, 2))
  with pytest.raises(LaunchError, match="threads per block"):
    dev._launch(lib, prg, [0, 0], [3, 5], (1,), (64, 32), False)

def test_a_missing_kernel_is_a_compile_error(driver):
  dev = cuda.CUDADevice(driver=driver[0])
  prg = signature_program()
  with pytest.raises(CompileError, match="not_there is not defined"):
    dev._compile(dataclasses.replace(prg, name="not_there"))

def test_module_loads_bind_the_context_in_the_loading_thread(driver):
  """The search loads modules on a thread pool; the context is current per thread."""
  name, log, fake = driver
  dev = cuda.CUDADevice(driver=name)
  with concurrent.futures.ThreadPoolExecutor(1) as pool: pool.submit(dev._compile, signature_program()).result()
  assert log[-1] == ("load", b"CUBIN sm_90", "primary")
  if name == "pycuda": assert fake.stack() == []

# ***** choosing a driver *****

def test_the_automatic_choice_prefers_pycuda_then_cuda_python(monkeypatch):
  install(monkeypatch, fake_pycuda(), FakeCudaPython())
  assert cuda.CUDADevice.availability() == (True, "launches through pycuda (1 device(s))")
  assert cuda.CUDADevice().driver_name == "pycuda"
  assert cuda.CUDADevice(driver="cuda-python").driver_name == "cuda-python"
  install(monkeypatch, None, FakeCudaPython())
  ok, reason = cuda.CUDADevice.availability()
  assert ok and reason == "launches through cuda-python (1 device(s))"
  assert cuda.CUDADevice().driver_name == "cuda-python"
  install(monkeypatch, fake_pycuda(devices=0), FakeCudaPython())   # pycuda works but sees no GPU: not chosen
  assert cuda.CUDADevice().driver_name == "cuda-python"
  monkeypatch.setattr(Device, "_open", {})   # the registry passes the choice on, and reports it
  assert Device["CUDA"].driver_name == "cuda-python" and Device.why_unavailable("CUDA") is None
  with pytest.raises(UnsupportedError, match="pycuda: LaunchError: it sees no device"):
    Device.open("CUDA", driver="pycuda")

def test_a_driver_object_is_used_as_it_is(monkeypatch):
  cp = FakeCudaPython()
  install(monkeypatch, None, cp)
  drv = cuda.CudaPythonDriver.open(0, context="framework")
  dev = cuda.CUDADevice(driver=drv)
  assert dev.driver is drv and dev.driver_name == "cuda-python" and dev.ctx == "framework" and dev.arch == "sm_90"

def test_unavailable_drivers_say_why(monkeypatch):
  install(monkeypatch, None, None)
  ok, reason = cuda.CUDADevice.availability()
  assert not ok and re.match(r"no CUDA driver/GPU: pycuda: \w*Error: .*; cuda-python: \w*Error", reason)
  with pytest.raises(UnsupportedError, match="no CUDA driver/GPU: pycuda"): cuda.CUDADevice(driver="pycuda")
  assert cuda.CUDADevice.availability("numba")[1].startswith("unknown CUDA driver 'numba'")
  install(monkeypatch, fake_pycuda(), None)
  monkeypatch.setattr(cuda, "have_compiler", lambda: False)
  assert cuda.CUDADevice.availability() == (False, "no CUDA compiler: neither NVRTC nor nvcc")

def test_import_kernopt_imports_no_driver():
  code = ("import sys, kernopt, kernopt.runtime, kernopt.runtime.cuda\n"
          "bad = [m for m in sys.modules if m.split('.')[0] in ('pycuda', 'cuda')]\n"
          "assert not bad, bad\n")
  subprocess.run([sys.executable, "-c", code], check=True)

# ***** what the caller owns *****

def launch_signature_program(dev):
  """signature_program on dev, launched and waited for: an output written also as the unused input, a wrapped
  external input, and an int32 and an int64 variable."""
  runner = dev.compile(signature_program())
  out = Buffer(dev, 8, F).copyin(np.zeros(8, np.float32))
  runner(out, out, Buffer.from_device_pointer(dev, 0x7e0000000000, BIG, F), var_vals={"m": 3, "n": BIG_N},
         wait=True)

def test_pycuda_on_the_callers_context_and_stream(monkeypatch):
  """A framework's context (current in its thread, as pycuda.autoinit leaves it) and stream: no primary context, no
  push or pop, and every launch, event and copy on that stream."""
  pyc = fake_pycuda()
  install(monkeypatch, pyc, None)
  ctx, stream = pyc.Context("framework"), FakeStream("fw_stream", pyc.log)
  ctx.push()
  launch_signature_program(cuda.CUDADevice(driver="pycuda", context=ctx, stream=stream))
  assert not any(e[0] == "retain" for e in pyc.log)
  for e in pyc.log:
    if e[0] in ("load", "alloc", "event", "launch", "htod"): assert e[-1] == "framework", e
    if e[0] in ("record", "launch", "htod"): assert e[2 if e[0] != "launch" else 4] is stream, e
  assert ("stream sync", "fw_stream") in pyc.log
  assert pyc.stack() == [ctx]

def test_cuda_python_on_the_callers_context_and_stream(monkeypatch):
  cp = FakeCudaPython()
  install(monkeypatch, None, cp)
  cp.widths = [(8, False), (8, False), (4, True), (8, True)]
  launch_signature_program(cuda.CUDADevice(driver="cuda-python", context="framework", stream="fw_stream"))
  assert not any(e[0] == "retain" for e in cp.log)
  launch = next(e for e in cp.log if e[0] == "launch")
  assert launch[4] == "fw_stream" and launch[6] == "framework"
  assert [e[2] for e in cp.log if e[0] in ("record", "htod")] == ["fw_stream"] * 3

def test_wrapping_an_external_allocation_copies_nothing_and_frees_nothing(driver):
  name, log, fake = driver
  dev = cuda.CUDADevice(driver=name)
  if name == "pycuda":   # the framework's own pycuda allocation
    dev.driver.ctx.push()
    alloc = fake.mem_alloc(64)
    fake.Context.pop()
  else:
    fake.cuCtxSetCurrent("primary")
    alloc = fake.cuMemAlloc(64)[1]
  class Owner: pass
  owner = Owner()
  gone = weakref.ref(owner)
  del log[:]
  b = Buffer.from_device_pointer(dev, alloc, 16, F, owner=owner)
  assert log == [] and b.size == 16 and b.nbytes == 64
  del owner
  gc.collect()
  assert gone() is not None   # the Buffer keeps the owner alive
  fake.mem.blocks[int(alloc)][:8] = np.array([1.5, 2.5], np.float32).tobytes()
  assert b.numpy()[:2].tolist() == [1.5, 2.5]   # reads the memory in place
  del b
  gc.collect()
  assert gone() is None and not any(e[0] == "free" for e in log)

def test_wrapping_refuses_what_is_no_usable_pointer(driver):
  dev = cuda.CUDADevice(driver=driver[0])
  with pytest.raises(LaunchError, match="not 16-byte aligned"): Buffer.from_device_pointer(dev, 0x1004, 4, F)
  with pytest.raises(LaunchError, match="null pointer"): Buffer.from_device_pointer(dev, 0, 4, F)
  with pytest.raises(LaunchError, match="not a device pointer"): Buffer.from_device_pointer(dev, "0x1000", 4, F)

def test_devices_that_cannot_wrap_say_so():
  with pytest.raises(UnsupportedError, match="cannot wrap"): Buffer.from_device_pointer("PYTHON", 0x1000, 4, F)
