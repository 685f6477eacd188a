"""Files we write and later trust: written atomically (temp file, fsync, rename), and directories
whose files are listed with their SHA-256 in a manifest written last, so that a directory matching
its manifest is whole and anything else is not trusted."""

from __future__ import annotations

import hashlib
import os
import tempfile
from pathlib import Path
from typing import Iterable


def file_sha256(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def _umask() -> int:
    # the umask is only read by setting it: once, at import, before a thread writes a file
    mask = os.umask(0o022)
    os.umask(mask)
    return mask


# mkstemp makes its file 0600; a file we write gets the mode a plain open would give it, so that the
# account that serves a kernel reads what the account that searched wrote
FILE_MODE = 0o666 & ~_umask()


def atomic_write(path: Path, write) -> None:
    """`write(tmp)` writes the whole file at a temporary path beside `path`; it becomes `path` (mode
    FILE_MODE) only once synced, so `path` is the old file or the new one, never a part."""
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    os.close(fd)
    try:
        write(tmp)
        os.chmod(tmp, FILE_MODE)
        with open(tmp, "rb") as f:
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


MANIFEST = "SHA256SUMS"


def write_manifest(directory: Path, files: Iterable[str]) -> str:
    """`SHA256SUMS` (the format `sha256sum -c` reads) over `files` of `directory`, written last and
    atomically: a directory whose files match it is whole. Returns the manifest's own hash."""
    lines = "".join(f"{file_sha256(directory / f)}  {f}\n" for f in files if (directory / f).exists())
    atomic_write(directory / MANIFEST, lambda tmp: Path(tmp).write_text(lines, encoding="utf-8"))
    return hashlib.sha256(lines.encode()).hexdigest()


def manifest_problem(directory: Path, expected: str | None = None, required: tuple[str, ...] = ()) -> str | None:
    """Why `directory` cannot be trusted (its manifest or a listed file missing or altered, a
    `required` file not listed, or the manifest not the one recorded as `expected`), or None."""
    try:
        text = (directory / MANIFEST).read_text(encoding="utf-8")
    except OSError:
        return f"{directory / MANIFEST} is missing"
    if expected is not None and hashlib.sha256(text.encode()).hexdigest() != expected:
        return f"{directory / MANIFEST} is not the one its artifact recorded"
    listed = {line.partition("  ")[2] for line in text.splitlines()}
    missing = [f for f in required if f not in listed]
    if missing:
        return f"{directory / MANIFEST} does not list {', '.join(missing)} (not compiled?)"
    for line in text.splitlines():
        digest, _, name = line.partition("  ")
        try:
            if file_sha256(directory / name) != digest:
                return f"{directory / name} does not match its checksum in {MANIFEST}"
        except OSError:
            return f"{directory / name} is missing"
    return None


def manifest_hash(directory: Path) -> str | None:
    try:
        return hashlib.sha256((directory / MANIFEST).read_bytes()).hexdigest()
    except OSError:
        return None
