"""The native profile's matmul machinery beyond the register tile: float32 sums of products accumulated in one
rounding (MULACC, `fused_accumulate`) and the B panel packed into a contiguous stack buffer (`panel_packing`). Fused
lanes must equal the scalar fmaf bit for bit; the panel must not change a single bit; both against numpy too."""
import platform
from dataclasses import replace
import numpy as np
import pytest
from catalogue import get
from kernopt.dtype import dtypes
from kernopt.kernel import Kernel, Opt, OptOps
from kernopt.ops import BinaryOps, TernaryOps
from kernopt.renderers.cstyle import CRenderer
from kernopt.passes import interchange, panel_packing, vectorize
from kernopt.renderers.native import NativeCRenderer, host_has_fma
from kernopt.runtime import Buffer, Device, cpu
from kernopt.uops import UOps

needs_cc = pytest.mark.skipif(not cpu.CPUDevice.availability()[0], reason="no C compiler")

def protocol(ast, renderer) -> Kernel:
  k = Kernel(ast, opts=renderer).required_optimizations()
  if not k.apply_tensor_cores(): k.hand_coded_optimizations()
  return k

def run(case, prg, dev, seed=7):
  ins = case.inputs(np.random.default_rng(seed))
  bufs = {b.idx: Buffer("CPU", b.numel, b.dtype) for b in case.buffers}
  for b in case.buffers:
    if not b.output: bufs[b.idx].copyin(ins[b.idx])
  dev.compile(prg)(*[bufs[i] for i in sorted(bufs)])
  want = case.reference(ins, {})[0].reshape(-1)
  return bufs[0].numpy()[:want.size], want

def updates(uops):
  """The value each accumulator's PHI assigns."""
  return [u.src[1] for u in uops if u.op is UOps.PHI]

# ***** fused accumulation *****

@pytest.mark.skipif(platform.machine().lower() in ("aarch64", "arm64"), reason="every AArch64 core has FMA")
@pytest.mark.parametrize("flags,fma", [("sse2 avx avx2 fma", True), ("sse2 avx avx2", False)])
def test_host_fma_from_cpuinfo(tmp_path, flags, fma):
  path = tmp_path / "cpuinfo"
  path.write_text(f"processor\t: 0\nflags\t\t: {flags}\n")
  assert host_has_fma(str(path)) is fma

@pytest.mark.parametrize("fused", [True, False])
def test_sum_of_products_lowers_to_mulacc_only_when_fused(fused):
  r = NativeCRenderer(vector_width=8, threads=1, fused_accumulate=fused)
  ups = updates(Kernel(get("matmul_64").ast, opts=r).linearize().uops)
  assert ups and all(u.op is UOps.ALU for u in ups)
  if fused:
    # MULACC(a, b, acc): the accumulator is the addend
    assert all(u.arg is TernaryOps.MULACC and u.src[2].op is UOps.DEFINE_ACC for u in ups)
  else: assert all(u.arg is BinaryOps.ADD and u.src[1].arg is BinaryOps.MUL for u in ups)

@pytest.mark.parametrize("name", ["sum_axis1", "max_axis1"])
def test_other_reduces_are_not_fused(name):
  r = NativeCRenderer(vector_width=8, threads=1, fused_accumulate=True)
  ups = updates(Kernel(get(name).ast, opts=r).linearize().uops)
  assert ups and not any(u.arg is TernaryOps.MULACC for u in ups)

def test_fused_accumulate_is_a_capability():
  a, b = NativeCRenderer(threads=1, fused_accumulate=True), NativeCRenderer(threads=1, fused_accumulate=False)
  assert a.capabilities()["fused_accumulate"] and not b.capabilities()["fused_accumulate"]
  assert CRenderer().capabilities()["fused_accumulate"] is False   # the spec's profile rounds every op

@needs_cc
def test_fused_vector_lanes_equal_scalar_fmaf():
  """The packed kernel's vector FMA computes, lane by lane, exactly the static profile's scalar fmaf."""
  case = get("matmul_64")
  opts = [Opt(OptOps.UPCAST, 1, 8), Opt(OptOps.UPCAST, 0, 4)]
  scalar = CRenderer()
  scalar.caps = replace(scalar.caps, fused_accumulate=True)
  outs = []
  for r, dev in ((NativeCRenderer(vector_width=8, threads=1, fused_accumulate=True), Device.open("CPU", threads=1)),
                 (scalar, Device.open("CPU", profile="static"))):
    k = Kernel(case.ast, opts=r)
    for o in opts: k.apply_opt(o)
    prg = k.to_program()
    assert ("ko_fma_float8" in prg.src) is (r is not scalar) and ("fmaf(" in prg.src)
    outs.append(run(case, prg, dev))
  (vec, want), (sca, _) = outs
  assert vec.tobytes() == sca.tobytes()
  np.testing.assert_allclose(vec, want, rtol=1e-4, atol=1e-4)

# ***** the packed B panel *****

@needs_cc
@pytest.mark.parametrize("name,scale,block,threads", [("matmul_64", "small", 16, 1), ("matmul_512", "large", 0, 2)])
def test_panel_keeps_every_bit(name, scale, block, threads):
  """matmul_64 with a reduce block of 16 (the panel holds one block), matmul_512 unblocked (the whole K)."""
  case, dev = get(name, scale), Device.open("CPU", threads=threads, min_parallel_work=0)
  res = []
  for panel in (1 << 15, 0):
    r = NativeCRenderer(vector_width=8, threads=threads, min_parallel_work=0)
    r.caps = replace(r.caps, reduce_block=block, panel_elements=panel)
    prg = protocol(case.ast, r).to_program()
    assert ("panel" in prg.src) is bool(panel)
    res.append(run(case, prg, dev))
  (packed, want), (plain, _) = res
  assert packed.tobytes() == plain.tobytes()
  np.testing.assert_allclose(packed, want, rtol=1e-3, atol=1e-3)

def _tile_uops(name, scale="small"):
  r = NativeCRenderer(vector_width=8, threads=1)
  return vectorize(interchange(protocol(get(name, scale).ast, r).linearize().lowered_uops), 8)

def test_panel_copies_b_and_reads_it_in_the_reduce():
  uops = _tile_uops("matmul_64")
  new = panel_packing(uops, 1 << 15)
  panels = [u for u in new if u.op is UOps.DEFINE_LOCAL]
  assert len(panels) == 1 and panels[0].arg[1] == 64 * 16   # K rows of the tile's 16 columns
  loads = [u for u in new if u.op is UOps.LOAD and u.src[0] is panels[0]]
  stores = [u for u in new if u.op is UOps.STORE and u.src[0] is panels[0]]
  assert len(loads) == len(stores) == 2 and all(ld.dtype.count == 8 for ld in loads)
  # the copy loop runs before the tile loop it serves
  assert new.index(stores[-1]) < min(new.index(ld) for ld in loads)

def test_panel_refuses_what_it_cant_hold():
  uops = _tile_uops("matmul_64")
  assert panel_packing(uops, 64 * 16 - 1) == uops
  add = Kernel(get("add").ast, opts=NativeCRenderer(vector_width=8, threads=1)).linearize().uops
  assert panel_packing(add, 1 << 15) == add

# ***** cpu.six_rows: a 6 x 2-vector tile where 6 divides the rows *****

@needs_cc
@pytest.mark.parametrize("w", [4, 8, 16])
@pytest.mark.parametrize("M,N,K", [(48, 64, 40), (6, 32, 24), (12, 255, 20), (64, 64, 40), (100, 32, 17), (20, 32, 8),
                                   (64, 255, 16)])
def test_six_row_tiles(w, M, N, K):
  """At widths 4 and 8 (16 vector registers) a two-vector matmul tile whose rows 6 divides takes 6 rows, upcast
  before the columns (12 accumulators; M = 6 upcasts the whole axis, 255 columns are padded first); other rows, and
  width 16 (32 registers), keep their tiles. Each kernel equals numpy's matmul."""
  from catalogue import _matmul_ast
  dev = Device.open("CPU", threads=1, vector_width=w)
  k = protocol(_matmul_ast(M, N, K), dev.renderer)
  ups = [(o.op, o.amt) for o in k.applied_opts if o.op is OptOps.UPCAST]
  padded_rows = [o for o in k.applied_opts if o.op is OptOps.PADTO and o.amt == 6]
  six = w < 16 and M % 6 == 0
  assert (ups[:2] == [(OptOps.UPCAST, 6), (OptOps.UPCAST, 2 * w)]) == six, k.applied_opts
  assert not padded_rows, k.applied_opts
  _matches_numpy(dev, k.to_program(), M, N, K, np.random.default_rng(M * N + w))

@needs_cc
def test_six_row_tiles_on_random_shapes():
  """Seeded random matmuls (M 1-300, N 1-80, K 1-300) at widths 4 and 8, on 1 and 2 threads, by the standard protocol
  and, every other shape, with the row axis PADTO'd to a multiple of 6 and a 6 x 2-vector tile (the borders pass's
  split tile loop), each equal to numpy's matmul. 16 shapes by default, FUZZ_N * 16 when FUZZ_N is set."""
  import os
  from catalogue import _matmul_ast
  rng = np.random.default_rng(int(os.environ.get("FUZZ_SEED", "0")))
  devs = {(w, t): Device.open("CPU", threads=t, vector_width=w, min_parallel_work=0) for w in (4, 8) for t in (1, 2)}
  seen_split = 0
  for _ in range(16 * int(os.environ.get("FUZZ_N", "1"))):
    M, N, K = int(rng.integers(1, 301)), int(rng.integers(1, 81)), int(rng.integers(1, 301))
    w = int(rng.choice([4, 8]))
    dev = devs[(w, int(rng.integers(1, 3)))]
    if rng.integers(2) and M > 6 and M % 6 and N % (2 * w) == 0:
      k = Kernel(_matmul_ast(M, N, K), opts=dev.renderer).required_optimizations()
      for o in (Opt(OptOps.PADTO, 0, 6), Opt(OptOps.UPCAST, 0, 6), Opt(OptOps.UPCAST, 1, 2 * w)): k.apply_opt(o)
    else: k = protocol(_matmul_ast(M, N, K), dev.renderer)
    prg = k.to_program()
    seen_split += any(u.op is UOps.RANGE and isinstance(u.arg[0], tuple) and u.arg[0][1] == 0 for u in prg.uops)
    _matches_numpy(dev, prg, M, N, K, rng, f"{M}x{N}x{K} {k.applied_opts} {dev.renderer.caps.vector_width}")
  assert seen_split, "no shape took the split tile loop"

def _matches_numpy(dev, prg, M, N, K, rng, msg=""):
  """prg, an M x K by K x N matmul, run on dev on standard normal inputs from rng equals numpy's float64 product."""
  a, b = rng.standard_normal((M, K), np.float32), rng.standard_normal((K, N), np.float32)
  out, ba, bb = Buffer("CPU", M * N, dtypes.float), Buffer("CPU", M * K, dtypes.float).copyin(a.ravel()), \
    Buffer("CPU", K * N, dtypes.float).copyin(b.ravel())
  dev.compile(prg)(out, ba, bb, wait=True)
  np.testing.assert_allclose(out.numpy().reshape(M, N), a.astype(np.float64) @ b, rtol=1e-4, atol=1e-4, err_msg=msg)

# ***** PADTO'd columns: the tile stays vectors, its last columns stored through a lane mask *****

def _mm(dev, M, N, K, opts, seed):
  from catalogue import _matmul_ast
  k = Kernel(_matmul_ast(M, N, K), opts=dev.renderer).required_optimizations()
  for o in opts: k.apply_opt(o)
  prg = k.to_program()
  _matches_numpy(dev, prg, M, N, K, np.random.default_rng(seed), f"{M}x{N}x{K} {opts}")
  return prg

@needs_cc
@pytest.mark.parametrize("w", [4, 8, 16])
@pytest.mark.parametrize("N", [9, 23, 37, 999 % 64])
def test_padded_columns_keep_the_tile_in_vectors(w, N):
  """A matmul tile whose column axis is PADTO'd to two vectors (N no multiple of 2w): A's element, the same for every
  column, is loaded once and broadcast (the padding's gate on it is dropped: only stored lanes are ever read back),
  B's row is a masked vector load, each accumulator one vector, and each row's store a masked vector STORE (an int32
  lane mask as its fourth source) where the guard differs between a vector's lanes, not the whole kernel in scalar
  lanes. Each kernel equals numpy's matmul, on 1 and 2 threads."""
  M, K = 12, 23
  opts = [Opt(OptOps.PADTO, 1, 2 * w), Opt(OptOps.UPCAST, 1, 2 * w), Opt(OptOps.UPCAST, 0, 4)]
  for threads in (1, 2):
    dev = Device.open("CPU", threads=threads, vector_width=w, min_parallel_work=0)
    uops = _mm(dev, M, N, K, opts, seed=N + w).uops
    if N < w: continue   # one tile, its second vector all padding: stored by no lane (numbers checked only)
    stores = [u for u in uops if u.op is UOps.STORE]
    assert all(u.src[2].dtype.count == w for u in stores), [u.src[2].dtype for u in stores]
    assert any(len(u.src) == 4 and u.src[3].dtype == dtypes.int32 for u in stores)
    a_loads = [u for u in uops if u.op is UOps.LOAD and u.src[0].arg[0] == 1]
    assert a_loads and all(len(u.src) == 2 for u in a_loads)
    assert not [u for u in uops if u.op is UOps.DEFINE_ACC and u.dtype.count == 1]

@needs_cc
def test_padded_columns_on_random_shapes():
  """Seeded random matmuls (M 2-70, N 2-100, K 1-70) with the column axis PADTO'd to two vectors and random rows
  upcast, at widths 4, 8 and 16, on 1 and 2 threads, each equal to numpy's matmul. 12 shapes by default, FUZZ_N * 12
  when FUZZ_N is set."""
  import os
  rng, ran = np.random.default_rng(int(os.environ.get("FUZZ_SEED", "0")) + 18), 0
  for _ in range(12 * int(os.environ.get("FUZZ_N", "1"))):
    M, N, K = int(rng.integers(2, 71)), int(rng.integers(2, 101)), int(rng.integers(1, 71))   # (size 1 drops an axis)
    w = int(rng.choice([4, 8, 16]))
    dev = Device.open("CPU", threads=int(rng.integers(1, 3)), vector_width=w, min_parallel_work=0)
    rows = [r for r in (2, 3, 4, 6, 8) if M % r == 0]
    opts = [Opt(OptOps.PADTO, 1, 2 * w)] if N % (2 * w) else []   # (PADTO refuses an axis with nothing to pad)
    opts.append(Opt(OptOps.UPCAST, 1, 2 * w))
    if rows and rng.integers(2): opts.append(Opt(OptOps.UPCAST, 0, int(rng.choice(rows))))
    if -(-N // (2 * w)) * 2 * w >= 4 * N: continue   # PADTO refuses to quadruple the work
    _mm(dev, M, N, K, opts, seed=int(rng.integers(1 << 30)))
    ran += 1
  assert ran >= 8 * int(os.environ.get("FUZZ_N", "1"))
