"""Stage 2, prune: a GEMM shape (and real weights, if given) -> sparse A in CSR (§7.1).

`random` is the paper's benchmark: exactly round((1 - s)·M·K) positions chosen uniformly without
replacement, values from a seeded standard normal (or, given real weights, their values there).
`magnitude` keeps the largest |w| of each layer's real weights; `global` keeps every |w| at or above
one threshold over all the model's layers (`global_magnitude_threshold`), so layers keep different
shares; `keep` takes a checkpoint that is already pruned as it is (the requested sparsity is not
applied; the achieved one is recorded). Weights that are already zero stay zero, so achieved
sparsity can exceed the request.

`nm:N:M` is N:M sparsity (`NMPattern`): in every group of M consecutive weights along K, the N of
largest |w| are kept (random positions for the zoo); `nm:N:M:V` is NM-SpMM's vector-wise form, where
each group of V consecutive rows shares one pattern, chosen by the group's Σ|w| per column. The
pattern fixes the sparsity at 1 − N/M. `nm_pattern_of` finds the N:M pattern a matrix already has
(`keep`: a 2:4 checkpoint is recorded as such).
"""

from __future__ import annotations

import dataclasses
import zlib
from dataclasses import dataclass

import numpy as np
import scipy.sparse as sp

from lospmm.kernel.nm import held_pattern
from lospmm.stages.extract import LayerShape
from lospmm.status import Status

METHODS = ("random", "magnitude", "global", "keep", "nm:N:M", "nm:N:M:V")
WEIGHT_METHODS = ("magnitude", "global", "keep")  # they need real weights


@dataclass(frozen=True, order=True)
class NMPattern:
    """N:M sparsity: at most `n` of every `m` consecutive weights along K kept; rows in groups of
    `vector` consecutive rows share one pattern (1: element-wise; a layer's last group holds the rows
    left, fewer where its rows are not a multiple of `vector`, as NM-SpMM pads them)."""

    n: int
    m: int
    vector: int = 1

    def __post_init__(self):
        if not (1 <= self.n < self.m):
            raise ValueError(f"N:M needs 1 <= N < M, got {self.n}:{self.m}")
        if self.vector < 1:
            raise ValueError(f"the vector length must be >= 1, got {self.vector}")

    @property
    def sparsity(self) -> float:
        return 1.0 - self.n / self.m

    @property
    def method(self) -> str:
        """The --prune spelling: nm:N:M, or nm:N:M:V for a vector-wise pattern."""
        return f"nm:{self.n}:{self.m}" + (f":{self.vector}" if self.vector > 1 else "")

    def __str__(self) -> str:
        return f"{self.n}:{self.m}" + (f" (vectors of {self.vector} rows)" if self.vector > 1 else "")

    def problem(self, layer: str, k: int) -> str:
        """Why a layer of K columns cannot take this pattern ("" when it can): its groups run along K
        (any row count takes it, a vector-wise pattern's last vector holding the rows left)."""
        if k < self.m:
            return f"{layer}: K={k} is narrower than one group of M={self.m} ({self.method})"
        if k % self.m:
            return f"{layer}: K={k} is not a multiple of M={self.m} ({self.method} groups K by M)"
        return ""


def run_sparsities(given, method: str | None, default=(0.9,)) -> tuple[float, ...]:
    """The sparsities a run prunes to: those given, else the N:M pattern's own, else `default`."""
    if given:
        return tuple(float(s) for s in given)
    try:
        pattern = nm_pattern(method or "")
    except ValueError:  # a malformed method: the run's checks name it
        pattern = None
    return (pattern.sparsity,) if pattern else tuple(default)


def nm_pattern(method: str) -> NMPattern | None:
    """The NMPattern of a prune method "nm:N:M" or "nm:N:M:V" (None for another method; ValueError
    for a malformed one, saying what is wrong)."""
    if not method.startswith("nm:"):
        return None
    parts = method.split(":")[1:]
    if len(parts) not in (2, 3) or not all(p.isdigit() for p in parts):
        raise ValueError("write nm:N:M (e.g. nm:2:4) or nm:N:M:V (V consecutive rows share a pattern)")
    return NMPattern(*(int(p) for p in parts))


@dataclass(frozen=True)
class PruneParams:
    """Defaults: method="random" (zoo; use "magnitude" for real weights), seed=0."""

    method: str = "random"
    seed: int = 0


@dataclass(frozen=True)
class PrunedLayer:
    """A pruned weight matrix A (M×K, float32 CSR with sorted, unique column indices)."""

    shape: LayerShape
    sparsity_requested: float
    sparsity_achieved: float
    matrix: sp.csr_matrix | None
    status: Status = Status.OK  # OK, EMPTY (pruned to all zeros) or ERROR
    message: str = ""
    pattern: NMPattern | None = None  # N:M: the one pruned to, or (keep) the one the weights have
    zeros_before: float = float("nan")  # the share of zeros in the weights as read (NaN: no weights)

    @property
    def nnz(self) -> int:
        return 0 if self.matrix is None else int(self.matrix.nnz)


def default_method(source_kind: str) -> str:
    """`random` for the zoo (the paper's benchmark: no weights), `magnitude` for real weights."""
    return "magnitude" if source_kind == "weights" else "random"


def checked_sparsity(sparsity: float) -> float:
    """`sparsity` if it lies in the open interval (0, 1), else ValueError."""
    s = float(sparsity)
    if not 0.0 < s < 1.0:
        raise ValueError(f"sparsity must lie strictly between 0 and 1, got {sparsity}")
    return s


def pruned_layer(
    shape: LayerShape,
    sparsity: float,
    params: PruneParams = PruneParams(),
    weight: np.ndarray | None = None,
    threshold: float | None = None,
) -> PrunedLayer:
    """Prune one layer; problems with the layer become a status, not an exception. `threshold`:
    the model-wide |w| threshold of the `global` method. A grouped convolution (groups > 1, its
    shape's K the dense convolution's cin·kh·kw) is pruned as its own weight (Cout × cin/groups·kh·kw)
    and then laid out block-diagonally in that K (grouped_as_dense): its sparsity is the weight's."""
    groups = shape.groups if shape.op == "conv" and shape.groups > 1 else 1
    if groups > 1:
        if shape.m % groups or shape.k % groups:
            return _error(shape, checked_sparsity(sparsity), f"{shape.layer}: M={shape.m} and K={shape.k} must both "
                                                             f"divide into groups={groups}")
        own = pruned_layer(dataclasses.replace(shape, k=shape.k // groups, groups=1), sparsity, params, weight,
                           threshold)
        matrix = None if own.matrix is None else grouped_as_dense(own.matrix, groups)
        return dataclasses.replace(own, shape=shape, matrix=matrix)
    s = checked_sparsity(sparsity)
    pattern = nm_pattern(params.method)
    if pattern is None and params.method not in METHODS:
        raise ValueError(f"unknown prune method {params.method!r}; choose from {METHODS}")
    if not shape.ok:
        return PrunedLayer(shape, s, float("nan"), None, Status.ERROR, shape.message or shape.status)
    if shape.m < 1 or shape.k < 1 or shape.n < 1:
        return _error(shape, s, f"{shape.layer}: empty GEMM (M={shape.m}, N={shape.n}, K={shape.k})")
    if pattern is not None:
        problem = pattern.problem(shape.layer, shape.k) or (
            _weight_problem(shape, weight) if weight is not None else "")
        if problem:
            return _error(shape, s, problem)
        if weight is not None:
            matrix = nm_pruned(weight, pattern)
        else:
            matrix = random_nm_pruned(shape.m, shape.k, pattern, _layer_rng(shape, s, params.seed))
    elif params.method in WEIGHT_METHODS:
        if weight is None:
            return _error(shape, s, f"{shape.layer}: {params.method} pruning needs the layer's weights")
        problem = _weight_problem(shape, weight)
        if problem:
            return _error(shape, s, problem)
        if params.method == "magnitude":
            matrix = magnitude_pruned(weight, s)
        elif params.method == "global":
            if threshold is None:
                raise ValueError("global pruning needs the model-wide threshold (global_magnitude_threshold)")
            matrix = sp.csr_matrix(np.where(np.abs(weight) >= threshold, weight, 0).astype(np.float32))
        else:  # keep: the checkpoint's own zeros, and the N:M pattern they may form
            matrix = sp.csr_matrix(np.asarray(weight, np.float32))
        matrix.eliminate_zeros()
        if params.method == "keep":
            pattern = nm_pattern_of(matrix)
    else:
        matrix = random_pruned(shape.m, shape.k, s, _layer_rng(shape, s, params.seed))
        if weight is not None:  # a random mask over real weights keeps their values
            problem = _weight_problem(shape, weight)
            if problem:
                return _error(shape, s, problem)
            matrix = _with_values(matrix, weight)
    achieved = 1.0 - matrix.nnz / (shape.m * shape.k)
    zeros = zeros_share(weight)
    if matrix.nnz == 0:
        return PrunedLayer(shape, s, achieved, matrix, Status.EMPTY,
                           f"{shape.layer}: pruned to all zeros at sparsity {s} (M={shape.m}, K={shape.k})",
                           zeros_before=zeros)
    return PrunedLayer(shape, s, achieved, matrix, pattern=pattern, zeros_before=zeros)


def zeros_share(weight: np.ndarray | None) -> float:
    """The share of a weight's entries that are zero (NaN for no weight): a trained dense layer has
    next to none, a pruned checkpoint's its sparsity."""
    if weight is None or weight.size == 0:
        return float("nan")
    return 1.0 - np.count_nonzero(weight) / weight.size


# a layer whose weights hold at least this share of zeros was pruned before it reached the run (a
# dense trained layer has next to none)
PRUNED_BEFORE_SHARE = 0.25


@dataclass(frozen=True)
class PrunedAgain:
    """A weights source whose layers were pruned before the run pruned them again (by a method other
    than `keep`): how many of its searched layers held at least PRUNED_BEFORE_SHARE zeros, the share
    of zeros in those layers' weights, and the sparsities at which they kept more zeros than asked."""

    layers: int
    of_layers: int
    zeros: float
    method: str
    sparsities: tuple[float, ...]
    kept_own: tuple[float, ...]  # requested sparsities below the layers' own zeros: achieved > requested

    def line(self, source: str) -> str:
        """One line for the run's end (and lt.search's warning)."""
        asked = ", ".join(f"{x:g}" for x in self.sparsities)
        out = (f"{source}: {self.layers} of its {self.of_layers} searched layers already held zeros "
               f"({self.zeros:.1%} of their weights: pruned before?) and were pruned again by {self.method} to {asked}; "
               f"`--prune keep` searches pruned weights as they are")
        if self.kept_own:
            out += (f" (at sparsity {', '.join(f'{x:g}' for x in self.kept_own)} they kept their own zeros: "
                    f"sparser than asked)")
        return out


def pruned_again(rows: list[dict]) -> PrunedAgain | None:
    """From one source's 02_pruned rows (any sparsities; `layer`, `m`, `k`, `method`, `zeros_before`,
    `sparsity_requested`, `sparsity_achieved`): whether a pruned checkpoint was pruned again, None
    when not (`keep`, no weights read, or no layer held PRUNED_BEFORE_SHARE zeros)."""
    layers: dict[str, dict] = {}
    for r in rows:
        zeros = r.get("zeros_before")
        if r.get("method") == "keep" or zeros is None or not np.isfinite(zeros) or zeros >= 1.0:
            continue  # (a layer of zeros only: pruned to nothing, a problem row of its own)
        layers.setdefault(r["layer"], []).append(r)
    pruned = {name: rs for name, rs in layers.items()
              if rs[0]["zeros_before"] >= PRUNED_BEFORE_SHARE and any(_changed_or_mislabelled(r) for r in rs)}
    if not pruned:
        return None
    firsts = [rs[0] for rs in pruned.values()]
    size = sum(r["m"] * r["k"] for r in firsts)
    zeros = sum(r["zeros_before"] * r["m"] * r["k"] for r in firsts) / size
    mine = [r for rs in pruned.values() for r in rs]
    sparsities = tuple(sorted({float(r["sparsity_requested"]) for r in mine}))
    kept_own = tuple(sorted({float(r["sparsity_requested"]) for r in mine if _sparser_than_asked(r)}))
    return PrunedAgain(len(pruned), len(layers), zeros, firsts[0]["method"], sparsities, kept_own)


def _achieved(row: dict) -> float:
    achieved = row.get("sparsity_achieved")
    return float("nan") if achieved is None else achieved


def _sparser_than_asked(row: dict) -> bool:
    # the file's own zeros kept past the sparsity asked: a run named for a sparsity its kernels do not have
    return _achieved(row) > row["sparsity_requested"] + 0.005


def _changed_or_mislabelled(row: dict) -> bool:
    # pruning removed weights the file held, or kept its zeros past the sparsity asked; a 2:4 checkpoint
    # pruned to nm:2:4 is neither: the same A, as asked (NaN compares false: a row with no A)
    return _achieved(row) > row["zeros_before"] + 1e-6 or _sparser_than_asked(row)


def grouped_as_dense(weight: sp.csr_matrix, groups: int) -> sp.csr_matrix:
    """A grouped convolution's weight (Cout × cin/groups·kh·kw, CSR) as the dense convolution's
    A (Cout × cin·kh·kw): output channel o of group g = o // (Cout/groups) reads input channels
    g·cin/groups … (g+1)·cin/groups − 1, so its columns move by g·(cin/groups·kh·kw). The zeros
    between the blocks are never baked: a kernel's code stays proportional to the nonzeros."""
    m, k = weight.shape
    per_group = m // groups
    rows = np.repeat(np.arange(m), np.diff(weight.indptr))
    indices = weight.indices + (rows // per_group) * k
    return sp.csr_matrix((weight.data.copy(), indices.astype(np.int32), weight.indptr.copy()), shape=(m, k * groups))


def random_pruned(m: int, k: int, sparsity: float, rng: np.random.Generator) -> sp.csr_matrix:
    """Exactly round((1 - sparsity)·m·k) nonzeros at uniform positions, N(0, 1) values."""
    nnz = int(round((1.0 - sparsity) * m * k))
    flat = np.sort(rng.choice(m * k, size=nnz, replace=False))
    rows, cols = np.divmod(flat, k)
    indptr = np.zeros(m + 1, dtype=np.int64)
    np.cumsum(np.bincount(rows, minlength=m), out=indptr[1:])
    values = rng.standard_normal(nnz).astype(np.float32)
    # Exact zeros would silently drop out of the pattern; N(0,1) makes them vanishingly rare.
    values[values == 0] = np.float32(1e-3)
    return sp.csr_matrix((values, cols.astype(np.int32), indptr.astype(np.int32)), shape=(m, k))


def nm_pruned(weight: np.ndarray, pattern: NMPattern) -> sp.csr_matrix:
    """In every group of `pattern.m` consecutive columns of every group of `pattern.vector` rows,
    the `pattern.n` columns of largest Σ|w| over those rows kept (ties: the lower column); K a
    multiple of M (NMPattern.problem). The last group of rows holds those left when V does not divide them."""
    w = np.ascontiguousarray(weight, dtype=np.float32)
    rows, k = w.shape
    v, m, n = pattern.vector, pattern.m, pattern.n
    padded = _rows_padded(np.abs(w), v)  # rows of zeros add nothing to the last group's sums
    score = padded.reshape(-1, v, k // m, m).sum(axis=1)  # (row groups, column groups, M)
    top = np.argsort(-score, axis=-1, kind="stable")[..., :n]
    keep = np.zeros_like(score, dtype=bool)
    np.put_along_axis(keep, top, True, axis=-1)
    mask = _group_rows(keep, v, rows, k) & (w != 0)
    return sp.csr_matrix(np.where(mask, w, np.float32(0)))


def random_nm_pruned(rows: int, k: int, pattern: NMPattern, rng: np.random.Generator) -> sp.csr_matrix:
    """N uniformly chosen positions in every group of M columns (one choice per vector of V rows),
    N(0, 1) values: the zoo's N:M benchmark weights."""
    v, m, n = pattern.vector, pattern.m, pattern.n
    score = rng.random((-(-rows // v), k // m, m))
    keep = np.zeros_like(score, dtype=bool)
    np.put_along_axis(keep, np.argsort(score, axis=-1)[..., :n], True, axis=-1)
    mask = _group_rows(keep, v, rows, k)
    values = rng.standard_normal((rows, k)).astype(np.float32)
    values[values == 0] = np.float32(1e-3)  # an exact zero would drop out of the pattern
    return sp.csr_matrix(np.where(mask, values, np.float32(0)))


def _rows_padded(a: np.ndarray, vector: int) -> np.ndarray:
    """`a` with rows of zeros appended up to a multiple of `vector`."""
    short = -a.shape[0] % vector
    return np.pad(a, ((0, short), (0, 0))) if short else a


def _group_rows(keep: np.ndarray, vector: int, rows: int, k: int) -> np.ndarray:
    """The (rows, k) mask of each group's kept columns (keep: (groups, K/M, M)), its padding rows cut."""
    return np.repeat(keep[:, None], vector, axis=1).reshape(-1, k)[:rows]


def nm_pattern_of(matrix: sp.csr_matrix) -> NMPattern | None:
    """The N:M pattern `matrix` holds (lospmm.kernel.nm.held_pattern: at most N nonzeros in every
    group of M columns and exactly N in at least 90% of the groups of its non-empty rows, M in NM_GROUPS
    dividing K, N < M, the least N/M, with the longest vector of consecutive rows sharing each group's
    columns); None when no group size fits."""
    held = held_pattern(matrix)
    return None if held is None else NMPattern(*held)


def magnitude_pruned(weight: np.ndarray, sparsity: float) -> sp.csr_matrix:
    """Keep the round((1 - sparsity)·size) entries of largest |w| (ties: lowest flat index)."""
    w = np.ascontiguousarray(weight, dtype=np.float32)
    keep = int(round((1.0 - sparsity) * w.size))
    mask = np.zeros(w.size, dtype=bool)
    if keep > 0:
        order = np.argsort(-np.abs(w.ravel()), kind="stable")[:keep]
        mask[order] = True
    mask &= w.ravel() != 0
    return sp.csr_matrix(np.where(mask.reshape(w.shape), w, np.float32(0)))


def global_magnitude_threshold(weights, sparsity: float) -> float:
    """The |w| at or above which round((1 - sparsity)·total) weights of all `weights` lie (one
    threshold for the whole model: the `global` method). Ties at the threshold are all kept."""
    s = checked_sparsity(sparsity)
    magnitudes = np.concatenate([np.abs(np.asarray(w, np.float32)).ravel() for w in weights])
    keep = int(round((1.0 - s) * magnitudes.size))
    if keep <= 0:
        return float("inf")
    return float(np.partition(magnitudes, magnitudes.size - keep)[magnitudes.size - keep])


def _with_values(mask: sp.csr_matrix, weight: np.ndarray) -> sp.csr_matrix:
    rows = np.repeat(np.arange(mask.shape[0]), np.diff(mask.indptr))
    out = sp.csr_matrix((weight[rows, mask.indices].astype(np.float32), mask.indices, mask.indptr), shape=mask.shape)
    out.eliminate_zeros()
    return out


def _layer_rng(shape: LayerShape, sparsity: float, seed: int) -> np.random.Generator:
    # Seeded per (model, layer, sparsity) so one layer's matrix does not depend on the others.
    tag = zlib.crc32(f"{shape.model}/{shape.layer}/{sparsity!r}".encode())
    return np.random.default_rng([seed, tag])


def _weight_problem(shape: LayerShape, weight: np.ndarray) -> str:
    if weight.shape != (shape.m, shape.k):
        return f"{shape.layer}: weight shape {weight.shape} does not match M×K = {shape.m}×{shape.k}"
    if not np.issubdtype(weight.dtype, np.number) or np.issubdtype(weight.dtype, np.complexfloating):
        return f"{shape.layer}: weight dtype {weight.dtype} is not a real number type"
    bad = int(np.size(weight) - np.count_nonzero(np.isfinite(weight)))
    if bad:
        return f"{shape.layer}: weight has {bad} NaN/Inf value(s)"
    return ""


def _error(shape: LayerShape, s: float, message: str) -> PrunedLayer:
    return PrunedLayer(shape, s, float("nan"), None, Status.ERROR, message)
