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
