"""A weights source's layers as the extract and prune stages read them: its shapes (`source_shapes`),
each layer's weight matrix A (`layer_weight`), and the share of zeros those layers already hold
(`kept_sparsity`: what `--prune keep` runs at when no sparsity is given)."""

from __future__ import annotations

import dataclasses

import numpy as np

from lospmm.flows.inputs.onnx_model import graph_weight_matrix, graph_weights, is_onnx
from lospmm.flows.inputs.sources import Source
from lospmm.flows.inputs.weights import GRAPH_METADATA, WeightsFile, graph_of, planned_weights
from lospmm.stages.extract import LayerShape, ModelConfig, graph_shapes, weight_shapes


def source_shapes(source: Source, weights: WeightsFile | None) -> list[LayerShape]:
    """The layers of a weights file (`weights`: it opened, None for an ONNX model): from an ONNX
    graph, from the geometry lospmm.torch.save_model stored, or from the tensors' names and shapes
    (a weight stored input × output, `source.transposed`, with the M and K of its transpose)."""
    if is_onnx(source.path):
        return graph_shapes(source.label, graph_weights(source.path, source.input_shapes), source.tokens, source.images)
    if GRAPH_METADATA in weights.metadata():  # lospmm.torch.save_model: shapes from a forward pass
        return graph_shapes(source.label, graph_of(weights), source.tokens, 1)
    shapes = weight_shapes(source.label, weights.infos(), source.tokens, source.model_config or ModelConfig(),
                           source.sequences or None)
    return [dataclasses.replace(s, m=s.k, k=s.m) if s.op == "linear" and s.layer in source.transposed else s
            for s in shapes]


def layer_weight(source: Source, shape: LayerShape, weights: WeightsFile | None):
    """A searched layer's weight as A (M × K: a conv weight [Cout, Cin, kh, kw] flattened, one stored
    input × output transposed), or None for a zoo layer or one extract did not pass."""
    if not (source.path and shape.ok):
        return None
    if is_onnx(source.path):
        return graph_weight_matrix(source.path, shape.layer, source.input_shapes)
    w = weights.tensor(shape.layer)
    if shape.layer in source.transposed:
        return np.ascontiguousarray(w.T)
    return w.reshape(w.shape[0], -1) if w.ndim == 4 else w


def kept_sparsity(source: Source) -> float:
    """The share of zeros over a weights source's searched layers (not its biases, norms or skipped
    tensors), to 3 decimals; ValueError naming the file when they hold no zero (nothing to keep)."""
    with planned_weights(source.path, source.sha256) as weights:
        zeros = total = 0
        for shape in source_shapes(source, weights):
            a = layer_weight(source, shape, weights)
            if a is not None:
                zeros, total = zeros + int((a == 0).sum()), total + a.size
    if not zeros:
        raise ValueError(f"{source.path}: --prune keep keeps the zeros its layers hold, and its {total:,} weights "
                         f"searched hold none: prune them first, or give --prune magnitude with a --sparsity")
    return round(min(max(zeros / total, 0.001), 0.999), 3)


KEPT_TOLERANCE = 0.005  # a --sparsity given with keep names the run where it is the file's share to this


def kept_run_sparsity(source: Source, given: tuple[float, ...] = ()) -> float:
    """The sparsity a `--prune keep` run of `source` is named for: the share of zeros its layers hold
    (kept_sparsity), or the one sparsity given where it is that share (to KEPT_TOLERANCE). ValueError
    in one line where the layers hold no zero, or the sparsity given is not theirs: keep prunes
    nothing, so a run named for another sparsity would say what its kernels do not hold."""
    held = kept_sparsity(source)
    given = tuple(dict.fromkeys(given))  # (--sparsity 0.5 --sparsity 0.5 is one)
    if not given:
        return held
    if len(given) > 1 or abs(given[0] - held) > KEPT_TOLERANCE + 1e-9:  # (0.81 for 0.805 in floats)
        asked = " ".join(map(str, given))
        raise ValueError(f"{source.path}: --prune keep keeps the zeros its layers hold, a share of {held:g}, and "
                         f"prunes nothing: leave --sparsity out, or give {held:g}, not {asked}")
    return given[0]
