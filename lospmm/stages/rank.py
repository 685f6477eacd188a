"""Stage 5, rank: kept (M1, N1) candidates -> LambdaMART score and top-K (§3.5, Table 1).

The ranker is a LightGBM `LGBMRanker` (lambdarank, one group per kernel) on Table 1's features.
Training data (§7.3, Table 3): synthetic pruned matrices; for each, every candidate the constrain
stage keeps is timed by a timer passed in (the `estimate` model, or the `cuda` timer on a GPU), and
its graded relevance is how close its time is to the group's best.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from functools import lru_cache
from typing import Callable, Sequence

import numpy as np

from lospmm.kernel.design import design_named
from lospmm.stages.reorder import ReorderParams

# Table 1, in this order: schedule information, sparse attributes, tile size.
FEATURES = ("num_a_tiles", "num_b_tiles", "block_num", "sparsity", "nnc_sum", "nnz_max", "m1", "n1", "k")
# a design-aware ranker's (one that ranks the tiles of several kernel designs together) besides Table 1's:
# what of the design changes the code a thread runs (kernel.design.KernelDesign)
DESIGN_FEATURES = ("columns_per_thread", "column_walks", "column_x", "chained", "streamed")
# a staged design's blocking (1 and 1 for every other design): a ranker that ranks staged tiles beside the
# others is trained on them too
STAGED_FEATURES = ("tiles_per_block", "tile_warps")
# a K split's section (0 for every other design): added where a split design is ranked beside the others
SPLIT_FEATURES = ("section_fmas",)
# a sliced tile's groups of warps along K (1 for every other design): added where a sliced design is ranked
SLICE_FEATURES = ("k_slices",)


@lru_cache(maxsize=None)
def design_features(label: str) -> dict:
    """DESIGN_FEATURES, STAGED_FEATURES, SPLIT_FEATURES and SLICE_FEATURES of the design with this label
    (KernelDesign.label; "" is the baseline)."""
    d = design_named(label or "baseline")
    return {"columns_per_thread": d.columns_per_thread, "column_walks": d.column_walks,
            "column_x": int(d.order == "column-x"), "chained": int(d.loads == "chained"),
            "streamed": int(d.a_values == "streamed"), "tiles_per_block": d.tiles_per_block,
            "tile_warps": d.tile_warps, "section_fmas": d.section_fmas, "k_slices": d.k_slices}


def ranker_features(metadata: dict) -> tuple[str, ...]:
    """The features a ranker was trained on (its metadata's; Table 1's for a model that names none)."""
    return tuple(metadata.get("features") or FEATURES)


def ranks_designs(features, designs=()) -> bool:
    """Whether a ranker with these features tells kernel designs apart (`designs`, KernelDesign: and
    these among them, a staged one's by STAGED_FEATURES too, a K split's by SPLIT_FEATURES, a sliced one's
    by SLICE_FEATURES)."""
    return set(design_feature_names(designs)) <= set(features)


def design_feature_names(designs) -> tuple[str, ...]:
    """The design features a ranker of `designs` (KernelDesign) is trained on: DESIGN_FEATURES, and
    STAGED_FEATURES where a staged design is among them, SPLIT_FEATURES where a K split is, SLICE_FEATURES
    where a sliced one is."""
    return (DESIGN_FEATURES + (STAGED_FEATURES if any(d.loads == "staged" for d in designs) else ())
            + (SPLIT_FEATURES if any(d.section_fmas for d in designs) else ())
            + (SLICE_FEATURES if any(d.k_slices > 1 for d in designs) else ()))


@dataclass(frozen=True)
class RankParams:
    """Defaults: top_k=10 (candidates passed on to proxy timing), use_rank=True (False: LO-SpMM
    without the ranker, every kept candidate is chosen)."""

    top_k: int = 10
    use_rank: bool = True


@dataclass(frozen=True)
class RankedCandidate:
    """A kept candidate (a constrain.Candidate) with its score and rank; `chosen`: in the top-K."""

    candidate: object
    score: float
    rank: int
    chosen: bool


@dataclass(frozen=True)
class SyntheticParams:
    """Table 3's ranges, N's and M1's wider. Defaults: m_exp=(6, 11), k_exp=(6, 11) (powers of two),
    n_exp=(5, 19) (N = 2^u rounded, u uniform: any N, not only powers of two), sparsity=(0.5, 0.98)
    uniform, m1=(1, 2, 4, 8, 12, 16, 24, 32, 48, 64, 96, 128) (the search's DEFAULT_M1 up to 128).
    Table 3's N of 2^10..2^11 and M1 from 2 left the ranker extrapolating on real layers, whose N runs
    from 4 (a classifier at batch 4) to 401,408 (ResNet-50's conv1 at batch 32): the model trained so
    kept none of the estimate's cheapest M1s in its top 10 on 2 of 3 ResNet-50 layers at batch 32
    (benchmarks.ranker_reach). N1 is every multiple of 32 the constrain stage keeps, as at inference; reorder: the reorder
    stage's candidates without the partitioner (its 0.5 s budget per layer over 1,000 synthetic
    kernels would add minutes to a ranker's training for orders that tile statistics barely tell
    apart)."""

    m_exp: tuple[int, int] = (6, 11)
    k_exp: tuple[int, int] = (6, 11)
    n_exp: tuple[int, int] = (5, 19)
    sparsity: tuple[float, float] = (0.5, 0.98)
    m1: tuple[int, ...] = (1, 2, 4, 8, 12, 16, 24, 32, 48, 64, 96, 128)
    reorder: ReorderParams = field(default_factory=lambda: ReorderParams(strategies=("identity", "algorithm1", "refine")))


@dataclass(frozen=True)
class RankerParams:
    """Defaults: n_estimators=300, learning_rate=0.05, num_leaves=31, min_child_samples=10,
    relevance_levels=8 (grade 7 = the group's best time, 0 = 4× slower or worse), holdout=0.2, seed=0."""

    n_estimators: int = 300
    learning_rate: float = 0.05
    num_leaves: int = 31
    min_child_samples: int = 10
    relevance_levels: int = 8
    holdout: float = 0.2
    seed: int = 0


@dataclass(frozen=True)
class SyntheticKernel:
    m: int
    k: int
    n: int
    sparsity: float
    seed: int


def synthetic_kernels(count: int, params: SyntheticParams = SyntheticParams(), seed: int = 0) -> list[SyntheticKernel]:
    """`count` shapes and sparsities drawn from Table 3's ranges (seeded)."""
    rng = np.random.default_rng(seed)
    out = []
    for i in range(count):
        m = 2 ** int(rng.integers(params.m_exp[0], params.m_exp[1] + 1))
        k = 2 ** int(rng.integers(params.k_exp[0], params.k_exp[1] + 1))
        n = int(round(2 ** rng.uniform(params.n_exp[0], params.n_exp[1])))
        out.append(SyntheticKernel(m, k, n, float(rng.uniform(*params.sparsity)), seed * 1_000_003 + i))
    return out


def feature_value(row: dict, name: str) -> float:
    """One feature of a candidate row; a design feature from the row's `design` label where the row
    does not hold it (a row without one is the baseline's)."""
    if name not in row and name in design_features(""):  # a design feature, of every family
        return float(design_features(row.get("design") or "")[name])
    return float(row[name])


def feature_matrix(rows: Sequence[dict], features: Sequence[str] = FEATURES) -> np.ndarray:
    """The `features` (Table 1's by default) of candidate rows as float64."""
    return np.array([[feature_value(r, f) for f in features] for r in rows],
                    dtype=np.float64).reshape(len(rows), len(features))


def feature_row(candidate, sparsity: float, k: int) -> dict:
    """Table 1's features of a constrain.Candidate on a layer of this sparsity and K, and its design."""
    return {**{f: getattr(candidate, f) for f in FEATURES if hasattr(candidate, f)}, "sparsity": sparsity, "k": k,
            "design": getattr(candidate, "design", "")}


def relevance(times_us: np.ndarray, levels: int = 8) -> np.ndarray:
    """Graded relevance within one group: levels−1 for the best time, falling with log(time/best),
    0 at 4× the best or slower (and for failed launches, time = inf)."""
    t = np.asarray(times_us, dtype=np.float64)
    finite = np.isfinite(t)
    if not finite.any():
        return np.zeros(len(t), dtype=np.int32)
    best = t[finite].min()
    ratio = np.where(finite, t / best, np.inf)
    grade = (levels - 1) * (1 - np.log(ratio) / np.log(4.0))
    return np.clip(np.floor(grade + 1e-9), 0, levels - 1).astype(np.int32)


def ndcg_at(scores: np.ndarray, labels: np.ndarray, k: int = 10) -> float:
    """NDCG@k of one group, gains 2^label − 1 (LightGBM's lambdarank default)."""
    order = np.argsort(-scores, kind="stable")[:k]
    ideal = np.sort(labels)[::-1][:k]
    disc = 1 / np.log2(np.arange(2, k + 2))
    dcg = ((2.0 ** labels[order] - 1) * disc[:len(order)]).sum()
    idcg = ((2.0 ** ideal - 1) * disc[:len(ideal)]).sum()
    return float(dcg / idcg) if idcg > 0 else 1.0


@dataclass(frozen=True)
class TrainedRanker:
    booster: object  # lightgbm.Booster
    metadata: dict


def held_out_groups(groups: np.ndarray, params: RankerParams = RankerParams(),
                    layer_of_group: dict | None = None) -> set:
    """The group ids kept out of training: a `holdout` share of the groups, or, with
    `layer_of_group` (group id -> its layer), every group of a `holdout` share of the layers (a
    layer measured at two sparsities is held out at both: held out by layer, not only by sparsity)."""
    ids = np.unique(groups)
    rng = np.random.default_rng(params.seed)
    if layer_of_group is None:
        return set(rng.choice(ids, size=max(1, int(round(params.holdout * len(ids)))), replace=False).tolist())
    layers = sorted({layer_of_group[int(g)] for g in ids})
    chosen = rng.choice(len(layers), size=max(1, int(round(params.holdout * len(layers)))), replace=False)
    held_layers = {layers[i] for i in chosen}
    return {int(g) for g in ids if layer_of_group[int(g)] in held_layers}


def ranker_quality(booster, features: np.ndarray, times_us: np.ndarray, groups: np.ndarray, held: set,
                   levels: int = 8) -> dict:
    """A ranker on the `held` groups: mean NDCG@10, the mean top-1 loss (the time of the tile it
    ranks first over the group's best, minus 1) and the share of groups whose top-1 is within 2%."""
    ndcgs, losses = [], []
    for gid in sorted(held):
        mask = groups == gid
        t = times_us[mask]
        s = np.asarray(booster.predict(features[mask]), dtype=np.float64)
        ndcgs.append(ndcg_at(s, relevance(t, levels), 10))
        losses.append(float(t[int(np.argmax(s))] / t[np.isfinite(t)].min() - 1))
    return {"groups": len(held), "ndcg_at_10": float(np.mean(ndcgs)) if ndcgs else float("nan"),
            "top1_mean_loss": float(np.mean(losses)) if losses else float("nan"),
            "top1_within_2pct": float(np.mean(np.array(losses) <= 0.02)) if losses else float("nan")}


def trained_ranker(features: np.ndarray, times_us: np.ndarray, groups: np.ndarray,
                   params: RankerParams = RankerParams(), held: set | None = None,
                   names: Sequence[str] = FEATURES) -> TrainedRanker:
    """Fit LGBMRanker on candidate rows (`groups` = group id per row, rows of a group contiguous)
    and report held-out NDCG@10, the top-10 hit rate (true best tile within the predicted top 10),
    and the loss of the best of the top 10 against the true best (share within 2%, mean). `held`:
    the groups kept out (default: held_out_groups, a share of the groups)."""
    import lightgbm

    ids = np.unique(groups)
    held = held_out_groups(groups, params) if held is None else set(held)
    labels = np.concatenate([relevance(times_us[groups == g], params.relevance_levels) for g in ids])
    order = np.concatenate([np.flatnonzero(groups == g) for g in ids])
    x, y, g = features[order], labels, groups[order]
    train = ~np.isin(g, list(held))

    def sizes(mask):
        _, counts = np.unique(g[mask], return_counts=True)
        # np.unique sorts ids; rows are grouped in `ids` order, which is sorted too
        return counts

    model = lightgbm.LGBMRanker(objective="lambdarank", n_estimators=params.n_estimators,
                                learning_rate=params.learning_rate, num_leaves=params.num_leaves,
                                min_child_samples=params.min_child_samples, random_state=params.seed,
                                label_gain=[2.0 ** i - 1 for i in range(params.relevance_levels)], verbose=-1)
    model.fit(x[train], y[train], group=sizes(train))
    ndcgs, hits, losses = [], [], []
    t_sorted = times_us[order]
    for gid in sorted(held):
        mask = g == gid
        s = model.predict(x[mask])
        ndcgs.append(ndcg_at(s, y[mask], 10))
        best = int(np.argmin(t_sorted[mask]))
        top = np.argsort(-s, kind="stable")[:10]
        hits.append(best in top)
        # the paper's Table 4 view: how much slower the best of the top 10 is than the true best
        losses.append(float(t_sorted[mask][top].min() / t_sorted[mask][best] - 1))
    meta = {"features": list(names), "train_groups": int(len(ids) - len(held)), "heldout_groups": len(held),
            "rows": int(len(x)), "heldout_ndcg_at_10": float(np.mean(ndcgs)),
            "heldout_top10_hit_rate": float(np.mean(hits)),
            "heldout_top10_within_2pct": float(np.mean(np.array(losses) <= 0.02)),
            "heldout_top10_mean_loss": float(np.mean(losses)), "params": asdict(params),
            "lightgbm": lightgbm.__version__}
    return TrainedRanker(model.booster_, meta)


def ranked(rows: Sequence[dict], booster, top_k: int, features: Sequence[str] = FEATURES
           ) -> tuple[np.ndarray, np.ndarray]:
    """Scores and 1-based ranks (1 = best) of one kernel's kept candidates on the ranker's
    `features`; rank ≤ top_k is chosen."""
    if not rows:
        return np.zeros(0), np.zeros(0, dtype=np.int32)
    scores = np.asarray(booster.predict(feature_matrix(rows, features)), dtype=np.float64)
    ranks = np.empty(len(rows), dtype=np.int32)
    ranks[np.argsort(-scores, kind="stable")] = np.arange(1, len(rows) + 1)
    return scores, ranks


def chosen_candidates(rows: Sequence[dict], booster, params: RankParams = RankParams(),
                      features: Sequence[str] = FEATURES) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Scores, 1-based ranks and the `chosen` mask of one kernel's kept candidates: the ranker's
    top-K (on its `features`: a design-aware ranker's rank the tiles of several designs together),
    or with `use_rank=False` every candidate (scores 0, ranks in the given order). ValueError when
    the candidates span several designs and the ranker cannot tell designs apart."""
    if params.use_rank:
        designs = {r.get("design") or "" for r in rows}
        if len(designs) > 1 and not ranks_designs(features):
            raise ValueError("the candidates span several kernel designs and the ranker was trained on one "
                             "(train a design-aware one: lospmm train-ranker --designs auto)")
        if len(designs) > 1 and not ranks_designs(features, [design_named(d or "baseline") for d in designs]):
            raise ValueError("the candidates span staged, split or sliced designs and the ranker was trained without "
                             "them (train one with them: lospmm train-ranker --designs 'auto;staged,tiles=8')")
        scores, ranks = ranked(rows, booster, params.top_k, features)
        return scores, ranks, ranks <= params.top_k
    n = len(rows)
    return np.zeros(n), np.arange(1, n + 1, dtype=np.int32), np.ones(n, dtype=bool)


def ranker_tag(version: str | None, params: RankParams = RankParams()) -> str:
    """What the `ranker` column says: the model's version, or that every kept candidate was timed."""
    return f"lambdamart:{version}" if params.use_rank else "none (every kept candidate)"


def launch_features(row: dict) -> dict:
    """Table 1's features of a launch-list row (a full kernel or proxy of one tile): a tile's loads
    are its non-empty columns (NNC), its multiply-adds its nonzeros."""
    num_a, num_b = len(row["tile_loads"]), -(-int(row["n"]) // int(row["n1"]))
    return {"num_a_tiles": num_a, "num_b_tiles": num_b, "block_num": num_a * num_b, "sparsity": float(row["sparsity"]),
            "nnc_sum": int(np.sum(row["tile_loads"])), "nnz_max": int(np.max(row["tile_fmas"])), "m1": int(row["m1"]),
            "n1": int(row["n1"]), "k": int(row["k"]), "design": row.get("design") or ""}


def measured_rows(launches: Sequence[dict]) -> tuple[np.ndarray, np.ndarray, np.ndarray, dict]:
    """Table 1's features, measured times and group ids of a measured launch file's full kernels
    (flows.training.measured_launches' rows: role "full", the plain variant, measured ok), one group per
    (model, layer, sparsity) with 2+ tiles; and group id -> (model, layer). The features come from
    the rows themselves: a tile's loads are its non-empty columns (NNC), its FMAs its nonzeros."""
    kept = [r for r in launches if r.get("role") == "full" and not r.get("variant")
            and r.get("measure_status") == "ok" and np.isfinite(r.get("measured_us") or np.nan)]
    # repeats (files that measured the same kernel): one row each, at the median of their times
    repeats: dict[tuple, list[dict]] = {}
    for r in kept:
        repeats.setdefault((r["model"], r["layer"], float(r["sparsity"]), r["id"]), []).append(r)
    by_group: dict[tuple, list[dict]] = {}
    for (model, layer, sparsity, _), rs in repeats.items():
        by_group.setdefault((model, layer, sparsity), []).append(
            {**rs[0], "measured_us": float(np.median([r["measured_us"] for r in rs]))})
    feats, times, groups, layer_of = [], [], [], {}
    for gid, (key, rows) in enumerate(sorted((k, v) for k, v in by_group.items() if len(v) >= 2)):
        layer_of[gid] = key[:2]
        for r in rows:
            feats.append(launch_features(r))
            times.append(float(r["measured_us"]))
            groups.append(gid)
    return feature_matrix(feats), np.array(times, np.float64), np.array(groups, np.int64), layer_of


def training_rows(kernels: Sequence[SyntheticKernel], candidates_of: Callable[[SyntheticKernel], list[dict]],
                  time_of: Callable[[SyntheticKernel, dict], float], features: Sequence[str] = FEATURES
                  ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Features, times and group ids for `kernels`; both callables are passed in (Triton-style), so
    the timer can be the estimate model or a GPU. A candidate that fails to time gets inf."""
    feats, times, groups = [], [], []
    for gid, sk in enumerate(kernels):
        cands = candidates_of(sk)
        if len(cands) < 2:
            continue  # nothing to rank
        for c in cands:
            try:
                t = float(time_of(sk, c))
            except Exception:
                t = float("inf")
            feats.append(c)
            times.append(t)
            groups.append(gid)
    return feature_matrix(feats, features), np.array(times, dtype=np.float64), np.array(groups, dtype=np.int64)
