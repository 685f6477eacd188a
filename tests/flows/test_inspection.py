"""The CLI's tables: the problems of a run."""

from __future__ import annotations

from rich.console import Console

from lospmm.flows.reports.inspection import problems_table


def _text(table) -> str:
    console = Console(width=200, record=True)
    console.print(table)
    return console.export_text()


def test_failed_layers_get_a_row_each_and_skipped_tensors_are_counted_by_reason():
    record = {"entries": [
        {"stage": "extract", "model": "bert", "problems": [
            *({"layer": f"layer.{i}.bias", "status": "skipped", "message": f"layer.{i}.bias [8]: excluded, bias (1-D)"}
              for i in range(120)),
            {"layer": "proj.b", "status": "skipped", "message": "proj.b: excluded, bias of Gemm proj"},
            {"layer": "embed", "status": "skipped", "message": "embed [10, 4]: excluded, embedding/lookup table (by its name)"}]},
        {"stage": "prune", "model": "bert", "sparsity": 0.9, "problems": [
            {"layer": "broken", "status": "error", "message": "broken: weight has NaN"}]},
    ]}
    text = _text(problems_table(record))
    assert "broken: weight has NaN" in text
    assert "120 tensors" in text and "bias (1-D)" in text and "layer.7.bias" not in text
    assert "1 tensor " in text and "embedding/lookup table (by its name)" in text
    assert problems_table({"entries": [{"stage": "prune", "problems": []}]}) is None
