"""Stage 3, reorder: A and a row-tile height M1 -> row groups (A_tiles), Algorithm 1 of §4.2.

Rows are taken in ascending nnz order (empty rows dropped: their output rows are zero). Each
row joins the open tile (fewer than M1 rows) whose merged non-empty-column count (nnc) is
smallest among those whose merged nnz stays within TH_nnz = nnz(A) / num_tiles; if every open
tile would exceed TH_nnz, the open tile with the smallest merged nnc. Ties go to the lowest tile
id (a stable sort by nnc). Column sets are bitsets, so a row costs O(tiles · K/64) word ops.

The identity grouping (non-empty rows in their original order, M1 at a time) is computed
beside it as the baseline.
"""

from __future__ import annotations

from dataclasses import dataclass

import numba
import numpy as np
import scipy.sparse as sp


@dataclass(frozen=True)
class ReorderParams:
    """Defaults: row_order="ascending" (Alg. 1 processes rows by ascending nnz; "descending"
    is offered for experiments)."""

    row_order: str = "ascending"


@dataclass(frozen=True)
class Tiles:
    """A_tiles for one M1: tile t holds rows[tile_ptr[t]:tile_ptr[t+1]] of A (original ids)."""

    m1: int
    rows: np.ndarray  # int32, the non-empty rows, tile after tile
    tile_ptr: np.ndarray  # int32, num_tiles + 1 offsets into rows
    tile_nnz: np.ndarray  # int32 per tile
    tile_nnc: np.ndarray  # int32 per tile: distinct columns touched
    empty_rows: np.ndarray  # int32, rows with no nonzero (left out of every tile)

    @property
    def num_tiles(self) -> int:
        return len(self.tile_ptr) - 1

    def tile(self, t: int) -> np.ndarray:
        return self.rows[self.tile_ptr[t] : self.tile_ptr[t + 1]]


@dataclass(frozen=True)
class TileStats:
    """Summary of a grouping: what §4 optimises (max nnc) and the balance it keeps (nnz COV)."""

    num_tiles: int
    max_nnc: int
    mean_nnc: float
    nnc_sum: int
    max_nnz: int
    cov_nnz: float


def distinct_m1s(matrix: sp.csr_matrix, m1s) -> list[int]:
    """The M1 values worth tiling: an M1 above the non-empty row count tiles like that count, so
    each such M1 is kept once, as that count."""
    nonempty = max(1, int((sp.csr_matrix(matrix).getnnz(axis=1) > 0).sum()))
    return sorted({min(int(m), nonempty) for m in m1s})


def reordered_tiles(matrix: sp.csr_matrix, m1: int, params: ReorderParams = ReorderParams()) -> Tiles:
    """Algorithm 1: group the non-empty rows of `matrix` into tiles of at most `m1` rows."""
    a = _canonical(matrix)
    if m1 < 1:
        raise ValueError(f"M1 must be >= 1, got {m1}")
    if params.row_order not in ("ascending", "descending"):
        raise ValueError(f"row_order must be 'ascending' or 'descending', got {params.row_order!r}")
    row_nnz = np.diff(a.indptr)
    nonempty = np.flatnonzero(row_nnz)
    key = row_nnz[nonempty] if params.row_order == "ascending" else -row_nnz[nonempty]
    order = nonempty[np.argsort(key, kind="stable")].astype(np.int64)
    num_tiles = -(-len(order) // m1)
    assign, tile_nnz, tile_nnc = _assign_rows(
        a.indptr.astype(np.int64), a.indices.astype(np.int64), a.shape[1], order, m1, num_tiles
    )
    # Rows of a tile in ascending original order: deterministic, and friendlier stores.
    by_tile = np.lexsort((order, assign))
    rows = order[by_tile].astype(np.int32)
    tile_ptr = np.zeros(num_tiles + 1, dtype=np.int32)
    np.cumsum(np.bincount(assign, minlength=num_tiles), out=tile_ptr[1:])
    return Tiles(m1, rows, tile_ptr, tile_nnz.astype(np.int32), tile_nnc.astype(np.int32),
                 np.flatnonzero(row_nnz == 0).astype(np.int32))


def identity_tiles(matrix: sp.csr_matrix, m1: int) -> Tiles:
    """The baseline: non-empty rows in original order, `m1` per tile."""
    a = _canonical(matrix)
    if m1 < 1:
        raise ValueError(f"M1 must be >= 1, got {m1}")
    row_nnz = np.diff(a.indptr)
    rows = np.flatnonzero(row_nnz).astype(np.int32)
    num_tiles = -(-len(rows) // m1)
    tile_ptr = np.minimum(np.arange(num_tiles + 1, dtype=np.int64) * m1, len(rows)).astype(np.int32)
    nnz, nnc = _tile_counts(a.indptr.astype(np.int64), a.indices.astype(np.int64), a.shape[1],
                            rows.astype(np.int64), tile_ptr.astype(np.int64))
    return Tiles(m1, rows, tile_ptr, nnz.astype(np.int32), nnc.astype(np.int32),
                 np.flatnonzero(row_nnz == 0).astype(np.int32))


def tile_stats(tiles: Tiles) -> TileStats:
    """max/mean nnc, nnc sum, max nnz and the coefficient of variation of nnz across tiles."""
    if tiles.num_tiles == 0:
        return TileStats(0, 0, 0.0, 0, 0, 0.0)
    nnz = tiles.tile_nnz.astype(np.float64)
    mean = nnz.mean()
    return TileStats(
        num_tiles=tiles.num_tiles,
        max_nnc=int(tiles.tile_nnc.max()),
        mean_nnc=float(tiles.tile_nnc.mean()),
        nnc_sum=int(tiles.tile_nnc.sum()),
        max_nnz=int(nnz.max()),
        cov_nnz=float(nnz.std() / mean) if mean > 0 else 0.0,
    )


def _canonical(matrix) -> sp.csr_matrix:
    a = sp.csr_matrix(matrix)
    if not a.has_canonical_format:
        a = a.copy()
        a.sum_duplicates()
    return a


@numba.njit(inline="always")
def _popcount(x):
    x = x - ((x >> np.uint64(1)) & np.uint64(0x5555555555555555))
    x = (x & np.uint64(0x3333333333333333)) + ((x >> np.uint64(2)) & np.uint64(0x3333333333333333))
    x = (x + (x >> np.uint64(4))) & np.uint64(0x0F0F0F0F0F0F0F0F)
    return (x * np.uint64(0x0101010101010101)) >> np.uint64(56)


@numba.njit(cache=True, nogil=True)
def _assign_rows(indptr, indices, k, order, m1, num_tiles):
    words = (k + 63) // 64
    bits = np.zeros((max(num_tiles, 1), words), dtype=np.uint64)
    size = np.zeros(num_tiles, dtype=np.int64)
    nnz = np.zeros(num_tiles, dtype=np.int64)
    nnc = np.zeros(num_tiles, dtype=np.int64)
    assign = np.empty(len(order), dtype=np.int64)
    total = indptr[-1]
    th_nnz = total / num_tiles if num_tiles > 0 else 0.0
    row_bits = np.zeros(words, dtype=np.uint64)
    # Open tiles kept compact; ties are broken by tile id explicitly, so their order is free.
    open_tiles = np.arange(num_tiles)
    n_open = num_tiles
    for i in range(len(order)):
        r = order[i]
        row_bits[:] = 0
        for p in range(indptr[r], indptr[r + 1]):
            c = indices[p]
            row_bits[c >> 6] |= np.uint64(1) << np.uint64(c & 63)
        rn = indptr[r + 1] - indptr[r]
        best_any, best_any_nnc = -1, 1 << 62
        best_ok, best_ok_nnc = -1, 1 << 62
        for j in range(n_open):
            t = open_tiles[j]
            overlap = 0
            if nnc[t] > 0:
                for w in range(words):
                    overlap += _popcount(bits[t, w] & row_bits[w])
            merged = nnc[t] + rn - overlap
            if merged < best_any_nnc or (merged == best_any_nnc and t < best_any):
                best_any, best_any_nnc = t, merged
            if nnz[t] + rn <= th_nnz and (merged < best_ok_nnc or (merged == best_ok_nnc and t < best_ok)):
                best_ok, best_ok_nnc = t, merged
        cid = best_ok if best_ok >= 0 else best_any
        assign[i] = cid
        for w in range(words):
            bits[cid, w] |= row_bits[w]
        nnc[cid] = best_ok_nnc if best_ok >= 0 else best_any_nnc
        nnz[cid] += rn
        size[cid] += 1
        if size[cid] == m1:
            for j in range(n_open):
                if open_tiles[j] == cid:
                    open_tiles[j] = open_tiles[n_open - 1]
                    n_open -= 1
                    break
    return assign, nnz, nnc


@numba.njit(cache=True, nogil=True)
def _tile_counts(indptr, indices, k, rows, tile_ptr):
    num_tiles = len(tile_ptr) - 1
    nnz = np.zeros(num_tiles, dtype=np.int64)
    nnc = np.zeros(num_tiles, dtype=np.int64)
    seen = np.full(k, -1, dtype=np.int64)
    for t in range(num_tiles):
        for i in range(tile_ptr[t], tile_ptr[t + 1]):
            r = rows[i]
            nnz[t] += indptr[r + 1] - indptr[r]
            for p in range(indptr[r], indptr[r + 1]):
                c = indices[p]
                if seen[c] != t:
                    seen[c] = t
                    nnc[t] += 1
    return nnz, nnc
