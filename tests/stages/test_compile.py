"""NVRTC compilation without a GPU: cubin, PTX and ptxas's resource report."""

import numpy as np
import pytest
import scipy.sparse as sp

from lospmm.stages import compile as nv
from lospmm.kernel.render import CodegenParams, kernel_source as full_kernel_source
from lospmm.stages.reorder import reordered_tiles



def _kernel(m1=4):
    a = sp.random(16, 24, density=0.3, format="csr", random_state=np.random.default_rng(0), dtype=np.float32)
    return full_kernel_source(a, reordered_tiles(a, m1), 64)


def test_compiles_to_cubin_and_ptx_with_a_resource_report():
    k = _kernel()
    out = nv.compiled(k.source, k.name, nv.CompileOptions(arch="sm_90"))
    assert out.status == "ok", out.log
    assert out.cubin[:4] == b"\x7fELF" and b".target sm_90" in out.ptx
    assert out.registers > 0 and out.spill_stores == 0
    assert f"Compiling entry function '{k.name}'" in out.log


def test_maxrregcount_is_honoured():
    k = _kernel(m1=16)
    out = nv.compiled(k.source, k.name, nv.CompileOptions(arch="sm_80", maxrregcount=32))
    assert out.status == "ok" and out.registers <= 32


def test_a_compile_failure_is_a_result_with_its_log():
    out = nv.compiled('extern "C" __global__ void k() { undeclared(); }', "broken", nv.CompileOptions())
    assert out.status == "error" and "undeclared" in out.log and out.cubin == b""


def test_options_are_explicit_and_checked():
    assert "--gpu-architecture=sm_75" in nv.CompileOptions(arch="sm_75").as_list()
    with pytest.raises(ValueError, match="arch"):
        nv.CompileOptions(arch="hopper").as_list()
    with pytest.raises(ValueError, match="Ofast-compile"):
        nv.CompileOptions(extra=("--Ofast-compile=max",)).as_list()


def test_compile_key_covers_source_options_and_arch():
    k = _kernel()
    base = nv.compile_key(k.source, nv.CompileOptions(), "13.5")
    assert base == nv.compile_key(k.source, nv.CompileOptions(), "13.5")
    assert base != nv.compile_key(k.source + " ", nv.CompileOptions(), "13.5")
    assert base != nv.compile_key(k.source, nv.CompileOptions(arch="sm_80"), "13.5")
    assert base != nv.compile_key(k.source, nv.CompileOptions(maxrregcount=40), "13.5")
    assert base != nv.compile_key(k.source, nv.CompileOptions(), "13.6")


def test_resource_usage_parses_ptxas_verbose_output():
    log = ("ptxas info    : Function properties for k\nptxas         .     8 bytes stack frame, 12 bytes spill "
           "stores, 16 bytes spill loads\nptxas info    : Used 40 registers, used 0 barriers, 1024 bytes smem\n"
           "ptxas info    : Function properties for tile_1\nptxas         .     8 bytes stack frame, 20 bytes spill "
           "stores, 4 bytes spill loads\n")
    assert nv.resource_usage(log) == {"registers": 40, "spill_stores": 32, "spill_loads": 20, "stack_bytes": 8,
                                      "smem_bytes": 1024, "thread_spill_bytes": 28}


def test_ptxas_level_is_an_explicit_option():
    assert "-Xptxas=-O1" in nv.CompileOptions().as_list()
    assert "-Xptxas=-O3" in nv.CompileOptions(ptxas_level=3).as_list()
    with pytest.raises(ValueError, match="ptxas_level"):
        nv.CompileOptions(ptxas_level=5).as_list()


def test_units_link_into_one_cubin_within_the_register_prediction():
    from lospmm.stages.constrain import predicted_registers
    from lospmm.stages.prune import random_pruned

    a = random_pruned(64, 768, 0.9, np.random.default_rng(0))
    k = full_kernel_source(a, reordered_tiles(a, 16), 128, CodegenParams(shard_nnz=800))
    assert len(k.units) >= 3
    out = nv.compiled_kernel(k, nv.kernel_options("sm_90", 16))
    assert out.status == "ok", out.log
    assert out.cubin[:4] == b"\x7fELF" and out.ptx == b""
    regs = nv.entry_registers(out.cubin)
    assert set(regs) == {k.name} | {f"tile_{t}" for t in range(k.num_tiles)}
    assert out.registers == regs[k.name] <= predicted_registers(16)


def test_tile_functions_save_no_callee_saved_registers():
    # A tile function never returns: without that, every call saves and restores ~30 callee-saved
    # registers (116 B of spill stores per function at M1 = 32, measured).
    from lospmm.stages.prune import random_pruned

    a = random_pruned(32, 768, 0.9, np.random.default_rng(0))
    k = full_kernel_source(a, reordered_tiles(a, 32), 128)
    out = nv.compiled(k.units[0], k.name, nv.kernel_options("sm_90", 32))
    assert out.status == "ok" and "tile_0" in out.log
    assert out.spill_stores < 64, out.log


def test_a_link_failure_is_a_result_with_its_log():
    k = full_kernel_source(sp.eye(8, format="csr", dtype=np.float32), reordered_tiles(sp.eye(8, format="csr"), 4),
                           32, CodegenParams())
    entry = nv.compiled(k.units[-1], k.name, nv.kernel_options("sm_90", 4))
    assert entry.status == "ok"
    out = nv.linked([entry.cubin], "sm_90", k.name)  # the tile units left out: tile_0 is undefined
    assert out.status == "error" and "tile_0" in out.log and out.cubin == b""


def test_a_cubin_without_the_entry_or_not_elf_is_refused():
    with pytest.raises(ValueError, match="ELF"):
        nv.entry_registers(b"not a cubin at all")
    k = _kernel()
    units = [nv.compiled(u, k.name, nv.kernel_options("sm_90", 4)) for u in k.units]
    out = nv.linked([u.cubin for u in units], "sm_90", "no_such_kernel")
    assert out.status == "error" and "no_such_kernel" in out.log and out.cubin == b""
    assert nv.linked([u.cubin for u in units], "sm_90", k.name).status == "ok"
