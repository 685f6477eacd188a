"""The GPU plan's parts that need no GPU: bundles of emitted kernels, the sample's choice of
layers, and the tables computed from measurements (Table 4, A/B, speedups)."""

from __future__ import annotations

import hashlib
import json

import numpy as np
import pyarrow as pa
import pytest
import scipy.sparse as sp

from benchmarks import gpuplan
from lospmm.flows.storage.runs import write_run_record
from lospmm.flows.storage.store import write_artifact
from lospmm.stages.extract import zoo_shapes
from lospmm.stages.prune import random_pruned


def _artifacts(root, layers=("fc1", "fc2")):
    """A run record with a prune and an emit artifact and one kernel directory per layer."""
    prune_rows, emit_rows, matrices = [], [], {}
    for i, layer in enumerate(layers):
        a = random_pruned(24 + 8 * i, 16, 0.7, np.random.default_rng(i))
        matrices[layer] = a
        prune_rows.append({"layer": layer, "status": "ok", "m": a.shape[0], "k": a.shape[1], "indptr": a.indptr.tolist(),
                           "indices": a.indices.tolist(), "data": a.data.astype(np.float32).tolist()})
        d = root / "10_kernels" / "m-s0.9" / layer
        d.mkdir(parents=True)
        (d / "kernel.cubin").write_bytes(bytes([i]) * 64)
        (d / "kernel.json").write_text(json.dumps({"kernel": f"k{i}", "n1": 32, "grid": {"x": 3}}))
        (d / "SHA256SUMS").write_text("".join(f"{hashlib.sha256((d / f).read_bytes()).hexdigest()}  {f}\n"
                                              for f in ("kernel.cubin", "kernel.json")))
        emit_rows.append({"model": "m", "layer": layer, "op": "linear", "m": a.shape[0], "n": 64, "k": 16,
                          "sparsity": 0.9, "status": "ok", "m1": 2, "n1": 32, "kernel": f"k{i}", "timer": "estimate",
                          "full_time_us": 5.0, "registers": 30, "spill_bytes": 0,
                          "kernel_dir": f"10_kernels/m-s0.9/{layer}"})
    emit_rows.append(emit_rows[-1] | {"layer": "failed", "status": "error", "kernel_dir": ""})
    for name, rows in (("02/p.parquet", prune_rows), ("10/e.parquet", emit_rows)):
        write_artifact(root / name, pa.Table.from_pylist(rows), {"stage": name[:2]})  # checksummed, as the flow writes
    write_run_record(root, {"run_id": "20261122-000000-aaaaaa", "status": "completed", "entries": [
        {"stage": "prune", "model": "m", "sparsity": 0.9, "path": "02/p.parquet"},
        {"stage": "emit", "model": "m", "sparsity": 0.9, "path": "10/e.parquet"}]})
    return matrices


def test_an_emitted_bundle_travels_with_its_matrices_and_verifies_on_arrival(tmp_path):
    matrices = _artifacts(tmp_path / "art")
    folder = gpuplan.emitted_bundle(tmp_path / "art", "m", 0.9, tmp_path / "staging")
    archive = gpuplan.packed(folder, tmp_path / "bundle" / "emitted-m.tar.xz")
    (unpacked,) = gpuplan.unpacked(tmp_path / "bundle", tmp_path / "there")
    rows = gpuplan.emitted_rows(unpacked)
    assert archive.exists() and [r["layer"] for r in rows] == ["fc1", "fc2"]  # the failed layer is not bundled
    for r in rows:
        a = gpuplan.read_matrix(f"{r['path']}/a.parquet")
        assert (a != matrices[r["layer"]]).nnz == 0 and r["nnz"] == matrices[r["layer"]].nnz
        from lospmm.flows.storage.store import manifest_problem

        assert manifest_problem(tmp_path / "there" / unpacked.name / r["dir"], required=("kernel.cubin",)) is None
    assert gpuplan.emitted_bundle(tmp_path / "art", "m", 0.5, tmp_path / "staging") is None  # never emitted
    only_big = gpuplan.emitted_bundle(tmp_path / "art", "m", 0.9, tmp_path / "big", min_nnz=matrices["fc2"].nnz)
    assert [r["layer"] for r in gpuplan.emitted_rows(only_big)] == ["fc2"]


def test_a_damaged_kernel_directory_is_refused_by_name_when_bundling(tmp_path):
    _artifacts(tmp_path / "art")
    (tmp_path / "art" / "10_kernels" / "m-s0.9" / "fc2" / "kernel.cubin").write_bytes(b"edited")
    with pytest.raises(ValueError, match="fc2.*kernel.cubin"):
        gpuplan.emitted_bundle(tmp_path / "art", "m", 0.9, tmp_path / "staging")


def test_the_sample_spreads_over_each_models_sizes_within_the_nonzero_limit():
    params = gpuplan.SampleParams(per_model=3, max_nnz=20_000, models=("resnet50", "bert-base"))
    picked = gpuplan.sampled_shapes([s for m in params.models for s in zoo_shapes(m)], params)
    resnet = [s for s in picked if s.model == "resnet50"]
    assert len(resnet) == 3 and len({(s.m, s.k, s.n) for s in resnet}) == 3
    sizes = [s.m * s.k for s in resnet]
    assert sizes == sorted(sizes) and sizes[0] < sizes[-1]
    assert all(s.m * s.k * (1 - params.sparsity) <= params.max_nnz for s in picked)
    assert not [s for s in picked if s.model == "bert-base"]  # every BERT layer has more nonzeros


def _launch(role, m1, n1, measured, estimate, variant="", layer="l"):
    return {"model": "m", "layer": layer, "m": 64, "k": 64, "n": 512, "role": role, "variant": variant, "m1": m1,
            "n1": n1, "measured_us": measured, "estimate_us": estimate, "spill_bytes": 0}


def test_table4_takes_the_measured_proxies_choice_and_prices_it_by_full_kernels():
    rows = [_launch("proxy", 1, 32, 5.0, 1.0), _launch("proxy", 2, 64, 4.0, 2.0), _launch("proxy", 4, 32, 6.0, 3.0),
            _launch("full", 1, 32, 10.0, 1.0), _launch("full", 2, 64, 12.0, 2.0), _launch("full", 4, 32, 8.0, 3.0),
            _launch("full", 8, 32, 1.0, 9.0, variant="outside-top-k")]  # never a top-K candidate
    (row,) = gpuplan.table4_rows(rows)
    assert row["best_tile"] == "4×32" and row["best_us"] == 8.0 and row["candidates"] == 3
    assert row["proxy_tile"] == "2×64" and row["proxy_loss"] == pytest.approx(12 / 8 - 1)
    assert row["estimate_tile"] == "1×32" and row["estimate_loss"] == pytest.approx(10 / 8 - 1)


def test_ab_rows_compare_a_variant_with_the_flows_own_kernel_and_m1_one_with_the_rest():
    rows = [_launch("full", 2, 64, 10.0, 2.0), _launch("full", 2, 64, 12.0, 2.0, variant="ptxas-O3"),
            _launch("full", 1, 32, 30.0, 1.0), _launch("full", 4, 32, 20.0, 3.0, variant="outside-top-k")]
    ab = {r["a_b"]: r for r in gpuplan.ab_rows(rows)}
    assert ab["ptxas-O3 vs ptxas-O1 prefetch-1"]["a_over_b"] == pytest.approx(1.2)
    one = ab["best M1=1 vs best M1>1"]
    assert one["a_over_b"] == pytest.approx(30 / 10) and one["estimate_a_over_b"] == pytest.approx(1 / 2)


def test_speedups_are_geometric_means_per_model_and_sparsity_of_finite_times():
    base = {"cublas_tf32_us": 1.0, "cublas_fp16_us": 1.0, "cusparse_csr_us": 1.0, "torch_csr_us": 1.0}
    rows = [{"model": "a", "sparsity": 0.9, "ours_us": 1.0, "cublas_fp32_us": 4.0} | base,
            {"model": "a", "sparsity": 0.9, "ours_us": 4.0, "cublas_fp32_us": 4.0} | base,
            {"model": "b", "sparsity": 0.9, "ours_us": float("inf"), "cublas_fp32_us": 4.0} | base,
            {"model": "b", "sparsity": 0.7, "ours_us": 2.0, "cublas_fp32_us": 2.0} | base]
    summary = {(r["model"], r["sparsity"]): r for r in gpuplan.speedup_summary(rows)}
    assert summary[("a", 0.9)]["vs_cublas_fp32"] == pytest.approx(2.0) and summary[("a", 0.9)]["kernels"] == 2
    assert ("b", 0.9) not in summary  # a failed launch is no speedup
    assert summary[("all", 0.9)]["kernels"] == 2 and summary[("b", 0.7)]["vs_cublas_fp32"] == pytest.approx(1.0)


def test_a_geometric_mean_ignores_failed_and_empty_measurements():
    assert gpuplan.geomean([1.0, 4.0, float("inf"), float("nan"), 0.0]) == pytest.approx(2.0)
    assert np.isnan(gpuplan.geomean([float("inf")]))


def test_the_conv_bundle_compiles_each_case_as_conv_and_as_gemm_kernel(tmp_path, monkeypatch):
    monkeypatch.setattr(gpuplan, "CONV_CASES", (("tiny 3x3/2", 8, dict(cin=3, h=9, w=7, kh=3, kw=3, stride=2, pad=1),
                                                 True, True),))
    folder = gpuplan.conv_bundle(tmp_path, sparsity=0.7, m1=2, n1=32)
    (case,) = json.loads((folder / "cases.json").read_text())
    assert case["k"] == 27 and len(case["bias"]) == 8 and case["relu"]
    assert case["conv"]["status"] == case["gemm"]["status"] == "ok"
    assert case["conv"]["kernel"].startswith("lospmm_conv") and case["conv"]["kernel"] != case["gemm"]["kernel"]
    assert (folder / "0-conv.cubin").stat().st_size > 0 and (folder / "0-gemm.cubin").stat().st_size > 0
    assert gpuplan.read_matrix(folder / "0-a.parquet").nnz == case["nnz"]


def test_an_emitted_kernels_work_is_recovered_from_its_kernel_json_as_the_estimate_sees_it():
    from lospmm.stages.reorder import reordered_tiles
    from lospmm.stages.timing import full_kernel_work

    a = random_pruned(50, 40, 0.8, np.random.default_rng(2))
    a = a.tolil()
    a[7] = 0  # an empty row: a zeroing block
    a = sp.csr_matrix(a)
    a.eliminate_zeros()
    tiles = reordered_tiles(a, 4)
    facts = {"row_order": tiles.rows.tolist(), "tile_ptr": tiles.tile_ptr.tolist(), "empty_rows": tiles.empty_rows.tolist(),
             "m1": 4, "n1": 64, "compile": {"registers": 30, "thread_spill_bytes": 8}}
    row = {"m": 50, "k": 40, "n": 300} | gpuplan.emitted_work(facts, a)
    got, want = gpuplan.launch_work(row), full_kernel_work(tiles, 50, 40, 300, 64, 30, 8)
    assert got.zero_blocks == want.zero_blocks == 1
    assert got.tile_loads.tolist() == want.tile_loads.tolist() and got.tile_fmas.tolist() == want.tile_fmas.tolist()
    assert (got.registers, got.spill_bytes, got.m1, got.n1) == (30, 8, 4, 64)
    measured = gpuplan.speedup_launch_rows([row | {"ours_us": 12.0}, row | {"ours_us": float("inf")}])
    assert len(measured) == 1 and measured[0]["measured_us"] == 12.0 and measured[0]["role"] == "full"


def test_an_every_kept_sample_launches_one_cubin_per_kept_m1_at_each_of_its_kept_n1(tmp_path):
    """Issue 24's Table 4 over every kept candidate: the launch list holds, per kept M1, one full
    kernel that reads N1 at launch and a row per kept N1 sharing its cubin — as many rows as the
    layer has kept candidates, for as many compiles as kept M1."""
    import pyarrow.parquet as pq

    from lospmm.flows.storage.ranker_store import load_ranker
    from lospmm.stages.devices import device_named
    from lospmm.stages.prune import pruned_layer
    from lospmm.stages.search import layer_search

    params = gpuplan.SampleParams(per_model=1, max_nnz=1500, models=("shufflenetv2",), top_k=2, every_kept=True)
    (shape,) = gpuplan.sampled_shapes(list(zoo_shapes("shufflenetv2")), params)
    dest = gpuplan.sample_bundle(params, tmp_path, workers=1, say=lambda *_: None)
    rows = pq.read_table(dest / "launches.parquet").to_pylist()
    every = [r for r in rows if r["variant"] == "every-kept"]
    search = layer_search(pruned_layer(shape, params.sparsity).matrix, shape.n, params.sparsity, device_named("h100"),
                          load_ranker()[0])
    assert sorted((r["m1"], r["n1"]) for r in every) == sorted((c.m1, c.n1) for c in search.kept)
    cubins = {r.get("cubin") or r["id"] for r in every}
    assert len(cubins) == len({c.m1 for c in search.kept})  # one compile per kept M1
    for r in every:
        assert (dest / f"{r.get('cubin') or r['id']}.cubin").is_file() and r["compile_status"] == "ok"
        assert json.loads(r["launch"])["threads"] == 0 and np.isfinite(r["estimate_us"])
