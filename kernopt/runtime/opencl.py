"""The OPENCL device: pyopencl (imported lazily) on any OpenCL platform, PoCL included. Programs are built
once and their binaries kept on disk under cache_dir/opencl; launches are checked against the device's
work-group limits; timings come from profiling events. Builds run on a thread with a large stack of their own.
Imports dtype, errors, helpers, renderers and runtime."""
from __future__ import annotations
import os, platform, threading, warnings
from typing import Any, Callable, Optional, TypeVar, Union
import numpy as np
from kernopt.dtype import DType, ImageDType, dtypes
from kernopt.errors import CompileError, LaunchError, UnsupportedError
from kernopt.helpers import (cache_subdir, cache_tmp, getconfig, prod, record_binary, remove_stale_tmp,
                             to_function_name, verified_binary)
from kernopt.renderers import Program
from kernopt.renderers.opencl import OpenCLRenderer
from kernopt.runtime import Compiled, np_dtype

T = TypeVar("T")
# PoCL builds in the calling thread and its LLVM recurses once per level of an expression: a framework's worker thread
# (512 KiB stacks are common) overflows on a deep kernel, so every build runs on a thread with this much stack
BUILD_STACK = 256 << 20
_STACK_LOCK = threading.Lock()

def on_build_stack(fn: Callable[[], T]) -> T:
  """fn() on a fresh thread with a BUILD_STACK-byte stack; its result returned, its exception re-raised here."""
  out: list[tuple[bool, Any]] = []
  def run() -> None:
    try: out.append((True, fn()))
    except BaseException as e: out.append((False, e))   # noqa: B036  re-raised in the caller's thread
  with _STACK_LOCK:   # threading.stack_size is process-wide: set it only around this thread's start
    old = threading.stack_size(BUILD_STACK)
    try:
      t = threading.Thread(target=run, name="kernopt-opencl-build", daemon=True)
      t.start()
    finally: threading.stack_size(old)
  t.join()
  ok, value = out[0]
  if ok: return value
  raise value

def _all_devices() -> list[Any]:
  import pyopencl as cl
  try: platforms = cl.get_platforms()
  except cl.Error: return []   # clGetPlatformIDs fails with PLATFORM_NOT_FOUND when no ICD is installed
  ret = []
  for p in platforms:
    try: ret += p.get_devices()
    except cl.Error: continue   # a platform with no device (DEVICE_NOT_FOUND) or a broken ICD
  return ret

# what to install when an OpenCL compiler cannot target this CPU
REMEDIES = ("Debian/Ubuntu's pocl-opencl-icd (apt-get install pocl-opencl-icd), a PoCL >= 5 with CPU selection, or "
            "Intel's CPU runtime (pip install intel-opencl-rt intel-cmplr-lib-rt); `bash .ci/install_opencl.sh` "
            "tries them in that order")
_PROBE_SRC = "__kernel void ko_probe(__global float* a) { int i = get_global_id(0); a[i] = 2.0f * a[i] + 1.0f; }"
_PROBE_N = 64
_probe_cache: dict[tuple[str, ...], Optional[str]] = {}

def device_label(d: Any) -> str:
  return f"{d.platform.name} {d.platform.version} / {d.name}"

def _device_key(d: Any) -> tuple[str, ...]:
  return (d.platform.name, d.platform.version, d.name, d.version, d.driver_version)

def unknown_cpu_error(d: Any, log: str) -> Optional[UnsupportedError]:
  """The UnsupportedError for a build log that says the OpenCL compiler does not know this host's CPU (an old PoCL
  on a newer CPU than its LLVM: it asks LLVM for the CPU's name, gets "generic", and passes it on), else None."""
  if "unknown target cpu" not in log.lower(): return None
  line = next((ln.strip() for ln in log.splitlines() if "unknown target cpu" in ln.lower()), "")
  return UnsupportedError(f"{device_label(d)} cannot compile for this CPU ({line}): its LLVM does not know the host. "
                          f"Use {REMEDIES}")

def probe(d: Any) -> Optional[str]:
  """Why device d cannot run kernopt's kernels, or None when it builds and runs a probe kernel with the right numbers.
  Cached per platform, device and driver version."""
  if (key := _device_key(d)) in _probe_cache: return _probe_cache[key]
  import pyopencl as cl
  reason: Optional[str] = None
  try:
    ctx = cl.Context([d])
    queue = cl.CommandQueue(ctx, d)
    with warnings.catch_warnings():   # pyopencl warns of any compiler output, Intel's notes included
      warnings.simplefilter("ignore")
      prg = cl.Program(ctx, _PROBE_SRC).build(devices=[d])
    x = np.arange(_PROBE_N, dtype=np.float32)
    buf = cl.Buffer(ctx, cl.mem_flags.READ_WRITE | cl.mem_flags.COPY_HOST_PTR, hostbuf=x)
    prg.ko_probe(queue, (_PROBE_N,), None, buf)
    out = np.empty_like(x)
    cl.enqueue_copy(queue, out, buf, is_blocking=True)
    if not (out == 2 * x + 1).all(): reason = f"the probe kernel computed wrong numbers: {out[:4]}..."
  except cl.Error as e:
    err = unknown_cpu_error(d, str(e))   # a failed build's message carries the build log
    reason = str(err) if err is not None else f"the probe kernel failed: {' '.join(str(e).split())[:400]}"
  _probe_cache[key] = reason
  return reason

def probe_report() -> list[tuple[str, Optional[str]]]:
  """(device, why it cannot be used or None) for every device of every platform, in selection order."""
  import pyopencl as cl
  devs = _all_devices()
  order = [d for d in devs if d.type & cl.device_type.GPU] + [d for d in devs if not d.type & cl.device_type.GPU]
  return [(device_label(d), probe(d)) for d in order]

def select_device(choice: Union[int, str, None] = None) -> Any:
  """An OpenCL device: choice is an index into every platform's devices or a substring of a device or platform
  name; "" or None means the CL_DEVICE knob, else the first GPU that runs the probe kernel, else the first other
  device that does (PoCL's CPU). An explicit choice is taken as it is."""
  import pyopencl as cl
  devs = _all_devices()
  if not devs: raise UnsupportedError("no OpenCL platform found (pip install pyopencl; then " + REMEDIES + ")")
  if choice is None or choice == "": choice = getconfig().CL_DEVICE or None
  if isinstance(choice, str) and choice.isdigit(): choice = int(choice)
  if isinstance(choice, int):
    if not 0 <= choice < len(devs): raise UnsupportedError(f"OpenCL device index {choice} is not in [0, {len(devs)})")
    return devs[choice]
  if isinstance(choice, str):
    for d in devs:
      if choice.lower() in d.name.lower() or choice.lower() in d.platform.name.lower(): return d
    raise UnsupportedError(f"no OpenCL device matches {choice!r}; have {[d.name for d in devs]}")
  order = [d for d in devs if d.type & cl.device_type.GPU] + [d for d in devs if not d.type & cl.device_type.GPU]
  reasons = []
  for d in order:
    if (why := probe(d)) is None: return d
    reasons.append(f"{device_label(d)}: {why}")
  raise UnsupportedError("no OpenCL device runs kernopt's probe kernel:\n  " + "\n  ".join(reasons))

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
  caches_binaries = True   # the program binary, in kernopt's disk cache
  warmup_launch = True     # PoCL builds a kernel's work-group code on its first launch, into its own kernel cache

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
    try: d = select_device(None)
    except UnsupportedError as e: return False, str(e)
    return True, device_label(d)

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
      if not self.renderer.caps.supports_images: raise UnsupportedError(f"{self.cl_device.name} has no image support")
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
  def _cache_path(self, src: str) -> Optional[str]:
    """Where src's binary lives in the disk cache; None without a usable cache (DISABLE_CACHE, an unfit directory)."""
    if getconfig().DISABLE_CACHE or (folder := cache_subdir("opencl")) is None: return None
    return os.path.join(folder, self.cache_key(src) + ".bin")

  def _compile(self, program: Program) -> _CLKernel:
    import pyopencl as cl
    path = self._cache_path(program.src)
    prg = None
    if path is not None and (binary := verified_binary("opencl_binary", path, program.src)) is not None:
      try: prg = on_build_stack(cl.Program(self.ctx, [self.cl_device], [binary]).build)
      except cl.Error: prg = None   # a stale binary: rebuild from source
    from_cache = prg is not None
    if prg is None:
      prg = self._build_source(program)
      if path is not None: self._store_binary(path, prg.get_info(cl.program_info.BINARIES)[0], program.src)
    return on_build_stack(lambda: _CLKernel(self, prg, _kernel_name(prg, program), from_cache))

  def _build_source(self, program: Program) -> Any:
    import pyopencl as cl
    prg = cl.Program(self.ctx, program.src)
    try: return on_build_stack(lambda: prg.build(devices=[self.cl_device]))
    except cl.Error as e:
      try: log = prg.get_build_info(self.cl_device, cl.program_build_info.LOG)
      except Exception: log = ""  # the program object may not exist after a failed build
      if (err := unknown_cpu_error(self.cl_device, log or str(e))) is not None: raise err from None
      raise CompileError(f"OpenCL build of {program.name} failed on {self.cl_device.name}", log or str(e),
                         program.src) from None

  @staticmethod
  def _store_binary(path: str, binary: bytes, src: str) -> None:
    """binary (built from src) written at path through a temporary file, and its digests recorded."""
    if not binary: return
    tmp = None
    try:
      remove_stale_tmp(os.path.dirname(path))
      tmp = cache_tmp(path)
      with open(tmp, "wb") as f: f.write(binary)
      os.replace(tmp, path)   # atomic, so concurrent processes never read half a file
      record_binary("opencl_binary", path, src, binary)
    except OSError: pass      # the cache is an optimization; a read-only or full disk is not an error
    finally:
      if tmp is not None and os.path.exists(tmp): os.unlink(tmp)

  # *** launch ***
  def _launch(self, lib: _CLKernel, program: Program, handles: list[Any], var_vals: list[int],
              global_size: Optional[tuple[int, ...]], local_size: Optional[tuple[int, ...]],
              wait: bool) -> Optional[float]:
    import pyopencl as cl
    gws, lws = self.launch_sizes(lib, program, global_size, local_size)
    try:
      lib.kernel.set_args(*handles, *[np_dtype(a.dtype).type(v) for a, v in zip(program.var_args, var_vals)])
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

def main() -> int:
  """`python -m kernopt.runtime.opencl`: every device tried, why the unusable ones were skipped, and the one the
  OPENCL device uses; exit status 1 when none works."""
  try: import pyopencl  # noqa: F401
  except ImportError:
    print("OpenCL: pyopencl is not installed (pip install pyopencl)")
    return 1
  report = probe_report()
  if not report: print("OpenCL: no platform or device found (no ICD registered with the loader)")
  for label, why in report:
    print(f"OpenCL: {'works' if why is None else 'skipped'}: {label}" + (f": {why}" if why else ""))
  try: d = select_device(None)
  except UnsupportedError:
    print(f"OpenCL: no device works here. Install {REMEDIES}")
    return 1
  print(f"OpenCL: kernopt uses {device_label(d)} (native float vector width {d.native_vector_width_float}, "
        f"max work-group {d.max_work_group_size}, local memory {d.local_mem_size} bytes)")
  return 0

if __name__ == "__main__":
  raise SystemExit(main())
