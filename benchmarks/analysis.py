"""Tables from device measurements, anywhere (pure functions over rows): the figures the issues
define — per-nonzero efficiency, speedups, the A/B decision, Table 4, the half set's accumulation
choice, the estimate's calibration — computed from the rows the device program (benchmarks.device)
writes. Nothing here needs a GPU."""

from __future__ import annotations

import math
import statistics
from collections.abc import Callable, Mapping

import numpy as np

from lospmm.kernel.design import design_named

WORK_BOUND_US = 15.0  # issue 30's work-bound layers: cuBLAS SGEMM at least this long at that N
HALF_WORK_BOUND_US = 10.0  # issue 23's work-bound layers: cuBLAS FP16 at least this long
FP32_SAME_TILE = "chained,v=2"  # our fp32 kernel with a half kernel's columns per thread: issue 23's comparison
STRATEGIES = ("proxies", "ranker", "estimate")  # Table 4's ways of choosing a layer's tile


def rows_table(rows: list[dict]):
    """Rows as a pyarrow table with every row's keys as columns (from_pylist takes the first row's
    alone: a failed launch first would lose every measured column), None where a row has none."""
    import pyarrow as pa

    columns = list(dict.fromkeys(k for r in rows for k in r))
    return pa.Table.from_pylist([{k: r.get(k) for k in columns} for r in rows])


# how print_table writes: rich on the terminal, or GitHub Markdown for the README
# (`python -m benchmarks.device report --markdown`)
TABLE_FORMATS = ("terminal", "markdown")
_table_format = ["terminal"]


def set_table_format(name: str) -> None:
    if name not in TABLE_FORMATS:
        raise ValueError(f"table format {name!r}: one of {', '.join(TABLE_FORMATS)}")
    _table_format[0] = name


def _cell(v) -> str:
    return f"{v:.3g}" if isinstance(v, float) else str(v if v is not None else "").replace("\n", " ")


def markdown_table(title: str, rows: list[dict]) -> str:
    """Rows as a GitHub Markdown table under its title in bold, every key a column (a `|` in a cell escaped)."""
    columns = list(dict.fromkeys(k for r in rows for k in r))
    if not columns:
        return f"**{title}**\n\n(no rows)\n"
    line = lambda cells: "| " + " | ".join(c.replace("|", "\\|") for c in cells) + " |"  # noqa: E731
    return "\n".join([f"**{title}**", "", line(columns), line(["---"] * len(columns)),
                      *(line([_cell(r.get(c)) for c in columns]) for r in rows)]) + "\n"


def print_table(title: str, rows: list[dict]) -> None:
    """Rows as a table, every key a column: on the terminal (rich), or as Markdown (set_table_format)."""
    if _table_format[0] == "markdown":
        print(markdown_table(title, rows))
        return
    from rich.console import Console
    from rich.table import Table

    table = Table(title=title)
    columns = list(dict.fromkeys(k for r in rows for k in r))
    for c in columns:
        table.add_column(c)
    from rich.markup import escape

    for r in rows:  # a cell's own brackets ("[partial]") are text, not rich markup
        table.add_row(*[escape(_cell(v)) for v in (r.get(c) for c in columns)])
    Console(width=200).print(table)


# --- statistics ------------------------------------------------------------------------------------


def geomean(values) -> float:
    v = np.asarray([x for x in values if np.isfinite(x) and x > 0], np.float64)
    return float(np.exp(np.log(v).mean())) if len(v) else float("nan")


def spearman(x, y) -> float:
    """Spearman's rank correlation of the finite pairs (nan with fewer than 3)."""
    from scipy.stats import spearmanr

    x, y = np.asarray(x, np.float64), np.asarray(y, np.float64)
    ok = np.isfinite(x) & np.isfinite(y)
    if ok.sum() < 3 or np.ptp(x[ok]) == 0 or np.ptp(y[ok]) == 0:
        return float("nan")
    return float(spearmanr(x[ok], y[ok]).statistic)


def within_layer_spearman(rows: list[dict], key: str) -> float:
    """Mean over layers of Spearman's correlation between `key` and the measured time: how well
    `key` ranks one layer's candidates, which is what the search asks of it."""
    values = []
    for layer in sorted({(r["model"], r["layer"]) for r in rows}):
        mine = [r for r in rows if (r["model"], r["layer"]) == layer]
        s = spearman([r[key] for r in mine], [r["ours_us"] for r in mine])
        if np.isfinite(s):
            values.append(s)
    return float(np.mean(values)) if values else float("nan")


# --- kernel speed (issues 20 and 30) ----------------------------------------------------------------


def efficiency(r: dict) -> float:
    """Per-nonzero efficiency: our useful FLOP/s over cuBLAS SGEMM's dense FLOP/s on the same shape."""
    return r["nnz"] * r["sgemm_us"] / (r["m"] * r["k"] * r["ours_us"])


def measured_us(row: dict | None, key: str = "ours_us") -> float:
    """A row's time in µs under `key`, NaN where the row or a finite time is missing (a launch that
    failed is no figure)."""
    t = (row or {}).get(key)
    return float(t) if isinstance(t, (int, float)) and math.isfinite(t) else float("nan")


def fp32_peak_flops(device) -> float:
    """The device's FP32 peak in FLOP/s: an FMA (two FLOPs) on every lane each cycle."""
    return device.sms * device.fp32_lanes_per_sm * 2 * device.clock_ghz * 1e9


def useful_flops(r: dict) -> float:
    """A launch's useful FLOP/s: two for each nonzero of A and column of B, over its measured time."""
    return 2.0 * r["nnz"] * r["n"] / (float(r["ours_us"]) * 1e-6)


def work_bound_kernel(r: dict) -> bool:
    """A measured full kernel (with its tiles' work) of a layer where SGEMM takes WORK_BOUND_US or more."""
    return (r.get("status") == "ok" and r.get("role", "full") == "full" and r.get("tile_loads") is not None
            and float(r.get("sgemm_us") or 0) >= WORK_BOUND_US and math.isfinite(float(r["ours_us"])))


def headline_summary(rows: list[dict], peak_tflops: float = 66.9) -> list[dict]:
    """Per sparsity over the work-bound rows (SGEMM ≥ 15 µs; the fastest design of each layer and N):
    median per-nonzero efficiency, geomean speedup over SGEMM, TF32 and FP16, slower-than-SGEMM count,
    and the largest layers' share of FP32 peak; then the same over every row."""
    best: dict = {}
    for r in rows:
        if r.get("status") == "ok" and r.get("sgemm_us") and math.isfinite(r["ours_us"]):
            key = (r["model"], r["layer"], r["sparsity"], r["n"])
            if key not in best or r["ours_us"] < best[key]["ours_us"]:
                best[key] = r
    out = []
    for scope, keep in (("work-bound", lambda r: r["sgemm_us"] >= WORK_BOUND_US), ("all", lambda r: True)):
        for s in sorted({r["sparsity"] for r in best.values()}):
            xs = [r for r in best.values() if r["sparsity"] == s and keep(r)]
            if not xs:
                continue
            useful = [useful_flops(r) / 1e12 for r in xs]
            out.append({"scope": scope, "sparsity": s, "layers": len(xs),
                        "efficiency (median)": float(np.median([efficiency(r) for r in xs])),
                        "vs SGEMM (geomean)": geomean([r["sgemm_us"] / r["ours_us"] for r in xs]),
                        "vs TF32": geomean([r["tf32_us"] / r["ours_us"] for r in xs if r.get("tf32_us")]),
                        "vs FP16": geomean([r["fp16_us"] / r["ours_us"] for r in xs if r.get("fp16_us")]),
                        "slower than SGEMM": sum(r["ours_us"] > r["sgemm_us"] for r in xs),
                        "% FP32 peak (max)": 100 * max(useful) / peak_tflops})
    return out


def ab_summary(rows: list[dict]) -> list[dict]:
    """Per A/B layer: today's kernel's µs and each design's time over it (< 1: faster)."""
    by_layer: dict = {}
    for r in rows:
        if r.get("set") == "ab":
            by_layer.setdefault((r["model"], r["layer"]), {})[r["design"]] = r
    baseline = design_named("baseline").label
    out = []
    for (model, layer), designs in by_layer.items():
        base = designs.get(baseline, {}).get("ours_us", float("nan"))
        out.append({"model": model, "layer": layer, "baseline_us": base,
                    **{d: designs[d]["ours_us"] / base for d in designs if d != baseline}})
    return out


def reorder_summary(rows: list[dict], nnc: Mapping[str, tuple[int, int]]) -> tuple[list[dict], float]:
    """Issue 33's device step: per A/B layer, each row order's µs and Σ nnc (`nnc`: kernel id ->
    (Σ nnc, max nnc), from the planned tiles), the kept order's time over Algorithm 1's and whether
    it is slower by more than the two spreads; and the Pearson correlation, over every (layer,
    order), of time against Σ nnc, each over its layer's Algorithm 1 kernel."""
    by_layer: dict = {}
    for r in rows:
        if r.get("set") == "reorder" and r.get("role", "full") == "full":
            by_layer.setdefault((r["model"], r["layer"]), {})[r["order"]] = r
    out, xs, ys = [], [], []
    for (model, layer), orders in by_layer.items():
        alg1 = orders.get("algorithm1")
        row = {"model": model, "layer": layer}
        for name, r in orders.items():
            row[f"{name}_us"] = r["ours_us"]
            row[f"{name}_nnc_sum"], row[f"{name}_max_nnc"] = nnc.get(r["id"], (float("nan"), float("nan")))
        if alg1 is not None and "kept" in orders:
            kept = orders["kept"]
            row["kept_over_alg1"] = kept["ours_us"] / alg1["ours_us"]
            band = (kept.get("spread") or 0.0) + (alg1.get("spread") or 0.0)
            row["slower_beyond_spread"] = bool(row["kept_over_alg1"] > 1 + band)
            for name, r in orders.items():
                xs.append(row[f"{name}_nnc_sum"] / row["algorithm1_nnc_sum"])
                ys.append(r["ours_us"] / alg1["ours_us"])
        out.append(row)
    x, y = np.asarray(xs, np.float64), np.asarray(ys, np.float64)
    ok = np.isfinite(x) & np.isfinite(y)
    corr = float(np.corrcoef(x[ok], y[ok])[0, 1]) if ok.sum() >= 3 and np.ptp(x[ok]) and np.ptp(y[ok]) else float("nan")
    return out, corr


# issue 34's targets: NM-SpMM's A100 speedups over cuBLAS SGEMM at N:32, beaten
NM_TARGETS = {16: 1.9, 12: 2.5, 8: 3.6, 4: 6.5}


def nm_summary(rows: list[dict]) -> list[dict]:
    """Issue 34's device step: per layer and N:M pattern, our baked kernel and our N:M kernel (design
    nm) on the N:M layer, the faster of the two (`served`: what a measured choice serves) against our
    kernel on the same layer pruned at random to the same sparsity, against SGEMM with the target
    (NM-SpMM's ratio at N:32, work-bound layers only: SGEMM ≥ WORK_BOUND_US), and cuSPARSELt's 2:4
    (fp16 and TF32) over ours; where the pattern fits sparse tensor cores, our fp16 kernel there
    (`tensor_core_us`, not among the fp32 kernels `served` picks from) and cuSPARSELt fp16 over it."""
    by: dict = {}
    for r in rows:
        if r.get("set") == "nm" and r.get("role", "full") == "full":
            tokens = str(r.get("design", "")).split(",")
            kind = "mma-kernel" if "acc=mma" in tokens else "nm-kernel" if "nm" in tokens else "baked"
            by.setdefault((r["model"], r["layer"], r["sparsity"]), {})[(r.get("prune") or "random", kind)] = r

    us = measured_us
    out = []
    for (model, layer, sparsity), kinds in sorted(by.items()):
        rand = us(kinds.get(("random", "baked")))
        for pattern in sorted({p for p, _ in kinds if p != "random"}):
            baked, kernel = kinds.get((pattern, "baked")), kinds.get((pattern, "nm-kernel"))
            tensor = kinds.get((pattern, "mma-kernel"))
            some = baked or kernel or tensor
            times = [t for t in (us(baked), us(kernel)) if math.isfinite(t)]
            served = min(times) if times else float("nan")
            n, m = (int(x) for x in pattern.split(":")[1:3])
            sgemm = float(some.get("sgemm_us") or float("nan"))
            work_bound = math.isfinite(sgemm) and sgemm >= WORK_BOUND_US
            speedup = sgemm / served
            target = NM_TARGETS.get(n, float("nan")) if m == 32 and work_bound else float("nan")
            out.append({"model": model, "layer": layer, "pattern": pattern[3:], "sparsity": sparsity,
                        "baked_us": us(baked), "nm_kernel_us": us(kernel), "random_us": rand,
                        "served": "nm kernel" if times and served == us(kernel) else "baked" if times else "",
                        "served / random": served / rand, "vs SGEMM": speedup, "target": target,
                        "meets": bool(math.isfinite(target) and speedup >= target),
                        "cuSPARSELt fp16 / ours": float(some.get("cusparselt_fp16_us") or float("nan")) / served,
                        "cuSPARSELt TF32 / ours": float(some.get("cusparselt_tf32_us") or float("nan")) / served,
                        "tensor_core_us": us(tensor),
                        "cuSPARSELt fp16 / tensor-core kernel":
                            float((tensor or some).get("cusparselt_fp16_us") or float("nan")) / us(tensor)})
    return out


def nm_spmm_summary(rows: list[dict]) -> list[dict]:
    """NM-SpMM's comparison (set nm-spmm): per LLaMA-like shape, tokens and pattern, our N:M kernel
    against SGEMM with NM-SpMM's A100 ratio as the target (work-bound shapes), and cuSPARSELt's 2:4
    over ours (2:4 in fp16 on sparse tensor cores too: variant mma, cuSPARSELt's own case); where a
    32-column stage was measured beside a deeper chosen one (variant stage-32), and
    that stage copying whole chunks beside a gathering one (variant whole-chunk), their times over the
    chosen one's."""
    def us(r) -> float:
        t = (r or {}).get("ours_us")
        return float(t) if (r or {}).get("status") == "ok" and isinstance(t, (int, float)) else float("nan")

    own = [r for r in rows if r.get("set") == "nm-spmm" and r.get("variant", "") in ("", "mma")]
    beside = {(r["variant"], r["layer"], r["n"], r.get("prune")): r for r in rows
              if r.get("set") == "nm-spmm" and r.get("variant") in ("stage-32", "whole-chunk")}
    out = []
    for r in sorted(own, key=lambda r: (r["layer"], r["n"], r["sparsity"])):
        n_of_m = int(str(r["prune"]).split(":")[1])
        ours = us(r)
        sgemm = float(r.get("sgemm_us") or float("nan"))
        work_bound = math.isfinite(sgemm) and sgemm >= WORK_BOUND_US
        speedup = sgemm / ours
        target = NM_TARGETS.get(n_of_m, float("nan")) if work_bound else float("nan")
        shallow, whole = (beside.get((v, r["layer"], r["n"], r.get("prune"))) for v in ("stage-32", "whole-chunk"))
        out.append({"shape": r["layer"], "tokens": r["n"], "pattern": str(r["prune"])[3:],
                    "cores": "tensor (fp16)" if r.get("variant") == "mma" else "CUDA (fp32)", "ours_us": ours,
                    "sgemm_us": sgemm, "vs SGEMM": speedup, "target": target,
                    "meets": bool(math.isfinite(target) and speedup >= target),
                    "cuSPARSELt fp16 / ours": float(r.get("cusparselt_fp16_us") or float("nan")) / ours,
                    "stage-32 / chosen": us(shallow) / ours if shallow else float("nan"),
                    "whole-chunk / chosen": us(whole) / ours if whole else float("nan"),
                    "status": r.get("status"), "message": r.get("message", "")})
    return out


# issue 35's device targets for `--design auto`
CHOICE_WITHIN = 0.05  # the design the estimate chooses within 5% of the best measured one
CHOICE_LAYERS = 0.80  # on at least 80% of the layers
CHOICE_GAIN = 1.2  # and the chosen designs' geomean 1.2× faster than the best single design


def reuse_summary(rows: list[dict], device) -> list[dict]:
    """Work-bound full kernels (SGEMM ≥ WORK_BOUND_US) by how many multiply-adds each B load feeds
    (Σ tile_fmas / Σ tile_loads): their useful FLOP/s as a share of `device`'s FP32 peak, beside the
    share B's 4-byte loads allow through L2 at `device.l2_gbps` (every load from L2: a block's B
    columns, K × N1 floats, do not fit L1) and through L1 at 128 B per SM-cycle."""
    peak = fp32_peak_flops(device)
    buckets = ((0.0, 1.1), (1.1, 1.5), (1.5, 2.5), (2.5, float("inf")))
    by: dict = {b: [] for b in buckets}
    for r in filter(work_bound_kernel, rows):
        loads, fmas = float(np.sum(r["tile_loads"])), float(np.sum(r["tile_fmas"]))
        if loads > 0:
            share = useful_flops(r) / peak
            by[next(b for b in buckets if b[0] <= fmas / loads < b[1])].append((share, fmas / loads))
    out = []
    for (low, high), values in by.items():
        if not values:
            continue
        shares, per_load = sorted(v for v, _ in values), sorted(f for _, f in values)[len(values) // 2]
        # a load's 4 bytes feed `per_load` FMAs (2 FLOPs each)
        l2 = device.l2_gbps * 1e9 / 4 * per_load * 2 / peak
        l1 = device.sms * 128 * device.clock_ghz * 1e9 / 4 * per_load * 2 / peak
        out.append({"fmas per B load": f"{low:g}-{high:g}", "kernels": len(values), "median fmas per load": per_load,
                    "% FP32 peak (median)": 100 * shares[len(shares) // 2], "% FP32 peak (max)": 100 * shares[-1],
                    "L2 allows (%)": 100 * min(1.0, l2), "L1 allows (%)": 100 * min(1.0, l1)})
    return out


def binding_terms(rows: list[dict], device, params=None) -> list[dict]:
    """Work-bound full kernels by the estimate's largest term on `device`: compute; memory, split
    into L2 and DRAM (the term again with L2 unbounded: unchanged, DRAM binds); latency; instruction
    fetch; or the longest tile's serial walk (the body past the other four), with the measured time
    over the estimate's (median)."""
    from dataclasses import replace

    from lospmm.kernel.estimate import EstimateParams, estimated_timing

    params = params or EstimateParams()
    no_l2_limit = replace(device, l2_gbps=float("inf"))
    by: dict = {}
    for r in filter(work_bound_kernel, rows):
        work = launch_work(r)
        t = estimated_timing(work, device, params)
        dram_only = estimated_timing(work, no_l2_limit, params).memory_us
        memory = "memory: DRAM" if math.isclose(dram_only, t.memory_us, rel_tol=1e-9) else "memory: L2"
        terms = {"compute": t.compute_us, memory: t.memory_us, "latency": t.latency_us, "fetch": t.fetch_us}
        top = max(terms, key=terms.get)
        if t.time_us - params.launch_us > terms[top] * (1 + 1e-9):  # the body is the longest tile's walk
            top = "longest tile"
        by.setdefault(top, []).append(float(r["ours_us"]) / t.time_us)
    return [{"bound by (estimate)": term, "kernels": len(v), "measured / estimate (median)": sorted(v)[len(v) // 2]}
            for term, v in sorted(by.items(), key=lambda kv: -len(kv[1]))]


LATENCY_REFERENCE = "prefetch-1,regs+0,O1"  # sets.LATENCY_VARIANTS[0]'s label (a test ties the two)
PREFETCH_REFERENCE = "prefetch-1"  # sets.prefetch_tiles_plan's flow kernel (a test ties the two)


def latency_summary(rows: list[dict]) -> list[dict]:
    """The latency A/B: per layer, each variant's time over the reference (the first of
    sets.LATENCY_VARIANTS: prefetch 1, the predicted registers, -O1) beside what the estimate
    predicted of it when the bundle was built (the launch rows' estimate_us), with its registers and
    spill bytes; then per variant the geomean over the layers, the worst layer and the largest spread."""
    return variant_summary(rows, "latency", LATENCY_REFERENCE)


def variant_summary(rows: list[dict], set_name: str, reference: str, estimate: bool = True,
                    models: dict | None = None) -> list[dict]:
    """An A/B of variants on the same layers (rows of `set_name`, keyed by `variant`): per layer each
    variant's time over the `reference` variant's (with the estimate's ratio the bundle recorded,
    `estimate`, and each of `models`' — {column name: an EstimateTimer} — recomputed from the launch's
    work at its compiled registers), registers and spills; then per variant the geomean over the
    layers, the worst layer and the largest spread."""
    def modelled(r: dict, timer) -> float:
        if r.get("tile_loads") is None:
            return float("nan")
        return float(estimated_timing(launch_work(r), timer.device, timer.params).time_us)

    from lospmm.kernel.estimate import estimated_timing

    by: dict = {}
    for r in rows:
        if r.get("set") == set_name and r.get("status") == "ok" and math.isfinite(float(r.get("ours_us") or "inf")):
            by.setdefault((r["model"], r["layer"]), {})[r["variant"]] = r
    out, ratios = [], {}
    for (model, layer), variants in sorted(by.items()):
        base = variants.get(reference)
        if base is None:
            continue
        for label, r in sorted(variants.items()):
            ratio = float(r["ours_us"]) / float(base["ours_us"])
            ratios.setdefault(label, []).append((ratio, max(float(r.get("spread") or 0), float(base.get("spread") or 0))))
            row = {"model": model, "layer": layer, "variant": label, "us": float(r["ours_us"]), "over reference": ratio}
            if estimate:
                row["estimate: over reference"] = float(r.get("estimate_us") or "nan") / float(base.get("estimate_us") or "nan")
            for name, timer in (models or {}).items():
                row[f"{name}: over reference"] = modelled(r, timer) / modelled(base, timer)
            out.append(row | {"registers": r.get("registers"), "spill_bytes": r.get("spill_bytes"),
                              "vs SGEMM": float(r.get("sgemm_us") or float("nan")) / float(r["ours_us"])})
    for label, values in sorted(ratios.items()):
        row = {"model": "all", "layer": f"{len(values)} layers", "variant": label,
               "over reference": geomean([v for v, _ in values])}
        if estimate:  # what the bundle's estimate said of the same layers, in geomean
            row["estimate: over reference"] = geomean([r["estimate: over reference"] for r in out
                                                       if r["variant"] == label and r["model"] != "all"])
        out.append(row | {"worst": max(v for v, _ in values), "largest spread": max(s for _, s in values)})
    return out


def prefetch_depth_summary(rows: list[dict]) -> list[dict]:
    """What loads in flight save on one tile (the prefetch-tiles step): per depth P, each layer's
    `prefetch-P` kernel over `prefetch-P-tile` (the same tile at depth 1), measured and as the bundle's
    estimate said, in geomean over the layers with both, with the least and most measured. The bundle's
    estimate divided a load's latency by (1 + P); on the H200 (2026-11-27) it said 0.60 and 0.45 at
    depths 4 and 8 where 0.90 and 0.83 were measured (the term is fitted to them since:
    benchmarks/prefetch_fit.py)."""
    by: dict = {}
    for r in rows:
        if r.get("set") == "prefetch-tiles" and r.get("status") == "ok" and math.isfinite(float(r.get("ours_us") or "inf")):
            by.setdefault((r["model"], r["layer"]), {})[r["variant"]] = r
    pairs: dict[int, list[tuple[float, float]]] = {}
    for variants in by.values():
        for label, r in variants.items():
            tile = variants.get(f"{label}-tile")
            if label.startswith("prefetch-") and tile is not None:
                pairs.setdefault(int(label.split("-")[1]), []).append(
                    (float(r["ours_us"]) / float(tile["ours_us"]),
                     float(r.get("estimate_us") or "nan") / float(tile.get("estimate_us") or "nan")))
    return [{"depth": depth, "layers": len(v), "measured: depth over depth 1, same tile (geomean)": geomean([m for m, _ in v]),
             "least": min(m for m, _ in v), "most": max(m for m, _ in v),
             "estimate (geomean)": geomean([e for _, e in v])} for depth, v in sorted(pairs.items())]


def conv_summary(rows: list[dict]) -> list[dict]:
    """The conv step (issues 13, 22, 35): per case, our implicit-im2col kernel against the GEMM kernel
    of the same A and tile on B already expanded (im2col's own time not counted; the implicit kernel
    also applies its case's epilogue, bias and ReLU on three of five, which the GEMM kernel does not),
    the streamed design's implicit-im2col kernel of the same tile, the staged design's (8 tiles of the
    same M1 a block, 32 pixels), the baked one of two pixels a thread (`v=2 / implicit`: below 1, V
    pays), the sliced one (`sliced / implicit`: below 1, more warps a tile pay), and cuDNN's dense convolution in fp32; where the case has them, the
    N:M conv kernel on its A pruned 2:4 (`nm_sparsity`) against the baked conv kernel of that A
    (`baked / N:M`: above 1, the N:M kernel is faster) and cuDNN, and in fp16 against cuDNN in fp16 and
    the fp32 N:M kernel (`N:M fp32 / fp16`); the tiled half conv kernel on the case's A in fp16 against
    cuDNN in fp16 and the fp32 one (`implicit / fp16`: above 1, fp16 is faster)."""
    kinds_of = {"im2col-gemm": "gemm", "streamed": "streamed", "staged": "staged", "nm": "nm", "nm-baked": "nm-baked",
                "nm-fp16": "nm-fp16", "v2": "v2", "sliced": "sliced", "fp16": "fp16"}
    by: dict = {}
    for r in rows:
        if r.get("set") == "conv":
            by.setdefault(r["layer"], {})[kinds_of.get(r.get("variant") or "", "conv")] = r

    def ratio(x: float, y: float) -> float:
        return x / y if y > 0 else float("nan")

    us = measured_us
    out = []
    for layer, kinds in sorted(by.items()):
        conv, gemm, streamed, staged, nm, nm_baked, nm_half, vector, sliced, half = (kinds.get(kind) for kind in (
            "conv", "gemm", "streamed", "staged", "nm", "nm-baked", "nm-fp16", "v2", "sliced", "fp16"))
        some = conv or gemm or streamed or staged or nm or nm_baked or nm_half or vector or sliced or half
        cudnn = us(conv, "cudnn_us")
        if math.isnan(cudnn):
            cudnn = us(nm, "cudnn_us")
        out.append({"case": layer, "m": some["m"], "k": some["k"], "n": some["n"],
                    "sparsity": (conv or gemm or streamed or staged or {}).get("sparsity", float("nan")),
                    "implicit_us": us(conv), "gemm_us": us(gemm), "implicit / gemm": ratio(us(conv), us(gemm)),
                    "streamed_us": us(streamed), "streamed / implicit": ratio(us(streamed), us(conv)),
                    "staged_us": us(staged), "staged / implicit": ratio(us(staged), us(conv)),
                    "v2_us": us(vector), "v=2 / implicit": ratio(us(vector), us(conv)),
                    "sliced_us": us(sliced), "sliced / implicit": ratio(us(sliced), us(conv)),
                    "fp16_us": us(half), "cuDNN fp16 / fp16": ratio(us(half, "cudnn_us"), us(half)),
                    "implicit / fp16": ratio(us(conv), us(half)),
                    "cudnn_us": cudnn, "cuDNN / implicit": ratio(cudnn, us(conv)),
                    "nm_sparsity": (nm or nm_baked or {}).get("sparsity", float("nan")),
                    "nm_us": us(nm), "nm_baked_us": us(nm_baked), "baked / N:M": ratio(us(nm_baked), us(nm)),
                    "cuDNN / N:M": ratio(cudnn, us(nm)),
                    "nm_fp16_us": us(nm_half), "cuDNN fp16 / N:M fp16": ratio(us(nm_half, "cudnn_us"), us(nm_half)),
                    "N:M fp32 / fp16": ratio(us(nm), us(nm_half)),
                    "spread (max)": max(float((r or {}).get("spread") or 0.0)
                                        for r in (conv, gemm, streamed, staged, nm, nm_baked, nm_half, vector, sliced,
                                                  half))})
    return out


def split_summary(rows: list[dict]) -> list[dict]:
    """The K split on the micro sweep's footprint tiles (issue 35): per tile, 16 walks over one walk
    without and with the split (a walk costs what one walk does at 16: no cliff), and the split's time
    over the unsplit one's at 16 walks (below 1: the split recovers part of the cliff)."""
    by: dict = {}
    for r in rows:
        if r.get("set") == "micro" and str(r.get("layer", "")).startswith("footprint-"):
            d = design_named(r["design"])
            key = "split" if d.section_fmas else f"walks={d.column_walks}"
            by.setdefault(r["layer"], {})[key] = r
    out = []
    for layer, kinds in sorted(by.items(), key=lambda kv: int(kv[0].split("-")[1])):
        one, sixteen, split = (measured_us(kinds.get(k)) for k in ("walks=1", "walks=16", "split"))
        if math.isnan(split):
            continue
        out.append({"tile": layer, "one walk µs": one, "16 walks µs": sixteen, "16 walks, split µs": split,
                    "16 / one": sixteen / one if one > 0 else float("nan"),
                    "16 split / one": split / one if one > 0 else float("nan"),
                    "split / unsplit": split / sixteen if sixteen > 0 else float("nan")})
    return out


def design_choice(rows: list[dict], rows_set: str = "ab") -> tuple[list[dict], dict]:
    """Issue 35's verdict on the design per layer: per layer of `rows_set` (each design of
    kernel.choices.DESIGN_CANDIDATES measured on one tile), the design the estimate prices lowest
    (the launch rows' `estimate_us`: the estimate alone, as the bundle was built, not the design price
    `--design auto` now serves by: benchmarks.design_estimate.price_verdicts) against the best measured, and in
    all: the share of layers where it is within CHOICE_WITHIN, and the chosen designs' geomean time
    over the best single design's (on the layers every design measured)."""
    by: dict = {}
    for r in rows:
        if r.get("set") == rows_set and r.get("role", "full") == "full" and r.get("status") == "ok" \
                and math.isfinite(r.get("ours_us") or math.inf):
            by.setdefault((r["model"], r["layer"]), {})[r["design"]] = r
    out, chosen_us, per_design = [], {}, {}
    for key, designs in sorted(by.items()):
        priced = {d: r["estimate_us"] for d, r in designs.items() if math.isfinite(r.get("estimate_us") or math.inf)}
        if not priced:
            continue
        chosen = min(priced, key=priced.get)
        best = min(designs, key=lambda d: designs[d]["ours_us"])
        ratio = designs[chosen]["ours_us"] / designs[best]["ours_us"]
        out.append({"model": key[0], "layer": key[1], "chosen (estimate)": chosen, "chosen_us": designs[chosen]["ours_us"],
                    "best (measured)": best, "best_us": designs[best]["ours_us"], "chosen / best": ratio,
                    "within": ratio <= 1 + CHOICE_WITHIN})
        chosen_us[key] = designs[chosen]["ours_us"]
        for d, r in designs.items():
            per_design.setdefault(d, {})[key] = r["ours_us"]
    layers = sorted(chosen_us)
    complete = {d: t for d, t in per_design.items() if set(t) >= set(layers)}
    best_single = min(complete, key=lambda d: geomean([complete[d][k] for k in layers])) if complete and layers else ""
    gain = (geomean([complete[best_single][k] for k in layers]) / geomean([chosen_us[k] for k in layers])
            if best_single else float("nan"))
    share = sum(r["within"] for r in out) / len(out) if out else float("nan")
    # the ceiling: the best measured design of every layer, over the best single design (what a perfect
    # choice among these designs gains; the H200's A/B: 1.067, under the 1.2 the target asks)
    best_us = {key: min(per_design[d][key] for d in per_design if key in per_design[d]) for key in layers}
    ceiling = (geomean([complete[best_single][k] for k in layers]) / geomean([best_us[k] for k in layers])
               if best_single else float("nan"))
    verdict = {"layers": len(out), "within 5% of the best": share, "best single design": best_single,
               "chosen over best single (geomean speedup)": gain,
               "best per layer over best single (the ceiling)": ceiling,
               "meets": bool(out and share >= CHOICE_LAYERS and gain >= CHOICE_GAIN)}
    return out, verdict


# issue 30, item 3: the default design changes only on this evidence
DECISION_GAIN = 0.05  # geomean at least 5% faster than the baseline on the A/B layers
DECISION_SPREAD = 0.05  # with every repeat spread under 5%
DECISION_WORST = 0.10  # and no layer more than 10% slower
DIAGNOSIS_EFFICIENCY = 0.35  # below this median per-nonzero efficiency at 0.9 (work-bound), diagnose first


def design_decision(rows: list[dict]) -> dict:
    """Issue 30's decision from the A/B rows (set "ab"): per design, the geomean of its time over the
    baseline's on the layers both measured, the largest spread, the worst layer, and whether it
    qualifies (DECISION_GAIN faster, spreads under DECISION_SPREAD, no layer DECISION_WORST slower); the
    design to make the default (the fastest that qualifies, else the baseline, kept); and whether any
    design reaches DIAGNOSIS_EFFICIENCY median per-nonzero efficiency on the work-bound layers
    (SGEMM ≥ WORK_BOUND_US) — if none does, the next steps are diagnosis, not more tables."""
    baseline = design_named("baseline").label
    ab = [r for r in rows if r.get("set") == "ab" and r.get("status") == "ok" and math.isfinite(r["ours_us"])]
    by = {}
    for r in ab:
        by.setdefault(r["design"], {})[(r["model"], r["layer"])] = r
    base = by.get(baseline, {})
    designs = []
    for design, layers in by.items():
        common = sorted(set(layers) & set(base))
        if design == baseline or not common:
            continue
        ratios = [layers[key]["ours_us"] / base[key]["ours_us"] for key in common]
        spread = max(max(layers[key].get("spread") or 0, base[key].get("spread") or 0) for key in common)
        gain = 1 / geomean(ratios) - 1
        qualifies = gain >= DECISION_GAIN and spread < DECISION_SPREAD and max(ratios) <= 1 + DECISION_WORST
        designs.append({"design": design, "layers": len(common), "speedup (geomean)": 1 + gain,
                        "worst layer (time over baseline)": max(ratios), "largest spread": spread,
                        "qualifies": qualifies})
    qualified = [d for d in designs if d["qualifies"]]
    chosen = max(qualified, key=lambda d: d["speedup (geomean)"])["design"] if qualified else baseline
    work = [r for r in ab if (r.get("sgemm_us") or 0) >= WORK_BOUND_US and abs(r["sparsity"] - 0.9) < 1e-9]
    efficiencies = {design: float(np.median([efficiency(r) for r in work if r["design"] == design]))
                    for design in {r["design"] for r in work}}
    best = max(efficiencies.values(), default=float("nan"))
    return {"default": chosen, "changed": chosen != baseline, "designs": designs,
            "median_efficiency_at_0.9": efficiencies, "best_median_efficiency": best,
            "diagnose_first": not best >= DIAGNOSIS_EFFICIENCY}


def design_table(rows: list[dict], decision: dict | None = None) -> list[dict]:
    """Issue 30 item 3's table, a row per design of the A/B rows (set "ab"): its geomean speedup over
    the baseline and worst layer (design_decision's), its median per-nonzero efficiency on the
    work-bound layers at 0.9, its geomean over cuBLAS SGEMM on every layer it launched, and whether
    it qualifies to be the default; the baseline first, then the fastest first. `decision`: the rows'
    design_decision, where the caller has it."""
    decision = decision or design_decision(rows)
    baseline = design_named("baseline").label
    ab = [r for r in rows if r.get("set") == "ab" and r.get("status") == "ok" and math.isfinite(r["ours_us"])]
    by = {d["design"]: d for d in decision["designs"]}
    out = []
    for design in [baseline] + sorted(by, key=lambda d: -by[d]["speedup (geomean)"]):
        mine = [r for r in ab if r["design"] == design]
        if not mine:
            continue
        row = by.get(design, {"speedup (geomean)": 1.0, "worst layer (time over baseline)": 1.0, "qualifies": False})
        out.append({"design": design, "layers": len(mine), "speedup over baseline (geomean)": row["speedup (geomean)"],
                    "worst layer (time / baseline's)": row["worst layer (time over baseline)"],
                    "median per-nonzero efficiency (0.9, work-bound)":
                        decision["median_efficiency_at_0.9"].get(design, float("nan")),
                    "vs SGEMM (geomean)": geomean([r["sgemm_us"] / r["ours_us"] for r in mine if r.get("sgemm_us")]),
                    "qualifies": row["qualifies"], "default": design == decision["default"]})
    return out


# --- half precision (issue 23) -----------------------------------------------------------------------


def half_rows(rows: list[dict]) -> list[dict]:
    """Issue 23's table from a run's rows: one per half kernel with its time, cuBLAS's in the same
    dtype, our fp32 kernel's on the same tile (FP32_SAME_TILE: same model, layer, sparsity, batch and
    tile), and both errors on the same data."""
    fp32_label = design_named(FP32_SAME_TILE).label
    fp32 = {(r["model"], r["layer"], r["sparsity"], r["batch"], r["m1"], r["n1"]): r for r in rows
            if r.get("set") == "half" and r["design"] == fp32_label}
    out = []
    for r in rows:
        if r.get("set") != "half" or r.get("dtype") in (None, "", "fp32"):
            continue
        same = fp32.get((r["model"], r["layer"], r["sparsity"], r["batch"], r["m1"], r["n1"]), {})
        out.append({k: r.get(k) for k in ("model", "layer", "m", "k", "n", "nnz", "sparsity", "batch", "dtype",
                                          "accumulate", "design", "m1", "n1", "spread", "status")}
                   | {"ours_us": r.get("ours_us", float("inf")), "cublas_same_dtype_us": r.get(f"{r['dtype']}_us"),
                      "ours_fp32_us": same.get("ours_us", float("nan")), "max_rel_error": r.get("max_rel_error"),
                      "cublas_max_rel_error": r.get("cublas_max_rel_error")})
    return out


def chosen_accumulation(rows: list[dict], dtype: str = "fp16") -> str | None:
    """Issue 23's rule for the default sums of `dtype`: of the accumulations whose every measured
    kernel meets the accuracy bar (error ≤ 2× cuBLAS's on the same data), the fastest (geomean over
    the kernels all of them ran; ties to the earlier in HALF_VARIANTS' order); None if none meets it."""
    by = {}
    for r in rows:
        if r.get("dtype") == dtype:
            by.setdefault(r["accumulate"], {})[(r["model"], r["layer"], r["sparsity"], r["batch"])] = r
    # a variant with a kernel that failed (not compiled, wrong, unmeasured) meets nothing
    meeting = {label: kernels for label, kernels in by.items()
               if all(r.get("status") == "ok" and r.get("cublas_max_rel_error") is not None
                      and r["max_rel_error"] <= 2 * r["cublas_max_rel_error"] for r in kernels.values())}
    if not meeting:
        return None
    common = set.intersection(*(set(k) for k in meeting.values()))
    speed = {label: geomean([kernels[key]["ours_us"] for key in common]) if common else float("inf")
             for label, kernels in meeting.items()}
    return min(speed, key=lambda label: speed[label])


def half_summary(rows: list[dict]) -> list[dict]:
    """Per accumulation (fp16/bf16 and its sums) and sparsity, over the work-bound rows (cuBLAS FP16
    ≥ 10 µs): geomean speedup over cuBLAS in the same dtype and over our fp32 kernel on the same
    tile, and how many kernels meet the accuracy bar (error ≤ 2× cuBLAS's on the same data)."""
    out = []
    ok = [r for r in rows if r.get("status") == "ok" and math.isfinite(r["ours_us"] or math.inf)
          and (r.get("cublas_same_dtype_us") or 0) > 0]
    for label in dict.fromkeys(r["accumulate"] for r in ok):
        for s in sorted({r["sparsity"] for r in ok if r["accumulate"] == label}):
            xs = [r for r in ok if r["accumulate"] == label and r["sparsity"] == s]
            work = [r for r in xs if r["cublas_same_dtype_us"] >= HALF_WORK_BOUND_US]
            fp32 = [r for r in work if r.get("ours_fp32_us") and math.isfinite(r["ours_fp32_us"])]
            out.append({"kernels": label, "sparsity": s, "work-bound": len(work), "all": len(xs),
                        "vs cuBLAS same dtype (geomean, work-bound)":
                            geomean([r["cublas_same_dtype_us"] / r["ours_us"] for r in work]) if work else float("nan"),
                        "vs ours fp32, same tile": geomean([r["ours_fp32_us"] / r["ours_us"] for r in fp32])
                        if fp32 else float("nan"),
                        "within 2x cuBLAS error": sum(r["max_rel_error"] <= 2 * r["cublas_max_rel_error"] for r in xs
                                                      if r.get("cublas_max_rel_error") is not None),
                        "error vs cuBLAS (median)": float(np.median([r["max_rel_error"] / r["cublas_max_rel_error"]
                                                                    for r in xs if r.get("cublas_max_rel_error")]))
                        if any(r.get("cublas_max_rel_error") for r in xs) else float("nan")})
    return out


# --- the search's quality: Table 4 and the A/B of the flow's own kernels (issue 24) ------------------


def launch_rows(rows: list[dict]) -> list[dict]:
    """Launch rows as this module reads them: `ours_us` and `status` (a launch file of the plan before
    the device program, as the committed gpu-h100 results hold, named them measured_us and
    measure_status)."""
    return [r if "ours_us" in r else r | {"ours_us": r["measured_us"], "status": r.get("measure_status", "")}
            for r in rows]


def launch_work(row: dict, arrays: dict | None = None):
    """The estimate's KernelWork of a launch-list row (arrays: the row's own columns by default)."""
    from lospmm.kernel.estimate import KernelWork

    arrays = row if arrays is None else arrays
    design = design_named(row["design"]) if row.get("design") else design_named("baseline")
    chunks = row.get("staged_chunks") or 0
    staged = np.asarray(arrays["staged_counts"], np.int64).reshape(-1, chunks) if chunks else None
    # each tile's work per chunk (rows built before it was recorded have none: the walk is priced whole)
    split = [np.asarray(arrays[c], np.int64).reshape(-1, chunks)
             if chunks and arrays.get(c) is not None and len(arrays[c]) else None for c in ("chunk_loads", "chunk_fmas")]
    return KernelWork(row["m"], row["k"], row["n"], row["m1"], row["n1"], np.asarray(arrays["tile_loads"], np.int64),
                      np.asarray(arrays["tile_fmas"], np.int64), row["registers"], row["spill_bytes"],
                      row.get("smem_bytes") or 0, row.get("zero_blocks") or 0, row.get("prefetch") or 1, design,
                      staged, *split, row.get("form") == "conv")


def table4_rows(measured: list[dict]) -> list[dict]:
    """Per sampled layer: the tile the measured proxies choose (the emit stage's rule), its full
    kernel's time against the best full kernel measured among the top-K, and the same for the
    estimate's choice. Only the flow's own variant ("") counts; outside-top-k rows are excluded."""
    from lospmm.search import choice
    from lospmm.status import Status
    from lospmm.kernel.timing import Timing

    out = []
    layers = sorted({(r["model"], r["layer"]) for r in measured})
    for model, layer in layers:
        rows = [r for r in measured if (r["model"], r["layer"]) == (model, layer) and r["variant"] == ""]
        # a tile in its design: search.choice's key (one design per sample so far)
        key_of = lambda r: (r["m1"], r["n1"], r.get("design") or "")  # noqa: E731
        full = {key_of(r): r for r in rows if r["role"] == "full"}
        proxy = {key_of(r): r for r in rows if r["role"] == "proxy"}
        full_t = {key: r["ours_us"] for key, r in full.items() if np.isfinite(r["ours_us"])}
        if not full_t or not proxy:
            continue
        measured_choice = choice({key: Timing("cuda", r["ours_us"], Status.OK if np.isfinite(r["ours_us"]) else Status.ERROR)
                                  for key, r in proxy.items()}, measured=True,
                                 registers={key: r.get("registers") for key, r in proxy.items()})
        estimate_choice = choice({key: Timing("estimate", r["estimate_us"]) for key, r in proxy.items()})
        best_key = min(full_t, key=full_t.get)
        best = full_t[best_key]
        row = {"model": model, "layer": layer, "m": rows[0]["m"], "k": rows[0]["k"], "n": rows[0]["n"],
               "candidates": len(full_t), "best_tile": f"{best_key[0]}×{best_key[1]}", "best_us": best,
               "proxy_tile": "", "proxy_us": float("nan"), "proxy_loss": float("nan"),
               "estimate_tile": "", "estimate_us": float("nan"), "estimate_loss": float("nan"),
               "spearman_proxy_full": spearman([proxy[k]["ours_us"] for k in full_t if k in proxy],
                                               [full_t[k] for k in full_t if k in proxy])}
        for prefix, key in (("proxy", measured_choice), ("estimate", estimate_choice)):
            if key is not None and key in full_t:
                row |= {f"{prefix}_tile": f"{key[0]}×{key[1]}", f"{prefix}_us": full_t[key],
                        f"{prefix}_loss": full_t[key] / best - 1}
        out.append(row)
    return out


def repeated(files: list[list[dict]]) -> dict[tuple, dict]:
    """(model, layer, sparsity, id) -> the row (of the first file holding it) with `times` (every
    repeat's ours_us), `ours_us` their median and `spread` (max − min) / median. Launch ids
    do not name the sparsity, so a kernel is a repeat only at the same sparsity; ValueError when
    one key's shape (m, k, n, nnz) differs between files (not the same kernel)."""
    out: dict[tuple, dict] = {}
    for rows in files:
        for r in rows:
            if r.get("status") != "ok" or not np.isfinite(r.get("ours_us") or np.nan):
                continue
            key = (r["model"], r["layer"], float(r["sparsity"]), r["id"])
            first = out.setdefault(key, {**r, "times": []})
            if tuple(first[c] for c in ("m", "k", "n", "nnz")) != tuple(r[c] for c in ("m", "k", "n", "nnz")):
                raise ValueError(f"{r['id']} at sparsity {r['sparsity']}: a different kernel in two files "
                                 f"(m, k, n, nnz differ): not repeats of one measurement")
            first["times"].append(float(r["ours_us"]))
    for r in out.values():
        r["ours_us"] = statistics.median(r["times"])
        r["spread"] = (max(r["times"]) - min(r["times"])) / r["ours_us"] if len(r["times"]) > 1 else float("nan")
    return out


def table4_strategy_rows(kernels: dict[tuple, dict], booster, estimate_timer, launched: list[dict] = ()) -> list[dict]:
    """One row per (model, layer, sparsity, strategy) of the measured `kernels` (repeated's)."""
    from lospmm.stages.emit import EmitParams, fastest_proxy
    from lospmm.stages.rank import launch_features, feature_matrix
    from lospmm.kernel.estimate import estimated_timing

    out = []
    groups = sorted({(r["model"], r["layer"], float(r["sparsity"])) for r in kernels.values()})
    for model, layer, sparsity in groups:
        mine = [r for r in kernels.values() if (r["model"], r["layer"], float(r["sparsity"])) == (model, layer, sparsity)]
        # where every kept candidate was launched (a cubin reading N1 at launch per M1), the best, the
        # ranker's and the estimate's picks are all among those kernels: one kind of kernel throughout
        kept = [r for r in launched if r.get("variant") == "every-kept" and
                (r["model"], r["layer"], float(r["sparsity"])) == (model, layer, sparsity)]
        every_kept = bool(kept)
        variants = ("every-kept",) if every_kept else ("outside-top-k", "")  # the flow's own kernel last
        full = {}
        for variant in variants:
            full |= {(r["m1"], r["n1"]): r for r in mine if r["role"] == "full" and r["variant"] == variant}
        proxies = [{**r, "time_us": r["ours_us"], "status": "ok"} for r in mine
                   if r["role"] == "proxy" and r["variant"] == ""]
        if len(full) < 2:
            continue
        best_key = min(full, key=lambda key: full[key]["ours_us"])
        # the ranker's top-1: over every kept candidate launched, measured or not (an unmeasured pick
        # has no loss: NaN, never the next one's), else over its measured top-k
        candidates = {(r["m1"], r["n1"]): r for r in kept} if every_kept else \
            {key: r for key, r in full.items() if r["variant"] == ""}
        ranked = list(candidates)
        chosen = {"proxies": None, "ranker": None, "estimate": None}
        pick = fastest_proxy(proxies, EmitParams().tie_band)
        if pick is not None:
            chosen["proxies"] = (pick["m1"], pick["n1"])
        if ranked:
            scores = booster.predict(feature_matrix([launch_features(candidates[key]) for key in ranked]))
            chosen["ranker"] = ranked[int(np.argmax(scores))]
        estimates = {key: estimated_timing(launch_work(r), estimate_timer.device, estimate_timer.params).time_us
                     for key, r in full.items()}
        chosen["estimate"] = min(estimates, key=estimates.get)
        best = full[best_key]
        for strategy in STRATEGIES:
            key = chosen[strategy]
            row = full.get(key) if key else None
            loss = row["ours_us"] / best["ours_us"] - 1 if row else float("nan")
            spread = max(row["spread"], best["spread"]) if row else float("nan")
            out.append({"model": model, "layer": layer, "sparsity": sparsity, "strategy": strategy,
                        "chosen_tile": f"{key[0]}×{key[1]}" if key else "", "best_tile": f"{best_key[0]}×{best_key[1]}",
                        "loss": loss, "spread": spread,
                        "beyond_noise": bool(loss > spread) if np.isfinite(loss) and np.isfinite(spread) else None,
                        "chosen_us": row["ours_us"] if row else float("nan"), "best_us": best["ours_us"],
                        "repeats": min(len(best["times"]), len(row["times"])) if row else len(best["times"]),
                        # every kept candidate launched, and how many of them measured: below all, the
                        # best is only the best of those measured
                        "kept_launched": len(kept) if every_kept else None,
                        "kept_measured": len(full) if every_kept else None})
    return out


def ab_rows(measured: list[dict]) -> list[dict]:
    """Each A/B variant's time against the flow's own kernel of the same layer and tile, and, per
    layer, the best measured M1 = 1 full kernel against the best other one."""
    out = []
    for r in measured:
        if r["variant"].startswith(("ptxas-", "prefetch-")):
            base = [b for b in measured if b["variant"] == "" and b["role"] == "full"
                    and (b["model"], b["layer"], b["m1"], b["n1"]) == (r["model"], r["layer"], r["m1"], r["n1"])]
            if base:
                out.append({"model": r["model"], "layer": r["layer"], "tile": f"{r['m1']}×{r['n1']}",
                            "a_b": f"{r['variant']} vs ptxas-O1 prefetch-1", "a_us": r["ours_us"],
                            "b_us": base[0]["ours_us"], "a_over_b": r["ours_us"] / base[0]["ours_us"],
                            "a_spill_bytes": r["spill_bytes"], "b_spill_bytes": base[0]["spill_bytes"]})
    for model, layer in sorted({(r["model"], r["layer"]) for r in measured}):
        fulls = [r for r in measured if (r["model"], r["layer"]) == (model, layer) and r["role"] == "full"
                 and r["variant"] in ("", "outside-top-k") and np.isfinite(r["ours_us"])]
        one = [r for r in fulls if r["m1"] == 1]
        rest = [r for r in fulls if r["m1"] != 1]
        if one and rest:
            a, b = min(one, key=lambda r: r["ours_us"]), min(rest, key=lambda r: r["ours_us"])
            est_a, est_b = min(one, key=lambda r: r["estimate_us"]), min(rest, key=lambda r: r["estimate_us"])
            out.append({"model": model, "layer": layer, "tile": f"{a['m1']}×{a['n1']} vs {b['m1']}×{b['n1']}",
                        "a_b": "best M1=1 vs best M1>1", "a_us": a["ours_us"], "b_us": b["ours_us"],
                        "a_over_b": a["ours_us"] / b["ours_us"],
                        "estimate_a_over_b": est_a["estimate_us"] / est_b["estimate_us"],
                        "a_spill_bytes": a["spill_bytes"], "b_spill_bytes": b["spill_bytes"]})
    return out


BASELINES = ("sgemm", "tf32", "fp16", "cusparse", "torch_csr")  # a row's <name>_us: the libraries timed beside ours


def speedup_summary(rows: list[dict], baselines: tuple[str, ...] = BASELINES) -> list[dict]:
    """Geometric means of each baseline's time over ours, per model and sparsity and over all models
    (`baselines`: the rows' <name>_us columns present)."""
    baselines = [b for b in baselines if any(f"{b}_us" in r for r in rows)]
    out = []
    for sparsity in sorted({r["sparsity"] for r in rows}):
        for model in [*sorted({r["model"] for r in rows}), "all"]:
            mine = [r for r in rows if model in ("all", r["model"]) and r["sparsity"] == sparsity
                    and np.isfinite(r["ours_us"])]
            if mine:
                out.append({"model": model, "sparsity": sparsity, "kernels": len(mine)}
                           | {f"vs_{b}": geomean([(r.get(f"{b}_us") or np.nan) / r["ours_us"] for r in mine])
                              for b in baselines})
    return out


# --- the estimate's calibration ------------------------------------------------------------------------


def calibration_rows(sets: dict[str, list[dict]], device, params, calibrated_device, calibrated_params,
                     after: Callable | None = None) -> list[dict]:
    """Per named set of measured launches and role: Spearman (pooled and within layer), the median
    |log(estimate / measured)|, and Table 4's loss of the estimate's choice, before and after (the
    estimate with the calibrated device and parameters, or `after(work)`: another way of pricing)."""
    from lospmm.kernel.estimate import estimated_timing

    out = []
    for name, rows in sets.items():
        rows = [dict(r) for r in rows if r["variant"] == "" and np.isfinite(r["ours_us"])]
        for r in rows:
            w = launch_work(r)
            r["before_us"] = estimated_timing(w, device, params).time_us
            r["after_us"] = after(w) if after else estimated_timing(w, calibrated_device, calibrated_params).time_us
        for role in ("proxy", "full"):
            mine = [r for r in rows if r["role"] == role]
            if not mine:
                continue
            m = np.array([r["ours_us"] for r in mine])
            row = {"set": name, "role": role, "launches": len(mine)}
            for when in ("before", "after"):
                e = np.array([r[f"{when}_us"] for r in mine])
                row |= {f"spearman_{when}": spearman(e, m), f"within_layer_{when}": within_layer_spearman(mine, f"{when}_us"),
                        f"median_log_error_{when}": float(np.median(np.abs(np.log(e / m))))}
            out.append(row)
        for when in ("before", "after"):  # only a launch list has candidates to choose among
            losses = [x["estimate_loss"] for x in table4_rows([r | {"estimate_us": r[f"{when}_us"]} for r in rows])]
            if out and out[-1]["set"] == name and np.isfinite(losses).any():
                out[-1][f"estimate_choice_loss_{when}"] = float(np.nanmean(losses))
    return out
