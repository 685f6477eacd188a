"""A kernel's design: how it walks its tiles (grid order, walks, columns per thread, B addresses,
baked or streamed values) and its number format. One frozen value, read back from its label.

On the H100 a baked kernel's time followed the straight-line code all its blocks walk (issue 20),
so the designs trade code for reuse: the grid's order (tiles along x, or column blocks along x so
that blocks dispatched together share a tile's code); a block walking several column blocks of
its tile (a loop around the tile's code); 2 or 4 output columns per thread (one B load feeds that
many multiply-adds of one literal); B addresses chained from the previous load (one IMAD.WIDE per
load instead of an IMAD.WIDE and a 64-bit add); and A's values streamed from data by one loop
instead of baked into code. A half design (fp16/bf16) holds two columns per thread as one packed
pair. Which kernels a design renders, and what it can serve, is asked of `KernelSpec`
(lospmm.kernel.spec); how it is launched is its `LaunchLayout` (lospmm.kernel.layout).
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from lospmm.kernel.numbers import DTYPES, HALF_DTYPES, NumberFormat

ORDERS = ("tile-x", "column-x")
LOADS = ("based", "chained", "staged")
STAGED_TILES = (2, 4, 8, 16)
STAGED_WARPS = (1, 2, 4)
STAGED_FLOATS = 8192  # a staged block's chunk of B at most (32 KiB of floats): 256 rows of K at 32 columns
A_VALUES = ("baked", "streamed", "nm")
VECTOR_WIDTHS = (1, 2, 4)
K_SLICES = (1, 2, 4, 8)
SLICE_SHARED_BYTES = 48 * 1024  # a sliced block's partial sums: the static shared memory a block may declare


@dataclass(frozen=True)
class KernelDesign:
    """How a kernel (and its proxies) walks its tiles. Defaults are the kernel measured on the
    H100 in earlier sessions (`baseline`), kept as the default until the device says which design wins.

    order: "tile-x" (blockIdx.x is the tile: blocks dispatched together run different tiles' code)
        or "column-x" (blockIdx.x is the column block: consecutive blocks share one tile's code).
    column_walks: column blocks one block walks. Above 1 the tile's code is a grid-stride loop,
        fetched once per block and executed up to this many times; the grid has
        ceil(column blocks / column_walks) blocks per tile.
    columns_per_thread: 1, 2 or 4 output columns per thread, read and written as float/float2/float4,
        so one B load feeds that many multiply-adds of one literal. N must be a multiple of it
        (`LaunchLayout.launch_columns`: the launchers pad B and C), B and C aligned to its width.
    loads: "based" (each B address from the thread's column: IMAD.WIDE and a 64-bit add),
        "chained" (from the previous load's address: one IMAD.WIDE), or "staged" (a block of
        `tiles_per_block` tiles shares N1 = 32·tile_warps columns, each tile walked by its own
        tile_warps warps; per chunk of K the block copies the union of its tiles' columns of B into
        shared memory once, and each tile's warps read its from there: B's traffic through L2 is
        the union's, not the sum of the tiles').
    tiles_per_block: a staged design's tiles a block (1 for the others).
    tile_warps: a staged design's warps a tile spans (1, 2 or 4): its N1 is 32 of them, so the tile's
        code, fetched once a block, serves 32·tile_warps columns; its chunks of K are as many times
        shorter (STAGED_FLOATS over N1 rows), so a chunk's union still fits 32 KiB.
    section_fmas: a looped baked fp32 design's K split (0: none): a tile of more nonzeros (multiply-adds
        of a literal: V FFMAs each at V columns a thread) is rendered in sections of its columns of at
        most this many (a column past it alone), each walked over all the block's
        column blocks before the next, its partial sums kept in C between sections (read back by the
        thread that wrote them; the epilogue at the last). A walk repeats one section's code, small
        enough to stay in the instruction cache, where the whole tile's would be fetched again per
        walk (the H200's micro sweep: 16 walks of one tile cost 9.3× one walk at 12 KB of code,
        12.9× at 0.8 MB).
    k_slices: a baked fp32 design's K split across a block's warps (1: none): a block is k_slices groups
        of N1 threads over the same N1·V columns, and each group walks one slice of the tile's columns
        (consecutive, balanced by loads and multiply-adds), so a tile's serial walk is about k_slices
        times shorter and k_slices times as many warps walk it; a row that more than one slice touches
        is summed through shared memory (each slice's partial stored, a barrier, its owner adding the
        others' to its own), the rest stored by their slice. On the H200 the flow's tiles were bound by
        the longest tile's walk at 4-33% achieved occupancy (the designs-held-out and headline steps):
        this is the design that gives each tile more warps. One walk, baked, chained loads.
    a_values: "baked" (A's values are literals in straight-line code, one function per tile) or
        "streamed" (one loop reads each tile's non-empty columns and values from data in the
        cubin: code O(1) in the kernel's size, compile time too; convolutions too), or "nm" (an N:M-sparse A compressed
        into values and positions that the loader fills in, B staged through shared memory:
        lospmm.kernel.nm; the kernel's blocking is its spec's `nm`, so the other fields keep their
        defaults).
    dtype: "fp32" (B, C and the literals in float) or "fp16" / "bf16" (B and C in the dtype, each
        thread's two columns one packed pair, so columns_per_thread is 2, one `fma.rn.f16x2` per
        nonzero); a half design has the baseline's grid (tile-x, one walk) and baked values so far.
    accumulate: a half design's sum: "packed" (in the dtype; "" is read as it), "f32" (B's pair
        converted to floats, two FFMAs per nonzero) or, for the nm design only, "mma" (fp32 in the
        sparse tensor cores: its kernel is mma.sp's, lospmm.kernel.sparse_mma); "" for fp32.
    promote_every: a packed half sum moved into an fp32 pair every this many nonzeros of a row (0: never)."""

    order: str = "tile-x"
    column_walks: int = 1
    columns_per_thread: int = 1
    loads: str = "based"
    a_values: str = "baked"
    dtype: str = "fp32"
    accumulate: str = ""
    promote_every: int = 0
    tiles_per_block: int = 1
    tile_warps: int = 1
    section_fmas: int = 0
    k_slices: int = 1

    def __post_init__(self):
        choices = {"order": ORDERS, "loads": LOADS, "a_values": A_VALUES, "dtype": DTYPES}
        for field_name, allowed in choices.items():
            if getattr(self, field_name) not in allowed:
                raise ValueError(f"design {field_name} must be one of {', '.join(allowed)}, "
                                 f"got {getattr(self, field_name)!r}")
        if self.columns_per_thread not in VECTOR_WIDTHS:
            raise ValueError(f"design columns_per_thread must be one of {VECTOR_WIDTHS}, got {self.columns_per_thread}")
        if self.column_walks < 1:
            raise ValueError(f"design column_walks must be >= 1, got {self.column_walks}")
        if (self.loads == "staged") != (self.tiles_per_block != 1):
            raise ValueError(f"design tiles_per_block is a staged design's ({', '.join(map(str, STAGED_TILES))}), and "
                             f"only its; got loads={self.loads}, tiles_per_block={self.tiles_per_block}")
        if self.tile_warps != 1 and (self.loads != "staged" or self.tile_warps not in STAGED_WARPS
                                     or 32 * self.tile_warps * self.tiles_per_block > 1024):
            raise ValueError(f"design tile_warps is a staged design's ({', '.join(map(str, STAGED_WARPS))}, at most "
                             f"1024 threads a block), and only its; got loads={self.loads}, tiles={self.tiles_per_block}, "
                             f"warps={self.tile_warps}")
        if self.loads == "staged" and (self.tiles_per_block not in STAGED_TILES or self.half
                                       or (self.order, self.column_walks, self.columns_per_thread, self.a_values)
                                       != ("tile-x", 1, 1, "baked")):
            raise ValueError(f"a staged design is fp32, baked, tile-x, one walk, v=1, with tiles={'|'.join(map(str, STAGED_TILES))} "
                             f"so far; got tiles={self.tiles_per_block}, {self.order}, walks={self.column_walks}, "
                             f"v={self.columns_per_thread}, {self.a_values}, {self.dtype}")
        if self.a_values == "nm":
            if (self.order, self.column_walks, self.columns_per_thread, self.loads) != ("tile-x", 1, 1, "based"):
                raise ValueError(f"the nm design has its own blocking (no grid order, walks, vector width or chained "
                                 f"loads); got {self.label}")
            if self.promote_every:
                raise ValueError(f"the nm design's half sums are packed or fp32, never promoted; got {self.label}")
        elif self.accumulate == "mma":
            raise ValueError(f"mma sums are the nm design's (the N:M kernel on sparse tensor cores); got {self.label}")
        elif self.half and (self.columns_per_thread, self.order, self.column_walks, self.a_values) != (
                2, "tile-x", 1, "baked"):
            raise ValueError(f"a {self.dtype} design holds one packed pair per thread (v=2) in the baseline's grid "
                             f"(tile-x, one walk) with baked values, so far; got {self.label}")
        if self.section_fmas and (self.section_fmas < 1 or not self.looped or self.a_values != "baked"
                                  or self.loads == "staged" or self.half):
            raise ValueError(f"a K split (split=S) is a looped baked fp32 design's (walks=W above 1: each section "
                             f"walked over the block's column blocks); got {self.label}")
        if self.k_slices not in K_SLICES:
            raise ValueError(f"design k_slices must be one of {K_SLICES}, got {self.k_slices}")
        if self.k_slices != 1 and (self.a_values != "baked" or self.loads != "chained" or self.looped or self.half
                                   or self.section_fmas):
            # based loads: ptxas spilled 0.8-1.1 KB a thread at V = 2 and 8 slices even 24 registers above the
            # prediction (NVRTC sm_90), where chained loads spilled nothing at it
            raise ValueError(f"a K split across a block's warps (slices=W) is a baked fp32 design's of one walk with "
                             f"chained loads (write chained,slices=W), no split=S; got {self.label}")
        if self.half:
            if not self.accumulate:  # one spelling per design: equal designs are equal keys
                object.__setattr__(self, "accumulate", "packed")
        NumberFormat(self.dtype, self.accumulate, self.promote_every)  # ValueError: no such number format

    @property
    def number(self) -> NumberFormat:
        """The number format of B, C and the sums (the renderers' strategy, the check's metric)."""
        return NumberFormat(self.dtype, self.accumulate, self.promote_every)

    @property
    def half(self) -> bool:
        """B and C in fp16 or bf16."""
        return self.dtype != "fp32"

    @property
    def element_bytes(self) -> int:
        """Bytes of one element of B and C."""
        return self.number.element_bytes

    @property
    def tiled(self) -> bool:
        """Whether its kernels are rendered on the search's reordered tiles (baked and streamed A); the
        nm design's on its own blocking of an N:M A (lospmm.kernel.choices.untiled_served)."""
        return self.a_values != "nm"

    @property
    def serves_conv(self) -> bool:
        """Whether an implicit-im2col conv kernel of this design exists (conv_kernel is itself: the grid's
        order, walks and columns per thread of a baked design in its number format or of a streamed
        fp32 one, a sliced one's slices, a staged one's blocking, the N:M kernel on CUDA cores in any number
        format); a convolution in another design is served by the GEMM kernel on its im2col B."""
        return self.conv_kernel == self

    @property
    def conv_kernel(self) -> "KernelDesign | None":
        """The implicit-im2col conv kernel a run in this design serves a convolution with: the part of
        the design such a kernel has (conv_design: the grid's order, the walks, whether A is baked or
        streamed, a baked one's columns per thread and number format (a half one's pair: two output
        pixels a thread), a sliced one's slices (its `chained` kept in its name only), the staged blocking,
        or the N:M kernel's own; its loads already take one instruction from the pixel's pointer, so
        `chained` has nothing to add); None for the N:M kernel
        on sparse tensor cores (its convolutions are im2col GEMMs)."""
        if self.accumulate == "mma":
            return None
        return conv_design(self)

    @property
    def conv_lanes(self) -> int:
        """Output pixels a thread of its implicit-im2col conv kernel computes, each loading its own input:
        a baked or streamed design's columns per thread (its conv form keeps them: a half one's pair is two
        pixels), 1 for every other (and for a design whose convolutions are im2col GEMMs)."""
        kernel = self.conv_kernel  # conv_design keeps the columns per thread of a baked or streamed design
        return kernel.columns_per_thread if kernel is not None else 1

    @property
    def conv_lane_windows(self) -> bool:
        """Whether its implicit-im2col conv kernel finds and keeps each lane's window (render.conv's form
        of V lanes; a sliced one's at any V: render.sliced), not one pixel's window mask."""
        kernel = self.conv_kernel
        return kernel is not None and (self.conv_lanes > 1 or kernel.k_slices > 1)

    @property
    def fixed_n1(self) -> int:
        """The N1 (threads per tile) its kernels must have, 0 for any multiple of the warp: a staged
        block's tiles each span tile_warps warps over the same 32·tile_warps columns."""
        return 32 * self.tile_warps if self.loads == "staged" else 0

    @property
    def staged_rows(self) -> int:
        """Rows of K a staged block copies at a time: its chunk of B is at most STAGED_FLOATS floats."""
        return STAGED_FLOATS // self.fixed_n1 if self.loads == "staged" else 0

    @property
    def block_groups(self) -> int:
        """Groups of N1 threads a block has, all over the block's N1·V columns: a staged block's tiles, a
        sliced tile's slices of K, 1 for every other design (LaunchLayout.groups)."""
        return self.tiles_per_block * self.k_slices

    def block_threads(self, n1: int) -> int:
        """Threads a block of its kernel has at N1: N1 for each of its tiles (each slice of a sliced tile)."""
        return n1 * self.block_groups

    def slice_shared_bytes(self, m1: int, n1: int) -> int:
        """A sliced block's shared memory for its partial sums at most (0 for every other design): a slot
        of N1·V floats for each slice and row of M1 (render.sliced keeps only the rows two slices touch)."""
        return 4 * self.k_slices * m1 * n1 * self.columns_per_thread if self.k_slices > 1 else 0

    def block_problem(self, m1: int, n1: int) -> str:
        """Why a block of tile (M1, N1) in this design cannot be launched ("" when it can), past what the
        registers say (kernel.registers, devices.block_fits_registers): a sliced block's threads past 1024
        or its partial sums past SLICE_SHARED_BYTES."""
        if self.k_slices == 1:
            return ""
        if self.block_threads(n1) > 1024:
            return f"{self.k_slices} slices × N1 = {n1}: {self.block_threads(n1)} threads a block, over 1024"
        if self.slice_shared_bytes(m1, n1) > SLICE_SHARED_BYTES:
            return (f"{self.k_slices} slices × M1 = {m1} × N1·V = {n1 * self.columns_per_thread}: "
                    f"{self.slice_shared_bytes(m1, n1)} bytes of partial sums, over {SLICE_SHARED_BYTES}")
        return ""

    def blocks_along_a(self, num_tiles: int) -> int:
        """Blocks along A that walk `num_tiles` tiles: one a tile, or a staged block's tiles_per_block."""
        return -(-num_tiles // self.tiles_per_block)

    @property
    def looped(self) -> bool:
        return self.column_walks > 1

    @property
    def code_key(self) -> tuple:
        """What of the design shapes the code: the number of walks is a launch fact, only whether
        there is a loop is in the text (a kernel looped for 4 walks runs any number). An fp32
        design's key is what it was before half designs existed."""
        key = (self.order, self.looped, self.columns_per_thread, self.loads, self.a_values)
        key += (self.tiles_per_block,) if self.loads == "staged" else ()
        key += (self.tile_warps,) if self.tile_warps != 1 else ()
        key += (("split", self.section_fmas),) if self.section_fmas else ()
        key += (("slices", self.k_slices),) if self.k_slices != 1 else ()
        return key + (self.dtype, self.accumulate, self.promote_every) if self.half else key

    @property
    def _number_label(self) -> str:
        if not self.half:
            return ""
        return (f"{self.dtype}," + (f"acc={self.accumulate}," if self.accumulate != "packed" else "")
                + (f"promote={self.promote_every}," if self.promote_every else ""))

    @property
    def code_label(self) -> str:
        """The part of the label the code shows (a source's header): the walks' count is a launch fact."""
        return (f"{self._number_label}{self.a_values},{self.loads},{self.order},"
                f"{'looped' if self.looped else 'one walk'},v={self.columns_per_thread}{self._tiles_label}")

    @property
    def _tiles_label(self) -> str:
        return ((f",tiles={self.tiles_per_block}" if self.loads == "staged" else "")
                + (f",warps={self.tile_warps}" if self.tile_warps != 1 else "")
                + (f",split={self.section_fmas}" if self.section_fmas else "")
                + (f",slices={self.k_slices}" if self.k_slices != 1 else ""))

    @property
    def label(self) -> str:
        """The design as `design_named` reads it back, e.g. "baked,chained,column-x,walks=4,v=4" or
        "fp16,acc=f32,baked,chained,tile-x,walks=1,v=2"."""
        return (f"{self._number_label}{self.a_values},{self.loads},{self.order},walks={self.column_walks},"
                f"v={self.columns_per_thread}{self._tiles_label}")

    def facts(self) -> dict:
        """Its fields and label; tiles_per_block only for a staged design, section_fmas and k_slices only
        for a K split (the facts of every other design, and so what is keyed on them, as before)."""
        return {"label": self.label, **{k: v for k, v in vars(self).items()
                                        if (k != "tiles_per_block" or self.loads == "staged")
                                        and (k != "tile_warps" or v != 1) and (k != "section_fmas" or v)
                                        and (k != "k_slices" or v != 1)}}

    @classmethod
    def of_facts(cls, facts: dict) -> "KernelDesign":
        """The design kernel.json's `design` records (its fields; the label is derived)."""
        design = dict(facts)
        design.pop("label", None)
        return cls(**design)


BASELINE = KernelDesign()


def short_design_label(text: str) -> str:
    """A design label as people read it: the tokens the default design does not share ("baked,chained,
    tile-x,walks=1,v=1" is "chained"; the default is "baseline"), which design_named reads back to the
    same design. A served kernel's label keeps its tile ("1×32 baked,chained,…" is "1×32 chained"); text
    that names no design (the N:M kernel's "nm 2:4,…", a tile alone) is returned as it is."""
    tile, _, label = text.rpartition(" ")
    try:
        design_named(label)
    except ValueError:
        return text
    if not label:
        return text
    common = set(BASELINE.label.split(","))
    short = ",".join(t for t in label.split(",") if t not in common) or "baseline"
    return f"{tile} {short}" if tile else short


def design_named(text: str) -> KernelDesign:
    """A design from its label's tokens in any order, each optional (the default's value otherwise):
    `baked|streamed`, `based|chained|staged`, `tile-x|column-x`, `walks=W`, `v=1|2|4`, a staged
    design's `tiles=G` (8 unless told) and `warps=1|2|4`, a looped design's K split `split=S`
    (nonzeros a section), a K split across a block's warps `slices=2|4|8`, and a half
    design's `fp16|bf16`, `acc=packed|f32|mma` (mma: the nm design's, on sparse tensor cores), `promote=K` (a half design is v=2 unless told);
    "baseline" is the default. ValueError naming the token it cannot read, or a token given twice
    with two values (`tile-x,column-x`)."""
    values: dict = {}
    for token in (t.strip() for t in text.split(",")):
        if token in ("", "baseline"):
            continue
        if token in DTYPES:
            field_name, value = "dtype", token
        elif token.startswith("acc=") and token[4:] in ("packed", "f32", "mma"):
            field_name, value = "accumulate", token[4:]
        elif token.startswith("promote=") and token[8:].isdigit():
            field_name, value = "promote_every", int(token[8:])
        elif token in A_VALUES:
            field_name, value = "a_values", token
        elif token in LOADS:
            field_name, value = "loads", token
        elif token in ORDERS:
            field_name, value = "order", token
        elif token.startswith("tiles=") and token[6:].isdigit():
            field_name, value = "tiles_per_block", int(token[6:])
        elif token.startswith("warps=") and token[6:].isdigit():
            field_name, value = "tile_warps", int(token[6:])
        elif token.startswith("split=") and token[6:].isdigit():
            field_name, value = "section_fmas", int(token[6:])
        elif token.startswith("slices=") and token[7:].isdigit():
            field_name, value = "k_slices", int(token[7:])
        elif token.startswith(("walks=", "v=")) and token.split("=", 1)[1].isdigit():
            key, number = token.split("=", 1)
            field_name, value = ("column_walks" if key == "walks" else "columns_per_thread"), int(number)
        else:
            raise ValueError(f"design {text!r}: cannot read {token!r} (tokens: baked|streamed, based|chained|staged, "
                             f"tile-x|column-x, walks=W, v=1|2|4, tiles=G, warps=1|2|4, split=S, slices=W, fp16|bf16, acc=packed|f32|mma, "
                             f"promote=K)")
        if field_name in values and values[field_name] != value:
            raise ValueError(f"design {text!r}: {field_name.replace('_', ' ')} given twice "
                             f"({values[field_name]} and {value}): choose one")
        values[field_name] = value
    if values.get("dtype", "fp32") != "fp32" and values.get("a_values") != "nm":
        values.setdefault("columns_per_thread", 2)
    if values.get("loads") == "staged":
        values.setdefault("tiles_per_block", 8)
    return KernelDesign(**values)


def conv_design(design: KernelDesign) -> KernelDesign:
    """The part of `design` an implicit-im2col conv kernel has: the grid's order, the column walks,
    whether A's values are baked or streamed, a baked one's columns per thread, a sliced one's slices of K
    (render.sliced: each slice's window loads, its shared rows reduced as the GEMM's), or a staged
    design's blocking (its copy gathers the pixels' inputs), or the N:M kernel's in its number format;
    its loads already take one instruction from the pixel's pointer. A baked design keeps its columns per thread: V output pixels a thread
    (n1 apart, so that a warp's loads of each stay consecutive), each literal feeding V multiply-adds,
    each pixel's input its own load (adjacent output pixels are not adjacent inputs); a streamed one
    keeps them alike (each value read from data feeds V multiply-adds). A half design's (fp16/bf16, baked) keeps its number
    format: its pair is two output pixels, n1 apart, each lane's 16-bit input loaded into its half of
    the pair."""
    if design.loads == "staged":
        return KernelDesign(loads="staged", tiles_per_block=design.tiles_per_block, tile_warps=design.tile_warps)
    if design.a_values == "nm":  # its own blocking: its copies gather the pixels' inputs
        return KernelDesign(a_values="nm", dtype=design.dtype, accumulate=design.accumulate)
    if design.a_values == "streamed":
        return KernelDesign(order=design.order, column_walks=design.column_walks, a_values="streamed",
                            columns_per_thread=design.columns_per_thread)
    if design.k_slices > 1:  # its slices and reduction as the GEMM's; its chained loads stay in its name only
        return KernelDesign(order=design.order, columns_per_thread=design.columns_per_thread, loads="chained",
                            k_slices=design.k_slices)
    return KernelDesign(order=design.order, column_walks=design.column_walks,
                        columns_per_thread=design.columns_per_thread, dtype=design.dtype,
                        accumulate=design.accumulate, promote_every=design.promote_every)


def conv_served_implicitly(design: KernelDesign, nm_kernel: bool = True) -> bool:
    """Whether a convolution in a run of `design` may be served by an implicit-im2col kernel: in the
    design's conv form (KernelDesign.conv_kernel), or, with `nm_kernel`, by the N:M kernel's in the
    design's number format where the layer holds an N:M pattern. Where neither serves a layer (a run
    of the N:M kernel on sparse tensor cores), its kernel is the GEMM on the im2col B."""
    if design.conv_kernel is not None:
        return True
    if not nm_kernel:
        return False
    try:
        return design_in(design.number, KernelDesign(a_values="nm")).conv_kernel is not None
    except ValueError:  # a promoted half sum: no N:M kernel of it
        return False


def design_in(number: NumberFormat, design: KernelDesign = BASELINE) -> KernelDesign:
    """`design` (an fp32 design) for kernels of `number`: itself for fp32, its half form otherwise
    (half_design: ValueError when it has none)."""
    return half_design(number, design) if number.is_half else design


def half_design(number: NumberFormat, design: KernelDesign = BASELINE) -> KernelDesign:
    """The half form of an fp32 `design` in the half `number` format: its loads, one packed pair per
    thread (v=2), the baseline's grid. ValueError naming the design when it has no half form (another
    grid, vector width or streamed values) or is a half design of another format already."""
    if number.dtype not in HALF_DTYPES:
        raise ValueError(f"{number.label} is not a half number format")
    if design.half:
        if design.number != number:
            raise ValueError(f"design {design.label} is not {number.label}")
        return design
    if design.a_values == "nm":  # its own blocking in any number format: the sums as `number` says
        return replace(design, dtype=number.dtype, accumulate=number.accumulate, promote_every=number.promote_every)
    if design.code_key not in (BASELINE.code_key, replace(BASELINE, loads="chained").code_key):
        raise ValueError(f"design {design.label}: a half kernel holds one packed pair per thread in the baseline's "
                         f"grid (tile-x, one walk), with based or chained loads, so far")
    return replace(design, dtype=number.dtype, accumulate=number.accumulate,
                   promote_every=number.promote_every, columns_per_thread=2)
