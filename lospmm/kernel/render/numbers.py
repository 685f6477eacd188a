"""The number format as a strategy the renderers use: what a thread's accumulators are, how it
loads B's value(s) of a column, what one nonzero's multiply-add is, how an output is stored through
the epilogue, and how the format names and heads its kernels. `number_code(design)` picks it.

fp32 (`Fp32Code`): V = 1, 2 or 4 columns per thread as float/float2/float4, `acc += b * <literal>`
per nonzero and column (the same FFMA as fmaf, without NVRTC's superlinear front end).
fp16/bf16 (`HalfCode`): the thread's two columns as one packed pair, one `fma.rn.f16x2` per nonzero
with the literal pair as its immediate, or (acc=f32) B's pair unpacked once per load and two fp32
FMAs per nonzero, or packed sums promoted into fp32 every k nonzeros; the epilogue in fp32 and one
rounding at the store.
"""

from __future__ import annotations

import numpy as np
import scipy.sparse as sp

from lospmm.kernel.design import BASELINE, KernelDesign
from lospmm.kernel.epilogue import Epilogue
from lospmm.kernel.includes import included
from lospmm.kernel.numbers import from_dtype_bits, to_dtype_bits
from lospmm.kernel.render.common import design_parts, float_literal

VECTOR_TYPE = {1: "float", 2: "float2", 4: "float4"}
LANES = {1: ("",), 2: (".x", ".y"), 4: (".x", ".y", ".z", ".w")}
SUFFIX = {1: "", 2: "2", 4: "4"}


def zero_value(v: int) -> str:
    return "0.0f" if v == 1 else f"{VECTOR_TYPE[v]}{{{', '.join(['0.0f'] * v)}}}"


def epilogue_scalar(epilogue: Epilogue, value: str) -> str:
    """The activation of one fp32 value in C."""
    if epilogue.activation == "relu":
        return f"lospmm_relu({value})"
    if epilogue.activation == "gelu":  # fused as one expression: the value is a register, read three times
        return f"(0.5f * ({value}) * (1.0f + erff(({value}) * 0.70710678118654752f)))"
    return value


def epilogue_applied(epilogue: Epilogue, acc: str, row: int, v: int = 1, bias_value: str = "") -> str:
    """The stored value(s) of fp32 accumulator `acc` (`v` columns) of output row `row`: its bias the
    row's literal, or `bias_value` (an expression: a streamed kernel reads its rows' biases from data)."""
    bias = f" + {bias_value or float_literal(np.array([epilogue.bias[row]]))[0]}" if epilogue.bias else ""
    if v == 1:
        return epilogue_scalar(epilogue, f"{acc}{bias}")
    return f"make_{VECTOR_TYPE[v]}(" + ", ".join(epilogue_scalar(epilogue, f"{acc}{lane}{bias}")
                                                   for lane in LANES[v]) + ")"


class Fp32Code:
    """fp32 kernels of `design`: V columns per thread, based or chained B addresses (chained from the
    thread's `chain_from` pointer; "" where the loads are a conv kernel's window loads, each one
    instruction from its pixel's pointer already)."""

    ctype = "float"
    kernel_prefix, proxy_prefix = "lospmm_full", "lospmm_proxy"
    kernel_kind, proxy_kind = "full kernel", "proxy"

    def __init__(self, design: KernelDesign, chain_from: str = "Bn"):
        self.design, self.v, self.chain_from = design, design.columns_per_thread, chain_from
        self.vector, self.lanes, self.store_fn = VECTOR_TYPE[self.v], LANES[self.v], f"lospmm_st{SUFFIX[self.v]}"

    # --- naming and the kernel's frame ---
    def matrix(self, matrix: sp.csr_matrix) -> sp.csr_matrix:
        return sp.csr_matrix(matrix)

    def value_bytes(self, a: sp.csr_matrix) -> bytes:
        return a.data.tobytes()

    def name_parts(self) -> tuple:
        return design_parts(self.design)

    def header_note(self) -> str:
        return f" design={self.design.code_label}" if self.design != BASELINE else ""

    def preamble(self) -> str:
        d = self.design
        baseline = d.code_key == BASELINE.code_key or d == KernelDesign(order=d.order)
        return (included("preamble.cuh") + ("" if baseline else included("vector.cuh"))
                + (included("split.cuh") if d.section_fmas else ""))

    # --- a tile's body ---
    def tile_values(self, data: np.ndarray) -> list[str]:
        return float_literal(data)

    def proxy_value(self, x: float) -> str:
        return f"{x:.7f}f"

    def tile_state(self, num_rows: int):
        return None

    def declarations(self, num_rows: int) -> list[str]:
        chains = self.design.loads == "chained" and self.chain_from
        sums = f"  {self.vector} " + ", ".join(f"acc{i} = {zero_value(self.v)}" for i in range(num_rows)) + ";\n"
        return ([f"  const float* p = {self.chain_from};\n"] if chains else []) + [sums]

    def load(self, j: int, column: int, previous: int) -> str:
        if self.design.loads == "chained":
            return f"  {self.vector} b{j}; LOSPMM_LDC{SUFFIX[self.v]}(b{j}, p, N, {4 * (column - previous)});\n"
        return f"  const {self.vector} b{j} = lospmm_ld{SUFFIX[self.v]}(Bn, {4 * column}, N);\n"

    def multiply_adds(self, j: int, nonzeros, state) -> list[str]:
        return [f"acc{i}{lane} += b{j}{lane} * {literal};" for i, literal in nonzeros for lane in self.lanes]

    def finish(self, num_rows: int, state) -> list:
        return list(range(num_rows))

    def store(self, finish, row: int, epilogue: Epilogue | None, target: str = "", guard: str = "", out: str = "Cn",
              stride: str = "N") -> str:
        """Row `row`'s output (accumulator `finish`) stored to C's row `target` (default `row`)
        through `epilogue`, or as it is (None: a proxy's), under `guard`; C is the thread's `out`, its
        rows `stride` apart (a convolution's Y: its pixels)."""
        value = f"acc{finish}" if epilogue is None else epilogue_applied(epilogue, f"acc{finish}", row, self.v)
        where = f"if ({guard}) " if guard else ""
        return f"  {where}{self.store_fn}({out}, {target or row}, {stride}, {value});\n"

    def zero_store(self, row: int, epilogue: Epilogue) -> str:
        value = zero_value(self.v) if epilogue.empty else epilogue_zero_literal(epilogue, row, self.v)
        return f"  {self.store_fn}(Cn, {row}, N, {value});\n"

    def resumed(self, finish, target, guard: str = "") -> str:
        """A K split's section after the first: accumulator `finish` resumed from the partial sum its
        thread stored at C's row `target` (under `guard`)."""
        where = f"if ({guard}) " if guard else ""
        return f"  {where}acc{finish} = lospmm_ldp{SUFFIX[self.v]}(Cn, {target}, N);\n"

    # --- an implicit-im2col conv kernel of V lanes (render.conv: V output pixels a thread, n1 apart, lane
    # L's pixel window at xp_L, rows_ok_L and cols_ok_L, its output at Yb_L where live_L) ---
    def window_load(self, j: int, offset: int, word: int, bit: int, inside: bool = False) -> str:
        """The statement that defines b{j}: each lane's input at element `offset` from its window's corner,
        0 where the entry (bit `bit` of word `word` of the lane's window mask, render.conv.window_bit) lies
        outside that lane's image (`inside`: every window is inside the image, and the loads have no test)."""
        if inside:
            return (f"  {self.vector} b{j};" + "".join(f" b{j}{lane} = __ldg(xp_{index} + {offset});"
                                                     for index, lane in enumerate(self.lanes)) + "\n")
        return (f"  {self.vector} b{j};" + "".join(
            f" LOSPMM_LDXM(b{j}{lane}, xp_{index}, {4 * offset}, ok{word}_{index}, {bit});"
            for index, lane in enumerate(self.lanes)) + "\n")

    def pixel_stores(self, finish, row: int, epilogue: Epilogue, stride: int) -> str:
        """Row `row`'s output of each live lane (accumulator `finish`) through `epilogue`, to its pixel's
        NCHW Y (rows `stride` apart)."""
        return "".join(f"  if (live_{index}) lospmm_st(Yb_{index}, {row}, {stride}, "
                       f"{epilogue_applied(epilogue, f'acc{finish}{lane}', row)});\n"
                       for index, lane in enumerate(self.lanes))

    def pixel_zero_store(self, out: str, row: int, epilogue: Epilogue, stride: int) -> str:
        """The statement that stores a row with no nonzero to one pixel's output `out` (rows `stride` apart)."""
        return f"lospmm_st({out}, {row}, {stride}, {epilogue_zero_literal(epilogue, row)});"


def epilogue_zero_literal(epilogue: Epilogue, row: int, v: int = 1) -> str:
    """The fp32 output of a row with no nonzero, as a literal (`v` columns)."""
    value = float_literal(np.array([epilogue.zero_output(row)]))[0]
    return value if v == 1 else f"{VECTOR_TYPE[v]}{{{', '.join([value] * v)}}}"


class HalfCode:
    """Half kernels of a half `design` (fp16/bf16): one packed pair per thread."""

    ctype = "lospmm_h16"
    kernel_prefix, proxy_prefix = "lospmm_half", "lospmm_half_proxy"
    kernel_kind, proxy_kind = "half kernel", "half proxy"
    store_fn = "lospmm_sth2"

    def __init__(self, design: KernelDesign):
        self.design, self.number, self.dtype = design, design.number, design.dtype
        self.v = design.columns_per_thread  # the pair: two columns, or a conv kernel's two output pixels

    def matrix(self, matrix: sp.csr_matrix) -> sp.csr_matrix:
        a = sp.csr_matrix(matrix, dtype=np.float64)
        if not np.array_equal(from_dtype_bits(to_dtype_bits(a.data, self.dtype), self.dtype), a.data):
            raise ValueError(f"A holds values that are not {self.dtype}: round it with rounded_matrix first")
        return a

    def value_bytes(self, a: sp.csr_matrix) -> bytes:
        return to_dtype_bits(a.data, self.dtype).tobytes()

    def name_parts(self) -> tuple:
        return self.number.label, self.design.loads

    def header_note(self) -> str:
        return f" {self.number.label} loads={self.design.loads}"

    def preamble(self) -> str:
        return included("preamble.cuh") + included("half.cuh")

    def tile_values(self, data: np.ndarray) -> list[int]:
        return [int(b) for b in to_dtype_bits(data, self.dtype)]

    def proxy_value(self, x: float) -> int:
        return int(to_dtype_bits(np.array([x], np.float64), self.dtype)[0])

    def tile_state(self, num_rows: int):
        return np.zeros(num_rows, np.int64)  # each row's packed multiply-adds so far (for promotions)

    def declarations(self, num_rows: int) -> list[str]:
        out = ["  const lospmm_h16* p = Bn;\n"] if self.design.loads == "chained" else []
        if self.number.packed:
            out.append("  unsigned " + ", ".join(f"acc{i} = 0u" for i in range(num_rows)) + ";\n")
        if not self.number.packed or self.number.promote_every:
            out.append("  float " + ", ".join(f"lo{i} = 0.0f, hi{i} = 0.0f" for i in range(num_rows)) + ";\n")
        return out

    def load(self, j: int, column: int, previous: int) -> str:
        if self.design.loads == "chained":  # from the previous column's address: one IMAD.WIDE and the load
            text = f"  unsigned b{j}; LOSPMM_LDCH2(b{j}, p, N, {2 * (column - previous)});\n"
        else:
            text = f"  const unsigned b{j} = lospmm_ldh2(Bn, {2 * column}, N);\n"
        return text + self._unpacked(j)

    def _unpacked(self, j: int) -> str:
        """The lines that unpack pair b{j} into fp32 (bl{j}, bh{j}) where the sums are fp32."""
        return "" if self.number.packed else f"  float bl{j}, bh{j}; lospmm_unpack_{self.dtype}(b{j}, bl{j}, bh{j});\n"

    def multiply_adds(self, j: int, nonzeros, counts) -> list[str]:
        out = []
        promote = self.number.promote_every
        for i, bits in nonzeros:
            if self.number.packed:
                out.append(f"acc{i} = lospmm_fma_{self.dtype}({pair_literal(bits)}, b{j}, acc{i});")
                counts[i] += 1
                if promote and counts[i] % promote == 0:
                    out.append(self._promoted(i))
            else:
                lit = np.format_float_scientific(np.float32(from_dtype_bits(np.array([bits]), self.dtype)[0]),
                                                 unique=True, trim="0") + "f"
                out.append(f"lo{i} = fmaf(bl{j}, {lit}, lo{i}); hi{i} = fmaf(bh{j}, {lit}, hi{i});")
        return out

    def _promoted(self, i: int) -> str:
        """The packed sum of row i added into its fp32 pair, and reset."""
        return f"{{ float l, h; lospmm_unpack_{self.dtype}(acc{i}, l, h); lo{i} += l; hi{i} += h; acc{i} = 0u; }}"

    def finish(self, num_rows: int, counts) -> list:
        """Per row: (lines that finish its sum, its packed sum or None, its fp32 pair or None)."""
        promote = self.number.promote_every
        out = []
        for i in range(num_rows):
            if self.number.packed and not promote:
                out.append(("", f"acc{i}", None))
            else:
                pending = "  " + self._promoted(i) + "\n" if self.number.packed and counts[i] % promote else ""
                out.append((pending, None, (f"lo{i}", f"hi{i}")))
        return out

    def store(self, finish, row: int, epilogue: Epilogue | None, target: str = "", guard: str = "") -> str:
        """The lines that store one row's pair to C's row `target` (default: `row`), through
        `epilogue` (row `row`'s bias): the pair as two floats, the bias added and the activation
        applied in fp32, rounded once to the dtype at the pack. `guard`: a condition the store is under."""
        pending, unpack, value = self._pair(finish, row, epilogue)
        where = f"if ({guard}) " if guard else ""
        target = target or str(row)
        if not unpack and (epilogue is None or epilogue.empty):
            return f"{pending}  {where}{self.store_fn}(Cn, {target}, N, {value});\n"
        return f"{pending}  {where}{{ {unpack}{self.store_fn}(Cn, {target}, N, {value}); }}\n"

    def _pair(self, finish, row: int, epilogue: Epilogue | None) -> tuple[str, str, str]:
        """(the lines that finish row `row`'s sum, a statement that unpacks it for the epilogue or "", the
        stored pair's expression): as it is, or through `epilogue` in fp32, rounded once at the pack."""
        pending, packed, floats = finish
        epilogue = epilogue or Epilogue()
        if epilogue.empty:
            return pending, "", packed if packed else f"lospmm_pack_{self.dtype}({floats[0]}, {floats[1]})"
        lo, hi = floats or ("l", "h")
        unpack = f"float l, h; lospmm_unpack_{self.dtype}({packed}, l, h); " if packed else ""
        return pending, unpack, (f"lospmm_pack_{self.dtype}({epilogue_applied(epilogue, lo, row)}, "
                                 f"{epilogue_applied(epilogue, hi, row)})")

    def zero_store(self, row: int, epilogue: Epilogue) -> str:
        return f"  {self.store_fn}(Cn, {row}, N, {zero_pair(epilogue, row, self.dtype)});\n"

    # --- an implicit-im2col conv kernel's pair: two output pixels, lane 0 the low half (Fp32Code's names) ---
    def window_load(self, j: int, offset: int, word: int, bit: int, inside: bool = False) -> str:
        """The statements that define pair b{j}: each lane's 16-bit input at element `offset` from its
        window's corner (0 where outside its image: bit `bit` of word `word` of its window mask; `inside`:
        every window is inside, no test) in its half (and the pair unpacked for fp32 sums)."""
        if inside:
            return (f"  const unsigned b{j} = (unsigned)__ldg(xp_0 + {offset}) | (unsigned)__ldg(xp_1 + {offset}) << 16;\n"
                    + self._unpacked(j))
        return (f"  unsigned b{j}; LOSPMM_LDXH2M(b{j}, xp_0, xp_1, {2 * offset}, ok{word}_0, ok{word}_1, {bit});\n"
                + self._unpacked(j))

    def pixel_stores(self, finish, row: int, epilogue: Epilogue, stride: int) -> str:
        """Row `row`'s pair (`finish`) through `epilogue`, rounded once, each live lane's half to its
        pixel's NCHW Y (rows `stride` apart)."""
        pending, unpack, value = self._pair(finish, row, epilogue)
        return (f"{pending}  {{ {unpack}const unsigned y = {value}; if (live_0) lospmm_sth(Yb_0, {row}, {stride}, y); "
                f"if (live_1) lospmm_sth(Yb_1, {row}, {stride}, y >> 16); }}\n")

    def pixel_zero_store(self, out: str, row: int, epilogue: Epilogue, stride: int) -> str:
        """The statement that stores a row with no nonzero to one pixel's output `out` (rows `stride` apart)."""
        return f"lospmm_sth({out}, {row}, {stride}, {zero_pair(epilogue, row, self.dtype)});"


def pair_literal(bits: int) -> str:
    return f"0x{(bits << 16) | bits:08x}u"


def zero_pair(epilogue: Epilogue, row: int, dtype: str) -> str:
    """The stored pair of a row with no nonzero: 0, or its epilogue's value (the activated bias)."""
    if epilogue.empty:
        return "0u"
    return pair_literal(int(to_dtype_bits(np.array([epilogue.zero_output(row)]), dtype)[0]))


def number_code(design: KernelDesign) -> Fp32Code | HalfCode:
    """The rendering strategy of `design`'s number format."""
    return HalfCode(design) if design.half else Fp32Code(design)
