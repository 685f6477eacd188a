"""Reading an ONNX model (the `onnx` extra): which initializers (or Constant nodes' tensors) are GEMM
weights (MatMul, Gemm, Conv), with the conv attributes and the activation shapes the graph states
(after ONNX shape inference, with any input dims the run fixes), and each weight as the GEMM's A
(M×K). Everything else is listed with its reason. A weight whose name an exporter generated
(`val_55`, `onnx::MatMul_35`) is named `<module path>.weight` from the node that uses it."""

from __future__ import annotations

import ast
import re
from collections import Counter
from dataclasses import replace
from functools import lru_cache
from pathlib import Path

import numpy as np

from lospmm.kernel.geometry import conv_output_size
from lospmm.stages.extract import GraphWeight


class OnnxModelError(ValueError):
    """An ONNX model is missing, unreadable or uses a weight in a way we do not handle; the message
    names the file (and the node)."""


def is_onnx(path: str | Path) -> bool:
    return Path(path).suffix.lower() == ".onnx"


InputShapes = tuple[tuple[str, tuple[int, ...]], ...]  # (graph input, its dims), as --input-shape gives them


def graph_weights(path: str | Path, input_shapes: InputShapes = ()) -> list[GraphWeight]:
    """Every initializer (and float Constant tensor) of the model, as the graph uses it (GraphWeight.op
    "" with a reason when no GEMM); `input_shapes` fixes those graph inputs' dims first."""
    return list(_analysed(str(path), input_shapes)[0].values())


def graph_weight_matrix(path: str | Path, name: str, input_shapes: InputShapes = ()) -> np.ndarray:
    """The GEMM's A (M×K, float32) of layer `name` (as graph_weights names it): a MatMul weight
    transposed, a Conv weight flattened to [Cout, Cin·kh·kw] (PyTorch's order, as conv kernels expect)."""
    from onnx import numpy_helper

    weights, tensors = _analysed(str(path), input_shapes)
    weight = weights.get(name)
    if weight is None or not weight.op:
        raise ValueError(f"{name}: not a GEMM weight of {path}")
    tensor, transposed = tensors[name]
    array = numpy_helper.to_array(tensor).astype(np.float32)
    if weight.op == "conv":
        return array.reshape(array.shape[0], -1)
    return array.T if transposed else array


def _analysed(path: str, input_shapes: InputShapes = ()):
    """(layer name -> GraphWeight, layer name -> (its TensorProto, whether it is stored K×M)), read
    and analysed once per file version and input shapes (a file changed since is read again): prune
    asks for one weight at a time."""
    p = Path(path)
    if not p.is_file():
        raise OnnxModelError(f"ONNX model {p} does not exist or is not a file")
    stat = p.stat()
    return _analysed_version(path, stat.st_mtime_ns, stat.st_size, tuple(input_shapes))


@lru_cache(maxsize=2)
def _analysed_version(path: str, mtime_ns: int, size: int, input_shapes: InputShapes):
    try:
        import onnx
    except ImportError:
        raise OnnxModelError("an ONNX model needs the onnx package: pip install 'lospmm[onnx]'") from None
    try:
        model = onnx.load(path)
    except Exception as e:
        raise OnnxModelError(f"ONNX model {path} is not readable: {type(e).__name__}: {e}") from None
    if input_shapes:
        _fix_input_dims(model, path, input_shapes)
    try:
        model = onnx.shape_inference.infer_shapes(model)
    except Exception as e:
        raise OnnxModelError(f"ONNX model {path} is not readable: {type(e).__name__}: {e}") from None
    shapes = {}  # every value's static shape, -1 for a symbolic dimension
    for v in [*model.graph.input, *model.graph.value_info, *model.graph.output]:
        dims = v.type.tensor_type.shape.dim
        shapes[v.name] = tuple(d.dim_value if d.HasField("dim_value") else -1 for d in dims)
    return _weights(model, shapes)


def with_image_batch(path: str | Path, input_shapes: InputShapes, images: int) -> InputShapes:
    """`input_shapes` and, for each image input of the graph (4-D, its batch symbolic, channels and
    size static) that they do not name, that input with its batch set to `images` (--cnn-batch): so
    that the layers after the convolutions (a classifier's Gemm) get the same batch in their N, not
    --tokens as a symbolic N would. An unreadable model is left to graph_weights to name."""
    try:
        stat = Path(path).stat()
        inputs = _image_inputs(str(path), stat.st_mtime_ns, stat.st_size)
    except OSError:
        return input_shapes
    given = {name for name, _ in input_shapes}
    return (*input_shapes, *((name, (images, *dims)) for name, dims in inputs if name not in given))


@lru_cache(maxsize=2)
def _image_inputs(path: str, mtime_ns: int, size: int) -> tuple[tuple[str, tuple[int, ...]], ...]:
    """(name, its static channels and size) of each 4-D graph input whose batch alone is symbolic, read
    once per file version (the run's checks and its plan both ask)."""
    try:
        import onnx

        graph = onnx.load(path, load_external_data=False).graph
    except Exception:
        return ()
    initializers = {t.name for t in graph.initializer}
    found = []
    for v in graph.input:
        dims = v.type.tensor_type.shape.dim
        if v.name not in initializers and len(dims) == 4 and not dims[0].HasField("dim_value") and \
                all(d.HasField("dim_value") and d.dim_value > 0 for d in dims[1:]):
            found.append((v.name, tuple(d.dim_value for d in dims[1:])))
    return tuple(found)


def _fix_input_dims(model, path: str, input_shapes: InputShapes) -> None:
    """Set the named graph inputs' dims (symbolic ones, typically batch, H, W) before shape inference,
    so that the convolutions after them get their sizes; OnnxModelError names an input that is not
    there, a rank or a static dim that differs from the graph's."""
    inputs = {v.name: v for v in model.graph.input}
    initializers = {t.name for t in model.graph.initializer}  # old exporters list them as inputs too
    for name, dims in input_shapes:
        if name not in inputs or name in initializers:
            there = ", ".join(n for n in inputs if n not in initializers) or "none"
            raise OnnxModelError(f"--input-shape {name}: {path} has no input {name!r} (its inputs: {there})")
        graph_dims = inputs[name].type.tensor_type.shape.dim
        if len(graph_dims) != len(dims):
            raise OnnxModelError(f"--input-shape {name}: {len(dims)} dims given, input {name!r} of {path} has "
                                 f"{len(graph_dims)}")
        for i, (d, value) in enumerate(zip(graph_dims, dims)):
            if d.HasField("dim_value") and d.dim_value != value:
                raise OnnxModelError(f"--input-shape {name}: dim {i} is {d.dim_value} in {path}, not {value}")
            d.dim_value = value  # replaces a symbolic dim_param


def _constants(model) -> dict[str, object]:
    """Constant nodes' float tensors of one or more dims, by output name: some exporters hold weights
    there instead of in initializers. Scalars and integer (shape, index) constants are no weights."""
    from onnx import TensorProto

    floats = {TensorProto.FLOAT, TensorProto.FLOAT16, TensorProto.BFLOAT16, TensorProto.DOUBLE}
    out = {}
    for node in model.graph.node:
        if node.op_type != "Constant" or not node.output:
            continue
        value = next((a.t for a in node.attribute if a.name == "value" and a.HasField("t")), None)
        if value is not None and value.data_type in floats and len(value.dims) >= 1:
            out[node.output[0]] = value
    return out


# names exporters make up for a folded or constant tensor: the dynamo exporter's `val_55`, the
# TorchScript exporter's `onnx::MatMul_35` (or a bare number) and its node outputs `/a/b/Constant_output_0`
_GENERATED = re.compile(r"_?val_\d+|onnx::.*|\d+|/.*_output_\d+")


def _module_path(node) -> str:
    """The module path (`encoder.layer.0.attention.self.query`) of the node that uses a weight, as the
    exporter recorded it, or "": the dynamo exporter's metadata (name scopes, their last one the
    op's own), else the TorchScript exporter's node name `/encoder/layer.0/…/query/MatMul`."""
    props = {p.key: p.value for p in node.metadata_props}
    try:
        scopes = ast.literal_eval(props.get("pkg.torch.onnx.name_scopes", "[]"))
    except (ValueError, SyntaxError):
        scopes = []
    if isinstance(scopes, list) and len(scopes) >= 2 and isinstance(scopes[-2], str) and scopes[-2]:
        return scopes[-2]
    if props.get("namespace"):  # ": pkg.M/layers.0: pkg.Attn/layers.0.query: …Linear/linear: aten.linear.default"
        parts = [p.split(":")[0].strip() for p in props["namespace"].split("/")]
        if len(parts) >= 2 and parts[-2]:
            return parts[-2]
    if node.name.startswith("/") and node.name.count("/") >= 2:
        path: list[str] = []
        for part in node.name.split("/")[1:-1]:  # the last part is the op's own name
            # a called container's child is named with the container's prefix: /head/head.0/MatMul
            if path and part.startswith(path[-1] + "."):
                path[-1] = part
            else:
                path.append(part)
        return ".".join(path)
    return ""


def _layer_names(weights: dict[str, GraphWeight], users: dict[str, object]) -> dict[str, str]:
    """Tensor name -> layer name: `<module path>.weight` for a GEMM weight whose name was generated
    and whose module the graph records; its own name otherwise, or where that would repeat a name."""
    taken = set(weights)
    names = {}
    for name, w in weights.items():
        if w.op and _GENERATED.fullmatch(name) and name in users:
            module = _module_path(users[name])
            candidate = f"{module}.weight" if module else ""
            if candidate and candidate not in taken:
                taken.add(candidate)
                names[name] = candidate
                continue
        names[name] = name
    return names


def _weights(model, shapes: dict[str, tuple[int, ...]]):
    tensors = {**{t.name: t for t in model.graph.initializer}, **_constants(model)}
    inits = {name: tuple(int(d) for d in t.dims) for name, t in tensors.items()}
    # torch's exporter passes shared initializers through Identity nodes: see through them
    alias: dict[str, str] = {}
    for node in model.graph.node:
        if node.op_type == "Identity" and node.input and (node.input[0] in inits or node.input[0] in alias):
            alias[node.output[0]] = alias.get(node.input[0], node.input[0])

    def initializer(value: str) -> str:
        return alias.get(value, value)

    used: dict[str, GraphWeight] = {}
    transposed: set[str] = set()  # linear weights stored K×M (MatMul's W, Gemm's without transB)
    users: dict[str, object] = {}  # a GEMM weight's first MatMul, Gemm or Conv node
    why_not: dict[str, str] = {}
    for node in model.graph.node:
        attrs = _attributes(node)
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
            as_mk = node.op_type == "Gemm" and bool(attrs.get("transB", 0))
            rows, cols = (dims[0], dims[1]) if as_mk else (dims[1], dims[0])
            if not as_mk:  # by the node, not by the shape: a square weight reads either way
                transposed.add(name)
            x = shapes.get(node.input[0])
            n = int(np.prod(x[:-1])) if x and all(d > 0 for d in x[:-1]) else 0
            used[name] = GraphWeight(name, "linear", rows, cols, n)
            users.setdefault(name, node)
            if node.op_type == "Gemm" and len(node.input) > 2:
                why_not.setdefault(initializer(node.input[2]), f"bias of {where}")
        elif node.op_type == "Conv" and len(node.input) >= 2 and initializer(node.input[1]) in inits:
            name = initializer(node.input[1])
            if len(node.input) > 2:  # a bias, whether or not the weight is searched
                why_not.setdefault(initializer(node.input[2]), f"bias of {where}")
            dims = inits[name]
            x = shapes.get(node.input[0])
            if len(dims) != 4 or not x or len(x) != 4 or x[2] <= 0 or x[3] <= 0:
                why_not.setdefault(name, f"{where}: not a 2-D convolution with a static input size in the "
                                         f"graph (--input-shape NAME:1x3xHxW fixes an input's size)")
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
            users.setdefault(name, node)
        else:
            for i, value in enumerate(node.input):
                name = initializer(value)
                if name in inits:
                    kind = "embedding/lookup table" if node.op_type == "Gather" and i == 0 else "input"
                    why_not.setdefault(name, f"{kind} of {where}")
    readers: dict[str, list] = {}  # value -> the nodes that read it (a graph output read by the caller too)
    for node in model.graph.node:
        for value in node.input:
            readers.setdefault(value, []).append(node)
    for value in [*model.graph.output, *_subgraph_reads(model.graph)]:  # read by the caller, or inside an If/Loop
        readers.setdefault(getattr(value, "name", value), []).append(None)
    gemms = Counter(initializer(node.input[1]) for node in model.graph.node
                    if node.op_type in ("MatMul", "Gemm", "Conv") and len(node.input) >= 2)
    for name, node in users.items():  # what each searched layer's kernel can fuse: its bias, the activation after it
        # a weight two nodes multiply by (tied) has one kernel for both: it fuses neither's epilogue
        fused = _fused(node, used[name], initializer, inits, readers) if gemms[name] == 1 else None
        if fused is not None:
            used[name] = replace(used[name], bias=fused[0], activation=fused[1])
            note = " (fused into its weight's kernel)"
            if fused[0] and not why_not.get(fused[0], "").endswith(note):  # a bias two layers add: said once
                why_not[fused[0]] = why_not.get(fused[0], "bias") + note
    weights = {name: used.get(name) or GraphWeight(name, "", reason=why_not.get(name, "not an input of any node"))
               for name in inits}
    names = _layer_names(weights, users)
    return ({names[n]: replace(w, name=names[n]) for n, w in weights.items()},
            {names[n]: (tensors[n], n in transposed) for n in weights})


def _fused(node, weight: GraphWeight, initializer, inits: dict, readers: dict) -> tuple[str, str] | None:
    """(bias, activation) a searched layer's kernel fuses, as lospmm.torch's importer finds them: the
    bias a Gemm (alpha = beta = 1) or Conv adds, or the one Add of an (M) or (1, M) initializer that
    alone reads a MatMul's output (of an (M, 1, 1) or (1, M, 1, 1) one after a Conv without a bias);
    then the Relu, or the exact Gelu, that alone reads the result (a subgraph's read or a graph output
    counts as a reader). Its bias name is the initializer's own in
    the file (graph_tensor reads it). None where the product is scaled (a Gemm's alpha) or a bias is
    added another way (beta, a bias not one value per output): nothing is fused."""

    def sole_reader(value: str):
        found = readers.get(value, [])
        return found[0] if len(found) == 1 else None

    def one_per_output(value: str, added: bool = False) -> str:
        # a Gemm's or Conv's own bias is (M); an Add broadcasts it along the dim that holds the outputs
        # without adding dims: a MatMul's last, (M) or (1, M); a Conv's channels, (M, 1, 1) or (1, M, 1, 1)
        name = initializer(value)
        m = weight.rows
        shapes = ((m,),) if not added else ((m, 1, 1), (1, m, 1, 1)) if node.op_type == "Conv" else ((m,), (1, m))
        return name if inits.get(name) in shapes else ""

    attrs = _attributes(node)
    if node.op_type == "Gemm" and attrs.get("alpha", 1.0) != 1.0:  # alpha·A·B: not the kernel's product to fuse after
        return None
    bias, out = "", node.output[0]
    if node.op_type in ("Gemm", "Conv") and len(node.input) > 2 and node.input[2]:
        bias = one_per_output(node.input[2])
        if not bias or (node.op_type == "Gemm" and attrs.get("beta", 1.0) != 1.0):
            return None
    elif node.op_type in ("MatMul", "Conv"):  # (a Conv without a bias of its own: TF's exporters add it after)
        add = sole_reader(out)
        if add is not None and add.op_type == "Add" and len(add.input) == 2:
            other = add.input[1] if add.input[0] == out else add.input[0]
            bias = one_per_output(other, added=True)
            if bias:
                out = add.output[0]
    after = sole_reader(out)
    activation = ""
    if after is not None and after.op_type == "Relu":
        activation = "relu"
    elif after is not None and after.op_type == "Gelu" and \
            _attributes(after).get("approximate", "none") == "none":
        activation = "gelu"
    return bias, activation


def _subgraph_reads(graph) -> set[str]:
    """The values the subgraphs of `graph`'s nodes (an If's branches, a Loop's or Scan's body) read."""
    from onnx import AttributeProto

    reads: set[str] = set()
    for node in graph.node:
        for a in node.attribute:
            for sub in ([a.g] if a.type == AttributeProto.GRAPH else list(a.graphs) if a.type == AttributeProto.GRAPHS
                        else []):
                reads |= {value for inner in sub.node for value in inner.input} | _subgraph_reads(sub)
    return reads


def graph_tensor(path: str | Path, name: str) -> np.ndarray:
    """An initializer (or float Constant) of the model by its name in the file, as float32: a fused
    bias (GraphWeight.bias)."""
    from onnx import numpy_helper

    p = Path(path)
    stat = p.stat()
    tensor = _tensors(str(p), stat.st_mtime_ns, stat.st_size).get(name)
    if tensor is None:
        raise ValueError(f"{name}: no such tensor in {path}")
    return numpy_helper.to_array(tensor).astype(np.float32)


@lru_cache(maxsize=2)
def _tensors(path: str, mtime_ns: int, size: int) -> dict:
    import onnx

    model = onnx.load(path)
    return {**{t.name: t for t in model.graph.initializer}, **_constants(model)}


def _attributes(node) -> dict:
    """A node's attributes by name, as Python values."""
    return {a.name: _attribute(a) for a in node.attribute}


def _attribute(a):
    from onnx import helper

    value = helper.get_attribute_value(a)
    return value.decode() if isinstance(value, bytes) else (list(value) if isinstance(value, (list, tuple)) else value)
