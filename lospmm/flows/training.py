"""Training set and model for the rank stage (`lospmm train-ranker`): synthetic kernels over
Table 3's ranges, every kept candidate's full kernel timed with the run's Timer."""

from __future__ import annotations

import time
from dataclasses import asdict
from pathlib import Path
from typing import Callable

import numpy as np

from lospmm.flows.storage.ranker_store import save_ranker
from lospmm.kernel.design import BASELINE, KernelDesign, design_named
from lospmm.kernel.numbers import in_format
from lospmm.stages.constrain import layer_candidates
from lospmm.stages.prune import random_pruned
from lospmm.stages.rank import (FEATURES, RankerParams, SyntheticKernel, SyntheticParams, design_feature_names,
                                feature_row, synthetic_kernels, trained_ranker, training_rows)
from lospmm.stages.reorder import tile_stats
from lospmm.search import full_kernel_time, layer_tiles
from lospmm.kernel.timing import Timer


def candidate_rows(sk: SyntheticKernel, device, params: SyntheticParams = SyntheticParams(),
                   design: KernelDesign = BASELINE, designs: tuple[KernelDesign, ...] = ()) -> list[dict]:
    """The kept candidates of one synthetic kernel (the search's own reorder and constrain) for
    kernels of `design`, or of each of `designs` (one group: a design-aware ranker's example), with
    the tiles needed to time them (a half design's A rounded to its dtype)."""
    a = random_pruned(sk.m, sk.k, sk.sparsity, np.random.default_rng(sk.seed))
    a = in_format(a, (designs[0] if designs else design).number)[0]
    tiles = layer_tiles(a, sk.n, params.m1, params.reorder)
    return [{**vars(c), **feature_row(c, sk.sparsity, sk.k), "m": sk.m, "n": sk.n, "_tiles": tiles[c.m1],
             "_matrix": a}
            for c in layer_candidates(sk.n, {m1: tile_stats(t) for m1, t in tiles.items()}, device, design=design,
                                      designs=designs)
            if c.removed_by is None]  # fallbacks are not examples of good tiles


def candidate_time(timer: Timer, design: KernelDesign = BASELINE) -> Callable[[SyntheticKernel, dict], float]:
    """µs of a candidate's full kernel in its own design (a row of several designs') or `design`
    (search.full_kernel_time: compiled first when the timer runs binaries, a failed compile times as
    inf; else estimated at the register prediction)."""
    def time_of(sk: SyntheticKernel, c: dict) -> float:
        own = design_named(c["design"]) if c.get("design") else design
        return full_kernel_time(timer, c["_matrix"], c["_tiles"], sk.m, sk.k, sk.n, c["n1"], own)
    return time_of


def train_ranker(out: Path, count: int, timer: Timer, seed: int = 0,
                 progress: Callable[[int, int], None] | None = None, design: KernelDesign = BASELINE,
                 designs: tuple[KernelDesign, ...] = ()) -> dict:
    """Build the training set for kernels of `design`, or a design-aware one over `designs` (each
    synthetic kernel's tiles in every design one group, Table 1's features and the designs': rank.
    design_feature_names), fit,
    save to `out` (.txt + .json); returns the metadata (which names the design or designs)."""
    device = timer.device
    t0 = time.perf_counter()
    kernels = synthetic_kernels(count, seed=seed)
    done = [0]

    def candidates_of(sk):
        done[0] += 1
        if progress:
            progress(done[0], len(kernels))
        return candidate_rows(sk, device, design=design, designs=designs)

    names = FEATURES + design_feature_names(designs) if len(designs) > 1 else FEATURES
    x, t, g = training_rows(kernels, candidates_of, candidate_time(timer, design), names)
    if len(np.unique(g)) < 5:
        raise ValueError(f"only {len(np.unique(g))} synthetic kernels had 2+ kept candidates; raise --samples")
    trained = trained_ranker(x, t, g, RankerParams(seed=seed), names=names)
    meta = {**trained.metadata, "timer": timer.name, "device": device.name, "arch": device.arch,
            "synthetic_kernels": count, "samples": int(len(t)), "seed": seed,
            "seconds": round(time.perf_counter() - t0, 1), "created": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
            "table3_ranges": asdict(SyntheticParams()),
            **({"designs": [d.label for d in designs]} if len(designs) > 1 else {"design": design.label})}
    return save_ranker(out, trained.booster, meta)


def measured_launches(files: list[Path]) -> tuple[list[dict], dict]:
    """The rows of measured launch files (the device program's kernel-speed-*.parquet of a sample
    bundle, or the launches-*.parquet of the plan before it) and the device they were measured on,
    from the env.json beside the first (name, driver; {} when there is none). ValueError names a file
    that cannot be read or holds no measured full kernel."""
    import json

    import pyarrow.parquet as pq

    rows, device = [], {}
    for f in files:
        try:
            table = pq.read_table(f)
        except Exception as e:
            raise ValueError(f"{f}: not a readable launch file ({type(e).__name__}: {e})") from None
        names = set(table.column_names) | {old for new, old in RENAMED.items() if new in table.column_names}
        lacking = sorted(set(LAUNCH_COLUMNS) - names)
        if lacking:
            raise ValueError(f"{f}: not a measured launch file: no {', '.join(lacking)} column(s)")
        table = [r | {old: r[new] for new, old in RENAMED.items() if new in r and old not in r} for r in table.to_pylist()]
        if not any(r.get("role") == "full" and r.get("measured_us") is not None for r in table):
            raise ValueError(f"{f}: no measured full kernel (role 'full', measured_us) in {len(table)} rows")
        rows += table
        env = Path(f).parent / "env.json"
        if env.is_file():
            facts = json.loads(env.read_text(encoding="utf-8"))
            smi = [p.strip() for p in str(facts.get("nvidia_smi", "")).split(",")]
            here = {"device": facts.get("name", ""), "driver": smi[1] if len(smi) > 1 else ""}
            if device and here != device:  # one ranker, one device: its name says which
                raise ValueError(f"{f}: measured on {here['device']} (driver {here['driver']}), the other files on "
                                 f"{device['device']} (driver {device['driver']}): train one ranker per device")
            device = device or here
    return rows, device


# the device program's names (benchmarks.measure) for what the launch files before it called otherwise
RENAMED = {"ours_us": "measured_us", "status": "measure_status"}
# what measured_rows reads of a launch file
LAUNCH_COLUMNS = ("model", "layer", "sparsity", "id", "role", "variant", "m1", "n1", "n", "k", "measured_us",
                  "measure_status", "tile_loads", "tile_fmas")


def measured_ranker_name(device: dict) -> str:
    """`ranker-<device>-<driver>`: a measured ranker is named for what it was measured on."""
    import re

    tag = "-".join(p for p in (device.get("device", ""), device.get("driver", "")) if p) or "unknown-device"
    # no dots: the name is a path stem, and a driver version "580.159.04" would read as a suffix
    return "ranker-" + re.sub(r"[^a-z0-9]+", "-", tag.lower()).strip("-")


def train_measured_ranker(out: Path | None, files: list[Path], seed: int = 0) -> tuple[Path, dict]:
    """A ranker fitted on measured full-kernel times (launch files from a device), held out by
    layer, with the held-out layers' NDCG@10 and top-1 loss of the shipped ranker (before) and of
    this one (after) in its metadata; written to `out` (default: ranker-<device>-<driver> beside
    the first file's folder's parent). Returns (the path stem, the metadata)."""
    from lospmm.flows.storage.ranker_store import load_ranker
    from lospmm.stages.rank import held_out_groups, measured_rows, ranker_quality

    t0 = time.perf_counter()
    rows, device = measured_launches(files)
    x, t, g, layer_of = measured_rows(rows)
    layers = len(set(layer_of.values()))
    if layers < 4:
        raise ValueError(f"{len(layer_of)} measured groups over {layers} layers: a ranker held out by layer needs 4+ "
                         f"layers with 2+ measured tiles each")
    params = RankerParams(seed=seed, min_child_samples=min(RankerParams().min_child_samples, max(2, len(t) // 20)))
    held = held_out_groups(g, params, layer_of)
    trained = trained_ranker(x, t, g, params, held)
    shipped, shipped_meta = load_ranker()
    # every layer held out once (leave one layer out): a small measured set says more this way than
    # through one held-out share
    folds = {"before": [], "after": []}
    for layer in sorted(set(layer_of.values())):
        out_groups = {gid for gid, lay in layer_of.items() if lay == layer}
        fold = trained_ranker(x, t, g, params, out_groups)
        folds["before"].append(ranker_quality(shipped, x, t, g, out_groups))
        folds["after"].append(ranker_quality(fold.booster, x, t, g, out_groups))
    cv = {side: {k: float(np.mean([q[k] for q in qs])) for k in ("ndcg_at_10", "top1_mean_loss", "top1_within_2pct")}
          | {"layers": len(qs)} for side, qs in folds.items()}
    meta = {**trained.metadata, "trained_on": "measured", "measured_files": [str(f) for f in files], **device,
            "leave_one_layer_out": cv,
            "held_out_by": "layer", "heldout_layers": sorted({"/".join(layer_of[h]) for h in held}),
            "before": {"ranker": f"shipped {shipped_meta.get('version')} ({shipped_meta.get('timer')})",
                       **ranker_quality(shipped, x, t, g, held)},
            "after": ranker_quality(trained.booster, x, t, g, held), "samples": int(len(t)), "seed": seed,
            "seconds": round(time.perf_counter() - t0, 1), "created": time.strftime("%Y-%m-%dT%H:%M:%S%z")}
    base = out if out is not None else Path(files[0]).parent.parent / measured_ranker_name(device)
    return base, save_ranker(base, trained.booster, meta)
