"""Tests that need a CUDA device (marked `gpu`, skipped without one): every kind of kernel checked on
the CUDA backend with the one check (lospmm.kernel.check), the cuda timer, the loader on CuPy/torch
arrays, a whole search with the cuda timer, and the device program's measurement of a bundle."""

from __future__ import annotations

import numpy as np
import pytest

from lospmm.kernel.cuda import gpu_present

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not gpu_present(), reason="no CUDA device")]


def _arch() -> str:
    from lospmm.kernel.cuda import device_facts

    return device_facts()["arch"]


def _package(tmp_path, m=96, k=64, sparsity=0.8, m1=8, n1=64, design="baseline", epilogue=None, conv=None, a=None):
    """An emitted kernel package (compiled for this GPU, not checked on the host) and its A."""
    from lospmm.flows.kernels import emitted_kernel
    from lospmm.kernel.design import design_named
    from lospmm.kernel.epilogue import Epilogue
    from lospmm.kernel.package import read_package
    from lospmm.stages.prune import random_pruned
    from lospmm.stages.reorder import reordered_tiles

    a = random_pruned(m, k, sparsity, np.random.default_rng(0)) if a is None else a
    out = tmp_path / design.replace(",", "_").replace("=", "")
    facts = emitted_kernel(str(tmp_path), a, reordered_tiles(a, m1), "test", sparsity, n1, _arch(), out, verify=False,
                           design=design_named(design), epilogue=epilogue or Epilogue(), conv=conv)
    assert facts["compile"]["status"] == "ok", facts["compile"]
    return a, read_package(out, ("kernel.json", "kernel.cubin"))


def _device_checked(package, a, counts):
    from lospmm.kernel.check import checked

    kernel = package.on("cuda")
    for count in counts:
        result = checked(kernel, a, count, seed=count)
        assert result.ok, (count, result.message)
        assert result.error <= result.bound


def test_emitted_kernel_matches_scipy_on_the_device(tmp_path):
    a, package = _package(tmp_path)
    _device_checked(package, a, (1, 63, 64, 200))


@pytest.mark.parametrize("design", ["staged,tiles=4", "staged,tiles=16", "staged,tiles=4,warps=4"])
def test_the_staged_kernel_matches_scipy_on_the_device(tmp_path, design):
    """The staged design's shared-memory copies and reads are inline PTX (st.shared, ld.shared at a
    literal offset): K over two or more chunks, N of 1, 31, 32, 4096 and an odd N, C poisoned with NaN;
    and through the loader on torch."""
    from lospmm.kernel.design import design_named
    from lospmm.loader import load_kernel

    a, package = _package(tmp_path, m=130, k=600, sparsity=0.85, m1=4, n1=design_named(design).fixed_n1,
                          design=design)
    _device_checked(package, a, (1, 31, 32, 4096, 333))
    torch = pytest.importorskip("torch")
    b = torch.randn(600, 77, device="cuda")
    np.testing.assert_allclose(load_kernel(package.dir)(b).cpu().numpy(), a @ b.cpu().numpy(), rtol=1e-4, atol=1e-4)


def test_a_staged_proxy_launches_with_its_own_shared_memory_and_eq6s_rest_past_48_kb():
    # the staged proxy declares its union (up to 32 KiB); with Eq. 6's rest at 3-4 active blocks a block
    # totals more than 48 KB, which a launch may only take after the opt-in (cuda.shared_opt_in)
    from lospmm.devices import device_named
    from lospmm.kernel.cuda import CudaTimer
    from lospmm.kernel.render import CodegenParams, proxy_source
    from lospmm.kernel.timing import LaunchUnderTest
    from lospmm.stages.cluster import chosen_proxy_clusters
    from lospmm.stages.constrain import constrained_candidates
    from lospmm.stages.pad import proxy_dynamic_shared, proxy_launch
    from lospmm.stages.reorder import reordered_tiles, tile_stats
    from lospmm.stages.compile import compiled_kernel, kernel_options
    from lospmm.kernel.design import design_named
    from lospmm.stages.prune import random_pruned

    h100 = device_named("h100")
    a = random_pruned(768, 3072, 0.9, np.random.default_rng(0))
    design, tiles = design_named("staged,tiles=8"), reordered_tiles(a, 8)
    chosen = constrained_candidates(784, {8: tile_stats(tiles)}, h100, design=design)
    clusters = chosen_proxy_clusters(a, tiles, chosen, 0.9, h100, design=design)[0]
    kernel = proxy_source(768, 3072, clusters, CodegenParams(design=design))
    out = compiled_kernel(kernel, kernel_options("sm_90", 8, design=design))
    launch = proxy_launch(tiles.num_tiles, 784, 8, 32, chosen[0].pred_regs, h100, design)
    dynamic = proxy_dynamic_shared(launch.smem_bytes, clusters)
    assert clusters.shared_bytes + dynamic > 48 * 1024  # the case the opt-in is for
    t = CudaTimer(h100, "gpu").time(LaunchUnderTest(None, 768, 3072, 784, 32, out.registers, 0, dynamic,
                                                    clusters=clusters, spec=kernel.spec, cubin=out.cubin))
    assert t.status == "ok" and np.isfinite(t.time_us), t


def test_a_sliced_proxy_launches_with_its_partial_sums_in_dynamic_shared_memory():
    """The sliced proxy's partial sums are dynamic shared memory (its N1 is a launch fact): launched with
    what proxy_dynamic_shared gives, it runs; the full kernel's static partials are checked above."""
    from lospmm.devices import device_named
    from lospmm.kernel.cuda import CudaTimer
    from lospmm.kernel.design import design_named
    from lospmm.kernel.render import CodegenParams, proxy_source
    from lospmm.kernel.timing import LaunchUnderTest
    from lospmm.stages.cluster import chosen_proxy_clusters
    from lospmm.stages.compile import compiled_kernel, kernel_options
    from lospmm.stages.constrain import constrained_candidates
    from lospmm.stages.pad import proxy_dynamic_shared, proxy_launch
    from lospmm.stages.prune import random_pruned
    from lospmm.stages.reorder import reordered_tiles, tile_stats

    h100 = device_named("h100")
    a = random_pruned(768, 3072, 0.9, np.random.default_rng(0))
    design, tiles = design_named("chained,slices=4"), reordered_tiles(a, 8)
    chosen = [c for c in constrained_candidates(196, {8: tile_stats(tiles)}, h100, design=design) if c.kept]
    clusters = chosen_proxy_clusters(a, tiles, chosen, 0.9, h100, design=design)[0]
    kernel = proxy_source(768, 3072, clusters, CodegenParams(design=design))
    out = compiled_kernel(kernel, kernel_options("sm_90", 8, design=design))
    n1 = chosen[0].n1
    launch = proxy_launch(tiles.num_tiles, 196, 8, n1, chosen[0].pred_regs, h100, design)
    dynamic = proxy_dynamic_shared(launch.smem_bytes, clusters, design, n1)
    assert dynamic >= design.slice_shared_bytes(8, n1)
    t = CudaTimer(h100, "gpu").time(LaunchUnderTest(None, 768, 3072, 196, n1, out.registers, 0, dynamic,
                                                    clusters=clusters, spec=kernel.spec, cubin=out.cubin))
    assert t.status == "ok" and np.isfinite(t.time_us), t


@pytest.mark.parametrize("design", ["chained", "chained,column-x", "chained,walks=3", "chained,v=2", "chained,v=4",
                                    "based,v=4,walks=2,column-x", "streamed", "streamed,chained,v=4,walks=2",
                                    "chained,walks=3,split=24", "v=2,walks=4,column-x,split=40", "chained,slices=4",
                                    "chained,slices=2,column-x", "chained,v=4,slices=2", "chained,v=2,slices=8"])
def test_every_kernel_design_matches_scipy_on_the_device(tmp_path, design):
    """Each design's inline PTX (vector and chained loads, vector stores; a K split's coherent loads of
    its own partial sums; a sliced tile's shared partial sums and barrier) runs only here: N of 1, 31 and 32 (padded to the design's column multiple),
    4096 and an odd N, C poisoned with NaN."""
    from lospmm.loader import load_kernel

    a, package = _package(tmp_path, m=130, k=200, sparsity=0.85, m1=4, n1=64, design=design)
    _device_checked(package, a, (1, 31, 32, 4096, 333))
    torch = pytest.importorskip("torch")
    b = torch.randn(200, 77, device="cuda")
    np.testing.assert_allclose(load_kernel(package.dir)(b).cpu().numpy(), a @ b.cpu().numpy(), rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("design", ["baseline", "chained,v=2", "streamed,chained,v=4"])
def test_a_fused_bias_and_gelu_match_the_reference_on_the_device(tmp_path, design):
    """The epilogue's device code (erff, make_float2) runs only here; the loader serves it too."""
    from lospmm.kernel.epilogue import Epilogue
    from lospmm.loader import load_kernel
    from lospmm.stages.prune import random_pruned

    a = random_pruned(130, 200, 0.85, np.random.default_rng(0)).tolil()
    a[7, :] = 0  # an empty row: stores gelu(bias) alone
    a = a.tocsr()
    epilogue = Epilogue(tuple(np.random.default_rng(1).standard_normal(130).astype(np.float32).tolist()), "gelu")
    a, package = _package(tmp_path, m1=4, design=design, epilogue=epilogue, a=a)
    _device_checked(package, a, (1, 32, 333))
    torch = pytest.importorskip("torch")
    b = torch.randn(200, 77, device="cuda")
    want = epilogue.reference(a @ b.cpu().numpy().astype(np.float64))
    np.testing.assert_allclose(load_kernel(package.dir)(b).cpu().numpy(), want, rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("pattern,blocking", [((16, 32, 8), (64, 128, 8, 8)), ((2, 4, 1), (32, 64, 8, 4)),
                                              ((4, 32, 16), (16, 64, 4, 4))])
def test_the_nm_kernel_matches_scipy_and_the_host_on_the_device(tmp_path, pattern, blocking):
    """The N:M kernel's cp.async stages, wait groups and barriers run only here (the host copies at
    once): its package through the loader on torch (module data filled from weight.parquet), N of 1,
    31, 32, 333 (element-wise path) and 4096 (float4), bias and ReLU fused; the device's C within the
    fp32 bound of the host emulation's."""
    from lospmm.flows.kernels import emitted_kernel
    from lospmm.kernel.choices import NM_DESIGN
    from lospmm.kernel.epilogue import Epilogue
    from lospmm.kernel.nm import NMTiling
    from lospmm.kernel.package import read_package
    from lospmm.stages.prune import NMPattern, random_nm_pruned

    a = random_nm_pruned(208, 256, NMPattern(*pattern), np.random.default_rng(0))
    epilogue = Epilogue(tuple(np.linspace(-1, 1, 208).tolist()), "relu")
    facts = emitted_kernel(str(tmp_path), a, None, "nm", 1 - pattern[0] / pattern[1], 0, _arch(), tmp_path / "k",
                           verify=False, design=NM_DESIGN, epilogue=epilogue, nm=NMTiling(*pattern, *blocking))
    assert facts["compile"]["status"] == "ok", facts["compile"]
    package = read_package(tmp_path / "k", ("kernel.json", "kernel.cubin"))
    _device_checked(package, a, (1, 31, 32, 333, 4096))
    torch = pytest.importorskip("torch")
    from lospmm.loader import load_kernel

    spmm = load_kernel(tmp_path / "k")
    b = torch.randn(256, 100, device="cuda")
    want = np.maximum(a @ b.cpu().numpy() + np.asarray(epilogue.bias, np.float32)[:, None], 0)
    np.testing.assert_allclose(spmm(b).cpu().numpy(), want, rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("design", ["nm,fp16", "nm,bf16,acc=f32"])
def test_a_half_nm_kernel_computes_on_the_device_what_the_host_emulation_computes(design):
    """The half N:M kernel's packed fma / fmaf on unpacked pairs, its 16-byte stages and uint2 stores:
    the device's C is the host emulation's and the exact model's bit for bit, at N 1, 32, 333 and 4096."""
    from lospmm.kernel.check import kernel_reference
    from lospmm.kernel.cuda import CudaKernel
    from lospmm.kernel.design import design_named
    from lospmm.kernel.host import HostKernel
    from lospmm.kernel.nm import NMTiling
    from lospmm.kernel.numbers import rounded_matrix, to_dtype_bits
    from lospmm.kernel.render import CodegenParams, kernel_source
    from lospmm.stages.compile import compiled_kernel, kernel_options
    from lospmm.stages.prune import NMPattern, random_nm_pruned

    d = design_named(design)
    a, _ = rounded_matrix(random_nm_pruned(136, 256, NMPattern(4, 32, 8), np.random.default_rng(0)), d.dtype)
    kernel = kernel_source(a, None, 0, CodegenParams(design=d), nm=NMTiling(4, 32, 8))
    compiled = compiled_kernel(kernel, kernel_options(_arch(), kernel.spec.m1, design=d))
    assert compiled.status == "ok", compiled.log[-500:]
    data = kernel.spec.module_data(a)
    on_device = CudaKernel(kernel.spec, compiled.cubin, data)
    for n in (1, 32, 333, 4096):
        b = to_dtype_bits(np.random.default_rng(n).standard_normal((256, n)), d.dtype)
        c = on_device.run(b)
        assert np.array_equal(c, kernel_reference(a, b, d.number)), n
        if n < 4096:  # the host run is slow at 4096
            assert np.array_equal(c, HostKernel(kernel, False, data).run(b)), n


@pytest.mark.parametrize("dtype,blocking", [("fp16", (64, 128, 32, 64, 32)), ("bf16", (32, 32, 32, 32, 64)),
                                            ("fp16", (128, 128, 64, 64, 32))])
def test_the_sparse_tensor_core_kernel_matches_scipy_and_the_host_emulation_on_the_device(dtype, blocking):
    """mma.sp with our fragment and metadata layout (the host emulation reads the PTX ISA's): the
    device's C is A·B within tensor-core sums' bound, through a bias and GELU, at N 1, 37, 256 and 4096
    (16-byte stages and pair stores, element-wise otherwise), and within a value of the dtype of the
    host emulation's (whose fp32 sums round once)."""
    from lospmm.kernel.check import checked
    from lospmm.kernel.cuda import CudaKernel
    from lospmm.kernel.design import design_named
    from lospmm.kernel.epilogue import Epilogue
    from lospmm.kernel.host import HostKernel
    from lospmm.kernel.numbers import from_dtype_bits, rounded_matrix, to_dtype_bits
    from lospmm.kernel.render import CodegenParams, kernel_source
    from lospmm.kernel.sparse_mma import MMATiling
    from lospmm.stages.compile import compiled_kernel, kernel_options
    from lospmm.stages.prune import NMPattern, random_nm_pruned

    d = design_named(f"nm,{dtype},acc=mma")
    a, _ = rounded_matrix(random_nm_pruned(200, 320, NMPattern(2, 4, 1), np.random.default_rng(0)), dtype)
    epilogue = Epilogue(tuple(np.linspace(-1, 1, 200).tolist()), "gelu")
    kernel = kernel_source(a, None, 0, CodegenParams(design=d), epilogue, nm=MMATiling(2, 4, 1, *blocking))
    compiled = compiled_kernel(kernel, kernel_options(_arch(), kernel.spec.m1, design=d))
    assert compiled.status == "ok", compiled.log[-500:]
    data = kernel.spec.module_data(a)
    on_device = CudaKernel(kernel.spec, compiled.cubin, data)
    for n in (1, 37, 256, 4096):
        result = checked(on_device, a, n, seed=n)
        assert result.ok, (n, result.message)
    b = to_dtype_bits(np.random.default_rng(5).standard_normal((320, 37)), dtype)
    host, device = (from_dtype_bits(k.run(b), dtype) for k in (HostKernel(kernel, False, data), on_device))
    spacing = np.abs(host) * (2.0 ** -10 if dtype == "fp16" else 2.0 ** -7) + 1e-6
    assert np.all(np.abs(host - device) <= 2 * spacing)


@pytest.mark.parametrize("number,loads", [(("fp16", "packed", 0), "based"), (("bf16", "packed", 0), "chained"),
                                          (("fp16", "f32", 0), "chained"), (("bf16", "packed", 4), "based")])
def test_a_half_kernel_computes_on_the_device_what_the_host_emulation_computes(number, loads):
    """fma.rn.f16x2 / .bf16x2, cvt.rn and the packed loads and stores run only here: the device's C
    is the host emulation's bit for bit (and the exact model's: kernel_reference), at N 1, 32 and 333."""
    from lospmm.kernel.check import kernel_reference
    from lospmm.kernel.cuda import CudaKernel
    from lospmm.kernel.design import design_named, half_design
    from lospmm.kernel.host import HostKernel
    from lospmm.kernel.numbers import NumberFormat, rounded_matrix, to_dtype_bits
    from lospmm.kernel.render import CodegenParams, kernel_source
    from lospmm.stages.compile import compiled_kernel, kernel_options
    from lospmm.stages.prune import random_pruned
    from lospmm.stages.reorder import reordered_tiles

    p = NumberFormat.half(*number)
    design = half_design(p, design_named(loads))
    a, _ = rounded_matrix(random_pruned(130, 200, 0.85, np.random.default_rng(0)), p.dtype)
    kernel = kernel_source(a, reordered_tiles(a, 4), 64, CodegenParams(design=design))
    compiled = compiled_kernel(kernel, kernel_options(_arch(), 4, design=design))
    assert compiled.status == "ok", compiled.log[-500:]
    on_device = CudaKernel(kernel.spec, compiled.cubin)
    for n in (1, 32, 333):
        b = to_dtype_bits(np.random.default_rng(n).standard_normal((200, n)), p.dtype)
        c = on_device.run(b)
        assert np.array_equal(c, HostKernel(kernel).run(b)), n
        assert np.array_equal(c, kernel_reference(a, b, p)), n


@pytest.mark.parametrize("design", ["fp16,chained", "bf16,acc=f32"])
def test_a_half_kernel_with_its_epilogue_and_its_proxy_run_right_on_the_device(design):
    """A half kernel's device check (what a half run's emit stage runs: the exact model, then the
    rounding bound): bias and GELU fused, at N 1, 31, 32, 4096; half proxies timed by the cuda timer
    with 2-byte buffers."""
    from lospmm.devices import device_named
    from lospmm.kernel.cuda import CudaTimer, device_facts
    from lospmm.kernel.design import design_named
    from lospmm.kernel.epilogue import Epilogue
    from lospmm.kernel.numbers import rounded_matrix
    from lospmm.kernel.render import CodegenParams, kernel_source
    from lospmm.search import SearchParams, layer_search, proxy_timings
    from lospmm.stages.compile import compiled_kernel, kernel_options
    from lospmm.stages.prune import random_pruned
    from lospmm.stages.rank import RankParams

    d = design_named(design)
    a, _ = rounded_matrix(random_pruned(130, 200, 0.85, np.random.default_rng(0)), d.dtype)
    epilogue = Epilogue(tuple(np.linspace(-1, 1, 130).tolist()), "gelu")
    search = layer_search(a, 4096, 0.85, device_named("h100"), None,
                          SearchParams(m1s=(4,), design=d, rank=RankParams(use_rank=False)))
    kernel = kernel_source(a, search.tiles[4], 64, CodegenParams(design=d), epilogue)
    compiled = compiled_kernel(kernel, kernel_options(_arch(), 4, design=d))
    assert compiled.status == "ok", compiled.log[-500:]
    timer = CudaTimer(device_named("h100"), device_facts()["name"])
    for n in (1, 31, 32, 4096):
        result = timer.checked(kernel.spec, compiled.cubin, a, n)
        assert result.ok and result.metric == "normalised_error", (n, result.message)
    timings = proxy_timings(search, 130, 200, 4096, timer)
    assert timings and all(0 < t.time_us < 1e4 for t in timings.values())


@pytest.mark.parametrize("design", ["streamed", "streamed,chained,v=4,walks=2"])
def test_a_streamed_proxy_is_timed_on_the_device(design):
    """The streamed design's proxy (its loop over the clusters' columns) launched by the cuda timer
    with its cluster map, as the time stage of a `--design streamed` run launches it."""
    from lospmm.devices import device_named
    from lospmm.kernel.cuda import CudaTimer, device_facts
    from lospmm.kernel.design import design_named
    from lospmm.search import SearchParams, layer_search, proxy_timings
    from lospmm.stages.prune import random_pruned
    from lospmm.stages.rank import RankParams

    a = random_pruned(130, 200, 0.85, np.random.default_rng(0))
    search = layer_search(a, 4096, 0.85, device_named("h100"), None,
                          SearchParams(m1s=(4, 8), design=design_named(design), rank=RankParams(use_rank=False)))
    timings = proxy_timings(search, 130, 200, 4096, CudaTimer(device_named("h100"), device_facts()["name"]))
    assert timings and all(0 < t.time_us < 1e4 and t.status == "ok" for t in timings.values())


def test_a_kernel_loaded_on_one_thread_runs_and_is_timed_on_another(tmp_path):
    """Prefect runs tasks in worker threads, and a CUDA context is current per thread: a kernel
    loaded here must launch from a thread that has never touched CUDA."""
    from concurrent.futures import ThreadPoolExecutor

    a, package = _package(tmp_path)
    kernel = package.on("cuda")
    b = np.random.default_rng(5).standard_normal((64, 50)).astype(np.float32)
    with ThreadPoolExecutor(1) as pool:
        c = pool.submit(kernel.run, b).result()
        t = pool.submit(kernel.time, 1000).result()
    np.testing.assert_allclose(c, a @ b, rtol=1e-4, atol=1e-4)
    assert t.status == "ok" and 0 < t.time_us < 1e4, t.message


def test_cuda_timer_measures_and_checks(tmp_path):
    from lospmm.devices import device_named
    from lospmm.kernel.cuda import CudaTimer, device_facts
    from lospmm.kernel.timing import LaunchUnderTest
    from lospmm.stages.reorder import reordered_tiles

    a, package = _package(tmp_path)
    timer = CudaTimer(device_named("h100"), device_facts()["name"])
    launch = LaunchUnderTest(reordered_tiles(a, 8), 96, 64, 4096, 64, package.facts["compile"]["registers"],
                             spec=package.spec, cubin=package.cubin())
    t = timer.time(launch)
    assert t.timer == "cuda" and t.status == "ok" and 0 < t.time_us < 1e4 and t.repeats == 20
    result = timer.checked(package.spec, package.cubin(), a, 77)
    assert result.ok and result.error < 1e-5 and timer.measures and timer.runs_binary


def test_loader_on_torch_or_cupy(tmp_path):
    from lospmm.loader import load_kernel

    a, package = _package(tmp_path)
    spmm = load_kernel(package.dir)
    b = np.random.default_rng(1).standard_normal((64, 130)).astype(np.float32)
    try:
        import torch

        c = spmm(torch.from_numpy(b).cuda()).cpu().numpy()
    except ImportError:
        cupy = pytest.importorskip("cupy")
        c = cupy.asnumpy(spmm(cupy.asarray(b)))
    np.testing.assert_allclose(c, a @ b, rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("design", ["baseline", "column-x,walks=3", "streamed", "streamed,column-x,walks=3",
                                    "staged,tiles=4", "v=2", "v=4,walks=2", "streamed,v=4", "streamed,v=2,walks=3"])
def test_an_implicit_im2col_conv_kernel_matches_the_reference_convolution_on_the_device(tmp_path, design):
    from lospmm.kernel.epilogue import Epilogue
    from lospmm.kernel.geometry import ConvGeometry
    from lospmm.loader import load_kernel
    from lospmm.stages.prune import random_pruned

    g = ConvGeometry(cin=5, h=11, w=9, kh=3, kw=3, stride=2, pad=1)
    a = random_pruned(12, g.k, 0.7, np.random.default_rng(3))
    bias = tuple(float(v) for v in np.linspace(-1, 1, 12))
    a, package = _package(tmp_path, m1=4, n1=32, conv=g, epilogue=Epilogue(bias, "relu"), a=a, design=design)
    _device_checked(package, a, (1, 3))  # batches (a looped kernel walks 2 column blocks at batch 3)
    torch = pytest.importorskip("torch")
    x = torch.randn(2, 5, 11, 9, device="cuda")
    weight = torch.from_numpy(a.toarray().reshape(12, 5, 3, 3)).float().cuda()
    want = torch.relu(torch.nn.functional.conv2d(x, weight, torch.tensor(bias, device="cuda").float(), 2, 1))
    torch.testing.assert_close(load_kernel(package.dir)(x), want, rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("design", ["fp16", "bf16,acc=f32", "fp16,promote=4"])
def test_a_tiled_half_conv_kernel_is_its_exact_model_on_the_device(tmp_path, design):
    """A tiled half design's implicit-im2col kernel (its pair two output pixels n1 apart, each lane's 16-bit
    input its own predicated load and pack, its half of the pair stored to its pixel): the device's Y is
    the exact model's of A · im2col(X) bit for bit (the check), at batches 1, 3 and 7 (lanes past the last
    pixel), through a bias and ReLU; the loader serves it on torch tensors."""
    from lospmm.kernel.design import design_named
    from lospmm.kernel.epilogue import Epilogue
    from lospmm.kernel.geometry import ConvGeometry
    from lospmm.kernel.numbers import rounded_matrix
    from lospmm.loader import load_kernel
    from lospmm.stages.prune import random_pruned

    d = design_named(design)
    g = ConvGeometry(cin=6, h=13, w=11, kh=3, kw=3, stride=2, pad=1)
    a = rounded_matrix(random_pruned(20, g.k, 0.7, np.random.default_rng(4)), d.dtype)[0]
    bias = tuple(float(v) for v in np.linspace(-1, 1, 20).astype(np.float32))
    a, package = _package(tmp_path, m1=4, n1=32, conv=g, epilogue=Epilogue(bias, "relu"), a=a, design=design)
    assert package.spec.form == "conv" and package.spec.design == d
    _device_checked(package, a, (1, 3, 7))
    torch = pytest.importorskip("torch")
    kind = {"fp16": torch.float16, "bf16": torch.bfloat16}[d.dtype]
    x = torch.randn(3, 6, 13, 11, device="cuda").to(kind)
    weight = torch.from_numpy(a.toarray().reshape(20, 6, 3, 3)).float().cuda()
    want = torch.relu(torch.nn.functional.conv2d(x.float(), weight, torch.tensor(bias, device="cuda"), 2, 1))
    got = load_kernel(package.dir)(x)
    assert got.dtype == kind
    torch.testing.assert_close(got.float(), want, rtol=0.1, atol=0.1)


@pytest.mark.parametrize("design", ["nm,fp16", "nm,bf16,acc=f32"])
def test_the_half_implicit_conv_nm_kernel_is_its_exact_model_on_the_device(tmp_path, design):
    """The N:M conv kernel in fp16/bf16: its 16-bit gathers (loads and stores, zero in the padding and past
    the last pixel), its NCHW half stores through a bias and ReLU: the device's Y is the exact model's of
    A · im2col(X) bit for bit (the check), at batches 1, 3 and 7, and the loader serves it on torch tensors."""
    from lospmm.flows.kernels import emitted_kernel
    from lospmm.kernel.design import design_named
    from lospmm.kernel.epilogue import Epilogue
    from lospmm.kernel.geometry import ConvGeometry
    from lospmm.kernel.nm import NMTiling
    from lospmm.kernel.numbers import rounded_matrix
    from lospmm.kernel.package import read_package
    from lospmm.loader import load_kernel
    from lospmm.stages.prune import NMPattern, random_nm_pruned

    d = design_named(design)
    g = ConvGeometry(cin=32, h=13, w=11, kh=3, kw=3, stride=2, pad=1)
    a = random_nm_pruned(72, g.k, NMPattern(8, 32, 8), np.random.default_rng(5))
    bias = tuple(float(v) for v in np.linspace(-1, 1, 72).astype(np.float32))
    facts = emitted_kernel(str(tmp_path), a, None, "conv-nm", 0.75, 0, _arch(), tmp_path / "k", verify=False, conv=g,
                           design=d, epilogue=Epilogue(bias, "relu"), nm=NMTiling(8, 32, 8, 64, 128, 8, 8))
    assert facts["compile"]["status"] == "ok", facts["compile"]
    package = read_package(tmp_path / "k", ("kernel.json", "kernel.cubin"))
    _device_checked(package, rounded_matrix(a, d.dtype)[0], (1, 3, 7))
    torch = pytest.importorskip("torch")
    kind = {"fp16": torch.float16, "bf16": torch.bfloat16}[d.dtype]
    x = torch.randn(3, 32, 13, 11, device="cuda").to(kind)
    weight = torch.from_numpy(rounded_matrix(a, d.dtype)[0].toarray().reshape(72, 32, 3, 3)).float().cuda()
    want = torch.relu(torch.nn.functional.conv2d(x.float(), weight, torch.tensor(bias, device="cuda"), 2, 1))
    got = load_kernel(package.dir)(x)
    assert got.dtype == kind
    torch.testing.assert_close(got.float(), want, rtol=0.1, atol=0.1)


@pytest.mark.parametrize("pattern,blocking", [((2, 4, 1), (16, 64, 4, 4)), ((8, 32, 8), (64, 128, 8, 8))])
def test_the_implicit_conv_nm_kernel_matches_the_reference_convolution_on_the_device(tmp_path, pattern, blocking):
    """The N:M kernel's conv form: its 4-byte cp.async gathers with zero fill (padding, past the last
    pixel, past K) run only here (the host copies at once); batches 1, 3 and 7 (a partial block of
    pixels), against torch's conv2d with the bias and ReLU."""
    from lospmm.flows.kernels import emitted_kernel
    from lospmm.kernel.choices import NM_DESIGN
    from lospmm.kernel.epilogue import Epilogue
    from lospmm.kernel.geometry import ConvGeometry
    from lospmm.kernel.nm import NMTiling
    from lospmm.kernel.package import read_package
    from lospmm.loader import load_kernel
    from lospmm.stages.prune import NMPattern, random_nm_pruned

    g = ConvGeometry(cin=32, h=13, w=11, kh=3, kw=3, stride=2, pad=1)
    a = random_nm_pruned(72, g.k, NMPattern(*pattern), np.random.default_rng(5))
    bias = tuple(float(v) for v in np.linspace(-1, 1, 72))
    facts = emitted_kernel(str(tmp_path), a, None, "conv-nm", 1 - pattern[0] / pattern[1], 0, _arch(), tmp_path / "k",
                           verify=False, conv=g, design=NM_DESIGN, epilogue=Epilogue(bias, "relu"),
                           nm=NMTiling(*pattern, *blocking))
    assert facts["compile"]["status"] == "ok", facts["compile"]
    package = read_package(tmp_path / "k", ("kernel.json", "kernel.cubin"))
    _device_checked(package, a, (1, 3, 7))
    torch = pytest.importorskip("torch")
    x = torch.randn(3, 32, 13, 11, device="cuda")
    weight = torch.from_numpy(a.toarray().reshape(72, 32, 3, 3)).float().cuda()
    want = torch.relu(torch.nn.functional.conv2d(x, weight, torch.tensor(bias, device="cuda").float(), 2, 1))
    torch.testing.assert_close(load_kernel(package.dir)(x), want, rtol=1e-4, atol=1e-4)


@pytest.mark.usefixtures("prefect_server")
def test_whole_search_with_the_cuda_timer(tmp_path):
    """The default timer on a GPU host is cuda: proxies and the emitted kernel are measured, the
    kernel is checked on the device, and the speedup over cuBLAS is reported when torch is present."""
    import pyarrow.parquet as pq
    from safetensors.numpy import save_file

    from lospmm.flows import pipeline as pl
    from lospmm.flows.storage.runs import run_record

    rng = np.random.default_rng(0)
    weights = tmp_path / "w.safetensors"
    save_file({"fc.weight": rng.standard_normal((256, 192)).astype(np.float32)}, str(weights))
    gpu = {"sm_90": "h100", "sm_80": "a100", "sm_70": "v100", "sm_75": "2080ti"}.get(_arch(), "h100")
    cfg = {"zoo": [], "weights": str(weights), "tokens": 2048, "sparsities": [0.9], "artifacts": str(tmp_path / "a"),
           "m1s": [2, 8], "until": "emit", "timer": "auto", "top_k": 4, "gpu": gpu}
    result = pl.pipeline(config=cfg)
    record = run_record(tmp_path / "a", result["run_id"])
    assert result["status"] == "completed"
    paths = {e["stage"]: tmp_path / "a" / e["path"] for e in record["entries"]}
    timed = pq.read_table(paths["time"]).to_pylist()
    assert timed and all(r["timer"] == "cuda" and r["status"] == "ok" and r["time_us"] > 0 for r in timed)
    (em,) = pq.read_table(paths["emit"]).to_pylist()
    assert em["status"] == "ok" and em["check"] == "device" and em["max_rel_error"] < 1e-4
    assert em["full_time_us"] > 0
    try:
        import torch  # noqa: F401
    except ImportError:
        assert np.isnan(em["dense_time_us"])
    else:
        assert em["dense_time_us"] > 0
        assert em["speedup_vs_dense"] == pytest.approx(em["dense_time_us"] / em["full_time_us"])


def test_the_device_program_checks_and_times_a_bundle_with_its_libraries(tmp_path):
    """benchmarks.measure on this GPU: a GEMM and a conv kernel and a proxy of a small bundle, each
    checked (the GEMM at N 1, 31, 32, 4096 and its own; the conv at batches 1, 3 and its own), timed
    by graph_timed, with SGEMM beside the GEMM and cuDNN beside the conv; and a run cut off at once
    goes on where it stopped."""
    pytest.importorskip("torch")
    import pyarrow.parquet as pq

    from benchmarks import bundle, measure, sets

    jobs = [sets.planned_job(p) for p in sets.conv_plan(batch=2) if p.id in ("conv-0-conv", "conv-0-gemm")] + \
        [j for j in sets.sample_jobs(sets.SampleParams(per_model=1, models=("shufflenetv2",), max_nnz=3000))
         if j.planned.role == "proxy"][:1]
    folder = bundle.build("gpu-test", jobs, tmp_path, threads=4, arch=_arch(), cache=tmp_path / "cache",
                          say=lambda *a: None)
    assert measure.run_bundle(folder, tmp_path / "out", "gpu-test", measure.Deadline.after(0)) == {}
    tables = measure.run_bundle(folder, tmp_path / "out", "gpu-test")
    rows = {r["id"]: r for r in pq.read_table(tables["kernel-speed"]).to_pylist()}
    assert all(r["status"] == "ok" and 0 < r["ours_us"] < 1e5 for r in rows.values()), rows
    conv = next(r for r in rows.values() if r["form"] == "conv")
    assert conv["cudnn_us"] > 0 and next(r for r in rows.values() if r["variant"] == "im2col-gemm")["sgemm_us"] > 0
    checks = pq.read_table(tables["checks"]).to_pylist()
    assert checks and all(c["status"] == "ok" for c in checks)
