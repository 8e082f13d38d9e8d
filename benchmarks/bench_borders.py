"""Padded loads versioned into an interior copy (kernopt/passes/borders.py) against the same kernels with masked loads
everywhere, on the reference's own conv ASTs (benchmarks/asts/reference/), with numpy's im2col + sgemm (1 BLAS thread)
as the yardstick: within each round every row runs kernopt unversioned, kernopt versioned and numpy back to back, and
the table shows medians over rounds of the within-round ratios. Both kernopt kernels are checked against the
reference's outputs first (and are bit-identical by construction).
  python benchmarks/bench_borders.py [--rows conv_64x56,dwconv_64x56] [--rounds 5] [--repeats 7] [--threads 1]
                                     [--width W]"""
from __future__ import annotations
import argparse
import os
import statistics
import sys
from dataclasses import replace
HERE = os.path.dirname(os.path.abspath(__file__))
sys.path[:0] = [os.path.join(HERE, "reference"), os.path.join(HERE, "..")]
from threadpoolctl import threadpool_limits  # noqa: E402
from kernopt_rows import RowProgram, check_reference, row_inputs  # noqa: E402
from rows import BY_NAME  # noqa: E402
from translate import load_rows  # noqa: E402
from vs_reference_cpu import median_time, numpy_baseline  # noqa: E402
from kernopt.runtime import Device  # noqa: E402

ROWS = ("conv_64x56", "conv_16x32_s1", "conv_16x32_s2", "dwconv_64x56")

def main() -> None:
  ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
  ap.add_argument("--rows", default=",".join(ROWS))
  ap.add_argument("--rounds", type=int, default=5)
  ap.add_argument("--repeats", type=int, default=7)
  ap.add_argument("--threads", type=int, default=1)
  ap.add_argument("--width", type=int, default=None, help="vector width (default: the host's)")
  a = ap.parse_args()
  names, refrows = a.rows.split(","), load_rows()
  progs = {}
  for name in names:
    ins = row_inputs(refrows[name])
    for split in (False, True):
      dev = Device.open("CPU", threads=a.threads, vector_width=a.width)
      dev.renderer.caps = replace(dev.renderer.caps, split_borders=split)
      p = progs[(name, split)] = RowProgram(dev, refrows[name], True, ins)
      p.run()
      check_reference(refrows[name], p.output())
  print(f"vector width {dev.renderer.caps.vector_width}, {a.threads} thread(s); load average {os.getloadavg()[0]:.1f}")
  ratios: dict[str, list[tuple[float, float, float]]] = {n: [] for n in names}
  times: dict[str, list[tuple[float, float, float]]] = {n: [] for n in names}
  with threadpool_limits(1):
    for _ in range(a.rounds):
      for name in names:
        steps, _ = numpy_baseline(BY_NAME[name], list(row_inputs(refrows[name]).values()))
        t_np = sum(median_time(f, a.repeats) for f in steps.values())
        t0 = statistics.median(sum(progs[(name, False)].run()) for _ in range(a.repeats))
        t1 = statistics.median(sum(progs[(name, True)].run()) for _ in range(a.repeats))
        times[name].append((t0, t1, t_np))
        ratios[name].append((t0 / t1, t_np / t1, t_np / t0))
  print(f"{'row':16s} {'masked ms':>10s} {'versioned':>10s} {'numpy ms':>9s} {'speedup':>8s} "
        f"{'vs np (versioned)':>18s} {'vs np (masked)':>15s}")
  for name in names:
    med = [statistics.median(x[i] for x in times[name]) * 1e3 for i in range(3)]
    r = [statistics.median(x[i] for x in ratios[name]) for i in range(3)]
    print(f"{name:16s} {med[0]:10.3f} {med[1]:10.3f} {med[2]:9.3f} {r[0]:7.2f}x {r[1]:17.2f}x {r[2]:14.2f}x")
  print(f"load average {os.getloadavg()[0]:.1f}; ratios are medians of within-round ratios (above 1: the first is "
        "faster); numpy is im2col (sliding_window_view, one copy) + one matmul on 1 BLAS thread, pad excluded")

if __name__ == "__main__": main()
