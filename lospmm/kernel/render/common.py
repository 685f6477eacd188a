"""What every renderer shares: identifiers, literals, the sharding of tile functions into units, the
entry unit that dispatches on the block, and the skeleton of a tile's straight-line body (its
number format fills in the accumulators, loads, multiply-adds and stores: render.numbers)."""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np
import scipy.sparse as sp

from lospmm.kernel.design import BASELINE, KernelDesign

if TYPE_CHECKING:  # annotations only: the loader imports the kernel package and need not load numba
    from lospmm.stages.reorder import Tiles


@dataclass(frozen=True)
class CodegenParams:
    """Defaults: prefetch=1 (B values loaded one column ahead, Alg. 2's b); shard_nnz=4096
    (multiply-adds per compiled unit at most; a bigger tile is a unit of its own), chosen from
    benchmarks/shard_compile.py; design=BASELINE (see KernelDesign); n1_at_launch=False (True: a full
    kernel reads its block size from blockDim, as a proxy does, so one cubin serves every N1 of its
    M1 — what a measurement of every kept candidate launches; the emitted kernels bake N1 in)."""

    prefetch: int = 1
    shard_nnz: int = 4096
    design: KernelDesign = BASELINE
    n1_at_launch: bool = False

    def __post_init__(self):
        if self.prefetch < 0:
            raise ValueError(f"prefetch must be >= 0, got {self.prefetch}")
        if self.shard_nnz < 1:
            raise ValueError(f"shard_nnz must be >= 1, got {self.shard_nnz}")


def kernel_name(prefix: str, *parts) -> str:
    """An identifier derived from a hash, never from raw layer names."""
    digest = hashlib.sha256(repr(parts).encode()).hexdigest()[:16]
    return f"{prefix}_{digest}"


def float_literal(values: np.ndarray) -> list[str]:
    """Shortest decimal literals that read back as exactly these float32 values."""
    return [np.format_float_scientific(v, unique=True, trim="0") + "f"
            for v in np.asarray(values, dtype=np.float32)]


def sorted_matrix(matrix: sp.csr_matrix, epilogue) -> sp.csr_matrix:
    """`matrix` as CSR with sorted columns, its epilogue's bias checked against its rows."""
    a = sp.csr_matrix(matrix)
    a.sort_indices()
    if epilogue.bias and len(epilogue.bias) != a.shape[0]:
        raise ValueError(f"bias has {len(epilogue.bias)} values for {a.shape[0]} output rows")
    return a


def checked_tile(n1: int) -> None:
    if n1 < 1 or n1 > 1024:
        raise ValueError(f"N1 must be in 1..1024, got {n1}")


def design_parts(design: KernelDesign) -> tuple:
    """The design's part of an fp32 kernel's name: nothing for the baseline, so its names (and
    compile-cache entries) are those of the kernels before designs existed."""
    return () if design.code_key == BASELINE.code_key else design.code_key


def axes(design: KernelDesign) -> tuple[str, str]:
    """(the tile's grid axis, the column block's)."""
    return ("x", "y") if design.order == "tile-x" else ("y", "x")


def shard_groups(costs: list[int], shard_nnz: int) -> list[list[int]]:
    """Consecutive functions grouped into units of at most `shard_nnz` multiply-adds (a function
    costing more is a unit of its own). Every function is in exactly one group, in order."""
    groups: list[list[int]] = []
    total = 0
    for i, cost in enumerate(costs):
        if not groups or total + cost > shard_nnz:
            groups.append([])
            total = 0
        groups[-1].append(i)
        total += cost
    return groups


def units(prefix: str, functions: list[str], costs: list[int], shard_nnz: int, preamble: str) -> list[str]:
    # A unit's text depends on its own functions only, so a kernel in which one tile changed shares
    # every other unit (and its compile-cache entry) with the kernel before the change.
    return [preamble + f"// lospmm unit: {prefix}_{g[0]}..{prefix}_{g[-1]}\n" + "".join(functions[i] for i in g)
            for g in shard_groups(costs, shard_nnz)]


def tile_costs(a: sp.csr_matrix, tiles: Tiles) -> list[int]:
    nnz = np.diff(a.indptr)
    return [int(nnz[tiles.tile(t)].sum()) for t in range(tiles.num_tiles)]


def zero_blocks(empty_rows: np.ndarray, per_block: int) -> list[np.ndarray]:
    return [empty_rows[i:i + per_block] for i in range(0, len(empty_rows), per_block)]


def zero_functions(code, tiles: Tiles, epilogue) -> list[tuple[str, str]]:
    """The zeroing blocks' functions (signature, body) of a kernel on `tiles`: each stores M1 of the
    rows with no nonzero (their epilogue's output of a zero) in the number format `code`."""
    return [(f"({code.ctype}* __restrict__ Cn, const int N)", "".join(code.zero_store(int(r), epilogue) for r in rows))
            for rows in zero_blocks(tiles.empty_rows, max(tiles.m1, 1))]


def proxy_nonzeros(code, clusters, c: int) -> tuple[list[int], list[list[tuple[int, object]]]]:
    """Cluster c's proxy work: the B rows it loads, and per load its CPL multiply-adds (row within the
    M1 rows, value token in `code`), of distinct constants so that none fold together."""
    cols, cpl, m1 = [int(x) for x in clusters.columns[c]], int(clusters.cpl[c]), clusters.m1
    return cols, [[((j * cpl + q) % m1, code.proxy_value(1 + ((j * cpl + q) % 97) / 128)) for q in range(cpl)]
                  for j in range(len(cols))]


def entry_unit(preamble: str, header: str, num_tiles: int, tile_signature: str,
               zero_functions: list[tuple[str, str]], kernel_head: str, tile_args: str, zero_call: str,
               tile_axis: str = "x") -> str:
    """The entry unit: the tile functions' declarations, the zeroing blocks' functions (signature,
    body), and the kernel (`kernel_head`: its signature and per-thread set-up) dispatching on the
    block's tile index (`blockIdx.<tile_axis>`); `zero_call` calls zero_{z}."""
    cases = [f"    case {t}: tile_{t}({tile_args}); break;\n" for t in range(num_tiles)]
    cases += [f"    case {num_tiles + z}: {zero_call.format(z=z)}; break;\n" for z in range(len(zero_functions))]
    return "".join([
        preamble, header, " (entry unit)\n",
        *(f"LOSPMM_TILE void tile_{t}{tile_signature};\n" for t in range(num_tiles)),
        *(f"__device__ __forceinline__ void zero_{z}{signature} {{\n{body}}}\n"
          for z, (signature, body) in enumerate(zero_functions)),
        kernel_head, f"  switch (blockIdx.{tile_axis}) {{\n{''.join(cases)}    default: break;\n  }}\n}}\n"])


def first_column(design: KernelDesign, per_block: str, variable: str = "n") -> str:
    """The kernel's first lines: a thread's first column (`variable`) from the column block's grid
    axis, blocks of `per_block` columns; with V > 1 columns per thread, first a trap on an N that is
    no multiple of V (never read past a row: the launcher pads N, LaunchLayout.launch_columns)."""
    v = design.columns_per_thread
    thread = "threadIdx.x" if v == 1 else f"threadIdx.x * {v}"
    return ((f"  if (N % {v} != 0) __trap();\n" if v > 1 else "")
            + f"  const int {variable} = blockIdx.{axes(design)[1]} * {per_block} + {thread};\n")


def tile_signature(design: KernelDesign, ctype: str) -> str:
    """A tile (or cluster) function's parameters: the thread's B and C (B, C, its column and the
    stride of a looped design's walk)."""
    if design.looped:
        return f"(const {ctype}* __restrict__ B, {ctype}* __restrict__ C, const int N, int n, const int stride)"
    return f"(const {ctype}* __restrict__ Bn, {ctype}* __restrict__ Cn, const int N)"


def walked(design: KernelDesign, body: list[str], ctype: str) -> list[str]:
    """A tile's body as its function runs it: once on the thread's columns, or (a looped design)
    once per column block the block walks."""
    if not design.looped:
        return body
    return ["  do {\n", f"  const {ctype}* Bn = B + n;\n", f"  {ctype}* Cn = C + n;\n", *body,
            "  n += stride;\n", "  } while (n < N);\n"]


def k_sections(columns: list[int], nonzeros: list, limit: int) -> list[tuple[list[int], list]]:
    """A tile's columns (and their nonzeros) in consecutive sections of at most `limit` multiply-adds
    each (a column's nonzeros stay together: a column of more is a section alone); one section where
    `limit` is 0 (no K split)."""
    if not limit:
        return [(columns, nonzeros)]
    out, cols, nzs, count = [], [], [], 0
    for c, nz in zip(columns, nonzeros):
        if cols and count + len(nz) > limit:
            out.append((cols, nzs))
            cols, nzs, count = [], [], 0
        cols.append(c)
        nzs.append(nz)
        count += len(nz)
    return out + ([(cols, nzs)] if cols or not out else [])


def sectioned_walks(code, design: KernelDesign, columns: list[int], nonzeros: list, num_rows: int, prefetch: int,
                    load, stores, resumed, partial) -> list[str]:
    """A tile's (or cluster's) function body as it runs: its straight-line code walked (`walked`)
    with `stores(finish)` at the end; with a K split (design.section_fmas) each section of its
    columns walked over all the block's column blocks before the next (the walk restarts at the
    thread's first column), a section after the first resuming each row's sum from C
    (`resumed(finish)`) and one before the last storing it there as it is (`partial(finish)`)."""
    sections = k_sections(columns, nonzeros, design.section_fmas)
    if len(sections) == 1:
        body, finish = straight_line(code, columns, nonzeros, num_rows, prefetch, load)
        return walked(design, body + stores(finish), code.ctype)
    out = ["  const int n0 = n;  // each section walks the block's column blocks from the first\n"]
    declared = len(code.declarations(num_rows))
    for s, (cols, nzs) in enumerate(sections):
        body, finish = straight_line(code, cols, nzs, num_rows, prefetch, load)
        if s:
            out.append("  n = n0;\n")
            body = body[:declared] + resumed(finish) + body[declared:]
        out += walked(design, body + (stores(finish) if s == len(sections) - 1 else partial(finish)), code.ctype)
    return out


def tile_columns(a: sp.csr_matrix, rows: np.ndarray) -> tuple[sp.csc_matrix, np.ndarray]:
    """The tile's rows of A by column (indices: the row within the tile) and its non-empty columns."""
    sub = a[rows].tocsc()
    sub.sort_indices()
    return sub, np.flatnonzero(np.diff(sub.indptr))


def straight_line(code, columns: list[int], nonzeros: list[list[tuple[int, object]]], num_rows: int,
                  prefetch: int, load) -> tuple[list[str], list]:
    """A tile's straight-line code in the number format `code`: its accumulators, the B value(s) of
    each of `columns` loaded `prefetch` columns ahead of their use (`load(j, column, previous
    column)`: the statement that defines b{j}), and per column its nonzeros (row within the tile,
    the value's token in `code`) as multiply-adds. Returns the lines and, per row, what its store
    needs (code.finish)."""
    state = code.tile_state(num_rows)
    out = code.declarations(num_rows)
    loads = [load(j, c, columns[j - 1] if j else 0) for j, c in enumerate(columns)]
    out.extend(loads[:prefetch])
    for j in range(len(columns)):
        if j + prefetch < len(loads):
            out.append(loads[j + prefetch])
        out.append("  " + " ".join(code.multiply_adds(j, nonzeros[j], state)) + "\n")
    return out, code.finish(num_rows, state)
