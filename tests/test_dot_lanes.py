"""Dot products as vectors along the reduce (a skinny matmul, rule cpu.dot_lanes): the vectorize pass packs W
accumulators whose updates read lanes 0..W-1 of one vector load (A along K) into one vector accumulator, the strided
operand (B) gathered; panel packing then lays B's panel out along K, so each gather is one load from the panel. Each
lane still computes its scalar op: the kernels run bit for bit as with no vectorize pass and against numpy, at widths
4, 8 and 16, on one and two threads."""
from dataclasses import replace
import numpy as np
import pytest
import catalogue
from kernopt.kernel import Kernel, Opt, OptOps
from kernopt.passes import passes_for, run_passes
from kernopt.renderers.native import NativeCRenderer
from kernopt.runtime import Buffer, Device, cpu
from kernopt.uops import UOps

needs_cc = pytest.mark.skipif(not cpu.CPUDevice.availability()[0], reason="no C compiler")
WIDTHS = (4, 8, 16)
# (M, N, K): an MLP's last layer, odd N (4 rows, no column upcast), N = 2 (4 rows), tiny
SHAPES = [(64, 10, 256), (12, 7, 64), (8, 6, 32), (16, 3, 48), (4, 2, 16)]

def _kernel(shape: tuple[int, int, int], w: int, threads: int = 1, vectorize: bool = True) -> tuple[Kernel, object]:
  dev = Device.open("CPU", threads=threads, vector_width=w)
  r = NativeCRenderer(vector_width=w, threads=threads)   # its own: the device's renderer is shared by every test
  if not vectorize: r.caps = replace(r.caps, vector_width=1)
  k = Kernel(catalogue._matmul_ast(*shape), opts=r).required_optimizations()
  # the rule's Opts, pinned (the heuristics choose them only where N is narrow for the width)
  M, N, K = shape
  k.apply_opt(Opt(OptOps.UNROLL, 0, w))
  if N % 2 == 0 and N > 2 and M % 2 == 0:
    k.apply_opt(Opt(OptOps.UPCAST, 1, 2))
    k.apply_opt(Opt(OptOps.UPCAST, 0, 2))
  elif M % 4 == 0: k.apply_opt(Opt(OptOps.UPCAST, 0, 4))
  return k, dev

def _run(k: Kernel, dev, a: np.ndarray, b: np.ndarray, shape) -> np.ndarray:
  M, N, K = shape
  prg = k.to_program()
  bufs = {0: Buffer(dev.name, M * N, catalogue.dtypes.float), 1: Buffer(dev.name, M * K, catalogue.dtypes.float),
          2: Buffer(dev.name, K * N, catalogue.dtypes.float)}
  bufs[1].copyin(a.reshape(-1))
  bufs[2].copyin(b.reshape(-1))
  dev.compile(prg)(*[bufs[x.idx] for x in prg.args], wait=True)
  return bufs[0].numpy().reshape(M, N)

def _inputs(shape, seed: int) -> tuple[np.ndarray, np.ndarray]:
  M, N, K = shape
  rng = np.random.default_rng(seed)
  return rng.standard_normal((M, K), dtype=np.float32), rng.standard_normal((K, N), dtype=np.float32)

def _shapes_for(w: int) -> list:
  return [s for s in SHAPES if s[2] % w == 0]

def test_the_rule_chooses_dot_lanes_for_a_narrow_n_with_rows_to_tile():
  """N = 10 at width 8: the reduce unrolled by 8, 2 columns x 2 rows; a matrix-vector product's single row leaves no
  row to tile: cpu.narrow_columns decides instead."""
  r = Device.open("CPU", threads=1, vector_width=8).renderer
  k = Kernel(catalogue._matmul_ast(64, 10, 256), opts=r).required_optimizations().hand_coded_optimizations()
  assert [(o.op.name, o.axis, o.amt) for o in k.applied_opts] == [("UNROLL", 0, 8), ("UPCAST", 1, 2), ("UPCAST", 0, 2)]
  k = Kernel(catalogue._matmul_ast(1, 10, 256), opts=r).required_optimizations().hand_coded_optimizations()
  rules = [d.rule for d in k.explain() if d.rule.startswith("cpu.")]
  assert rules.index("cpu.dot_lanes") < rules.index("cpu.narrow_columns")
  assert not any(o.op is OptOps.UNROLL and o.amt == 8 for o in k.applied_opts)

@pytest.mark.parametrize("w", (4, 8))
def test_dot_lanes_become_vector_accumulators_and_each_gather_one_panel_load(w):
  k, _ = _kernel((64, 10, 256), w)
  uops = k.linearize().uops
  accs = [u for u in uops if u.op is UOps.DEFINE_ACC]
  assert accs and all(u.dtype.count == w for u in accs), [str(u.dtype) for u in accs]
  panels = {u for u in uops if u.op is UOps.DEFINE_LOCAL}
  assert len(panels) == 1
  loads = [u for u in uops if u.op is UOps.LOAD and u.dtype.count == w]
  assert any(u.src[0] in panels for u in loads), "no vector load from the panel"
  # no gather of loads is left: every vector operand is one load
  assert not [u for u in uops if u.op is UOps.VECTORIZE and all(s.op is UOps.LOAD for s in u.src) and
              len(set(u.src)) > 1]

def test_without_panel_packing_the_dot_lanes_are_gathers_of_the_strided_loads():
  """The pass order: vectorize gathers B (stride N along K); panel packing is what makes each gather one load."""
  k, _ = _kernel((64, 10, 256), 8)
  ps = passes_for(k.opts)
  before = run_passes(k.linearize().lowered_uops, ps[:[p.name for p in ps].index("panel_packing")])
  gathers = [u for u in before if u.op is UOps.VECTORIZE and all(s.op is UOps.LOAD for s in u.src)]
  assert gathers and all(len({s.src[0] for s in g.src}) == 1 for g in gathers)

@needs_cc
@pytest.mark.parametrize("w", (4, 8))
def test_dot_lanes_run_bit_for_bit_as_the_scalar_lanes(w):
  """At widths 4 and 8 the scalar lanes keep one accumulator per lane too (accs_per_group): the same sums in the same
  order, so the results are the same bits."""
  for i, shape in enumerate(_shapes_for(w)):
    a, b = _inputs(shape, i)
    got = _run(*_kernel(shape, w), a, b, shape)
    ref = _run(*_kernel(shape, w, vectorize=False), a, b, shape)
    assert np.array_equal(got.view(np.uint32), ref.view(np.uint32)), shape
    np.testing.assert_allclose(got, a @ b, rtol=1e-5, atol=1e-4)

@needs_cc
@pytest.mark.parametrize("w,threads", [(4, 2), (8, 1), (8, 2), (16, 1), (16, 2)])
def test_dot_lanes_equal_numpy(w, threads):
  for i, shape in enumerate(_shapes_for(w)):
    a, b = _inputs(shape, 100 + i)
    np.testing.assert_allclose(_run(*_kernel(shape, w, threads), a, b, shape), a.astype(np.float64) @ b,
                               rtol=1e-5, atol=1e-4)

@needs_cc
@pytest.mark.parametrize("w", WIDTHS)
def test_the_standard_protocol_on_skinny_matmuls_equals_numpy(w):
  dev = Device.open("CPU", threads=1, vector_width=w)
  for i, shape in enumerate(SHAPES + [(64, 10, 250), (9, 5, 40)]):
    k = Kernel(catalogue._matmul_ast(*shape), opts=dev.renderer).required_optimizations()
    k.hand_coded_optimizations()
    a, b = _inputs(shape, 200 + i)
    np.testing.assert_allclose(_run(k, dev, a, b, shape), a.astype(np.float64) @ b, rtol=1e-5, atol=1e-4)
