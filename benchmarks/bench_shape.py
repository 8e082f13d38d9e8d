"""Shape-layer codegen cost: 10,000 `from_shape -> reshape -> permute -> pad -> expr_idxs` chains over varied shapes,
cold (every shape-layer cache emptied first) and warm (the same chains again, fully cached). Medians of 7 repeats.
Run: python benchmarks/bench_shape.py"""
import pathlib, statistics, sys, time
sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1]))
from kernopt.shape.shapetracker import ShapeTracker  # noqa: E402
from kernopt.shape.view import clear_caches  # noqa: E402

CHAINS, REPEATS = 10_000, 7
SHAPES = [(1 + i % 16, 1 + (i // 16) % 25, 1 + (i // 400) % 25) for i in range(CHAINS)]  # 10,000 distinct shapes

def run_chains() -> None:
  for a, b, c in SHAPES:
    st = ShapeTracker.from_shape((a, b, c)).reshape((a * b, c)).permute((1, 0)).pad(((1, 1), (0, 2)))
    st.expr_idxs()

def median_seconds(cold: bool) -> float:
  times = []
  for _ in range(REPEATS):
    if cold: clear_caches()
    else: run_chains()
    t = time.perf_counter()
    run_chains()
    times.append(time.perf_counter() - t)
  return statistics.median(times)

def main() -> None:
  for label, cold in (("cold (caches emptied)", True), ("warm (fully cached)", False)):
    s = median_seconds(cold)
    print(f"{label:24s} {CHAINS} chains: median {s * 1e3:8.1f} ms  = {s / CHAINS * 1e6:6.1f} us/chain")
  root = pathlib.Path(__file__).resolve().parents[1] / "kernopt" / "shape"
  lines = {p.name: len(p.read_text().splitlines()) for p in (root / "view.py", root / "shapetracker.py")}
  print("lines: " + ", ".join(f"{k} {v}" for k, v in lines.items()))

if __name__ == "__main__":
  main()
