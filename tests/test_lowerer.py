"""The lowerer and linearizer end to end: hand-built optimized ASTs lowered, linearized and run by a small
sequential reference evaluator (RANGE loops, a grid of SPECIAL threads run in lockstep between BARRIERs),
compared with numpy. On pinned native CPU profiles, the lanes the lowerer builds as vector UOps: their count, the
source they render against the scalar lanes the vectorize pass packs, and compiled kernels against numpy."""
import itertools, struct
import copy
import numpy as np
import pytest
from kernopt.dtype import dtypes
from kernopt.errors import UnsupportedError
from kernopt.ops import (BinaryOps, BufferOps, ConstBuffer, KernelInfo, LazyOp, MemBuffer, MetaOps, ReduceOps,
                         TernaryOps, UnaryOps, exec_alu, truncate_float)
from kernopt.renderers import get_renderer
from kernopt.shape.shapetracker import ShapeTracker
from kernopt.shape.symbolic import Variable, sym_infer
from kernopt.lowerer import fold_dims, lower
from kernopt.uopgraph import linearize
from kernopt.uops import UOps

CPU, CL = get_renderer("CPU"), get_renderer("OPENCL")

# ***** a reference evaluator of linearized UOp lists *****

def _cast(v, dt):
  if dtypes.is_float(dt): return truncate_float(float(v), dt)
  return dtypes.as_const(v, dt)

def _jumps(uops):
  jump, stack = {}, []
  for i, u in enumerate(uops):
    if u.op in (UOps.RANGE, UOps.IF): stack.append(i)
    elif u.op in (UOps.ENDRANGE, UOps.ENDIF):
      j = stack.pop()
      jump[i], jump[j] = j, i
  assert not stack
  return jump

def _segment(uops, lo, hi, env, bufs, jump):
  pc = lo
  while pc < hi:
    u = uops[pc]
    op, src = u.op, u.src
    if op is UOps.RANGE:
      env[u] = env[src[0]]
      if env[u] >= env[src[1]]: pc = jump[pc]
    elif op is UOps.ENDRANGE:
      r = src[0]
      env[r] += 1
      if env[r] < env[r.src[1]]: pc = jump[pc]
    elif op is UOps.IF:
      if not env[src[0]]: pc = jump[pc]
    elif op in (UOps.ENDIF, UOps.BARRIER, UOps.DEFINE_GLOBAL, UOps.DEFINE_LOCAL, UOps.DEFINE_VAR, UOps.SPECIAL): pass
    elif op is UOps.CONST: env[u] = u.arg
    elif op is UOps.DEFINE_ACC: env[u] = u.arg[0]
    elif op is UOps.PHI: env[u] = env[src[0]] = env[src[1]]
    elif op is UOps.LOAD:
      buf = bufs[src[0]]
      if len(src) == 4 and not env[src[2]]: env[u] = env[src[3]]
      else:
        i = env[src[1]]
        assert 0 <= i and i + u.dtype.count <= len(buf), f"out of bounds load {i} of {len(buf)}"
        env[u] = buf[i].item() if u.dtype.count == 1 else tuple(x.item() for x in buf[i:i + u.dtype.count])
    elif op is UOps.STORE:
      if len(src) == 4 and not env[src[3]]: pass
      else:
        buf, i, v = bufs[src[0]], env[src[1]], env[src[2]]
        assert 0 <= i and i + (len(v) if isinstance(v, tuple) else 1) <= len(buf), f"out of bounds store {i}"
        if isinstance(v, tuple): buf[i:i + len(v)] = v
        else: buf[i] = v
    elif op is UOps.ALU: env[u] = exec_alu(u.arg, u.dtype, tuple(env[s] for s in src))
    elif op is UOps.CAST: env[u] = _cast(env[src[0]], u.dtype)
    elif op is UOps.BITCAST:
      env[u] = struct.unpack(u.dtype.fmt, struct.pack(src[0].dtype.fmt, env[src[0]]))[0]
    elif op is UOps.VECTORIZE: env[u] = tuple(env[s] for s in src)
    elif op is UOps.GEP: env[u] = env[src[0]][u.arg]
    else: raise NotImplementedError(op)
    pc += 1

def run_uops(uops, arrays, var_vals=None):
  """Run a linearized program; arrays[i] is buffer i (flat numpy, modified in place)."""
  var_vals = var_vals or {}
  jump = _jumps(uops)
  specials = [u for u in uops if u.op is UOps.SPECIAL]
  vv = {u.arg: var_vals[u.arg.expr] for u in uops if u.op is UOps.DEFINE_VAR}
  def size(s): return sym_infer(s, vv)
  gl = [u for u in specials if u.arg[1].startswith("g")]
  lc = [u for u in specials if u.arg[1].startswith("l")]
  cuts = [0] + [i for i, u in enumerate(uops) if u.op is UOps.BARRIER] + [len(uops)]
  for gvals in itertools.product(*[range(size(u.arg[2])) for u in gl]):
    locals_ = {u: np.zeros(u.arg[1], dtype=np.dtype(u.dtype.fmt)) for u in uops if u.op is UOps.DEFINE_LOCAL}
    bufs = {u: arrays[u.arg[0]] for u in uops if u.op is UOps.DEFINE_GLOBAL}
    bufs.update(locals_)
    envs = []
    for lvals in itertools.product(*[range(size(u.arg[2])) for u in lc]):
      env = dict(zip(gl, gvals))
      env.update(zip(lc, lvals))
      env.update({u: var_vals[u.arg.expr] for u in uops if u.op is UOps.DEFINE_VAR})
      envs.append(env)
    for lo, hi in zip(cuts, cuts[1:]):  # threads of a workgroup in lockstep between barriers
      for env in envs: _segment(uops, lo, hi, env, bufs, jump)

def check(ast, opts, inputs, expected, var_vals=None, **tol):
  uops = linearize(lower(ast, opts), opts)
  out = np.zeros(expected.size, dtype=expected.dtype)
  run_uops(uops, [out] + [np.ascontiguousarray(x).reshape(-1) for x in inputs], var_vals)
  np.testing.assert_allclose(out.reshape(expected.shape), expected, **({"rtol": 1e-5, "atol": 1e-5} | tol))
  return uops

# ***** AST builders *****

def ld(i, st, dt=dtypes.float): return LazyOp(BufferOps.LOAD, (), MemBuffer(i, dt, st))
def store(x, st, i=0, dt=dtypes.float): return LazyOp(BufferOps.STORE, (x,), MemBuffer(i, dt, st))
def kernel(*stores, **info): return LazyOp(MetaOps.KERNEL, tuple(stores), KernelInfo(**info))
def S(*shape): return ShapeTracker.from_shape(shape)

rng = np.random.default_rng(0)
def rand(*shape): return rng.standard_normal(shape).astype(np.float32)

@pytest.mark.parametrize("opts", [CPU, CL], ids=["C", "OpenCL"])
def test_elementwise(opts):
  a, b = rand(4, 8), rand(4, 8)
  a_plus_b = LazyOp(BinaryOps.ADD, (ld(2, S(4, 8)), ld(1, S(4, 8))))
  ast = kernel(store(LazyOp(BinaryOps.MUL, (ld(1, S(4, 8)), a_plus_b)), S(4, 8)))
  uops = check(ast, opts, [a, b], a * (b + a))
  assert (UOps.SPECIAL in {u.op for u in uops}) == opts.caps.has_local

@pytest.mark.parametrize("opts", [CPU, CL], ids=["C", "OpenCL"])
def test_reduce_sum(opts):
  a = rand(5, 7)
  ast = kernel(store(LazyOp(ReduceOps.SUM, (ld(1, S(5, 7)),), (1,)), S(5, 1)))
  uops = check(ast, opts, [a], a.sum(1, keepdims=True))
  assert sum(u.op is UOps.DEFINE_ACC for u in uops) == 1

def test_max_with_permuted_input():
  a = rand(6, 5)
  st = S(5, 6).permute((1, 0))   # reads a transposed (5, 6) buffer
  ast = kernel(store(LazyOp(ReduceOps.MAX, (ld(1, st),), (1,)), S(6, 1)))
  check(ast, CPU, [a.T.copy()], a.max(1, keepdims=True))

@pytest.mark.parametrize("opts", [CPU, CL], ids=["C", "OpenCL"])
def test_padded_input_guarded(opts):
  a = rand(3, 4)
  st = S(3, 4).pad(((1, 1), (2, 0)))   # (5, 6), zero outside
  ast = kernel(store(LazyOp(UnaryOps.EXP2, (ld(1, st),)), S(5, 6)))
  uops = check(ast, opts, [a], np.exp2(np.pad(a, ((1, 1), (2, 0)))))
  assert any(u.op is UOps.LOAD and len(u.src) == 4 for u in uops)

def test_padded_sum():
  a = rand(3, 4)
  st = S(3, 4).pad(((0, 0), (1, 3)))
  ast = kernel(store(LazyOp(ReduceOps.SUM, (ld(1, st),), (1,)), S(3, 1)))
  check(ast, CPU, [a], a.sum(1, keepdims=True))

def test_const_buffer_masked():
  a = rand(3, 4)
  cst = LazyOp(BufferOps.CONST, (), ConstBuffer(2.0, dtypes.float, S(3, 2).pad(((0, 0), (1, 1)))))
  ast = kernel(store(LazyOp(BinaryOps.ADD, (ld(1, S(3, 4)), cst)), S(3, 4)))
  check(ast, CPU, [a], a + np.pad(np.full((3, 2), 2.0, np.float32), ((0, 0), (1, 1))))

def _upcast_sum_ast(m=8, n=16, up=4, unroll=4):
  # axes: global m/up | reduce loop n/unroll | upcast up (output) | unroll (reduce)
  st_in = S(m, n).reshape((m // up, up, n // unroll, unroll)).permute((0, 2, 1, 3))
  st_out = S(m, 1).reshape((m // up, up, 1, 1)).permute((0, 2, 1, 3))
  return kernel(store(LazyOp(ReduceOps.SUM, (ld(1, st_in),), (1, 3)), st_out), upcasted=2)

@pytest.mark.parametrize("opts", [CPU, CL], ids=["C", "OpenCL"])
def test_upcast_and_unroll(opts):
  a = rand(8, 16)
  uops = check(_upcast_sum_ast(), opts, [a], a.sum(1, keepdims=True))
  # independent accumulators: one per (output lane, unrolled lane)
  assert sum(u.op is UOps.DEFINE_ACC for u in uops) == 16
  assert sum(u.op is UOps.RANGE for u in uops) == (1 if opts.caps.has_local else 2)

def test_unroll_only_no_loop():
  a = rand(4, 4)
  st = S(4, 4)
  ast = kernel(store(LazyOp(ReduceOps.SUM, (ld(1, st),), (1,)), S(4, 1)), upcasted=1)
  uops = check(ast, CPU, [a], a.sum(1, keepdims=True))
  assert not any(u.op is UOps.DEFINE_ACC for u in uops)

def test_two_reduces_share_the_loop():
  a = rand(4, 9)
  r1 = LazyOp(ReduceOps.SUM, (ld(1, S(4, 9)),), (1,))
  r2 = LazyOp(ReduceOps.MAX, (ld(1, S(4, 9)),), (1,))
  ast = kernel(store(LazyOp(BinaryOps.ADD, (r1, r2)), S(4, 1)), store(r2, S(4, 1), i=2))
  uops = linearize(lower(ast, CPU), CPU)
  out, out2 = np.zeros(4, np.float32), np.zeros(4, np.float32)
  run_uops(uops, [out, a.reshape(-1), out2])
  np.testing.assert_allclose(out, a.sum(1) + a.max(1), rtol=1e-5)
  np.testing.assert_allclose(out2, a.max(1), rtol=1e-5)
  assert sum(u.op is UOps.RANGE and u.arg[1] for u in uops) == 1

def test_symbolic_shape():
  n = Variable("n", 1, 16)
  a = rand(5, 3)
  st = S(n, 3)
  ast = kernel(store(LazyOp(ReduceOps.SUM, (ld(1, st),), (1,)), S(n, 1)))
  uops = linearize(lower(ast, CPU), CPU)
  assert [u.arg.expr for u in uops if u.op is UOps.DEFINE_VAR] == ["n"]
  out = np.zeros(5, np.float32)
  run_uops(uops, [out, a.reshape(-1)], {"n": 5})
  np.testing.assert_allclose(out, a.sum(1), rtol=1e-5)

def test_symbolic_shape_on_gpu():
  n = Variable("n", 1, 16)
  a = rand(6)
  ast = kernel(store(LazyOp(UnaryOps.NEG, (ld(1, S(n)),)), S(n)))
  uops = linearize(lower(ast, CL), CL)
  out = np.zeros(6, np.float32)
  run_uops(uops, [out, a], {"n": 6})
  np.testing.assert_allclose(out, -a)

def test_cast_and_int():
  a = rng.integers(-50, 50, (4, 4)).astype(np.int32)
  div = LazyOp(BinaryOps.IDIV, (ld(1, S(4, 4), dtypes.int), ld(1, S(4, 4).permute((1, 0)), dtypes.int)))
  ast = kernel(store(LazyOp(UnaryOps.CAST, (div,), dtypes.float), S(4, 4)))
  b = a.T
  ref = np.where(b == 0, 0, np.trunc(a / np.where(b == 0, 1, b))).astype(np.float32)
  check(ast, CPU, [a], ref)

def _matmul_ast(n=8, up=2, unroll=2):
  # out[i, j] = sum_k a[i, k] * b[k, j]; axes: i/up, j/up | k/unroll loop | i up, j up | k unroll
  ai = S(n, n).reshape((n, 1, n)).expand((n, n, n))                     # a[i, k] over (i, j, k)
  bj = S(n, n).permute((1, 0)).reshape((1, n, n)).expand((n, n, n))     # b[k, j]
  def opt(st): return st.reshape((n // up, up, n // up, up, n // unroll, unroll)).permute((0, 2, 4, 1, 3, 5))
  out = S(n, n).reshape((n // up, up, n // up, up, 1, 1)).permute((0, 2, 4, 1, 3, 5))
  mul = LazyOp(BinaryOps.MUL, (ld(1, opt(ai)), ld(2, opt(bj))))
  return kernel(store(LazyOp(ReduceOps.SUM, (mul,), (2, 5)), out), upcasted=3)

@pytest.mark.parametrize("opts", [CPU, CL], ids=["C", "OpenCL"])
def test_matmul_upcast_unroll(opts):
  a, b = rand(8, 8), rand(8, 8)
  uops = check(_matmul_ast(), opts, [a, b], a @ b, rtol=1e-4, atol=1e-4)
  assert sum(u.op is UOps.DEFINE_ACC for u in uops) == 2 * 2 * 2
  # at most MAX_ACCS accumulators: 4x4 outputs unrolled by 4 get 2 each
  uops = linearize(lower(_matmul_ast(16, 4, 4), opts), opts)
  assert sum(u.op is UOps.DEFINE_ACC for u in uops) == 32

def test_accumulator_budget_grows_only_to_whole_vectors():
  """32 scalar accumulators per reduce, shared by its output lane groups; a wide target may keep up to four vectors
  of them, but only where every group's accumulators then fill whole vectors (else they would stay scalars)."""
  from kernopt.lower_reduce import accs_per_group
  assert accs_per_group(32, 4, 8) == 8          # width 8: the scalar budget already makes one vector a group
  assert accs_per_group(32, 4, 16) == 16        # width 16: 4 rows x one float16 accumulator, not 4 x 8 scalars
  assert accs_per_group(9, 16, 16) == 2         # a conv's 3x3 window over 16 outputs: 64 // 16 = 4 would be scalars
  assert accs_per_group(4, 4, 16) == 4 and accs_per_group(64, 64, 1) == 1

def test_float4_vectorized_loads_and_stores():
  a = rand(4, 8)
  st = S(4, 8).reshape((4, 2, 4))
  ast = kernel(store(LazyOp(UnaryOps.SQRT, (ld(1, st),)), st), upcasted=1)
  uops = check(ast, CL, [np.abs(a)], np.sqrt(np.abs(a)))
  assert [u.dtype for u in uops if u.op is UOps.LOAD] == [dtypes.float.vec(4)]
  assert [u.src[2].dtype for u in uops if u.op is UOps.STORE] == [dtypes.float.vec(4)]
  # not on C, and not when the base index is not a provable multiple of 4
  assert not any(u.dtype.count > 1 for u in linearize(lower(ast, CPU), CPU) if u.op is UOps.LOAD)
  st2 = S(4, 9).shrink(((0, 4), (1, 9))).reshape((4, 2, 4))
  ast2 = kernel(store(LazyOp(UnaryOps.NEG, (ld(1, st2),)), st), upcasted=1)
  b = rand(4, 9)
  uops2 = check(ast2, CL, [b], -b[:, 1:])
  assert all(u.dtype.count == 1 for u in uops2 if u.op is UOps.LOAD)

def test_group_reduce_through_local_memory():
  # x (4, 64) summed over axis 1: global 4 | group 16 (threads) | loop 4; second reduce over the group axis
  a = rand(4, 64)
  st_in = S(4, 64).reshape((4, 16, 4))
  first = LazyOp(ReduceOps.SUM, (ld(1, st_in),), (2,))
  lbuf = MemBuffer(-1, dtypes.float, S(1, 16, 1))
  lstore = LazyOp(BufferOps.STORE, (first,), lbuf)
  second = LazyOp(ReduceOps.SUM, (LazyOp(BufferOps.LOAD, (lstore,), lbuf),), (1,))
  ast = kernel(store(second, S(4, 1, 1)))
  uops = check(ast, CL, [a], a.sum(1).reshape(4, 1, 1), rtol=1e-4, atol=1e-4)
  ops = [u.op for u in uops]
  assert ops.count(UOps.BARRIER) == 1 and UOps.IF in ops and UOps.DEFINE_LOCAL in ops
  # the barrier comes after the local store and before the local load
  bi = ops.index(UOps.BARRIER)
  assert any(u.op is UOps.STORE and u.src[0].op is UOps.DEFINE_LOCAL for u in uops[:bi])
  assert all(not (u.op is UOps.LOAD and u.src[0].op is UOps.DEFINE_LOCAL) for u in uops[:bi])
  with pytest.raises(UnsupportedError): lower(ast, CPU)

def test_more_than_three_global_dims_fold():
  a = rand(2, 3, 4, 5)
  ast = kernel(store(LazyOp(UnaryOps.NEG, (ld(1, S(2, 3, 4, 5)),)), S(2, 3, 4, 5)))
  uops = check(ast, CL, [a], -a)
  assert sorted(u.arg for u in uops if u.op is UOps.SPECIAL) == [(0, "gidx0", 6), (1, "gidx1", 4), (2, "gidx2", 5)]

def test_fold_dims_respects_maxima():
  assert fold_dims([2, 3, 4, 5], None) == [[0, 1], [2], [3]]
  assert fold_dims([10, 70000], (2**31 - 1, 65535, 65535)) == [[0, 1]]
  assert fold_dims([3, 4], (100, 100, 100)) == [[0], [1]]
  with pytest.raises(UnsupportedError): fold_dims([70000, 70000, 70000], (65535, 65535, 65535))

def test_parameters_first_in_order():
  a, b = rand(4), rand(4)
  ast = kernel(store(LazyOp(BinaryOps.ADD, (ld(2, S(4)), ld(1, S(4)))), S(4)))
  uops = linearize(lower(ast, CPU), CPU)
  assert [u.arg for u in uops[:3]] == [(0, "data0", True), (1, "data1", False), (2, "data2", False)]
  del a, b

def test_images_refused_cleanly():
  img = dtypes.imagef((2, 2, 4))
  ast = kernel(store(ld(1, S(16), img), S(16)))
  with pytest.raises(UnsupportedError, match="no images"): lower(ast, CPU)  # the C dialect has no images

# ***** the team's catalogue, optimized by the Kernel's heuristics for the C and OpenCL profiles *****

def _catalogue_cases():
  try: import catalogue
  except ImportError: return []
  return [c for c in catalogue.catalogue("small") if not c.tags & {"image", "bfloat16"}]

def _hand_coded_uops(case, opts):
  from kernopt.kernel import Kernel
  k = Kernel(case.ast, opts=opts).required_optimizations().hand_coded_optimizations()
  return linearize(lower(k.get_optimized_ast(), opts), opts)

def _evaluator_sized(opts):
  """The cases the slow reference evaluator runs in well under a second (at most 30k ALU ops); the larger ones run
  compiled in tests/test_e2e_cpu.py and tests/test_opencl.py."""
  from kernopt.uops import flops_mem
  def ops(case):
    uops, vv = _hand_coded_uops(case, opts), case.var_vals[-1]
    return sym_infer(flops_mem(uops)[0], {u.arg: vv[u.arg.expr] for u in uops if u.op is UOps.DEFINE_VAR})
  return [pytest.param(c, opts, id=f"{c.name}-{opts.caps.device}") for c in _catalogue_cases() if ops(c) <= 30_000]

@pytest.mark.parametrize("case,opts", _evaluator_sized(CPU) + _evaluator_sized(CL))
def test_catalogue_hand_coded(case, opts):
  uops = _hand_coded_uops(case, opts)
  for var_vals in case.var_vals[-1:]:
    inputs = case.inputs(np.random.default_rng(1))
    arrays = {b.idx: np.zeros(b.numel, b.np_dtype) for b in case.outputs}
    arrays.update({i: np.ascontiguousarray(x).reshape(-1) for i, x in inputs.items()})
    run_uops(uops, [arrays[i] for i in range(len(arrays))], var_vals)
    for i, ref in case.reference(inputs, var_vals).items():
      got = arrays[i][:ref.size].reshape(ref.shape)
      if case.tol: np.testing.assert_allclose(got, ref, rtol=case.tol, atol=case.tol)
      else: np.testing.assert_array_equal(got, ref)

@pytest.mark.parametrize("opts", [CPU, CL], ids=["C", "OpenCL"])
def test_kernel_matmul_16(opts):
  catalogue = pytest.importorskip("catalogue")
  from kernopt.kernel import Kernel
  k = Kernel(catalogue._matmul_ast(16, 16, 16), opts=opts).required_optimizations().hand_coded_optimizations()
  a, b = rand(16, 16), rand(16, 16)
  check(k.get_optimized_ast(), opts, [a, b], (a @ b).reshape(16, 16, 1), rtol=1e-4, atol=1e-4)

def _reduce_depth_at(uops, target):
  """How many reduce RANGEs enclose target in a linearized list."""
  depth = 0
  for u in uops:
    if u is target: return depth
    if u.op is UOps.RANGE and u.arg[1]: depth += 1
    elif u.op is UOps.ENDRANGE and u.src[0].arg[1]: depth -= 1
  raise AssertionError("not in the list")

@pytest.mark.parametrize("first", [[], ["UNROLL"]], ids=["padto", "unroll_padto"])
def test_padto_on_a_kept_axis_of_a_reduce(first):
  """The padded output view has a (0, 1) mask on the reduce axis: its index there must be 0, not the loop index,
  or the store lands inside the reduce loop (and with UNROLL the placement had a cycle)."""
  from kernopt.kernel import Kernel, Opt, OptOps
  a, bias = rand(32, 16), rand(32, 1)
  ast = kernel(store(LazyOp(BinaryOps.ADD, (LazyOp(ReduceOps.MAX, (ld(1, S(32, 16)),), (1,)), ld(2, S(32, 1)))),
                     S(32, 1)))
  k = Kernel(ast, opts=CPU)
  if first: k.apply_opt(Opt(OptOps.UNROLL, 0, 2))
  k.apply_opt(Opt(OptOps.PADTO, 0, 3))
  assert k.full_shape[0] == 33
  uops = check(k.get_optimized_ast(), CPU, [a, bias], a.max(1, keepdims=True) + bias)
  stores = [u for u in uops if u.op is UOps.STORE]
  assert stores and all(_reduce_depth_at(uops, s) == 0 for s in stores)
  loads = [u for u in uops if u.op is UOps.LOAD and u.src[0].arg[0] == 2]
  assert loads and all(_reduce_depth_at(uops, x) == 0 for x in loads)   # the bias is read once per row

def test_padto_kept_axis_through_the_kernel_renders():
  catalogue = pytest.importorskip("catalogue")
  from kernopt.kernel import Kernel, Opt, OptOps
  for opts in ([Opt(OptOps.PADTO, 0, 3)], [Opt(OptOps.UNROLL, 0, 2), Opt(OptOps.PADTO, 0, 3)]):
    k = Kernel(catalogue.get("max_axis1").ast, opts=CPU)
    for o in opts: k.apply_opt(o)
    src = k.to_program().src
    inner = src[src.index("ridx1 = 0"):]
    body = inner[:inner.index("}")]   # the reduce loop's body
    assert "data0[" not in body and "data0[" in inner

# ***** vector lanes from the lowerer, on pinned native CPU profiles *****

WIDTHS = (4, 8, 16)   # pinned: the host's own width must not decide what a test checks

def native(w, fused=True):
  from kernopt.renderers.native import ISA_LEVELS, NativeCRenderer
  return NativeCRenderer(vector_width=w, threads=1, fused_accumulate=fused, isa=ISA_LEVELS["x86-64-v3"])

def _opted(ast, r, opts):
  from kernopt.kernel import Kernel
  k = Kernel(ast, opts=r)
  for o in opts: k.apply_opt(o)
  return k

def _floats(uops, count):
  """(op, arg) of the float32 LOAD, ALU, DEFINE_ACC and STORE UOps of `count` lanes (a STORE by its value)."""
  out = []
  for u in uops:
    dt = u.src[2].dtype if u.op is UOps.STORE else u.dtype
    if u.op in (UOps.LOAD, UOps.ALU, UOps.DEFINE_ACC, UOps.STORE) and dt is not None and dt.scalar() == dtypes.float \
       and dt.count == count:
      out.append((u.op, u.arg if u.op is UOps.ALU else None))
  return out

@pytest.mark.parametrize("w", WIDTHS)
def test_unit_stride_upcast_lowers_to_one_vector_op_per_group(w):
  """An elementwise add upcast by w and by 2w along its unit-stride axis: each group of w lanes is one vector LOAD
  per input, one ADD and one STORE, and no scalar float op is left; the list grows by the vectors, not the lanes."""
  from kernopt.kernel import Opt, OptOps
  catalogue = pytest.importorskip("catalogue")
  ast, r = catalogue.get("add").ast, native(w)
  sizes = []
  for groups in (1, 2):
    opts = [Opt(OptOps.UPCAST, 0, w)] + ([Opt(OptOps.UPCAST, 0, 2)] if groups == 2 else [])
    uops = linearize(lower(_opted(ast, r, opts).get_optimized_ast(), r), r)
    vec = _floats(uops, w)
    assert sorted(vec, key=str) == sorted([(UOps.LOAD, None)] * 2 * groups + [(UOps.ALU, BinaryOps.ADD)] * groups +
                                          [(UOps.STORE, None)] * groups, key=str)
    assert _floats(uops, 1) == []
    sizes.append(len(uops))
  assert sizes[1] - sizes[0] <= 6   # the second group's 4 vector ops and its index, not w more lanes of each

@pytest.mark.parametrize("w", WIDTHS)
def test_matmul_tile_lowers_to_vector_accumulators(w):
  """matmul_64's 4xN register tile (N = 8 at width 4, the profile's most upcast, else 16): B's row is N/w vector loads,
  A's 4 elements scalar loads broadcast, and each of the tile's 4N/w vectors one accumulator, one fused multiply-add
  (MULACC) and one store."""
  from kernopt.kernel import Opt, OptOps
  catalogue = pytest.importorskip("catalogue")
  r, cols = native(w), 8 if w == 4 else 16
  k = _opted(catalogue.get("matmul_64").ast, r, [Opt(OptOps.UPCAST, 1, cols), Opt(OptOps.UPCAST, 0, 4)])
  uops = linearize(lower(k.get_optimized_ast(), r), r)
  vec, n = _floats(uops, w), 4 * cols // w
  assert vec.count((UOps.LOAD, None)) == cols // w and vec.count((UOps.ALU, TernaryOps.MULACC)) == n
  assert vec.count((UOps.DEFINE_ACC, None)) == n and vec.count((UOps.STORE, None)) == n
  assert _floats(uops, 1) == [(UOps.LOAD, None)] * 4
  assert sum(u.op is UOps.VECTORIZE for u in uops) == 4   # A's broadcasts

def _native_cases():
  try: import catalogue
  except ImportError: return []
  return [c.name for c in catalogue.catalogue("small") if not c.tags & {"image"}]

@pytest.mark.parametrize("w", WIDTHS)
def test_vector_lowering_renders_what_the_vectorize_pass_packs(w):
  """For every small catalogue kernel under the heuristics at width w (width 8 without fused accumulation), the
  source from the lowerer's vectors is byte for byte the one the vectorize pass makes of scalar lanes: the oracle is
  the scalar lowering, packed. The exception is a kernel with lanes gated one by one (padding, PADTO'd columns), which
  the lowerer makes masked vector loads and stores: its two sources differ in how the masks are placed and spelled,
  so both are run, and must store the same bits, which match the AST's independent evaluation."""
  from kernopt.kernel import Kernel
  from kernopt.passes import passes_for, run_passes
  catalogue = pytest.importorskip("catalogue")
  vectorized, masked = 0, []
  r = native(w, fused=w != 8)
  for name in _native_cases():
    k = Kernel(catalogue.get(name).ast, opts=r).required_optimizations().hand_coded_optimizations()
    ast = k.get_optimized_ast()
    srcs, lows = [], []
    for vectors in (True, False):
      lows.append(low := linearize(lower(ast, r, vectors=vectors), r))
      if vectors: vectorized += any(u.dtype is not None and u.dtype.count > 1 for u in low)
      srcs.append(r.render("k", run_passes(low, passes_for(r))))
    if any(_masked(u) for u in lows[0]):
      assert not any(_masked(u) for u in lows[1]), name   # the scalar lanes are gated one by one
      masked.append(name)
      _same_bits_as_packed_lanes(k, srcs, w)
    else: assert srcs[0] == srcs[1], name
  assert vectorized >= 5 and "matmul_pad" in masked and (w == 16 or {"pad", "conv2d"} <= set(masked))

def _masked_store(u):
  return u.op is UOps.STORE and len(u.src) == 4 and u.src[3].dtype != dtypes.bool

def _masked(u):
  """A masked vector LOAD(buf, index, int32 lane mask) or STORE(buf, index, value, int32 lane mask)."""
  return _masked_store(u) or (u.op is UOps.LOAD and len(u.src) == 3 and u.src[2].dtype == dtypes.int32)

def _same_bits_as_packed_lanes(k, srcs, w, seed=0):
  """The two sources of Kernel k's lists (rendered as function `k`: the lowerer's vectors, the scalar lanes the
  vectorize pass packed), compiled at width w and run on the same seeded inputs, store bit-identical outputs (lane
  for lane the same ops in the same order), and those match tests/ast_oracle's evaluation of k's AST."""
  import dataclasses
  import ast_oracle
  from kernopt.runtime import Buffer, Device
  dev = Device.open("CPU", threads=1, vector_width=w)
  prg = k.to_program()
  outs = {s.arg.idx for s in k.ast.src}
  rng = np.random.default_rng(seed)
  arrays = {a.idx: ast_oracle.zeros((a.min_size,), a.dtype) if a.idx in outs else
            ast_oracle.to_storage(rng.standard_normal(a.min_size), a.dtype) for a in prg.args}
  got = []
  for src in srcs:
    bufs = {a.idx: Buffer(dev.name, a.min_size, a.dtype).copyin(arrays[a.idx]) for a in prg.args}
    dev.compile(dataclasses.replace(prg, name="k", src=src))(*[bufs[a.idx] for a in prg.args], wait=True)
    got.append({i: bufs[i].numpy() for i in outs})
  ev = ast_oracle.evaluate(k.ast, {i: a for i, a in arrays.items() if i not in outs}, {i: arrays[i] for i in outs})
  for i in outs:
    np.testing.assert_array_equal(got[0][i].view(np.uint8), got[1][i].view(np.uint8))
    np.testing.assert_allclose(got[0][i], ev.buffers[i], rtol=1e-4, atol=1e-4 * max(1.0, ev.scale[i]))

_PADDED = ("conv_64x56_0", "conv_16x32_s1_0", "conv_16x32_s2_0", "dwconv_64x56_0")

def test_padded_windows_lower_to_masked_vector_loads():
  """The reference scheduler's padded convolutions (benchmarks/asts/reference) under the heuristics at widths 4, 8 and
  16: the lowerer makes each padded window's gated lanes one masked vector load (no gather of gated lanes), from a
  list of fewer UOps than the scalar lowering; the borders pass folds the masks of the interior copy to plain vector
  loads. The source and the scalar lanes packed store the same bits, which match the AST's evaluation (the small
  conv of the same scheduler, the big ones are checked so in test_reference_asts)."""
  import os
  import kernopt
  from kernopt.kernel import Kernel
  from kernopt.passes import passes_for, run_passes
  root = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "benchmarks", "asts", "reference")
  vectorized = 0
  for name, w in itertools.product(_PADDED, WIDTHS):
    r = native(w)
    k = Kernel(kernopt.load(os.path.join(root, name + ".json")), opts=r).required_optimizations()
    ast = k.hand_coded_optimizations().get_optimized_ast()
    lows = [linearize(lower(ast, r, vectors=vectors), r) for vectors in (True, False)]
    if any(u.dtype is not None and u.dtype.count > 1 for u in lows[0]):
      vectorized += 1
      assert len(lows[0]) < len(lows[1]), (name, w)
      gathers = [u for u in lows[0] if u.op is UOps.VECTORIZE and any(s.op is UOps.LOAD and len(s.src) == 4
                                                                        for s in u.src)]
      assert not gathers and any(_masked(u) for u in lows[0]), (name, w)
      out = run_passes(lows[0], passes_for(r))
      if "IF" in {u.op.name for u in out}:   # versioned: the interior copy's loads are plain
        first_if = next(i for i, u in enumerate(out) if u.op is UOps.IF)
        inside = out[first_if:next(i for i, u in enumerate(out) if u.op is UOps.ENDIF)]
        assert not any(_masked(u) for u in inside) and any(u.op is UOps.LOAD and u.dtype.count > 1 for u in inside)
  assert vectorized >= 5
  for w in WIDTHS:
    r = native(w)
    k = Kernel(kernopt.load(os.path.join(root, "conv_small_0.json")), opts=r).required_optimizations()
    ast = k.hand_coded_optimizations().get_optimized_ast()
    srcs = [r.render("k", run_passes(linearize(lower(ast, r, vectors=v), r), passes_for(r))) for v in (True, False)]
    _same_bits_as_packed_lanes(k, srcs, w)

def test_a_loop_invariant_broadcast_read_twice_keeps_scalar_lanes():
  """out[m, n] = sum_k a[k, n] * s[m]: the vectorize pass broadcasts s[m] inside the reduce loop, the linearizer would
  hoist a broadcast built by the lowerer out of it. Read once (8 lanes of n, one vector) the renderer spells it
  inline, so the lowerer builds vectors; read by two vector ops (16 lanes) it is named where placed, so that kernel
  keeps scalar lanes. Both render what the vectorize pass packs."""
  from kernopt.kernel import Opt, OptOps
  from kernopt.passes import passes_for, run_passes
  catalogue = pytest.importorskip("catalogue")
  M, N, K = 16, 64, 32
  a = catalogue.buf(1, (M, N, K), st=catalogue.view((M, N, K), (0, 1, N)))
  scale = catalogue.buf(2, (M, N, K), st=catalogue.view((M, N, K), (1, 0, 0)))
  ast = catalogue.kernel(catalogue.store(catalogue.reduce(ReduceOps.SUM, catalogue.alu(BinaryOps.MUL, a, scale), (2,))))
  r = native(8)
  for lanes, vectors in ((8, True), (16, False)):
    opt = _opted(ast, r, [Opt(OptOps.UPCAST, 1, lanes)]).get_optimized_ast()
    lists = [linearize(lower(opt, r, vectors=v), r) for v in (True, False)]
    assert any(u.dtype is not None and u.dtype.count > 1 for u in lists[0]) is vectors
    assert r.render("k", run_passes(lists[0], passes_for(r))) == r.render("k", run_passes(lists[1], passes_for(r)))

@pytest.mark.parametrize("w", WIDTHS)
def test_vector_lowered_kernels_match_numpy(w):
  """Kernels whose lanes the lowerer builds as vectors (a broadcast add, an unrolled reduce, a matmul tile, a padded
  conv whose guarded lanes the vectorize pass packs into a masked load) compiled at width w and run on the CPU match
  numpy."""
  catalogue = pytest.importorskip("catalogue")
  from kernopt.kernel import Kernel
  from kernopt.runtime import Device, cpu
  if not cpu.CPUDevice.availability()[0]: pytest.skip("no C compiler")
  import dataclasses
  dev = Device.open("CPU", threads=1, vector_width=w)
  # padded loads stay scalar lanes where the borders pass versions them: the conv is vector-lowered without it
  unversioned = copy.copy(dev.renderer)
  unversioned.caps = dataclasses.replace(dev.renderer.caps, split_borders=False)
  for name in ("broadcast_add", "max_axis1", "matmul_64", "conv2d"):
    case = catalogue.get(name, "large")
    r = unversioned if name == "conv2d" else dev.renderer
    k = Kernel(case.ast, opts=r).required_optimizations().hand_coded_optimizations()
    prg = k.to_program()
    assert any(u.dtype is not None and u.dtype.count == w for u in k.lowered_uops), name
    for _, got, want in catalogue.run_program(dev, case, prg, seed=5):
      for i, ref in want.items(): np.testing.assert_allclose(got[i], ref, rtol=1e-4, atol=1e-4, err_msg=name)

def test_lane_substitute_matches_substitute():
  # a window gate's conjuncts at every value of the upcast variable: the bounds shortcut gives what substitute does
  import random
  from kernopt.lowerer import lane_substitute
  from kernopt.shape.symbolic import NumNode
  rng = random.Random(0)
  r, s, up, up2 = Variable("r", 0, 6), Variable("s", 0, 2), Variable("up", 0, 7), Variable("up2", 0, 1)
  for _ in range(600):
    terms = [v * rng.choice([-8, -3, -2, -1, 1, 2, 8]) for v in (r, s, up, up2) if rng.random() < 0.8] + \
            [rng.randint(-5, 5)]
    lhs = sum(terms[1:], terms[0])
    if not hasattr(lhs, "lt"): continue
    c = lhs.lt(rng.randint(-20, 60))
    for x in range(8):
      for vals in ({up: x}, {up: x, up2: x % 2}, {up2: x % 2}):
        got, want = lane_substitute(c, vals), c.substitute({v: NumNode(y) for v, y in vals.items()})
        # the same node, built the same way (the lowerer renders it: its structure is the source's)
        assert got == want and repr(got) == repr(want) and type(got) is type(want), (c, vals)

def _shared_nested_reduce_cases():
  """(AST, numpy of each output) for a reduce read by two outputs under different enclosing reduces (the AST fuzzer's
  seed 48002: m = MAX over axis 1, then SUM_2(MAX_0(m)) and SUM_{0,2}(m)), and deeper variants."""
  from catalogue import buf, kernel, reduce, store
  S, M, X = ReduceOps.SUM, ReduceOps.MAX, buf(2, (8, 4, 7))
  m = reduce(M, X, (1,))
  mm = reduce(S, reduce(M, buf(2, (8, 4, 7, 3), st=ShapeTracker.from_shape((8, 4, 7, 1)).expand((8, 4, 7, 3))),
                        (3,)), (1,))   # a reduce nested in the shared one
  return [
    (kernel(store(reduce(S, reduce(M, m, (0,)), (2,))), store(reduce(S, m, (0, 2)), idx=1)),
     lambda x: [x.max(1).max(0).sum(), x.max(1).sum()]),
    (kernel(store(reduce(S, m, (0, 2))), store(reduce(S, reduce(S, m, (0,)), (2,)), idx=1)),
     lambda x: [x.max(1).sum(), x.max(1).sum(0).sum()]),
    (kernel(store(reduce(M, reduce(S, mm, (2,)), (0,))), store(reduce(S, mm, (0, 2)), idx=1)),
     lambda x: [x.sum(1).sum(1).max(0), x.sum(1).sum()]),
  ]

@pytest.mark.parametrize("device", ["CPU", "PYTHON"])
def test_a_reduce_shared_under_different_enclosing_reduces_gets_its_own_loops_in_each(device):
  """Lowered once under the first output's loops, a shared reduce read again under the second output's own copies of
  those loops gets its own accumulator and loop copies there (else its single loop would have to nest inside both
  nests: a cycle the linearizer refuses); the numbers are numpy's."""
  from kernopt.kernel import Kernel
  from kernopt.runtime import Buffer, Device
  dev = Device[device]
  x = np.random.default_rng(3).standard_normal((8, 4, 7)).astype(np.float32)
  for ast, want in _shared_nested_reduce_cases():
    prg = Kernel(ast, opts=dev.renderer).to_program()
    bufs = {i: Buffer(device, n, dtypes.float) for i, n in ((0, 1), (1, 1), (2, x.size))}
    bufs[2].copyin(x.reshape(-1))
    dev.compile(prg)(*[bufs[a.idx] for a in prg.args], wait=True)
    np.testing.assert_allclose([bufs[0].numpy()[0], bufs[1].numpy()[0]], want(x.astype(np.float64)), rtol=1e-5)

# ***** vector stores under a guard shared by their lanes *****

@pytest.mark.parametrize("w", [4, 8])
def test_a_padded_row_tile_lowers_as_vectors_with_guarded_vector_stores(w):
  """A matmul tile of 6 rows (PADTO'd: 100 rows to 102) x 2 vectors: the rows' guard is the same for every lane of a
  vector, so the lowerer's vector plan keeps the tile as vectors (12 vector accumulators, not 96 scalar lanes) and
  each vector is stored under its row's guard; the kernel equals numpy's matmul."""
  from catalogue import _matmul_ast
  from kernopt.kernel import Kernel, Opt, OptOps
  from kernopt.runtime import Buffer, Device, cpu
  if not cpu.CPUDevice.availability()[0]: pytest.skip("no C compiler")
  dev = Device.open("CPU", threads=1, vector_width=w)
  k = Kernel(_matmul_ast(100, 4 * w, 24), opts=dev.renderer).required_optimizations()
  for o in (Opt(OptOps.PADTO, 0, 6), Opt(OptOps.UPCAST, 0, 6), Opt(OptOps.UPCAST, 1, 2 * w)): k.apply_opt(o)
  lowered = k.linearize().lowered_uops
  accs = [u for u in lowered if u.op is UOps.DEFINE_ACC]
  assert len(accs) == 12 and all(u.dtype.count == w for u in accs)
  stores = [u for u in lowered if u.op is UOps.STORE]
  assert len(stores) == 12 and all(u.src[2].dtype.count == w for u in stores)
  assert any(u.op is UOps.IF for u in lowered)   # the guarded vector stores of the rows past 100
  rng = np.random.default_rng(w)
  a, b = rng.standard_normal((100, 24), np.float32), rng.standard_normal((24, 4 * w), np.float32)
  out, ba, bb = Buffer("CPU", 100 * 4 * w, dtypes.float), Buffer("CPU", a.size, dtypes.float).copyin(a.ravel()), \
    Buffer("CPU", b.size, dtypes.float).copyin(b.ravel())
  dev.compile(k.to_program())(out, ba, bb, wait=True)
  np.testing.assert_allclose(out.numpy().reshape(100, 4 * w), a.astype(np.float64) @ b, rtol=1e-5, atol=1e-5)

def test_half_width_tiles_lower_to_half_width_vectors_at_width_16():
  """Width 16, conv output rows of 24 columns (16 does not divide them; rule cpu.half_width tiles them with 8-lane
  vectors): the lowerer's vector plan takes the vectorize pass's fallback width, so the lowered list holds 8-lane
  vector ops and few UOps, and the source stores the same bits as the one the pass packs from the scalar lanes. (A
  depthwise conv's window-unrolled taps stay scalar lanes at every width: the pass packs their overlapping loads.)"""
  from kernopt.kernel import Kernel
  from kernopt.passes import passes_for, run_passes
  catalogue = pytest.importorskip("catalogue")
  r = native(16)
  k = Kernel(catalogue.conv2d_ast(1, 8, 4, 24, 16), opts=r).required_optimizations().hand_coded_optimizations()
  opt_ast = k.get_optimized_ast()
  low = [linearize(lower(opt_ast, r, vectors=v), r) for v in (True, False)]
  assert {u.dtype.count for u in low[0] if u.dtype is not None and u.dtype.count > 1} == {8}
  assert 2 * len(low[0]) < len(low[1])
  srcs = [r.render("k", run_passes(lst, passes_for(r))) for lst in low]
  assert "float8" in srcs[0]
  _same_bits_as_packed_lanes(k, srcs, 16)
