"""Beam search on the CPU device: results match numpy and beat hand-coded, validation drops a wrong candidate, the
tuning cache keys, hits, export and import, and tune_all on a dask.distributed cluster (needs `dask[distributed]`)."""
import concurrent.futures as cf
import copy
import json
from dataclasses import replace
import multiprocessing
import time
import warnings
import numpy as np
import pytest
import catalogue
import kernopt
from kernopt import search as S
from kernopt.helpers import config_override
from kernopt.kernel import Kernel, Opt, OptOps
from kernopt.runtime import Buffer, Device, cpu

pytestmark = pytest.mark.skipif(not cpu.CPUDevice.availability()[0], reason="no C compiler")
DEV = Device.open("CPU", threads=1)  # one thread: timings on a shared 2-core machine are noisy enough

@pytest.fixture(scope="module")
def pool():
  ex = cf.ProcessPoolExecutor(max_workers=2, mp_context=multiprocessing.get_context("forkserver"))
  yield ex
  ex.shutdown(cancel_futures=True)

@pytest.fixture(scope="module")
def cache_dir(tmp_path_factory):
  return str(tmp_path_factory.mktemp("search_cache"))

def make_buffers(case, seed=1):
  """Buffers in MemBuffer index order: inputs from the case, outputs zeroed; and the inputs."""
  inputs = case.inputs(np.random.default_rng(seed))
  bufs = []
  for b in sorted(case.buffers, key=lambda b: b.idx):
    data = inputs[b.idx] if not b.output else np.zeros(b.numel, b.np_dtype)
    bufs.append(Buffer("CPU", b.numel, b.dtype).copyin(data))
  return bufs, inputs

def check_numpy(kernel, case, seed=2):
  """Run kernel on the case's inputs and compare every output with the numpy reference."""
  bufs, inputs = make_buffers(case, seed)
  DEV.compile(kernel.to_program())(*bufs, wait=True)
  for out, want in case.reference(inputs).items():
    got = bufs[out].numpy().reshape(want.shape)
    np.testing.assert_allclose(got, want, rtol=max(case.tol, 1e-5), atol=1e-4)

def kernel_of(name, renderer=None):
  return Kernel(catalogue.get(name).ast, opts=renderer or DEV.renderer)

def hand_coded(k):
  k = k.copy()
  if not k.apply_tensor_cores(): k.hand_coded_optimizations()
  return k

def best_time(runner, bufs, n=30):
  return min(runner(*bufs, wait=True) for _ in range(n))

def test_search_matmul_matches_numpy_and_beats_hand_coded(pool, cache_dir):
  case = catalogue.get("matmul_64")
  with config_override(CACHE_DIR=cache_dir):
    bufs, inputs = make_buffers(case)
    before = [b.numpy().copy() for b in bufs[1:]]
    res = S.search(kernel_of("matmul_64"), bufs, S.SearchConfig(time_budget_s=8, executor=pool, progress=False))
    assert res.validated and res.stats.compiled > 2 and res.stats.timed > 2 and res.stats.rounds >= 1
    assert res.time_s <= res.baseline_s  # the standard protocol's kernel is a candidate
    for b, x in zip(bufs[1:], before): np.testing.assert_array_equal(b.numpy(), x)  # inputs untouched
    check_numpy(res.kernel, case)
    # measured again, interleaved, with a generous allowance for a machine shared with other jobs
    hc = DEV.compile(hand_coded(kernel_of("matmul_64")).to_program())
    found = DEV.compile(res.kernel.to_program())
    t_hc = min(best_time(hc, bufs) for _ in range(3))
    t_found = min(best_time(found, bufs) for _ in range(3))
    assert t_found <= 1.5 * t_hc, (t_found, t_hc, res.kernel.applied_opts)

def _add_one(kernel, program):
  """A wrong kernel: its source adds one to the first output element after computing it."""
  src = program.src.rstrip()
  assert src.endswith("}")
  return type(program)(**{**program.__dict__, "src": src[:-1] + "  data0[0] = data0[0] + 1;\n}\n"})

class MiscompilingCPU(cpu.CPUDevice):
  """A CPU device whose compiler is wrong for every kernel but the unoptimized one (source `clean`): it adds one to
  the first output element."""
  def __init__(self, clean: str):
    super().__init__(threads=1)
    self.clean = clean

  def compile(self, program):
    return super().compile(program if program.src == self.clean else _add_one(None, program))

def test_validation_drops_a_wrong_candidate(capsys, pool, cache_dir):
  start = kernel_of("sum_axis1")
  dev = MiscompilingCPU(start.copy().to_program().src)
  with config_override(CACHE_DIR=cache_dir), pytest.warns(RuntimeWarning, match="differs from the unoptimized kernel"):
    res = S.search(start, None, S.SearchConfig(time_budget_s=10, executor=pool, max_rounds=1, progress=True),
                   device=dev)
  assert res.kernel.applied_opts == () and res.stats.rejected >= 2 and res.validated
  check_numpy(res.kernel, catalogue.get("sum_axis1"))
  err = capsys.readouterr().err
  assert "round 1" in err and "best" in err  # the plain progress lines (tqdm not installed) or tqdm's bar

def test_validation_passes_unchanged_programs(cache_dir):
  with config_override(CACHE_DIR=cache_dir):
    k = hand_coded(kernel_of("sum_axis1"))
    v = S.Validator(k, DEV, {}, None, seed=0)
    assert v.check(DEV.compile(k.to_program())) is None
    assert "differ" in v.check(DEV.compile(_add_one(k, k.to_program())))

def test_tolerances_and_random_inputs():
  from kernopt.dtype import dtypes
  assert S.tolerance(dtypes.int32) == 0 and S.tolerance(dtypes.bool) == 0
  assert S.tolerance(dtypes.float) == 1e-3 and S.tolerance(dtypes.half) == 1e-2 and S.tolerance(dtypes.bfloat16) == 1e-2
  rng = np.random.default_rng(0)
  assert S.random_array(dtypes.uint8, 100, rng).max() < 16 and S.random_array(dtypes.int32, 100, rng).min() >= -8
  bf = S.random_array(dtypes.bfloat16, 100, rng)
  assert bf.dtype == np.uint16 and np.abs(S._as_float(bf, dtypes.bfloat16)).max() <= 1

def test_expand_prunes_and_deduplicates():
  k = kernel_of("matmul_64")
  seen, stats = set(), S.SearchStats()
  cands = S.expand(k, S.SearchConfig(max_upcast_size=2), seen, stats)
  assert cands and stats.pruned > 0
  assert all(S._upcast_size(c) <= 2 for _, c in cands)
  assert len({d for d, _ in cands}) == len(cands)
  assert S.expand(k, S.SearchConfig(max_upcast_size=2), seen, stats) == []  # everything already seen

def test_a_start_beyond_the_upcast_limit_still_has_children():
  """A device profile's hand-coded tile may exceed max_upcast_size; its children that don't grow the tile (another
  axis unrolled into the same size, a PADTO, a LOCAL) are still candidates, those that grow it are pruned."""
  k = kernel_of("matmul_64")
  k.apply_opt(Opt(OptOps.UPCAST, 0, 4))
  k.apply_opt(Opt(OptOps.UPCAST, 1, 4))
  stats = S.SearchStats()
  cands = S.expand(k, S.SearchConfig(max_upcast_size=8), set(), stats)
  assert cands and stats.pruned > 0 and all(S._upcast_size(c) <= 16 for _, c in cands)
  acts = S.actions(k)
  assert Opt(OptOps.UPCAST, 0, 7) in acts and Opt(OptOps.UNROLL, 0, 0) in acts and Opt(OptOps.PADTO, 2, 32) in acts
  assert not any(a.op is OptOps.LOCAL for a in acts)  # the C dialect has no local threads
  assert S.opt_from_json(S.opt_to_json(Opt(OptOps.UPCAST, 1, 4))) == Opt(OptOps.UPCAST, 1, 4)

def test_cache_key_covers_compiler_dialect_version_and_config(monkeypatch):
  k, dev, cfg = kernel_of("sum_axis1"), DEV, S.SearchConfig()
  base = S.tuning_key(k, dev, cfg)
  assert base == S.tuning_key(kernel_of("sum_axis1"), dev, S.SearchConfig(time_budget_s=3, repeats=5))
  flagged = Device.open("CPU", threads=1, extra_flags=("-DKERNOPT_SEARCH_TEST=1",))
  narrow = copy.copy(DEV.renderer)
  narrow.caps = replace(narrow.caps, max_upcast=4)
  others = [S.tuning_key(k, flagged, cfg), S.tuning_key(kernel_of("sum_axis1", narrow), dev, cfg),
            S.tuning_key(k, dev, S.SearchConfig(beam=5)), S.tuning_key(k, dev, S.SearchConfig(validate=False)),
            S.tuning_key(hand_coded(k), dev, cfg), S.tuning_key(kernel_of("sum_axis0"), dev, cfg)]
  monkeypatch.setattr(kernopt, "__version__", "999.0")
  others.append(S.tuning_key(k, dev, cfg))
  assert len(set(others + [base])) == len(others) + 1

def _no_search(*args, **kwargs):
  raise AssertionError("searched although the tuning cache should have hit")

def test_cache_hit_reapplies_without_searching_or_compiling_and_flags_miss(monkeypatch, cache_dir, compiler_runs):
  cfg = S.SearchConfig(time_budget_s=3, workers=0, progress=False)
  with config_override(CACHE_DIR=cache_dir):
    tuned = S.search_or_cached(kernel_of("sum_axis1"), config=cfg)
    entry = S.lookup(kernel_of("sum_axis1"), config=cfg)
    assert entry["opts"] == [S.opt_to_json(o) for o in tuned.applied_opts] and entry["validated"]
    monkeypatch.setattr(S, "search", _no_search)
    runs = dict(compiler_runs)
    hit = S.search_or_cached(kernel_of("sum_axis1"), config=cfg)
    assert hit.applied_opts == tuned.applied_opts and compiler_runs == runs   # no search, no compile
    check_numpy(hit, catalogue.get("sum_axis1"))
    # other compiler flags: a miss, so it searches
    flagged = Device.open("CPU", threads=1, extra_flags=("-DKERNOPT_SEARCH_TEST=1",))
    with pytest.raises(AssertionError, match="searched although"):
      S.search_or_cached(kernel_of("sum_axis1"), config=cfg, device=flagged)
    monkeypatch.setattr(kernopt, "__version__", "999.0")
    with pytest.raises(AssertionError, match="searched although"):
      S.search_or_cached(kernel_of("sum_axis1"), config=cfg)

def test_export_import_gives_hits_validated_once(monkeypatch, tmp_path, cache_dir):
  cfg = S.SearchConfig(time_budget_s=3, workers=0, progress=False)
  path = str(tmp_path / "tuning.json")
  with config_override(CACHE_DIR=cache_dir):
    tuned = S.search_or_cached(kernel_of("max_axis1"), config=cfg)
    assert S.export_cache(path) >= 1
  data = json.load(open(path))
  assert data["format"] == "kernopt-tuning" and all(isinstance(k, str) for k in data["entries"])
  assert any(e["opts"] == [list(S.opt_to_json(o)) for o in tuned.applied_opts] for e in data["entries"].values())
  checks = []
  orig_check = S.Validator.check
  monkeypatch.setattr(S.Validator, "check", lambda self, r: checks.append(r) or orig_check(self, r))
  monkeypatch.setattr(S, "search", _no_search)
  with config_override(CACHE_DIR=str(tmp_path / "fresh")):
    assert S.lookup(kernel_of("max_axis1"), config=cfg) is None
    assert S.import_cache(path) == len(data["entries"])
    assert S.lookup(kernel_of("max_axis1"), config=cfg)["imported"]
    first = S.search_or_cached(kernel_of("max_axis1"), config=cfg)
    assert len(checks) == 1 and first.applied_opts == tuned.applied_opts
    entry = S.lookup(kernel_of("max_axis1"), config=cfg)
    assert entry["validated"] and not entry["imported"]
    second = S.search_or_cached(kernel_of("max_axis1"), config=cfg)
    assert len(checks) == 1 and second.applied_opts == tuned.applied_opts
    check_numpy(second, catalogue.get("max_axis1"))
  with pytest.raises(ValueError, match="not a kernopt tuning export"):
    (tmp_path / "bad.json").write_text("{}")
    S.import_cache(str(tmp_path / "bad.json"))

def test_budget_ends_the_search(tmp_path, monkeypatch):
  """Every compile takes at least 0.3 s, so the large conv's first rounds (dozens of candidates, 4 compile threads)
  outlast the 1.5 s budget on any host, however fast its compiler; the slack covers validating the winner."""
  compile_ = type(DEV).compile
  def slow_compile(self, prg):
    time.sleep(0.3)
    return compile_(self, prg)
  monkeypatch.setattr(type(DEV), "compile", slow_compile)
  with config_override(CACHE_DIR=str(tmp_path)):
    big = catalogue.get("conv2d", "large")
    res = S.search(Kernel(big.ast, opts=DEV.renderer), None, S.SearchConfig(time_budget_s=1.5, workers=0,
                                                                             progress=False))
  assert res.stats.out_of_budget and res.stats.wall_s < 1.5 + 4.5
  check_numpy(res.kernel, big)

@pytest.mark.parametrize("budget_binds", [True, False])
def test_builds_cut_short_by_the_budget_end_the_search(monkeypatch, budget_binds):
  """Builds still running when the budget, less the time reserved to time them, runs out are dropped and the search
  is out of budget (it ended early with out_of_budget False on a fast host); builds dropped for outliving
  compile_timeout_s leave the budget as it was."""
  compile_ = type(DEV).compile
  monkeypatch.setattr(type(DEV), "compile", lambda self, prg: (time.sleep(0.4), compile_(self, prg))[1])
  k = kernel_of("add")
  bufs, _ = make_buffers(catalogue.get("add"))
  cfg = S.SearchConfig(workers=0, validate=False, progress=False, time_budget_s=60,
                       compile_timeout_s=10.0 if budget_binds else 0.1)
  s = S._Search(k, bufs, cfg, None, DEV)
  s.deadline, s.timing_reserve = time.perf_counter() + 0.3, 0.2
  if not budget_binds: s.deadline = time.perf_counter() + 50
  cands = [S._Cand(d, k2) for d, k2 in S.expand(k, cfg, set(), S.SearchStats())][:3]
  try: assert s.build(cands) == []
  finally: s._drop_executor(wait=True)
  assert s.stats.failed == 3 and s.stats.out_of_budget is budget_binds

def test_misused_search_entry_points_raise_kernopt_errors(tmp_path):
  """Found by an independent tester: each raised AttributeError or TypeError from inside the search or the tuning
  file, or (a negative budget, beam 0, a version of `true`) was accepted."""
  from kernopt.errors import TuningCacheError, VerifyError
  k = kernel_of("add")
  with pytest.raises(VerifyError, match="search takes a Kernel"): S.search(k.ast)
  with pytest.raises(VerifyError, match="search_or_cached takes a Kernel"): S.search_or_cached(k.ast)
  with pytest.raises(VerifyError, match="buffers must be None or a list of Buffers"): S.search(k, [1, 2])
  with pytest.raises(VerifyError, match="config must be a SearchConfig"): S.search(k, None, {"beam": 2})
  for bad in ({"time_budget_s": -1}, {"time_budget_s": float("nan")}, {"beam": 0}, {"repeats": 0},
              {"workers": -1}, {"validate": "yes"}, {"executor": 3}):
    with pytest.raises(VerifyError, match="SearchConfig"): S.SearchConfig(**bad)
  for call in (S.import_cache, S.export_cache):
    with pytest.raises(TuningCacheError, match="takes a file path"): call(None)
  fake = tmp_path / "v.json"
  fake.write_text(json.dumps({"format": S.EXPORT_FORMAT, "version": True, "entries": {}}))
  with pytest.raises(TuningCacheError, match="is not a kernopt tuning export"): S.import_cache(str(fake))

def test_a_converged_search_goes_on_within_its_budget(monkeypatch):
  """With budget left after `patience` rounds without progress, the search continues from the fastest candidates it
  has timed but not expanded (until none is left); a budget-free search stops there."""
  beams: list[int] = []
  restart = S._Search._restart
  def spy(self, *args):
    beam = restart(self, *args)
    beams.append(len(beam))
    return beam
  monkeypatch.setattr(S._Search, "_restart", spy)
  k = kernel_of("matmul_512")
  S.search(k, None, S.SearchConfig(workers=0, progress=False))
  assert beams == []
  res = S.search(k, None, S.SearchConfig(time_budget_s=60, workers=0, progress=False))
  # (how many restarts there are depends on the timings: which candidates fall within `cutoff` of the best)
  assert beams and beams[-1] == 0 and not res.stats.out_of_budget
  check_numpy(res.kernel, catalogue.get("matmul_512"))

def test_a_restart_takes_the_fastest_unexpanded_candidates_within_the_cutoff(monkeypatch):
  """The next beam of a converged budgeted search: the `width` fastest built candidates not expanded yet, each once,
  none over `cutoff` times the best; when none is left the search ends."""
  s = S._Search.__new__(S._Search)
  s.cfg, s.validator = S.SearchConfig(beam=2, cutoff=3.0, workers=0, progress=False), None
  monkeypatch.setattr(S._Search, "out_of_time", lambda self: False)
  k = kernel_of("add")
  c = {d: S._Cand(d, k, runner=object(), time_s=t) for d, t in [("a", 1.0), ("b", 1.5), ("c", 2.0), ("d", 2.5),
                                                                   ("slow", 4.0)]}
  c["unbuilt"] = S._Cand("unbuilt", k, runner=None, time_s=1.2)
  pool = [*c.values(), c["b"]]
  assert [x.digest for x in s._restart(pool, {"a"}, c["a"], 2)] == ["b", "c"]
  assert [x.digest for x in s._restart(pool, {"a", "b"}, c["a"], 3)] == ["c", "d"]
  assert s._restart(pool, {"a", "b", "c", "d"}, c["a"], 2) == []

class _Recorder(cf.Executor):
  """An executor that keeps each task it is given and answers it with no Program."""
  def __init__(self): self.tasks = []
  def submit(self, fn, /, *args, **kwargs):
    self.tasks.append(args[0])
    fut: cf.Future = cf.Future()
    fut.set_result((None, "recorded"))
    return fut

@pytest.mark.parametrize("caches,warms", [(True, False), (False, True), (True, True)])
def test_workers_prebuild_where_the_device_class_declares_a_binary_cache(monkeypatch, caches, warms):
  """A search's workers compile a candidate into the device's on-disk cache only where its class declares one
  (`caches_binaries`), and launch it once after only where the class says a first launch builds more
  (`warmup_launch`): declared data of the device class, never its name."""
  monkeypatch.setattr(type(DEV), "caches_binaries", caches)
  monkeypatch.setattr(type(DEV), "warmup_launch", warms)
  k, rec = kernel_of("add"), _Recorder()
  bufs, _ = make_buffers(catalogue.get("add"))
  s = S._Search(k, bufs, S.SearchConfig(workers=1, executor=rec, validate=False, progress=False), None, DEV)
  assert s._build_remote([S._Cand("a", k)], force=True)[0][1:] == (None, "recorded")
  (task,) = rec.tasks
  assert S.device_spec(DEV) is not None
  assert task.device == (S.device_spec(DEV) if caches else None) and task.warm is (caches and warms)

def test_stopping_a_busy_private_pool_ends_its_workers():
  """A build still running when a search ends (a PoCL build can't be interrupted from inside its worker) must not
  hold a core after `search` returns: the search's own pool is shut down with its busy workers terminated."""
  ex = cf.ProcessPoolExecutor(max_workers=1, mp_context=multiprocessing.get_context("forkserver"))
  ex.submit(int).result()   # the worker is up
  build = ex.submit(time.sleep, 120)
  while not build.running(): time.sleep(0.01)   # handed to the worker: shutdown can no longer cancel it
  workers = list(ex._processes.values())
  S.stop_pool(ex, terminate=True)
  for p in workers: p.join(timeout=30)
  assert workers and not any(p.is_alive() for p in workers)

def test_tune_all_on_a_dask_cluster(monkeypatch, tmp_path):
  from dask.distributed import Client, LocalCluster  # required: pip install "dask[distributed]" (the test extra)
  names = ["sum_axis2", "matvec"]
  asts = [catalogue.get(n).ast for n in names]
  cfg = S.SearchConfig(time_budget_s=8)
  with warnings.catch_warnings():
    warnings.simplefilter("ignore")  # dask's port and resource warnings
    cluster = LocalCluster(n_workers=2, threads_per_worker=1, processes=True, dashboard_address=None)
    client = Client(cluster)
  try:
    with config_override(CACHE_DIR=str(tmp_path)):
      results = S.tune_all(asts, device="CPU", executor=client.get_executor(), config=cfg,
                           device_options={"threads": 1})
      assert set(results) == {kernopt.ops.ast_digest(a) for a in asts}
      for name, ast in zip(names, asts):
        k = kernel_of(name)
        for o in results[kernopt.ops.ast_digest(ast)]: k.apply_opt(o)
        check_numpy(k, catalogue.get(name))
      # each worker really searched: beyond the hand-coded start it compiled and timed other candidates, and the
      # winner (hand-coded or not, whichever timed faster on that worker) was validated against the unoptimized kernel
      entries = [S.lookup(kernel_of(n), config=cfg) for n in names]
      assert all(e["compiled"] >= 2 and e["timed"] >= 2 and e["validated"] for e in entries), entries
      monkeypatch.setattr(S, "search", _no_search)  # merged into this process's cache
      for name, ast in zip(names, asts):
        hit = S.search_or_cached(kernel_of(name), config=cfg)
        assert list(hit.applied_opts) == results[kernopt.ops.ast_digest(ast)]
  finally:
    client.close()
    cluster.close()

def test_round_order_and_action_amounts():
  k = hand_coded(kernel_of("matmul_64"))
  acts = S.actions(k)
  assert {8, 16} <= {a.amt for a in acts if a.op is OptOps.UPCAST}
  assert {8, 16} <= {a.amt for a in acts if a.op is OptOps.UNROLL}
  cands = [S._Cand(d, k2) for d, k2 in S.expand(k, S.SearchConfig(), set(), S.SearchStats())]
  order = S._interleave([cands, cands[:1]])
  assert len(order) == len(cands) + 1 and sorted(map(id, order[:-1])) == sorted(map(id, cands))
  kinds = {c.kernel.applied_opts[-1].op for c in cands}
  assert {c.kernel.applied_opts[-1].op for c in order[:len(kinds)]} == kinds   # one of each kind first
  first, amts = {}, {}
  for c in order[:-1]:
    o = c.kernel.applied_opts[-1]
    first.setdefault(o.op, o.amt)
    amts.setdefault(o.op, set()).add(o.amt)
  for op, amt in first.items():   # the likeliest amount of each kind first: 4, then 2, 8, 16
    likely = [a for a in (4, 2, 8, 16) if a in amts[op]]
    assert amt == (likely[0] if likely else amt)
