"""What a run searches (`Source`) and which ranker it uses (`RankerRef`): the parameters of the
extract, prune and rank nodes. Kept apart from the config so those adapters import nothing else."""

from __future__ import annotations

from dataclasses import asdict, dataclass

from lospmm.stages.extract import ModelConfig, ZooParams


@dataclass(frozen=True)
class Source:
    """One model to search: a zoo entry, or a weights file identified by its content."""

    kind: str  # "zoo" | "weights"
    name: str
    label: str  # the model's name in artifacts and file names
    zoo: ZooParams | None = None  # zoo: the sizes this model uses (the rest at their defaults)
    path: str | None = None  # weights: where the file lies (not part of any key)
    sha256: str = ""  # weights: what the file holds
    tokens: int = 0  # weights: N of every layer
    model_config: ModelConfig | None = None  # weights: from a config.json beside the file, if any
    images: int = 0  # an ONNX model's batch where its graph leaves it symbolic (conv layers' N)
    input_shapes: tuple[tuple[str, tuple[int, ...]], ...] = ()  # ONNX: inputs whose dims the run fixes
    sequences: int = 0  # a checkpoint with a pooler: the pooler's N, one row per sequence (0: no pooler)
    dtype: str = "fp32"  # the emitted kernels' B and C: fp32, or fp16 / bf16 (codegen_half)
    # weights: tensors stored input × output (Hugging Face's Conv1D: GPT-2), whose A is their transpose
    transposed: tuple[str, ...] = ()

    def key_form(self) -> dict:
        # (no transposed tensor: the key a source had before the field, so its artifacts are reused)
        return {k: v for k, v in asdict(self).items() if k != "path" and not (k == "transposed" and not v)}


@dataclass(frozen=True)
class RankerRef:
    """The ranker model a run uses: its files (None = shipped) and its version (the key's part)."""

    path: str | None
    version: str

    def key_form(self) -> dict:
        return {"version": self.version}
