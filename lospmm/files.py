"""Files we write and later trust: written atomically (temp file, fsync, rename), and directories
whose files are listed with their SHA-256 in a manifest written last, so that a directory matching
its manifest is whole and anything else is not trusted."""

from __future__ import annotations

import hashlib
import os
import secrets
from pathlib import Path
from typing import Iterable


def stream_sha256(f) -> str:
    """The SHA-256 of what is left to read of the open binary file `f`, read a MiB at a time."""
    h = hashlib.sha256()
    for chunk in iter(lambda: f.read(1 << 20), b""):
        h.update(chunk)
    return h.hexdigest()


def file_sha256(path: Path) -> str:
    with open(path, "rb") as f:
        return stream_sha256(f)


def _temporary_beside(path: Path) -> Path:
    """A new empty file beside `path`, named for it, this process and a random token (the seam a test
    fills the disk at: every file we trust is begun here)."""
    tmp = path.parent / f".{path.name}.{os.getpid()}.{secrets.token_hex(6)}.tmp"
    os.close(os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o666))
    return tmp


def atomic_write(path: Path, write) -> None:
    """`write(tmp)` writes the whole file at a temporary path beside `path`; it becomes `path` only once
    synced, so `path` is the old file or the new one, never a part. The temporary file is made as a
    plain open makes a file (0666 less the umask, which the kernel applies: mkstemp's 0600 would hide
    it from the account that serves what the account that searched wrote)."""
    path = Path(path)
    tmp = _temporary_beside(path)
    try:
        write(str(tmp))
        with open(tmp, "rb") as f:
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
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
