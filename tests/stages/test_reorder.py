import numpy as np
import pytest
import scipy.sparse as sp
from hypothesis import given, settings, strategies as st

from lospmm.stages.reorder import ReorderParams, identity_tiles, reordered_tiles, tile_stats


def _reference_algorithm_1(a: sp.csr_matrix, m1: int):
    """Algorithm 1 transcribed literally: merge the row into every tile, stable-sort by merged
    nnc, take the first open tile within TH_nnz, else the first open tile."""
    nnz_rows = np.diff(a.indptr)
    rows = [r for r in np.argsort(nnz_rows, kind="stable") if nnz_rows[r] > 0]
    num = -(-len(rows) // m1)
    th = a.nnz / num if num else 0
    tiles = [{"id": i, "rows": [], "cols": set(), "nnz": 0} for i in range(num)]
    for r in rows:
        cols = set(a.indices[a.indptr[r]:a.indptr[r + 1]])
        merged = sorted(tiles, key=lambda t: len(t["cols"] | cols))  # stable: ties keep id order
        cid = None
        for t in merged:
            if len(t["rows"]) < m1:
                if cid is None:
                    cid = t["id"]
                if t["nnz"] + len(cols) <= th:
                    cid = t["id"]
                    break
        tiles[cid]["rows"].append(r)
        tiles[cid]["cols"] |= cols
        tiles[cid]["nnz"] += len(cols)
    return [sorted(t["rows"]) for t in tiles]


@st.composite
def sparse_matrices(draw, max_m=40, max_k=40):
    m = draw(st.integers(1, max_m))
    k = draw(st.integers(1, max_k))
    density = draw(st.floats(0.0, 0.6))
    seed = draw(st.integers(0, 2**31))
    rng = np.random.default_rng(seed)
    a = sp.random(m, k, density=density, format="csr", random_state=rng, dtype=np.float32)
    a.data[:] = 1.0
    return a


@settings(max_examples=150, deadline=None)
@given(a=sparse_matrices(), m1=st.integers(1, 12))
def test_reorder_is_a_partition_of_the_nonempty_rows(a, m1):
    tiles = reordered_tiles(a, m1)
    nonempty = np.flatnonzero(np.diff(a.indptr))
    assert sorted(tiles.rows.tolist()) == nonempty.tolist()
    assert sorted(tiles.empty_rows.tolist()) == np.flatnonzero(np.diff(a.indptr) == 0).tolist()
    assert tiles.num_tiles == -(-len(nonempty) // m1)
    sizes = np.diff(tiles.tile_ptr)
    assert np.all(sizes <= m1) and np.all(sizes >= 1)
    for t in range(tiles.num_tiles):
        block = a[tiles.tile(t)]
        assert tiles.tile_nnz[t] == block.nnz
        assert tiles.tile_nnc[t] == len(np.unique(block.indices))


@settings(max_examples=150, deadline=None)
@given(a=sparse_matrices(), m1=st.integers(1, 12))
def test_reorder_matches_a_literal_transcription_of_algorithm_1(a, m1):
    tiles = reordered_tiles(a, m1)
    got = [sorted(tiles.tile(t).tolist()) for t in range(tiles.num_tiles)]
    assert got == _reference_algorithm_1(a, m1)


@settings(max_examples=80, deadline=None)
@given(a=sparse_matrices(), m1=st.integers(1, 12))
def test_identity_grouping_is_consecutive_nonempty_rows(a, m1):
    tiles = identity_tiles(a, m1)
    assert tiles.rows.tolist() == np.flatnonzero(np.diff(a.indptr)).tolist()
    for t in range(tiles.num_tiles):
        block = a[tiles.tile(t)]
        assert tiles.tile_nnc[t] == len(np.unique(block.indices)) and tiles.tile_nnz[t] == block.nnz


def test_reorder_groups_rows_with_shared_columns():
    # Fig. 5 of the paper: rows 0-1 and 4-5 share columns, as do rows 2-3 and 6-7.
    a = np.zeros((8, 8), dtype=np.float32)
    for r in (0, 1, 4, 5):
        a[r, [0, 1, 2]] = 1
    for r in (2, 3, 6, 7):
        a[r, [5, 6, 7]] = 1
    a = sp.csr_matrix(a)
    before, after = tile_stats(identity_tiles(a, 4)), tile_stats(reordered_tiles(a, 4))
    assert before.max_nnc == 6 and after.max_nnc == 3
    tiles = reordered_tiles(a, 4)
    assert {frozenset(tiles.tile(t).tolist()) for t in range(2)} == {frozenset({0, 1, 4, 5}), frozenset({2, 3, 6, 7})}


def test_reorder_beats_identity_on_interleaved_similar_blocks():
    # Blocks i and i+16 share their nonzero positions (the §4.3 setting with R = 1).
    rng = np.random.default_rng(0)
    m, k, rows_per_block = 1024, 1024, 32
    dense = np.zeros((m, k), dtype=np.float32)
    for b in range(16):
        pattern = rng.random((rows_per_block, k)) < 0.02
        for blk in (b, b + 16):
            dense[blk * rows_per_block:(blk + 1) * rows_per_block][pattern] = 1
    a = sp.csr_matrix(dense)
    assert tile_stats(reordered_tiles(a, 32)).max_nnc < tile_stats(identity_tiles(a, 32)).max_nnc


def test_empty_matrix_has_no_tiles():
    a = sp.csr_matrix((5, 7), dtype=np.float32)
    tiles = reordered_tiles(a, 4)
    assert tiles.num_tiles == 0 and tiles.empty_rows.tolist() == [0, 1, 2, 3, 4]
    assert tile_stats(tiles).max_nnc == 0


def test_bad_parameters_are_rejected():
    a = sp.csr_matrix(np.eye(3, dtype=np.float32))
    with pytest.raises(ValueError, match="M1"):
        reordered_tiles(a, 0)
    with pytest.raises(ValueError, match="row_order"):
        reordered_tiles(a, 2, ReorderParams(row_order="random"))


def test_distinct_m1s_caps_at_the_nonempty_row_count_once():
    from lospmm.stages.reorder import distinct_m1s

    a = sp.csr_matrix(np.diag([1.0, 0, 2, 3, 0, 4]))  # 4 non-empty rows
    assert distinct_m1s(a, [1, 2, 8, 32, 4]) == [1, 2, 4]
    assert distinct_m1s(sp.csr_matrix((3, 3)), [8]) == [1]
