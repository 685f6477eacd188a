"""Search-cost headline and register model, measured on a random sample of compiles (no GPU needed).

For every layer of the chosen models at one sparsity: the kept candidates (constrain stage, h100),
grouped by M1. A search without proxies compiles one full kernel per kept (M1, N1); with proxies,
one proxy per kept M1 (§5.1). N1 only changes a constant in the full kernel, so every (M1, N1) of a
group costs what its group's full kernel at the first kept N1 costs.

The script compiles a seeded random sample of groups (full kernel and proxy, each in its own
process with a time limit, the pipeline's compile options) until the wall budget is spent,
appending each result to a JSONL log, so a second run resumes and adds samples. It then fits
log(seconds) = a + b·log(loads + multiply-adds) per kind on the measured compiles and costs every
unmeasured kernel with that fit. Every per-layer figure says how much of it was measured; the
rest is an ESTIMATE from the fit, and the fit's leave-one-out error is printed.

Registers: for each measured compile, ptxas's count under `--maxrregcount` = the §3.2 prediction
vs the prediction (exact match, under-use, spills), per group and weighted by kept candidates.

    python -m benchmarks.search_cost [--budget 3600] [--limit 600] [--log search_cost.jsonl]
    python -m benchmarks.search_cost --report-only --log search_cost.jsonl
"""

from __future__ import annotations

import argparse
import json
import random
import resource
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np
from rich.console import Console
from rich.table import Table

from benchmarks.compile_cost import in_child
from lospmm.stages.compile import CompileOptions, compiled_kernel, kernel_options
from lospmm.stages.constrain import predicted_registers
from lospmm.devices import device_named
from lospmm.stages.extract import zoo_shapes
from lospmm.stages.prune import pruned_layer
from lospmm.stages.rank import RankParams
from lospmm.search import DEFAULT_M1, SearchParams, chosen_by_proxy, full_source, layer_search, proxy_sources


@dataclass
class Group:
    """One (layer, M1) with its kept N1s: one proxy, len(n1s) full kernels."""

    model: str
    layer: str
    m1: int
    n1s: list[int]
    pred_regs: int
    full_work: int  # loads + multiply-adds of the full kernel
    proxy_work: int

    @property
    def key(self) -> str:
        return f"{self.model}|{self.layer}|{self.m1}"


def unranked_search(a, n: int, sparsity: float, gpu: str, m1s=DEFAULT_M1):
    """The flow's search without the ranker: every kept candidate is chosen, so `clusters[m1]` is the
    proxy the flow builds for M1 (sized by proxy_active_blocks over M1's kept candidates)."""
    return layer_search(a, n, sparsity, device_named(gpu), params=SearchParams(m1s, rank=RankParams(use_rank=False)))


def _build(model: str, layer: str, m1: int, n1: int, sparsity: float, gpu: str, kind: str):
    shape = next(s for s in zoo_shapes(model) if s.layer == layer)
    a = pruned_layer(shape, sparsity).matrix
    # M1 alone: constrain and cluster look at one M1 at a time, so this is the full search's proxy
    search = unranked_search(a, shape.n, sparsity, gpu, (m1,))
    if kind == "full":
        return full_source(a, search, m1, n1)
    return proxy_sources(search, shape.m, shape.k)[(m1, search.design.label)]


def groups_of(models: list[str], sparsity: float, gpu: str) -> list[Group]:
    groups = []
    for model in models:
        for shape in [s for s in zoo_shapes(model) if s.ok]:
            a = pruned_layer(shape, sparsity).matrix
            search = unranked_search(a, shape.n, sparsity, gpu)
            for (m1, label), cands in chosen_by_proxy(search.chosen).items():
                t, cl = search.tiles[m1], search.clusters[(m1, label)]
                groups.append(Group(model, shape.layer, m1, [c.n1 for c in cands], predicted_registers(m1),
                                    int(t.tile_nnc.sum()) + a.nnz, int(cl.nnc_p.sum() + (cl.nnc_p * cl.cpl).sum())))
    return groups


def _child(args, queue) -> None:
    model, layer, m1, n1, sparsity, gpu, kind, arch = args
    k = _build(model, layer, m1, n1, sparsity, gpu, kind)
    out = compiled_kernel(k, kernel_options(arch, m1))
    queue.put({"status": out.status, "seconds": out.seconds, "registers": out.registers,
               "spill_stores": out.spill_stores, "rss_mib": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
               "source_bytes": len(k.source)})


def measure(g: Group, kind: str, sparsity: float, gpu: str, arch: str, limit: float) -> dict:
    return in_child(_child, ((g.model, g.layer, g.m1, g.n1s[0], sparsity, gpu, kind, arch),), limit)


def _fit(points: list[tuple[int, float]]) -> tuple[float, float, float]:
    """log t = a + b log w; returns a, b and the median leave-one-out relative error."""
    w = np.log([p[0] for p in points])
    t = np.log([p[1] for p in points])
    b, a = np.polyfit(w, t, 1)
    errs = []
    for i in range(len(points)):
        if len(points) < 4:
            break
        mask = np.arange(len(points)) != i
        bi, ai = np.polyfit(w[mask], t[mask], 1)
        errs.append(abs(np.exp(ai + bi * w[i]) / points[i][1] - 1))
    return a, b, float(np.median(errs)) if errs else float("nan")


def report(groups: list[Group], log: dict, console: Console) -> None:
    fits = {}
    for kind in ("full", "proxy"):
        pts = [(getattr(g, f"{kind}_work"), log[(g.key, kind)]["seconds"]) for g in groups
               if log.get((g.key, kind), {}).get("status") == "ok"]
        if len(pts) >= 2:
            fits[kind] = _fit(pts)
            a, b, err = fits[kind]
            console.print(f"fit {kind}: seconds = {np.exp(a):.3g} · work^{b:.2f} over {len(pts)} measured compiles "
                          f"(work {min(p[0] for p in pts)}–{max(p[0] for p in pts)}); median leave-one-out error "
                          f"{err:.0%}")

    def seconds(g: Group, kind: str) -> tuple[float, bool]:
        r = log.get((g.key, kind))
        if r and r["status"] == "ok":
            return r["seconds"], True
        if kind not in fits:
            return float("nan"), False
        a, b, _ = fits[kind]
        return float(np.exp(a) * getattr(g, f"{kind}_work") ** b), False

    table = Table(title="search cost per layer: compile seconds, every kept full kernel vs one proxy per kept M1 "
                        "(measured where the 'measured' columns say so, the rest ESTIMATED from the fit)")
    for c in ("model", "layer", "kept (M1,N1)", "kept M1", "full s", "full measured", "proxy s",
              "proxy measured", "full/proxy"):
        table.add_column(c)
    totals: dict[str, list[float]] = {}
    by_layer: dict[tuple[str, str], list[Group]] = {}
    for g in groups:
        by_layer.setdefault((g.model, g.layer), []).append(g)
    for (model, layer), gs in by_layer.items():
        full = [(seconds(g, "full"), len(g.n1s)) for g in gs]
        prox = [seconds(g, "proxy") for g in gs]
        f_s = sum(s * n for (s, _), n in full)
        p_s = sum(s for s, _ in prox)
        f_meas = sum(n for (_, m), n in full if m)
        p_meas = sum(1 for _, m in prox if m)
        kept = sum(len(g.n1s) for g in gs)
        table.add_row(model, layer, str(kept), str(len(gs)), f"{f_s:,.0f}", f"{f_meas}/{kept}", f"{p_s:,.0f}",
                      f"{p_meas}/{len(gs)}", f"{f_s / p_s:.1f}×" if p_s else "-")
        t = totals.setdefault(model, [0.0, 0.0, 0, 0, 0, 0])
        for i, v in enumerate((f_s, p_s, f_meas, kept, p_meas, len(gs))):
            t[i] += v
    for model, (f_s, p_s, f_m, kept, p_m, n) in totals.items():
        table.add_row(model, "ALL", str(kept), str(n), f"{f_s:,.0f}", f"{f_m}/{kept}", f"{p_s:,.0f}", f"{p_m}/{n}",
                      f"{f_s / p_s:.1f}×" if p_s else "-", style="bold")
    console.print(table)

    regs = Table(title="register prediction (§3.2, maxrregcount = prediction) vs ptxas, measured compiles")
    for c in ("kind", "compiles", "exact", "ptxas below", "spilled", "mean pred − ptxas", "kept candidates exact"):
        regs.add_column(c)
    for kind in ("full", "proxy"):
        rows = [(g, log[(g.key, kind)]) for g in groups if log.get((g.key, kind), {}).get("status") == "ok"]
        if not rows:
            continue
        exact = [g for g, r in rows if r["registers"] == g.pred_regs and r["spill_stores"] == 0]
        below = [g for g, r in rows if r["registers"] < g.pred_regs]
        spilled = [g for g, r in rows if r["spill_stores"] > 0]
        err = np.mean([g.pred_regs - r["registers"] for g, r in rows])
        weighted = sum(len(g.n1s) for g in exact) / sum(len(g.n1s) for g, _ in rows)
        regs.add_row(kind, str(len(rows)), f"{len(exact) / len(rows):.0%}", str(len(below)), str(len(spilled)),
                     f"{err:.1f}", f"{weighted:.0%}")
    console.print(regs)
    detail = Table(title="registers by M1 (measured compiles)")
    for c in ("M1", "predicted", "full: ptxas used (compiles)", "proxy: ptxas used (compiles)", "spilled compiles"):
        detail.add_column(c)
    for m1 in sorted({g.m1 for g in groups}):
        cells = []
        spilled = 0
        for kind in ("full", "proxy"):
            used = [log[(g.key, kind)]["registers"] for g in groups if g.m1 == m1
                    and log.get((g.key, kind), {}).get("status") == "ok"]
            spilled += sum(1 for g in groups if g.m1 == m1 and log.get((g.key, kind), {}).get("status") == "ok"
                           and log[(g.key, kind)]["spill_stores"] > 0)
            cells.append(", ".join(f"{r}×{used.count(r)}" for r in sorted(set(used))) or "-")
        detail.add_row(str(m1), str(predicted_registers(m1)), *cells, str(spilled))
    console.print(detail)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--models", nargs="+", default=["bert-base", "resnet50"])
    ap.add_argument("--sparsity", type=float, default=0.9)
    ap.add_argument("--gpu", default="h100")
    ap.add_argument("--arch", default="sm_90")
    ap.add_argument("--budget", type=float, default=3600.0, help="wall seconds of compiling in this run")
    ap.add_argument("--limit", type=float, default=600.0, help="seconds per compile before it counts as a timeout")
    ap.add_argument("--log", type=Path, default=Path("search_cost.jsonl"))
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--report-only", action="store_true")
    args = ap.parse_args()
    console = Console(width=200)

    groups = groups_of(args.models, args.sparsity, args.gpu)
    console.print(f"{len(groups)} (layer, M1) groups, {sum(len(g.n1s) for g in groups)} kept candidates")
    log: dict = {}
    if args.log.exists():
        for line in args.log.read_text().splitlines():
            r = json.loads(line)
            if r["sparsity"] == args.sparsity and r["arch"] == args.arch and r["options"] == _options_tag():
                log[(r["key"], r["kind"])] = r
    if not args.report_only:
        order = groups[:]
        random.Random(args.seed).shuffle(order)
        t_end = time.monotonic() + args.budget
        for g in order:
            for kind in ("proxy", "full"):
                if (g.key, kind) in log:
                    continue
                if time.monotonic() > t_end:
                    break
                r = measure(g, kind, args.sparsity, args.gpu, args.arch, args.limit)
                r.update(key=g.key, kind=kind, sparsity=args.sparsity, arch=args.arch, options=_options_tag(),
                         work=getattr(g, f"{kind}_work"), pred_regs=g.pred_regs)
                log[(g.key, kind)] = r
                with args.log.open("a") as f:
                    f.write(json.dumps(r) + "\n")
                console.print(f"{g.key} {kind}: {r['status']} {r['seconds']:.1f} s "
                              f"regs {r.get('registers')} spill {r.get('spill_stores')} work {r['work']}")
    report(groups, log, console)


def _options_tag() -> str:
    return " ".join(CompileOptions().as_list()[1:])  # everything but the arch


if __name__ == "__main__":
    main()
