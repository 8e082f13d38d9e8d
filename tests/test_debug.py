"""What DEBUG prints (kernopt/debug.py): nothing at 0; at 1 a line per kernel built whose Opts, times and cache answers
are the Program's and the caches'; at 2 a line per launch whose GFLOP/s and GB/s are the Program's estimates over the
printed time, and a total at exit; 3-6 the AST, source, UOps and lowering steps, all on stderr; escapes only on a
terminal without NO_COLOR. Also GRAPHUOPS's files and RUN_PROCESS_REPLAY's captures."""
import io
import os
import re
import subprocess
import sys
import numpy as np
import pytest
import kernopt
from kernopt import capture, debug, replay
from kernopt.helpers import config_override
from kernopt.kernel import Kernel
from kernopt.renderers.native import ISA_LEVELS, NativeCRenderer
from kernopt.runtime import Buffer, Device
import catalogue

CASES = {c.name: c for c in catalogue.catalogue("small")}

@pytest.fixture(autouse=True)
def _no_total_at_exit():
  """A test at DEBUG=2 registers the exit total; the test process does not print it."""
  yield
  import atexit
  atexit.unregister(debug._print_total)
  debug._exit_registered = False

def _pinned() -> NativeCRenderer:
  return NativeCRenderer(vector_width=4, threads=1, isa=ISA_LEVELS["x86-64-v2"], fused_accumulate=False)

def _protocol(ast, renderer) -> Kernel:
  k = Kernel(ast, opts=renderer).required_optimizations()
  if not k.apply_tensor_cores(): k.hand_coded_optimizations()
  return k

def _run(case, runner, wait=True):
  """case's outputs from runner on seeded inputs, and the catalogue's numpy reference of them."""
  ins = case.inputs(np.random.default_rng(0))
  bufs = [Buffer("CPU", b.numel, b.dtype) if b.output else Buffer("CPU", b.numel, b.dtype).copyin(ins[b.idx])
          for b in case.buffers]
  t = runner(*bufs, wait=wait)
  ref = case.reference(ins)
  return t, {b.idx: bufs[b.idx].numpy()[:ref[b.idx].size] for b in case.outputs}, ref

def test_nothing_printed_at_debug_0(tmp_path, capsys):
  case = CASES["matmul_64"]
  with config_override(DEBUG=0, CACHE_DIR=str(tmp_path)):
    runner = kernopt.compile(case.ast, "CPU")
    _, got, ref = _run(case, runner)
  np.testing.assert_allclose(got[0], ref[0].reshape(-1), rtol=1e-4, atol=1e-4)
  out, err = capsys.readouterr()
  assert out == "" and err == ""

_BUILT = re.compile(r"built\s+(\S+)\s+(\S+)\s+opts=(\[.*?\])\s+codegen (\S+)(?: ms)?\s+compile (\S+)(?: ms)?\s+"
                    r"cache program=(\S+) binary=(\S+) tuning=(\S+)$")

def test_debug_1_one_line_per_kernel_built_with_its_cache_answers(tmp_path, capsys, fresh_devices):
  case = CASES["sum_axis1"]
  expect = _protocol(case.ast, Device["CPU"].renderer)
  with config_override(DEBUG=1, CACHE_DIR=str(tmp_path)):
    kernopt.compile(case.ast, "CPU")
    first = capsys.readouterr()
    kernopt.compile(case.ast, "CPU")
    second = capsys.readouterr()
  assert first.out == "" and second.out == ""
  lines = [ln for ln in (first.err + second.err).splitlines() if ln]
  assert len(lines) == 2, lines
  m1, m2 = (_BUILT.search(ln) for ln in lines)
  assert m1 and m2, lines
  opts = "[" + ", ".join(f"{o.op.name}({o.axis},{o.amt})" for o in expect.applied_opts) + "]"
  assert (m1[1], m1[2], m1[3]) == ("CPU", expect.name, opts) and m2[3] == opts
  assert float(m1[4]) > 0 and float(m1[5]) > 0
  # first: the program cache misses and the compiler runs; second: the program cache and this process's runner serve
  assert (m1[6], m1[7], m1[8]) == ("miss", "miss", "-")
  assert (m2[6], m2[7], m2[8]) == ("hit", "memory", "-") and m2[4] == "-" and m2[5] == "-"

def test_debug_1_binary_cache_hit_in_another_device(tmp_path, capsys, fresh_devices):
  prg = _protocol(CASES["add"].ast, _pinned()).to_program()
  with config_override(DEBUG=1, CACHE_DIR=str(tmp_path)):
    Device["CPU"].compile(prg)
    Device.open("CPU", threads=1).compile(prg)   # its own runners: the binary comes from the disk cache
  lines = capsys.readouterr().err.splitlines()
  assert [_BUILT.search(ln)[7] for ln in lines] == ["miss", "hit"], lines

_LAUNCH = re.compile(r"launch\s+CPU\s+(\S+)\s+global=(\S+) local=(\S+)\s+(\S+) ms\s+(\S+) GFLOP/s\s+(\S+) GB/s$")

def test_debug_2_launch_line_is_the_programs_estimates_over_its_time(tmp_path, capsys):
  case = CASES["matmul_64"]
  prg = _protocol(case.ast, _pinned()).to_program()
  runner = Device["CPU"].compile(prg)
  capsys.readouterr()
  with config_override(DEBUG=2, CACHE_DIR=str(tmp_path)):
    t, got, ref = _run(case, runner, wait=False)
  assert t is None   # the caller did not ask for the time; DEBUG waited for it all the same
  np.testing.assert_allclose(got[0], ref[0].reshape(-1), rtol=1e-4, atol=1e-4)
  lines = capsys.readouterr().err.splitlines()
  assert len(lines) == 1, lines
  m = _LAUNCH.search(lines[0])
  assert m and m[1] == prg.name and (m[2], m[3]) == ("-", "-"), lines
  ms, gflops, gbs = float(m[4]), float(m[5]), float(m[6])
  tol = 0.0005 / ms + 0.01   # the printed time has three decimals
  assert gflops == pytest.approx(prg.op_estimate / (ms * 1e-3) * 1e-9, rel=tol, abs=0.01)
  assert gbs == pytest.approx(prg.mem_estimate / (ms * 1e-3) * 1e-9, rel=tol, abs=0.01)
  assert prg.op_estimate >= 2 * 64 ** 3   # the estimate counts at least the matmul's multiply-adds

def test_debug_2_total_at_exit_registered_on_first_launch_only(tmp_path):
  code = ("import sys; sys.path.insert(0, 'tests'); import numpy as np, kernopt, catalogue; from kernopt import debug;"
          "from kernopt.runtime import Buffer; c = {x.name: x for x in catalogue.catalogue('small')}['add'];"
          "r = kernopt.compile(c.ast, 'CPU'); ins = c.inputs(np.random.default_rng(0));"
          "print(debug._exit_registered);"
          "bufs = [Buffer('CPU', b.numel, b.dtype) for b in c.buffers]; [r(*bufs) for _ in range(3)]")
  root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
  env = {**os.environ, "CACHE_DIR": str(tmp_path), "NO_COLOR": "1"}
  for level, launches in (("0", None), ("2", 3)):
    p = subprocess.run([sys.executable, "-c", code], cwd=root, env={**env, "DEBUG": level}, capture_output=True,
                       text=True, timeout=120)
    assert p.returncode == 0, p.stderr
    assert p.stdout.strip() == "False"
    if launches is None:
      assert p.stderr == ""
      continue
    err = p.stderr.splitlines()
    assert sum(" launch " in ln for ln in err) == launches
    assert re.search(rf"total\s+{launches} launches .* 1 kernels built$", err[-1]), err

def test_debug_3_to_6_on_stderr(capsys):
  case = CASES["sum_axis1"]
  with config_override(DEBUG=6):
    prg = _protocol(case.ast, _pinned()).to_program()
  out, err = capsys.readouterr()
  assert out == ""
  assert "BufferOps.STORE" in err or "STORE" in err   # the optimized AST
  assert prg.src in err                              # the source
  for i, u in enumerate(prg.uops): assert f"{i:4d} {u}" in err   # the UOps
  steps = dict(re.findall(r"step\s+(\w+)\s+(\d+) uops", err))
  # one step line per pass between linearize and render; what render spells is Program.uops
  assert set(steps) >= {"ast", "lower", "linearize", "vectorize", "render"} and int(steps["render"]) == len(prg.uops)

class _Tty(io.StringIO):
  def isatty(self) -> bool: return True

def test_colour_only_on_a_terminal_without_no_color(monkeypatch):
  line = debug.kernel_line("r_4", "CPU", [], 0.001, 0.002, {"program": "-"})
  monkeypatch.delenv("NO_COLOR", raising=False)
  tty, pipe = _Tty(), io.StringIO()
  debug.emit(line, tty)
  debug.emit(line, pipe)
  assert "\x1b[" in tty.getvalue() and "\x1b" not in pipe.getvalue()
  monkeypatch.setenv("NO_COLOR", "1")
  tty = _Tty()
  debug.emit(line, tty)
  assert "\x1b" not in tty.getvalue()

def test_search_progress_is_opt_in_and_one_summary_line_at_debug_1(tmp_path, capsys):
  from kernopt.search import SearchConfig, search
  assert SearchConfig().progress is False
  case = CASES["add"]
  with config_override(DEBUG=1, CACHE_DIR=str(tmp_path)):
    res = search(Kernel(case.ast, opts=Device["CPU"].renderer), config=SearchConfig(max_rounds=1, workers=0))
  err = capsys.readouterr().err.splitlines()
  assert len(err) == 1 and "search" in err[0], err   # no line per candidate, no progress
  assert f"{res.stats.rounds} rounds, {res.stats.compiled} compiled, {res.stats.timed} timed" in err[0]
  assert f"best {res.time_s * 1e6:.1f} us" in err[0]

def test_graphuops_writes_the_dot_in_a_private_folder(tmp_path, capsys):
  import shutil
  with config_override(GRAPHUOPS=1, DEBUG=1, CACHE_DIR=str(tmp_path)):
    prg = _protocol(CASES["add"].ast, _pinned()).to_program()
  dot = tmp_path / "graphs" / f"uops_{prg.name}.dot"
  text = dot.read_text()
  assert text.count("[label=") == len(prg.uops) and oct(os.stat(tmp_path / "graphs").st_mode & 0o777) == "0o700"
  assert str(dot) in capsys.readouterr().err
  assert (tmp_path / "graphs" / f"uops_{prg.name}.svg").exists() == (shutil.which("dot") is not None)
  os.chmod(tmp_path / "graphs", 0o777)   # not private any more: refused, with a warning, nothing written
  dot.unlink()
  with config_override(GRAPHUOPS=1, CACHE_DIR=str(tmp_path)), pytest.warns(RuntimeWarning, match="writable by group"):
    _protocol(CASES["add"].ast, _pinned()).to_program()
  assert not dot.exists()

def test_graphuops_names_a_long_kernel_name_by_its_digest(tmp_path):
  """A Variable named with 300 characters makes a kernel name no file system takes whole: the file is named by a cut
  of it and its digest, and a second kernel of another long name gets a file of its own."""
  from catalogue import alu, buf, kernel, store
  from kernopt.ops import BinaryOps
  from kernopt.shape.symbolic import Variable
  names = []
  for ch in "vw":
    x = buf(1, (Variable(ch * 300, 1, 64), 4))
    with config_override(GRAPHUOPS=1, CACHE_DIR=str(tmp_path)):
      prg = _protocol(kernel(store(alu(BinaryOps.ADD, x, x))), _pinned()).to_program()
    names.append(len(prg.uops))
  files = sorted((tmp_path / "graphs").glob("uops_*.dot"))
  assert len(files) == 2 and all(len(f.name) < 120 for f in files)
  assert sorted(f.read_text().count("[label=") for f in files) == sorted(names)

def test_run_process_replay_captures_what_kernopt_replay_rebuilds(tmp_path):
  with config_override(RUN_PROCESS_REPLAY=1, CACHE_DIR=str(tmp_path)):
    prgs = [_protocol(CASES[n].ast, r).to_program() for n, r in
            (("matmul_64", _pinned()), ("sum_axis1", capture.profiles()["cuda_h200"]()))]
  files = replay.read(str(tmp_path / "process_replay"))
  assert len(files) == 2
  srcs = sorted("\n".join(__import__("json").loads(t)["src"]) for t in files.values())
  assert srcs == sorted(p.src for p in prgs)
  assert replay.replay(files) == []   # rendered again from the capture alone: the same files

@pytest.mark.parametrize("profile", sorted(capture.profiles()))
def test_each_profile_rebuilds_from_its_capabilities(profile):
  r = capture.profiles()[profile]()
  caps = capture.jsonable(r.capabilities())
  assert capture.jsonable(capture.renderer_from_capabilities(caps).capabilities()) == caps
