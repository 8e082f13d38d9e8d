"""The rows of issue 18's reference benchmark: each a tinygrad expression (built from Tensor methods only, so this
module imports no tinygrad and runs in both venvs), its numpy oracle, its inputs (shapes and seeds) and the work it
does (FLOPs for compute-bound rows; distinct bytes read and written for memory-bound ones). Imports only numpy."""
from __future__ import annotations
from dataclasses import dataclass
from typing import Any, Callable, Optional
import numpy as np

F32 = 4

@dataclass(frozen=True)
class Conv:
  """The conv2d of a row, for the im2col yardstick: input (n, cin, h, w), weight (cout, cin // groups, 3, 3)."""
  n: int
  cin: int
  h: int
  w: int
  cout: int
  stride: int = 1
  padding: int = 1
  groups: int = 1

  @property
  def out_hw(self) -> tuple[int, int]:
    return ((self.h + 2 * self.padding - 3) // self.stride + 1, (self.w + 2 * self.padding - 3) // self.stride + 1)

@dataclass(frozen=True)
class Row:
  name: str
  inputs: tuple[tuple[str, tuple[int, ...]], ...]
  tinygrad: Callable[..., Any]     # Tensors in `inputs` order -> Tensor
  numpy: Callable[..., np.ndarray]  # float32 arrays in `inputs` order -> the expected output (computed in float64)
  bound: str                        # "compute" or "memory"
  amount: int                       # FLOPs, or distinct bytes read and written
  conv: Optional[Conv] = None

  def arrays(self, seed: int = 0) -> list[np.ndarray]:
    """The row's inputs: input i is standard normal float32 from numpy's default_rng(seed + i)."""
    return [np.random.default_rng(seed + i).standard_normal(shape, dtype=np.float32)
            for i, (_, shape) in enumerate(self.inputs)]

def conv_numpy(x: np.ndarray, w: np.ndarray, c: Conv) -> np.ndarray:
  """conv2d (cross-correlation, as tinygrad's) by shifted windows, in float64."""
  x = np.pad(x.astype(np.float64), ((0, 0), (0, 0), (c.padding,) * 2, (c.padding,) * 2))
  ho, wo = c.out_hw
  g, cig, cog = c.groups, c.cin // c.groups, c.cout // c.groups
  out = np.zeros((c.n, c.cout, ho, wo))
  for gi in range(g):
    xs, ws = x[:, gi * cig:(gi + 1) * cig], w[gi * cog:(gi + 1) * cog].astype(np.float64)
    for ky in range(3):
      for kx in range(3):
        win = xs[:, :, ky:ky + c.stride * ho:c.stride, kx:kx + c.stride * wo:c.stride]
        out[:, gi * cog:(gi + 1) * cog] += np.einsum("nchw,oc->nohw", win, ws[:, :, ky, kx])
  return out

def _conv_row(name: str, c: Conv) -> Row:
  ho, wo = c.out_hw
  return Row(name, (("x", (c.n, c.cin, c.h, c.w)), ("w", (c.cout, c.cin // c.groups, 3, 3))),
             lambda x, w: x.conv2d(w, padding=c.padding, stride=c.stride, groups=c.groups),
             lambda x, w: conv_numpy(x, w, c), "compute", 2 * c.n * c.cout * ho * wo * (c.cin // c.groups) * 9, c)

def _matmul_row(name: str, m: int, k: int, n: int, batch: int = 0) -> Row:
  lead = (batch,) if batch else ()
  return Row(name, (("a", (*lead, m, k)), ("b", (*lead, k, n))), lambda a, b: a @ b,
             lambda a, b: np.matmul(a.astype(np.float64), b.astype(np.float64)), "compute",
             2 * max(batch, 1) * m * k * n)

def _softmax(x: np.ndarray) -> np.ndarray:
  e = np.exp(x.astype(np.float64) - x.max(-1, keepdims=True))
  return e / e.sum(-1, keepdims=True)

def _layernorm(x: np.ndarray) -> np.ndarray:
  x = x.astype(np.float64)
  return (x - x.mean(-1, keepdims=True)) / np.sqrt(x.var(-1, keepdims=True) + 1e-5)

def _rows(n: int, sm: tuple[int, int], suffix: str = "") -> tuple[Row, ...]:
  """The rows: sum/add/relu_fma over (n, n), softmax / layernorm over sm = (rows, features)."""
  return (
    # softmax / layernorm: bytes are counted per kernel of the reference's schedule (distinct bytes read and written
    # by that kernel); the row's figure is their sum over the sum of the kernel times (amount 0: from the kernels)
    Row(f"sum_axis1{suffix}", (("a", (n, n)),), lambda a: a.sum(axis=1), lambda a: a.astype(np.float64).sum(axis=1),
        "memory", F32 * (n * n + n)),
    Row(f"softmax{suffix}", (("x", sm),), lambda x: x.softmax(-1), _softmax, "memory", 0),
    Row(f"layernorm{suffix}", (("x", sm),), lambda x: x.layernorm(), _layernorm, "memory", 0),
    Row(f"add{suffix}", (("a", (n, n)), ("b", (n, n))), lambda a, b: a + b,
        lambda a, b: a.astype(np.float64) + b, "memory", 3 * F32 * n * n),
    Row(f"relu_fma{suffix}", (("a", (n, n)), ("b", (n, n)), ("c", (n, n))), lambda a, b, c: (a * b + c).relu(),
        lambda a, b, c: np.maximum(a.astype(np.float64) * b + c, 0), "memory", 4 * F32 * n * n),
  )

ROWS: tuple[Row, ...] = (
  _conv_row("conv_64x56", Conv(1, 64, 56, 56, 64)),
  _conv_row("conv_16x32_s1", Conv(8, 16, 32, 32, 32)),
  _conv_row("conv_16x32_s2", Conv(8, 16, 32, 32, 32, stride=2)),
  _conv_row("dwconv_64x56", Conv(1, 64, 56, 56, 64, groups=64)),
  _matmul_row("matmul_1024", 1024, 1024, 1024),
  _matmul_row("matmul_512", 512, 512, 512),
  _matmul_row("matmul_1000x1000x999", 1000, 1000, 999),
  _matmul_row("matmul_64x784x256", 64, 784, 256),
  _matmul_row("matmul_64x256x10", 64, 256, 10),
  _matmul_row("bmm_8x128x64x128", 128, 64, 128, batch=8),
  *_rows(4096, (4096, 1024)),
)
# the same constructions at sizes the tests' independent evaluator (tests/ast_oracle.py) checks in milliseconds: the
# reference schedules them into the same kinds of kernels (padded window views, broadcast matmuls, reduce chains)
SMALL_ROWS: tuple[Row, ...] = (
  _conv_row("conv_small", Conv(1, 8, 12, 12, 8)),
  _conv_row("conv_small_s1", Conv(2, 4, 10, 10, 8)),
  _conv_row("conv_small_s2", Conv(2, 4, 10, 10, 8, stride=2)),
  _conv_row("dwconv_small", Conv(1, 8, 12, 12, 8, groups=8)),
  _matmul_row("matmul_small", 32, 32, 32),
  _matmul_row("matmul_small_odd", 40, 40, 39),
  _matmul_row("matmul_small_mlp", 16, 49, 32),
  _matmul_row("bmm_small", 16, 8, 16, batch=2),
  *_rows(64, (64, 48), "_small"),
)
BY_NAME = {r.name: r for r in ROWS + SMALL_ROWS}
