"""Stage 3, reorder: A and a row-tile height M1 -> row groups (A_tiles): several candidate orders,
the one the estimate prices cheapest kept.

A tile of M1 rows loads one row of B per non-empty column (nnc): Σ nnc over the tiles is the
kernel's B traffic, the largest nnc bounds its slowest block. Candidates (`ReorderParams.strategies`):

- identity: the non-empty rows in their original order, M1 at a time;
- algorithm1: Algorithm 1 of §4.2. Rows are taken in ascending nnz order (empty rows dropped: their
  output rows are zero). Each row joins the open tile (fewer than M1 rows) whose merged nnc is
  smallest among those whose merged nnz stays within TH_nnz = nnz(A) / num_tiles; if every open
  tile would exceed TH_nnz, the open tile with the smallest merged nnc. Ties go to the lowest tile
  id. Column sets are bitsets, so a row costs O(tiles · K/64) word ops;
- partition: a hypergraph partition by Mt-KaHyPar (rows as vertices, columns as nets, ceil(rows/M1)
  blocks of at most M1 rows, the connectivity objective km1 = Σ nnc − non-empty columns, ε = 0, its
  deterministic preset). It runs only for the M1s within `partition_m1s` that can still win (their
  cheapest order so far within `partition_within` of the layer's cheapest), cheapest first, while its
  priced cost (`partition_seconds`, a fit of its measured run times) fits the layer's
  `budget_seconds`: priced, not timed, so the same input always gets the same candidates and order;
- refine: row swaps (and moves into tiles with room) between tiles that lower Σ nnc, started from
  the cheaper of identity and Algorithm 1, for the M1s that can still win (as the partition); every
  tile's nnc stays within the start's largest and its nnz within the start's range clipped to
  TH_row's window around the mean (a tile already outside it moves only towards it), so the start's
  max nnc and nnz range bound it too, and from a start whose every tile lies in the window it passes
  constrain's load-balance test (bounded by the start's range alone, it grouped a real detector's
  heavy rows past TH_row and was not eligible; bounded, the kept Σ nnc of that detector at 0.9,
  M1 = 8 went from 0.895 to 0.869 of the identity's). A fixed number of passes over the rows, in a
  fixed order. Where the partitioner ran, refinement runs
  again from its order, nnz balanced first (balanced_tiles: a partition groups alike rows, whose nnz
  often differ past constrain's TH_row), and the cheaper eligible of the two refinements stays.

Every candidate is priced by the estimate (kernel.estimate, the baseline design at N1 = price_n1 on
`price_device`, the layer's N), which weighs Σ nnc (B traffic, issue) and the largest tile (the
slowest block). A candidate is eligible only if its Σ nnc is at most the identity's and its nnz
balance (COV) passes constrain's load-balance test (max_cov_nnz, the run's TH_row) wherever the
identity's does (where the identity's fails it, within the larger of the identity's and Algorithm
1's): the kept order is never above the identity in Σ nnc, and never loses its M1 to a test the
identity passes. Of the eligible, the cheapest estimate is kept; ties go to the lower Σ nnc, then
to the earlier strategy in STRATEGIES.
"""

from __future__ import annotations

import importlib.metadata
import importlib.util
import threading
import time
from dataclasses import dataclass

import numba
import numpy as np
import scipy.sparse as sp


STRATEGIES = ("identity", "algorithm1", "partition", "refine")


@dataclass(frozen=True)
class ReorderParams:
    """Defaults: row_order="ascending" (Alg. 1 processes rows by ascending nnz; "descending" is
    offered for experiments); strategies=STRATEGIES (identity is always a candidate);
    partition_m1s=(8, 64) (the M1 range the partitioner runs for: below 8 a tile is a handful of rows
    that refine pairs as well, above 64 the constraints remove the baseline design's tiles);
    partition_preset="deterministic" (Mt-KaHyPar's preset whose result does not depend on threads);
    partition_seed=0, partition_threads=1 (both in the cache key); budget_seconds=0.5 (the
    partitioner's priced seconds per layer, all its M1s together: `--reorder-budget`);
    partition_within=1.25 (an M1 can still win, so is refined and partitioned, while its cheapest of
    identity and Algorithm 1 is within this factor of the layer's cheapest); refine_passes=3,
    refine_width=4 (tiles tried per row: those sharing most of its columns); refine_work=3e8 (the
    refinement's priced steps per (layer, M1), column walks and swap checks: over it, not run);
    price_device="h100", price_n1=128 (the launch the estimate prices); max_cov_nnz=0.25 (constrain's
    TH_row: a run passes its --th-row)."""

    row_order: str = "ascending"
    strategies: tuple[str, ...] = STRATEGIES
    partition_m1s: tuple[int, int] = (8, 64)
    partition_preset: str = "deterministic"
    partition_seed: int = 0
    partition_threads: int = 1
    budget_seconds: float = 0.5
    partition_within: float = 1.25
    refine_passes: int = 3
    refine_width: int = 4
    refine_work: float = 3e8
    price_device: str = "h100"
    price_n1: int = 128
    max_cov_nnz: float = 0.25

    def __post_init__(self):
        # the numba loops index by these: a bad value would read and write out of bounds
        if self.refine_width < 1 or self.refine_passes < 0:
            raise ValueError(f"refine_width must be >= 1 and refine_passes >= 0, got {self.refine_width}, "
                             f"{self.refine_passes}")
        if self.partition_m1s[0] > self.partition_m1s[1] or self.partition_threads < 1:
            raise ValueError(f"partition_m1s must be (low, high) with low <= high and partition_threads >= 1, "
                             f"got {self.partition_m1s}, {self.partition_threads}")


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


@dataclass(frozen=True)
class OrderCandidate:
    """One candidate order of a (layer, M1): its counts, estimate and cost; `note` says why it was
    skipped (nnc_sum = -1) or not eligible."""

    strategy: str
    nnc_sum: int
    max_nnc: int
    cov_nnz: float
    estimate_us: float
    seconds: float
    chosen: bool = False
    note: str = ""


@dataclass(frozen=True)
class Reordering:
    """The kept order of a (layer, M1) and every candidate's figures (identity first)."""

    tiles: Tiles
    strategy: str
    candidates: tuple[OrderCandidate, ...]
    identity: TileStats  # the identity order's statistics (03_reordered's identity_* columns)

    def candidate(self, strategy: str) -> OrderCandidate | None:
        return next((c for c in self.candidates if c.strategy == strategy), None)


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


def ordered_tiles(matrix: sp.csr_matrix, m1: int, n: int, params: ReorderParams = ReorderParams()) -> Reordering:
    """Every candidate order of `params.strategies` for tiles of `m1` rows, each priced for a
    launch over `n` columns, and the cheapest eligible one kept (see the module docstring)."""
    if m1 < 1:
        raise ValueError(f"M1 must be >= 1, got {m1}")
    return layer_orders(matrix, (m1,), n, params)[distinct_m1s(matrix, (m1,))[0]]


def layer_orders(matrix: sp.csr_matrix, m1s, n: int, params: ReorderParams = ReorderParams()) -> dict[int, Reordering]:
    """ordered_tiles for every distinct M1 of `m1s` (distinct_m1s), refinement and the partitioner
    run only for the M1s that can still win: those whose cheaper of identity and Algorithm 1 is
    within `partition_within` of the layer's cheapest; the partitioner cheapest first, while the
    layer's priced `budget_seconds` lasts; refinement while priced within `refine_work`."""
    a = _canonical(matrix)
    if min(m1s, default=1) < 1:
        raise ValueError(f"M1 must be >= 1, got {min(m1s)}")
    unknown = set(params.strategies) - set(STRATEGIES)
    if unknown:
        raise ValueError(f"unknown reorder strategies {sorted(unknown)}; choose from {STRATEGIES}")
    work = {m1: _cheap_orders(a, m1, n, params) for m1 in distinct_m1s(a, m1s)}
    # identity's and Algorithm 1's prices decide which M1s can still win: refinement and the partition
    # run only for those (within partition_within of the layer's cheapest), the partition cheapest first
    cheap = {m1: w.best_price for m1, w in work.items()}
    best = min(cheap.values(), default=0.0)

    def out_of_reach(m1: int) -> str:
        if cheap[m1] <= params.partition_within * best:
            return ""
        return (f"skipped: this M1's cheapest order ({cheap[m1]:.1f} µs) is over {params.partition_within:g}× the "
                f"layer's cheapest ({best:.1f} µs)")

    refine_priced: dict[int, float] = {}  # asked twice for an M1 the partition runs for

    def refine_priced_out(m1: int) -> str:
        if m1 not in refine_priced:
            refine_priced[m1] = refine_steps(a, m1, params)
        steps = refine_priced[m1]
        return f"skipped: priced at {steps:.2g} steps, over refine_work {params.refine_work:.2g}" \
            if steps > params.refine_work else ""

    if "refine" in params.strategies:
        for m1, w in work.items():
            if w.single:
                continue
            why = out_of_reach(m1) or refine_priced_out(m1)
            if why:
                w.notes["refine"] = why
                continue
            start = w.start()
            w.add(a, "refine", lambda: refined_tiles(a, w.built[start][0], params, w.cov_bound(params)), n, params)
            w.notes["refine"] = f"from {start}"
    if "partition" in params.strategies and work:
        left = params.budget_seconds
        for m1 in sorted(work, key=lambda m: (cheap[m], m)):
            w = work[m1]
            if w.single:
                continue
            why = _partition_skip(a, m1, params) or out_of_reach(m1)
            priced = partition_seconds(a.nnz, -(-_nonempty_rows(a) // m1))
            if not why and priced > left:
                why = f"skipped: priced at {priced:.2f} s, over the {left:.2f} s left of the layer's budget"
            if why:
                w.notes["partition"] = why
                continue
            left -= priced
            w.add(a, "partition", lambda: partitioned_tiles(a, m1, params), n, params)
            if "refine" in params.strategies and not refine_priced_out(m1):
                w.refine_from_partition(a, n, params)
    return {m1: w.kept(params) for m1, w in work.items()}


@dataclass
class _Orders:
    """The candidate orders built so far for one (layer, M1): tiles and seconds, prices, notes."""

    m1: int
    single: bool
    built: dict
    prices: dict
    notes: dict

    @property
    def best_price(self) -> float:
        return min(self.prices.values())

    def add(self, a, name: str, make, n: int, params: ReorderParams) -> None:
        t0 = time.perf_counter()
        tiles = make()
        self.built[name] = (tiles, time.perf_counter() - t0)
        self.prices[name] = _price(tiles, a.shape, n, params)

    def start(self) -> str:
        """The cheapest order other than refine's: where refinement starts."""
        return min((s for s in self.prices if s != "refine"),
                   key=lambda s: (self.prices[s], int(self.built[s][0].tile_nnc.sum()), STRATEGIES.index(s)))

    def cov_bound(self, params: ReorderParams) -> float:
        """The nnz COV an eligible order may reach: max_cov_nnz (TH_row) where the identity's passes
        it, else the larger of the identity's and Algorithm 1's (constrain fails the M1 either way)."""
        identity = tile_stats(self.built["identity"][0]).cov_nnz
        if identity <= params.max_cov_nnz:
            return params.max_cov_nnz
        return max(identity, tile_stats(self.built["algorithm1"][0]).cov_nnz if "algorithm1" in self.built else 0.0)

    def unfit(self, tiles: Tiles, params: ReorderParams) -> str:
        """Why `tiles` is not eligible ("" when it is)."""
        st, ident = tile_stats(tiles), tile_stats(self.built["identity"][0])
        if st.nnc_sum > ident.nnc_sum:
            return f"not eligible: Σ nnc {st.nnc_sum} above the identity's {ident.nnc_sum}"
        bound = self.cov_bound(params)
        if st.cov_nnz > bound + 1e-12:
            return f"not eligible: nnz COV {st.cov_nnz:.3f} above {bound:.3f}"
        return ""

    def refine_from_partition(self, a, n: int, params: ReorderParams) -> None:
        """Refinement from the partition, its nnz balanced first (balanced_tiles): it replaces the
        refinement from the cheaper of identity and Algorithm 1 where it is eligible and cheaper."""
        t0 = time.perf_counter()
        start = self.built["partition"][0]
        balanced = balanced_tiles(a, start, self.cov_bound(params))
        tiles = refined_tiles(a, balanced, params, self.cov_bound(params))
        seconds, price = time.perf_counter() - t0, _price(tiles, a.shape, n, params)
        how = "from partition" + (", nnz balanced first" if balanced is not start else "")
        old = self.built.get("refine")
        if old is not None and not self.unfit(old[0], params) and (
                self.unfit(tiles, params)
                or (self.prices["refine"], int(old[0].tile_nnc.sum())) <= (price, int(tiles.tile_nnc.sum()))):
            self.notes["refine"] = _joined(self.notes.get("refine"), f"kept over the refinement {how} "
                                           f"(Σ nnc {int(tiles.tile_nnc.sum())}, {price:.3g} µs)")
            self.built["refine"] = (old[0], old[1] + seconds)
            return
        self.built["refine"] = (tiles, seconds + (old[1] if old else 0.0))
        self.prices["refine"] = price
        self.notes["refine"] = how

    def kept(self, params: ReorderParams) -> Reordering:
        stats = {name: tile_stats(t) for name, (t, _) in self.built.items()}
        notes, eligible = dict(self.notes), []
        for name, (tiles, _) in self.built.items():
            why = self.unfit(tiles, params)
            if why:
                notes[name] = _joined(notes.get(name), why)
            else:
                eligible.append(name)
        kept = min(eligible, key=lambda s: (self.prices[s], stats[s].nnc_sum, STRATEGIES.index(s)))
        order = [s for s in STRATEGIES if s in params.strategies or s == "identity"]
        candidates = tuple(
            OrderCandidate(s, stats[s].nnc_sum, stats[s].max_nnc, stats[s].cov_nnz, self.prices[s], self.built[s][1],
                           s == kept, notes.get(s, ""))
            if s in self.built else OrderCandidate(s, -1, -1, float("nan"), float("inf"), 0.0, False, notes.get(s, ""))
            for s in order)
        return Reordering(self.built[kept][0], kept, candidates, stats["identity"])


def _cheap_orders(a: sp.csr_matrix, m1: int, n: int, params: ReorderParams) -> _Orders:
    """Identity and Algorithm 1 (refinement and the partition come later, where the M1 can still win)."""
    w = _Orders(m1, False, {}, {}, {})
    w.add(a, "identity", lambda: identity_tiles(a, m1), n, params)
    w.single = w.built["identity"][0].num_tiles <= 1 or m1 == 1
    if "algorithm1" in params.strategies:
        w.add(a, "algorithm1", lambda: reordered_tiles(a, m1, params), n, params)
    for name in ("partition", "refine"):
        if name in params.strategies and w.single:
            w.notes[name] = "skipped: every order of one tile or of one-row tiles is the same"
    return w


def _nonempty_rows(a: sp.csr_matrix) -> int:
    return int((np.diff(a.indptr) > 0).sum())


def refine_steps(matrix: sp.csr_matrix, m1: int, params: ReorderParams = ReorderParams()) -> float:
    """The refinement's priced work on tiles of `m1` rows: per pass, each nonzero's walk over its
    column's rows (or over every tile, where that is shorter) and the swap checks (refine_width
    tiles of m1 rows per row)."""
    a = _canonical(matrix)
    tiles = max(1, -(-_nonempty_rows(a) // max(m1, 1)))
    column_rows = np.bincount(a.indices, minlength=a.shape[1]).astype(np.float64)
    walks = min(float((column_rows ** 2).sum()), float(a.nnz) * tiles)
    return params.refine_passes * (walks + params.refine_width * m1 * float(a.nnz))


def partitioner_version() -> str:
    """The installed Mt-KaHyPar's version ("absent" without it): part of the reorder cache key."""
    try:
        return importlib.metadata.version("mtkahypar")
    except importlib.metadata.PackageNotFoundError:
        return "absent"


def partition_seconds(pins: int, blocks: int) -> float:
    """Mt-KaHyPar's priced run time (deterministic preset, one thread) for a hypergraph of `pins`
    pins cut into `blocks` blocks: 0.008 + 7.8e-6 · pins · blocks^0.55 s, a fit of 60 measured runs
    (real and random layers of 614–105k nonzeros, 2–128 blocks, on a shared 2-core machine: within
    0.5–1.7× of each). A price, not a promise: the budget compares prices so that orders stay
    reproducible."""
    return 0.008 + 7.8e-6 * pins * blocks ** 0.55


def partitioned_tiles(matrix: sp.csr_matrix, m1: int, params: ReorderParams = ReorderParams()) -> Tiles:
    """The non-empty rows cut by Mt-KaHyPar into ceil(rows/M1) blocks of at most M1 rows under the
    connectivity objective (ImportError when mtkahypar is not installed)."""
    a = _canonical(matrix)
    row_nnz = np.diff(a.indptr)
    rows = np.flatnonzero(row_nnz)
    blocks = -(-len(rows) // m1)
    if blocks <= 1:
        return identity_tiles(a, m1)
    part = _mtkahypar_partition(a[rows].tocsc(), blocks, params)
    return _tiles_of_groups(a, m1, rows, _within_size(part, blocks, m1))


def refined_tiles(matrix: sp.csr_matrix, start: Tiles, params: ReorderParams = ReorderParams(),
                  max_cov: float | None = None) -> Tiles:
    """`start` improved by row swaps and moves that lower Σ nnc, no tile's nnc growing past the
    start's largest, and no tile's nnz leaving the start's range (given `max_cov`, its part within
    max_cov of the mean) or, where it lies outside, moving away from it (module docstring)."""
    a = _canonical(matrix)
    if start.num_tiles <= 1:
        return start
    _check_start(a, start)
    low, high = float(start.tile_nnz.min()), float(start.tile_nnz.max())
    if max_cov is not None:
        window = _nnz_window(start, max_cov)
        low, high = max(low, window[0]), min(high, window[1])
    tile_of = _refine(a.indptr.astype(np.int64), a.indices.astype(np.int64), a.shape[1],
                      start.rows.astype(np.int64), start.tile_ptr.astype(np.int64), start.m1,
                      params.refine_passes, params.refine_width, low, high)
    return _tiles_of_groups(a, start.m1, start.rows.astype(np.int64), tile_of)


def balanced_tiles(matrix: sp.csr_matrix, start: Tiles, max_cov: float) -> Tiles:
    """`start` with rows moved and swapped between tiles until every tile's nnz lies within
    max_cov of the mean (so the nnz COV is at most max_cov), at the least Σ nnc it can: a
    partition balances rows, not nonzeros, and an order past constrain's TH_row loses its M1."""
    a = _canonical(matrix)
    if start.num_tiles <= 1 or tile_stats(start).cov_nnz <= max_cov:
        return start
    _check_start(a, start)
    tile_of = _balance(a.indptr.astype(np.int64), a.indices.astype(np.int64), a.shape[1],
                       start.rows.astype(np.int64), start.tile_ptr.astype(np.int64), start.m1,
                       *_nnz_window(start, max_cov), 4 * start.num_tiles, 16)
    return _tiles_of_groups(a, start.m1, start.rows.astype(np.int64), tile_of)


def _nnz_window(tiles: Tiles, max_cov: float) -> tuple[float, float]:
    """The tile nnz within which every tile keeps the nnz COV at most max_cov: the mean ± 0.98·max_cov
    of it (inside the bound, not on it: float sums)."""
    mean = float(tiles.tile_nnz.sum()) / tiles.num_tiles
    return mean * (1 - 0.98 * max_cov), mean * (1 + 0.98 * max_cov)


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


def _check_start(a: sp.csr_matrix, start: Tiles) -> None:
    """A start the numba loops can trust (they do not check bounds): tiles of at most M1 rows of A."""
    if np.diff(start.tile_ptr).max(initial=0) > start.m1 or (len(start.rows) and (
            start.rows.min() < 0 or start.rows.max() >= a.shape[0])):
        raise ValueError(f"tiles of M1 = {start.m1} do not fit this {a.shape[0]}-row matrix")


def _joined(*parts) -> str:
    return "; ".join(p for p in parts if p)


def _price(tiles: Tiles, shape: tuple[int, int], n: int, params: ReorderParams) -> float:
    """The estimate's µs for the full kernel of `tiles` (baseline design, N1 = price_n1)."""
    from lospmm.devices import device_named
    from lospmm.kernel.estimate import estimated_timing, full_kernel_work
    from lospmm.kernel.registers import predicted_registers

    device = device_named(params.price_device)
    work = full_kernel_work(tiles, shape[0], shape[1], max(int(n), 1), params.price_n1, predicted_registers(tiles.m1))
    return float(estimated_timing(work, device).time_us)


def _partition_skip(a: sp.csr_matrix, m1: int, params: ReorderParams) -> str:
    """Why the partitioner does not run for this (layer, M1), or ""."""
    low, high = params.partition_m1s
    if not low <= m1 <= high:
        return f"skipped: M1 = {m1} outside partition_m1s {low}-{high}"
    if importlib.util.find_spec("mtkahypar") is None:
        return "skipped: mtkahypar is not installed (pip install mtkahypar)"
    return ""


_MTKAHYPAR: dict = {}
_MTKAHYPAR_LOCK = threading.Lock()


def _mtkahypar_partition(columns: sp.csc_matrix, blocks: int, params: ReorderParams) -> np.ndarray:
    """Block of each row (column index of `columns`' rows): nets are the columns with two or more rows."""
    import mtkahypar

    nets = [columns.indices[columns.indptr[c]:columns.indptr[c + 1]].tolist()
            for c in range(columns.shape[1]) if columns.indptr[c + 1] - columns.indptr[c] > 1]
    # Mt-KaHyPar is initialised once per process and its seed is global: one partition at a time
    with _MTKAHYPAR_LOCK:
        init = _MTKAHYPAR.get("init")
        if init is None:
            init = _MTKAHYPAR["init"] = mtkahypar.initialize(params.partition_threads, False)
        preset = getattr(mtkahypar.PresetType, params.partition_preset.upper())
        ctx = init.context_from_preset(preset)
        ctx.logging = False
        ctx.set_partitioning_parameters(blocks, 0.0, mtkahypar.Objective.KM1)
        mtkahypar.set_seed(params.partition_seed)
        graph = init.create_hypergraph(ctx, columns.shape[0], len(nets), nets)
        part = graph.partition(ctx)
        return np.array([part.block_id(v) for v in range(columns.shape[0])], dtype=np.int64)


def _within_size(block: np.ndarray, blocks: int, m1: int) -> np.ndarray:
    """Blocks of at most M1 rows: rows past a block's M1th (ε = 0 should leave none) move to the
    first blocks with room, in row order (deterministic)."""
    block = block.copy()
    size = np.bincount(block, minlength=blocks)
    if size.max(initial=0) <= m1:
        return block
    room = [b for b in range(blocks) if size[b] < m1]
    for i in range(len(block)):
        b = block[i]
        if size[b] > m1:
            target = room[0]
            block[i] = target
            size[b] -= 1
            size[target] += 1
            if size[target] == m1:
                room.pop(0)
    return block


def _tiles_of_groups(a: sp.csr_matrix, m1: int, rows: np.ndarray, group: np.ndarray) -> Tiles:
    """Tiles from a group per row (rows ascending within a tile, tiles in group order, empty groups
    dropped)."""
    by_group = np.lexsort((rows, group))
    ordered = rows[by_group].astype(np.int32)
    _, sizes = np.unique(group, return_counts=True)
    tile_ptr = np.zeros(len(sizes) + 1, dtype=np.int32)
    np.cumsum(sizes, out=tile_ptr[1:])
    nnz, nnc = _tile_counts(a.indptr.astype(np.int64), a.indices.astype(np.int64), a.shape[1],
                            ordered.astype(np.int64), tile_ptr.astype(np.int64))
    row_nnz = np.diff(a.indptr)
    return Tiles(m1, ordered, tile_ptr, nnz.astype(np.int32), nnc.astype(np.int32),
                 np.flatnonzero(row_nnz == 0).astype(np.int32))


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


@numba.njit(cache=True, nogil=True)
def _membership(n, tile_ptr, m1):
    """Tile of each of n rows, each tile's rows (-1 padded to m1) and its size, from tile_ptr."""
    num_tiles = len(tile_ptr) - 1
    tile_of = np.empty(n, np.int64)
    members = np.full((num_tiles, m1), -1, np.int64)
    size = np.zeros(num_tiles, np.int64)
    for t in range(num_tiles):
        for i in range(tile_ptr[t], tile_ptr[t + 1]):
            tile_of[i] = t
            members[t, size[t]] = i
            size[t] += 1
    return tile_of, members, size


@numba.njit(cache=True, nogil=True)
def _leave(i, t, rows, indptr, indices, cnt, nnc, nnz, members, size):
    """Row i (of `rows`) out of tile t: its column counts, t's nnc and nnz, t's member list."""
    r = rows[i]
    for p in range(indptr[r], indptr[r + 1]):
        c = indices[p]
        cnt[c, t] -= 1
        if cnt[c, t] == 0:
            nnc[t] -= 1
    nnz[t] -= indptr[r + 1] - indptr[r]
    for u in range(size[t]):
        if members[t, u] == i:
            members[t, u] = members[t, size[t] - 1]
            members[t, size[t] - 1] = -1
            size[t] -= 1
            break


@numba.njit(cache=True, nogil=True)
def _join(i, t, rows, indptr, indices, cnt, nnc, nnz, members, size, tile_of):
    """Row i into tile t, which has room: _leave's converse."""
    r = rows[i]
    for p in range(indptr[r], indptr[r + 1]):
        c = indices[p]
        if cnt[c, t] == 0:
            nnc[t] += 1
        cnt[c, t] += 1
    nnz[t] += indptr[r + 1] - indptr[r]
    members[t, size[t]] = i
    size[t] += 1
    tile_of[i] = t


@numba.njit(inline="always")
def _outside(x, low, high):
    return max(0.0, x - high) + max(0.0, low - x)


@numba.njit(inline="always")
def _no_further(before, after, low, high):
    """A tile's nnz may change from `before` to `after`: it stays within [low, high] widened to take
    `before` in, so a tile inside stays inside and one outside moves only towards the window (never
    past its start's range)."""
    return min(low, before) <= after <= max(high, before)


@numba.njit(cache=True, nogil=True)
def _refine(indptr, indices, k, rows, tile_ptr, m1, passes, width, low, high):
    """Group of each of `rows` after swap/move passes that lower Σ nnc (see refined_tiles). For each
    row r of tile a, the `width` tiles sharing most of r's columns are tried: a move into one with
    room, or a swap with each of its rows; the best change that lowers Σ nnc and keeps every tile
    within the start's max nnc and max nnz is applied at once."""
    num_tiles = len(tile_ptr) - 1
    n = len(rows)
    tile_of, members, size = _membership(n, tile_ptr, m1)
    cnt = np.zeros((k, num_tiles), np.int32)  # rows of tile b with column c, as cnt[c, b]
    nnc = np.zeros(num_tiles, np.int64)
    nnz = np.zeros(num_tiles, np.int64)
    col_count = np.zeros(k + 1, np.int64)
    for i in range(n):
        r = rows[i]
        t = tile_of[i]
        nnz[t] += indptr[r + 1] - indptr[r]
        for p in range(indptr[r], indptr[r + 1]):
            c = indices[p]
            col_count[c + 1] += 1
            if cnt[c, t] == 0:
                nnc[t] += 1
            cnt[c, t] += 1
    # the rows (local ids) of each column, to find the tiles sharing a row's columns
    col_ptr = np.cumsum(col_count)
    col_rows = np.empty(col_ptr[-1], np.int64)
    fill = col_ptr[:-1].copy()
    for i in range(n):
        r = rows[i]
        for p in range(indptr[r], indptr[r + 1]):
            c = indices[p]
            col_rows[fill[c]] = i
            fill[c] += 1
    cap_nnc = nnc.max()
    mark = np.full(k, -1, np.int64)
    overlap = np.zeros(num_tiles, np.int64)
    seen = np.full(num_tiles, -1, np.int64)
    touched = np.empty(num_tiles, np.int64)
    best_tiles = np.empty(width, np.int64)
    for it in range(passes):
        changed = 0
        for i in range(n):
            r = rows[i]
            a = tile_of[i]
            lo, hi = indptr[r], indptr[r + 1]
            nr = hi - lo
            rem_a = 0
            num_touched = 0
            stamp0 = it * indptr[-1]  # a stamp per (pass, nonzero): an earlier pass's never matches
            scan = 0
            for p in range(lo, hi):
                scan += col_ptr[indices[p] + 1] - col_ptr[indices[p]]
            # dense columns: counting r's columns in every tile is cheaper than walking their rows
            by_tile = scan > nr * num_tiles
            for p in range(lo, hi):
                c = indices[p]
                mark[c] = i
                if cnt[c, a] == 1:
                    rem_a += 1
                if by_tile:
                    for b in range(num_tiles):
                        if b != a and cnt[c, b] > 0:
                            if overlap[b] == 0:
                                touched[num_touched] = b
                                num_touched += 1
                            overlap[b] += 1
                    continue
                for q in range(col_ptr[c], col_ptr[c + 1]):
                    b = tile_of[col_rows[q]]
                    if b != a and seen[b] != stamp0 + p:
                        seen[b] = stamp0 + p
                        if overlap[b] == 0:
                            touched[num_touched] = b
                            num_touched += 1
                        overlap[b] += 1
            if rem_a == 0:  # r frees no column of its tile: a swap that gains is found from its partner
                for q in range(num_touched):
                    overlap[touched[q]] = 0
                continue
            nb = 0  # the `width` touched tiles of most overlap, ties to the lower tile id
            for q in range(num_touched):
                b = touched[q]
                j = nb
                if nb < width:
                    nb += 1
                elif overlap[b] < overlap[best_tiles[width - 1]] or (
                        overlap[b] == overlap[best_tiles[width - 1]] and b > best_tiles[width - 1]):
                    continue
                else:
                    j = width - 1
                best_tiles[j] = b
                while j > 0 and (overlap[best_tiles[j]] > overlap[best_tiles[j - 1]] or (
                        overlap[best_tiles[j]] == overlap[best_tiles[j - 1]] and best_tiles[j] < best_tiles[j - 1])):
                    best_tiles[j], best_tiles[j - 1] = best_tiles[j - 1], best_tiles[j]
                    j -= 1
            best_delta, best_b, best_s = 0, -1, -1
            for q in range(nb):
                b = best_tiles[q]
                new_b = nr - overlap[b]
                if size[b] < m1:  # a move into a tile with room
                    d = new_b - rem_a
                    if (d < best_delta and nnc[b] + new_b <= cap_nnc and _no_further(nnz[b], nnz[b] + nr, low, high)
                            and _no_further(nnz[a], nnz[a] - nr, low, high)):
                        best_delta, best_b, best_s = d, b, -1
                for u in range(size[b]):
                    s = members[b, u]
                    rs = rows[s]
                    lost_b, new_a, common = 0, 0, 0
                    for p in range(indptr[rs], indptr[rs + 1]):
                        c = indices[p]
                        if mark[c] == i:
                            if cnt[c, a] == 1:
                                common += 1
                        else:
                            if cnt[c, b] == 1:
                                lost_b += 1
                            if cnt[c, a] == 0:
                                new_a += 1
                    lost_a = rem_a - common
                    d = (new_a - lost_a) + (new_b - lost_b)
                    if d < best_delta:
                        ns = indptr[rs + 1] - indptr[rs]
                        if (nnc[a] + new_a - lost_a <= cap_nnc and nnc[b] + new_b - lost_b <= cap_nnc
                                and _no_further(nnz[a], nnz[a] - nr + ns, low, high)
                                and _no_further(nnz[b], nnz[b] - ns + nr, low, high)):
                            best_delta, best_b, best_s = d, b, s
            for q in range(num_touched):
                overlap[touched[q]] = 0
            if best_b < 0:
                continue
            b = best_b
            # both rows leave before either joins: a full tile takes a row only in a swap
            _leave(i, a, rows, indptr, indices, cnt, nnc, nnz, members, size)
            if best_s >= 0:
                _leave(best_s, b, rows, indptr, indices, cnt, nnc, nnz, members, size)
                _join(best_s, a, rows, indptr, indices, cnt, nnc, nnz, members, size, tile_of)
            _join(i, b, rows, indptr, indices, cnt, nnc, nnz, members, size, tile_of)
            changed += 1
        if changed == 0:
            break
    return tile_of




@numba.njit(cache=True, nogil=True)
def _balance(indptr, indices, k, rows, tile_ptr, m1, low, high, max_rounds, reach):
    """Group of each of `rows` after moves and swaps that bring every tile's nnz into [low, high]:
    each round takes the tile furthest outside and applies the change of one of its rows (a move
    into a tile with room, or a swap) with one of `reach` tiles furthest on the other side of the
    mean or `reach` tiles sharing most of its columns, the change that brings the two tiles closer
    to the window at the least Σ nnc per nonzero of the gap closed. Σ nnc changes are counted per
    row against the tiles as they are (ignoring columns two swapped rows share): a ranking, the
    counts stay exact."""
    num_tiles = len(tile_ptr) - 1
    n = len(rows)
    tile_of, members, size = _membership(n, tile_ptr, m1)
    cnt = np.zeros((k, num_tiles), np.int32)
    nnc = np.zeros(num_tiles, np.int64)  # kept by _leave and _join, as the refinement keeps it
    nnz = np.zeros(num_tiles, np.float64)
    row_nnz = np.empty(n, np.float64)
    for i in range(n):
        r = rows[i]
        row_nnz[i] = indptr[r + 1] - indptr[r]
        nnz[tile_of[i]] += row_nnz[i]
        for p in range(indptr[r], indptr[r + 1]):
            if cnt[indices[p], tile_of[i]] == 0:
                nnc[tile_of[i]] += 1
            cnt[indices[p], tile_of[i]] += 1
    mean = nnz.sum() / num_tiles
    shared = np.zeros(num_tiles, np.int64)
    seen = np.full(k, -1, np.int64)
    picked = np.zeros(num_tiles, np.bool_)
    for step in range(max_rounds):
        w, far = -1, 0.0
        for t in range(num_tiles):
            v = _outside(nnz[t], low, high)
            if v > far:
                w, far = t, v
        if w < 0:
            break
        # partner tiles: furthest on the other side of the mean, and sharing most columns with w
        picked[:] = False
        side = np.argsort(nnz) if nnz[w] > mean else np.argsort(-nnz)
        taken = 0
        for q in range(num_tiles):
            b = side[q]
            if taken == reach or (nnz[b] - mean) * (nnz[w] - mean) >= 0:
                break
            picked[b] = True
            taken += 1
        shared[:] = 0
        for u in range(size[w]):
            r = rows[members[w, u]]
            for p in range(indptr[r], indptr[r + 1]):
                c = indices[p]
                if seen[c] != step:
                    seen[c] = step
                    for b in range(num_tiles):
                        if cnt[c, b] > 0:
                            shared[b] += 1
        shared[w] = -1
        for q in np.argsort(-shared, kind="mergesort")[:reach]:
            if shared[q] > 0:
                picked[q] = True
        picked[w] = False
        before_w = _outside(nnz[w], low, high)
        best_score, best_x, best_y, best_b = np.inf, -1, -1, -1
        for u in range(size[w]):
            x = members[w, u]
            r = rows[x]
            freed_x = 0
            for p in range(indptr[r], indptr[r + 1]):
                if cnt[indices[p], w] == 1:
                    freed_x += 1
            for b in range(num_tiles):
                if not picked[b]:
                    continue
                add_x = 0
                for p in range(indptr[r], indptr[r + 1]):
                    if cnt[indices[p], b] == 0:
                        add_x += 1
                if size[b] < m1:  # a move of x into a tile with room
                    closer = (before_w + _outside(nnz[b], low, high) - _outside(nnz[w] - row_nnz[x], low, high)
                              - _outside(nnz[b] + row_nnz[x], low, high))
                    if closer > 0:
                        score = (add_x - freed_x) / closer
                        if score < best_score:
                            best_score, best_x, best_y, best_b = score, x, -1, b
                for v in range(size[b]):  # a swap of x with a row of b
                    y = members[b, v]
                    moved = row_nnz[x] - row_nnz[y]
                    closer = (before_w + _outside(nnz[b], low, high) - _outside(nnz[w] - moved, low, high)
                              - _outside(nnz[b] + moved, low, high))
                    if closer <= 0:
                        continue
                    ry = rows[y]
                    freed_y, add_y = 0, 0
                    for p in range(indptr[ry], indptr[ry + 1]):
                        c = indices[p]
                        if cnt[c, b] == 1:
                            freed_y += 1
                        if cnt[c, w] == 0:
                            add_y += 1
                    score = (add_x - freed_x + add_y - freed_y) / closer
                    if score < best_score:
                        best_score, best_x, best_y, best_b = score, x, y, b
        if best_x < 0:
            break
        # both rows leave their tiles before either joins (a full tile takes a row only in a swap)
        _leave(best_x, w, rows, indptr, indices, cnt, nnc, nnz, members, size)
        if best_y >= 0:
            _leave(best_y, best_b, rows, indptr, indices, cnt, nnc, nnz, members, size)
            _join(best_y, w, rows, indptr, indices, cnt, nnc, nnz, members, size, tile_of)
        _join(best_x, best_b, rows, indptr, indices, cnt, nnc, nnz, members, size, tile_of)
    return tile_of
