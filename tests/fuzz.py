"""Differential fuzzing of Opt sequences, for any device: random legal Opt sequences on catalogue ASTs, each result
compared with the unoptimized kernel's on the same inputs (exact for ints and bools, the dtype's tolerance for floats,
since reassociation is allowed). Kernels run in a child process per AST that logs "about to run <opts>" before each
launch, so a crashing kernel becomes a reported failure naming the AST and opts, not a dead test run.
Entry points: `run_fuzz(device_name, cases, n_per_ast, seed, device_options=None)`, `generate`, `run_programs`."""
from __future__ import annotations
import os
import pickle
import random
import subprocess
import sys
import tempfile
import traceback
import zlib
from collections import Counter
from dataclasses import dataclass, field
from typing import Any, Optional, Sequence

_HERE = os.path.dirname(os.path.abspath(__file__))
_ROOT = os.path.dirname(_HERE)
if _ROOT not in sys.path: sys.path.insert(0, _ROOT)  # the worker runs this file as a script

import numpy as np  # noqa: E402
from kernopt.dtype import DType, ImageDType, dtypes  # noqa: E402
from kernopt.errors import KernelOptError, UnsupportedError  # noqa: E402
from kernopt.kernel import Kernel, Opt, OptOps  # noqa: E402

FUZZ_AMTS = (0, 2, 3, 4, 5, 7, 8, 16, 32)
# OptOps that need local threads (has_local), a grouped reduce into an image, or tensor cores: never legal on the C
# dialect (has_local=False, no images, no tensor cores). TC is never drawn by the fuzzer (it is its own protocol).
NEEDS_LOCALS = frozenset({OptOps.LOCAL, OptOps.GROUP, OptOps.GROUPTOP, OptOps.NOLOCALS, OptOps.UPCASTMID})
MAX_TRIES_PER_STEP = 300
# the fuzzer itself refuses Opts that make more than this many upcasted (unrolled) elements per loop iteration: legal
# but slow to compile (a 128-lane unroll of a 16-long reduce renders 200k characters that gcc -O2 takes 25 s on)
MAX_UPCAST_PRODUCT = 64
SENTINEL_BYTE = 0x7B  # output buffers start as this byte pattern, so an element a kernel forgets to write shows up

@dataclass(frozen=True)
class FuzzFailure:
  """kind: apply_opt | contract | codegen | compile | launch | mismatch | crash | timeout | baseline."""
  case: str
  opts: tuple
  kind: str
  detail: str
  var_vals: Optional[dict] = None

  def __str__(self) -> str:
    vv = f" var_vals={self.var_vals}" if self.var_vals else ""
    return f"[{self.kind}] {self.case} opts={list(self.opts)}{vv}: {self.detail}"

@dataclass
class FuzzReport:
  device: str
  cases: list[str] = field(default_factory=list)
  skipped: dict[str, str] = field(default_factory=dict)
  executed: int = 0                     # optimized kernels that ran and matched at every var_vals
  accepted_ops: set = field(default_factory=set)  # OptOps apply_opt accepted at least once while generating
  executed_ops: set = field(default_factory=set)  # OptOps in some sequence that ran and matched
  failures: list[FuzzFailure] = field(default_factory=list)

  def summary(self) -> str:
    lines = [f"fuzz on {self.device}: {len(self.cases)} ASTs, {self.executed} optimized kernels matched, "
             f"{len(self.failures)} failures; skipped {self.skipped}"]
    lines += [str(f) for f in self.failures[:30]]
    if len(self.failures) > 30: lines.append(f"... and {len(self.failures) - 30} more")
    return "\n".join(lines)

# ***** generating legal sequences *****

def case_seed(seed: int, name: str) -> int: return zlib.crc32(f"{seed}:{name}".encode())

def action_space(k: Kernel) -> list[Opt]:
  """Every Opt except TC over the kernel's current axes: amounts FUZZ_AMTS, MERGE without an amount, NOLOCALS alone."""
  acts = [Opt(OptOps.NOLOCALS)]
  for op in OptOps:
    if op in (OptOps.TC, OptOps.NOLOCALS): continue
    for axis in range(k.shape_len):
      if op is OptOps.MERGE: acts.append(Opt(op, axis))
      else: acts.extend(Opt(op, axis, amt) for amt in FUZZ_AMTS)
  return acts

def _state(k: Kernel) -> tuple:
  return (k.sts, k.applied_opts, k.full_shape, k.upcasted, k.local_dims, k.group_for_reduces, k.dont_use_locals)

def upcast_product(k: Kernel) -> int:
  p = 1
  for s in k.full_shape[k.shape_len - k.upcasted:]: p *= s if isinstance(s, int) else 1
  return p

def _step(k: Kernel, rng: random.Random, accepted: Counter, problems: list[FuzzFailure], name: str) -> Optional[Kernel]:
  """k with one more random legal Opt (k itself is left unchanged), or None when none of the tried ones is accepted."""
  acts = action_space(k)
  rng.shuffle(acts)
  for opt in acts[:MAX_TRIES_PER_STEP]:
    trial = k.copy()
    before = _state(trial)
    try: trial.apply_opt(opt)
    except KernelOptError:
      if _state(trial) != before:
        problems.append(FuzzFailure(name, k.applied_opts + (opt,), "contract", "a refused Opt changed the kernel"))
        return None
      continue
    except Exception as e:  # a Kernel bug: anything but KernelOptError breaks the contract
      problems.append(FuzzFailure(name, k.applied_opts + (opt,), "apply_opt", f"{type(e).__name__}: {e}"))
      return None
    if upcast_product(trial) > MAX_UPCAST_PRODUCT: continue
    accepted[opt.op] += 1
    return trial
  return None

def generate(ast: Any, renderer: Any, n: int, seed: int, name: str = "?") -> tuple[list[Kernel], Counter, list]:
  """Up to n kernels with distinct applied_opts (1-6 legal Opts each, none empty), the count of each OptOps
  accepted while generating, and any apply_opt contract problems. Deterministic for a given seed."""
  rng, accepted, problems = random.Random(seed), Counter(), []
  base = Kernel(ast, opts=renderer)
  seen: set = {()}
  kernels: list[Kernel] = []
  for _ in range(6 * n):
    if len(kernels) >= n: break
    k = base
    for _ in range(rng.randint(1, 6)):
      if (nxt := _step(k, rng, accepted, problems, name)) is None: break
      k = nxt
    if k.applied_opts in seen: continue
    seen.add(k.applied_opts)
    kernels.append(k)
  return kernels, accepted, problems

# ***** comparing outputs *****

def _dtype_of(dt: DType) -> DType: return dt.base if isinstance(dt, ImageDType) else dt

def dtype_tolerance(dt: DType) -> float:
  """Relative tolerance for a reassociated float result of dtype dt (0 for ints and bools: exact)."""
  dt = _dtype_of(dt)
  if not dtypes.is_float(dt): return 0.0
  return {dtypes.half: 2e-3, dtypes.bfloat16: 2e-2, dtypes.double: 1e-9}.get(dt, 1e-4)

def as_values(arr: np.ndarray, dt: DType) -> np.ndarray:
  """A comparable numpy view of a buffer's contents: bfloat16 bit patterns become float32, bools raw bytes."""
  dt = _dtype_of(dt)
  if dt == dtypes.bfloat16: return (arr.astype(np.uint32) << np.uint32(16)).view(np.float32)
  if dt == dtypes.bool: return arr.view(np.uint8)
  return arr

def compare(ref: np.ndarray, got: np.ndarray, dt: DType, tol: float) -> Optional[str]:
  """None when got matches ref: exactly for tol == 0 or non-float dtypes; else rtol=tol, atol=tol·max(1, |ref|)."""
  r, g = as_values(ref, dt), as_values(got, dt)
  try:
    if tol == 0 or not dtypes.is_float(_dtype_of(dt)): np.testing.assert_array_equal(g, r)
    else:
      finite = np.abs(r[np.isfinite(r)].astype(np.float64))
      scale = max(1.0, float(finite.max())) if finite.size else 1.0
      np.testing.assert_allclose(g, r, rtol=tol, atol=tol * scale, equal_nan=True)
  except AssertionError as e: return str(e).strip()[:600]
  return None

# ***** running programs in a child process *****

@dataclass(frozen=True)
class BufInfo:
  idx: int
  numel: int
  dtype: DType
  output: bool

def run_programs(device_name: str, programs: Sequence[tuple[str, Any]], buffers: Sequence[BufInfo],
                 inputs: dict[int, np.ndarray], var_vals: Sequence[dict], device_options: Optional[dict] = None,
                 config: Optional[dict] = None, timeout_s: float = 300.0, case: str = "?",
                 max_restarts: int = 3) -> tuple[dict[int, Any], list[FuzzFailure]]:
  """Compile and launch each (label, Program) in a child process, at every var_vals. Returns {program index:
  [("ok", {idx: output array}) | ("launch", traceback) per var_vals] | ("compile", traceback)} and the crashes and
  timeouts (a crash names the label being run; the child is restarted after the crashing program)."""
  results: dict[int, Any] = {}
  failures: list[FuzzFailure] = []
  start, restarts = 0, 0
  labels = [lbl for lbl, _ in programs]
  with tempfile.TemporaryDirectory(prefix="kernopt_fuzz_") as tmp:
    while start < len(programs):
      payload = dict(device=device_name, device_options=device_options or {}, config=config or {},
                     programs=list(programs), start=start, buffers=list(buffers), inputs=inputs,
                     var_vals=list(var_vals))
      paths = {k: os.path.join(tmp, f"{k}{restarts}") for k in ("payload", "result", "progress")}
      with open(paths["payload"], "wb") as f: pickle.dump(payload, f)
      cmd = [sys.executable, os.path.abspath(__file__), "--worker", paths["payload"], paths["result"],
             paths["progress"]]
      try:
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout_s, cwd=_ROOT)
        rc, err = proc.returncode, proc.stderr
      except subprocess.TimeoutExpired as e:
        rc, err = None, e.stderr.decode(errors="replace") if isinstance(e.stderr, bytes) else (e.stderr or "")
      done = _read_results(paths["result"])
      results.update(done)
      if rc == 0 and all(i in results for i in range(start, len(programs))): break
      last = _last_line(paths["progress"])
      at = _progress_index(last, start)
      kind = "timeout" if rc is None else "crash"
      why = f"child exited with {rc}" if rc is not None else f"no result within {timeout_s}s"
      failures.append(FuzzFailure(case, _label_opts(labels, at), kind,
                                  f"{why} while: {last or '(starting)'}\n{err[-1500:]}"))
      restarts += 1
      start = max(at + 1, max(results, default=-1) + 1)
      if restarts > max_restarts:
        for i in range(start, len(programs)):
          failures.append(FuzzFailure(case, _label_opts(labels, i), "crash", "not run: too many child crashes"))
        break
  return results, failures

def _label_opts(labels: list[str], i: int) -> tuple:
  return (labels[i],) if 0 <= i < len(labels) else ()

def _read_results(path: str) -> dict[int, Any]:
  out: dict[int, Any] = {}
  if not os.path.exists(path): return out
  with open(path, "rb") as f:
    while True:
      try: i, res = pickle.load(f)
      except (EOFError, pickle.UnpicklingError, ValueError): break
      out[i] = res
  return out

def _last_line(path: str) -> str:
  if not os.path.exists(path): return ""
  with open(path) as f: lines = [ln.rstrip("\n") for ln in f if ln.strip()]
  return lines[-1] if lines else ""

def _progress_index(line: str, default: int) -> int:
  """Progress lines read '<verb> #<index> ...'."""
  for tok in line.split():
    if tok.startswith("#") and tok[1:].isdigit(): return int(tok[1:])
  return default

def _worker(payload_path: str, result_path: str, progress_path: str) -> None:
  from kernopt.helpers import config_override
  from kernopt.runtime import Buffer, Device, np_dtype
  with open(payload_path, "rb") as f: p = pickle.load(f)
  with config_override(**p["config"]), open(progress_path, "a") as prog, open(result_path, "ab") as res:
    def note(msg: str) -> None:
      prog.write(msg + "\n")
      prog.flush()
    dev = Device.open(p["device"], **p["device_options"])
    bufs = {b.idx: Buffer(p["device"], max(b.numel, 1), b.dtype) for b in p["buffers"]}
    outs = [b for b in p["buffers"] if b.output]
    sentinel = {b.idx: np.full(bufs[b.idx].nbytes, SENTINEL_BYTE, np.uint8) for b in outs}
    for i in range(p["start"], len(p["programs"])):
      label, prg = p["programs"][i]
      note(f"compile #{i} {label}")
      try: runner = dev.compile(prg)
      except Exception: ret: Any = ("compile", traceback.format_exc(limit=4))
      else:
        ret = []
        for vv in p["var_vals"]:
          for b in outs: bufs[b.idx].copyin(sentinel[b.idx].view(np_dtype(b.dtype)))
          for idx, arr in p["inputs"].items(): bufs[idx].copyin(arr)
          note(f"about to run #{i} {label} var_vals={vv}")
          try: runner(*[bufs[a.idx] for a in prg.args], var_vals=vv, wait=True)
          except Exception: ret.append(("launch", traceback.format_exc(limit=4)))
          else: ret.append(("ok", {b.idx: bufs[b.idx].numpy() for b in outs}))
      pickle.dump((i, ret), res)
      res.flush()
      note(f"done #{i}")

# ***** the driver *****

def _buffers(case: Any) -> list[BufInfo]: return [BufInfo(b.idx, b.numel, b.dtype, b.output) for b in case.buffers]

def fuzz_case(device_name: str, case: Any, renderer: Any, n: int, seed: int, report: FuzzReport,
              device_options: Optional[dict] = None, config: Optional[dict] = None, timeout_s: float = 300.0) -> None:
  """Fuzz one catalogue case into report (see run_fuzz)."""
  name = case.name
  try: baseline = Kernel(case.ast, opts=renderer).to_program()
  except UnsupportedError as e:
    report.skipped[name] = f"UnsupportedError: {e}"
    return
  report.cases.append(name)
  kernels, accepted, problems = generate(case.ast, renderer, n, case_seed(seed, name), name)
  report.accepted_ops |= set(accepted)
  report.failures += problems
  programs: list[tuple[str, Any]] = [("()", baseline)]
  opts_of: list[tuple] = [()]
  for k in kernels:
    try: prg = k.to_program()
    except Exception as e:
      report.failures.append(FuzzFailure(name, k.applied_opts, "codegen", f"{type(e).__name__}: {e}"))
      continue
    programs.append((repr(list(k.applied_opts)), prg))
    opts_of.append(k.applied_opts)
  inputs = case.inputs(np.random.default_rng(case_seed(seed, name) & 0xFFFF))
  results, crashes = run_programs(device_name, programs, _buffers(case), inputs, case.var_vals, device_options,
                                  config, timeout_s, name)
  for c in crashes: report.failures.append(FuzzFailure(name, opts_of[_index_of(programs, c.opts)], c.kind, c.detail))
  base = results.get(0)
  if not isinstance(base, list) or any(r[0] != "ok" for r in base):
    report.failures.append(FuzzFailure(name, (), "baseline", f"the unoptimized kernel did not run: {base!r}"[:2000]))
    return
  out_dtypes = {b.idx: b.dtype for b in case.buffers if b.output}
  tols = {idx: 0.0 if case.tol == 0 else max(case.tol, dtype_tolerance(dt)) for idx, dt in out_dtypes.items()}
  for i in range(1, len(programs)):
    if i not in results: continue  # reported as a crash
    if not _check(name, opts_of[i], results[i], base, case.var_vals, out_dtypes, tols, report): continue
    report.executed += 1
    report.executed_ops |= {o.op for o in opts_of[i]}

def _index_of(programs: list[tuple[str, Any]], label_opts: tuple) -> int:
  for i, (lbl, _) in enumerate(programs):
    if label_opts == (lbl,): return i
  return 0

def _check(name: str, opts: tuple, got: Any, base: list, var_vals: Sequence[dict], out_dtypes: dict, tols: dict,
           report: FuzzReport) -> bool:
  if not isinstance(got, list):
    report.failures.append(FuzzFailure(name, opts, "compile", str(got[1])[-1500:]))
    return False
  ok = True
  for vv, (kind, outs), (_, ref) in zip(var_vals, got, base):
    if kind != "ok":
      report.failures.append(FuzzFailure(name, opts, kind, str(outs)[-1500:], vv))
      ok = False
      continue
    for idx, dt in out_dtypes.items():
      if (msg := compare(ref[idx], outs[idx], dt, tols[idx])) is not None:
        report.failures.append(FuzzFailure(name, opts, "mismatch", f"output {idx}: {msg}", vv))
        ok = False
  return ok

def run_fuzz(device_name: str, cases: Sequence[Any], n_per_ast: int = 20, seed: int = 0,
             device_options: Optional[dict] = None, config: Optional[dict] = None,
             timeout_s: float = 300.0) -> FuzzReport:
  """Fuzz each catalogue case on device_name: up to n_per_ast distinct random legal Opt sequences (1-6 Opts), each
  kernel's outputs compared with the unoptimized kernel's on the same inputs at every var_vals. A case whose
  unoptimized kernel the dialect refuses (UnsupportedError) is skipped. `config` knobs apply in the child too."""
  from kernopt.helpers import config_override
  from kernopt.runtime import Device
  report = FuzzReport(device_name)
  with config_override(**(config or {})):
    renderer = Device.open(device_name, **(device_options or {})).renderer
    for case in cases:
      fuzz_case(device_name, case, renderer, n_per_ast, seed, report, device_options, config, timeout_s)
  return report

if __name__ == "__main__" and len(sys.argv) == 5 and sys.argv[1] == "--worker":
  _worker(*sys.argv[2:])
