"""The host emulation's build cache stays bounded."""

from __future__ import annotations

import os

from lospmm.kernel.host import pruned_cache


def test_the_build_cache_drops_its_least_recently_used_binaries_first(tmp_path):
    for i, name in enumerate(("old", "middle", "new")):
        f = tmp_path / f"{name}.bin"
        f.write_bytes(b"x" * 100)
        os.utime(f, (1_000_000 + i, 1_000_000 + i))
    (tmp_path / "keep.txt").write_bytes(b"y" * 1000)  # not a build: never counted or removed
    assert pruned_cache(tmp_path, max_bytes=250) == 100
    assert sorted(p.name for p in tmp_path.iterdir()) == ["keep.txt", "middle.bin", "new.bin"]
    assert pruned_cache(tmp_path, max_bytes=250) == 0  # under the limit: nothing more goes
