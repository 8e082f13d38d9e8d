"""Padded loads that stay fast (issue 18): the `borders` pass (kernopt/passes/borders.py, run by passes_for when
caps.split_borders is set, after interchange and before vectorize) versions the tile loop of a padded window kernel
into an interior copy with plain loads and the original with masked ones, when its rule cpu.padded_interior
(wants_interior, a function of the plan alone) accepts the plan. The box is checked by brute force (every folded gate
holds at every point of it, for every value of its other loops, and fails just outside it); the versioned kernels run
against numpy and bit for bit against the unversioned ones at widths 4, 8 and 16 (pinned renderers, never the host's
width); the rule's choices, its thresholds and the cost estimate are checked on the lists."""
import itertools
import os
from dataclasses import replace
from typing import Optional
import numpy as np
import pytest
from catalogue import dwconv2d_ast, dwconv2d_numpy, get
from test_index_simplify import _apply, tinygrad_conv_input
import kernopt
from kernopt.ast import alu, kernel, load, reduce, store
from kernopt.dtype import dtypes
from kernopt.kernel import Kernel, Opt, OptOps
from kernopt.ops import BinaryOps, ReduceOps, exec_alu
from kernopt.passes import passes_for, run_passes
from kernopt.passes.borders import _gate_atoms, borders, interior, split_borders, wants_interior
from kernopt.renderers.native import NativeCRenderer
from kernopt.runtime import Buffer, Device, cpu
from kernopt.shape.shapetracker import ShapeTracker
from kernopt.uops import ReduceBlock, UOp, UOps, flops_mem, loop_mark

needs_cc = pytest.mark.skipif(not cpu.CPUDevice.availability()[0], reason="no C compiler")
REF = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "benchmarks", "asts", "reference")
WIDTHS = (4, 8, 16)

def conv_ast(n: int, cin: int, h: int, w: int, cout: int, k: int, stride: int, pad: int):
  """conv2d as tinygrad 0.9.2 schedules it: the input through its pad + window movement ops, the weight broadcast,
  summed over (cin, ky, kx). Returns the AST and the output's (n, cout, oy, ox)."""
  shape, ops = tinygrad_conv_input(n, cin, h, w, cout, (k, k), stride, 1, pad)
  st, arr = _apply(shape, ops)
  full = arr.shape
  wst = ShapeTracker.from_shape((cout, cin, k, k)).reshape((1, 1, cout, 1, 1, cin, k, k)).expand(full)
  prod = alu(BinaryOps.MUL, load(1, dtypes.float, st), load(2, dtypes.float, wst))
  return kernel(store(0, reduce(ReduceOps.SUM, prod, (5, 6, 7)))), (n, cout, full[3], full[4])

def conv_numpy(x: np.ndarray, wt: np.ndarray, stride: int, pad: int) -> np.ndarray:
  x = np.pad(x.astype(np.float64), ((0, 0), (0, 0), (pad, pad), (pad, pad)))
  k = wt.shape[-1]
  oy, ox = (x.shape[2] - k) // stride + 1, (x.shape[3] - k) // stride + 1
  out = np.zeros((x.shape[0], wt.shape[0], oy, ox))
  for ky, kx in itertools.product(range(k), range(k)):
    win = x[:, :, ky:ky + stride * oy:stride, kx:kx + stride * ox:stride]
    out += np.einsum("nchw,oc->nohw", win, wt[:, :, ky, kx].astype(np.float64))
  return out

def native(w: int, split: bool = True, threads: int = 1) -> NativeCRenderer:
  r = NativeCRenderer(vector_width=w, threads=threads)
  r.caps = replace(r.caps, split_borders=split)
  return r

def linearized(ast, w: int) -> list:
  """The list the borders pass receives: the lowered list through the passes before it."""
  r = native(w)
  k = Kernel(ast, opts=r).required_optimizations()
  k.hand_coded_optimizations()
  ps = passes_for(r)
  return run_passes(k.linearize().lowered_uops, ps[:[p.name for p in ps].index("borders")])

# ***** the box, by brute force *****

def _value(u, env: dict, memo: dict):
  """The value of an index or gate UOp with the loops in env."""
  if u in env: return env[u]
  if u in memo: return memo[u]
  if u.op is UOps.CONST: ret = u.arg
  else:
    assert u.op is UOps.ALU, u
    ret = exec_alu(u.arg, u.src[-1].dtype if u.arg is not BinaryOps.CMPLT else u.src[0].dtype,
                   tuple(_value(s, env, memo) for s in u.src))
  memo[u] = ret
  return ret

def _loops(u) -> list:
  return sorted({x for x in [u, *u.parents] if x.op is UOps.RANGE}, key=lambda r: str(r.arg))

def _span(r, box: dict) -> range:
  lo, hi = box.get(r, (r.src[0].arg, r.src[1].arg - 1))
  return range(lo, hi + 1)

CASES = [("conv_small_0", 4), ("conv_small_0", 8), ("conv_small_s1_0", 16), ("dwconv_small_0", 4),
         ("conv_64x56_0", 16), ("conv_16x32_s2_0", 8)]

@pytest.mark.parametrize("name,w", CASES)
def test_box_holds_every_folded_gate_and_is_tight(name, w):
  uops = linearized(kernopt.load(os.path.join(REF, f"{name}.json")), w)
  plan = interior(uops)
  assert plan is not None and plan.folded
  box = {r: (lo, hi) for r, lo, hi in plan.box}
  for atom in plan.folded:
    loops = _loops(atom)
    for vals in itertools.product(*[_span(r, box) for r in loops]):
      assert _value(atom, dict(zip(loops, vals)), {}), (atom, dict(zip(loops, vals)))
  # just outside the box some folded gate fails for some value of the other loops: the box is not too small
  for r, (lo, hi) in box.items():
    for edge in (lo - 1, hi + 1):
      if not r.src[0].arg <= edge < r.src[1].arg: continue
      def fails(atom) -> bool:
        loops = _loops(atom)
        if r not in loops: return False
        spans = [range(edge, edge + 1) if x is r else _span(x, {}) for x in loops]
        return any(not _value(atom, dict(zip(loops, v)), {}) for v in itertools.product(*spans))
      assert any(fails(a) for a in plan.folded), (r.arg, edge)

def test_interior_of_the_reference_conv():
  # 12x12 input, pad 1, 3x3 window: output rows and columns 1..10 read no padding; the heuristics' tile at width 8
  # keeps both as loops (channels are the vector axis)
  plan = interior(linearized(kernopt.load(os.path.join(REF, "conv_small_0.json")), 8))
  assert plan is not None
  assert sorted((r.src[1].arg, lo, hi) for r, lo, hi in plan.box) == [(12, 1, 10), (12, 1, 10)]
  assert plan.ungated == plan.gated > 0 and plan.fraction == pytest.approx(100 / 144)

def test_versioned_list_has_a_plain_interior_copy():
  uops = linearized(kernopt.load(os.path.join(REF, "conv_small_0.json")), 8)
  new = split_borders(uops)
  ifs = [i for i, u in enumerate(new) if u.op is UOps.IF]
  ends = [i for i, u in enumerate(new) if u.op is UOps.ENDIF]
  assert len(ifs) == len(ends) == 2 and ends[0] == ifs[1] - 1
  fast, slow = new[ifs[0] + 1:ends[0]], new[ifs[1] + 1:ends[1]]
  assert not [u for u in fast if u.op is UOps.LOAD and len(u.src) == 4]
  assert [u for u in slow if u.op is UOps.LOAD and len(u.src) == 4]
  assert not set(fast) & set(slow)                          # every UOp of the copy is its own
  assert set(slow) <= set(uops)
  assert len(new) == len(set(new))                          # and no UOp is placed twice
  assert new[ifs[1]].src[0].src[0] is new[ifs[0]].src[0]    # the second block runs exactly when the first doesn't

# ***** the rule *****

def test_rule_choices():
  big = linearized(kernopt.load(os.path.join(REF, "conv_64x56_0.json")), 8)
  assert wants_interior(interior(big))
  # two tiles of 16 lanes (width 16) across a row of 32: each tile touches a border, only the rows are narrowed, and
  # the edge lanes keep their gates (the vector stays a masked load): not versioned
  two_tiles = interior(linearized(kernopt.load(os.path.join(REF, "conv_16x32_s1_0.json")), 16))
  assert two_tiles is not None and two_tiles.ungated < two_tiles.gated and not wants_interior(two_tiles)
  # an elementwise pad: one gated load per store, memory-bound
  pad = linearized(get("pad", "large").ast, 8)
  assert (pad_plan := interior(pad)) is None or not wants_interior(pad_plan)
  before = list(big)
  assert borders(pad) == pad and borders(tuple(big)) == split_borders(big) != big and big == before   # pure
  # the thresholds, on the same plan: its interior share and its size
  plan = interior(big)
  assert not wants_interior(plan, min_interior=plan.fraction + 0.01) and wants_interior(plan, plan.fraction)
  assert not wants_interior(plan, max_versioned=plan.size - 1) and wants_interior(plan, max_versioned=plan.size)

def test_pipeline_places_borders_after_interchange_before_vectorize():
  names = [p.name for p in passes_for(native(8))]
  assert names.index("interchange") < names.index("borders") == names.index("vectorize") - 1
  assert "borders" not in [p.name for p in passes_for(native(8, split=False))]

def test_cost_estimate_counts_one_version():
  ast = kernopt.load(os.path.join(REF, "conv_64x56_0.json"))
  progs = []
  for split in (False, True):
    k = Kernel(ast, opts=native(8, split)).required_optimizations()
    k.hand_coded_optimizations()
    progs.append(k.to_program())
  assert sum(u.op is UOps.IF for u in progs[1].uops) == 2
  assert progs[1].op_estimate == progs[0].op_estimate == 2 * 64 * 56 * 56 * 64 * 9
  assert progs[1].mem_estimate == progs[0].mem_estimate
  # on the lists themselves (what the parallel pass weighs): the two back-to-back versions count as one
  plain = linearized(ast, 8)
  assert flops_mem(split_borders(plain)) == flops_mem(plain) == (2 * 64 * 56 * 56 * 64 * 9, flops_mem(plain)[1])

# ***** numbers *****

def _run(ast, w: int, split: bool, inputs: dict, opts: Optional[list] = None) -> tuple:
  """(output, IF count) of ast under the standard protocol (or `opts`) on the native profile at width w."""
  dev = Device.open("CPU", threads=2, vector_width=w, min_parallel_work=0)
  dev.renderer.caps = replace(dev.renderer.caps, split_borders=split)
  k = Kernel(ast, opts=dev.renderer).required_optimizations()
  if opts is None: k.hand_coded_optimizations()
  else:
    for o in opts: k.apply_opt(o)
  prg = k.to_program()
  bufs = {a.idx: Buffer(dev, a.min_size, a.dtype) for a in prg.args}
  for i, b in bufs.items(): b.copyin(inputs[i][:b.size] if i else np.full(b.size, np.nan, np.float32))
  dev.compile(prg)(*[bufs[a.idx] for a in prg.args], wait=True)
  return bufs[0].numpy(), sum(u.op is UOps.IF for u in prg.uops)

CONVS = [((1, 3, 12, 12, 8, 3, 1, 1), 4), ((1, 3, 12, 12, 8, 3, 1, 1), 8), ((1, 3, 12, 12, 8, 3, 1, 1), 16),
         ((1, 4, 32, 32, 8, 3, 2, 1), 4), ((2, 2, 9, 10, 4, 3, 1, 2), 8), ((1, 2, 2, 2, 4, 3, 1, 1), 8)]

@needs_cc
@pytest.mark.parametrize("conv,w", CONVS, ids=[f"{'x'.join(map(str, c))}-w{w}" for c, w in CONVS])
def test_versioned_conv_matches_numpy_and_the_unversioned_kernel(conv, w):
  """Every split (pad 1 and 2, stride 1 and 2, an input too small to have an interior) at pinned widths: the same
  bits as the kernel with masked loads everywhere, and numpy's convolution."""
  n, cin, h, wd, cout, k, stride, pad = conv
  ast, oshape = conv_ast(n, cin, h, wd, cout, k, stride, pad)
  rng = np.random.default_rng(sum(conv) + w)
  x, wt = rng.standard_normal((n, cin, h, wd)).astype(np.float32), rng.standard_normal((cout, cin, k, k))
  inputs = {1: x.reshape(-1), 2: wt.astype(np.float32).reshape(-1)}
  (plain, ifs0), (versioned, ifs) = _run(ast, w, False, inputs), _run(ast, w, True, inputs)
  assert ifs0 == 0 and ifs == (0 if h <= 2 else 2)
  assert versioned.tobytes() == plain.tobytes()
  want = conv_numpy(x, wt.astype(np.float32), stride, pad)
  np.testing.assert_allclose(versioned.reshape(oshape), want, rtol=1e-4, atol=1e-4)

@needs_cc
@pytest.mark.parametrize("w", (4, 16))
def test_versioned_depthwise_window_matches_the_oracle(w):
  """A depthwise conv with one vector of columns and its window unrolled (no reduce loop: the gated loads alone make
  the body; the standard protocol's 4 rows share their loads, too few gated loads per store to be versioned)."""
  N, C, H, W = 1, 4, 12, 4 * w   # 4 column tiles, 2 of them interior
  ast = dwconv2d_ast(N, C, H, W)
  rng = np.random.default_rng(w)
  inputs = {1: rng.standard_normal(N * C * H * W).astype(np.float32), 2: rng.standard_normal(C * 9).astype(np.float32)}
  opts = [Opt(OptOps.UPCAST, 2, w), Opt(OptOps.UNROLL, 1, 0), Opt(OptOps.UNROLL, 0, 0)]
  (plain, _), (versioned, ifs) = _run(ast, w, False, inputs, opts), _run(ast, w, True, inputs, opts)
  assert ifs == 2 and versioned.tobytes() == plain.tobytes()
  want = dwconv2d_numpy(inputs[1].reshape(N, C, H, W), inputs[2].reshape(C, 3, 3))
  np.testing.assert_allclose(versioned.reshape(want.shape), want, rtol=1e-4, atol=1e-4)

def test_gate_atoms_flatten_ands():
  i32, b = dtypes.int32, dtypes.bool
  r = UOp(UOps.RANGE, i32, (UOp.const(i32, 0), UOp.const(i32, 4)), (0, False))
  c = [UOp(UOps.ALU, b, (r, UOp.const(i32, v)), BinaryOps.CMPLT) for v in (1, 2, 3)]
  tree = UOp(UOps.ALU, b, (UOp(UOps.ALU, b, (c[0], c[1]), BinaryOps.AND), c[2]), BinaryOps.AND)
  assert _gate_atoms(tree) == c

def test_interior_copies_keep_each_reduces_own_loops():
  """Two reduces over one axis (nested differently) each have their own RANGE of it; the interior copy keeps them
  apart. The fuzzer found them merged into one RANGE opened twice, whose second loop read the first one's index
  (tests/regressions/kernopt-error-cpu-4137011a456f.json: "alu2 undeclared")."""
  from kernopt.ast import const, where
  bools = load(2, dtypes.bool, ShapeTracker.from_shape((3, 5)).reshape((1, 3, 5)).expand((32, 3, 5)))
  pad = load(1, dtypes.float64, ShapeTracker.from_shape((1,)).reshape((1, 1, 1)).pad(((0, 0), (2, 0), (0, 0))))
  vals = load(3, dtypes.float64, (1, 3, 5))
  shifted = alu(BinaryOps.ADD, reduce(ReduceOps.MAX, vals, (2,)), pad)
  ast = kernel(store(0, where(reduce(ReduceOps.MAX, bools, (0, 2)), shifted, const(1.75, dtypes.float64, (1, 3, 1)))))
  r = NativeCRenderer(vector_width=8, threads=1)
  k = Kernel(ast, opts=r).linearize()
  rngs = [u for u in k.uops if u.op is UOps.RANGE]
  assert any(isinstance(u.arg[0], tuple) for u in rngs), "the borders pass did not version this kernel"
  assert len(set(rngs)) == len(rngs) == sum(u.op is UOps.ENDRANGE for u in k.uops)

# ***** a PADTO'd output axis: the edge tile's gated loads and stores *****

def _padded_matmul(w: int, split: bool, a: np.ndarray, b: np.ndarray, steps: Optional[int] = None,
                   uops: Optional[list] = None, opts: Optional[list] = None) -> tuple[np.ndarray, int, list]:
  """a @ b by the standard protocol (or `opts`) on the native profile at width w (reduce blocks of `steps` when
  given), versioned when split: (out, IFs in the program, the Opts); the program's UOps appended to `uops` when
  given."""
  from catalogue import _matmul_ast
  (m, kk), n = a.shape, b.shape[1]
  dev = Device.open("CPU", threads=1, vector_width=w)
  dev.renderer.caps = replace(dev.renderer.caps, split_borders=split)
  if steps is not None: dev.renderer.caps = replace(dev.renderer.caps, reduce_block=steps)
  k = Kernel(_matmul_ast(m, n, kk), opts=dev.renderer).required_optimizations()
  if opts is None: k.hand_coded_optimizations()
  else:
    for o in opts: k.apply_opt(o)
  prg = k.to_program()
  out, ba, bb = Buffer(dev, m * n, dtypes.float), Buffer(dev, a.size, dtypes.float), Buffer(dev, b.size, dtypes.float)
  ba.copyin(a.reshape(-1))
  bb.copyin(b.reshape(-1))
  dev.compile(prg)(out, ba, bb, wait=True)
  if uops is not None: uops.extend(prg.uops)
  return out.numpy().reshape(m, n), sum(u.op is UOps.IF for u in prg.uops), [o.op.name for o in k.applied_opts]

@needs_cc
@pytest.mark.parametrize("w", WIDTHS)
def test_padded_matmul_tile_versioned_matches_numpy(w):
  """N = 255 padded to two vectors (rule cpu.pad_columns): the interior tiles lose the gates of B's loads and of the
  output's stores (the lowerer's IF block of edge stores vanishes from the copy); the edge tile keeps them. Bit for
  bit the unversioned kernel, and numpy."""
  rng = np.random.default_rng(w)
  a, b = rng.standard_normal((12, 20)).astype(np.float32), rng.standard_normal((20, 255)).astype(np.float32)
  (plain, ifs0, opts0), (versioned, ifs, opts) = _padded_matmul(w, False, a, b), _padded_matmul(w, True, a, b)
  assert opts[0] == "PADTO" and opts == opts0 and ifs > ifs0
  assert versioned.tobytes() == plain.tobytes()
  np.testing.assert_allclose(versioned, a.astype(np.float64) @ b, rtol=1e-5, atol=1e-5)

@needs_cc
@pytest.mark.parametrize("w", WIDTHS)
def test_a_padded_column_axis_versions_the_tile_loop_whole_and_its_copy_is_blocked(w):
  """The PADTO'd column axis is the interchanged tile's outer loop (matmul 1000x1000x999 at width 8: 63 column tiles,
  the last one gated), so the box leaves the tile loop whole: the IF opens once per column tile, around the tile
  loop, and the interior copy's tile loop is a plain nest that reduce blocking and panel packing take (K = 96 in 4
  blocks of 24) while the edge tile keeps its gated loads and stores, unblocked. Bit for bit the unversioned kernel
  (whose gated stores leave it unblocked), and numpy."""
  rng = np.random.default_rng(w)
  a, b = rng.standard_normal((16, 96)).astype(np.float32), rng.standard_normal((96, 255)).astype(np.float32)
  uops: list = []
  (plain, _, opts0), (versioned, _, opts) = _padded_matmul(w, False, a, b, 24), _padded_matmul(w, True, a, b, 24, uops)
  assert opts[0] == "PADTO" and opts == opts0
  ifs = [i for i, u in enumerate(uops) if u.op is UOps.IF]
  ends = {u.src[0]: i for i, u in enumerate(uops) if u.op in (UOps.ENDIF, UOps.ENDRANGE)}
  tiles = [i for i, u in enumerate(uops) if u.op is UOps.RANGE and not u.arg[1] and ifs[0] < i < ends[uops[ifs[0]]]]
  assert tiles, "the interior copy's IF does not hold a tile loop"
  blocks = [u for u in uops if u.op is UOps.RANGE and isinstance(loop_mark(u), ReduceBlock)]
  assert len(blocks) == 1 and isinstance(loop_mark(blocks[0]).of.arg[0], tuple)   # the interior copy's reduce
  assert ifs[0] < uops.index(blocks[0]) < ends[uops[ifs[0]]]
  assert [u.op for u in uops].count(UOps.DEFINE_LOCAL) == 1                       # its panel
  assert versioned.tobytes() == plain.tobytes()
  np.testing.assert_allclose(versioned, a.astype(np.float64) @ b, rtol=1e-5, atol=1e-5)

@needs_cc
@pytest.mark.parametrize("w", (4, 8))
def test_a_padded_row_axis_splits_the_tile_loop_and_its_copy_is_blocked(w):
  """A PADTO'd row axis (100 rows to 102, 17 tiles of 6) is the interchanged tile loop itself, so the box narrows it
  to its first 16 tiles: the loop is split there, a loop over those 16 runs the interior copy, a plain
  tile nest that reduce blocking and panel packing take (K = 96 in 4 blocks of 24), and the tile loop after it runs
  the gated region for the last tile only (an IF). Bit for bit the unversioned kernel, and numpy."""
  rng = np.random.default_rng(w)
  a, b = rng.standard_normal((100, 96)).astype(np.float32), rng.standard_normal((96, 64)).astype(np.float32)
  uops: list = []
  tile = [Opt(OptOps.PADTO, 0, 6), Opt(OptOps.UPCAST, 0, 6), Opt(OptOps.UPCAST, 1, 2 * w)]
  (plain, _, _), (versioned, _, _) = _padded_matmul(w, False, a, b, 24, opts=tile), \
    _padded_matmul(w, True, a, b, 24, uops, opts=tile)
  copies = [u for u in uops if u.op is UOps.RANGE and isinstance(u.arg[0], tuple) and not u.arg[1]]
  assert len(copies) == 1 and copies[0].src[1].arg - copies[0].src[0].arg == 16   # the box's tiles
  blocks = [u for u in uops if u.op is UOps.RANGE and isinstance(loop_mark(u), ReduceBlock)]
  assert len(blocks) == 1 and isinstance(loop_mark(blocks[0]).of.arg[0], tuple)   # the interior copy's reduce
  assert [u.op for u in uops].count(UOps.DEFINE_LOCAL) == 1                       # its panel
  tile = next(i for i, u in enumerate(uops) if u.op is UOps.RANGE and u.arg[0] == 0 and not u.arg[1])
  assert uops.index(copies[0]) < tile and any(u.op is UOps.IF for u in uops[tile:])
  assert versioned.tobytes() == plain.tobytes()
  np.testing.assert_allclose(versioned, a.astype(np.float64) @ b, rtol=1e-5, atol=1e-5)

# ***** reduces hoisted out of the tile loop *****

def _attention_softmax(nq: int, t: int, d: int):
  """softmax_j(q @ k.T) as one kernel (docs/fusion.md): the row max and the row sum of exp are reduces over the keys
  that the output loop over keys reads, so the lowerer hoists them above it; q (nq, d) and k (t, d) are loaded through
  views of the full shape (nq, t, t, t, d)."""
  from kernopt.ast import exp2, max as rmax, mul, sub, sum as rsum, view, div
  def score(shape, key_axis):
    qs = [d if a == 0 else 1 if a == 4 else 0 for a in range(5)]
    ks = [d if a == key_axis else 1 if a == 4 else 0 for a in range(5)]
    return rsum(mul(load(1, dtypes.float, view(shape, qs)), load(2, dtypes.float, view(shape, ks))), 4)
  exp = lambda v: exp2(mul(v, 1.4426950408889634))   # noqa: E731
  total = rsum(exp(sub(score((nq, t, t, 1, d), 2), rmax(score((nq, t, t, t, d), 3), 3))), 2)
  return kernel(store(0, div(exp(sub(score((nq, t, 1, 1, d), 1), rmax(score((nq, t, 1, t, d), 3), 3))), total)))

@needs_cc
@pytest.mark.parametrize("w", WIDTHS)
def test_interior_copy_reads_reduces_hoisted_before_the_tile_loop(w):
  """PADTO of the query axis (2 -> 4) gates every load of the hoisted reduces by the same atom the box folds. The
  interior copy must read their results, not rebuild them over the folded gate: the rebuilt max was updated again
  inside the copy over the closed loop's index (an independent tester: gcc "'ridx1' undeclared", in about 5% of
  random Opts on this kernel). Against numpy, and bit for bit against the unversioned kernel."""
  nq, t, d = 2, 9, 3
  rng = np.random.default_rng(w)
  q, kt = rng.standard_normal((nq, d)).astype(np.float32), rng.standard_normal((t, d)).astype(np.float32)
  s = q.astype(np.float64) @ kt.astype(np.float64).T
  e = np.exp(s - s.max(1, keepdims=True))
  outs, ifs = [], []
  for split in (False, True):
    dev = Device.open("CPU", threads=1, vector_width=w)
    dev.renderer.caps = replace(dev.renderer.caps, split_borders=split)
    k = Kernel(_attention_softmax(nq, t, d), opts=dev.renderer)
    k.apply_opt(Opt(OptOps.PADTO, 0, 4))
    prg = k.to_program()
    ifs.append(sum(u.op is UOps.IF for u in prg.uops))
    out = Buffer(dev, nq * t, dtypes.float)
    dev.compile(prg)(out, Buffer(dev, q.size, dtypes.float).copyin(q.reshape(-1)),
                     Buffer(dev, kt.size, dtypes.float).copyin(kt.reshape(-1)), wait=True)
    outs.append(out.numpy())
  assert ifs[1] > ifs[0], "the borders pass did not version this kernel"
  assert outs[0].tobytes() == outs[1].tobytes()
  np.testing.assert_allclose(outs[1].reshape(nq, t), e / e.sum(1, keepdims=True), rtol=1e-5, atol=1e-6)
