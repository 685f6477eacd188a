"""Every device target of the open issues against the committed results: one row per target, what
it asks, the figure measured (with how many kernels, layers or models it rests on, and the step
folder it comes from) and whether it is met. A target no committed result covers says `not
measured` and names the step that measures it: nothing here is estimated. A figure from a step cut
off before its last launch (`[partial]`: no done.json) or from the layers a model was fitted on
(`in-sample`) is provisional: its yes is counted apart from a met target.

    python -m benchmarks.device verdict [--device h100] [--markdown]

The targets are issue 30's (fp32 against cuBLAS, half, end to end, the search's Table 4), issue
34's (N:M against NM-SpMM's ratios, cuSPARSELt and our unstructured kernel) and issue 35's (the
design chosen per layer). They are judged on the device each issue names (the H100); another
device's rows (`--device h200`) are the same figures on that card. Results under the program's
folders only (benchmarks/results/<device>/<step>/): the plan before the program (gpu-h100/)
measured kernels three design generations old.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from benchmarks import analysis

# issue 30's fp32 targets by sparsity: geomean speedup over cuBLAS SGEMM on the work-bound layers
SGEMM_TARGETS = {0.7: 1.5, 0.9: 4.0, 0.95: 7.0}
EFFICIENCY_TARGET = 0.5  # median per-nonzero efficiency at each of those sparsities
NEVER_SLOWER_FROM = 0.8  # never slower than SGEMM at this sparsity or above
PEAK_TARGET = 30.0  # % of FP32 peak in useful FLOP/s on the largest layers
HALF_TARGETS = {0.9: 1.0, 0.95: 1.5}  # fp16 over cuBLAS FP16
END_TO_END_TARGETS = {"eager": 1.5, "graph": 2.0}  # over the dense fp32 model, ResNet-50 and BERT-base at 0.9
END_TO_END_MODELS = ("resnet50", "bert")  # benchmarks.end_to_end's names (its --models)
END_TO_END_BATCHES = (8, 32)
TABLE4_LOSS = 0.02  # mean loss at every sparsity
TABLE4_SPARSITIES = (0.5, 0.7, 0.9, 0.95)
PARTIAL = " [partial]"  # a step folder's mark in `from` when its step has no done.json


def largest_layer(model: str, layer: str) -> bool:
    """Issue 30's largest layers: BERT's FFN (intermediate.dense and the FFN's output.dense, not the
    attention's) and ResNet-50's layer4."""
    if model == "bert-base":
        return bool(re.search(r"\.intermediate\.dense$|\.output\.dense$", layer)) and ".attention." not in layer
    return model == "resnet50" and layer.startswith("layer4.")


@dataclass(frozen=True)
class Found:
    """The launch rows of a device's step folders, and which folders they came from."""

    rows: list
    folders: tuple[str, ...]

    @property
    def partial(self) -> bool:
        """Whether a step it read was cut off before its last launch (its figures may still move)."""
        return any(f.endswith(PARTIAL) for f in self.folders)

    def source(self, count: int, unit: str) -> str:
        return f"{count} {unit} ({', '.join(self.folders)})" if self.folders else ""

    def __add__(self, other: "Found") -> "Found":
        return Found(self.rows + other.rows, self.folders + other.folders)


def found(results: Path, device: str, steps: tuple[str, ...], kind: str = "kernel-speed") -> Found:
    """Every `kind`-*.parquet row under results/<device>/<step>/ for `steps` (names, or a prefix
    ending in '*'), with the folders that had any."""
    import pyarrow.parquet as pq

    from benchmarks.device import with_plan_columns

    rows, folders = [], []
    base = Path(results) / device
    for step in steps:
        for folder in sorted(base.glob(step)) if step.endswith("*") else [base / step]:
            files = sorted(folder.glob(f"{kind}*.parquet"))
            got = [r for f in files for r in pq.read_table(f).to_pylist()]
            if got:
                rows += got
                # a step cut off before its last launch has no done.json (a run cut off removes it)
                folders.append(f"{device}/{folder.name}" + ("" if (folder / "done.json").exists() else PARTIAL))
    return Found(with_plan_columns(rows) if kind == "kernel-speed" else rows, tuple(folders))


def row(issue: str, target: str, goal: str, measured: str = "", met: bool | None = None, source: str = "",
        step: str = "", provisional: str = "") -> dict:
    """One verdict row; `met` None: not measured (then `source` names the step that measures it).
    `provisional` says why a figure may not stand ("partial": its step was cut off; "in-sample": the
    layers it was fitted on): `met` reads "yes, partial" or "no, in-sample" and the tally keeps a
    provisional yes apart from a met target."""
    verdict = "not measured" if met is None else "yes" if met else "no"
    return {"issue": issue, "target": target, "goal": goal, "measured": measured or "-",
            "met": f"{verdict}, {provisional}" if provisional and met is not None else verdict,
            "from": source or (f"run {step}" if step else "-")}


def _partial(found_: "Found") -> str:
    return "partial" if found_.partial else ""


def _fmt(x: float, digits: int = 3) -> str:
    return f"{x:.{digits}g}" if math.isfinite(x) else "-"


def fp32_rows(results: Path, device: str) -> list[dict]:
    """Issue 30's fp32 targets from the headline steps (every zoo layer, the flow's own kernels)."""
    got = found(results, device, ("headline-*",))
    gemm = [r for r in got.rows if r.get("set") == "headline" and r.get("role", "full") == "full"]
    summary = {s["sparsity"]: s for s in analysis.headline_summary(gemm) if s["scope"] == "work-bound"}
    models = ", ".join(sorted({r["model"] for r in gemm}))
    unit = f"work-bound layers × batches of {models}"
    out = []
    for s, speedup in SGEMM_TARGETS.items():
        got_s = summary.get(s)
        if got_s is None:
            out += [row("30", f"fp32 per-nonzero efficiency at {s:g}, median", f"≥ {EFFICIENCY_TARGET:g}",
                        step="headline-*"),
                    row("30", f"fp32 vs cuBLAS SGEMM at {s:g}, geomean", f"≥ {speedup:g}×", step="headline-*")]
            continue
        src = got.source(got_s["layers"], unit)
        out += [row("30", f"fp32 per-nonzero efficiency at {s:g}, median", f"≥ {EFFICIENCY_TARGET:g}",
                    _fmt(got_s["efficiency (median)"]), got_s["efficiency (median)"] >= EFFICIENCY_TARGET, src,
                    provisional=_partial(got)),
                row("30", f"fp32 vs cuBLAS SGEMM at {s:g}, geomean", f"≥ {speedup:g}×",
                    f"{_fmt(got_s['vs SGEMM (geomean)'])}×", got_s["vs SGEMM (geomean)"] >= speedup, src,
                    provisional=_partial(got))]
    high = [s for s in summary.values() if s["sparsity"] >= NEVER_SLOWER_FROM]
    if high:
        slower = sum(s["slower than SGEMM"] for s in high)
        total = sum(s["layers"] for s in high)
        out.append(row("30", f"fp32 never slower than SGEMM at ≥ {NEVER_SLOWER_FROM:g}", "0 slower",
                       f"{slower} of {total} slower", slower == 0, got.source(total, unit), provisional=_partial(got)))
    else:
        out.append(row("30", f"fp32 never slower than SGEMM at ≥ {NEVER_SLOWER_FROM:g}", "0 slower", step="headline-*"))
    out.append(peak_row(gemm, got, device))
    return out


def peak_row(gemm: list[dict], got: Found, device: str) -> dict:
    """The largest layers' share of FP32 peak: the lowest over their work-bound kernels, per sparsity
    (the target holds where every one of them reaches it)."""
    from lospmm.devices import device_named

    gpu = device_named(device if device in ("h100", "h200") else "h100")
    peak = analysis.fp32_peak_flops(gpu)
    kernels = [r for r in gemm if largest_layer(r["model"], r["layer"]) and r.get("status") == "ok"
               and float(r.get("sgemm_us") or 0) >= analysis.WORK_BOUND_US and math.isfinite(float(r["ours_us"]))]
    target = "fp32 largest layers (BERT FFN, ResNet-50 layer4), % of FP32 peak in useful FLOP/s, lowest per sparsity"
    if not kernels:
        return row("30", target, f"≥ {PEAK_TARGET:g}%", step="headline-resnet50, headline-bert-base")
    shares: dict = {}
    for r in kernels:
        shares.setdefault(r["sparsity"], []).append(100 * analysis.useful_flops(r) / peak)
    text = ", ".join(f"{s:g}: {min(v):.1f}% (max {max(v):.1f}%)" for s, v in sorted(shares.items()))
    models = ", ".join(sorted({r["model"] for r in kernels}))
    return row("30", target, f"≥ {PEAK_TARGET:g}%", text, all(min(v) >= PEAK_TARGET for v in shares.values()),
               got.source(len(kernels), f"work-bound kernels of {models}"), provisional=_partial(got))


def half_rows(results: Path, device: str) -> list[dict]:
    """Issue 23's targets (through issue 30): fp16 against cuBLAS FP16, in the sums issue 23's rule
    chooses (the fastest meeting the accuracy bar on every kernel), and that bar."""
    got = found(results, device, ("half",))
    half = analysis.half_rows(got.rows)
    chosen = analysis.chosen_accumulation(half, "fp16")
    fp16 = [r for r in half if r.get("dtype") == "fp16"]
    out = []
    if not fp16:
        return [row("30", f"fp16 vs cuBLAS FP16 at {s:g}, geomean", f"≥ {t:g}×", step="half")
                for s, t in HALF_TARGETS.items()] + [row("30", "fp16 error within 2× cuBLAS FP16's", "every kernel",
                                                         step="half")]
    label = chosen or "none meets the accuracy bar"
    summary = {(s["kernels"], s["sparsity"]): s for s in analysis.half_summary(fp16)}
    for s, t in HALF_TARGETS.items():
        target = f"fp16 vs cuBLAS FP16 at {s:g}, geomean (sums: {label}"
        if not chosen:  # no sums are accurate enough to serve: the speed target fails with them
            out.append(row("30", target + ")", f"≥ {t:g}×", "no fp16 sums meet the accuracy bar", False,
                           got.source(len(fp16), "kernels"), provisional=_partial(got)))
            continue
        got_s = summary.get((chosen, s))
        if got_s is None or not got_s["work-bound"]:
            out.append(row("30", target + ")", f"≥ {t:g}×", step="half"))
            continue
        value = got_s["vs cuBLAS same dtype (geomean, work-bound)"]
        out.append(row("30", f"{target}; cuBLAS ≥ {analysis.HALF_WORK_BOUND_US:g} µs)", f"≥ {t:g}×",
                       f"{_fmt(value)}×", value >= t, got.source(got_s["work-bound"], "kernels"),
                       provisional=_partial(got)))
    # issue 23's rule chooses only sums within the bar on every kernel they ran, so the row counts them all
    checked = [r for r in fp16 if r.get("cublas_max_rel_error") is not None]
    tried = list(dict.fromkeys(r["accumulate"] for r in checked))
    meeting = [a for a in tried
               if all(r["max_rel_error"] <= 2 * r["cublas_max_rel_error"] for r in checked if r["accumulate"] == a)]
    out.append(row("30", "fp16 error within 2× cuBLAS FP16's on the same data", "every kernel, in the sums served",
                   f"sums within on every kernel: {', '.join(meeting) or 'none'} (of {', '.join(tried)})",
                   bool(meeting), got.source(len(checked), "kernels"), provisional=_partial(got)))
    return out


def end_to_end_rows(results: Path, device: str) -> list[dict]:
    """Issue 22's targets (through issue 30): ResNet-50 and BERT-base at 0.9, batch 8 and 32, our
    served model over the dense fp32 one, eagerly and under CUDA graphs."""
    got = found(results, device, ("serving",), kind="end-to-end")
    rows = [r for r in got.rows if r.get("baseline") == "fp32" and r.get("dtype", "fp32") == "fp32"
            and abs(float(r.get("sparsity") or 0) - 0.9) < 1e-6 and r.get("model") in END_TO_END_MODELS
            and r.get("batch") in END_TO_END_BATCHES]
    out = []
    for mode, goal in END_TO_END_TARGETS.items():
        # a mode the runner could not time (NaN) is a case not measured, never a speedup
        xs = [r for r in rows if r.get("mode") == mode and math.isfinite(float(r.get("ours_ms") or "nan"))
              and math.isfinite(float(r.get("dense_ms") or "nan")) and float(r["ours_ms"]) > 0]
        target = f"end to end at 0.9 ({', '.join(END_TO_END_MODELS)}, batch {' and '.join(map(str, END_TO_END_BATCHES))}) " \
                 f"over the dense fp32 model, {'eagerly' if mode == 'eager' else 'under CUDA graphs'}, lowest"
        if not xs:
            out.append(row("30", target, f"≥ {goal:g}×", step="serving"))
            continue
        speedups = {(r["model"], r["batch"]): r["dense_ms"] / r["ours_ms"] for r in xs}
        lowest = min(speedups.values())
        missing = len(END_TO_END_MODELS) * len(END_TO_END_BATCHES) - len(speedups)
        text = ", ".join(f"{m} b{b}: {v:.2f}×" for (m, b), v in sorted(speedups.items()))
        out.append(row("30", target, f"≥ {goal:g}×", text + (f" ({missing} cases not measured)" if missing else ""),
                       lowest >= goal and not missing, got.source(len(speedups), "cases"), provisional=_partial(got)))
    return out


def table4_rows(results: Path, device: str) -> list[dict]:
    """Issue 24's target (through issue 30): the search's mean loss over Table 4's layers at every
    sparsity, for the measured proxies' choice (`--timer cuda`) and the estimate's (`--timer estimate`)."""
    out = []
    for s in TABLE4_SPARSITIES:
        got = found(results, device, (f"table4-{s:g}",))
        launches = [r for r in got.rows if r.get("set") == "sample"]
        rows = analysis.table4_rows(launches) if launches else []
        for chooser, column in (("the measured proxies' choice (--timer cuda)", "proxy_loss"),
                                ("the estimate's choice (--timer estimate)", "estimate_loss")):
            losses = [r[column] for r in rows if math.isfinite(r[column])]
            target = f"search at {s:g}: Table 4 mean loss, {chooser}"
            if not losses:
                out.append(row("30", target, f"≤ {TABLE4_LOSS:.0%}", step=f"table4-{s:g}"))
                continue
            mean = float(np.mean(losses))
            # a layer whose chosen tile has no measured full kernel is no loss figure: said, not averaged
            short = len(rows) - len(losses)
            out.append(row("30", target, f"≤ {TABLE4_LOSS:.0%}", f"{mean:.1%} (worst {max(losses):.1%})"
                           + (f"; {short} of {len(rows)} layers without the chosen tile's time" if short else ""),
                           mean <= TABLE4_LOSS and not short, got.source(len(losses), "layers"),
                           provisional=_partial(got)))
    return out


def nm_rows(results: Path, device: str) -> list[dict]:
    """Issue 34's targets: NM-SpMM's A100 ratios over SGEMM at N:32 (NM-SpMM's shapes and the zoo's
    work-bound layers, our fp32 N:M choice), fp16 2:4 on sparse tensor cores against cuSPARSELt 2:4,
    and an N:M layer never slower than our kernel on the same layer pruned at random."""
    spmm = found(results, device, ("nm-spmm",))
    zoo = found(results, device, ("nm",))
    shapes = [r for r in analysis.nm_spmm_summary(spmm.rows) if r["cores"] == "CUDA (fp32)"]
    layers = analysis.nm_summary(zoo.rows)
    out = []
    for n, goal in analysis.NM_TARGETS.items():
        pattern = f"{n}:32"
        # a pattern reads N:M, or N:M:V with vectors of V rows sharing it
        speedups = [r["vs SGEMM"] for r in shapes + layers
                    if str(r["pattern"]).split(":")[:2] == [str(n), "32"] and math.isfinite(r["target"])
                    and math.isfinite(r["vs SGEMM"])]
        target = f"N:M {pattern} vs cuBLAS SGEMM, geomean over work-bound shapes and layers (fp32)"
        if not speedups:
            out.append(row("34", target, f"≥ {goal:g}×", step="nm-spmm, nm"))
            continue
        value = analysis.geomean(speedups)
        out.append(row("34", target, f"≥ {goal:g}×", f"{_fmt(value)}× (worst {_fmt(min(speedups))}×)", value >= goal,
                       (spmm + zoo).source(len(speedups), "kernels"), provisional=_partial(spmm + zoo)))
    tensor = [r for r in analysis.nm_spmm_summary(spmm.rows) if r["cores"] == "tensor (fp16)"
              and math.isfinite(r["cuSPARSELt fp16 / ours"])]
    tensor_layers = [r["cuSPARSELt fp16 / tensor-core kernel"] for r in layers
                     if math.isfinite(r["cuSPARSELt fp16 / tensor-core kernel"])]
    ratios = [r["cuSPARSELt fp16 / ours"] for r in tensor] + tensor_layers
    target = "fp16 2:4 on sparse tensor cores vs cuSPARSELt 2:4 (cuSPARSELt's time over ours), lowest"
    if ratios:
        out.append(row("34", target, "≥ 1× on every shape", f"{_fmt(min(ratios))}× (geomean {_fmt(analysis.geomean(ratios))}×)",
                       min(ratios) >= 1.0, (spmm + zoo).source(len(ratios), "shapes"), provisional=_partial(spmm + zoo)))
    else:
        out.append(row("34", target, "≥ 1× on every shape", step="nm-spmm, nm"))
    versus = [r["served / random"] for r in layers if math.isfinite(r["served / random"])]
    target = "an N:M layer never slower than our unstructured kernel at the same sparsity (served / random)"
    if versus:
        slower = sum(v > 1.0 for v in versus)
        out.append(row("34", target, "0 slower", f"{slower} of {len(versus)} slower (worst {max(versus):.2f}×)",
                       slower == 0, zoo.source(len(versus), "layer × pattern"), provisional=_partial(zoo)))
    else:
        out.append(row("34", target, "0 slower", step="nm"))
    return out


def design_rows(results: Path, device: str) -> list[dict]:
    """Issue 35's targets on the layers the design price never saw (designs-held-out), else on the
    A/B layers (in-sample: the price's form and overlap were chosen on them, though each layer is held
    out of the factors' fit in turn): `--design auto`'s choice within 5% of the best measured design
    on ≥ 80% of layers, and its geomean over the best single design. Priced offline by
    benchmarks.design_estimate on the measured launches, every design on one tile a layer."""
    from benchmarks.design_estimate import price_verdicts

    out = []
    for step, file, note, provisional in (
            ("designs-held-out", "kernel-speed-ab-held-out.parquet", "layers the design price never saw", ""),
            ("designs", "kernel-speed-ab.parquet", "the A/B layers, each held out of the factors' fit in turn",
             "in-sample")):
        folder = Path(results) / device / step
        path = folder / file
        verdicts = price_verdicts(path) if path.is_file() else []
        if not verdicts:
            continue
        # unseen layers: the shipped factors; the A/B: the factors refitted with each layer held out
        v = verdicts[0] if step == "designs-held-out" else verdicts[1]
        partial = "" if (folder / "done.json").exists() else "partial"
        why = ", ".join(x for x in (provisional, partial) if x)
        src = f"{v.get('layers', '?')} layers ({device}/{step}{PARTIAL if partial else ''})"
        out += [row("35", f"--design auto within {analysis.CHOICE_WITHIN:.0%} of the best measured design ({note})",
                    f"≥ {analysis.CHOICE_LAYERS:.0%} of layers", f"{v['within 5% of the best']:.0%}",
                    v["within 5% of the best"] >= analysis.CHOICE_LAYERS, src, provisional=why),
                row("35", f"--design auto over the best single design, geomean ({note})",
                    f"≥ {analysis.CHOICE_GAIN:g}×", f"{_fmt(v['gain over the best single design'])}×",
                    v["gain over the best single design"] >= analysis.CHOICE_GAIN, src, provisional=why)]
        break
    if not out:
        out = [row("35", f"--design auto within {analysis.CHOICE_WITHIN:.0%} of the best measured design",
                   f"≥ {analysis.CHOICE_LAYERS:.0%} of layers", step="designs-held-out"),
               row("35", "--design auto over the best single design, geomean", f"≥ {analysis.CHOICE_GAIN:g}×",
                   step="designs-held-out")]
    return out


def verdict_rows(results: Path, device: str = "h100") -> list[dict]:
    """Every open issue's device target on `device`'s committed results, in the issues' order."""
    return (fp32_rows(results, device) + half_rows(results, device) + end_to_end_rows(results, device)
            + table4_rows(results, device) + nm_rows(results, device) + design_rows(results, device))


def tally(rows: list[dict]) -> str:
    """`met` counted: 'N met, N not met, N met provisionally, N not measured' (a provisional yes rests
    on a cut-off step or on the layers a model was fitted on; a no is a no either way)."""
    met = sum(r["met"] == "yes" for r in rows)
    provisional = sum(r["met"].startswith("yes,") for r in rows)
    missed = sum(r["met"] == "no" or r["met"].startswith("no,") for r in rows)
    unmeasured = sum(r["met"] == "not measured" for r in rows)
    return f"{met} met, {missed} not met, {provisional} met provisionally, {unmeasured} not measured"
