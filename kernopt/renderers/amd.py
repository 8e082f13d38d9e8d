"""The AMD HIP dialect (RDNA3 WMMA)."""
from __future__ import annotations
from kernopt.dtype import dtypes
from kernopt.renderers import TensorCore
from kernopt.renderers.cstyle import CStyleLanguage

AMD_TENSOR_CORES = tuple(TensorCore(dims=(16, 16, 16), dtype_in=di, dtype_out=do,
                                    threads=((0, 8), (0, 2), (1, 2)), thread_local_sizes=((16,), (16,), (4, 2)))
                         for di, do in ((dtypes.half, dtypes.float), (dtypes.half, dtypes.half)))

class AMDRenderer(CStyleLanguage):
  device = "AMD"
  shared_max = 65536
  tensor_cores = AMD_TENSOR_CORES
