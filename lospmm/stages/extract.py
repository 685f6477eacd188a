"""Stage 1, extract: model zoo entry or real weights -> GEMM shapes (§7.1).

A linear layer y = W x with W of shape (out, in) is C = A·B with A = W (M = out, K = in) and
B the activations (N = tokens). A convolution is lowered by im2col: M = Cout, K = Cin/groups·kh·kw,
N = batch·Hout·Wout. Depthwise convolutions are not GEMMs; they are listed with status "skipped".
"""

from __future__ import annotations

import hashlib
import re
from dataclasses import dataclass, field, replace
from typing import Iterable, Sequence

from lospmm.kernel.geometry import conv_output_size
from lospmm.status import Status

ZOO_NAMES = ("bert-base", "resnet50", "mobilenetv2", "shufflenetv2")


@dataclass(frozen=True)
class ZooParams:
    """Zoo input sizes. Defaults: batch=32, seq_len=128 (BERT: N = 4096 tokens, the paper's
    setting); cnn_batch=4, image_size=224 (N up to 4·112·112 = 50,176, the paper's largest N)."""

    batch: int = 32
    seq_len: int = 128
    cnn_batch: int = 4
    image_size: int = 224


@dataclass(frozen=True)
class LayerShape:
    """One GEMM C[M×N] = A[M×K]·B[K×N]; conv geometry is zero for linear layers."""

    model: str
    layer: str
    op: str  # "linear" | "conv" | "depthwise" | "tensor"
    m: int
    n: int
    k: int
    repeat: int = 1
    layers: tuple[str, ...] = ()
    cin: int = 0
    cout: int = 0
    kh: int = 0
    kw: int = 0
    stride: int = 0
    pad: int = 0
    groups: int = 0
    h_in: int = 0
    w_in: int = 0
    h_out: int = 0
    w_out: int = 0
    dilation: int = 0
    status: Status = Status.OK  # OK, SKIPPED (not a GEMM) or ERROR
    message: str = ""
    bias: str = ""  # the bias tensor (in the source's file) fused into the layer's kernel; "" none
    activation: str = ""  # the activation fused after it ("" none, "relu", "gelu")

    @property
    def ok(self) -> bool:
        return self.status == Status.OK


@dataclass(frozen=True)
class TensorInfo:
    """What extract needs to know of one tensor in a weights file."""

    name: str
    shape: tuple[int, ...]
    dtype: str


def zoo_shapes(name: str, params: ZooParams = ZooParams()) -> list[LayerShape]:
    """Distinct GEMM shapes of a built-in model, duplicates folded into `repeat`."""
    builders = {
        "bert-base": _bert_base,
        "resnet50": _resnet50,
        "mobilenetv2": _mobilenetv2,
        "shufflenetv2": _shufflenetv2,
    }
    if name not in builders:
        raise ValueError(f"unknown zoo model {name!r}; built-in: {', '.join(ZOO_NAMES)}")
    _check_positive(params)
    return folded_duplicates(builders[name](params))


def used_zoo_params(name: str, params: ZooParams) -> ZooParams:
    """`params` with the sizes `name` does not use at their defaults: a CNN batch change leaves BERT's
    shapes, and so its cache key, as they were."""
    d = ZooParams()
    if name == "bert-base":
        return ZooParams(batch=params.batch, seq_len=params.seq_len)
    return ZooParams(d.batch, d.seq_len, params.cnn_batch, params.image_size)


@dataclass(frozen=True)
class ModelConfig:
    """What a checkpoint's `config.json` says that tells lookup tables from GEMM weights (0: not
    given). Read from Hugging Face names: vocab_size, max_position_embeddings (GPT-2: n_positions),
    type_vocab_size, hidden_size (GPT-2: n_embd)."""

    vocab_size: int = 0
    max_position_embeddings: int = 0
    type_vocab_size: int = 0
    hidden_size: int = 0

    @classmethod
    def from_dict(cls, config: dict) -> ModelConfig:
        def first(*names: str) -> int:
            for n in names:
                v = config.get(n)
                if isinstance(v, int) and not isinstance(v, bool) and v > 0:
                    return v
            return 0
        return cls(first("vocab_size"), first("max_position_embeddings", "n_positions"), first("type_vocab_size"),
                   first("hidden_size", "n_embd", "d_model"))


FLOAT_DTYPES = {"F64", "F32", "F16", "BF16", "float64", "float32", "float16", "bfloat16"}
# name parts of lookup tables (BERT, GPT-2, LLaMA, T5 naming): embeddings are gathered, not multiplied
_EMBEDDING = re.compile(r"(^|[._])(embeddings?|embed_tokens|word_embeddings|position_embeddings|"
                        r"token_type_embeddings|wte|wpe|shared|embed_positions)([._]|$)", re.IGNORECASE)
# output heads whose rows are the vocabulary: a GEMM, even when tied to the embedding table
_HEAD = re.compile(r"(^|[._])(lm_head|decoder|classifier|cls|head|output|logits)([._]|$)", re.IGNORECASE)
# modules that are linear layers by their name (BERT, GPT-2, LLaMA, T5, timm): their weight is a
# GEMM whatever its shape, even [intermediate, hidden] with intermediate = max_position_embeddings
_LINEAR = re.compile(r"(^|[._])(dense|query|key|value|[qkvo]_?proj|out_proj|proj|fc\d*|linear\d*|mlp|ffn|"
                     r"intermediate|gate_proj|up_proj|down_proj|c_attn|c_fc|c_proj|wi|wo|pooler)([._]|$)",
                     re.IGNORECASE)
_NORM = re.compile(r"(^|[._])(layer_?norm|ln_?\w*|norm\w*|rms_?norm|bn\d*|batch_?norm)([._]|$)", re.IGNORECASE)
# BERT's pooler: it multiplies each sequence's first token only, so its N is the sequence count
_POOLER = re.compile(r"(^|[._])pooler([._]|$)", re.IGNORECASE)


def is_pooler(name: str) -> bool:
    """A layer of a pooler (`bert.pooler.dense.weight`): one row per sequence, not per token."""
    return bool(_POOLER.search(name))


def excluded_reason(tensor: TensorInfo, config: ModelConfig = ModelConfig()) -> str | None:
    """Why a checkpoint tensor is not a GEMM weight to search, or None when it is one: a 2-D
    floating-point tensor that is not a lookup table (by its name, or by rows equal to the config's
    vocabulary, position or token-type count with hidden-size columns, unless named as a head or a
    linear layer)."""
    name, shape = tensor.name, tensor.shape
    if tensor.dtype not in FLOAT_DTYPES:
        return f"integer or other non-float buffer ({tensor.dtype})"
    if len(shape) == 0:
        return "scalar"
    if len(shape) == 1:
        if name.endswith("bias"):
            return "bias (1-D)"
        return "norm weight (1-D)" if _NORM.search(name) else "1-D tensor"
    if len(shape) == 4:
        return ("convolution weight: a checkpoint gives no stride, padding or input size "
                "(use the ONNX or PyTorch importer)")
    if len(shape) != 2:
        return f"{len(shape)}-D tensor"
    if _EMBEDDING.search(name) and not _HEAD.search(name):
        return "embedding/lookup table (by its name)"
    rows, cols = shape
    tables = {"vocab_size": config.vocab_size, "max_position_embeddings": config.max_position_embeddings,
              "type_vocab_size": config.type_vocab_size}
    for what, count in tables.items():
        if count and rows == count and (not config.hidden_size or cols == config.hidden_size) \
                and not _HEAD.search(name) and not _LINEAR.search(name):
            return f"embedding/lookup table ({rows} rows = config's {what})"
    return None


def weight_shapes(model: str, tensors: Iterable[TensorInfo], tokens: int,
                  config: ModelConfig = ModelConfig(), sequences: int | None = None) -> list[LayerShape]:
    """One linear layer per GEMM weight of a checkpoint (M = rows, K = columns, N = tokens; a pooler's
    N = `sequences`, its one row per sequence, and a checkpoint with a pooler needs it given).

    Each tensor keeps its own row (real weights differ even when shapes match); every other tensor
    is listed as skipped with `excluded_reason`, a zero-sized weight as an error.
    """
    tensors = list(tensors)
    if tokens < 1:
        raise ValueError(f"tokens must be >= 1, got {tokens}")
    pooler = next((t.name for t in tensors if is_pooler(t.name) and excluded_reason(t, config) is None), None)
    if pooler and not (sequences and 1 <= sequences <= tokens):
        raise ValueError(f"{pooler}: a pooler's N is the number of sequences (1 to tokens = {tokens}), got {sequences}")
    out = []
    for t in tensors:
        base = dict(model=model, layer=t.name, op="tensor", layers=(t.name,))
        reason = excluded_reason(t, config)
        if reason is not None:
            out.append(LayerShape(**base, m=0, n=tokens, k=0, status=Status.SKIPPED,
                                  message=f"{t.name} {list(t.shape)}: excluded, {reason}"))
            continue
        m, k = t.shape
        shape = LayerShape(**{**base, "op": "linear"}, m=m, n=sequences if is_pooler(t.name) else tokens, k=k)
        if m == 0 or k == 0:
            shape = _failed(shape, f"{t.name}: weight has an empty dimension (M={m}, K={k})")
        out.append(shape)
    return out


@dataclass(frozen=True)
class GraphWeight:
    """One weight initializer of a model graph (ONNX) as the graph uses it: `op` is "linear" (a
    MatMul or Gemm whose weight is this initializer), "conv" (a Conv), or "" when it is no GEMM
    weight (`reason` says why). `rows`, `cols` are the GEMM's M, K once transposed or flattened;
    `n` the GEMM's N from the graph's shapes (0: not static there); conv geometry as LayerShape's."""

    name: str
    op: str
    rows: int = 0
    cols: int = 0
    n: int = 0
    reason: str = ""
    conv: dict = field(default_factory=dict)  # LayerShape's geometry fields (cin, kh, …, w_out), groups
    batch: int = 0  # conv: the static batch in the graph (0: symbolic)
    bias: str = ""  # the name of the bias tensor the layer adds (in the same file), fused into its kernel
    activation: str = ""  # the activation the model applies right after the layer (codegen.ACTIVATIONS), fused


def graph_shapes(model: str, weights: Iterable[GraphWeight], tokens: int, batch: int) -> list[LayerShape]:
    """One layer per GEMM weight of a model graph. N is the graph's where static; else `tokens` for
    a linear layer and `batch`·h_out·w_out for a convolution. A grouped convolution (depthwise
    included) is the dense convolution whose A is its weight laid out block-diagonally: K =
    cin·kh·kw (prune.grouped_as_dense). Every other initializer is listed as skipped with the reason."""
    if tokens < 1 or batch < 1:
        raise ValueError(f"tokens and batch must be >= 1, got {tokens} and {batch}")
    out = []
    for w in weights:
        base = dict(model=model, layer=w.name, layers=(w.name,))
        groups = w.conv.get("groups", 1) if w.op == "conv" else 1
        if groups > 1 and (w.conv["cin"] % groups or w.rows % groups
                           or w.cols * groups != w.conv["cin"] * w.conv["kh"] * w.conv["kw"]):
            w = replace(w, op="", reason=f"grouped convolution (groups={groups}) whose channels do not divide "
                                         f"into its groups")
        if w.op not in ("linear", "conv"):
            out.append(LayerShape(**base, op="tensor", m=0, n=0, k=0, status=Status.SKIPPED,
                                  message=f"{w.name}: excluded, {w.reason}"))
            continue
        if w.op == "linear":
            out.append(LayerShape(**base, op="linear", m=w.rows, n=w.n or tokens, k=w.cols, bias=w.bias,
                                  activation=w.activation))
            continue
        images = w.batch or batch
        out.append(LayerShape(**base, op="conv", m=w.rows, n=images * w.conv["h_out"] * w.conv["w_out"],
                              k=w.cols * groups, cout=w.rows, **w.conv, bias=w.bias, activation=w.activation))
    return out


def folded_duplicates(shapes: Sequence[LayerShape]) -> list[LayerShape]:
    """Keep the first layer of each (op, M, N, K, conv geometry); count the rest in `repeat`, name
    them in `layers`."""
    first: dict[tuple, LayerShape] = {}
    members: dict[tuple, list[str]] = {}
    repeats: dict[tuple, int] = {}
    for s in shapes:
        # a convolution's geometry is part of its kernel once the kernel reads the input itself
        # (implicit im2col): 3×3 s1 on 28×28 and 3×3 s2 on 56×56 share (M, N, K), not a kernel
        key = ((s.op, s.m, s.n, s.k, s.cin, s.kh, s.kw, s.stride, s.pad, s.dilation, s.h_in, s.w_in)
               if s.status != Status.SKIPPED else (s.op, s.layer))
        if key not in first:
            first[key], members[key], repeats[key] = s, [], 0
        members[key].extend(s.layers or (s.layer,))
        repeats[key] += s.repeat
    return [_replace(s, repeat=repeats[key], layers=tuple(members[key])) for key, s in first.items()]


def sanitized_name(text: str) -> str:
    """A name safe for files and C identifiers: [A-Za-z0-9_], not starting with a digit."""
    name = re.sub(r"[^A-Za-z0-9_]+", "_", text).strip("_") or "model"
    return name if not name[0].isdigit() else f"m_{name}"


def layer_id(raw: str, max_chars: int = 64) -> str:
    """A layer's identity in file names: its sanitised name (at most `max_chars`) and a short hash
    of the raw name, so `enc.0`, `enc_0` and `enc 0` never share a kernel directory, names made only
    of non-ASCII characters stay apart, and any name fits a path (at most max_chars + 9 characters)."""
    digest = hashlib.sha256(raw.encode("utf-8", "surrogatepass")).hexdigest()[:8]
    return f"{sanitized_name(raw)[:max_chars]}-{digest}"


# --- helpers ---------------------------------------------------------------------------------


def _replace(s: LayerShape, **changes) -> LayerShape:
    return replace(s, **changes)


def _failed(s: LayerShape, message: str) -> LayerShape:
    return _replace(s, status=Status.ERROR, message=message)


def _check_positive(p: ZooParams) -> None:
    for f in ("batch", "seq_len", "cnn_batch", "image_size"):
        if getattr(p, f) < 1:
            raise ValueError(f"{f} must be >= 1, got {getattr(p, f)}")


def _linear(model: str, layer: str, d_in: int, d_out: int, tokens: int) -> LayerShape:
    return LayerShape(model, layer, "linear", m=d_out, n=tokens, k=d_in)


@dataclass
class _ConvNet:
    """Accumulates im2col GEMMs while walking a CNN definition."""

    model: str
    batch: int
    shapes: list[LayerShape] = field(default_factory=list)

    def conv(self, layer: str, cin: int, cout: int, k: int, stride: int, h: int, groups: int = 1) -> int:
        """Record a k×k conv on an h×h input (padding k//2); return the output size."""
        pad = k // 2
        h_out = conv_output_size(h, k, stride, pad)
        depthwise = groups > 1 and groups == cin
        self.shapes.append(
            LayerShape(
                self.model, layer, "depthwise" if depthwise else "conv",
                m=cout, n=self.batch * h_out * h_out, k=(cin // groups) * k * k,
                cin=cin, cout=cout, kh=k, kw=k, stride=stride, pad=pad, groups=groups,
                h_in=h, w_in=h, h_out=h_out, w_out=h_out, dilation=1,
                status=Status.SKIPPED if depthwise else Status.OK,
                message="depthwise convolution is not a GEMM" if depthwise else "",
            )
        )
        return h_out

    def linear(self, layer: str, d_in: int, d_out: int) -> None:
        self.shapes.append(_linear(self.model, layer, d_in, d_out, self.batch))


def _bert_base(p: ZooParams) -> list[LayerShape]:
    """BERT-base encoder: 12 layers, hidden 768, FFN 3072, plus the pooler (CLS token only)."""
    tokens, hidden, ffn = p.batch * p.seq_len, 768, 3072
    shapes = []
    for i in range(12):
        pre = f"encoder.layer.{i}"
        for proj in ("query", "key", "value"):
            shapes.append(_linear("bert-base", f"{pre}.attention.self.{proj}", hidden, hidden, tokens))
        shapes.append(_linear("bert-base", f"{pre}.attention.output.dense", hidden, hidden, tokens))
        shapes.append(_linear("bert-base", f"{pre}.intermediate.dense", hidden, ffn, tokens))
        shapes.append(_linear("bert-base", f"{pre}.output.dense", ffn, hidden, tokens))
    shapes.append(_linear("bert-base", "pooler.dense", hidden, hidden, p.batch))
    return shapes


def _resnet50(p: ZooParams) -> list[LayerShape]:
    """torchvision ResNet-50 (v1.5: stride on the 3×3 conv of each bottleneck)."""
    net = _ConvNet("resnet50", p.cnn_batch)
    h = net.conv("conv1", 3, 64, 7, 2, p.image_size)
    h = (h + 2 - 3) // 2 + 1  # 3×3/2 max-pool, padding 1
    cin = 64
    for stage, (width, blocks) in enumerate(zip((64, 128, 256, 512), (3, 4, 6, 3)), start=1):
        for b in range(blocks):
            pre = f"layer{stage}.{b}"
            stride = 2 if (b == 0 and stage > 1) else 1
            net.conv(f"{pre}.conv1", cin, width, 1, 1, h)
            h_out = net.conv(f"{pre}.conv2", width, width, 3, stride, h)
            net.conv(f"{pre}.conv3", width, width * 4, 1, 1, h_out)
            if b == 0:
                net.conv(f"{pre}.downsample.0", cin, width * 4, 1, stride, h)
            cin, h = width * 4, h_out
    net.linear("fc", 2048, 1000)
    return net.shapes


def _mobilenetv2(p: ZooParams) -> list[LayerShape]:
    """torchvision MobileNetV2 (width 1.0)."""
    net = _ConvNet("mobilenetv2", p.cnn_batch)
    h = net.conv("features.0", 3, 32, 3, 2, p.image_size)
    cin, idx = 32, 1
    for t, c, n, s in ((1, 16, 1, 1), (6, 24, 2, 2), (6, 32, 3, 2), (6, 64, 4, 2),
                       (6, 96, 3, 1), (6, 160, 3, 2), (6, 320, 1, 1)):
        for i in range(n):
            stride = s if i == 0 else 1
            hidden = cin * t
            pre = f"features.{idx}.conv"
            j = 0
            if t != 1:
                net.conv(f"{pre}.{j}", cin, hidden, 1, 1, h)
                j += 1
            h_out = net.conv(f"{pre}.{j}", hidden, hidden, 3, stride, h, groups=hidden)
            net.conv(f"{pre}.{j + 1}", hidden, c, 1, 1, h_out)
            cin, h, idx = c, h_out, idx + 1
    net.conv(f"features.{idx}", cin, 1280, 1, 1, h)
    net.linear("classifier.1", 1280, 1000)
    return net.shapes


def _shufflenetv2(p: ZooParams) -> list[LayerShape]:
    """torchvision ShuffleNetV2 x1.0: stages of 4, 8, 4 units, channels 116, 232, 464."""
    net = _ConvNet("shufflenetv2", p.cnn_batch)
    h = net.conv("conv1.0", 3, 24, 3, 2, p.image_size)
    h = (h + 2 - 3) // 2 + 1  # max-pool 3×3/2
    cin = 24
    for stage, (units, cout) in enumerate(zip((4, 8, 4), (116, 232, 464)), start=2):
        half = cout // 2
        for u in range(units):
            pre = f"stage{stage}.{u}"
            if u == 0:  # stride-2 unit: both branches see the whole input
                h_out = net.conv(f"{pre}.branch1.0", cin, cin, 3, 2, h, groups=cin)
                net.conv(f"{pre}.branch1.2", cin, half, 1, 1, h_out)
                net.conv(f"{pre}.branch2.0", cin, half, 1, 1, h)
                net.conv(f"{pre}.branch2.3", half, half, 3, 2, h, groups=half)
                net.conv(f"{pre}.branch2.5", half, half, 1, 1, h_out)
                h = h_out
            else:  # stride-1 unit: branch2 sees half the channels
                net.conv(f"{pre}.branch2.0", half, half, 1, 1, h)
                net.conv(f"{pre}.branch2.3", half, half, 3, 1, h, groups=half)
                net.conv(f"{pre}.branch2.5", half, half, 1, 1, h)
        cin = cout
    net.conv("conv5.0", cin, 1024, 1, 1, h)
    net.linear("fc", 1024, 1000)
    return net.shapes
