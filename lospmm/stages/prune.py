"""Stage 2, prune: a GEMM shape (and real weights, if given) -> sparse A in CSR (§7.1).

`random` is the paper's benchmark: exactly round((1 - s)·M·K) positions chosen uniformly without
replacement, values from a seeded standard normal (or, given real weights, their values there).
`magnitude` keeps the largest |w| of each layer's real weights; `global` keeps every |w| at or above
one threshold over all the model's layers (`global_magnitude_threshold`), so layers keep different
shares; `keep` takes a checkpoint that is already pruned as it is (the requested sparsity is not
applied; the achieved one is recorded). Weights that are already zero stay zero, so achieved
sparsity can exceed the request.
"""

from __future__ import annotations

import dataclasses
import zlib
from dataclasses import dataclass

import numpy as np
import scipy.sparse as sp

from lospmm.stages.extract import LayerShape
from lospmm.status import Status

METHODS = ("random", "magnitude", "global", "keep")
WEIGHT_METHODS = ("magnitude", "global", "keep")  # they need real weights


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
    if params.method not in METHODS:
        raise ValueError(f"unknown prune method {params.method!r}; choose from {METHODS}")
    if not shape.ok:
        return PrunedLayer(shape, s, float("nan"), None, Status.ERROR, shape.message or shape.status)
    if shape.m < 1 or shape.k < 1 or shape.n < 1:
        return _error(shape, s, f"{shape.layer}: empty GEMM (M={shape.m}, N={shape.n}, K={shape.k})")
    if params.method in WEIGHT_METHODS:
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
        else:  # keep: the checkpoint's own zeros
            matrix = sp.csr_matrix(np.asarray(weight, np.float32))
        matrix.eliminate_zeros()
    else:
        matrix = random_pruned(shape.m, shape.k, s, _layer_rng(shape, s, params.seed))
        if weight is not None:  # a random mask over real weights keeps their values
            problem = _weight_problem(shape, weight)
            if problem:
                return _error(shape, s, problem)
            matrix = _with_values(matrix, weight)
    achieved = 1.0 - matrix.nnz / (shape.m * shape.k)
    if matrix.nnz == 0:
        return PrunedLayer(shape, s, achieved, matrix, Status.EMPTY,
                           f"{shape.layer}: pruned to all zeros at sparsity {s} (M={shape.m}, K={shape.k})")
    return PrunedLayer(shape, s, achieved, matrix)


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
