"""A dialect is one renderer module plus its registration: tests/toy_dialect.py declares its capabilities record,
spells the UOp list as Python/numpy source and registers itself as "TOY"; nothing else in kernopt knows it. Every
catalogue case, unoptimized and under the standard protocol, matches numpy's reference."""
import numpy as np
import pytest
import catalogue
from catalogue import bf16_to_f32
from kernopt.dtype import dtypes
from kernopt.errors import UnsupportedError
from kernopt.kernel import Kernel
from kernopt.ops import BinaryOps
from kernopt.renderers import dialect_names, get_renderer
import toy_dialect
from toy_dialect import ToyRenderer, run_toy

CASES = catalogue.catalogue("small")
IMAGES = [c for c in CASES if "image" in c.tags]

def run_case(case, prg, seed=3):
  """[(var_vals, outputs, references)] of prg run by the toy runner on seeded inputs, flat by buffer index."""
  ins, ret = case.inputs(np.random.default_rng(seed)), []
  for vv in case.var_vals:
    bufs = {b.idx: np.zeros(b.numel, b.np_dtype) if b.output else np.array(ins[b.idx], b.np_dtype).reshape(-1)
            for b in case.buffers}
    run_toy(prg, bufs, vv)
    want = {i: np.asarray(r).reshape(-1) for i, r in case.reference(ins, vv).items()}
    ret.append((vv, {i: bufs[i][:w.size] for i, w in want.items()}, want))
  return ret

def assert_matches(case, got, want, what):
  """Exact for ints, bools and tol == 0; else rtol=tol and atol=tol·max(1, |reference|)."""
  for spec in case.outputs:
    g, w = got[spec.idx], want[spec.idx]
    if spec.dtype == dtypes.bfloat16: g, w = bf16_to_f32(g), bf16_to_f32(w)
    if case.tol == 0 or not dtypes.is_float(spec.dtype): np.testing.assert_array_equal(g, w.astype(g.dtype), what)
    else:
      scale = max(1.0, float(np.nanmax(np.abs(w.astype(np.float64)), initial=0.0)))
      np.testing.assert_allclose(g.astype(np.float64), w.astype(np.float64), case.tol, case.tol * scale, err_msg=what)

def test_the_toy_dialect_is_registered_by_its_own_module():
  assert "TOY" in dialect_names() and type(get_renderer("TOY")) is ToyRenderer
  caps = get_renderer("TOY").capabilities()
  assert caps["dialect"] == "ToyRenderer" and caps["device"] == "TOY" and caps["has_local"] is False

@pytest.mark.parametrize("protocol", [False, True], ids=["no_opts", "protocol"])
@pytest.mark.parametrize("case", [c for c in CASES if c not in IMAGES], ids=lambda c: c.name)
def test_catalogue_matches_numpy(case, protocol):
  k = Kernel(case.ast, opts=ToyRenderer())
  if protocol: k.hand_coded_optimizations()
  prg = k.to_program()
  assert prg.device == "TOY" and prg.src.startswith(f"def {prg.name}(")
  for vv, got, want in run_case(case, prg):
    assert_matches(case, got, want, f"{case.name} {k.applied_opts} {vv}")

@pytest.mark.parametrize("case", IMAGES, ids=lambda c: c.name)
def test_images_are_refused_as_the_record_declares(case):
  assert ToyRenderer().caps.supports_images is False
  with pytest.raises(UnsupportedError, match="TOY has no images"):
    Kernel(case.ast, opts=ToyRenderer()).hand_coded_optimizations().to_program()

def test_a_wrong_spelling_is_caught(monkeypatch):
  """The comparison is live: MAX spelled as a minimum makes max_axis1 differ from numpy."""
  monkeypatch.setitem(toy_dialect._CALL, BinaryOps.MAX, "np.minimum")
  case = catalogue.get("max_axis1")
  (_, got, want), = run_case(case, Kernel(case.ast, opts=ToyRenderer()).to_program())
  with pytest.raises(AssertionError): assert_matches(case, got, want, "max spelled as min")
