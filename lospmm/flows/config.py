"""What a run is asked to do, validated before any work starts."""

from __future__ import annotations

from dataclasses import asdict, dataclass, fields
from pathlib import Path
from typing import Any

from lospmm.flows.store import STAGES
from lospmm.stages.devices import device_named
from lospmm.stages.extract import ZOO_NAMES, ZooParams, sanitized_name
from lospmm.stages.prune import METHODS, checked_sparsity

# M1 (rows of a thread's output tile): 1 to 256. The register constraint removes the tallest
# (M1 = 256 needs > 255 registers); Table 3 of the paper trains on 2..128.
DEFAULT_M1 = (1, 2, 4, 8, 12, 16, 24, 32, 48, 64, 96, 128, 192, 256)
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
    candidate), ranker=None (the shipped model), jobs=0 (compile/emit threads; 0 = every core), and the ZooParams defaults (batch 32 × seq 128
    for BERT, batch 4 at 224×224 for CNNs)."""

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

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> "RunConfig":
        known = {f.name for f in fields(cls)}
        unknown = set(d) - known
        if unknown:
            raise ConfigError(f"unknown run option(s): {', '.join(sorted(unknown))}")
        tuples = {"zoo", "sparsities", "m1s"}
        return cls(**{k: (tuple(v) if k in tuples and v is not None else v) for k, v in d.items()})

    def as_dict(self) -> dict[str, Any]:
        return {k: (list(v) if isinstance(v, tuple) else v) for k, v in asdict(self).items()}

    @property
    def zoo_params(self) -> ZooParams:
        return ZooParams(self.batch, self.seq_len, self.cnn_batch, self.image_size)

    def stages(self) -> tuple[str, ...]:
        return STAGES[: STAGES.index(self.until) + 1]


def validated(cfg: RunConfig) -> RunConfig:
    """`cfg` if every option is usable, else ConfigError naming the problem. Reads nothing big."""
    if not cfg.zoo and not cfg.weights:
        raise ConfigError("nothing to run: give --zoo NAME or --weights FILE")
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
    try:
        device_named(cfg.gpu)
    except ValueError as e:
        raise ConfigError(f"--gpu: {e}") from None
    if cfg.prune is not None and cfg.prune not in METHODS:
        raise ConfigError(f"--prune {cfg.prune!r}: choose one of {', '.join(METHODS)}")
    for name in ("tokens", "batch", "seq_len", "cnn_batch", "image_size"):
        if getattr(cfg, name) < 1:
            raise ConfigError(f"--{name.replace('_', '-')} must be >= 1, got {getattr(cfg, name)}")
    if not cfg.m1s or min(cfg.m1s) < 1:
        raise ConfigError(f"--m1 values must be >= 1, got {list(cfg.m1s)}")
    for name in ("th_row", "th_col"):
        if not getattr(cfg, name) >= 0:
            raise ConfigError(f"--{name.replace('_', '-')} must be >= 0, got {getattr(cfg, name)}")
    if cfg.timer not in TIMERS:
        raise ConfigError(f"--timer {cfg.timer!r}: choose one of {', '.join(TIMERS)}")
    if cfg.jobs < 0:
        raise ConfigError(f"--jobs must be >= 0 (0 = every core), got {cfg.jobs}")
    if cfg.top_k < 1:
        raise ConfigError(f"--top-k must be >= 1, got {cfg.top_k}")
    if cfg.ranker and not (Path(cfg.ranker).with_suffix(".txt").is_file()
                           and Path(cfg.ranker).with_suffix(".json").is_file()):
        raise ConfigError(f"--ranker {cfg.ranker}: needs {Path(cfg.ranker).with_suffix('.txt')} and .json "
                          f"(written by `lospmm train-ranker`)")
    if cfg.weights:
        from lospmm.flows.weights import tensor_infos  # raises ConfigError naming the file

        tensor_infos(cfg.weights)
    return cfg


def weights_label(path: str) -> str:
    return sanitized_name(Path(path).stem)

