"""Kernel.explain(): the heuristics' decisions, recorded as they apply Opts. For every catalogue AST (both scales) under
every pinned profile of scripts/process_replay.py (static C, OpenCL, OpenCL CPU, CUDA, CUDA H200, Metal, AMD, native
at widths 4, 8, 16): replaying the explanation's Opts on a fresh Kernel gives the same applied_opts and trackers, each
fact it cites about the kernel equals the fresh kernel's state at that step, and every registered rule is cited by some
case. The oracle is the fresh Kernel, not the trace."""
import os
from dataclasses import replace
import sys
import pytest
from catalogue import buf, kernel, reduce, store
from kernopt import heuristics, heuristics_cpu, heuristics_cuda, heuristics_opencl
from kernopt import kernel as kernel_module
from kernopt.errors import KernoptError
from kernopt.helpers import config_override, prod
from kernopt.kernel import Kernel
from kernopt.ops import ReduceOps
from kernopt.opt import Opt, OptOps
from kernopt.renderers import get_renderer

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "scripts"))
import process_replay as replay  # noqa: E402
import catalogue  # noqa: E402

REGISTRIES = {"kernel": kernel_module.RULES, "heuristics": heuristics.RULES, "heuristics_cpu": heuristics_cpu.RULES,
              "heuristics_opencl": heuristics_opencl.RULES, "heuristics_cuda": heuristics_cuda.RULES}
ALL_RULES = {name for rules in REGISTRIES.values() for name in rules}

def protocol(ast, renderer) -> Kernel:
  k = Kernel(ast, opts=renderer).required_optimizations()
  if not k.apply_tensor_cores(): k.hand_coded_optimizations()
  return k

def extra_cases() -> list:
  """(label, AST, renderer, knobs) for the rules no catalogue case reaches under the default knobs."""
  empty = kernel(store(reduce(ReduceOps.SUM, buf(1, (16, 0)), (1,))))
  cl16 = replay.profiles()["opencl_cpu"]()
  cl16.caps = replace(cl16.caps, vector_width=16)
  return [("nolocals", catalogue.get("add").ast, get_renderer("OPENCL"), {"NOLOCALS": 1}),
          ("empty", empty, get_renderer("CPU"), {}),
          ("dwconv", catalogue.dwconv2d_ast(1, 4, 8, 16), replay.profiles()["opencl_cpu"](), {}),
          ("conv at width 16", catalogue.conv2d_ast(1, 8, 4, 24, 16), cl16, {}),
          ("dwconv, native", catalogue.dwconv2d_ast(1, 4, 8, 16), replay.profiles()["cpu_native_w8"](), {}),
          ("skinny matmul, K no multiple of 8", catalogue._matmul_ast(16, 10, 44), replay.profiles()["cpu_native_w8"](),
           {})]

@pytest.fixture(scope="module")
def runs() -> list:
  """(label, make renderer, ast, knobs, kernel) for every case the protocol optimizes."""
  out = []
  with replay.pinned_config():
    for profile, make in replay.profiles().items():
      for scale in ("small", "large"):
        for case in catalogue.catalogue(scale):
          try: out.append((f"{profile}/{scale}-{case.name}", make, case.ast, {}, protocol(case.ast, make())))
          except KernoptError: continue   # refused by this dialect (e.g. images on CUDA): nothing to explain
    for label, ast, r, knobs in extra_cases():
      with config_override(**knobs): out.append((label, lambda r=r: r, ast, knobs, protocol(ast, r)))
  return out

def check_facts(d: heuristics.Decision, k: Kernel) -> list:
  """The facts of d that disagree with k, the kernel as it was when d was made."""
  f, bad = d.facts, []
  def expect(key, actual):
    if key in f and f[key] != actual: bad.append(f"{key}={f[key]!r}, kernel has {actual!r}")
  if d.rule != "direct": expect("full_shape", k.full_shape)
  for key in ("first_reduce", "upcasted", "local_dims", "group_for_reduces"): expect(key, getattr(k, key))
  if "outputs" in f: expect("outputs", prod(k.output_shape[:k.first_reduce]))
  if "axis" in f:
    ax = f["axis"]
    expect("size", k.full_shape[ax])
    expect("strides", tuple(st.views[-1].strides[ax] for st in k.sts))
    expect("buffer_strides", tuple(k.sts[i].real_strides(ignore_valid=True)[ax] for i in range(len(k.bufs))))
  if "operands" in f:
    expect("operand_strides", tuple(k.sts[b].real_strides() for b in f["operands"]))
  return bad

def replay_explanation(make, ast, knobs, ex) -> tuple:
  """A fresh Kernel with ex's Opts applied in order, and every fact that disagreed with it along the way."""
  fresh, wrong = Kernel(ast, opts=make()), []
  with replay.pinned_config(), config_override(**knobs):
    for d in ex:
      wrong += [f"{d.rule}: {w}" for w in check_facts(d, fresh)]
      if d.opt is not None: fresh.apply_opt(d.opt)
  return fresh, wrong

def test_explanation_opts_reproduce_applied_opts_and_facts_hold(runs):
  assert len(runs) > 500, "the catalogue under every profile"
  for label, make, ast, knobs, k in runs:
    ex = k.explain()
    assert ex.opts == k.applied_opts, label
    fresh, wrong = replay_explanation(make, ast, knobs, ex)
    assert fresh.applied_opts == k.applied_opts, label
    assert fresh.sts == k.sts and fresh.tensor_core == k.tensor_core, label
    assert not wrong, f"{label}: {wrong}"

def test_every_rule_is_named_by_a_case_and_every_cited_rule_is_registered(runs):
  cited = {d.rule for *_, k in runs for d in k.explain()}
  assert cited <= ALL_RULES, f"unregistered rules: {sorted(cited - ALL_RULES)}"
  assert ALL_RULES - cited == {"direct"}, f"rules no case names: {sorted(ALL_RULES - cited - {'direct'})}"
  names = [n for rules in REGISTRIES.values() for n in rules]
  assert len(names) == len(set(names)), "a rule is declared twice"
  assert all(isinstance(v, str) and v for rules in REGISTRIES.values() for v in rules.values())

def test_main_rules_cite_the_values_that_decided_them(runs):
  """The spec's broadcast upcast cites the strides that made its axis a broadcast one (a 0 among them), the matvec
  rule the operand strides it tested, a refused tensor core a reason per tensor core tried."""
  decisions = [(label, d) for label, *_, k in runs for d in k.explain()]
  bcast = [d for _, d in decisions if d.rule == "spec.broadcast_upcast" and d.opt is not None]
  assert bcast and all(0 in d.facts["strides"] and d.facts["outputs"] >= d.facts["limit"] == 1024 for d in bcast)
  mv = [d for _, d in decisions if d.rule == "spec.matvec" and d.opt is not None and d.opt.op is OptOps.GROUP]
  assert mv and all(d.facts["operand_strides"][0][d.facts["first_reduce"]] == 1 for d in mv)
  for label, *_, k in runs:
    rules = k.explain().rules
    if "tc.refused" in rules and k.opts.caps.tensor_cores and k.reduceop is not None and k.reduceop.op is ReduceOps.SUM:
      tried = [d for d in k.explain() if d.rule == "tc.no_match"]
      assert len(tried) == len(k.opts.caps.tensor_cores), label

def test_direct_opts_and_a_copy():
  """Opts applied by hand appear as "direct", in place among the rules' decisions; a copy carries the trace and a
  refused Opt leaves it unchanged."""
  r = get_renderer("OPENCL")
  k = Kernel(catalogue.get("matmul_64").ast, opts=r)
  k.apply_opt(Opt(OptOps.UPCAST, 0, 4))
  k.hand_coded_optimizations()
  ex = k.explain()
  assert ex.decisions[0].rule == "direct" and ex.decisions[0].opt == Opt(OptOps.UPCAST, 0, 4)
  assert ex.opts == k.applied_opts
  c = k.copy()
  c.apply_opt(Opt(OptOps.UPCAST, 1, 2))
  assert c.explain().opts == c.applied_opts and k.explain() == ex
  before = c.trace
  with pytest.raises(KernoptError): c.apply_opt(Opt(OptOps.UPCAST, 0, 7))
  assert c.trace is before

def test_str_is_one_line_per_decision():
  k = protocol(catalogue.get("matvec").ast, get_renderer("OPENCL"))
  text = str(k.explain())
  assert len(text.splitlines()) == len(k.explain())
  assert text.splitlines()[-1].startswith("spec.matvec") and "UPCAST axis=0 amt=4" in text.splitlines()[-1]

def test_compile_explain_returns_the_runner_and_its_explanation(tmp_path):
  import numpy as np
  import kernopt
  from kernopt.runtime import Buffer
  case = catalogue.get("sum_axis1")
  with config_override(CACHE_DIR=str(tmp_path)):
    runner, ex = kernopt.compile(case.ast, "CPU", explain=True)
    again = kernopt.compile(case.ast, "CPU", explain=True)   # a program-cache hit explains the same
  assert ex == again.explanation and again.runner.program.src == runner.program.src
  assert ex.opts == protocol(case.ast, runner.device.renderer).applied_opts
  ins = case.inputs(np.random.default_rng(0))
  bufs = {b.idx: Buffer("CPU", b.numel, b.dtype) for b in case.buffers}
  for b in case.buffers:
    if not b.output: bufs[b.idx].copyin(ins[b.idx])
  runner(*[bufs[i] for i in sorted(bufs)], wait=True)
  ref = case.reference(ins, {})
  for b in case.outputs: np.testing.assert_allclose(bufs[b.idx].numpy(), np.asarray(ref[b.idx]).reshape(-1), rtol=1e-4)
