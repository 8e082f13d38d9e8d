"""Tensor-core fragment layouts of the PYTHON device against the vendors' documentation, and warp-level WMMA
(alone and inside a kernel on the PYTHON device) against numpy."""
import numpy as np
import pytest
from kernopt.dtype import dtypes
from kernopt.ops import BinaryOps, WMMAArg
from kernopt.runtime import Buffer, Device
from kernopt.runtime.python import make_program
from kernopt.runtime.python_alu import EmulationError
from kernopt.runtime.python_wmma import (WMMA_LAYOUTS, amd_a_elem, amd_b_elem, amd_c_elem, cuda_a_elem, cuda_b_elem,
                                         cuda_c_elem, metal_elem, wmma_warps)
from kernopt.uops import UOp, UOps

# (lane, element) -> (row, col), transcribed by hand from the figures of the PTX ISA, section 9.7.13.4.8
# ("Matrix Fragments for mma.m16n8k16 with floating point type"): groupID = lane >> 2, threadID_in_group = lane % 4.
PTX_A = {(0, 0): (0, 0), (0, 1): (0, 1), (0, 2): (8, 0), (0, 5): (0, 9), (0, 7): (8, 9), (1, 0): (0, 2),
         (5, 3): (9, 3), (6, 4): (1, 12), (31, 0): (7, 6), (31, 7): (15, 15)}
PTX_B = {(0, 0): (0, 0), (0, 1): (1, 0), (0, 2): (8, 0), (0, 3): (9, 0), (1, 0): (2, 0), (4, 0): (0, 1),
         (13, 2): (10, 3), (31, 0): (6, 7), (31, 3): (15, 7)}
PTX_C = {(0, 0): (0, 0), (0, 1): (0, 1), (0, 2): (8, 0), (0, 3): (8, 1), (1, 0): (0, 2), (4, 0): (1, 0),
         (10, 2): (10, 4), (31, 0): (7, 6), (31, 3): (15, 7)}
# AMD "RDNA3" Instruction Set Architecture reference guide, section 7.9 (WMMA), wave32, 16x16x16 f16 -> f32:
# A and B replicated in lanes 0-15 and 16-31; C/D element j of lane l is row 2j + l//16, column l % 16.
RDNA3_A = {(0, 0): (0, 0), (0, 15): (0, 15), (5, 3): (5, 3), (15, 7): (15, 7), (16, 0): (0, 0), (21, 3): (5, 3),
           (31, 15): (15, 15)}
RDNA3_B = {(0, 0): (0, 0), (5, 3): (3, 5), (20, 9): (9, 4), (31, 15): (15, 15), (15, 1): (1, 15)}
RDNA3_C = {(0, 0): (0, 0), (0, 1): (2, 0), (16, 0): (1, 0), (16, 7): (15, 0), (5, 3): (6, 5), (20, 2): (5, 4),
           (31, 7): (15, 15)}
# Metal simdgroup_matrix 8x8: Apple publishes no per-thread layout. This table is the layout implied by the spec's
# Metal tensor-core permutations (and tinygrad's emulator), the same for A, B, C and D.
METAL = {(0, 0): (0, 0), (0, 1): (0, 1), (1, 0): (0, 2), (2, 0): (1, 0), (8, 0): (0, 4), (16, 0): (4, 0),
         (13, 1): (2, 7), (31, 1): (7, 7)}

@pytest.mark.parametrize("fn,table", [(cuda_a_elem, PTX_A), (cuda_b_elem, PTX_B), (cuda_c_elem, PTX_C),
                                      (amd_a_elem, RDNA3_A), (amd_b_elem, RDNA3_B), (amd_c_elem, RDNA3_C),
                                      (metal_elem, METAL)], ids=lambda x: getattr(x, "__name__", ""))
def test_layout_matches_documentation(fn, table):
  for (lane, i), rc in table.items(): assert fn(lane, i) == rc, (fn.__name__, lane, i)

@pytest.mark.parametrize("device", sorted(WMMA_LAYOUTS))
def test_layout_covers_each_element(device):
  lay = WMMA_LAYOUTS[device]
  m, n, k = lay.mnk
  copies = 2 if lay.replicated else 1
  for which, shape in enumerate(((m, k), (k, n), (m, n))):
    rows, cols = lay.index(which)
    counts = np.zeros(shape, int)
    np.add.at(counts, (rows, cols), 1)
    assert (counts == (copies if which < 2 else 1)).all(), (device, which)

# the documented layouts again, written as (row, col) -> [(lane, element)] so that fragments are distributed
# independently of the functions under test
def _inv_cuda(which, r, c):
  if which == 0: return [(4 * (r % 8) + (c % 8) // 2, c % 2 + 2 * (r // 8) + 4 * (c // 8))]
  if which == 1: return [(4 * c + (r % 8) // 2, r % 2 + 2 * (r // 8))]
  return [(4 * (r % 8) + c // 2, c % 2 + 2 * (r // 8))]

def _inv_amd(which, r, c):
  if which == 0: return [(r, c), (r + 16, c)]
  if which == 1: return [(c, r), (c + 16, r)]
  return [(c + 16 * (r % 2), r // 2)]

def _inv_metal(which, r, c): return [((c // 2) % 2 + 2 * (r % 4) + 8 * (c // 4) + 16 * (r // 4), c % 2)]

INVERSE = {"CUDA": _inv_cuda, "AMD": _inv_amd, "METAL": _inv_metal}
SHAPES = {"CUDA": (16, 8, 16), "AMD": (16, 16, 16), "METAL": (8, 8, 8)}   # (M, N, K)
SIZES = {"CUDA": (8, 4, 4), "AMD": (16, 16, 8), "METAL": (2, 2, 2)}

def _scatter(device, which, mats):
  """Per-lane fragments (W, 32, n) of matrices (W, rows, cols)."""
  out = np.full((mats.shape[0], 32, SIZES[device][which]), np.nan, np.float32)
  for r in range(mats.shape[1]):
    for c in range(mats.shape[2]):
      for lane, i in INVERSE[device](which, r, c): out[:, lane, i] = mats[:, r, c]
  assert not np.isnan(out).any()
  return out

def _gather_d(device, frags):
  m, n, _ = SHAPES[device]
  d = np.zeros((frags.shape[0], m, n), np.float32)
  for r in range(m):
    for c in range(n):
      (lane, i), = INVERSE[device](2, r, c)
      d[:, r, c] = frags[:, lane, i]
  return d

def _random_problem(device, warps, rng, dtype_in=dtypes.half):
  m, n, k = SHAPES[device]
  a = rng.standard_normal((warps, m, k)).astype(np.float16).astype(np.float32)
  b = rng.standard_normal((warps, k, n)).astype(np.float16).astype(np.float32)
  c = rng.standard_normal((warps, m, n)).astype(np.float32)
  return a, b, c

@pytest.mark.parametrize("device", ["CUDA", "AMD", "METAL"])
def test_warp_wmma_matches_numpy(device):
  rng = np.random.default_rng(3)
  a, b, c = _random_problem(device, 3, rng)
  frags = [_scatter(device, w, x) for w, x in enumerate((a, b, c))]
  d = wmma_warps(device, frags[0].astype(np.float16), frags[1].astype(np.float16), frags[2], dtypes.half, dtypes.float)
  np.testing.assert_allclose(_gather_d(device, d), a @ b + c, rtol=1e-5, atol=1e-5)

def test_cuda_bfloat16_inputs_are_rounded():
  rng = np.random.default_rng(4)
  a, b, c = (rng.standard_normal(s).astype(np.float32) for s in ((1, 16, 16), (1, 16, 8), (1, 16, 8)))
  frags = [_scatter("CUDA", w, x) for w, x in enumerate((a, b, c))]
  d = wmma_warps("CUDA", *frags, dtypes.bfloat16, dtypes.float)
  def bf16(x): return ((x.view(np.uint32) + 0x7FFF + ((x.view(np.uint32) >> 16) & 1)) & 0xFFFF0000).view(np.float32)
  np.testing.assert_allclose(_gather_d("CUDA", d), bf16(a) @ bf16(b) + c, rtol=1e-5, atol=1e-5)

def test_amd_requires_replicated_lanes():
  rng = np.random.default_rng(5)
  a, b, c = _random_problem("AMD", 1, rng)
  frags = [_scatter("AMD", w, x) for w, x in enumerate((a, b, c))]
  frags[0][0, 20, 3] += 1
  with pytest.raises(EmulationError, match="replicate lanes 0-15 of A"):
    wmma_warps("AMD", frags[0], frags[1], frags[2], dtypes.half, dtypes.float)

TC_ARGS = {"CUDA": ((8, 16, 16), (8, 4, 4)), "AMD": ((16, 16, 16), (16, 16, 8)), "METAL": ((8, 8, 8), (2, 2, 2))}

@pytest.mark.parametrize("device", ["CUDA", "AMD", "METAL"])
def test_wmma_uop_on_python_device(device):
  """Two workgroups of 64 threads (four warps): thread t loads its fragments from frag buffers, runs WMMA, stores D."""
  dims, (na, nb, nc) = TC_ARGS[device]
  i32, h, f = dtypes.int32, dtypes.half, dtypes.float
  arg = WMMAArg(f"WMMA_{device}", dims, h, f, (na, nb, nc), device, (0, 0, 0), ())
  uops: list[UOp] = []
  def add(*a):
    u = UOp(*a)
    if u not in uops: uops.append(u)
    return u
  out, fa, fb, fc = (add(UOps.DEFINE_GLOBAL, dt, (), (i, f"data{i}", i == 0)) for i, dt in enumerate((f, h, h, f)))
  g, lid = add(UOps.SPECIAL, i32, (), (0, "gidx0", 2)), add(UOps.SPECIAL, i32, (), (0, "lidx0", 64))
  def mul(x, n): return add(UOps.ALU, i32, (x, add(UOps.CONST, i32, (), n)), BinaryOps.MUL)
  t = add(UOps.ALU, i32, (mul(g, 64), lid), BinaryOps.ADD)
  def frag(buf, dt, n): return add(UOps.LOAD, dt.vec(n), (buf, mul(t, n)))
  va, vb, vc = frag(fa, h, na), frag(fb, h, nb), frag(fc, f, nc)
  d = add(UOps.WMMA, f.vec(nc), (va, vb, vc), arg)
  add(UOps.STORE, None, (out, mul(t, nc), d))
  rng = np.random.default_rng(6)
  a, b, c = _random_problem(device, 4, rng)
  frags = [_scatter(device, w, x).reshape(-1) for w, x in enumerate((a, b, c))]
  dev = Device.open("PYTHON", emulate=device)
  prg = make_program(f"wmma_{device.lower()}", uops, (2,), (64,), {0: 128 * nc, 1: 128 * na, 2: 128 * nb, 3: 128 * nc},
                     emulate=device)
  bufs = [Buffer(dev.name, 128 * n, dt).copyin(x) for n, dt, x in
          ((nc, f, np.zeros(128 * nc, np.float32)), (na, h, frags[0]), (nb, h, frags[1]), (nc, f, frags[2]))]
  dev.compile(prg)(*bufs)
  got = _gather_d(device, bufs[0].numpy().reshape(4, 32, nc))
  np.testing.assert_allclose(got, a @ b + c, rtol=1e-5, atol=1e-5)
