"""The CLI's tables: the problems of a run."""

from __future__ import annotations

from rich.console import Console

from lospmm.flows.reports.inspection import problems_table, skipped_line


def _text(table) -> str:
    console = Console(width=200, record=True)
    console.print(table)
    return console.export_text()


def test_failed_layers_get_a_row_each_and_skipped_tensors_are_one_line_counted_by_reason():
    record = {"run_id": "r1", "entries": [
        {"stage": "extract", "model": "bert", "problems": [
            *({"layer": f"layer.{i}.bias", "status": "skipped", "message": f"layer.{i}.bias [8]: excluded, bias (1-D)"}
              for i in range(120)),
            {"layer": "proj.b", "status": "skipped", "message": "proj.b: excluded, bias of Gemm proj"},
            {"layer": "embed", "status": "skipped", "message": "embed [10, 4]: excluded, embedding/lookup table (by its name)"}]},
        {"stage": "prune", "model": "bert", "sparsity": 0.9, "problems": [
            {"layer": "broken", "status": "error", "message": "broken: weight has NaN"}]},
        {"stage": "time", "model": "bert", "sparsity": 0.9, "problems": [
            {"layer": "fc", "status": "skipped", "message": "fc (2,32): its proxy did not compile"}]},
    ]}
    text = _text(problems_table(record))
    assert "broken: weight has NaN" in text and "its proxy did not compile" in text  # a candidate not timed: kept
    assert "bias" not in text and "embedding" not in text  # extract's skips are no problem
    assert skipped_line(record) == ("122 tensors not searched: 120 × bias (1-D), 1 × bias, "
                                    "1 × embedding/lookup table (by its name) (`lospmm inspect r1 --stage extract` "
                                    "lists them)")
    assert problems_table({"entries": [{"stage": "prune", "problems": []}]}) is None
    assert "(the other layers completed)" in text
    # a command to paste names the run's root where it is not the default
    assert skipped_line({**record, "config": {"artifacts": "/data/art"}}).endswith(
        "(`lospmm inspect r1 --stage extract --artifacts /data/art` lists them)")
    # where no layer completed, the title does not say the others did
    failed = [{"layer": "broken", "status": "error", "message": ""}, {"layer": "fc", "status": "error", "message": ""}]
    assert "(no layer completed)" in _text(problems_table({**record, "layers": {"total": 2, "failed": failed}}))
    assert "(the other layers completed)" in _text(problems_table({**record, "layers": {"total": 3, "failed": failed}}))


def test_a_clean_run_has_no_problem_table_and_its_depthwise_skips_group_across_models():
    """The README's main job exits 0 with depthwise convolutions skipped: one line, no problem table."""
    record = {"run_id": "r2", "entries": [
        {"stage": "extract", "model": "shufflenetv2", "problems": [
            {"layer": f"stage2.{i}.branch2.3", "status": "skipped", "message": "depthwise convolution is not a GEMM"}
            for i in range(3)]},
        {"stage": "extract", "model": "m", "problems": [
            {"layer": f"dw{g}.w", "status": "skipped",
             "message": f"dw{g}.w: excluded, grouped convolution (groups={g}; depthwise): not a GEMM"} for g in (8, 16)]},
        {"stage": "emit", "model": "shufflenetv2", "sparsity": 0.9, "problems": []},
    ]}
    assert problems_table(record) is None
    assert skipped_line(record) == ("5 tensors not searched: m: 2 × grouped convolution (depthwise): not a GEMM; "
                                    "shufflenetv2: 3 × depthwise convolution is not a GEMM "
                                    "(`lospmm inspect r2 --stage extract` lists them)")
    assert skipped_line({"entries": []}) is None


def test_the_run_summary_names_each_kernels_dtype(tmp_path):
    import io

    import pyarrow as pa
    from rich.console import Console

    from lospmm.flows.reports.inspection import summary_table
    from lospmm.flows.storage.store import write_artifact

    row = {"model": "m", "layer": "enc.0.weight", "sparsity": 0.9, "status": "ok", "candidates": 10,
           "after_constrain": 5, "after_rank": 3, "timed": 3, "m1": 2, "n1": 32, "dtype": "bf16", "timer": "estimate",
           "time_us": 6.5, "speedup_vs_dense": float("nan"), "compile_seconds": 0.5, "emit_seconds": 2.0,
           "search_seconds": 4.0}
    write_artifact(tmp_path / "summary" / "r.parquet", pa.Table.from_pylist([row]), {"stage": "summary"})
    out = io.StringIO()
    Console(file=out, width=250).print(summary_table(str(tmp_path), {"summary": "summary/r.parquet"}))
    lines = out.getvalue().splitlines()
    header = next(l for l in lines if l.startswith("┃"))
    line = next(l for l in lines if l.startswith("│") and "enc.0" in l)
    assert header.split("┃")[10].strip() == "dtype" and line.split("│")[10].strip() == "bf16"


def test_a_stage_view_shows_paths_and_timers_short_and_missing_values_empty():
    # `inspect RUN --stage emit`'s default view: the kernel directory by its name (the run's folder is the
    # artifact's), the timer by its kind, NaN (no runner-up) as nothing; --all-columns shows them whole
    from lospmm.flows.reports.inspection import _cell

    path = "10_kernels/shufflenetv2-s0.9-605c411417d3049a/conv1_0-cc32e008"
    assert _cell("kernel_dir", path) == "conv1_0-cc32e008" and _cell("kernel_dir", path, short=False) == path
    assert _cell("timer", "estimate:h100-2026-11-23") == "estimate" and _cell("timer", "cuda") == "cuda"
    assert _cell("runner_up_estimate_us", float("nan")) == "" and _cell("full_time_us", 9.47612) == "9.476"
    assert _cell("designs_measured", None) == ""
    # a design by what it does not share with the default; whole with --all-columns
    assert _cell("design", "1×32 baked,chained,tile-x,walks=1,v=1") == "1×32 chained"
    assert _cell("design", "baked,based,tile-x,walks=1,v=1", short=False) == "baked,based,tile-x,walks=1,v=1"
    assert _cell("designs_measured", "1×32 baked,chained,tile-x,walks=1,v=1: 2.50 µs; nm 2:4,64x128,8x8: failed (x: y)") \
        == "1×32 chained: 2.50 µs; nm 2:4,64x128,8x8: failed (x: y)"


def test_the_emit_view_prices_a_design_in_one_cell():
    # estimate and design price: one figure where they agree, both where the device's pricing moved it
    import pyarrow as pa

    from lospmm.flows.reports.inspection import PRICED, RUNNER_UP_PRICED, _priced_designs

    nan = float("nan")
    table = _priced_designs(pa.Table.from_pylist([
        {"design_estimate_us": 16.388, "design_price_us": 11.23, "runner_up_estimate_us": 16.39, "runner_up_price_us": 11.82},
        {"design_estimate_us": 9.476, "design_price_us": 9.476, "runner_up_estimate_us": nan, "runner_up_price_us": nan}]))
    assert table.column(PRICED).to_pylist() == ["16.39 / 11.23", "9.476"]
    assert table.column(RUNNER_UP_PRICED).to_pylist() == ["16.39 / 11.82", ""]


def test_a_layer_the_nm_kernel_serves_is_no_fallback():
    """A layer whose kept candidates all failed a constraint is a fallback when one of them serves it,
    but not when the N:M kernel does (the constraints judged tiles, not it); nothing emitted is said as
    such."""
    from lospmm.flows.reports.summary import layer_status
    from lospmm.status import Status

    baked, nm = {"status": Status.OK, "design": "4×32"}, {"status": Status.OK, "design": "nm 2:4,mma,64x128,w32x64"}
    assert layer_status(baked, True, True, True) == Status.FALLBACK
    assert layer_status(nm, True, True, True) == Status.OK
    assert layer_status(baked, True, False, True) == Status.OK
    assert layer_status({}, False, False, True) == Status.NO_CANDIDATE
    assert layer_status({}, True, False, True) == Status.NOT_EMITTED


def test_a_runs_outcome_says_what_it_gave():
    # as `lospmm run` exits and `lt.search` reports: layers failed, the run failed, cancelled, or a record older
    # than the layers' outcomes (nothing to say of them)
    from lospmm.flows.reports.inspection import run_outcome

    base = {"run_id": "r1", "status": "completed", "entries": []}
    assert run_outcome({**base, "layers": {"total": 2, "failed": []}}) == ("ok", "")
    assert run_outcome({**base, "layers": {"total": 2, "failed": [{"layer": "fc", "status": "error"}]}}) == (
        "layers", "1 of 2 layers did not produce what was asked: fc (error)")
    # a layer's reason, where it has one (its message names it); one reason said once
    failed = [{"layer": f"l{i}", "status": "error", "message": f"l{i}: K=36 is not a multiple of M=8\nmore"}
              for i in range(5)] + [{"layer": "fc", "status": "empty", "message": ""}]
    assert run_outcome({**base, "layers": {"total": 9, "failed": failed}}) == (
        "layers", "6 of 9 layers did not produce what was asked: l0: K=36 is not a multiple of M=8; "
                  "l1: K=36 is not a multiple of M=8; l2: K=36 is not a multiple of M=8; and 3 more")
    # a message that does not name its layer is led by it: no layer goes unnamed behind a shared reason
    shared = [{"layer": n, "status": "error", "message": "the compiler was killed"} for n in ("a", "b")]
    assert run_outcome({**base, "layers": {"total": 2, "failed": shared}}) == (
        "layers", "2 of 2 layers did not produce what was asked: a: the compiler was killed; b: the compiler was killed")
    assert run_outcome(base) == ("ok", "")
    assert run_outcome({**base, "summary_error": "OSError: disk full"}) == (
        "failed", "run r1: its summary could not be written: OSError: disk full")
    assert run_outcome({**base, "status": "cancelled"}) == (
        "failed", "run r1 was cancelled; its finished artifacts are kept")
    failed = {**base, "status": "failed", "entries": [{"stage": "emit", "label": "m-s0.9", "state": "Failed",
                                                        "error": "RuntimeError: boom\ntraceback"}]}
    assert run_outcome(failed) == ("failed", "run r1 failed: emit m-s0.9: RuntimeError: boom")


def test_a_stage_view_says_once_what_every_row_shares_and_leaves_out_empty_columns():
    # `inspect RUN --stage S` at a terminal's width: 20 emit columns had folded to 2 characters each at 120
    # columns. A column empty in every row shown, or one value in all of them, is said once under the table;
    # --all-columns (columns=None) keeps every column as stored
    import io

    import pyarrow as pa

    from lospmm.flows.reports.inspection import _plain_table

    table = pa.Table.from_pylist([
        {"layer": f"enc.{i}.query", "design": "baked,based,tile-x,walks=1,v=1", "runner_up": "",
         "runner_up_estimate_us": float("nan"), "full_time_us": 5.0 + i, "status": "ok"} for i in range(3)])
    view = ["layer", "design", "runner_up", "runner_up_estimate_us", "full_time_us", "status"]

    def shown(t):
        out = io.StringIO()
        Console(file=out, width=120).print(_plain_table(t, 60, "emit", view))
        return out.getvalue()

    text = shown(table)
    header = next(line for line in text.splitlines() if line.startswith("┃"))
    assert [c.strip() for c in header.split("┃")[1:-1]] == ["layer", "full time us"]
    flat = " ".join(text.split())
    assert "in every row shown: design baseline; status ok" in flat  # (a design by its short label)
    assert "empty in every row shown: runner_up, runner_up_estimate_us" in flat
    # one row shares everything with itself: only its empty columns go
    one = shown(table.slice(0, 1))
    header = next(line for line in one.splitlines() if line.startswith("┃"))
    assert [c.strip() for c in header.split("┃")[1:-1]] == ["layer", "design", "full time us", "status"]
    assert not any(line.startswith("in every row shown") for line in one.splitlines())
    # every column, as stored, each row a record of its own (a row of 30 columns fits no terminal: the
    # probe found --all-columns unreadable at any width)
    out = io.StringIO()
    Console(file=out, width=80).print(_plain_table(table, 60, "emit", None))
    cells = [[c.strip() for c in line.split("│")[1:-1]] for line in out.getvalue().splitlines() if line.startswith("│")]
    assert [c[0] for c in cells] == list(table.column_names) * 3
    assert cells[:len(table.column_names)] == [["layer", "enc.0.query"], ["design", "baked,based,tile-x,walks=1,v=1"],
                                              ["runner_up", ""], ["runner_up_estimate_us", ""], ["full_time_us", "5"],
                                              ["status", "ok"]]


def test_a_runs_summary_fits_120_columns_saying_once_what_its_layers_share(tmp_path):
    # the README's main job (ten ShuffleNetV2 layers at 0.9, no GPU): 16 columns had been cut to 3–5
    # characters at 120 columns and the last one cropped. What every layer shares is said once below it
    import io

    import pyarrow as pa
    from rich.console import Console

    from lospmm.flows.reports.inspection import summary_table
    from lospmm.flows.storage.store import write_artifact

    rows = [{"model": "shufflenetv2", "layer": f"stage{i}.0.branch2.0", "sparsity": 0.9, "status": "ok",
             "candidates": 320, "after_constrain": 100 + i, "after_rank": 10, "timed": 10, "m1": 2, "n1": 32 * (i + 1),
             "dtype": "fp32", "timer": "estimate:h100-2026-11-23", "time_us": 5.0 + i, "speedup_vs_dense": float("nan"),
             "compile_seconds": 0.5, "emit_seconds": 2.0, "search_seconds": 4.0 + i,
             "design": f"2×{32 * (i + 1)}" + (" baked,chained,tile-x,walks=1,v=1" if i == 9 else ""),
             "pruned": "random"} for i in range(10)]
    write_artifact(tmp_path / "summary" / "r.parquet", pa.Table.from_pylist(rows), {"stage": "summary"})
    out = io.StringIO()
    Console(file=out, width=120).print(summary_table(str(tmp_path), {"summary": "summary/r.parquet"}))
    lines = out.getvalue().splitlines()
    assert max(len(line) for line in lines) <= 120
    header = next(line for line in lines if line.startswith("┃"))
    assert [c.strip() for c in header.split("┃")[1:-1]] == ["layer", "constrain", "kernel", "time µs", "search s"]
    assert "│ stage9.0.branch2.0 │" in out.getvalue() and "2×320 chained" in out.getvalue()  # the design, short
    flat = " ".join(out.getvalue().split())
    assert "in every row shown: model shufflenetv2; sparsity 0.9; pruned random; status ok; cands 320; rank 10; timed 10; dtype fp32; timer " \
           "estimate:h100-2026-11-23; compile s 0.5; emit s 2.0" in flat
    assert "empty in every row shown: vs cuBLAS" in flat
    # at 80 columns, with long names and every figure its own, nothing is cropped and no figure cut short
    # (the probe saw 56.3 search seconds as "5")
    for i, r in enumerate(rows):
        r.update(layer=f"encoder.layer.{i}.attention.output.dense", compile_seconds=10.5 + i, emit_seconds=20.25 + 3 * i,
                 search_seconds=50.3 + 7 * i, timed=i + 1)
    write_artifact(tmp_path / "summary" / "r2.parquet", pa.Table.from_pylist(rows), {"stage": "summary"})
    out = io.StringIO()
    Console(file=out, width=80).print(summary_table(str(tmp_path), {"summary": "summary/r2.parquet"}))
    lines = out.getvalue().splitlines()
    assert max(len(line) for line in lines) <= 80
    cells = [[c.strip() for c in line.split("│")[1:-1]] for line in lines if line.startswith("│")]
    assert sorted(c[-1] for c in cells if c[-1]) == sorted(f"{50.3 + 7 * i:.1f}" for i in range(10))


def test_the_summary_says_how_each_layer_was_pruned_and_an_nm_pattern_found_in_kept_weights():
    # a 2:4 checkpoint searched with --prune keep: the run's own output said nothing of the pattern
    from lospmm.flows.reports.summary import pruned_cell

    assert pruned_cell({"method": "keep", "nm": "2:4"}) == "keep, 2:4 found"
    assert pruned_cell({"method": "nm:2:4", "nm": "2:4"}) == "nm:2:4"
    assert pruned_cell({"method": "magnitude", "nm": None}) == "magnitude"
