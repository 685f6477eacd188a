"""What the estimate says of the sliced designs (a tile's K split across a block's warps) before any
device has measured them: each A/B and held-out layer's kernel at 0.9, on the tile the device program's
A/B puts it on (benchmarks.sets.ab_plan: the A it bakes, its M1 and N1, narrowed to whole warps where
a sliced block needs it), priced by the estimate in `chained` and in each sliced design. Every figure is
an ESTIMATE (the device's calibration where one is stored), for the window that measures them
(`python -m benchmarks.device report designs` then gives the measured table).

    python -m benchmarks.sliced_estimate [--gpu h100] [--designs 'chained,slices=2;chained,slices=4;...']
"""

from __future__ import annotations

import argparse
import math

from benchmarks.analysis import geomean, print_table
from benchmarks.sets import AB_HELD_OUT_LAYERS, AB_LAYERS, ab_plan, matrix_of
from lospmm.devices import DEVICES
from lospmm.kernel.choices import PENDING_DESIGNS
from lospmm.kernel.design import design_named
from lospmm.kernel.estimate import estimate_timer
from lospmm.kernel.registers import predicted_registers
from lospmm.kernel.timing import LaunchUnderTest
from lospmm.stages.reorder import reordered_tiles

BASE = "chained"


def estimated_ratios(gpu: str = "h100", designs=PENDING_DESIGNS, layers=AB_LAYERS + AB_HELD_OUT_LAYERS) -> list[dict]:
    """Per layer: the estimate of `chained` on its A/B tile (µs) and each of `designs`' time
    over it (inf where the design cannot run the tile), with the N1 each runs at."""
    timer = estimate_timer(DEVICES[gpu])
    labels = {design_named(d).label: d for d in (BASE, *designs)}
    rows, tiles = [], {}
    for p in ab_plan(designs=(BASE, *designs), layers=layers):
        if p.design not in labels:
            continue
        key = (p.model, p.layer)
        if (key, p.m1) not in tiles:
            a = matrix_of(p)
            tiles[(key, p.m1)] = (a, reordered_tiles(a, p.m1))
        a, t = tiles[(key, p.m1)]
        d = design_named(p.design)
        timing = timer.time(LaunchUnderTest(t, p.m, p.k, p.n, p.n1, predicted_registers(p.m1, design=d), design=d,
                                            matrix=a))
        if not rows or rows[-1]["layer"] != p.layer:
            rows.append({"model": p.model, "layer": p.layer, "M×K×N": f"{p.m}×{p.k}×{p.n}", "M1": p.m1})
        row = rows[-1]
        name = labels[p.design]
        if name == BASE:
            row[f"{BASE} µs"] = round(timing.time_us, 1)
            row["N1"] = p.n1
        else:
            row[name] = timing.time_us
            row[f"{name} N1"] = p.n1
    for row in rows:
        for name in designs:
            row[name] = round(row[name] / row[f"{BASE} µs"], 3) if math.isfinite(row[name]) else math.inf
    return rows


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--gpu", default="h100", choices=sorted(DEVICES))
    ap.add_argument("--designs", default=";".join(PENDING_DESIGNS), help="design labels split by ';'")
    args = ap.parse_args(argv)
    designs = tuple(d for d in args.designs.split(";") if d)
    rows = estimated_ratios(args.gpu, designs)
    print_table(f"ESTIMATE ({args.gpu}): each design's time over {BASE}'s on the A/B tiles at 0.9", rows)
    summary = []
    for name in designs:
        ratios = [r[name] for r in rows if math.isfinite(r[name])]
        summary.append({"design": name, "geomean": round(geomean(ratios), 3), "min": min(ratios), "max": max(ratios),
                        "faster": sum(x < 0.95 for x in ratios), "slower": sum(x > 1.05 for x in ratios),
                        "cannot run": sum(not math.isfinite(r[name]) for r in rows), "layers": len(rows)})
    print_table(f"ESTIMATE ({args.gpu}): over {BASE}, geomean and range (faster/slower: beyond 5%)", summary)


if __name__ == "__main__":
    main()
