"""benchmarks/kernel_speed.py without a GPU: the A/B and diagnosis plans, a bundle built and its
kernels right on the host, and the report's figures computed from rows as the issue defines them."""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np
import pyarrow.parquet as pq
import pytest

from benchmarks import kernel_speed as ks

ROOT = Path(__file__).resolve().parents[1]


def test_the_ab_plan_puts_every_design_on_todays_tile():
    plan = ks.ab_plan()
    assert len(plan) == len(ks.AB_LAYERS) * len(ks.AB_DESIGNS) and len({p.id for p in plan}) == len(plan)
    query = [p for p in plan if p.layer == "encoder.layer.0.attention.self.query"]
    assert {(p.m1, p.n1) for p in query} == {(12, 512)}  # the tile measured in the committed call l
    assert {p.design for p in query} == {ks.design_named(d).label for d in ks.AB_DESIGNS}
    assert all(p.matrix == query[0].matrix for p in query)  # one pruned A, shared by the designs


def test_a_bundle_holds_launchable_kernels_that_are_right(tmp_path):
    """Two diagnosis kernels built into a bundle: each row's cubin, its launch layout and the A it
    bakes in; the same source run on the host equals A·B."""
    from lospmm.hostemu import checked_against_scipy
    from lospmm.sparse_file import read_matrix

    plan = [p for p in ks.micro_plan(n=4096) if p.layer == "footprint-256"]
    table = ks.build(plan, tmp_path / "bundle", jobs=1, cache=tmp_path / "cache", sass=False, say=lambda *_: None)
    rows = pq.read_table(table).to_pylist()
    assert [r["status"] for r in rows] == ["ok", "ok"]
    for r, p in zip(rows, plan):
        assert (tmp_path / "bundle" / f"{r['id']}.cubin").read_bytes()[:4] == b"\x7fELF"
        layout = ks.LaunchLayout(**json.loads(r["launch"]))
        assert layout.column_walks == ks.design_named(p.design).column_walks
        a = read_matrix(tmp_path / "bundle" / "a" / f"{r['matrix']}.parquet")
        assert a.nnz == r["nnz"] == 256
        source = ks.source_of(p, a)
        assert source.name == r["kernel"]  # the cubin beside it is this source's (its symbol, its hash)
        assert source.name.encode() in (tmp_path / "bundle" / f"{r['id']}.cubin").read_bytes()
        assert checked_against_scipy(source, a, 300) <= 1e-5


def _row(ours, sgemm, sparsity=0.9, design="d", layer="l", nnz=100, **extra):
    return {"set": "headline", "model": "m", "layer": layer, "m": 10, "k": 100, "n": 64, "nnz": nnz,
            "sparsity": sparsity, "design": design, "status": "ok", "ours_us": ours, "sgemm_us": sgemm,
            "tf32_us": sgemm / 2, "fp16_us": sgemm / 4, **extra}


def test_efficiency_and_the_headline_figures_follow_the_issue():
    # useful FLOP/s over SGEMM's dense FLOP/s: nnz/(m·k) · sgemm/ours
    assert ks.efficiency(_row(ours=10.0, sgemm=20.0)) == pytest.approx(0.1 * 2.0)
    rows = [_row(10.0, 20.0, layer="a"), _row(40.0, 20.0, layer="b"), _row(30.0, 20.0, layer="b", design="e"),
            _row(5.0, 10.0, layer="c")]  # c is launch-bound (SGEMM under 15 µs): only in "all"
    work_bound, every = ks.headline_summary(rows)
    assert work_bound["layers"] == 2 and every["layers"] == 3  # layer b's fastest design only
    assert work_bound["vs SGEMM (geomean)"] == pytest.approx(math.sqrt(2.0 * 20 / 30))
    assert work_bound["slower than SGEMM"] == 1
    assert work_bound["vs TF32"] == pytest.approx(work_bound["vs SGEMM (geomean)"] / 2)


def test_the_ab_summary_is_each_design_over_todays_kernel():
    base = ks.design_named("baseline").label
    rows = [{"set": "ab", "model": "m", "layer": "l", "design": base, "ours_us": 20.0},
            {"set": "ab", "model": "m", "layer": "l", "design": "x", "ours_us": 5.0}]
    (row,) = ks.ab_summary(rows)
    assert row["baseline_us"] == 20.0 and row["x"] == 0.25


def test_the_headline_plan_chooses_tiles_with_the_search(monkeypatch):
    """One small layer: the tile is one of the search's kept candidates, in the design asked for."""
    from lospmm.stages.extract import LayerShape

    shape = LayerShape("bert-base", "pooler.dense", "linear", 768, 32, 768)
    monkeypatch.setattr(ks, "gemm_shapes", lambda model, batch=4: [shape])
    (p,) = ks.headline_plan("chained,v=2", sparsities=(0.95,), models=("bert-base",))
    assert p.design == ks.design_named("chained,v=2").label and p.m1 >= 1 and p.n1 % 32 == 0
    assert "search" in p.chosen_by and np.isclose(p.sparsity, 0.95)


def test_the_half_set_puts_each_variant_and_the_fp32_pair_kernel_on_the_half_searchs_tile(tmp_path):
    """Issue 23's device set, built here: the fp16 search's tile, each half variant on it and the
    fp32 kernel of the same columns per thread; each half kernel right on the host within its
    rounding bound, on the rounded A the bundle carries for the device check."""
    from lospmm.hostemu import checked_half_kernel
    from lospmm.sparse_file import read_matrix
    from lospmm.stages.codegen_half import error_bound, precision_of

    plan = ks.half_plan(sparsities=(0.9,), batches=(4,), models=("mobilenetv2",),
                        layers=(("mobilenetv2", "features.1.conv.1"),), variants=("fp16,chained", "bf16,acc=f32,chained"))
    assert [ks.design_named(p.design).dtype for p in plan] == ["fp16", "bf16", "fp32"]
    assert len({(p.m1, p.n1) for p in plan}) == 1 and plan[-1].design == ks.design_named(ks.FP32_SAME_TILE).label
    table = ks.build(plan, tmp_path / "bundle", jobs=1, cache=tmp_path / "cache", sass=False, say=lambda *_: None)
    rows = pq.read_table(table).to_pylist()
    assert [r["status"] for r in rows] == ["ok"] * 3 and [r["spill_bytes"] for r in rows] == [0] * 3
    for r, p in zip(rows[:2], plan):
        precision = precision_of(ks.design_named(p.design))
        a = read_matrix(tmp_path / "bundle" / "a" / f"{r['matrix']}.parquet")
        assert json.loads(r["launch"])["columns_per_thread"] == 2
        source = ks.source_of(p, a)
        assert source.name == r["kernel"]
        gamma, eta = error_bound(a, precision)
        checked_half_kernel(source, a, 10, precision.dtype, bound=gamma, absolute=eta)  # raises if wrong


def test_the_half_table_joins_our_fp32_kernel_on_the_same_tile_and_the_summary_follows_the_issue():
    common = {"set": "half", "model": "m", "layer": "l", "m": 8, "k": 8, "n": 64, "nnz": 6, "sparsity": 0.9,
              "batch": 4, "m1": 2, "n1": 32, "status": "ok", "spread": 0.01}
    rows = [common | {"design": ks.design_named("fp16,chained").label, "dtype": "fp16", "accumulate": "fp16-packed",
                      "ours_us": 5.0, "fp16_us": 20.0, "max_rel_error": 1e-3, "cublas_max_rel_error": 1e-3},
            common | {"design": ks.design_named("fp16,acc=f32,chained").label, "dtype": "fp16",
                      "accumulate": "fp16-f32", "ours_us": 8.0, "fp16_us": 20.0, "max_rel_error": 3e-3,
                      "cublas_max_rel_error": 1e-3},
            common | {"design": ks.design_named(ks.FP32_SAME_TILE).label, "ours_us": 10.0, "sgemm_us": 30.0}]
    half = ks.half_rows(rows)
    assert [(r["dtype"], r["cublas_same_dtype_us"], r["ours_fp32_us"]) for r in half] == [("fp16", 20.0, 10.0)] * 2
    summary = {r["kernels"]: r for r in ks.half_summary(half)}
    assert summary["fp16-packed"]["vs cuBLAS same dtype (geomean, work-bound)"] == pytest.approx(4.0)
    assert summary["fp16-packed"]["vs ours fp32, same tile"] == pytest.approx(2.0)
    assert summary["fp16-packed"]["within 2x cuBLAS error"] == 1 and summary["fp16-f32"]["within 2x cuBLAS error"] == 0
    # the default: the fastest sums that meet the bar on every kernel (f32 is slower and misses it here)
    assert ks.chosen_accumulation(half) == "fp16-packed"
    half[0]["max_rel_error"] = 5e-3  # packed misses the bar on its one kernel: f32 misses it too
    assert ks.chosen_accumulation(half) is None
    half[1]["max_rel_error"] = 1e-3
    assert ks.chosen_accumulation(half) == "fp16-f32"
    # a variant with a kernel that failed its check is in the table, and meets no bar
    failed = common | {"layer": "l2", "design": ks.design_named("fp16,acc=f32,chained").label, "dtype": "fp16",
                       "accumulate": "fp16-f32", "status": "failed check", "ours_us": float("inf")}
    faster_f32 = rows[1] | {"max_rel_error": 1e-3, "ours_us": 3.0}  # f32 the faster, within the bar on l
    assert ks.chosen_accumulation(ks.half_rows([rows[0], faster_f32, rows[2]])) == "fp16-f32"
    half = ks.half_rows([rows[0], faster_f32, failed, rows[2]])
    assert [r["status"] for r in half] == ["ok", "ok", "failed check"]
    assert ks.chosen_accumulation(half) == "fp16-packed"
