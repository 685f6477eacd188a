"""The price that compares one layer's designs (issue 35, item 4), from committed device results
alone: the design chosen per A/B layer, held out one layer at a time, under several ways of pricing a
design; the same choice on another card's A/B with the factors fitted on this one's (a held-out
card); the factors of the shipped pricing (lospmm.kernel.estimate.DESIGN_PRICINGS); and what the
same pricing would do to the ranking of tiles within a layer (the search's other use of the
estimate, which keeps the estimate's own order). No GPU; every time is measured, every choice priced.

    python -m benchmarks.design_estimate [--ab FILE] [--other FILE ...] [--tiles FILE ...] [--gpu h100]

Ways of pricing:
- `max`: the shipped estimate (its throughput terms' maximum);
- `max × design`: times a per-design factor, the geomean of measured over estimated time on the
  other layers (leave one layer out);
- `p-norm × design`: the terms' p-norm (between their maximum and their sum, p = 1: imperfect
  overlap of issue, memory, latency and instruction supply; lospmm.kernel.estimate.overlapped_us),
  times the per-design factor, for p in --overlaps. The shipped pricing is `--ship`'s.
`ceiling`: the best measured design of every layer over the best single design, what a perfect
choice gains on these layers.
"""

from __future__ import annotations

import argparse
import math
from collections import defaultdict
from pathlib import Path

from benchmarks.analysis import CHOICE_WITHIN, calibration_rows, geomean, launch_rows, launch_work, print_table
from lospmm.kernel.estimate import DESIGN_PRICINGS, design_factors, overlapped_us

AB = Path("benchmarks/results/h100/designs/kernel-speed-ab.parquet")
# the same A/B on another card, and the held-out layers (the designs-held-out step) where measured
OTHER_CARDS = (Path("benchmarks/results/h200/designs/kernel-speed-ab.parquet"),
               Path("benchmarks/results/h100/designs-held-out/kernel-speed-ab-held-out.parquet"),
               Path("benchmarks/results/h200/designs-held-out/kernel-speed-ab-held-out.parquet"))
SHIPPED_OVERLAP = DESIGN_PRICINGS["h100"].overlap
TILES = (Path("benchmarks/results/gpu-h100/c/launches-sample-0.9.parquet"),
         Path("benchmarks/results/gpu-h100/d/launches-sample-0.7.parquet"))


def ab_layers(path: Path, timer) -> dict:
    """{layer: {design: (measured µs, the estimate's Timing)}} of the A/B's launched full kernels."""
    import pyarrow.parquet as pq

    from lospmm.kernel.estimate import estimated_timing

    out: dict = defaultdict(dict)
    for r in pq.read_table(path).to_pylist():
        if r.get("set") != "ab" or r.get("role") != "full" or r.get("status") != "ok" or not math.isfinite(r["ours_us"]):
            continue
        out[(r["model"], r["layer"])][r["design"]] = (r["ours_us"], estimated_timing(launch_work(r), timer.device,
                                                                                    timer.params))
    return dict(out)


def factors_from(layers: dict, launch_us: float, overlap: float, per_design: bool, leave_out=None) -> dict:
    """Per design, measured over priced on `layers` (but `leave_out`): lospmm.kernel.estimate.design_factors;
    1 for every design without `per_design`."""
    if not per_design:
        return defaultdict(lambda: 1.0)
    samples = [(d, us, t) for k, v in layers.items() if k != leave_out for d, (us, t) in v.items()]
    return defaultdict(lambda: 1.0, design_factors(samples, launch_us, overlap))


def choices(layers: dict, launch_us: float, overlap: float, factors_for) -> dict:
    """Per layer, the design priced lowest (overlapped_us × its factor, `factors_for(layer)`) against the
    best measured; the share within CHOICE_WITHIN and the geomean gain over the best single design.
    Only layers with two designs or more measured count (one is no choice); none: NaN figures."""
    layers = {k: v for k, v in layers.items() if len(v) >= 2}
    complete = [d for d in {d for v in layers.values() for d in v} if all(d in v for v in layers.values())]
    if not layers:
        return {"layers": 0, "within 5% of the best": float("nan"), "gain over the best single design": float("nan"),
                "best single design": ""}
    within, chosen = 0, {}
    for layer, designs in layers.items():
        factor = factors_for(layer)
        price = {d: overlapped_us(t, launch_us, overlap) * factor[d] for d, (_, t) in designs.items()}
        pick = min(price, key=price.get)
        best = min(us for us, _ in designs.values())
        within += designs[pick][0] <= (1 + CHOICE_WITHIN) * best
        chosen[layer] = designs[pick][0]
    single = min(complete, key=lambda d: geomean([layers[k][d][0] for k in layers])) if complete else ""
    gain = (geomean([layers[k][single][0] for k in layers]) / geomean([chosen[k] for k in layers])
            if single else float("nan"))  # a cut-off run where no design reached every layer
    return {"layers": len(layers), "within 5% of the best": within / len(layers),
            "gain over the best single design": gain, "best single design": single}


def price_verdicts(path: Path, pricing=None) -> list[dict]:
    """What the shipped design price (lospmm.kernel.estimate.DESIGN_PRICINGS["h100"], or `pricing`)
    chooses on the A/B rows of `path` (the designs step's, or designs-held-out's): with its shipped
    factors (held out where `path` is not what they were fitted on), and with each layer held out
    while the factors are fitted again on the others; [] where the file holds no A/B launch."""
    from lospmm.devices import device_named
    from lospmm.kernel.estimate import estimate_timer

    pricing = pricing or DESIGN_PRICINGS["h100"]
    timer = estimate_timer(device_named("h100"))  # the factors are over this calibration's terms
    layers = ab_layers(path, timer)
    if not layers:
        return []
    launch_us, shipped = timer.params.launch_us, defaultdict(lambda: 1.0, dict(pricing.factors))
    return [{"pricing": f"{pricing.label}: its factors", **choices(layers, launch_us, pricing.overlap, lambda _: shipped)},
            {"pricing": f"overlap {pricing.overlap:g}, factors refitted with each layer held out",
             **held_out_choices(layers, launch_us, pricing.overlap, True)}]


def held_out_choices(layers: dict, launch_us: float, overlap: float, per_design: bool) -> dict:
    """choices with each layer held out while the per-design factors are fitted on the others."""
    return choices(layers, launch_us, overlap,
                   lambda held: factors_from(layers, launch_us, overlap, per_design, leave_out=held))


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--ab", type=Path, default=AB, help="the designs step's kernel-speed-ab.parquet (the fit's card)")
    p.add_argument("--other", type=Path, nargs="*", default=list(OTHER_CARDS),
                   help="the A/B measured on other cards, or other layers (designs-held-out): the factors fitted "
                        "on --ab choose there")
    p.add_argument("--tiles", type=Path, nargs="*", default=list(TILES),
                   help="launch lists of measured top-K tiles per layer (the plan-before's sample sets)")
    p.add_argument("--gpu", default="h100", help="the estimate's device (its calibration)")
    p.add_argument("--overlaps", type=float, nargs="+", default=[8.0, 4.0, 3.0, 2.0, 1.5, 1.0])
    p.add_argument("--ship", type=float, default=SHIPPED_OVERLAP,
                   help="the overlap whose factors, fitted on every --ab layer, are printed as a DesignPricing")
    args = p.parse_args(argv)
    import pyarrow.parquet as pq

    from lospmm.devices import device_named
    from lospmm.kernel.estimate import estimate_timer

    timer = estimate_timer(device_named(args.gpu))
    launch_us = timer.params.launch_us
    layers = ab_layers(args.ab, timer)
    best = {k: min(us for us, _ in v.values()) for k, v in layers.items()}
    complete = [d for d in {d for v in layers.values() for d in v} if all(d in v for v in layers.values())]
    single = min(complete, key=lambda d: geomean([layers[k][d][0] for k in layers]))
    ceiling = geomean([layers[k][single][0] for k in layers]) / geomean(list(best.values()))
    others = {path: there for path in args.other if path.exists() and path != args.ab
              for there in [ab_layers(path, timer)] if there}

    def row(name: str, overlap: float, per_design: bool) -> dict:
        out = {"pricing": name, **held_out_choices(layers, launch_us, overlap, per_design)}
        fitted = factors_from(layers, launch_us, overlap, per_design)
        for path, there in others.items():  # every layer of another card, priced with this card's factors
            verdict = choices(there, launch_us, overlap, lambda _: fitted)
            where = f"{path.parent.parent.name}/{path.parent.name}"
            out[f"{where}: within 5%"] = verdict["within 5% of the best"]
            out[f"{where}: gain"] = verdict["gain over the best single design"]
        return out

    rows = [row("max (shipped estimate)", math.inf, False), row("max × design", math.inf, True)]
    rows += [row(f"{p:g}-norm × design", p, True) for p in args.overlaps]
    print_table(f"the design chosen on {len(layers)} A/B layers ({args.ab}), each held out while the per-design "
                f"factors are fitted on the others; on the other cards, every layer with the factors fitted on all of "
                f"these; ceiling (best per layer over {single}): {ceiling:.3f}", rows)
    fitted = factors_from(layers, launch_us, args.ship, True)
    print(f"DesignPricing fitted on every layer of {args.ab} at overlap {args.ship:g} "
          f"(lospmm.kernel.estimate.DESIGN_PRICINGS):")
    print("    factors=(" + "".join(f"\n        ({d!r}, {f:.4f})," for d, f in sorted(fitted.items())) + "\n    )")

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
        return overlapped_us(estimated_timing(work, timer.device, timer.params), launch_us, overlap)

    for overlap in args.overlaps:
        table = calibration_rows(sets, timer.device, timer.params, timer.device, timer.params,
                                 after=lambda work, overlap=overlap: normed(work, overlap))
        print_table(f"tiles within a layer, the shipped model (before) against the {overlap:g}-norm (after): "
                    f"Spearman pooled and within a layer, the loss of the estimate's choice among the measured top-K",
                    [{k: v for k, v in r.items() if "spearman" in k or "within" in k or "choice" in k or k in ("set", "role")}
                     for r in table])


if __name__ == "__main__":
    main()
