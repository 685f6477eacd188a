import re

import pytest
from typer.testing import CliRunner

from lospmm.cli import _expanded, app

runner = CliRunner()


def test_list_options_take_space_separated_values():
    argv = ["run", "--zoo", "bert-base", "resnet50", "--sparsity", "0.5", "0.9", "--until", "prune"]
    assert _expanded(argv) == ["run", "--zoo", "bert-base", "--zoo", "resnet50", "--sparsity", "0.5",
                               "--sparsity", "0.9", "--until", "prune"]


@pytest.mark.parametrize("args, message", [
    (["--zoo", "bert-large"], "unknown zoo model 'bert-large'"),
    (["--sparsity", "1.0"], "--sparsity 1.0"),
    (["--sparsity", "0"], "between 0 and 1"),
    (["--until", "deploy"], "--until 'deploy'"),
    (["--timer", "fast"], "--timer 'fast'"),
    (["--top-k", "0"], "--top-k must be >= 1"),
    (["--gpu", "rtx9090"], "unknown GPU"),
    (["--tokens", "0", "--weights", "x.safetensors"], "--tokens must be >= 1"),
    (["--weights", "missing.safetensors"], "missing.safetensors does not exist"),
    (["--m1", "0"], "--m1"),
    (["--input-shape", "images:1x0"], "--input-shape 'images:1x0': give NAME:DIMS"),
    (["--input-shape", "images:1x3x8x8"], "input shapes fix an ONNX model's inputs; give --weights MODEL.onnx"),
])
def test_bad_run_options_fail_fast_with_a_clear_message(tmp_path, args, message):
    model = [] if "--weights" in args or "--zoo" in args else ["--zoo", "bert-base"]
    result = runner.invoke(app, ["run", "--artifacts", str(tmp_path), *model, *args])
    assert result.exit_code == 2
    assert message in result.output
    assert not (tmp_path / "01_shapes").exists()  # nothing started


@pytest.mark.parametrize("argv, line", [
    (["run", "--sparsity", "abc"], "error: lospmm run: Invalid value for '--sparsity': "),
    (["run", "--zoo", "resnet50", "--bogus"], "error: lospmm run: No such option: --bogus"),
    (["kernel"], "error: lospmm kernel: Missing option '--layer' (see lospmm kernel --help)"),
    (["nosuch"], "error: lospmm: No such command 'nosuch' (see lospmm --help)"),
    (["run", "--zoo"], "error: lospmm run: Option '--zoo' requires an argument (see lospmm run --help)"),
])
def test_a_command_line_that_does_not_parse_gets_one_line_and_exit_2(tmp_path, monkeypatch, capsys, argv, line):
    from lospmm import cli

    monkeypatch.setattr(cli, "_EXITS_AFTER", [False])  # main() marks the process as ending with the command
    monkeypatch.setattr("sys.argv", ["lospmm", *argv])
    monkeypatch.chdir(tmp_path)
    with pytest.raises(SystemExit) as stop:
        cli.main()
    out = capsys.readouterr()
    assert stop.value.code == 2 and out.out == ""
    assert out.err.startswith(line) and out.err.count("\n") == 1, out.err
    assert not (tmp_path / "artifacts").exists()


def test_the_entry_point_keeps_help_and_exit_codes(tmp_path, monkeypatch, capsys):
    from lospmm import cli

    monkeypatch.setattr(cli, "_EXITS_AFTER", [False])
    monkeypatch.chdir(tmp_path)
    for argv, code in ((["run", "--help"], 0), (["inspect"], 2)):  # help; no runs under artifacts: bad input
        monkeypatch.setattr("sys.argv", ["lospmm", *argv])
        with pytest.raises(SystemExit) as stop:
            cli.main()
        assert stop.value.code == code, argv
    out = capsys.readouterr()
    assert "Usage: lospmm run" in out.out and "no runs under artifacts" in out.err


def test_the_entry_point_passes_a_commands_own_exit_through(monkeypatch, capsys):
    """A command that ends the process itself (sys.exit, as click does on a broken pipe) keeps its
    code; an abort at a prompt is one line and 1."""
    import sys

    import typer

    from lospmm import cli

    own = typer.Typer()

    @own.command()
    def leave(code: int = 0, abort: bool = False) -> None:
        if abort:
            raise typer.Abort()
        sys.exit(code)

    @own.command()
    def other() -> None:  # two commands: the first is a subcommand, as lospmm's are
        pass

    monkeypatch.setattr(cli, "app", own)
    monkeypatch.setattr(cli, "_EXITS_AFTER", [False])
    for argv, code in ((["leave", "--code", "3"], 3), (["leave", "--abort"], 1), (["other"], 0)):
        monkeypatch.setattr("sys.argv", ["lospmm", *argv])
        with pytest.raises(SystemExit) as stop:
            cli.main()
        assert stop.value.code == code, argv
    assert capsys.readouterr().err == "aborted\n"


def test_unreadable_weights_file_is_named(tmp_path):
    bad = tmp_path / "junk.safetensors"
    bad.write_bytes(b"this is not a safetensors file")
    result = runner.invoke(app, ["run", "--artifacts", str(tmp_path), "--weights", str(bad)])
    assert result.exit_code == 2 and "junk.safetensors" in result.output and "not a readable safetensors" in result.output


def test_a_torch_checkpoint_is_named_as_one_with_what_to_give_instead(tmp_path):
    pt = tmp_path / "model.pt"
    pt.write_bytes(b"PK\x03\x04" + bytes(60))  # torch.save's zip archive
    result = runner.invoke(app, ["run", "--artifacts", str(tmp_path), "--weights", str(pt)])
    assert result.exit_code == 2 and "looks like a torch checkpoint" in result.output
    assert "lt.search(model, example_input)" in result.output and "not a readable safetensors" not in result.output


def test_run_help_states_the_poolers_rows_and_the_input_shapes():
    text = " ".join(runner.invoke(app, ["run", "--help"], env={"COLUMNS": "200"}).output.split())
    assert "pooler" in text and "--input-shape" in text and "NAME:1x3x640x640" in text


def test_run_help_shows_its_options_in_panels_in_the_order_a_user_meets_them():
    text = runner.invoke(app, ["run", "--help"], env={"COLUMNS": "200"}).output
    panels = re.findall(r"╭─ (.+?) ─", text)
    assert panels == ["Options", "The model", "Pruning", "The search", "The kernels", "Running"], panels
    under = {}  # each option under the panel above it
    for line in text.splitlines():
        if line.startswith("╭─ "):
            panel = re.match(r"╭─ (.+?) ─", line)[1]
        elif option := re.match(r"│ (--[a-z0-9-]+)", line):
            under[option[1]] = panel
    assert (under["--weights"], under["--prune"], under["--top-k"], under["--dtype"], under["--artifacts"]) == (
        "The model", "Pruning", "The search", "The kernels", "Running")
    assert len(under) == 33  # every option shown once (32 and --help)


def test_inspect_without_runs_says_how_to_start(tmp_path):
    result = runner.invoke(app, ["inspect", "--artifacts", str(tmp_path)])
    assert result.exit_code == 2 and "lospmm run" in result.output


@pytest.mark.usefixtures("prefect_server")
def test_run_inspect_and_rerun(tmp_path):
    root = str(tmp_path / "art")
    common = ["--artifacts", root]
    result = runner.invoke(app, ["run", "--zoo", "bert-base", "--sparsity", "0.8", "--batch", "1", "--seq-len", "64",
                                 "--m1", "8", "--until", "constrain", *common])
    assert result.exit_code == 0, result.output
    assert "completed" in result.output

    listing = runner.invoke(app, ["inspect", *common])
    assert listing.exit_code == 0 and "bert-base" in listing.output
    from lospmm.flows.storage.runs import run_record

    run_id = run_record(root)["run_id"]
    detail = runner.invoke(app, ["inspect", run_id[:15], *common])
    assert detail.exit_code == 0 and "04_candidates/" in detail.output and "Completed" in detail.output
    assert "per layer: candidates after each step" in detail.output  # the run's summary, shown again
    constrain = runner.invoke(app, ["inspect", "--stage", "constrain", *common])
    assert constrain.exit_code == 0 and "register / utilisation" in constrain.output and "pooler.dense" in constrain.output
    reorder = runner.invoke(app, ["inspect", "--stage", "reorder", "--layer", "query", *common])
    assert reorder.exit_code == 0 and "candidate orders" in reorder.output and "query" in reorder.output
    assert "algorithm1" in reorder.output and "kept / identity" in reorder.output
    rows = runner.invoke(app, ["inspect", "--stage", "reorder", "--layer", "query", "--rows", *common])
    assert rows.exit_code == 0 and "(1 rows)" in rows.output and "candidate orders" not in rows.output

    rerun = runner.invoke(app, ["rerun", "--stage", "reorder", *common])
    assert rerun.exit_code == 0, rerun.output
    assert "recomputing: reorder, constrain" in rerun.output
    bad = runner.invoke(app, ["rerun", "--stage", "deploy", *common])
    assert bad.exit_code == 2 and "choose one of" in bad.output
    beyond = runner.invoke(app, ["rerun", "--stage", "emit", *common])
    assert beyond.exit_code == 2 and "it has no 'emit' stage" in beyond.output
    # `lospmm kernel` without a tile writes the kernel the run served: this run served none
    out = ["--out", str(tmp_path / "k"), *common]
    served = runner.invoke(app, ["kernel", "--layer", "pooler", *out])
    assert served.exit_code == 2 and (f"run {run_record(root)['run_id']} stopped after constrain (--until constrain): it has no emit "
                                      "artifact; --m1 and --n1 write a kernel of a tile the run reordered for"
                                      in " ".join(served.output.split())), served.output
    odd = runner.invoke(app, ["kernel", "--layer", "pooler", "--m1", "8", "--n1", "50", *out])
    assert odd.exit_code == 2 and "--n1 50: threads per block are a multiple of 32 up to 1024 on the" in odd.output
    assert not (tmp_path / "k").exists()


def test_train_ranker_writes_a_usable_model(tmp_path):
    import json

    from lospmm.flows.storage.ranker_store import load_ranker

    out = tmp_path / "my-ranker"
    result = runner.invoke(app, ["train-ranker", "--samples", "30", "--out", str(out), "--timer", "estimate"])
    assert result.exit_code == 0, result.output
    meta = json.loads(out.with_suffix(".json").read_text())
    assert meta["timer"].startswith("estimate") and meta["device"] == "h100" and meta["synthetic_kernels"] == 30
    assert 0 <= meta["heldout_ndcg_at_10"] <= 1 and meta["samples"] > 30
    booster, back = load_ranker(out)
    assert back["version"] == meta["version"]
    # a run can use it (validated before any work); a missing model is named
    missing = runner.invoke(app, ["run", "--artifacts", str(tmp_path / "a"), "--zoo", "bert-base", "--ranker",
                                  str(tmp_path / "nope")])
    assert missing.exit_code == 2 and "nope.txt" in missing.output


def test_train_ranker_from_a_measured_launch_file(tmp_path):
    from pathlib import Path

    launches = Path(__file__).resolve().parents[1] / "benchmarks/results/gpu-h100/b/launches-sample-0.9.parquet"
    out = tmp_path / "h100"
    result = runner.invoke(app, ["train-ranker", "--measured", str(launches), "--out", str(out)])
    assert result.exit_code == 0, result.output
    assert "held out in turn" in result.output and out.with_suffix(".txt").is_file()
    bad = tmp_path / "bad.parquet"
    bad.write_bytes(b"not parquet")
    refused = runner.invoke(app, ["train-ranker", "--measured", str(bad)])
    assert refused.exit_code == 2 and "bad.parquet: not a readable launch file" in refused.output


def test_cuda_timer_without_a_gpu_is_refused_up_front(tmp_path):
    from lospmm.kernel.cuda import gpu_present

    if gpu_present():
        pytest.skip("a GPU is present")
    result = runner.invoke(app, ["run", "--artifacts", str(tmp_path), "--zoo", "bert-base", "--timer", "cuda"])
    assert result.exit_code == 2 and "no CUDA device" in result.output
    assert not (tmp_path / "01_shapes").exists()


def test_every_stage_has_an_inspect_view():
    from lospmm.flows.dag import artifact_schemas
    from lospmm.flows.reports.inspection import DERIVED_COLUMNS, VIEW_COLUMNS
    from lospmm.stages import STAGES

    for stage in STAGES:
        names, derived = set(artifact_schemas()[stage].names), DERIVED_COLUMNS.get(stage, {})
        assert set(VIEW_COLUMNS[stage]) <= names | set(derived), stage
        assert all(set(reads) <= names for reads in derived.values()), stage  # a cell made of what is stored


def test_a_bad_artifact_root_fails_before_anything_starts(tmp_path):
    (tmp_path / "file").write_text("x")
    result = runner.invoke(app, ["run", "--zoo", "shufflenetv2", "--artifacts", str(tmp_path / "file" / "art")])
    assert result.exit_code == 2 and "which is a file" in result.output
    assert "Traceback" not in result.output and len(result.output.strip().splitlines()) <= 2


@pytest.mark.usefixtures("prefect_server")
def test_exit_codes_say_whether_every_layer_produced_what_was_asked(tmp_path):
    import numpy as np
    from safetensors.numpy import save_file

    rng = np.random.default_rng(0)
    bad = rng.standard_normal((16, 16)).astype(np.float32)
    bad[0, 0] = np.nan
    weights = tmp_path / "w.safetensors"
    save_file({"good": rng.standard_normal((32, 16)).astype(np.float32), "bad": bad,
               "bias": rng.standard_normal(16).astype(np.float32)}, str(weights))
    common = ["run", "--weights", str(weights), "--artifacts", str(tmp_path / "art"), "--m1", "2"]
    result = runner.invoke(app, [*common, "--until", "constrain", "--tokens", "256"])
    assert result.exit_code == 3, result.output  # `bad` has a NaN: the others complete, the run says so
    assert "1 of 2 layers did not produce what was asked: bad: weight has 1 NaN/Inf value(s)" in result.output
    # the bias is no problem: a line counts it, the problem table has `bad` only
    assert "1 tensor not searched: 1 × bias (1-D)" in result.output and "layers with problems" in result.output
    assert result.output.count("bias") == 1
    # inspect shows the run as it ended: the failed layer (the summary leaves out a layer prune refused)
    run_id = re.search(r"lospmm run (\S+)", result.output)[1]
    shown = runner.invoke(app, ["inspect", run_id, "--artifacts", str(tmp_path / "art")], env={"COLUMNS": "250"})
    assert shown.exit_code == 0 and "layers with problems" in shown.output, shown.output
    assert "1 of 2 layers did not produce what was asked: bad: weight has 1 NaN/Inf value(s)" in shown.output
    listed = runner.invoke(app, ["inspect", "--artifacts", str(tmp_path / "art")], env={"COLUMNS": "250"})
    assert "1 of 2 failed" in next(line for line in listed.output.splitlines() if run_id in line)
    ones = tmp_path / "ones.safetensors"
    save_file({"good": rng.standard_normal((32, 16)).astype(np.float32)}, str(ones))
    fine = runner.invoke(app, ["run", "--weights", str(ones), "--artifacts", str(tmp_path / "art"), "--m1", "2",
                               "--until", "constrain", "--tokens", "256"])
    assert fine.exit_code == 0, fine.output
    extracted = runner.invoke(app, ["run", "--weights", str(ones), "--artifacts", str(tmp_path / "art"),
                                    "--until", "extract"])
    assert extracted.exit_code == 0, extracted.output  # asked for shapes only, and got them
    # N = 1 token: no candidate passes, so the least-bad are kept as a fallback and a kernel is emitted
    small = runner.invoke(app, ["run", "--weights", str(ones), "--artifacts", str(tmp_path / "art"), "--m1", "2",
                                "--tokens", "1"])
    assert small.exit_code == 0 and "fallback" in small.output, small.output
    # only M1 = 256 on a 256-row layer: the register limit removes every tile, nothing can be emitted
    tall = tmp_path / "tall.safetensors"
    save_file({"tall": rng.standard_normal((256, 16)).astype(np.float32)}, str(tall))
    nothing = runner.invoke(app, ["run", "--weights", str(tall), "--artifacts", str(tmp_path / "art"), "--m1", "256",
                                  "--tokens", "4096"])
    assert nothing.exit_code == 3 and "tall (no kept candidate)" in nothing.output, nothing.output

    # an artifact deleted after the run: inspect names it and how to rebuild it, no traceback
    from lospmm.flows.storage.runs import run_record

    record = run_record(tmp_path / "art")
    (tmp_path / "art" / next(e["path"] for e in record["entries"] if e["stage"] == "constrain")).unlink()
    shown = runner.invoke(app, ["inspect", record["run_id"], "--stage", "constrain", "--artifacts",
                                str(tmp_path / "art")])
    assert shown.exit_code == 1 and "missing" in shown.output and "lospmm rerun --stage constrain" in shown.output
    assert "Traceback" not in shown.output


@pytest.mark.usefixtures("prefect_server")
def test_a_layer_failing_for_a_passing_cause_is_reported_and_retried_on_the_next_run(tmp_path, monkeypatch):
    import errno

    import numpy as np
    from safetensors.numpy import save_file

    import lospmm.kernel.package as kernels  # where a kernel directory writes its manifest

    rng = np.random.default_rng(0)
    weights = tmp_path / "w.safetensors"
    save_file({"full": rng.standard_normal((32, 16)).astype(np.float32),
               "fine": rng.standard_normal((24, 16)).astype(np.float32)}, str(weights))
    common = ["run", "--weights", str(weights), "--artifacts", str(tmp_path / "art"), "--m1", "2", "--tokens", "256"]
    write_manifest = kernels.write_manifest

    def disk_full_for_one_layer(directory, files):
        if directory.name.startswith("full"):
            raise OSError(errno.ENOSPC, "No space left on device", str(directory))
        return write_manifest(directory, files)

    monkeypatch.setattr(kernels, "write_manifest", disk_full_for_one_layer)
    result = runner.invoke(app, common)
    # the other layer completes, the summary is written, the exit code says a layer failed
    assert result.exit_code == 3, result.output
    assert "1 of 2 layers did not produce what was asked" in result.output and "full (error)" in result.output
    monkeypatch.setattr(kernels, "write_manifest", write_manifest)  # the disk has room again
    again = runner.invoke(app, common)
    assert again.exit_code == 0, again.output  # the failure was not cached as the layer's result


def test_an_interrupted_run_is_recorded_so_and_one_stopped_before_it_began_says_nothing_was_written(tmp_path):
    from lospmm.flows.execution.stopping import record_ended as _record_ended
    from lospmm.flows.storage.runs import RunStatus, run_record, write_run_record

    assert _record_ended(tmp_path, "20260101-000000-abcdef", RunStatus.CANCELLED) is False  # no record: the flow never began
    write_run_record(tmp_path, {"run_id": "20260101-000000-abcdef", "status": RunStatus.RUNNING, "config": {}})
    assert _record_ended(tmp_path, "20260101-000000-abcdef", RunStatus.CANCELLED) is True
    assert run_record(tmp_path)["status"] == RunStatus.CANCELLED


@pytest.mark.usefixtures("prefect_server")
def test_a_pruned_checkpoint_pruned_again_says_so_at_the_end_and_keep_does_not(tmp_path):
    """The default prune on a checkpoint whose layers hold 80% zeros prunes them again: the run ends
    with a line naming the file, the share and `--prune keep`, and inspect shows it too."""
    import numpy as np
    from safetensors.numpy import save_file

    rng = np.random.default_rng(0)
    w = rng.standard_normal((64, 32)).astype(np.float32)
    w[rng.random(w.shape) < 0.8] = 0
    weights = tmp_path / "net.safetensors"
    save_file({"fc.weight": w, "head.weight": rng.standard_normal((8, 64)).astype(np.float32)}, str(weights))
    art = ["--artifacts", str(tmp_path / "art"), "--until", "prune", "--tokens", "64"]
    said = (f"net ({weights}): 1 of its 2 searched layers already held zeros ({(w == 0).mean():.1%} of their "
            f"weights: pruned before?) and were pruned again by magnitude to 0.9; `--prune keep` searches pruned "
            f"weights as they are")
    result = runner.invoke(app, ["run", "--weights", str(weights), *art], env={"COLUMNS": "250"})
    assert result.exit_code == 0 and said in " ".join(result.output.split()), result.output
    run_id = re.search(r"lospmm run (\S+)", result.output)[1]
    shown = runner.invoke(app, ["inspect", run_id, "--artifacts", str(tmp_path / "art")], env={"COLUMNS": "250"})
    assert said in " ".join(shown.output.split()), shown.output
    # a kernel asked of it names why there is none (it said "run has sparsities []")
    kernel = runner.invoke(app, ["kernel", run_id, "--layer", "fc.weight", "--m1", "2", "--n1", "32", "--out",
                                 str(tmp_path / "k"), "--artifacts", str(tmp_path / "art")])
    assert kernel.exit_code != 0 and (f"run {run_id} stopped after prune (--until prune): it has no reorder artifact"
                                      in " ".join(kernel.output.split())), kernel.output
    kept = runner.invoke(app, ["run", "--weights", str(weights), "--prune", "keep", *art], env={"COLUMNS": "250"})
    assert kept.exit_code == 0 and "already held zeros" not in kept.output, kept.output


def test_keep_without_a_sparsity_names_the_run_for_the_zeros_the_file_holds(tmp_path):
    """`--prune keep` keeps the file's zeros: without --sparsity the run is named for their share over
    the searched layers (as lt.search names it), not the default 0.9; a file without zeros is refused
    in one line before anything runs."""
    import numpy as np
    from safetensors.numpy import save_file

    from lospmm.cli import _kept
    from lospmm.flows.config import RunConfig

    rng = np.random.default_rng(0)
    w = rng.standard_normal((64, 32)).astype(np.float32)
    w[rng.random(w.shape) < 0.8] = 0
    pruned, dense = tmp_path / "pruned.safetensors", tmp_path / "dense.safetensors"
    # the bias is not searched: its values do not count
    save_file({"fc.weight": w, "fc.bias": np.ones(64, np.float32)}, str(pruned))
    save_file({"fc.weight": rng.standard_normal((64, 32)).astype(np.float32)}, str(dense))
    cfg = RunConfig(zoo=(), weights=str(pruned), prune="keep", artifacts=str(tmp_path / "art"))
    held = round(float((w == 0).mean()), 3)
    assert _kept(cfg, ()).sparsities == (held,) and _kept(cfg, (round(held, 2),)).sparsities == (round(held, 2),)
    assert _kept(cfg, (held, held)).sparsities == (held,)  # the same one twice is one
    for given in (["--sparsity", "0.9"], [], ["--sparsity", "0.5"], ["--sparsity", str(held), "--sparsity", "0.9"]):
        result = runner.invoke(app, ["run", "--weights", str(dense if not given else pruned), "--prune", "keep",
                                     *given, "--artifacts", str(tmp_path / "art")])
        # keep prunes nothing: no file without zeros, and no run named for a sparsity its file does not hold
        said = (f"pruned.safetensors: --prune keep keeps the zeros its layers hold, a share of {held:g}, and prunes "
                f"nothing: leave --sparsity out, or give {held:g}, not {' '.join(given[1::2])}") if given else (
                "dense.safetensors: --prune keep keeps the zeros its layers hold, and its 2,048 weights searched hold none")
        assert result.exit_code == 2 and said in " ".join(result.output.split()), result.output
        assert "Traceback" not in result.output and not (tmp_path / "art" / "runs").exists()
    result = runner.invoke(app, ["run", "--weights", str(dense), "--prune", "keep", "--sparsity", "0.9",
                                 "--artifacts", str(tmp_path / "art")])
    assert result.exit_code == 2 and "hold none" in result.output  # a sparsity given is no way past it


def test_a_sharded_checkpoint_is_searched_as_one_model(tmp_path):
    """Hugging Face's sharded layout: its folder or its index is one model, every shard's layers
    searched under the folder's name (the reader called the index a damaged safetensors header);
    one shard given alone is searched with a warning that it is part of a model."""
    import json

    import numpy as np
    import pyarrow.parquet as pq
    from safetensors.numpy import save_file

    folder = tmp_path / "tiny-bert"
    folder.mkdir()
    rng = np.random.default_rng(0)
    weight_map = {}
    for i in (1, 2):
        shard = f"model-0000{i}-of-00002.safetensors"
        save_file({f"layer{i}.dense.weight": rng.standard_normal((16, 16)).astype(np.float32)}, str(folder / shard))
        weight_map[f"layer{i}.dense.weight"] = shard
    (folder / "model.safetensors.index.json").write_text(json.dumps({"weight_map": weight_map}))
    for given in (folder, folder / "model.safetensors.index.json"):
        art = tmp_path / f"art-{given.name}"
        run = runner.invoke(app, ["run", "--weights", str(given), "--until", "extract", "--sparsity", "0.5",
                                  "--artifacts", str(art)])
        assert run.exit_code == 0 and "is shard" not in run.output, run.output
        rows = [r for f in (art / "01_shapes").glob("*.parquet") for r in pq.read_table(f).to_pylist()]
        assert sorted((r["model"], r["layer"]) for r in rows) == [("tiny_bert", "layer1.dense.weight"),
                                                                    ("tiny_bert", "layer2.dense.weight")]
    one = runner.invoke(app, ["run", "--weights", str(folder / "model-00001-of-00002.safetensors"), "--until", "extract",
                              "--sparsity", "0.5", "--artifacts", str(tmp_path / "art")])
    assert one.exit_code == 0 and "model-00001-of-00002.safetensors is shard 1 of 2 of a checkpoint: only its layers " \
                                  "are searched; to search the model, give its folder" in " ".join(one.output.split()), \
        one.output
    (folder / "model.safetensors.index.json").unlink()
    refused = runner.invoke(app, ["run", "--weights", str(folder), "--until", "extract", "--artifacts", str(tmp_path / "x")])
    assert refused.exit_code == 2 and "2 safetensors files (model-00001-of-00002.safetensors, " \
                                      "model-00002-of-00002.safetensors) and no index" in " ".join(refused.output.split()), \
        refused.output


def test_lospmm_kernel_writes_the_runs_dtype_unless_told(tmp_path):
    """`lospmm kernel` on a half run wrote an fp32 kernel unless given --dtype: its default is now the run's
    kernels' dtype (its --dtype, else its weights file's), fp32 for the zoo."""
    import numpy as np
    from safetensors.numpy import save_file

    from lospmm.cli import _run_dtype

    half = tmp_path / "half.safetensors"
    save_file({"fc.weight": np.ones((8, 8), np.float16)}, str(half))
    record = {"run_id": "r", "config": {"zoo": [], "weights": str(half), "dtype": ""}}
    assert _run_dtype(record) == "fp16"
    assert _run_dtype({**record, "config": {**record["config"], "dtype": "bf16"}}) == "bf16"
    assert _run_dtype({"run_id": "z", "config": {"zoo": ["shufflenetv2"], "weights": None, "dtype": ""}}) == "fp32"
    half.unlink()
    with pytest.raises(ValueError, match="half.safetensors cannot be read to know its kernels' dtype; give --dtype"):
        _run_dtype(record)


def test_lospmm_kernel_finds_a_layer_in_the_one_model_of_the_run_that_holds_it_or_asks_which(tmp_path):
    """A run of several models: `lospmm kernel --layer fc` read the artifacts of whichever model came last,
    and so another model's layer of the same name; now the layer's model is found, or asked for."""
    common = ["--artifacts", str(tmp_path / "art")]
    run = runner.invoke(app, ["run", "--zoo", "shufflenetv2", "--zoo", "resnet50", "--until", "extract", *common])
    assert run.exit_code == 0, run.output
    out = ["--out", str(tmp_path / "k"), *common]

    def said(*args: str) -> str:
        result = runner.invoke(app, ["kernel", *args, *out])
        assert result.exit_code == 2, result.output
        return " ".join(result.output.split())

    assert ("--layer 'fc' is in 2 of the run's models: shufflenetv2 (fc), resnet50 (fc); give --model"
            in said("--layer", "fc", "--m1", "1", "--n1", "32"))
    assert "(--until extract): it has no reorder artifact" in said("--layer", "fc", "--model", "resnet50", "--m1", "1",
                                                                   "--n1", "32")
    assert "it has no emit artifact; --m1 and --n1 write" in said("--layer", "fc", "--model", "resnet50")
    assert "--model vgg16: not a model of run" in said("--layer", "fc", "--model", "vgg16")
    # text in one model's layer names alone needs no --model
    assert "(--until extract): it has no reorder artifact" in said("--layer", "layer4.1.conv2", "--m1", "1",
                                                                   "--n1", "32")
    assert "layer 'nope' is not in the run" in said("--layer", "nope")
    assert not (tmp_path / "k").exists()
