from dataclasses import replace

import numpy as np
import pytest
import scipy.sparse as sp
from hypothesis import given, settings, strategies as st

from lospmm.stages.extract import LayerShape
from lospmm.status import Status
from lospmm.kernel.nm import NM_GROUPS
from lospmm.stages.prune import (NMPattern, PruneParams, checked_sparsity, magnitude_pruned, nm_pattern, nm_pattern_of,
                                 nm_pruned, pruned_layer, random_pruned)


def _shape(m=64, k=48, layer="fc", **kw):
    return LayerShape("net", layer, "linear", m=m, n=16, k=k, **kw)


@settings(max_examples=60, deadline=None)
@given(m=st.integers(1, 80), k=st.integers(1, 80), s=st.floats(0.01, 0.99), seed=st.integers(0, 2**31))
def test_random_pruning_hits_the_requested_count_exactly(m, k, s, seed):
    a = random_pruned(m, k, s, np.random.default_rng(seed))
    assert a.nnz == round((1 - s) * m * k)
    assert a.has_canonical_format and a.shape == (m, k)
    assert np.all(a.data != 0)


def test_random_pruning_is_seeded_per_layer():
    a1 = pruned_layer(_shape(), 0.9, PruneParams(seed=1)).matrix
    a2 = pruned_layer(_shape(), 0.9, PruneParams(seed=1)).matrix
    b = pruned_layer(_shape(), 0.9, PruneParams(seed=2)).matrix
    other = pruned_layer(_shape(layer="fc2"), 0.9, PruneParams(seed=1)).matrix
    assert (a1 != a2).nnz == 0
    assert (a1 != b).nnz > 0 and (a1 != other).nnz > 0


def test_records_requested_and_achieved_sparsity():
    layer = pruned_layer(_shape(m=10, k=10), 0.55)
    assert layer.sparsity_requested == 0.55
    assert layer.sparsity_achieved == pytest.approx(1 - round(0.45 * 100) / 100)


def test_magnitude_pruning_keeps_the_largest_weights():
    w = np.arange(1, 21, dtype=np.float32).reshape(4, 5) * np.array([1, -1, 1, -1, 1], dtype=np.float32)
    a = magnitude_pruned(w, 0.75)
    assert a.nnz == 5
    assert sorted(np.abs(a.data)) == [16, 17, 18, 19, 20]
    kept = a.toarray()
    assert np.array_equal(kept[kept != 0], w[kept != 0])


def test_magnitude_pruning_of_already_sparse_weights_reports_higher_sparsity():
    w = np.zeros((8, 8), dtype=np.float32)
    w[0, :4] = 1.0
    layer = pruned_layer(_shape(m=8, k=8), 0.5, PruneParams(method="magnitude"), weight=w)
    assert layer.nnz == 4 and layer.sparsity_achieved == pytest.approx(60 / 64)


def test_nan_weights_are_an_error_naming_the_layer():
    w = np.ones((4, 4), dtype=np.float32)
    w[1, 2] = np.nan
    w[3, 3] = np.inf
    layer = pruned_layer(_shape(m=4, k=4, layer="enc.0.q"), 0.5, PruneParams(method="magnitude"), weight=w)
    assert layer.status == "error" and "enc.0.q" in layer.message and "2 NaN/Inf" in layer.message


def test_all_zero_weights_prune_to_empty_with_a_message():
    layer = pruned_layer(_shape(m=4, k=4, layer="dead"), 0.5, PruneParams(method="magnitude"),
                         weight=np.zeros((4, 4), np.float32))
    assert layer.status == "empty" and "dead" in layer.message and "all zeros" in layer.message


def test_tiny_layer_at_high_sparsity_is_empty_not_an_exception():
    layer = pruned_layer(_shape(m=2, k=2, layer="tiny"), 0.99)
    assert layer.status == "empty" and layer.nnz == 0


def test_random_mask_over_real_weights_keeps_their_values():
    w = np.random.default_rng(0).standard_normal((16, 16)).astype(np.float32)
    a = pruned_layer(_shape(m=16, k=16), 0.5, PruneParams(method="random"), weight=w).matrix
    dense = a.toarray()
    assert a.nnz == 128 and np.array_equal(dense[dense != 0], w[dense != 0])


@pytest.mark.parametrize("s", [0, 1, -0.1, 1.5, float("nan")])
def test_sparsity_outside_the_open_unit_interval_is_rejected(s):
    with pytest.raises(ValueError, match="between 0 and 1"):
        checked_sparsity(s)


def test_empty_gemm_and_failed_shapes_become_error_rows():
    assert pruned_layer(_shape(m=0), 0.5).status == "error"
    failed = pruned_layer(_shape(status="error", message="fc: bad"), 0.5)
    assert failed.status == "error" and failed.message == "fc: bad"
    assert "needs the layer's weights" in pruned_layer(_shape(), 0.5, PruneParams(method="magnitude")).message


def test_global_pruning_keeps_one_threshold_over_the_model_and_the_requested_share_overall():
    from lospmm.stages.prune import global_magnitude_threshold

    rng = np.random.default_rng(0)
    small = rng.standard_normal((8, 16)).astype(np.float32) * 0.1  # a layer of small weights
    large = rng.standard_normal((8, 16)).astype(np.float32)
    t = global_magnitude_threshold([small, large], 0.75)
    params = PruneParams(method="global")
    kept = [pruned_layer(_shape(8, 16), 0.75, params, w, t) for w in (small, large)]
    assert sum(p.nnz for p in kept) == round(0.25 * 2 * 128)  # the model's share, not each layer's
    assert kept[0].nnz < kept[1].nnz  # the small layer keeps fewer
    assert all(np.abs(p.matrix.data).min() >= t for p in kept if p.nnz)
    with pytest.raises(ValueError, match="model-wide threshold"):
        pruned_layer(_shape(8, 16), 0.75, params, small)


def test_keep_takes_an_already_pruned_checkpoint_as_it_is():
    rng = np.random.default_rng(1)
    w = rng.standard_normal((6, 10)).astype(np.float32)
    w[rng.random(w.shape) < 0.6] = 0
    layer = pruned_layer(_shape(6, 10), 0.9, PruneParams(method="keep"), w)
    assert np.array_equal(layer.matrix.toarray(), w) and layer.sparsity_achieved == pytest.approx((w == 0).mean())


def test_a_grouped_convolution_is_pruned_as_its_own_weight_and_laid_out_block_diagonally():
    from lospmm.stages.prune import grouped_as_dense

    rng = np.random.default_rng(0)
    weight = rng.standard_normal((8, 2 * 3 * 3)).astype(np.float32)  # Cout 8, groups 4: 2 input channels each
    shape = LayerShape("m", "g.weight", "conv", m=8, n=16, k=8 * 9, cin=8, cout=8, kh=3, kw=3, stride=1, pad=1,
                       groups=4, h_in=4, w_in=4, h_out=4, w_out=4, dilation=1)
    layer = pruned_layer(shape, 0.5, PruneParams("magnitude"), weight)
    a = layer.matrix.toarray()
    assert a.shape == (8, 72) and layer.nnz == 72 and layer.sparsity_achieved == pytest.approx(0.5)
    for o in range(8):  # output channel o reads input channels 2·(o // 2) and 2·(o // 2) + 1 alone
        g = o // 2
        assert not a[o, :g * 18].any() and not a[o, (g + 1) * 18:].any()
    assert np.array_equal(a[:, :18][:2], magnitude_pruned(weight, 0.5).toarray()[:2])
    assert np.array_equal(grouped_as_dense(sp.csr_matrix(weight), 1).toarray(), weight)
    odd = pruned_layer(replace(shape, m=6, cout=6), 0.5, PruneParams("magnitude"), weight[:6])
    assert odd.status == "error" and "divide into groups=4" in odd.message


def _nm_reference(weight: np.ndarray, n: int, m: int, v: int) -> np.ndarray:
    """N:M by its definition, one group at a time: per V rows × M columns, the N columns of largest
    Σ|w| (ties to the lower column) kept."""
    keep = np.zeros(weight.shape, bool)
    for r0 in range(0, weight.shape[0], v):
        for c0 in range(0, weight.shape[1], m):
            score = np.abs(weight[r0:r0 + v, c0:c0 + m]).sum(axis=0)
            cols = sorted(range(m), key=lambda c: (-score[c], c))[:n]
            keep[r0:r0 + v, [c0 + c for c in cols]] = True
    return np.where(keep, weight, 0)


@settings(max_examples=60, deadline=None)
@given(st.sampled_from([(1, 2), (2, 4), (1, 4), (2, 8), (4, 32), (12, 32), (16, 32)]), st.sampled_from([1, 2, 4]),
       st.integers(1, 6), st.integers(0, 3), st.integers(1, 4), st.integers(0, 2**31))
def test_nm_pruning_keeps_the_largest_n_of_every_m(nm, v, row_groups, rows_short, col_groups, seed):
    n, m = nm
    rng = np.random.default_rng(seed)
    rows = max(1, v * row_groups - rows_short % v)  # the last group of V rows may hold fewer
    weight = rng.standard_normal((rows, m * col_groups)).astype(np.float32)
    weight[rng.random(weight.shape) < 0.05] = 0  # zeros already there stay zeros
    pattern = NMPattern(n, m, v)
    a = nm_pruned(weight, pattern)
    assert np.array_equal(a.toarray(), _nm_reference(weight, n, m, v))
    found = nm_pattern_of(a)
    if (weight != 0).all() and any(weight.shape[1] % g == 0 for g in NM_GROUPS):
        assert found is not None and found.n * m <= n * found.m  # its own ratio (or a tighter one) is found


def test_a_pattern_past_half_and_a_checkpoint_with_empty_rows_are_found_and_unstructured_sparsity_is_not():
    rng = np.random.default_rng(0)
    weight = rng.standard_normal((64, 128)).astype(np.float32)
    assert nm_pattern_of(nm_pruned(weight, NMPattern(3, 4))) == NMPattern(3, 4)  # N > M/2: served too
    two_four = nm_pruned(weight, NMPattern(2, 4)).toarray()
    two_four[rng.random(64) < 0.3] = 0  # output channels pruned whole: no group of theirs is full
    two_four[0, :8] = 0  # weights that were zero already leave a few groups short
    assert nm_pattern_of(sp.csr_matrix(two_four)) == NMPattern(2, 4)
    for sparsity in (0.25, 0.5, 0.75):  # unstructured: under some N everywhere, but few groups at it
        random = np.where(rng.random(weight.shape) < sparsity, 0, weight)
        assert nm_pattern_of(sp.csr_matrix(random)) is None, sparsity


def test_nm_pruned_layers_record_the_pattern_and_bad_layers_say_why():
    good = pruned_layer(_shape(m=16, k=64), 0.5, PruneParams(method="nm:2:4"), np.ones((16, 64), np.float32))
    assert good.pattern == NMPattern(2, 4) and good.sparsity_achieved == 0.5
    zoo = pruned_layer(_shape(m=16, k=64), 0.75, PruneParams(method="nm:8:32:4"))  # no weights: random positions
    assert zoo.pattern == NMPattern(8, 32, 4) and zoo.nnz == 16 * 64 // 4
    assert nm_pattern_of(zoo.matrix) == NMPattern(8, 32, 4)
    # rows not a multiple of V (a classifier's 1000 outputs in vectors of 32): the last vector holds the 8 left
    odd = pruned_layer(_shape(m=1000, k=64), 0.75, PruneParams(method="nm:8:32:32"),
                       np.random.default_rng(0).standard_normal((1000, 64)).astype(np.float32))
    assert odd.status != Status.ERROR and odd.pattern == NMPattern(8, 32, 32) and odd.nnz == 1000 * 64 // 4
    assert nm_pattern_of(odd.matrix) == NMPattern(8, 32, 32)
    last = odd.matrix.toarray()[992:] != 0
    assert (last == last[0]).all() and not (last == (odd.matrix.toarray()[960] != 0)).all()  # one pattern of its own
    for shape, method, words in ((_shape(k=30), "nm:2:4", "K=30 is not a multiple of M=4"),
                                 (_shape(k=16), "nm:16:32", "K=16 is narrower than one group of M=32")):
        bad = pruned_layer(shape, 0.5, PruneParams(method=method))
        assert bad.status == Status.ERROR and bad.message.startswith("fc: ") and words in bad.message, bad.message
    with pytest.raises(ValueError, match="N < M"):
        nm_pattern("nm:4:2")
    with pytest.raises(ValueError, match="write nm:N:M"):
        nm_pattern("nm:2")


def test_keep_detects_the_pattern_of_an_nm_checkpoint_and_not_of_unstructured_weights():
    rng = np.random.default_rng(0)
    weight = rng.standard_normal((64, 128)).astype(np.float32)
    two_four = nm_pruned(weight, NMPattern(2, 4)).toarray()
    kept = pruned_layer(_shape(m=64, k=128), 0.5, PruneParams(method="keep"), two_four)
    assert kept.pattern == NMPattern(2, 4)
    vector = nm_pruned(weight, NMPattern(8, 32, 8)).toarray()
    assert pruned_layer(_shape(m=64, k=128), 0.75, PruneParams(method="keep"), vector).pattern == NMPattern(8, 32, 8)
    # unstructured at 0.9: under 16 of every 32, but the groups are not filled to any N
    loose = magnitude_pruned(weight, 0.9).toarray()
    assert pruned_layer(_shape(m=64, k=128), 0.9, PruneParams(method="keep"), loose).pattern is None


def test_a_pruned_checkpoint_pruned_again_is_told_apart_from_dense_weights_and_from_keep():
    """zeros_before is the share of zeros in the weights as read; pruned_again names a source whose
    layers held PRUNED_BEFORE_SHARE or more before a method other than keep pruned them, and the
    sparsities at which they kept their own zeros (sparser than asked)."""
    from lospmm.stages.prune import PRUNED_BEFORE_SHARE, pruned_again, zeros_share

    rng = np.random.default_rng(0)
    shape = _shape(k=32)
    dense = rng.standard_normal((64, 32)).astype(np.float32)
    pruned = dense * (rng.random(dense.shape) >= 0.8)
    assert zeros_share(dense) == 0 and zeros_share(None) != zeros_share(None)  # NaN: no weights
    rows = []
    for sparsity in (0.7, 0.9):
        for name, w in (("fc", pruned), ("head", dense)):
            layer = pruned_layer(replace(shape, layer=name), sparsity, PruneParams("magnitude"), w)
            assert layer.zeros_before == pytest.approx((w == 0).mean())
            rows.append({"layer": name, "m": 64, "k": 32, "method": "magnitude", "zeros_before": layer.zeros_before,
                         "sparsity_requested": sparsity, "sparsity_achieved": layer.sparsity_achieved})
    again = pruned_again(rows)
    assert (again.layers, again.of_layers, again.method, again.sparsities) == (1, 2, "magnitude", (0.7, 0.9))
    assert again.zeros == pytest.approx((pruned == 0).mean()) and again.kept_own == (0.7,)  # 0.8 held, 0.7 asked
    line = again.line("net (net.safetensors)")
    assert "1 of its 2 searched layers already held zeros" in line and "`--prune keep`" in line
    assert "at sparsity 0.7 they kept their own zeros" in line
    assert pruned_again([r for r in rows if r["layer"] == "head"]) is None  # dense weights: nothing to say
    assert pruned_again([{**r, "method": "keep"} for r in rows]) is None  # their zeros searched as they are
    assert pruned_again([{**r, "zeros_before": float("nan")} for r in rows]) is None  # the zoo: no weights read
    light = dense * (rng.random(dense.shape) >= PRUNED_BEFORE_SHARE / 2)  # a few zeros: not called pruned
    assert pruned_again([{**rows[0], "zeros_before": zeros_share(light)}]) is None
    # a 2:4 checkpoint pruned to nm:2:4 is the same A, as asked: nothing to say; a layer of zeros only neither
    two_four = nm_pruned(dense, NMPattern(2, 4)).toarray()
    same = pruned_layer(shape, 0.5, PruneParams("nm:2:4"), two_four)
    assert same.zeros_before == 0.5 and np.array_equal(same.matrix.toarray(), two_four)
    assert pruned_again([{"layer": "fc", "m": 64, "k": 32, "method": "nm:2:4", "zeros_before": same.zeros_before,
                          "sparsity_requested": 0.5, "sparsity_achieved": same.sparsity_achieved}]) is None
    assert pruned_again([{**rows[1], "zeros_before": 1.0, "sparsity_achieved": 1.0}]) is None
