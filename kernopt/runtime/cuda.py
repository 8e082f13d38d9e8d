"""The CUDA device: CUDA C++ from `CUDARenderer`, compiled to a cubin by NVRTC (cuda-python's cuda.bindings.nvrtc)
when importable, else by nvcc; launched through the driver API of cuda-python (cuda.bindings.driver). Both are
imported lazily: rendering and `compile_cuda` work on a machine without a GPU. Flags keep IEEE semantics
(--fmad=false: no contraction of a*b+c, as ops.exec_alu and the CPU device's -ffp-contract=off)."""
from __future__ import annotations
import ctypes
import functools
import glob
import os
import re
import shutil
import subprocess
import tempfile
import time
from typing import Any, Optional
import numpy as np
from kernopt.dtype import DType
from kernopt.errors import CompileError, LaunchError, UnsupportedError
from kernopt.helpers import diskcache_get, diskcache_put
from kernopt.renderers import Program, Renderer
from kernopt.renderers.cuda import CUDARenderer
from kernopt.runtime import Compiled

FLAGS = ("--fmad=false",)
# compiler processes / NVRTC programs this module started (tests read it to prove a cache hit)
compiler_calls: dict[str, int] = {"nvcc": 0, "nvrtc": 0}

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
  compiler_calls["nvrtc"] += 1
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
  compiler_calls["nvcc"] += 1
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

# ***** the driver *****

def _import_driver() -> Any:
  try:
    from cuda.bindings import driver  # cuda-python >= 12.6
    return driver
  except ImportError: pass
  from cuda import cuda as driver  # type: ignore[no-redef]  # older cuda-python; ImportError when absent
  return driver

def _ok(ret: Any, what: str) -> Any:
  """The value(s) of a cuda-python call (which returns (error, *values)), raising on an error."""
  err, vals = (ret[0], ret[1:]) if isinstance(ret, tuple) else (ret, ())
  if int(err) != 0: raise LaunchError(f"CUDA driver: {what} failed with {err}")
  return vals[0] if len(vals) == 1 else vals

class _CUDAKernel:
  def __init__(self, module: Any, fn: Any, name: str): self.module, self.fn, self.name = module, fn, name

class CUDADevice(Compiled):
  """One NVIDIA GPU through the driver API (its primary context). Buffers are device pointers; kernel parameters
  are the buffers then the int variables; `global_size` counts thread blocks and `local_size` threads per block."""
  name = "CUDA"

  def __init__(self, device_id: int = 0, prefer_nvrtc: bool = True):
    ok, reason = self.availability()
    if not ok: raise UnsupportedError(reason)
    self.drv = _import_driver()
    _ok(self.drv.cuInit(0), "cuInit")
    self.dev = _ok(self.drv.cuDeviceGet(device_id), f"cuDeviceGet({device_id})")
    self.ctx = _ok(self.drv.cuDevicePrimaryCtxRetain(self.dev), "cuDevicePrimaryCtxRetain")
    _ok(self.drv.cuCtxSetCurrent(self.ctx), "cuCtxSetCurrent")
    attr = self.drv.CUdevice_attribute
    major = _ok(self.drv.cuDeviceGetAttribute(attr.CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR, self.dev), "arch")
    minor = _ok(self.drv.cuDeviceGetAttribute(attr.CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR, self.dev), "arch")
    self.arch, self.prefer_nvrtc = f"sm_{major}{minor}", prefer_nvrtc
    sms = self.drv.cuDeviceGetAttribute(attr.CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT, self.dev)
    self.sm_count = int(_ok(sms, "multiprocessor count"))
    super().__init__()

  @classmethod
  def availability(cls) -> tuple[bool, str]:
    try: drv = _import_driver()
    except ImportError as e: return False, f"no CUDA driver/GPU: cuda-python is not installed ({e})"
    try:
      _ok(drv.cuInit(0), "cuInit")
      count = _ok(drv.cuDeviceGetCount(), "cuDeviceGetCount")
    except Exception as e: return False, f"no CUDA driver/GPU: {e}"
    if int(count) < 1: return False, "no CUDA driver/GPU: the driver reports no device"
    if _import_nvrtc() is None and find_nvcc() is None: return False, "no CUDA compiler: neither NVRTC nor nvcc"
    return True, ""

  def _make_renderer(self) -> Renderer:
    return CUDARenderer(arch=self.arch, heuristics="cuda_gpu", sm_count=self.sm_count)
  def compiler_id(self) -> str: return compiler_id(self.arch, self.prefer_nvrtc)
  def synchronize(self) -> None:
    self._bind()
    _ok(self.drv.cuCtxSynchronize(), "cuCtxSynchronize")
  def _bind(self) -> None:
    """Make this device's context current in the calling thread: the driver keeps one per thread, and the search
    compiles (loads modules) on a thread pool."""
    _ok(self.drv.cuCtxSetCurrent(self.ctx), "cuCtxSetCurrent")

  # -- memory --
  def _alloc(self, nbytes: int, dtype: DType) -> Any:
    self._bind()
    return _ok(self.drv.cuMemAlloc(max(nbytes, 1)), f"cuMemAlloc({nbytes})")
  def _free(self, handle: Any) -> None: self.drv.cuMemFree(handle)
  def _copyin(self, handle: Any, src: np.ndarray) -> None:
    src = np.ascontiguousarray(src)
    self._bind()
    _ok(self.drv.cuMemcpyHtoD(handle, src.ctypes.data, src.nbytes), "cuMemcpyHtoD")
  def _copyout(self, dst: np.ndarray, handle: Any) -> None:
    self._bind()
    _ok(self.drv.cuMemcpyDtoH(dst.ctypes.data, handle, dst.nbytes), "cuMemcpyDtoH")

  # -- compile and launch --
  def _compile(self, program: Program) -> _CUDAKernel:
    cubin = compile_cuda(program.src, self.arch, self.prefer_nvrtc)
    self._bind()
    module = _ok(self.drv.cuModuleLoadData(cubin), f"cuModuleLoadData({program.name})")
    try: fn = _ok(self.drv.cuModuleGetFunction(module, program.name.encode()), f"cuModuleGetFunction({program.name})")
    except LaunchError: raise CompileError(f"{program.name} is not defined by its source", "", program.src) from None
    return _CUDAKernel(module, fn, program.name)

  def launch_dims(self, program: Program, global_size: Optional[tuple[int, ...]],
                  local_size: Optional[tuple[int, ...]]) -> tuple[tuple[int, int, int], tuple[int, int, int]]:
    """(blocks, threads) padded to three dimensions and checked against the renderer's limits."""
    grid = tuple(global_size or ()) + (1,) * (3 - len(global_size or ()))
    block = tuple(local_size or ()) + (1,) * (3 - len(local_size or ()))
    r = self.renderer
    if len(grid) > 3 or len(block) > 3 or any(not isinstance(x, int) or x < 1 for x in grid + block):
      raise LaunchError(f"{program.name}: bad launch sizes global={global_size} local={local_size}")
    for i in range(3):
      if grid[i] > r.global_max[i] or block[i] > r.local_max[i]:
        raise LaunchError(f"{program.name}: launch global={grid} local={block} exceeds the limits "
                          f"{r.global_max} / {r.local_max} in dim {i}")
    if block[0] * block[1] * block[2] > r.max_local_size:
      raise LaunchError(f"{program.name}: {block} is more than {r.max_local_size} threads per block")
    return grid, block  # type: ignore[return-value]

  def _launch(self, lib: _CUDAKernel, program: Program, handles: list[Any], var_vals: list[int],
              global_size: Optional[tuple[int, ...]], local_size: Optional[tuple[int, ...]],
              wait: bool) -> Optional[float]:
    grid, block = self.launch_dims(program, global_size, local_size)
    vals = [ctypes.c_uint64(int(h)) for h in handles] + [ctypes.c_int32(v) for v in var_vals]
    params = (ctypes.c_void_p * max(len(vals), 1))(*[ctypes.addressof(v) for v in vals])
    drv = self.drv
    self._bind()
    if wait:
      start, end = _ok(drv.cuEventCreate(0), "cuEventCreate"), _ok(drv.cuEventCreate(0), "cuEventCreate")
      _ok(drv.cuEventRecord(start, 0), "cuEventRecord")
    _ok(drv.cuLaunchKernel(lib.fn, *grid, *block, 0, 0, ctypes.addressof(params), 0), f"launch of {program.name}")
    if not wait: return None
    _ok(drv.cuEventRecord(end, 0), "cuEventRecord")
    _ok(drv.cuEventSynchronize(end), f"{program.name} (cuEventSynchronize)")
    ms = _ok(drv.cuEventElapsedTime(start, end), "cuEventElapsedTime")
    for ev in (start, end): drv.cuEventDestroy(ev)
    return float(ms) * 1e-3

def time_compile(src: str, arch: str, prefer_nvrtc: bool = True) -> tuple[bytes, float]:
  """(cubin, seconds) of an uncached compile: for benchmarks and the GPU check's timing table."""
  st = time.perf_counter()
  out = compile_cuda(src, arch, prefer_nvrtc, cache=False)
  return out, time.perf_counter() - st

DEVICE_CLASS = CUDADevice
