"""Launch latency through the CPU device's pthread pool: a 1M-element float add on 2 threads, launched back to back
and with 50 us of busy Python between launches (a framework's gaps), in a fresh process whose pool has 1 worker and
in one whose pool an 8-thread launch grew first (more threads than a small host's CPUs: its workers must not spin).
The yardstick is the same add on 1 thread (no pool), in the same process. Each (pool, gap) row is measured in its own
process, the rows alternated round by round; medians of the per-round median, p90 and p99.
Usage: python3 benchmarks/bench_pool.py [--rounds N] [--launches N]"""
from __future__ import annotations
import argparse
import json
import os
import statistics
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

CHILD = r'''
import json, sys, time
import numpy as np
from kernopt import ast as A
from kernopt.dtype import dtypes
from kernopt.kernel import Kernel
from kernopt.runtime import Buffer, Device
grow, gap, launches = sys.argv[1] == "grown", float(sys.argv[2]), int(sys.argv[3])
def build(threads, n):
  d = Device.open("CPU", threads=threads, parallel="pthread", min_parallel_work=0)
  ast = A.kernel(A.store(0, A.add(A.load(1, dtypes.float, (n,)), 1.0)))
  run = d.compile(Kernel(ast, opts=d.renderer).hand_coded_optimizations().to_program())
  x = np.arange(n, dtype=np.float32)
  xb, out = Buffer(d, n, dtypes.float).copyin(x), Buffer(d, n, dtypes.float)
  run(out, xb, wait=True)
  assert np.array_equal(out.numpy(), x + 1)
  return lambda: run(out, xb, wait=True)
two, one = build(2, 1 << 20), build(1, 1 << 20)
if grow: build(8, 64)()
res = {}
for name, go in (("2 threads", two), ("1 thread", one)):
  ts = []
  for _ in range(launches):
    t0 = time.perf_counter(); go(); ts.append(time.perf_counter() - t0)
    end = time.perf_counter() + gap
    while time.perf_counter() < end: pass
  q = np.percentile(np.array(ts) * 1e6, [50, 90, 99])
  res[name] = [float(v) for v in q]
print(json.dumps(res))
'''

def main() -> None:
  ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
  ap.add_argument("--rounds", type=int, default=3)
  ap.add_argument("--launches", type=int, default=2000)
  a = ap.parse_args()
  env = {**os.environ, "PYTHONPATH": os.pathsep.join([ROOT, os.environ.get("PYTHONPATH", "")])}
  cases = [(pool, gap) for pool in ("fresh", "grown") for gap in (0.0, 50e-6)]
  got: dict[tuple[str, float], list[dict]] = {c: [] for c in cases}
  for _ in range(a.rounds):
    for pool, gap in cases:
      out = subprocess.run([sys.executable, "-c", CHILD, pool, str(gap), str(a.launches)], env=env, check=True,
                           capture_output=True, text=True).stdout
      got[(pool, gap)].append(json.loads(out))
  print(f"host CPUs {os.cpu_count()}; {a.launches} launches per row and round, medians of {a.rounds} rounds (us)")
  print(f"{'pool':6s} {'gap':>6s}  {'2T med':>7s} {'p90':>6s} {'p99':>6s}   {'1T med':>7s} {'p90':>6s} {'p99':>6s}")
  for pool, gap in cases:
    rs = got[(pool, gap)]
    med = lambda k, i: statistics.median(r[k][i] for r in rs)  # noqa: E731
    print(f"{pool:6s} {gap * 1e6:4.0f}us  {med('2 threads', 0):7.1f} {med('2 threads', 1):6.1f} "
          f"{med('2 threads', 2):6.1f}   {med('1 thread', 0):7.1f} {med('1 thread', 1):6.1f} {med('1 thread', 2):6.1f}")

if __name__ == "__main__":
  main()
