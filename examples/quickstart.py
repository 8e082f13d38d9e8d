"""kernopt's main example: build a matmul, a row sum and a row mean plus bias the way a framework would (with the
`kernopt.ast` builders, docs/ast.md), optimize each by the standard protocol, show the kernel kernopt writes, run it
on the CPU and check it against numpy."""
import time
import numpy as np
from kernopt import Buffer, Device, Kernel, LazyOp, dtypes
from kernopt import ast as A

def matmul_ast(m: int, n: int, k: int) -> LazyOp:
  """out[m, n] = sum_k a[m, k] * b[k, n], as a reduce over the last axis of an (m, n, k) iteration space."""
  a = A.expand(A.reshape(A.load(1, dtypes.float, (m, k)), (m, 1, k)), (m, n, k))
  b = A.expand(A.reshape(A.permute(A.load(2, dtypes.float, (k, n)), (1, 0)), (1, n, k)), (m, n, k))
  return A.kernel(A.store(0, A.sum(A.mul(a, b), 2)))   # the reduce keeps its axis: out is (m, n, 1)

def rowsum_ast(m: int, n: int) -> LazyOp:
  """out[m] = sum_n x[m, n]."""
  return A.kernel(A.store(0, A.sum(A.load(1, dtypes.float, (m, n)), 1)))

def rowmean_bias_ast(m: int, n: int) -> LazyOp:
  """out[m, 0] = mean_n x[m, n] + bias[m, 0]: after a reduce, operands come at its keep-dims shape (m, 1)."""
  mean = A.mul(A.sum(A.load(1, dtypes.float, (m, n)), 1), 1.0 / n)
  return A.kernel(A.store(0, A.add(mean, A.load(2, dtypes.float, (m, 1)))))

def run(name: str, ast: LazyOp, inputs: list, expected: np.ndarray, flops: int, nbytes: int) -> None:
  device = Device["CPU"]
  st = time.perf_counter()
  k = Kernel(ast, opts=device.renderer).required_optimizations()
  if not k.apply_tensor_cores(): k.hand_coded_optimizations()
  program = k.to_program()
  codegen_ms = (time.perf_counter() - st) * 1e3
  print(f"=== {name}: kernel {program.name}, codegen {codegen_ms:.1f} ms")
  print("applied opts:", ", ".join(f"{o.op.name}(axis={o.axis}, amt={o.amt})" for o in k.applied_opts) or "none")
  print(program.src)
  runner = device.compile(program)
  out = Buffer("CPU", expected.size, dtypes.float)
  bufs = [out] + [Buffer("CPU", x.size, dtypes.float).copyin(x) for x in inputs]
  times = [runner(*bufs, wait=True) for _ in range(5)]
  np.testing.assert_allclose(out.numpy().reshape(expected.shape), expected, rtol=1e-4, atol=1e-4)
  best = min(times)
  print("first outputs:", np.round(out.numpy()[:4], 4), "numpy:", np.round(expected.reshape(-1)[:4], 4))
  print(f"matches numpy; {best * 1e3:.3f} ms, {flops / best * 1e-9:.2f} GFLOP/s, {nbytes / best * 1e-9:.2f} GB/s\n")

if __name__ == "__main__":
  rng = np.random.default_rng(0)
  a, b = rng.standard_normal((256, 256), dtype=np.float32), rng.standard_normal((256, 256), dtype=np.float32)
  run("matmul 256x256x256", matmul_ast(256, 256, 256), [a, b], a @ b, 2 * 256 ** 3, 3 * 256 * 256 * 4)
  x = rng.standard_normal((1024, 1024), dtype=np.float32)
  run("sum(axis=1) of 1024x1024", rowsum_ast(1024, 1024), [x], x.sum(axis=1), 1024 * 1024, (1024 * 1024 + 1024) * 4)
  bias = rng.standard_normal((1024, 1), dtype=np.float32)
  run("mean(axis=1) + bias of 1024x1024", rowmean_bias_ast(1024, 1024), [x, bias], x.mean(1, keepdims=True) + bias,
      1024 * 1024 + 2 * 1024, (1024 * 1024 + 2 * 1024) * 4)
