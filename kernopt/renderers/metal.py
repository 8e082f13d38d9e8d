"""The Metal Shading Language dialect."""
from __future__ import annotations
from kernopt.dtype import dtypes
from kernopt.renderers import TensorCore
from kernopt.renderers.cstyle import CStyleLanguage

METAL_TENSOR_CORES = tuple(TensorCore(dims=(8, 8, 8), dtype_in=di, dtype_out=do,
                                      threads=((0, 2), (1, 4), (0, 2), (1, 2)), thread_local_sizes=((2,), (2,), (2,)))
                           for di, do in ((dtypes.float, dtypes.float), (dtypes.half, dtypes.float),
                                          (dtypes.half, dtypes.half)))

class MetalRenderer(CStyleLanguage):
  device = "METAL"
  tensor_cores = METAL_TENSOR_CORES
