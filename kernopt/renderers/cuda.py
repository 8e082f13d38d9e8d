"""The CUDA C dialect."""
from __future__ import annotations
from kernopt.dtype import dtypes
from kernopt.errors import UnsupportedError
from kernopt.renderers import TensorCore
from kernopt.renderers.cstyle import CStyleLanguage

CUDA_TENSOR_CORES = tuple(TensorCore(dims=(8, 16, 16), dtype_in=di, dtype_out=dtypes.float,
                                     threads=((0, 2), (0, 2), (1, 2), (1, 2), (0, 2)),
                                     thread_local_sizes=((2, 2, 2), (2, 2), (2, 2)))
                          for di in (dtypes.half, dtypes.bfloat16))

class CUDARenderer(CStyleLanguage):
  device = "CUDA"
  global_max = (2147483647, 65535, 65535)
  local_max = (1024, 1024, 64)
  max_local_size = 1024
  shared_max = 49152

  def __init__(self, arch: str = "sm_80"):
    if not arch.startswith("sm_") or not arch[3:].isdigit():
      raise UnsupportedError(f"CUDA arch must look like 'sm_80', got {arch!r}")
    self.arch = arch
    self.tensor_cores = CUDA_TENSOR_CORES if int(arch[3:]) >= 80 else ()

  def capabilities(self) -> dict:
    return {**super().capabilities(), "arch": self.arch}
