"""Parallel launch on the CPU device: the same kernels (native heuristics) run serially, with OpenMP (static and
dynamic schedules) and with the pthread pool, interleaved in one process; median and 10th-90th percentile of the
launch time. Usage: python3 benchmarks/bench_cpu_threads.py [--threads N] [--repeats N]"""
from __future__ import annotations
import argparse
import os
import statistics
import sys
from dataclasses import replace

sys.path[:0] = [os.path.join(os.path.dirname(os.path.abspath(__file__)), p) for p in ("..", "../tests")]
import numpy as np  # noqa: E402
from catalogue import _matmul_ast, alu, buf, kernel, store  # noqa: E402
from kernopt.dtype import dtypes  # noqa: E402
from kernopt.kernel import Kernel  # noqa: E402
from kernopt.ops import BinaryOps  # noqa: E402
from kernopt.runtime import Buffer, Device  # noqa: E402

def add_ast(n: int):
  return kernel(store(alu(BinaryOps.ADD, buf(1, (n,)), buf(2, (n,)))))

def main() -> None:
  ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  ap.add_argument("--threads", type=int, default=2)
  ap.add_argument("--repeats", type=int, default=41)
  a = ap.parse_args()
  work = {"add 64K": (add_ast(1 << 16), 1 << 16), "add 1M": (add_ast(1 << 20), 1 << 20),
          "matmul 256^3": (_matmul_ast(256, 256, 256), 256 * 256),
          "matmul 512^3": (_matmul_ast(512, 512, 512), 512 * 512)}
  t = a.threads
  modes = [("serial", dict(threads=1), None), ("omp static", dict(threads=t, parallel="openmp"), "static"),
           ("omp dynamic", dict(threads=t, parallel="openmp"), "dynamic"),
           ("pthread", dict(threads=t, parallel="pthread"), None)]
  print(f"{t} threads; median [10th-90th percentile] of {a.repeats} interleaved launches; small kernels forced "
        "parallel")
  for name, (ast, size) in work.items():
    runners = []
    for label, opts, schedule in modes:
      dev = Device.open("CPU", min_parallel_work=0, **opts)
      if schedule is not None: dev.renderer.caps = replace(dev.renderer.caps, schedule=schedule)
      k = Kernel(ast, opts=dev.renderer).required_optimizations().hand_coded_optimizations()
      bufs = [Buffer("CPU", size, dtypes.float32).copyin(np.random.rand(size).astype(np.float32)) for _ in range(3)]
      runners.append((label, dev.compile(k.to_program()), bufs))
    times: dict[str, list[float]] = {label: [] for label, _, _ in runners}
    for _ in range(a.repeats):
      for label, runner, bufs in runners: times[label].append(runner(*bufs, wait=True))
    def fmt(v: list[float]) -> str:
      q = statistics.quantiles(v, n=10)
      return f"{1e6 * statistics.median(v):8.0f} us [{1e6 * q[0]:.0f}-{1e6 * q[-1]:.0f}]"
    print(f"{name:13s} " + "  ".join(f"{label}: {fmt(v)}" for label, v in times.items()), flush=True)

if __name__ == "__main__":
  main()
