"""The CUDA device: CUDA C++ from `CUDARenderer`, compiled to a cubin by NVRTC (cuda-python's cuda.bindings.nvrtc)
when importable, else by nvcc; launched through a `CUDADriver`: pycuda (`pycuda.driver`) when it works, else
cuda-python (`cuda.bindings.driver`). Every binding is imported lazily: rendering and `compile_cuda` work on a machine
without a GPU. Flags keep IEEE semantics (--fmad=false: no contraction of a*b+c, as ops.exec_alu and the CPU device's
-ffp-contract=off). Imports dtype, errors, helpers, renderers and runtime/."""
from __future__ import annotations
import contextlib
import ctypes
import functools
import glob
import os
import re
import shutil
import subprocess
import tempfile
import time
from typing import Any, Iterator, Optional
import numpy as np
from kernopt.dtype import DType
from kernopt.errors import CompileError, LaunchError, UnsupportedError
from kernopt.helpers import diskcache_get, diskcache_put
from kernopt.renderers import Program, Renderer
from kernopt.renderers.cuda import CUDARenderer
from kernopt.runtime import Compiled

FLAGS = ("--fmad=false",)

# ***** compilers *****

def find_nvcc() -> Optional[str]:
  """nvcc on PATH, else in /usr/local/cuda/bin."""
  found = shutil.which("nvcc") or next(iter(sorted(glob.glob("/usr/local/cuda*/bin/nvcc"))), None)
  return os.path.realpath(found) if found else None

@functools.lru_cache(None)
def _import_nvrtc() -> Any:
  """cuda-python's NVRTC module when it imports and its library loads (cuda-python can be installed without
  libnvrtc, which it finds only at the first call), else None."""
  try:
    from cuda.bindings import nvrtc  # cuda-python >= 12.6
  except ImportError:
    try: from cuda import nvrtc  # type: ignore[no-redef]  # older cuda-python
    except ImportError: return None
  try: nvrtc.nvrtcVersion()
  except Exception: return None
  return nvrtc

@functools.lru_cache(None)
def nvcc_version(nvcc: str) -> str:
  out = subprocess.run([nvcc, "--version"], capture_output=True, text=True).stdout.strip().splitlines()
  return out[-1] if out else "unknown"

@functools.lru_cache(None)
def include_dirs() -> tuple[str, ...]:
  """Folders holding cuda_fp16.h / cuda_bf16.h for NVRTC (which ships without them): the CUDA toolkit next to nvcc,
  /usr/local/cuda*, and the include folders of NVIDIA's pip wheels (nvidia/cuda_runtime, nvidia/cuda_nvrtc)."""
  cands = []
  if (nvcc := find_nvcc()) is not None: cands.append(os.path.join(os.path.dirname(os.path.dirname(nvcc)), "include"))
  cands += sorted(glob.glob("/usr/local/cuda*/include")) + ["/usr/include"]
  try:
    import nvidia  # type: ignore[import-not-found]
    for root in list(getattr(nvidia, "__path__", [])):
      cands += sorted(glob.glob(os.path.join(root, "*", "include")))
  except ImportError: pass
  return tuple(dict.fromkeys(d for d in cands if os.path.exists(os.path.join(d, "cuda_fp16.h"))))

def compiler_id(arch: str, prefer_nvrtc: bool = True) -> str:
  """The compiler compile_cuda would use for arch, its version and flags (part of the binary cache key)."""
  nvrtc = _import_nvrtc() if prefer_nvrtc else None
  if nvrtc is not None:
    _, major, minor = nvrtc.nvrtcVersion()
    return f"nvrtc {major}.{minor} | {' '.join(FLAGS)} | {arch}"
  if (nvcc := find_nvcc()) is None:
    raise UnsupportedError("compiling CUDA needs NVRTC (pip install cuda-python) or nvcc on PATH; neither was found")
  return f"{nvcc} {nvcc_version(nvcc)} | {' '.join(FLAGS)} | {arch}"

def compile_cuda(src: str, arch: str = "sm_80", prefer_nvrtc: bool = True, cache: bool = True) -> bytes:
  """The cubin of CUDA source src for arch ("sm_90"), by NVRTC if importable (falling back to nvcc if NVRTC can't
  find the fp16 headers), else nvcc. Cached on disk by source and compiler. Raises CompileError with the log."""
  if not re.fullmatch(r"sm_\d+a?", arch): raise UnsupportedError(f"CUDA arch must look like 'sm_90', got {arch!r}")
  key = ("cuda_cubin", src, compiler_id(arch, prefer_nvrtc))
  if cache and (hit := diskcache_get("cuda_cubin", key)) is not None: return hit
  nvrtc = _import_nvrtc() if prefer_nvrtc else None
  if nvrtc is not None:
    try: out = _nvrtc_compile(nvrtc, src, arch)
    except CompileError as e:
      if find_nvcc() is None or "cuda_fp16.h" not in e.log and "cuda_bf16.h" not in e.log: raise
      out = _nvcc_compile(src, arch)
  else: out = _nvcc_compile(src, arch)
  return diskcache_put("cuda_cubin", key, out) if cache else out

def _nvrtc_compile(nvrtc: Any, src: str, arch: str) -> bytes:
  err, prog = nvrtc.nvrtcCreateProgram(src.encode(), b"kernel.cu", 0, [], [])
  if int(err) != 0: raise CompileError(f"nvrtcCreateProgram failed: {err}", "", src)
  try:
    opts = [f"--gpu-architecture={arch}".encode(), *(f.encode() for f in FLAGS),
            *(f"-I{d}".encode() for d in include_dirs())]
    err, = nvrtc.nvrtcCompileProgram(prog, len(opts), opts)
    if int(err) != 0:
      _, size = nvrtc.nvrtcGetProgramLogSize(prog)
      log = b" " * size
      nvrtc.nvrtcGetProgramLog(prog, log)
      raise CompileError(f"NVRTC could not compile for {arch}", log.decode(errors="replace").rstrip("\0 "), src)
    _, size = nvrtc.nvrtcGetCUBINSize(prog)
    cubin = b" " * size
    err, = nvrtc.nvrtcGetCUBIN(prog, cubin)
    if int(err) != 0: raise CompileError(f"nvrtcGetCUBIN failed for {arch}: {err}", "", src)
    return bytes(cubin)
  finally: nvrtc.nvrtcDestroyProgram(prog)

def _nvcc_compile(src: str, arch: str) -> bytes:
  if (nvcc := find_nvcc()) is None: raise UnsupportedError("nvcc is not on PATH")
  with tempfile.TemporaryDirectory(prefix="kernopt_cuda_") as tmp:
    cu, cubin = os.path.join(tmp, "kernel.cu"), os.path.join(tmp, "kernel.cubin")
    with open(cu, "w") as f: f.write(src)
    cmd = [nvcc, f"-arch={arch}", "-cubin", "-O3", *FLAGS, "-o", cubin, cu]
    res = subprocess.run(cmd, capture_output=True, text=True)
    if res.returncode != 0: raise CompileError(f"nvcc could not compile for {arch}", res.stderr + res.stdout, src)
    with open(cubin, "rb") as f: return f.read()

def batch_sources(srcs: list[str]) -> str:
  """Several rendered kernels as one translation unit (one compiler call): includes hoisted, each kernel's helpers
  in its own namespace and each kernel renamed `<name>_k<i>`."""
  includes: dict[str, None] = {}
  bodies = []
  for i, src in enumerate(srcs):
    lines = src.splitlines()
    includes.update((ln, None) for ln in lines if ln.startswith("#include"))
    body = "\n".join(ln for ln in lines if not ln.startswith("#include"))
    body = re.sub(r"(__launch_bounds__\(\d+\) )(\w+)\(", lambda m: f"{m.group(1)}{m.group(2)}_k{i}(", body, count=1)
    bodies.append(f"namespace ko_batch{i} {{\n{body}\n}}")
  return "\n".join([*includes, *bodies]) + "\n"

# ***** the drivers: one small interface, a class per Python binding of the driver API *****

def _ok(ret: Any, what: str) -> Any:
  """The value(s) of a cuda-python call (which returns (error, *values)), raising on an error."""
  err, vals = (ret[0], ret[1:]) if isinstance(ret, tuple) else (ret, ())
  if int(err) != 0: raise LaunchError(f"CUDA driver: {what} failed with {err}")
  return vals[0] if len(vals) == 1 else vals

def _import_cuda_python() -> Any:
  try:
    from cuda.bindings import driver  # cuda-python >= 12.6
    return driver
  except ImportError: pass
  from cuda import cuda as driver  # type: ignore[no-redef]  # older cuda-python; ImportError when absent
  return driver

def _import_pycuda() -> Any:
  import pycuda.driver as cuda  # ImportError when absent, or when its extension can't load libcuda.so.1
  return cuda

def kernel_args(program: Program, pointers: list[int], var_vals: list[int]) -> list[np.generic]:
  """The kernel's parameters as its signature declares them: a 64-bit address per used buffer (in index order), then
  each variable as its `program.var_args` dtype, int32 or int64."""
  ints: dict[int, type[np.signedinteger]] = {4: np.int32, 8: np.int64}
  args: list[np.generic] = [np.uint64(p) for p in pointers]
  return args + [ints[a.dtype.itemsize](v) for a, v in zip(program.var_args, var_vals)]

class CUDADriver:
  """What CUDADevice needs from a binding of the CUDA driver API. Every method makes the driver's context current in
  the calling thread first (the driver keeps one per thread, and the search loads modules on a thread pool), and
  work goes to `stream`. Handles are the binding's own objects; `pointer(handle)` is the device address."""
  name = ""
  arch, sm_count = "sm_80", 0
  ctx: Any = None
  stream: Any = None

  @classmethod
  def probe(cls) -> str:
    """What the binding sees (its devices), raising when it doesn't import or sees no GPU."""
    raise NotImplementedError
  @classmethod
  def open(cls, device_id: int = 0, context: Any = None, stream: Any = None) -> CUDADriver:
    """The driver on device device_id's primary context and the default stream, or on the given ones."""
    raise NotImplementedError
  def load(self, image: bytes) -> Any: raise NotImplementedError
  def function(self, module: Any, name: str) -> Any: raise NotImplementedError
  def alloc(self, nbytes: int) -> Any: raise NotImplementedError
  def free(self, handle: Any) -> None: raise NotImplementedError
  def copyin(self, handle: Any, src: np.ndarray) -> None: raise NotImplementedError
  def copyout(self, dst: np.ndarray, handle: Any) -> None: raise NotImplementedError
  def launch(self, fn: Any, grid: tuple[int, int, int], block: tuple[int, int, int], args: list[np.generic]) -> None:
    raise NotImplementedError
  def event(self) -> Any: raise NotImplementedError
  def record(self, event: Any) -> None: raise NotImplementedError
  def elapsed(self, start: Any, end: Any) -> float:
    """Seconds from start to end, once end has happened; both events are released."""
    raise NotImplementedError
  def synchronize(self) -> None: raise NotImplementedError
  def pointer(self, handle: Any) -> int: return int(handle)

_CTYPES: dict[np.dtype, Any] = {np.dtype(np.uint64): ctypes.c_uint64, np.dtype(np.int32): ctypes.c_int32,
                                 np.dtype(np.int64): ctypes.c_int64}

class CudaPythonDriver(CUDADriver):
  """NVIDIA's cuda-python (`cuda.bindings.driver`): every call returns (error, *values); buffers are CUdeviceptr."""
  name = "cuda-python"

  def __init__(self, drv: Any, ctx: Any = None, stream: Any = 0):
    self.drv, self.ctx, self.stream = drv, ctx, stream

  @classmethod
  def probe(cls) -> str:
    drv = _import_cuda_python()
    _ok(drv.cuInit(0), "cuInit")
    if (count := int(_ok(drv.cuDeviceGetCount(), "cuDeviceGetCount"))) < 1: raise LaunchError("it sees no device")
    return f"{count} device(s)"

  @classmethod
  def open(cls, device_id: int = 0, context: Any = None, stream: Any = None) -> CudaPythonDriver:
    drv = _import_cuda_python()
    _ok(drv.cuInit(0), "cuInit")
    if context is None:
      dev = _ok(drv.cuDeviceGet(device_id), f"cuDeviceGet({device_id})")
      context = _ok(drv.cuDevicePrimaryCtxRetain(dev), "cuDevicePrimaryCtxRetain")
    self = cls(drv, context, 0 if stream is None else stream)
    self._bind()
    dev = _ok(drv.cuCtxGetDevice(), "cuCtxGetDevice")
    attr = drv.CUdevice_attribute
    def get(a: Any) -> int: return int(_ok(drv.cuDeviceGetAttribute(a, dev), f"cuDeviceGetAttribute({a})"))
    major, minor = (get(attr.CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR),
                    get(attr.CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR))
    self.arch, self.sm_count = f"sm_{major}{minor}", get(attr.CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT)
    return self

  def _bind(self) -> None: _ok(self.drv.cuCtxSetCurrent(self.ctx), "cuCtxSetCurrent")
  def load(self, image: bytes) -> Any:
    self._bind()
    return _ok(self.drv.cuModuleLoadData(image), "cuModuleLoadData")
  def function(self, module: Any, name: str) -> Any:
    return _ok(self.drv.cuModuleGetFunction(module, name.encode()), f"cuModuleGetFunction({name})")
  def alloc(self, nbytes: int) -> Any:
    self._bind()
    return _ok(self.drv.cuMemAlloc(max(nbytes, 1)), f"cuMemAlloc({nbytes})")
  def free(self, handle: Any) -> None:
    self._bind()
    _ok(self.drv.cuMemFree(handle), "cuMemFree")
  def copyin(self, handle: Any, src: np.ndarray) -> None:
    self._bind()
    _ok(self.drv.cuMemcpyHtoDAsync(handle, src.ctypes.data, src.nbytes, self.stream), "cuMemcpyHtoDAsync")
    _ok(self.drv.cuStreamSynchronize(self.stream), "cuStreamSynchronize")
  def copyout(self, dst: np.ndarray, handle: Any) -> None:
    self._bind()
    _ok(self.drv.cuMemcpyDtoHAsync(dst.ctypes.data, handle, dst.nbytes, self.stream), "cuMemcpyDtoHAsync")
    _ok(self.drv.cuStreamSynchronize(self.stream), "cuStreamSynchronize")
  def launch(self, fn: Any, grid: tuple[int, int, int], block: tuple[int, int, int], args: list[np.generic]) -> None:
    vals = [_CTYPES[a.dtype](a.item()) for a in args]
    params = (ctypes.c_void_p * max(len(vals), 1))(*[ctypes.addressof(v) for v in vals])
    self._bind()
    _ok(self.drv.cuLaunchKernel(fn, *grid, *block, 0, self.stream, ctypes.addressof(params), 0), "cuLaunchKernel")
  def event(self) -> Any:
    self._bind()
    return _ok(self.drv.cuEventCreate(0), "cuEventCreate")
  def record(self, event: Any) -> None: _ok(self.drv.cuEventRecord(event, self.stream), "cuEventRecord")
  def elapsed(self, start: Any, end: Any) -> float:
    try:
      _ok(self.drv.cuEventSynchronize(end), "cuEventSynchronize")
      return float(_ok(self.drv.cuEventElapsedTime(start, end), "cuEventElapsedTime")) * 1e-3
    finally:
      for ev in (start, end): self.drv.cuEventDestroy(ev)
  def synchronize(self) -> None:
    self._bind()
    _ok(self.drv.cuCtxSynchronize(), "cuCtxSynchronize")

class PyCUDADriver(CUDADriver):
  """pycuda (`pycuda.driver`): buffers are DeviceAllocations, `stream` a pycuda Stream or None (the default stream).
  pycuda keeps its own stack of current contexts and aborts at exit when one is left pushed, so each call pushes the
  context only when it isn't current already and pops it again."""
  name = "pycuda"

  def __init__(self, cuda: Any, ctx: Any, stream: Any = None):
    self.cuda, self.ctx, self.stream = cuda, ctx, stream

  @classmethod
  def probe(cls) -> str:
    cuda = _import_pycuda()
    cuda.init()
    if (count := int(cuda.Device.count())) < 1: raise LaunchError("it sees no device")
    return f"{count} device(s)"

  @classmethod
  def open(cls, device_id: int = 0, context: Any = None, stream: Any = None) -> PyCUDADriver:
    cuda = _import_pycuda()
    cuda.init()
    self = cls(cuda, context if context is not None else cuda.Device(device_id).retain_primary_context(), stream)
    with self._active("opening the device"):
      dev = cuda.Context.get_device()
      major, minor = dev.compute_capability()
      self.arch = f"sm_{major}{minor}"
      self.sm_count = int(dev.get_attribute(cuda.device_attribute.MULTIPROCESSOR_COUNT))
    return self

  @contextlib.contextmanager
  def _active(self, what: str) -> Iterator[None]:
    """The block runs with ctx current; pycuda's errors become LaunchError."""
    cur = self.cuda.Context.get_current()
    pushed = cur is None or cur != self.ctx
    if pushed: self.ctx.push()
    try: yield
    except self.cuda.Error as e: raise LaunchError(f"CUDA driver (pycuda): {what} failed: {e}") from e
    finally:
      if pushed: self.cuda.Context.pop()

  def load(self, image: bytes) -> Any:
    with self._active("module_from_buffer"): return self.cuda.module_from_buffer(image)
  def function(self, module: Any, name: str) -> Any:
    with self._active(f"get_function({name})"): return module.get_function(name)
  def alloc(self, nbytes: int) -> Any:
    with self._active(f"mem_alloc({nbytes})"): return self.cuda.mem_alloc(max(nbytes, 1))
  def free(self, handle: Any) -> None:
    with self._active("free"): handle.free()
  def copyin(self, handle: Any, src: np.ndarray) -> None:
    with self._active("memcpy_htod"):
      if self.stream is None: self.cuda.memcpy_htod(self.pointer(handle), src)
      else:
        self.cuda.memcpy_htod_async(self.pointer(handle), src, self.stream)
        self.stream.synchronize()
  def copyout(self, dst: np.ndarray, handle: Any) -> None:
    with self._active("memcpy_dtoh"):
      if self.stream is None: self.cuda.memcpy_dtoh(dst, self.pointer(handle))
      else:
        self.cuda.memcpy_dtoh_async(dst, self.pointer(handle), self.stream)
        self.stream.synchronize()
  def launch(self, fn: Any, grid: tuple[int, int, int], block: tuple[int, int, int], args: list[np.generic]) -> None:
    # pycuda packs numpy scalars by their dtype with C alignment, as the kernel's parameter block is laid out
    with self._active("launch"): fn(*args, grid=grid, block=block, stream=self.stream)
  def event(self) -> Any:
    with self._active("Event"): return self.cuda.Event()
  def record(self, event: Any) -> None:
    with self._active("Event.record"): event.record(self.stream)
  def elapsed(self, start: Any, end: Any) -> float:
    with self._active("Event.synchronize"): return float(end.synchronize().time_since(start)) * 1e-3
  def synchronize(self) -> None:
    with self._active("Context.synchronize"): self.cuda.Context.synchronize()

# the order is the automatic choice's: the design card's driver first
DRIVERS: dict[str, type[CUDADriver]] = {"pycuda": PyCUDADriver, "cuda-python": CudaPythonDriver}

def have_compiler() -> bool: return _import_nvrtc() is not None or find_nvcc() is not None

def choose_driver(driver: Optional[str] = None) -> tuple[Optional[type[CUDADriver]], str]:
  """(the driver class a device opened with `driver` would use, what it sees) or (None, why none can be used):
  driver=None takes the first of DRIVERS that imports and sees a GPU."""
  if driver is not None and driver not in DRIVERS:
    return None, f"unknown CUDA driver {driver!r}; known: {', '.join(DRIVERS)}"
  whys = []
  for cls in ([DRIVERS[driver]] if driver else DRIVERS.values()):
    try: seen = cls.probe()
    except Exception as e:  # ImportError, the binding's own errors, LaunchError
      whys.append(f"{cls.name}: {type(e).__name__}: {e}")
      continue
    if not have_compiler(): return None, "no CUDA compiler: neither NVRTC nor nvcc"
    return cls, f"launches through {cls.name} ({seen})"
  return None, "no CUDA driver/GPU: " + "; ".join(whys)

class _CUDAKernel:
  def __init__(self, module: Any, fn: Any, name: str): self.module, self.fn, self.name = module, fn, name

class CUDADevice(Compiled):
  """One NVIDIA GPU through a CUDADriver (`driver_name` says which). Buffers are device allocations; kernel parameters
  are the used buffers then the variables; `global_size` counts thread blocks and `local_size` threads per block.
  `driver` is "pycuda", "cuda-python", None (the first that works) or a CUDADriver; `context` and `stream` (the
  binding's own objects) run kernopt on a context and stream the caller owns instead of the primary context and the
  default stream."""
  name = "CUDA"

  def __init__(self, device_id: int = 0, prefer_nvrtc: bool = True, driver: Optional[str | CUDADriver] = None,
               context: Any = None, stream: Any = None):
    if not isinstance(driver, CUDADriver):
      cls, reason = choose_driver(driver)
      if cls is None: raise UnsupportedError(reason)
      driver = cls.open(device_id, context, stream)
    self.driver: CUDADriver = driver
    self.arch, self.sm_count, self.prefer_nvrtc = driver.arch, driver.sm_count, prefer_nvrtc
    super().__init__()

  @classmethod
  def availability(cls, driver: Optional[str] = None) -> tuple[bool, str]:
    """(True, which driver a device would launch through) or (False, why it can't be opened)."""
    found, reason = choose_driver(driver)
    return found is not None, reason

  @property
  def driver_name(self) -> str: return self.driver.name
  # a cuda-python module and context set directly, as tests of the launch sequence do on a bare instance
  @property
  def drv(self) -> Any: return getattr(self.driver, "drv", None)
  @drv.setter
  def drv(self, module: Any) -> None:
    self.driver = CudaPythonDriver(module, getattr(self.__dict__.get("driver"), "ctx", None))
  @property
  def ctx(self) -> Any: return self.driver.ctx
  @ctx.setter
  def ctx(self, ctx: Any) -> None: self.driver.ctx = ctx

  def _make_renderer(self) -> Renderer:
    return CUDARenderer(arch=self.arch, heuristics="cuda_gpu", sm_count=self.sm_count)
  def compiler_id(self) -> str: return compiler_id(self.arch, self.prefer_nvrtc)
  def synchronize(self) -> None: self.driver.synchronize()

  # -- memory --
  def _alloc(self, nbytes: int, dtype: DType) -> Any: return self.driver.alloc(nbytes)
  def _free(self, handle: Any) -> None:
    try: self.driver.free(handle)
    except Exception: pass  # called from Buffer.__del__, possibly at interpreter exit: nothing to report to
  def _wrap(self, ptr: Any, nbytes: int) -> int:
    """The address of memory allocated elsewhere: an int, a pycuda DeviceAllocation, a cuda-python CUdeviceptr."""
    bad = LaunchError(f"CUDA: {ptr!r} is not a device pointer")
    if isinstance(ptr, (str, bytes, float, bool)): raise bad
    try: addr = int(ptr)
    except (TypeError, ValueError): raise bad from None
    if nbytes and addr == 0: raise LaunchError(f"CUDA: a Buffer of {nbytes} bytes at the null pointer")
    if addr % 16: raise LaunchError(f"CUDA: pointer {addr:#x} is not 16-byte aligned (kernels load up to 16 bytes)")
    return addr
  def _copyin(self, handle: Any, src: np.ndarray) -> None: self.driver.copyin(handle, np.ascontiguousarray(src))
  def _copyout(self, dst: np.ndarray, handle: Any) -> None: self.driver.copyout(dst, handle)

  # -- compile and launch --
  def _compile(self, program: Program) -> _CUDAKernel:
    cubin = compile_cuda(program.src, self.arch, self.prefer_nvrtc)
    module = self.driver.load(cubin)
    try: fn = self.driver.function(module, program.name)
    except LaunchError: raise CompileError(f"{program.name} is not defined by its source", "", program.src) from None
    return _CUDAKernel(module, fn, program.name)

  def launch_dims(self, program: Program, global_size: Optional[tuple[int, ...]],
                  local_size: Optional[tuple[int, ...]]) -> tuple[tuple[int, int, int], tuple[int, int, int]]:
    """(blocks, threads) padded to three dimensions and checked against the renderer's limits."""
    grid = tuple(global_size or ()) + (1,) * (3 - len(global_size or ()))
    block = tuple(local_size or ()) + (1,) * (3 - len(local_size or ()))
    r = self.renderer.caps
    if len(grid) > 3 or len(block) > 3 or any(not isinstance(x, int) or x < 1 for x in grid + block):
      raise LaunchError(f"{program.name}: bad launch sizes global={global_size} local={local_size}")
    for i in range(3):
      if any(lim is not None and x[i] > lim[i] for x, lim in ((grid, r.global_max), (block, r.local_max))):
        raise LaunchError(f"{program.name}: launch global={grid} local={block} exceeds the limits "
                          f"{r.global_max} / {r.local_max} in dim {i}")
    if block[0] * block[1] * block[2] > r.max_local_size:
      raise LaunchError(f"{program.name}: {block} is more than {r.max_local_size} threads per block")
    return grid, block  # type: ignore[return-value]

  def _launch(self, lib: _CUDAKernel, program: Program, handles: list[Any], var_vals: list[int],
              global_size: Optional[tuple[int, ...]], local_size: Optional[tuple[int, ...]],
              wait: bool) -> Optional[float]:
    grid, block = self.launch_dims(program, global_size, local_size)
    drv = self.driver
    args = kernel_args(program, [drv.pointer(h) for h in handles], var_vals)
    try:
      if not wait:
        drv.launch(lib.fn, grid, block, args)
        return None
      start, end = drv.event(), drv.event()
      drv.record(start)
      drv.launch(lib.fn, grid, block, args)
      drv.record(end)
      return drv.elapsed(start, end)
    except LaunchError as e: raise LaunchError(f"{program.name}: {e}") from None

def time_compile(src: str, arch: str, prefer_nvrtc: bool = True) -> tuple[bytes, float]:
  """(cubin, seconds) of an uncached compile: for benchmarks and the GPU check's timing table."""
  st = time.perf_counter()
  out = compile_cuda(src, arch, prefer_nvrtc, cache=False)
  return out, time.perf_counter() - st

DEVICE_CLASS = CUDADevice
