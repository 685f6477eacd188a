"""The K split (design section_fmas, issue 35): a looped baked tile's code in sections of its columns,
each walked over the block's column blocks before the next, its partial sums kept in C. Against
scipy on the host (every walk, vector width and epilogue), its proxy, its label, its estimate."""

import re

import numpy as np
import pytest
import scipy.sparse as sp
from hypothesis import HealthCheck, given, settings, strategies as st

from lospmm.devices import DEVICES
from lospmm.kernel.check import checked
from lospmm.kernel.design import design_named
from lospmm.kernel.epilogue import Epilogue
from lospmm.kernel.estimate import estimate_timer
from lospmm.kernel.host import HostKernel
from lospmm.kernel.registers import predicted_registers
from lospmm.kernel.render import CodegenParams, kernel_source
from lospmm.kernel.render.common import k_sections
from lospmm.kernel.spec import KernelSource
from lospmm.kernel.timing import LaunchUnderTest
from lospmm.stages.prune import random_pruned
from lospmm.stages.reorder import reordered_tiles
from tests.conftest import host_run_wrong, proxy_on_host


@given(st.lists(st.integers(1, 9), max_size=30), st.integers(0, 20))
def test_sections_keep_the_columns_in_order_and_each_within_its_limit(counts, limit):
    columns = list(range(len(counts)))
    nonzeros = [[(0, "x")] * c for c in counts]
    sections = k_sections(columns, nonzeros, limit)
    assert [c for cols, _ in sections for c in cols] == columns
    assert [nz for _, nzs in sections for nz in nzs] == nonzeros
    if not limit:
        assert len(sections) == 1
    for cols, nzs in sections:
        total = sum(map(len, nzs))
        assert total <= limit or len(cols) == 1 or not limit  # a column of more than the limit stands alone
    for (_, first), (_, second) in zip(sections, sections[1:]):  # a section closes only when the next column would pass
        assert sum(map(len, first)) + len(second[0]) > limit


@settings(max_examples=20, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(m=st.integers(1, 30), k=st.integers(1, 120), density=st.floats(0.05, 0.6), m1=st.integers(1, 6),
       walks=st.integers(2, 5), v=st.sampled_from([1, 2, 4]), loads=st.sampled_from(["based", "chained"]),
       order=st.sampled_from(["tile-x", "column-x"]), split=st.integers(1, 40), n=st.sampled_from([1, 37, 200]),
       prefetch=st.integers(0, 2), seed=st.integers(0, 1000))
def test_a_split_kernel_computes_a_times_b_through_its_epilogue_on_the_host(m, k, density, m1, walks, v, loads, order,
                                                                             split, n, prefetch, seed):
    # sections resume their rows' sums from C and only the last applies the bias and ReLU; every
    # section walks all the block's column blocks (N up to 200 over N1 = 32·V: several walks, a partial one)
    rng = np.random.default_rng(seed)
    a = random_pruned(m, k, 1 - density, rng)
    design = design_named(f"{loads},{order},walks={walks},v={v},split={split}")
    epilogue = Epilogue(tuple(float(x) for x in rng.standard_normal(m)), "relu")
    kernel = kernel_source(a, reordered_tiles(a, m1), 32, CodegenParams(prefetch=prefetch, design=design), epilogue)
    result = checked(HostKernel(kernel, True), a, n, seed)
    assert result.ok, (design.label, result.message)


def test_a_tile_past_its_limit_is_walked_section_by_section_and_the_epilogue_comes_last():
    a = random_pruned(8, 400, 0.5, np.random.default_rng(1))
    design = design_named("chained,walks=4,split=64")
    epilogue = Epilogue(tuple(np.linspace(-2, 2, 8).tolist()), "relu")
    kernel = kernel_source(a, reordered_tiles(a, 4), 32, CodegenParams(design=design), epilogue)
    text = "".join(kernel.units)
    per_tile = -(-(a.nnz // 2) // 64)  # two tiles of about half the nonzeros each
    assert text.count("while (n < N)") >= 2 * (per_tile - 1) and "lospmm_ldp(Cn," in text
    assert text.count("lospmm_relu(acc") == 8  # once per row: the last section's stores
    assert checked(HostKernel(kernel, True), a, 300).ok
    # the walk restarts at the thread's first column for every section: without it, a section after
    # the first starts past N (its do-while runs once there: ASan stops the store past C)
    broken = KernelSource(kernel.spec, tuple(u.replace("  n = n0;\n", "") for u in kernel.units))
    assert host_run_wrong(broken, a, 300)
    # the partial sums are stored as they are: with the ReLU applied to them, negative partials vanish
    relu_partials = tuple(re.sub(r"lospmm_st\(Cn, (\d+), N, (acc\d+)\);", r"lospmm_st(Cn, \1, N, lospmm_relu(\2));", u)
                          for u in kernel.units)
    assert relu_partials != kernel.units
    assert host_run_wrong(KernelSource(kernel.spec, relu_partials), a, 300)


def test_a_split_proxy_runs_in_bounds_and_follows_its_design():
    kernel, _, out = proxy_on_host(design_named("chained,walks=3,split=16"))
    assert "n = n0;" in kernel.source and "lospmm_ldp(Cn," in kernel.source
    assert out.shape == (38, 150) and np.isfinite(out).all()


def test_the_split_is_a_looped_baked_fp32_designs_and_reads_back_from_its_label():
    d = design_named("chained,walks=16,split=256")
    assert d.section_fmas == 256 and design_named(d.label) == d and d.label.endswith(",split=256")
    assert "section_fmas" in d.facts() and "section_fmas" not in design_named("chained,walks=16").facts()
    assert d.code_key != design_named("chained,walks=16").code_key
    for text in ("chained,split=64", "streamed,walks=4,split=64", "staged,split=64", "fp16,split=8"):
        with pytest.raises(ValueError, match="K split"):
            design_named(text)
    assert d.conv_kernel == design_named("walks=16")  # a convolution's looped kernel has no split


def test_the_estimate_fetches_a_split_tiles_sections_once_per_block_and_pays_for_its_partial_sums():
    # a tile of 65536 multiply-adds (~1 MB of code) walked 16 times: unsplit, every walk fetches it again (past the cache);
    # in sections of 1024 multiply-adds (~30 KB each), a section's walks hit the cache
    a = sp.csr_matrix(np.random.default_rng(0).standard_normal((2, 32768)).astype(np.float32))
    tiles = reordered_tiles(a, 2)
    timer = estimate_timer(DEVICES["h100"])

    def timing(label):
        d = design_named(label)
        return timer.time(LaunchUnderTest(tiles, 2, 32768, 65536, 128, predicted_registers(2, design=d), design=d,
                                          matrix=a))

    whole, split = timing("chained,walks=16"), timing("chained,walks=16,split=1024")
    assert split.fetch_us < whole.fetch_us / 4
    assert timing("chained,walks=16,split=65536").fetch_us == whole.fetch_us  # one section: nothing changes
    assert timing("chained,walks=16,split=1024").compute_us > timing("chained,walks=16,split=65536").compute_us


def test_a_split_kernel_spills_nothing_at_its_predicted_registers_and_a_ranker_tells_it_apart():
    # ptxas keeps each row's offset in C live across the sections (RegisterModel.split_regs_per_row):
    # at the walked kernel's own prediction this tile spilled about 1 KB
    from lospmm.stages.compile import compiled_kernel, kernel_options
    from lospmm.stages.rank import DESIGN_FEATURES, SPLIT_FEATURES, design_feature_names, ranks_designs

    a = random_pruned(64, 4096, 0.9, np.random.default_rng(0))
    design = design_named("walks=16,split=256")
    kernel = kernel_source(a, reordered_tiles(a, 8), 128, CodegenParams(design=design), Epilogue())
    out = compiled_kernel(kernel, kernel_options("sm_90", 8, design=design))
    assert out.status.name == "OK" and out.thread_spill_bytes == 0
    assert predicted_registers(8, design=design) == predicted_registers(8, design=design_named("walks=16")) + 18
    designs = [design_named("walks=16"), design]
    assert design_feature_names(designs) == DESIGN_FEATURES + SPLIT_FEATURES
    assert not ranks_designs(DESIGN_FEATURES, designs) and ranks_designs(DESIGN_FEATURES + SPLIT_FEATURES, designs)
