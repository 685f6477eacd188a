"""PyTorch in and out (the `torch` extra): a model's GEMM layers found by running it once, searched
by the same flow as any weights file, and the model served back on the emitted kernels.

    import lospmm.torch as lt
    run_id = lt.search(model, example_input, sparsity=0.9)   # magnitude-pruned, all ten stages
    fast = lt.sparsify(model, run_id)                         # nn.Linear/nn.Conv2d -> emitted kernels
    ref = lt.pruned(model, run_id)                            # the same pruned weights, dense
    folded = lt.fold_batchnorm(model)                         # inference: BatchNorm folded into the convs

`layer_weights(model, example_input)` is the importer: it runs the model once with forward hooks,
so every nn.Linear gets its N (the input's rows) and every nn.Conv2d its input size, stride,
padding and dilation; every other parameter and buffer is listed with why it is not searched.
`save_model` writes those weights to a safetensors file whose metadata carries that geometry;
`lospmm run --weights FILE` reads it like any checkpoint.
"""

from __future__ import annotations

import copy
import hashlib
import json
import os
import secrets
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np

try:
    import torch
    from torch import nn
except ImportError as e:  # the extra is optional: say which one
    raise ImportError(f"lospmm.torch needs PyTorch: pip install 'lospmm[torch]' ({e})") from None

from lospmm.flows.inputs.weights import GRAPH_METADATA
from lospmm.sparse_file import read_matrix
from lospmm.loader import KernelDirError, SpConv, SpMM, checked_backend, kernel_facts, load_kernel
from lospmm.stages.extract import GraphWeight, conv_output_size


# --- inference transforms -----------------------------------------------------------------------


def fold_batchnorm(model: nn.Module) -> nn.Module:
    """An inference copy of `model` (eval mode) with every BatchNorm that directly follows a
    convolution folded into that convolution's weight and bias (torch.fx's `fuse`, the usual
    inference transform). Search the folded model, so that the pruning and the baked-in weights are
    the folded ones; `sparsify` then serves its convolutions with the folded bias. A BatchNorm after
    anything else, or after a convolution whose output is also used elsewhere, stays. The model must
    be traceable by torch.fx (torchvision's CNNs are); ValueError says so otherwise."""
    from torch.fx.experimental.optimization import fuse

    try:
        return fuse(copy.deepcopy(model).eval(), inplace=True)
    except Exception as e:  # data-dependent control flow and the like: fx cannot trace it
        raise ValueError(f"fold_batchnorm: torch.fx cannot trace the model ({type(e).__name__}: {e}); fold "
                         f"each Conv2d/BatchNorm2d pair with torch.nn.utils.fusion.fuse_conv_bn_eval") from None


# --- importer ------------------------------------------------------------------------------------


def layer_weights(model: nn.Module, example_input) -> list[GraphWeight]:
    """One GraphWeight per parameter and buffer of `model` (state_dict names): `op` "linear" or
    "conv" for a weight the example input's forward pass multiplies as a GEMM, else "" with the
    reason. `example_input`: a tensor, or a tuple of positional arguments."""
    calls: dict[str, list[tuple[int, ...]]] = {}
    modules = dict(model.named_modules())
    every_name = dict(model.named_modules(remove_duplicate=False))  # a module under two names has both

    def hook(name):
        def record(module, args):
            if args and isinstance(args[0], torch.Tensor):
                calls.setdefault(name, []).append(tuple(args[0].shape))
        return record

    handles = [m.register_forward_pre_hook(hook(name)) for name, m in modules.items()
               if isinstance(m, (nn.Linear, nn.Conv2d))]
    training = {m: m.training for m in model.modules()}
    try:
        model.eval()  # shapes do not depend on the mode; a BatchNorm in train mode would update its statistics
        with torch.no_grad():
            model(*example_input) if isinstance(example_input, tuple) else model(example_input)
    finally:
        for h in handles:
            h.remove()
        for m, was in training.items():
            m.training = was

    first_name = {id(m): n for n, m in modules.items()}
    out = []
    for name, tensor in [*model.state_dict(keep_vars=True).items()]:
        owner, _, leaf = name.rpartition(".")
        module = every_name.get(owner)
        if module is not None and first_name.get(id(module), owner) != owner:
            first = first_name[id(module)]
            out.append(GraphWeight(name, "", reason=f"the same tensor as {first + '.' if first else ''}{leaf} "
                                                    f"(one module under two names)"))
            continue
        out.append(_weight(name, tensor, module, leaf, calls.get(owner, [])))
    return out


def _weight(name: str, tensor, module, leaf: str, shapes: list[tuple[int, ...]]) -> GraphWeight:
    kind = type(module).__name__ if module is not None else "model"
    if not tensor.dtype.is_floating_point:
        return GraphWeight(name, "", reason=f"integer or other non-float buffer ({str(tensor.dtype)[6:]}) of {kind}")
    if isinstance(module, (nn.Linear, nn.Conv2d)) and leaf == "bias":
        return GraphWeight(name, "", reason=f"bias of {kind} (added after the kernel)")
    if isinstance(module, nn.Embedding):
        return GraphWeight(name, "", reason=f"embedding/lookup table ({kind})")
    if not isinstance(module, (nn.Linear, nn.Conv2d)) or leaf != "weight":
        what = "norm parameter or statistic" if "Norm" in kind else "parameter or buffer"
        return GraphWeight(name, "", reason=f"{what} of {kind}: not an nn.Linear or nn.Conv2d weight")
    if not _plain(module):
        return GraphWeight(name, "", reason=f"{kind} overrides nn.{_base(module).__name__}'s forward (its kernel "
                                            f"would compute with the raw weight)")
    if not shapes:
        return GraphWeight(name, "", reason=f"{kind} not called by the example input")
    if len(set(shapes)) > 1:
        return GraphWeight(name, "", reason=f"{kind} called with {len(set(shapes))} different input shapes")
    x = shapes[0]
    if isinstance(module, nn.Linear):
        return GraphWeight(name, "linear", module.out_features, module.in_features, int(np.prod(x[:-1])))
    return _conv_weight(name, module, x)


def _base(module: nn.Module) -> type:
    return nn.Conv2d if isinstance(module, nn.Conv2d) else nn.Linear


def _plain(module: nn.Module) -> bool:
    """An nn.Linear / nn.Conv2d whose forward is torch's own: a subclass that standardises or
    fake-quantises its weight in forward (timm's StdConv2d, QAT modules) computes something else."""
    base = _base(module)
    methods = ("forward", "_conv_forward") if base is nn.Conv2d else ("forward",)
    return all(getattr(type(module), m) is getattr(base, m) for m in methods)


def _conv_weight(name: str, conv: nn.Conv2d, x: tuple[int, ...]) -> GraphWeight:
    if len(x) != 4:
        return GraphWeight(name, "", reason=f"Conv2d on an unbatched {len(x)}-D input")
    if conv.padding_mode != "zeros":
        return GraphWeight(name, "", reason=f"Conv2d padding_mode {conv.padding_mode!r} (only zeros)")
    kh, kw = conv.kernel_size
    padding = conv.padding
    if isinstance(padding, str):  # "valid" or "same" (stride 1)
        same = [conv.dilation[i] * (k - 1) for i, k in enumerate((kh, kw))]
        if padding == "same" and any(t % 2 for t in same):
            return GraphWeight(name, "", reason="Conv2d padding 'same' with uneven padding")
        padding = (0, 0) if padding == "valid" else (same[0] // 2, same[1] // 2)
    for what, pair in (("stride", conv.stride), ("padding", padding), ("dilation", conv.dilation)):
        if pair[0] != pair[1]:
            return GraphWeight(name, "", reason=f"Conv2d with uneven {what} {tuple(pair)} (not supported yet)")
    stride, pad, dilation = conv.stride[0], padding[0], conv.dilation[0]
    h_out, w_out = (conv_output_size(x[2], kh, stride, pad, dilation), conv_output_size(x[3], kw, stride, pad, dilation))
    if conv.groups != 1:
        return GraphWeight(name, "", reason=f"grouped convolution (groups={conv.groups}"
                                            f"{'; depthwise' if conv.groups == conv.in_channels else ''}): not a GEMM")
    geometry = {"cin": conv.in_channels, "kh": kh, "kw": kw, "stride": stride, "pad": pad, "groups": conv.groups,
                "h_in": x[2], "w_in": x[3], "h_out": h_out, "w_out": w_out, "dilation": dilation}
    return GraphWeight(name, "conv", conv.out_channels, conv.in_channels // conv.groups * kh * kw, conv=geometry,
                       batch=x[0])


def save_model(model: nn.Module, example_input, path: str | Path) -> Path:
    """Write the GEMM weights of `model` (as `layer_weights` finds them, float32, state_dict names)
    to a safetensors file, with every GraphWeight (geometry, and each other tensor's reason) in its
    metadata, for `lospmm run --weights PATH`. Written atomically; returns the path."""
    from safetensors.numpy import save_file

    from lospmm.flows.storage.store import atomic_write

    weights = layer_weights(model, example_input)
    state = model.state_dict()
    tensors = {w.name: np.ascontiguousarray(state[w.name].detach().to("cpu", torch.float32).numpy())
               for w in weights if w.op}
    if not tensors:
        raise ValueError(f"{type(model).__name__}: no nn.Linear or nn.Conv2d weight is used by the example input")
    meta = {GRAPH_METADATA: json.dumps([asdict(w) for w in weights])}
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    atomic_write(path, lambda tmp: save_file(tensors, tmp, metadata=meta))
    return path


def search(model: nn.Module, example_input, sparsity: float | None = None, prune: str = "magnitude",
           artifacts: str | Path = "artifacts", name: str | None = None, **options) -> str:
    """Save `model` (`save_model`, under `<artifacts>/models/`) and run the whole search on it, as
    `lospmm run --weights FILE --prune PRUNE --sparsity SPARSITY` would, in this process (Prefect's
    ephemeral API unless one is configured). `sparsity`: 0.9 by default; with prune="keep" (an
    already pruned model, its zeros kept) the default is the model's own share of zeros in its GEMM
    weights. `options`: other RunConfig fields (gpu, timer, top_k, jobs, …). Returns the run id;
    ValueError for bad options (the CLI's one-line message)."""
    os.environ.setdefault("PREFECT_SERVER_ANALYTICS_ENABLED", "false")  # as the CLI: no telemetry
    from lospmm.flows.config import ConfigError, RunConfig, resolved
    from lospmm.flows.pipeline import run_plan

    label = name or type(model).__name__.lower()
    tmp = Path(artifacts) / "models" / f".{label}.{os.getpid()}.{secrets.token_hex(4)}.pending.safetensors"
    save_model(model, example_input, tmp)
    digest = hashlib.sha256(tmp.read_bytes()).hexdigest()[:12]
    path = tmp.with_name(f"{label}-{digest}.safetensors")
    tmp.replace(path)
    if sparsity is None:
        sparsity = _zero_share(path) if prune == "keep" else 0.9
    try:
        config = RunConfig.from_dict({"zoo": (), "weights": str(path.resolve()), "sparsities": (sparsity,),
                                      "prune": prune, "artifacts": str(artifacts), **options})
        plan = resolved(config)
    except ConfigError as e:
        raise ValueError(str(e)) from None
    return run_plan(plan)["run_id"]


def _zero_share(path: Path) -> float:
    """The share of zeros over every weight in a saved model file (its GEMM weights), to 3 decimals."""
    from safetensors.numpy import load_file

    weights = load_file(str(path)).values()
    zeros, total = sum(int((w == 0).sum()) for w in weights), sum(w.size for w in weights)
    return round(min(max(zeros / max(total, 1), 0.001), 0.999), 3)


# --- the drop-in ---------------------------------------------------------------------------------


def _inference_only(x, kernel) -> None:
    if torch.is_grad_enabled() and x.requires_grad:
        raise RuntimeError(f"{kernel.facts['layer']}: an emitted kernel has no backward (A is baked into it); "
                           f"run the sparsified model for inference, under torch.no_grad()")


# --- the kernels as registered operators ------------------------------------------------------------
#
# A kernel is named by a string, "<backend>|<kernel directory>": the operator loads it once per process
# (the cubin and its launch layout, cached) and its fake implementation reads only kernel.json, so that
# torch.compile traces the model without a device (and torch.export keeps the name). Launches go on
# torch's current stream: eagerly, under torch.cuda.graph capture and under torch.compile's CUDA graphs.


_KERNELS: dict[str, SpMM | SpConv] = {}  # name -> the kernel a served module loaded (one module load each)


def kernel_name(kernel: SpMM | SpConv) -> str:
    """The operators' name of a loaded kernel, which the operators then launch (the latest loaded
    under a name wins: a directory emitted again and loaded again is served anew)."""
    name = f"{kernel.backend}|{kernel.dir.resolve()}"
    _KERNELS[name] = kernel
    return name


def _loaded(name: str) -> SpMM | SpConv:
    """The kernel of `name`: the one a module registered, else loaded now (a model exported and run
    in another process names its kernels only)."""
    if name not in _KERNELS:
        backend, directory = name.split("|", 1)
        _KERNELS[name] = load_kernel(directory, backend)
    return _KERNELS[name]


def _facts(name: str) -> dict:
    """kernel.json of `name`: the registered kernel's, else read (not loaded: a fake needs no device)."""
    return _KERNELS[name].facts if name in _KERNELS else kernel_facts(name.split("|", 1)[1])


@torch.library.custom_op("lospmm::spmm", mutates_args=())
def spmm(b: torch.Tensor, kernel: str) -> torch.Tensor:
    """C = A·B by the GEMM kernel `kernel` (kernel_name): B is K×N float32, C is M×N."""
    return _loaded(kernel)(b)


@spmm.register_fake
def _(b: torch.Tensor, kernel: str) -> torch.Tensor:
    return b.new_empty((_facts(kernel)["m"], b.shape[1]))


@torch.library.custom_op("lospmm::conv", mutates_args=())
def conv(x: torch.Tensor, kernel: str) -> torch.Tensor:
    """Y = conv(X) by the implicit-im2col kernel `kernel` (kernel_name): X and Y NCHW float32."""
    return _loaded(kernel)(x)


@conv.register_fake
def _(x: torch.Tensor, kernel: str) -> torch.Tensor:
    facts = _facts(kernel)
    return x.new_empty((x.shape[0], facts["m"], facts["conv"]["h_out"], facts["conv"]["w_out"]))


def sparse_linear(kernel_dir: str | Path, bias=None, backend: str = "cuda") -> "SparseLinear":
    """A torch.nn.Module computing x @ W.T + bias with W the kernel's pruned weight (out × in)."""
    return SparseLinear(load_kernel(kernel_dir, backend), bias)


class SparseLinear(nn.Module):
    """x @ A.T + bias with A baked into an emitted GEMM kernel (out × in)."""

    def __init__(self, kernel: SpMM, bias=None):
        super().__init__()
        self.kernel, self.in_features, self.out_features = kernel, kernel.k, kernel.m
        self.name = kernel_name(kernel)
        self.bias = nn.Parameter(bias.detach().clone(), requires_grad=False) if bias is not None else None

    def forward(self, x):
        _inference_only(x, self.kernel)
        if x.shape[-1] != self.in_features:
            raise ValueError(f"{self.kernel.facts['layer']}: input has {x.shape[-1]} features, the kernel "
                             f"takes {self.in_features}")
        lead = x.shape[:-1]
        y = spmm(x.reshape(-1, self.in_features).t().contiguous(), self.name).t()  # C = A·Xᵀ is out × tokens
        if self.bias is not None:
            y = y + self.bias
        return y.reshape(*lead, self.out_features)

    def extra_repr(self) -> str:
        return f"in={self.in_features}, out={self.out_features}, kernel={self.kernel.dir.name}, {self.kernel.backend}"


class SparseConv2d(nn.Module):
    """An nn.Conv2d (groups = 1) on an emitted kernel: the implicit-im2col kernel reads X itself;
    a GEMM kernel (an im2col run) gets the unfolded input. Bias added after."""

    def __init__(self, kernel: SpMM | SpConv, conv: nn.Conv2d, geometry: dict):
        super().__init__()
        self.kernel, self.geometry = kernel, geometry
        self.name = kernel_name(kernel)
        self.out_channels = conv.out_channels
        self.bias = nn.Parameter(conv.bias.detach().clone(), requires_grad=False) if conv.bias is not None else None

    def forward(self, x):
        _inference_only(x, self.kernel)
        g = self.geometry
        if isinstance(self.kernel, SpConv):
            y = conv(x.contiguous(), self.name)
        else:  # C = A · im2col(X): K × (batch·h_out·w_out), columns image-major
            cols = nn.functional.unfold(x, (g["kh"], g["kw"]), dilation=g["dilation"], padding=g["pad"],
                                        stride=g["stride"])  # batch × K × L
            b = cols.permute(1, 0, 2).reshape(cols.shape[1], -1).contiguous()
            h_out, w_out = (conv_output_size(x.shape[i], g[w], g["stride"], g["pad"], g["dilation"])
                            for i, w in ((2, "kh"), (3, "kw")))
            y = spmm(b, self.name).reshape(self.out_channels, x.shape[0], h_out, w_out).permute(1, 0, 2, 3)
        if self.bias is not None:
            y = y + self.bias.view(1, -1, 1, 1)
        return y.contiguous()

    def extra_repr(self) -> str:
        form = "implicit-conv" if isinstance(self.kernel, SpConv) else "im2col gemm"
        return f"out={self.out_channels}, {form}, kernel={self.kernel.dir.name}, {self.kernel.backend}"


@dataclass(frozen=True)
class Replacement:
    """What sparsify did with one kernel directory: `module` replaced, or `reason` why not."""

    layer: str
    kernel_dir: str
    module: str = ""
    reason: str = ""


def kernel_dirs(source: str | Path, artifacts: str | Path = "artifacts", sparsity: float | None = None) -> list[Path]:
    """The kernel directories behind `source`: one kernel directory, a folder of them (an emit
    artifact's), or a run id (or unique prefix) under `artifacts` with one sparsity (or `sparsity`)."""
    p = Path(source)
    if (p / "kernel.json").is_file():
        return [p]
    if p.is_dir():
        found = sorted(d for d in p.iterdir() if (d / "kernel.json").is_file())
        if not found:
            raise KernelDirError(f"{p}: no kernel directory (kernel.json) in it")
        return found
    from lospmm.flows.storage.runs import artifacts_of, run_record
    from lospmm.flows.storage.store import read_artifact

    try:
        record = run_record(artifacts, str(source))
    except (LookupError, ValueError) as e:
        raise KernelDirError(f"{source}: neither a kernel directory nor a run under {artifacts} ({e})") from None
    emits = artifacts_of(record, "emit")
    if sparsity is not None:
        there = sorted({e.get("sparsity") for e in emits})
        emits = [e for e in emits if e.get("sparsity") == sparsity]
        if not emits:
            raise KernelDirError(f"run {record['run_id']} emitted no kernels at sparsity {sparsity}; "
                                 f"it has {there or 'none'}")
    if len(emits) != 1:
        found = sorted((e.get("model"), e.get("sparsity")) for e in emits)
        raise KernelDirError(f"run {record['run_id']}: {len(emits)} emitted (model, sparsity) sets {found}; "
                             f"give one sparsity, or a kernel folder")
    table = read_artifact(Path(artifacts) / emits[0]["path"], columns=["kernel_dir", "status"]).to_pylist()
    return [Path(artifacts) / r["kernel_dir"] for r in table if r["status"] == "ok" and r["kernel_dir"]]


def _weight_matrix(module: nn.Module) -> np.ndarray:
    w = module.weight.detach().to("cpu", torch.float32).numpy()
    return w.reshape(w.shape[0], -1)


def _matching(a, facts: dict, module: nn.Module, layer: str) -> str:
    """"" when the kernel computes this module's operation (a plain nn.Linear / nn.Conv2d, the same
    convolution geometry, no fused epilogue) with its weight, entries zeroed; else why not."""
    if not isinstance(module, (nn.Linear, nn.Conv2d)):
        return f"{layer}: the model's {type(module).__name__} is not an nn.Linear or nn.Conv2d"
    if not _plain(module):
        return f"{layer}: {type(module).__name__} overrides nn.{_base(module).__name__}'s forward"
    if isinstance(module, nn.Conv2d) and module.groups != 1:
        return f"{layer}: a grouped convolution (groups={module.groups}) has no kernel"
    epilogue = facts.get("epilogue") or {}
    if epilogue.get("bias") or epilogue.get("relu"):
        return (f"{layer}: the kernel fuses {' and '.join(k for k in ('bias', 'relu') if epilogue.get(k))}; "
                f"sparsify serves plain kernels (the model's own bias and activation follow them)")
    if facts.get("conv"):
        if not isinstance(module, nn.Conv2d):
            return f"{layer}: a convolution kernel for the model's {type(module).__name__}"
        g = facts["conv"]
        mine = _conv_weight(layer, module, (1, module.in_channels, g["h"], g["w"]))
        if not mine.op:
            return f"{layer}: {mine.reason}"
        keys = ("cin", "kh", "kw", "stride", "pad", "dilation")
        theirs, ours = {k: g[k] for k in keys}, {k: mine.conv[k] for k in keys}
        if ours != theirs:
            return f"{layer}: the kernel's convolution ({theirs}) is not the module's ({ours})"
    w = _weight_matrix(module)
    if w.shape != a.shape:
        return f"{layer}: the kernel's A is {a.shape[0]}×{a.shape[1]}, the model's weight {w.shape[0]}×{w.shape[1]}"
    rows = np.repeat(np.arange(a.shape[0]), np.diff(a.indptr))
    differ = int(np.count_nonzero(w[rows, a.indices] != a.data))
    if differ:
        return (f"{layer}: {differ} of the kernel's {a.nnz} nonzeros differ from the model's weight: "
                f"the kernel was built from other weights")
    return ""


def replacements(model: nn.Module, source: str | Path, artifacts: str | Path = "artifacts",
                 sparsity: float | None = None) -> list[Replacement]:
    """For each kernel directory behind `source` (kernel_dirs): the module of `model` its layer names
    (state_dict name `<module>.weight`) when its pruned A is that module's weight with entries
    zeroed, else the reason it is not used. A kernel from other weights (a zoo run's random ones,
    another checkpoint) is never used."""
    modules = dict(model.named_modules())
    out = []
    for d in kernel_dirs(source, artifacts, sparsity):
        facts = kernel_facts(d, ("kernel.json", "weight.parquet"))
        layer = facts["layer"]
        owner, _, leaf = layer.rpartition(".")
        module = modules.get(owner) if leaf == "weight" else None
        if module is None:
            out.append(Replacement(layer, str(d), reason=f"{layer}: no module {owner or layer!r} in the model"))
            continue
        reason = _matching(read_matrix(d / "weight.parquet"), facts, module, layer)
        out.append(Replacement(layer, str(d), owner if not reason else "", reason))
    return out


def sparsify(model: nn.Module, source: str | Path, backend: str = "cuda", artifacts: str | Path = "artifacts",
             sparsity: float | None = None, strict: bool = True) -> nn.Module:
    """A copy of `model` with each nn.Linear / nn.Conv2d that has a kernel behind `source` (a run id
    under `artifacts`, an emit folder or one kernel directory) replaced by its emitted kernel, bias
    carried over; activations stay the model's own modules. `backend`: `cuda` (the GPU) or `host`
    (the CPU host emulation, for tests: slow). `strict`: raise KernelDirError when a kernel does not
    match the model (its reason), else skip it. The copy's `lospmm_replacements` lists every
    kernel the source emitted and what became of it. The model itself is left as it was.

    The copy is for inference (an emitted kernel has no backward). A convolution's kernel reads the
    input size it was searched for (any batch); another size raises ValueError naming the layer."""
    if checked_backend(backend) == "cuda":
        from lospmm.runtime import gpu_present

        if not gpu_present():
            raise RuntimeError("no CUDA device here for backend='cuda'; backend='host' runs the kernels on the CPU "
                               "(the host emulation: slow, for checking)")
    plan = replacements(model, source, artifacts, sparsity)
    _refuse_mismatches(plan, strict)
    out = copy.deepcopy(model)  # aliases stay aliases in the copy: replaced together below
    out.requires_grad_(False)  # for inference: no parameter asks autograd to track what the kernels cannot
    paths = _paths(out)
    for r in plan:
        if not r.module:
            continue
        original = out.get_submodule(r.module)
        kernel = load_kernel(r.kernel_dir, backend)
        if isinstance(original, nn.Linear):
            new = SparseLinear(kernel, original.bias)
        else:
            new = SparseConv2d(kernel, original, kernel.facts.get("conv") or _geometry_of(original))
        for path in paths[id(original)]:  # every name the module goes by (a module shared by two parents)
            parent_name, _, child = path.rpartition(".")
            setattr(out.get_submodule(parent_name) if parent_name else out, child, new)
    out.lospmm_replacements = plan
    return out


def _refuse_mismatches(plan: list[Replacement], strict: bool) -> None:
    bad = [r.reason for r in plan if r.reason]
    if bad and strict:
        more = f"; and {len(bad) - 3} more (lospmm.torch.replacements lists them)" if len(bad) > 3 else ""
        raise KernelDirError(f"{len(bad)} of {len(plan)} kernels do not match the model: " + "; ".join(bad[:3]) + more)


def _paths(model: nn.Module) -> dict[int, list[str]]:
    """Every name of every submodule, aliases included (named_modules hides the second name)."""
    paths: dict[int, list[str]] = {}
    for name, m in model.named_modules(remove_duplicate=False):
        if name:
            paths.setdefault(id(m), []).append(name)
    return paths


def _geometry_of(conv: nn.Conv2d) -> dict:
    """The window of a convolution served by an im2col GEMM kernel, from the module itself."""
    found = _conv_weight("", conv, (1, conv.in_channels, 1 << 15, 1 << 15))
    if not found.op:
        raise KernelDirError(f"an im2col kernel for a convolution lospmm cannot unfold: {found.reason}")
    return found.conv


def pruned(model: nn.Module, source: str | Path, artifacts: str | Path = "artifacts",
           sparsity: float | None = None, strict: bool = True) -> nn.Module:
    """A copy of `model` whose searched layers hold the kernels' pruned weights, dense: the
    reference `sparsify`'s model must agree with, runnable anywhere. The same matching as sparsify:
    `strict` raises KernelDirError for a kernel that does not match, else that layer stays as it is."""
    out = copy.deepcopy(model)
    plan = replacements(model, source, artifacts, sparsity)
    _refuse_mismatches(plan, strict)
    for r in plan:
        if r.module:
            module = out.get_submodule(r.module)
            a = read_matrix(Path(r.kernel_dir) / "weight.parquet").toarray()
            w = module.weight
            # a new Parameter: a weight tied elsewhere (an embedding table, say) keeps its own values
            module.weight = nn.Parameter(torch.from_numpy(a.reshape(w.shape)).to(w.device, w.dtype),
                                         requires_grad=w.requires_grad)
    return out
