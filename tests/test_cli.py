"""The command line (kernopt/cli.py) on catalogue AST files: what each command prints is what the library computes
independently; `run` catches a wrong kernel; `replay` finds a renderer's changed spelling and nothing on a clean tree;
bad arguments are one line and exit status 2."""
import json
import os
import subprocess
import sys
import pytest
import kernopt
from kernopt import capture, cli, replay
from kernopt.helpers import config_override, diskcache_items
from kernopt.kernel import Kernel
from kernopt.runtime import Device
import catalogue

CASES = {c.name: c for c in catalogue.catalogue("small")}

@pytest.fixture
def files(tmp_path):
  """catalogue ASTs saved with kernopt.save, and a private cache directory for the commands."""
  out = {n: kernopt.save(CASES[n].ast, str(tmp_path / f"{n}.json")) for n in ("add", "matmul_64", "sym_sum")}
  with config_override(CACHE_DIR=str(tmp_path / "cache")): yield out

def _protocol(ast, renderer) -> Kernel:
  k = Kernel(ast, opts=renderer).required_optimizations()
  if not k.apply_tensor_cores(): k.hand_coded_optimizations()
  return k

def test_show_prints_the_protocols_kernel(files, capsys):
  for device in ("CPU", "CUDA"):
    assert cli.main(["show", files["matmul_64"], "--device", device]) == 0
    out = capsys.readouterr().out
    renderer = Device[device].renderer if device in Device.available() else kernopt.ast and \
      __import__("kernopt.renderers", fromlist=["get_renderer"]).get_renderer(device)
    prg = _protocol(CASES["matmul_64"].ast, renderer).to_program()
    assert f"name   {prg.name}\n" in out and out.endswith(prg.src + "\n")
  assert cli.main(["show", files["add"], "--opts", "UPCAST:0:4"]) == 0
  assert "opts   [UPCAST(0,4)]" in capsys.readouterr().out

def test_run_checks_against_the_unoptimized_kernel(files, capsys):
  for name in ("matmul_64", "sym_sum"):
    assert cli.main(["run", files[name], "--repeat", "2"]) == 0
    assert "matches the unoptimized kernel on CPU" in capsys.readouterr().out

def test_run_detects_a_wrong_kernel(files, capsys, monkeypatch):
  """Fault injection: the optimized Program computes a*b where the AST says a+b."""
  from kernopt import ast as A
  add = CASES["add"].ast
  mul = A.kernel(A.store(0, A.mul(*add.src[0].src[0].src)))
  real = cli._optimized_program
  monkeypatch.setattr(cli, "_optimized_program", lambda k: real(Kernel(mul, opts=k.opts)))
  assert cli.main(["run", files["add"], "--repeat", "1"]) == 1
  assert "MISMATCH" in capsys.readouterr().out

def test_search_then_the_cache_commands(files, tmp_path, capsys, fresh_devices):
  assert cli.main(["search", files["add"], "--budget", "1", "--no-progress", "--beam", "2"]) == 0
  out = capsys.readouterr().out
  assert out.startswith("before ") and "\nafter " in out
  tuned = diskcache_items("tuning")
  assert len(tuned) == 1
  assert f"opts={cli_opts(tuned[0][1]['opts'])}" in out.splitlines()[1]
  assert cli.main(["cache", "info"]) == 0
  info = capsys.readouterr().out
  assert "tuning   1 entries" in info and "binaries cpu: 0 files" not in info
  export = str(tmp_path / "tuning.json")
  assert cli.main(["cache", "export", export]) == 0 and len(json.load(open(export))["entries"]) == 1
  assert cli.main(["cache", "clear", "tuning"]) == 0 and diskcache_items("tuning") == []
  assert cli.main(["cache", "import", export]) == 0 and len(diskcache_items("tuning")) == 1
  assert cli.main(["cache", "clear"]) == 0
  assert diskcache_items("tuning") == [] and not os.path.exists(tmp_path / "cache" / "cpu")
  capsys.readouterr()

def cli_opts(opts: list) -> str: return "[" + ", ".join(f"{o}({a},{n})" for o, a, n in opts) + "]"

def _capture(folder) -> None:
  todo = [("cpu_static", "add"), ("cpu_static", "matmul_64"), ("opencl", "add")]
  files = {f"{p}/small-{c}.json": capture.dumps(replay.capture_one(f"small-{c}", CASES[c].ast, p,
                                                                   capture.profiles()[p]()))
           for p, c in todo}
  capture.write_capture(files, str(folder))

def test_replay_reports_only_the_kernels_a_changed_renderer_writes_differently(tmp_path, capsys, monkeypatch):
  from kernopt.renderers.cstyle import CRenderer
  _capture(tmp_path / "cap")
  assert cli.main(["replay", str(tmp_path / "cap")]) == 0
  assert capsys.readouterr().out.strip() == "replay: 3 kernels unchanged"
  monkeypatch.setattr(CRenderer, "kernel_prefix", "static ")
  assert cli.main(["replay", str(tmp_path / "cap")]) == 1
  out = capsys.readouterr().out
  changed = [ln.split()[1] for ln in out.splitlines() if ln.startswith("changed: ")]
  assert changed == ["cpu_static/small-add.json", "cpu_static/small-matmul_64.json"]
  assert '+  "static void' in out and "replay: 2 of 3 kernels changed" in out

def test_devices_lists_what_the_registry_finds(capsys):
  assert cli.main(["devices"]) == 0
  lines = capsys.readouterr().out.splitlines()
  assert lines[0] == f"available: {', '.join(Device.available())}"
  for name in ("CUDA", "METAL", "OPENCL", "PYTHON", "CPU"):
    if name not in Device.available(): assert f"{name}: unavailable: {Device.why_unavailable(name)}" in lines

@pytest.mark.parametrize("argv", [[], ["bogus"], ["run", "missing.json"], ["show", "NOTAST"], ["show", "ADD", "--opts",
                                  "UPCAST"], ["run", "ADD", "--repeat", "0"], ["run", "ADD", "--device", "METAL"],
                                  ["replay", "missing"], ["show", "ADD", "--opts", "UPCAST:9:4"]])
def test_bad_arguments_are_one_line_and_status_2(files, tmp_path, capsys, argv):
  (tmp_path / "bad.json").write_text('{"not": "an ast"}')
  argv = [files["add"] if a == "ADD" else str(tmp_path / "bad.json") if a == "NOTAST" else a for a in argv]
  assert cli.main(argv) == 2
  out, err = capsys.readouterr()
  assert out == "" and len(err.splitlines()) == 1 and err.startswith("kernopt: error: "), err

def test_python_dash_m_kernopt(tmp_path):
  root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
  p = subprocess.run([sys.executable, "-m", "kernopt", "show", str(tmp_path / "none.json")], cwd=root,
                     capture_output=True, text=True, timeout=60, env={**os.environ, "CACHE_DIR": str(tmp_path)})
  assert p.returncode == 2 and p.stdout == "" and "Traceback" not in p.stderr
  assert p.stderr.startswith("kernopt: error: ") and len(p.stderr.splitlines()) == 1
