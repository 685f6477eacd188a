"""The built-in device table: names resolve case- and punctuation-insensitively; facts are sane."""

from __future__ import annotations

import re

import pytest

from lospmm.devices import DEVICES, device_named


@pytest.mark.parametrize("name, key", [("H100", "h100"), ("rtx-2080ti", "2080ti"), ("RTX 2080Ti", "2080ti"),
                                       (" a100 ", "a100"), ("V100", "v100"), ("h200", "h200")])
def test_names_resolve(name, key):
    assert device_named(name) is DEVICES[key]


def test_an_unknown_gpu_lists_the_known_ones():
    with pytest.raises(ValueError, match="built-in: 2080ti, a100, h100, h200, v100"):
        device_named("rtx9090")


@pytest.mark.parametrize("key", sorted(DEVICES))
def test_facts_are_consistent(key):
    d = DEVICES[key]
    assert re.fullmatch(r"sm_\d+", d.arch) and d.name == key
    assert d.max_smem_per_block + d.reserved_smem_per_block <= d.smem_per_sm
    assert d.max_threads_per_block <= d.max_threads_per_sm and d.max_threads_per_sm % d.warp_size == 0
    assert d.max_regs_per_block <= d.regs_per_sm and d.reg_alloc_unit % d.warp_size == 0
    assert d.clock_ghz > 0 and d.dram_gbps > 0 and d.l2_gbps >= d.dram_gbps and d.fp32_lanes_per_sm >= 32


def test_the_arch_families_the_design_names_are_there():
    assert {d.arch for d in DEVICES.values()} >= {"sm_70", "sm_75", "sm_80", "sm_90"}
