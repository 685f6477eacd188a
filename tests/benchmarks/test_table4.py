"""benchmarks/table4.py on the committed H100 launch files: Table 4 with its noise band."""

from pathlib import Path

import math

RESULTS = Path(__file__).resolve().parents[2] / "benchmarks" / "results" / "gpu-h100"


def test_table4_has_each_strategy_per_layer_with_the_repeats_spread(tmp_path):
    from benchmarks.table4 import STRATEGIES, main

    out = tmp_path / "t4.parquet"
    rows = main([str(RESULTS / "b" / "launches-sample-0.9.parquet"), str(RESULTS / "c" / "launches-sample-0.9.parquet"),
                 "--out", str(out)])
    assert out.is_file() and len(rows) == 11 * len(STRATEGIES)
    for r in rows:
        assert {"model", "layer", "sparsity", "strategy", "chosen_tile", "best_tile", "loss", "spread"} <= set(r)
        assert r["repeats"] == 2 and math.isfinite(r["spread"]) and r["spread"] >= 0  # two calls measured each
        assert math.isnan(r["loss"]) or r["loss"] >= 0  # the best is the best of every measured full kernel
        if r["chosen_tile"] == r["best_tile"]:
            assert r["loss"] == 0 and r["beyond_noise"] is False
        elif r["beyond_noise"] is not None:
            assert r["beyond_noise"] == (r["loss"] > r["spread"])
    single = main([str(RESULTS / "d" / "launches-sample-0.7.parquet"), "--out", str(tmp_path / "d.parquet")])
    assert all(math.isnan(r["spread"]) and r["beyond_noise"] is None for r in single)  # one call: no noise band
    # files at two sparsities share launch ids: their kernels are not repeats of each other
    both = main([str(RESULTS / "b" / "launches-sample-0.9.parquet"), str(RESULTS / "d" / "launches-sample-0.7.parquet"),
                 "--out", str(tmp_path / "bd.parquet")])
    assert len(both) == (11 + 9) * len(STRATEGIES) and all(r["repeats"] == 1 for r in both)


def test_every_kept_candidate_measured_from_one_cubin_per_m1_sets_the_best_and_the_rankers_field(tmp_path):
    """A sample prepared with --every-kept launches every kept (M1, N1) from a cubin reading N1 at
    launch: the layer's picks are all priced among those kernels, the ranker's top-1 is over every
    kept candidate launched, and a pick that was not measured has no loss (never the next one's)."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    from benchmarks.table4 import main

    rows = pq.read_table(RESULTS / "b" / "launches-sample-0.9.parquet").to_pylist()
    layer = next(r["layer"] for r in rows if r["role"] == "full")
    full = [r for r in rows if r["layer"] == layer and r["role"] == "full" and r["variant"] == ""]
    kept = [r | {"id": r["id"] + "-every-kept", "variant": "every-kept", "cubin": r["id"]} for r in full]
    kept.append(full[0] | {"id": full[0]["id"] + "-every-kept-n999", "variant": "every-kept", "n1": 999,
                           "cubin": full[0]["id"], "measured_us": min(r["measured_us"] for r in full) / 2})
    (tmp_path / "env.json").write_text((RESULTS / "b" / "env.json").read_text())

    def table(launches):
        path = tmp_path / "launches-sample-0.9.parquet"
        pq.write_table(pa.Table.from_pylist(launches), path)
        return {r["strategy"]: r for r in main([str(path), "--out", str(tmp_path / "t4.parquet")]) if r["layer"] == layer}

    got = table(rows + kept)
    assert {r["best_tile"] for r in got.values()} == {f"{kept[-1]['m1']}×999"}
    assert all(r["kept_launched"] == r["kept_measured"] == len(kept) for r in got.values())
    pick = got["ranker"]["chosen_tile"]
    unmeasured = [r | ({"measure_status": "stopped at the time budget", "measured_us": float("inf")}
                       if f"{r['m1']}×{r['n1']}" == pick else {}) for r in kept]
    again = table(rows + unmeasured)["ranker"]
    assert again["chosen_tile"] == pick and math.isnan(again["loss"]) and again["kept_measured"] == len(kept) - 1
