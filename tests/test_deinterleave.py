"""Stride-2 gathers as two vector loads and a shuffle (kernopt/passes/deinterleave.py, caps.deinterleave, native
profile): every lane of the rewritten vector reads the element its scalar load read, the two loads stay inside the
lanes' own span (checked on the index math), and the kernels run bit for bit as without the pass and against numpy at
widths 4, 8 and 16 (pinned renderers), including gathers whose last lane is the buffer's last element and gathers of
a padded window's gated lanes (two masked loads that open only the lanes' elements, each where its lane's gate
holds)."""
from dataclasses import replace
import numpy as np
import pytest
from catalogue import get
from kernopt.ast import kernel, load, reduce, store, view
from kernopt.dtype import dtypes
from kernopt.kernel import Kernel, Opt, OptOps
from kernopt.ops import ReduceOps
from kernopt.passes import deinterleave, passes_for, run_passes
from kernopt.passes.deinterleave import stride2_lanes
from kernopt.passes.lists import index_value
from kernopt.runtime import Buffer, Device, cpu
from kernopt.uops import UOps

needs_cc = pytest.mark.skipif(not cpu.CPUDevice.availability()[0], reason="no C compiler")
WIDTHS = (4, 8, 16)

def _device(w: int, on: bool):
  dev = Device.open("CPU", threads=1, vector_width=w)
  dev.renderer.caps = replace(dev.renderer.caps, deinterleave=on)
  return dev

def _before_pass(ast, w: int) -> list:
  """The list the deinterleave pass receives under the native profile at width w."""
  r = _device(w, True).renderer
  k = Kernel(ast, opts=r).required_optimizations()
  k.hand_coded_optimizations()
  ps = passes_for(r)
  return run_passes(k.linearize().lowered_uops, ps[:[p.name for p in ps].index("deinterleave")])

@pytest.mark.parametrize("w", WIDTHS)
def test_each_lane_reads_the_element_its_scalar_load_read_and_no_further(w):
  uops = _before_pass(get("conv2d_s2", "large").ast, w)
  gathers = [u for u in uops if stride2_lanes(u) is not None]
  assert gathers, "no stride-2 gather in the conv's list"
  out = deinterleave(uops)
  assert not any(stride2_lanes(u) is not None for u in out)
  new = [u for u in out if u.op is UOps.VECTORIZE and all(s.op is UOps.GEP for s in u.src)]
  assert len(new) == len(set(gathers))
  for old, vec in zip(dict.fromkeys(gathers), dict.fromkeys(new)):
    n, memo = len(old.src), {}
    want = [index_value(ln.src[1], {}, memo) for ln in old.src]
    got = [index_value(g.src[0].src[1], {}, memo) + g.arg for g in vec.src]
    assert got == want and want == [want[0] + 2 * i for i in range(n)]
    for v in {g.src[0] for g in vec.src}:   # each vector load's n elements lie within the lanes' span
      lo = index_value(v.src[1], {}, memo)
      assert want[0] <= lo and lo + n - 1 <= want[-1] and v.dtype.count == n

def test_other_strides_and_gated_lanes_stay_gathers():
  uops = _before_pass(get("conv2d", "small").ast, 8)   # stride 1 (and padded): nothing to deinterleave
  assert deinterleave(uops) == uops and deinterleave(uops, masked=True) == uops
  s2 = _before_pass(get("conv2d_s2", "large").ast, 16)   # padded at stride 2: gated lanes stay gathers unless masked
  gated = [u for u in s2 if stride2_lanes(u, masked=True) is not None and stride2_lanes(u) is None]
  assert gated and all(stride2_lanes(u) is None for u in deinterleave(s2) if u in gated)

@needs_cc
@pytest.mark.parametrize("w", WIDTHS)
def test_gated_stride2_lanes_are_two_masked_loads_bit_for_bit(w):
  """The reference's padded stride-2 conv (16x32x32, 3x3, stride 2, padding 1): its window rows' gathers, gated by the
  padding, become two masked vector loads (LOAD with an int32 lane mask) and a shuffle, without the gathers left;
  the results are bit for bit those of the gathered lanes (the pass off) and numpy's."""
  from catalogue import conv2d_s2_ast
  N, C, H, W, CO = 1, 16, 32, 32, 16
  rng = np.random.default_rng(w)
  x, wgt = rng.standard_normal((N, C, H, W), np.float32), rng.standard_normal((CO, C, 3, 3), np.float32)
  xp = np.pad(x.astype(np.float64), ((0, 0), (0, 0), (1, 1), (1, 1)))
  want = sum(np.einsum("nchw,oc->nohw", xp[:, :, ky:ky + H:2, kx:kx + W:2], wgt[:, :, ky, kx]) for ky in range(3)
             for kx in range(3))
  outs = []
  for on in (False, True):
    dev = _device(w, on)
    k = Kernel(conv2d_s2_ast(N, C, H, W, CO), opts=dev.renderer).required_optimizations()
    k.hand_coded_optimizations()
    prg = k.to_program()
    masked = [u for u in prg.uops if u.op is UOps.LOAD and len(u.src) == 3 and u.src[2].dtype == dtypes.int32 and
              u.dtype.count == w]
    shuffles = [u for u in prg.uops if u.op is UOps.VECTORIZE and u.src and all(s.op is UOps.GEP for s in u.src)]
    assert bool(shuffles and {s.src[0] for v in shuffles for s in v.src} & set(masked)) == on
    out = Buffer(dev, want.size, dtypes.float)
    dev.compile(prg)(out, Buffer(dev, x.size, dtypes.float).copyin(x), Buffer(dev, wgt.size, dtypes.float).copyin(wgt),
                     wait=True)
    outs.append(out.numpy())
  assert outs[0].tobytes() == outs[1].tobytes()
  np.testing.assert_allclose(outs[1].reshape(want.shape), want, rtol=1e-4, atol=1e-4)

@needs_cc
@pytest.mark.parametrize("w", WIDTHS)
def test_stride2_conv_bit_identical_and_matches_numpy(w):
  case = get("conv2d_s2", "large")
  ins = case.inputs(np.random.default_rng(w))
  outs = []
  for on in (False, True):
    dev = _device(w, on)
    k = Kernel(case.ast, opts=dev.renderer).required_optimizations()
    k.hand_coded_optimizations()
    prg = k.to_program()
    assert any(u.op is UOps.VECTORIZE and u.src and all(s.op is UOps.GEP for s in u.src) for u in prg.uops) == on
    bufs = {b.idx: Buffer(dev, b.numel, b.dtype) for b in case.buffers}
    for b in case.buffers:
      if not b.output: bufs[b.idx].copyin(ins[b.idx])
    dev.compile(prg)(*[bufs[a.idx] for a in prg.args], wait=True)
    outs.append(bufs[0].numpy())
  assert outs[0].tobytes() == outs[1].tobytes()
  want = case.reference(ins, {})[0].reshape(-1)
  np.testing.assert_allclose(outs[1][:want.size], want, rtol=1e-4, atol=1e-4)

@needs_cc
@pytest.mark.parametrize("w", WIDTHS)
def test_a_gather_ending_at_the_buffers_last_element(w):
  """Pairwise sums out[i] = x[2i] + x[2i + 1] (a stride-2 window of 2) with x of exactly 2n elements: the odd taps'
  last tile ends on x's last element, and its second load too."""
  n = 4 * w
  x = np.random.default_rng(w).standard_normal(2 * n).astype(np.float32)
  dev = _device(w, True)
  pairs = load(1, dtypes.float, view((n, 2), (2, 1)))
  k = Kernel(kernel(store(0, reduce(ReduceOps.SUM, pairs, (1,)))), opts=dev.renderer)
  k.apply_opt(Opt(OptOps.UPCAST, 0, w))
  prg = k.to_program()
  assert any(u.op is UOps.VECTORIZE and u.src and all(s.op is UOps.GEP for s in u.src) for u in prg.uops)
  out = Buffer(dev, n, dtypes.float)
  dev.compile(prg)(out, Buffer(dev, x.size, dtypes.float).copyin(x), wait=True)
  assert out.numpy().tobytes() == (x[0::2] + x[1::2]).tobytes()

@needs_cc
@pytest.mark.parametrize("flags", [["-mavx2"], ["-mno-avx"]], ids=["avx2", "generic"])
def test_the_8_lane_shuffle_helper_picks_even_lanes_of_a_and_odd_lanes_of_b(tmp_path, flags):
  """ko_deint_float8, the native dialect's spelling of the pass's 8-lane shuffle, on both of its paths (AVX2's
  vshufps + vpermpd, and the lanes one by one), against numpy's slicing."""
  import ctypes
  import platform
  import subprocess
  from kernopt.renderers.x86_helpers import DEINT8
  if flags == ["-mavx2"] and platform.machine().lower() not in ("x86_64", "amd64"): pytest.skip("x86 only")
  src = "\n".join(["typedef float float8 __attribute__((aligned(32), vector_size(32)));", DEINT8.format(vt="float8"),
                   "void run(const float* a, const float* b, float* out) {",
                   "  float8 x, y; __builtin_memcpy(&x, a, 32); __builtin_memcpy(&y, b, 32);",
                   "  float8 r = ko_deint_float8(x, y); __builtin_memcpy(out, &r, 32); }"])
  (tmp_path / "d.c").write_text(src)
  so = tmp_path / "d.so"
  subprocess.run(["gcc", "-O2", *flags, "-shared", "-fPIC", str(tmp_path / "d.c"), "-o", str(so)], check=True)
  run = ctypes.CDLL(str(so)).run
  a, b = np.arange(8, dtype=np.float32), np.arange(100, 108, dtype=np.float32)
  out = np.zeros(8, np.float32)
  ptr = lambda x: x.ctypes.data_as(ctypes.c_void_p)  # noqa: E731
  run(ptr(a), ptr(b), ptr(out))
  assert out.tolist() == a[0::2].tolist() + b[1::2].tolist()

@needs_cc
def test_width_8_spells_the_shuffle_with_the_helper():
  case = get("conv2d_s2", "large")
  k = Kernel(case.ast, opts=_device(8, True).renderer).required_optimizations()
  k.hand_coded_optimizations()
  assert "ko_deint_float8(" in k.to_program().src
