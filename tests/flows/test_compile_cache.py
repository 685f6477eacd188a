import numpy as np
import pytest
import scipy.sparse as sp

from lospmm.flows.execution import units
from lospmm.flows.storage import compile_cache as cc
from lospmm.stages import compile as nv


def _small_kernel(seed: int = 0):
    from lospmm.kernel.render import kernel_source as full_kernel_source
    from lospmm.stages.reorder import reordered_tiles

    a = sp.random(16, 12, density=0.3, format="csr", random_state=np.random.default_rng(seed), dtype=np.float32)
    return full_kernel_source(a, reordered_tiles(a, 4), 32)


OPTIONS = nv.kernel_options("sm_90", 4)


def test_a_kernel_is_never_compiled_twice(tmp_path, monkeypatch):
    kernel = _small_kernel()
    first, hit = cc.cached_kernel(tmp_path, kernel, OPTIONS)
    assert not hit and first["status"] == "ok" and first["registers"] > 0 and first["units_compiled"] == first["units"]
    assert (tmp_path / first["paths"]["cubin"]).read_bytes()[:4] == b"\x7fELF"
    monkeypatch.setattr(units, "compiled", lambda *a, **k: pytest.fail("compiled twice"))
    monkeypatch.setattr(cc, "linked", lambda *a, **k: pytest.fail("linked twice"))
    again, hit = cc.cached_kernel(tmp_path, kernel, OPTIONS)
    assert hit and again["key"] == first["key"] and again["sha256"] == first["sha256"]
    assert again["seconds"] == 0.0 and again["units_compiled"] == 0 and again["cost_seconds"] == first["cost_seconds"]


def test_a_complete_kernel_is_served_from_a_read_only_root(tmp_path, monkeypatch):
    kernel = _small_kernel()
    first, _ = cc.cached_kernel(tmp_path, kernel, OPTIONS)

    def no_writes(*a, **k):
        raise OSError(30, "Read-only file system")

    monkeypatch.setattr(cc, "locked", no_writes)  # taking a lock writes a file
    monkeypatch.setattr(cc, "atomic_write", no_writes)
    again, hit = cc.cached_kernel(tmp_path, kernel, OPTIONS)
    assert hit and again["key"] == first["key"]


def test_other_options_or_arch_are_other_entries(tmp_path):
    kernel = _small_kernel()
    a, _ = cc.cached_kernel(tmp_path, kernel, nv.kernel_options("sm_90", 4))
    b, hit = cc.cached_kernel(tmp_path, kernel, nv.kernel_options("sm_80", 4))
    assert not hit and a["key"] != b["key"] and set(a["unit_keys"]).isdisjoint(b["unit_keys"])


def test_a_damaged_entry_is_rebuilt(tmp_path):
    kernel = _small_kernel()
    first, _ = cc.cached_kernel(tmp_path, kernel, OPTIONS)
    cubin = tmp_path / first["paths"]["cubin"]
    cubin.write_bytes(cubin.read_bytes()[:10])
    again, hit = cc.cached_kernel(tmp_path, kernel, OPTIONS)
    assert not hit and cubin.read_bytes()[:4] == b"\x7fELF" and again["units_compiled"] == 0  # relinked only


def test_failures_are_cached_with_their_log(tmp_path):
    import dataclasses

    kernel = _small_kernel()
    broken = dataclasses.replace(kernel, units=(kernel.units[0] + "\nthis is not CUDA\n", *kernel.units[1:]))
    bad, hit = cc.cached_kernel(tmp_path, broken, OPTIONS)
    assert bad["status"] == "error" and "failed" in bad["log"] and not hit
    assert cc.cached_kernel(tmp_path, broken, OPTIONS)[1]


def _compile_in_child(root: str, queue) -> None:
    from lospmm.flows.storage import compile_cache

    result, hit = compile_cache.cached_kernel(root, _slow_kernel(), OPTIONS)
    queue.put((hit, result["key"], result["units_compiled"]))


def _slow_kernel():
    from lospmm.kernel.render import kernel_source as full_kernel_source
    from lospmm.stages.reorder import reordered_tiles

    a = sp.random(64, 256, density=0.3, format="csr", random_state=np.random.default_rng(7), dtype=np.float32)
    return full_kernel_source(a, reordered_tiles(a, 4), 32)


def test_two_processes_build_one_kernel_once(tmp_path):
    import multiprocessing

    mp = multiprocessing.get_context("spawn")
    queue = mp.Queue()
    procs = [mp.Process(target=_compile_in_child, args=(str(tmp_path), queue)) for _ in range(2)]
    for p in procs:
        p.start()
    results = [queue.get(timeout=300) for _ in procs]
    for p in procs:
        p.join(30)
    assert sorted(hit for hit, _, _ in results) == [False, True]  # one built it, the other waited and reused it
    assert len({key for _, key, _ in results}) == 1 and sorted(n for _, _, n in results)[0] == 0


def _sharded(values: np.ndarray, m1: int = 4):
    from lospmm.kernel.render import CodegenParams, kernel_source as full_kernel_source
    from lospmm.stages.reorder import reordered_tiles

    a = sp.csr_matrix(values)
    return full_kernel_source(a, reordered_tiles(a, m1), 32, CodegenParams(shard_nnz=8))


def test_a_kernel_whose_tiles_changed_recompiles_only_their_units(tmp_path, monkeypatch):
    values = sp.random(32, 24, density=0.2, format="csr", random_state=np.random.default_rng(1),
                       dtype=np.float32).toarray()
    kernel = _sharded(values)
    assert len(kernel.units) >= 4
    options = nv.kernel_options("sm_90", 4)
    first, hit = cc.cached_kernel(tmp_path, kernel, options, units.threads(2))
    assert not hit and first["status"] == "ok" and first["units_compiled"] == first["units"] == len(kernel.units)
    assert (tmp_path / first["paths"]["cubin"]).read_bytes()[:4] == b"\x7fELF"
    regs = nv.entry_registers((tmp_path / first["paths"]["cubin"]).read_bytes())
    assert first["registers"] == regs[kernel.name] == max(regs.values())  # the entry's: the most any tile uses
    again, hit = cc.cached_kernel(tmp_path, kernel, options)
    assert hit and again["key"] == first["key"] and again["units_compiled"] == 0

    changed = values.copy()
    row = int(np.flatnonzero(changed.any(axis=1))[-1])  # one value of one row: one tile's unit
    changed[row, np.flatnonzero(changed[row])[0]] += 1.0
    other = _sharded(changed)
    differ = [i for i, (u, v) in enumerate(zip(kernel.units, other.units)) if u != v]
    assert len(differ) == 2  # that tile's unit, and the entry (whose name is the kernel's content hash)
    compiled_now = []
    real = units.compiled
    monkeypatch.setattr(units, "compiled", lambda src, name, opts: compiled_now.append(name) or real(src, name, opts))
    result, hit = cc.cached_kernel(tmp_path, other, options)
    assert not hit and result["status"] == "ok" and result["units_compiled"] == 2 and len(compiled_now) == 2
    assert result["key"] != first["key"]


def test_a_unit_that_fails_fails_the_kernel_with_its_log(tmp_path):
    import dataclasses

    kernel = _sharded(np.eye(8, dtype=np.float32))
    broken = dataclasses.replace(kernel, units=(kernel.units[0] + "\nthis is not CUDA\n", *kernel.units[1:]))
    result, hit = cc.cached_kernel(tmp_path, broken, nv.kernel_options("sm_90", 4))
    assert result["status"] == "error" and "unit 0 of" in result["log"] and "this is not CUDA" in result["log"]
    with pytest.raises(ValueError, match="relocatable"):
        cc.cached_kernel(tmp_path, kernel, nv.CompileOptions())


def test_a_compile_killed_midway_resumes_unit_by_unit(tmp_path):
    kernel = _sharded(sp.random(32, 24, density=0.3, format="csr", random_state=np.random.default_rng(2),
                                dtype=np.float32).toarray())
    options = nv.kernel_options("sm_90", 4)

    class Killed(BaseException):
        pass

    def dies_after_two(batch, landed):
        for i, job in enumerate(batch[:2]):
            landed(i, units.compiled_unit(*job))
        raise Killed

    with pytest.raises(Killed):
        cc.cached_kernel(tmp_path, kernel, options, dies_after_two)
    result, hit = cc.cached_kernel(tmp_path, kernel, options)
    assert not hit and result["status"] == "ok"
    assert result["units_compiled"] == len(kernel.units) - 2  # the two that landed were kept


def test_an_entry_of_an_older_format_is_rebuilt_not_read_with_defaults(tmp_path):
    import json

    kernel = _sharded(np.eye(8, dtype=np.float32))
    options = nv.kernel_options("sm_90", 4)
    first, _ = cc.cached_kernel(tmp_path, kernel, options)
    for result in (tmp_path / "compile-cache").glob("*/*/result.json"):  # as the format before thread_spill_bytes
        old = json.loads(result.read_text())
        old.pop("format")
        old.pop("thread_spill_bytes")
        result.write_text(json.dumps(old))
    again, hit = cc.cached_kernel(tmp_path, kernel, options)
    assert not hit and again["units_compiled"] == len(kernel.units) and "thread_spill_bytes" in again


def test_a_unit_cubin_changed_after_its_check_is_not_linked(tmp_path, monkeypatch):
    kernel = _sharded(np.eye(8, dtype=np.float32))
    options = nv.kernel_options("sm_90", 4)
    real = cc._valid

    def then_damaged(d, files):  # the unit is found whole, then its cubin changes before the link reads it
        result = real(d, files)
        if result is not None and files is cc.FILES:
            cubin = d / "kernel.cubin"
            data = bytearray(cubin.read_bytes())
            data[100] ^= 0xFF
            cubin.write_bytes(bytes(data))
        return result

    cc.cached_kernel(tmp_path, kernel, options)
    for link in (tmp_path / "compile-cache").glob("*/*/result.json"):
        if "unit_keys" in link.read_text():
            link.unlink()  # the link must be built again, from the units
    monkeypatch.setattr(cc, "_valid", then_damaged)
    with pytest.raises(OSError, match="changed since it was checked"):
        cc.cached_kernel(tmp_path, kernel, options)


def test_a_log_line_gives_a_compiles_wall_time_and_names_the_unit_seconds_as_a_sum():
    """27 units on parallel jobs: 207.6 s of compiler time summed in a 150 s compile (issue 22: a log line
    said "compile ok in 207.6 s … 162.2 s in all")."""
    parallel = {"status": "ok", "seconds": 207.6, "wall_seconds": 150.04, "units_compiled": 27}
    assert cc.compile_summary(parallel, False) == ("ok in 150.0 s (207.6 s of compiler time summed over 27 units "
                                                   "compiled side by side, and the link)")
    assert cc.compile_summary({**parallel, "units_compiled": 1, "seconds": 3.0, "wall_seconds": 3.1}, False) == "ok in 3.1 s"
    assert cc.compile_summary({**parallel, "seconds": 0.0, "wall_seconds": 0.02}, True) == \
        "ok from the compile cache in 0.0 s"
    assert cc.compile_summary({**parallel, "units_compiled": 0, "seconds": 0.4, "wall_seconds": 0.5}, False) == \
        "ok in 0.5 s (its units from the compile cache, linked now)"


def test_a_compiles_wall_time_is_measured_around_all_its_units(tmp_path):
    kernel = _small_kernel(3)
    result, hit = cc.cached_kernel(tmp_path, kernel, OPTIONS, units.threads(2))
    assert not hit and result["units_compiled"] == result["units"]
    # the wall time spans every unit and the link, whichever thread compiled them
    assert result["wall_seconds"] >= max(result["unit_seconds"]) + result["link_seconds"]
    assert cc.compile_summary(result, hit).startswith(f"ok in {result['wall_seconds']:.1f} s")
