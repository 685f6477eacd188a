"""`lospmm` console script: run, rerun, inspect, kernel, train-ranker."""

from __future__ import annotations

import os
import shutil
import sys
from pathlib import Path
from typing import Optional

import typer
from rich.console import Console
from rich.markup import escape

try:  # typer vendors click from 0.2x on: its parse errors are its own copy's classes
    from typer._click import exceptions as parse_errors
except ImportError:  # pragma: no cover - an older typer on the released click
    from click import exceptions as parse_errors

from lospmm.flows.config import SHARD, ConfigError, RunConfig, read_design, resolved
from lospmm.flows.storage.runs import RunStatus
from lospmm.stages import STAGES
from lospmm.kernel.design import design_named
from lospmm.devices import DEVICES, device_named
from lospmm.stages.extract import ZOO_NAMES
from lospmm.stages.prune import run_sparsities

# GPU hosts are often offline; Prefect's server telemetry would log an ERROR on every run there.
# An explicit setting by the user still wins.
os.environ.setdefault("PREFECT_SERVER_ANALYTICS_ENABLED", "false")

app = typer.Typer(help="Sparsity-specialised SpMM kernels for pruned networks (LO-SpMM).",
                  no_args_is_help=True, add_completion=False)
# piped output (a log, a file): 240 columns, wide enough for the run summary's kernel column and caption, unless
# COLUMNS says otherwise (rich reads it when width is None)
console = Console(width=None if sys.stdout.isatty() or os.environ.get("COLUMNS") else 240)
# an error is one line, however long: never wrapped; its text as it is (a layer "a[0]" or "nm:x:4" no markup, no emoji)
err = Console(stderr=True, soft_wrap=True, emoji=False)

# Exit codes of `lospmm run` and `rerun` (README: "Exit codes").
EXIT_OK, EXIT_RUN_FAILED, EXIT_BAD_INPUT, EXIT_LAYERS_FAILED, EXIT_INTERRUPTED = 0, 1, 2, 3, 130

# Options that take several values after one flag: `--sparsity 0.5 0.7 0.9`.
_MULTI = ("--sparsity", "--zoo", "--m1")
# `lospmm run --help` in panels, in the order a user meets them
_MODEL_PANEL, _PRUNE_PANEL, _SEARCH_PANEL, _KERNEL_PANEL, _RUNNING_PANEL = (
    "The model", "Pruning", "The search", "The kernels", "Running")
_ARTIFACTS_HELP = "Artifact root directory."
_ARTIFACTS = typer.Option("artifacts", "--artifacts", help=_ARTIFACTS_HELP)


_EXITS_AFTER = [False]  # set by the console entry point: the process ends with the command


def main() -> None:
    """Entry point: lets list options take space-separated values, then runs the app. A command line
    click cannot parse (an unknown option, `--sparsity abc`) is answered as every other bad input: one
    line naming the command and the problem, exit 2 (typer's own answer is a box of several lines)."""
    _EXITS_AFTER[0] = True
    argv = _expanded(sys.argv[1:])
    try:
        code = app(args=argv, prog_name="lospmm", standalone_mode=False)
    except parse_errors.UsageError as e:
        where = e.ctx.command_path if e.ctx is not None else _command_path(argv)
        err.print(f"[red]error:[/] {escape(where)}: {escape(e.format_message().rstrip('.'))} (see {escape(where)} --help)")
        sys.exit(e.exit_code)
    except parse_errors.ClickException as e:  # a bad file argument and the like: click's own message, one line
        err.print(f"[red]error:[/] {escape(e.format_message())}")
        sys.exit(e.exit_code)
    except typer.Abort:  # end of input at a prompt (typer's own class, vendored click or not)
        err.print("[yellow]aborted[/]")
        sys.exit(1)
    # without standalone mode a typer.Exit (and Ctrl-C: 130) comes back as its code, a command's end as None
    sys.exit(code if isinstance(code, int) else 0)


def _command_path(argv: list[str]) -> str:
    """`lospmm` and the command argv names, for an error click raised without its context (an option
    missing its value)."""
    commands = typer.main.get_command(app).commands
    return "lospmm" + (f" {argv[0]}" if argv and argv[0] in commands else "")


def _expanded(argv: list[str]) -> list[str]:
    out, current = [], None
    for tok in argv:
        if tok.startswith("-"):
            current = tok if tok in _MULTI else None
            out.append(tok)
        elif current and out and out[-1] != current and not out[-1].startswith("-"):
            out += [current, tok]  # a further value of the same list option
        else:
            out.append(tok)
    return out


_DESIGN_HELP = ("Kernel design (issue 20), comma-separated tokens, each optional: tile-x|column-x (grid order), "
                "walks=W (column blocks a block walks), v=1|2|4 (columns per thread), based|chained (B addresses), "
                "baked|streamed (A's values as code or as data read by one loop), staged,tiles=G[,warps=W] (G tiles "
                "a block share B's columns through shared memory; N1 = 32·W), chained,slices=2|4|8 (a tile's columns "
                "walked by that many groups of N1 threads, summed through shared memory); half kernels: --dtype; 'chained' "
                "(default: it won the device's A/B) is "
                "tile-x,walks=1,v=1,chained; 'baseline' the kernel measured before it, tile-x,walks=1,v=1,based. A "
                "convolution takes its design's implicit-im2col kernel: the grid order, walks and v of a baked or "
                "streamed design (a half one's pair: two output pixels a thread), a sliced one's slices, a staged design's "
                "blocking, the N:M kernel's own, "
                "fp32 or half (the N:M kernel on sparse tensor cores: an im2col GEMM).")
_RUN_DESIGN_HELP = _DESIGN_HELP + (" 'auto': the design is a search dimension: each layer's candidates span the "
                                   "ten designs of the device's A/B (each with its own constraints and proxies), "
                                   "ranked together by the design-aware ranker (lospmm/models/ranker-designs), the "
                                   "emitted design the one the design price prices lowest (on the H100: fitted on "
                                   "its measured A/B; elsewhere the estimate); the default stays 'chained'.")

_RUN = RunConfig()  # the options' defaults are the run's, stated once (RunConfig)


@app.command()
def run(
    zoo: list[str] = typer.Option([], "--zoo", rich_help_panel=_MODEL_PANEL, help=f"Built-in model(s): {', '.join(ZOO_NAMES)}, or 'all'."),
    weights: Optional[Path] = typer.Option(None, "--weights", rich_help_panel=_MODEL_PANEL, help="safetensors checkpoint, or a sharded one (its folder or model.safetensors.index.json: the shards read as one model) (each 2-D float weight a linear layer; embeddings, buffers, norms, biases skipped with the reason; a config.json beside it is read; one saved by lospmm.torch.save_model carries each Linear's N and each Conv2d's geometry) or ONNX model (.onnx: MatMul/Gemm/Conv weights with the graph's shapes; the onnx extra)."),
    tokens: int = typer.Option(_RUN.tokens, "--tokens", rich_help_panel=_MODEL_PANEL, help="N (tokens: sequences × length) for --weights layers (an ONNX linear layer: where its graph leaves N symbolic; a checkpoint's pooler gets --batch)."),
    sparsity: list[float] = typer.Option([], "--sparsity", rich_help_panel=_PRUNE_PANEL, help=f"One or more sparsities in (0, 1) (default: "
                                         f"{' '.join(map(str, _RUN.sparsities))}; with --prune nm:N:M, 1 - N/M; with --prune keep, "
                                         f"the share of zeros the file's searched layers hold, the only one it "
                                         f"takes: keep prunes nothing)."),
    gpu: str = typer.Option(_RUN.gpu, "--gpu", rich_help_panel=_SEARCH_PANEL, help=f"Built-in device table: {', '.join(DEVICES)}."),
    seed: int = typer.Option(_RUN.seed, "--seed", rich_help_panel=_PRUNE_PANEL, help="Seed of the random pruning (the zoo's; `--prune random` on weights): the same seed, the same A."),
    prune: Optional[str] = typer.Option(None, "--prune", rich_help_panel=_PRUNE_PANEL, help="random | magnitude (per layer) | global (one threshold over the model) | keep (an already pruned checkpoint as it is; an N:M pattern in it is recorded) | nm:N:M (in every M weights along K the N largest kept; random positions for the zoo) | nm:N:M:V (V consecutive rows share each pattern, as NM-SpMM); default: random for the zoo, magnitude for weights."),
    batch: int = typer.Option(_RUN.batch, "--batch", rich_help_panel=_MODEL_PANEL, help="BERT batch size (sequences); also the N of a --weights checkpoint's pooler layers, which see one row per sequence (at most --tokens)."),
    seq_len: int = typer.Option(_RUN.seq_len, "--seq-len", rich_help_panel=_MODEL_PANEL, help="BERT sequence length."),
    cnn_batch: int = typer.Option(_RUN.cnn_batch, "--cnn-batch", rich_help_panel=_MODEL_PANEL, help="CNN batch size (an ONNX model's image "
                                  "inputs whose batch is symbolic take it, and the layers after their convolutions)."),
    image_size: int = typer.Option(_RUN.image_size, "--image-size", rich_help_panel=_MODEL_PANEL, help="The zoo CNNs' input height and width in pixels: it sets each convolution's N (output pixels × --cnn-batch)."),
    m1: list[int] = typer.Option(list(_RUN.m1s), "--m1", rich_help_panel=_SEARCH_PANEL, help="Candidate M1 values (rows per thread)."),
    th_row: float = typer.Option(_RUN.th_row, "--th-row", rich_help_panel=_SEARCH_PANEL, help="Load-balance threshold on COV_row."),
    th_col: float = typer.Option(_RUN.th_col, "--th-col", rich_help_panel=_SEARCH_PANEL, help="Load-balance threshold on WASTE_col."),
    verify: bool = typer.Option(_RUN.verify, "--verify", rich_help_panel=_KERNEL_PANEL, help="Run every compiled proxy on the host under AddressSanitizer."),
    timer: str = typer.Option(_RUN.timer, "--timer", rich_help_panel=_SEARCH_PANEL, help="auto (cuda with a GPU, else estimate) | estimate | cuda."),
    top_k: int = typer.Option(_RUN.top_k, "--top-k", rich_help_panel=_SEARCH_PANEL, help="Candidates the ranker passes on to proxy timing."),
    no_rank: bool = typer.Option(False, "--no-rank", rich_help_panel=_SEARCH_PANEL, help="Time every kept candidate (LO-SpMM without the ranker)."),
    ranker: Optional[Path] = typer.Option(None, "--ranker", rich_help_panel=_SEARCH_PANEL, help="Ranker model (from train-ranker); default: shipped."),
    jobs: int = typer.Option(_RUN.jobs, "--jobs", rich_help_panel=_RUNNING_PANEL, help="Threads for NVRTC and host checks (0 = every core)."),
    dask: str = typer.Option(_RUN.dask, "--dask", rich_help_panel=_RUNNING_PANEL, help="Dask scheduler address (tcp://host:8786): run the tasks and "
                             "kernel compiles on that cluster; workers must see --artifacts at the same path."),
    im2col: bool = typer.Option(False, "--im2col", rich_help_panel=_KERNEL_PANEL, help="Emit convolutions as GEMM kernels on the im2col matrix "
                                "(default: implicit-im2col kernels that read the NCHW input, where the geometry is known)."),
    no_nm_kernel: bool = typer.Option(False, "--no-nm-kernel", rich_help_panel=_KERNEL_PANEL, help="Serve N:M layers with the baked kernel of "
                                      "their searched tile only (default: the N:M kernel where the estimate "
                                      "prices it lower; a convolution's in its implicit-im2col form in fp32)."),
    design: str = typer.Option(_RUN.design, "--design", rich_help_panel=_KERNEL_PANEL, help=_RUN_DESIGN_HELP),
    input_shape: list[str] = typer.Option(list(_RUN.input_shapes), "--input-shape", rich_help_panel=_MODEL_PANEL, help="An ONNX model's input dims "
                                          "fixed before shape inference, as trtexec --shapes takes them: "
                                          "NAME:1x3x640x640 (repeatable): convolutions after a symbolic H/W get their sizes."),
    dtype: str = typer.Option(_RUN.dtype, "--dtype", rich_help_panel=_KERNEL_PANEL, help="The emitted kernels' B and C: fp32, fp16 or bf16 "
                              "(default: the weights' own; fp32 for the zoo and ONNX). Half kernels are searched as "
                              "half kernels (their own constraints, proxies, estimate and ranker); GEMM form with "
                              "the bias and activation fused; convolutions in implicit-im2col form too."),
    accumulate: str = typer.Option(_RUN.accumulate, "--accumulate", rich_help_panel=_KERNEL_PANEL, help="A half run's sums: packed (in the dtype, "
                                   "the default) or f32 (B converted, fp32 FMAs, rounded once at the store). A layer "
                                   "pruned 2:4 (at most 2 of every 4 columns) is also priced on sparse tensor cores "
                                   "(mma.sp, fp32 sums) and served there where cheaper."),
    promote_every: int = typer.Option(_RUN.promote_every, "--promote-every", rich_help_panel=_KERNEL_PANEL, help="A half run's packed sums moved "
                                      "into fp32 every K nonzeros of a row (0: never)."),
    reorder: str = typer.Option(",".join(_RUN.reorder), "--reorder", rich_help_panel=_SEARCH_PANEL, help="Candidate row orders per (layer, M1), "
                                "comma-separated; the one the estimate prices cheapest is kept, never above the "
                                "identity's Σ nnc: identity (always), algorithm1 (the paper's), partition "
                                "(Mt-KaHyPar), refine (row swaps from the best so far)."),
    reorder_budget: float = typer.Option(_RUN.reorder_budget, "--reorder-budget", rich_help_panel=_SEARCH_PANEL, help="The partitioner's priced "
                                         "seconds per layer, all its M1s together (0: not run)."),
    until: str = typer.Option(_RUN.until, "--until", rich_help_panel=_RUNNING_PANEL, help=f"Last stage to run: {', '.join(STAGES)}."),
    artifacts: str = typer.Option("artifacts", "--artifacts", rich_help_panel=_RUNNING_PANEL, help=_ARTIFACTS_HELP),
) -> None:
    """Run the pipeline over zoo models and/or a weights file."""
    if not zoo and weights is None:  # a search of BERT-base takes minutes: not started unasked
        _fail(f"lospmm run needs a model: --weights FILE (a safetensors checkpoint or an ONNX model) or --zoo NAME "
              f"({', '.join(ZOO_NAMES)}, or all), e.g. `lospmm run --zoo shufflenetv2 --sparsity 0.9`; "
              f"`lospmm run --help` lists every option")
    if "all" in zoo:
        zoo = list(ZOO_NAMES)
    # files as absolute paths: the run record must name them from any directory (`lospmm rerun`)
    cfg = RunConfig(zoo=tuple(zoo), weights=os.path.abspath(weights) if weights else None, tokens=tokens,
                    sparsities=run_sparsities(sparsity, prune, _RUN.sparsities), until=until, artifacts=artifacts, gpu=gpu, seed=seed,
                    prune=prune, batch=batch, seq_len=seq_len, cnn_batch=cnn_batch, image_size=image_size,
                    m1s=tuple(m1), th_row=th_row, th_col=th_col, verify=verify, timer=timer, top_k=top_k,
                    rank=not no_rank, ranker=str(ranker.resolve()) if ranker else None, jobs=jobs, dask=dask,
                    implicit_conv=not im2col, nm_kernel=not no_nm_kernel, design=design, input_shapes=tuple(input_shape), dtype=dtype,
                    accumulate=accumulate, promote_every=promote_every,
                    reorder=tuple(s.strip() for s in reorder.split(",") if s.strip()), reorder_budget=reorder_budget)
    if prune == "keep" and weights is not None:
        cfg = _kept(cfg, tuple(sparsity))
    shard = SHARD.search(weights.name) if weights is not None else None
    if shard:  # (a global threshold or kept share over part of a model would say so of the part only)
        err.print(f"[yellow]warning:[/] {weights.name} is shard {int(shard[1])} of {int(shard[2])} of a checkpoint: "
                  f"only its layers are searched; to search the model, give its folder (or its model.safetensors.index.json)")
    _run(cfg, refresh=[])


def _kept(cfg: RunConfig, given: tuple[float, ...]) -> RunConfig:
    """--prune keep: the run is named for the share of zeros the file's layers hold (as lt.search
    names it), not a default it does not hold; a --sparsity given must be that share."""
    from dataclasses import replace

    from lospmm.flows.inputs.layers import kept_run_sparsity

    try:
        source = next(s for s in resolved(cfg).sources if s.kind == "weights")
        return replace(cfg, sparsities=(kept_run_sparsity(source, given),))
    except (ConfigError, ValueError) as e:
        _fail(str(e))


@app.command("train-ranker")
def train_ranker_cmd(
    out: Optional[Path] = typer.Option(None, "--out", help="Model path stem: writes OUT.txt and OUT.json (default: "
                                       "ranker; with --measured, ranker-<device>-<driver> beside the results)."),
    samples: int = typer.Option(500, "--samples", help="Synthetic kernels (groups) drawn from Table 3's ranges, "
                                "N's and M1's wider (SyntheticParams)."),
    gpu: str = typer.Option(_RUN.gpu, "--gpu", help="Device table for constraints and the estimate timer."),
    timer: str = typer.Option(_RUN.timer, "--timer", help="auto | estimate | cuda (times every kept candidate)."),
    seed: int = typer.Option(_RUN.seed, "--seed", help="Seed of the synthetic layers and of LightGBM's training."),
    measured: list[Path] = typer.Option([], "--measured", help="Train on measured full-kernel times instead: a "
                                        "device's launch file(s) (benchmarks.device's kernel-speed-sample-*.parquet), held "
                                        "out by layer; the model is named for the device and driver (env.json beside "
                                        "the file) unless --out is given."),
    dtype: str = typer.Option("fp32", "--dtype", help="The kernels it ranks: fp32, or half kernels (fp16, bf16: "
                              "one packed pair per thread; the shipped lospmm/models/ranker-half is fp16's)."),
    accumulate: str = typer.Option("", "--accumulate", help="A half kernel's sums: packed (default) or f32."),
    designs: str = typer.Option("", "--designs", help="A design-aware ranker: 'auto' (the designs `run --design "
                                "auto` searches) or design labels split by ';', 'auto' among them for those "
                                "('auto;staged,tiles=8': the shipped lospmm/models/ranker-designs adds three staged "
                                "designs). Each synthetic kernel's tiles in every design are one group, ranked on "
                                "Table 1's features and the design's (a staged one's tiles a block and warps a tile)."),
) -> None:
    """Build the ranker's training set by timing synthetic kernels (or from measured launch files), fit
    LambdaMART, write a model."""
    from rich.progress import Progress

    from lospmm.flows.config import resolved_timer, source_design, trained_designs
    from lospmm.flows.training import train_measured_ranker, train_ranker
    from lospmm.kernel.design import BASELINE

    if measured:
        if dtype != "fp32" or accumulate:
            _fail("--measured trains on the launch files' own kernels (fp32 so far): --dtype and --accumulate "
                  "do not apply")
        try:
            base, meta = train_measured_ranker(out, measured, seed)
        except (ValueError, OSError) as e:
            _fail(str(e))
        cv = meta["leave_one_layer_out"]
        console.print(f"wrote {base.with_suffix('.txt')} and {base.with_suffix('.json')} (version {meta['version']}): "
                      f"{meta['samples']} measured kernels on {meta.get('device') or 'an unnamed device'}; each of "
                      f"{cv['after']['layers']} layers held out in turn: NDCG@10 {cv['before']['ndcg_at_10']:.3f} → "
                      f"{cv['after']['ndcg_at_10']:.3f}, top-1 mean loss {cv['before']['top1_mean_loss']:.1%} → "
                      f"{cv['after']['top1_mean_loss']:.1%} (shipped → measured)")
        return

    try:
        timer_ = resolved_timer(timer, device_named(gpu))
        if samples < 10:
            raise ConfigError(f"--samples must be >= 10, got {samples}")
        if dtype not in ("fp32", "fp16", "bf16"):
            raise ConfigError(f"--dtype {dtype!r}: choose fp32, fp16 or bf16")
        if accumulate and dtype == "fp32":
            raise ConfigError("--accumulate is a half ranker's (--dtype fp16 or bf16)")
        # fp32: the run's default design (what a run's ranker ranks); half: the baseline's half form, whose
        # model reaches the cheapest chained half kernel as well as models trained on chained ones do
        # (benchmarks.ranker_reach on the chained fp16 design, 2026-11-27: mean loss 0.04% against 0.19% and
        # 0.09% for two seeds trained on chained; worst 3.1% against 17% and 9.4%)
        design = design_named(_RUN.design) if dtype == "fp32" else source_design(BASELINE, dtype, accumulate)
        searched = trained_designs(designs)
        if searched and dtype != "fp32":
            raise ConfigError("--designs ranks fp32 kernels' designs (a half kernel has one grid so far)")
    except (ConfigError, ValueError) as e:
        _fail(str(e))
    with Progress(console=err, transient=True) as progress:
        bar = progress.add_task(f"timing synthetic kernels ({timer_.name})", total=samples)
        out = out or Path("ranker")
        meta = train_ranker(out, samples, timer_, seed,
                            progress=lambda done, total: progress.update(bar, completed=done), design=design,
                            designs=searched)
    kind = f"design {meta['design']}" if "design" in meta else f"{len(meta['designs'])} designs"
    console.print(f"wrote {out.with_suffix('.txt')} and {out.with_suffix('.json')} (version {meta['version']}): "
                  f"timer {meta['timer']}, device {meta['device']}, {kind}, "
                  f"{meta['synthetic_kernels']} kernels, "
                  f"{meta['samples']} timed candidates; held-out NDCG@10 {meta['heldout_ndcg_at_10']:.3f}, "
                  f"true best in top-10 {meta['heldout_top10_hit_rate']:.0%}")


@app.command()
def rerun(
    stage: str = typer.Option(..., "--stage", help=f"Stage to recompute with its dependants: {', '.join(STAGES)}."),
    run_id: Optional[str] = typer.Argument(None, help="Run to repeat (default: the latest)."),
    artifacts: str = _ARTIFACTS,
) -> None:
    """Recompute one stage and everything downstream of it for an earlier run's inputs."""
    from lospmm.flows.storage.runs import run_record

    if stage not in STAGES:
        _fail(f"--stage {stage!r}: choose one of {', '.join(STAGES)}")
    try:
        record = run_record(artifacts, run_id)
    except LookupError as e:
        _fail(str(e))
    cfg = RunConfig.from_dict({**record["config"], "artifacts": artifacts})
    stages = cfg.stages()
    if stage not in stages:
        _fail(f"run {record['run_id']} stopped at {cfg.until!r}; it has no {stage!r} stage")
    _run(cfg, refresh=list(stages[stages.index(stage):]))


@app.command()
def inspect(
    run_id: Optional[str] = typer.Argument(None, help="Run id (a unique prefix will do)."),
    stage: Optional[str] = typer.Option(None, "--stage", help="Show this stage's artifact contents."),
    layer: Optional[str] = typer.Option(None, "--layer", help="Only rows of layers containing this text."),
    rows: bool = typer.Option(False, "--rows", help="For constrain and reorder: the artifact's rows, not the per-layer summary."),
    limit: int = typer.Option(60, "--limit", help="Most rows to print per artifact."),
    all_columns: bool = typer.Option(False, "--all-columns", help="Every column except the list payloads."),
    artifacts: str = _ARTIFACTS,
) -> None:
    """List runs; a run's artifacts; or one stage's artifact contents."""
    from lospmm.flows.reports import inspection
    from lospmm.flows.storage.runs import damaged_records, run_record, run_records

    from lospmm.flows.storage.store import ArtifactError

    if run_id is None and stage is None and layer is None:
        records, damaged = run_records(artifacts), damaged_records(artifacts)
        if not records and not damaged:
            _fail(f"no runs under {Path(artifacts) / 'runs'}; start one with `lospmm run`")
        console.print(inspection.runs_table(records, damaged))
        return
    try:
        record = run_record(artifacts, run_id)
    except LookupError as e:
        _fail(str(e))
    if stage is not None and stage not in STAGES:
        _fail(f"--stage {stage!r}: choose one of {', '.join(STAGES)}")
    try:
        if stage is None:  # as the run ended, with what failed said (its exit code is the run's, not this one's)
            if not record.get("entries") and record.get("status") != RunStatus.COMPLETED:
                record = _with_artifacts_left(record, artifacts)
            _show_run(record, artifacts, root=artifacts, limit=limit, layer=layer)
            if layer is None:
                _exit_code(record, console)
            return
        for title, table in inspection.stage_tables(artifacts, record, stage, layer, rows, limit, all_columns):
            console.print(table)
            console.print(title, style="dim")
    except LookupError as e:  # --layer that names no layer of the run
        _fail(str(e))
    except ArtifactError as e:  # deleted or damaged since the run: say which, `lospmm rerun` recomputes it
        _fail(_rerun_hint(e, record["run_id"], artifacts, stage), code=1)


def _with_artifacts_left(record: dict, artifacts: str) -> dict:
    """A run that did not finish lists no tasks (its record gets them when its flow ends): its plan's
    tasks instead, each with the artifact it left (pipeline.artifacts_left)."""
    from lospmm.flows.pipeline import artifacts_left

    entries = artifacts_left(record, artifacts)
    if entries is None:
        err.print(f"run {record['run_id']}: its tasks are not recorded (it did not finish) and its plan cannot be "
                  f"made again here (its weights file moved or changed?)", style="yellow")
        return record
    kept = sum(e["state"] == "kept" for e in entries)
    console.print(f"run {record['run_id']} did not finish, so its record lists no tasks; planned again: {kept} of "
                  f"{len(entries)} tasks left their artifact (kept: running the same command again reuses them)",
                  style="dim", soft_wrap=True)
    return {**record, "entries": entries}


def _run_dtype(record: dict) -> str:
    """The dtype a run's kernels are in: its --dtype, else its weights file's (a half checkpoint's
    kernels are half), else fp32 (the zoo)."""
    from lospmm.flows.config import kernels_dtype

    cfg = record["config"]
    weights = cfg.get("weights") if not cfg.get("zoo") else None
    try:
        return kernels_dtype(cfg.get("dtype") or "", weights)
    except (OSError, ValueError):  # the file is gone: its kernels' dtype is not known here
        raise ValueError(f"run {record['run_id']}: its weights file {weights} cannot be read to know its kernels' "
                         f"dtype; give --dtype") from None


def _rerun_hint(error: Exception, run_id: str, artifacts: str, stage: str | None = None) -> str:
    """An artifact deleted or damaged since its run (ArtifactError), and the `lospmm rerun` that
    recomputes it: its stage `stage`, else the one whose folder the message names."""
    from lospmm.flows.reports.inspection import lospmm_command
    from lospmm.stages import STAGE_LAYERS

    stage = stage or next((name for name, folder in STAGE_LAYERS.items() if f"/{folder}/" in str(error)), "extract")
    return f"{error}; `{lospmm_command({}, 'rerun', '--stage', stage, run_id, root=artifacts)}` recomputes it"


@app.command()
def kernel(
    run_id: Optional[str] = typer.Argument(None, help="Run (default: the latest)."),
    layer: str = typer.Option(..., "--layer", help="Layer name as in the run's artifacts, or text in only one layer's name."),
    m1: Optional[int] = typer.Option(None, "--m1", help="Rows per thread (an M1 the run reordered for); a baked "
                                     "kernel's tile, with --n1. Without --m1, --n1 and --design: the kernel the run "
                                     "served the layer with (its tile, design, form and dtype), written again and "
                                     "checked."),
    n1: Optional[int] = typer.Option(None, "--n1", help="Threads per tile (a multiple of 32; a staged or sliced "
                                     "block has several tiles' or slices' worth)."),
    sparsity: Optional[float] = typer.Option(None, "--sparsity", help="Needed when the run has several."),
    model: Optional[str] = typer.Option(None, "--model", help="The run's model the layer is in: needed where "
                                        "several hold it (a run of --zoo all: each CNN has an fc)."),
    out: Path = typer.Option(Path("kernel"), "--out", help="Kernel directory to write."),
    compile_: bool = typer.Option(True, "--compile/--no-compile", help="Compile with NVRTC (compile cache)."),
    verify: bool = typer.Option(True, "--verify/--no-verify", help="Check on the host against scipy (ASan build)."),
    implicit_conv: bool = typer.Option(False, "--implicit-conv", help="For a convolution: read the NCHW input "
                                       "directly (no im2col matrix), write NCHW output; checked against a "
                                       "reference convolution."),
    relu: bool = typer.Option(False, "--relu", help="Fuse ReLU into the kernel (after the bias and activation the run fuses, if any)."),
    design: Optional[str] = typer.Option(None, "--design", show_default=False, help=_DESIGN_HELP + " Here `nm` "
                                         "too: the N:M kernel of a layer pruned N:M (A compressed, B through shared "
                                         "memory; its blocking the estimate's cheapest, no --m1/--n1). Default here: "
                                         "the run's --design (under auto, chained)."),
    dtype: Optional[str] = typer.Option(None, "--dtype", help="fp32, or a half kernel: fp16 or bf16 (B and C in "
                                        "that dtype, A's values rounded to it; two columns per thread, one packed "
                                        "FMA per nonzero); default: the run's kernels' dtype."),
    accumulate: Optional[str] = typer.Option(None, "--accumulate", help="A half kernel's sums: packed (in the "
                                             "dtype), f32 (B converted, fp32 FMAs, rounded once at the store) or, with "
                                             "--design nm, mma (the N:M kernel on sparse tensor cores: mma.sp, fp32 "
                                             "sums; a layer keeping at most 2 of every 4 columns); default: the run's."),
    promote_every: Optional[int] = typer.Option(None, "--promote-every", help="A packed half sum moved into fp32 "
                                                "every K nonzeros of a row (0: never); default: the run's."),
    artifacts: str = _ARTIFACTS,
) -> None:
    """Write the full Alg. 2 kernel of one layer and tile: kernel.cu, kernel.cubin and kernel.json (by
    default the kernel the run served the layer with)."""
    from lospmm.flows.kernels import served_kernel, write_full_kernel
    from lospmm.flows.storage.runs import run_record
    from lospmm.flows.storage.store import ArtifactError
    from lospmm.flows.config import source_design

    existed = out.exists()
    if existed and not out.is_dir():
        _fail(f"--out {out}: a file is there; a kernel is a directory (give a new path, or a kernel directory "
              f"to replace)")
    if existed and any(out.iterdir()) and not (out / "kernel.json").exists():
        _fail(f"--out {out}: a directory of other files, not a kernel directory (give a new path, or a kernel "
              f"directory to replace)")
    served = None
    try:
        if dtype not in (None, "fp32", "fp16", "bf16"):
            raise ValueError(f"--dtype {dtype}: choose fp32, fp16 or bf16")
        as_served = design is None and m1 is None and n1 is None  # the run's own kernel of the layer
        if as_served:
            for given, flag in ((dtype, "--dtype"), (accumulate, "--accumulate"), (promote_every, "--promote-every")):
                if given is not None:
                    raise ValueError(f"{flag}: the kernel the run served is in its own number format; give --design "
                                     f"(with --m1 and --n1 for a baked one) to write another")
        asked = _asked_design(design, m1, n1) if design is not None else None  # before any run is read
        record = run_record(artifacts, run_id)
        cfg = record["config"]  # what the run's kernels were, where not told otherwise
        if as_served:
            served = served_kernel(artifacts, record, layer, sparsity, model)
            if implicit_conv and not served.implicit_conv:
                raise ValueError(f"--implicit-conv: the run served {served.layer} by a GEMM kernel ({served.label}); "
                                 f"give --m1 and --n1 for an implicit-im2col kernel of a tile")
            layer, sparsity, implicit_conv, model = served.layer, served.sparsity, served.implicit_conv, served.model
            m1, n1, kernel_design = served.m1, served.n1, served.design
        else:
            if asked is None:  # the run's, but auto searched designs per layer: its default then
                design = cfg.get("design") or _RUN.design
                asked = _asked_design(_RUN.design if design == "auto" or not read_design(design).tiled else design,
                                      m1, n1)
            kernel_design = source_design(asked, dtype or _run_dtype(record),
                                          (cfg.get("accumulate") or "packed") if accumulate is None else accumulate,
                                          (cfg.get("promote_every") or 0) if promote_every is None else promote_every)
            m1, n1 = m1 or 0, n1 or 0
        facts = write_full_kernel(artifacts, record, layer, m1, n1, str(out), sparsity, compile_, verify,
                                  implicit_conv, relu, kernel_design, nm_tiling=served and served.nm_tiling,
                                  model=model)
    except (LookupError, ValueError) as e:
        _fail(str(e))
    except (OSError, ArtifactError) as e:  # e.g. a read-only root whose compile cache lacks this kernel
        if not existed:  # no half-written kernel directory is left behind
            shutil.rmtree(out, ignore_errors=True)
        if isinstance(e, ArtifactError):  # an artifact of the run deleted or damaged since: its rerun rebuilds it
            _fail(_rerun_hint(e, record["run_id"], artifacts), code=EXIT_RUN_FAILED)
        in_cache = isinstance(e, OSError) and e.filename and \
            Path(e.filename).resolve().is_relative_to((Path(artifacts) / "compile-cache").resolve())
        _fail(f"{type(e).__name__}: {e}" + ("; the compile cache under --artifacts must be writable to build a "
                                              "kernel it lacks (or pass --no-compile)" if in_cache else ""),
              code=EXIT_RUN_FAILED)
    _kernel_written(facts, out, m1, n1, kernel_design, implicit_conv, served, relu)


def _asked_design(design: str, m1: int | None, n1: int | None):
    """`lospmm kernel`'s design (fp32: --dtype makes it half), with the tile its kernel needs, or none where
    it picks its own blocking; ValueError naming what is wrong."""
    kernel_design = read_design(design)
    if kernel_design.half:
        raise ValueError(f"--design {design}: give a half kernel's dtype and sums with --dtype, --accumulate "
                         f"and --promote-every")
    if kernel_design.tiled and (m1 is None or n1 is None):
        raise ValueError("--m1 and --n1: the tile of the kernel (an M1 the run reordered for, and threads per "
                         "block; `lospmm inspect RUN --stage emit` shows each layer's), or neither with no --design "
                         "for the kernel the run served")
    if not kernel_design.tiled and (m1 is not None or n1 is not None):
        raise ValueError(f"--design {design}: its kernel picks its own blocking; leave out --m1 and --n1")
    return kernel_design


def _kernel_written(facts: dict, out: Path, m1: int, n1: int, kernel_design, implicit_conv: bool, served=None,
                    relu: bool = False) -> None:
    """`lospmm kernel`'s report of the kernel it wrote (exit 1 where its host check failed); `served`: the
    run's kernel it wrote again (flows.kernels.ServedKernel), whose name it must have unless --relu changed it."""
    from lospmm.kernel.check import CheckResult

    if served is not None:
        same = facts["kernel"] == served.kernel
        console.print(f"the kernel the run served {served.layer} with at sparsity {served.sparsity:g}: {served.label}"
                      + ("" if same or relu else f" [yellow](written again it is {facts['kernel']}, served as "
                                                 f"{served.kernel}: the code changed since the run?)[/]")
                      + (" (with --relu fused)" if relu else ""))
    c = facts.get("compile", {})
    console.print(f"[bold]{facts['kernel']}[/] → {out}/  {kernel_design.dtype} M={facts['m']} K={facts['k']} nnz={facts['nnz']} "
                  + (f"N:M {facts['nm']['label']}" if facts.get("nm") else f"tile=({m1},{n1})")
                  + f" design {facts['design']['label']} grid " + (" × ".join(str(facts['grid'][a]) for a in "xyz")
                                                                      if isinstance(facts['grid'], dict) else str(facts['grid'])))
    if c:
        console.print(f"compile: {c['status']}, {c['registers']} registers, {c['spill_stores']} B spilled, "
                      f"{c['seconds']:.1f} s{' (from cache)' if c['from_cache'] else ''}")
    if not facts.get("host_check"):
        return
    check = CheckResult.of_facts(facts["host_check"])
    against = ("the float64 product of the same rounded A and B" if kernel_design.dtype != "fp32"
               else "a reference convolution" if implicit_conv else "scipy")
    if not check.ok:
        err.print(f"[red]host check vs {against} FAILED:[/] {check.message}")
        raise typer.Exit(1)
    if facts.get("rounding"):  # a half kernel's A, rounded to its dtype
        r = facts["rounding"]
        console.print(f"{kernel_design.dtype} ({facts['precision']['accumulate']} sums): {r['to_zero']} of A's {r['nnz']} values "
                      f"round to zero and are not baked, {r['subnormal']} are subnormal")
    console.print(f"host check vs {against}: {check.metric.replace('_', ' ')} {check.error:.2e} (bound {check.bound:.2e})")


def _run(cfg: RunConfig, refresh: list[str]) -> None:
    try:
        plan = resolved(cfg)  # the one validation: the flow gets the typed plan
    except ConfigError as e:
        _fail(str(e))
    from lospmm.flows.pipeline import new_run_id, run_plan

    from prefect.exceptions import TerminationSignal

    from lospmm.flows.execution.server import api_start_failure, detach_embedded_api
    from lospmm.flows.execution.stopping import record_ended, stops_cleanly
    from lospmm.flows.execution.taskio import Interrupted, run_failure

    run_id = new_run_id()
    console.print(f"[bold]lospmm run {run_id}[/] → {Path(cfg.artifacts).resolve()}"
                  + (f"  (recomputing: {', '.join(refresh)})" if refresh else ""))
    try:
        def at_once() -> None:  # a second Ctrl-C: out now, the record saying cancelled (not killed), one line
            ended = record_ended(plan.root, run_id, RunStatus.CANCELLED)
            err.print(f"[yellow]cancelled at once:[/] run {run_id}" + ("; finished artifacts are kept and running the "
                      "same command again resumes from them" if ended else ""))

        with stops_cleanly(exit_code_on_second=EXIT_INTERRUPTED, on_second=at_once):
            result = run_plan(plan, refresh=refresh, run_id=run_id, before_flow=detach_embedded_api)
    # Ctrl-C; SIGTERM as Prefect re-raises it in a flow run; a task's stop, as Prefect re-raises it
    except (KeyboardInterrupt, TerminationSignal, Interrupted):
        if _EXITS_AFTER[0]:  # (in-process, `app(...)` in a notebook or a test, the caller's handlers stay)
            _out_at_once_on_another_signal(at_once)
        if record_ended(plan.root, run_id, RunStatus.CANCELLED):
            err.print(f"[yellow]cancelled:[/] run {run_id} stopped; finished artifacts are kept and running the "
                      f"same command again resumes from them")
        else:
            err.print(f"[yellow]cancelled:[/] run {run_id} stopped before it started; nothing was written")
        raise typer.Exit(EXIT_INTERRUPTED) from None
    except Exception as e:  # escaped the flow: the record must not stay `running`
        line = run_failure(e) or api_start_failure(e)
        record_ended(plan.root, run_id, RunStatus.FAILED, line or f"{type(e).__name__}: {e}")
        if line is None:
            raise  # a bug: its traceback says where
        _fail(f"run {run_id} failed: {line}", code=EXIT_RUN_FAILED)
    if result.get("error"):  # the run could not go on (a full disk): nothing more to show
        _fail(f"run {run_id} failed: {result['error']}", code=EXIT_RUN_FAILED)
    from lospmm.flows.storage.runs import run_record

    record = run_record(cfg.artifacts, result["run_id"])
    _show_run(record, cfg.artifacts)
    raise typer.Exit(_exit_code(record))


def _out_at_once_on_another_signal(first) -> None:
    """The run stopped, and the process is on its way out (Prefect's exit stops its API, up to
    seconds): a second Ctrl-C now exits at once after `first()`, as one during the stop does, not
    with a traceback of whatever the exit was doing."""
    import signal

    def out(signum, frame):
        try:
            first()
        finally:
            os._exit(EXIT_INTERRUPTED)

    for s in (signal.SIGINT, signal.SIGTERM):
        signal.signal(s, out)


def _show_run(record: dict, artifacts: str, root: str | None = None, limit: int | None = None,
              layer: str | None = None) -> None:
    """A run as `run` ends and `inspect RUN` shows it: its tasks, the layers with problems, the tensors
    skipped and the per-layer summary (`layer`: its rows only; `root`: each artifact checked since)."""
    from lospmm.flows.reports import inspection

    summary = inspection.summary_table(artifacts, record, **({} if limit is None else {"limit": limit}), layer=layer)
    console.print(inspection.run_table(record, root=root))
    if layer is None:
        problems = inspection.problems_table(record)
        if problems is not None:
            console.print(problems)
        skipped = inspection.skipped_line(record)  # expected, on a clean run too: a line, not a problem table
        if skipped is not None:
            console.print(skipped, style="dim", soft_wrap=True)
    if summary is not None:
        console.print(summary)
    if layer is None:  # after the summary, where the run's last lines stay in view
        for line in record.get("pruned_again", []):  # a pruned checkpoint without --prune keep (summary.pruned_again_lines)
            console.print(line, style="yellow", soft_wrap=True, markup=False)


# a run's outcome (inspection.run_outcome) as `run`'s exit code, and the colour of its line
_OUTCOMES = {"ok": (EXIT_OK, ""), "layers": (EXIT_LAYERS_FAILED, "yellow"), "failed": (EXIT_RUN_FAILED, "red")}


def _exit_code(record: dict, console_: Console | None = None) -> int:
    """0: every requested layer produced what was asked; 3: some (or all) did not, the rest are
    kept; 1: the run itself failed (a task crashed). The reason goes to `console_` (stderr)."""
    from lospmm.flows.reports.inspection import run_outcome

    outcome, line = run_outcome(record)
    code, colour = _OUTCOMES[outcome]
    if line:
        (console_ or err).print(line, style=colour, soft_wrap=True, markup=False)
    return code


def _fail(message: str, code: int = EXIT_BAD_INPUT) -> None:
    err.print(f"[red]error:[/] {escape(message)}")
    raise typer.Exit(code)


if __name__ == "__main__":
    main()
