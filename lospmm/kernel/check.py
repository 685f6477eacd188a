"""One way to check a kernel: run it (on a backend: lospmm.kernel.backend) on fresh seeded inputs,
its outputs poisoned with NaN first, and judge them against the reference in the metric of its
number format, against that format's tolerance.

- fp32 (GEMM and conv): the relative error max|C − ref| / max|ref| against the float64 product
  (through the epilogue; a reference convolution for a conv kernel), within FP32_TOLERANCE.
- fp16/bf16: bit for bit the kernel's exact model (`kernel_reference`: each operation rounded as the
  device rounds it; within one value after a GELU), then the normalised error |C − A·B| / Σ|a·b|
  against the rounding bound γ of its row length (`error_bound`). Tensor-core sums (`mma`) have no
  exact model (their order and rounding are the hardware's): the bound alone, with truncation's
  rounding per addition.
An output never written (still NaN) fails either way.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import scipy.sparse as sp

from lospmm.kernel.epilogue import Epilogue, activated
from lospmm.kernel.numbers import FP32_TOLERANCE, NumberFormat, from_dtype_bits, to_dtype_bits
from lospmm.kernel.spec import KernelSpec

OK, WRONG = "ok", "wrong"
CONV_CHECK_BATCH = 2  # images a conv kernel is checked on (two: the batch index is exercised)


@dataclass(frozen=True)
class CheckResult:
    """A kernel's check: `error` in its format's metric (`metric`), the `bound` it is held against,
    `status` ok or wrong, `message` why not, and `count` (N, or a conv kernel's batch)."""

    error: float
    bound: float
    metric: str
    count: int
    status: str = OK
    message: str = ""
    count_name: str = "n"
    reference: str = ""  # what the output was compared with, in words

    @property
    def ok(self) -> bool:
        return self.status == OK

    def facts(self) -> dict:
        """A kernel.json check record: the metric's figure by name, its bound, the status."""
        return {self.metric: self.error, "bound": self.bound, self.count_name: self.count, "status": self.status,
                "metric": self.metric, "reference": self.reference, **({"message": self.message} if self.message else {})}

    @classmethod
    def of_facts(cls, facts: dict) -> "CheckResult":
        """A check record as facts() wrote it; a check that could not run (status error: its
        message) reads as a failed one with an infinite error."""
        metric = facts.get("metric") or next((m for m in ("normalised_error", "max_rel_error") if m in facts), "")
        count_name = "batch" if "batch" in facts else "n"
        error = facts.get(metric)
        return cls(float("inf") if error is None else float(error), float(facts.get("bound", float("nan"))), metric,
                   int(facts.get(count_name) or 0), facts.get("status", "error"), facts.get("message", ""), count_name,
                   facts.get("reference", ""))


def metric_of(number: NumberFormat) -> str:
    return "normalised_error" if number.is_half else "max_rel_error"


def tolerance(number: NumberFormat, matrix: sp.csr_matrix) -> tuple[float, float]:
    """(bound, absolute allowance) a kernel of `number` on A is held against: FP32_TOLERANCE for fp32,
    the rounding bound (γ, η) of A's longest row for a half format (error_bound)."""
    return error_bound(matrix, number) if number.is_half else (FP32_TOLERANCE, 0.0)


def check_count(spec: KernelSpec, columns: int) -> int:
    """What a check of `spec`'s kernel runs over: `columns` of B for a GEMM kernel, CONV_CHECK_BATCH
    images for a conv kernel."""
    return CONV_CHECK_BATCH if spec.form == "conv" else columns


def check_counts(spec: KernelSpec, count: int, columns: tuple[int, ...] = (1, 31, 32, 4096)) -> list[int]:
    """Every count a thorough check runs a kernel at: a GEMM kernel at N of `columns` (one column, a
    partial and a whole warp, many) and its own `count`; a conv kernel at batches 1, 3 and its own."""
    return sorted({1, 3, count} if spec.form == "conv" else {*columns, count})


def check_input(spec: KernelSpec, count: int, seed: int = 0) -> np.ndarray:
    """The seeded input a check runs on: B (K×count) standard normal in float32, or rounded to a half
    dtype as its bits (random_b_bits), or a conv kernel's X (count images, NCHW) drawn alike."""
    values = np.random.default_rng(seed).standard_normal(spec.input_shape(count))
    return to_dtype_bits(values, spec.dtype) if spec.number.is_half else values.astype(np.float32)


def judged(spec: KernelSpec, matrix: sp.csr_matrix, x: np.ndarray, y: np.ndarray) -> CheckResult:
    """The check of output `y` of the kernel on input `x` (check_input's), A = `matrix` (a half kernel's
    rounded A), through the spec's epilogue."""
    count = x.shape[0] if spec.form == "conv" else x.shape[1]
    bound, absolute = tolerance(spec.number, matrix)

    def result(error: float, message: str = "") -> CheckResult:
        return CheckResult(error, bound, metric_of(spec.number), count, WRONG if message else OK, message,
                           "batch" if spec.form == "conv" else "n", reference_of(spec))

    values = from_dtype_bits(y, spec.dtype) if spec.number.is_half else np.asarray(y, np.float64)
    if np.isnan(values).any():
        rows = np.unique(np.nonzero(np.isnan(values))[1 if spec.form == "conv" else 0])
        return result(float("inf"), f"{int(np.isnan(values).sum())} output elements never written "
                                    f"(rows {rows[:10].tolist()}…)")
    if not spec.number.is_half and not np.isfinite(values).all() and matrix.nnz:
        return result(float("inf"), _overflow_line(values, matrix))
    if spec.number.is_half:
        if spec.form == "conv":  # the GEMM the kernel computes: A · im2col(X), its output M × (batch · pixels)
            x, y = im2col(x, spec.conv), nchw_as_gemm(y)
            values = nchw_as_gemm(values)
        problem = output_problem(y, matrix, x, spec.number, spec.epilogue) if spec.number.exact else ""
        if problem:
            return result(float("inf"), problem)
        error = normalised_error(values, matrix, from_dtype_bits(x, spec.dtype), absolute, spec.epilogue, spec.dtype)
    else:
        if spec.form == "conv":
            weight = matrix.toarray().reshape(spec.m, spec.conv.cin, spec.conv.kh, spec.conv.kw)
            pre = reference_conv2d(x, weight, spec.conv, Epilogue(spec.epilogue.bias))
        else:
            pre = Epilogue(spec.epilogue.bias).reference(sp.csr_matrix(matrix).astype(np.float64) @ x.astype(np.float64))
        ref = activated(pre, spec.epilogue.activation)
        # after an activation, errors are the sum's, at the scale of the values it activates: a GELU of
        # a sum far below zero is about 0, and fp32's erff of it 0 (relative to that output, all error)
        error = relative_error(values, ref, float(np.abs(pre).max(initial=0.0)) if spec.epilogue.activation else 0.0)
    if not error <= bound:
        return result(error, f"{metric_of(spec.number).replace('_', ' ')} {error:.3g} exceeds {bound:.3g}")
    return result(error)


def _overflow_line(values: np.ndarray, matrix: sp.csr_matrix) -> str:
    """Why an fp32 kernel's outputs are ±inf: its sums overflowed, and the weight that makes them."""
    a = sp.csr_matrix(matrix)
    where = int(np.argmax(np.abs(a.data)))
    row = int(np.searchsorted(a.indptr, where, side="right") - 1)
    largest = float(a.data[where])
    return (f"{int((~np.isfinite(values)).sum())} outputs are ±inf: fp32 sums overflow (A's largest weight "
            f"{largest:.3g} at row {row}, column {int(a.indices[where])}, times a standard-normal B; fp32 holds "
            f"|x| < 3.4e38): is the weight file damaged?")


def reference_of(spec: KernelSpec) -> str:
    """What a check of `spec`'s kernel compares its output with, in words (kernel.json's record)."""
    if spec.number.is_half and not spec.number.exact:
        return "the float64 product of the same rounded A and B, within the rounding bound of tensor-core sums"
    if spec.number.is_half:
        return ("the kernel's exact model, bit for bit (kernel.check.kernel_reference), then the float64 product "
                "of the same rounded A and B")
    return "numpy conv2d in float64" if spec.form == "conv" else "A·B in float64 (scipy)"


def checked(kernel, matrix: sp.csr_matrix, count: int, seed: int = 0) -> CheckResult:
    """Run `kernel` (a backend's kernel: `spec` and `run(x) -> y` on numpy arrays) on check_input and
    judge it. A failure to run raises (a backend's error, which may be transient); a wrong result is
    the result's status."""
    x = check_input(kernel.spec, count, seed)
    return judged(kernel.spec, matrix, x, kernel.run(x))


def checked_paths(kernel, matrix: sp.csr_matrix, count: int, seed: int = 0) -> CheckResult:
    """`checked` at every count of KernelSpec.path_counts(count), so that each path the kernel picks at
    launch runs (the N:M kernel's element-wise and 16-byte ones); the worst result (a failed one first)."""
    results = [checked(kernel, matrix, c, seed) for c in kernel.spec.path_counts(count)]
    return max(results, key=lambda r: (not r.ok, r.error))


def relative_error(got: np.ndarray, ref: np.ndarray, scale: float = 0.0) -> float:
    """max |got − ref| / max(max |ref|, `scale`) (the fp32 metric; `scale`: the magnitude an activation's
    input had, where its outputs may all be near zero); inf when an output is not finite."""
    if not np.isfinite(got).all():
        return float("inf")
    if got.size == 0:
        return 0.0
    return float(np.abs(got - ref).max() / max(float(np.abs(ref).max()), scale, 1e-30))


def im2col(x: np.ndarray, geometry) -> np.ndarray:
    """The im2col B of NCHW `x` (any dtype, half bits included): row (ci·kh + ky)·kw + kx, column
    image·pixels + pixel, the input there or zero in the padding; written from the definition as
    reference_conv2d is."""
    g = geometry
    cols = np.empty((g.cin, g.kh, g.kw, x.shape[0], g.h_out, g.w_out), x.dtype)
    for ky, kx, window in _windows(x, g):
        cols[:, ky, kx] = window.transpose(1, 0, 2, 3)
    return cols.reshape(g.k, -1)


def _windows(x: np.ndarray, g):
    """(ky, kx, the input every output pixel reads at that kernel offset: batch × cin × h_out × w_out) of
    NCHW `x` padded with zeros, one strided window per offset."""
    xp = np.pad(x, ((0, 0), (0, 0), (g.pad, g.pad), (g.pad, g.pad)))
    for ky in range(g.kh):
        for kx in range(g.kw):
            y0, x0 = ky * g.dilation, kx * g.dilation
            yield ky, kx, xp[:, :, y0:y0 + g.stride * (g.h_out - 1) + 1:g.stride,
                             x0:x0 + g.stride * (g.w_out - 1) + 1:g.stride]


def nchw_as_gemm(y: np.ndarray) -> np.ndarray:
    """NCHW output Y (batch × M × h × w) as the GEMM's C: M × (batch · pixels), columns image-major."""
    return np.ascontiguousarray(y.transpose(1, 0, 2, 3)).reshape(y.shape[1], -1)


def reference_conv2d(x: np.ndarray, weight: np.ndarray, geometry, epilogue: Epilogue | None = None) -> np.ndarray:
    """A plain numpy Conv2D (NCHW, groups = 1, float64): the reference the conv kernels are checked
    against, written from the definition (padding, then one strided window per kernel offset)."""
    g = geometry
    out = np.zeros((x.shape[0], weight.shape[0], g.h_out, g.w_out))
    for ky, kx, window in _windows(x.astype(np.float64), g):
        out += np.einsum("oc,bchw->bohw", weight[:, :, ky, kx].astype(np.float64), window)
    return out if epilogue is None else epilogue.reference(out, row_axis=1)


# --- half kernels: the exact model, the rounding bound and the normalised error ---------------------


def random_b_bits(k: int, n: int, dtype: str, seed: int) -> np.ndarray:
    """A fresh random B (K×n, standard normal, seeded) rounded to `dtype`, as uint16 bits: the data
    every half check draws, so that a library's error can be measured on the same B."""
    return to_dtype_bits(np.random.default_rng(seed).standard_normal((k, n)), dtype)


def sum_to_odd(p: np.ndarray, c: np.ndarray) -> np.ndarray:
    """p + c in float64 rounded to odd (TwoSum's error sets the last bit): rounded from there to a
    16-bit dtype (≤ 51 bits fewer), it rounds as the exact sum does — one rounding, as fma.rn."""
    s = p + c
    bb = s - p
    e = (p - (s - bb)) + (c - bb)
    even = (s.view(np.int64) & 1) == 0
    with np.errstate(invalid="ignore"):
        return np.where((e != 0) & even & np.isfinite(s), np.nextafter(s, np.copysign(np.inf, e)), s)


def _f32_fma(x: np.ndarray, y: np.ndarray, c: np.ndarray) -> np.ndarray:
    """fmaf(x, y, c) of float32 values, rounded once: the product is exact in float64, the sum
    rounded to odd there (29 bits to spare) and then to float32."""
    return sum_to_odd(np.float64(x) * np.float64(y), np.asarray(c, np.float64)).astype(np.float32)


def _epilogued(value: np.ndarray, row: int, epilogue: Epilogue) -> np.ndarray:
    """The kernel's epilogue on one row's float32 values, in float32 as the kernel computes it (the
    GELU's erff by a correctly rounded erf: within 2 ulps of CUDA's)."""
    x = np.asarray(value, np.float32)
    if epilogue.bias:
        x = x + np.float32(epilogue.bias[row])
    if epilogue.activation == "relu":  # fmaxf(x, 0): 0 for NaN too
        return np.where(x > 0, x, np.float32(0.0)).astype(np.float32)
    if epilogue.activation == "gelu":
        from scipy.special import erf

        e = erf((x * np.float32(0.70710678118654752)).astype(np.float64)).astype(np.float32)
        return (np.float32(0.5) * x) * (np.float32(1.0) + e)
    return x


def kernel_reference(matrix: sp.csr_matrix, b_bits: np.ndarray, number: NumberFormat,
                     epilogue: Epilogue = Epilogue()) -> np.ndarray:
    """What a correct half kernel of `number` stores, bit for bit (uint16, M×N), for the rounded A
    (`matrix`) and B's bits: each row's nonzeros in ascending column order — packed FMAs each rounded
    once to the dtype from the exact value (the product of two halves is exact in float64, the sum
    rounded to odd there: sum_to_odd), or fp32 FMAs on the converted pair, or packed sums moved into
    fp32 every `promote_every` — then the epilogue in fp32 and one rounding to the dtype. Rows with
    no nonzero store the epilogue of zero as the kernel's literal does."""
    return _reference(matrix, b_bits, number, epilogue)[0]


def _zero_bits(epilogue: Epilogue, row: int, dtype: str) -> int:
    """What a half kernel stores for a row with no nonzero (its literal pair's half)."""
    return 0 if epilogue.empty else int(to_dtype_bits(np.array([epilogue.zero_output(row)]), dtype)[0])


def _reference(matrix: sp.csr_matrix, b_bits: np.ndarray, number: NumberFormat,
               epilogue: Epilogue) -> tuple[np.ndarray, np.ndarray]:
    """(kernel_reference's bits, each output's fp32 value before the activation: its sum plus bias)."""
    a = sp.csr_matrix(matrix, dtype=np.float64)
    a.sort_indices()
    dtype, promote = number.dtype, number.promote_every
    b = from_dtype_bits(b_bits, dtype)
    out = np.zeros((a.shape[0], b.shape[1]), np.uint16)
    pre = np.zeros((a.shape[0], b.shape[1]), np.float32)
    for r in range(a.shape[0]):
        lo, hi = a.indptr[r], a.indptr[r + 1]
        if lo == hi:
            out[r] = _zero_bits(epilogue, r, dtype)
            pre[r] = np.float32(epilogue.bias[r]) if epilogue.bias else 0.0
            continue
        if number.accumulate == "f32":
            total = np.zeros(b.shape[1], np.float32)
            for p in range(lo, hi):
                total = _f32_fma(b[a.indices[p]].astype(np.float32), np.float32(a.data[p]), total)
        else:
            acc, total = np.zeros(b.shape[1]), np.zeros(b.shape[1], np.float32)
            for count, p in enumerate(range(lo, hi), 1):
                acc = from_dtype_bits(to_dtype_bits(sum_to_odd(a.data[p] * b[a.indices[p]], acc), dtype), dtype)
                if promote and count % promote == 0:
                    total, acc = total + acc.astype(np.float32), np.zeros(b.shape[1])
            if not promote:  # the packed sum is stored as it is, or unpacked exactly for the epilogue
                total = acc.astype(np.float32)
            elif (hi - lo) % promote:
                total = total + acc.astype(np.float32)
            if not promote and epilogue.empty:
                out[r], pre[r] = to_dtype_bits(acc, dtype), total
                continue
        pre[r] = _epilogued(total, r, Epilogue(epilogue.bias))
        out[r] = to_dtype_bits(_epilogued(total, r, epilogue).astype(np.float64), dtype)
    return out, pre


def bits_apart(x_bits: np.ndarray, y_bits: np.ndarray) -> np.ndarray:
    """How many representable values of a 16-bit dtype lie between two bit patterns (0: equal; ±0
    are 0 apart)."""
    def ordered(bits):
        v = np.asarray(bits, np.int32)
        return np.where(v & 0x8000, -(v & 0x7FFF), v)

    return np.abs(ordered(x_bits) - ordered(y_bits))


# CUDA's erff is within 2 fp32 ulps (|erff| < 1: 2·2^-24), and 1 + erff rounds once more: the GELU's
# 0.5·x·(1 + erff(x/√2)) may differ from the model's by |x|·2^-23. Where 1 + erff cancels (x below
# about -4) that is several values of the dtype, so a GELU's output is allowed it beside one value.
ERFF_ABSOLUTE = 2.0 ** -23


def output_problem(c_bits: np.ndarray, matrix: sp.csr_matrix, b_bits: np.ndarray, number: NumberFormat,
                   epilogue: Epilogue = Epilogue()) -> str:
    """"" when a half kernel's output equals kernel_reference's value for value (±0 alike, NaN as
    NaN; after a GELU, within one value of the dtype and erff's own error), else one line: how many
    outputs differ and the first of them."""
    want, pre = _reference(matrix, b_bits, number, epilogue)
    got_v, want_v = from_dtype_bits(c_bits, number.dtype), from_dtype_bits(want, number.dtype)
    same = (got_v == want_v) | (np.isnan(got_v) & np.isnan(want_v))
    if epilogue.activation == "gelu":
        # x, the pre-activation value (sum + bias) as the dtype holds it (within its rounding: doubled below)
        x = np.abs(from_dtype_bits(to_dtype_bits(pre.astype(np.float64), number.dtype), number.dtype))
        one_value = (np.spacing(np.abs(want_v).astype(np.float16)).astype(np.float64) if number.dtype == "fp16"
                     else np.abs(want_v) * 2.0 ** -7)  # bf16: 8 significant bits
        same |= bits_apart(c_bits, want) <= 1
        same |= np.abs(got_v - want_v) <= one_value + 2 * x * ERFF_ABSOLUTE
    wrong = ~same
    if not wrong.any():
        return ""
    r, c = (int(x[0]) for x in np.nonzero(wrong))
    got, exp = (from_dtype_bits(np.array([v]), number.dtype)[0] for v in (c_bits[r, c], want[r, c]))
    return (f"{int(wrong.sum())} of {wrong.size} outputs differ from the kernel's exact model, the first at row {r}, "
            f"column {c}: {got!r}, expected {exp!r}")


UNIT_ROUNDOFF = {"fp16": 2.0 ** -11, "bf16": 2.0 ** -8}
SUBNORMAL_SPACING = {"fp16": 2.0 ** -24, "bf16": 2.0 ** -133}


def error_bound(matrix: sp.csr_matrix, number: NumberFormat) -> tuple[float, float]:
    """(γ, η): a correct kernel's |C − A·B| ≤ γ·Σ|a·b| + η for every output, from k = the most
    nonzeros of a row + 1 roundings (|error| ≤ γ_k Σ|a·b|) and η = k half-spacings of the
    subnormals (a rounding's absolute error there). An fp32 sum rounds once in the dtype. γ is
    capped at 1 (beyond it the bound says nothing: the exact model, kernel_reference, is the check
    that catches a wrong kernel; this bound is the accuracy figure's)."""
    k = int(np.diff(sp.csr_matrix(matrix).indptr).max(initial=0)) + 1
    u = UNIT_ROUNDOFF[number.dtype]
    if number.accumulate == "f32":
        gamma = u + k * 2.0 ** -23
    elif number.accumulate == "mma":  # fp32 sums that may truncate at each addition (the tensor cores')
        gamma = u + k * 2.0 ** -22
    else:
        gamma = k * u / (1 - k * u) if k * u < 0.5 else 1.0
    return min(gamma, 1.0), k * SUBNORMAL_SPACING[number.dtype] / 2


# an epilogue's rounding beyond the sum's: its fp32 add and activation (erff within 2 ulps), relative
# to the pre-activation value, and the one rounding to the dtype at the pack, relative to the output
EPILOGUE_FP32_ROUNDING = 2.0 ** -22
GELU_LIPSCHITZ = 1.13  # max |gelu'(x)| ≈ 1.129: a sum's error grows by at most this through the GELU


def normalised_error(c: np.ndarray, matrix: sp.csr_matrix, b: np.ndarray, absolute: float = 0.0,
                     epilogue: Epilogue = Epilogue(), dtype: str = "fp16") -> float:
    """max over outputs of (|C − ref| − `absolute`)⁺ / Σ|a·b| (the sum of the output's products'
    magnitudes, |A|·|B|: the scale of the classic summation bound, at most ‖A's row‖·‖B's column‖),
    ref = A·B in float64 on the same rounded A and B (issue 23's accuracy measure, taken alike for
    ours and cuBLAS; `absolute`: the error a rounding among subnormals may add, error_bound's η).
    Through an `epilogue`, ref is its activation of A·B + bias; each output's allowance adds the
    epilogue's own roundings (fp32 for the bias and activation, one rounding to `dtype` at the
    store) and the sum's error is divided by the activation's Lipschitz bound, so the result is
    held against the same γ."""
    a = sp.csr_matrix(matrix, dtype=np.float64)
    ref = a @ b
    scale = np.asarray(abs(a) @ np.abs(b))
    if not epilogue.empty:
        pre = Epilogue(epilogue.bias).reference(ref)
        ref = epilogue.reference(ref)
        lipschitz = GELU_LIPSCHITZ if epilogue.activation == "gelu" else 1.0
        absolute = lipschitz * absolute + EPILOGUE_FP32_ROUNDING * np.abs(pre) + UNIT_ROUNDOFF[dtype] * np.abs(ref)
        scale = lipschitz * scale
    err = np.maximum(np.abs(np.asarray(c, np.float64) - ref) - absolute, 0.0)
    with np.errstate(invalid="ignore", divide="ignore"):
        ratio = np.where(scale > 0, err / np.where(scale > 0, scale, 1.0), np.where(err > 0, np.inf, 0.0))
    return float(ratio.max()) if ratio.size else 0.0
