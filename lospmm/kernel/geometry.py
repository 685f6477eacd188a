"""A convolution as its implicit-im2col kernel reads it (§6.2)."""

from __future__ import annotations

from dataclasses import dataclass


def conv_output_size(size: int, window: int, stride: int, pad: int, dilation: int = 1) -> int:
    """Output rows (or columns) of a convolution along one axis of `size` input pixels."""
    return (size + 2 * pad - dilation * (window - 1) - 1) // stride + 1


@dataclass(frozen=True)
class ConvGeometry:
    """A Conv2D (groups = 1) as its implicit-im2col kernel reads it (§6.2): an NCHW input of
    cin×h×w per image and a kh×kw window with stride, padding and dilation, all fixed at emit time;
    the batch is a run-time argument. A's column c is (ci·kh + ky)·kw + kx, PyTorch's
    [Cout, Cin, kh, kw] weight flattened (the im2col GEMM's K = cin·kh·kw, N = batch·h_out·w_out)."""

    cin: int
    h: int
    w: int
    kh: int
    kw: int
    stride: int = 1
    pad: int = 0
    dilation: int = 1

    def __post_init__(self):
        for name in ("cin", "h", "w", "kh", "kw", "stride", "dilation"):
            if getattr(self, name) < 1:
                raise ValueError(f"conv {name} must be >= 1, got {getattr(self, name)}")
        if self.pad < 0:
            raise ValueError(f"conv pad must be >= 0, got {self.pad}")
        if self.kh > 32 or self.kw > 32:  # a window row or column is one bit of a 32-bit mask
            raise ValueError(f"conv window {self.kh}×{self.kw}: at most 32×32")
        if 4 * self.cin * self.h * self.w > 2**31 - 1:  # a load's byte offset within an image is 32-bit
            raise ValueError(f"conv input {self.cin}×{self.h}×{self.w}: an image of 2^29 floats or more; the kernels "
                             f"address an image with 32-bit byte offsets")
        if self.h_out < 1 or self.w_out < 1:
            raise ValueError(f"conv window {self.kh}×{self.kw} (dilation {self.dilation}) is larger than the "
                             f"padded input {self.h + 2 * self.pad}×{self.w + 2 * self.pad}")

    @property
    def h_out(self) -> int:
        return conv_output_size(self.h, self.kh, self.stride, self.pad, self.dilation)

    @property
    def w_out(self) -> int:
        return conv_output_size(self.w, self.kw, self.stride, self.pad, self.dilation)

    @property
    def windows_inside(self) -> bool:
        """Whether every output pixel's window lies inside the image: without padding the last window ends
        at (h_out - 1)·stride + (kh - 1)·dilation ≤ h - 1 (and alike along w), so a kernel's loads of it
        need no bounds test."""
        return self.pad == 0

    @property
    def k(self) -> int:
        return self.cin * self.kh * self.kw

    @property
    def pixels(self) -> int:
        """Output pixels per image: the im2col GEMM's columns per image."""
        return self.h_out * self.w_out

    def n(self, batch: int) -> int:
        """The im2col GEMM's N for `batch` images."""
        return batch * self.pixels

    def window_offset(self, column: int) -> tuple[int, int, int]:
        """Where A's `column` reads the input: (its element offset from the window's top-left input
        pixel in image ci's plane, its window row ky, its window column kx)."""
        ci, rest = divmod(int(column), self.kh * self.kw)
        ky, kx = divmod(rest, self.kw)
        return ci * self.h * self.w + ky * self.dilation * self.w + kx * self.dilation, ky, kx

    def facts(self) -> dict:
        """kernel.json's `conv`."""
        return {**vars(self), "h_out": self.h_out, "w_out": self.w_out}

    @classmethod
    def of_facts(cls, facts: dict) -> "ConvGeometry":
        return cls(**{k: facts[k] for k in ("cin", "h", "w", "kh", "kw", "stride", "pad", "dilation") if k in facts})
