"""The repository tree itself: no tracked file whose name a shell or a tool would read as an option."""
import pathlib, subprocess
import pytest

REPO = pathlib.Path(__file__).resolve().parents[1]

def tracked_files() -> list[str]:
  try: out = subprocess.run(["git", "-C", str(REPO), "ls-files", "-z"], capture_output=True, timeout=30)
  except (OSError, subprocess.TimeoutExpired): out = None
  if out is None or out.returncode != 0:   # not a git checkout (an sdist): the files on disk
    return [str(p.relative_to(REPO)) for p in REPO.rglob("*") if ".venv" not in p.parts and ".git" not in p.parts]
  return [f for f in out.stdout.decode().split("\0") if f]

def test_no_file_name_starts_with_a_dash():
  files = tracked_files()
  assert "README.md" in files
  assert [f for f in files if any(part.startswith("-") for part in pathlib.PurePosixPath(f).parts)] == []

@pytest.mark.parametrize("script", [".ci/run", ".ci/install_opencl.sh", "benchmarks/reference/vs_reference.sh"])
def test_shell_scripts_parse(script):
  assert subprocess.run(["bash", "-n", str(REPO / script)], capture_output=True).returncode == 0
