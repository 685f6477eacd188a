"""benchmarks.prepared_vs_measured: a prepared bundle's kernels paired with the measured launches
they replace, and the per-sparsity table of measured and estimated speedups."""

from __future__ import annotations

import math

import pytest

from benchmarks import prepared_vs_measured as pvm


def _launch(layer, sparsity, m1, estimate_us, ours_us=None, sgemm_us=40.0, **extra):
    row = {"set": "headline", "model": "resnet50", "layer": layer, "sparsity": sparsity, "n": 3136, "role": "full",
           "m1": m1, "n1": 256, "estimate_us": estimate_us, "variant": "", "dtype": "fp32"} | extra
    if ours_us is not None:
        row |= {"ours_us": ours_us, "sgemm_us": sgemm_us, "status": "ok"}
    return row


def test_pairs_are_matched_by_launch_and_only_measured_full_kernels_count():
    measured = [_launch("a", 0.9, 2, 20.0, 25.0), _launch("b", 0.9, 2, 10.0, 10.0),
                _launch("c", 0.9, 2, 10.0, math.inf, status="error"),  # failed: no figure
                _launch("a", 0.9, 2, 20.0, 25.0, role="proxy")]
    prepared = [_launch("a", 0.9, 16, 10.0), _launch("b", 0.9, 2, 10.0), _launch("c", 0.9, 16, 5.0),
                _launch("a", 0.7, 16, 1.0)]  # another sparsity: not a's at 0.9
    pairs = pvm.paired(prepared, measured)
    assert [(p["layer"], p["old_tile"][0], p["new_tile"][0], p["new_estimate_us"]) for p in pairs] == \
        [("a", 2, 16, 10.0), ("b", 2, 2, 10.0)]


def test_the_summary_scales_each_new_estimate_by_its_old_kernels_error():
    measured = [_launch("a", 0.9, 2, 20.0, 25.0), _launch("b", 0.9, 2, 10.0, 10.0),
                _launch("tiny", 0.9, 2, 1.0, 1.0, sgemm_us=5.0)]  # not work-bound
    prepared = [_launch("a", 0.9, 16, 10.0), _launch("b", 0.9, 2, 10.0), _launch("tiny", 0.9, 16, 0.1)]
    (row,) = pvm.summary(pvm.paired(prepared, measured))
    assert row["work-bound kernels"] == 2 and row["tile changed"] == 1
    assert row["vs SGEMM, measured (old)"] == pytest.approx(math.sqrt(40 / 25 * 40 / 10))
    assert row["vs SGEMM, estimate (new)"] == pytest.approx(math.sqrt(40 / 10 * 40 / 10))
    # a's new kernel: 10 µs estimated, its old one measured 1.25x its estimate -> 12.5 µs
    assert row["vs SGEMM, new scaled"] == pytest.approx(math.sqrt(40 / 12.5 * 40 / 10))
    assert row["new / old estimate (changed tiles)"] == pytest.approx(0.5)


def test_without_a_prepared_bundle_it_says_what_to_prepare(tmp_path, monkeypatch):
    from benchmarks import bundle

    monkeypatch.setattr(bundle, "HOME", tmp_path)
    with pytest.raises(SystemExit, match="no prepared bundle headline-resnet50 under .*device prepare headline-resnet50"):
        pvm.main(["headline-resnet50"])
