"""benchmarks.bundle: the one bundle format, built resumably here, packed to carry, checked on arrival."""

from __future__ import annotations

import json

import pytest

from benchmarks import bundle, pack, sets
from lospmm.kernel.package import KernelDirError


def _jobs():
    micro = [sets.planned_job(p) for p in sets.micro_plan(n=4096) if p.layer == "footprint-256"]
    return micro + [sets.planned_job(p) for p in sets.conv_plan(batch=2)[:7] if p.variant in ("", "im2col-gemm")]


def test_a_bundle_holds_each_kernels_package_its_launch_rows_and_the_a_it_is_checked_against(tmp_path):
    folder = bundle.build("b", _jobs(), tmp_path, threads=2, cache=tmp_path / "cache", set_name="micro",
                          options={"n": 4096}, sass=False, say=lambda *_: None)
    rows = bundle.bundle_rows(folder)
    assert [r["status"] for r in rows] == ["ok"] * 4 and [r["form"] for r in rows] == ["gemm", "gemm", "conv", "gemm"]
    for r in rows:
        package = bundle.package_of(folder, r)
        assert package.spec.name == r["kernel"] and package.cubin()[:4] == b"\x7fELF"
        assert package.spec.layer == r["layer"] and package.spec.sparsity == r["sparsity"]
        assert not (package.dir / "kernel.cu").exists() and not (package.dir / "weight.parquet").exists()  # not carried
        assert bundle.matrix_of_row(folder, r).nnz == r["nnz"] == package.spec.nnz
        assert r["count"] == (2 if r["form"] == "conv" else r["n"])  # a conv kernel is launched over a batch
        assert r["estimate_us"] > 0 and r["estimate_timer"].startswith("estimate")
    facts = bundle.bundle_facts(folder)
    assert facts["inputs"] == bundle.inputs_hash("micro", {"n": 4096}) and facts["kernels"] == facts["compiled"] == 4


def test_a_cut_off_build_goes_on_where_it_stopped_and_a_damaged_package_is_built_again(tmp_path):
    jobs, said = _jobs(), []
    folder = bundle.build("b", jobs[:2], tmp_path, cache=tmp_path / "cache", sass=False, say=said.append)
    assert not (folder / "launches.parquet").exists() or len(bundle.bundle_rows(folder)) == 2
    (folder / "kernels" / jobs[0].planned.id / "kernel.cubin").write_bytes(b"damaged")
    said.clear()
    folder = bundle.build("b", jobs, tmp_path, cache=tmp_path / "cache", sass=False, say=said.append)
    built = [line.split(":")[0].split("] ")[1] for line in said]
    # the whole one was kept (kernels build side by side: the lines come as they finish)
    assert sorted(built) == sorted([jobs[0].planned.id, jobs[2].planned.id, jobs[3].planned.id])
    assert len(bundle.bundle_rows(folder)) == 4 and bundle.package_of(folder, bundle.bundle_rows(folder)[0])
    assert [r["id"] for r in bundle.bundle_rows(folder)] == [j.planned.id for j in jobs]  # rows in the jobs' order


def test_carried_parts_are_bundles_of_their_own_and_a_damaged_archive_is_refused(tmp_path):
    folder = bundle.build("b", _jobs(), tmp_path, cache=tmp_path / "cache", sass=False, say=lambda *_: None)
    parts = pack.packed_parts(folder, tmp_path / "carry", max_mib=0.005, ratio=1.0)  # split: a kernel a part
    assert len(parts) == 4 and parts[0].name == "b-1of4.tar.xz"
    listing = tmp_path / "carry" / "b.parts.json"
    opened = [pack.opened(a, tmp_path / "there") for a in pack.verified_parts(listing)]
    rows = [r for folder in opened for r in bundle.bundle_rows(folder)]
    assert sorted(r["id"] for r in rows) == sorted(r["id"] for r in bundle.bundle_rows(folder))
    for part in opened:
        for r in bundle.bundle_rows(part):
            assert bundle.package_of(part, r).cubin()[:4] == b"\x7fELF" and bundle.matrix_of_row(part, r).nnz > 0
    data = bytearray(parts[1].read_bytes())
    data[-10] ^= 1
    parts[1].write_bytes(bytes(data))
    with pytest.raises(ValueError, match="b-2of4.tar.xz: its SHA-256 is not the one b.parts.json lists"):
        pack.verified_parts(listing)
    parts[2].unlink()  # and, past the damaged one, one that never arrived
    with pytest.raises(ValueError, match="b-3of4.tar.xz: missing"):
        pack.verified_parts(_without(listing, parts[1].name))


def test_a_part_that_packs_larger_than_guessed_is_split_until_it_fits(tmp_path):
    # xz did worse on the N:M set's big kernels than the guessed ratio: one part came out at 70 MiB,
    # more than a device call carries
    folder = bundle.build("b", _jobs(), tmp_path, cache=tmp_path / "cache", sass=False, say=lambda *_: None)
    parts = pack.packed_parts(folder, tmp_path / "carry", max_mib=0.005, ratio=1000.0)  # a guess far too good
    listing = json.loads((tmp_path / "carry" / "b.parts.json").read_text())
    assert [p.name for p in parts] == [f"b-{i}of4.tar.xz" for i in range(1, 5)] == [q["file"] for q in listing["parts"]]
    assert all(len({tuple(k)[0] for k in q["launches"]}) == 1 for q in listing["parts"])  # a kernel a part
    assert sorted(k[0] for q in listing["parts"] for k in q["launches"]) == sorted(
        r["id"] for r in bundle.bundle_rows(folder))
    assert not (tmp_path / "carry" / ".staging").exists() and not list((tmp_path / "carry").glob("b-part*"))


def _without(listing, name):
    """The listing with one entry removed (so the next problem shows)."""
    facts = json.loads(listing.read_text())
    facts["parts"] = [p for p in facts["parts"] if p["file"] != name]
    out = listing.with_name("other.parts.json")
    out.write_text(json.dumps(facts))
    return out


def test_a_bundles_inputs_name_its_set_options_and_code():
    assert bundle.inputs_hash("ab", {}) == bundle.inputs_hash("ab", {})
    assert bundle.inputs_hash("ab", {}) != bundle.inputs_hash("ab", {"sparsity": 0.7})
    assert bundle.inputs_hash("ab", {}) != bundle.inputs_hash("micro", {})


def test_a_retrained_ranker_makes_the_bundles_it_chose_for_stale(monkeypatch):
    # the headline bundles' tiles are the search's, chosen by the shipped ranker: a model retrained
    # (the code unchanged) must not leave the bundles built with the old one ready
    from lospmm.flows.storage import ranker_store

    before = bundle.inputs_hash("headline-resnet50", {})
    real = ranker_store.ranker_metadata
    for model in (ranker_store.SHIPPED, ranker_store.SHIPPED_HALF, ranker_store.SHIPPED_DESIGNS):
        monkeypatch.setattr(ranker_store, "ranker_metadata",
                            lambda base=None, model=model: {**real(base), "version": "retrained"} if base == model
                            else real(base))
        assert bundle.inputs_hash("headline-resnet50", {}) != before, model.name


def test_a_package_that_fails_its_manifest_is_not_launched(tmp_path):
    folder = bundle.build("b", _jobs()[:1], tmp_path, cache=tmp_path / "cache", sass=False, say=lambda *_: None)
    (row,) = bundle.bundle_rows(folder)
    (folder / "kernels" / row["package"] / "kernel.json").write_text("{}")
    with pytest.raises(KernelDirError, match="kernel.json does not match its checksum"):
        bundle.package_of(folder, row)


def test_a_build_whose_time_is_up_starts_no_more_kernels_and_what_it_built_can_be_measured(tmp_path):
    # the GPU machine's build of the nm set outlasted a 10-minute command and nothing came back: a build
    # now stops starting kernels at its time, leaves an unfinished bundle of what it built, and goes on
    import time

    jobs, said = _jobs(), []
    bundle.build("b", jobs[:2], tmp_path, cache=tmp_path / "cache", sass=False, say=lambda *_: None)
    folder = bundle.build("b", jobs, tmp_path, cache=tmp_path / "cache", sass=False, say=said.append,
                          stop_at=time.monotonic())
    assert [r["id"] for r in bundle.bundle_rows(folder)] == [j.planned.id for j in jobs[:2]]
    assert bundle.bundle_facts(folder) == {}  # unfinished: not a ready bundle
    assert any("2 of 4 kernels built" in line for line in said)
    folder = bundle.build("b", jobs, tmp_path, cache=tmp_path / "cache", sass=False, say=lambda *_: None)
    assert len(bundle.bundle_rows(folder)) == 4 and bundle.bundle_facts(folder)["kernels"] == 4


def test_a_bundle_records_the_code_it_was_built_from_not_the_code_at_its_end(tmp_path, monkeypatch):
    # a 2-core build of the nm set runs for hours: sources edited meanwhile must leave it stale
    hashes = iter(["before", "after"])
    monkeypatch.setattr(bundle, "inputs_hash", lambda *a: next(hashes))
    folder = bundle.build("b", _jobs()[:1], tmp_path, cache=tmp_path / "cache", set_name="micro", sass=False,
                          say=lambda *_: None)
    assert bundle.bundle_facts(folder)["inputs"] == "before"


def test_a_build_cut_off_under_other_code_starts_over(tmp_path, monkeypatch):
    # its packages were rendered by the code of then: resumed under today's hash they would be passed off
    # as today's kernels
    jobs, said = _jobs()[:1], []
    monkeypatch.setattr(bundle, "inputs_hash", lambda *a: "then")
    folder = bundle.build("b", jobs, tmp_path, cache=tmp_path / "cache", set_name="micro", sass=False,
                          say=lambda *_: None, stop_at=0.0)  # cut off before its first kernel
    (folder / "kernels" / "stale-package").mkdir()
    monkeypatch.setattr(bundle, "inputs_hash", lambda *a: "now")
    folder = bundle.build("b", jobs, tmp_path, cache=tmp_path / "cache", set_name="micro", sass=False,
                          say=said.append)
    assert any("starting over" in line for line in said) and not (folder / "kernels" / "stale-package").exists()
    assert bundle.bundle_facts(folder)["inputs"] == "now"



def test_a_bundles_archives_are_its_own_not_those_of_a_bundle_whose_name_begins_with_its(tmp_path):
    # packing nm once deleted nm-spmm's archive (a glob of nm*.tar.xz)
    for name in ("nm.tar.xz", "nm-1of2.tar.xz", "nm-2of2.tar.xz", "nm-spmm.tar.xz", "nm-spmm-1of2.tar.xz",
                 "sample-0.9.tar.xz", "sample-0.9-h200.tar.xz"):
        (tmp_path / name).write_bytes(b"")
    assert [a.name for a in pack.archives_of("nm", tmp_path)] == ["nm-1of2.tar.xz", "nm-2of2.tar.xz", "nm.tar.xz"]
    assert [a.name for a in pack.archives_of("sample-0.9", tmp_path)] == ["sample-0.9.tar.xz"]
    assert [a.name for a in pack.archives_of("nm-spmm", tmp_path)] == ["nm-spmm-1of2.tar.xz", "nm-spmm.tar.xz"]


def test_a_build_without_nvdisasm_stops_before_anything_is_built_unless_told_to_leave_sass_out(tmp_path, monkeypatch):
    """A bundle's rows carry each kernel's SASS facts (the A/B table's instructions per multiply-add): a
    prepare on a machine without nvdisasm built 143 kernels without them, and said nothing."""
    from lospmm.kernel import sass
    from lospmm.kernel.sass import NvdisasmMissing

    def missing():
        raise NvdisasmMissing("nvdisasm not found")

    monkeypatch.setattr(sass, "nvdisasm", missing)
    with pytest.raises(NvdisasmMissing) as raised:
        bundle.build("b", _jobs()[:1], tmp_path, cache=tmp_path / "cache", say=lambda *_: None)
    assert str(raised.value) == ("b: nvdisasm not found; a bundle's rows carry each kernel's SASS facts "
                                 "(instructions per multiply-add, code bytes)")
    assert not (tmp_path / "b").exists()
    folder = bundle.build("b", _jobs()[:1], tmp_path, cache=tmp_path / "cache", sass=False, say=lambda *_: None)
    assert bundle.bundle_facts(folder)["sass"] == "none" and "instructions" not in bundle.bundle_rows(folder)[0]


def test_a_build_resumed_with_sass_says_its_rows_carry_them_only_in_part(tmp_path, monkeypatch):
    """bundle.json's `sass` is counted from the rows: a build resumed with nvdisasm after one without it
    keeps the first kernels' rows as they were, so its facts are "partial", not the last setting's."""
    from lospmm.kernel import sass

    folder = bundle.build("b", _jobs()[:1], tmp_path, cache=tmp_path / "cache", sass=False, say=lambda *_: None)
    assert bundle.bundle_facts(folder)["sass"] == "none"
    monkeypatch.setattr(sass, "nvdisasm", lambda: "nvdisasm")  # CI has none: the facts are stood in for
    monkeypatch.setattr(bundle, "sass_facts", lambda cubin, source: {"instructions": 100, "instructions_per_fma": 2.0})
    folder = bundle.build("b", _jobs()[:2], tmp_path, cache=tmp_path / "cache", say=lambda *_: None)
    rows = bundle.bundle_rows(folder)
    assert [r["instructions"] for r in rows] == [None, 100]
    assert bundle.bundle_facts(folder)["sass"] == "partial"
    (folder / "kernels" / rows[0]["package"] / "row.json").unlink()  # built again, with its facts this time
    assert bundle.bundle_facts(bundle.build("b", _jobs()[:2], tmp_path, cache=tmp_path / "cache",
                                            say=lambda *_: None))["sass"] == "all"
