"""The METAL device (macOS only): MSL from `MetalRenderer` compiled at run time by the Metal framework through PyObjC
(imported lazily), buffers in shared storage, one command buffer per launch. Untested here (no macOS): kept small.
fastMathEnabled is off so float results follow IEEE as ops.exec_alu does.
Imports dtype, errors, renderers and runtime/."""
from __future__ import annotations
import sys
from typing import Any, Optional
import numpy as np
from kernopt.dtype import DType
from kernopt.errors import CompileError, LaunchError, UnsupportedError
from kernopt.renderers import Program, Renderer
from kernopt.renderers.metal import MetalRenderer
from kernopt.runtime import Compiled, np_dtype

class MetalDevice(Compiled):
  """The system default Metal GPU. Kernel parameters are the buffers [[buffer(i)]], then the variables."""
  name = "METAL"

  def __init__(self) -> None:
    ok, reason = self.availability()
    if not ok: raise UnsupportedError(reason)
    import Metal  # type: ignore[import-not-found]
    self.mtl = Metal
    self.device = Metal.MTLCreateSystemDefaultDevice()
    if self.device is None: raise UnsupportedError("Metal: no default GPU device")
    self.queue = self.device.newCommandQueue()
    super().__init__()

  @classmethod
  def availability(cls) -> tuple[bool, str]:
    if sys.platform != "darwin": return False, "Metal needs macOS with PyObjC"
    try: import Metal  # type: ignore[import-not-found]  # noqa: F401
    except ImportError: return False, "Metal needs macOS with PyObjC (pip install pyobjc-framework-Metal)"
    return True, ""

  def _make_renderer(self) -> Renderer: return MetalRenderer()
  def compiler_id(self) -> str: return f"metal | {self.device.name()} | fastMath off"

  # -- memory: shared storage, read and written through its contents pointer --
  def _alloc(self, nbytes: int, dtype: DType) -> Any:
    buf = self.device.newBufferWithLength_options_(max(nbytes, 1), self.mtl.MTLResourceStorageModeShared)
    if buf is None: raise LaunchError(f"Metal: could not allocate {nbytes} bytes")
    return buf

  def _view(self, handle: Any, nbytes: int) -> np.ndarray:
    return np.frombuffer(handle.contents().as_buffer(handle.length()), dtype=np.uint8)[:nbytes]

  def _copyin(self, handle: Any, src: np.ndarray) -> None:
    self._view(handle, src.nbytes)[:] = np.ascontiguousarray(src).reshape(-1).view(np.uint8)
  def _copyout(self, dst: np.ndarray, handle: Any) -> None:
    dst.reshape(-1).view(np.uint8)[:] = self._view(handle, dst.nbytes)

  # -- compile and launch --
  def _compile(self, program: Program) -> Any:
    options = self.mtl.MTLCompileOptions.new()
    options.setFastMathEnabled_(False)
    library, err = self.device.newLibraryWithSource_options_error_(program.src, options, None)
    if library is None: raise CompileError(f"Metal could not compile {program.name}", str(err), program.src)
    fn = library.newFunctionWithName_(program.name)
    if fn is None: raise CompileError(f"{program.name} is not defined by its source", "", program.src)
    pipeline, err = self.device.newComputePipelineStateWithFunction_error_(fn, None)
    if pipeline is None:
      raise CompileError(f"Metal could not build a pipeline for {program.name}", str(err), program.src)
    return pipeline

  def _launch(self, lib: Any, program: Program, handles: list[Any], var_vals: list[int],
              global_size: Optional[tuple[int, ...]], local_size: Optional[tuple[int, ...]],
              wait: bool) -> Optional[float]:
    grid = tuple(global_size or ()) + (1,) * (3 - len(global_size or ()))
    block = tuple(local_size or ()) + (1,) * (3 - len(local_size or ()))
    if block[0] * block[1] * block[2] > lib.maxTotalThreadsPerThreadgroup():
      raise LaunchError(f"{program.name}: {block} is more than {lib.maxTotalThreadsPerThreadgroup()} threads")
    cmd = self.queue.commandBuffer()
    enc = cmd.computeCommandEncoder()
    enc.setComputePipelineState_(lib)
    for i, h in enumerate(handles): enc.setBuffer_offset_atIndex_(h, 0, i)
    for j, (a, v) in enumerate(zip(program.var_args, var_vals)):
      enc.setBytes_length_atIndex_(np_dtype(a.dtype).type(v).tobytes(), a.dtype.itemsize, len(handles) + j)
    enc.dispatchThreadgroups_threadsPerThreadgroup_(self.mtl.MTLSizeMake(*grid), self.mtl.MTLSizeMake(*block))
    enc.endEncoding()
    cmd.commit()
    if not wait: return None
    cmd.waitUntilCompleted()
    if cmd.error() is not None: raise LaunchError(f"{program.name}: Metal reported {cmd.error()}")
    return cmd.GPUEndTime() - cmd.GPUStartTime()

  def synchronize(self) -> None:
    cmd = self.queue.commandBuffer()
    cmd.commit()
    cmd.waitUntilCompleted()

DEVICE_CLASS = MetalDevice
