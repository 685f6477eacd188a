"""What staging B in shared memory for a group of tiles saves in B's traffic through L2 (host only;
an estimate of bytes, not a time). On the H200's headline tables 44 of 93 work-bound kernels are
bound by L2 traffic in the estimate: every tile reads each of its non-empty columns of B over its N1
columns, and K × N1 floats a block do not fit L1. The staged design (lospmm.kernel.render.staged),
whose block of `group` warps walks as many consecutive tiles (in the flow's row order) over the same
32 columns and first copies the union of their non-empty columns of B into shared memory, in chunks
of `chunk` rows of K, reads Σ nnc / |∪ columns| times fewer bytes of B through L2 (each column of
the union once; the chunk does not change it). This prints that ratio per A/B layer, on its A/B
tile at 0.9, and the shared memory one chunk's union needs at most (its columns × 32 floats).

    python -m benchmarks.staged_reuse [--groups 2 4 8 16] [--chunk 256] [--estimate [--warps 1 4]]

With --estimate it also prints the estimate's TIME of the staged kernel over the chained one on each
layer's tiles (kernel.estimate.staged_timing), on the H100's calibration and the H200's datasheet
model, and the term that binds it: the prediction the device program's `staged` step tests.
"""

from __future__ import annotations

import argparse

import numpy as np
import scipy.sparse as sp


def traffic_ratio(a: sp.csr_matrix, tiles, group: int, chunk: int) -> tuple[float, int]:
    """(Σ over tiles of their non-empty columns) / (Σ over groups of `group` consecutive tiles and
    chunks of `chunk` columns of the union's columns), and the largest union of one (group, chunk)."""
    a = sp.csr_matrix(a)
    per_tile = [np.unique(a[tiles.tile(t)].indices) for t in range(tiles.num_tiles)]
    alone = sum(len(c) for c in per_tile)
    staged, largest = 0, 0
    for start in range(0, len(per_tile), group):
        union = np.unique(np.concatenate(per_tile[start:start + group]))
        counts = np.bincount(union // chunk)
        staged += int(counts.sum())
        largest = max(largest, int(counts.max(initial=0)))
    return alone / max(staged, 1), largest


def reuse_rows(groups=(2, 4, 8, 16), chunk: int = 256) -> list[dict]:
    """Per A/B layer (its A/B tile, Algorithm 1's order): the L2 traffic ratio of each group size."""
    from benchmarks.sets import ab_plan, matrix_of, ordered

    out = []
    for p in ab_plan(designs=("chained",)):
        a = matrix_of(p)
        tiles = ordered(a, p)
        row = {"model": p.model, "layer": p.layer, "tile": f"{p.m1}×{p.n1}", "K": p.k,
               "nnc per tile (mean)": float(np.mean(tiles.tile_nnc))}
        for g in groups:
            ratio, largest = traffic_ratio(a, tiles, g, chunk)
            row[f"×{g} tiles: L2 bytes saved"] = ratio
            row[f"×{g}: smem/warp KiB"] = largest * 32 * 4 / 1024  # one chunk's union, 32 columns
        out.append(row)
    return out


def estimate_rows(groups=(4, 8), gpus=("h100", "h200"), warps=(1,)) -> list[dict]:
    """Per A/B layer (its A/B tile, Algorithm 1's order, at its N): the estimate's time of the staged
    kernel with G tiles a block (and each of `warps` warps a tile: N1 = 32·W) over the `chained`
    kernel's (each at the registers predicted), and the term that binds the 8-tile one, on each GPU's
    estimate (the H100's calibration, the H200's datasheet model: kernel.estimate.estimate_timer).
    ESTIMATES: the device program's `staged` step measures them."""
    from benchmarks.sets import ab_plan, matrix_of, ordered
    from lospmm.devices import device_named
    from lospmm.kernel.design import design_named
    from lospmm.kernel.estimate import estimate_timer
    from lospmm.kernel.registers import predicted_registers
    from lospmm.kernel.timing import LaunchUnderTest

    def timed(timer, a, tiles, p, design, n1):
        return timer.time(LaunchUnderTest(tiles, p.m, p.k, p.n, n1, predicted_registers(tiles.m1, design=design),
                                          design=design, matrix=a))

    out = []
    timers = {gpu: estimate_timer(device_named(gpu)) for gpu in gpus}
    for p in ab_plan(designs=("chained",)):
        a = matrix_of(p)
        tiles = ordered(a, p)
        row = {"model": p.model, "layer": p.layer, "tile": f"{p.m1}×{p.n1}", "N": p.n}
        for gpu, timer in timers.items():
            chained = timed(timer, a, tiles, p, design_named("chained"), p.n1)
            row[f"{gpu}: chained µs"] = chained.time_us
            shown = 8 if 8 in groups else groups[-1]  # the term that binds the default's (8 tiles a block)
            for w in warps:
                for g in (g for g in groups if 32 * w * g <= 1024):
                    design = design_named(f"staged,tiles={g},warps={w}")
                    staged = timed(timer, a, tiles, p, design, design.fixed_n1)
                    row[f"{gpu}: ×{g}{'' if w == 1 else f' w{w}'} / chained"] = staged.time_us / chained.time_us
                    if (g, w) == (shown, 1):
                        row[f"{gpu}: ×{g} bound by"] = binding_term(staged)
        out.append(row)
    return out


def binding_term(timing) -> str:
    """The estimate's largest term of a launch: issue, memory, latency or instruction supply."""
    terms = {"issue": timing.compute_us, "memory": timing.memory_us, "latency": timing.latency_us,
             "instruction supply": timing.fetch_us}
    return max(terms, key=lambda k: terms[k])


def main(argv=None) -> list[dict]:
    from benchmarks.analysis import print_table

    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--groups", type=int, nargs="+", default=[2, 4, 8, 16])
    p.add_argument("--chunk", type=int, default=256, help="rows of K a block stages at a time")
    p.add_argument("--estimate", action="store_true",
                   help="also the estimate's time of the staged kernel over the chained one, per GPU (an estimate)")
    p.add_argument("--warps", type=int, nargs="+", default=[1], help="with --estimate: warps a staged tile spans")
    args = p.parse_args(argv)
    rows = reuse_rows(tuple(args.groups), args.chunk)
    print_table(f"B's L2 traffic of today's kernel over a block's staged union (chunks of {args.chunk} rows of K): "
                f"an estimate of bytes, not of time", rows)
    if args.estimate:
        timed = estimate_rows(tuple(args.groups), warps=tuple(args.warps))
        print_table("The estimate's time of the staged kernel over the chained kernel on the same tiles "
                    "(registers predicted; H100: its calibration, H200: the datasheet model): ESTIMATES", timed)
        rows = rows + timed
    return rows


if __name__ == "__main__":
    main()
