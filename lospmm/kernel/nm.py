"""The N:M kernel's data: how an N:M-sparse A (at most N nonzeros in every group of M consecutive
columns, one pattern per vector of V consecutive rows) is tiled and compressed for the data-driven
N:M kernel (render/nm.py), in the manner of NM-SpMM (Ma et al., IPDPS 2025) with A and B swapped:
A's kept values and their positions are data, B goes through shared memory.

A block computes `block_rows` × `block_columns` of C with `block_rows / thread_rows ·
block_columns / thread_columns` threads, each `thread_rows` × `thread_columns` outputs. K is
walked in chunks of whole groups (`chunk` columns: M times ceil(32 / M)), each chunk's rows of B
staged in shared memory (double-buffered, cp.async) while the previous chunk is multiplied. A
chunk of a row holds `kept` = N·chunk/M slots. Rows in groups of `index_rows` (gcd of V and the
thread's rows) share one slot's column, so a thread loads one B vector per group of its rows.

A stage holds `staged` rows of B's chunk: all `chunk` of them, or, where a block's rows lie in so
few vectors that they keep fewer columns of a chunk than it has (`gathers`: NM-SpMM's 4:32 in
vectors of 32 rows keeps at most 8 of every 32 in a block of 64 rows), only the rows the block's
slots read, listed per block and chunk. On the H200 the whole-chunk copy held the kernel at 0.35 of
SGEMM's efficiency per nonzero at 4:32 against 0.7 at 16:32: its traffic did not shrink with the
sparsity.

The compressed A, laid out so that a block's share of a chunk is contiguous (one copy loop each):
    values  float32  [chunks][row blocks][kept][block_rows]           the kept values (0 in a spare slot)
    index   uint8    [chunks][row blocks][slab]                       per slot and index row group, the
             staged row it reads (`staged`, one past the last: a row of zeros, for a spare slot),
             [kept][block_rows / index_rows] padded to `slab` bytes (a multiple of 16)
    rows    uint8    [chunks][row blocks][rows_slab]                  only where the tiling gathers: the
             staged rows' columns within the chunk, ascending, then `chunk` (a row of zeros) up to
             `staged`, padded to `rows_slab` bytes; where it does not, staged row r is column r
A spare slot (a group whose rows hold fewer than N columns, or past K) multiplies a zero row, never
a value of B. A row sharing a slot with rows that have a nonzero in its column multiplies that
column of B by its own zero (a NaN or infinity there reaches its output, as in a dense product of
the same A); with one index row per slot (index_rows 1) nothing but a nonzero reaches C, as in the
sparse product. Stored zeros of A are dropped first: they are no nonzeros of the pattern.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace

import numpy as np
import scipy.sparse as sp

from lospmm.kernel.sparse_mma import ENGINE, MMATiling, mma_tilings

SHARED_BYTES = 48 * 1024  # static shared memory a block may declare
NM_GROUPS = (4, 8, 16, 32)  # the M that held_pattern looks for (cuSPARSELt's 4, NM-SpMM's 32)


def held_pattern(matrix: sp.csr_matrix) -> tuple[int, int, int] | None:
    """(N, M, V): the N:M pattern `matrix` holds — at most N nonzeros in every group of M columns and
    exactly N in at least 90% of the groups of its non-empty rows (a row pruned whole, or an output
    channel a checkpoint left at zero, is no evidence against the pattern), M in NM_GROUPS dividing K,
    N < M; the one of least N/M (then the smallest M), with the longest vector V of consecutive rows
    that share each group's columns (2, 4, 8, …; the last vector holds the rows left) — or None when no
    group size fits (stages.prune.nm_pattern_of names it an NMPattern). The 90% rule tells an N:M pruning (nearly every
    group filled to N) from unstructured sparsity (which merely stays under some N)."""
    a = sp.csr_matrix(matrix, copy=True)
    a.eliminate_zeros()  # a stored zero is no nonzero of the pattern (nm_operands drops it too)
    rows, k = a.shape
    if a.nnz == 0:
        return None
    row_of = np.repeat(np.arange(rows), np.diff(a.indptr))
    filled = np.flatnonzero(np.diff(a.indptr))  # the rows holding a nonzero
    found = None
    for m in NM_GROUPS:
        if k % m or k < m:
            continue
        counts = np.bincount(row_of * (k // m) + a.indices // m, minlength=rows * (k // m)).reshape(rows, k // m)
        n = int(counts.max())
        # an N:M pruning fills nearly every group to N (weights zero already leave a few short);
        # unstructured sparsity merely stays under some N
        if n < m and (counts[filled] == n).mean() >= 0.9 and (found is None or n * found[1] < found[0] * m):
            found = (n, m)
    if found is None:
        return None
    dense = a.toarray() != 0
    vector, row = 1, np.arange(rows)
    while 2 * vector <= rows:  # each group of 2V rows (the last: the rows left) as its first row
        if not (dense == dense[row - row % (2 * vector)]).all():
            break
        vector *= 2
    return found[0], found[1], vector


@dataclass(frozen=True)
class NMTiling:
    """n, m, vector: the N:M pattern the kernel serves (at most n of every m columns; rows in vectors
    of `vector` that share positions). Defaults: NM-SpMM's blocking, 64 × 128 outputs per block in
    8 × 8 per thread (128 threads), and stages of at least `depth` = 32 columns of K (a sparse pattern
    whose stages gather few rows of B takes deeper ones: as many slots per barrier as a dense one)."""

    n: int
    m: int
    vector: int = 1
    block_rows: int = 64
    block_columns: int = 128
    thread_rows: int = 8
    thread_columns: int = 8
    depth: int = 32
    gather: bool = True  # False: every stage copies the whole chunk (the kernel before 2026-11-26; an A/B's control)

    def __post_init__(self):
        if not (1 <= self.n < self.m <= 255):
            raise ValueError(f"N:M kernel: needs 1 <= N < M <= 255, got {self.n}:{self.m}")
        if self.vector < 1:
            raise ValueError(f"N:M kernel: the vector length must be >= 1, got {self.vector}")
        if self.thread_rows not in (4, 8) or self.thread_columns not in (4, 8):
            raise ValueError(f"N:M kernel: 4 or 8 rows and columns per thread, got {self.thread_rows}×"
                             f"{self.thread_columns}")
        if self.block_rows != self.thread_rows * self.thread_columns:
            # then a block has block_columns threads: the launch layout's one column per thread
            raise ValueError(f"N:M kernel: block rows must be thread rows × thread columns "
                             f"({self.thread_rows * self.thread_columns}), got {self.block_rows}")
        if self.block_columns % self.thread_columns:
            raise ValueError(f"N:M kernel: block columns {self.block_columns} not a multiple of "
                             f"{self.thread_columns}")
        if self.chunk > 255 or self.shared_bytes > SHARED_BYTES:
            raise ValueError(f"N:M kernel {self.label}: {self.shared_bytes} bytes of shared memory, over "
                             f"{SHARED_BYTES}")

    @property
    def label(self) -> str:
        v = f":{self.vector}" if self.vector > 1 else ""
        deep = f",k{self.chunk}" if self.depth != 32 else ""
        whole = ",whole" if not self.gather and replace(self, gather=True).gathers else ""
        return (f"{self.n}:{self.m}{v},{self.block_rows}x{self.block_columns},"
                f"{self.thread_rows}x{self.thread_columns}{deep}{whole}")

    @property
    def chunk(self) -> int:
        """Columns of K per stage: whole groups, at least `depth`."""
        return self.m * -(-self.depth // self.m)

    @property
    def kept(self) -> int:
        """Slots per row per chunk."""
        return self.n * (self.chunk // self.m)

    @property
    def index_rows(self) -> int:
        """Rows that share one slot's column in the index (a thread loads one B vector for them)."""
        return math.gcd(self.vector, self.thread_rows)

    @property
    def staged(self) -> int:
        """Rows of B's chunk a stage holds: the chunk, or the most columns the block's rows can keep
        in it (the slots of each vector of `vector` rows the block touches) where that is fewer."""
        v, rows = self.vector, self.block_rows
        touching = rows // v if rows % v == 0 else 1 if v % rows == 0 else rows // v + 2
        return min(self.chunk, touching * self.kept) if self.gather else self.chunk

    @property
    def roles(self) -> tuple[str, ...]:
        """The module data's roles (KernelSpec.module_symbols): values, index and, where it gathers, rows."""
        return ("values", "index", "rows") if self.gathers else ("values", "index")

    def operands(self, matrix: sp.csr_matrix, number=None) -> dict[str, np.ndarray]:
        """A compressed for the kernel (nm_operands) in `number` (numbers.NumberFormat; None: fp32): a
        half kernel's values rounded to its dtype, for packed sums each as the pair its fma takes."""
        arrays = nm_operands(matrix, self)
        if number is not None and number.is_half:
            from lospmm.kernel.numbers import from_dtype_bits, to_dtype_bits

            bits = to_dtype_bits(arrays["values"], number.dtype)
            if number.packed:
                wide = bits.astype(np.uint32)
                arrays["values"] = (wide | (wide << 16)).view(np.float32)
            else:
                arrays["values"] = from_dtype_bits(bits, number.dtype).astype(np.float32)
        return arrays

    @property
    def gathers(self) -> bool:
        """Whether a stage copies only the rows of B its block reads (listed in the `rows` operand)."""
        return self.staged < self.chunk

    @property
    def rows_slab(self) -> int:
        """Bytes of one block's chunk of the `rows` operand (0 where the tiling does not gather)."""
        return -(-self.staged // 16) * 16 if self.gathers else 0

    @property
    def threads(self) -> int:
        return (self.block_rows // self.thread_rows) * (self.block_columns // self.thread_columns)

    @property
    def slab(self) -> int:
        """Index bytes of one block's chunk, padded to 16."""
        raw = self.kept * (self.block_rows // self.index_rows)
        return -(-raw // 16) * 16

    @property
    def shared_bytes(self) -> int:
        """Two stages of B's staged rows (plus the zero row), A's values and the index, B in fp32 (what
        a blocking must fit: a half kernel's, with B 16-bit, is smaller: shared_bytes_of)."""
        return self.shared_bytes_of(4)

    def shared_bytes_of(self, element_bytes: int) -> int:
        """shared_bytes with B's elements `element_bytes` wide."""
        return 2 * ((self.staged + 1) * self.block_columns * element_bytes + self.kept * self.block_rows * 4
                    + self.slab)

    def chunks(self, k: int) -> int:
        return -(-k // self.chunk)

    def row_blocks(self, m: int) -> int:
        return -(-m // self.block_rows)

    def operand_sizes(self, m: int, k: int) -> dict[str, int]:
        """Elements of each compressed array for an A of m × k (values: 4 bytes each, index and rows: 1)."""
        blocks = self.chunks(k) * self.row_blocks(m)
        sizes = {"values": blocks * self.kept * self.block_rows, "index": blocks * self.slab}
        return sizes | ({"rows": blocks * self.rows_slab} if self.gathers else {})

    def facts(self) -> dict:
        return {"label": self.label, "n": self.n, "m": self.m, "vector": self.vector, "block_rows": self.block_rows,
                "block_columns": self.block_columns, "thread_rows": self.thread_rows,
                "thread_columns": self.thread_columns, "chunk": self.chunk, "kept": self.kept,
                "index_rows": self.index_rows, "slab": self.slab, "staged": self.staged, "depth": self.depth,
                "gather": self.gather}

    @classmethod
    def of_facts(cls, facts: dict) -> "NMTiling":
        return cls(*(int(facts[f]) for f in ("n", "m", "vector", "block_rows", "block_columns", "thread_rows",
                                             "thread_columns")), int(facts.get("depth", 32)),
                   # a kernel.json written before stages gathered (no `staged`) is a whole-chunk kernel
                   bool(facts.get("gather", "staged" in facts)))


# the blockings the search tries, widest first (NM-SpMM's 64 × 128 first); nm_tilings keeps those that fit
BLOCKINGS = ((64, 128, 8, 8), (64, 64, 8, 8), (32, 128, 8, 4), (32, 64, 8, 4), (16, 64, 4, 4))
# the stage depths it tries: deeper stages only where they hold no more slots than a 32-column stage
# of a half-dense pattern would (what fits shared memory decides the rest)
DEPTHS = (32, 64, 128)


def untiled_tiling(facts: dict):
    """The tiling kernel.json's `nm` records: the sparse tensor-core kernel's (its `engine` says so) or
    the CUDA-core N:M kernel's (a kernel.json without `engine`)."""
    return MMATiling.of_facts(facts) if facts.get("engine") == ENGINE else NMTiling.of_facts(facts)


def nm_tilings(n: int, m: int, vector: int = 1, number=None) -> list:
    """Every blocking of BLOCKINGS at every depth of DEPTHS that fits shared memory for the pattern
    n:m:vector, the 32-column stages first; a deeper stage only where it changes the chunk and its
    block's stages gather (a whole-chunk stage grows with depth without saving any traffic). With
    `number`'s sums in tensor cores (accumulate mma), the sparse tensor-core kernel's blockings
    (sparse_mma.mma_tilings: none for a pattern it cannot take)."""
    if number is not None and number.accumulate == "mma":
        return mma_tilings(n, m, vector)
    out = []
    for depth in DEPTHS:
        for rows, cols, trows, tcols in BLOCKINGS:
            try:
                t = NMTiling(n, m, vector, rows, cols, trows, tcols, depth)
            except ValueError:
                continue
            if depth == DEPTHS[0] or (t.gathers and t.chunk > NMTiling(n, m, vector, rows, cols, trows, tcols).chunk
                                      and t.kept <= 16):
                out.append(t)
    return out


def pattern_problem(matrix: sp.csr_matrix, n: int, m: int, vector: int) -> str:
    """Why `matrix` does not hold the pattern (more than n distinct columns in some group of m
    columns of some vector of `vector` rows; stored zeros are no nonzeros), or ""."""
    a = sp.csr_matrix(matrix, copy=True)
    a.eliminate_zeros()
    a = a.tocoo()
    rows, k = a.shape
    if k % m:
        return f"K={k} is not a multiple of M={m}"
    if a.nnz == 0:
        return ""
    pairs = np.unique((a.row // vector).astype(np.int64) * k + a.col)  # distinct (vector, column)
    groups = np.unique(pairs // m, return_counts=True)[1]  # (vector, group of m) of each pair
    worst = int(groups.max())
    if worst > n:
        return f"a group of {m} columns holds {worst} nonzero columns, over N={n} ({n}:{m}, vectors of {vector} rows)"
    return ""


def nm_operands(matrix: sp.csr_matrix, tiling: NMTiling) -> dict[str, np.ndarray]:
    """A compressed for the kernel: {"values": float32, "index": uint8, and where the tiling gathers
    "rows": uint8} as the module docstring lays them out. ValueError naming the problem when A does
    not hold the tiling's pattern."""
    a = sp.csr_matrix(matrix, copy=True)
    a.sum_duplicates()
    a.eliminate_zeros()  # a stored zero is no nonzero: it takes no slot
    a = a.tocoo()
    rows, k = a.shape
    t = tiling
    # a gathering stage holds the columns of whole vectors: A must share positions in vectors of V rows
    problem = pattern_problem(a, t.n, t.m, t.vector if t.gathers else t.index_rows)
    if problem:
        raise ValueError(f"N:M kernel: {problem}")
    chunks, blocks = t.chunks(k), t.row_blocks(rows)
    group_of_rows = t.index_rows
    index_per_slot = t.block_rows // group_of_rows
    values = np.zeros((chunks, blocks, t.kept, t.block_rows), np.float32)
    index = np.full((chunks, blocks, t.slab), t.staged, np.uint8)
    index[:, :, t.kept * index_per_slot:] = 0  # padding past the slots: never read
    staged_rows = np.full((chunks, blocks, t.rows_slab), t.chunk, np.uint8)
    if a.nnz:
        row, col = a.row.astype(np.int64), a.col.astype(np.int64)
        # the slot of a (row group, column): its rank among the group's distinct columns in its M-group
        pairs, where = np.unique((row // group_of_rows) * k + col, return_inverse=True)
        pair_group = pairs // t.m
        first = np.r_[0, np.flatnonzero(np.diff(pair_group)) + 1]
        rank = np.arange(len(pairs)) - np.repeat(first, np.diff(np.r_[first, len(pairs)]))
        pair_col = pairs % k
        slot = (pair_col // t.m) * t.n + rank  # along the row: group · N + rank
        chunk_of, p = slot // t.kept, slot % t.kept
        pair_row_group = pairs // k
        block = (pair_row_group * group_of_rows) // t.block_rows
        g = pair_row_group % index_per_slot
        staged = pair_col - chunk_of * t.chunk  # the column within the chunk: its staged row, unless gathered
        if t.gathers:  # each (chunk, block)'s distinct columns, ascending, are its staged rows
            cell = chunk_of * blocks + block
            used, position = np.unique(cell * t.chunk + staged, return_inverse=True)
            used_cell = used // t.chunk
            starts = np.r_[0, np.flatnonzero(np.diff(used_cell)) + 1]
            rank_in_cell = np.arange(len(used)) - np.repeat(starts, np.diff(np.r_[starts, len(used)]))
            if rank_in_cell.max() >= t.staged:  # the pattern check above rules it out: a guard, not a path
                raise ValueError(f"N:M kernel: a block's chunk reads more than {t.staged} rows of B")
            staged_rows.reshape(chunks * blocks, t.rows_slab)[used_cell, rank_in_cell] = used % t.chunk
            staged = rank_in_cell[position]
        index[chunk_of, block, p * index_per_slot + g] = staged.astype(np.uint8)
        values[chunk_of[where], row // t.block_rows, p[where], row % t.block_rows] = a.data
    out = {"values": values.ravel(), "index": index.ravel()}
    return out | ({"rows": staged_rows.ravel()} if t.gathers else {})


def nm_product(operands: dict[str, np.ndarray], tiling: NMTiling, m: int, k: int, b: np.ndarray) -> np.ndarray:
    """C = A·B computed from the compressed operands as the kernel reads them (float64): what the
    operands mean, for tests."""
    t = tiling
    chunks, blocks = t.chunks(k), t.row_blocks(m)
    values = operands["values"].reshape(chunks, blocks, t.kept, t.block_rows).astype(np.float64)
    index = operands["index"].reshape(chunks, blocks, t.slab)
    listed = operands["rows"].reshape(chunks, blocks, t.rows_slab) if t.gathers else None
    per_slot = t.block_rows // t.index_rows
    padded = np.zeros((chunks * t.chunk + 1, b.shape[1]))
    padded[:k] = b
    zero_row = len(padded) - 1
    c = np.zeros((blocks * t.block_rows, b.shape[1]))
    for ch in range(chunks):
        for bl in range(blocks):
            # the stage as the kernel copies it: staged row r is B's row at the chunk's column r (or listed)
            columns = listed[ch, bl, :t.staged].astype(np.int64) if t.gathers else np.arange(t.chunk)
            stage = np.append(np.where(columns < t.chunk, ch * t.chunk + columns, zero_row), zero_row)
            for p in range(t.kept):
                at = stage[index[ch, bl, p * per_slot:(p + 1) * per_slot].astype(np.int64)]
                rows_b = padded[np.repeat(at, t.index_rows)]
                c[bl * t.block_rows:(bl + 1) * t.block_rows] += values[ch, bl, p][:, None] * rows_b
    return c[:m]
