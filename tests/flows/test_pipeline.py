"""Integration: the flow on a real (temporary) Prefect API."""

from __future__ import annotations

import numpy as np
import pyarrow.parquet as pq
import pytest
from safetensors.numpy import save_file

from lospmm.flows import pipeline as pl
from lospmm.flows.storage.runs import run_record
from lospmm.flows.storage.store import valid_sidecar

pytestmark = pytest.mark.usefixtures("prefect_server")


@pytest.fixture()
def weights_file(tmp_path):
    rng = np.random.default_rng(0)
    bad = rng.standard_normal((32, 16)).astype(np.float32)
    bad[3, 4] = np.nan
    path = tmp_path / "tiny model.safetensors"
    save_file({
        "enc.0.q.weight": rng.standard_normal((96, 64)).astype(np.float32),
        "enc.0.ffn.weight": rng.standard_normal((128, 96)).astype(np.float32),
        "enc.0.q.bias": rng.standard_normal(96).astype(np.float32),
        "enc.0.broken.weight": bad,
        "enc.0.dead.weight": np.zeros((16, 16), np.float32),
    }, str(path))
    return path


def _config(root, weights, **kw):
    return {"zoo": [], "weights": str(weights), "tokens": 256, "sparsities": [0.5, 0.9],
            "artifacts": str(root), "m1s": [2, 8, 32], "until": "constrain", **kw}


def _states(result, root):
    record = run_record(root, result["run_id"])
    return {(e["stage"], e.get("sparsity")): e["state"] for e in record["entries"]}, record


def test_run_cache_partial_rerun_and_recovery(tmp_path, weights_file):
    root = tmp_path / "artifacts"
    cfg = _config(root, weights_file)

    first = pl.pipeline(config=cfg)
    states, record = _states(first, root)
    assert first["status"] == "completed"
    assert set(states.values()) == {"Completed"}
    # every artifact opens with plain pyarrow
    for e in record["entries"]:
        assert pq.read_table(root / e["path"]).num_rows == e["rows"]

    # bad layers are reported by name; the good ones have candidates
    problems = {p["layer"]: p for e in record["entries"] for p in e["problems"]}
    assert problems["enc.0.broken.weight"]["status"] == "error" and "NaN" in problems["enc.0.broken.weight"]["message"]
    assert problems["enc.0.dead.weight"]["status"] == "empty"
    cand = pq.read_table(root / next(e["path"] for e in record["entries"] if e["stage"] == "constrain")).to_pylist()
    good = [c for c in cand if c["layer"] == "enc.0.ffn.weight"]
    assert good and any(c["kept"] for c in good)
    assert {c["removed_by"] for c in cand if c["layer"] == "enc.0.dead.weight"} == {"empty"}
    assert {c["removed_by"] for c in cand if c["layer"] == "enc.0.broken.weight"} == {"error"}

    # same inputs again: everything Cached
    states, _ = _states(pl.pipeline(config=cfg), root)
    assert set(states.values()) == {"Cached"}

    # a constrain parameter: only constrain recomputes (th_col; th_row bounds the reorder's orders too)
    states, _ = _states(pl.pipeline(config={**cfg, "th_col": 0.1}), root)
    assert {k: v for k, v in states.items() if v != "Cached"} == {("constrain", 0.5): "Completed",
                                                                 ("constrain", 0.9): "Completed"}

    # reorder's code changes: reorder and constrain recompute, extract and prune stay cached
    from lospmm.flows import dag

    real = dag.stage_version
    dag.stage_version = lambda s: real(s) + ("-edited" if s == "reorder" else "")
    try:
        states, _ = _states(pl.pipeline(config=cfg), root)
    finally:
        dag.stage_version = real
    assert {s for (s, _), v in states.items() if v == "Completed"} == {"reorder", "constrain"}
    assert {s for (s, _), v in states.items() if v == "Cached"} == {"extract", "prune"}

    # a deleted and a truncated artifact are detected and recomputed; the rest stays cached
    _, record = _states(pl.pipeline(config=cfg), root)
    paths = {(e["stage"], e.get("sparsity")): root / e["path"] for e in record["entries"]}
    paths[("prune", 0.5)].unlink()
    data = paths[("reorder", 0.9)].read_bytes()
    paths[("reorder", 0.9)].write_bytes(data[:100])
    states, _ = _states(pl.pipeline(config=cfg), root)
    assert {k for k, v in states.items() if v == "Completed"} == {("prune", 0.5), ("reorder", 0.9)}
    assert valid_sidecar(paths[("prune", 0.5)]) and valid_sidecar(paths[("reorder", 0.9)])

    # forced recompute of one stage and its dependants
    states, _ = _states(pl.pipeline(config=cfg, refresh=["reorder", "constrain"]), root)
    assert {s for (s, _), v in states.items() if v == "Completed"} == {"reorder", "constrain"}


def test_finished_artifacts_survive_a_lost_cache_record(tmp_path, weights_file):
    """As after a SIGKILL between writing an artifact and Prefect recording the result."""
    import shutil

    root = tmp_path / "artifacts"
    cfg = _config(root, weights_file, sparsities=[0.7])
    _, record = _states(pl.pipeline(config=cfg), root)
    mtimes = {e["path"]: (root / e["path"]).stat().st_mtime_ns for e in record["entries"]}
    shutil.rmtree(root / ".prefect-results")
    states, record = _states(pl.pipeline(config=cfg), root)
    assert all(e["reused"] for e in record["entries"])
    assert mtimes == {e["path"]: (root / e["path"]).stat().st_mtime_ns for e in record["entries"]}


def test_until_stops_after_the_named_stage(tmp_path, weights_file):
    root = tmp_path / "artifacts"
    result = pl.pipeline(config=_config(root, weights_file, sparsities=[0.5], until="prune"))
    states, _ = _states(result, root)
    assert set(states) == {("extract", None), ("prune", 0.5)}


def test_zoo_model_runs_through_constrain(tmp_path):
    root = tmp_path / "artifacts"
    cfg = {"zoo": ["bert-base"], "sparsities": [0.9], "batch": 2, "seq_len": 64, "m1s": [4, 16],
           "artifacts": str(root), "until": "constrain"}
    result = pl.pipeline(config=cfg)
    states, record = _states(result, root)
    assert result["status"] == "completed" and set(states.values()) == {"Completed"}
    cand = pq.read_table(root / next(e["path"] for e in record["entries"] if e["stage"] == "constrain"))
    assert set(cand.column("layer").to_pylist()) == {
        "encoder.layer.0.attention.self.query", "encoder.layer.0.intermediate.dense",
        "encoder.layer.0.output.dense", "pooler.dense"}
    assert cand.num_rows == 4 * 2 * 32


def test_whole_search_to_emitted_kernels(tmp_path, weights_file):
    import json

    root = tmp_path / "artifacts"
    cfg = _config(root, weights_file, sparsities=[0.8], m1s=[2, 8], until="emit", verify=True, top_k=4)
    result = pl.pipeline(config=cfg)
    states, record = _states(result, root)
    assert result["status"] == "completed" and set(states.values()) == {"Completed"}
    paths = {e["stage"]: root / e["path"] for e in record["entries"]}
    kept = {(c["layer"], c["m1"], c["n1"]) for c in pq.read_table(paths["constrain"]).to_pylist() if c["kept"]}
    ranked = pq.read_table(paths["rank"]).to_pylist()
    assert {(r["layer"], r["m1"], r["n1"]) for r in ranked} == kept
    chosen = {(r["layer"], r["m1"], r["n1"]) for r in ranked if r["chosen"]}
    for layer in {lay for lay, _, _ in kept}:
        n_kept = sum(1 for k in kept if k[0] == layer)
        assert sum(1 for c in chosen if c[0] == layer) == min(4, n_kept)
    launch = pq.read_table(paths["pad"]).to_pylist()
    assert {(r["layer"], r["m1"], r["n1"]) for r in launch} == chosen
    assert all(r["smem_bytes"] >= 0 and r["num_atb"] >= 1 for r in launch)
    clusters = pq.read_table(paths["cluster"]).to_pylist()
    assert {(r["layer"], r["m1"]) for r in clusters} == {(l, m1) for l, m1, _ in chosen}
    compiled = pq.read_table(paths["compile"]).to_pylist()
    assert len(compiled) == len(clusters)
    for r in compiled:
        assert r["status"] == "ok" and r["verified"] == "asan-ok" and r["registers"] > 0
        assert (root / r["cubin_path"]).read_bytes()[:4] == b"\x7fELF"
    timed = pq.read_table(paths["time"]).to_pylist()
    assert {(r["layer"], r["m1"], r["n1"]) for r in timed} == chosen
    assert all(r["timer"].startswith("estimate") and r["status"] == "ok" and r["time_us"] > 0 for r in timed)
    emitted = pq.read_table(paths["emit"]).to_pylist()
    assert {r["layer"] for r in emitted} == {lay for lay, _, _ in chosen}
    for r in emitted:
        mine = [t for t in timed if t["layer"] == r["layer"]]
        fastest = min(t["time_us"] for t in mine)
        tied = [(t["m1"], t["n1"]) for t in mine if t["time_us"] == fastest]  # an estimate's exact ties
        assert (r["m1"], r["n1"]) == min(tied, key=lambda t: (-t[0], t[1])) and r["proxy_time_us"] == fastest
        assert r["status"] == "ok" and r["check"] == "host-asan" and r["max_rel_error"] < 1e-5
        d = root / r["kernel_dir"]
        facts = json.loads((d / "kernel.json").read_text())
        assert facts["timer"].startswith("estimate") and facts["m1"] == r["m1"] and facts["chosen_by"]
        assert (d / "kernel.cubin").read_bytes()[:4] == b"\x7fELF" and (d / "kernel.cu").exists()
    # the flow decides as one layer's search does (train-ranker and the benchmarks call that)
    from lospmm.flows.storage.ranker_store import load_ranker
    from lospmm.flows.catalog.pruned import csr_from_row
    from lospmm.devices import device_named
    from lospmm.stages.rank import RankParams
    from lospmm.search import SearchParams, layer_search

    pruned = pq.read_table(paths["prune"])
    booster, _ = load_ranker()
    for i, row in enumerate(pruned.select(["layer", "n", "status"]).to_pylist()):
        if row["status"] == "ok":
            s = layer_search(csr_from_row(pruned, i), row["n"], 0.8, device_named("h100"), booster,
                             SearchParams(m1s=(2, 8), rank=RankParams(top_k=4)))
            assert {(c.m1, c.n1) for c in s.chosen} == {(m1, n1) for lay, m1, n1 in chosen if lay == row["layer"]}
            assert {m1: cl.num_clusters for (m1, _), cl in s.clusters.items()} == \
                {r["m1"]: r["num_clusters"] for r in clusters if r["layer"] == row["layer"]}
    summary = pq.read_table(root / record["summary"]).to_pylist()
    good = [s for s in summary if s["status"] == "ok"]
    assert {s["layer"] for s in good} == {r["layer"] for r in emitted}
    assert all(s["after_constrain"] >= s["after_rank"] == s["timed"] and s["search_seconds"] > 0 for s in good)
    from prefect.artifacts import Artifact

    assert Artifact.get("lospmm-progress").data == 100.0  # the run's progress artifact ends full
    table = json.loads(Artifact.get("lospmm-layer-summary").data)  # a table artifact stores JSON text
    assert {r["layer"] for r in table} >= {s["layer"] for s in good}

    # nothing compiles again: the flow is cached, and a forced recompute hits the compile cache
    states, _ = _states(pl.pipeline(config=cfg), root)
    assert set(states.values()) == {"Cached"}
    _, record = _states(pl.pipeline(config=cfg, refresh=["compile"]), root)
    again = pq.read_table(root / next(e["path"] for e in record["entries"] if e["stage"] == "compile")).to_pylist()
    assert all(r["from_cache"] for r in again)

    # --no-rank times every kept candidate
    _, record = _states(pl.pipeline(config={**cfg, "rank": False, "until": "time"}), root)
    timed = pq.read_table(root / next(e["path"] for e in record["entries"] if e["stage"] == "time")).to_pylist()
    assert {(r["layer"], r["m1"], r["n1"]) for r in timed} == kept


def _emitted(tmp_path, weights_file, **options):
    """A run to emit at 0.8 over M1 in {2, 8} with proxies host-checked (--verify): the artifact root and
    each stage's artifact, after checking every task completed."""
    root = tmp_path / "artifacts"
    result = pl.pipeline(config=_config(root, weights_file, sparsities=[0.8], m1s=[2, 8], until="emit", verify=True,
                                        **options))
    states, record = _states(result, root)
    assert result["status"] == "completed" and set(states.values()) == {"Completed"}
    return root, {e["stage"]: root / e["path"] for e in record["entries"]}


def _served_by(root, paths, proxy_prefix: str, design_label: str) -> list[dict]:
    """The emitted rows of a run in one design, after checking that its proxies were that design's (each
    host-checked under ASan, none spilling) and that each GEMM layer is served, host-checked, by a kernel
    whose kernel.json names the design."""
    import json

    compiled = pq.read_table(paths["compile"]).to_pylist()
    assert compiled and all(r["kernel"].startswith(proxy_prefix) and r["verified"] == "asan-ok"
                            and r["spill_stores"] == 0 for r in compiled)
    emitted = pq.read_table(paths["emit"]).to_pylist()
    assert {r["layer"] for r in emitted} == {"enc.0.q.weight", "enc.0.ffn.weight"}
    for r in emitted:
        assert r["status"] == "ok" and r["check"] == "host-asan" and r["max_rel_error"] < 1e-5
        assert json.loads((root / r["kernel_dir"] / "kernel.json").read_text())["design"]["label"] == design_label
    assert _written_again_as_served(root) == {design_label}
    return emitted


def _written_again_as_served(root) -> set[str]:
    """Each emitted layer's kernel as `lospmm kernel` writes it with no tile or design (flows.kernels.served_kernel):
    the kernel the run served, the same name (the hash of its text), in the design the run chose for it (the
    command's old default was `chained`, whatever the run served); the designs' labels."""
    from lospmm.flows.kernels import served_kernel, write_full_kernel

    record = run_record(root, sorted(p.stem for p in (root / "runs").glob("*.json"))[-1])
    labels = set()
    for layer in ("enc.0.q.weight", "enc.0.ffn.weight"):
        served = served_kernel(str(root), record, layer.split(".")[2])  # text in one layer's name finds it
        assert served.layer == layer
        again = write_full_kernel(str(root), record, layer, served.m1, served.n1, str(root.parent / f"again-{layer}"),
                                  verify=False, design=served.design)
        assert again["kernel"] == served.kernel and again["design"]["label"] == served.design.label
        labels.add(served.design.label)
    return labels


def test_a_streamed_run_is_searched_by_streamed_proxies(tmp_path, weights_file):
    # the streamed design has its own proxy (the same loop over the clusters' columns), so a run searches
    # in it and serves each layer by the streamed kernel of its tile
    root, paths = _emitted(tmp_path, weights_file, top_k=2, design="streamed,chained")
    emitted = _served_by(root, paths, "lospmm_stream_proxy_", "streamed,chained,tile-x,walks=1,v=1")
    assert all("×" in r["design"] for r in emitted)


def test_a_staged_run_is_searched_by_staged_proxies(tmp_path, weights_file):
    # the staged design's proxy copies what the full kernel's blocks copy (06_clusters' staged_counts, from
    # the real tiles) and runs each cluster's walk from shared memory: a run searches in it at its N1 (64:
    # two warps a tile), its blocks of 4 tiles launched as 256 threads, and serves each layer by the staged
    # kernel it chose
    from lospmm.flows.catalog.clusters import clusters_from_row
    from lospmm.flows.catalog.pruned import csr_from_row
    from lospmm.flows.catalog.reordered import tiles_from_row
    from lospmm.kernel.staging import staged_counts

    root, paths = _emitted(tmp_path, weights_file, top_k=2, design="staged,tiles=4,warps=2")
    candidates = [r for r in pq.read_table(paths["constrain"]).to_pylist() if r["status"] == "ok"]
    assert candidates and {(r["n1"], r["threads"]) for r in candidates} == {(64, 256)}
    tiles_of = {(c["layer"], c["m1"]): c["num_a_tiles"] for c in candidates}
    launches = [r for r in pq.read_table(paths["pad"]).to_pylist() if r["status"] == "ok"]
    assert launches and all(r["block"] == 256 and r["grid_x"] == -(-tiles_of[(r["layer"], r["m1"])] // 4)
                            for r in launches)
    table, pruned, reordered = (pq.read_table(paths[s]) for s in ("cluster", "prune", "reorder"))
    matrices = {pruned.column("layer")[i].as_py(): csr_from_row(pruned, i) for i in range(pruned.num_rows)
                if pruned.column("status")[i].as_py() == "ok"}
    tiles = {(reordered.column("layer")[i].as_py(), reordered.column("m1")[i].as_py()): tiles_from_row(reordered, i)
             for i in range(reordered.num_rows) if reordered.column("status")[i].as_py() == "ok"}
    assert table.num_rows
    for i, row in enumerate(table.to_pylist()):
        expected = staged_counts(matrices[row["layer"]], tiles[(row["layer"], row["m1"])], 4, 128)  # 128 rows
        read = clusters_from_row(table, i)
        assert np.array_equal(read.staged_counts, expected) and expected.sum() > 0
        assert read.shared_bytes == int(expected.max()) * 4 * 64  # its union over the design's N1 floats
    emitted = _served_by(root, paths, "lospmm_staged_proxy_", "baked,staged,tile-x,walks=1,v=1,tiles=4,warps=2")
    assert all(r["n1"] == 64 for r in emitted)


def test_design_auto_searches_the_designs_through_every_stage(tmp_path, weights_file):
    # `--design auto`: each layer's candidates span every candidate design, the design-aware ranker's
    # top-K may hold several, each (M1, design) gets its own proxy, compiled and host-checked under ASan,
    # and the layer is served by a tile in the design the search chose
    import json

    from lospmm.kernel.choices import DESIGN_CANDIDATES
    from lospmm.kernel.design import design_named

    root, paths = _emitted(tmp_path, weights_file, top_k=6, design="auto")
    labels = {design_named(d).label for d in DESIGN_CANDIDATES}
    candidates = pq.read_table(paths["constrain"]).to_pylist()
    q = [r for r in candidates if r["layer"] == "enc.0.q.weight"]
    assert {r["design"] for r in q} == labels and len(q) == len(labels) * 2 * 32
    chosen = [r for r in pq.read_table(paths["rank"]).to_pylist() if r["chosen"]]
    assert len({(r["layer"], r["design"]) for r in chosen}) > 2  # the ranker's top-K spans designs
    compiled = pq.read_table(paths["compile"]).to_pylist()
    assert {(r["layer"], r["m1"], r["design"]) for r in compiled} == {(r["layer"], r["m1"], r["design"])
                                                                     for r in chosen}
    assert all(r["status"] == "ok" and r["verified"] == "asan-ok" and r["spill_stores"] == 0 for r in compiled)
    for r in compiled:  # each proxy is rendered in its row's design (its source's header names a non-baseline one)
        source = (root / r["source_path"]).read_text()
        design = design_named(r["design"])
        assert (f"design={design.code_label}" in source) == (design != design_named("baseline")), r["design"]
    timed = pq.read_table(paths["time"]).to_pylist()
    assert {(r["layer"], r["m1"], r["n1"], r["design"]) for r in timed} == {
        (r["layer"], r["m1"], r["n1"], r["design"]) for r in chosen}
    for r in pq.read_table(paths["emit"]).to_pylist():
        if r["layer"] not in ("enc.0.q.weight", "enc.0.ffn.weight"):
            continue
        assert r["status"] == "ok" and r["check"] == "host-asan" and r["max_rel_error"] < 1e-5
        facts = json.loads((root / r["kernel_dir"] / "kernel.json").read_text())
        assert facts["design"]["label"] in labels
    _written_again_as_served(root)


def test_full_kernel_directory_for_a_layer_of_a_run(tmp_path, weights_file):
    import json

    from lospmm.flows.kernels import write_full_kernel

    root = tmp_path / "artifacts"
    result = pl.pipeline(config=_config(root, weights_file, sparsities=[0.7], until="reorder"))
    record = run_record(root, result["run_id"])
    out = tmp_path / "kernel"
    facts = write_full_kernel(str(root), record, "enc.0.ffn.weight", 8, 64, str(out), compile_=True, verify=True)
    assert (out / "kernel.cu").read_text().count("lospmm_ld(Bn,") > 0
    assert facts["host_check"]["max_rel_error"] < 1e-4
    assert json.loads((out / "kernel.json").read_text())["m1"] == 8
    assert facts["compile"]["status"] == "ok" and (out / "kernel.cubin").read_bytes()[:4] == b"\x7fELF"
    with pytest.raises(LookupError, match="M1 values in the run"):
        write_full_kernel(str(root), record, "0.ffn", 5, 64, str(out))  # text in one layer's name names it
    with pytest.raises(LookupError, match="not in the run"):
        write_full_kernel(str(root), record, "nope", 8, 64, str(out))
    # a layer the run refused (a NaN in its weights): its reason, not a failure to read an A it never had
    with pytest.raises(ValueError, match=r"^enc\.0\.broken\.weight: .*NaN.*refused this layer at prune"):
        write_full_kernel(str(root), record, "enc.0.broken.weight", 8, 64, str(out))


def test_an_implicit_im2col_kernel_for_a_convolution_of_a_run(tmp_path):
    import json

    from lospmm.flows.kernels import write_full_kernel

    root = tmp_path / "artifacts"
    config = {"zoo": ["shufflenetv2"], "sparsities": [0.8], "artifacts": str(root), "m1s": [4], "until": "reorder",
              "cnn_batch": 1, "image_size": 32}
    record = run_record(root, pl.pipeline(config=config)["run_id"])
    out = tmp_path / "conv"
    # conv1.0: 3 -> 24 channels, 3×3, stride 2, padding 1: the first layer reads the image itself
    facts = write_full_kernel(str(root), record, "conv1.0", 4, 64, str(out), implicit_conv=True, relu=True)
    written = json.loads((out / "kernel.json").read_text())
    assert written["conv"]["stride"] == 2 and written["conv"]["cin"] == 3 and written["epilogue"]["relu"] is True
    assert facts["host_check"]["reference"] == "numpy conv2d in float64" and facts["host_check"]["max_rel_error"] < 1e-4
    assert facts["compile"]["status"] == "ok" and "LOSPMM_LDX" in (out / "kernel.cu").read_text()
    # in the default design (chained) a convolution's kernel is its conv form: the grid's order and walks
    from lospmm.kernel.design import design_named

    walked = write_full_kernel(str(root), record, "conv1.0", 4, 64, str(tmp_path / "walked"), implicit_conv=True,
                               design=design_named("chained,walks=4"))
    assert walked["design"]["label"] == "baked,based,tile-x,walks=4,v=1" and walked["conv"]["stride"] == 2
    assert walked["host_check"]["max_rel_error"] < 1e-4
    with pytest.raises(ValueError, match="fc is a linear layer, not a convolution"):
        write_full_kernel(str(root), record, "fc", 4, 64, str(out), implicit_conv=True)


def test_the_flows_wait_for_its_tasks_arms_no_alarm_signal(monkeypatch):
    # prefect.futures.wait(…, timeout=) times out with SIGALRM in the main thread: its handler raised
    # wherever the flow was, 4 times a second ("RuntimeError: release unlocked lock" ended a resumed run
    # in CI; once the handler waited on a lock the interrupted code held, and the run hung)
    import concurrent.futures
    import signal
    import threading

    from prefect.futures import PrefectConcurrentFuture

    from lospmm.flows import pipeline

    armed = []
    real_setitimer = signal.setitimer
    monkeypatch.setattr(signal, "setitimer", lambda which, *a: armed.append(which) or real_setitimer(which, *a))

    class Logger:
        def info(self, *a, **k):
            pass

        warning = info

    class Publisher:
        def __init__(self, *a):
            pass

        def push(self, final=False):
            pass

    monkeypatch.setattr(pipeline, "get_run_logger", lambda: Logger())
    monkeypatch.setattr(pipeline.progress, "Publisher", Publisher)
    wrapped = [concurrent.futures.Future() for _ in range(3)]
    futures = [PrefectConcurrentFuture(task_run_id=__import__("uuid").uuid4(), wrapped_future=w) for w in wrapped]
    for i, w in enumerate(wrapped):  # each done a little later, from another thread, as a task runner's are
        threading.Timer(0.3 * (i + 1), w.set_result, args=(None,)).start()
    submitted = [({"stage": "prune", "label": f"m{i}"}, f) for i, f in enumerate(futures)]
    monkeypatch.setattr(PrefectConcurrentFuture, "state",
                        property(lambda self: __import__("prefect.states", fromlist=["Completed"]).Completed()))
    assert pipeline._awaited("run", submitted)
    assert signal.ITIMER_REAL not in armed


def test_lospmm_kernel_writes_an_nm_layers_served_kernel_in_its_blocking_and_names_a_refused_layers_reason(
        tmp_path, weights_file, monkeypatch):
    """An N:M run (nm:2:4 in vectors of 32): `lospmm kernel` without a
    tile writes each layer's served kernel again, an N:M one in the blocking emit served (a GPU's emit serves
    the fastest blocking it timed, not the estimate's cheapest: nothing is priced again); a layer the run
    refused at prune is named with its reason, not as missing."""
    import lospmm.flows.kernels as kernels
    from lospmm.flows.kernels import served_kernel, write_full_kernel

    root = tmp_path / "artifacts"
    result = pl.pipeline(config=_config(root, weights_file, sparsities=[0.5], m1s=[2, 8], until="emit",
                                        prune="nm:2:4:32"))
    record = run_record(root, result["run_id"])
    emitted = {r["layer"]: r for r in pq.read_table(root / next(
        e["path"] for e in record["entries"] if e["stage"] == "emit")).to_pylist()}
    served_nm = [layer for layer, r in emitted.items() if r["status"] == "ok" and r["design"].startswith("nm ")]
    assert served_nm, {layer: r["design"] for layer, r in emitted.items()}

    def priced_again(*args, **kwargs):
        raise AssertionError("the served kernel's blocking was priced again")

    monkeypatch.setattr(kernels, "untiled_served", priced_again)
    for layer in served_nm:
        served = served_kernel(str(root), record, layer)
        assert served.nm_tiling is not None and served.label == emitted[layer]["design"]
        again = write_full_kernel(str(root), record, layer, served.m1, served.n1, str(tmp_path / layer), verify=False,
                                  design=served.design, nm_tiling=served.nm_tiling)
        assert again["kernel"] == served.kernel
    with pytest.raises(ValueError, match=r"^enc\.0\.broken\.weight: .*NaN.*refused this layer at prune"):
        served_kernel(str(root), record, "broken")
    with pytest.raises(LookupError, match=r"^enc\.0\.q\.bias: the run searched no kernel for it \(.*bias \(1-D\)\)"):
        served_kernel(str(root), record, "enc.0.q.bias")  # a tensor extract passed over
