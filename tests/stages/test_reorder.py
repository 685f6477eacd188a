from dataclasses import replace

import numpy as np
import pytest
import scipy.sparse as sp
from hypothesis import given, settings, strategies as st

from lospmm.stages.reorder import (ReorderParams, balanced_tiles, identity_tiles, layer_orders, ordered_tiles,
                                   partition_seconds, partitioned_tiles,
                                   refined_tiles, reordered_tiles, tile_stats)


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


# --- the candidate orders (ordered_tiles) ----------------------------------------------------------


def _recounted(a: sp.csr_matrix, tiles) -> tuple[list[int], list[int]]:
    nnz, nnc = [], []
    for t in range(tiles.num_tiles):
        sub = a[tiles.tile(t)]
        nnz.append(sub.nnz)
        nnc.append(len(np.unique(sub.indices)))
    return nnz, nnc


def _check_tiles(a: sp.csr_matrix, tiles, m1: int) -> None:
    nonempty = np.flatnonzero(np.diff(a.indptr))
    assert sorted(tiles.rows.tolist()) == nonempty.tolist()
    assert np.diff(tiles.tile_ptr).max(initial=0) <= m1 and np.diff(tiles.tile_ptr).min(initial=1) >= 1
    nnz, nnc = _recounted(a, tiles)
    assert tiles.tile_nnz.tolist() == nnz and tiles.tile_nnc.tolist() == nnc


@st.composite
def structured_matrices(draw):
    """Planted groups of rows sharing columns, shuffled, with noise: what partitioners and refinement find."""
    groups = draw(st.integers(2, 12))
    size = draw(st.integers(2, 9))
    k = draw(st.integers(16, 96))
    rng = np.random.default_rng(draw(st.integers(0, 2**31)))
    rows = []
    for _ in range(groups):
        cols = rng.choice(k, size=max(1, k // 6), replace=False)
        for _ in range(size):
            keep = cols[rng.random(len(cols)) < 0.8]
            noise = rng.choice(k, size=int(rng.integers(0, 3)), replace=False)
            row = np.zeros(k, np.float32)
            row[np.concatenate([keep, noise]).astype(int)] = 1.0
            rows.append(row)
    dense = np.array(rows)[rng.permutation(len(rows))]
    return sp.csr_matrix(dense)


# without the partitioner the property runs in milliseconds; the partitioner has its own tests below
_NO_PARTITION = ReorderParams(strategies=("identity", "algorithm1", "refine"))


@settings(max_examples=80, deadline=None)
@given(st.one_of(sparse_matrices(max_m=60, max_k=60), structured_matrices()), st.sampled_from([2, 3, 4, 8, 16]),
       st.sampled_from([1, 64, 4096]), st.sampled_from([0.05, 0.15, 0.25]))
def test_the_kept_order_is_never_above_the_identity(a, m1, n, th_row):
    params = replace(_NO_PARTITION, max_cov_nnz=th_row)
    r = ordered_tiles(a, m1, n, params)
    _check_tiles(a, r.tiles, m1)
    ident = tile_stats(identity_tiles(a, m1))
    kept = tile_stats(r.tiles)
    assert kept.nnc_sum <= ident.nnc_sum
    assert [c.strategy for c in r.candidates] == ["identity", "algorithm1", "refine"]
    assert sum(c.chosen for c in r.candidates) == 1 and r.candidate(r.strategy).chosen
    chosen = r.candidate(r.strategy)
    assert chosen.nnc_sum == kept.nnc_sum and chosen.max_nnc == kept.max_nnc
    # the kept one is the cheapest estimate among those not above the identity
    assert chosen.estimate_us <= min(c.estimate_us for c in r.candidates if 0 <= c.nnc_sum <= ident.nnc_sum
                                     and "not eligible" not in c.note)
    # never an order that constrain's TH_row test removes where the identity passes it
    if ident.cov_nnz <= th_row:
        assert kept.cov_nnz <= th_row + 1e-9


@settings(max_examples=60, deadline=None)
@given(st.one_of(sparse_matrices(max_m=60, max_k=60), structured_matrices()), st.sampled_from([2, 4, 8]))
def test_refinement_never_loses_what_it_started_from(a, m1):
    start = reordered_tiles(a, m1)
    refined = refined_tiles(a, start)
    _check_tiles(a, refined, m1)
    before, after = tile_stats(start), tile_stats(refined)
    assert after.nnc_sum <= before.nnc_sum
    assert after.max_nnc <= before.max_nnc
    if start.num_tiles > 1:
        assert refined.tile_nnz.min() >= start.tile_nnz.min() and refined.tile_nnz.max() <= start.tile_nnz.max()


@settings(max_examples=60, deadline=None)
@given(st.one_of(sparse_matrices(max_m=60, max_k=60), structured_matrices()), st.sampled_from([2, 4, 8]),
       st.sampled_from([0.1, 0.25, 0.5]))
def test_a_cov_bounded_refinement_moves_no_tile_further_from_the_window(a, m1, max_cov):
    # the start's range clipped to max_cov of the mean: a tile inside stays inside, one outside gets no
    # further out, so a start within the bound is refined within it (an order constrain's TH_row keeps)
    start = reordered_tiles(a, m1)
    refined = refined_tiles(a, start, max_cov=max_cov)
    _check_tiles(a, refined, m1)
    assert tile_stats(refined).nnc_sum <= tile_stats(start).nnc_sum
    if start.num_tiles <= 1:
        return
    mean = start.tile_nnz.sum() / start.num_tiles
    low = max(start.tile_nnz.min(), mean * (1 - 0.98 * max_cov))
    high = min(start.tile_nnz.max(), mean * (1 + 0.98 * max_cov))
    outside = lambda nnz: np.maximum(0, nnz - high) + np.maximum(0, low - nnz)  # noqa: E731
    assert outside(refined.tile_nnz).max() <= outside(start.tile_nnz).max() + 1e-9
    if outside(start.tile_nnz).max() == 0:
        assert tile_stats(refined).cov_nnz <= max_cov + 1e-9


def test_a_cov_bounded_refinement_keeps_an_order_past_constrain_out():
    # rows of very different nnz, the heavy ones on shared columns (as in a magnitude-pruned conv): a
    # refinement bounded only by its start's nnz range groups the heavy rows past TH_row; bounded by
    # max_cov it never does from a start within it
    rng = np.random.default_rng(57)
    dense = np.zeros((96, 128), np.float32)
    hot = rng.choice(128, size=48, replace=False)
    for r in range(96):
        width = int(rng.choice([4, 12, 40]))
        dense[r, rng.choice(hot if width == 40 else np.arange(128), size=width, replace=False)] = 1.0
    a = sp.csr_matrix(dense)
    start = reordered_tiles(a, 8)
    assert tile_stats(start).cov_nnz <= 0.25
    free, bounded = refined_tiles(a, start), refined_tiles(a, start, max_cov=0.25)
    assert tile_stats(bounded).cov_nnz <= 0.25
    assert tile_stats(free).cov_nnz > 0.25, "the case no longer shows the unbounded refinement passing TH_row"
    assert tile_stats(bounded).nnc_sum < tile_stats(start).nnc_sum


def _planted(groups=16, size=8, k=256, seed=0) -> tuple[sp.csr_matrix, int]:
    """Groups of `size` rows on disjoint column sets, rows shuffled: the planted tiling's Σ nnc."""
    rng = np.random.default_rng(seed)
    width = k // groups
    rows = []
    for g in range(groups):
        for _ in range(size):
            row = np.zeros(k, np.float32)
            row[g * width + rng.choice(width, size=width // 2, replace=False)] = 1.0
            rows.append(row)
    dense = np.array(rows)[rng.permutation(len(rows))]
    a = sp.csr_matrix(dense)
    planted = sum(len(np.unique(sp.csr_matrix(np.array(rows[g * size:(g + 1) * size])).indices)) for g in range(groups))
    return a, planted


def test_the_partition_finds_planted_tiles_that_algorithm_1_misses():
    a, planted = _planted()
    r = ordered_tiles(a, 8, 4096)
    by = {c.strategy: c for c in r.candidates}
    assert by["partition"].nnc_sum == planted, by["partition"]
    assert tile_stats(r.tiles).nnc_sum == planted
    assert by["identity"].nnc_sum > 1.5 * planted  # shuffled: the identity order mixes the groups
    assert r.strategy in ("partition", "refine")


def test_orders_are_reproducible():
    a, _ = _planted(seed=3)
    noisy = sp.csr_matrix(a + sp.random(*a.shape, density=0.05, random_state=1, format="csr"))
    first, second = ordered_tiles(noisy, 8, 1024), ordered_tiles(noisy, 8, 1024)
    assert first.strategy == second.strategy
    assert first.tiles.rows.tolist() == second.tiles.rows.tolist()
    assert first.tiles.tile_ptr.tolist() == second.tiles.tile_ptr.tolist()
    assert [(c.strategy, c.nnc_sum, c.max_nnc) for c in first.candidates] == \
           [(c.strategy, c.nnc_sum, c.max_nnc) for c in second.candidates]


def test_the_partitioner_keeps_to_its_budget_and_m1_range():
    a, _ = _planted()
    priced = partition_seconds(a.nnz, a.shape[0] // 8)
    over = ordered_tiles(a, 8, 1024, ReorderParams(budget_seconds=priced / 2)).candidate("partition")
    assert over.nnc_sum == -1 and "over the" in over.note and over.seconds == 0.0
    outside = ordered_tiles(a, 4, 1024).candidate("partition")
    assert outside.nnc_sum == -1 and "outside partition_m1s" in outside.note
    ran = ordered_tiles(a, 8, 1024, ReorderParams(budget_seconds=priced * 2)).candidate("partition")
    assert ran.nnc_sum > 0 and ran.note == ""


def test_one_tile_or_one_row_tiles_leave_nothing_to_order():
    a = sp.csr_matrix(np.eye(6, dtype=np.float32))
    r = ordered_tiles(a, 1, 64)
    assert r.strategy == "identity"
    assert all("skipped" in c.note for c in r.candidates if c.strategy in ("partition", "refine"))


def test_unknown_strategies_are_refused():
    with pytest.raises(ValueError, match="unknown reorder strategies"):
        ordered_tiles(sp.csr_matrix(np.eye(4, dtype=np.float32)), 2, 64, ReorderParams(strategies=("identity", "magic")))


def test_the_partitioner_runs_only_for_the_m1s_that_can_still_win():
    a, _ = _planted(groups=16, size=8)
    m1s = (2, 8, 16, 32, 64)
    cheap = layer_orders(a, m1s, 4096, _NO_PARTITION)
    cheapest = {m1: min(c.estimate_us for c in r.candidates) for m1, r in cheap.items()}
    ratios = sorted(cheapest[m1] / min(cheapest.values()) for m1 in (8, 16, 32, 64))
    within = (ratios[1] + ratios[2]) / 2  # two of the four M1s in range can win, two cannot
    orders = layer_orders(a, m1s, 4096, ReorderParams(budget_seconds=60.0, partition_within=within))
    assert "outside partition_m1s" in orders[2].candidate("partition").note
    for m1 in (8, 16, 32, 64):
        ran = orders[m1].candidate("partition").nnc_sum >= 0
        assert ran == (cheapest[m1] <= within * min(cheapest.values())), (m1, orders[m1].candidate("partition"))
        if not ran:
            assert f"over {within:g}×" in orders[m1].candidate("partition").note
    # the budget is the layer's: once spent, the other M1s are skipped with what was left
    tight = layer_orders(a, (8, 16, 32, 64), 4096, ReorderParams(
        budget_seconds=partition_seconds(a.nnz, 16) * 1.01, partition_within=100.0))
    ran = [m1 for m1, r in tight.items() if r.candidate("partition").nnc_sum >= 0]
    assert len(ran) == 1
    assert all("left of the layer's budget" in r.candidate("partition").note for m1, r in tight.items() if m1 not in ran)


def _planted_unequal(seed=0) -> sp.csr_matrix:
    """Planted groups of 8 rows on disjoint columns, alternate groups four times denser: the
    partition finds the groups, whose nnz differ far past constrain's TH_row."""
    rng = np.random.default_rng(seed)
    rows = []
    for g in range(16):
        for _ in range(8):
            row = np.zeros(256, np.float32)
            row[g * 16 + rng.choice(16, size=12 if g % 2 else 3, replace=False)] = 1.0
            rows.append(row)
    return sp.csr_matrix(np.array(rows)[rng.permutation(len(rows))])


def test_balancing_brings_a_partition_within_the_nnz_bound():
    a = _planted_unequal()
    start = partitioned_tiles(a, 8)
    assert tile_stats(start).cov_nnz > 0.5  # the groups themselves
    balanced = balanced_tiles(a, start, 0.25)
    _check_tiles(a, balanced, 8)
    assert tile_stats(balanced).cov_nnz <= 0.25
    assert tile_stats(balanced).nnc_sum < tile_stats(identity_tiles(a, 8)).nnc_sum
    assert balanced_tiles(a, balanced, 0.25) is balanced  # within the bound: left as it is


def test_a_balanced_partition_is_refined_and_weighed_against_the_other_refinement():
    a = _planted_unequal()
    r = ordered_tiles(a, 8, 4096)
    by = {c.strategy: c for c in r.candidates}
    assert "not eligible: nnz COV" in by["partition"].note
    # the two refinements (from Algorithm 1, from the balanced partition): the cheaper one stays
    assert "from partition, nnz balanced first" in by["refine"].note, by["refine"].note
    assert r.strategy == "refine" and by["refine"].nnc_sum < by["algorithm1"].nnc_sum
    assert by["refine"].cov_nnz <= 0.25 + 1e-9


def test_bad_parameters_and_starts_are_refused_before_the_numba_loops():
    with pytest.raises(ValueError, match="refine_width"):
        ReorderParams(refine_width=0)
    a, _ = _planted()
    start = identity_tiles(a, 8)
    with pytest.raises(ValueError, match="do not fit"):
        refined_tiles(a[:64], start)  # rows past the matrix
    wide = identity_tiles(a, 16)
    with pytest.raises(ValueError, match="do not fit"):
        refined_tiles(a, type(wide)(8, wide.rows, wide.tile_ptr, wide.tile_nnz, wide.tile_nnc, wide.empty_rows))


def test_refinement_priced_over_its_work_is_skipped_and_says_so():
    a, _ = _planted()
    r = ordered_tiles(a, 8, 1024, ReorderParams(strategies=("identity", "algorithm1", "refine"), refine_work=1))
    assert r.candidate("refine").nnc_sum == -1 and "over refine_work" in r.candidate("refine").note
