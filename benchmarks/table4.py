"""Table 4 from measured launch files, with its noise band (issue 24, item 2): per sampled layer and
strategy, the tile the strategy chooses, the best measured full kernel, the loss (chosen / best − 1)
and the repeat-to-repeat spread of the two measurements, so that a loss inside the noise is seen as such.

    python -m benchmarks.table4 FILE [FILE ...] [--name NAME] [--ranker STEM] [--out FILE.parquet]

FILEs are the device program's kernel-speed files of a sample bundle (benchmarks.device's table4
steps; the plan before it wrote launches-*.parquet, read alike). Files that measured the same kernels
(the same `id`) are repeats: each kernel's time is their median and its spread (max − min) / median
(NaN with one repeat: no noise band, said so in the table). Strategies:
- proxies: the emit stage's rule on the measured proxies (fastest_proxy, its 5% tie band);
- ranker: the ranker's top-1 among the layer's measured full kernels (default: the shipped model);
- estimate: the estimate timer's fastest full kernel (the device's calibration, recomputed here).
The best is over every measured full kernel of the layer (the plain variant and those outside the
ranker's top-k). From a sample prepared with `--every-kept`, it is over every kept candidate instead
(one cubin per M1 that reads N1 at launch: one kind of kernel for all of the layer's picks), the
ranker's top-1 is over every kept candidate launched, measured or not, and `kept_launched` /
`kept_measured` say whether the best is over all of them. A strategy whose tile has no measured full
kernel gets loss NaN.

Writes benchmarks/results/<device folder of the first file>/table4-<name>.parquet with the columns
model, layer, sparsity, strategy, chosen_tile, best_tile, loss, spread, beyond_noise, chosen_us,
best_us, repeats, and prints the table and each strategy's mean loss.
"""

from __future__ import annotations

import argparse
from pathlib import Path

import numpy as np

from benchmarks.analysis import STRATEGIES, launch_rows, repeated, table4_strategy_rows


def main(argv=None) -> list[dict]:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("files", nargs="+", type=Path)
    p.add_argument("--name", default=None, help="the table's name (default: the first file's stem)")
    p.add_argument("--ranker", type=Path, default=None, help="ranker model stem (default: the shipped one)")
    p.add_argument("--gpu", default="h100", help="device table whose calibrated estimate is the estimate strategy")
    p.add_argument("--out", type=Path, default=None)
    args = p.parse_args(argv)
    import pyarrow as pa
    import pyarrow.parquet as pq

    from lospmm.devices import device_named
    from lospmm.flows.storage.ranker_store import load_ranker
    from lospmm.kernel.estimate import estimate_timer

    tables = [launch_rows(pq.read_table(f).to_pylist()) for f in args.files]
    kernels = repeated(tables)
    booster, meta = load_ranker(args.ranker)
    timer = estimate_timer(device_named(args.gpu))
    launched = list({(r["model"], r["layer"], float(r["sparsity"]), r["id"]): r for rows in tables for r in rows}.values())
    rows = table4_strategy_rows(kernels, booster, timer, launched)
    name = args.name or args.files[0].stem.removeprefix("launches-").removeprefix("kernel-speed-")
    out = args.out or args.files[0].parent.parent / f"table4-{name}.parquet"
    pq.write_table(pa.Table.from_pylist(rows), out)
    print(f"Table 4 from {', '.join(str(f) for f in args.files)}: ranker {meta.get('version')}, {timer.name}")
    print(f"{'model':13} {'layer':38} {'s':>4} {'strategy':9} {'chosen':>8} {'best':>8} {'loss':>7} {'spread':>7} beyond")
    for r in rows:
        print(f"{r['model']:13} {r['layer'][:38]:38} {r['sparsity']:4.2f} {r['strategy']:9} {r['chosen_tile']:>8} "
              f"{r['best_tile']:>8} {r['loss']:7.1%} {r['spread']:7.1%} {r['beyond_noise']}")
    for strategy in STRATEGIES:
        losses = [r["loss"] for r in rows if r["strategy"] == strategy and np.isfinite(r["loss"])]
        beyond = [r for r in rows if r["strategy"] == strategy and r["beyond_noise"]]
        if losses:
            print(f"{strategy}: mean loss {np.mean(losses):.1%} over {len(losses)} layers, {sum(v <= 0.02 for v in losses)}"
                  f" within 2%, {len(beyond)} beyond the measurement spread, worst {max(losses):.1%}")
    print(f"wrote {len(rows)} rows to {out}")
    return rows


if __name__ == "__main__":
    main()
