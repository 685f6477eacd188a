"""What an estimate per design would take (issue 35, item 4), from committed device results alone:
the design the estimate chooses per A/B layer, held out one layer at a time, under three ways of
pricing a design, and what the same change does to the ranking of tiles within a layer (the
search's other use of the estimate). No GPU; every time is measured, every choice an estimate's.

    python -m benchmarks.design_estimate [--ab FILE] [--tiles FILE ...] [--gpu h100]

Ways of pricing (each an experiment, not the shipped estimate):
- `max`: the shipped estimate (its throughput terms' maximum);
- `max × design`: times a per-design factor, the geomean of measured over estimated time on the
  other layers (leave one layer out);
- `p-norm × design`: the terms' p-norm (between their maximum and their sum: imperfect overlap of
  issue, memory and latency), times the per-design factor, for p in --overlaps.
`ceiling`: the best measured design of every layer over the best single design, what a perfect
choice gains on these layers.
"""

from __future__ import annotations

import argparse
import math
from collections import defaultdict
from pathlib import Path

import numpy as np

from benchmarks.analysis import CHOICE_WITHIN, calibration_rows, geomean, launch_rows, launch_work, print_table

AB = Path("benchmarks/results/h200/designs/kernel-speed-ab.parquet")
TILES = (Path("benchmarks/results/gpu-h100/c/launches-sample-0.9.parquet"),
         Path("benchmarks/results/gpu-h100/d/launches-sample-0.7.parquet"))


def priced(terms: np.ndarray, launch_us: float, overlap: float) -> float:
    """A launch's time from its estimate's terms (compute, memory, latency, fetch, and the body the
    shipped model took: their maximum or the longest block) with the throughput terms combined by
    their `overlap`-norm (infinite: the shipped maximum)."""
    throughput, body = terms[:4], terms[4]
    if math.isinf(overlap):
        return launch_us + body
    top = throughput.max()
    norm = top * float(np.sum((throughput / top) ** overlap) ** (1 / overlap)) if top > 0 else 0.0
    return launch_us + max(body, norm)


def ab_layers(path: Path, timer) -> dict:
    """{layer: {design: (measured µs, estimate terms)}} of the A/B's launched full kernels."""
    import pyarrow.parquet as pq

    from lospmm.kernel.estimate import estimated_timing

    out: dict = defaultdict(dict)
    for r in pq.read_table(path).to_pylist():
        if r.get("set") != "ab" or r.get("role") != "full" or r.get("status") != "ok" or not math.isfinite(r["ours_us"]):
            continue
        t = estimated_timing(launch_work(r), timer.device, timer.params)
        terms = np.array([t.compute_us, t.memory_us, t.latency_us, t.fetch_us, t.time_us - timer.params.launch_us])
        out[(r["model"], r["layer"])][r["design"]] = (r["ours_us"], terms)
    return dict(out)


def held_out_choices(layers: dict, launch_us: float, overlap: float, per_design: bool) -> dict:
    """Per layer held out: the design priced lowest (with per-design factors fitted on the others)
    against the best measured; the share within CHOICE_WITHIN and the geomean gain over the best
    single design."""
    within, chosen = 0, {}
    for held in layers:
        factor = {}
        for design in layers[held]:
            logs = [math.log(layers[k][design][0] / priced(layers[k][design][1], launch_us, overlap))
                    for k in layers if k != held and design in layers[k]]
            factor[design] = math.exp(sum(logs) / len(logs)) if per_design and logs else 1.0
        price = {d: priced(terms, launch_us, overlap) * factor[d] for d, (_, terms) in layers[held].items()}
        pick = min(price, key=price.get)
        best = min(us for us, _ in layers[held].values())
        within += layers[held][pick][0] <= (1 + CHOICE_WITHIN) * best
        chosen[held] = layers[held][pick][0]
    complete = [d for d in {d for v in layers.values() for d in v} if all(d in v for v in layers.values())]
    single = min(complete, key=lambda d: geomean([layers[k][d][0] for k in layers]))
    return {"within 5% of the best": within / len(layers),
            "gain over the best single design": geomean([layers[k][single][0] for k in layers])
            / geomean([chosen[k] for k in layers]), "best single design": single}


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--ab", type=Path, default=AB, help="the designs step's kernel-speed-ab.parquet")
    p.add_argument("--tiles", type=Path, nargs="*", default=list(TILES),
                   help="launch lists of measured top-K tiles per layer (the plan-before's sample sets)")
    p.add_argument("--gpu", default="h100", help="the estimate's device (its calibration)")
    p.add_argument("--overlaps", type=float, nargs="+", default=[8.0, 4.0, 3.0])
    args = p.parse_args(argv)
    import pyarrow.parquet as pq

    from lospmm.devices import device_named
    from lospmm.kernel.estimate import estimate_timer

    timer = estimate_timer(device_named(args.gpu))
    layers = ab_layers(args.ab, timer)
    best = {k: min(us for us, _ in v.values()) for k, v in layers.items()}
    complete = [d for d in {d for v in layers.values() for d in v} if all(d in v for v in layers.values())]
    single = min(complete, key=lambda d: geomean([layers[k][d][0] for k in layers]))
    ceiling = geomean([layers[k][single][0] for k in layers]) / geomean(list(best.values()))
    rows = [{"pricing": "max (shipped)", **held_out_choices(layers, timer.params.launch_us, math.inf, False)},
            {"pricing": "max × design", **held_out_choices(layers, timer.params.launch_us, math.inf, True)}]
    rows += [{"pricing": f"{p:g}-norm × design", **held_out_choices(layers, timer.params.launch_us, p, True)}
             for p in args.overlaps]
    print_table(f"the design the estimate chooses on {len(layers)} A/B layers ({args.ab}), each held out while the "
                f"per-design factors are fitted on the others; ceiling (best per layer over {single}): {ceiling:.3f}",
                rows)

    # the same change on the ranking of tiles within a layer: the shipped model against the p-norm one
    sets: dict = {}
    for path in args.tiles:
        if not path.exists():
            continue
        for r in launch_rows(pq.read_table(path).to_pylist()):
            if r.get("tile_loads") is not None:
                sets.setdefault(f"{path.parent.name}/{path.stem} s{r['sparsity']:g}", []).append(r)
    if not sets:
        return
    from lospmm.kernel.estimate import estimated_timing

    def normed(work, overlap: float) -> float:
        t = estimated_timing(work, timer.device, timer.params)
        if not math.isfinite(t.time_us):
            return t.time_us
        terms = np.array([t.compute_us, t.memory_us, t.latency_us, t.fetch_us, t.time_us - timer.params.launch_us])
        return priced(terms, timer.params.launch_us, overlap)

    for overlap in args.overlaps:
        table = calibration_rows(sets, timer.device, timer.params, timer.device, timer.params,
                                 after=lambda work, overlap=overlap: normed(work, overlap))
        print_table(f"tiles within a layer, the shipped model (before) against the {overlap:g}-norm (after): "
                    f"Spearman pooled and within a layer, the loss of the estimate's choice among the measured top-K",
                    [{k: v for k, v in r.items() if "spearman" in k or "within" in k or "choice" in k or k in ("set", "role")}
                     for r in table])

if __name__ == "__main__":
    main()
