"""Test setup: tests/ and the repository root on sys.path (for `import catalogue` and `import examples`, under plain
`pytest` as under `python -m pytest`) and a private on-disk cache for this session, set before
kernopt reads the environment (kernopt.helpers reads it once, at import)."""
import atexit
import os
import shutil
import sys
import tempfile

_cache = tempfile.mkdtemp(prefix="kernopt-test-cache-")
os.environ["XDG_CACHE_HOME"] = _cache
atexit.register(shutil.rmtree, _cache, ignore_errors=True)
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
if (_root := os.path.dirname(os.path.dirname(os.path.abspath(__file__)))) not in sys.path: sys.path.insert(1, _root)

import collections  # noqa: E402
import pytest  # noqa: E402

@pytest.fixture
def compiler_runs(monkeypatch):
  """A Counter of the compiler processes the CPU device starts during the test, by purpose ("compile", "probe"): what
  proves a cache hit, or that a refused argument never reached the compiler."""
  from kernopt.runtime import cpu
  runs: collections.Counter = collections.Counter()
  run = cpu._run
  def counting(cmd, purpose, *args, **kwargs):
    runs[purpose] += 1
    return run(cmd, purpose, *args, **kwargs)
  monkeypatch.setattr(cpu, "_run", counting)
  return runs

@pytest.fixture
def fresh_devices(monkeypatch):
  """An empty device registry for the test: the devices it opens hold no runner an earlier test compiled in this
  process, so a first compile really compiles (and writes its binary into the test's CACHE_DIR) whatever ran before."""
  from kernopt.runtime import Device
  monkeypatch.setattr(Device, "_open", {})
