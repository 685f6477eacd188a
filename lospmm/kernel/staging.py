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


def _tile_columns(matrix: sp.csr_matrix, tiles) -> list[np.ndarray]:
    """Each tile's columns of A, one per nonzero (a column as often as its rows in the tile hold it)."""
    a = sp.csr_matrix(matrix)
    return [a[tiles.tile(t)].indices for t in range(tiles.num_tiles)]


def _block_counts(columns: list[np.ndarray], per_block: int, chunks: int, chunk_rows: int) -> np.ndarray:
    """staged_counts from each tile's columns (_tile_columns)."""
    groups = block_tiles(len(columns), per_block)
    out = np.zeros((len(groups), chunks), np.int32)
    for g, group in enumerate(groups):
        union = np.unique(np.concatenate([columns[t] for t in group]))
        out[g] = np.bincount(union // chunk_rows, minlength=chunks)[:chunks]
    return out


def staged_counts(matrix: sp.csr_matrix, tiles, per_block: int, chunk_rows: int = STAGED_ROWS) -> np.ndarray:
    """Columns of B each staged block copies in each chunk of K: an int32 array (blocks × chunks),
    the size of the union of its tiles' non-empty columns there (0: the chunk is skipped, no
    barrier)."""
    return _block_counts(_tile_columns(matrix, tiles), per_block, chunk_count(matrix.shape[1], chunk_rows), chunk_rows)


def design_counts(matrix: sp.csr_matrix, tiles, design) -> np.ndarray:
    """staged_counts of a staged `design` (kernel.design.KernelDesign): its tiles a block, its chunks."""
    return staged_counts(matrix, tiles, design.tiles_per_block, design.staged_rows)


def staged_shared_bytes(counts: np.ndarray, columns: int, element_bytes: int = 4) -> int:
    """A staged block's shared memory: its largest chunk's union, `columns` (its N1) floats each."""
    return int(counts.max(initial=0)) * columns * element_bytes


def _chunk_work(columns: list[np.ndarray], chunks: int, chunk_rows: int) -> tuple[np.ndarray, np.ndarray]:
    """chunk_work from each tile's columns (_tile_columns)."""
    loads = np.zeros((len(columns), chunks), np.int64)
    fmas = np.zeros((len(columns), chunks), np.int64)
    for t, tile_columns in enumerate(columns):
        fmas[t] = np.bincount(tile_columns // chunk_rows, minlength=chunks)[:chunks]
        loads[t] = np.bincount(np.unique(tile_columns) // chunk_rows, minlength=chunks)[:chunks]
    return loads, fmas


def chunk_work(matrix: sp.csr_matrix, tiles, chunk_rows: int = STAGED_ROWS) -> tuple[np.ndarray, np.ndarray]:
    """Each tile's loads (its non-empty columns) and multiply-adds (its nonzeros) in each chunk of K:
    two int64 arrays (tiles × chunks); each row sums to the tile's tile_nnc and tile_nnz."""
    return _chunk_work(_tile_columns(matrix, tiles), chunk_count(matrix.shape[1], chunk_rows), chunk_rows)


def design_work(matrix: sp.csr_matrix, tiles, design) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """What the estimate of a staged `design`'s kernel needs, from one pass over its tiles: its
    blocks' copies (design_counts) and its tiles' loads and multiply-adds per chunk (chunk_work)."""
    columns, rows = _tile_columns(matrix, tiles), design.staged_rows
    chunks = chunk_count(matrix.shape[1], rows)
    return (_block_counts(columns, design.tiles_per_block, chunks, rows), *_chunk_work(columns, chunks, rows))
