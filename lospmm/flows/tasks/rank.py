"""Adapter of stage 5, rank: 04_candidates (kept rows) -> 05_ranked with score, rank and chosen."""

from __future__ import annotations

import time

from lospmm.flows.catalog.ranked import SCHEMA
from lospmm.flows.storage.ranker_store import load_ranker
from lospmm.flows.inputs.sources import RankerRef
from lospmm.flows.execution.taskio import RunContext, grouped, run_stage, stage_task, stoppable
from lospmm.stages.rank import FEATURES, RankParams, chosen_candidates, ranker_features, ranker_tag


@stage_task("rank")
def rank(key: str, ctx: RunContext, label: str, inputs: dict, force: bool, params: RankParams,
         ranker: RankerRef) -> dict:
    def compute():
        booster, meta = load_ranker(ranker.path) if params.use_rank else (None, {})
        features = ranker_features(meta) if params.use_rank else FEATURES
        table = ctx.read(inputs["constrain"])
        rows = []
        # (layer, design, M1, N1) order: a layer's candidates of every design it spans are one group
        for group in stoppable(grouped(table.filter(table["kept"]).to_pylist(), "layer").values()):
            t0 = time.perf_counter()
            scores, ranks, chosen = chosen_candidates(group, booster, params, features)
            seconds = time.perf_counter() - t0
            rows += [{**c, "score": float(s), "rank": int(r), "chosen": bool(ch), "seconds": seconds,
                      "ranker": ranker_tag(ranker.version, params)}
                     for c, s, r, ch in zip(group, scores, ranks, chosen)]
        return rows

    return run_stage("rank", SCHEMA, key, ctx, label, force, compute, inputs)
