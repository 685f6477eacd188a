"""benchmarks.calibrate --nm: the N:M launches it fits, read back as the kernels they measured."""

from benchmarks import calibrate


def test_an_nm_row_names_its_blocking_and_one_measured_before_rows_did_is_a_whole_chunk_kernel():
    old = {"prune": "nm:4:32:32", "m1": 32, "n1": 64, "m": 4096, "k": 4096, "n": 256, "registers": 126,
           "design": "nm,based,tile-x,walks=1,v=1"}
    work = calibrate.nm_work(old)  # 32 rows, 64 threads: the 32×64 blocking of 8×4, as the H200 measured it
    t = work.tiling
    assert (t.block_rows, t.block_columns, t.thread_rows, t.thread_columns) == (32, 64, 8, 4)
    assert t.depth == 32 and not t.gather and t.staged == t.chunk
    new = old | {"nm": [64, 128, 8, 8, 128, 1]}
    t = calibrate.nm_work(new).tiling
    assert (t.block_rows, t.depth, t.gather, t.gathers) == (64, 128, True, True)
