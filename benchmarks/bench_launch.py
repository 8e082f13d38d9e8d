"""Launch overhead on the JIT's hot path: a tiny elementwise kernel (16 floats, static C profile on the CPU device),
with int shapes and with a symbolic n, called through the runner (every argument and bounds check), through a runner
without the address-range checks, and straight through the device's `_launch` (the yardstick: no checks),
interleaved; medians over rounds of many launches. (With int shapes, a launch with the very Buffers of the runner's
last checked launch skips the checks: that is the JIT's replay, and what the "int shape" row times.)
Usage: python3 benchmarks/bench_launch.py [--rounds N] [--launches N]"""
from __future__ import annotations
import argparse
import os
import statistics
import sys
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
import numpy as np  # noqa: E402
from kernopt import ast as A, dtypes  # noqa: E402
from kernopt.kernel import Kernel  # noqa: E402
from kernopt.renderers import get_renderer  # noqa: E402
from kernopt.runtime import Buffer, Device  # noqa: E402
from kernopt.shape.symbolic import Variable  # noqa: E402

def runner_for(shape):
  f = dtypes.float
  ast = A.kernel(A.store(0, A.add(A.load(1, f, shape), A.load(2, f, shape))))
  return Device["CPU"].compile(Kernel(ast, opts=get_renderer("CPU")).to_program())

def per_launch_us(fn, launches: int) -> float:
  t0 = time.perf_counter()
  for _ in range(launches): fn()
  return (time.perf_counter() - t0) / launches * 1e6

def main() -> None:
  ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  ap.add_argument("--rounds", type=int, default=21)
  ap.add_argument("--launches", type=int, default=2000)
  a = ap.parse_args()
  n = 16
  v = Variable("n", 1, 4096)
  cases = {"int shape": (runner_for((n,)), {}), "symbolic n": (runner_for((v,)), {"n": n})}
  fns = {}
  for name, (run, vv) in cases.items():
    # buffers as large as n's maximum, so that the same call passes both with and without launch-time bounds
    bufs = [Buffer("CPU", v.max, dtypes.float).copyin(np.arange(v.max, dtype=np.float32)) for _ in range(3)]
    vals = run._check(tuple(bufs), vv)
    handles = [b._arg for arg, b in zip(run.program.args, bufs) if arg.used]
    ordered = [vals[x] for x in run.program.vars]
    fns[f"{name}: runner"] = lambda run=run, vv=vv, b=bufs: run(*b, var_vals=vv)
    bare = type(run)(run.device, run.program, run.lib)
    bare._bounds, bare._plan = {}, tuple((x, None) for x in run.program.args)   # every check but the address ranges
    fns[f"{name}: no bounds"] = lambda run=bare, vv=vv, b=bufs: run(*b, var_vals=vv)
    fns[f"{name}: _launch"] = lambda run=run, h=handles, o=ordered: run.device._launch(run.lib, run.program, h, o,
                                                                                        None, None, False)
  times: dict[str, list[float]] = {k: [] for k in fns}
  for _ in range(a.rounds):
    for k, fn in fns.items(): times[k].append(per_launch_us(fn, a.launches))
  print(f"median over {a.rounds} rounds of {a.launches} launches, microseconds per launch")
  for name in cases:
    run, nob, raw = (statistics.median(times[f"{name}: {k}"]) for k in ("runner", "no bounds", "_launch"))
    print(f"{name:12s} runner {run:7.2f}  without bounds checks {nob:7.2f}  _launch {raw:7.2f}  "
          f"bounds {run - nob:5.2f}  all checks {run - raw:6.2f}  runner/_launch {run / raw:5.2f}")

if __name__ == "__main__":
  main()
