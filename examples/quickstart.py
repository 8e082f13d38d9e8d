"""kernopt's main example: build a matmul and a row-sum AST the way a framework would, optimize each by the
standard protocol, show the kernel kernopt writes, run it on the CPU and check it against numpy."""
import time
import numpy as np
from kernopt import dtypes
from kernopt.kernel import Kernel
from kernopt.ops import BufferOps, BinaryOps, LazyOp, MemBuffer, MetaOps, ReduceOps
from kernopt.runtime import Buffer, Device
from kernopt.shape.shapetracker import ShapeTracker

def load(idx: int, st: ShapeTracker) -> LazyOp: return LazyOp(BufferOps.LOAD, (), MemBuffer(idx, dtypes.float, st))
def store(value: LazyOp, shape: tuple) -> LazyOp:
  return LazyOp(BufferOps.STORE, (value,), MemBuffer(0, dtypes.float, ShapeTracker.from_shape(shape)))

def matmul_ast(m: int, n: int, k: int) -> LazyOp:
  """out[m, n] = sum_k a[m, k] * b[k, n], as a reduce over the last axis of an (m, n, k) iteration space."""
  a = ShapeTracker.from_shape((m, k)).reshape((m, 1, k)).expand((m, n, k))
  b = ShapeTracker.from_shape((k, n)).permute((1, 0)).reshape((1, n, k)).expand((m, n, k))
  mul = LazyOp(BinaryOps.MUL, (load(1, a), load(2, b)))
  return LazyOp(MetaOps.KERNEL, (store(LazyOp(ReduceOps.SUM, (mul,), (2,)), (m, n, 1)),))

def rowsum_ast(m: int, n: int) -> LazyOp:
  """out[m] = sum_n x[m, n]."""
  x = load(1, ShapeTracker.from_shape((m, n)))
  return LazyOp(MetaOps.KERNEL, (store(LazyOp(ReduceOps.SUM, (x,), (1,)), (m, 1)),))

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
  print(f"matches numpy; {best * 1e3:.3f} ms, {flops / best * 1e-9:.2f} GFLOP/s, {nbytes / best * 1e-9:.2f} GB/s\n")

if __name__ == "__main__":
  rng = np.random.default_rng(0)
  a, b = rng.standard_normal((256, 256), dtype=np.float32), rng.standard_normal((256, 256), dtype=np.float32)
  run("matmul 256x256x256", matmul_ast(256, 256, 256), [a, b], a @ b, 2 * 256 ** 3, 3 * 256 * 256 * 4)
  x = rng.standard_normal((1024, 1024), dtype=np.float32)
  run("sum(axis=1) of 1024x1024", rowsum_ast(1024, 1024), [x], x.sum(axis=1), 1024 * 1024, (1024 * 1024 + 1024) * 4)
