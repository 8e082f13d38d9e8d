"""The PYTHON device's tensor cores: each vendor's fragment layout, (lane, element) -> (row, col) of the warp's
matrix, and `wmma_warps`, the warp-wide multiply-accumulate computed from the fragments as the hardware lays them
out. Imports dtype, errors and runtime."""
from __future__ import annotations
from dataclasses import dataclass
from typing import Callable, Optional
import numpy as np
from kernopt.dtype import DType, dtypes
from kernopt.errors import UnsupportedError
from kernopt.runtime.python_alu import EmulationError, reg_dtype, round_bf16, to_reg

# D(M x N) = A(M x K) @ B(K x N) + C(M x N); a TensorCore's dims are (N, M, K).

def cuda_a_elem(lane: int, i: int) -> tuple[int, int]:
  """mma.m16n8k16 A (16x16, row major), 8 halves a0..a7 per thread (PTX ISA, mma.m16n8k16 fragment figures)."""
  group, tig = lane >> 2, lane % 4
  return group + 8 * ((i >> 1) & 1), tig * 2 + (i & 1) + 8 * (i >> 2)

def cuda_b_elem(lane: int, i: int) -> tuple[int, int]:
  """mma.m16n8k16 B (16x8, column major), 4 halves b0..b3 per thread."""
  group, tig = lane >> 2, lane % 4
  return tig * 2 + (i & 1) + 8 * (i >> 1), group

def cuda_c_elem(lane: int, i: int) -> tuple[int, int]:
  """mma.m16n8k16 C and D (16x8), 4 floats c0..c3 per thread."""
  group, tig = lane >> 2, lane % 4
  return group + 8 * (i >> 1), tig * 2 + (i & 1)

def metal_elem(lane: int, i: int) -> tuple[int, int]:
  """simdgroup_matrix 8x8, 2 elements per thread, the same for A, B, C and D. Apple publishes no per-thread layout:
  this is the one the spec's Metal tensor-core permutations (and tinygrad's emulator) assume, rows in quads of
  lanes (lane//2)%4 + 4*(lane//16), column pairs 2*(lane%2) + 4*((lane//8)%2)."""
  return (lane // 2) % 4 + 4 * (lane // 16), i + 2 * (lane % 2) + 4 * ((lane // 8) % 2)

def amd_a_elem(lane: int, i: int) -> tuple[int, int]:
  """v_wmma_f32_16x16x16_f16 (wave32) A: lane l holds row l%16, all 16 K values; lanes 16-31 replicate 0-15."""
  return lane % 16, i

def amd_b_elem(lane: int, i: int) -> tuple[int, int]:
  """v_wmma (wave32) B: lane l holds column l%16, all 16 K values; lanes 16-31 replicate 0-15."""
  return i, lane % 16

def amd_c_elem(lane: int, i: int) -> tuple[int, int]:
  """v_wmma_f32_16x16x16 (wave32) C and D: 8 floats per lane, element j of lane l at row 2j + l//16, column l%16."""
  return 2 * i + lane // 16, lane % 16

@dataclass(frozen=True)
class WMMALayout:
  """A vendor's warp-wide multiply: matrix sizes (M, N, K), fragment sizes and element maps of A, B and C/D."""
  mnk: tuple[int, int, int]
  sizes: tuple[int, int, int]
  a: Callable[[int, int], tuple[int, int]]
  b: Callable[[int, int], tuple[int, int]]
  c: Callable[[int, int], tuple[int, int]]
  replicated: bool = False   # AMD wave32: lanes 16-31 must hold the same A and B as lanes 0-15
  warp: int = 32

  def index(self, which: int) -> tuple[np.ndarray, np.ndarray]:
    """Row and column of every (lane, element) of operand `which` (0: A, 1: B, 2: C/D), lane-major."""
    fn, n = (self.a, self.b, self.c)[which], self.sizes[which]
    rc = np.array([fn(lane, i) for lane in range(self.warp) for i in range(n)], dtype=np.int64)
    return rc[:, 0], rc[:, 1]

WMMA_LAYOUTS: dict[str, WMMALayout] = {
  "CUDA": WMMALayout((16, 8, 16), (8, 4, 4), cuda_a_elem, cuda_b_elem, cuda_c_elem),
  "METAL": WMMALayout((8, 8, 8), (2, 2, 2), metal_elem, metal_elem, metal_elem),
  "AMD": WMMALayout((16, 16, 16), (16, 16, 8), amd_a_elem, amd_b_elem, amd_c_elem, replicated=True),
}

def _round_in(x: np.ndarray, dt: DType) -> np.ndarray:
  if dt.scalar() == dtypes.bfloat16: return round_bf16(x)
  return np.asarray(x).astype(reg_dtype(dt)).astype(np.float32)

def wmma_warps(device: str, a: np.ndarray, b: np.ndarray, c: np.ndarray, dtype_in: DType, dtype_out: DType,
               dims: Optional[tuple[int, int, int]] = None) -> np.ndarray:
  """D fragments (W, 32, nc) of D = A @ B + C for W warps, given each lane's fragments a (W, 32, na), b, c laid out as
  WMMA_LAYOUTS[device] says; the product is computed in float32 from inputs rounded to dtype_in."""
  lay = WMMA_LAYOUTS.get(device)
  if lay is None: raise UnsupportedError(f"no tensor-core layout for device {device!r}; known: {sorted(WMMA_LAYOUTS)}")
  m, n, k = lay.mnk
  if dims is not None and tuple(dims) != (n, m, k):
    raise UnsupportedError(f"{device} WMMA emulates dims (N, M, K) = {(n, m, k)}, the kernel asks {tuple(dims)}")
  for name, x, sz in (("A", a, lay.sizes[0]), ("B", b, lay.sizes[1]), ("C", c, lay.sizes[2])):
    if x.ndim != 3 or x.shape[1:] != (lay.warp, sz):
      raise EmulationError(f"{device} WMMA wants {name} fragments of {sz} elements on {lay.warp} lanes, got {x.shape}")
  w = a.shape[0]
  if lay.replicated:
    for name, x in (("A", a), ("B", b)):
      if not np.array_equal(x[:, :16], x[:, 16:], equal_nan=True):
        raise EmulationError(f"{device} WMMA: lanes 16-31 must replicate lanes 0-15 of {name}")
  mats = []
  for which, (x, shape) in enumerate(((a, (m, k)), (b, (k, n)), (c, (m, n)))):
    rows, cols = lay.index(which)
    mat = np.zeros((w,) + shape, dtype=np.float32)
    mat[:, rows, cols] = _round_in(x, dtype_in if which < 2 else dtype_out).reshape(w, -1)
    mats.append(mat)
  d = np.matmul(mats[0], mats[1]) + mats[2]
  rows, cols = lay.index(2)
  return to_reg(d[:, rows, cols].reshape(w, lay.warp, lay.sizes[2]), dtype_out)
