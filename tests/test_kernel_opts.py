"""apply_opt: every refusal (each raises KernelOptError and leaves the kernel exactly as it was), the effect of a few
accepted Opts, and a seeded stress run over the whole Opt action space on every test AST and static dialect."""
import random
import zlib
import pytest
from catalogue import buf, catalogue, kernel, reduce, store
from test_kernel import G, GT, L, NL, U, UM, UN, bcast_add, ew_add, image_in_sum, image_out_add, matmul, matvec, \
                        padded_add, sum_all, sum_axis, sym_add, sym_sum, two_outputs, two_reduces
from kernopt.dtype import dtypes
from kernopt.errors import KernelOptError
from kernopt.helpers import prod
from kernopt.kernel import Kernel, Opt, OptOps
from kernopt.ops import BufferOps, ConstBuffer, LazyOp, MemBuffer, ReduceOps, UnaryOps
from kernopt.renderers import get_renderer
from kernopt.shape.shapetracker import ShapeTracker

TC, MERGE, PADTO = OptOps.TC, OptOps.MERGE, OptOps.PADTO
DIALECTS = ("CPU", "OPENCL", "CUDA", "METAL", "AMD")

def state(k):
  return (k.sts, k.applied_opts, k.group_for_reduces, k.upcasted, k.local_dims, k.tensor_core, k.tensor_core_opts,
          dict(k.bufs_for_tensor_core), k.dont_use_locals, k.full_shape, k.name)

def upcastmid_image():
  """An image output (1, 64, 4) reduced over 32: first_reduce 2, one unit-stride axis (1)."""
  out = MemBuffer(0, dtypes.imagef((1, 64, 4)), ShapeTracker.from_shape((64, 4, 1)))
  return kernel(LazyOp(BufferOps.STORE, (reduce(ReduceOps.SUM, buf(1, (64, 4, 32)), (2,)),), out))

def recip_sum():
  return kernel(store(reduce(ReduceOps.SUM, LazyOp(UnaryOps.RECIP, (buf(1, (1000, 1000)),)), (1,))))

def bitcast_neg_sum():
  """SUM(BITCAST(int32, NEG(x))): a padded x's NEG is -0.0, whose bits 0x80000000 the sum would add (the AST fuzzer,
  seed 31000)."""
  bits = LazyOp(UnaryOps.BITCAST, (LazyOp(UnaryOps.NEG, (buf(1, (3, 17)),)),), dtypes.int32)
  return kernel(store(reduce(ReduceOps.SUM, bits, (0, 1)), dtype=dtypes.int32))

def not_sum():
  """SUM(CAST(half, CAST(float, NEG(c)))) over 9 elements, c a bool: NEG of a bool is logical not, so a padded c
  (False) would count as True (the AST fuzzer, seed 46000: 32 instead of 9)."""
  c = LazyOp(BufferOps.CONST, (), ConstBuffer(False, dtypes.bool, ShapeTracker.from_shape((9,))))
  flt = LazyOp(UnaryOps.CAST, (LazyOp(UnaryOps.NEG, (c,)),), dtypes.float)
  return kernel(store(reduce(ReduceOps.SUM, LazyOp(UnaryOps.CAST, (flt,), dtypes.half), (0,)), dtype=dtypes.half))

mm64 = lambda: matmul(64, 64, 64)  # noqa: E731

# (id, builder, dialect, opts applied first, refused opt, message)
REFUSALS = [
  ("nolocals-local", ew_add, "OPENCL", [Opt(NL)], Opt(L, 0, 4), "locals are off"),
  ("nolocals-grouptop", sum_all, "OPENCL", [Opt(NL)], Opt(GT, 0, 16), "locals are off"),
  ("nolocals-group", sum_all, "OPENCL", [Opt(NL)], Opt(G, 0, 16), "locals are off"),
  ("nolocals-upcastmid", sum_all, "OPENCL", [Opt(NL)], Opt(UM, 0, 4), "locals are off"),
  ("tc-not-first", mm64, "METAL", [Opt(U, 0, 4)], Opt(TC, 0, 0), "first Opt"),
  ("tc-axis-none", mm64, "METAL", [], Opt(TC, None, 0), "int axis"),
  ("tc-amt-none", mm64, "METAL", [], Opt(TC, 0, None), "int axis"),
  ("tc-none-on-dialect", mm64, "OPENCL", [], Opt(TC, 0, 0), "no tensor cores"),
  ("tc-no-reduce", ew_add, "METAL", [], Opt(TC, 0, 0), "SUM reduce"),
  ("tc-max-reduce", lambda: sum_axis(1, (1024, 1024), ReduceOps.MAX), "METAL", [], Opt(TC, 0, 0), "SUM reduce"),
  ("tc-needs-pad", lambda: matmul(100, 37, 53), "METAL", [], Opt(TC, 0, 1), "no tensor core matches"),
  ("tc-axis-beyond-choices", mm64, "METAL", [], Opt(TC, 1, 0), "no tensor core matches"),
  ("tc-float-on-cuda", mm64, "CUDA", [], Opt(TC, 0, 2), "no tensor core matches"),
  ("axis-out-of-range", ew_add, "CPU", [], Opt(U, 1, 4), "out of range"),
  ("axis-none", ew_add, "CPU", [], Opt(U, None, 4), "non-negative"),
  ("unroll-axis-out-of-range", sum_all, "CPU", [], Opt(UN, 1, 4), "out of range"),
  ("amt-one", ew_add, "CPU", [], Opt(U, 0, 1), "is 1"),
  ("amt-none", ew_add, "CPU", [], Opt(U, 0, None), "needs an amount"),
  ("amt-symbolic", sym_add, "CPU", [], Opt(U, 0, 0), "symbolic"),
  ("amt-not-dividing", ew_add, "CPU", [], Opt(U, 0, 3), "does not divide"),
  ("amt-huge", ew_add, "CPU", [], Opt(U, 0, 10**9), "does not divide"),
  ("shared-memory", sum_all, "OPENCL", [], Opt(G, 0, 16384), "shared memory"),  # 16384 * 4 bytes > 32768
  # with a group, LOCAL counts too: 1024 * 4 bytes * 16 grouped threads > 32768
  ("shared-memory-after-group", lambda: sum_axis(2), "OPENCL", [Opt(G, 0, 16)], Opt(L, 0, 1024), "shared memory"),
  ("workgroup-size", ew_add, "CUDA", [], Opt(L, 0, 2048), "exceeds 1024"),
  ("local-on-cpu", ew_add, "CPU", [], Opt(L, 0, 4), "no local threads"),
  ("local-on-reduce", lambda: sum_axis(2), "OPENCL", [], Opt(L, 1, 4), "global axis"),
  ("group-on-cpu", sum_all, "CPU", [], Opt(G, 0, 16), "no local threads or shared"),
  ("group-on-upcast", lambda: sum_axis(2), "OPENCL", [Opt(UN, 0, 4)], Opt(G, 1, 4), "ungrouped reduce"),
  # no reduce: first_reduce == shape_len, so the real axis first_reduce + 0 is past the end
  ("group-no-reduce", ew_add, "OPENCL", [], Opt(G, 0, 4), "out of range"),
  ("group-with-tc", mm64, "METAL", [Opt(TC, 0, 0)], Opt(G, 0, 2), "tensor cores"),
  ("group-two-reduces", two_reduces, "OPENCL", [], Opt(G, 0, 16), "several reduces"),
  ("unroll-upcasted", sum_all, "CPU", [Opt(UN, 0, 4)], Opt(UN, 1, 2), "already upcasted"),
  ("unroll-too-much", sum_all, "CPU", [], Opt(UN, 0, 64), "exceeds 32"),
  ("upcast-reduce", lambda: sum_axis(2), "CPU", [], Opt(U, 1, 4), "non-reduce"),
  ("upcast-tc-locals", mm64, "METAL", [Opt(TC, 0, 0)], Opt(U, 2, 2), "tensor-core locals"),
  # after TC the layout axes are fixed: padding the first warp axis (2 -> 4) would break them
  ("padto-tc-warp", mm64, "METAL", [Opt(TC, 0, 0)], Opt(PADTO, 2, 4), "warp or fragment"),
  ("upcast-too-much", ew_add, "CPU", [], Opt(U, 0, 16), "exceeds 8"),
  ("upcastmid-not-image", sum_all, "OPENCL", [Opt(GT, 0, 16)], Opt(UM, 0, 4), "UPCASTMID needs"),
  ("upcastmid-no-group", upcastmid_image, "OPENCL", [], Opt(UM, 1, 4), "UPCASTMID needs"),
  ("upcastmid-wrong-axis", upcastmid_image, "OPENCL", [Opt(G, 0, 8)], Opt(UM, 0, 4), "unit-stride axis 1"),
  ("upcastmid-amt", upcastmid_image, "OPENCL", [Opt(G, 0, 8)], Opt(UM, 1, 2), "must be 4"),
  ("nolocals-on-cpu", ew_add, "CPU", [], Opt(NL), "no locals to turn off"),
  ("nolocals-twice", ew_add, "OPENCL", [Opt(NL)], Opt(NL), "no locals to turn off"),
  ("nolocals-after-local", ew_add, "OPENCL", [Opt(L, 0, 4)], Opt(NL), "already in use"),
  ("nolocals-after-group", sum_all, "OPENCL", [Opt(GT, 0, 16)], Opt(NL), "already in use"),
  ("nolocals-with-axis", ew_add, "OPENCL", [], Opt(NL, 0), "takes no axis"),
  ("merge-not-upcasted", mm64, "CPU", [], Opt(MERGE, 0), "for upcasted"),
  ("merge-last-axis", ew_add, "CPU", [Opt(U, 0, 4)], Opt(MERGE, 1), "two upcasted"),
  ("merge-reduce", mm64, "CPU", [Opt(U, 1, 4), Opt(UN, 0, 4)], Opt(MERGE, 3), "merge reduce"),
  ("merge-with-amt", mm64, "CPU", [Opt(U, 1, 4), Opt(U, 0, 4)], Opt(MERGE, 3, 2), "no amount"),
  ("padto-symbolic", sym_sum, "CPU", [], Opt(PADTO, 0, 32), "symbolic"),
  ("padto-upcasted", ew_add, "CPU", [Opt(U, 0, 4)], Opt(PADTO, 1, 8), "upcasted"),
  ("padto-max-reduce", lambda: sum_axis(1, (1024, 1000), ReduceOps.MAX), "CPU", [], Opt(PADTO, 1, 1024), "not a SUM"),
  ("padto-unsafe-op", recip_sum, "CPU", [], Opt(PADTO, 1, 1024), "pad-safe"),
  ("padto-bitcast", bitcast_neg_sum, "CPU", [], Opt(PADTO, 0, 32), "pad-safe"),
  ("padto-bool-not", not_sum, "CPU", [], Opt(PADTO, 0, 32), "pad-safe"),
  ("padto-quadruple", lambda: matmul(100, 37, 53), "CPU", [], Opt(PADTO, 0, 10**9), "quadruples"),
  ("padto-nothing", ew_add, "CPU", [], Opt(PADTO, 0, 1024), "nothing to pad"),
  ("padto-whole-axis", ew_add, "CPU", [], Opt(PADTO, 0, 0), "nothing to pad"),
  ("not-an-opt", ew_add, "CPU", [], (U, 0, 4), "not an Opt"),
]

@pytest.mark.parametrize("build,dialect,setup,opt,msg", [r[1:] for r in REFUSALS], ids=[r[0] for r in REFUSALS])
def test_refused_opt_leaves_kernel_unchanged(build, dialect, setup, opt, msg):
  k = Kernel(build(), opts=get_renderer(dialect))
  for o in setup: k.apply_opt(o)
  before, snapshot = state(k), k.copy()
  with pytest.raises(KernelOptError, match=msg):
    k.apply_opt(opt)
  assert state(k) == before == state(snapshot)

def test_padto_that_grows_the_workgroup_past_the_device_is_refused():
  """The GPU fuzzer (FUZZ_SEED=7 on PoCL, 4096 threads a group): a whole-axis GROUP of 4096 threads then PADTO by 3
  made a group of 4098, which the lowerer could not launch; PADTO now checks the workgroup as LOCAL and GROUP do."""
  from kernopt.renderers.opencl import OpenCLRenderer
  k = Kernel(sum_axis(1, (4, 1024)), opts=OpenCLRenderer(max_local_size=1024))
  k.apply_opt(Opt(G, 0, 0))
  before = state(k)
  with pytest.raises(KernelOptError, match="workgroup of 1026 threads exceeds 1024"): k.apply_opt(Opt(PADTO, 1, 3))
  assert state(k) == before
  k.apply_opt(Opt(PADTO, 0, 8))   # a global axis: the workgroup stays 1024
  assert k.full_shape[:2] == (8, 1024)

@pytest.mark.parametrize("args,msg", [((TC, -1, 0), "axis must be None or a non-negative int"),
  ((U, -1, 4), "axis must be"), ((U, "0", 4), "axis must be .* str '0'"), ((U, True, 4), "axis must be .* bool"),
  ((U, 0, -1), "amt must be"), ((U, 0, 2.0), "amt must be .* float"), ((U, 0, 2**31), "amt must be"),
  (("UPCAST", 0, 4), "op must be an OptOps member")])
def test_opt_refuses_bad_fields_when_built(args, msg):
  with pytest.raises(KernelOptError, match=msg): Opt(*args)

def test_refusal_message_names_op_axis_amount_and_shape():
  k = Kernel(ew_add(), opts=get_renderer("CPU"))
  with pytest.raises(KernelOptError) as e:
    k.apply_opt(Opt(U, 0, 16))
  assert all(s in str(e.value) for s in ("UPCAST", "axis=0", "amt=16", "(1048576,)"))

def test_apply_opt_chains_and_records():
  k = Kernel(ew_add(), opts=get_renderer("OPENCL"))
  assert k.apply_opt(Opt(U, 0, 4)).apply_opt(Opt(L, 0, 16)) is k
  assert k.applied_opts == (Opt(U, 0, 4), Opt(L, 0, 16)) and k.full_shape == (16384, 16, 4)

def test_padto_pads_every_tracker():
  # 100 -> 128 (100 > 32 // 4); the reduce axis 53 -> 64 is allowed: SUM of MUL keeps f(0) = 0
  k = Kernel(matmul(100, 37, 53), opts=get_renderer("OPENCL")).apply_opt(Opt(PADTO, 0, 32)).apply_opt(Opt(PADTO, 2, 16))
  assert k.full_shape == (128, 37, 64) and k.output_shape == (128, 37, 1)
  assert all(st.shape[0] == 128 for st in k.sts)

def test_merge_upcasted_axes():
  # UPCAST 1 4 then UPCAST 0 4: (256, 256, 1024, 4, 4); MERGE 3 swaps the last two and joins them into 16
  k = Kernel(matmul(1024, 1024, 1024), opts=get_renderer("CPU")).apply_opt(Opt(U, 1, 4)).apply_opt(Opt(U, 0, 4))
  k.apply_opt(Opt(MERGE, 3))
  assert k.full_shape == (256, 256, 1024, 16) and k.upcasted == 1 and k.colors() == ["blue", "blue", "red", "yellow"]

def test_opt_is_frozen_and_orderable():
  opts = [Opt(L, 1, 4), Opt(U, 0, 4), Opt(NL), Opt(U, None, 2)]
  assert sorted(opts) == [Opt(U, None, 2), Opt(U, 0, 4), Opt(L, 1, 4), Opt(NL)]
  assert len({Opt(U, 0, 4), Opt(U, 0, 4)}) == 1
  with pytest.raises(AttributeError): opts[0].amt = 8  # type: ignore[misc]

# ***** stress: random Opts over the whole action space *****

AMTS = [None, 0, -1, 1, 2, 3, 4, 7, 8, 16, 32, 33, 10**9]
OWN = [ew_add, bcast_add, lambda: sum_axis(0), lambda: sum_axis(1), lambda: sum_axis(2), sum_all, mm64,
       lambda: matmul(100, 37, 53), lambda: matmul(256, 256, 256, dtypes.half), matvec, padded_add, image_in_sum,
       image_out_add, two_outputs, two_reduces, sym_add, sym_sum, upcastmid_image, recip_sum]

def check_consistent(k, size0, padded):
  n = k.shape_len
  assert all(len(st.shape) == n for st in k.sts)
  assert 0 <= k.upcasted <= n and 0 <= k.local_dims <= k.first_reduce <= n - k.upcasted
  assert k.group_for_reduces >= 0 and k.first_reduce + k.group_for_reduces <= n - k.upcasted
  assert len(k.colors()) == n and k.name
  if not k.vars:
    size = prod(k.full_shape)
    assert size == size0 or (padded and size > size0)

def stress(ast, dialect, seed, steps):
  rng = random.Random(seed)
  k = Kernel(ast, opts=get_renderer(dialect))
  size0 = prod(k.full_shape)
  padded = applied = 0
  for _ in range(steps):
    op = rng.choice(list(OptOps))
    opt = (op, rng.choice(list(range(-2, k.shape_len + 3)) + [None]), rng.choice(AMTS))
    before = state(k)
    try:
      k.apply_opt(Opt(*opt))   # (a negative axis or amount is refused by Opt itself)
      applied += 1
      padded |= op in (PADTO, TC)  # TC at level >= 2 pads too
    except KernelOptError:
      assert state(k) == before, opt
    check_consistent(k, size0, padded)
  k.get_optimized_ast()
  return applied

CASES = [(f"own{i}", b) for i, b in enumerate(OWN)] + [(c.name, (lambda c=c: c.ast)) for c in catalogue("large")]

@pytest.mark.parametrize("name,build", CASES, ids=[c[0] for c in CASES])
def test_stress_random_opts(name, build):
  applied = sum(stress(build(), d, seed=zlib.crc32(f'{name}-{d}'.encode()), steps=150) for d in DIALECTS)
  assert applied > 0

def test_a_refused_heuristic_leaves_the_kernel_as_it_was():
  """Found by an independent tester: hand_coded_optimizations() a second time on an OpenCL matmul applied some of
  the spec's Opts, then raised KernelOptError for a LOCAL, leaving the kernel half-modified. It is all or nothing, and
  the kernel still computes numpy's numbers afterwards (PYTHON's OpenCL-shaped emulator)."""
  import numpy as np
  from catalogue import alu, view
  from kernopt import Buffer, Device
  from kernopt.ops import BinaryOps
  from kernopt.renderers import get_renderer
  a = buf(1, (64, 64, 64), st=view((64, 64, 64), (64, 0, 1)))
  b = buf(2, (64, 64, 64), st=view((64, 64, 64), (0, 1, 64)))
  k = Kernel(kernel(store(reduce(ReduceOps.SUM, alu(BinaryOps.MUL, a, b), (2,)))), opts=get_renderer("OPENCL"))
  k.hand_coded_optimizations()
  before = (k.applied_opts, k.full_shape, k.sts, k.trace)
  with pytest.raises(KernelOptError): k.hand_coded_optimizations()
  assert (k.applied_opts, k.full_shape, k.sts, k.trace) == before
  dev = Device.open("PYTHON")
  x, y = np.random.default_rng(0).standard_normal((2, 64, 64), dtype=np.float32)
  bufs = {0: Buffer(dev, 64 * 64, dtypes.float32), 1: Buffer(dev, x.size, dtypes.float32).copyin(x),
          2: Buffer(dev, y.size, dtypes.float32).copyin(y)}
  prg = Kernel(k.ast, opts=dev.renderer)
  for o in k.applied_opts: prg.apply_opt(o)
  p = prg.to_program()
  dev.compile(p)(*[bufs[a.idx] for a in p.args], wait=True)
  np.testing.assert_allclose(bufs[0].numpy().reshape(64, 64), x @ y, rtol=1e-4, atol=1e-4)
