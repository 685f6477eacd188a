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


def test_every_kept_candidate_measured_from_one_cubin_per_m1_sets_the_best_and_the_rankers_field(tmp_path):
    """A sample prepared with --every-kept adds full kernels at every kept (M1, N1), launched from a
    cubin reading N1 at launch: they count in the best, and the ranker's top-1 is over all of them."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    from benchmarks.table4 import main

    rows = pq.read_table(RESULTS / "b" / "launches-sample-0.9.parquet").to_pylist()
    layer = next(r["layer"] for r in rows if r["role"] == "full")
    full = [r for r in rows if r["layer"] == layer and r["role"] == "full" and r["variant"] == ""]
    fastest = min(r["measured_us"] for r in full)
    extra = full[0] | {"id": full[0]["id"] + "-every-kept-n999", "variant": "every-kept", "n1": 999,
                       "cubin": full[0]["id"], "measured_us": fastest / 2}
    path = tmp_path / "launches-sample-0.9.parquet"
    pq.write_table(pa.Table.from_pylist(rows + [extra]), path)
    (tmp_path / "env.json").write_text((RESULTS / "b" / "env.json").read_text())
    got = [r for r in main([str(path), "--out", str(tmp_path / "t4.parquet")]) if r["layer"] == layer]
    assert {r["best_tile"] for r in got} == {f"{extra['m1']}×999"}
    assert all(r["loss"] > 0 or r["chosen_tile"] == r["best_tile"] for r in got)
