"""Differential fuzz on the devices with local threads: OpenCL (PoCL, where every compile costs ~0.5 s, so a few
sequences per AST) and the PYTHON emulator shaped for each GPU dialect. Random legal Opt sequences must reproduce the
unoptimized kernel's outputs. FUZZ_N_OPENCL / FUZZ_N_PYTHON scale them up, FUZZ_SEED reseeds."""
import os
import pytest
import fuzz
from catalogue import catalogue
from kernopt.kernel import OptOps
from kernopt.runtime import Device
from kernopt.runtime.opencl import OpenCLDevice

FUZZ_SEED = int(os.environ.get("FUZZ_SEED", "0"))
N_OPENCL = int(os.environ.get("FUZZ_N_OPENCL", "2"))
N_PYTHON = int(os.environ.get("FUZZ_N_PYTHON", "4"))
CASES = catalogue("small")
# what the local-memory dialects must accept somewhere in the catalogue (TC is the search's and the protocol's business)
GPU_OPTOPS = {OptOps.UPCAST, OptOps.UNROLL, OptOps.LOCAL, OptOps.GROUP, OptOps.GROUPTOP, OptOps.NOLOCALS,
              OptOps.PADTO, OptOps.MERGE}
opencl_ok, opencl_why = OpenCLDevice.availability()

def _check(report):
  assert not report.failures, report.summary()
  assert report.executed_ops == report.accepted_ops, report.summary()

@pytest.mark.skipif(not opencl_ok, reason=f"no OpenCL platform: {opencl_why}")
@pytest.mark.parametrize("case", CASES, ids=lambda c: c.name)
def test_fuzz_opencl(case):
  _check(fuzz.run_fuzz("OPENCL", [case], N_OPENCL, FUZZ_SEED))

@pytest.mark.parametrize("emulate", ["CUDA", "METAL", "AMD"])
def test_fuzz_python_emulator(emulate):
  _check(fuzz.run_fuzz("PYTHON", CASES, N_PYTHON, FUZZ_SEED, device_options={"emulate": emulate}))

@pytest.mark.parametrize("device,options", [("OPENCL", {}), ("PYTHON", {"emulate": "CUDA"})])
def test_every_local_memory_optop_is_accepted_somewhere(device, options):
  """Generation only: over the catalogue, apply_opt accepts each OptOp a GPU dialect supports at least once."""
  if device == "OPENCL" and not opencl_ok: pytest.skip(f"no OpenCL platform: {opencl_why}")
  renderer, accepted = Device.open(device, **options).renderer, set()
  for c in CASES:
    _, acc, problems = fuzz.generate(c.ast, renderer, 20, fuzz.case_seed(FUZZ_SEED, c.name), c.name)
    assert not problems, problems
    accepted |= set(acc)
  assert GPU_OPTOPS <= accepted, f"never accepted: {GPU_OPTOPS - accepted}"
