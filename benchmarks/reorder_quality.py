"""Reorder quality, the paper's §4.3 experiment: 1024×1024, 98% sparse, 32 blocks of 32 rows;
blocks i and i+16 share a fraction R of their nonzero positions, adjacent blocks (i, i+1 for even
i) differ in nnz by a ratio. Tiles of 32 rows: max non-empty columns per tile (the memory traffic
Alg. 1 minimises) for identity, our Algorithm 1, and KaHyPar (connectivity objective, rows as
nodes weighted by nnz, columns as nets, k = 32, ε = 0.03), with each one's run time.

    pip install -e '.[bench]'   # kahypar
    python -m benchmarks.reorder_quality --kahypar-config km1_kKaHyPar_sea20.ini

KaHyPar needs one of its preset .ini files (config/ in the KaHyPar repository); without
--kahypar-config its columns are left out, and the table says so.
"""

from __future__ import annotations

import argparse
import time

import numpy as np
import scipy.sparse as sp
from rich.console import Console
from rich.table import Table

from lospmm.stages.reorder import identity_tiles, reordered_tiles, tile_stats

M = K = 1024
BLOCKS, ROWS = 32, 32


def similar_blocks_matrix(similarity: float, nnz_ratio: float, rng: np.random.Generator) -> sp.csr_matrix:
    """The §4.3 matrix: 98% sparse overall; block b+16 repeats `similarity` of block b's positions."""
    low = 0.04 / (1 + nnz_ratio)  # adjacent blocks at low and ratio·low average to 2% density
    dense = np.zeros((M, K), dtype=bool)
    cells = ROWS * K
    for b in range(BLOCKS // 2):
        count = int(round((low if b % 2 == 0 else low * nnz_ratio) * cells))
        first = rng.choice(cells, size=count, replace=False)
        shared = rng.choice(first, size=int(round(similarity * count)), replace=False)
        rest = rng.choice(np.setdiff1d(np.arange(cells), first), size=count - len(shared), replace=False)
        for blk, flat in ((b, first), (b + BLOCKS // 2, np.concatenate([shared, rest]))):
            block = np.zeros(cells, dtype=bool)
            block[flat] = True
            dense[blk * ROWS:(blk + 1) * ROWS] = block.reshape(ROWS, K)
    values = rng.standard_normal((M, K)).astype(np.float32)
    return sp.csr_matrix(np.where(dense, values, 0))


def kahypar_tiles(a: sp.csr_matrix, parts: int, config: str, seed: int = 0) -> tuple[list[np.ndarray], float]:
    import kahypar

    t0 = time.perf_counter()
    row_nnz = np.diff(a.indptr)
    rows = np.flatnonzero(row_nnz)
    node_of = {int(r): i for i, r in enumerate(rows)}
    csc = a[rows].tocsc()
    nets, index = [], [0]
    for c in range(a.shape[1]):
        pins = csc.indices[csc.indptr[c]:csc.indptr[c + 1]]
        if len(pins) >= 2:  # single-pin nets never add to the connectivity objective
            nets.extend(int(p) for p in pins)
            index.append(len(nets))
    hg = kahypar.Hypergraph(len(rows), len(index) - 1, index, nets, parts, [1] * (len(index) - 1),
                            [int(w) for w in row_nnz[rows]])
    ctx = kahypar.Context()
    ctx.loadINIconfiguration(config)
    ctx.setK(parts)
    ctx.setEpsilon(0.03)
    ctx.setSeed(seed)
    ctx.suppressOutput(True)
    kahypar.partition(hg, ctx)
    block = np.array([hg.blockID(node_of[int(r)]) for r in rows])
    return [rows[block == p] for p in range(parts)], time.perf_counter() - t0


def _max_nnc(a: sp.csr_matrix, groups: list[np.ndarray]) -> int:
    return max((len(np.unique(a[g].indices)) for g in groups if len(g)), default=0)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--kahypar-config", help="KaHyPar preset .ini (e.g. km1_kKaHyPar_sea20.ini)")
    ap.add_argument("--ratios", type=float, nargs="+", default=[1.0, 2.0, 3.0])
    ap.add_argument("--similarities", type=float, nargs="+", default=[round(0.1 * i, 1) for i in range(10)])
    args = ap.parse_args()
    reordered_tiles(sp.csr_matrix(np.eye(4, dtype=np.float32)), 2)  # JIT outside the timings

    table = Table(title="max non-empty columns per 32-row tile (lower is less B traffic); seconds per method")
    cols = ["nnz ratio", "R", "identity", "ours", "ours nnz COV", "ours s"]
    if args.kahypar_config:
        cols += ["KaHyPar", "KaHyPar rows/tile max", "KaHyPar nnz COV", "KaHyPar s"]
    for c in cols:
        table.add_column(c)
    rng = np.random.default_rng(0)
    for ratio in args.ratios:
        for sim in args.similarities:
            a = similar_blocks_matrix(sim, ratio, rng)
            ident = tile_stats(identity_tiles(a, ROWS))
            t0 = time.perf_counter()
            ours_tiles = reordered_tiles(a, ROWS)
            ours_s = time.perf_counter() - t0
            ours = tile_stats(ours_tiles)
            row = [f"{ratio:g}", f"{sim:.1f}", str(ident.max_nnc), str(ours.max_nnc), f"{ours.cov_nnz:.3f}", f"{ours_s:.4f}"]
            if args.kahypar_config:
                groups, kh_s = kahypar_tiles(a, BLOCKS, args.kahypar_config)
                nnz = np.array([a[g].nnz for g in groups], dtype=float)
                row += [str(_max_nnc(a, groups)), str(max(len(g) for g in groups)),
                        f"{nnz.std() / nnz.mean():.3f}", f"{kh_s:.3f}"]
            table.add_row(*row)
    Console(width=160).print(table)
    if not args.kahypar_config:
        print("KaHyPar columns left out: pass --kahypar-config PRESET.ini")


if __name__ == "__main__":
    main()
