"""How a kernel is launched over N output columns: the one description the runtime, the loader,
the host emulation, lospmm.torch and the GPU benchmarks read (kernel.json's `launch`)."""

from __future__ import annotations

from dataclasses import dataclass

from lospmm.kernel.design import BASELINE, ORDERS, KernelDesign

MAX_GRID_Y = 65535  # the hardware's limit on a grid's y (x takes 2^31 - 1)


@dataclass(frozen=True)
class LaunchLayout:
    """row_blocks: blocks along A (its tiles, plus a full kernel's zeroing blocks); threads: per block
    (0 when the block size is given at launch: a proxy's N1 under test, or a kernel that reads N1
    at launch); each thread computes columns_per_thread columns and each block walks column_walks
    column blocks; order says which grid axis holds the tiles."""

    row_blocks: int
    threads: int
    columns_per_thread: int = 1
    column_walks: int = 1
    order: str = "tile-x"
    # groups of `threads` a block has over the same columns (KernelDesign.block_groups): a staged block's
    # tiles, each walked by its own warps, or a sliced tile's slices of K; 1 for every other kernel
    groups: int = 1

    def __post_init__(self):
        if self.order not in ORDERS:
            raise ValueError(f"launch order must be one of {', '.join(ORDERS)}, got {self.order!r}")

    def block(self, threads: int | None = None) -> int:
        """Threads a block launches with: its own, or where N1 is given at launch (`threads`: a proxy's
        N1 under test) that many for each of its tiles (a staged block's tiles each have their own N1)."""
        block = threads * self.groups if threads else self.threads
        if block < 1:
            raise ValueError("a proxy's launch needs its N1 (threads per block)")
        return block

    def launch_columns(self, n: int) -> int:
        """The N the kernel is launched with for n columns: a multiple of columns_per_thread (B and
        C padded with columns beyond n when it is not n)."""
        v = self.columns_per_thread
        return -(-n // v) * v

    def column_blocks(self, n: int, threads: int | None = None) -> int:
        return -(-self.launch_columns(n) // self.columns_per_block(threads))

    def columns_per_block(self, threads: int | None = None) -> int:
        """Columns of C a block computes: its threads' (a staged block's tiles, a sliced tile's slices share theirs)."""
        return self.block(threads) * self.columns_per_thread // self.groups

    def grid(self, n: int, threads: int | None = None) -> tuple[int, int, int]:
        """The launch grid for n columns (a proxy takes the N1 under test as `threads`)."""
        walkers = -(-self.column_blocks(n, threads) // self.column_walks)
        grid = (self.row_blocks, walkers, 1) if self.order == "tile-x" else (walkers, self.row_blocks, 1)
        if grid[1] > MAX_GRID_Y:
            along = "column blocks" if self.order == "tile-x" else "blocks along A"
            if self.groups > 1:  # a staged block's N1 is its design's, and it walks once; a sliced block walks once
                hint = ("a staged or sliced block walks once: more warps a tile (staged), a wider N1 (sliced), or "
                        "fewer columns a launch")
            else:
                hint = "more walks or a wider N1" if self.order == "tile-x" else "use tile-x or a taller M1"
            raise ValueError(f"{grid[1]} {along} exceed the grid's y limit of {MAX_GRID_Y} ({self.order}; {hint})")
        return grid

    def facts(self) -> dict:
        return {k: v for k, v in vars(self).items() if k != "groups" or v != 1}

    def grid_formula(self, columns: str) -> dict:
        """kernel.json's `grid`, for readers in C++: each axis as a number or a formula of `columns`."""
        per_block = f"{self.threads * self.columns_per_thread // self.groups}"
        walkers = (f"ceil({columns} / {per_block})" if self.column_walks == 1
                   else f"ceil(ceil({columns} / {per_block}) / {self.column_walks})")
        x, y = (self.row_blocks, walkers) if self.order == "tile-x" else (walkers, self.row_blocks)
        return {"x": x, "y": y, "z": 1}

    @classmethod
    def of_facts(cls, facts: dict) -> "LaunchLayout":
        """The layout kernel.json records; a directory written before `launch` existed had the grid's
        x and N1 only (tiles along x, one column per thread, one walk); a staged kernel's before sliced
        kernels existed named its groups `tiles_per_block`."""
        if "launch" in facts:
            launch = dict(facts["launch"])
            if "tiles_per_block" in launch:
                launch["groups"] = launch.pop("tiles_per_block")
            return cls(**launch)
        return cls(row_blocks=int(facts["grid"]["x"]), threads=int(facts["n1"]))


def proxy_layout(num_tiles: int, design: KernelDesign = BASELINE) -> LaunchLayout:
    """How a proxy of `num_tiles` tiles is launched in `design` (its N1 given at launch): a block a
    tile, or in a staged design one a `tiles_per_block` of them (each block N1 threads a group:
    KernelDesign.block_groups)."""
    return LaunchLayout(design.blocks_along_a(num_tiles), 0, design.columns_per_thread, design.column_walks,
                        design.order, design.block_groups)
