"""Codegen latency: Kernel(ast) + the standard protocol for every catalogue AST (large scale), cold (a freshly built
AST each repeat) and warm (the same AST object again), then linearize + render when the lowerer is present.
Prints the median over repeats in milliseconds. Usage: python3 benchmarks/bench_codegen.py [repeats] [dialect...]"""
from __future__ import annotations
import os
import statistics
import sys
import time
from typing import Any, Callable

sys.path[:0] = [os.path.join(os.path.dirname(os.path.abspath(__file__)), p) for p in ("..", "../tests")]
from kernopt.kernel import Kernel  # noqa: E402
from kernopt.renderers import get_renderer  # noqa: E402

def optimize(ast: Any, dialect: str) -> Kernel:
  k = Kernel(ast, opts=get_renderer(dialect)).required_optimizations()
  if not k.apply_tensor_cores(): k.hand_coded_optimizations()
  return k

def median_ms(fn: Callable[[], Any], setup: Callable[[], Any], repeats: int) -> float:
  times = []
  for _ in range(repeats):
    arg = setup()
    t0 = time.perf_counter()
    fn(arg)
    times.append(time.perf_counter() - t0)
  return 1e3 * statistics.median(times)

def cases() -> tuple[list[str], Callable[[str], Any]]:
  """Case names and a builder giving a fresh AST object for a name."""
  try:
    import catalogue
  except ImportError:
    sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "../tests"))
    import test_kernel as tk
    own = {"add": tk.ew_add, "bcast_add": tk.bcast_add, "sum_all": tk.sum_all, "matvec": tk.matvec,
           "matmul_1024": lambda: tk.matmul(1024, 1024, 1024), "sym_add": tk.sym_add}
    return list(own), lambda n: own[n]()
  def fresh(name: str) -> Any:
    catalogue._build.cache_clear()
    return catalogue.get(name, "large").ast
  return [c.name for c in catalogue.catalogue("large")], fresh

def main() -> None:
  repeats = int(sys.argv[1]) if len(sys.argv) > 1 else 7
  dialects = sys.argv[2:] or ["CPU", "OPENCL", "CUDA"]
  names, fresh = cases()
  print(f"{'case':16s} {'dialect':7s} {'cold ms':>8s} {'warm ms':>8s} {'lin+render ms':>14s}  kernel")
  cold_all, warm_all = [], []
  for name in names:
    for d in dialects:
      cold = median_ms(lambda ast: optimize(ast, d), lambda: fresh(name), repeats)
      ast = fresh(name)
      warm = median_ms(lambda ast: optimize(ast, d), lambda: ast, repeats)
      cold_all.append(cold)
      warm_all.append(warm)
      k = optimize(ast, d)
      try:
        lin = f"{median_ms(lambda k: k.copy().to_program(), lambda: k, repeats):14.2f}"
      except Exception as e:  # the lowerer or this dialect's renderer may not handle it yet
        lin = f"{type(e).__name__:>14s}"
      print(f"{name:16s} {d:7s} {cold:8.2f} {warm:8.2f} {lin}  {k!r}")
  print(f"median over all: cold {statistics.median(cold_all):.2f} ms, warm {statistics.median(warm_all):.2f} ms")

if __name__ == "__main__":
  main()
