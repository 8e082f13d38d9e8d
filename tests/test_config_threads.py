"""config_override reaches the work kernopt hands to other threads and processes: the search's compile threads run in
a copy of the caller's context (CACHE_DIR, COMPILE_TIMEOUT, DISABLE_CACHE hold there), and a build handed to a worker
process gets the knobs explicitly."""
import os
import threading
import pytest
import catalogue
from kernopt import search as S
from kernopt import search_workers as W
from kernopt.helpers import config_override, getconfig
from kernopt.kernel import Kernel
from kernopt.runtime import Device, cpu

pytestmark = pytest.mark.skipif(not cpu.CPUDevice.availability()[0], reason="no C compiler")

def _spy_loads(monkeypatch) -> list[tuple]:
  """(CACHE_DIR, COMPILE_TIMEOUT, DISABLE_CACHE, thread name) of every CPU build, as the building thread sees them."""
  seen: list[tuple] = []
  load = cpu.CPUDevice._load
  def spy(self, src, name):
    cfg = getconfig()
    seen.append((cfg.CACHE_DIR, cfg.COMPILE_TIMEOUT, cfg.DISABLE_CACHE, threading.current_thread().name))
    return load(self, src, name)
  monkeypatch.setattr(cpu.CPUDevice, "_load", spy)
  return seen

def _search(tag: str) -> S.SearchResult:
  # a device of its own, so no runner from another test is reused and every candidate really compiles
  dev = Device.open("CPU", threads=1, extra_flags=(f"-DKERNOPT_CONFIG_THREADS_{tag}=1",))
  k = Kernel(catalogue.get("sum_axis1").ast, opts=dev.renderer)
  return S.search(k, None, S.SearchConfig(workers=0, max_rounds=1, time_budget_s=20, progress=False), device=dev)

def _binaries(folder) -> list[str]:
  return [f for f in os.listdir(folder) if f.endswith(".so")] if os.path.isdir(folder) else []

def test_search_compile_threads_build_into_the_overridden_cache(tmp_path, monkeypatch):
  seen = _spy_loads(monkeypatch)
  with config_override(CACHE_DIR=str(tmp_path), COMPILE_TIMEOUT=77.0):
    res = _search("A")
  threaded = [s for s in seen if s[3].startswith("kernopt-search")]
  assert len(threaded) >= 2 and res.stats.compiled >= 2
  assert all(s[:3] == (str(tmp_path), 77.0, 0) for s in threaded), threaded
  assert len(_binaries(tmp_path / "cpu")) >= len(threaded)   # every binary in the overridden directory

def test_search_compile_threads_see_disable_cache(tmp_path, monkeypatch):
  seen = _spy_loads(monkeypatch)
  with config_override(CACHE_DIR=str(tmp_path), DISABLE_CACHE=1):
    _search("B")
  threaded = [s for s in seen if s[3].startswith("kernopt-search")]
  assert threaded and all(s[2] == 1 for s in threaded), threaded
  assert _binaries(tmp_path / "cpu") == []

def test_a_worker_process_gets_the_knobs_explicitly(tmp_path):
  dev = Device.open("CPU", threads=1, extra_flags=("-DKERNOPT_CONFIG_THREADS_C=1",))
  k = Kernel(catalogue.get("add").ast, opts=dev.renderer)
  with config_override(CACHE_DIR=str(tmp_path), COMPILE_TIMEOUT=30.0):
    knobs = W.worker_knobs()
    assert knobs["CACHE_DIR"] == str(tmp_path) and knobs["COMPILE_TIMEOUT"] == 30.0
  from kernopt import ops
  task = W.RenderTask(ops.ast_to_json(k.ast), ops.ast_digest(k.ast), (), k.opts, W.device_spec(dev), knobs, False)
  pool = W.process_pool(1)
  try: prg, err = pool.submit(W.render_task, task).result(timeout=120)
  finally: pool.shutdown()
  assert prg is not None, err
  assert len(_binaries(tmp_path / "cpu")) == 1   # the worker (a fresh process) built into the caller's CACHE_DIR
