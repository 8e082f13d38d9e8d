"""The one-call entry: kernopt.compile and compile_many against numpy, the persistent program cache (a warm process
neither lowers nor renders; a changed kernopt misses; a corrupt entry is a miss), the default renderer, plain kernel
names, and README's code blocks run as written."""
import os, pathlib, re, shutil, subprocess, sys, textwrap
import numpy as np
import pytest
import kernopt
from kernopt import Buffer, Device, dtypes
from kernopt import ast as A
from kernopt.errors import UnsupportedError, VerifyError
from kernopt.helpers import config_override
from kernopt.kernel import Kernel

REPO = pathlib.Path(__file__).resolve().parents[1]
pytestmark = pytest.mark.skipif(Device.why_unavailable("CPU") is not None, reason="no C compiler")

@pytest.fixture(autouse=True)
def _cache_dir(tmp_path):
  with config_override(CACHE_DIR=str(tmp_path / "cache")): yield

def bufs(*arrays):
  return [Buffer("CPU", a.size, dtypes.from_name(a.dtype.name)).copyin(a) for a in arrays]

def matmul_bias(n=32):
  a = A.reshape(A.load(1, dtypes.float, (n, n)), (n, 1, n))
  b = A.reshape(A.permute(A.load(2, dtypes.float, (n, n)), (1, 0)), (1, n, n))
  mm = A.sum(A.mul(A.expand(a, (n, n, n)), A.expand(b, (n, n, n))), 2)
  return A.kernel(A.store(0, A.add(mm, A.expand(A.load(3, dtypes.float, (1, n, 1)), (n, n, 1)))))

def run_matmul(runner, n=32, seed=0):
  rng = np.random.default_rng(seed)
  a, b, c = (rng.standard_normal(s, dtype=np.float32) for s in ((n, n), (n, n), (n,)))
  out, *ins = bufs(np.zeros(n * n, np.float32), a, b, c)
  runner(out, *ins)
  np.testing.assert_allclose(out.numpy().reshape(n, n), a @ b + c[None, :], rtol=1e-4, atol=1e-4)

def test_compile_runs_the_protocol_on_a_name_or_a_device():
  ast = matmul_bias()
  run_matmul(kernopt.compile(ast, "CPU"))
  dev = Device.open("CPU", threads=1)
  runner = kernopt.compile(ast, dev)
  assert runner.device is dev
  run_matmul(runner, seed=1)
  want = Kernel(ast, opts=dev.renderer).required_optimizations()
  if not want.apply_tensor_cores(): want.hand_coded_optimizations()
  assert runner.program.src == want.to_program().src   # exactly the standard protocol
  with pytest.raises(VerifyError, match="device must be"): kernopt.compile(ast, 3)
  with pytest.raises(VerifyError, match="LazyOp"): kernopt.compile("not an ast", "CPU")
  with pytest.raises(VerifyError, match="beam"): kernopt.compile(ast, "CPU", beam=-1)

def test_beam_knob_starts_a_search(monkeypatch):
  """BEAM in the environment (or beam=) searches through the tuning cache, unlike a plain beam-width setting."""
  from kernopt import search
  seen = []
  def fake_search(kernel, buffers=None, config=None, var_vals=None, device=None):
    seen.append(config.beam)
    return kernel.required_optimizations().hand_coded_optimizations()
  monkeypatch.setattr(search, "search_or_cached", fake_search)
  with config_override(BEAM=3): run_matmul(kernopt.compile(matmul_bias(), "CPU"))
  run_matmul(kernopt.compile(matmul_bias(16), "CPU", beam=2), n=16)
  assert seen == [3, 2]

def test_compile_many_keeps_order_and_reports_failures_per_ast():
  img = A.kernel(A.store(0, A.load(1, dtypes.imagef((4, 4, 4)), (4, 4, 4))))
  add = A.kernel(A.store(0, A.add(A.load(1, dtypes.float, (64,)), A.load(2, dtypes.float, (64,)))))
  got = kernopt.compile_many([matmul_bias(), img, add, matmul_bias(16)], "CPU", workers=2)
  assert len(got) == 4 and isinstance(got[1], UnsupportedError)
  run_matmul(got[0])
  run_matmul(got[3], n=16)
  x, y = np.arange(64, dtype=np.float32), np.full(64, 0.5, np.float32)
  out, *ins = bufs(np.zeros(64, np.float32), x, y)
  got[2](out, *ins)
  np.testing.assert_array_equal(out.numpy(), x + y)
  with pytest.raises(VerifyError, match="workers"): kernopt.compile_many([add], "CPU", workers=0)

WARM = textwrap.dedent("""
  import json, sys
  import numpy as np
  import kernopt
  from kernopt import Buffer, dtypes, ast as A
  asts = [A.kernel(A.store(0, A.mul(A.load(1, dtypes.float, (n,)), A.load(2, dtypes.float, (n,))))) for n in (64, 96)]
  asts.append(A.kernel(A.store(0, A.sum(A.load(1, dtypes.float, (16, 32)), 1))))
  runners = kernopt.compile_many(asts, "CPU")
  x = np.arange(96, dtype=np.float32)
  out = Buffer("CPU", 96, dtypes.float)
  runners[1](out, Buffer("CPU", 96, dtypes.float).copyin(x), Buffer("CPU", 96, dtypes.float).copyin(x))
  assert (out.numpy() == x * x).all()
  print(json.dumps(kernopt.stats()))
""")

def _run(code, env_extra, pythonpath=None):
  env = {**os.environ, **env_extra}
  if pythonpath: env["PYTHONPATH"] = pythonpath
  # outside the checkout, so `-c`'s sys.path[0] (the working directory) can't shadow PYTHONPATH's kernopt
  out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=240,
                       cwd=env_extra["CACHE_DIR"].rsplit("/", 1)[0])
  assert out.returncode == 0, out.stderr
  import json
  return json.loads(out.stdout.strip().splitlines()[-1])

def test_a_warm_process_neither_lowers_nor_renders(tmp_path):
  env = {"CACHE_DIR": str(tmp_path / "shared")}
  cold = _run(WARM, env)
  assert cold["lowerings"] == 3 and cold["renders"] == 3 and cold["compiles"] == 3
  warm = _run(WARM, env)
  assert (warm["lowerings"], warm["renders"], warm["compiles"]) == (0, 0, 0)
  assert warm["program_cache_hits"] == 3 and warm["binary_hits"] == 3

def test_a_changed_kernopt_misses_the_program_cache(tmp_path):
  """A copy of kernopt whose renderer differs by one comment gets its own Programs: the key holds kernopt's source."""
  env = {"CACHE_DIR": str(tmp_path / "shared")}
  _run(WARM, env)
  copy = tmp_path / "copy"
  shutil.copytree(REPO / "kernopt", copy / "kernopt", ignore=shutil.ignore_patterns("__pycache__"))
  with open(copy / "kernopt" / "renderers" / "cstyle.py", "a") as f: f.write("\n# a changed renderer\n")
  changed = _run(WARM, env, pythonpath=str(copy))
  assert changed["program_cache_hits"] == 0 and changed["renders"] == 3
  assert _run(WARM, env)["program_cache_hits"] == 3   # the original's entries are still there

def test_a_corrupt_program_entry_is_a_miss():
  from kernopt import program_cache
  from kernopt.helpers import diskcache_get, diskcache_put
  ast = matmul_bias()
  key = program_cache.program_key(ast, Device["CPU"].renderer, "protocol")
  run_matmul(kernopt.compile(ast, "CPU"))
  entry = diskcache_get(program_cache.TABLE, key)
  diskcache_put(program_cache.TABLE, key, {**entry, "program": entry["program"].replace("data0", "data9")})
  before = kernopt.stats()["program_cache_misses"]
  assert program_cache.get(key) is None and kernopt.stats()["program_cache_misses"] == before + 1
  run_matmul(kernopt.compile(ast, "CPU"), seed=2)

def test_program_round_trips_with_symbolic_sizes():
  from kernopt import program_cache
  from kernopt.shape.symbolic import Variable
  n = Variable("n", 1, 1000)
  ast = A.kernel(A.store(0, A.add(A.load(1, dtypes.float, (n,)), A.load(2, dtypes.float, (n,)))))
  for dev in (Device["CPU"], Device.open("PYTHON", emulate="CUDA")):
    prg = Kernel(ast, opts=dev.renderer).required_optimizations().hand_coded_optimizations().to_program()
    back = program_cache.program_from_json(program_cache.program_to_json(prg))
    for f in ("name", "src", "device", "global_size", "local_size", "args", "vars", "var_args", "op_estimate",
              "mem_estimate"):
      assert getattr(back, f) == getattr(prg, f), f

def test_default_renderer_is_the_host_native_profile():
  from kernopt.renderers.native import NativeCRenderer
  from kernopt.renderers.opencl import OpenCLRenderer
  ast = matmul_bias()
  assert isinstance(Kernel(ast).opts, NativeCRenderer)
  with config_override(DEVICE="OPENCL"): assert type(Kernel(ast).opts) is OpenCLRenderer
  with config_override(DEVICE="CPU"): assert isinstance(Kernel(ast).opts, NativeCRenderer)

def test_kernel_name_is_plain_and_display_name_coloured():
  k = Kernel(matmul_bias(), opts=Device["CPU"].renderer).required_optimizations().hand_coded_optimizations()
  assert "\x1b" not in k.name and re.fullmatch(r"[rEC]\d*_[0-9a-z_]+", k.name)
  assert "\x1b" in k.display_name and k.to_program().name == k.name

def test_readme_code_blocks_run_as_written(tmp_path):
  blocks = re.findall(r"```python\n(.*?)```", (REPO / "README.md").read_text(), re.S)
  assert blocks and "kernopt.compile" in blocks[0]
  out = subprocess.run([sys.executable, "-c", "\n".join(blocks)], capture_output=True, text=True, timeout=240,
                       env={**os.environ, "CACHE_DIR": str(tmp_path)}, cwd=tmp_path)
  assert out.returncode == 0, out.stderr

def test_misused_entry_points_raise_kernopt_errors_that_name_the_problem():
  """Found by an independent tester: each of these raised AttributeError or TypeError from deep inside, was accepted
  (cache="yes"; check with a device name for opts answered []), or (a CPU Program given to OpenCL) gave a compiler
  log about math.h."""
  from kernopt.errors import CompileError
  with pytest.raises(UnsupportedError, match="PYTHON emulates CUDA, METAL or AMD"): Device.open("PYTHON", emulate=3)
  assert "a device name is a str" in Device.why_unavailable(3)
  cpu = Device["CPU"]
  for bad in (None, "src"):
    with pytest.raises(CompileError, match="compile takes a Program"): cpu.compile(bad)
  ast = A.kernel(A.store(0, A.mul(A.load(1, dtypes.float, (8,)), 2.0)))
  for bad in (ast, None, 5):   # (a second tester found None and 5: TypeError, not iterable)
    with pytest.raises(VerifyError, match="compile_many takes an iterable of ASTs"): kernopt.compile_many(bad, "CPU")
  with pytest.raises(VerifyError, match="cache must be a bool"): kernopt.compile(ast, "CPU", cache="yes")
  assert kernopt.check(ast, opts="CPU") == ["opts must be a Renderer (a device's .renderer), got str 'CPU'"]
  prg = Kernel(ast, opts=cpu.renderer).to_program()
  python = Device.open("PYTHON")
  assert python.compile(Kernel(ast, opts=python.renderer).to_program()) is not None   # interprets any dialect's uops
  if "OPENCL" in Device.available():
    with pytest.raises(CompileError, match="was rendered for CPU; the OPENCL device compiles OPENCL programs"):
      Device["OPENCL"].compile(prg)
