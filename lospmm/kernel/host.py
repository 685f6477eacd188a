"""The host backend: a kernel's generated CUDA text run on the CPU. The text NVRTC compiles is
included after a shim header (include/host_shim.h: CUDA's built-ins and the kernels' helpers in
C++, half arithmetic rounded exactly as the device rounds it), built with the host C++ compiler
with a driver (include/host_harness.cpp) that runs every block and thread in a loop.

Each pointer argument is copied into a heap buffer of exactly its size (so AddressSanitizer,
`sanitize=True`, catches any out-of-bounds read or write) and every output buffer is filled with
NaN first (0x7fff for 16-bit elements), so an element the kernel never writes fails the check.

A kernel whose threads share memory and meet at barriers (`KernelSpec.cooperative`: the N:M
kernel) runs each block's threads one at a time on threads of their own, each until its next
barrier; a kernel's module data (`KernelSpec.module_data`) is copied into its globals first.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Mapping

import numpy as np

from lospmm.kernel.includes import included
from lospmm.kernel.spec import KernelSource, KernelSpec
from lospmm.kernel.timing import Timing

NAME = "host"


class EmulationError(RuntimeError):
    """The host build failed, or the kernel crashed or touched memory out of bounds. `transient`:
    the compiler or the program was killed by a signal (out of memory, say), not failed."""

    def __init__(self, message: str, transient: bool = False):
        super().__init__(message)
        self.transient = transient


@dataclass(frozen=True)
class _Param:
    ctype: str
    name: str

    @property
    def pointer(self) -> bool:
        return "*" in self.ctype

    @property
    def output(self) -> bool:
        return self.pointer and not self.ctype.startswith("const")

    @property
    def base(self) -> str:
        return self.ctype.replace("const", "").replace("*", "").strip()


def _params(spec: KernelSpec) -> list[_Param]:
    out = []
    for decl in spec.params:
        ctype, name = decl.rsplit(" ", 1)
        out.append(_Param(ctype.strip(), name.strip()))
    return out


# the C type of each role of module data (KernelSpec.module_symbols)
MODULE_CTYPES = {"values": "float", "index": "unsigned char", "rows": "unsigned char", "bias": "float"}
_MODULE_DTYPES = {"float": np.float32, "unsigned char": np.uint8}


def host_program(kernel: KernelSource) -> str:
    """The C++ translation unit: shim, the kernel text unchanged, and a driver main()."""
    reads, writes = [], []
    params = _params(kernel.spec)
    for p in params:
        if p.pointer:
            reads.append(f"  long long n_{p.name}; {p.base}* {p.name} = read_array<{p.base}>(in, &n_{p.name});")
            if p.output:  # poisoned: an element never written fails the check (0x7fff: NaN in fp16 and bf16)
                poison = "0x7fff" if p.base == "lospmm_h16" else "NAN"
                reads.append(f"  for (long long i = 0; i < n_{p.name}; ++i) {p.name}[i] = {poison};")
                writes.append(f"  fwrite({p.name}, sizeof({p.base}), n_{p.name}, out);")
        else:
            reads.append(f"  long long n_{p.name}; {p.base}* {p.name}_box = read_array<{p.base}>(in, &n_{p.name}); "
                         f"const {p.base} {p.name} = {p.name}_box[0];")
    for role, symbol in kernel.spec.module_symbols.items():  # read after the parameters, in this order
        ctype = MODULE_CTYPES[role]
        reads.append(f"  {{ long long n; {ctype}* data = read_array<{ctype}>(in, &n);\n"
                     f"    if ((unsigned long long)n != sizeof({symbol}) / sizeof({symbol}[0])) {{ fprintf(stderr, "
                     f"\"module data {symbol}: %lld elements, the kernel declares %zu\\n\", n, "
                     f"sizeof({symbol}) / sizeof({symbol}[0])); exit(4); }}\n"
                     f"    memcpy({symbol}, data, sizeof({symbol})); free(data); }}")
    harness = (included("host_harness.cpp").replace("@READ@", "\n".join(reads)).replace("@WRITE@", "\n".join(writes))
               .replace("@KERNEL@", kernel.name).replace("@ARGS@", ", ".join(p.name for p in params)))
    cooperative = "#define LOSPMM_COOPERATIVE 1\n" if kernel.spec.cooperative else ""
    return cooperative + included("host_shim.h") + "\n" + kernel.source + "\n" + harness


def run_on_host(kernel: KernelSource, args: Mapping[str, np.ndarray | int], grid: tuple[int, int, int],
                block: int, sanitize: bool = False, cxx: str | None = None,
                build_dir: str | None = None, module_data: Mapping[str, np.ndarray] | None = None,
                smem_bytes: int = 0) -> dict[str, np.ndarray]:
    """Build `kernel` for the host and run it; returns each output pointer argument's final array.

    `args` maps parameter names to arrays (pointers) or ints; output arrays give only the size.
    `module_data`: {symbol: array} for each of the kernel's module globals (KernelSpec.module_data).
    `smem_bytes`: the launch's dynamic shared memory, allocated to the byte (under ASan a kernel
    reaching past it fails, as it would on the GPU)."""
    params = _params(kernel.spec)
    missing = [p.name for p in params if p.name not in args]
    if missing:
        raise ValueError(f"missing kernel arguments: {missing}")
    module_data = module_data or {}
    unfilled = [s for s in kernel.spec.module_symbols.values() if s not in module_data]
    if unfilled:
        raise ValueError(f"{kernel.spec.layer or kernel.name}: module data not given for {unfilled}")
    exe = _build(kernel, sanitize, cxx, build_dir)
    with tempfile.TemporaryDirectory(prefix="lospmm-emu-") as tmp:
        inp, outp = Path(tmp) / "in.bin", Path(tmp) / "out.bin"
        with open(inp, "wb") as f:
            f.write(np.array([grid[0], grid[1], block, smem_bytes], dtype=np.uint32).tobytes())
            for p in params:
                arr = np.atleast_1d(np.asarray(args[p.name], dtype=_dtype(p.base)))
                f.write(np.int64(arr.size).tobytes())
                f.write(np.ascontiguousarray(arr).tobytes())
            for role, symbol in kernel.spec.module_symbols.items():
                arr = np.asarray(module_data[symbol], _MODULE_DTYPES[MODULE_CTYPES[role]]).ravel()
                f.write(np.int64(arr.size).tobytes())
                f.write(arr.tobytes())
        env = {**os.environ, "ASAN_OPTIONS": "detect_leaks=0:abort_on_error=0:exitcode=23"}
        proc = subprocess.run([str(exe), str(inp), str(outp)], capture_output=True, text=True, env=env)
        if proc.returncode != 0:
            raise EmulationError(f"{kernel.name}: host run failed (exit {proc.returncode}): {proc.stderr[-3000:]}",
                                 transient=proc.returncode < 0)
        data = outp.read_bytes()
    out, offset = {}, 0
    for p in params:
        if p.output:
            size = np.atleast_1d(args[p.name]).size
            dt = _dtype(p.base)
            out[p.name] = np.frombuffer(data, dtype=dt, count=size, offset=offset).copy()
            offset += size * np.dtype(dt).itemsize
    return out


def _dtype(base: str):
    return {"float": np.float32, "int": np.int32, "unsigned": np.uint32, "lospmm_h16": np.uint16}[base]


def _build(kernel: KernelSource, sanitize: bool, cxx: str | None, build_dir: str | None) -> Path:
    cxx = cxx or os.environ.get("CXX") or shutil.which("g++") or shutil.which("c++") or "c++"
    program = host_program(kernel)
    # -O0: the generated kernels are long straight-line functions; g++ -O1 builds them 3-4x slower
    # (59k nonzeros: 19.3 s vs 5.2 s with ASan) and the check runs a small N, so speed of the
    # built program does not matter.
    flags = (["-O0", "-std=c++17", "-w"] + (["-pthread"] if kernel.spec.cooperative else [])
             + (["-fsanitize=address", "-fno-omit-frame-pointer"] if sanitize else []))
    key = hashlib.sha256((program + " ".join([cxx, *flags])).encode()).hexdigest()[:24]
    root = Path(build_dir or Path(tempfile.gettempdir()) / "lospmm-hostemu")
    exe = root / f"{key}.bin"
    if exe.exists():
        try:
            os.utime(exe)  # recently used: the last to go when the cache is pruned
        except OSError:
            pass
        return exe
    root.mkdir(parents=True, exist_ok=True)
    src = root / f"{key}.cpp"
    src.write_text(program, encoding="utf-8")
    tmp_exe = root / f".{key}.{os.getpid()}.tmp"
    proc = subprocess.run([cxx, *flags, "-o", str(tmp_exe), str(src)], capture_output=True, text=True)
    if proc.returncode != 0:
        raise EmulationError(f"{kernel.name}: host build failed (exit {proc.returncode}): {proc.stderr[-3000:]}",
                             transient=proc.returncode < 0)
    os.replace(tmp_exe, exe)
    src.unlink(missing_ok=True)  # the program text is the key's input, not needed once built
    pruned_cache(root)
    return exe


HOST_CACHE_BYTES = 2 << 30  # the host-build cache's size limit: every checked kernel leaves a binary


def pruned_cache(root: Path, max_bytes: int = HOST_CACHE_BYTES) -> int:
    """Delete the least recently used builds under `root` until they take at most `max_bytes`
    (over sessions an unbounded cache filled a shared disk); returns the bytes freed."""
    entries = []
    for f in root.glob("*.bin"):
        try:
            st = f.stat()
        except OSError:  # another process pruned it
            continue
        entries.append((st.st_mtime, st.st_size, f))
    total, freed = sum(size for _, size, _ in entries), 0
    for _, size, f in sorted(entries, key=lambda e: e[0]):
        if total - freed <= max_bytes:
            break
        f.unlink(missing_ok=True)
        freed += size
    return freed


class HostKernel:
    """A kernel on the host backend: `run(x)` launches it as its spec says on a numpy input (B, its
    bits for a half kernel, or a conv kernel's NCHW X) and returns the output (C or Y), B and C
    padded to the columns it launches with and cut back. `sanitize`: under AddressSanitizer."""

    backend = NAME

    def __init__(self, kernel: KernelSource, sanitize: bool = False, module_data: Mapping[str, np.ndarray] | None = None):
        """`module_data`: the kernel's module globals (KernelSpec.module_data of its A), when it has any."""
        self.kernel, self.spec, self.sanitize = kernel, kernel.spec, sanitize
        self.module_data = dict(module_data or {})

    def run(self, x: np.ndarray, threads: int | None = None, extra: Mapping[str, np.ndarray | int] | None = None,
            smem_bytes: int = 0) -> np.ndarray:
        """`threads`: a block size given at launch (a proxy's N1, or a kernel reading N1 at launch);
        `extra`: a proxy's cluster_of; `smem_bytes`: the dynamic shared memory it is launched with (a
        proxy's: stages.pad.proxy_dynamic_shared)."""
        spec = self.spec
        x = np.asarray(x, spec.number.array_dtype)
        inp, outp, count_name = spec.argument_names
        count = x.shape[0] if spec.form == "conv" else x.shape[1]
        launched = spec.launch_count(count)
        if spec.form != "conv" and launched != count:  # padded with zero columns to the column multiple
            padded = np.zeros((x.shape[0], launched), x.dtype)
            padded[:, :count] = x
            x = padded
        out_shape = spec.output_shape(launched)
        args = {inp: x.ravel(), outp: np.empty(int(np.prod(out_shape)), x.dtype), count_name: launched, **(extra or {})}
        y = run_on_host(self.kernel, args, spec.grid(launched, threads), spec.layout.block(threads),
                        sanitize=self.sanitize, module_data=self.module_data, smem_bytes=smem_bytes)[outp].reshape(out_shape)
        return y if spec.form == "conv" else y[:, :count]

    def time(self, count: int) -> Timing:
        """The host times nothing (its figures would say nothing of a GPU): a SKIPPED timing."""
        from lospmm.status import Status

        return Timing(NAME, float("nan"), Status.SKIPPED, "the host backend does not time; the estimate timer models")


def proxy_check(kernel: KernelSource, cluster_of: np.ndarray, n: int, n1: int, smem_bytes: int = 0) -> str:
    """Run a proxy on the host under AddressSanitizer with zero B and N = `n` columns in blocks of
    `n1`, launched with `smem_bytes` of dynamic shared memory (the least its launches get): "asan-ok",
    or "failed: ..." with the reason (a proxy's output is meaningless, its memory accesses are not)."""
    try:
        HostKernel(kernel, sanitize=True).run(np.zeros((kernel.k, n), kernel.spec.number.array_dtype), n1,
                                              {"cluster_of": np.asarray(cluster_of, np.int32)}, smem_bytes)
        return "asan-ok"
    except Exception as e:
        return f"failed: {e}"[:2000]
