"""benchmarks.verdict: every open issue's device target against committed results, on results
folders written here (no GPU)."""

from __future__ import annotations

import pyarrow as pa
import pyarrow.parquet as pq

from benchmarks import verdict


def _write(path, rows, done=True):
    """A step folder's launches, finished (done.json) unless `done` is False."""
    path.parent.mkdir(parents=True, exist_ok=True)
    pq.write_table(pa.Table.from_pylist(rows), path)
    if done:
        (path.parent / "done.json").write_text("{}")


def _headline(model, layer, sparsity, efficiency, sgemm_us=40.0, n=3136, m=256, k=2304):
    """A headline launch whose per-nonzero efficiency is `efficiency`."""
    nnz = int(round(m * k * (1 - sparsity)))
    ours = nnz * sgemm_us / (m * k * efficiency)
    return {"set": "headline", "role": "full", "status": "ok", "model": model, "layer": layer, "sparsity": sparsity,
            "n": n, "m": m, "k": k, "nnz": nnz, "ours_us": ours, "sgemm_us": sgemm_us, "tf32_us": 10.0,
            "fp16_us": 5.0}


def _by_target(rows):
    return {r["target"]: r for r in rows}


def test_nothing_committed_is_nothing_measured(tmp_path):
    rows = verdict.verdict_rows(tmp_path, "h100")
    assert rows and all(r["met"] == "not measured" and r["measured"] == "-" for r in rows)
    # each names the step that would measure it
    assert all(r["from"].startswith("run ") for r in rows)
    assert {r["issue"] for r in rows} == {"30", "34", "35"}
    assert verdict.tally(rows) == f"0 met, 0 not met, 0 met provisionally, {len(rows)} not measured"


def test_fp32_targets_are_judged_per_sparsity_from_the_headline_steps(tmp_path):
    rows = [_headline("resnet50", f"layer{i}.conv", 0.9, eff) for i, eff in enumerate((0.55, 0.6, 0.7))]
    rows += [_headline("resnet50", f"layer{i}.conv", 0.7, eff) for i, eff in enumerate((0.1, 0.2, 0.3))]
    rows.append(_headline("resnet50", "tiny", 0.9, 0.01, sgemm_us=5.0))  # not work-bound: not counted
    _write(tmp_path / "h100" / "headline-resnet50" / "kernel-speed-headline-resnet50.parquet", rows, done=False)
    # another device's results are not the H100's
    _write(tmp_path / "h200" / "headline-bert-base" / "kernel-speed-headline-bert-base.parquet",
           [_headline("bert-base", "q", 0.9, 0.01)])
    got = [r for r in verdict.fp32_rows(tmp_path, "h100")]
    eff = {r["target"].split(",")[0]: r for r in got if "efficiency" in r["target"]}
    at_9, at_7 = eff["fp32 per-nonzero efficiency at 0.9"], eff["fp32 per-nonzero efficiency at 0.7"]
    # a step cut off before its last launch: its yes is provisional, its no a no
    assert at_9["measured"] == "0.6" and at_9["met"] == "yes, partial"
    assert at_7["measured"] == "0.2" and at_7["met"] == "no, partial"
    assert at_9["from"] == "3 work-bound layers × batches of resnet50 (h100/headline-resnet50 [partial])"
    assert verdict.tally([at_9, at_7]) == "0 met, 1 not met, 1 met provisionally, 0 not measured"
    (tmp_path / "h100" / "headline-resnet50" / "done.json").write_text("{}")
    got = verdict.fp32_rows(tmp_path, "h100")
    assert got[0]["from"].endswith("(h100/headline-resnet50)") and got[0]["met"] == "no"
    eff = {r["target"].split(",")[0]: r for r in got if "efficiency" in r["target"]}
    assert eff["fp32 per-nonzero efficiency at 0.95"]["met"] == "not measured"
    # at 0.9 each kernel's time over SGEMM's is its efficiency over 0.1 (the density): 5.5-7×, under 4× never
    speed = next(r for r in got if r["target"].startswith("fp32 vs cuBLAS SGEMM at 0.9"))
    assert speed["met"] == "yes" and float(speed["measured"].rstrip("×")) > 5
    slower = next(r for r in got if r["target"].startswith("fp32 never slower"))
    assert slower["measured"] == "0 of 3 slower" and slower["met"] == "yes"


def test_the_largest_layers_are_bert_ffn_and_resnet50_layer4():
    assert verdict.largest_layer("bert-base", "encoder.layer.3.intermediate.dense")
    assert verdict.largest_layer("bert-base", "encoder.layer.3.output.dense")
    assert not verdict.largest_layer("bert-base", "encoder.layer.3.attention.output.dense")
    assert not verdict.largest_layer("bert-base", "encoder.layer.3.attention.self.query")
    assert verdict.largest_layer("resnet50", "layer4.0.conv2")
    assert not verdict.largest_layer("resnet50", "layer3.0.conv2")
    assert not verdict.largest_layer("mobilenetv2", "layer4.0.conv2")


def test_peak_share_is_the_lowest_of_the_largest_layers(tmp_path):
    # the H100 (132 SMs, 128 lanes, 1.98 GHz): 66.9 TFLOPS; 2·nnz·n / t
    rows = [_headline("resnet50", "layer4.0.conv2", 0.9, 0.6), _headline("resnet50", "layer4.1.conv2", 0.9, 0.05),
            _headline("resnet50", "layer1.0.conv2", 0.9, 0.01),  # not among the largest
            _headline("resnet50", "layer4.2.conv3", 0.9, 0.001, sgemm_us=5.0)]  # not work-bound
    _write(tmp_path / "h100" / "headline-resnet50" / "kernel-speed-headline-resnet50.parquet", rows)
    peak = next(r for r in verdict.fp32_rows(tmp_path, "h100") if "FP32 peak" in r["target"])
    share = [2 * r["nnz"] * r["n"] / (r["ours_us"] * 1e-6) / 66.9e12 * 100 for r in rows[:2]]
    assert peak["measured"] == f"0.9: {min(share):.1f}% (max {max(share):.1f}%)"
    assert peak["met"] == ("yes" if min(share) >= 30 else "no")
    assert peak["from"].startswith("2 work-bound kernels")


def test_end_to_end_needs_every_model_and_batch(tmp_path):
    # benchmarks.end_to_end's own model names (its --models: resnet50, mobilenet_v2, bert)
    rows = [{"model": m, "batch": b, "sparsity": 0.9, "dtype": "fp32", "baseline": "fp32", "mode": mode,
             "dense_ms": 10.0, "ours_ms": 10.0 / (3.0 if mode == "graph" else 1.6)}
            for m in ("resnet50", "bert", "mobilenet_v2") for b in (8, 32) for mode in ("eager", "graph")]
    _write(tmp_path / "h100" / "serving" / "end-to-end.parquet", rows)
    eager, graph = verdict.end_to_end_rows(tmp_path, "h100")
    assert eager["met"] == "yes" and graph["met"] == "yes" and "resnet50 b8: 1.60×" in eager["measured"]
    assert "bert b32: 1.60×" in eager["measured"] and "mobilenet" not in eager["measured"]
    _write(tmp_path / "h100" / "serving" / "end-to-end.parquet", rows[2:])  # resnet50 batch 8 lost
    eager, _ = verdict.end_to_end_rows(tmp_path, "h100")
    assert eager["met"] == "no" and "1 cases not measured" in eager["measured"]
    # a mode the runner could not time is written NaN: a case not measured, never a speedup
    rows[0]["ours_ms"] = float("nan")
    _write(tmp_path / "h100" / "serving" / "end-to-end.parquet", rows)
    eager, _ = verdict.end_to_end_rows(tmp_path, "h100")
    assert eager["met"] == "no" and "1 cases not measured" in eager["measured"]


def test_nm_patterns_with_a_vector_length_count_for_their_n_of_32(tmp_path):
    rows = [{"set": "nm-spmm", "variant": "", "role": "full", "status": "ok", "layer": "4096x4096", "n": 4096,
             "sparsity": 1 - n / 32, "prune": f"nm:{n}:32:32", "ours_us": 100.0 / speed, "sgemm_us": 100.0,
             "id": f"k{n}", "order": "", "epilogue": ""}
            for n, speed in ((16, 2.0), (12, 2.0), (8, 4.0), (4, 4.0))]
    _write(tmp_path / "h100" / "nm-spmm" / "kernel-speed-nm-spmm.parquet", rows)
    got = {r["target"].split(" vs")[0]: r for r in verdict.nm_rows(tmp_path, "h100")}
    assert got["N:M 16:32"]["met"] == "yes" and got["N:M 16:32"]["measured"].startswith("2×")
    assert got["N:M 12:32"]["met"] == "no"  # 2× under 2.5×
    assert got["N:M 8:32"]["met"] == "yes" and got["N:M 4:32"]["met"] == "no"
    assert got["N:M 4:32"]["from"] == "1 kernels (h100/nm-spmm)"


def test_the_verdict_command_prints_the_committed_results(capsys):
    from benchmarks.device import main

    main(["verdict", "--markdown"])
    out = capsys.readouterr().out
    assert "device targets on h100's committed results" in out and "| issue | target |" in out
    assert "not measured" in out


def test_the_readme_table_is_the_verdict_of_the_committed_results():
    """README's "Where the targets stand" is `verdict --markdown` on benchmarks/results/h100: after
    a window's results are committed, run it again and paste the table."""
    from pathlib import Path

    from benchmarks import analysis
    from benchmarks.device import RESULTS

    rows = verdict.verdict_rows(RESULTS, "h100")
    readme = (Path(__file__).resolve().parents[2] / "README.md").read_text(encoding="utf-8")
    section = readme.split("### Where the targets stand", 1)[1].split("\n### ", 1)[0]
    assert analysis.markdown_table("", rows).strip().split("\n", 2)[-1] in section, \
        "README's verdict table is stale: python -m benchmarks.device verdict --markdown"
    assert f"**{verdict.tally(rows)}.**" in " ".join(section.split())


def test_the_design_choice_on_the_layers_it_was_fitted_on_is_provisional():
    """The H100's design price was shaped on the A/B layers: its figure there is in-sample, and a yes
    there is no met target; the held-out step's figures count."""
    from benchmarks.device import RESULTS

    rows = verdict.design_rows(RESULTS, "h100")
    assert all("(h100/designs)" in r["from"] and r["met"].endswith(", in-sample") for r in rows)
    assert rows[0]["met"] == "yes, in-sample"
    assert "met provisionally" in verdict.tally(rows) and verdict.tally(rows).startswith("0 met")
