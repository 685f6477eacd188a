"""The sparse tensor-core kernel's data: how an A with at most 2 nonzeros in every group of 4
consecutive columns (2:4, or 1:4) is tiled and compressed for `mma.sp` (render/sparse_mma.py), the
instruction cuSPARSELt's 2:4 kernels are built on: fp16 or bf16 A and B, fp32 sums, on sm_80 and later.

A block computes `block_rows` × `block_columns` of C with warps of `warp_rows` × `warp_columns`
each; a warp's tile is (warp_rows / 16) × (warp_columns / 8) `mma.sp.m16n8k32` a step of 32 columns
of K. K is walked in stages of `depth` columns: each stage's rows of B, and the block's fragments of
A, are copied into shared memory (cp.async, double-buffered) while the previous stage is multiplied.

A's fragments are laid out for the instruction, lane by lane (PTX ISA, "Matrix fragments for sparse
mma.m16n8k32 with .f16/.bf16", groupID g = lane / 4, t = lane % 4), so that a warp reads each with
one 16-byte load a lane:
    values  uint32 [row blocks][steps][mtiles][32 lanes][4]   a lane's four registers of two halves:
            row g and row g + 8 at compressed columns 2t, 2t + 1, then row g and row g + 8 at 2t + 8,
            2t + 9; compressed column c of a row is the (c % 2)-th kept value of its group c / 2 of 4
    index   uint32 [row blocks][steps][mtiles][16]            the metadata (sparsity selector 0: the
            lanes with t = 0 and 1 give it): entry 2g + h holds, for the groups 4h .. 4h + 3 of the
            step, row g's in bits 0-15 and row g + 8's in bits 16-31, 4 bits a group (the column of its
            first kept value in the low 2, of its second in the high 2, ascending: ::ordered_metadata)
A group with fewer than 2 nonzeros keeps a zero at another of its columns (indices must differ);
rows past M and columns past K are zeros. Stored zeros of A are dropped first.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import scipy.sparse as sp

from lospmm.kernel.numbers import NumberFormat, to_dtype_bits

SHARED_BYTES = 48 * 1024  # static shared memory a block may declare
STEP = 32  # columns of K one mma.sp.m16n8k32 multiplies
ENGINE = "mma.sp"  # kernel.json's nm.engine: what tells this tiling from the CUDA-core N:M kernel's


@dataclass(frozen=True)
class MMATiling:
    """n, m, vector: the pattern the kernel serves (at most n of every m columns: n ≤ 2, m a multiple of
    4; vector as the pattern was found, not needed: each row has its own metadata). Defaults: 64 × 128
    outputs a block in four warps of 32 × 64, stages of 32 columns of K."""

    n: int = 2
    m: int = 4
    vector: int = 1
    block_rows: int = 64
    block_columns: int = 128
    warp_rows: int = 32
    warp_columns: int = 64
    depth: int = 32

    def __post_init__(self):
        if not fits(self.n, self.m):
            raise ValueError(f"sparse tensor-core kernel: serves N:M with at most 2 of every 4 columns (N <= 2, M a "
                             f"multiple of 4), got {self.n}:{self.m}")
        if self.warp_rows % 16 or self.warp_columns % 8 or self.warp_rows < 16 or self.warp_columns < 8:
            raise ValueError(f"sparse tensor-core kernel: a warp's tile is a multiple of 16 × 8, got "
                             f"{self.warp_rows}×{self.warp_columns}")
        if self.block_rows % self.warp_rows or self.block_columns % self.warp_columns:
            raise ValueError(f"sparse tensor-core kernel: block {self.block_rows}×{self.block_columns} is not whole "
                             f"warps of {self.warp_rows}×{self.warp_columns}")
        if self.depth % STEP or self.depth < STEP:
            raise ValueError(f"sparse tensor-core kernel: stages of a multiple of {STEP} columns, got {self.depth}")
        if self.threads != self.block_columns:  # the launch layout's one column a thread (LaunchLayout)
            raise ValueError(f"sparse tensor-core kernel {self.label}: {self.threads} threads a block, not one a "
                             f"column of its {self.block_columns}")
        if self.shared_bytes > SHARED_BYTES:
            raise ValueError(f"sparse tensor-core kernel {self.label}: {self.shared_bytes} bytes of shared memory, "
                             f"over {SHARED_BYTES}")

    @property
    def label(self) -> str:
        return (f"{self.n}:{self.m},mma,{self.block_rows}x{self.block_columns},w{self.warp_rows}x{self.warp_columns}"
                f"{f',k{self.depth}' if self.depth != STEP else ''}")

    @property
    def roles(self) -> tuple[str, ...]:
        """The module data's roles (KernelSpec.module_symbols): the fragments and their metadata."""
        return "values", "index"

    @property
    def warps(self) -> int:
        return (self.block_rows // self.warp_rows) * (self.block_columns // self.warp_columns)

    @property
    def threads(self) -> int:
        return 32 * self.warps

    @property
    def mtiles(self) -> int:
        """16-row tiles of A a block holds."""
        return self.block_rows // 16

    @property
    def steps(self) -> int:
        """mma steps of 32 columns a stage."""
        return self.depth // STEP

    @property
    def row_pitch(self) -> int:
        """Elements between two staged rows of B: the block's columns and 8 more, so that the 8 rows an
        ldmatrix reads fall in 8 different 16-byte bank groups."""
        return self.block_columns + 8

    @property
    def stage_words(self) -> tuple[int, int]:
        """32-bit words of one stage's A fragments and metadata."""
        return self.steps * self.mtiles * 128, self.steps * self.mtiles * 16

    @property
    def shared_bytes(self) -> int:
        """Two stages of B's rows (16-bit), A's fragments and metadata."""
        values, index = self.stage_words
        return 2 * (self.depth * self.row_pitch * 2 + 4 * (values + index))

    def chunks(self, k: int) -> int:
        return -(-k // self.depth)

    def row_blocks(self, m: int) -> int:
        return -(-m // self.block_rows)

    def operand_sizes(self, m: int, k: int) -> dict[str, int]:
        """Elements of each operand for an m × k A: values as 4-byte words, index as bytes."""
        values, index = self.stage_words
        blocks = self.chunks(k) * self.row_blocks(m)
        return {"values": blocks * values, "index": blocks * index * 4}

    def operands(self, matrix: sp.csr_matrix, number: NumberFormat) -> dict[str, np.ndarray]:
        """A laid out for the kernel in `number`'s dtype (mma_operands)."""
        return mma_operands(matrix, self, number.dtype)

    def facts(self) -> dict:
        return {"engine": ENGINE, "label": self.label, "n": self.n, "m": self.m, "vector": self.vector,
                "block_rows": self.block_rows, "block_columns": self.block_columns, "warp_rows": self.warp_rows,
                "warp_columns": self.warp_columns, "depth": self.depth}

    @classmethod
    def of_facts(cls, facts: dict) -> "MMATiling":
        return cls(*(int(facts[f]) for f in ("n", "m", "vector", "block_rows", "block_columns", "warp_rows",
                                             "warp_columns", "depth")))


# the blockings the search tries (block rows, columns, warp rows, columns; a warp a 32 columns of the
# block): wide tiles for large N, narrow ones for the small N of inference (a batch of 4 to 64 columns)
BLOCKINGS = ((128, 128, 64, 64), (64, 128, 32, 64), (64, 64, 64, 32), (32, 64, 32, 32), (64, 32, 64, 32),
             (32, 32, 32, 32), (16, 32, 16, 32))
DEPTHS = (32, 64)


def mma_tilings(n: int, m: int, vector: int = 1) -> list[MMATiling]:
    """Every blocking of BLOCKINGS at each depth of DEPTHS that fits shared memory, for a pattern the
    instruction serves (at most 2 of every 4 columns); [] for any other."""
    if not fits(n, m):
        return []
    out = []
    for depth in DEPTHS:
        for rows, cols, wrows, wcols in BLOCKINGS:
            try:
                out.append(MMATiling(n, m, vector, rows, cols, wrows, wcols, depth))
            except ValueError:
                continue
    return out


def fits(n: int, m: int) -> bool:
    """Whether an n:m pattern keeps at most 2 of every 4 consecutive columns (what mma.sp serves): a
    group of 4 lies inside one group of m when m is a multiple of 4, so n ≤ 2 is enough."""
    return m % 4 == 0 and 1 <= n <= 2


def group_problem(matrix: sp.csr_matrix) -> str:
    """Why A does not fit the instruction (a row's group of 4 columns with more than 2 nonzeros; a last
    group cut short by K is fine: past K is zero), or ""."""
    a = sp.coo_matrix(matrix)
    if a.nnz == 0:
        return ""
    per_row = a.shape[1] // 4 + 1
    keys, counts = np.unique(a.row.astype(np.int64) * per_row + a.col // 4, return_counts=True)
    if counts.max() > 2:
        row, group = divmod(int(keys[np.argmax(counts)]), per_row)
        return (f"row {row} holds {int(counts.max())} nonzeros in columns {4 * group}..{4 * group + 3}: the sparse "
                f"tensor cores take at most 2 of every 4")
    return ""


def mma_operands(matrix: sp.csr_matrix, tiling: MMATiling, dtype: str) -> dict[str, np.ndarray]:
    """{"values": float32 (the fragments' 32-bit words, as floats: the module's array type),
    "index": uint8 (the metadata's 32-bit words, as bytes)} as the module docstring lays them out, A's
    values rounded to `dtype`. ValueError naming the row and group that holds more than 2 nonzeros."""
    a = sp.csr_matrix(matrix, dtype=np.float64, copy=True)
    a.sum_duplicates()
    a.eliminate_zeros()
    problem = group_problem(a)
    if problem:
        raise ValueError(f"sparse tensor-core kernel: {problem}")
    t = tiling
    rows, k = a.shape
    blocks, chunks = t.row_blocks(rows), t.chunks(k)
    steps_total = chunks * t.steps
    m_pad, groups = blocks * t.block_rows, steps_total * STEP // 4
    # per row and group of 4: the two kept values (16-bit bits) and their columns in the group, ascending
    kept_bits = np.zeros((m_pad, groups, 2), np.uint16)
    kept_col = np.tile(np.array([0, 1], np.uint8), (m_pad, groups, 1))
    coo = a.tocoo()
    if coo.nnz:
        row, col = coo.row.astype(np.int64), coo.col.astype(np.int64)
        order = np.lexsort((col, row))
        row, col, data = row[order], col[order], coo.data[order]
        group = col // 4
        key = row * groups + group
        first = np.r_[True, key[1:] != key[:-1]]
        slot = np.where(first, 0, 1)
        count = np.bincount(key, minlength=m_pad * groups).reshape(m_pad, groups)
        kept_bits[row, group, slot] = to_dtype_bits(data, dtype)
        kept_col[row, group, slot] = (col % 4).astype(np.uint8)
        # a group with one nonzero: its zero partner at another column, the pair ascending
        lone = (count == 1)
        r1, g1 = np.nonzero(lone)
        c = kept_col[r1, g1, 0]
        partner_low = c > 0  # the zero goes below it (column c - 1), else above (column 1)
        kept_col[r1, g1, 0] = np.where(partner_low, c - 1, c)
        kept_col[r1, g1, 1] = np.where(partner_low, c, 1)
        bits = kept_bits[r1, g1, 0].copy()
        kept_bits[r1, g1, 0] = np.where(partner_low, 0, bits)
        kept_bits[r1, g1, 1] = np.where(partner_low, bits, 0)
    # compressed columns: 2 per group, 16 a step; per (row, step): 16 halves and 8 groups' 4-bit codes
    compressed = kept_bits.reshape(m_pad, steps_total, 16)
    codes = (kept_col[..., 0] | (kept_col[..., 1] << 2)).astype(np.uint32).reshape(m_pad, steps_total, 8)
    # values[block][step][mtile][lane][reg]: lane = 4g + t; reg 0: row g at 2t, 2t+1; reg 1: row g+8;
    # reg 2: row g at 2t+8, 2t+9; reg 3: row g+8 there
    tiles = compressed.reshape(blocks, t.mtiles, 16, steps_total, 16).transpose(0, 3, 1, 2, 4)
    g = np.arange(8)[:, None]
    tt = np.arange(4)[None, :]
    words = np.zeros((blocks, steps_total, t.mtiles, 8, 4, 4), np.uint32)
    for reg, (row_off, col_off) in enumerate(((0, 0), (8, 0), (0, 8), (8, 8))):
        low = tiles[:, :, :, g + row_off, 2 * tt + col_off].astype(np.uint32)
        high = tiles[:, :, :, g + row_off, 2 * tt + col_off + 1].astype(np.uint32)
        words[..., reg] = low | (high << 16)
    values = words.reshape(blocks, steps_total, t.mtiles, 32, 4)
    # metadata[block][step][mtile][2g + h]: groups 4h..4h+3 of rows g (bits 0-15) and g + 8 (bits 16-31)
    code_tiles = codes.reshape(blocks, t.mtiles, 16, steps_total, 8).transpose(0, 3, 1, 2, 4)
    half_codes = code_tiles.reshape(blocks, steps_total, t.mtiles, 16, 2, 4)  # [..., row, h, group in h]
    packed16 = (half_codes << (4 * np.arange(4, dtype=np.uint32))).sum(axis=-1, dtype=np.uint32)
    meta = packed16[:, :, :, :8, :] | (packed16[:, :, :, 8:, :] << 16)  # [..., g, h]
    meta = meta.reshape(blocks, steps_total, t.mtiles, 16)
    # stage-major: a block's stage is contiguous ([chunk][block][steps of the stage][mtile]...)
    values = values.reshape(blocks, chunks, t.steps, t.mtiles, 32, 4).transpose(1, 0, 2, 3, 4, 5)
    meta = meta.reshape(blocks, chunks, t.steps, t.mtiles, 16).transpose(1, 0, 2, 3, 4)
    return {"values": np.ascontiguousarray(values).reshape(-1).view(np.float32),
            "index": np.ascontiguousarray(meta).reshape(-1).view(np.uint8)}


def mma_product(operands: dict[str, np.ndarray], tiling: MMATiling, m: int, k: int, b: np.ndarray,
                dtype: str) -> np.ndarray:
    """C = A·B (float64) from the operands, decoded as the instruction reads them (the PTX ISA's
    fragment and metadata layout, written apart from mma_operands): what the operands mean, for tests."""
    from lospmm.kernel.numbers import from_dtype_bits

    t = tiling
    chunks, blocks = t.chunks(k), t.row_blocks(m)
    words = operands["values"].view(np.uint32).reshape(chunks, blocks, t.steps, t.mtiles, 32, 4)
    meta = operands["index"].view(np.uint32).reshape(chunks, blocks, t.steps, t.mtiles, 16)
    dense = np.zeros((blocks * t.block_rows, chunks * t.depth))
    for ch in range(chunks):
        for bl in range(blocks):
            for s in range(t.steps):
                for mt in range(t.mtiles):
                    k0, r0 = (ch * t.steps + s) * STEP, bl * t.block_rows + mt * 16
                    for lane in range(32):
                        gid, tid = divmod(lane, 4)
                        for reg in range(4):
                            row = gid + (8 if reg % 2 else 0)
                            for half in range(2):
                                c = 2 * tid + half + (8 if reg >= 2 else 0)  # compressed column
                                bits = (int(words[ch, bl, s, mt, lane, reg]) >> (16 * half)) & 0xFFFF
                                group = c // 2
                                entry = int(meta[ch, bl, s, mt, 2 * (row % 8) + group // 4])
                                code = (entry >> (16 * (row // 8) + 4 * (group % 4))) & 0xF
                                column = group * 4 + ((code >> (2 * (c % 2))) & 3)
                                dense[r0 + row, k0 + column] += float(
                                    from_dtype_bits(np.array([bits], np.uint16), dtype)[0])
    return dense[:m, :k] @ np.asarray(b, np.float64)
