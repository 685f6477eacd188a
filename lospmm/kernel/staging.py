"""What a staged block copies (design loads="staged", lospmm.kernel.render.staged): block g walks
tiles g·G .. g·G + G − 1 (G = tiles_per_block, in the tiles' order), and per chunk of K (the design's
staged_rows: STAGED_ROWS at 32 columns a block, fewer at more) the block copies the union of those
tiles' non-empty columns of B into shared memory once. The renderer bakes each union into a copy table; the estimate and the staged proxy
read how many columns each (block, chunk) copies (`staged_counts`), and the estimate each tile's loads
and multiply-adds in each chunk (`chunk_work`: between a chunk's barriers its block waits on its slowest
warp)."""

from __future__ import annotations

import numpy as np
import scipy.sparse as sp

# rows of K a block of 32 columns stages at a time (KernelDesign.staged_rows: fewer at a wider N1): its union
# there is at most 256 columns × 32 floats (32 KiB)
STAGED_ROWS = 256


def block_tiles(num_tiles: int, per_block: int) -> list[list[int]]:
    """The tiles each staged block walks, slot by slot: `per_block` consecutive ones (fewer in the last)."""
    return [list(range(g, min(g + per_block, num_tiles))) for g in range(0, num_tiles, per_block)]


def chunk_count(k: int, rows: int = STAGED_ROWS) -> int:
    """Chunks of `rows` rows that K spans."""
    return -(-k // rows)


def staged_counts(matrix: sp.csr_matrix, tiles, per_block: int, chunk_rows: int = STAGED_ROWS) -> np.ndarray:
    """Columns of B each staged block copies in each chunk of K: an int32 array (blocks × chunks),
    the size of the union of its tiles' non-empty columns there (0: the chunk is skipped, no
    barrier)."""
    a = sp.csr_matrix(matrix)
    chunks = chunk_count(a.shape[1], chunk_rows)
    groups = block_tiles(tiles.num_tiles, per_block)
    out = np.zeros((len(groups), chunks), np.int32)
    for g, group in enumerate(groups):
        union = np.unique(a[np.concatenate([tiles.tile(t) for t in group])].indices)
        out[g] = np.bincount(union // chunk_rows, minlength=chunks)[:chunks]
    return out


def design_counts(matrix: sp.csr_matrix, tiles, design) -> np.ndarray:
    """staged_counts of a staged `design` (kernel.design.KernelDesign): its tiles a block, its chunks."""
    return staged_counts(matrix, tiles, design.tiles_per_block, design.staged_rows)


def staged_shared_bytes(counts: np.ndarray, columns: int, element_bytes: int = 4) -> int:
    """A staged block's shared memory: its largest chunk's union, `columns` (its N1) floats each."""
    return int(counts.max(initial=0)) * columns * element_bytes


def chunk_work(matrix: sp.csr_matrix, tiles, chunk_rows: int = STAGED_ROWS) -> tuple[np.ndarray, np.ndarray]:
    """Each tile's loads (its non-empty columns) and multiply-adds (its nonzeros) in each chunk of K:
    two int64 arrays (tiles × chunks); each row sums to the tile's tile_nnc and tile_nnz."""
    a = sp.csr_matrix(matrix)
    chunks = chunk_count(a.shape[1], chunk_rows)
    loads = np.zeros((tiles.num_tiles, chunks), np.int64)
    fmas = np.zeros((tiles.num_tiles, chunks), np.int64)
    for t in range(tiles.num_tiles):
        columns = a[tiles.tile(t)].indices
        fmas[t] = np.bincount(columns // chunk_rows, minlength=chunks)[:chunks]
        loads[t] = np.bincount(np.unique(columns) // chunk_rows, minlength=chunks)[:chunks]
    return loads, fmas


def design_chunk_work(matrix: sp.csr_matrix, tiles, design) -> tuple[np.ndarray, np.ndarray]:
    """chunk_work in a staged `design`'s chunks."""
    return chunk_work(matrix, tiles, design.staged_rows)
