"""Benchmark workloads: float32 kernel ASTs at realistic sizes, each with a numpy reference, its flop count and the
bytes it must move (every buffer once). `Workload.build()` makes fresh AST objects on every call (cold codegen).
Built with the catalogue's DSL (tests/catalogue.py)."""
from __future__ import annotations
import os
import sys
from dataclasses import dataclass
from typing import Callable

sys.path[:0] = [os.path.join(os.path.dirname(os.path.abspath(__file__)), p) for p in ("..", "../tests")]
import numpy as np  # noqa: E402
from catalogue import alu, buf, const, conv2d_ast, kernel, reduce, store, view  # noqa: E402
from kernopt.ops import BinaryOps, LazyOp, ReduceOps  # noqa: E402

@dataclass(frozen=True)
class Workload:
  """`buffers`: (idx, numel) of every float32 buffer, output first; `inputs(rng)` {idx: array}; `reference(inputs)`
  the flat output; `bound`: "memory" or "compute" (which roofline the figure is compared with)."""
  name: str
  desc: str
  build: Callable[[], LazyOp]
  buffers: tuple[tuple[int, int], ...]
  inputs: Callable[[np.random.Generator], dict[int, np.ndarray]]
  reference: Callable[[dict[int, np.ndarray]], np.ndarray]
  flops: int
  bytes: int
  bound: str
  tol: float = 1e-4

def _rand(rng: np.random.Generator, *shape: int) -> np.ndarray:
  return rng.standard_normal(shape, dtype=np.float32)

def _nbytes(*numels: int) -> int: return 4 * sum(numels)

def add(n: int = 4096) -> Workload:
  shp = (n, n)
  return Workload("W1", f"a+b {n}x{n}", lambda: kernel(store(alu(BinaryOps.ADD, buf(1, shp), buf(2, shp)))),
                  ((0, n * n), (1, n * n), (2, n * n)), lambda r: {1: _rand(r, n, n), 2: _rand(r, n, n)},
                  lambda x: (x[1] + x[2]).reshape(-1), n * n, _nbytes(n * n, n * n, n * n), "memory")

def row_sum(n: int = 4096) -> Workload:
  shp = (n, n)
  return Workload("W2", f"sum(axis=1) {n}x{n}", lambda: kernel(store(reduce(ReduceOps.SUM, buf(1, shp), (1,)))),
                  ((0, n), (1, n * n)), lambda r: {1: _rand(r, n, n)}, lambda x: x[1].sum(axis=1),
                  n * n, _nbytes(n, n * n), "memory", tol=1e-3)

def _matmul_ast(M: int, N: int, K: int) -> LazyOp:
  """out[m, n] = sum_k A[m, k] B[k, n] over the full shape (M, N, K)."""
  a = buf(1, (M, N, K), st=view((M, N, K), (K, 0, 1)))
  b = buf(2, (M, N, K), st=view((M, N, K), (0, 1, N)))
  return kernel(store(reduce(ReduceOps.SUM, alu(BinaryOps.MUL, a, b), (2,))))

def matmul(name: str, M: int, N: int, K: int) -> Workload:
  return Workload(name, f"matmul {M}x{K} @ {K}x{N}", lambda: _matmul_ast(M, N, K),
                  ((0, M * N), (1, M * K), (2, K * N)), lambda r: {1: _rand(r, M, K), 2: _rand(r, K, N)},
                  lambda x: (x[1] @ x[2]).reshape(-1), 2 * M * N * K, _nbytes(M * N, M * K, K * N), "compute", tol=1e-3)

_conv_ast = conv2d_ast   # 3x3, padding 1 (tests/catalogue.py)

def _conv_ref(x: dict[int, np.ndarray], N: int, CI: int, H: int, W: int, CO: int) -> np.ndarray:
  xp = np.pad(x[1], ((0, 0), (0, 0), (1, 1), (1, 1)))
  # im2col: (N, H, W, CI*9) @ (CI*9, CO)
  cols = np.stack([xp[:, :, ky:ky + H, kx:kx + W] for ky in range(3) for kx in range(3)], axis=2)  # N CI 9 H W
  cols = cols.reshape(N, CI * 9, H * W).transpose(0, 2, 1)
  out = cols @ x[2].reshape(CO, CI * 9).T  # N, H*W, CO
  return out.transpose(0, 2, 1).reshape(-1)

def conv2d(N: int = 1, CI: int = 64, H: int = 56, W: int = 56, CO: int = 64) -> Workload:
  return Workload("W5", f"conv2d N={N} Cin={CI} {H}x{W} Cout={CO} 3x3 pad1", lambda: _conv_ast(N, CI, H, W, CO),
                  ((0, N * CO * H * W), (1, N * CI * H * W), (2, CO * CI * 9)),
                  lambda r: {1: _rand(r, N, CI, H, W), 2: _rand(r, CO, CI, 3, 3)},
                  lambda x: _conv_ref(x, N, CI, H, W, CO), 2 * N * CO * H * W * CI * 9,
                  _nbytes(N * CO * H * W, N * CI * H * W, CO * CI * 9), "compute", tol=1e-3)

def relu_fma(n: int = 4096) -> Workload:
  shp = (n, n)
  def build() -> LazyOp:
    x = alu(BinaryOps.ADD, alu(BinaryOps.MUL, buf(1, shp), buf(2, shp)), buf(3, shp))
    return kernel(store(alu(BinaryOps.MAX, x, const(0.0, shp))))
  def ref(x: dict[int, np.ndarray]) -> np.ndarray:
    out = np.multiply(x[1], x[2])
    np.add(out, x[3], out=out)
    return np.maximum(out, np.float32(0), out=out).reshape(-1)
  return Workload("W7", f"relu(a*b+c) {n}x{n}", build, ((0, n * n), (1, n * n), (2, n * n), (3, n * n)),
                  lambda r: {1: _rand(r, n, n), 2: _rand(r, n, n), 3: _rand(r, n, n)}, ref, 3 * n * n,
                  _nbytes(*(4 * (n * n,))), "memory")

def workloads() -> dict[str, Workload]:
  """Every workload by name (W1, W2, W4, W5, W6, W7)."""
  ws = [add(), row_sum(), matmul("W4", 1024, 1024, 1024), conv2d(), matmul("W6", 512, 512, 512), relu_fma()]
  return {w.name: w for w in ws}
