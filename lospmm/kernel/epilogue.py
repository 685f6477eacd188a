"""What a kernel applies to each output before storing it: a bias per output row (channel), baked in
as literals, then an activation (§6.2 fuses Conv2D + ReLU; a linear layer's GELU fuses alike)."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

ACTIVATIONS = ("", "relu", "gelu")  # gelu: the exact (erf) form, torch's default


@dataclass(frozen=True)
class Epilogue:
    """bias: one float per output row (empty: none); activation: one of ACTIVATIONS. The empty
    epilogue leaves a kernel's text as it was without one."""

    bias: tuple[float, ...] = ()
    activation: str = ""

    def __post_init__(self):
        if self.activation not in ACTIVATIONS:
            raise ValueError(f"activation {self.activation!r}: choose one of {', '.join(map(repr, ACTIVATIONS))}")

    @property
    def relu(self) -> bool:
        return self.activation == "relu"

    @property
    def empty(self) -> bool:
        return not self.bias and not self.activation

    @property
    def label(self) -> str:
        """What is fused besides the product: "", "bias", "bias+relu", "relu", …"""
        return "+".join(p for p in ("bias" if self.bias else "", self.activation) if p)

    def name_parts(self) -> tuple:
        """The epilogue's part of a kernel's name (the conv kernels' parts before activations existed
        for no activation and ReLU, so their names stay)."""
        act = self.relu if self.activation in ("", "relu") else self.activation
        return np.asarray(self.bias, np.float32).tobytes(), act

    def facts(self) -> dict:
        """kernel.json's `epilogue`: what is fused, with the bias's values (float32, exact in JSON), so
        that a device check can apply it and a model whose bias differs is refused."""
        return {"bias": bool(self.bias), "relu": self.relu, "activation": self.activation,
                **({"bias_values": [float(np.float32(x)) for x in self.bias]} if self.bias else {})}

    @classmethod
    def of_facts(cls, e: dict | None, where: str = "") -> "Epilogue":
        """The epilogue kernel.json's `epilogue` records (none for a directory written before epilogues)."""
        e = e or {}
        if e.get("bias") and "bias_values" not in e:
            raise ValueError(f"{where}: kernel.json says a bias is fused but not its values "
                             f"(written before bias values were recorded); emit the kernel again")
        return cls(tuple(e.get("bias_values", ())), e.get("activation") or ("relu" if e.get("relu") else ""))

    def zero_output(self, row: int) -> float:
        """The output of a row with no nonzero before any rounding to the kernel's format: the
        activated bias (its float32 value), or 0."""
        x = np.float64(np.float32(self.bias[row]) if self.bias else 0.0)
        return float(activated(np.array([x]), self.activation)[0])

    def reference(self, product: np.ndarray, row_axis: int = 0) -> np.ndarray:
        """The epilogue applied to A·B in float64 (rows of A along `row_axis`): what a kernel is
        checked against."""
        out = np.asarray(product, np.float64)
        if self.bias:
            shape = [1] * out.ndim
            shape[row_axis] = len(self.bias)
            out = out + np.asarray(self.bias, np.float64).reshape(shape)
        return activated(out, self.activation)


def activated(values: np.ndarray, activation: str) -> np.ndarray:
    """An activation of ACTIVATIONS in float64 (the reference)."""
    if activation == "relu":
        return np.maximum(values, 0.0)
    if activation == "gelu":
        from scipy.special import erf

        return 0.5 * values * (1.0 + erf(values / np.sqrt(2.0)))
    return values
