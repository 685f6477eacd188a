"""Reading an ONNX model (the `onnx` extra): which initializers are GEMM weights (MatMul, Gemm,
Conv), with the conv attributes and the activation shapes the graph states (after ONNX shape
inference), and each weight as the GEMM's A (M×K). Everything else is listed with its reason."""

from __future__ import annotations

from functools import lru_cache
from pathlib import Path

import numpy as np

from lospmm.stages.extract import GraphWeight, conv_output_size


class OnnxModelError(ValueError):
    """An ONNX model is missing, unreadable or uses a weight in a way we do not handle; the message
    names the file (and the node)."""


def is_onnx(path: str | Path) -> bool:
    return Path(path).suffix.lower() == ".onnx"


def graph_weights(path: str | Path) -> list[GraphWeight]:
    """Every initializer of the model, as the graph uses it (GraphWeight.op "" with a reason when no GEMM)."""
    return list(_analysed(str(path))[1].values())


def graph_weight_matrix(path: str | Path, name: str) -> np.ndarray:
    """The GEMM's A (M×K, float32) of initializer `name`: a MatMul weight transposed, a Conv weight
    flattened to [Cout, Cin·kh·kw] (PyTorch's order, as conv kernels expect)."""
    from onnx import numpy_helper

    model, weights = _analysed(str(path))
    weight = weights.get(name)
    if weight is None or not weight.op:
        raise ValueError(f"{name}: not a GEMM weight of {path}")
    init = next(t for t in model.graph.initializer if t.name == name)
    array = numpy_helper.to_array(init).astype(np.float32)
    if weight.op == "conv":
        return array.reshape(array.shape[0], -1)
    return array if array.shape == (weight.rows, weight.cols) else array.T


def _analysed(path: str):
    """(model, initializer name -> GraphWeight), read and analysed once per file version (a file
    changed since is read again): prune asks for one weight at a time."""
    p = Path(path)
    if not p.is_file():
        raise OnnxModelError(f"ONNX model {p} does not exist or is not a file")
    stat = p.stat()
    return _analysed_version(path, stat.st_mtime_ns, stat.st_size)


@lru_cache(maxsize=2)
def _analysed_version(path: str, mtime_ns: int, size: int):
    try:
        import onnx
    except ImportError:
        raise OnnxModelError("an ONNX model needs the onnx package: pip install 'lospmm[onnx]'") from None
    try:
        model = onnx.shape_inference.infer_shapes(onnx.load(path))
    except Exception as e:
        raise OnnxModelError(f"ONNX model {path} is not readable: {type(e).__name__}: {e}") from None
    shapes = {}  # every value's static shape, -1 for a symbolic dimension
    for v in [*model.graph.input, *model.graph.value_info, *model.graph.output]:
        dims = v.type.tensor_type.shape.dim
        shapes[v.name] = tuple(d.dim_value if d.HasField("dim_value") else -1 for d in dims)
    return model, _weights(model, shapes)


def _weights(model, shapes: dict[str, tuple[int, ...]]) -> dict[str, GraphWeight]:
    inits = {t.name: tuple(int(d) for d in t.dims) for t in model.graph.initializer}
    # torch's exporter passes shared initializers through Identity nodes: see through them
    alias: dict[str, str] = {}
    for node in model.graph.node:
        if node.op_type == "Identity" and node.input and (node.input[0] in inits or node.input[0] in alias):
            alias[node.output[0]] = alias.get(node.input[0], node.input[0])

    def initializer(value: str) -> str:
        return alias.get(value, value)

    used: dict[str, GraphWeight] = {}
    why_not: dict[str, str] = {}
    for node in model.graph.node:
        attrs = {a.name: _attribute(a) for a in node.attribute}
        where = f"{node.op_type} {node.name or node.output[0]}"
        if node.op_type == "Identity" and node.input and initializer(node.input[0]) in inits:
            continue  # judged by the node that consumes its output
        if node.op_type in ("MatMul", "Gemm") and len(node.input) >= 2 and initializer(node.input[1]) in inits:
            name = initializer(node.input[1])
            dims = inits[name]
            if len(dims) != 2 or (node.op_type == "Gemm" and attrs.get("transA", 0)):
                why_not.setdefault(name, f"{where}: a {len(dims)}-D or transposed-input weight")
                continue
            # MatMul: X·W with W (K×M); Gemm transB=1: W is (M×K) already
            rows, cols = (dims[0], dims[1]) if node.op_type == "Gemm" and attrs.get("transB", 0) else (dims[1], dims[0])
            x = shapes.get(node.input[0])
            n = int(np.prod(x[:-1])) if x and all(d > 0 for d in x[:-1]) else 0
            used[name] = GraphWeight(name, "linear", rows, cols, n)
            if node.op_type == "Gemm" and len(node.input) > 2:
                why_not.setdefault(initializer(node.input[2]), f"bias of {where}")
        elif node.op_type == "Conv" and len(node.input) >= 2 and initializer(node.input[1]) in inits:
            name = initializer(node.input[1])
            dims = inits[name]
            x = shapes.get(node.input[0])
            if len(dims) != 4 or not x or len(x) != 4 or x[2] <= 0 or x[3] <= 0:
                why_not.setdefault(name, f"{where}: not a 2-D convolution with a static input size in the graph")
                continue
            strides, dilations = attrs.get("strides", [1, 1]), attrs.get("dilations", [1, 1])
            pads = attrs.get("pads", [0, 0, 0, 0])
            if len(set(strides)) != 1 or len(set(pads)) != 1 or len(set(dilations)) != 1:
                why_not.setdefault(name, f"{where}: uneven strides, pads or dilations (not supported yet)")
                continue
            if attrs.get("auto_pad", "NOTSET") not in ("NOTSET", "VALID"):
                why_not.setdefault(name, f"{where}: auto_pad {attrs['auto_pad']} (not supported yet)")
                continue
            cout, cin_per_group, kh, kw = dims
            stride, pad, dilation = strides[0], pads[0], dilations[0]
            h_out = conv_output_size(x[2], kh, stride, pad, dilation)
            w_out = conv_output_size(x[3], kw, stride, pad, dilation)
            if h_out < 1 or w_out < 1:
                why_not.setdefault(name, f"{where}: window {kh}×{kw} larger than the padded input")
                continue
            geometry = {"cin": x[1], "kh": kh, "kw": kw, "stride": stride, "pad": pad,
                        "groups": int(attrs.get("group", 1)), "h_in": x[2], "w_in": x[3], "h_out": h_out,
                        "w_out": w_out, "dilation": dilation}
            used[name] = GraphWeight(name, "conv", cout, cin_per_group * kh * kw, 0, conv=geometry,
                                     batch=x[0] if x[0] > 0 else 0)
            if len(node.input) > 2:
                why_not.setdefault(initializer(node.input[2]), f"bias of {where}")
        else:
            for i, value in enumerate(node.input):
                name = initializer(value)
                if name in inits:
                    kind = "embedding/lookup table" if node.op_type == "Gather" and i == 0 else "input"
                    why_not.setdefault(name, f"{kind} of {where}")
    return {name: used.get(name) or GraphWeight(name, "", reason=why_not.get(name, "not an input of any node"))
            for name in inits}


def _attribute(a):
    from onnx import helper

    value = helper.get_attribute_value(a)
    return value.decode() if isinstance(value, bytes) else (list(value) if isinstance(value, (list, tuple)) else value)
