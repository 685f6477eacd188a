"""The N:M kernel on sparse tensor cores (mma.sp, lospmm.kernel.sparse_mma): its fragments and metadata
mean A (decoded as the PTX ISA lays them out), its CUDA text run on the host (each warp's ldmatrix and
mma.sp emulated from its lanes' registers) equals A·B within tensor-core sums' bound, NVRTC takes it
for sm_80 and sm_90 as HMMA.SP without spilling, and the search prices it beside the CUDA-core kernel."""

import json
import subprocess

import numpy as np
import pytest
import scipy.sparse as sp
from hypothesis import HealthCheck, given, settings, strategies as st

from lospmm.devices import DEVICES
from lospmm.kernel.check import checked, reference_of
from lospmm.kernel.choices import untiled_options
from lospmm.kernel.design import BASELINE, design_in, design_named
from lospmm.kernel.epilogue import Epilogue
from lospmm.kernel.host import EmulationError, HostKernel
from lospmm.kernel.numbers import NumberFormat, rounded_matrix
from lospmm.kernel.render import CodegenParams, kernel_source
from lospmm.kernel.sparse_mma import BLOCKINGS, DEPTHS, MMATiling, mma_operands, mma_product, mma_tilings
from lospmm.kernel.spec import KernelSource, KernelSpec
from lospmm.stages.prune import NMPattern, random_nm_pruned

PATTERNS = [(2, 4), (1, 4), (2, 8), (1, 8), (2, 16)]


def mma_design(dtype="fp16"):
    return design_named(f"nm,{dtype},acc=mma")


def mma_source(a, tiling, dtype="fp16", epilogue=Epilogue()) -> KernelSource:
    return kernel_source(a, None, 0, CodegenParams(design=mma_design(dtype)), epilogue, nm=tiling)


@st.composite
def layers(draw, max_rows=70):
    n, m = draw(st.sampled_from(PATTERNS))
    rows = draw(st.integers(1, max_rows))
    k = m * draw(st.integers(1, max(1, 100 // m)))
    rng = np.random.default_rng(draw(st.integers(0, 2**31)))
    a = random_nm_pruned(rows, k, NMPattern(n, m, 1), rng)
    if draw(st.booleans()):  # weights zero already: groups of 4 with one nonzero or none
        a.data[rng.random(a.nnz) < 0.2] = 0.0
        a.eliminate_zeros()
    return a, n, m


@settings(max_examples=40, deadline=None)
@given(layers(max_rows=140), st.integers(0, len(BLOCKINGS) * len(DEPTHS) - 1), st.sampled_from(["fp16", "bf16"]))
def test_fragments_and_metadata_mean_a(layer, blocking, dtype):
    """The operands decoded lane by lane as mma.sp reads them (mma_product: row g and g + 8 of each
    16-row tile, two halves a register, each compressed column placed by its 2-bit index) are A·B."""
    a, n, m = layer
    a, _ = rounded_matrix(a, dtype)
    tilings = mma_tilings(n, m)
    tiling = tilings[blocking % len(tilings)]
    b = np.random.default_rng(1).standard_normal((a.shape[1], 3))
    got = mma_product(mma_operands(a, tiling, dtype), tiling, a.shape[0], a.shape[1], b, dtype)
    np.testing.assert_allclose(got, a @ b, rtol=1e-12, atol=1e-12)


@settings(max_examples=10, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(layers(), st.integers(0, len(BLOCKINGS) * len(DEPTHS) - 1), st.sampled_from(["fp16", "bf16"]),
       st.sampled_from([1, 6, 16, 37]), st.sampled_from([Epilogue(), "bias+relu", Epilogue(activation="gelu")]))
def test_host_run_is_a_times_b_within_the_tensor_core_bound(layer, blocking, dtype, n_columns, epilogue):
    """The exact CUDA text under AddressSanitizer, each block's warps run with ldmatrix and mma.sp
    emulated from the PTX ISA's fragment layouts, equals the float64 A·B through the epilogue within
    the rounding bound of tensor-core sums: rows past M, columns past N (16-byte copies where N is a
    multiple of 8, element-wise otherwise), K past the last stage."""
    a, n, m = layer
    a, _ = rounded_matrix(a, dtype)
    tilings = mma_tilings(n, m)
    tiling = tilings[blocking % len(tilings)]
    if epilogue == "bias+relu":
        epilogue = Epilogue(tuple(np.linspace(-1, 1, a.shape[0]).tolist()), "relu")
    kernel = mma_source(a, tiling, dtype, epilogue)
    result = checked(HostKernel(kernel, True, kernel.spec.module_data(a)), a, n_columns)
    assert result.ok, (tiling.label, result.message)
    assert result.bound < 0.01  # the bound is a figure a wrong kernel exceeds (fp16's: u + k·2^-22)


def test_a_wrong_fragment_fails_the_check():
    """The check can fail: the same kernel fed a layout with one register's rows swapped (row g + 8's
    values where row g's belong) is judged wrong."""
    a = random_nm_pruned(32, 64, NMPattern(2, 4, 1), np.random.default_rng(4))
    a, _ = rounded_matrix(a, "fp16")
    tiling = MMATiling(2, 4, 1, 32, 32, 32, 32)
    kernel = mma_source(a, tiling)
    data = kernel.spec.module_data(a)
    assert checked(HostKernel(kernel, False, data), a, 32).ok
    symbol = kernel.spec.module_symbols["values"]
    words = data[symbol].view(np.uint32).reshape(-1, 32, 4).copy()
    words[:, :, [0, 1]] = words[:, :, [1, 0]]
    broken = {**data, symbol: words.reshape(-1).view(np.float32)}
    result = checked(HostKernel(kernel, False, broken), a, 32)
    assert not result.ok and "exceeds" in result.message


def test_metadata_out_of_order_stops_the_emulated_instruction():
    """::ordered_metadata: a group's two indices ascending and distinct; the host emulation refuses
    a pair that is not (the device's behaviour is undefined there)."""
    a = random_nm_pruned(16, 32, NMPattern(2, 4, 1), np.random.default_rng(5))
    a, _ = rounded_matrix(a, "fp16")
    tiling = MMATiling(2, 4, 1, 16, 32, 16, 32)
    kernel = mma_source(a, tiling)
    data = kernel.spec.module_data(a)
    symbol = kernel.spec.module_symbols["index"]
    meta = data[symbol].view(np.uint32).copy()
    meta[0] = (meta[0] & ~np.uint32(0xF)) | np.uint32(0b0001)  # indices 1 then 0
    with pytest.raises(EmulationError, match="not ascending"):
        HostKernel(kernel, False, {**data, symbol: meta.view(np.uint8)}).run(np.zeros((32, 32), np.uint16))


def test_a_group_of_four_with_three_nonzeros_is_refused_by_row():
    dense = np.zeros((3, 8), np.float32)
    dense[2, 4:7] = 1.0
    with pytest.raises(ValueError, match="row 2 holds 3 nonzeros in columns 4..7"):
        mma_source(sp.csr_matrix(dense), MMATiling(2, 4, 1, 16, 32, 16, 32))


def test_a_missing_barrier_is_caught_on_the_host():
    a = random_nm_pruned(64, 128, NMPattern(2, 4, 1), np.random.default_rng(3))
    a, _ = rounded_matrix(a, "fp16")
    kernel = mma_source(a, MMATiling(2, 4, 1, 64, 64, 64, 32))
    data = kernel.spec.module_data(a)
    assert checked(HostKernel(kernel, False, data), a, 64).ok
    text = kernel.source
    first = text.index("    __syncthreads();\n")
    broken = KernelSource(kernel.spec, (text[:first] + text[first + len("    __syncthreads();\n"):],))
    try:  # the stage not there yet: its metadata still zero (the emulated mma.sp refuses it) or stale values
        caught = not checked(HostKernel(broken, False, data), a, 64).ok
    except EmulationError as e:
        caught = "not ascending" in str(e)
    assert caught


def test_design_spec_and_kernel_json():
    """acc=mma is the nm design's only; the spec reads back from kernel.json as the tensor-core kernel's
    (nm.engine), with its module data, its bound-only check and its grid."""
    assert mma_design("bf16").label == "bf16,acc=mma,nm,based,tile-x,walks=1,v=1"
    with pytest.raises(ValueError, match="mma sums are the nm design's"):
        design_named("fp16,acc=mma")
    with pytest.raises(ValueError, match="mma sums take a sparse tensor-core blocking"):
        kernel_source(sp.csr_matrix(np.eye(4, dtype=np.float32)), None, 0, CodegenParams(design=mma_design()),
                      nm=__import__("lospmm.kernel.nm", fromlist=["NMTiling"]).NMTiling(2, 4))
    a = random_nm_pruned(48, 64, NMPattern(2, 4, 1), np.random.default_rng(0))
    a, _ = rounded_matrix(a, "fp16")
    spec = mma_source(a, MMATiling(2, 4, 1, 32, 64, 32, 32), "fp16", Epilogue((0.5,) * 48, "relu")).spec
    back = KernelSpec.from_json(spec.to_json())
    assert back == spec and isinstance(back.nm, MMATiling) and back.cooperative
    facts = json.loads(spec.to_json())
    assert facts["nm"]["engine"] == "mma.sp" and set(spec.module_symbols) == {"values", "index", "bias"}
    assert facts["grid"] == {"x": 2, "y": "ceil(N / 64)", "z": 1}
    assert "rounding bound of tensor-core sums" in reference_of(spec)
    assert not spec.number.exact and spec.path_counts(13) == (13, 16)


def test_blockings_fit_shared_memory_with_a_warp_per_32_columns():
    for n, m in PATTERNS:
        tilings = mma_tilings(n, m)
        assert len(tilings) >= len(BLOCKINGS)
        for t in tilings:
            assert t.shared_bytes <= 48 * 1024 and t.threads == t.block_columns
    assert mma_tilings(4, 8) == [] and mma_tilings(3, 4) == []  # 3 of a group of 4 possible
    with pytest.raises(ValueError, match="a warp's tile"):
        MMATiling(warp_rows=24)


def test_nvrtc_compiles_it_to_sparse_hmma_without_spilling(tmp_path):
    """NVRTC takes the inline PTX (mma.sp::ordered_metadata, ldmatrix.trans) for sm_80 and sm_90; on
    sm_90 the SASS has one HMMA.SP.16832 per m-tile and n-tile a step, one LDSM.T an n-tile, no spill."""
    from lospmm.kernel.sass import NvdisasmMissing, nvdisasm
    from lospmm.stages.compile import CompileOptions, compiled_kernel

    a = random_nm_pruned(128, 256, NMPattern(2, 4, 1), np.random.default_rng(0))
    a, _ = rounded_matrix(a, "bf16")
    tiling = MMATiling(2, 4, 1, 64, 128, 32, 64)
    kernel = mma_source(a, tiling, "bf16", Epilogue(activation="gelu"))
    for arch in ("sm_80", "sm_90"):
        out = compiled_kernel(kernel, CompileOptions(arch=arch, relocatable=True))
        assert out.status.name == "OK", out.log[-500:]
        assert out.spill_stores == out.spill_loads == 0 and out.registers <= 255
    try:
        tool = nvdisasm()
    except NvdisasmMissing:  # the bench extra's; NVRTC's part above ran
        pytest.skip("no nvdisasm to read the SASS with")
    cubin = tmp_path / "kernel.cubin"
    cubin.write_bytes(out.cubin)
    sass = subprocess.run([tool, "-c", str(cubin)], capture_output=True, text=True, check=True).stdout
    assert sass.count("HMMA.SP.16832.F32.BF16") == (tiling.warp_rows // 16) * (tiling.warp_columns // 8)
    assert sass.count("LDSM.16.MT88.4") == tiling.warp_columns // 8


def test_a_half_search_prices_the_tensor_core_kernel_beside_the_cuda_core_one():
    """A 2:4 layer in a half run: the options hold both N:M kernels, the tensor-core one cheaper at large N;
    none on a GPU without sparse mma, in fp32, or for a pattern that may keep 3 of 4."""
    a = random_nm_pruned(512, 512, NMPattern(2, 4, 1), np.random.default_rng(0))
    half = design_in(NumberFormat.half("fp16", "packed"), BASELINE)
    options = untiled_options(a, 1024, DEVICES["h100"], half)
    kinds = {o.design.accumulate for o in options}
    assert kinds == {"packed", "mma"}
    best = min(options, key=lambda o: o.estimate_us)
    assert isinstance(best.nm, MMATiling) and best.label.startswith("nm 2:4,mma,")
    assert all(o.design.accumulate == "packed" for o in untiled_options(a, 1024, DEVICES["v100"], half))
    assert all(not isinstance(o.nm, MMATiling) for o in untiled_options(a, 1024, DEVICES["h100"], BASELINE))
    wide = random_nm_pruned(64, 64, NMPattern(4, 8, 1), np.random.default_rng(0))
    assert all(not isinstance(o.nm, MMATiling) for o in untiled_options(wide, 64, DEVICES["h100"], half))
