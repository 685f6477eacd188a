"""A kernel's number format: B's and C's element type and how a sum accumulates. One value each
kernel asks — its element width, its C type in the source, its check's metric and tolerance — and
the half formats' rounding (numpy; the host emulation's shim does the same in C).

fp32: float B and C, fp32 sums; checked by the relative error max|C − ref| / max|ref| against
FP32_TOLERANCE. fp16 / bf16: B and C as 16-bit patterns, two columns per thread as one packed pair;
the sum is `packed` (in the dtype: one `fma.rn.f16x2` per nonzero), `f32` (B's pair converted to
floats, two FFMAs per nonzero), packed with `promote_every=k` (moved into fp32 every k nonzeros
of a row) or `mma` (fp32 in the sparse tensor cores); checked bit for bit against the kernel's exact
model (all but `mma`) and by a normalised error against the rounding bound of the row length
(lospmm.kernel.check).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import scipy.sparse as sp

DTYPES = ("fp32", "fp16", "bf16")
HALF_DTYPES = ("fp16", "bf16")
ACCUMULATIONS = ("packed", "f32", "mma")

# The fp32 kernels' check: the largest relative error max|C − ref| / max|ref| a correct kernel shows
# against the float64 product (the emitted kernels measured ~1e-7; a wrong one is O(1)).
FP32_TOLERANCE = 1e-4


@dataclass(frozen=True)
class NumberFormat:
    """Defaults: dtype="fp32" (accumulate "" and promote_every 0: fp32 sums). A half format:
    dtype "fp16" or "bf16", accumulate "packed" (the pair sums in the dtype), "f32" or "mma" (fp32 sums
    in the tensor cores: their order and rounding the hardware's, so no exact model: the N:M kernel on
    sparse tensor cores),
    promote_every=0 (packed sums never moved into fp32; k > 0: every k nonzeros of a row)."""

    dtype: str = "fp32"
    accumulate: str = ""
    promote_every: int = 0

    def __post_init__(self):
        if self.dtype not in DTYPES:
            raise ValueError(f"dtype {self.dtype!r}: choose one of {', '.join(DTYPES)}")
        if self.dtype == "fp32":
            if self.accumulate or self.promote_every:
                raise ValueError("an fp32 design sums in fp32: accumulate and promote_every are a half design's")
            return
        if self.accumulate not in ("", *ACCUMULATIONS):
            raise ValueError(f"design accumulate {self.accumulate!r}: choose packed, f32 or mma")
        if not self.accumulate:
            object.__setattr__(self, "accumulate", "packed")
        if self.promote_every < 0 or (self.promote_every and self.accumulate != "packed"):
            raise ValueError("design promote_every is a count >= 1 of a packed accumulation's nonzeros (0: never)")

    @classmethod
    def of(cls, dtype: str, accumulate: str = "", promote_every: int = 0) -> "NumberFormat":
        """The format of kernels in `dtype`, a half one summing as `accumulate` and `promote_every`
        say (a run's sums are its half sources'; an fp32 format sums in fp32 whatever they say)."""
        return cls(dtype) if dtype == "fp32" else cls(dtype, accumulate or "packed", promote_every)

    @classmethod
    def half(cls, dtype: str = "fp16", accumulate: str = "packed", promote_every: int = 0) -> "NumberFormat":
        """A half format; ValueError for fp32 (what a half kernel, a half check, needs)."""
        if dtype not in HALF_DTYPES:
            raise ValueError(f"dtype {dtype!r}: a half kernel is one of {', '.join(HALF_DTYPES)}")
        return cls(dtype, accumulate, promote_every)

    @property
    def is_half(self) -> bool:
        return self.dtype in HALF_DTYPES

    @property
    def element_bytes(self) -> int:
        """Bytes of one element of B and C."""
        return 2 if self.is_half else 4

    @property
    def ctype(self) -> str:
        """B's and C's element type in a kernel's source."""
        return "lospmm_h16" if self.is_half else "float"

    @property
    def array_dtype(self) -> np.dtype:
        """B's and C's elements as numpy holds them: float32, or a half format's 16-bit patterns."""
        return np.dtype(np.uint16 if self.is_half else np.float32)

    @property
    def min_sm(self) -> int:
        """The oldest compute capability (×10) its instructions run on: a half kernel's packed FMAs and
        conversions (fma.rn.bf16x2, cvt.rn.f16x2.f32) need sm_80."""
        return 80 if self.is_half else 70

    def sample(self, shape: tuple[int, ...], seed: int = 0) -> np.ndarray:
        """Seeded standard-normal values of `shape` in the format's array type (a half format's as
        fp16 bit patterns, which a bf16 kernel reads as values of its own): what a timed launch runs on."""
        values = np.random.default_rng(seed).standard_normal(shape)
        return values.astype(np.float16).view(np.uint16) if self.is_half else values.astype(np.float32)

    @property
    def packed(self) -> bool:
        return self.accumulate == "packed"

    @property
    def exact(self) -> bool:
        """Whether a kernel's every rounding is known (kernel.check.kernel_reference models it bit for
        bit); not for tensor-core sums, whose order and rounding are the hardware's."""
        return self.accumulate != "mma"

    @property
    def label(self) -> str:
        if not self.is_half:
            return "fp32"
        return f"{self.dtype}-{self.accumulate}" + (f"-promote{self.promote_every}" if self.promote_every else "")

    def facts(self) -> dict:
        return {"dtype": self.dtype, "accumulate": self.accumulate, "promote_every": self.promote_every}


# --- rounding to a half dtype ----------------------------------------------------------------------


def to_dtype_bits(values: np.ndarray, dtype: str) -> np.ndarray:
    """float64/float32 values rounded to nearest even in fp16 or bf16, as uint16 bit patterns."""
    x = np.asarray(values, np.float64)
    if dtype == "fp16":
        with np.errstate(over="ignore"):  # an overflow is ±inf, which rounded_matrix counts and refuses
            return x.astype(np.float16).view(np.uint16)  # numpy rounds double to half correctly (RNE)
    return _bf16_bits(x)


def from_dtype_bits(bits: np.ndarray, dtype: str) -> np.ndarray:
    """uint16 bit patterns of fp16 or bf16 as float64 (exact)."""
    b = np.asarray(bits, np.uint16)
    if dtype == "fp16":
        return b.view(np.float16).astype(np.float64)
    return (b.astype(np.uint32) << 16).view(np.float32).astype(np.float64)


def _bf16_bits(x: np.ndarray) -> np.ndarray:
    """Round-to-nearest-even of float64 to bfloat16 in one rounding (not through float32, which
    would round twice): the value's significand scaled to 8 bits and rounded by numpy's rint."""
    out = np.zeros(x.shape, np.uint16)
    sign = np.signbit(x).astype(np.uint16) << 15
    a = np.abs(x)
    nan, inf = np.isnan(a), ~np.isfinite(a) & ~np.isnan(a)
    finite = np.isfinite(a) & (a > 0)
    m, e = np.frexp(np.where(finite, a, 1.0))  # a = m·2^e, m in [0.5, 1)
    normal = finite & (e - 1 >= -126)
    q = np.rint(np.ldexp(m, 8))  # the 8-bit significand, 128..256 (256: rounded up to the next binade)
    exp = (e - 1) + (q == 256)
    q = np.where(q == 256, 128, q)
    big = normal & (exp > 127)
    enc = ((exp + 127).astype(np.int64) << 7) | (q.astype(np.int64) - 128)
    out = np.where(normal & ~big, enc, out)
    sub = finite & ~normal  # multiples of 2^-133; a round up to 128 is the smallest normal's encoding
    out = np.where(sub, np.rint(np.ldexp(np.where(sub, a, 0.0), 133)).astype(np.int64), out)
    out = np.where(big | inf, 0x7F80, out)
    out = np.where(nan, 0x7FC0, out)
    return (out.astype(np.uint16) | sign).astype(np.uint16)


@dataclass(frozen=True)
class RoundingReport:
    """What rounding A to the dtype did: nonzeros that became zero (not baked; the reference sees
    them as zero too), ones that became subnormal, and ones that overflowed to ±inf."""

    nnz: int
    to_zero: int
    subnormal: int
    overflow: int

    def facts(self) -> dict:
        return vars(self).copy()


def rounded_matrix(matrix: sp.csr_matrix, dtype: str) -> tuple[sp.csr_matrix, RoundingReport]:
    """A with every value rounded to `dtype` (float64 values that are exactly representable), its
    zeros after rounding removed, and the count of each kind of loss."""
    a = sp.csr_matrix(matrix, dtype=np.float64, copy=True)
    a.sort_indices()
    bits = to_dtype_bits(a.data, dtype)
    values = from_dtype_bits(bits, dtype)
    tiny = 2.0 ** (-14 if dtype == "fp16" else -126)
    report = RoundingReport(int(a.nnz), int(np.count_nonzero(values == 0)),
                            int(np.count_nonzero((values != 0) & (np.abs(values) < tiny))),
                            int(np.count_nonzero(~np.isfinite(values))))
    if report.overflow:
        raise ValueError(f"{report.overflow} of A's values overflow {dtype} (|w| > its largest finite value)")
    a.data = values
    a.eliminate_zeros()
    return a, report


def in_format(matrix: sp.csr_matrix, number: NumberFormat) -> tuple[sp.csr_matrix, RoundingReport | None]:
    """A as a kernel of `number` bakes it: as it is for fp32, rounded to a half dtype (rounded_matrix)."""
    if not number.is_half:
        return matrix, None
    return rounded_matrix(matrix, number.dtype)
