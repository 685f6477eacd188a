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
The example input is what `torch.export` takes: a tensor, a tuple of positional arguments or a
mapping of keyword arguments (a tokenizer's output), and `kwargs=`. Each layer's bias and the
activation the model applies right after it (ReLU, exact GELU; `following_activations`, read from
the torch.fx graph) are fused into its kernel. `save_model` writes those weights and biases to a
safetensors file whose metadata carries that geometry; `lospmm run --weights FILE` reads it like
any checkpoint.
"""

from __future__ import annotations

import copy
import dataclasses
import hashlib
import json
import numbers
import os
import secrets
import warnings
from collections.abc import Mapping
from dataclasses import asdict, dataclass, fields
from pathlib import Path
from typing import Callable

import numpy as np

try:
    import torch
    from torch import nn
except ImportError as e:  # the extra is optional: say which one
    raise ImportError(f"lospmm.torch needs PyTorch: pip install 'lospmm[torch]' ({e})") from None

from lospmm.flows.inputs.weights import GRAPH_METADATA
from lospmm.sparse_file import read_matrix
from lospmm.kernel.package import read_package
from lospmm.kernel.spec import KernelSpec
from lospmm.loader import KernelDirError, SpConv, SpMM, backend_here, kernel_package, load_kernel
from lospmm.kernel.geometry import conv_output_size
from lospmm.stages.extract import GraphWeight


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
        folded = fuse(copy.deepcopy(model).eval(), inplace=True)
        # named as the model (lt.search names its files and artifacts by the class), not "GraphModule"
        return torch.fx.GraphModule(folded, folded.graph, class_name=type(model).__name__).eval()
    except Exception as e:  # data-dependent control flow and the like: fx cannot trace it
        raise ValueError(f"fold_batchnorm: torch.fx cannot trace the model ({type(e).__name__}: {e}); fold "
                         f"each Conv2d/BatchNorm2d pair with torch.nn.utils.fusion.fuse_conv_bn_eval") from None


# --- fused activations: which activation the model applies right after a layer -----------------------
#
# Read (never rewritten) from the model's torch.fx graph: the whole model's, else, for a model fx cannot
# trace whole (a transformers BertModel), each layer's parent module's. A layer's activation can be fused
# when the layer is called once there and its output goes to that activation alone. ReLU is idempotent,
# so a model that applies it as a function or a shared module keeps doing so after a ReLU kernel, with the
# same result; another activation (GELU) is fused only when a module of its own applies it, once, so that
# `sparsify` can make that module an identity. Caveat of symbolic tracing: Python control flow on an
# argument's identity (`if mask is not None`) follows the branch taken with every argument given.


def _activation_of(node, scope: nn.Module) -> str:
    """"relu" / "gelu" (exact) when `node` applies that activation to its first argument alone, else ""."""
    import torch.nn.functional as F

    extra = [a for a in (*node.args[1:], *node.kwargs.values()) if not isinstance(a, (bool, str, type(None)))]
    if extra:
        return ""
    if node.op == "call_module":
        module = scope.get_submodule(node.target)
        if type(module) is nn.ReLU:
            return "relu"
        if type(module) is nn.GELU and module.approximate == "none":
            return "gelu"
    if node.op == "call_function":
        if node.target in (torch.relu, torch.relu_, F.relu):
            return "relu"
        if node.target is F.gelu and node.kwargs.get("approximate", "none") == "none" and len(node.args) == 1:
            return "gelu"
    if node.op == "call_method" and node.target in ("relu", "relu_") and len(node.args) == 1:
        return "relu"
    return ""


def _own_module(node, graph, scope: nn.Module) -> str:
    """The path (in `scope`) of a module that applies `node` and nothing else, called once: an
    activation module, or a wrapper without parameters whose whole traced body is this call
    (transformers' GELUActivation); "" when the activation is the scope's own code."""
    if node.op == "call_module":
        path = node.target
        calls = sum(1 for n in graph.nodes if n.op == "call_module" and n.target == path)
    else:
        stack = node.meta.get("nn_module_stack") or {}
        if not stack:
            return ""
        path = next(reversed(stack.values()))[0]
        # every node the wrapper (or anything inside it) made: the activation must be all of it
        calls = sum(1 for n in graph.nodes if any(entry[0] == path for entry in (n.meta.get("nn_module_stack") or {})
                                                  .values()))
        if any(True for _ in scope.get_submodule(path).parameters()):
            return ""
    return path if calls == 1 else ""


def _gemm_activations(graph, scope: nn.Module) -> dict[str, tuple[str, str]]:
    """target -> (activation, the module applying it alone or "") for each nn.Linear / nn.Conv2d
    called once in `graph` whose output goes to an activation alone (paths relative to `scope`)."""
    calls: dict[str, list] = {}
    for node in graph.nodes:
        if node.op == "call_module" and isinstance(scope.get_submodule(node.target), (nn.Linear, nn.Conv2d)):
            calls.setdefault(node.target, []).append(node)
    out = {}
    for target, nodes in calls.items():
        if len(nodes) != 1 or len(nodes[0].users) != 1:
            continue
        user = next(iter(nodes[0].users))
        if user.args and user.args[0] is nodes[0] and (act := _activation_of(user, scope)):
            out[target] = (act, _own_module(user, graph, scope))
    return out


def _traced_scopes(model: nn.Module) -> list[tuple[str, object]]:
    """(scope path, fx graph) to read activations from: the model traced whole, else one per parent
    module of a layer that traces."""
    import torch.fx

    class ChildrenWithLayersAreLeaves(torch.fx.Tracer):
        # a parent's graph calls a child that holds layers as one module (that child is a scope of
        # its own), so that each layer's activation is read in exactly one graph
        def is_leaf_module(self, m, qualname):
            return super().is_leaf_module(m, qualname) or any(
                isinstance(d, (nn.Linear, nn.Conv2d)) for d in m.modules())

    def traced(module, tracer):
        try:
            return tracer.trace(module)
        except Exception:  # data-dependent control flow, unsupported calls: try smaller scopes
            return None

    whole = traced(model, torch.fx.Tracer())
    if whole is not None:
        return [("", whole)]
    parents = dict.fromkeys(name.rpartition(".")[0] for name, m in model.named_modules()
                            if isinstance(m, (nn.Linear, nn.Conv2d)) and name)
    return [(p, g) for p in parents
            if (g := traced(model.get_submodule(p) if p else model, ChildrenWithLayersAreLeaves())) is not None]


def _fusable(model: nn.Module) -> dict[str, tuple[str, str]]:
    """Module path -> (activation, path of the module applying it alone or "") of every layer whose
    activation a kernel can fuse: ReLU always (applied again, it changes nothing), GELU only when a
    module of its own, under one name, applies it (sparsify makes that module an identity)."""
    names = _paths(model)
    out = {}
    for scope_path, graph in _traced_scopes(model):
        scope = model.get_submodule(scope_path) if scope_path else model
        for target, (act, own) in _gemm_activations(graph, scope).items():
            full = f"{scope_path}.{target}" if scope_path else target
            if len(names.get(id(model.get_submodule(full)), ())) != 1:
                continue  # a layer under two names: one graph cannot say what follows it at the other
            own_full = (f"{scope_path}.{own}" if scope_path else own) if own else ""
            if own_full and len(names.get(id(model.get_submodule(own_full)), ())) != 1:
                own_full = ""  # one module under two names: making it an identity would reach the other too
            if act == "relu" or own_full:
                out[full] = (act, own_full)
    return out


def _verified(model: nn.Module, example_input, kwargs, output,
              fusable: dict[str, tuple[str, str]]) -> dict[str, tuple[str, str]]:
    """The fusions of `fusable` that compute, on the example input, what the model computes: a dense
    twin with each fused layer applying its activation itself and each activation module of its own
    an identity (what sparsify serves) must give the model's `output` on it. The graph read may follow
    another branch than this input takes (an optional argument's `is not None`): a fusion that
    changes the output is dropped, alone where the others still agree, else all of them."""
    if not fusable:
        return {}
    args, named = example_call(example_input, kwargs)
    want = _tensors(output)

    def agrees(chosen: dict) -> bool:
        twin = copy.deepcopy(model).eval()
        for path, (act, own) in chosen.items():
            twin.get_submodule(path).register_forward_hook(
                lambda module, inputs, output, act=act: torch.relu(output) if act == "relu"
                else nn.functional.gelu(output))
            if own:
                _put(twin, own, nn.Identity())
        with torch.no_grad():
            got = _tensors(twin(*args, **named))
        return len(got) == len(want) and all(
            g.shape == w.shape and torch.allclose(g.double(), w.double(), rtol=1e-5, atol=1e-6 * max(1.0, float(
                w.double().abs().max()) if w.numel() else 1.0)) for g, w in zip(got, want))

    if agrees(fusable):
        return fusable
    alone = {path: f for path, f in fusable.items() if agrees({path: f})}
    return alone if alone and agrees(alone) else {}


def _tensors(output) -> list:
    """The floating-point tensors of a model's output, in order (tuples, lists, dicts, ModelOutput)."""
    if isinstance(output, torch.Tensor):
        return [output] if output.is_floating_point() else []
    if isinstance(output, Mapping):
        return [t for v in output.values() for t in _tensors(v)]
    if isinstance(output, (tuple, list)):
        return [t for v in output for t in _tensors(v)]
    return []


def following_activations(model: nn.Module) -> dict[str, str]:
    """Module path -> the activation ("relu", or "gelu" in its exact form) the model applies right
    after that nn.Linear / nn.Conv2d, to its output alone, that a kernel of it can fuse (see the
    comment above). A layer in a graph torch.fx cannot read is not listed: its activation stays the model's."""
    return {path: act for path, (act, _) in _fusable(model).items()}


# --- importer ------------------------------------------------------------------------------------
# --- importer ------------------------------------------------------------------------------------


class ExampleInputError(ValueError):
    """The model's forward pass failed on the example input (one line: the model and the error)."""


def example_call(example_input, kwargs: Mapping | None = None) -> tuple[tuple, dict]:
    """The (args, kwargs) a model is called with, as torch.export takes them: `example_input` is a
    tensor (one positional argument), a tuple of positional arguments, or a mapping of keyword
    arguments (what a tokenizer returns); `kwargs` adds keyword arguments."""
    if isinstance(example_input, Mapping):
        args, named = (), dict(example_input)
    elif isinstance(example_input, tuple):
        args, named = example_input, {}
    elif isinstance(example_input, list):
        raise TypeError("example_input: a tensor, a tuple of positional arguments or a mapping of keyword "
                        "arguments, not a list (a list is ambiguous: one argument or several?)")
    else:
        args, named = (example_input,), {}
    clash = sorted(set(named) & set(kwargs or {}))
    if clash:
        raise TypeError(f"example_input and kwargs both give {', '.join(clash)}")
    return tuple(args), {**named, **(kwargs or {})}


def _forward(model: nn.Module, example_input, kwargs: Mapping | None):
    """`model`'s output on the example (no grad); ExampleInputError in one line if it fails."""
    args, named = example_call(example_input, kwargs)
    try:
        with torch.no_grad():
            return model(*args, **named)
    except Exception as e:  # the model's own traceback says little about what the caller got wrong
        what = " ".join(f"{type(e).__name__}: {e}".split())
        given = ", ".join([*(_described(a) for a in args), *(f"{k}={_described(v)}" for k, v in named.items())])
        raise ExampleInputError(f"{type(model).__name__}: its forward pass failed on the example input ({given}): "
                                f"{what}") from None


def _described(value) -> str:
    if isinstance(value, torch.Tensor):
        return f"tensor{tuple(value.shape)} {str(value.dtype).removeprefix('torch.')}"
    return type(value).__name__


def layer_weights(model: nn.Module, example_input, kwargs: Mapping | None = None) -> list[GraphWeight]:
    """One GraphWeight per parameter and buffer of `model` (state_dict names): `op` "linear" or
    "conv" for a weight the example input's forward pass multiplies as a GEMM, else "" with the
    reason. `example_input`: a tensor, a tuple of positional arguments or a mapping of keyword
    arguments; `kwargs`: more keyword arguments (model(*args, **kwargs), as torch.export takes
    them). ExampleInputError (a ValueError) when the forward pass fails on them."""
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
        output = _forward(model, example_input, kwargs)
        for h in handles:
            h.remove()
        handles = []
        fusable = _verified(model, example_input, kwargs, output, _fusable(model))  # in eval mode, as `output`
    finally:
        for h in handles:
            h.remove()
        for m, was in training.items():
            m.training = was

    first_name = {id(m): n for n, m in modules.items()}
    activations = {path: act for path, (act, _) in fusable.items()}
    out = []
    for name, tensor in model_tensors(model).items():
        owner, _, leaf = name.rpartition(".")
        module = every_name.get(owner)
        if module is not None and first_name.get(id(module), owner) != owner:
            first = first_name[id(module)]
            out.append(GraphWeight(name, "", reason=f"the same tensor as {first + '.' if first else ''}{leaf} "
                                                    f"(one module under two names)"))
            continue
        found = _weight(name, tensor, module, leaf, calls.get(owner, []))
        if found.op:  # what its kernel fuses: the module's bias (saved beside it) and the activation after it
            bias = f"{owner}.bias" if getattr(module, "bias", None) is not None else ""
            found = dataclasses.replace(found, bias=bias, activation=activations.get(owner, ""))
        out.append(found)
    return out


def model_tensors(model: nn.Module) -> dict[str, "torch.Tensor"]:
    """The model's state_dict (its tensors, not detached), with each tensor that torch.nn.utils.prune
    reparametrized as the model computes with it: `fc.weight` = `fc.weight_orig` · `fc.weight_mask`, in
    place of the two (a model pruned with torch's pruning and `prune.remove` not yet called)."""
    state = model.state_dict(keep_vars=True)
    folded = {}
    for owner, module in model.named_modules():
        for leaf in ("weight", "bias"):
            orig, mask = getattr(module, f"{leaf}_orig", None), getattr(module, f"{leaf}_mask", None)
            if isinstance(orig, torch.Tensor) and isinstance(mask, torch.Tensor):
                prefix = f"{owner}." if owner else ""
                folded[f"{prefix}{leaf}_orig"] = (f"{prefix}{leaf}", orig * mask)
                folded[f"{prefix}{leaf}_mask"] = None
    out = {}
    for name, tensor in state.items():
        if name not in folded:
            out[name] = tensor
        elif folded[name] is not None:
            out[folded[name][0]] = folded[name][1]
    return out


def _weight(name: str, tensor, module, leaf: str, shapes: list[tuple[int, ...]]) -> GraphWeight:
    kind = type(module).__name__ if module is not None else "model"
    if not tensor.dtype.is_floating_point:
        return GraphWeight(name, "", reason=f"integer or other non-float buffer ({str(tensor.dtype)[6:]}) of {kind}")
    if isinstance(module, (nn.Linear, nn.Conv2d)) and leaf == "bias":
        return GraphWeight(name, "", reason=f"bias of {kind} (fused into its weight's kernel when that is searched)")
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
    geometry = {"cin": conv.in_channels, "kh": kh, "kw": kw, "stride": stride, "pad": pad, "groups": conv.groups,
                "h_in": x[2], "w_in": x[3], "h_out": h_out, "w_out": w_out, "dilation": dilation}
    return GraphWeight(name, "conv", conv.out_channels, conv.in_channels // conv.groups * kh * kw, conv=geometry,
                       batch=x[0])


def save_model(model: nn.Module, example_input, path: str | Path, kwargs: Mapping | None = None) -> Path:
    """Write the GEMM weights of `model` (as `layer_weights` finds them, and the biases their kernels
    fuse; state_dict names, in the model's own dtype: float32, float16 or bfloat16, other dtypes as
    float32) to a safetensors file, with every GraphWeight (geometry, and each other tensor's
    reason) in its metadata, for `lospmm run --weights PATH` (whose kernels follow that dtype).
    Written atomically; returns the path."""
    from safetensors.torch import save_file

    from lospmm.files import atomic_write

    weights = layer_weights(model, example_input, kwargs)
    state = {name: tensor.detach() for name, tensor in model_tensors(model).items()}
    names = [w.name for w in weights if w.op] + [w.bias for w in weights if w.op and w.bias]
    kept = (torch.float32, torch.float16, torch.bfloat16)
    tensors = {name: state[name].detach().to("cpu", state[name].dtype if state[name].dtype in kept else torch.float32)
               .contiguous().clone() for name in names}
    if not tensors:
        raise ValueError(f"{type(model).__name__}: no nn.Linear or nn.Conv2d weight is used by the example input")
    meta = {GRAPH_METADATA: json.dumps([asdict(w) for w in weights])}
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    atomic_write(path, lambda tmp: save_file(tensors, tmp, metadata=meta))
    return path


def search(model: nn.Module, example_input, sparsity: float | None = None, prune: str = "magnitude",
           artifacts: str | Path = "artifacts", name: str | None = None, kwargs: Mapping | None = None,
           **options) -> str:
    """Save `model` (`save_model`, under `<artifacts>/models/`) and run the whole search on it, as
    `lospmm run --weights FILE --prune PRUNE --sparsity SPARSITY` would, in this process (Prefect's
    ephemeral API unless one is configured). `example_input`: a tensor, a tuple of positional
    arguments or a mapping of keyword arguments (a tokenizer's output); `kwargs`: more keyword
    arguments — the model is run once as model(*args, **kwargs). `sparsity`: 0.9 by default; with
    prune="keep" (an already pruned model, its zeros kept) the default is the model's own share of
    zeros in its GEMM weights, with prune="nm:N:M" 1 - N/M. `options`: other RunConfig fields (gpu, timer, top_k, jobs, …),
    checked before anything is written. Returns the run id; ValueError in one line for a bad option
    (named by its keyword) or an example input the model's forward pass fails on."""
    os.environ.setdefault("PREFECT_SERVER_ANALYTICS_ENABLED", "false")  # as the CLI: no telemetry
    from lospmm.flows.config import ConfigError, RunConfig, checked_settings, resolved
    from lospmm.stages.prune import run_sparsities
    from lospmm.flows.pipeline import run_plan

    unknown = sorted(set(options) - {f.name for f in fields(RunConfig)} | set(options) & {"zoo", "weights", "sparsities"})
    if unknown:
        raise ValueError(f"lt.search: {', '.join(unknown)}: not run option(s) of lt.search (the model's own keyword "
                         f"inputs go in kwargs={{...}}, or pass a mapping as example_input); run options: "
                         f"{', '.join(_search_options())}")
    if sparsity is not None and (isinstance(sparsity, bool) or not isinstance(sparsity, numbers.Real)):
        raise ValueError(f"lt.search: sparsity must be one number in (0, 1) (a search is of one), got {sparsity!r}")
    settings = {"zoo": (), "prune": prune, "artifacts": str(artifacts), **options}
    try:  # every option but the model file, before the model is run and written
        checked_settings(RunConfig.from_dict({**settings, "sparsities": run_sparsities(
            () if sparsity is None else (sparsity,), prune, (0.5,))}))
    except ConfigError as e:
        raise ValueError(_as_keywords(str(e))) from None
    label = name or type(model).__name__.lower()
    tmp = Path(artifacts) / "models" / f".{label}.{os.getpid()}.{secrets.token_hex(4)}.pending.safetensors"
    try:
        save_model(model, example_input, tmp, kwargs)
        digest = hashlib.sha256(tmp.read_bytes()).hexdigest()[:12]
        path = tmp.with_name(f"{label}-{digest}.safetensors")
        tmp.replace(path)
    finally:
        tmp.unlink(missing_ok=True)
    try:
        if prune == "keep":  # the share of zeros its layers hold (kept_run_sparsity), or that share given
            from lospmm.flows.inputs.layers import kept_run_sparsity

            planned = resolved(RunConfig.from_dict({**settings, "weights": str(path.resolve()), "sparsities": (0.5,)}))
            sparsity = kept_run_sparsity(next(s for s in planned.sources if s.kind == "weights"),
                                         () if sparsity is None else (sparsity,))
        elif sparsity is None:  # nm:N:M: 1 - N/M
            sparsity = run_sparsities((), prune, (0.9,))[0]
        plan = resolved(RunConfig.from_dict({**settings, "weights": str(path.resolve()), "sparsities": (sparsity,)}))
    except (ConfigError, ValueError) as e:
        raise ValueError(_as_keywords(str(e))) from None
    from prefect.exceptions import TerminationSignal

    from lospmm.flows.execution.server import api_start_failure, detach_embedded_api
    from lospmm.flows.execution.stopping import record_ended, stops_cleanly
    from lospmm.flows.execution.taskio import Interrupted
    from lospmm.flows.pipeline import new_run_id
    from lospmm.flows.storage.runs import RunStatus

    run_id = new_run_id()
    try:  # Ctrl-C (or SIGTERM) stops the flow's tasks too, records the run cancelled, and raises
        with stops_cleanly():
            result = run_plan(plan, run_id=run_id, before_flow=detach_embedded_api)
    except RuntimeError as e:
        line = api_start_failure(e)
        if line is None:
            raise
        raise RuntimeError(f"lt.search: {line}") from None
    except (KeyboardInterrupt, TerminationSignal, Interrupted):
        record_ended(plan.root, run_id, RunStatus.CANCELLED)
        raise KeyboardInterrupt(f"lt.search: run {run_id} cancelled; finished artifacts are kept and searching "
                                f"again resumes from them") from None
    if result.get("error"):
        raise RuntimeError(f"lt.search: run {run_id} failed: {result['error']}")
    from lospmm.flows.reports.inspection import lospmm_command, run_outcome
    from lospmm.flows.storage.runs import run_record

    # as `lospmm run` exits 1 or 3: a failed run raises, layers that got no kernel are a warning naming them
    # (the others' kernels are served; lt.sparsify(strict=False) takes what there is)
    record = run_record(plan.root, result["run_id"])
    outcome, line = run_outcome(record)
    layers = record.get("layers") or {}
    if outcome == "failed" or (outcome == "layers" and len(layers.get("failed", ())) >= layers.get("total", 0)):
        raise RuntimeError(f"lt.search: {line} (`{lospmm_command(record, 'inspect', result['run_id'])}`)")
    if outcome == "layers":
        warnings.warn(f"lt.search: {line} (`{lospmm_command(record, 'inspect', result['run_id'])}` shows why)",
                      SearchWarning, stacklevel=2)
    for again in record.get("pruned_again", []):  # a pruned model searched without prune="keep"
        keyword = again.replace("`--prune keep`", "prune='keep'")
        warnings.warn(f"lt.search: {keyword}", SearchWarning, stacklevel=2)
    return result["run_id"]


class SearchWarning(UserWarning):
    """lt.search finished, but some of the model's layers got no kernel (each named, with its status),
    or a model already pruned was pruned again (searched without prune="keep")."""


# a CLI flag in a ConfigError -> the keyword a Python caller gives (the rest: dashes to underscores)
_KEYWORD_OF_FLAG = {"sparsity": "sparsity", "m1": "m1s", "weights": "model", "zoo": "model"}


def _as_keywords(message: str) -> str:
    """A ConfigError's line as a Python caller reads it: --top-k becomes top_k, except in a command it
    quotes (`lospmm kernel --design nm` stays a command)."""
    import re

    def keywords(text: str) -> str:
        return re.sub(r"(?<![\w-])--([a-z][a-z0-9-]*)", lambda m: _KEYWORD_OF_FLAG.get(m[1], m[1].replace("-", "_")),
                      text)

    parts = message.split("`")  # the odd parts are quoted
    return "lt.search: " + "`".join(keywords(part) if i % 2 == 0 else part for i, part in enumerate(parts))


def _search_options() -> list[str]:
    from lospmm.flows.config import RunConfig

    return [f.name for f in fields(RunConfig) if f.name not in ("zoo", "weights", "sparsities", "prune", "artifacts")]


# --- the drop-in ---------------------------------------------------------------------------------


def _inference_only(x, kernel) -> None:
    if torch.is_grad_enabled() and x.requires_grad:
        raise RuntimeError(f"{kernel.spec.layer}: an emitted kernel has no backward (A is baked into it); "
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


def _spec(name: str) -> KernelSpec:
    """The KernelSpec of `name`: the registered kernel's, else read from its kernel.json (not loaded: a
    fake needs no device)."""
    return _KERNELS[name].spec if name in _KERNELS else kernel_package(name.split("|", 1)[1]).spec


# Defined with torch.library.Library, not custom_op: custom_op's Python wrapper (its autograd kernel,
# the aliasing check) cost 8 µs a call on a 2-core host and 43 µs on the H200's, where the whole
# eager call of the loader's SpMM is 24 µs (benchmarks.launch_overhead, 2026-11-26). The kernels have
# no backward: the implementations refuse a grad-requiring input by name (_inference_only), as custom_op's
# autograd kernel did at backward (without either, backward would pass by the op with a warning).
_DEFINED = hasattr(torch.ops.lospmm, "spmm")  # this module loaded again (importlib.reload): defined once


def _launched(x: torch.Tensor, kernel: str) -> torch.Tensor:
    """Both operators' implementation: the kernel `kernel` (kernel_name) on its input, C = A·B for a
    GEMM kernel (B K×N in its dtype, C M×N), Y = conv(X) for an implicit-im2col one (NCHW)."""
    loaded = _loaded(kernel)
    _inference_only(x, loaded)
    return loaded(x)


def _spmm_fake(b: torch.Tensor, kernel: str) -> torch.Tensor:
    return b.new_empty(_spec(kernel).output_shape(b.shape[1]))


def _conv_fake(x: torch.Tensor, kernel: str) -> torch.Tensor:
    return x.new_empty(_spec(kernel).output_shape(x.shape[0]))


if not _DEFINED:  # (the first definitions read this module's globals, which a reload rebinds in place)
    _LIBRARY = torch.library.Library("lospmm", "DEF")
    _LIBRARY.define("spmm(Tensor b, str kernel) -> Tensor")
    _LIBRARY.define("conv(Tensor x, str kernel) -> Tensor")
    for _key in ("CPU", "CUDA"):  # the host backend's kernels take CPU tensors
        _LIBRARY.impl("spmm", _launched, _key)
        _LIBRARY.impl("conv", _launched, _key)
    torch.library.register_fake("lospmm::spmm")(_spmm_fake)
    torch.library.register_fake("lospmm::conv")(_conv_fake)


spmm = torch.ops.lospmm.spmm.default  # what the modules call: the overload itself, no lookup a call
conv = torch.ops.lospmm.conv.default


def sparse_linear(kernel_dir: str | Path, bias=None, backend: str = "cuda") -> "SparseLinear":
    """A torch.nn.Module computing x @ W.T with W the kernel's pruned weight (out × in), through what
    the kernel fuses (kernel.json's `epilogue`: the layer's bias, and the activation the model applied
    after it, as a run of a model's own weights emits it: lt.search, save_model, ONNX), plus `bias` where the
    kernel fuses none. A bias given for a kernel that adds its own, or that applies an activation
    (which the bias must come before), is refused (ValueError): it would be wrong without a sign.
    `extra_repr` says what the kernel fuses."""
    return SparseLinear(load_kernel(kernel_dir, backend), bias)


def _own_bias(kernel: SpMM | SpConv, bias):
    """`bias` as the module's own parameter, None when none is given; refused where the kernel adds one."""
    if bias is None:
        return None
    epilogue, layer = kernel.spec.epilogue, kernel.spec.layer or kernel.dir.name
    if epilogue.bias:
        raise ValueError(f"{layer}: the kernel adds its layer's bias itself (kernel.json's epilogue: {epilogue.label}); "
                         f"give no bias, or it is added twice")
    if epilogue.activation:  # act(A·B) + bias is not act(A·B + bias)
        raise ValueError(f"{layer}: the kernel applies {epilogue.activation} to A·B itself, and a bias added after it "
                         f"would come after the activation; emit the kernel with the bias fused (a model's own run)")
    return nn.Parameter(bias.detach().clone(), requires_grad=False)


def _fuses(kernel: SpMM | SpConv) -> str:
    label = kernel.spec.epilogue.label
    return f", fuses {label}" if label else ""


class SparseLinear(nn.Module):
    """x @ A.T (+ bias) with A baked into an emitted GEMM kernel (out × in), through the kernel's
    fused epilogue (its bias and activation, if any: then `bias` must be None)."""

    def __init__(self, kernel: SpMM, bias=None):
        super().__init__()
        self.kernel, self.in_features, self.out_features = kernel, kernel.k, kernel.m
        self.name = kernel_name(kernel)
        self.bias = _own_bias(kernel, bias)

    def forward(self, x):  # (a grad-requiring x is refused by the operator it calls)
        if x.shape[-1] != self.in_features:
            raise ValueError(f"{self.kernel.spec.layer}: input has {x.shape[-1]} features, the kernel "
                             f"takes {self.in_features}")
        lead = x.shape[:-1]
        y = spmm(x.reshape(-1, self.in_features).t().contiguous(), self.name).t()  # C = A·Xᵀ is out × tokens
        if self.bias is not None:
            y = y + self.bias
        return y.reshape(*lead, self.out_features)

    def extra_repr(self) -> str:
        return (f"in={self.in_features}, out={self.out_features}, kernel={self.kernel.dir.name}, {self.kernel.backend}"
                f"{_fuses(self.kernel)}")


class SparseConv2d(nn.Module):
    """An nn.Conv2d on an emitted kernel (a grouped one's A block-diagonal over all input channels):
    the implicit-im2col kernel reads X itself;
    a GEMM kernel (an im2col run) gets the unfolded input. Bias added after."""

    def __init__(self, kernel: SpMM | SpConv, conv: nn.Conv2d, geometry: dict, bias=None):
        super().__init__()
        self.kernel, self.geometry = kernel, geometry
        self.name = kernel_name(kernel)
        self.out_channels = conv.out_channels
        self.bias = _own_bias(kernel, bias)

    def forward(self, x):  # (a grad-requiring x is refused by the operator it calls)
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
        return f"out={self.out_channels}, {form}, kernel={self.kernel.dir.name}, {self.kernel.backend}{_fuses(self.kernel)}"


@dataclass(frozen=True)
class Replacement:
    """What sparsify did with one kernel directory: `module` replaced, or `reason` why not."""

    layer: str
    kernel_dir: str
    module: str = ""
    reason: str = ""
    fused: str = ""  # what the kernel fuses besides the product: "", "bias", "bias+relu", "relu", …


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
    from lospmm.flows.reports.inspection import lospmm_command
    from lospmm.flows.storage.runs import artifacts_of, run_record, why_no_artifact
    from lospmm.flows.storage.store import ArtifactError, read_artifact

    try:
        record = run_record(artifacts, str(source))
    except (LookupError, ValueError) as e:
        raise KernelDirError(f"{source}: neither a kernel directory nor a run under {artifacts} ({e})") from None
    emits = artifacts_of(record, "emit")
    if not emits:
        raise KernelDirError(f"no kernels to serve: {why_no_artifact(record, 'emit', 'search again as before')}")
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
    emitted = Path(artifacts) / emits[0]["path"]
    try:
        table = read_artifact(emitted, columns=["kernel_dir", "status"]).to_pylist()
    except ArtifactError as e:  # a file of it edited or deleted since: name that file, and what mends it
        rerun = lospmm_command(record, "rerun", "--stage", "emit", record["run_id"], root=artifacts)
        raise KernelDirError(f"run {record['run_id']}: {e.reason or e}; `{rerun}` rebuilds it") from None
    found = [Path(artifacts) / r["kernel_dir"] for r in table if r["status"] == "ok" and r["kernel_dir"]]
    if not found:  # as an empty folder: nothing to serve is no model served
        raise KernelDirError(f"run {record['run_id']}: no layer got a kernel "
                             f"(`{lospmm_command(record, 'inspect', record['run_id'], root=artifacts)}` "
                             f"says why)")
    return found


def _weight_matrix(module: nn.Module) -> np.ndarray:
    """The module's weight as the A its kernel bakes: out × in for a linear layer, Cout × cin·kh·kw
    for a convolution (a grouped one's blocks on the diagonal, zeros between: prune.grouped_as_dense)."""
    w = module.weight.detach().to("cpu", torch.float32).numpy()
    w = w.reshape(w.shape[0], -1)
    groups = getattr(module, "groups", 1)
    if groups == 1:
        return w
    per_group, k = w.shape[0] // groups, w.shape[1]
    dense = np.zeros((w.shape[0], k * groups), np.float32)
    for g in range(groups):
        dense[g * per_group:(g + 1) * per_group, g * k:(g + 1) * k] = w[g * per_group:(g + 1) * per_group]
    return dense


def _module_weight(a: np.ndarray, module: nn.Module) -> np.ndarray:
    """The inverse of _weight_matrix: a kernel's dense A as the module's weight tensor's values."""
    groups = getattr(module, "groups", 1)
    if groups > 1:
        per_group, k = a.shape[0] // groups, a.shape[1] // groups
        a = np.concatenate([a[g * per_group:(g + 1) * per_group, g * k:(g + 1) * k] for g in range(groups)])
    return a.reshape(module.weight.shape)


_TORCH_DTYPES = {"fp16": torch.float16, "bf16": torch.bfloat16, "fp32": torch.float32}


def _matching(a, spec: KernelSpec, module: nn.Module, layer: str, activation_after: Callable[[], str],
              any_dtype: bool = False) -> str:
    """"" when the kernel computes this module's operation (a plain nn.Linear / nn.Conv2d, the same
    convolution geometry) with its weight, entries zeroed, and what it fuses is the module's bias
    and the activation the model applies right after it (`activation_after()`); else why not.
    `any_dtype`: the module may be in another dtype than the kernel (lt.pruned's reference: a half
    kernel's A is the module's weight rounded to its dtype)."""
    if not isinstance(module, (nn.Linear, nn.Conv2d)):
        return f"{layer}: the model's {type(module).__name__} is not an nn.Linear or nn.Conv2d"
    if not _plain(module):
        return f"{layer}: {type(module).__name__} overrides nn.{_base(module).__name__}'s forward"
    if spec.conv is not None:
        if not isinstance(module, nn.Conv2d):
            return f"{layer}: a convolution kernel for the model's {type(module).__name__}"
        g = spec.conv.facts()
        mine = _conv_weight(layer, module, (1, module.in_channels, g["h"], g["w"]))
        if not mine.op:
            return f"{layer}: {mine.reason}"
        keys = ("cin", "kh", "kw", "stride", "pad", "dilation")
        theirs, ours = {k: g[k] for k in keys}, {k: mine.conv[k] for k in keys}
        if ours != theirs:
            return f"{layer}: the kernel's convolution ({theirs}) is not the module's ({ours})"
    kernel_dtype = spec.dtype
    model_dtype = next((name for name, d in _TORCH_DTYPES.items() if d == module.weight.dtype), "fp32")
    if kernel_dtype != model_dtype and not any_dtype:
        torch_dtype = str(_TORCH_DTYPES[kernel_dtype])
        return (f"{layer}: the kernel computes in {kernel_dtype}, the module's weight is "
                f"{str(module.weight.dtype).removeprefix('torch.')} (no silent conversion: serve the model in the "
                f"kernels' dtype, model.to({torch_dtype}), or search it in its own)")
    w = _weight_matrix(module)
    if kernel_dtype != model_dtype:  # (any_dtype) the module's values as the kernel's dtype holds them
        w = torch.from_numpy(w).to(_TORCH_DTYPES[kernel_dtype]).float().numpy()
    if w.shape != a.shape:
        return f"{layer}: the kernel's A is {a.shape[0]}×{a.shape[1]}, the model's weight {w.shape[0]}×{w.shape[1]}"
    rows = np.repeat(np.arange(a.shape[0]), np.diff(a.indptr))
    differ = int(np.count_nonzero(w[rows, a.indices] != a.data))
    if differ:
        return (f"{layer}: {differ} of the kernel's {a.nnz} nonzeros differ from the model's weight: "
                f"the kernel was built from other weights")
    epilogue = spec.epilogue
    if epilogue.bias:
        mine = None if module.bias is None else module.bias.detach().to("cpu", torch.float32).numpy()
        # the kernel's bias as the module's dtype holds it: a half model from the fp32 file the run read
        # has each value rounded, the kernel adds the file's (as close as the half output shows)
        theirs = torch.tensor(epilogue.bias, dtype=torch.float32).to(module.weight.dtype).float().numpy()
        if mine is None or mine.shape != theirs.shape or not np.array_equal(mine, theirs):
            return (f"{layer}: the kernel fuses a bias that is not the module's "
                    f"({'it has none' if mine is None else 'other values'}): the kernel was built from other weights")
    if epilogue.activation and not epilogue.bias and getattr(module, "bias", None) is not None:
        return (f"{layer}: the kernel fuses {epilogue.activation} but not the module's bias, which comes before it: "
                f"emit it with the bias fused (a run of lospmm.torch's model file), or without the activation")
    if epilogue.activation and activation_after() != epilogue.activation:
        owner = layer.rpartition(".")[0]
        return (f"{layer}: the kernel fuses {epilogue.activation}, but the model does not apply "
                f"{epilogue.activation} right after {owner} (and to its output alone, in a graph torch.fx can read)")
    return ""


def replacements(model: nn.Module, source: str | Path, artifacts: str | Path = "artifacts",
                 sparsity: float | None = None, any_dtype: bool = False) -> list[Replacement]:
    """For each kernel directory behind `source` (kernel_dirs): the module of `model` its layer names
    (state_dict name `<module>.weight`) when its pruned A is that module's weight with entries
    zeroed and what it fuses is the module's bias and the activation after it, else the reason it
    is not used. A kernel from other weights (a zoo run's random ones, another checkpoint) is never used.
    `any_dtype`: a module in another dtype than its kernel matches too (the reference lt.pruned makes)."""
    modules = dict(model.named_modules())
    activations: list[dict[str, str]] = []  # read from the model's graph once, when a kernel fuses one

    def activation_after(owner: str) -> str:
        if not activations:
            activations.append(following_activations(model))
        return activations[0].get(owner, "")

    out = []
    for d in kernel_dirs(source, artifacts, sparsity):
        try:
            package = read_package(d, ("kernel.json", "weight.parquet"))
        except KernelDirError as e:  # damaged, or one this lospmm cannot read: a reason, not the end of the plan
            out.append(Replacement(d.name, str(d), reason=str(e)))
            continue
        layer = package.spec.layer
        owner, _, leaf = layer.rpartition(".")
        module = modules.get(owner) if leaf == "weight" else None
        if module is None:
            out.append(Replacement(layer, str(d), reason=f"{layer}: no module {owner or layer!r} in the model"))
            continue
        reason = _matching(package.matrix(), package.spec, module, layer, lambda: activation_after(owner), any_dtype)
        if reason.endswith("built from other weights") and any(isinstance(m, nn.BatchNorm2d) for m in modules.values()):
            reason += " (a model searched as lt.fold_batchnorm(model) is served as that model too)"
        out.append(Replacement(layer, str(d), owner if not reason else "", reason, package.spec.epilogue.label))
    return _one_kernel_a_module(out)


def _one_kernel_a_module(plan: list[Replacement]) -> list[Replacement]:
    """The plan, where two kernel directories would serve one module (a folder holding a run's kernel
    and another from `lospmm kernel --design …`) neither used, each saying so: which one to serve is
    the user's choice, not the folder's order."""
    dirs: dict[str, list[str]] = {}
    for r in plan:
        if r.module:
            dirs.setdefault(r.module, []).append(Path(r.kernel_dir).name)
    return [r if len(dirs.get(r.module, ())) < 2 else
            dataclasses.replace(r, module="", reason=f"{r.layer}: {len(dirs[r.module])} kernels in the source serve "
                                                   f"it ({', '.join(dirs[r.module])}): keep one")
            for r in plan]


def sparsify(model: nn.Module, source: str | Path, backend: str = "cuda", artifacts: str | Path = "artifacts",
             sparsity: float | None = None, strict: bool = True) -> nn.Module:
    """A copy of `model` with each nn.Linear / nn.Conv2d that has a kernel behind `source` (a run id
    under `artifacts`, an emit folder or one kernel directory) replaced by its emitted kernel, bias
    carried over unless the kernel fuses it (see below). `backend`: `cuda` (the GPU) or `host`
    (the CPU host emulation, for tests: slow). `strict`: raise KernelDirError when a kernel does not
    match the model (its reason), else skip it. The copy's `lospmm_replacements` lists every
    kernel the source emitted, what it fuses and what became of it. The model itself is left as it was.

    A kernel that fuses its layer's bias serves the module without a bias of its own; one that fuses
    the activation after it (following_activations) makes the model's module applying that
    activation an identity when it has one of its own (a ReLU applied by the model's code stays:
    applied twice it changes nothing).

    The copy is for inference (an emitted kernel has no backward). A convolution's kernel reads the
    input size it was searched for (any batch); another size raises ValueError naming the layer."""
    backend_here(backend)  # before any work
    plan = replacements(model, source, artifacts, sparsity)
    _refuse_mismatches(plan, strict)
    out = copy.deepcopy(model)  # aliases stay aliases in the copy: replaced together below
    out.requires_grad_(False)  # for inference: no parameter asks autograd to track what the kernels cannot
    fused = {r.module for r in plan if r.module and r.fused.removeprefix("bias").strip("+")}
    if fused:  # the kernel applies the activation: a module of the model's own that applied it becomes an identity
        for layer, (_, own) in _fusable(out).items():
            if layer in fused and own:
                _put(out, own, nn.Identity())
    paths = _paths(out)
    for r in plan:
        if not r.module:
            continue
        original = out.get_submodule(r.module)
        kernel = load_kernel(r.kernel_dir, backend)
        bias = None if r.fused.startswith("bias") else original.bias  # a fused bias is in the kernel
        if isinstance(original, nn.Linear):
            new = SparseLinear(kernel, bias)
        else:
            geometry = kernel.spec.conv.facts() if kernel.spec.conv is not None else _geometry_of(original)
            new = SparseConv2d(kernel, original, geometry, bias)
        for path in paths[id(original)]:  # every name the module goes by (a module shared by two parents)
            _put(out, path, new)
    out.lospmm_replacements = plan
    return out


def _refuse_mismatches(plan: list[Replacement], strict: bool) -> None:
    bad = [r.reason for r in plan if r.reason]
    if bad and strict:
        said = list(dict.fromkeys(bad))  # two kernels of one layer give one reason
        more = f"; and {len(said) - 3} more (lospmm.torch.replacements lists them)" if len(said) > 3 else ""
        raise KernelDirError(f"{len(bad)} of {len(plan)} kernels cannot serve the model: " + "; ".join(said[:3]) + more)


def _put(model: nn.Module, path: str, module: nn.Module) -> None:
    """`module` in `model` under the dotted `path`, in place of what was there."""
    parent, _, child = path.rpartition(".")
    setattr(model.get_submodule(parent) if parent else model, child, module)


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
    reference `sparsify`'s model must agree with, runnable anywhere. The same matching as sparsify,
    but in any dtype: each layer keeps its own values where its kernel keeps a weight (an fp32 model
    is the fp32 reference of a half run's kernels). `strict` raises KernelDirError for a kernel that
    does not match, else that layer stays as it is."""
    out = copy.deepcopy(model)
    plan = replacements(model, source, artifacts, sparsity, any_dtype=True)
    _refuse_mismatches(plan, strict)
    for r in plan:
        if r.module:
            module = out.get_submodule(r.module)
            kept = read_matrix(Path(r.kernel_dir) / "weight.parquet").toarray() != 0
            w = module.weight
            values = np.where(kept, _weight_matrix(module), np.float32(0))  # (its dtype's values, in float32)
            # a new Parameter: a weight tied elsewhere (an embedding table, say) keeps its own values
            module.weight = nn.Parameter(torch.from_numpy(_module_weight(values, module)).to(w.device, w.dtype),
                                         requires_grad=w.requires_grad)
    return out
