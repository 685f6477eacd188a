"""Tests that need a CUDA device (marked `gpu`, skipped without one): the cuda timer, device checks
of an emitted kernel, and the loader on CuPy/torch arrays."""

from __future__ import annotations

import numpy as np
import pytest

from lospmm.runtime import gpu_present
from lospmm.stages.codegen import LaunchLayout

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not gpu_present(), reason="no CUDA device")]


def _kernel(tmp_path, m=96, k=64, sparsity=0.8, m1=8, n1=64, design="baseline"):
    from lospmm.flows.kernels import emitted_kernel
    from lospmm.runtime import device_facts
    from lospmm.stages.codegen import design_named
    from lospmm.stages.prune import random_pruned
    from lospmm.stages.reorder import reordered_tiles

    a = random_pruned(m, k, sparsity, np.random.default_rng(0))
    arch = device_facts()["arch"]
    out = tmp_path / design.replace(",", "_").replace("=", "")
    facts = emitted_kernel(str(tmp_path), a, reordered_tiles(a, m1), "test", sparsity, n1, arch, out, verify=False,
                           design=design_named(design))
    return a, facts, out


def test_emitted_kernel_matches_scipy_on_the_device(tmp_path):
    from lospmm.runtime import check_full_kernel

    a, facts, d = _kernel(tmp_path)
    for n in (1, 63, 64, 200):
        err = check_full_kernel((d / "kernel.cubin").read_bytes(), facts["kernel"], LaunchLayout.of_facts(facts), a, n=n)
        assert err < 1e-5


@pytest.mark.parametrize("design", ["chained", "chained,column-x", "chained,walks=3", "chained,v=2", "chained,v=4",
                                    "based,v=4,walks=2,column-x", "streamed", "streamed,chained,v=4,walks=2"])
def test_every_kernel_design_matches_scipy_on_the_device(tmp_path, design):
    """Each design's inline PTX (vector and chained loads, vector stores) runs only here: N of 1, 31
    and 32 (padded to the design's column multiple), 4096 and an odd N, C poisoned with NaN."""
    from lospmm.loader import load_kernel
    from lospmm.runtime import check_full_kernel

    a, facts, d = _kernel(tmp_path, m=130, k=200, sparsity=0.85, m1=4, n1=64, design=design)
    assert facts["compile"]["status"] == "ok", facts["compile"]
    for n in (1, 31, 32, 4096, 333):
        assert check_full_kernel((d / "kernel.cubin").read_bytes(), facts["kernel"], LaunchLayout.of_facts(facts), a,
                                 n=n, seed=n) < 1e-5, n
    torch = pytest.importorskip("torch")
    b = torch.randn(200, 77, device="cuda")
    np.testing.assert_allclose(load_kernel(d)(b).cpu().numpy(), a @ b.cpu().numpy(), rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("design", ["baseline", "chained,v=2"])
def test_a_fused_bias_and_gelu_match_the_reference_on_the_device(tmp_path, design):
    """The epilogue's device code (erff, make_float2) runs only here; the loader serves it too."""
    from lospmm.flows.kernels import emitted_kernel
    from lospmm.loader import load_kernel
    from lospmm.runtime import check_full_kernel, device_facts
    from lospmm.stages.codegen import Epilogue, design_named
    from lospmm.stages.prune import random_pruned
    from lospmm.stages.reorder import reordered_tiles

    a = random_pruned(130, 200, 0.85, np.random.default_rng(0))
    a = a.tolil()
    a[7, :] = 0  # an empty row: stores gelu(bias) alone
    a = a.tocsr()
    epilogue = Epilogue(tuple(np.random.default_rng(1).standard_normal(130).astype(np.float32).tolist()), "gelu")
    d = tmp_path / "fused"
    facts = emitted_kernel(str(tmp_path), a, reordered_tiles(a, 4), "fused", 0.85, 64, device_facts()["arch"], d,
                           verify=False, design=design_named(design), epilogue=epilogue)
    assert facts["compile"]["status"] == "ok", facts["compile"]
    for n in (1, 32, 333):
        assert check_full_kernel((d / "kernel.cubin").read_bytes(), facts["kernel"], LaunchLayout.of_facts(facts), a,
                                 n=n, seed=n, epilogue=epilogue) < 1e-5, n
    torch = pytest.importorskip("torch")
    b = torch.randn(200, 77, device="cuda")
    want = epilogue.reference(a @ b.cpu().numpy().astype(np.float64))
    np.testing.assert_allclose(load_kernel(d)(b).cpu().numpy(), want, rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("precision,loads", [(("fp16", "packed", 0), "based"), (("bf16", "packed", 0), "chained"),
                                             (("fp16", "f32", 0), "chained"), (("bf16", "packed", 4), "based")])
def test_a_half_kernel_computes_on_the_device_what_the_host_emulation_computes(precision, loads):
    """fma.rn.f16x2 / .bf16x2, cvt.rn and the packed loads and stores run only here: the device's C
    is the host emulation's bit for bit (packed: also the numpy reference's), at N 1, 32 and 333."""
    from lospmm.hostemu import half_gemm_on_host
    from lospmm.runtime import device_facts, half_gemm_on_device
    from lospmm.stages.codegen import CodegenParams, design_named
    from lospmm.stages.codegen_half import (Precision, half_kernel_source, packed_reference, rounded_matrix,
                                            to_dtype_bits)
    from lospmm.stages.compile import compiled_kernel, kernel_options
    from lospmm.stages.prune import random_pruned
    from lospmm.stages.reorder import reordered_tiles

    p = Precision(*precision)
    a, _ = rounded_matrix(random_pruned(130, 200, 0.85, np.random.default_rng(0)), p.dtype)
    kernel = half_kernel_source(a, reordered_tiles(a, 4), 64, p, CodegenParams(design=design_named(loads)))
    compiled = compiled_kernel(kernel, kernel_options(device_facts()["arch"], 4, design=kernel.design))
    assert compiled.status == "ok", compiled.log[-500:]
    for n in (1, 32, 333):
        b = to_dtype_bits(np.random.default_rng(n).standard_normal((200, n)), p.dtype)
        on_device = half_gemm_on_device(compiled.cubin, kernel.name, kernel.layout, 130, b)
        assert np.array_equal(on_device, half_gemm_on_host(kernel, b)), n
        if p.accumulate == "packed" and not p.promote_every:
            assert np.array_equal(on_device, packed_reference(a, b, p.dtype)), n


@pytest.mark.parametrize("design", ["fp16,chained", "bf16,acc=f32"])
def test_a_half_kernel_with_its_epilogue_and_its_proxy_run_right_on_the_device(design):
    """The device check of a half kernel (runtime.check_half_kernel, what a half run's emit stage
    runs): bias and GELU fused, within the rounding bound at N 1, 31, 32, 4096; a half proxy and the
    full kernel timed by the cuda timer with 2-byte buffers."""
    from lospmm.runtime import CudaTimer, check_half_kernel, device_facts
    from lospmm.stages.codegen import CodegenParams, Epilogue, design_named
    from lospmm.stages.codegen_half import error_bound, precision_of, rounded_matrix
    from lospmm.stages.compile import compiled_kernel, kernel_options
    from lospmm.stages.devices import device_named
    from lospmm.stages.prune import random_pruned
    from lospmm.stages.rank import RankParams
    from lospmm.stages.search import SearchParams, layer_search, proxy_timings
    from lospmm.stages.sources import kernel_source

    d = design_named(design)
    a, _ = rounded_matrix(random_pruned(130, 200, 0.85, np.random.default_rng(0)), d.dtype)
    epilogue = Epilogue(tuple(np.linspace(-1, 1, 130).tolist()), "gelu")
    search = layer_search(a, 4096, 0.85, device_named("h100"), None,
                          SearchParams(m1s=(4,), design=d, rank=RankParams(use_rank=False)))
    kernel = kernel_source(a, search.tiles[4], 64, CodegenParams(design=d), epilogue)
    compiled = compiled_kernel(kernel, kernel_options(device_facts()["arch"], 4, design=d))
    assert compiled.status == "ok", compiled.log[-500:]
    gamma, eta = error_bound(a, precision_of(d))
    for n in (1, 31, 32, 4096):
        assert check_half_kernel(compiled.cubin, kernel.name, kernel.layout, a, n, precision_of(d), eta, n,
                                 epilogue) <= gamma, n
    timer = CudaTimer(device_named("h100"), device_facts()["name"])
    timings = proxy_timings(search, 130, 200, 4096, timer)
    assert timings and all(0 < t.time_us < 1e4 for t in timings.values())


def test_a_kernel_loaded_on_one_thread_runs_and_is_timed_on_another(tmp_path):
    """Prefect runs tasks in worker threads, and a CUDA context is current per thread: a kernel
    loaded here must launch from a thread that has never touched CUDA."""
    from concurrent.futures import ThreadPoolExecutor

    from cuda.bindings import driver

    from lospmm.runtime import DeviceBuffer, LoadedKernel, _ck, time_full_kernel_cubin

    a, facts, d = _kernel(tmp_path)
    cubin = (d / "kernel.cubin").read_bytes()
    kernel = LoadedKernel(cubin, facts["kernel"])
    b = np.random.default_rng(5).standard_normal((64, 50)).astype(np.float32)
    bb, cb = DeviceBuffer.of(b), DeviceBuffer.of(np.full((96, 50), np.nan, np.float32))
    with ThreadPoolExecutor(1) as pool:
        layout = LaunchLayout.of_facts(facts)
        pool.submit(kernel.launch, layout.grid(50), layout.block(), [("ptr", bb.ptr), ("ptr", cb.ptr), ("int", 50)]).result()
        t = pool.submit(time_full_kernel_cubin, cubin, facts["kernel"], layout, 96, 64, 1000).result()
    _ck(driver.cuCtxSynchronize(), "sync")
    c = cb.to_host(np.float32, 96 * 50).reshape(96, 50)
    np.testing.assert_allclose(c, a @ b, rtol=1e-4, atol=1e-4)
    assert t.status == "ok" and 0 < t.time_us < 1e4, t.message


def test_cuda_timer_measures(tmp_path):
    from lospmm.runtime import CudaTimer, device_facts
    from lospmm.stages.devices import device_named
    from lospmm.stages.reorder import reordered_tiles
    from lospmm.stages.timing import LaunchUnderTest

    a, facts, d = _kernel(tmp_path)
    timer = CudaTimer(device_named("h100"), device_facts()["name"])
    launch = LaunchUnderTest(reordered_tiles(a, 8), 96, 64, 4096, 64, facts["compile"]["registers"],
                             kernel=facts["kernel"], layout=LaunchLayout.of_facts(facts),
                             cubin=(d / "kernel.cubin").read_bytes())
    t = timer.time(launch)
    assert t.timer == "cuda" and t.status == "ok" and 0 < t.time_us < 1e4 and t.repeats == 20
    assert timer.device_error(launch, a, 77) < 1e-5 and timer.measures and timer.runs_binary


def test_loader_on_torch_or_cupy(tmp_path):
    from lospmm.loader import load_kernel

    a, facts, d = _kernel(tmp_path)
    spmm = load_kernel(d)
    b = np.random.default_rng(1).standard_normal((64, 130)).astype(np.float32)
    try:
        import torch

        c = spmm(torch.from_numpy(b).cuda()).cpu().numpy()
    except ImportError:
        cupy = pytest.importorskip("cupy")
        c = cupy.asnumpy(spmm(cupy.asarray(b)))
    np.testing.assert_allclose(c, a @ b, rtol=1e-4, atol=1e-4)


@pytest.mark.usefixtures("prefect_server")
def test_whole_search_with_the_cuda_timer(tmp_path):
    """The default timer on a GPU host is cuda: proxies and the emitted kernel are measured, the
    kernel is checked on the device, and the speedup over cuBLAS is reported when torch is present."""
    import pyarrow.parquet as pq
    from safetensors.numpy import save_file

    from lospmm.flows import pipeline as pl
    from lospmm.flows.storage.runs import run_record
    from lospmm.runtime import device_facts

    rng = np.random.default_rng(0)
    weights = tmp_path / "w.safetensors"
    save_file({"fc.weight": rng.standard_normal((256, 192)).astype(np.float32)}, str(weights))
    gpu = {"sm_90": "h100", "sm_80": "a100", "sm_70": "v100", "sm_75": "2080ti"}.get(device_facts()["arch"], "h100")
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


def test_the_gpu_plans_device_check_and_speedup_steps_run_an_emitted_kernel(tmp_path):
    import json


    from benchmarks import gpuplan

    a, facts, d = _kernel(tmp_path)
    gpuplan.write_matrix(d / "a.parquet", a)
    row = {"model": "test", "layer": "fc", "m": 96, "k": 64, "n": 300, "nnz": int(a.nnz), "m1": 8, "n1": 64,
           "sparsity": 0.8, "full_time_us": 1.0, "path": str(d)}
    checks = gpuplan.device_check_rows([row])
    assert sorted(r["n"] for r in checks) == [1, 31, 32, 300, 4096]
    assert all(r["status"] == "ok" and r["max_rel_error"] < 1e-5 for r in checks), json.dumps(checks, default=str)
    (speed,) = gpuplan.speedup_rows([row], repeats=5)
    assert 0 < speed["ours_us"] < 1e4 and speed["ours_status"] == "ok" and speed["cublas_fp32_us"] > 0


def test_the_gpu_plans_steps_launch_an_emitted_conv_kernel_as_a_convolution(tmp_path):
    """A run now emits implicit-im2col kernels for convolutions: the plan's check, loader and speedup
    steps must launch them with an NCHW X, not as a GEMM on B."""
    import json

    from benchmarks import gpuplan
    from lospmm.flows.kernels import emitted_kernel
    from lospmm.runtime import device_facts
    from lospmm.stages.codegen import ConvGeometry
    from lospmm.stages.prune import random_pruned
    from lospmm.stages.reorder import reordered_tiles

    g = ConvGeometry(cin=8, h=14, w=14, kh=3, kw=3, stride=2, pad=1)
    a = random_pruned(32, g.k, 0.8, np.random.default_rng(1))
    d = tmp_path / "conv"
    emitted_kernel(str(tmp_path), a, reordered_tiles(a, 4), "conv", 0.8, 64, device_facts()["arch"], d,
                   verify=False, conv=g)
    gpuplan.write_matrix(d / "a.parquet", a)
    row = {"model": "test", "layer": "conv", "m": 32, "k": g.k, "n": g.n(4), "nnz": int(a.nnz), "m1": 4, "n1": 64,
           "sparsity": 0.8, "full_time_us": 1.0, "path": str(d)}
    checks = gpuplan.device_check_rows([row])
    assert sorted(r["n"] for r in checks) == [g.n(1), g.n(3), g.n(4)]
    assert all(r["status"] == "ok" and r["form"] == "implicit-conv" for r in checks), json.dumps(checks, default=str)
    (loaded,) = gpuplan.loader_rows([row])
    assert loaded["torch_max_rel_error"] < 1e-5, loaded
    (speed,) = gpuplan.speedup_rows([row], repeats=5)
    assert speed["ours_status"] == "ok" and speed["cudnn_fp32_us"] > 0 and speed["form"] == "implicit-conv"


def test_an_implicit_im2col_conv_kernel_matches_the_reference_convolution_on_the_device():
    from lospmm.runtime import check_conv_kernel, device_facts
    from lospmm.stages.codegen import ConvGeometry, Epilogue, conv_kernel_source
    from lospmm.stages.compile import compiled_kernel, kernel_options
    from lospmm.stages.prune import random_pruned
    from lospmm.stages.reorder import reordered_tiles

    g = ConvGeometry(cin=5, h=11, w=9, kh=3, kw=3, stride=2, pad=1)
    a = random_pruned(12, g.k, 0.7, np.random.default_rng(3))
    bias = tuple(float(v) for v in np.linspace(-1, 1, 12))
    src = conv_kernel_source(a, reordered_tiles(a, 4), 32, g, Epilogue(bias, "relu"))
    c = compiled_kernel(src, kernel_options(device_facts()["arch"], 4))
    for batch in (1, 3):
        assert check_conv_kernel(c.cubin, src.name, src.layout, a, g, Epilogue(bias, "relu"), batch=batch, seed=batch) < 1e-5
