"""The process-replay guard (scripts/process_replay.py): every source in tests/replay/ is what this tree renders, the
capture does not depend on the host it runs on, and it is the same in another process with another hash seed.
After an intended change: `python scripts/process_replay.py --update`, and review the diff of tests/replay/."""
import os
import subprocess
import sys
import pytest

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "scripts"))
import process_replay as replay  # noqa: E402

replay._use_tree(replay.ROOT)

def _explain(diffs: list, what: str, max_files: int = 3, max_lines: int = 16) -> str:
  names = [rel for rel, _ in diffs]
  head = f"{len(diffs)} replay files differ ({what}): {', '.join(names[:20])}{' ...' if len(names) > 20 else ''}"
  shown = ["\n".join(diff.splitlines()[:max_lines]) for _, diff in diffs[:max_files]]
  return "\n\n".join([head, *shown])

@pytest.fixture(scope="module")
def other_process(tmp_path_factory: pytest.TempPathFactory):
  """The small cases captured by another process, with another hash seed and a host-looking environment; started
  before this process's capture so the two run side by side."""
  out = tmp_path_factory.mktemp("replay")
  env = {**os.environ, "PYTHONHASHSEED": "4242", "CPU_MARCH": "x86-64-v2", "CPU_THREADS": "1", "USE_TC": "0"}
  script = os.path.join(replay.ROOT, "scripts", "process_replay.py")
  proc = subprocess.Popen([sys.executable, script, "--out", str(out), "--only", "*/small-*"], env=env,
                          stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
  yield proc, out
  if proc.poll() is None: proc.kill()
  proc.communicate()

@pytest.fixture(scope="module")
def current(other_process: tuple) -> dict:
  return replay.capture()

def test_capture_unchanged(current: dict):
  stored = replay.read_capture()
  assert stored, f"no capture under {replay.REPLAY_DIR}: run `python scripts/process_replay.py --update`"
  diffs = replay.differences(stored, current)
  if diffs: pytest.fail(_explain(diffs, "rerun `python scripts/process_replay.py --update` if intended"), pytrace=False)

def test_capture_ignores_the_host(current: dict, monkeypatch: pytest.MonkeyPatch):
  """Another host: an AArch64 machine with AVX-512 flags (impossible, so nothing can agree by accident), 64 cores
  and every knob the environment could set to something else."""
  import kernopt.renderers.native as native
  monkeypatch.setattr(native.platform, "machine", lambda: "aarch64")
  monkeypatch.setattr(native, "host_cpu_flags", lambda cpuinfo="": frozenset({"avx512f", "avx2", "fma", "sse4_2"}))
  monkeypatch.setattr(native, "host_threads", lambda: 64)
  from kernopt.helpers import config_override
  with config_override(CPU_MARCH="x86-64-v4", CPU_THREADS=7, USE_TC=0, TC_OPT=2, NOLOCALS=1, MV=0, BEAM=2):
    # the native profiles read host probes; the knobs are pinned once for all profiles, so one GPU profile checks them
    other = replay.capture(lambda p, c: p.startswith("cpu_native") or (p == "cuda_h200" and c.startswith("small")))
  assert other, "the filter kept nothing"
  diffs = replay.differences({rel: current[rel] for rel in other}, other)
  if diffs: pytest.fail(_explain(diffs, "a host probe or a knob leaks into a pinned profile"), pytrace=False)

def test_capture_is_deterministic(current: dict, other_process: tuple):
  proc, out = other_process
  log, _ = proc.communicate(timeout=300)
  assert proc.returncode == 0, log
  other = replay.read_capture(str(out))
  assert len(other) > 100, log
  diffs = replay.differences({rel: current[rel] for rel in other}, other)
  if diffs: pytest.fail(_explain(diffs, "the capture differs between two processes"), pytrace=False)
