"""Buffer bounds: each BufferArg's address range [lo, hi) as expressions of the Variables, checked by the runner at the
launch's var_vals (LaunchError below 0 or past the buffer's size); View's `contiguous` derived from its fields; a
symbolic shrink refused at construction only when provably out of range. Numbers are compared with numpy, and the
bounds with a brute-force enumeration of the addresses (tests/ast_oracle.py's independent view arithmetic)."""
import json
import random
from dataclasses import replace
import numpy as np
import pytest
from ast_oracle import st_index, sym_eval
from kernopt import ast as A
from kernopt.dtype import dtypes
from kernopt.errors import LaunchError, ShapeError
from kernopt.kernel import Kernel
from kernopt.program_cache import program_from_json, program_to_json
from kernopt.runtime import Buffer, Device
from kernopt.runtime.opencl import OpenCLDevice
from kernopt.shape.shapetracker import ShapeTracker
from kernopt.shape.symbolic import Node, Variable
from kernopt.shape.view import View

F = dtypes.float
opencl_ok, opencl_why = OpenCLDevice.availability()
DEVICES = [("CPU", {"vector_width": 8}), ("CPU", {"profile": "static"}), ("PYTHON", {}), ("OPENCL", {})]
IDS = ["CPU-native8", "CPU-static", "PYTHON", "OPENCL"]

def _open(name: str, options: dict):
  if name == "OPENCL" and not opencl_ok: pytest.skip(f"no OpenCL platform: {opencl_why}")
  return Device.open(name, **options)

def _runner(dev, ast):
  return dev.compile(Kernel(ast, opts=dev.renderer).to_program())

def _bufs(dev, *arrays):
  return [Buffer(dev.name, a.size, F).copyin(a) for a in arrays]

def _copy_ast(st: ShapeTracker, out_shape: tuple) -> object:
  return A.kernel(A.store(0, A.load(1, F, st), out_shape))

N = Variable("n", 1, 1000000)

# ***** the examples of issue 14, on every device *****

@pytest.mark.parametrize("name,options", DEVICES, ids=IDS)
def test_negative_offsets_raise_before_launch(name, options):
  dev = _open(name, options)
  for off in (-4, -(1 << 28)):
    prg = Kernel(_copy_ast(ShapeTracker((View.create((4,), (1,), off),)), (4,)), opts=dev.renderer).to_program()
    assert prg.args[1].lo == off and prg.args[1].hi == off + 4 and prg.args[1].min_size >= 0
    out, x = _bufs(dev, np.full(4, 7, np.float32), np.arange(8, dtype=np.float32))
    with pytest.raises(LaunchError, match=f"buffer 1: the kernel addresses element {off}, before"):
      dev.compile(prg)(out, x, wait=True)
    np.testing.assert_array_equal(out.numpy(), np.full(4, 7, np.float32))   # nothing ran
  # a negative offset under a mask (pad) and a flipped axis address only elements inside the buffer: they run
  x = np.arange(1, 5, dtype=np.float32)
  ast = A.kernel(A.store(0, A.add(A.pad(A.load(1, F, (4,)), ((2, 2),)), A.stride(A.load(2, F, (8,)), (-1,)))))
  out, xb, yb = _bufs(dev, np.zeros(8, np.float32), x, np.arange(8, dtype=np.float32))
  _runner(dev, ast)(out, xb, yb, wait=True)
  np.testing.assert_array_equal(out.numpy(), np.pad(x, (2, 2)) + np.arange(8, dtype=np.float32)[::-1])

@pytest.mark.parametrize("name,options", DEVICES, ids=IDS)
def test_a_contiguous_flag_contradicting_the_strides_is_ignored(name, options):
  dev = _open(name, options)
  v = View((4, 4), (1, 4), 0, None, True)   # a transpose that claims to be contiguous
  assert not v.contiguous and View((4, 4), (4, 1), 0, None, False).contiguous
  st = ShapeTracker((v,)).reshape((16,))
  x = np.arange(16, dtype=np.float32)
  out, xb = _bufs(dev, np.zeros(16, np.float32), x)
  _runner(dev, _copy_ast(st, (16,)))(out, xb, wait=True)
  np.testing.assert_array_equal(out.numpy(), x.reshape(4, 4).T.reshape(16))

@pytest.mark.parametrize("name,options", DEVICES, ids=IDS)
def test_symbolic_sizes_are_checked_at_the_launched_values(name, options):
  dev = _open(name, options)
  r = _runner(dev, A.kernel(A.store(0, A.add(A.load(1, F, (N,)), A.load(2, F, (N,))))))
  assert r.program.args[1].min_size == N.max and r.program.args[1].hi == N
  a, b = np.arange(5, dtype=np.float32), np.arange(5, dtype=np.float32) * 10
  out, ab, bb = _bufs(dev, np.zeros(5, np.float32), a, b)
  r(out, ab, bb, var_vals={"n": 5}, wait=True)   # 5-element buffers at n = 5 (refused before: "addresses 1000000")
  np.testing.assert_array_equal(out.numpy(), a + b)
  r(out, ab, bb, var_vals={N: 3}, wait=True)
  np.testing.assert_array_equal(out.numpy(), np.concatenate([a[:3] + b[:3], (a + b)[3:]]))
  msg = r"buffer 0 holds 5 elements, the kernel addresses 6 \(elements \[0, 6\) at n=6"
  with pytest.raises(LaunchError, match=msg):
    r(out, ab, bb, var_vals={"n": 6})

@pytest.mark.parametrize("name,options", DEVICES, ids=IDS)
def test_a_symbolic_shrink_is_accepted_and_checked_at_launch(name, options):
  dev = _open(name, options)
  x = np.arange(10, dtype=np.float32)
  # end n may pass 10, which is not provable: accepted, and the launch checks it
  r = _runner(dev, A.kernel(A.store(0, A.shrink(A.load(1, F, (10,)), ((0, N),)), (N,))))
  out, xb = _bufs(dev, np.zeros(12, np.float32), x)
  r(out, xb, var_vals={"n": 7}, wait=True)
  np.testing.assert_array_equal(out.numpy()[:7], x[:7])
  with pytest.raises(LaunchError, match="buffer 1 holds 10 elements, the kernel addresses 11"):
    r(out, xb, var_vals={"n": 11})

def test_a_shrink_is_refused_only_when_provably_out_of_range():
  st = ShapeTracker.from_shape((10,))
  with pytest.raises(ShapeError, match="outside shape"): st.shrink(((0, N + 10),))   # end > 10 for every n >= 1
  with pytest.raises(ShapeError, match="outside shape"): st.shrink(((N + 5, N),))     # begin > end always
  with pytest.raises(ShapeError, match="outside shape"): st.shrink(((0, 11),))
  m = Variable("m", 0, 12)
  with pytest.raises(ShapeError, match="not provably >= 0"): st.shrink(((m, 10),))    # size 10 - m may be negative
  k = Variable("k", 0, 10)
  lo, hi = st.shrink(((k, 10),)).address_bounds()
  assert (lo, hi) == (k, 10) and st.shrink(((k, 10),)).shape == (10 - k,)

def test_an_iteration_space_past_int64_is_refused_where_the_ast_is_built():
  """2**40 x 2**40 elements cannot be indexed in int64: VerifyError naming the shape when the kernel is built (it was
  a ShapeError from a reshape inside the Kernel, which the user never wrote); 2**31 x 2**31 is accepted."""
  from kernopt.errors import VerifyError
  for shape in ((2**40, 2**40), (2**62, 2)):
    with pytest.raises(VerifyError, match=r"more than int64 indices address"):
      A.kernel(A.store(0, A.load(1, F, shape)))
  Kernel(A.kernel(A.store(0, A.load(1, F, (2**31, 2**31)))))

# ***** the signature: serialized with the Program, part of the runner's key *****

def test_bounds_round_trip_the_program_cache_and_key_the_runner():
  st = ShapeTracker.from_shape((12,)).shrink(((2, N + 2),))
  prg = Kernel(_copy_ast(st, (N,)), opts=Device["PYTHON"].renderer).to_program()
  assert (prg.args[1].lo, prg.args[1].hi) == (2, N + 2)
  back = program_from_json(json.loads(json.dumps(program_to_json(prg))))
  assert back.args == prg.args and isinstance(back.args[1].hi, Node)
  other = replace(prg, args=(prg.args[0], replace(prg.args[1], hi=N + 3)))
  dev = Device["PYTHON"]
  assert dev.compile(prg) is dev.compile(replace(prg)) and dev.compile(prg) is not dev.compile(other)

def test_every_load_of_a_buffer_counts():
  """Two views of buffer 1: the range covers both, at each launch."""
  st2 = ShapeTracker.from_shape((20,)).shrink(((N, N + 4),))
  ast = A.kernel(A.store(0, A.add(A.load(1, F, (4,)), A.load(1, F, st2))))
  dev = Device["PYTHON"]
  r = _runner(dev, ast)
  assert (r.program.args[1].lo, r.program.args[1].hi) == (0, N + 4)
  x = np.arange(9, dtype=np.float32)
  out, xb = _bufs(dev, np.zeros(4, np.float32), x)
  r(out, xb, var_vals={"n": 5}, wait=True)
  np.testing.assert_array_equal(out.numpy(), x[:4] + x[5:9])
  with pytest.raises(LaunchError, match="addresses 10"): r(out, xb, var_vals={"n": 6})

# ***** random trackers against a brute-force enumeration of their addresses *****

def _random_tracker(rng: random.Random) -> ShapeTracker:
  nd = rng.randint(1, 3)
  sym = rng.random() < 0.4
  shape = tuple(Variable("n", 1, 5) if sym and i == 0 else rng.randint(1, 5) for i in range(nd))
  if rng.random() < 0.5: st = ShapeTracker.from_shape(shape)
  else:
    strides = tuple(rng.randint(-6, 6) for _ in shape)
    st = ShapeTracker((View.create(shape, strides, rng.randint(-10, 40)),))
  for _ in range(rng.randint(0, 5)):
    op, sh = rng.choice(("pad", "shrink", "permute", "reshape", "reshape", "stride", "expand")), st.shape
    try:
      if op == "pad": st = st.pad(tuple((rng.randint(0, 2), rng.randint(0, 2)) for _ in sh))
      elif op == "shrink":
        st = st.shrink(tuple((0, s) if not isinstance(s, int) else (b := rng.randint(0, s - 1), rng.randint(b + 1, s))
                             for s in sh))
      elif op == "permute": st = st.permute(rng.sample(range(len(sh)), len(sh)))
      elif op == "stride": st = st.stride(tuple(rng.choice((1, -1, 2)) for _ in sh))
      elif op == "expand": st = st.expand(tuple(rng.randint(1, 3) if s == 1 else s for s in sh))
      elif all(isinstance(s, int) for s in sh):
        total = int(np.prod(sh))
        split = [d for d in range(1, total + 1) if total % d == 0]
        st = st.reshape((d := rng.choice(split), total // d))
    except ShapeError: pass
  return st

def _check_bounds(st: ShapeTracker, lo, hi, vals: list[int], exact: bool) -> None:
  for n in vals:
    vv = {"n": n}
    flat, valid = st_index(st, vv)
    if not valid.any(): continue
    got_lo, got_hi = sym_eval(lo, vv), sym_eval(hi, vv)
    want_lo, want_hi = int(flat[valid].min()), int(flat[valid].max()) + 1
    assert got_lo <= want_lo and want_hi <= got_hi, (st, n, (got_lo, got_hi), (want_lo, want_hi))
    if exact: assert (got_lo, got_hi) == (want_lo, want_hi), (st, n)

def test_random_trackers_bounds_against_brute_force():
  rng = random.Random(14)
  exact_seen = multi_seen = 0
  for _ in range(400):
    st = _random_tracker(rng)
    lo, hi = st.address_bounds()
    simple = st.simplify()
    v = simple.views[0]
    # exact: one View whose mask (if any) is all ints; a symbolic mask bound may count as its whole axis
    exact = len(simple.views) == 1 and (v.mask is None or all(isinstance(x, int) for m in v.mask for x in m))
    exact_seen += exact
    multi_seen += not exact
    _check_bounds(st, lo, hi, [1, rng.randint(1, 5), 5], exact)
  assert exact_seen > 100 and multi_seen > 20   # the generator reaches both kinds

def test_random_trackers_bufferarg_bounds_against_brute_force():
  """The BufferArg of two loads of one buffer through random trackers of the same shape holds both ranges."""
  rng = random.Random(41)
  dev = Device["PYTHON"]
  done = 0
  while done < 25:
    st1 = _random_tracker(rng)
    if not all(isinstance(s, int) for s in st1.shape): continue
    st2 = ShapeTracker((View.create(st1.shape, tuple(rng.randint(-3, 3) for _ in st1.shape), rng.randint(0, 9)),))
    ast = A.kernel(A.store(0, A.add(A.load(1, F, st1), A.load(1, F, st2))))
    arg = Kernel(ast, opts=dev.renderer).to_program().args[1]
    for st in (st1, st2): _check_bounds(st, arg.lo, arg.hi, [1], False)
    done += 1

def test_a_buffers_size_dtype_and_memory_are_fixed():
  """The launch checks trust a Buffer's size, dtype and device: none of them (nor its memory) can be rebound, so a
  caller can't make a 4-element Buffer pass for a 1000-element one (the kernel below then fails its bounds check)."""
  small = Buffer("CPU", 4, dtypes.float)
  for name, value in (("size", 1000), ("dtype", dtypes.int32), ("device", "PYTHON"), ("nbytes", 4000), ("_arg", 0)):
    with pytest.raises(AttributeError, match="fixed"): setattr(small, name, value)
  assert (small.size, small.dtype, small.nbytes) == (4, dtypes.float, 16)
  ast = A.kernel(A.store(0, A.add(A.load(1, dtypes.float, (1000,)), 1.0)))
  dev = Device["CPU"]
  with pytest.raises(LaunchError, match="holds 4 elements"):
    dev.compile(Kernel(ast, opts=dev.renderer).to_program())(Buffer("CPU", 1000, dtypes.float), small)
