"""Training set and model for the rank stage (`lospmm train-ranker`): synthetic kernels over
Table 3's ranges, every kept candidate's full kernel timed with the run's Timer."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Callable

import numpy as np

from lospmm.flows.storage.ranker_store import save_ranker
from lospmm.stages.constrain import layer_candidates
from lospmm.stages.prune import random_pruned
from lospmm.stages.rank import (RankerParams, SyntheticKernel, SyntheticParams, feature_row, synthetic_kernels,
                                trained_ranker, training_rows)
from lospmm.stages.reorder import tile_stats
from lospmm.stages.search import full_kernel_time, layer_tiles
from lospmm.stages.timing import Timer


def candidate_rows(sk: SyntheticKernel, device, params: SyntheticParams = SyntheticParams()) -> list[dict]:
    """The kept candidates of one synthetic kernel (the search's own reorder and constrain), with
    the tiles needed to time them."""
    a = random_pruned(sk.m, sk.k, sk.sparsity, np.random.default_rng(sk.seed))
    tiles = layer_tiles(a, params.m1)
    return [{**vars(c), **feature_row(c, sk.sparsity, sk.k), "m": sk.m, "n": sk.n, "_tiles": tiles[c.m1],
             "_matrix": a}
            for c in layer_candidates(sk.n, {m1: tile_stats(t) for m1, t in tiles.items()}, device)
            if c.removed_by is None]  # fallbacks are not examples of good tiles


def candidate_time(timer: Timer) -> Callable[[SyntheticKernel, dict], float]:
    """µs of a candidate's full kernel (search.full_kernel_time: compiled first when the timer runs
    binaries, a failed compile times as inf; else estimated at the register prediction)."""
    def time_of(sk: SyntheticKernel, c: dict) -> float:
        return full_kernel_time(timer, c["_matrix"], c["_tiles"], sk.m, sk.k, sk.n, c["n1"])
    return time_of


def train_ranker(out: Path, count: int, timer: Timer, seed: int = 0,
                 progress: Callable[[int, int], None] | None = None) -> dict:
    """Build the training set, fit, save to `out` (.txt + .json); returns the metadata."""
    device = timer.device
    t0 = time.perf_counter()
    kernels = synthetic_kernels(count, seed=seed)
    done = [0]

    def candidates_of(sk):
        done[0] += 1
        if progress:
            progress(done[0], len(kernels))
        return candidate_rows(sk, device)

    x, t, g = training_rows(kernels, candidates_of, candidate_time(timer))
    if len(np.unique(g)) < 5:
        raise ValueError(f"only {len(np.unique(g))} synthetic kernels had 2+ kept candidates; raise --samples")
    trained = trained_ranker(x, t, g, RankerParams(seed=seed))
    meta = {**trained.metadata, "timer": timer.name, "device": device.name, "arch": device.arch,
            "synthetic_kernels": count, "samples": int(len(t)), "seed": seed,
            "seconds": round(time.perf_counter() - t0, 1), "created": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
            "table3_ranges": vars(SyntheticParams())}
    return save_ranker(out, trained.booster, meta)
