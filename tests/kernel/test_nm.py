"""The data-driven N:M kernel (design `nm`): its compressed A means A (against scipy), its CUDA text
run on the host as cooperative blocks equals scipy's A·B through its epilogue, a missing barrier
is caught, and its spec, package and estimate hold together."""

import json
import math

import numpy as np
import pytest
import scipy.sparse as sp
from hypothesis import HealthCheck, example, given, settings, strategies as st

from lospmm.devices import DEVICES
from lospmm.kernel.check import checked
from lospmm.kernel.design import design_named
from lospmm.kernel.epilogue import Epilogue
from lospmm.kernel.estimate import NMWork, nm_registers, nm_timing
from lospmm.kernel.host import EmulationError, HostKernel
from lospmm.kernel.nm import BLOCKINGS, DEPTHS, NMTiling, nm_operands, nm_product, nm_tilings, pattern_problem
from lospmm.kernel.render import CodegenParams, kernel_source
from lospmm.kernel.spec import KernelSource, KernelSpec
from lospmm.stages.prune import NMPattern, random_nm_pruned

NM = design_named("nm")
PATTERNS = [(1, 2), (2, 4), (1, 4), (3, 8), (2, 8), (4, 16), (16, 32), (12, 32), (8, 32), (4, 32)]


def nm_source(a, tiling, epilogue=Epilogue()) -> KernelSource:
    return kernel_source(a, None, 0, CodegenParams(design=NM), epilogue, nm=tiling)


def host_checked(a, tiling, n, epilogue=Epilogue(), seed=0, sanitize=True):
    kernel = nm_source(a, tiling, epilogue)
    from dataclasses import replace

    kernel = KernelSource(replace(kernel.spec), kernel.units)
    return checked(HostKernel(kernel, sanitize, kernel.spec.module_data(a)), a, n, seed)


@st.composite
def nm_layers(draw, max_rows=80):
    n, m = draw(st.sampled_from(PATTERNS))
    vector = draw(st.sampled_from([1, 2, 4, 8, 16, 32]))
    # the last vector may hold fewer rows (a layer's rows not a multiple of V: NMPattern's padding)
    rows = max(1, vector * draw(st.integers(1, max(1, max_rows // vector))) - draw(st.integers(0, vector - 1)))
    k = m * draw(st.integers(1, max(1, 96 // m)))
    rng = np.random.default_rng(draw(st.integers(0, 2**31)))
    a = random_nm_pruned(rows, k, NMPattern(n, m, vector), rng)
    if draw(st.booleans()):  # a few weights zero already: groups with fewer than N nonzeros
        a.data[rng.random(a.nnz) < 0.1] = 0.0
        a.eliminate_zeros()
    return a, n, m, vector


@settings(max_examples=60, deadline=None)
@given(nm_layers(max_rows=200), st.integers(0, len(BLOCKINGS) * len(DEPTHS) - 1), st.integers(1, 9))
def test_compressed_operands_mean_a(layer, blocking, n_columns):
    """The kernel's data read as the kernel reads it (nm_product) is A·B, for every pattern, vector
    length and blocking that fits."""
    a, n, m, vector = layer
    tilings = nm_tilings(n, m, vector)
    tiling = tilings[blocking % len(tilings)]
    b = np.random.default_rng(1).standard_normal((a.shape[1], n_columns))
    got = nm_product(nm_operands(a, tiling), tiling, a.shape[0], a.shape[1], b)
    np.testing.assert_allclose(got, a @ b, rtol=1e-5, atol=1e-5)


def test_an_a_without_the_pattern_is_refused_by_name():
    a = sp.csr_matrix(np.ones((8, 8), np.float32))
    assert "holds 4 nonzero columns, over N=2" in pattern_problem(a, 2, 4, 1)
    with pytest.raises(ValueError, match="over N=2"):
        nm_source(a, NMTiling(2, 4))
    # rows that do not share positions are not a vector of 2
    rows = sp.csr_matrix(np.array([[1, 0, 0, 0], [0, 1, 0, 0]], np.float32))
    assert pattern_problem(rows, 1, 4, 1) == ""
    assert "over N=1" in pattern_problem(rows, 1, 4, 2)


@settings(max_examples=12, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(nm_layers(), st.integers(0, len(BLOCKINGS) * len(DEPTHS) - 1), st.sampled_from([1, 5, 8, 70, 131]),
       st.sampled_from([Epilogue(), "bias+relu", Epilogue(activation="gelu")]))
def test_host_run_equals_scipy(layer, blocking, n_columns, epilogue):
    """The exact CUDA text, built for the host under AddressSanitizer with each block's threads run
    as a cooperative block, equals scipy's A·B through the epilogue: rows past M, columns past N
    (element-wise path: N not a multiple of 4; float4 path otherwise), K past the last chunk."""
    a, n, m, vector = layer
    tilings = nm_tilings(n, m, vector)
    tiling = tilings[blocking % len(tilings)]
    if epilogue == "bias+relu":
        epilogue = Epilogue(tuple(np.linspace(-1, 1, a.shape[0]).tolist()), "relu")
    result = host_checked(a, tiling, n_columns, epilogue)
    assert result.ok, (tiling.label, result.message)


def test_a_nan_in_b_reaches_c_only_through_a_nonzero():
    """A spare slot multiplies a row of zeros, not B: a NaN in a row of B that A never reads stays
    out of C, as in the sparse product."""
    a = sp.csr_matrix(np.array([[1, 0, 0, 0, 2, 0, 0, 0]], np.float32))  # 1:4, one group of the second half... and
    tiling = NMTiling(2, 4, block_rows=16, block_columns=64, thread_rows=4, thread_columns=4)
    kernel = nm_source(a, tiling)
    b = np.ones((8, 4), np.float32)
    b[1] = np.nan  # column 1 of A is zero in every row
    c = HostKernel(kernel, True, kernel.spec.module_data(a)).run(b)
    np.testing.assert_array_equal(c, np.full((1, 4), 3.0, np.float32))


def test_a_missing_barrier_is_caught_on_the_host():
    """The host runs a block's threads one at a time, each until its next barrier: without the
    barrier after a stage is copied, a thread multiplies a stage the others have not written."""
    a = random_nm_pruned(64, 64, NMPattern(2, 4, 8), np.random.default_rng(3))
    tiling = NMTiling(2, 4, 8)
    kernel = nm_source(a, tiling)
    assert checked(HostKernel(kernel, False, kernel.spec.module_data(a)), a, 64).ok
    text = kernel.source
    first = text.index("    __syncthreads();\n")
    broken = KernelSource(kernel.spec, (text[:first] + text[first + len("    __syncthreads();\n"):],))
    result = checked(HostKernel(broken, False, kernel.spec.module_data(a)), a, 64)
    assert not result.ok


def test_module_data_must_be_given_and_whole():
    a = random_nm_pruned(16, 32, NMPattern(8, 32, 16), np.random.default_rng(0))
    kernel = nm_source(a, NMTiling(8, 32, 16, 16, 64, 4, 4))
    with pytest.raises(ValueError, match="module data not given"):
        HostKernel(kernel).run(np.ones((32, 4), np.float32))
    data = kernel.spec.module_data(a)
    short = {s: v[:-1] if s.startswith("lospmm_nmv") else v for s, v in data.items()}
    with pytest.raises(EmulationError, match="module data lospmm_nmv"):
        HostKernel(kernel, False, short).run(np.ones((32, 4), np.float32))


def test_spec_round_trips_kernel_json():
    a = random_nm_pruned(48, 64, NMPattern(4, 32, 8), np.random.default_rng(0))
    spec = nm_source(a, NMTiling(4, 32, 8, 32, 64, 8, 4), Epilogue((0.5,) * 48, "relu")).spec
    back = KernelSpec.from_json(spec.to_json())
    assert back == spec and back.nm == spec.nm and back.cooperative
    facts = json.loads(spec.to_json())
    assert facts["nm"]["module_data"] == spec.module_symbols
    assert set(spec.module_symbols) == {"values", "index", "rows", "bias"}  # 4 vectors of 4 slots: 16 of 32 rows
    whole = nm_source(a, NMTiling(4, 32, 1, 32, 64, 8, 4)).spec  # element-wise: every row of a chunk is read
    assert set(whole.module_symbols) == {"values", "index"} and whole.nm.staged == whole.nm.chunk
    assert facts["grid"] == {"x": 2, "y": "ceil(N / 64)", "z": 1}
    assert spec.column_multiple == 1 and spec.alignment == 4
    with pytest.raises(ValueError, match="nm design has its own blocking"):
        design_named("nm,v=4")


def test_blockings_fit_shared_memory_and_keep_one_column_per_thread():
    for n, m in PATTERNS:
        for vector in (1, 8):
            tilings = nm_tilings(n, m, vector)
            assert tilings, (n, m, vector)
            for t in tilings:
                assert t.shared_bytes <= 48 * 1024 and t.threads == t.block_columns
    with pytest.raises(ValueError, match="shared memory"):
        NMTiling(31, 32, 1)  # 64×128 with 31 slots per row and no shared columns
    with pytest.raises(ValueError, match="block rows"):
        NMTiling(2, 4, block_rows=32)


def test_estimate_sees_sparsity_and_shared_columns():
    """Fewer slots are cheaper, and rows sharing columns (one B vector per 8 rows) are cheaper than
    element-wise N:M (one per row), on a work-bound layer."""
    h100 = DEVICES["h100"]

    def us(n, vector, shape=(4096, 4096, 4096)):
        t = nm_tilings(n, 32, vector)[0]
        return nm_timing(NMWork(t, *shape, nm_registers(t)), h100).time_us

    assert us(4, 8) < us(8, 8) < us(16, 8)
    assert us(16, 8) < us(16, 1)
    assert math.isfinite(us(16, 8, (64, 64, 1)))


def test_stored_zeros_are_no_nonzeros_of_the_pattern():
    """A stored zero neither makes a pattern look wider nor takes a slot (a review found the pattern
    found with them and the operands refused without them)."""
    from lospmm.kernel.nm import held_pattern

    dense = np.array([[1, 2, 0, 0, 3, 0, 4, 0], [1, 2, 0, 0, 3, 0, 4, 0]], np.float32)
    a = sp.csr_matrix(dense)  # 2:4 in a vector of 2 rows
    with_zeros = sp.csr_matrix((np.r_[a.data[:4], np.float32(0), a.data[4:]],
                                np.r_[a.indices[:4], np.int32(3), a.indices[4:]],
                                np.array([0, 5, 9], np.int32)), shape=(2, 8))  # row 0 stores a zero at column 3
    assert with_zeros.nnz == 9 and held_pattern(with_zeros) == held_pattern(a) == (2, 4, 2)
    tiling = NMTiling(2, 4, 2, 16, 64, 4, 4)
    assert pattern_problem(with_zeros, 2, 4, 2) == ""
    for k, v in nm_operands(with_zeros, tiling).items():
        np.testing.assert_array_equal(v, nm_operands(a, tiling)[k])


def test_a_check_runs_the_float4_path_too():
    a = random_nm_pruned(16, 32, NMPattern(8, 32, 16), np.random.default_rng(0))
    spec = nm_source(a, NMTiling(8, 32, 16, 16, 64, 4, 4)).spec
    assert spec.path_counts(131) == (131, 132) and spec.path_counts(64) == (64,)
    from lospmm.kernel.design import design_named as named

    half = kernel_source(a, None, 0, CodegenParams(design=named("nm,fp16")), nm=NMTiling(8, 32, 16, 16, 64, 4, 4)).spec
    assert half.path_counts(131) == (131, 136) and half.path_counts(132) == (132, 136)  # 16-bit: multiples of 8
    from lospmm.stages.reorder import reordered_tiles

    baked = kernel_source(a, reordered_tiles(a, 4), 32).spec
    assert baked.path_counts(131) == (131,)


@settings(max_examples=10, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(nm_layers(max_rows=48), st.sampled_from(["fp16", "bf16"]), st.sampled_from(["packed", "f32"]),
       st.integers(0, len(BLOCKINGS) * len(DEPTHS) - 1), st.sampled_from([1, 6, 8, 37]),
       st.sampled_from([Epilogue(), "bias+relu", Epilogue(activation="gelu")]))
def test_a_half_nm_kernel_is_its_exact_model_bit_for_bit(layer, dtype, accumulate, blocking, n_columns, epilogue):
    """fp16/bf16 N:M kernels, sums packed (one fma per slot and pair of columns) or in fp32 (fmaf in
    slot order): the host run equals the exact model of the half kernels (kernel_reference: each
    row's nonzeros in column order, every rounding as the device rounds it) value for value, through
    the epilogue, on both paths (N a multiple of 8 or not)."""
    from lospmm.kernel.design import half_design
    from lospmm.kernel.numbers import NumberFormat, rounded_matrix

    a, n, m, vector = layer
    number = NumberFormat.half(dtype, accumulate, 0)
    a, _ = rounded_matrix(a, dtype)
    tilings = nm_tilings(n, m, vector)
    tiling = tilings[blocking % len(tilings)]
    if epilogue == "bias+relu":
        epilogue = Epilogue(tuple(np.linspace(-1, 1, a.shape[0]).tolist()), "relu")
    kernel = kernel_source(a, None, 0, CodegenParams(design=half_design(number, NM)), epilogue, nm=tiling)
    assert kernel.spec.dtype == dtype and kernel.spec.number == number
    result = checked(HostKernel(kernel, True, kernel.spec.module_data(a)), a, n_columns)
    assert result.ok, (tiling.label, result.message)


def test_a_stage_of_a_long_vector_pattern_copies_only_the_rows_its_block_reads():
    """NM-SpMM's 4:32 in vectors of 32 rows keeps at most 8 of every 32 columns in a block of 64
    rows: a stage copies those 8 rows of B, as the block's list says, not the chunk's 32 (on the
    H200 the whole-chunk copy held 4:32 at half the efficiency per nonzero of 16:32)."""
    rng = np.random.default_rng(5)
    a = random_nm_pruned(64, 96, NMPattern(4, 32, 32), rng)
    t = NMTiling(4, 32, 32)
    assert t.gathers and t.staged == 8 and t.shared_bytes < NMTiling(16, 32, 32).shared_bytes
    listed = nm_operands(a, t)["rows"].reshape(t.chunks(96), 1, t.rows_slab)
    dense = a.toarray() != 0
    for ch in range(3):
        read = np.flatnonzero(dense[:, ch * 32:(ch + 1) * 32].any(axis=0))
        assert list(listed[ch, 0, :len(read)]) == list(read) and (listed[ch, 0, len(read):t.staged] == 32).all()
    kernel = nm_source(a, t)
    assert "listed[r]" in kernel.source and f"Bs[2][{9 * 128}]" in kernel.source
    result = host_checked(a, t, 70)
    assert result.ok, result.message
    # a row of B that no slot of the block reads is never copied: a NaN there stays out of C
    b = rng.standard_normal((96, 8)).astype(np.float32)
    unread = np.flatnonzero(~dense.any(axis=0))
    b[unread] = np.nan
    c = HostKernel(kernel, True, kernel.spec.module_data(a)).run(b)
    b[unread] = 0.0
    np.testing.assert_allclose(c, a @ b, rtol=1e-4, atol=1e-4)
    # a deeper stage (128 columns: 16 slots, at most 32 rows gathered), K past the last stage's end
    deep_a = random_nm_pruned(64, 160, NMPattern(4, 32, 32), rng)
    deep = NMTiling(4, 32, 32, depth=128)
    assert deep.chunk == 128 and deep.kept == 16 and deep.staged == 32 and deep.gathers and deep in nm_tilings(4, 32, 32)
    result = host_checked(deep_a, deep, 37)
    assert result.ok, result.message
    # an A whose rows share positions in vectors of 8 only does not fit a stage of 8 rows for 64
    short = random_nm_pruned(64, 96, NMPattern(4, 32, 8), rng)
    with pytest.raises(ValueError, match="vectors of 32 rows"):
        nm_operands(short, t)


def test_a_gathered_stage_is_priced_cheaper_than_the_whole_chunk():
    from dataclasses import replace

    h100 = DEVICES["h100"]
    t = NMTiling(4, 32, 32)
    whole = replace(t, gather=False)  # the same blocking, every row of the chunk staged
    assert t.gathers and not whole.gathers and whole.label.endswith(",whole")

    def timing(tiling):
        return nm_timing(NMWork(tiling, 4096, 4096, 4096, nm_registers(tiling)), h100)

    assert timing(t).memory_us < 0.5 * timing(whole).memory_us  # a quarter of B's rows from L2
    assert timing(t).time_us < timing(whole).time_us


def test_the_nm_loops_parameters_are_recovered_from_launches_they_priced():
    """calibrated_nm fits the loop's issue efficiency and the warps it needs (fitted to the H200's
    nm-spmm launches, whose times the full-rate model put 1.4-3.5x too fast): launches priced with
    known values give those values back, from the shipped ones as the start."""
    from dataclasses import replace

    from lospmm.kernel.estimate import EstimateParams, calibrated_nm

    h100 = DEVICES["h100"]
    truth = replace(EstimateParams(), nm_issue_efficiency=0.4, nm_warps_to_fill=3.0)
    works = [NMWork(t, m, 4096, n, nm_registers(t)) for t in (NMTiling(16, 32, 32), NMTiling(4, 32, 32, 32, 128, 8, 4))
             for m in (4096, 11008) for n in (64, 256, 4096)]
    measured = [nm_timing(w, h100, truth).time_us for w in works]
    fitted = calibrated_nm(works, measured, h100)
    assert fitted.nm_issue_efficiency == pytest.approx(0.4, rel=0.05)
    assert fitted.nm_warps_to_fill == pytest.approx(3.0, rel=0.1)
    # few warps resident cost rate: one block of 4 warps an SM is priced slower per multiply-add than three
    small, large = (nm_timing(NMWork(NMTiling(16, 32, 32), 4096, 4096, n, 152), h100) for n in (256, 4096))
    assert small.compute_us * 16 > large.compute_us * 1.5


def test_a_kernel_json_written_before_stages_gathered_reads_back_as_a_whole_chunk_kernel():
    """A package emitted before the gathered stages holds no `staged` fact and no rows global: read
    back, its tiling must copy whole chunks, not ask for a list its binary does not have (a review
    found it read as gathering)."""
    old = {k: v for k, v in NMTiling(4, 32, 32).facts().items() if k not in ("staged", "depth", "gather")}
    back = NMTiling.of_facts(old)
    assert not back.gather and not back.gathers and back.staged == back.chunk
    assert NMTiling.of_facts(NMTiling(4, 32, 32).facts()).gathers  # today's facts: as written


@settings(max_examples=8, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(pattern=st.sampled_from([(2, 4, 1), (1, 4, 1), (2, 8, 2), (8, 32, 8), (4, 32, 32)]),
       cin=st.sampled_from([4, 8, 16, 32]), window=st.sampled_from([1, 3, 5]), stride=st.integers(1, 2),
       pad=st.integers(0, 2), dilation=st.integers(1, 2), blocking=st.integers(0, len(BLOCKINGS) * len(DEPTHS) - 1),
       batch=st.integers(1, 3), seed=st.integers(0, 1000))
# always: several chunks of K (32 channels × 9), padding on every border, a partial last block of
# pixels (2 × 7 × 6 = 84 over 64 a block) and of rows (37 over 16 or 32), a stage that gathers
@example(pattern=(8, 32, 8), cin=32, window=3, stride=1, pad=1, dilation=1, blocking=4, batch=2, seed=4)
def test_the_implicit_conv_nm_kernel_equals_a_reference_convolution(pattern, cin, window, stride, pad, dilation,
                                                                    blocking, batch, seed):
    """The N:M kernel with a convolution's geometry: each thread copies its output pixel's input at each
    staged row's window entry (zero in the padding, past the last pixel and past K), the slots' loop is
    the GEMM's, each output goes to NCHW Y through the bias and ReLU; against numpy's conv2d."""
    from lospmm.kernel.geometry import ConvGeometry

    n, m, vector = pattern
    size = dilation * (window - 1) + 1
    geometry = ConvGeometry(cin=cin, h=max(size, 7), w=max(size - 2 * pad, 6), kh=window, kw=window, stride=stride,
                            pad=pad, dilation=dilation)
    if geometry.k % m:
        return
    rng = np.random.default_rng(seed)
    rows = 32 if vector == 32 else 37 - 37 % vector
    a = random_nm_pruned(rows, geometry.k, NMPattern(n, m, vector), rng)
    tilings = nm_tilings(n, m, vector)
    tiling = tilings[blocking % len(tilings)]
    epilogue = Epilogue(tuple(float(v) for v in rng.standard_normal(rows)), "relu")
    kernel = kernel_source(a, None, 0, CodegenParams(design=NM), epilogue, geometry, nm=tiling)
    spec = kernel.spec
    assert spec.form == "conv" and spec.params == ("const float* X", "float* Y", "int batch") and spec.cooperative
    assert spec.path_counts(batch) == (batch,)  # no vector path: a pixel's inputs are gathered 4 bytes a copy
    result = checked(HostKernel(kernel, True, spec.module_data(a)), a, batch, seed)
    assert result.ok, (tiling.label, result.message)


@pytest.mark.parametrize("window, test, without", [
    (3, "((window_ok >> e.y) & 1)", "live"),  # one mask of 9 places (live in it)
    (7, "((window_ok >> e.y) & 1)", "live"),  # 49 places: a 64-bit mask
    # 81 places: a row and a column mask, tested apart
    (9, "live && ((rows_ok >> (e.y & 0xffff)) & (cols_ok >> (e.y >> 16)) & 1u)", "live"),
])
def test_the_implicit_conv_nm_kernel_reads_the_padding_as_zero(window, test, without):
    """Without its window test the copy reads the input beside the window's edge, not zeros: the check
    against the reference convolution fails (ASan may stop it first)."""
    from lospmm.kernel.geometry import ConvGeometry

    geometry = ConvGeometry(cin=4, h=10, w=10, kh=window, kw=window, pad=window // 2)
    a = random_nm_pruned(16, geometry.k, NMPattern(2, 4), np.random.default_rng(2))
    kernel = kernel_source(a, None, 0, CodegenParams(design=NM), Epilogue(), geometry, nm=NMTiling(2, 4, 1, 16, 64, 4, 4))
    data = kernel.spec.module_data(a)
    assert checked(HostKernel(kernel, False, data), a, 2).ok
    text = kernel.source
    assert text.count(test) == 1
    broken = KernelSource(kernel.spec, (text.replace(test, without),))
    try:
        result = checked(HostKernel(broken, False, data), a, 2)
    except Exception:  # the emulation stopped it: the read past the image
        return
    assert not result.ok


@settings(max_examples=8, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(pattern=st.sampled_from([(2, 4, 1), (1, 4, 1), (2, 8, 2), (8, 32, 8), (4, 32, 32)]),
       dtype=st.sampled_from(["fp16", "bf16"]), accumulate=st.sampled_from(["packed", "f32"]),
       cin=st.sampled_from([4, 8, 16, 32]), window=st.sampled_from([1, 3]), stride=st.integers(1, 2),
       pad=st.integers(0, 1), blocking=st.integers(0, len(BLOCKINGS) * len(DEPTHS) - 1), batch=st.integers(1, 3),
       epilogue=st.sampled_from(["", "bias", "relu", "gelu"]), seed=st.integers(0, 1000))
# always: several chunks of K, padding on every border, a partial last block of pixels and of rows
@example(pattern=(8, 32, 8), dtype="fp16", accumulate="packed", cin=32, window=3, stride=1, pad=1, blocking=4, batch=2,
         epilogue="relu", seed=4)
def test_the_half_implicit_conv_nm_kernel_is_its_exact_model_bit_for_bit(pattern, dtype, accumulate, cin, window,
                                                                         stride, pad, blocking, batch, epilogue, seed):
    """The N:M conv kernel in fp16/bf16 (X and Y NCHW 16-bit, each pixel's input loaded, not copied
    asynchronously): its output is the exact model's of A · im2col(X) (the GEMM's slot order), bit for
    bit, through the bias and activation (one rounding from fp32); the check judges it as that GEMM."""
    from lospmm.kernel.design import design_in
    from lospmm.kernel.geometry import ConvGeometry
    from lospmm.kernel.numbers import NumberFormat, rounded_matrix

    n, m, vector = pattern
    geometry = ConvGeometry(cin=cin, h=7, w=6, kh=window, kw=window, stride=stride, pad=pad)
    if geometry.k % m:
        return
    rng = np.random.default_rng(seed)
    rows = 32 if vector == 32 else 37 - 37 % vector
    design = design_in(NumberFormat.half(dtype, accumulate), NM)
    a = rounded_matrix(random_nm_pruned(rows, geometry.k, NMPattern(n, m, vector), rng), dtype)[0]
    tilings = nm_tilings(n, m, vector, number=design.number)
    tiling = tilings[blocking % len(tilings)]
    bias = tuple(float(v) for v in rng.standard_normal(rows).astype(np.float32)) if epilogue else ()
    kernel = kernel_source(a, None, 0, CodegenParams(design=design), Epilogue(bias, epilogue if epilogue != "bias" else ""),
                           geometry, nm=tiling)
    spec = kernel.spec
    assert spec.form == "conv" and spec.params == ("const lospmm_h16* X", "lospmm_h16* Y", "int batch")
    assert KernelSpec.from_json(spec.to_json()) == spec and f"{dtype} (16-bit)" in spec.layout_text()
    result = checked(HostKernel(kernel, True, spec.module_data(a)), a, batch, seed)
    assert result.ok and result.metric == "normalised_error", (tiling.label, result.message)


def test_a_half_conv_check_sees_a_wrong_padding_and_a_wrong_half_of_a_pair():
    """The half conv check is the exact model's of the GEMM on im2col(X): reading beside the window's
    edge instead of zeros, or storing the other half of a packed pair, fails it."""
    from lospmm.kernel.design import design_in
    from lospmm.kernel.geometry import ConvGeometry
    from lospmm.kernel.numbers import NumberFormat, rounded_matrix

    geometry = ConvGeometry(cin=8, h=6, w=6, kh=3, kw=3, pad=1)
    design = design_in(NumberFormat.half("fp16", "packed"), NM)
    a = rounded_matrix(random_nm_pruned(16, geometry.k, NMPattern(2, 4), np.random.default_rng(2)), "fp16")[0]
    kernel = kernel_source(a, None, 0, CodegenParams(design=design), Epilogue(), geometry,
                           nm=NMTiling(2, 4, 1, 16, 64, 4, 4))
    data = kernel.spec.module_data(a)
    assert checked(HostKernel(kernel, False, data), a, 2).ok
    text = kernel.source
    for wrong, right in (("live", "((window_ok >> e.y) & 1)"),
                         ("const float x = hi;", "const float x = lo;")):
        assert right in text
        broken = KernelSource(kernel.spec, (text.replace(right, wrong),))
        try:
            result = checked(HostKernel(broken, False, data), a, 2)
        except Exception:  # the emulation stopped it: the read past the image
            continue
        assert not result.ok and "exact model" in result.message


def test_an_implicit_conv_nm_spec_round_trips_and_refuses_what_it_is_not():
    from lospmm.kernel.geometry import ConvGeometry
    from lospmm.kernel.design import design_in
    from lospmm.kernel.numbers import NumberFormat, rounded_matrix
    from lospmm.kernel.sparse_mma import mma_tilings

    geometry = ConvGeometry(cin=16, h=9, w=9, kh=3, kw=3, stride=2, pad=1)
    a = random_nm_pruned(32, geometry.k, NMPattern(4, 16, 8), np.random.default_rng(0))
    tiling = NMTiling(4, 16, 8, 32, 64, 8, 4)
    spec = kernel_source(a, None, 0, CodegenParams(design=NM), Epilogue((0.5,) * 32, "relu"), geometry, nm=tiling).spec
    back = KernelSpec.from_json(spec.to_json())
    assert back == spec and back.conv == geometry and back.nm == tiling and back.form == "conv"
    facts = json.loads(spec.to_json())
    assert facts["grid"] == {"x": 1, "y": f"ceil(batch * {geometry.pixels} / 64)", "z": 1}
    assert "fill the module's globals" in facts["layout"] and "NCHW" in facts["layout"]
    assert NM.serves_conv and NM.conv_kernel == NM
    for accumulate in ("packed", "f32"):  # on CUDA cores in a half format too
        half = design_in(NumberFormat.half("fp16", accumulate), NM)
        assert half.serves_conv and half.conv_kernel == half
    mma = design_in(NumberFormat.half("fp16", "mma"), NM)  # the sparse tensor cores' kernel is a GEMM's
    assert not mma.serves_conv and mma.conv_kernel is None
    with pytest.raises(ValueError, match="is a GEMM kernel"):
        kernel_source(rounded_matrix(a, "fp16")[0], None, 0, CodegenParams(design=mma), Epilogue(), geometry,
                      nm=mma_tilings(2, 4)[0])
    with pytest.raises(ValueError, match="cin·kh·kw"):
        kernel_source(a[:, :72], None, 0, CodegenParams(design=NM), Epilogue(), geometry, nm=NMTiling(4, 16, 8))


def test_a_convolutions_nm_kernel_is_priced_above_the_gemms_for_its_gathers():
    """The same launch with a convolution's copies (4 bytes a pixel's input, each its entry's load and
    window test) costs more than with 16-byte copies of an im2col B's rows, on a work-bound layer whose
    loop is bound by its issue (8:32 in vectors of 8: one B vector a slot)."""
    h100 = DEVICES["h100"]
    t = nm_tilings(8, 32, 8)[0]
    gemm, conv = (nm_timing(NMWork(t, 256, 2304, 50176, nm_registers(t), None, c), h100) for c in (False, True))
    assert conv.time_us > gemm.time_us * 1.05 and conv.compute_us > gemm.compute_us


@pytest.mark.parametrize("pattern, k, tiling, dtype, count, construct", [
    # the whole chunk, K a multiple of it; N = 8 of a block's 128 columns: most threads copy zeros
    ((16, 32, 1), 64, dict(), "fp32", 8, "p + 4ull * kbytes"),
    # the whole chunk, K past the last stage's end
    ((3, 8, 1), 40, dict(), "fp32", 136, "< left ?"),
    # a chunk of 35 rows (M = 5): the last pass copies 3 of its 4 rows; K past the last stage's end
    ((2, 5, 1), 45, dict(), "fp32", 132, "if (r0 + 32 < 35)"),
    # a chunk of 33 rows (M = 3): the last pass copies 1 of 4, the others would land past the zero row
    ((2, 3, 1), 66, dict(), "fp32", 40, "if (r0 + 32 < 33)"),
    # a gathering stage of 6 rows (3:32 in vectors of 32): the last pass copies 2 of 4
    ((3, 32, 32), 96, dict(), "fp32", 68, "if (r0 + 4 < 6)"),
    # a gathering stage of 12 rows at 64 columns, K past the last stage, 16-bit B: passes of 8 rows
    ((3, 32, 32), 96, dict(depth=64), "fp16", 16, "if (r0 + 8 < 12)"),
    ((16, 32, 8), 96, dict(block_rows=16, block_columns=64, thread_rows=4, thread_columns=4), "bf16", 24, "p + 8ull"),
    # the sparse tensor-core kernel's stages (rows padded in shared memory), K past the last stage's end
    ((2, 4, 1), 40, dict(mma=True), "fp16", 16, "< left ?"),
    ((1, 4, 1), 96, dict(mma=True, block_rows=16, block_columns=32, warp_rows=16, warp_columns=32, depth=64), "bf16",
     40, "< left ?"),
])
def test_the_16_byte_copies_of_b_cover_every_edge_of_a_stage(pattern, k, tiling, dtype, count, construct):
    """The straight-line copies of the vector path (N a multiple of 4, or 8 for a 16-bit B): every
    staged row of B arrives, rows past K and a gathering stage's unused entries arrive as zeros, and
    no copy writes past the stage (a partial last pass) or reads past B (AddressSanitizer)."""
    from lospmm.kernel.design import half_design
    from lospmm.kernel.numbers import NumberFormat, rounded_matrix
    from lospmm.kernel.sparse_mma import MMATiling

    n, m, vector = pattern
    a = random_nm_pruned(64, k, NMPattern(n, m, vector), np.random.default_rng(k + n))
    tiling = dict(tiling)
    mma = tiling.pop("mma", False)
    t = MMATiling(n, m, vector, **tiling) if mma else NMTiling(n, m, vector, **tiling)
    design = NM
    if dtype != "fp32":
        a, _ = rounded_matrix(a, dtype)
        design = half_design(NumberFormat.half(dtype, "mma" if mma else "packed", 0), NM)
    kernel = kernel_source(a, None, 0, CodegenParams(design=design), nm=t)
    assert construct in kernel.source
    assert kernel.spec.path_counts(count) == (count,)  # the vector path
    result = checked(HostKernel(kernel, True, kernel.spec.module_data(a)), a, count)
    assert result.ok, (t.label, result.message)


def _chunk_loop(kernel, tiling, design, conv=False) -> float:
    """Instructions of the compiled kernel's chunk loop on its 16-byte path, per chunk, as
    benchmarks.sass_efficiency --nm counts them (that benchmark's chunk_counts)."""
    from benchmarks.sass_efficiency import chunk_counts
    from lospmm.kernel.sass import NvdisasmMissing

    try:
        return chunk_counts(kernel, tiling.block_rows, design, conv)["instructions"]
    except NvdisasmMissing:  # the bench extra's
        pytest.skip("no nvdisasm (pip install 'lospmm[bench]')")


def test_the_estimate_counts_a_chunk_as_the_sass_does():
    """nm_chunk_instructions against the compiled chunk loop (sm_90): the GEMM form within 12% (its
    slots, copies and loop), and what a convolution's 4-byte gathers add over the GEMM's 16-byte copies
    within 10%: the estimate's copy prices are the SASS's, so its choice between the two forms and the
    baked kernels sees what each stage costs."""
    from lospmm.kernel.epilogue import Epilogue
    from lospmm.kernel.estimate import nm_chunk_instructions
    from lospmm.kernel.geometry import ConvGeometry

    geometry = ConvGeometry(cin=64, h=14, w=14, kh=3, kw=3, stride=1, pad=1)
    for tiling in (NMTiling(16, 32, 32), NMTiling(4, 32, 32), NMTiling(4, 32, 32, depth=128),
                   NMTiling(2, 4, 1, 16, 64, 4, 4), NMTiling(2, 4, 1)):
        a = random_nm_pruned(128, geometry.k, NMPattern(tiling.n, tiling.m, tiling.vector), np.random.default_rng(1))
        gemm = _chunk_loop(nm_source(a, tiling), tiling, NM)
        estimate = nm_chunk_instructions(tiling)
        assert abs(estimate / gemm - 1) < 0.12, (tiling.label, estimate, gemm)
        if tiling.vector == 1:  # the conv form: a gather a staged row, for each thread's pixel
            conv = _chunk_loop(kernel_source(a, None, 0, CodegenParams(design=NM), Epilogue(), geometry, nm=tiling),
                               tiling, NM, conv=True)
            added = nm_chunk_instructions(tiling, conv=True) - estimate
            assert abs(added / (conv - gemm) - 1) < 0.10, (tiling.label, added, conv - gemm)
