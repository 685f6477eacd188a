"""Table 4 from measured launch files, with its noise band (issue 24, item 2): per sampled layer and
strategy, the tile the strategy chooses, the best measured full kernel, the loss (chosen / best − 1)
and the repeat-to-repeat spread of the two measurements, so that a loss inside the noise is seen as such.

    python -m benchmarks.table4 FILE [FILE ...] [--name NAME] [--ranker STEM] [--out FILE.parquet]

FILEs are benchmarks.gpu_plan launch files (launches-*.parquet). Files that measured the same kernels
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
import statistics
from pathlib import Path

import numpy as np

STRATEGIES = ("proxies", "ranker", "estimate")


def repeated(files: list[list[dict]]) -> dict[tuple, dict]:
    """(model, layer, sparsity, id) -> the row (of the first file holding it) with `times` (every
    repeat's measured_us), `measured_us` their median and `spread` (max − min) / median. Launch ids
    do not name the sparsity, so a kernel is a repeat only at the same sparsity; ValueError when
    one key's shape (m, k, n, nnz) differs between files (not the same kernel)."""
    out: dict[tuple, dict] = {}
    for rows in files:
        for r in rows:
            if r.get("measure_status") != "ok" or not np.isfinite(r.get("measured_us") or np.nan):
                continue
            key = (r["model"], r["layer"], float(r["sparsity"]), r["id"])
            first = out.setdefault(key, {**r, "times": []})
            if tuple(first[c] for c in ("m", "k", "n", "nnz")) != tuple(r[c] for c in ("m", "k", "n", "nnz")):
                raise ValueError(f"{r['id']} at sparsity {r['sparsity']}: a different kernel in two files "
                                 f"(m, k, n, nnz differ): not repeats of one measurement")
            first["times"].append(float(r["measured_us"]))
    for r in out.values():
        r["measured_us"] = statistics.median(r["times"])
        r["spread"] = (max(r["times"]) - min(r["times"])) / r["measured_us"] if len(r["times"]) > 1 else float("nan")
    return out


def table4_strategy_rows(kernels: dict[tuple, dict], booster, estimate_timer, launched: list[dict] = ()) -> list[dict]:
    """One row per (model, layer, sparsity, strategy) of the measured `kernels` (repeated's)."""
    from benchmarks.gpuplan import launch_work
    from lospmm.stages.emit import EmitParams, fastest_proxy
    from lospmm.stages.rank import launch_features, feature_matrix
    from lospmm.stages.timing import estimated_timing

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
        proxies = [{**r, "time_us": r["measured_us"], "status": "ok"} for r in mine
                   if r["role"] == "proxy" and r["variant"] == ""]
        if len(full) < 2:
            continue
        best_key = min(full, key=lambda key: full[key]["measured_us"])
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
            loss = row["measured_us"] / best["measured_us"] - 1 if row else float("nan")
            spread = max(row["spread"], best["spread"]) if row else float("nan")
            out.append({"model": model, "layer": layer, "sparsity": sparsity, "strategy": strategy,
                        "chosen_tile": f"{key[0]}×{key[1]}" if key else "", "best_tile": f"{best_key[0]}×{best_key[1]}",
                        "loss": loss, "spread": spread,
                        "beyond_noise": bool(loss > spread) if np.isfinite(loss) and np.isfinite(spread) else None,
                        "chosen_us": row["measured_us"] if row else float("nan"), "best_us": best["measured_us"],
                        "repeats": min(len(best["times"]), len(row["times"])) if row else len(best["times"]),
                        # every kept candidate launched, and how many of them measured: below all, the
                        # best is only the best of those measured
                        "kept_launched": len(kept) if every_kept else None,
                        "kept_measured": len(full) if every_kept else None})
    return out


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

    from lospmm.flows.storage.ranker_store import load_ranker
    from lospmm.stages.devices import device_named
    from lospmm.stages.timing import estimate_timer

    tables = [pq.read_table(f).to_pylist() for f in args.files]
    kernels = repeated(tables)
    booster, meta = load_ranker(args.ranker)
    timer = estimate_timer(device_named(args.gpu))
    launched = list({(r["model"], r["layer"], float(r["sparsity"]), r["id"]): r for rows in tables for r in rows}.values())
    rows = table4_strategy_rows(kernels, booster, timer, launched)
    name = args.name or args.files[0].stem.removeprefix("launches-")
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
