"""The OPENCL device: pyopencl (imported lazily) on any OpenCL platform, PoCL included. Programs are built
once and their binaries kept on disk under cache_dir/opencl; launches are checked against the device's
work-group limits; timings come from profiling events."""
from __future__ import annotations
import os, platform, tempfile
from typing import Any, Optional, Union
import numpy as np
from kernopt.dtype import DType, ImageDType, dtypes
from kernopt.errors import CompileError, LaunchError, UnsupportedError
from kernopt.helpers import getconfig, prod, to_function_name
from kernopt.renderers import Program
from kernopt.renderers.opencl import OpenCLRenderer
from kernopt.runtime import Compiled

def _all_devices() -> list[Any]:
  import pyopencl as cl
  try: platforms = cl.get_platforms()
  except cl.Error: return []   # clGetPlatformIDs fails with PLATFORM_NOT_FOUND when no ICD is installed
  return [d for p in platforms for d in p.get_devices()]

def select_device(choice: Union[int, str, None] = None) -> Any:
  """An OpenCL device: choice is an index into every platform's devices or a substring of a device or platform
  name; "" or None means the CL_DEVICE knob, else the first GPU, else the first device (PoCL's CPU)."""
  import pyopencl as cl
  devs = _all_devices()
  if not devs: raise UnsupportedError("no OpenCL platform found (pip install pyopencl pocl-binary-distribution)")
  if choice is None or choice == "": choice = getconfig().CL_DEVICE or None
  if isinstance(choice, str) and choice.isdigit(): choice = int(choice)
  if isinstance(choice, int):
    if not 0 <= choice < len(devs): raise UnsupportedError(f"OpenCL device index {choice} is not in [0, {len(devs)})")
    return devs[choice]
  if isinstance(choice, str):
    for d in devs:
      if choice.lower() in d.name.lower() or choice.lower() in d.platform.name.lower(): return d
    raise UnsupportedError(f"no OpenCL device matches {choice!r}; have {[d.name for d in devs]}")
  gpus = [d for d in devs if d.type & cl.device_type.GPU]
  return (gpus or devs)[0]

def cpu_vector_width(d: Any, cl: Any) -> int:
  """The float lanes the CPU profile packs for device d: its native float vector width (a power of two from 4 to
  16; PoCL on AVX2 says 8), or 1 (no CPU profile) for a device that is not a CPU."""
  if not d.type & cl.device_type.CPU: return 1
  w = d.native_vector_width_float or d.preferred_vector_width_float
  return w if w in (4, 8, 16) else 4

def is_pocl(d: Any) -> bool:
  """Whether device d belongs to PoCL, whose OpenCL C compiler is clang."""
  return "portable computing language" in d.platform.name.lower()

class OpenCLDevice(Compiled):
  """Device "OPENCL". `OpenCLDevice(device=1)` or `device="pthread"` picks a device (see select_device)."""
  name = "OPENCL"

  def __init__(self, device: Union[int, str, None] = None, stream_stores: Optional[bool] = None):
    """`stream_stores`: big loop-free kernels store with non-temporal stores, fenced per work-group (+20-25% on
    a+b and relu(a*b+c) of 4096^2 here). None (the default) turns them on where they are possible: PoCL on an
    x86-64 host."""
    import pyopencl as cl
    self.cl_device = select_device(device)
    possible = is_pocl(self.cl_device) and platform.machine().lower() in ("x86_64", "amd64")
    self.stream_stores = possible if stream_stores is None else stream_stores and possible
    self.ctx = cl.Context([self.cl_device])
    self.queue = cl.CommandQueue(self.ctx, self.cl_device, properties=cl.command_queue_properties.PROFILING_ENABLE)
    super().__init__()

  @classmethod
  def availability(cls) -> tuple[bool, str]:
    try: import pyopencl  # noqa: F401
    except ImportError: return False, "pyopencl is not installed (pip install pyopencl pocl-binary-distribution)"
    devs = _all_devices()
    if not devs: return False, "pyopencl found no OpenCL platform (pip install pocl-binary-distribution)"
    return True, ", ".join(f"{d.platform.name}: {d.name}" for d in devs)

  def _make_renderer(self) -> OpenCLRenderer:
    """The device's limits and features; a CPU device (PoCL's pthread) also gets the CPU profile: lanes packed
    into vectors of its native float width and heuristics_opencl's Opts; PoCL's (its compiler is clang) also gets
    element-aligned vector types for vector accesses, and on x86-64 fenced non-temporal stores in big loop-free
    kernels (see __init__)."""
    import pyopencl as cl
    d = self.cl_device
    return OpenCLRenderer(local_max=tuple(d.max_work_item_sizes), max_local_size=d.max_work_group_size,
                          shared_max=d.local_mem_size, has_fp16="cl_khr_fp16" in d.extensions.split(),
                          supports_images=bool(d.image_support), vector_width=cpu_vector_width(d, cl),
                          stream_stores=self.stream_stores, clang=is_pocl(d))

  def compiler_id(self) -> str:
    d = self.cl_device
    return f"OPENCL|{d.platform.name}|{d.platform.version}|{d.name}|{d.version}|{d.driver_version}"

  # *** memory ***
  def _alloc(self, nbytes: int, dtype: DType) -> Any:
    import pyopencl as cl
    if isinstance(dtype, ImageDType):
      if not self.renderer.supports_images: raise UnsupportedError(f"{self.cl_device.name} has no image support")
      h, w = dtype.shape[0], dtype.shape[1]
      ctype = cl.channel_type.HALF_FLOAT if dtype.base == dtypes.half else cl.channel_type.FLOAT
      return cl.create_image(self.ctx, cl.mem_flags.READ_WRITE, cl.ImageFormat(cl.channel_order.RGBA, ctype),
                             shape=(w, h))
    return cl.Buffer(self.ctx, cl.mem_flags.READ_WRITE, max(nbytes, 1))   # OpenCL refuses empty buffers

  def _copyin(self, handle: Any, src: np.ndarray) -> None:
    import pyopencl as cl
    if src.nbytes == 0: return
    if isinstance(handle, cl.Image):
      w, h = handle.shape[:2]
      cl.enqueue_copy(self.queue, handle, src, origin=(0, 0), region=(w, h), is_blocking=True)
    else: cl.enqueue_copy(self.queue, handle, src, is_blocking=True)

  def _copyout(self, dst: np.ndarray, handle: Any) -> None:
    import pyopencl as cl
    if dst.nbytes == 0: return
    if isinstance(handle, cl.Image):
      w, h = handle.shape[:2]
      cl.enqueue_copy(self.queue, dst, handle, origin=(0, 0), region=(w, h), is_blocking=True)
    else: cl.enqueue_copy(self.queue, dst, handle, is_blocking=True)

  def synchronize(self) -> None: self.queue.finish()

  # *** compile ***
  def _cache_path(self, src: str) -> str:
    return os.path.join(getconfig().cache_dir, "opencl", self.cache_key(src) + ".bin")

  def _compile(self, program: Program) -> _CLKernel:
    import pyopencl as cl
    path = self._cache_path(program.src)
    prg = None
    if not getconfig().DISABLE_CACHE and os.path.exists(path):
      try:
        with open(path, "rb") as f: binary = f.read()
        prg = cl.Program(self.ctx, [self.cl_device], [binary]).build()
      except (OSError, cl.Error): prg = None   # a stale or foreign binary: rebuild from source
    from_cache = prg is not None
    if prg is None:
      prg = self._build_source(program)
      if not getconfig().DISABLE_CACHE: self._store_binary(path, prg.get_info(cl.program_info.BINARIES)[0])
    return _CLKernel(self, prg, _kernel_name(prg, program), from_cache)

  def _build_source(self, program: Program) -> Any:
    import pyopencl as cl
    prg = cl.Program(self.ctx, program.src)
    try: return prg.build(devices=[self.cl_device])
    except cl.Error as e:
      try: log = prg.get_build_info(self.cl_device, cl.program_build_info.LOG)
      except Exception: log = ""  # the program object may not exist after a failed build
      raise CompileError(f"OpenCL build of {program.name} failed on {self.cl_device.name}", log or str(e),
                         program.src) from None

  @staticmethod
  def _store_binary(path: str, binary: bytes) -> None:
    if not binary: return
    try:
      os.makedirs(os.path.dirname(path), exist_ok=True)
      fd, tmp = tempfile.mkstemp(dir=os.path.dirname(path), suffix=".tmp")
      with os.fdopen(fd, "wb") as f: f.write(binary)
      os.replace(tmp, path)   # atomic, so concurrent processes never read half a file
    except OSError: pass      # the cache is an optimization; a read-only disk is not an error

  # *** launch ***
  def _launch(self, lib: _CLKernel, program: Program, handles: list[Any], var_vals: list[int],
              global_size: Optional[tuple[int, ...]], local_size: Optional[tuple[int, ...]],
              wait: bool) -> Optional[float]:
    import pyopencl as cl
    gws, lws = self.launch_sizes(lib, program, global_size, local_size)
    try:
      lib.kernel.set_args(*handles, *[np.int32(v) for v in var_vals])
      ev = cl.enqueue_nd_range_kernel(self.queue, lib.kernel, gws, lws)
    except cl.Error as e: raise LaunchError(f"{program.name}: enqueue failed: {e}") from None
    if not wait: return None
    ev.wait()
    return (ev.profile.end - ev.profile.start) * 1e-9

  def launch_sizes(self, lib: _CLKernel, program: Program, global_size: Optional[tuple[int, ...]],
                   local_size: Optional[tuple[int, ...]]) -> tuple[tuple[int, ...], tuple[int, ...]]:
    """The NDRange (global = workgroups * local per dim) and local size, refused with LaunchError when they
    exceed the device's limits rather than letting clEnqueueNDRangeKernel fail."""
    groups = tuple(global_size) if global_size else (1,)
    local = tuple(local_size) if local_size else (1,) * len(groups)
    if len(local) < len(groups): local = local + (1,) * (len(groups) - len(local))
    if len(groups) < len(local): groups = groups + (1,) * (len(local) - len(groups))
    if len(groups) > 3: raise LaunchError(f"{program.name}: {len(groups)} launch dimensions, OpenCL allows at most 3")
    if any(not isinstance(x, int) or x < 1 for x in groups + local):
      raise LaunchError(f"{program.name}: launch sizes must be positive ints, got global={groups} local={local}")
    d = self.cl_device
    for i, (lsz, mx) in enumerate(zip(local, d.max_work_item_sizes)):
      if lsz > mx: raise LaunchError(f"{program.name}: local size {local} exceeds the device's max {mx} on dim {i}")
    limit = min(d.max_work_group_size, lib.max_group)
    if prod(local) > limit:
      raise LaunchError(f"{program.name}: work-group of {prod(local)} threads (local size {local}) exceeds the "
                        f"limit {limit} of {d.name}")
    if lib.local_mem > d.local_mem_size:
      raise LaunchError(f"{program.name}: uses {lib.local_mem} bytes of local memory, {d.name} has {d.local_mem_size}")
    return tuple(g * lsz for g, lsz in zip(groups, local)), local

class _CLKernel:
  """A built program, its kernel object, and the kernel's own limits."""
  def __init__(self, dev: OpenCLDevice, prg: Any, name: str, from_cache: bool):
    import pyopencl as cl
    self.program, self.kernel, self.from_cache = prg, cl.Kernel(prg, name), from_cache
    info = cl.kernel_work_group_info
    self.max_group = self.kernel.get_work_group_info(info.WORK_GROUP_SIZE, dev.cl_device)
    self.local_mem = self.kernel.get_work_group_info(info.LOCAL_MEM_SIZE, dev.cl_device)

def _kernel_name(prg: Any, program: Program) -> str:
  names = [n for n in prg.kernel_names.split(";") if n]
  for cand in (program.name, to_function_name(program.name)):
    if cand in names: return cand
  if len(names) == 1: return names[0]
  raise CompileError(f"no kernel named {program.name!r} in the program (found {names})", src=program.src)

DEVICE_CLASS = OpenCLDevice
