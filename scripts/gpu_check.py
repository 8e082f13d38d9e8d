"""Run the small catalogue on a real NVIDIA GPU through kernopt.runtime.cuda and compare with numpy.

  PYTHONPATH=. python scripts/gpu_check.py            # needs numpy and pycuda or cuda-python (cuda.bindings)
  PYTHONPATH=. python scripts/gpu_check.py --driver cuda-python  # launch through that binding (default: the first
                                                                 # of pycuda, cuda-python that works)
  PYTHONPATH=. python scripts/gpu_check.py --dry-run  # render and compile (nvcc or NVRTC) without a GPU
  PYTHONPATH=. python scripts/gpu_check.py --fuzz 8  # then 8 random legal Opt sequences per case (tests/fuzz.py)

Each case runs with the standard protocol and the CUDA device's profile (heuristics_cuda); cases that take tensor
cores also run with USE_TC=2 and TC_OPT 0..2.
Prints a pass/fail table with codegen, compile and kernel times; exits 1 on any failure."""
from __future__ import annotations
import argparse
import contextlib
import io
import os
import sys
import time
import traceback
from typing import Any, Optional
import numpy as np

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "tests"))
from catalogue import Case, bf16_to_f32, catalogue  # noqa: E402
from kernopt.dtype import dtypes  # noqa: E402
from kernopt.helpers import config_override  # noqa: E402
from kernopt.kernel import Kernel  # noqa: E402
from kernopt.renderers import Program  # noqa: E402
from kernopt.renderers.cuda import CUDARenderer  # noqa: E402

def variants(case: Case, arch: str) -> list[dict[str, int]]:
  """The knob settings to run case with: the default, plus USE_TC=2 and TC_OPT 0..2 where a tensor core applies."""
  def applies(tc_opt: int) -> bool:
    with contextlib.redirect_stdout(io.StringIO()):
      k = Kernel(case.ast, opts=CUDARenderer(arch, heuristics="cuda_gpu")).required_optimizations()
      return bool(k.apply_tensor_cores(1, tc_opt=tc_opt))
  levels = [t for t in (0, 1, 2) if applies(t)]
  if not levels: return [{}]
  return [{}, {"USE_TC": 2, "TC_OPT": levels[0]}] + [{"TC_OPT": t} for t in levels if t > 0]

def build(case: Case, arch: str, knobs: dict[str, int]) -> tuple[Program, bool]:
  """The Program of case for CUDA arch under knobs (standard protocol) and whether a tensor core was applied."""
  with config_override(**knobs), contextlib.redirect_stdout(io.StringIO()):
    k = Kernel(case.ast, opts=CUDARenderer(arch, heuristics="cuda_gpu")).required_optimizations()
    tc = bool(k.apply_tensor_cores())
    if not tc: k.hand_coded_optimizations()
    return k.to_program(), tc

def as_float(x: np.ndarray, spec: Any) -> np.ndarray:
  return bf16_to_f32(x) if spec.dtype == dtypes.bfloat16 else x

def compare(case: Case, got: dict[int, np.ndarray], var_vals: dict[str, int], inputs: dict[int, np.ndarray]) -> str:
  """'' when every output matches the numpy reference, else what differs."""
  ref = case.reference(inputs, var_vals)
  for spec in case.outputs:
    want = np.asarray(ref[spec.idx])
    have = got[spec.idx][:want.size].reshape(want.shape)
    w, h = as_float(want, spec), as_float(have, spec)
    if case.tol == 0 or not np.issubdtype(np.asarray(w).dtype, np.floating):
      if not np.array_equal(w, h): return f"out{spec.idx}: {int(np.sum(w != h))} of {w.size} differ"
    elif not np.allclose(h.astype(np.float64), w.astype(np.float64), rtol=max(case.tol, 1e-3), atol=1e-3,
                         equal_nan=True):
      err = np.nanmax(np.abs(h.astype(np.float64) - w.astype(np.float64)))
      return f"out{spec.idx}: max abs error {err:.3g}"
  return ""

def run_case(dev: Any, case: Case, prg: Program) -> tuple[str, float, float]:
  """(error or '', compile seconds, kernel seconds) of prg on dev for every var_vals of case."""
  from kernopt.runtime import Buffer
  st = time.perf_counter()
  runner = dev.compile(prg)
  t_compile, t_kernel = time.perf_counter() - st, 0.0
  for var_vals in case.var_vals:
    inputs = case.inputs(np.random.default_rng(0))
    bufs = {}
    for spec in case.buffers:
      b = Buffer(dev, spec.numel, spec.dtype)   # allocated through the driver under test
      if not spec.output: b.copyin(inputs[spec.idx])
      else: b.copyin(np.zeros(spec.numel, dtype=spec.np_dtype))
      bufs[spec.idx] = b
    used = [bufs[a.idx] for a in prg.args]
    t_kernel += runner(*used, var_vals={k: v for k, v in var_vals.items()}, wait=True) or 0.0
    got = {i: bufs[i].numpy() for i in bufs if i in {s.idx for s in case.outputs}}
    if (err := compare(case, got, var_vals, inputs)): return err, t_compile, t_kernel
  return "", t_compile, t_kernel

def main(argv: Optional[list[str]] = None) -> int:
  ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  ap.add_argument("--dry-run", action="store_true", help="render and compile only (no GPU needed)")
  ap.add_argument("--arch", default=None, help="target for --dry-run (default sm_90; the GPU's own otherwise)")
  ap.add_argument("--only", nargs="*", default=None, help="case names to run")
  ap.add_argument("--nvcc", action="store_true", help="compile with nvcc even when NVRTC is importable")
  ap.add_argument("--driver", default=None, choices=("pycuda", "cuda-python"),
                  help="the driver binding to launch through (default: the first of them that works)")
  ap.add_argument("--fuzz", type=int, default=0, help="then fuzz each case with this many random Opt sequences")
  ap.add_argument("--seed", type=int, default=0, help="the fuzz seed")
  args = ap.parse_args(argv)
  from kernopt.runtime.cuda import CUDADevice, compile_cuda
  dev = None
  if args.dry_run: arch = args.arch or "sm_90"
  else:
    ok, reason = CUDADevice.availability(args.driver)
    if not ok:
      print(f"gpu_check: {reason}")
      return 2
    dev = CUDADevice(prefer_nvrtc=not args.nvcc, driver=args.driver)
    arch = dev.arch
    print(f"gpu_check: {arch}, {reason}")
  cases = [c for c in catalogue("small") if "image" not in c.name and (not args.only or c.name in args.only)]
  print(f"{'case':<16}{'knobs':<18}{'tc':<4}{'codegen ms':>11}{'compile ms':>11}{'kernel us':>11}  result")
  failures, t0 = 0, time.perf_counter()
  for case in cases:
    for knobs in variants(case, arch):
      label = ",".join(f"{k}={v}" for k, v in knobs.items()) or "default"
      try:
        st = time.perf_counter()
        prg, tc = build(case, arch, knobs)
        t_gen = time.perf_counter() - st
        if dev is None:
          st = time.perf_counter()
          compile_cuda(prg.src, arch, prefer_nvrtc=not args.nvcc, cache=False)
          err, t_comp, t_kern = "", time.perf_counter() - st, 0.0
        else: err, t_comp, t_kern = run_case(dev, case, prg)
      except Exception as e:  # a crash is a failed row, not the end of the check
        err, tc, t_gen, t_comp, t_kern = f"{type(e).__name__}: {str(e).splitlines()[0][:120]}", False, 0.0, 0.0, 0.0
        if os.environ.get("GPU_CHECK_TRACE"): traceback.print_exc()
      failures += bool(err)
      print(f"{case.name:<16}{label:<18}{'y' if tc else '-':<4}{t_gen * 1e3:>11.1f}{t_comp * 1e3:>11.1f}"
            f"{t_kern * 1e6:>11.1f}  {'FAIL ' + err if err else 'ok'}", flush=True)
  through = "dry run" if dev is None else f"through {dev.driver_name}"
  print(f"{failures} failure(s) in {time.perf_counter() - t0:.1f} s ({through}, {arch})")
  if args.fuzz and dev is not None:
    import fuzz
    t0 = time.perf_counter()
    options = {"prefer_nvrtc": not args.nvcc, "driver": dev.driver_name}
    report = fuzz.run_fuzz("CUDA", cases, args.fuzz, args.seed, device_options=options)
    print(report.summary())
    print(f"fuzz: {time.perf_counter() - t0:.1f} s; OptOps that ran: {sorted(o.name for o in report.executed_ops)}")
    failures += len(report.failures)
  return 1 if failures else 0

if __name__ == "__main__":
  sys.exit(main())
