"""benchmarks.sets: the kernel sets the device program measures, planned and rendered here (no GPU)."""

from __future__ import annotations

import math
from dataclasses import replace

import numpy as np
import pytest

from benchmarks import sets
from lospmm.kernel.design import design_named
from lospmm.kernel.sparse_mma import MMATiling
from lospmm.stages.extract import zoo_shapes


def test_the_ab_plan_puts_every_design_on_todays_tile():
    plan = sets.ab_plan()
    assert len(plan) == len(sets.AB_LAYERS) * len(sets.AB_DESIGNS) and len({p.id for p in plan}) == len(plan)
    query = [p for p in plan if p.layer == "encoder.layer.0.attention.self.query"]
    assert {(p.m1, p.n1) for p in query if "slices" not in p.design} == {(12, 512)}  # as measured in call l
    # a sliced block of 12 rows: 4 slices of 512 threads pass 1024, so the widest N1 of whole warps that fits
    sliced = {p.design: p.n1 for p in query if "slices" in p.design}
    assert sliced == {design_named("chained,slices=2").label: 512, design_named("chained,slices=4").label: 256,
                      design_named("chained,v=2,slices=2").label: 256}
    assert all(design_named(d).block_problem(12, n1) == "" for d, n1 in sliced.items())
    assert {p.design for p in query} == {design_named(d).label for d in sets.AB_DESIGNS}
    assert all(p.matrix == query[0].matrix for p in query)  # one pruned A, shared by the designs


def test_the_held_out_designs_set_puts_every_auto_design_on_layers_the_design_price_never_saw():
    from benchmarks import device
    from lospmm.kernel.choices import DESIGN_CANDIDATES, PENDING_DESIGNS
    from lospmm.kernel.estimate import DESIGN_PRICINGS

    plan = sets.ab_plan(layers=sets.AB_HELD_OUT_LAYERS)
    assert not set(sets.AB_HELD_OUT_LAYERS) & set(sets.AB_LAYERS)  # the price was fitted on the A/B layers alone
    assert {p.model for p in plan} == set(sets.MODELS) and len({(p.model, p.layer) for p in plan}) == 11
    # every design --design auto prices, each with its fitted factor, on each layer's measured tile, and
    # those waiting for their factor
    assert {p.design for p in plan} == {design_named(d).label for d in DESIGN_CANDIDATES + PENDING_DESIGNS}
    assert {design_named(d).label for d in DESIGN_CANDIDATES} == set(dict(DESIGN_PRICINGS["h100"].factors))
    ffn = [p for p in plan if p.layer == "encoder.layer.0.output.dense"]
    assert {(p.m1, p.n1) for p in ffn if "slices" not in p.design} == {(12, 512)}
    assert len({p.id for p in plan} | {p.id for p in sets.ab_plan()}) == 2 * 11 * 13
    step = device.step_named("designs-held-out")
    assert [b.options["layers"] for b in step.bundles] == [sets.AB_HELD_OUT_LAYERS]


def test_the_sample_spreads_over_each_models_sizes_within_the_nonzero_limit():
    params = sets.SampleParams(per_model=3, max_nnz=20_000, models=("resnet50", "bert-base"))
    picked = sets.sampled_shapes([s for m in params.models for s in zoo_shapes(m)], params)
    resnet = [s for s in picked if s.model == "resnet50"]
    assert len(resnet) == 3 and len({(s.m, s.k, s.n) for s in resnet}) == 3
    sizes = [s.m * s.k for s in resnet]
    assert sizes == sorted(sizes) and sizes[0] < sizes[-1]
    assert all(s.m * s.k * (1 - params.sparsity) <= params.max_nnz for s in picked)
    assert not [s for s in picked if s.model == "bert-base"]  # every BERT layer has more nonzeros


def test_the_headline_plan_chooses_tiles_with_the_search(monkeypatch):
    """One small layer: the tile is one of the search's kept candidates, in the design asked for."""
    from lospmm.stages.extract import LayerShape

    shape = LayerShape("bert-base", "pooler.dense", "linear", 768, 32, 768)
    monkeypatch.setattr(sets, "gemm_shapes", lambda model, batch=4: [shape])
    (p,) = sets.headline_plan("chained,v=2", sparsities=(0.95,), models=("bert-base",))
    assert p.design == design_named("chained,v=2").label and p.m1 >= 1 and p.n1 % 32 == 0
    assert "search" in p.chosen_by and np.isclose(p.sparsity, 0.95)


def test_the_half_set_puts_each_variant_and_the_fp32_pair_kernel_on_the_half_searchs_tile():
    plan = sets.half_plan(sparsities=(0.9,), batches=(4,), models=("mobilenetv2",),
                          layers=(("mobilenetv2", "features.1.conv.1"),), variants=("fp16,chained", "bf16,acc=f32,chained"))
    assert [design_named(p.design).dtype for p in plan] == ["fp16", "bf16", "fp32"]
    assert len({(p.m1, p.n1) for p in plan}) == 1 and plan[-1].design == design_named(sets.FP32_SAME_TILE).label
    half = [sets.matrix_of(p) for p in plan]  # each A as its design's number format rounds it
    assert half[0].nnz <= half[2].nnz and set(np.unique(half[0].data.astype(np.float16).astype(np.float64)
                                                        == half[0].data)) == {True}


def test_an_every_kept_sample_launches_one_kernel_per_kept_m1_at_each_of_its_kept_n1():
    """Issue 24's Table 4 over every kept candidate: per kept M1, one full kernel that reads N1 at
    launch, launched at each kept N1 — as many launches as the layer has kept candidates, for as many
    kernels as kept M1; one proxy per chosen M1, launched at each chosen N1."""
    from lospmm.devices import device_named
    from lospmm.flows.storage.ranker_store import load_ranker
    from lospmm.search import SearchParams, layer_search
    from lospmm.stages.prune import pruned_layer
    from lospmm.stages.rank import RankParams

    params = sets.SampleParams(per_model=1, max_nnz=1500, models=("shufflenetv2",), top_k=2, every_kept=True)
    (shape,) = sets.sampled_shapes(list(zoo_shapes("shufflenetv2")), params)
    jobs = sets.sample_jobs(params)
    search = layer_search(pruned_layer(shape, params.sparsity).matrix, shape.n, params.sparsity, device_named("h100"),
                          load_ranker()[0], SearchParams(rank=RankParams(top_k=params.top_k)))
    every = [j.planned for j in jobs if j.planned.variant == "every-kept"]
    launched = sorted((p.m1, n1) for p in every for n1 in (p.n1, *(n for n, _ in p.also_at)))
    assert launched == sorted((c.m1, c.n1) for c in search.kept) and len(every) == len({c.m1 for c in search.kept})
    assert all(p.n1_at_launch for p in every) and all(j.source().spec.n1_at_launch for j in jobs
                                                      if j.planned.variant == "every-kept")
    proxies = [j for j in jobs if j.planned.role == "proxy"]
    assert sorted(j.planned.m1 for j in proxies) == sorted({c.m1 for c in search.chosen})
    assert sorted((j.planned.m1, n1) for j in proxies for n1 in (j.planned.n1, *(n for n, _ in j.planned.also_at))) \
        == sorted((c.m1, c.n1) for c in search.chosen)
    assert all(j.matrix is None and j.source().spec.form == "proxy" and set(j.launch["smem_at"]) >=
               {j.planned.n1} for j in proxies)


def test_every_set_is_known_by_name_and_an_unknown_one_is_named():
    import pytest

    assert {j.planned.set for j in sets.set_jobs("micro", n=4096)} == {"micro"}
    with pytest.raises(ValueError, match="no kernel set 'nope'"):
        sets.set_jobs("nope")


def test_the_reorder_set_differs_only_in_the_row_order():
    plan = sets.reorder_plan(layers=(("bert-base", "pooler.dense"),))
    assert [p.order for p in plan] == ["identity", "algorithm1", "kept"] and len({p.id for p in plan}) == 3
    same = {(p.model, p.layer, p.m1, p.n1, p.design, p.matrix, p.n) for p in plan}
    assert len(same) == 1  # one A, one tile, one design: only the rows' grouping differs
    nnc = {p.order: int(sets.ordered(sets.matrix_of(p), p).tile_nnc.sum()) for p in plan}
    assert nnc["kept"] <= nnc["identity"] and nnc["algorithm1"] != nnc["identity"]


def test_the_nm_set_pairs_each_nm_layer_with_a_random_one_of_the_same_sparsity():
    from lospmm.stages.prune import NMPattern, nm_pattern_of

    plan = sets.nm_plan(patterns=("nm:8:32:32", "nm:4:32"), layers=(("bert-base", "pooler.dense"), ("resnet50", "conv1")))
    # conv1's K = 147 is no multiple of 32: left out; the pooler gets an N:M A (baked, and the N:M kernel
    # on the same A) and a random A per pattern
    assert {p.layer for p in plan} == {"pooler.dense"}
    assert [(p.prune, p.design.startswith("nm")) for p in plan] == [
        ("nm:8:32:32", False), ("", False), ("nm:8:32:32", True), ("nm:4:32", False), ("", False), ("nm:4:32", True)]
    nm, rand, kernel = plan[0], plan[1], plan[2]
    assert nm.sparsity == rand.sparsity == kernel.sparsity == 0.75 and nm.matrix != rand.matrix and nm.id != rand.id
    assert kernel.matrix == nm.matrix and kernel.nm and kernel.n1 == kernel.nm[1]
    a, b = sets.matrix_of(nm), sets.matrix_of(rand)
    assert nm_pattern_of(a) == NMPattern(8, 32, 32) and nm_pattern_of(b) is None and a.nnz == b.nnz
    # the N:M kernel's job renders the N:M kernel of that A and says its estimate
    job = sets.planned_job(kernel)
    source = job.source()
    assert source.spec.nm == sets.nm_tiling_of(kernel) and source.spec.nnz == a.nnz
    assert 0 < job.launch["estimate_us"] < float("inf")


def test_the_nm_spmm_set_plans_the_nm_kernel_on_llama_shapes_with_a_seeded_a():
    from lospmm.stages.prune import nm_pattern_of

    plan = sets.nm_spmm_plan(patterns=("nm:8:32:32",), shapes=((256, 512),), tokens=(64,))
    *plan, tensor = plan  # last, 2:4 on sparse tensor cores in fp16 on the same shape: cuSPARSELt's case
    assert tensor.variant == "mma" and tensor.prune == "nm:2:4" and tensor.design.startswith("fp16,acc=mma,nm")
    assert isinstance(sets.nm_tiling_of(tensor), MMATiling) and sets.matrix_of(tensor).shape == (256, 512)
    assert sets.planned_job(tensor).source().spec.nm == sets.nm_tiling_of(tensor)
    assert all(q.variant != "mma" for q in sets.nm_spmm_plan(patterns=("nm:8:32:32",), shapes=((256, 512),),
                                                              tokens=(64,), tensor_cores=False))
    p, *beside = plan  # the estimate's choice, then the best 32-column stage where the choice is deeper, and
    # that one copying whole chunks where it gathers (the device's A/B of the gathered stages)
    chosen = sets.nm_tiling_of(p)
    shallow = sets.nm_tiling_of(beside[0]) if beside[0].variant == "stage-32" else chosen
    assert [b.variant for b in beside] == [*(["stage-32"] if chosen.depth > 32 else []),
                                           *(["whole-chunk"] if shallow.gathers else [])]
    assert all(b.matrix == p.matrix for b in beside)  # the same A
    if shallow.gathers:
        assert sets.nm_tiling_of(beside[-1]) == replace(shallow, gather=False)
    assert (p.model, p.m, p.k, p.n, p.sparsity, p.design) == ("nm-spmm", 256, 512, 64, 0.75, "nm,based,tile-x,walks=1,v=1")
    a = sets.matrix_of(p)
    found = nm_pattern_of(a)
    assert (found.n, found.m) == (8, 32) and found.vector % 32 == 0  # vectors of 32 rows (or longer by chance)
    # the same A on every machine: the bundle carries none, the measurement makes it again
    from benchmarks.bundle import matrix_of_row

    again = matrix_of_row("/nonexistent", p.row())
    assert (again != a).nnz == 0


def test_the_latency_set_differs_only_in_prefetch_registers_and_ptxas_level_and_builds_under_its_cap(tmp_path):
    from benchmarks import bundle
    from lospmm.stages.compile import kernel_options

    plan = sets.latency_plan(layers=(("resnet50", "layer1.0.conv2"),))  # 64 x 576: a small A/B layer to build
    assert [(p.prefetch, p.extra_registers, p.ptxas_level) for p in plan] == list(sets.LATENCY_VARIANTS)
    assert len({p.id for p in plan}) == len(plan) and plan[0].variant == "prefetch-1,regs+0,O1"
    same = {(p.model, p.layer, p.m1, p.n1, p.design, p.matrix, p.n) for p in plan}
    assert len(same) == 1 and plan[0].design == design_named("chained").label
    assert kernel_options("sm_90", 2, extra_registers=16).maxrregcount == kernel_options("sm_90", 2).maxrregcount + 16
    assert kernel_options("sm_90", 200, extra_registers=200).maxrregcount == 255
    # built: the deeper prefetch is in the kernel's text, and each compiled under its own cap
    reference, deep = plan[0], plan[3]
    folder = bundle.build("lat", [sets.planned_job(p) for p in (reference, deep)], tmp_path, cache=tmp_path / "cache",
                          sass=False, say=lambda *_: None)
    rows = {r["id"]: r for r in bundle.bundle_rows(folder)}
    assert [rows[p.id]["status"] for p in (reference, deep)] == ["ok", "ok"]
    assert rows[deep.id]["kernel"] != rows[reference.id]["kernel"]  # another text: B loaded 16 columns ahead
    assert rows[deep.id]["extra_registers"] == 16 and rows[deep.id]["spill_bytes"] == 0
    cap = kernel_options("sm_90", reference.m1, design=design_named(reference.design)).maxrregcount
    # the deeper prefetch holds more B values: more registers (24 and 46 at this writing), each under its cap
    assert rows[reference.id]["registers"] <= cap < rows[deep.id]["registers"] <= cap + 16


def test_the_staged_set_puts_the_staged_design_on_each_layers_tiles_beside_its_chained_kernel(tmp_path):
    from benchmarks import analysis, bundle

    plan = sets.staged_plan(layers=(("resnet50", "layer1.0.conv2"),))  # 64 x 576: a small A/B layer to build
    assert [p.variant for p in plan] == ["chained", "staged,tiles=4", "staged,tiles=8", "staged,tiles=4,warps=4"]
    assert len({(p.m1, p.matrix, p.order) for p in plan}) == 1 and [p.n1 for p in plan][1:] == [32, 32, 128]
    assert plan[2].design == design_named("staged,tiles=8").label
    folder = bundle.build("st", [sets.planned_job(p) for p in (plan[0], plan[2], plan[3])], tmp_path,
                          cache=tmp_path / "cache", sass=False, say=lambda *_: None)
    rows = bundle.bundle_rows(folder)
    assert [r["status"] for r in rows] == ["ok", "ok", "ok"] and rows[1]["spill_bytes"] == rows[2]["spill_bytes"] == 0
    assert rows[1]["kernel"].startswith("lospmm_staged_") and (rows[1]["n1"], rows[2]["n1"]) == (32, 128)
    # its launch row carries its blocks' copies (chunks of 256 rows of K = 576 at one warp a tile, 64 at four),
    # so the estimate's staged model priced it when it was built
    assert (rows[1]["staged_chunks"], rows[2]["staged_chunks"]) == (3, 9)
    assert len(rows[1]["staged_counts"]) == 3 * -(-len(rows[1]["tile_loads"]) // 8)
    # and each tile's loads and multiply-adds per chunk (the block waits on each chunk's slowest warp)
    assert len(rows[1]["chunk_loads"]) == len(rows[1]["chunk_fmas"]) == 3 * len(rows[1]["tile_loads"])
    work = analysis.launch_work(rows[1])
    assert (work.chunk_loads.sum(1) == work.tile_loads).all() and (work.chunk_fmas.sum(1) == work.tile_fmas).all()
    assert all(math.isfinite(r["estimate_us"]) for r in rows) and rows[1]["estimate_us"] != rows[0]["estimate_us"]
    measured = [r | {"ours_us": us, "spread": 0.0} for r, us in zip(rows, (10.0, 5.0, 20.0))]
    from lospmm.devices import device_named
    from lospmm.kernel.estimate import estimate_timer

    models = {"datasheet": estimate_timer(device_named("h200"), calibrated=False)}
    summary = analysis.variant_summary(measured, "staged", "chained", True, models)
    staged = next(r for r in summary if r["variant"] == "staged,tiles=8" and r["model"] != "all")
    overall = {r["variant"]: r for r in summary if r["model"] == "all"}
    assert overall["staged,tiles=8"]["over reference"] == 0.5 and overall["staged,tiles=4,warps=4"]["over reference"] == 2
    assert staged["estimate: over reference"] > 0 and staged["datasheet: over reference"] > 0


def test_the_conv_step_measures_each_case_baked_streamed_staged_sliced_and_as_its_im2col_gemm():
    # issue 35: the streamed, staged and sliced designs' implicit-im2col kernels beside the baked one, the same A and M1
    from benchmarks.analysis import conv_summary

    plan = sets.conv_plan(batch=2)
    assert len([p for p in plan if not p.prune]) == 7 * len(sets.CONV_CASES)
    staged = [p for p in plan if p.variant == "staged"]
    assert len(staged) == len(sets.CONV_CASES) and all(p.n1 == 32 and p.m1 == plan[0].m1 for p in staged)
    assert sets.planned_job(staged[0]).source().spec.form == "conv"
    streamed = [p for p in plan if p.variant == "streamed"]
    assert len(streamed) == len(sets.CONV_CASES) and all(p.conv and p.design.startswith("streamed") for p in streamed)
    source = sets.planned_job(streamed[0]).source()
    assert source.spec.form == "conv" and source.design.a_values == "streamed" and len(source.units) == 1
    baked = sets.planned_job(plan[0]).source()
    assert (baked.spec.epilogue, baked.layout.threads) == (source.spec.epilogue, source.layout.threads)
    vector = [p for p in plan if p.variant == "v2"]  # issue 35 item 2: two pixels a thread, same A and tile
    assert len(vector) == len(sets.CONV_CASES) and all(p.m1 == plan[0].m1 and p.n1 == plan[0].n1 for p in vector)
    v2 = sets.planned_job(vector[0]).source()
    assert v2.spec.form == "conv" and v2.layout.columns_per_thread == 2 and v2.spec.epilogue == baked.spec.epilogue
    sliced = [p for p in plan if p.variant == "sliced"]  # a tile's walk over 4 groups of warps, same A and M1
    assert len(sliced) == len(sets.CONV_CASES) and all(p.m1 == plan[0].m1 and p.n1 == 256 for p in sliced)
    walked = sets.planned_job(sliced[0]).source()
    assert walked.spec.form == "conv" and walked.design.k_slices == 4 and walked.layout.block() == 1024
    assert walked.spec.epilogue == baked.spec.epilogue
    # a taller tile: N1 narrowed to the widest whole warps its partial sums fit (4 · 16 · 192 · 4 B = 48 KiB)
    tall = next(p for p in sets.conv_plan(batch=2, m1=16, nm=False) if p.variant == "sliced")
    assert tall.n1 == 192 and sets.planned_job(tall).source().layout.block() == 768
    # its launch row's estimate loads each lane's input apart (a review found it priced as the GEMM's v=2)
    from benchmarks import analysis

    work = dict(sets.planned_job(vector[0]).launch)
    row = {**work, "m": vector[0].m, "k": vector[0].k, "n": vector[0].n, "m1": vector[0].m1, "n1": vector[0].n1,
           "registers": 64, "spill_bytes": 0, "design": vector[0].design}
    assert analysis.launch_work(row | {"form": "conv"}).lane_loads == 2
    assert analysis.launch_work(row | {"form": "gemm"}).lane_loads == 1
    # the tiled half conv kernel: the same tile, the case's A rounded to fp16 (a matrix of its own in the bundle)
    from lospmm.kernel.numbers import rounded_matrix

    half = [p for p in plan if p.variant == "fp16"]
    assert len(half) == len(sets.CONV_CASES) and all(p.m1 == plan[0].m1 and p.n1 == plan[0].n1 for p in half)
    assert half[0].matrix != plan[0].matrix and ":" not in half[0].matrix
    assert (sets.matrix_of(half[0]) != rounded_matrix(sets.matrix_of(plan[0]), "fp16")[0]).nnz == 0
    pair = sets.planned_job(half[0]).source()
    assert pair.spec.form == "conv" and pair.spec.dtype == "fp16" and pair.layout.columns_per_thread == 2
    assert pair.spec.epilogue == baked.spec.epilogue
    rows = [dict(set="conv", layer=p.layer, variant=p.variant, m=p.m, k=p.k, n=p.n, sparsity=p.sparsity,
                 ours_us={"": 10.0, "streamed": 15.0, "staged": 8.0, "v2": 9.0, "sliced": 7.0, "fp16": 4.0,
                          "im2col-gemm": 12.0}[p.variant],
                 spread=0.01, cudnn_us=30.0 if p.variant != "fp16" else 6.0) for p in plan[:7]]
    (summary,) = conv_summary(rows)
    assert summary["sliced / implicit"] == 0.7
    assert summary["streamed / implicit"] == 1.5 and summary["implicit / gemm"] == pytest.approx(10 / 12)
    assert summary["staged / implicit"] == 0.8 and summary["v=2 / implicit"] == 0.9
    assert summary["cuDNN fp16 / fp16"] == 1.5 and summary["implicit / fp16"] == 2.5 and summary["cuDNN / implicit"] == 3.0


def test_the_conv_step_sets_the_nm_conv_kernel_against_the_baked_one_on_the_same_2_4_weights():
    # issue 34: a convolution pruned 2:4 along Cin·kh·kw, in the N:M kernel's conv form (the estimate's
    # blocking) and as the baked conv kernel of the same A; only where K is a multiple of 4 (not 7×7×3)
    from benchmarks.analysis import conv_summary
    from lospmm.kernel.nm import held_pattern

    plan = sets.conv_plan(batch=2)
    nm = [p for p in plan if p.variant == "nm"]
    baked = {p.layer: p for p in plan if p.variant == "nm-baked"}
    assert [p.layer.split(":")[0] for p in nm] == ["1", "2", "3", "4"] and set(baked) == {p.layer for p in nm}
    assert len(sets.conv_plan(batch=2, nm=False)) == 7 * len(sets.CONV_CASES)
    p = nm[2]
    from lospmm.kernel.numbers import rounded_matrix
    assert (p.prune, p.sparsity, p.matrix) == ("nm:2:4", 0.5, baked[p.layer].matrix) and p.conv == baked[p.layer].conv
    a = sets.matrix_of(p)
    assert held_pattern(a) == (2, 4, 1) and (a != sets.matrix_of(baked[p.layer])).nnz == 0
    job = sets.planned_job(p)
    source = job.source()
    assert source.spec.form == "conv" and source.spec.nm.label.startswith("2:4") and source.spec.epilogue.bias
    assert 0 < job.launch["estimate_us"] < float("inf")
    assert sets.planned_job(baked[p.layer]).source().spec.nm is None
    # the same A rounded to fp16, in the N:M kernel's fp16 conv form (a matrix of its own in the bundle)
    half = {q.layer: q for q in plan if q.variant == "nm-fp16"}
    assert set(half) == set(baked)
    h = half[p.layer]
    assert design_named(h.design).dtype == "fp16" and h.matrix != p.matrix and ":" not in h.matrix
    assert (sets.matrix_of(h) != rounded_matrix(a, "fp16")[0]).nnz == 0
    half_source = sets.planned_job(h).source()
    assert half_source.spec.form == "conv" and half_source.spec.dtype == "fp16"
    rows = [dict(set="conv", layer=p.layer, variant=v, m=p.m, k=p.k, n=p.n, sparsity=0.5, ours_us=us, spread=0.01,
                 cudnn_us=cudnn) for v, us, cudnn in (("nm", 10.0, 30.0), ("nm-baked", 15.0, 30.0), ("nm-fp16", 8.0, 16.0))]
    (summary,) = conv_summary(rows)
    assert summary["baked / N:M"] == 1.5 and summary["cuDNN / N:M"] == 3.0 and math.isnan(summary["implicit_us"])
    assert summary["cuDNN fp16 / N:M fp16"] == 2.0 and summary["N:M fp32 / fp16"] == 1.25
    assert summary["nm_sparsity"] == 0.5 and math.isnan(summary["sparsity"])  # the unstructured kernels' own
    assert ":" not in p.matrix  # a bundle's file name


def test_the_micro_sweep_walks_the_footprint_tiles_past_the_cache_in_a_k_split_too():
    plan = sets.micro_plan(n=4096)
    split = [p for p in plan if p.variant == "split"]
    assert [p.layer for p in split] == [f"footprint-{n}" for n in (512, 1024, 2048, 4096, 16384)]
    assert all(design_named(p.design).section_fmas == sets.MICRO_SPLIT and design_named(p.design).column_walks == 16
               for p in split)
    kernel = sets.planned_job(split[0]).source()
    assert "n = n0;" in "".join(kernel.units) and kernel.spec.design.section_fmas == sets.MICRO_SPLIT


def test_the_prefetch_tiles_set_prices_each_depths_tile_and_builds_it_at_that_depth(tmp_path):
    from benchmarks import analysis, bundle
    from lospmm.devices import device_named
    from lospmm.kernel.estimate import estimate_timer, estimated_timing, full_kernel_work
    from lospmm.kernel.registers import predicted_registers
    from lospmm.search import layer_tiles
    from lospmm.stages.constrain import layer_candidates
    from lospmm.stages.reorder import tile_stats

    # a layer whose deep tiles differ from the flow's at both depths under the fitted prefetch term
    # (BERT's pooler, before it: since, its deep tiles are the flow's, planned once)
    layer = ("resnet50", "layer2.0.conv2")
    plan = sets.prefetch_tiles_plan(layers=(layer,))
    assert [p.variant for p in plan] == ["prefetch-1", "prefetch-4", "prefetch-4-tile", "prefetch-8",
                                         "prefetch-8-tile"]
    assert plan[0].variant == analysis.PREFETCH_REFERENCE
    assert [(p.prefetch, p.extra_registers) for p in plan] == [(1, 0), (4, 4), (1, 0), (8, 8), (1, 0)]
    assert all(p.order == "kept" and p.design == design_named("chained").label for p in plan)
    # each depth's tile and its depth-1 twin are one tile
    assert (plan[1].m1, plan[1].n1) == (plan[2].m1, plan[2].n1) and (plan[3].m1, plan[3].n1) == (plan[4].m1, plan[4].n1)
    # the depth-8 tile is the cheapest kept candidate at depth 8 by the calibrated estimate (its own
    # device's latency and bandwidths, not the datasheet's), found here by hand
    shape = next(s for s in sets.gemm_shapes(layer[0]) if s.layer == layer[1])
    a, device, design = sets.pruned(shape, 0.9), device_named("h100"), design_named("chained")
    timer, tiles = estimate_timer(device), layer_tiles(sets.pruned(shape, 0.9), shape.n)

    def price(c, depth):
        work = full_kernel_work(tiles[c.m1], shape.m, shape.k, shape.n, c.n1,
                                predicted_registers(c.m1, design=design) + (depth if depth > 1 else 0),
                                prefetch=depth, design=design)
        return estimated_timing(work, timer.device, timer.params).time_us

    kept = [c for c in layer_candidates(shape.n, {m1: tile_stats(t) for m1, t in tiles.items()}, device, design=design)
            if c.kept]
    for depth, p in ((1, plan[0]), (4, plan[1]), (8, plan[3])):
        prices = {(c.m1, c.n1): price(c, depth) for c in kept}
        assert (p.m1, p.n1) == min(prices, key=prices.get)
    # deeper is cheaper by the estimate, on a taller tile than the flow's
    assert sets.cheapest_tile_at_depth(a, shape, 8, design, device, timer)[2] < \
        sets.cheapest_tile_at_depth(a, shape, 1, design, device, timer)[2]
    assert plan[3].m1 > plan[0].m1
    # built: the deep kernel loads B 8 columns ahead under 8 more registers, its twin at depth 1
    folder = bundle.build("pt", [sets.planned_job(p) for p in (plan[3], plan[4])], tmp_path, cache=tmp_path / "cache",
                          sass=False, say=lambda *_: None)
    rows = {r["variant"]: r for r in bundle.bundle_rows(folder)}
    assert rows["prefetch-8"]["status"] == rows["prefetch-8-tile"]["status"] == "ok"
    assert rows["prefetch-8"]["kernel"] != rows["prefetch-8-tile"]["kernel"]
    assert rows["prefetch-8"]["prefetch"] == 8 and rows["prefetch-8"]["extra_registers"] == 8
    # each launch row carries the estimate at its own depth: deeper is cheaper on the same tile
    assert rows["prefetch-8"]["estimate_us"] < rows["prefetch-8-tile"]["estimate_us"]


def test_the_prefetch_tiles_set_plans_each_kernel_of_a_layer_once():
    # BERT's FFN: its depth-4 and depth-8 tiles are one tile, so its depth-1 twin is planned once
    plan = sets.prefetch_tiles_plan(layers=(("bert-base", "encoder.layer.0.intermediate.dense"),))
    kernels = [(p.m1, p.n1, p.prefetch) for p in plan]
    assert len(kernels) == len(set(kernels)) and len(plan) < 5
    assert plan[0].variant == "prefetch-1"
