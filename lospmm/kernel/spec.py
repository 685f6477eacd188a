"""`KernelSpec`: one frozen, validated description of a kernel — its form, its signature, how it is
launched, its design and number format, its epilogue and convolution geometry — and the only reader
and writer of kernel.json. Everything that depends on a kernel's kind asks it: which N it can
serve, its column multiple, its element width, its inputs and outputs, whether it reads N1 at launch.

Forms:
- `gemm`: C = A·B (A baked in or streamed, M×K), B K×N and C M×N row-major in the number format;
  parameters (B, C, N), N any multiple of the column multiple (a launcher pads B and C).
- `conv`: Y = conv(X) without im2col (§6.2), X and Y NCHW in the number format (float32, or the N:M
  kernel's fp16/bf16); parameters (X, Y, batch).
- `proxy`: a search proxy (§5.1) of one M1, for timing: parameters (B, C, N, cluster_of), its N1
  and grid given at launch.
"""

from __future__ import annotations

import hashlib
import json
import math
from dataclasses import dataclass, field
from typing import Any, Mapping

from lospmm.kernel.design import BASELINE, KernelDesign
from lospmm.kernel.epilogue import Epilogue
from lospmm.kernel.geometry import ConvGeometry
from lospmm.kernel.layout import LaunchLayout
from lospmm.kernel.nm import NMTiling, untiled_tiling
from lospmm.kernel.sparse_mma import MMATiling
from lospmm.kernel.numbers import NumberFormat, RoundingReport

FORMS = ("gemm", "conv", "proxy")
# kernel.json's version: 1 added the field (the facts are the unversioned files'); a reader refuses newer
KERNEL_JSON_VERSION = 1


class KernelSpecError(ValueError):
    """A kernel.json this lospmm cannot read (a newer version, missing or contradictory facts)."""


@dataclass(frozen=True)
class KernelSpec:
    """name: the kernel's symbol; form: one of FORMS; m, k: A's shape; m1: rows per tile;
    layout: how it is launched; num_tiles: its tiles (a proxy: its blocks along A); design: its walk
    and number format; epilogue: what it applies before a store (gemm and conv); conv: a conv
    kernel's geometry; nnz: A's nonzeros it bakes (0 for a proxy). Where it came from, as kernel.json
    records it: layer, sparsity, arch (the cubin's), row_order/tile_ptr/empty_rows (its tiles),
    rounding (a half kernel's A rounded to its dtype). `results`: what kernel.json records beside
    the description (compile, checks, times, how it was chosen), read back with it."""

    name: str
    form: str
    m: int
    k: int
    m1: int
    layout: LaunchLayout
    num_tiles: int
    design: KernelDesign = BASELINE
    epilogue: Epilogue = Epilogue()
    conv: ConvGeometry | None = None
    nnz: int = 0
    layer: str = ""
    sparsity: float | None = None
    arch: str = ""
    row_order: tuple[int, ...] = ()
    tile_ptr: tuple[int, ...] = ()
    empty_rows: tuple[int, ...] = ()
    rounding: RoundingReport | None = None
    results: Mapping[str, Any] = field(default_factory=dict, compare=False, hash=False)
    nm: "NMTiling | MMATiling | None" = None  # an N:M kernel's blocking: on CUDA cores, or sparse tensor cores

    def __post_init__(self):
        where = self.layer or self.name
        if self.form not in FORMS:
            raise KernelSpecError(f"{where}: kernel form {self.form!r}: one of {', '.join(FORMS)}")
        if (self.form == "conv") != (self.conv is not None):
            raise KernelSpecError(f"{where}: a conv kernel, and only one, has a convolution geometry")
        if self.form == "conv" and not self.design.serves_conv:
            raise KernelSpecError(f"{where}: design {self.design.label}: a conv kernel takes only the grid's order, walks "
                                  f"and baked or streamed fp32 values, a staged blocking or the N:M kernel's own "
                                  f"on CUDA cores")
        if self.form == "conv" and self.conv.k != self.k:
            raise KernelSpecError(f"{where}: K={self.k}, the conv geometry needs cin·kh·kw = {self.conv.k}")
        if (self.design.a_values == "nm") != (self.nm is not None):
            raise KernelSpecError(f"{where}: a kernel of design nm, and only one, has an N:M tiling")
        if self.nm is not None and self.form == "proxy":
            raise KernelSpecError(f"{where}: the N:M kernel has no proxy form")
        if self.form == "proxy" and not self.epilogue.empty:
            raise KernelSpecError(f"{where}: a proxy fuses no epilogue")
        if self.layout.groups != self.design.block_groups:
            raise KernelSpecError(f"{where}: its layout's {self.layout.groups} groups of threads a block are not its "
                                  f"design's {self.design.block_groups}")
        if self.layout.columns_per_thread != self.design.columns_per_thread:
            raise KernelSpecError(f"{where}: its layout's {self.layout.columns_per_thread} columns per thread are not "
                                  f"its design's {self.design.columns_per_thread}")

    def located(self, layer: str, sparsity: float | None, arch: str, tiles=None,
                rounding: RoundingReport | None = None) -> "KernelSpec":
        """This spec with where it came from: its layer and sparsity, the arch it is compiled for, its
        tiles' order (a reorder.Tiles) and a half kernel's rounding of A."""
        from dataclasses import replace

        order = {} if tiles is None else {"row_order": tuple(int(r) for r in tiles.rows),
                                          "tile_ptr": tuple(int(p) for p in tiles.tile_ptr),
                                          "empty_rows": tuple(int(r) for r in tiles.empty_rows)}
        return replace(self, layer=layer, sparsity=sparsity, arch=arch, rounding=rounding, **order)

    # --- what it is ---
    @property
    def number(self) -> NumberFormat:
        return self.design.number

    @property
    def dtype(self) -> str:
        """B's and C's dtype: fp32, fp16 or bf16."""
        return self.design.dtype

    @property
    def element_bytes(self) -> int:
        return self.number.element_bytes

    @property
    def streamed(self) -> bool:
        return self.design.a_values == "streamed"

    @property
    def module_symbols(self) -> dict[str, str]:
        """The module's globals a loader fills before the first launch (cuModuleGetGlobal), by role:
        an N:M kernel's compressed A ("values", "index", and "rows" where its stages gather B's
        rows) and its bias ("bias"); none for a kernel
        whose A is in its code or initialised data."""
        if self.nm is None:
            return {}
        symbols = {role: f"lospmm_nm{role[0]}_{self.name}" for role in self.nm.roles}
        return symbols | ({"bias": f"lospmm_nmb_{self.name}"} if self.epilogue.bias else {})

    def module_data(self, matrix) -> dict[str, Any]:
        """{symbol: numpy array} to copy into the module's globals before a launch, from the A the
        kernel computes with (its package's weight.parquet); {} for most kernels."""
        if self.nm is None:
            return {}
        import numpy as np

        arrays = self.nm.operands(matrix, self.number)  # its tiling lays A out, in the number format
        if self.epilogue.bias:
            arrays["bias"] = np.asarray(self.epilogue.bias, np.float32)
        return {self.module_symbols[role]: array for role, array in arrays.items()}

    @property
    def cooperative(self) -> bool:
        """Whether a block's threads share memory and meet at barriers (the host emulation then runs
        them as a cooperative block): the N:M, staged and sliced kernels."""
        return self.nm is not None or self.design.loads == "staged" or self.design.k_slices > 1

    @property
    def params(self) -> tuple[str, ...]:
        """The C parameters in order."""
        t = self.number.ctype
        if self.form == "conv":
            return f"const {t}* X", f"{t}* Y", "int batch"
        gemm = (f"const {t}* B", f"{t}* C", "int N")
        return gemm + ("const int* cluster_of",) if self.form == "proxy" else gemm

    @property
    def argument_names(self) -> tuple[str, str, str]:
        """(input, output, count): B, C, N of a GEMM kernel or proxy; X, Y, batch of a conv kernel."""
        return ("X", "Y", "batch") if self.form == "conv" else ("B", "C", "N")

    # --- what it can serve, and how it is launched ---
    @property
    def n1(self) -> int:
        """Threads per block (0 when given at launch)."""
        return self.layout.threads

    @property
    def n1_at_launch(self) -> bool:
        """Whether the block size is a launch argument (a proxy, or a kernel built to serve every N1)."""
        return self.layout.threads == 0

    @property
    def column_multiple(self) -> int:
        """N a launch serves directly is a multiple of this (B and C padded to it otherwise)."""
        return self.layout.columns_per_thread

    @property
    def alignment(self) -> int:
        """Bytes B and C must be aligned to (a vector access of the columns per thread; a conv kernel's
        pixels are each their own access)."""
        return self.element_bytes * (1 if self.form == "conv" else self.layout.columns_per_thread)

    def columns(self, count: int) -> int:
        """The GEMM columns of a launch over `count` (N, or a conv kernel's batch)."""
        return self.conv.n(count) if self.form == "conv" else count

    def input_count(self, shape: tuple[int, ...]) -> int:
        """The count (N, or a conv kernel's batch) of an input of `shape` (one it serves)."""
        return int(shape[0] if self.form == "conv" else shape[1])

    def count(self, columns: int) -> int:
        """The count (N, or a conv kernel's batch) of a launch over `columns` GEMM columns."""
        return columns // self.conv.pixels if self.form == "conv" else columns

    def path_counts(self, count: int) -> tuple[int, ...]:
        """The counts a check runs at so that every path of the kernel runs: `count`, and for a kernel
        that picks 16-byte accesses at launch where N is a multiple of 4 (fp32) or 8 (16-bit elements)
        (the N:M kernel) the next such N too (its element-wise path at an N that is not)."""
        whole = 8 if self.number.is_half else 4
        if self.nm is None or self.form == "conv" or count % whole == 0:  # a conv kernel's copies are element-wise
            return (count,)
        return count, count + (-count) % whole

    def launch_count(self, count: int) -> int:
        """The count a launch passes for `count` (N padded to the column multiple; a batch as it is)."""
        return count if self.form == "conv" else self.layout.launch_columns(count)

    def grid(self, count: int, threads: int | None = None) -> tuple[int, int, int]:
        fixed = self.design.fixed_n1
        if threads and fixed and threads != fixed:  # its code assumes its own N1 (a staged block's tiles' columns)
            raise ValueError(f"{self.layer or self.name}: design {self.design.label} runs at N1 = {fixed}, not {threads}")
        return self.layout.grid(self.columns(count), threads)

    def input_shape(self, count: int) -> tuple[int, ...]:
        """The input's shape for `count` (N or a batch): B K×N, or X batch×cin×h×w."""
        if self.form == "conv":
            return count, self.conv.cin, self.conv.h, self.conv.w
        return self.k, count

    def output_shape(self, count: int) -> tuple[int, ...]:
        if self.form == "conv":
            return count, self.m, self.conv.h_out, self.conv.w_out
        return self.m, count

    def serves(self, shape: tuple[int, ...]) -> str:
        """"" when an input of `shape` is one this kernel computes on, else why not (one line)."""
        if self.form == "conv":
            g = self.conv
            if len(shape) != 4 or tuple(shape[1:]) != (g.cin, g.h, g.w):
                return (f"X must be batch×{g.cin}×{g.h}×{g.w} (NCHW; the input size the kernel was searched and "
                        f"emitted for), got {tuple(shape)}")
            return ""
        if len(shape) != 2 or shape[0] != self.k:
            return f"B must be {self.k}×N, got {tuple(shape)}"
        return ""

    # --- kernel.json ---
    def _module_data_text(self) -> str:
        t = self.nm
        return (f"; before the first launch fill the module's globals {', '.join(self.module_symbols.values())} "
                f"(cuModuleGetGlobal) with A compressed {t.n}:{t.m} as {type(t).__module__} lays it out "
                f"(kernel.json's `nm`)")

    def layout_text(self) -> str:
        """kernel.json's `layout`: the arrays in words, for a reader in C++."""
        if self.form == "conv":
            g = self.conv
            element = f"{self.dtype} (16-bit)" if self.number.is_half else "float32"
            return (f"X is NCHW ({g.cin}×{g.h}×{g.w} per image) and Y is NCHW ({self.m}×{g.h_out}×{g.w_out} per "
                    f"image), {element}; the batch is a runtime argument; A's column c is (ci·kh + ky)·kw + kx"
                    + ("" if self.nm is None else self._module_data_text()))
        if self.nm is not None:
            element = f"{self.dtype} (16-bit)" if self.number.is_half else "float32"
            whole = 8 if self.number.is_half else 4
            return (f"B is K×N and C is M×N, row-major {element}; N is a runtime argument (16-byte accesses where N is "
                    f"a multiple of {whole} and B and C 16-byte aligned)" + self._module_data_text())
        if self.number.is_half:
            return (f"B is K×N and C is M×N, row-major {self.dtype} (16-bit); N is a runtime argument, even (pad B and "
                    f"C with a column), B and C 4-byte aligned")
        v = self.layout.columns_per_thread
        if self.layout.groups > 1:
            # a proxy's threads are a launch fact: a staged block's N1 is its design's
            n1 = self.design.fixed_n1 or self.layout.threads // self.layout.groups
            per_block = n1 * v
            groups = (f"{self.layout.groups} tiles" if self.design.loads == "staged"
                      else f"{self.layout.groups} slices of K")
            return ("B is K×N and C is M×N, row-major float32; N is a runtime argument"
                    + (f", a multiple of {v} (pad B and C with columns), B and C {4 * v}-byte aligned" if v > 1 else "")
                    + f"; a block's {groups} ({n1} threads each) share {per_block} columns: launch "
                    f"ceil(N / {per_block}) column blocks (kernel.json's `grid`)")
        return ("B is K×N and C is M×N, row-major float32; N is a runtime argument"
                + (f", a multiple of {v} (pad B and C with columns), B and C {4 * v}-byte aligned" if v > 1 else ""))

    def facts(self) -> dict:
        """The description as kernel.json holds it (its `results` left out)."""
        facts = {"version": KERNEL_JSON_VERSION, "kernel": self.name, "layer": self.layer, "sparsity": self.sparsity,
                 "m": self.m, "k": self.k, "nnz": self.nnz, "m1": self.m1, "n1": self.n1, "params": list(self.params),
                 "layout": self.layout_text(), "launch": self.layout.facts(), "design": self.design.facts(),
                 "grid": self.layout.grid_formula(f"batch * {self.conv.pixels}" if self.conv else "N"),
                 "block": {"x": self.n1, "y": 1, "z": 1}, "dynamic_smem_bytes": 0, "arch": self.arch,
                 "row_order": list(self.row_order), "tile_ptr": list(self.tile_ptr), "empty_rows": list(self.empty_rows)}
        if self.conv is not None:
            facts["conv"] = self.conv.facts()
        if self.nm is not None:
            facts["nm"] = self.nm.facts() | {"module_data": self.module_symbols}
        if self.conv is not None or not self.epilogue.empty:  # a GEMM kernel records it only when it fuses one
            facts["epilogue"] = self.epilogue.facts()
        if self.number.is_half:
            facts["precision"] = self.number.facts()
            if self.rounding is not None:
                facts["rounding"] = self.rounding.facts()
        return facts

    def to_json(self, results: Mapping[str, Any] | None = None) -> str:
        """kernel.json: the description and `results` (default: its own), strict JSON (C++ parsers
        reject NaN: a missing figure is null)."""
        record = {**self.facts(), **(self.results if results is None else results)}
        return json.dumps(_json_safe(record), indent=1, allow_nan=False)

    @classmethod
    def from_json(cls, text: str, where: str = "kernel.json") -> "KernelSpec":
        """The spec a kernel.json describes, with its results; KernelSpecError in one line for a
        version this lospmm does not read or facts it cannot. A file written before the version
        field (version 0) reads with its era's defaults: the baseline design, no epilogue."""
        try:
            facts = json.loads(text)
        except ValueError as e:
            raise KernelSpecError(f"{where}: not JSON ({e})") from None
        if not isinstance(facts, dict):
            raise KernelSpecError(f"{where}: not a JSON object")
        return cls.of_facts(facts, where)

    @classmethod
    def of_facts(cls, facts: Mapping[str, Any], where: str = "kernel.json") -> "KernelSpec":
        version = facts.get("version", 0)
        if not isinstance(version, int) or not 0 <= version <= KERNEL_JSON_VERSION:
            raise KernelSpecError(f"{where}: kernel.json version {version!r}; this lospmm reads versions up to "
                                  f"{KERNEL_JSON_VERSION} (upgrade lospmm, or emit the kernel again)")
        try:
            design = KernelDesign.of_facts(facts.get("design") or {})
            conv = ConvGeometry.of_facts(facts["conv"]) if facts.get("conv") else None
            params = tuple(facts.get("params") or ())
            form = "conv" if conv is not None else ("proxy" if "const int* cluster_of" in params else "gemm")
            rounding = facts.get("rounding")
            nm = untiled_tiling(facts["nm"]) if "nm" in facts else None
            layout = LaunchLayout.of_facts(facts)
            # an N:M kernel's blocks along A are its row blocks (it has no tiles)
            num_tiles = layout.row_blocks if nm is not None else len(facts.get("tile_ptr") or [0]) - 1
            spec = cls(facts["kernel"], form, int(facts["m"]), int(facts["k"]), int(facts["m1"]), layout, num_tiles, design,
                       Epilogue.of_facts(facts.get("epilogue"), facts.get("layer", where)), conv,
                       int(facts.get("nnz", 0)), facts.get("layer", ""), facts.get("sparsity"), facts.get("arch", ""),
                       tuple(facts.get("row_order") or ()), tuple(facts.get("tile_ptr") or ()),
                       tuple(facts.get("empty_rows") or ()), RoundingReport(**rounding) if rounding else None,
                       {k: v for k, v in facts.items() if k not in DESCRIPTION_KEYS}, nm)
        except KernelSpecError:
            raise
        except (KeyError, TypeError, ValueError) as e:
            raise KernelSpecError(f"{where}: cannot read its kernel ({type(e).__name__}: {e})") from None
        if params and spec.params != params:
            raise KernelSpecError(f"{where}: parameters {list(params)} are not a {spec.form} kernel's "
                                  f"{list(spec.params)} in {spec.dtype}")
        return spec


# kernel.json's keys that are the description (facts()); the others are results
DESCRIPTION_KEYS = frozenset({"version", "kernel", "layer", "sparsity", "m", "k", "nnz", "m1", "n1", "params", "layout",
                              "launch", "design", "grid", "block", "dynamic_smem_bytes", "arch", "row_order", "tile_ptr",
                              "empty_rows", "conv", "epilogue", "precision", "rounding", "nm"})


def _json_safe(value):
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, dict):
        return {k: _json_safe(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_json_safe(v) for v in value]
    return value


@dataclass(frozen=True)
class KernelSource:
    """A rendered kernel: its spec and its source in units (compiled separately and linked; the
    entry unit is last). The host check compiles `source`, the units' concatenation: the same text."""

    spec: KernelSpec
    units: tuple[str, ...]

    @property
    def source(self) -> str:
        """The whole kernel as one text: its units in order."""
        return "".join(self.units)

    @property
    def sha256(self) -> str:
        return hashlib.sha256(self.source.encode()).hexdigest()

    # the spec's facts a compiler, a launcher and a check ask most
    @property
    def name(self) -> str:
        return self.spec.name

    @property
    def kind(self) -> str:
        """"full" (a GEMM kernel), "conv" or "proxy"."""
        return "full" if self.spec.form == "gemm" else self.spec.form

    @property
    def m(self) -> int:
        return self.spec.m

    @property
    def k(self) -> int:
        return self.spec.k

    @property
    def m1(self) -> int:
        return self.spec.m1

    @property
    def layout(self) -> LaunchLayout:
        return self.spec.layout

    @property
    def design(self) -> KernelDesign:
        return self.spec.design

    @property
    def num_tiles(self) -> int:
        return self.spec.num_tiles

    @property
    def params(self) -> tuple[str, ...]:
        return self.spec.params

    @property
    def n1(self) -> int:
        return self.spec.n1

    @property
    def grid_x(self) -> int:
        """Blocks along A: tiles, plus zeroing blocks for a full kernel."""
        return self.layout.row_blocks

    def grid(self, n: int, n1: int | None = None) -> tuple[int, int, int]:
        """Launch grid for N output columns (a proxy takes the N1 under test)."""
        return self.layout.grid(n, n1)
