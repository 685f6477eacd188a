"""Half-precision kernels (issue 23): the exact CUDA text run on the host, with a shim that rounds as
the device does, against a reference computed from the same rounded A and B."""

import numpy as np
import pytest
import scipy.sparse as sp
from hypothesis import HealthCheck, given, settings, strategies as st

from dataclasses import replace

from lospmm.kernel.check import (UNIT_ROUNDOFF, bits_apart, check_input, error_bound, judged, kernel_reference,
                                 normalised_error, output_problem)
from lospmm.kernel.design import half_design
from lospmm.kernel.epilogue import Epilogue
from lospmm.kernel.host import HostKernel
from lospmm.kernel.numbers import NumberFormat, from_dtype_bits, rounded_matrix, to_dtype_bits
from lospmm.kernel.render import CodegenParams, kernel_source
from lospmm.stages.prune import random_pruned
from lospmm.stages.reorder import reordered_tiles

Precision = NumberFormat.half  # a half number format: (dtype, accumulate, promote_every)


def half_kernel_source(a, tiles, n1, number=None, params=CodegenParams(), epilogue=Epilogue()):
    """The half kernel of `number` (default fp16 packed) in the loads of `params.design`."""
    return kernel_source(a, tiles, n1, replace(params, design=half_design(number or Precision(), params.design)),
                         epilogue)


def host_checked(kernel, a, n, seed=0, sanitize=False):
    """(the check of the kernel on the host, B's bits, C's bits)."""
    b_bits = check_input(kernel.spec, n, seed)
    c_bits = HostKernel(kernel, sanitize).run(b_bits)
    return judged(kernel.spec, a, b_bits, c_bits), b_bits, c_bits


def packed_reference(a, b_bits, dtype):
    return kernel_reference(a, b_bits, Precision(dtype))



@st.composite
def layers(draw):
    m, k = draw(st.integers(1, 20)), draw(st.integers(1, 20))
    rng = np.random.default_rng(draw(st.integers(0, 2**31)))
    a = sp.random(m, k, density=draw(st.floats(0.0, 0.7)), format="csr", random_state=rng, dtype=np.float64)
    a.data[:] = rng.standard_normal(a.nnz) * draw(st.sampled_from([1e-3, 1.0, 50.0]))
    a.eliminate_zeros()
    return a


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(a=layers(), m1=st.integers(1, 6), n1=st.sampled_from([1, 3, 32]), n=st.integers(1, 50),
       dtype=st.sampled_from(["fp16", "bf16"]), accumulate=st.sampled_from(["packed", "f32"]),
       promote=st.sampled_from([0, 2]), prefetch=st.integers(0, 2), loads=st.sampled_from(["based", "chained"]))
def test_a_half_kernel_computes_the_rounded_product_within_its_error_bound(a, m1, n1, n, dtype, accumulate, promote,
                                                                           prefetch, loads):
    from lospmm.kernel.design import design_named

    precision = Precision(dtype, accumulate, promote if accumulate == "packed" else 0)
    rounded, _ = rounded_matrix(a, dtype)
    kernel = half_kernel_source(rounded, reordered_tiles(rounded, m1), n1, precision,
                                CodegenParams(prefetch=prefetch, design=design_named(loads)))
    gamma, eta = error_bound(rounded, precision)
    result, b_bits, c_bits = host_checked(kernel, rounded, n, seed=n)
    assert result.ok and result.bound == gamma and result.metric == "normalised_error", result.message
    # computed here, not by the checker: |C − A·B| ≤ γ·‖A's row‖‖B's column‖ + η, every output
    b = from_dtype_bits(b_bits, dtype)
    scale = np.sqrt(np.asarray(rounded.multiply(rounded).sum(axis=1))) * np.linalg.norm(b, axis=0)[None, :]
    assert (np.abs(from_dtype_bits(c_bits, dtype) - rounded @ b) <= gamma * scale + eta).all()
    assert gamma <= (np.diff(rounded.indptr).max(initial=0) + 1) * 2 * UNIT_ROUNDOFF[dtype]  # a bound that can fail
    if accumulate == "packed" and not precision.promote_every:  # and bit for bit what the device computes
        assert np.array_equal(c_bits, packed_reference(rounded, b_bits, dtype))


def test_rounding_to_bf16_is_round_to_nearest_even_as_torch_does_it():
    torch = pytest.importorskip("torch")
    rng = np.random.default_rng(0)
    x = np.concatenate([rng.standard_normal(5000) * 10.0 ** rng.integers(-40, 38, 5000),
                        [0.0, -0.0, 1e-45, 3e38, 1.0 + 2.0 ** -8, 1.0 + 3 * 2.0 ** -8, -(1.0 + 2.0 ** -8)]])
    x = x.astype(np.float32)  # exact float32 inputs: torch rounds float32 -> bfloat16 once
    theirs = torch.from_numpy(x).to(torch.bfloat16).view(torch.int16).numpy().view(np.uint16)
    assert np.array_equal(to_dtype_bits(x, "bf16"), theirs)
    assert np.array_equal(from_dtype_bits(theirs, "bf16"), torch.from_numpy(theirs.view(np.int16)).view(
        torch.bfloat16).double().numpy())
    # one rounding from float64, not two through float32: 1 + 2^-8 + 2^-30 is above the tie, so it rounds up
    assert from_dtype_bits(to_dtype_bits(np.array([1 + 2.0 ** -8 + 2.0 ** -30]), "bf16"), "bf16")[0] == 1 + 2.0 ** -7


def test_values_lost_to_rounding_are_counted_and_left_out_of_kernel_and_reference_alike():
    a = sp.csr_matrix(np.array([[1.0, 1e-9, 0.0], [0.0, 3e-6, -2.0], [7e4, 0.0, 0.5]]))
    with pytest.raises(ValueError, match="1 of A's values overflow fp16"):
        rounded_matrix(a, "fp16")
    a[2, 0] = 7.0
    rounded, report = rounded_matrix(a, "fp16")
    assert (report.nnz, report.to_zero, report.subnormal, report.overflow) == (6, 1, 1, 0)
    assert rounded.nnz == 5 and rounded[0, 1] == 0 and rounded[1, 1] == from_dtype_bits(to_dtype_bits(
        np.array([3e-6]), "fp16"), "fp16")[0]
    kernel = half_kernel_source(rounded, reordered_tiles(rounded, 2), 32)
    result, b, c = host_checked(kernel, rounded, 33, sanitize=True)  # ASan, an odd N padded
    assert result.ok and np.array_equal(c, packed_reference(rounded, b, "fp16"))
    with pytest.raises(ValueError, match="not fp16: round it with rounded_matrix first"):
        half_kernel_source(a, reordered_tiles(a, 2), 32)


def test_an_unwritten_output_or_a_wrong_result_fails_the_check():
    a, _ = rounded_matrix(random_pruned(9, 12, 0.5, np.random.default_rng(1)), "fp16")
    kernel = half_kernel_source(a, reordered_tiles(a, 2), 8)
    broken = replace(kernel, units=tuple(u.replace("lospmm_sth2(Cn, 0,", "(void)(Cn, 0,") for u in kernel.units))
    result = host_checked(broken, a, 10)[0]
    assert not result.ok and "never written" in result.message
    result = host_checked(kernel, a * 2, 10)[0]  # judged against the reference of another A
    assert not result.ok and "differ from the kernel's exact model" in result.message

    b_bits = to_dtype_bits(np.random.default_rng(0).standard_normal((12, 10)), "fp16")
    c_bits = HostKernel(kernel).run(b_bits)
    c = from_dtype_bits(c_bits, "fp16")
    b = from_dtype_bits(b_bits, "fp16")
    assert normalised_error(c, a, b) <= error_bound(a, Precision())[0]
    assert normalised_error(c * 1.01 + 0.01, a, b) > error_bound(a, Precision())[0]  # the accuracy figure can fail
    assert normalised_error(np.zeros((1, 1)), sp.csr_matrix(np.zeros((1, 1))), np.zeros((1, 1))) == 0.0


def test_a_half_kernel_compiles_for_the_h100_with_one_packed_fma_per_nonzero():
    from lospmm.stages.compile import compiled_kernel, kernel_options

    a, _ = rounded_matrix(random_pruned(64, 96, 0.8, np.random.default_rng(2)), "fp16")
    for precision in (Precision("fp16"), Precision("bf16", "f32"), Precision("fp16", "packed", 4)):
        rounded, _ = rounded_matrix(a, precision.dtype)
        kernel = half_kernel_source(rounded, reordered_tiles(rounded, 4), 64, precision)
        result = compiled_kernel(kernel, kernel_options("sm_90", 4, design=kernel.design))  # its own register cap
        assert result.status == "ok", result.log[-500:]
        assert result.thread_spill_bytes == 0
    from lospmm.kernel.sass import NvdisasmMissing, opcodes_by_function

    cubin = compiled_kernel(half_kernel_source(a, reordered_tiles(a, 4), 64), kernel_options("sm_90", 4)).cubin
    try:
        ops = [o for function in opcodes_by_function(cubin).values() for o in function]
    except NvdisasmMissing:  # nvdisasm is the bench extra's
        pytest.skip("no nvdisasm (pip install 'lospmm[bench]')")
    # the literal pair is the instruction's immediate: one packed instruction per nonzero (×1.0 is an HADD2)
    assert sum(ops.count(op) for op in ("HFMA2", "HADD2", "HMUL2")) == a.nnz


def test_a_packed_fma_rounds_once_from_the_exact_sum_even_where_float64_cannot_hold_it():
    """bf16's exponent range lets an accumulator sit far below the product: 1.0625² + 2^-60 is just
    above the midpoint between two bf16 values, and float64 alone would round it to the tie (then
    to even, down). fma.rn rounds the exact value, up; so must the shim and the reference."""
    from fractions import Fraction

    a = sp.csr_matrix(np.array([[2.0 ** -30, 1.0625]]))
    b = np.array([[2.0 ** -30], [1.0625]])
    exact = Fraction(2) ** -60 + Fraction(17, 16) ** 2
    below, above = Fraction(1.125), Fraction(1.1328125)
    assert below < exact < above and exact - below > above - exact  # the nearest bf16 is above
    b_bits = to_dtype_bits(b, "bf16")
    assert from_dtype_bits(packed_reference(a, b_bits, "bf16"), "bf16")[0, 0] == 1.1328125
    kernel = half_kernel_source(a, reordered_tiles(a, 1), 1, Precision("bf16"))
    assert from_dtype_bits(HostKernel(kernel).run(b_bits), "bf16")[0, 0] == 1.1328125


@settings(max_examples=20, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(a=layers(), m1=st.integers(1, 4), n=st.integers(1, 40), dtype=st.sampled_from(["fp16", "bf16"]),
       accumulate=st.sampled_from(["packed", "f32"]), bias=st.booleans(), activation=st.sampled_from(["", "relu", "gelu"]),
       seed=st.integers(0, 2**16))
def test_a_half_kernel_fuses_its_bias_and_activation_within_the_bound(a, m1, n, dtype, accumulate, bias, activation,
                                                                      seed):
    """Bias and activation applied in fp32 to the pair, rounded once at the store: within the sum's
    bound plus the epilogue's own roundings, against act(A·B + bias) in float64; rows with no
    nonzero store the activated bias."""
    rng = np.random.default_rng(seed)
    epilogue = Epilogue(tuple(float(x) for x in rng.standard_normal(a.shape[0]) * 2) if bias else (), activation)
    precision = Precision(dtype, accumulate)
    rounded, _ = rounded_matrix(a, dtype)
    kernel = half_kernel_source(rounded, reordered_tiles(rounded, m1), 32, precision, epilogue=epilogue)
    # fails beyond the bound; a row with no nonzero has no sum's allowance (its scale is 0): only the
    # activated bias rounded once passes there
    result = host_checked(kernel, rounded, n, seed=n)[0]
    assert result.ok and result.bound == error_bound(rounded, precision)[0], result.message


@pytest.mark.parametrize("dtype,accumulate,missing", [("fp16", "packed", "bias"), ("bf16", "packed", "gelu"),
                                                      ("bf16", "f32", "bias")])
def test_a_half_kernel_missing_its_epilogue_fails_the_check_at_a_real_layers_size(dtype, accumulate, missing):
    """At 64×768, 90% sparse, the rounding bound alone (γ·Σ|a·b|, γ ≈ 0.05 fp16 and 0.3 bf16 packed)
    would let a small bias or a missing GELU through: the check compares with the kernel's exact model
    first, so it does not."""
    a, _ = rounded_matrix(random_pruned(64, 768, 0.9, np.random.default_rng(5)), dtype)
    bias = tuple((np.random.default_rng(6).standard_normal(64) * 0.1).tolist())
    epilogue = Epilogue(bias, "gelu")
    precision = Precision(dtype, accumulate)
    kernel = half_kernel_source(a, reordered_tiles(a, 4), 32, precision,
                                epilogue=Epilogue(() if missing == "bias" else bias, "" if missing == "gelu" else "gelu"))
    x = check_input(kernel.spec, 8)  # its output judged as the kernel the layer needs (with the whole epilogue)
    result = judged(replace(kernel.spec, epilogue=epilogue), a, x, HostKernel(kernel).run(x))
    assert not result.ok and "differ from the kernel's exact model" in result.message
    fused = half_kernel_source(a, reordered_tiles(a, 4), 32, precision, epilogue=epilogue)
    assert "bias=True activation=gelu" in fused.source and fused.name != kernel.name
    result, b_bits, c_bits = host_checked(fused, a, 8)
    assert result.ok, result.message
    assert output_problem(c_bits, a, b_bits, precision, epilogue) == ""
    # the exact model is the packed reference where there is nothing else to model
    if accumulate == "packed":
        assert np.array_equal(kernel_reference(a, b_bits, precision), packed_reference(a, b_bits, dtype))


def test_a_gelus_output_is_allowed_cudas_erff_error_where_one_plus_erff_cancels_and_nothing_more():
    """CUDA's erff may be 2 fp32 ulps from the model's correctly rounded erf: below x ≈ -4 that moves
    the stored GELU by several values of the dtype (40 in bf16 at -5), which the check allows; a
    value off by half is still caught."""
    from scipy.special import erf

    a, e = sp.csr_matrix(np.array([[1.0]])), Epilogue(activation="gelu")
    for dtype in ("fp16", "bf16"):
        for x in (-5.0, -4.5, -1.0, 0.7, 3.0):
            b_bits = to_dtype_bits(np.array([[x]]), dtype)
            want = kernel_reference(a, b_bits, Precision(dtype), e)
            v = np.float32(from_dtype_bits(b_bits, dtype)[0, 0])
            erff = np.float32(erf(np.float64(v * np.float32(0.70710678118654752))))
            for _ in range(2):  # erff two ulps below
                erff = np.nextafter(erff, np.float32(-2))
            device = to_dtype_bits(np.array([[np.float64((np.float32(0.5) * v) * (np.float32(1) + erff))]]), dtype)
            assert output_problem(device, a, b_bits, Precision(dtype), e) == "", (dtype, x, bits_apart(device, want))
            off = to_dtype_bits(from_dtype_bits(want, dtype) * 1.5 + 0.01, dtype)
            assert output_problem(off, a, b_bits, Precision(dtype), e)
