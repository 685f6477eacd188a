"""Stage 8, compile: CUDA source -> PTX and cubin via NVRTC (cuda-python), with ptxas's resource
report (registers, spills, stack, shared memory). Works without a GPU. A compile failure is a
result with its log, never an exception.

A kernel's units (see codegen: tile functions in shards, then the entry) compile separately as
relocatable code and nvJitLink links their cubins into one (`linked`); each unit's compile is
small, so the whole costs time linear in the kernel's size and bounded memory.
"""

from __future__ import annotations

import hashlib
import re
import struct
import time
from dataclasses import dataclass, field

from lospmm.kernel.design import BASELINE, KernelDesign
from lospmm.stages.constrain import predicted_registers
from lospmm.status import Status


@dataclass(frozen=True)
class CompileOptions:
    """NVRTC options. Defaults: arch="sm_90" (always explicit; nothing asks a device),
    maxrregcount=None (the caller passes the register prediction), ptxas_level=1, std="c++17",
    relocatable=False (True for a kernel's units, which are linked), extra=(). --Ofast-compile is
    never passed.

    ptxas_level=1: at -O2/-O3 ptxas hoists the generated code's B loads far ahead of their use
    (255 registers uncapped) and, capped at the §3.2 prediction, spills 0.9-2.7 KB per kernel;
    at -O1 it keeps the emitted prefetch schedule, never spilled at the prediction in our
    measurements, and compiles in about half the time (benchmarks/ptxas_level.py)."""

    arch: str = "sm_90"
    maxrregcount: int | None = None
    ptxas_level: int = 1
    std: str = "c++17"
    relocatable: bool = False
    extra: tuple[str, ...] = field(default=())

    def as_list(self) -> list[str]:
        if not re.fullmatch(r"sm_\d+[a-z]?", self.arch):
            raise ValueError(f"arch must look like sm_90, got {self.arch!r}")
        if self.ptxas_level not in (0, 1, 2, 3):
            raise ValueError(f"ptxas_level must be 0..3, got {self.ptxas_level}")
        opts = [f"--gpu-architecture={self.arch}", f"--std={self.std}", "-Xptxas=-v",
                f"-Xptxas=-O{self.ptxas_level}"]
        if self.maxrregcount:
            opts.append(f"--maxrregcount={int(self.maxrregcount)}")
        if self.relocatable:
            opts.append("--relocatable-device-code=true")
        bad = [o for o in self.extra if "Ofast-compile" in o]
        if bad:
            raise ValueError(f"--Ofast-compile is not allowed: {bad}")
        return opts + list(self.extra)


def kernel_options(arch: str, m1: int, ptxas_level: int = 1, design: KernelDesign = BASELINE,
                   extra_registers: int = 0, conv: bool = False) -> CompileOptions:
    """Options for the units of a full kernel or proxy of tile height M1 in `design` (`conv`: an
    implicit-im2col convolution's): the §3.2 register prediction caps every tile function, and so the
    linked kernel (a baked conv kernel of V > 1 lanes at ptxas -O2 at least); `extra_registers` above it (at most 255 in all: the device program's latency A/B
    gives a deeper prefetch room)."""
    registers = predicted_registers(m1, design=design, conv=conv) + extra_registers
    if conv and design.conv_lane_windows:
        # ptxas -O1 hoists the V lanes' independent window loads and spills kilobytes at any cap (NVRTC
        # sm_90: 0.6-14 KB a thread on a 3×3 layer, 255 registers included); -O2 schedules them within
        # the prediction, and compiled that layer faster (a sliced one of one lane: 0.1-1 KB at -O1 with
        # 12 registers more, none at -O2 with 8 more)
        ptxas_level = max(ptxas_level, 2)
    return CompileOptions(arch=arch, maxrregcount=min(255, registers), ptxas_level=ptxas_level, relocatable=True)


@dataclass(frozen=True)
class ProxyCheck:
    """How `--verify` runs each compiled proxy on the host under AddressSanitizer. Defaults: n=37
    columns with n1=32 threads per block: two column blocks, the second partial (a design whose tiles
    have their own N1, a staged one's, is run at it)."""

    n: int = 37
    n1: int = 32


@dataclass(frozen=True)
class Compiled:
    """NVRTC's output for one source. `status` is Status.OK or Status.ERROR (then `log` says why)."""

    status: Status
    log: str
    ptx: bytes
    cubin: bytes
    registers: int
    spill_stores: int
    spill_loads: int
    stack_bytes: int
    smem_bytes: int
    seconds: float
    nvrtc_version: str
    # spill bytes (stores + loads) of the function that spills most: what one thread of a linked
    # kernel executes at most (it runs one tile function), as against the totals above
    thread_spill_bytes: int = 0


def nvrtc_version() -> str:
    from cuda.bindings import nvrtc

    _, major, minor = nvrtc.nvrtcVersion()
    return f"{major}.{minor}"


def compile_key(source: str, options: CompileOptions, version: str | None = None) -> str:
    """Content address of a compilation: source, options, NVRTC version and arch."""
    blob = "\0".join([source, " ".join(options.as_list()), version or nvrtc_version(), options.arch])
    return hashlib.sha256(blob.encode()).hexdigest()


def compiled(source: str, name: str, options: CompileOptions = CompileOptions()) -> Compiled:
    """Compile `source` (file name `name` in messages) to PTX and cubin for `options.arch`."""
    from cuda.bindings import nvrtc

    version = nvrtc_version()
    opts = [o.encode() for o in options.as_list()]
    t0 = time.perf_counter()
    err, prog = nvrtc.nvrtcCreateProgram(source.encode(), f"{name}.cu".encode(), 0, [], [])
    _check(err, "nvrtcCreateProgram")
    try:
        (result,) = nvrtc.nvrtcCompileProgram(prog, len(opts), opts)
        seconds = time.perf_counter() - t0
        log = _log(prog)
        if result != nvrtc.nvrtcResult.NVRTC_SUCCESS:
            return Compiled(Status.ERROR, log or str(result), b"", b"", 0, 0, 0, 0, 0, seconds, version)
        ptx = _blob(prog, nvrtc.nvrtcGetPTXSize, nvrtc.nvrtcGetPTX).rstrip(b"\0")
        cubin = _blob(prog, nvrtc.nvrtcGetCUBINSize, nvrtc.nvrtcGetCUBIN)
    finally:
        nvrtc.nvrtcDestroyProgram(prog)
    usage = resource_usage(log)
    return Compiled(Status.OK, log, ptx, cubin, usage["registers"], usage["spill_stores"], usage["spill_loads"],
                    usage["stack_bytes"], usage["smem_bytes"], seconds, version, usage["thread_spill_bytes"])


def compiled_kernel(kernel, options: CompileOptions) -> Compiled:
    """A generated kernel (codegen.KernelSource) as one cubin: its units compiled one after another
    and linked, without a cache (the flow's is flows.compile_cache.cached_kernel). `ptx` is empty:
    the units' PTX are separate relocatable modules. Spills are summed over the units."""
    if not options.relocatable:
        raise ValueError("a kernel's units are compiled with CompileOptions(relocatable=True)")
    units = [compiled(u, f"{kernel.name}_unit{i}", options) for i, u in enumerate(kernel.units)]
    seconds = sum(u.seconds for u in units)
    failed = [u for u in units if u.status != Status.OK]
    if failed:
        return Compiled(Status.ERROR, failed[0].log, b"", b"", 0, 0, 0, 0, 0, seconds, units[0].nvrtc_version)
    out = linked([u.cubin for u in units], options.arch, kernel.name)
    return Compiled(out.status, "\n".join([*(u.log for u in units), out.log]), b"", out.cubin, out.registers,
                    sum(u.spill_stores for u in units), sum(u.spill_loads for u in units),
                    max(u.stack_bytes for u in units), max(u.smem_bytes for u in units), seconds + out.seconds,
                    units[0].nvrtc_version, max(u.thread_spill_bytes for u in units))


@dataclass(frozen=True)
class Linked:
    """nvJitLink's output for a kernel's unit cubins. `registers` is the entry's, read from the
    linked cubin (the most any function it calls uses)."""

    status: Status
    log: str
    cubin: bytes
    registers: int
    seconds: float


def link_key(unit_keys: list[str], arch: str, version: str | None = None) -> str:
    """Content address of a link: its units' compile keys, in order, the arch and nvJitLink's version."""
    blob = "\0".join(["nvjitlink", *unit_keys, arch, version or nvjitlink_version()])
    return hashlib.sha256(blob.encode()).hexdigest()


def nvjitlink_version() -> str:
    from cuda.bindings import nvjitlink

    major, minor = nvjitlink.version()
    return f"{major}.{minor}"


# nvJitLink results that say nothing about the input: retried, never cached as the link's result.
# (Not ERROR_INTERNAL: nvJitLink 13.5 reports an undefined function that way.)
TRANSIENT_LINK_RESULTS = ("ERROR_THREADPOOL",)


class TransientLinkError(RuntimeError):
    transient = True


def linked(cubins: list[bytes], arch: str, entry: str) -> Linked:
    """Link relocatable unit cubins into one cubin for `arch` (nvJitLink; no GPU needed), with the
    registers of `entry`, the kernel. A bad input or a missing function is an error result; nvJitLink
    failing on its own (its thread pool) raises TransientLinkError."""
    from cuda.bindings import nvjitlink

    t0 = time.perf_counter()
    handle = None
    try:
        handle = nvjitlink.create(1, [f"-arch={arch}"])
        for i, cubin in enumerate(cubins):
            nvjitlink.add_data(handle, nvjitlink.InputType.CUBIN, cubin, len(cubin), f"unit{i}.cubin")
        nvjitlink.complete(handle)
        out = bytearray(nvjitlink.get_linked_cubin_size(handle))
        nvjitlink.get_linked_cubin(handle, out)
        log = _link_log(handle, error=False)
    except nvjitlink.nvJitLinkError as e:
        if any(name in str(e) for name in TRANSIENT_LINK_RESULTS):
            raise TransientLinkError(f"nvJitLink: {e}") from e
        log = _link_log(handle, error=True) if handle is not None else ""
        return Linked(Status.ERROR, f"{e}\n{log}".strip(), b"", 0, time.perf_counter() - t0)
    finally:
        if handle is not None:
            nvjitlink.destroy(handle)
    cubin = bytes(out)
    try:
        registers = entry_registers(cubin)[entry]
    except (KeyError, ValueError, IndexError, struct.error) as e:  # a cubin we cannot read: not served
        return Linked(Status.ERROR, f"{log}\nno register count for {entry} in the linked cubin: "
                                    f"{type(e).__name__}: {e}".strip(), b"", 0, time.perf_counter() - t0)
    return Linked(Status.OK, log, cubin, registers, time.perf_counter() - t0)


def _link_log(handle, error: bool) -> str:
    from cuda.bindings import nvjitlink

    size = (nvjitlink.get_error_log_size if error else nvjitlink.get_info_log_size)(handle)
    if size <= 1:
        return ""
    buf = bytearray(size)
    (nvjitlink.get_error_log if error else nvjitlink.get_info_log)(handle, buf)
    return bytes(buf).rstrip(b"\0").decode(errors="replace").strip()


def entry_registers(cubin: bytes) -> dict[str, int]:
    """Registers per thread of each function with a register count in a cubin's `.nv.info`
    (EIATTR_REGCOUNT), by symbol name: what the driver allocates for a launch. ValueError for bytes
    that are not a 64-bit little-endian ELF with a section table."""
    if cubin[:4] != b"\x7fELF" or cubin[4] != 2 or cubin[5] != 1:
        raise ValueError("not a 64-bit little-endian ELF file")

    def section_headers():
        shoff, = struct.unpack_from("<Q", cubin, 0x28)
        entsize, count, names = struct.unpack_from("<HHH", cubin, 0x3A)
        if count == 0 or names >= count:
            raise ValueError("no section table (or extended numbering)")
        headers = [struct.unpack_from("<IIQQQQIIQQ", cubin, shoff + i * entsize) for i in range(count)]
        strtab = headers[names][4]
        return [(_c_string(cubin, strtab + h[0]), h) for h in headers]

    sections = section_headers()
    symbols = []
    for name, h in sections:
        if name == ".symtab":
            strtab = sections[h[6]][1][4]  # sh_link: the symbols' string table
            symbols = [_c_string(cubin, strtab + struct.unpack_from("<I", cubin, h[4] + i * 24)[0])
                       for i in range(h[5] // 24)]
    out = {}
    for name, h in sections:
        if name != ".nv.info":
            continue
        pos, end = h[4], h[4] + h[5]
        while pos + 4 <= end:
            fmt, attr, size = cubin[pos], cubin[pos + 1], struct.unpack_from("<H", cubin, pos + 2)[0]
            if fmt == 0x04 and attr == 0x2F and size == 8:  # EIATTR_REGCOUNT: (symbol index, registers)
                index, regs = struct.unpack_from("<II", cubin, pos + 4)
                out[symbols[index] if index < len(symbols) else str(index)] = regs
            pos += 4 + (size if fmt == 0x04 else 0)
    return out


def _c_string(blob: bytes, at: int) -> str:
    return blob[at:blob.index(b"\0", at)].decode(errors="replace")


def resource_usage(ptxas_log: str) -> dict[str, int]:
    """Registers, spills, stack and static shared memory from ptxas's -v report: spills summed over
    the functions, and the most one function spills (`thread_spill_bytes`, stores + loads)."""
    def total(pattern: str) -> int:
        return sum(int(x) for x in re.findall(pattern, ptxas_log))

    regs = [int(x) for x in re.findall(r"Used (\d+) registers", ptxas_log)]
    return {
        "registers": max(regs, default=0),
        "spill_stores": total(r"(\d+) bytes spill stores"),
        "spill_loads": total(r"(\d+) bytes spill loads"),
        "stack_bytes": max([int(x) for x in re.findall(r"(\d+) bytes stack frame", ptxas_log)], default=0),
        "smem_bytes": max([int(x) for x in re.findall(r"(\d+) bytes smem", ptxas_log)], default=0),
        "thread_spill_bytes": max([int(a) + int(b) for a, b in
                                   re.findall(r"(\d+) bytes spill stores, (\d+) bytes spill loads", ptxas_log)],
                                  default=0),
    }


def _check(err, what: str) -> None:
    from cuda.bindings import nvrtc

    if err != nvrtc.nvrtcResult.NVRTC_SUCCESS:
        raise RuntimeError(f"{what} failed: {err}")


def _log(prog) -> str:
    from cuda.bindings import nvrtc

    _, size = nvrtc.nvrtcGetProgramLogSize(prog)
    buf = b" " * size
    nvrtc.nvrtcGetProgramLog(prog, buf)
    return buf.rstrip(b"\0").decode(errors="replace").strip()


def _blob(prog, size_fn, get_fn) -> bytes:
    _, size = size_fn(prog)
    buf = b" " * size
    (err,) = get_fn(prog, buf)
    _check(err, get_fn.__name__)
    return bytes(buf)
