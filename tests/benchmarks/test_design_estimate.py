"""benchmarks.design_estimate: the pricing experiments of issue 35's item 4, on their own."""

import math

import numpy as np
import pytest

from benchmarks import design_estimate as de


def test_the_p_norm_lies_between_the_largest_term_and_the_sum_and_infinity_is_the_shipped_model():
    terms = np.array([3.0, 4.0, 1.0, 0.5, 4.0])  # compute, memory, latency, fetch, the shipped body
    assert de.priced(terms, 2.0, math.inf) == 6.0
    two = de.priced(terms, 2.0, 2.0)
    assert two == pytest.approx(2.0 + math.sqrt(9 + 16 + 1 + 0.25))
    assert 6.0 < two < 2.0 + 8.5
    longest = np.array([1.0, 1.0, 1.0, 1.0, 10.0])  # a block's critical path binds: the norm cannot undercut it
    assert de.priced(longest, 0.0, 4.0) == 10.0


def test_a_held_out_layer_is_priced_with_factors_fitted_on_the_others_only():
    # design b is measured 2x its estimate everywhere; a and b are priced alike. Without factors the
    # tie goes to the first; with them, b's factor (from the other layers) makes a the choice
    def layer(a_us, b_us):
        flat = np.array([1.0, 1.0, 1.0, 1.0, 1.0])
        return {"a": (a_us, flat * 1.0), "b": (b_us, flat * 1.0)}

    layers = {("m", "x"): layer(1.0, 2.0), ("m", "y"): layer(1.0, 2.0), ("m", "z"): layer(1.0, 2.0)}
    out = de.held_out_choices(layers, 0.0, math.inf, per_design=True)
    assert out["within 5% of the best"] == 1.0 and out["best single design"] == "a"
    layers[("m", "z")] = layer(3.0, 2.0)  # on z, b is faster, but the others say b costs twice its estimate
    out = de.held_out_choices(layers, 0.0, math.inf, per_design=True)
    assert out["within 5% of the best"] == pytest.approx(2 / 3)
