"""A design's short label (what `inspect` and the run summary show) reads back to the same design."""

from __future__ import annotations

import itertools

from lospmm.kernel.design import (A_VALUES, BASELINE, K_SLICES, LOADS, ORDERS, VECTOR_WIDTHS, KernelDesign,
                                  design_named, short_design_label)
from lospmm.kernel.numbers import DTYPES

# every field's values (a few of each number): their product holds every kind of design there is
_VALUES = {"order": ORDERS, "column_walks": (1, 4), "columns_per_thread": VECTOR_WIDTHS, "loads": LOADS,
           "a_values": A_VALUES, "dtype": DTYPES, "accumulate": ("", "packed", "f32", "mma"), "promote_every": (0, 64),
           "tiles_per_block": (1, 8), "tile_warps": (1, 2), "section_fmas": (0, 256), "k_slices": K_SLICES}


def _designs():
    for values in itertools.product(*_VALUES.values()):
        try:
            yield KernelDesign(**dict(zip(_VALUES, values)))
        except ValueError:  # a combination no kernel has
            continue


def test_every_designs_short_label_reads_back_to_it():
    designs = set(_designs())
    assert len(designs) > 50
    for design in designs:
        short = short_design_label(design.label)
        assert design_named(short) == design, (design.label, short)
        assert len(short) <= len(design.label)
        # a served kernel's label keeps its tile
        assert short_design_label(f"4×64 {design.label}") == f"4×64 {short}"


def test_a_short_label_names_only_what_differs_from_the_default():
    assert short_design_label(BASELINE.label) == "baseline"
    assert short_design_label("baked,chained,tile-x,walks=1,v=1") == "chained"
    assert short_design_label("1×32 baked,chained,column-x,walks=4,v=4") == "1×32 chained,column-x,walks=4,v=4"
    assert short_design_label("fp16,baked,based,tile-x,walks=1,v=2") == "fp16,v=2"
    # what names no design is left as it is: a tile alone, the N:M kernel's blocking, nothing
    for text in ("8×448", "nm 2:4,mma,64x128,w32x64", "nm 16:32:4,64x128,8x8", ""):
        assert short_design_label(text) == text
