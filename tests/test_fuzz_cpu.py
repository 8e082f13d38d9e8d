"""Differential fuzz on the CPU device: random legal Opt sequences on every catalogue AST must reproduce the
unoptimized kernel's outputs. FUZZ_N (sequences per AST, default 20) and FUZZ_SEED (default 0) scale and reseed it.
The C dialect has no local threads, no images and no tensor cores, so it can only ever accept UPCAST, UNROLL, PADTO
and MERGE: LOCAL, GROUP, GROUPTOP and NOLOCALS need has_local, UPCASTMID a grouped reduce into an image, TC tensor
cores."""
import os
import numpy as np
import pytest
import fuzz
from catalogue import catalogue
from kernopt.dtype import dtypes
from kernopt.errors import KernelOptError
from kernopt.kernel import Kernel, Opt, OptOps
from kernopt.renderers import BufferArg, Program
from kernopt.runtime import Device
from kernopt.runtime import cpu

pytestmark = pytest.mark.skipif(not cpu.CPUDevice.availability()[0], reason="no C compiler")
FUZZ_N = int(os.environ.get("FUZZ_N", "20"))
FUZZ_SEED = int(os.environ.get("FUZZ_SEED", "0"))
CASES = catalogue("small")
C_ACCEPTS = {OptOps.UPCAST, OptOps.UNROLL, OptOps.PADTO, OptOps.MERGE}

@pytest.mark.parametrize("case", [c for c in CASES if "image" not in c.tags], ids=lambda c: c.name)
def test_fuzz_matches_unoptimized(case):
  report = fuzz.run_fuzz("CPU", [case], FUZZ_N, FUZZ_SEED)
  assert not report.failures, report.summary()
  assert report.executed > 0 or not report.accepted_ops, report.summary()
  # every OptOps accepted while generating was part of some sequence that ran and matched
  assert report.executed_ops == report.accepted_ops, report.summary()

def test_image_cases_are_skipped_as_unsupported():
  report = fuzz.run_fuzz("CPU", [c for c in CASES if "image" in c.tags], FUZZ_N, FUZZ_SEED)
  assert set(report.skipped) == {"image_in", "image_out"} and not report.cases
  assert all(why.startswith("UnsupportedError") for why in report.skipped.values())

def test_optops_coverage_on_the_c_dialect():
  """Generation only (the runs are test_fuzz_matches_unoptimized's): what apply_opt accepts over the catalogue."""
  renderer, accepted = Device["CPU"].renderer, set()
  for c in CASES:
    if "image" in c.tags: continue
    _, acc, problems = fuzz.generate(c.ast, renderer, FUZZ_N, fuzz.case_seed(FUZZ_SEED, c.name), c.name)
    assert not problems, problems
    accepted |= set(acc)
  assert accepted == C_ACCEPTS
  assert not accepted & fuzz.NEEDS_LOCALS

def test_tensor_cores_never_apply_on_c():
  k = Kernel(next(c for c in CASES if c.name == "matmul_half").ast, opts=Device["CPU"].renderer)
  assert not k.apply_tensor_cores(1)
  with pytest.raises(KernelOptError): k.apply_opt(Opt(OptOps.TC, 0, 0))
  assert k.applied_opts == ()

def _program(name: str, body: str) -> Program:
  src = f"void {name}(float* restrict data0) {{\n{body}\n}}\n"
  return Program(name, src, "CPU", args=(BufferArg(0, dtypes.float32, 16, True),))

def test_a_crashing_kernel_is_reported_not_fatal():
  progs = [("ok_first", _program("ok_first", "for (int i = 0; i < 16; i++) data0[i] = (float)i;")),
           ("segv", _program("segv", "*(volatile int*)0 = 1; data0[0] = 1.0f;")),
           ("ok_after", _program("ok_after", "for (int i = 0; i < 16; i++) data0[i] = 2.0f * i;"))]
  results, failures = fuzz.run_programs("CPU", progs, [fuzz.BufInfo(0, 16, dtypes.float32, True)], {}, [{}],
                                        case="handmade")
  assert [(f.kind, f.case, f.opts) for f in failures] == [("crash", "handmade", ("segv",))]
  assert "about to run #1 segv" in failures[0].detail
  # the child was restarted after the crash: the programs on either side of it ran
  np.testing.assert_array_equal(results[0][0][1][0], np.arange(16, dtype=np.float32))
  np.testing.assert_array_equal(results[2][0][1][0], 2 * np.arange(16, dtype=np.float32))
  assert 1 not in results

def test_compare_is_exact_for_ints_and_tolerant_for_floats():
  a = np.arange(8, dtype=np.int32)
  assert fuzz.compare(a, a.copy(), dtypes.int32, 0.0) is None
  assert fuzz.compare(a, a + np.int32(1) * (a == 3), dtypes.int32, 0.0) is not None
  f = np.linspace(-1, 1, 8, dtype=np.float32)
  assert fuzz.compare(f, f * np.float32(1 + 1e-6), dtypes.float32, 1e-4) is None
  assert fuzz.compare(f, f + np.float32(1e-2), dtypes.float32, 1e-4) is not None
  assert fuzz.compare(f, f * np.float32(1 + 1e-6), dtypes.float32, 0.0) is not None
