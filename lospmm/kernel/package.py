"""A kernel package: one kernel in a directory, the form every emitted kernel is written in and
every reader loads —

    kernel.cu       the source (its units' concatenation: what NVRTC compiled and the host check ran)
    kernel.cubin    the linked cubin, when compiled
    kernel.json     its KernelSpec and what was recorded of it (compile, checks, times): KernelSpec.to_json
    weight.parquet  the pruned A it bakes in (a half kernel's rounded to its dtype), rows in the layer's order
    <global>.bin    a kernel that keeps A in its module's globals (the N:M kernel): each global's bytes as
                    it holds them (KernelSpec.module_data), for a C++ loader's cuMemcpyHtoD
    SHA256SUMS      the manifest over those, written last: a directory that matches it is whole

Nothing in a directory that fails its manifest is trusted (KernelDirError names what is wrong)."""

from __future__ import annotations

import shutil
from dataclasses import dataclass
from pathlib import Path

from lospmm.files import MANIFEST, atomic_write, manifest_problem, write_manifest
from lospmm.kernel.spec import KernelSource, KernelSpec, KernelSpecError

# No kernel.ptx: the kernel is linked from relocatable units, whose PTX are separate modules (each
# unit's kernel.ptx stays in the compile cache).
KERNEL_FILES = ("kernel.cu", "kernel.cubin", "kernel.json", "weight.parquet")


class KernelDirError(ValueError):
    """A kernel directory is missing a file, fails its manifest or was not compiled; the message names it."""


GLOBALS_SUFFIX = ".bin"  # a module global's bytes: <symbol>.bin
GLOBALS_GLOB = f"lospmm_*{GLOBALS_SUFFIX}"  # every module global's symbol starts lospmm_ (KernelSpec.module_symbols)


def package_files(spec: KernelSpec) -> tuple[str, ...]:
    """The files a package of `spec` may hold: KERNEL_FILES, and a file per module global it is given."""
    return KERNEL_FILES + tuple(f"{symbol}{GLOBALS_SUFFIX}" for symbol in spec.module_symbols.values())


def _written(out: Path) -> list[str]:
    """The package files in `out`, the globals' among them, the manifest last."""
    return [f for f in KERNEL_FILES if (out / f).exists()] + sorted(
        p.name for p in out.glob(GLOBALS_GLOB)) + ([MANIFEST] if (out / MANIFEST).exists() else [])


def cleared(out: Path) -> None:
    """`out` made, with no file left from an earlier kernel there (kernel.ptx: from before kernels were
    linked; the manifest first, so that nothing half-replaced is trusted)."""
    out.mkdir(parents=True, exist_ok=True)
    for f in (MANIFEST, "kernel.ptx", *_written(out)):
        (out / f).unlink(missing_ok=True)


def moved_package(src: Path, out: Path) -> None:
    """The package written at `src` moved to `out` (cleared first), its manifest last so that `out` is
    trusted only once whole; `src` removed."""
    cleared(out)
    for f in _written(src):  # MANIFEST is the last of them
        (src / f).replace(out / f)
    shutil.rmtree(src, ignore_errors=True)


def write_source(out: Path, kernel: KernelSource, matrix) -> None:
    """kernel.cu and weight.parquet (the A the kernel bakes in: what `lospmm.torch.sparsify` checks a
    model's weight against, and a user's way to evaluate the pruned layer without a GPU); a kernel
    keeping A in its module's globals, each global's bytes (`<symbol>.bin`, what its loader copies in)."""
    from lospmm.sparse_file import write_matrix

    atomic_write(out / "kernel.cu", lambda tmp: Path(tmp).write_text(kernel.source, encoding="utf-8"))
    atomic_write(out / "weight.parquet", lambda tmp: write_matrix(tmp, matrix))
    for symbol, array in kernel.spec.module_data(matrix).items():
        atomic_write(out / f"{symbol}{GLOBALS_SUFFIX}", lambda tmp, array=array: array.tofile(tmp))


def write_cubin(out: Path, cubin_path: Path) -> bytes:
    """kernel.cubin, copied from `cubin_path` (the compile cache's); returns its bytes."""
    atomic_write(out / "kernel.cubin", lambda tmp: shutil.copyfile(cubin_path, tmp))
    return (out / "kernel.cubin").read_bytes()


def write_record(out: Path, spec: KernelSpec, results: dict) -> None:
    """kernel.json (the spec and `results`), then the manifest over the package's files: the package
    is whole from here on."""
    text = spec.to_json(results)
    atomic_write(out / "kernel.json", lambda tmp: Path(tmp).write_text(text, encoding="utf-8"))
    write_manifest(out, package_files(spec))


@dataclass(frozen=True)
class KernelPackage:
    """A kernel directory that passed its manifest, with its spec read from kernel.json."""

    dir: Path
    spec: KernelSpec

    @property
    def facts(self) -> dict:
        """kernel.json's record: the description's facts and its results."""
        return {**self.spec.facts(), **self.spec.results}

    def cubin(self) -> bytes:
        return (self.dir / "kernel.cubin").read_bytes()

    def source(self) -> KernelSource:
        return KernelSource(self.spec, ((self.dir / "kernel.cu").read_text(encoding="utf-8"),))

    def matrix(self):
        from lospmm.sparse_file import read_matrix

        return read_matrix(self.dir / "weight.parquet")

    def on(self, backend: str, sanitize: bool = False, matrix=None):
        """This kernel on `backend` (lospmm.kernel.backend): its cubin on the GPU, its source on the host.
        A kernel that keeps A as module data (the N:M kernel) has it filled from `matrix`, by default
        its weight.parquet (a benchmark bundle keeps its A beside the package instead)."""
        from lospmm.kernel.backend import backend_kernel

        data = None
        if self.spec.module_symbols:
            data = self.spec.module_data(self.matrix() if matrix is None else matrix)
        if backend == "cuda":
            return backend_kernel(backend, self.spec, cubin=self.cubin(), module_data=data)
        return backend_kernel(backend, self.spec, source=self.source().source, sanitize=sanitize, module_data=data)


def runs(backend: str) -> str:
    """The file a backend runs: the cubin on the GPU, the source on the host."""
    from lospmm.kernel.backend import checked_backend

    return "kernel.cubin" if checked_backend(backend) == "cuda" else "kernel.cu"


def read_package(directory: str | Path, required: tuple[str, ...] = ("kernel.json",)) -> KernelPackage:
    """The package at `directory`, every file emit wrote unchanged and `required` among them;
    KernelDirError naming the directory and the problem otherwise (a kernel.json of a newer version,
    or one it cannot read, included)."""
    d = Path(directory)
    problem = manifest_problem(d, required=required)  # as emit wrote them, or nothing
    if problem:
        raise KernelDirError(f"{problem}; re-run the search (or `lospmm rerun --stage emit`) to rebuild it")
    try:
        text = (d / "kernel.json").read_text(encoding="utf-8")
    except FileNotFoundError as e:
        raise KernelDirError(f"{d}: {Path(e.filename).name} is missing (was the kernel compiled?)") from None
    try:
        return KernelPackage(d, KernelSpec.from_json(text, str(d / "kernel.json")))
    except KernelSpecError as e:
        raise KernelDirError(str(e)) from None
