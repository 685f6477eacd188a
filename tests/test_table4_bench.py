"""benchmarks/table4.py on the committed H100 launch files: Table 4 with its noise band."""

from pathlib import Path

import math

RESULTS = Path(__file__).resolve().parents[1] / "benchmarks" / "results" / "gpu-h100"


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
