"""Training set and model for the rank stage (`lospmm train-ranker`): synthetic kernels over
Table 3's ranges, every kept candidate timed with the chosen timer."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Callable

import numpy as np

from lospmm.flows.ranker_store import save_ranker
from lospmm.stages.constrain import constrained_candidates
from lospmm.stages.devices import Device, device_named
from lospmm.stages.prune import random_pruned
from lospmm.stages.rank import (RankerParams, SyntheticKernel, SyntheticParams, synthetic_kernels, trained_ranker,
                                training_rows)
from lospmm.stages.reorder import distinct_m1s, reordered_tiles, tile_stats
from lospmm.stages.timing import estimated_timing, full_kernel_work


def candidate_rows(sk: SyntheticKernel, device: Device, params: SyntheticParams = SyntheticParams()) -> list[dict]:
    """The kept candidates of one synthetic kernel, with the tiles needed to time them."""
    a = random_pruned(sk.m, sk.k, sk.sparsity, np.random.default_rng(sk.seed))
    tiles = {m1: reordered_tiles(a, m1) for m1 in distinct_m1s(a, params.m1)}
    out = []
    for c in constrained_candidates(sk.n, {m1: tile_stats(t) for m1, t in tiles.items()}, device):
        if c.kept:
            out.append({**vars(c), "sparsity": sk.sparsity, "k": sk.k, "m": sk.m, "n": sk.n,
                        "_tiles": tiles[c.m1], "_matrix": a})
    return out


def estimate_time(device: Device) -> Callable[[SyntheticKernel, dict], float]:
    """The estimate timer on a candidate's full kernel, registers = the §3.2 prediction."""
    def time_of(sk: SyntheticKernel, c: dict) -> float:
        work = full_kernel_work(c["_tiles"], sk.m, sk.k, sk.n, c["n1"], c["pred_regs"])
        return estimated_timing(work, device).time_us
    return time_of


def cuda_time(device: Device, arch: str) -> Callable[[SyntheticKernel, dict], float]:
    """Compile the candidate's full kernel and time it on the GPU (lospmm.runtime)."""
    from lospmm.runtime import time_full_kernel

    def time_of(sk: SyntheticKernel, c: dict) -> float:
        return time_full_kernel(c["_matrix"], c["_tiles"], sk.n, c["n1"], c["pred_regs"], arch).time_us
    return time_of


def train_ranker(out: Path, count: int, gpu: str, timer: str, seed: int = 0,
                 progress: Callable[[int, int], None] | None = None) -> dict:
    """Build the training set, fit, save to `out` (.txt + .json); returns the metadata."""
    device = device_named(gpu)
    t0 = time.perf_counter()
    kernels = synthetic_kernels(count, seed=seed)
    time_of = estimate_time(device) if timer == "estimate" else cuda_time(device, device.arch)
    done = [0]

    def candidates_of(sk):
        done[0] += 1
        if progress:
            progress(done[0], len(kernels))
        return candidate_rows(sk, device)

    x, t, g = training_rows(kernels, candidates_of, time_of)
    if len(np.unique(g)) < 5:
        raise ValueError(f"only {len(np.unique(g))} synthetic kernels had 2+ kept candidates; raise --samples")
    trained = trained_ranker(x, t, g, RankerParams(seed=seed))
    meta = {**trained.metadata, "timer": timer, "device": device.name, "arch": device.arch,
            "synthetic_kernels": count, "samples": int(len(t)), "seed": seed,
            "seconds": round(time.perf_counter() - t0, 1), "created": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
            "table3_ranges": vars(SyntheticParams())}
    return save_ranker(out, trained.booster, meta)
