"""What a run is asked to do (`RunConfig`, plain options as the CLI and deployments give them) and,
validated once, what it will do (`RunPlan`: typed values — a Device, a Timer, sources, each stage's
parameters — that the flow hands to its tasks)."""

from __future__ import annotations

import json
import os
import re
import shutil
import tempfile
from collections import Counter
from dataclasses import asdict, dataclass, field, fields
from pathlib import Path
from typing import Any

from lospmm.flows.inputs.onnx_model import is_onnx, with_image_batch
from lospmm.flows.inputs.sources import RankerRef, Source
from lospmm.stages import STAGES
from lospmm.kernel.choices import DESIGN_CANDIDATES
from lospmm.kernel.design import BASELINE, KernelDesign, design_in, design_named
from lospmm.kernel.numbers import NumberFormat
from lospmm.stages.compile import ProxyCheck
from lospmm.stages.constrain import ConstrainParams
from lospmm.devices import Device, device_named
from lospmm.stages.emit import EmitParams, emit_params
from lospmm.stages.extract import (ZOO_NAMES, ModelConfig, ZooParams, excluded_reason, is_pooler, sanitized_name,
                                   used_zoo_params)
from lospmm.stages.prune import METHODS, WEIGHT_METHODS, PruneParams, checked_sparsity, default_method, nm_pattern
from lospmm.stages.rank import RankParams
from lospmm.search import DEFAULT_M1, SearchParams
from lospmm.stages.reorder import STRATEGIES, ReorderParams
from lospmm.kernel.estimate import estimate_timer
from lospmm.kernel.timing import Timer

TIMERS = ("auto", "estimate", "cuda")


class ConfigError(ValueError):
    """A bad run request; the message names the offending option, file or value."""


@dataclass(frozen=True)
class RunConfig:
    """A run's inputs and parameters. Defaults: zoo=("bert-base",), sparsities=(0.9,),
    until="emit", artifacts="artifacts", gpu="h100", seed=0, prune=None (random for the
    zoo, magnitude for weights), tokens=4096, M1 in DEFAULT_M1, th_row=th_col=0.25,
    verify=False (host-emulate compiled proxies under AddressSanitizer), timer="auto" (cuda
    when a GPU is present, else estimate), top_k=10, rank=True (False: time every kept
    candidate), ranker=None (the shipped model), jobs=0 (compile/emit threads; 0 = every core),
    dask="" (a Dask scheduler address: the flow's tasks and every kernel unit's compile run on that
    cluster through prefect-dask; its workers must see the artifact root at the same path),
    implicit_conv=True (False: convolutions get im2col GEMM kernels, `--im2col`), nm_kernel=True (a
    layer whose A holds an N:M pattern may be served by the N:M kernel where the estimate prices it
    lowest; False: `--no-nm-kernel`),
    design="chained" (the kernel design the constraints, proxies and emitted kernels follow:
    kernel.design.design_named's tokens, `--design`; a half source's is its half form: source_design;
    "auto": the design is a search dimension: each fp32 layer's candidates span every design of
    kernel.choices.DESIGN_CANDIDATES (each with its own constraints and proxies), ranked together by
    the design-aware ranker (storage.ranker_store.SHIPPED_DESIGNS), and emit prices the fastest
    proxy's tile in the others too and serves the design the device's design price ranks first:
    stages.emit.ranked_designs),
    dtype="" (the weights' own), accumulate="" (packed), promote_every=0, input_shapes=() (an ONNX model's inputs whose dims
    to fix before shape inference, trtexec's form "NAME:1x3x640x640", `--input-shape`), and the
    ZooParams defaults (batch 32 × seq 128 for BERT, batch 4 at 224×224 for CNNs; `batch` is also
    the row count of a checkpoint's pooler, one row per sequence)."""

    zoo: tuple[str, ...] = ("bert-base",)
    weights: str | None = None
    tokens: int = 4096
    sparsities: tuple[float, ...] = (0.9,)
    until: str = "emit"
    artifacts: str = "artifacts"
    gpu: str = "h100"
    seed: int = 0
    prune: str | None = None
    batch: int = 32
    seq_len: int = 128
    cnn_batch: int = 4
    image_size: int = 224
    m1s: tuple[int, ...] = DEFAULT_M1
    th_row: float = 0.25
    th_col: float = 0.25
    verify: bool = False
    timer: str = "auto"
    top_k: int = 10
    rank: bool = True
    ranker: str | None = None
    jobs: int = 0
    dask: str = ""
    implicit_conv: bool = True
    nm_kernel: bool = True
    design: str = "chained"  # the device's A/B (H200, 2026-11-26): 1.157x the baseline in geomean, no layer slower
    input_shapes: tuple[str, ...] = ()
    dtype: str = ""  # the emitted kernels' B and C: fp32, fp16, bf16; "": the weights' own (fp32 for the zoo)
    accumulate: str = ""  # a half run's sums: packed (in the dtype; ""), or f32
    promote_every: int = 0  # a half run's packed sums moved into fp32 every this many nonzeros of a row (0: never)
    reorder: tuple[str, ...] = STRATEGIES  # candidate orders (stages.reorder); identity is always one
    reorder_budget: float = ReorderParams.budget_seconds  # the partitioner's priced seconds per layer

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> "RunConfig":
        known = {f.name for f in fields(cls)}
        unknown = set(d) - known
        if unknown:
            raise ConfigError(f"unknown run option(s): {', '.join(sorted(unknown))}")
        tuples = {"zoo", "sparsities", "m1s", "input_shapes", "reorder"}
        return cls(**{k: (tuple(v) if k in tuples and v is not None else v) for k, v in d.items()})

    def as_dict(self) -> dict[str, Any]:
        return {k: (list(v) if isinstance(v, tuple) else v) for k, v in asdict(self).items()}

    def stages(self) -> tuple[str, ...]:
        return STAGES[: STAGES.index(self.until) + 1]


@dataclass(frozen=True)
class RunPlan:
    """A validated run: every value a task needs, typed."""

    config: RunConfig
    root: Path
    stages: tuple[str, ...]
    sources: tuple[Source, ...]
    device: Device
    timer: Timer
    ranker: RankerRef
    prune: dict[str, PruneParams]  # per source kind
    search: SearchParams = field(default_factory=SearchParams)  # stages 3-7 and the kernel design, as the benchmarks take them
    proxy_check: ProxyCheck = field(default_factory=ProxyCheck)
    emit: EmitParams = field(default_factory=EmitParams)
    jobs: int = 1
    half_ranker: RankerRef | None = None  # the half sources' (None: the run has none)

    @property
    def sparsities(self) -> tuple[float, ...]:
        """Each requested sparsity once, in the order given (`--sparsity 0.9 0.9` is one run of 0.9)."""
        return tuple(dict.fromkeys(float(s) for s in self.config.sparsities))

    def ranker_for(self, source: Source) -> RankerRef:
        """The ranker of `source`'s candidates: the half kernels' model for an fp16/bf16 source (a
        --ranker serves the sources of the kind it was trained on; the shipped model the others)."""
        return self.half_ranker if source.dtype != "fp32" and self.half_ranker is not None else self.ranker

    def design_for(self, source: Source) -> KernelDesign:
        """The kernel design `source`'s search and kernels follow: the run's, in the source's dtype
        (a half source's: one packed pair per thread, the run's accumulation)."""
        return source_design(self.search.design, source.dtype, self.config.accumulate, self.config.promote_every)

    def designs_for(self, source: Source) -> tuple[KernelDesign, ...]:
        """The designs `source`'s search spans: every one of a `--design auto` run (search.designs) for
        fp32 kernels, else design_for's alone (a half kernel has one grid so far)."""
        if self.search.designs and source.dtype == "fp32":
            return self.search.designs
        return (self.design_for(source),)


MIN_FREE_BYTES = 256 * 2**20  # below this a run would fail writing artifacts or compile-cache entries


def resolved(cfg: RunConfig) -> RunPlan:
    """The plan for `cfg`, or ConfigError naming the problem, before any work. Reads only headers
    and metadata (and writes one probe file to the artifact root)."""
    device, told = _check_options(cfg)
    checked_root(Path(cfg.artifacts))
    stages = cfg.stages()
    rank = RankParams(top_k=cfg.top_k, use_rank=cfg.rank)
    sources = tuple(_sources(cfg, told))
    design = run_design(cfg.design)
    for source in sources:
        checked_dtype(source, device)
        try:
            source_design(design, source.dtype, cfg.accumulate, cfg.promote_every)
        except ValueError as e:
            raise ConfigError(f"{source.label}: {source.dtype} kernels: {e}") from None
    given_half = _ranks_half(cfg.ranker) if cfg.ranker and cfg.rank and "rank" in stages else None
    if given_half is not None:
        kind = "half" if given_half else "fp32"
        if all((s.dtype != "fp32") != given_half for s in sources):
            raise ConfigError(f"--ranker {cfg.ranker} ranks {kind} kernels; this run's sources are "
                              f"{', '.join(sorted({s.dtype for s in sources}))} (train one with `lospmm train-ranker "
                              f"--dtype ...`, or leave --ranker out for the shipped one)")
    if (cfg.accumulate or cfg.promote_every) and all(s.dtype == "fp32" for s in sources):
        raise ConfigError("--accumulate and --promote-every are a half run's (fp16 or bf16 kernels: --dtype, or "
                          "half weights)")
    return RunPlan(
        config=cfg, root=Path(cfg.artifacts).resolve(), stages=stages, sources=sources, device=device,
        timer=resolved_timer(cfg.timer, device), ranker=_ranker(cfg, stages, False, given_half),
        half_ranker=_ranker(cfg, stages, True, given_half) if any(s.dtype != "fp32" for s in sources) else None,
        prune={kind: PruneParams(method=cfg.prune or default_method(kind), seed=cfg.seed)
               for kind in ("zoo", "weights")},
        search=SearchParams(m1s=tuple(sorted(set(cfg.m1s))), constrain=ConstrainParams(th_row=cfg.th_row, th_col=cfg.th_col),
                            rank=rank, design=design, designs=run_designs(cfg.design),
                            reorder=ReorderParams(strategies=cfg.reorder, budget_seconds=cfg.reorder_budget,
                                                  price_device=device.name, max_cov_nnz=cfg.th_row)),
        emit=emit_params(rank, verify=True, implicit_conv=cfg.implicit_conv, nm_kernel=cfg.nm_kernel,
                         designs=DESIGN_CANDIDATES if cfg.design == AUTO_DESIGN else ()), jobs=cfg.jobs or _cores())


def scheduler_problem(address: str, timeout_s: float = 5.0) -> str:
    """"" when a Dask scheduler accepts a connection at `address` within `timeout_s`, else why not,
    in one line: checked before the Prefect server and the flow start, not a minute into the run."""
    import asyncio

    from distributed.comm import connect

    async def probe() -> None:
        comm = await connect(address, timeout=timeout_s)
        await comm.close()

    try:
        asyncio.run(probe())
        return ""
    except Exception as e:  # refused, unreachable, timed out, a bad host name
        return " ".join(f"{type(e).__name__}: {e}".split())[:300]


AUTO_DESIGN = "auto"  # --design auto: the design is a search dimension (run_designs), the baseline first


def run_designs(text: str) -> tuple[KernelDesign, ...]:
    """The designs each layer's search spans: kernel.choices.DESIGN_CANDIDATES for `--design auto`
    (the baseline first), none besides the run's design otherwise."""
    return tuple(design_named(d) for d in DESIGN_CANDIDATES) if text == AUTO_DESIGN else ()


def trained_designs(text: str) -> tuple[KernelDesign, ...]:
    """The designs `train-ranker --designs` ranks together: "" none (a ranker of one design), "auto"
    the run's candidates (run_designs), else labels split by ';' (two or more fp32 tiled designs;
    `auto` among them stands for the run's candidates: 'auto;staged,tiles=8'); ConfigError naming what
    cannot be read. A staged design's tiles are told apart by stages.rank.STAGED_FEATURES."""
    if not text:
        return ()
    if text == AUTO_DESIGN:
        return run_designs(text)
    try:
        designs = tuple(dict.fromkeys(d for t in text.split(";") if t.strip()
                                      for d in (run_designs(AUTO_DESIGN) if t.strip() == AUTO_DESIGN
                                                else (design_named(t.strip()),))))
    except ValueError as e:
        raise ConfigError(f"--designs: {e}") from None
    if len(designs) < 2:
        raise ConfigError(f"--designs {text!r}: name two or more designs (split by ';'), or 'auto'")
    odd = [d.label for d in designs if d.half or not d.tiled]
    if odd:
        raise ConfigError(f"--designs: {', '.join(odd)}: a design-aware ranker ranks fp32 tiled designs")
    return designs


# KernelDesign's fields as the --design tokens that set them: its checks name the fields
_DESIGN_TOKENS = {"column_walks": "walks=W", "columns_per_thread": "v=V", "tiles_per_block": "tiles=G",
                  "tile_warps": "warps=W", "section_fmas": "split=S", "k_slices": "slices=W"}


def _as_tokens(message: str) -> str:
    """design_named's error in the words of --design: its tokens, and `auto` beside them."""
    for name, token in _DESIGN_TOKENS.items():
        message = message.replace(f"design {name} ", f"{token} ").replace(f"{name}=", f"{token.split('=')[0]}=")
    message = message.replace("loads=", "")  # its value is the token: based, chained, staged
    return message.replace("(tokens: ", f"(`{AUTO_DESIGN}`, `baseline`, or tokens: ")


def read_design(text: str) -> KernelDesign:
    """`--design`'s text as a design (design_named), or ConfigError in the flag's words (_as_tokens);
    one with no token is refused: design_named reads it as the baseline, where a flag given empty is
    more likely a slip."""
    tokens = [token.strip() for token in text.split(",")]
    if not any(tokens):
        raise ConfigError(f"--design {text!r} names no design: give one ({AUTO_DESIGN}, baseline, chained, "
                          f"chained,v=4, …)")
    if AUTO_DESIGN in tokens:
        raise ConfigError(f"--design {text!r}: `{AUTO_DESIGN}` stands alone (the search spans the designs of "
                          f"kernel.choices.DESIGN_CANDIDATES); to force one design, give its tokens without it")
    try:
        return design_named(text)
    except ValueError as e:
        raise ConfigError(f"--design: {_as_tokens(str(e))}") from None


def run_design(text: str) -> KernelDesign:
    """The kernel design of a run (`--design`; `auto`: the baseline, the first of the designs its
    search spans, run_designs), or ConfigError naming what cannot be read or searched."""
    if text == AUTO_DESIGN:
        return BASELINE
    design = read_design(text)
    if design.half:
        raise ConfigError(f"--design {text}: a run's kernels take their dtype from --dtype (or the weights), and a "
                          f"half run's sums from --accumulate and --promote-every")
    if not design.tiled:
        raise ConfigError(f"--design {text}: the N:M kernel is no design to search in; a run serves each N:M layer "
                          f"by it where the estimate prices it lower (unless --no-nm-kernel), and `lospmm kernel "
                          f"--design nm` writes it for one layer")
    return design


def resolved_timer(timer: str, device: Device) -> Timer:
    """"auto" -> cuda when a GPU is present, else estimate; "cuda" without a GPU is a ConfigError."""
    from lospmm.kernel.cuda import gpu_present

    if timer not in TIMERS:
        raise ConfigError(f"--timer {timer!r}: choose one of {', '.join(TIMERS)}")
    if timer == "auto":
        timer = "cuda" if gpu_present() else "estimate"
    if timer == "estimate":
        return estimate_timer(device)
    if not gpu_present():
        raise ConfigError("--timer cuda: no CUDA device here (use --timer estimate, or auto)")
    from lospmm.kernel.cuda import CudaTimer, device_facts

    return CudaTimer(device, device_facts()["name"])


def checked_root(root: Path, min_free: int = MIN_FREE_BYTES) -> Path:
    """`root`, created if need be, or ConfigError with one line saying why no run can write there:
    a file in its place or above it, no permission, a read-only file system, a full disk."""
    root = root.resolve()
    existing = next(p for p in (root, *root.parents) if p.exists())
    if not existing.is_dir():
        where = "is a file" if existing == root else f"lies under {existing}, which is a file"
        raise ConfigError(f"--artifacts {root}: {where}; give a directory")
    try:
        root.mkdir(parents=True, exist_ok=True)
        with tempfile.NamedTemporaryFile(dir=root, prefix=".lospmm-probe-") as probe:
            probe.write(b"\0" * 4096)
            probe.flush()
            os.fsync(probe.fileno())
    except OSError as e:
        raise ConfigError(f"--artifacts {root}: cannot write there ({e.strerror or e}); "
                          f"`lospmm inspect --artifacts {root}` can still read it") from None
    free = shutil.disk_usage(root).free
    if free < min_free:
        raise ConfigError(f"--artifacts {root}: only {free // 2**20} MiB free on its disk; a run needs at least "
                          f"{min_free // 2**20} MiB")
    return root


def weights_label(path: str) -> str:
    """A weights source's label: its file's stem; a sharded checkpoint's folder name (its index is
    model.safetensors.index.json whatever the model)."""
    from lospmm.flows.inputs.weights import INDEX_SUFFIX

    path = Path(os.path.abspath(path))  # not resolved: a Hugging Face cache's files link to blobs/<hash>
    return sanitized_name(path.parent.name if path.name.endswith(INDEX_SUFFIX) else path.stem)


def _cores() -> int:
    return os.cpu_count() or 1


def _ranker(cfg: RunConfig, stages: tuple[str, ...], half: bool, given_half: bool | None) -> RankerRef:
    """The ranker of the run's fp32 sources, or (`half`) of its fp16/bf16 ones: --ranker for the kind
    of kernels it was trained on (`given_half`, _ranks_half of it), the shipped model of the kind
    otherwise."""
    if not (cfg.rank and "rank" in stages):
        return RankerRef(cfg.ranker, "none")
    from lospmm.flows.storage.ranker_store import SHIPPED_DESIGNS, RankerError, checked_ranker, shipped_ranker
    from lospmm.stages.rank import ranker_features, ranks_designs

    designs = not half and cfg.design == AUTO_DESIGN  # the fp32 candidates span designs: ranked together
    path = cfg.ranker if cfg.ranker and given_half == half else \
        (str(shipped_ranker(half=True)) if half else str(SHIPPED_DESIGNS) if designs else None)
    try:
        _, meta = checked_ranker(path)  # the model itself, not only its metadata: a bad file fails here
        ref = RankerRef(path, meta["version"])
    except (RankerError, KeyError) as e:
        raise ConfigError(f"--ranker: {e}") from None
    if designs and not ranks_designs(ranker_features(meta)):
        raise ConfigError(f"--ranker {cfg.ranker}: ranks the tiles of one kernel design, and --design auto ranks "
                          f"every design's together (train one with `lospmm train-ranker --designs auto`, or leave "
                          f"--ranker out for the shipped one)")
    return ref


def _ranks_half(path: str) -> bool:
    """Whether the ranker at `path` was trained on half kernels (its metadata's design)."""
    from lospmm.flows.storage.ranker_store import RankerError, ranker_metadata

    try:
        design = ranker_metadata(Path(path)).get("design") or "baseline"
        return design_named(design).half
    except (RankerError, ValueError, AttributeError) as e:
        raise ConfigError(f"--ranker: {e}") from None


def _sources(cfg: RunConfig, model_config: ModelConfig | None = None) -> list[Source]:
    """The run's sources; `model_config`: what the config.json beside --weights says (read once, by
    the validation)."""
    out = [Source("zoo", name, name, zoo=used_zoo_params(name, ZooParams(cfg.batch, cfg.seq_len, cfg.cnn_batch,
                                                                         cfg.image_size)), dtype=cfg.dtype or "fp32")
           for name in dict.fromkeys(cfg.zoo)]
    if cfg.weights:
        from lospmm.flows.inputs.weights import weights_file, weights_sha256

        # a sharded checkpoint's folder: its index; absolute, links kept (a Hugging Face cache's snapshot
        # holds links to blobs/<hash>, whose names say nothing of what they hold)
        path = os.path.abspath(weights_file(cfg.weights))
        onnx = is_onnx(path)
        out.append(Source("weights", weights_label(path), weights_label(path), path=path,
                          sha256=weights_sha256(path), tokens=cfg.tokens,
                          model_config=None if onnx else model_config, images=cfg.cnn_batch if onnx else 0,
                          input_shapes=with_image_batch(path, parsed_input_shapes(cfg.input_shapes), cfg.cnn_batch)
                          if onnx else parsed_input_shapes(cfg.input_shapes),
                          sequences=0 if onnx else _pooler_rows(cfg, path),
                          dtype=kernels_dtype(cfg.dtype, path),
                          transposed=() if onnx else conv1d_weights(path)))
    return out


# Hugging Face's Conv1D (GPT-2, OpenAI GPT, ImageGPT) stores a linear layer's weight input × output, the
# transpose of nn.Linear's (y = x·W + b). The config.json beside the file tells them apart: GPT-BigCode
# names its nn.Linear layers c_attn and c_fc too.
CONV1D_MODELS = frozenset({"gpt2", "openai-gpt", "imagegpt", "decision_transformer"})
_CONV1D_WEIGHT = re.compile(r"(^|\.)(c_attn|q_attn|c_fc|c_proj)\.weight$")


def conv1d_weights(weights: str | Path) -> tuple[str, ...]:
    """The 2-D tensors of a checkpoint (not one lospmm.torch.save_model wrote: its shapes are the
    modules') that are Conv1D weights, stored input × output: named so, in a model whose config.json
    says a Conv1D family's model_type."""
    from lospmm.flows.inputs.weights import saved_graph, tensor_infos

    if (_config_json(weights) or {}).get("model_type") not in CONV1D_MODELS or saved_graph(weights) is not None:
        return ()
    return tuple(t.name for t in tensor_infos(weights) if len(t.shape) == 2 and _CONV1D_WEIGHT.search(t.name))


def kernels_dtype(dtype: str, weights: str | None) -> str:
    """The dtype of a source's kernels: the run's --dtype, else its weights file's (ONNX: fp32), else
    fp32 (the zoo)."""
    if dtype:
        return dtype
    return "fp32" if not weights or is_onnx(weights) else weights_dtype(weights)


def source_design(design: KernelDesign, dtype: str, accumulate: str = "", promote_every: int = 0) -> KernelDesign:
    """`design` (a run's, fp32) for kernels of `dtype`: unchanged for fp32 (the sums are a half
    source's), else the half design with its loads (ValueError when the design has no half form)."""
    return design_in(NumberFormat.of(dtype, accumulate, promote_every), design)


def checked_dtype(source: Source, device: Device) -> None:
    """ConfigError when the device cannot run `source`'s kernel dtype: a half kernel's packed FMAs
    and conversions (fma.rn.bf16x2, cvt.rn.f16x2.f32) need sm_80 or newer."""
    if int(device.arch.split("_")[1].rstrip("a")) < NumberFormat.of(source.dtype).min_sm:
        raise ConfigError(f"{source.label}: {source.dtype} kernels need sm_80 or newer; the {device.name} is "
                          f"{device.arch} (give --dtype fp32, or another --gpu)")


# a safetensors dtype -> the kernels' (what a run of that checkpoint emits by default)
_KERNEL_DTYPES = {"F16": "fp16", "BF16": "bf16"}


def weights_dtype(path: str) -> str:
    """The dtype of a safetensors file's GEMM weights (lospmm.torch's file: its searched layers';
    a checkpoint: its 2-D and 4-D float tensors' most common), as a kernel dtype: fp16, bf16 or fp32."""
    from lospmm.flows.inputs.weights import saved_graph, tensor_infos

    infos = {t.name: t for t in tensor_infos(path)}
    graph = saved_graph(path)
    names = [w.name for w in graph if w.op] if graph is not None else [
        n for n, t in infos.items() if len(t.shape) in (2, 4) and t.dtype in ("F32", "F16", "BF16", "F64")]
    found = Counter(infos[n].dtype for n in names if n in infos)
    return _KERNEL_DTYPES.get(found.most_common(1)[0][0], "fp32") if found else "fp32"


def _pooler_rows(cfg: RunConfig, path: str) -> int:
    """--batch where a plain checkpoint has a pooler layer (its N: one row per sequence), else 0: the
    other checkpoints' keys do not change with --batch. Reads the header only."""
    from lospmm.flows.inputs.weights import saved_graph, tensor_infos

    if saved_graph(path) is not None:  # lospmm.torch's file: each layer's N came from a forward pass
        return 0
    return cfg.batch if any(is_pooler(t.name) for t in tensor_infos(path)) else 0


def parsed_input_shapes(specs: tuple[str, ...]) -> tuple[tuple[str, tuple[int, ...]], ...]:
    """--input-shape values as trtexec's --shapes takes them (`images:1x3x640x640`, several joined by
    commas or the option repeated) -> ((name, dims), ...); ConfigError names a value it cannot read."""
    out: dict[str, tuple[int, ...]] = {}
    for spec in (part.strip() for text in specs for part in str(text).split(",")):
        name, sep, dims = spec.rpartition(":")  # the last colon: a name may hold one (TF's `input:0`)
        name = name.strip("'\"")
        if not (sep and name and re.fullmatch(r"[1-9]\d*(x[1-9]\d*)*", dims.strip())):
            raise ConfigError(f"--input-shape {spec!r}: give NAME:DIMS, positive dims joined by x "
                              f"(e.g. images:1x3x640x640)")
        if name in out:
            raise ConfigError(f"--input-shape {name}: given twice")
        out[name] = tuple(int(d) for d in dims.strip().split("x"))
    return tuple(out.items())


def model_config(weights: str | Path) -> ModelConfig | None:
    """The `config.json` beside a checkpoint (Hugging Face layout), if there is one: it tells lookup
    tables from GEMM weights. ConfigError names a file that is there but unreadable."""
    data = _config_json(weights)
    return None if data is None else ModelConfig.from_dict(data)


def _config_json(weights: str | Path) -> dict | None:
    """The `config.json` beside a checkpoint as a dict, None where there is none; ConfigError names
    a file that is there but unreadable."""
    path = Path(weights) / "config.json" if Path(weights).is_dir() else Path(weights).parent / "config.json"
    if not path.is_file():
        return None
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as e:
        raise ConfigError(f"{path} (beside --weights): not readable JSON ({type(e).__name__}: {e})") from None
    if not isinstance(data, dict):
        raise ConfigError(f"{path} (beside --weights): not a JSON object")
    return data


def _check_options(cfg: RunConfig) -> tuple[Device, ModelConfig | None]:
    """ConfigError naming the first bad option or file; else the device and the weights' config.json
    (what the checks had to read, so that the plan reads neither again)."""
    if not cfg.zoo and not cfg.weights:
        raise ConfigError("nothing to run: give --zoo NAME or --weights FILE")
    device = checked_settings(cfg)
    return device, _checked_sources(cfg)


def checked_settings(cfg: RunConfig) -> Device:
    """ConfigError naming the first bad option that is not a source (everything but --zoo's models'
    and --weights' files), else the device: what a caller checks before it writes a model file."""
    for name in cfg.zoo:
        if name not in ZOO_NAMES:
            raise ConfigError(f"unknown zoo model {name!r}; built-in: {', '.join(ZOO_NAMES)}")
    if not cfg.sparsities:
        raise ConfigError("give at least one --sparsity")
    for s in cfg.sparsities:
        try:
            checked_sparsity(s)
        except ValueError as e:
            raise ConfigError(f"--sparsity {s}: {e}") from None
    if cfg.until not in STAGES:
        raise ConfigError(f"--until {cfg.until!r}: choose one of {', '.join(STAGES)}")
    run_design(cfg.design)
    if cfg.dtype not in ("", "fp32", "fp16", "bf16"):
        raise ConfigError(f"--dtype {cfg.dtype!r}: choose fp32, fp16 or bf16 (or leave it out: the weights' own)")
    if cfg.accumulate not in ("", "packed", "f32"):
        hint = (" (mma, fp32 sums on sparse tensor cores, is the N:M kernel's: a half run prices it for each layer "
                "pruned N:M by itself, and `lospmm kernel --design nm --accumulate mma` writes it)"
                if cfg.accumulate == "mma" else "")
        raise ConfigError(f"--accumulate {cfg.accumulate!r}: choose packed or f32{hint}")
    if cfg.promote_every < 0 or (cfg.promote_every and cfg.accumulate == "f32"):
        raise ConfigError(f"--promote-every {cfg.promote_every}: a count >= 1 of a packed sum's nonzeros (0: never)")
    unknown = [s for s in cfg.reorder if s not in STRATEGIES]
    if unknown or not cfg.reorder:
        raise ConfigError(f"--reorder {','.join(cfg.reorder)}: choose among {', '.join(STRATEGIES)} "
                          f"(identity is always a candidate)")
    if not cfg.reorder_budget >= 0:
        raise ConfigError(f"--reorder-budget {cfg.reorder_budget}: seconds >= 0 (0: no partitioner)")
    try:
        device = device_named(cfg.gpu)
    except ValueError as e:
        raise ConfigError(f"--gpu: {e}") from None
    try:
        pattern = nm_pattern(cfg.prune or "")
    except ValueError as e:
        raise ConfigError(f"--prune {cfg.prune}: {e}") from None
    if cfg.prune is not None and pattern is None and cfg.prune not in METHODS:
        raise ConfigError(f"--prune {cfg.prune!r}: choose one of {', '.join(METHODS)}")
    if pattern is not None and any(abs(s - pattern.sparsity) > 1e-6 for s in cfg.sparsities):  # 1/3 as 0.333333
        raise ConfigError(f"--prune {cfg.prune} prunes to sparsity {pattern.sparsity:g} (1 - N/M): leave --sparsity "
                          f"out or give {pattern.sparsity:g}, not {' '.join(f'{s:g}' for s in cfg.sparsities)}")
    if cfg.prune in WEIGHT_METHODS and cfg.zoo:
        raise ConfigError(f"--prune {cfg.prune} needs real weights and the zoo models ({', '.join(cfg.zoo)}) have none: "
                          f"give --weights FILE, or --prune random")
    for name in ("tokens", "batch", "seq_len", "cnn_batch", "image_size"):
        if getattr(cfg, name) < 1:
            raise ConfigError(f"--{name.replace('_', '-')} must be >= 1, got {getattr(cfg, name)}")
    if not cfg.m1s or min(cfg.m1s) < 1:
        raise ConfigError(f"--m1 values must be >= 1, got {list(cfg.m1s)}")
    for name in ("th_row", "th_col"):
        if not getattr(cfg, name) >= 0:
            raise ConfigError(f"--{name.replace('_', '-')} must be >= 0, got {getattr(cfg, name)}")
    if cfg.jobs < 0:
        raise ConfigError(f"--jobs must be >= 0 (0 = every core), got {cfg.jobs}")
    if cfg.dask:
        if not re.fullmatch(r"(tcp|tls|inproc|ws|wss|ucx)://\S+", cfg.dask):
            raise ConfigError(f"--dask must be a scheduler address such as tcp://host:8786, got {cfg.dask!r}")
        try:
            import prefect_dask  # noqa: F401
        except ImportError:
            raise ConfigError("--dask needs prefect-dask: pip install 'lospmm[dask]'") from None
        problem = scheduler_problem(cfg.dask)
        if problem:
            raise ConfigError(f"--dask {cfg.dask}: no Dask scheduler answers there ({problem})")
    if cfg.top_k < 1:
        raise ConfigError(f"--top-k must be >= 1, got {cfg.top_k}")
    if cfg.ranker:
        from lospmm.flows.storage.ranker_store import ranker_files

        lacking = [str(f) for f in ranker_files(Path(cfg.ranker)) if not f.is_file()]
        if lacking:
            raise ConfigError(f"--ranker {cfg.ranker}: no {' and no '.join(lacking)} (a ranker is the .txt model and "
                              f"its .json metadata, both written by `lospmm train-ranker`)")
    return device


# a shard of a sharded Hugging Face checkpoint: model-00001-of-00002.safetensors
SHARD = re.compile(r"-(\d{5})-of-(\d{5})\.safetensors$")


def _one_weights_file(path: Path) -> None:
    """ConfigError where --weights names a folder that holds no model to read as one: neither one
    index of a sharded checkpoint nor one safetensors file."""
    from lospmm.flows.inputs.weights import WeightsFileError, weights_file

    try:
        weights_file(path)
    except WeightsFileError as e:
        raise ConfigError(str(e)) from None


def _checked_sources(cfg: RunConfig) -> ModelConfig | None:
    """ConfigError naming a --weights file the run cannot search; else its config.json (or None)."""
    told = None
    if cfg.weights and Path(cfg.weights).is_file() and Path(cfg.weights).stat().st_size == 0:
        raise ConfigError(f"weights file {cfg.weights} is empty (0 bytes)")
    if cfg.weights:
        _one_weights_file(Path(cfg.weights))
    input_shapes = parsed_input_shapes(cfg.input_shapes)
    if input_shapes and not (cfg.weights and is_onnx(cfg.weights)):
        raise ConfigError(f"--input-shape {input_shapes[0][0]}: input shapes fix an ONNX model's inputs; "
                          f"give --weights MODEL.onnx")
    if cfg.weights and is_onnx(cfg.weights):
        from lospmm.flows.inputs.onnx_model import OnnxModelError, graph_weights

        try:
            found = graph_weights(cfg.weights, with_image_batch(cfg.weights, input_shapes, cfg.cnn_batch))
        except OnnxModelError as e:
            raise ConfigError(str(e)) from None
        if not any(w.op for w in found):
            sizes = next((w.reason for w in found if "--input-shape" in w.reason), "")  # a symbolic image size
            raise ConfigError(f"{cfg.weights}: no MatMul, Gemm or Conv weight (initializer or Constant) to search "
                              f"({len(found)} tensors)" + (f"; {sizes}" if sizes else ""))
    elif cfg.weights:
        from lospmm.flows.inputs.weights import WeightsFileError, saved_graph, tensor_infos

        try:
            infos = tensor_infos(cfg.weights)
            graph = saved_graph(cfg.weights)
        except WeightsFileError as e:
            raise ConfigError(str(e)) from None
        told = model_config(cfg.weights)
        if graph is not None:
            if not any(w.op for w in graph):
                raise ConfigError(f"{cfg.weights}: no nn.Linear or nn.Conv2d weight to search ({len(graph)} tensors)")
            return told
        reasons = [excluded_reason(t, told or ModelConfig()) for t in infos]
        if all(reasons):  # extract would find no layer: say so before any work
            counts = ", ".join(f"{n} {r}" for r, n in Counter(reasons).most_common())
            raise ConfigError(f"{cfg.weights}: no GEMM weight to search ({len(infos)} tensors: {counts or 'none'})")
        pooler = next((t.name for t, r in zip(infos, reasons) if r is None and is_pooler(t.name)), None)
        if pooler and cfg.batch > cfg.tokens:
            raise ConfigError(f"--batch {cfg.batch} > --tokens {cfg.tokens}: {pooler} gets one row per sequence "
                              f"(--batch sequences of --tokens in all); give --batch <= --tokens")
    return told
