"""Every rendered kernel equals scipy's A·B (a reference convolution; through its epilogue), checked by
running the exact CUDA text on the host backend with the one check (lospmm.kernel.check)."""

import dataclasses
import re

import numpy as np
import pytest
import scipy.sparse as sp
from hypothesis import HealthCheck, given, settings, strategies as st

from lospmm.kernel.check import checked, judged
from lospmm.kernel.design import BASELINE, KernelDesign, design_named
from lospmm.kernel.epilogue import Epilogue
from lospmm.kernel.geometry import ConvGeometry
from lospmm.kernel.host import EmulationError, HostKernel, host_program, run_on_host
from lospmm.kernel.layout import LaunchLayout
from lospmm.kernel.numbers import rounded_matrix
from lospmm.kernel.registers import predicted_registers
from lospmm.kernel.render import CodegenParams, float_literal, kernel_source, proxy_source, shard_groups
from lospmm.kernel.spec import KernelSource
from lospmm.stages import compile as nv
from lospmm.stages.cluster import proxy_clusters
from lospmm.stages.prune import random_pruned
from lospmm.stages.reorder import identity_tiles, reordered_tiles
from tests.conftest import convolutions


def host_error(kernel, a, n, seed=0, sanitize=False) -> float:
    """The kernel's error on the host in its format's metric; AssertionError naming why when its
    check fails (an output never written, an error beyond the tolerance)."""
    result = checked(HostKernel(kernel, sanitize), a, n, seed)
    assert result.ok, result.message
    return result.error


def full_kernel_source(a, tiles, n1, params=CodegenParams(), epilogue=Epilogue()):
    return kernel_source(a, tiles, n1, params, epilogue)


def conv_kernel_source(a, tiles, n1, geometry, epilogue=Epilogue(), params=CodegenParams()):
    return kernel_source(a, tiles, n1, params, epilogue, geometry)


def proxy_kernel_source(m, k, clusters, params=CodegenParams()):
    return proxy_source(m, k, clusters, params)


@st.composite
def layers(draw):
    m, k = draw(st.integers(1, 24)), draw(st.integers(1, 24))
    rng = np.random.default_rng(draw(st.integers(0, 2**31)))
    a = sp.random(m, k, density=draw(st.floats(0.0, 0.7)), format="csr", random_state=rng, dtype=np.float32)
    a.data[:] = rng.standard_normal(a.nnz).astype(np.float32)
    a.eliminate_zeros()
    return a


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(a=layers(), m1=st.integers(1, 9), n1=st.sampled_from([1, 3, 32]), n=st.integers(1, 70),
       prefetch=st.integers(0, 3), reorder=st.booleans(), shard_nnz=st.sampled_from([1, 7, 4096]))
def test_emitted_kernel_equals_scipy(a, m1, n1, n, prefetch, reorder, shard_nnz):
    tiles = reordered_tiles(a, m1) if reorder else identity_tiles(a, m1)
    kernel = full_kernel_source(a, tiles, n1, CodegenParams(prefetch=prefetch, shard_nnz=shard_nnz))
    assert host_error(kernel, a, n, seed=n) <= 1e-4


def test_empty_rows_are_zeroed_and_memory_stays_in_bounds():
    a = sp.csr_matrix(np.array([[0, 0, 0], [1.5, 0, -2], [0, 0, 0], [0, 3, 0], [0, 0, 0]], dtype=np.float32))
    kernel = full_kernel_source(a, reordered_tiles(a, 1), 32)
    assert "zero_0" in kernel.source and kernel.grid_x == 2 + 3
    host_error(kernel, a, 33, sanitize=True)  # AddressSanitizer build


def test_all_zero_matrix_writes_zeros():
    a = sp.csr_matrix((4, 6), dtype=np.float32)
    kernel = full_kernel_source(a, reordered_tiles(a, 2), 32)
    assert host_error(kernel, a, 5) == 0.0


def test_an_unwritten_output_fails_the_check():
    a = sp.csr_matrix(np.eye(3, dtype=np.float32))
    kernel = full_kernel_source(a, reordered_tiles(a, 1), 32)
    # drop the last tile's block
    spec = dataclasses.replace(kernel.spec, layout=dataclasses.replace(kernel.layout, row_blocks=kernel.grid_x - 1))
    result = checked(HostKernel(dataclasses.replace(kernel, spec=spec)), a, 4)
    assert not result.ok and "never written" in result.message and result.error == float("inf")


def test_out_of_bounds_access_is_caught_under_sanitizer():
    a = sp.csr_matrix(np.eye(3, dtype=np.float32))
    kernel = full_kernel_source(a, reordered_tiles(a, 1), 32)
    with pytest.raises(EmulationError, match="host run failed"):
        # B sized for 2 columns but the kernel told N = 4: reads past the end of B
        run_on_host(kernel, {"B": np.ones(3 * 2, np.float32), "C": np.empty(3 * 4, np.float32), "N": 4},
                    kernel.grid(4), 32, sanitize=True)


def test_source_shape_follows_algorithm_2():
    a = sp.csr_matrix(np.array([[1, 0, 2, 0], [0, 0, 3, 0]], dtype=np.float32))
    kernel = full_kernel_source(a, reordered_tiles(a, 2), 64)
    src = kernel.source
    assert src.count("lospmm_ld(Bn,") == 2  # columns 0 and 2 only: no load for an empty column
    assert len(re.findall(r"acc\d \+= b\d \* ", src)) == 3  # one multiply-add per nonzero
    assert "fmaf" not in src and "blockIdx.y * 64" in src and "if (n >= N) return;" in src
    assert re.fullmatch(r"lospmm_full_[0-9a-f]{16}", kernel.name)
    assert kernel.name in host_program(kernel)


def test_float_literals_round_trip_exactly():
    values = np.random.default_rng(0).standard_normal(1000).astype(np.float32)
    values = np.concatenate([values, np.float32([1e-38, -3.4e38, 0.1, 1.0])])
    parsed = np.array([np.float32(float(s[:-1])) for s in float_literal(values)])
    assert np.array_equal(parsed, values)


def test_bad_tile_parameters_are_rejected():
    a = sp.csr_matrix(np.eye(2, dtype=np.float32))
    with pytest.raises(ValueError, match="N1"):
        full_kernel_source(a, reordered_tiles(a, 1), 2048)
    with pytest.raises(ValueError, match="prefetch"):
        full_kernel_source(a, reordered_tiles(a, 1), 32, CodegenParams(prefetch=-1))


# --- proxies (§5.1) ---


def test_proxy_runs_in_bounds_under_host_emulation():
    a = random_pruned(96, 64, 0.8, np.random.default_rng(0))
    tiles = reordered_tiles(a, 8)
    cl = proxy_clusters(a, tiles, 0.8, 2)
    kernel = proxy_kernel_source(96, 64, cl)
    assert kernel.spec.form == "proxy" and kernel.params[-1] == "const int* cluster_of" and kernel.spec.n1_at_launch
    out = HostKernel(kernel, sanitize=True).run(np.ones((64, 100), np.float32), 32, {"cluster_of": cl.cluster_of})
    assert out.shape == (96, 100) and np.isfinite(out).all()  # every row of C stored (tile·M1 + i), in bounds


@pytest.mark.parametrize("design", ["chained", "chained,column-x,walks=3", "based,v=2", "chained,v=4,walks=2"])
def test_a_proxy_follows_its_design_and_stores_every_tile_row_in_bounds(design):
    a = random_pruned(40, 64, 0.8, np.random.default_rng(0))
    tiles = reordered_tiles(a, 4)
    cl = proxy_clusters(a, tiles, 0.8, 2)
    kernel = proxy_kernel_source(40, 64, cl, CodegenParams(design=design_named(design)))
    out = HostKernel(kernel, sanitize=True).run(np.ones((64, 70), np.float32), 8, {"cluster_of": cl.cluster_of})
    assert np.isfinite(out).all()
    assert bool(re.search(r"LOSPMM_LDC\d?\(b\d", kernel.source)) == ("chained" in design)
    assert ("while (n < N)" in kernel.source) == ("walks" in design)


@pytest.mark.parametrize("design", ["streamed", "streamed,chained", "streamed,chained,v=4,walks=2,column-x"])
def test_a_streamed_proxy_runs_its_clusters_columns_in_the_full_kernels_loop(design):
    # the search times a streamed design by this proxy: block t runs the loop over its cluster's NNC_p
    # columns, M1 multiply-adds each (as the full kernel per non-empty column), storing rows t·M1 + i
    a = random_pruned(44, 96, 0.8, np.random.default_rng(2))
    tiles = reordered_tiles(a, 4)
    cl = proxy_clusters(a, tiles, 0.8, 2)
    params = CodegenParams(design=design_named(design))
    kernel = proxy_kernel_source(44, 96, cl, params)
    assert kernel.spec.form == "proxy" and kernel.params[-1] == "const int* cluster_of" and len(kernel.units) == 1
    b = np.random.default_rng(0).standard_normal((96, 72)).astype(np.float32)
    out = HostKernel(kernel, sanitize=True).run(b, 8, {"cluster_of": cl.cluster_of})
    # its values are 1 + (i % 97) / 128 over its cluster's columns, row-major per column: the product exactly
    for t in range(tiles.num_tiles):
        cols = np.asarray(cl.columns[cl.cluster_of[t]])
        vals = (1 + (np.arange(len(cols) * 4) % 97) / 128).astype(np.float32).reshape(len(cols), 4)
        for i in range(4):
            if t * 4 + i < 44:
                np.testing.assert_allclose(out[t * 4 + i], vals[:, i] @ b[cols], rtol=1e-4, atol=1e-4)
    # the same loop as the full kernel's: its code does not grow with the clusters
    full = full_kernel_source(a, tiles, 64, params)
    loop = lambda k: re.sub(r"lospmm_\w+_[0-9a-f]{16}", "X", k.source[k.source.index("  const int stride"):])  # noqa: E731
    assert loop(kernel).split("for (int n = n0")[1].split("    }\n")[0] == \
        loop(full).split("for (int n = n0")[1].split("    }\n")[0]
    with pytest.raises(ValueError, match="baked proxy is the baked designs'"):
        from lospmm.kernel.render.baked import baked_proxy
        baked_proxy(44, 96, cl, params)


def test_a_proxy_spills_nothing_where_its_full_kernel_spills_nothing():
    """BERT's M1 = 12 proxies spilled ~1.8 KB on the H100 (a table of rows kept live through the
    multiply-adds) while the full kernels at the same cap spilled none: a proxy that spills misleads."""
    from lospmm.stages.compile import compiled_kernel, kernel_options

    a = random_pruned(192, 768, 0.9, np.random.default_rng(5))
    tiles = reordered_tiles(a, 12)
    for design in (BASELINE, design_named("streamed,chained,v=4")):
        params = CodegenParams(design=design)
        proxy = proxy_kernel_source(192, 768, proxy_clusters(a, tiles, 0.9, 4), params)
        full = full_kernel_source(a, tiles, 128, params)
        spills = [compiled_kernel(k, kernel_options("sm_90", 12, design=design)).thread_spill_bytes
                  for k in (full, proxy)]
        assert spills == [0, 0], design.label


def test_proxy_is_much_shorter_than_the_full_kernel_and_compiles():
    a = random_pruned(256, 256, 0.7, np.random.default_rng(0))
    tiles = reordered_tiles(a, 16)
    cl = proxy_clusters(a, tiles, 0.7, 1)
    proxy = proxy_kernel_source(256, 256, cl)
    full = full_kernel_source(a, tiles, 128)
    assert len(proxy.source) < len(full.source) / 3
    out = nv.compiled(proxy.source, proxy.name, nv.CompileOptions(maxrregcount=32))
    assert out.status == "ok", out.log


@given(st.lists(st.integers(0, 50), max_size=40), st.integers(1, 60))
def test_shard_groups_cover_every_function_once_in_order_within_the_budget(costs, budget):
    groups = shard_groups(costs, budget)
    assert [i for g in groups for i in g] == list(range(len(costs)))
    for g in groups:
        assert len(g) == 1 or sum(costs[i] for i in g) <= budget
    for g, nxt in zip(groups, groups[1:]):  # a group closes only when the next function would not fit
        assert sum(costs[i] for i in g) + costs[nxt[0]] > budget


def test_the_host_checked_text_is_the_units_compiled():
    a = random_pruned(64, 64, 0.8, np.random.default_rng(3))
    kernel = full_kernel_source(a, reordered_tiles(a, 8), 32, CodegenParams(shard_nnz=40))
    assert len(kernel.units) > 3 and kernel.source == "".join(kernel.units)
    assert kernel.name in kernel.units[-1] and all(kernel.name not in u for u in kernel.units[:-1])
    assert all(u.count("LOSPMM_TILE void tile_") >= 1 for u in kernel.units[:-1])


@settings(max_examples=20, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(conv=convolutions(), m1=st.integers(1, 5), n1=st.sampled_from([1, 7, 32]), batch=st.integers(1, 3),
       relu=st.booleans(), shard_nnz=st.sampled_from([1, 7, 4096]),
       design=st.sampled_from(["baseline", "column-x", "walks=3", "column-x,walks=2", "streamed",
                               "streamed,column-x,walks=2", "v=2", "v=4", "v=2,column-x,walks=3", "v=4,walks=2",
                               "streamed,v=2", "streamed,v=4,column-x,walks=2"]))
def test_the_conv_kernel_equals_a_reference_convolution_without_im2col(conv, m1, n1, batch, relu, shard_nnz, design):
    """In each grid order, once or walking its column blocks (a looped kernel finds each pixel's window
    again per walk; its zero blocks walk too), A baked or streamed (the loop reads each column's window
    offset from data), one pixel a thread or V (each lane its own window and loads, n1 apart; a lane past
    the last pixel loads and stores nothing)."""
    a, geometry, bias = conv
    epilogue = Epilogue(bias=bias, activation="relu" if relu else "")
    params = CodegenParams(shard_nnz=shard_nnz, design=design_named(design))
    kernel = conv_kernel_source(a, reordered_tiles(a, m1), n1, geometry, epilogue, params)
    assert kernel.k == geometry.k and kernel.params == ("const float* X", "float* Y", "int batch")
    assert host_error(kernel, a, batch) < 1e-4


@settings(max_examples=15, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(conv=convolutions(), m1=st.integers(1, 5), n1=st.sampled_from([1, 7, 32]), batch=st.integers(1, 3),
       activation=st.sampled_from(["", "relu", "gelu"]), shard_nnz=st.sampled_from([1, 7, 4096]),
       design=st.sampled_from(["fp16", "bf16", "fp16,acc=f32", "bf16,acc=f32", "fp16,promote=3", "bf16,chained"]),
       seed=st.integers(0, 1000))
def test_the_half_conv_kernel_is_its_exact_model_of_the_im2col_gemm_bit_for_bit(conv, m1, n1, batch, activation,
                                                                                shard_nnz, design, seed):
    """A tiled half design's implicit-im2col conv kernel (its pair two output pixels n1 apart, each lane's
    16-bit input its own load, zero in the padding): its NCHW output is the exact model's of A · im2col(X)
    in the design's sums (packed, fp32, promoted), bit for bit, through the bias and activation (rounded
    once from fp32), in every geometry, blocking and shard."""
    a, geometry, bias = conv
    d = design_named(design).conv_kernel
    rounded = rounded_matrix(a, d.dtype)[0]
    kernel = conv_kernel_source(rounded, reordered_tiles(rounded, m1), n1, geometry, Epilogue(bias, activation),
                                CodegenParams(shard_nnz=shard_nnz, design=d))
    assert kernel.params == ("const lospmm_h16* X", "lospmm_h16* Y", "int batch") and kernel.design == d
    result = checked(HostKernel(kernel, False), rounded, batch, seed)
    assert result.ok and result.metric == "normalised_error", result.message


def test_a_half_conv_kernel_storing_the_wrong_half_or_reading_beside_the_window_fails_its_check():
    geometry = ConvGeometry(cin=4, h=6, w=5, kh=3, kw=3, pad=1)
    a = rounded_matrix(random_pruned(8, geometry.k, 0.6, np.random.default_rng(4)), "fp16")[0]
    kernel = conv_kernel_source(a, reordered_tiles(a, 2), 8, geometry, Epilogue((0.25,) * 8, "relu"),
                                CodegenParams(design=design_named("fp16")))
    assert checked(HostKernel(kernel, True), a, 2).ok
    text = kernel.source
    for right, wrong in (("lospmm_sth(Yb_1, 0, 30, y >> 16)", "lospmm_sth(Yb_1, 0, 30, y)"),  # lane 0's half
                         ("ok0_0, ok0_1, ", "ok0_0, 0xffffffffu, ")):  # lane 1: no padding
        assert right in text
        broken = KernelSource(kernel.spec, tuple(u.replace(right, wrong) for u in kernel.units))
        try:
            result = checked(HostKernel(broken, True), a, 2)
        except EmulationError:  # the sanitizer stopped it: a read outside X
            continue
        assert not result.ok and "exact model" in result.message, wrong


@pytest.mark.parametrize("name, cin, hw, window, stride, pad", [
    ("3×3, padding borders", 4, (7, 6), 3, 1, 1),
    ("3×3, stride 2", 4, (9, 9), 3, 2, 1),
    ("7×7 first layer, stride 2", 3, (16, 15), 7, 2, 3),
    ("11×11 first layer, stride 4: 121 window entries, four mask words", 3, (31, 29), 11, 4, 2),
])
@pytest.mark.parametrize("design", ["baseline", "streamed", "v=4,walks=2", "streamed,v=4,walks=2", "chained,v=2,slices=2"])
def test_conv_kernels_read_only_their_input_under_the_sanitizer(name, cin, hw, window, stride, pad, design):
    geometry = ConvGeometry(cin=cin, h=hw[0], w=hw[1], kh=window, kw=window, stride=stride, pad=pad)
    a = random_pruned(8, geometry.k, 0.6, np.random.default_rng(3))
    epilogue = Epilogue(bias=tuple(np.linspace(-1, 1, 8).tolist()), activation="relu")
    kernel = conv_kernel_source(a, reordered_tiles(a, 2), 32, geometry, epilogue,
                                CodegenParams(shard_nnz=64, design=design_named(design)))
    assert host_error(kernel, a, 2, sanitize=True) < 1e-4


@pytest.mark.parametrize("pad", [1, 0])
@pytest.mark.parametrize("design", ["v=4", "v=2,walks=3", "fp16", "bf16,acc=f32", "streamed,v=2",
                                    "streamed,v=4,walks=3", "chained,slices=2", "chained,v=4,slices=4"])
def test_a_vector_conv_kernels_lanes_past_the_last_pixel_store_nothing(design, pad):
    """Empty rows (zeroing blocks) and a last block of pixels that fills only some lanes: a lane past the
    last pixel loads and stores nothing, in the tile functions and the zeroing ones (ASan sees a store
    past Y); without padding (loads without a test) it reads pixel n's window instead (ASan sees a read
    past X otherwise), and stores nothing; a half design's pair is two lanes."""
    geometry = ConvGeometry(cin=3, h=5, w=5, kh=3, kw=3, stride=1, pad=pad)  # 25 pixels a image, 9 without padding
    a = random_pruned(6, geometry.k, 0.5, np.random.default_rng(1)).tolil()
    a[1, :], a[4, :] = 0, 0
    a = sp.csr_matrix(a)
    a.eliminate_zeros()
    if design_named(design).half:
        a = rounded_matrix(a, design_named(design).dtype)[0]
    kernel = conv_kernel_source(a, reordered_tiles(a, 2), 8, geometry, Epilogue(bias=(0.5,) * 6, activation="relu"),
                                CodegenParams(design=design_named(design)))
    assert kernel.num_tiles < kernel.grid_x  # zeroing blocks (a streamed kernel's: blocks with no column)
    for batch in (1, 3):  # 25 and 75 pixels (9 and 27 without padding) over blocks of 8·V
        error = host_error(kernel, a, batch, sanitize=True)  # a half kernel's: its exact model, bit for bit
        assert kernel.design.half or error < 1e-4


def test_a_conv_kernel_links_into_one_entry_without_spills_at_the_prediction():
    geometry = ConvGeometry(cin=16, h=14, w=14, kh=3, kw=3, stride=1, pad=1)
    a = random_pruned(32, geometry.k, 0.8, np.random.default_rng(0))
    # a streamed one keeps its pixel's window across its loop: at one walk 8 registers above the GEMM's
    # (RegisterModel.window_regs; 16 B spilled at M1 = 16 without them)
    # a baked one of V lanes keeps each lane's window and loads (RegisterModel.lane_regs), compiled at
    # ptxas -O2 (at -O1 it spilled kilobytes at any cap); a sliced one too at V = 1 (320 B spilled at
    # M1 = 16 at the window mask's registers)
    for m1, design in ((1, "baseline"), (16, "baseline"), (16, "streamed"), (24, "streamed"),
                       (16, "streamed,column-x,walks=4"), (8, "staged,tiles=4"), (16, "staged,tiles=2,warps=2"),
                       (1, "v=2"), (8, "v=2"), (2, "v=4"), (16, "v=4,walks=4,column-x"), (16, "fp16"),
                       (32, "bf16,acc=f32"), (16, "fp16,promote=4"), (16, "streamed,v=2"), (4, "streamed,v=4"),
                       (16, "streamed,v=4,walks=4"), (16, "chained,slices=4"), (8, "chained,v=2,slices=4"),
                       (4, "chained,v=4,slices=2")):
        d = design_named(design)
        weight = rounded_matrix(a, d.dtype)[0] if d.half else a
        kernel = conv_kernel_source(weight, reordered_tiles(weight, m1), d.fixed_n1 or 64, geometry,
                                    Epilogue((0.5,) * 32, "relu"), CodegenParams(design=d))
        out = nv.compiled_kernel(kernel, nv.kernel_options("sm_90", m1, design=kernel.design, conv=True))
        assert out.status == "ok" and out.thread_spill_bytes == 0, out.log[-2000:]
        assert nv.entry_registers(out.cubin)[kernel.name] == out.registers  # the one entry point
        if d.half:  # the prediction the search constrains by is not below what ptxas gives (54-134 over these)
            assert out.registers <= predicted_registers(m1, design=d, conv=True), (design, out.registers)


def test_a_convolution_without_padding_loads_its_windows_without_a_bounds_test():
    """No padding: every window lies inside the image (ConvGeometry.windows_inside), so the baked conv
    kernels load without the window masks' test or the zero before it (`__ldg` at the window offset; a
    vector lane past the last pixel reads pixel n's window), the streamed loop and the staged copy without
    their entry's window test (the staged copy's last-pixel test stays). A 1×1 layer at 0.8, the same A and tile with
    and without a padding of 1: no spill at the prediction, and (SASS, where nvdisasm is installed) no
    predicate work left in the tile functions, under 0.8 of the padded kernel's instructions."""
    from lospmm.kernel.sass import NvdisasmMissing, opcodes_by_function

    a = random_pruned(32, 144, 0.8, np.random.default_rng(0))
    counts = {}
    for design in ("baseline", "v=2", "fp16", "streamed", "staged,tiles=2"):
        d = design_named(design)
        weight = rounded_matrix(a, d.dtype)[0] if d.half else a
        for pad in (0, 1):
            g = ConvGeometry(cin=144, h=14, w=14, kh=1, kw=1, pad=pad)
            assert g.windows_inside == (pad == 0)
            kernel = conv_kernel_source(weight, reordered_tiles(weight, 8), d.fixed_n1 or 64, g, Epilogue(),
                                        CodegenParams(design=d))
            tested = "LOSPMM_LDXR(x" if design == "streamed" else "rows_ok"  # the streamed loop's entries are data
            assert (tested in kernel.source) == (pad == 1)
            assert host_error(kernel, weight, 2) < 1e-4 or d.half  # (a half kernel's: its exact model)
            out = nv.compiled_kernel(kernel, nv.kernel_options("sm_90", 8, design=kernel.design, conv=True))
            assert out.status == "ok" and out.thread_spill_bytes == 0, out.log[-2000:]
            assert out.registers <= predicted_registers(8, design=d, conv=True)
            try:
                counts[design, pad] = [o for f, ops in opcodes_by_function(out.cubin).items() if f.startswith("tile_")
                                       for o in ops]
            except NvdisasmMissing:  # nvdisasm is the bench extra's
                continue
    if not counts:
        pytest.skip("no nvdisasm (pip install 'lospmm[bench]')")
    assert not {"ISETP", "PLOP3", "LOP3", "SEL"} & set(counts["baseline", 0])  # loads, FFMAs and stores
    for design in ("baseline", "v=2", "fp16"):  # (the streamed loop's: 304 against 352, its entries' loads stay)
        assert len(counts[design, 0]) < 0.8 * len(counts[design, 1]), (design, len(counts[design, 0]),
                                                                        len(counts[design, 1]))
    # with padding, a load tests one bit of its pixel's window mask (include/window.cuh): a 3×3 layer's
    # kernel issues under 3 instructions a load beside its FFMAs (5.1 when each tested a row and a column bit)
    g = ConvGeometry(cin=32, h=14, w=14, kh=3, kw=3, pad=1)
    a = random_pruned(64, g.k, 0.8, np.random.default_rng(1))
    kernel = conv_kernel_source(a, reordered_tiles(a, 16), 64, g, Epilogue(), CodegenParams())
    assert "LOSPMM_LDXM(" in kernel.source and "rows_ok, cols_ok" not in kernel.source
    out = nv.compiled_kernel(kernel, nv.kernel_options("sm_90", 16, design=kernel.design, conv=True))
    assert out.status == "ok" and out.thread_spill_bytes == 0
    ops = [o for f, function in opcodes_by_function(out.cubin).items() if f.startswith("tile_") for o in function]
    assert (len(ops) - ops.count("FFMA")) / ops.count("LDG") < 3.0


def test_bad_conv_geometry_is_named():
    with pytest.raises(ValueError, match="larger than the padded input"):
        ConvGeometry(cin=1, h=2, w=2, kh=5, kw=5)
    with pytest.raises(ValueError, match="stride must be >= 1"):
        ConvGeometry(cin=1, h=4, w=4, kh=3, kw=3, stride=0)
    with pytest.raises(ValueError, match="the kernels address an image with 32-bit byte offsets"):
        ConvGeometry(cin=64, h=4096, w=2160, kh=3, kw=3)  # 4·64·4096·2160 bytes: past 2^31
    assert ConvGeometry(cin=64, h=2048, w=2048, kh=3, kw=3).k == 576  # 2^30 bytes: addressed
    a = random_pruned(4, 10, 0.5, np.random.default_rng(0))
    with pytest.raises(ValueError, match="K=10 columns, the conv geometry needs cin·kh·kw = 9"):
        conv_kernel_source(a, reordered_tiles(a, 2), 32, ConvGeometry(cin=1, h=4, w=4, kh=3, kw=3))


# --- kernel designs (issue 20) ---


@settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(a=layers(), m1=st.integers(1, 6), n1=st.sampled_from([1, 3, 32]), n=st.integers(1, 70),
       prefetch=st.integers(0, 2), order=st.sampled_from(["tile-x", "column-x"]), walks=st.integers(1, 4),
       width=st.sampled_from([1, 2, 4]), loads=st.sampled_from(["based", "chained"]),
       values=st.sampled_from(["baked", "streamed"]))
def test_every_design_equals_scipy(a, m1, n1, n, prefetch, order, walks, width, loads, values):
    design = KernelDesign(order, walks, width, loads, values)
    kernel = full_kernel_source(a, reordered_tiles(a, m1), n1, CodegenParams(prefetch=prefetch, design=design))
    assert kernel.design == design and kernel.layout.columns_per_thread == width
    assert host_error(kernel, a, n, seed=n) <= 1e-4


def test_designs_stay_in_bounds_and_aligned_under_the_sanitizer():
    a = random_pruned(37, 50, 0.7, np.random.default_rng(4))
    for design in ("chained,v=4,walks=3,column-x", "streamed,chained,v=2,walks=2", "based,v=4"):
        kernel = full_kernel_source(a, reordered_tiles(a, 3), 16, CodegenParams(design=design_named(design)))
        host_error(kernel, a, 45, sanitize=True)  # padded to the column multiple by the launcher


def test_a_vector_kernel_refuses_an_unpadded_n():
    a = random_pruned(8, 8, 0.5, np.random.default_rng(0))
    kernel = full_kernel_source(a, reordered_tiles(a, 2), 4, CodegenParams(design=design_named("v=4")))
    with pytest.raises(EmulationError, match="not a multiple of the kernel's columns per thread") as e:
        run_on_host(kernel, {"B": np.ones(8 * 6, np.float32), "C": np.empty(8 * 6, np.float32), "N": 6},
                    kernel.layout.grid(6), 4)  # N = 6 is no multiple of 4: the kernel traps
    assert not e.value.transient  # the kernel's own refusal: never retried as a crash


def test_the_baseline_design_is_the_kernel_before_designs():
    """The same text, byte for byte, as the kernels generated before designs existed (commit d25b3a0,
    the kernels measured on the H100): the A/B's baseline, and its compile-cache entries still hit. The
    padded conv kernel's text changed on purpose on 2026-11-26 (each load tests one bit of its pixel's
    window mask, include/window.cuh): its digest is the new kernel's."""
    import hashlib

    a = random_pruned(40, 36, 0.7, np.random.default_rng(7))
    tiles = reordered_tiles(a, 4)
    full = full_kernel_source(a, tiles, 64)
    conv = conv_kernel_source(a, tiles, 64, ConvGeometry(cin=4, h=6, w=6, kh=3, kw=3, pad=1))
    assert (full.name, hashlib.sha256(full.source.encode()).hexdigest()) == (
        "lospmm_full_1dc503d7bfd3b65f", "66bb0d3a6772782c8108d8b5bf6827ceffc160f1c412490a4038d3fe0137a5c9")
    assert (conv.name, hashlib.sha256(conv.source.encode()).hexdigest()) == (
        "lospmm_conv_5a68034b8d1b3cd9", "3c9170bf34ebd6a19e1add7884f159f73abd88cbec740d23a07d05349ede0242")
    a = sp.csr_matrix(np.array([[1, 0, 2, 0], [0, 0, 3, 0]], dtype=np.float32))
    kernel = full_kernel_source(a, reordered_tiles(a, 2), 64)
    assert kernel.design == BASELINE and "LOSPMM_DESIGN_PREAMBLE" not in kernel.source
    walked = full_kernel_source(a, reordered_tiles(a, 2), 64, CodegenParams(design=design_named("walks=2")))
    assert walked.name != kernel.name
    # walks above 1 share one text: the number of walks is a launch fact
    assert full_kernel_source(a, reordered_tiles(a, 2), 64, CodegenParams(design=design_named("walks=5"))).source \
        == walked.source


def test_chained_loads_step_from_the_previous_column():
    a = sp.csr_matrix(np.array([[1, 0, 2, 0, 0, 4]], dtype=np.float32))
    kernel = full_kernel_source(a, reordered_tiles(a, 1), 32, CodegenParams(design=design_named("chained")))
    steps = [int(s) for s in re.findall(r"LOSPMM_LDC\(b\d+, p, N, (\d+)\)", kernel.source)]
    assert steps == [0, 8, 12]  # columns 0, 2, 5: byte steps of 4·(column − previous column)


def test_a_streamed_kernel_is_one_small_unit_whatever_the_layer():
    small = random_pruned(16, 32, 0.8, np.random.default_rng(0))
    large = random_pruned(256, 512, 0.8, np.random.default_rng(0))
    design = CodegenParams(design=design_named("streamed"))
    kernels = [full_kernel_source(a, reordered_tiles(a, 4), 32, design) for a in (small, large)]
    code = [k.source[k.source.index("LOSPMM_KERNEL void"):] for k in kernels]
    assert all(len(k.units) == 1 for k in kernels) and code[0].replace(kernels[0].name, "") == \
        code[1].replace(kernels[1].name, "")  # the same loop; only the data differs


@pytest.mark.parametrize("order, expected", [("tile-x", (7, 3, 1)), ("column-x", (3, 7, 1))])
def test_the_launch_layout_is_the_one_grid(order, expected):
    layout = LaunchLayout(row_blocks=7, threads=32, columns_per_thread=2, column_walks=2, order=order)
    # 330 columns: padded to 330 (a multiple of 2), 6 column blocks of 64, walked 2 by each block
    assert layout.launch_columns(331) == 332 and layout.grid(330) == expected
    assert LaunchLayout.of_facts({"launch": layout.facts()}) == layout
    assert LaunchLayout.of_facts({"grid": {"x": 9}, "n1": 64}) == LaunchLayout(9, 64)  # kernel.json before `launch`
    with pytest.raises(ValueError, match="exceed the grid's y limit of 65535"):  # the tiles on y: at most 65535
        LaunchLayout(row_blocks=70000, threads=32, order="column-x").grid(32)
    with pytest.raises(ValueError, match="launch order must be one of"):
        LaunchLayout(1, 32, order="diagonal")


def test_design_names_read_back_and_bad_ones_are_named():
    for design in (BASELINE, KernelDesign("column-x", 4, 2, "chained", "baked"), KernelDesign(a_values="streamed")):
        assert design_named(design.label) == design
    assert design_named("baseline") == BASELINE
    for bad, match in (("v=3", "columns_per_thread"), ("warp", "cannot read 'warp'"), ("walks=0", "column_walks")):
        with pytest.raises(ValueError, match=match):
            design_named(bad)


def test_a_conv_kernel_takes_the_grid_order_walks_columns_per_thread_and_baked_or_streamed_values_only():
    g = ConvGeometry(cin=2, h=5, w=5, kh=3, kw=3, pad=1)
    a = random_pruned(4, g.k, 0.5, np.random.default_rng(0))
    kernel = conv_kernel_source(a, reordered_tiles(a, 2), 8, g, params=CodegenParams(design=design_named("column-x")))
    assert kernel.layout.order == "column-x" and kernel.grid(g.n(2))[1] == kernel.grid_x
    looped = conv_kernel_source(a, reordered_tiles(a, 2), 8, g, params=CodegenParams(design=design_named("walks=4")))
    assert looped.layout.column_walks == 4 and looped.grid(g.n(2))[1] == -(-g.n(2) // 8 // 4)  # 50 pixels: 7 blocks, 2 walkers
    with pytest.raises(ValueError, match="only the grid's order"):
        conv_kernel_source(a, reordered_tiles(a, 2), 8, g, params=CodegenParams(design=design_named("chained,v=2")))
    # V pixels a thread: a block covers n1·V pixels, lanes n1 apart; its arrays need no vector alignment
    vector = conv_kernel_source(a, reordered_tiles(a, 2), 8, g, params=CodegenParams(design=design_named("v=4")))
    assert vector.layout.columns_per_thread == 4 and vector.grid(g.n(2))[1] == -(-g.n(2) // 32)
    assert vector.spec.alignment == 4 and "+ 24;" in vector.source  # lane 3: n + 3·8
    assert design_named("chained,v=4,walks=4").conv_kernel == design_named("v=4,walks=4")
    # its lanes' registers are a conv kernel's only (a review found the search adding them to every GEMM
    # layer once); a half design's pair is two lanes (two output pixels), the sparse tensor cores' kernel a GEMM
    half, vector2 = design_named("fp16,chained"), design_named("chained,v=2")
    mma = design_named("nm,fp16,acc=mma")
    assert (half.conv_lanes, vector2.conv_lanes, design_named("streamed,v=4").conv_lanes, mma.conv_lanes) == (2, 2, 4, 1)
    assert design_named("streamed,chained,v=4,walks=2").conv_kernel == design_named("streamed,v=4,walks=2")
    assert half.conv_kernel == design_named("fp16") and design_named("bf16,acc=f32").serves_conv
    assert predicted_registers(4, design=half, conv=True) == predicted_registers(4, design=half) + 24
    assert predicted_registers(4, design=vector2, conv=True) == predicted_registers(4, design=vector2) + 24
    # a half one: its pair's lanes n1 apart, each pixel's 16-bit X and Y its own access (2-byte alignment)
    rounded = rounded_matrix(a, "bf16")[0]
    pair = conv_kernel_source(rounded, reordered_tiles(rounded, 2), 8, g, params=CodegenParams(design=design_named("bf16")))
    assert pair.params == ("const lospmm_h16* X", "lospmm_h16* Y", "int batch") and pair.spec.alignment == 2
    assert pair.layout.columns_per_thread == 2 and pair.grid(g.n(2))[1] == -(-g.n(2) // 16) and "+ 8;" in pair.source
    with pytest.raises(ValueError, match="only the grid's order"):
        conv_kernel_source(rounded, reordered_tiles(rounded, 2), 8, g, params=CodegenParams(design=design_named("bf16,chained")))
    with pytest.raises(ValueError, match="not bf16"):
        conv_kernel_source(a, reordered_tiles(a, 2), 8, g, params=CodegenParams(design=design_named("bf16")))
    # streamed: one small unit whatever the layer, its window offsets in data; launched as the baked one
    streamed = conv_kernel_source(a, reordered_tiles(a, 2), 8, g,
                                  params=CodegenParams(design=design_named("streamed,column-x,walks=4")))
    assert len(streamed.units) == 1 and "tile_" not in streamed.source and "LOSPMM_LDXR" in streamed.source
    # its entries are read as int2 pairs: the device faults on a misaligned one, the host does not
    assert f"__device__ __align__(8) const int lospmm_cols_{streamed.name}[]" in streamed.source
    staged = conv_kernel_source(a, reordered_tiles(a, 2), 32, g, params=CodegenParams(design=design_named("staged,tiles=2")))
    assert staged.source.count("__device__ __align__(8) const int lospmm_staged_") == -(-staged.num_tiles // 2)
    tiles_along, walkers, _ = looped.grid(g.n(2))
    assert streamed.spec.form == "conv" and streamed.grid(g.n(2)) == (walkers, tiles_along, 1)  # column-x
    # its conv form (KernelDesign.conv_kernel) is what renders: chained loads have nothing to chain there
    with pytest.raises(ValueError, match="a streamed conv kernel takes the grid's order, walks and columns per thread"):
        conv_kernel_source(a, reordered_tiles(a, 2), 8, g, params=CodegenParams(design=design_named("streamed,chained")))
    assert design_named("streamed,chained").conv_kernel == design_named("streamed")
    # V pixels a thread, blockDim.x apart (each lane its window), launched as the baked vector conv kernel
    lanes = conv_kernel_source(a, reordered_tiles(a, 2), 8, g, params=CodegenParams(design=design_named("streamed,v=4")))
    assert len(lanes.units) == 1 and lanes.layout.columns_per_thread == 4 and "3 * blockDim.x" in lanes.source
    assert lanes.grid(g.n(2)) == vector.grid(g.n(2)) and lanes.spec.alignment == 4


# --- fused epilogues (issue 22): a bias per row and an activation, in every design (streamed: its bias as data) ---


@settings(max_examples=20, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(a=layers(), m1=st.integers(1, 5), n1=st.sampled_from([1, 32]), n=st.integers(1, 40),
       design=st.sampled_from(["baseline", "chained,v=2", "v=4,walks=2,column-x", "chained,walks=3", "streamed",
                               "streamed,chained,v=4,walks=2"]),
       bias=st.booleans(), activation=st.sampled_from(["", "relu", "gelu"]), seed=st.integers(0, 2**31))
def test_a_fused_epilogue_equals_the_reference_in_every_design(a, m1, n1, n, design, bias, activation, seed):
    values = tuple(np.random.default_rng(seed).standard_normal(a.shape[0]).astype(np.float32).tolist()) if bias else ()
    epilogue = Epilogue(values, activation)
    kernel = full_kernel_source(a, reordered_tiles(a, m1), n1, CodegenParams(design=design_named(design)), epilogue)
    # rows without a nonzero (zero blocks) store the activated bias; rows with one, act(A·B + bias)
    assert kernel.spec.epilogue == epilogue and host_error(kernel, a, n, seed=n) <= 1e-4


def test_an_epilogue_changes_the_kernel_and_the_empty_one_does_not():
    a = sp.csr_matrix(np.array([[0, 0, 0], [1.5, 0, -2], [0, 0, 0], [0, 3, 0]], dtype=np.float32))
    tiles = reordered_tiles(a, 1)
    plain = full_kernel_source(a, tiles, 32)
    assert full_kernel_source(a, tiles, 32, epilogue=Epilogue()).source == plain.source
    gelu = full_kernel_source(a, tiles, 32, epilogue=Epilogue((0.5, -1.0, 2.0, 0.25), "gelu"))
    assert gelu.name != plain.name and "erff(" in gelu.source
    host_error(gelu, a, 33, sanitize=True)
    # the check applies the spec's epilogue: judged as a kernel without one, the same output fails
    x = np.random.default_rng(0).standard_normal((3, 33)).astype(np.float32)
    wrong = judged(dataclasses.replace(gelu.spec, epilogue=Epilogue()), a, x, HostKernel(gelu).run(x))
    assert not wrong.ok and "exceeds" in wrong.message
    with pytest.raises(ValueError, match="bias has 2 values for 4 output rows"):
        full_kernel_source(a, tiles, 32, epilogue=Epilogue((1.0, 2.0)))
    with pytest.raises(ValueError, match="activation 'tanh'"):
        Epilogue(activation="tanh")
    assert Epilogue.of_facts(Epilogue((1.5, -2.0), "relu").facts()) == Epilogue((1.5, -2.0), "relu")
    assert Epilogue.of_facts({"bias": False, "relu": True}) == Epilogue(activation="relu")  # an older kernel.json


def test_a_full_kernel_reading_n1_at_launch_is_right_at_every_n1_and_shares_its_tile_units():
    """One cubin per M1 for every kept N1 (issue 24's Table 4 over every kept candidate): the block
    size comes from blockDim; the tile units are the baked kernel's, so the compile cache shares them."""
    a = random_pruned(40, 60, 0.8, np.random.default_rng(0))
    tiles = reordered_tiles(a, 2)
    baked = full_kernel_source(a, tiles, 64)
    any_n1 = full_kernel_source(a, tiles, 64, CodegenParams(n1_at_launch=True))
    assert any_n1.layout.threads == 0 and any_n1.name != baked.name
    assert any_n1.units[:-1] == baked.units[:-1] and "blockIdx.y * blockDim.x" in any_n1.units[-1]
    for design in ("streamed", "fp16"):  # the baked fp32 kernels' so far: refused, never ignored
        with pytest.raises(ValueError, match="N1 at launch"):
            full_kernel_source(a, tiles, 64, CodegenParams(design=design_named(design), n1_at_launch=True))
    b = np.random.default_rng(1).standard_normal((60, 77)).astype(np.float32)
    for n1 in (32, 96):
        c = run_on_host(any_n1, {"B": b.ravel(), "C": np.empty(40 * 77, np.float32), "N": 77},
                        any_n1.layout.grid(77, n1), n1)["C"].reshape(40, 77)
        np.testing.assert_allclose(c, a @ b.astype(np.float64), rtol=1e-5, atol=1e-5)
