import pytest

from lospmm.flows import compile_cache as cc
from lospmm.stages import compile as nv


SRC = 'extern "C" __global__ void k(float* c) { c[threadIdx.x] = 2.0f * threadIdx.x; }\n'


def test_a_kernel_is_never_compiled_twice(tmp_path, monkeypatch):
    first, hit = cc.cached_compile(tmp_path, SRC, "k", nv.CompileOptions())
    assert not hit and first["status"] == "ok" and first["registers"] > 0
    assert (tmp_path / first["paths"]["cubin"]).read_bytes()[:4] == b"\x7fELF"
    monkeypatch.setattr(cc, "compiled", lambda *a, **k: pytest.fail("compiled twice"))
    again, hit = cc.cached_compile(tmp_path, SRC, "k", nv.CompileOptions())
    assert hit and again == first


def test_other_options_or_arch_are_other_entries(tmp_path):
    a, _ = cc.cached_compile(tmp_path, SRC, "k", nv.CompileOptions(arch="sm_90"))
    b, hit = cc.cached_compile(tmp_path, SRC, "k", nv.CompileOptions(arch="sm_80"))
    assert not hit and a["key"] != b["key"]


def test_a_damaged_entry_is_recompiled(tmp_path):
    first, _ = cc.cached_compile(tmp_path, SRC, "k", nv.CompileOptions())
    cubin = tmp_path / first["paths"]["cubin"]
    cubin.write_bytes(cubin.read_bytes()[:10])
    again, hit = cc.cached_compile(tmp_path, SRC, "k", nv.CompileOptions())
    assert not hit and cubin.read_bytes()[:4] == b"\x7fELF"


def test_failures_are_cached_with_their_log(tmp_path):
    bad, hit = cc.cached_compile(tmp_path, "this is not CUDA", "bad", nv.CompileOptions())
    assert bad["status"] == "error" and bad["log"] and not hit
    assert cc.cached_compile(tmp_path, "this is not CUDA", "bad", nv.CompileOptions())[1]


def _compile_in_child(root: str, queue) -> None:
    from lospmm.flows import compile_cache
    from lospmm.stages.compile import CompileOptions

    result, hit = compile_cache.cached_compile(root, _SLOW_SOURCE, "slow", CompileOptions(arch="sm_90"))
    queue.put((hit, result["key"]))


_SLOW_SOURCE = "extern \"C\" __global__ void slow(float* c) {\n" + "".join(
    f"  c[{i}] = c[{i}] * 1.5f + {i}.0f;\n" for i in range(3000)) + "}\n"


def test_two_processes_compile_one_source_once(tmp_path):
    import multiprocessing

    mp = multiprocessing.get_context("spawn")
    queue = mp.Queue()
    procs = [mp.Process(target=_compile_in_child, args=(str(tmp_path), queue)) for _ in range(2)]
    for p in procs:
        p.start()
    results = [queue.get(timeout=120) for _ in procs]
    for p in procs:
        p.join(30)
    assert sorted(hit for hit, _ in results) == [False, True]  # one compiled, the other waited and reused
    assert len({key for _, key in results}) == 1
