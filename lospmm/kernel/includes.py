"""The C++ a kernel's source and its host build include, as files under lospmm/kernel/include/: the
device helpers every unit starts with (preamble.cuh, vector.cuh, half.cuh, half_conv.cuh, …) and the host
emulation's shim and driver (host_shim.h, host_harness.cpp). A file's `//!` lines document it and
are left out of what is included, so that a kernel's text stays what it was."""

from __future__ import annotations

from functools import lru_cache
from pathlib import Path

FOLDER = Path(__file__).with_name("include")
# read as code: their text is part of the version of every module that renders or builds with them
__code_files__ = tuple(sorted(str(p) for p in FOLDER.iterdir() if p.suffix in (".cuh", ".h", ".cpp")))


@lru_cache(maxsize=None)
def included(name: str) -> str:
    """The text of include/<name> as it goes into a source: every line but its `//!` lines."""
    text = (FOLDER / name).read_text(encoding="utf-8")
    return "".join(line for line in text.splitlines(keepends=True) if not line.startswith("//!"))
