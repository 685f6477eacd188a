"""benchmarks/end_to_end.py on the CPU: the same code the GPU runs, on the host emulation (fp32 eager
only), so that the device session spends its time measuring, not debugging the script."""

import pyarrow.parquet as pq
import pytest

pytest.importorskip("torch")


def test_the_end_to_end_benchmark_writes_its_rows(tmp_path, prefect_server):
    from benchmarks.end_to_end import COLUMNS, main

    out = tmp_path / "e2e.parquet"
    rows = main(["--models", "tiny-cnn", "--batches", "2", "--search-batch", "2", "--repeats", "1", "--rounds", "1",
                 "--sparsity", "0.7", "--jobs", "2", "--artifacts", str(tmp_path / "art"), "--out", str(out)])
    table = pq.read_table(out)
    assert tuple(table.column_names) == COLUMNS and table.num_rows == len(rows) == 1
    row = rows[0]
    assert (row["model"], row["baseline"], row["mode"], row["device"]) == ("tiny-cnn", "fp32", "eager",
                                                                           "cpu (host emulation)")
    assert row["max_rel_diff"] < 1e-5 and row["top1_agreement"] == 1.0
    assert row["dense_ms"] > 0 and row["ours_ms"] > 0


def test_a_model_measured_before_is_not_run_again_and_the_file_keeps_every_model(tmp_path, monkeypatch):
    # a device call cut off at its limit kept nothing of the models it had finished: rows are written
    # after each model, and the next call goes on from them
    import benchmarks.end_to_end as e2e

    ran = []

    def model_rows(name, args):
        ran.append(name)
        return [{c: None for c in e2e.COLUMNS} | {"model": name, "batch": b, "sparsity": args.sparsity,
                                                  "dtype": args.dtype, "speedup": 1.0, "device": "cpu (host emulation)",
                                                  "timer": args.timer} for b in args.batches]

    monkeypatch.setattr(e2e, "model_rows", model_rows)
    out = str(tmp_path / "e2e.parquet")
    e2e.main(["--models", "tiny-cnn", "--batches", "2", "--out", out])
    rows = e2e.main(["--models", "tiny-cnn", "tiny-bert", "--batches", "2", "--out", out])
    assert ran == ["tiny-cnn", "tiny-bert"] and [r["model"] for r in rows] == ["tiny-cnn", "tiny-bert"]
    e2e.main(["--models", "tiny-cnn", "--batches", "2", "4", "--out", out])  # a batch it lacks: run again
    e2e.main(["--models", "tiny-cnn", "--batches", "2", "--sparsity", "0.7", "--out", out])
    assert ran == ["tiny-cnn", "tiny-bert", "tiny-cnn", "tiny-cnn"]
    e2e.main(["--models", "tiny-cnn", "--batches", "2", "--timer", "estimate", "--out", out])  # another timer's rows
    assert ran[-1] == "tiny-cnn" and len(ran) == 5
    kept = pq.read_table(out).to_pylist()
    assert sorted((r["model"], r["batch"], r["sparsity"], r["timer"]) for r in kept) == [
        ("tiny-bert", 2, 0.9, "auto"), ("tiny-cnn", 2, 0.7, "auto"), ("tiny-cnn", 2, 0.9, "auto"),
        ("tiny-cnn", 2, 0.9, "estimate"), ("tiny-cnn", 4, 0.9, "auto")]


def test_a_half_model_end_to_end_is_served_by_half_kernels_against_itself_dense_in_half(tmp_path, prefect_server):
    """Issue 23's whole-model rows: the model in fp16, searched and served by fp16 kernels; the one
    baseline is the same pruned model dense in fp16, and the difference is against it in float32."""
    from benchmarks.end_to_end import main

    rows = main(["--models", "tiny-cnn", "--batches", "2", "--search-batch", "2", "--repeats", "1", "--rounds", "1",
                 "--sparsity", "0.7", "--jobs", "2", "--artifacts", str(tmp_path / "art"), "--dtype", "fp16",
                 "--out", str(tmp_path / "e2e16.parquet")])
    (row,) = rows
    assert (row["dtype"], row["baseline"], row["mode"]) == ("fp16", "fp16", "eager")
    assert 0 < row["max_rel_diff"] < 5e-3 and row["top1_agreement"] == 1.0  # fp16's rounding, not a wrong kernel
