"""How a bundle travels to a GPU machine: packed into .tar.xz archives of at most ~28 MiB (parts that
are bundles of their own), listed with their sizes, SHA-256 and launches in `<name>.parts.json`,
checked on arrival and unpacked. Apart from benchmarks.bundle on purpose: a bundle's `inputs` hash
covers the code that plans, renders and compiles it, not how it is packed, so a change here leaves
prepared bundles current."""

from __future__ import annotations

import json
import lzma
import shutil
import tarfile
from pathlib import Path

from benchmarks.analysis import rows_table
from benchmarks.bundle import bundle_facts, bundle_rows
from benchmarks.measure import measured_key
from lospmm.files import file_sha256

MAX_PART_MIB = 28.0


def packed(directory: Path, archive: Path) -> Path:
    """`directory` as an xz tarball (its folder name at the top), written atomically."""
    archive.parent.mkdir(parents=True, exist_ok=True)
    tmp = archive.with_suffix(archive.suffix + ".tmp")
    with lzma.open(tmp, "wb", preset=6) as raw, tarfile.open(fileobj=raw, mode="w") as tar:
        tar.add(directory, arcname=directory.name)
    tmp.replace(archive)
    return archive


def packed_parts(bundle: Path, into: Path, max_mib: float = MAX_PART_MIB, ratio: float = 5.0) -> list[Path]:
    """The bundle as .tar.xz archives of at most about `max_mib` each (`ratio`: xz's on these cubins
    as first guessed, 5-13; the N:M set's large kernels went as low as 2): one archive if it fits,
    else parts `<name>-<i>of<n>`, each a bundle of its own (its rows' packages and matrices), split
    between kernels in the bundle's order; a part that came out over OVERSIZE × `max_mib` is split in
    two and packed again (a 70 MiB part of the N:M set fitted no device call; a single kernel that
    large stays one part, which `window` names as too large to carry). Each part's folder inside its
    archive is `<name>-part<k>` (named before the count is known). Writes `<name>.parts.json` beside
    them: each archive's size, SHA-256 and launches."""
    bundle, into = Path(bundle), Path(into)
    rows = bundle_rows(bundle)
    by_package: dict[str, list[dict]] = {}
    for r in rows:
        by_package.setdefault(r["package"], []).append(r)
    size = {p: sum(f.stat().st_size for f in (bundle / "kernels" / p).iterdir()) for p in by_package}
    budget = max_mib * 2**20 * ratio
    if sum(size.values()) <= budget:
        whole = packed(bundle, into / f"{bundle.name}.tar.xz")
        if whole.stat().st_size <= OVERSIZE * max_mib * 2**20 or len(by_package) < 2:
            return _listed(bundle, into, [(whole, rows)])
        whole.unlink()
        budget = sum(size.values()) / 2
    groups, current, total = [], [], 0
    for p in by_package:
        if current and total + size[p] > budget:
            groups.append(current)
            current, total = [], 0
        current.append(p)
        total += size[p]
    groups.append(current)
    staging = into / ".staging"
    done: list[tuple[Path, list[dict]]] = []
    while groups:
        group = groups.pop(0)
        mine = [r for p in group for r in by_package[p]]
        archive = _packed_part(bundle, staging, f"{bundle.name}-part{len(done) + 1}", group, mine)
        if archive.stat().st_size > OVERSIZE * max_mib * 2**20 and len(group) > 1:
            archive.unlink()  # xz did worse on these kernels than guessed: in two, each packed again
            groups[:0] = [group[:len(group) // 2], group[len(group) // 2:]]
            continue
        done.append((archive, mine))
    named = []
    for i, (archive, mine) in enumerate(done, 1):
        named.append((archive.replace(into / f"{bundle.name}-{i}of{len(done)}.tar.xz"), mine))
    shutil.rmtree(staging, ignore_errors=True)
    return _listed(bundle, into, named)


# a part may come out this much over max_mib before it is split (the guess of xz's ratio is rough)
OVERSIZE = 1.25


def _packed_part(bundle: Path, staging: Path, name: str, group: list[str], mine: list[dict]) -> Path:
    """One part of `bundle`, a bundle of its own (`group`'s packages, their matrices and `mine`, their
    rows), packed into `staging` as `<name>.tar.xz`."""
    import pyarrow.parquet as pq

    part = staging / name
    shutil.rmtree(part, ignore_errors=True)
    (part / "a").mkdir(parents=True)
    (part / "kernels").mkdir()
    for p in group:
        shutil.copytree(bundle / "kernels" / p, part / "kernels" / p)
    for matrix in {r["matrix"] for r in mine}:
        if (bundle / "a" / f"{matrix}.parquet").exists():
            shutil.copyfile(bundle / "a" / f"{matrix}.parquet", part / "a" / f"{matrix}.parquet")
    pq.write_table(rows_table(mine), part / "launches.parquet")
    facts = bundle_facts(bundle) | {"part": name, "launches": len(mine), "kernels": len(group)}
    (part / "bundle.json").write_text(json.dumps(facts, indent=1))
    archive = packed(part, staging / f"{name}.tar.xz")
    shutil.rmtree(part)
    return archive


def _listed(bundle: Path, into: Path, archives: list[tuple[Path, list[dict]]]) -> list[Path]:
    """Writes `<name>.parts.json`: each archive's size, SHA-256 and launches (id and kernel), so that a
    step carried part by part over several calls knows when it has measured them all."""
    listing = {"bundle": bundle.name, "inputs": bundle_facts(bundle).get("inputs", ""),
               "parts": [{"file": a.name, "bytes": a.stat().st_size, "sha256": file_sha256(a),
                          "launches": [list(measured_key(r)) for r in mine]} for a, mine in archives]}
    (into / f"{bundle.name}.parts.json").write_text(json.dumps(listing, indent=1))
    return [a for a, _ in archives]


def archives_of(name: str, carry: Path) -> list[Path]:
    """The archives packed of the bundle `name` in `carry`: `<name>.tar.xz` and `<name>-<i>of<n>.tar.xz`,
    not another bundle's whose name begins with it (`nm` and `nm-spmm`, `sample-0.9` and
    `sample-0.9-h200`: a glob of `<name>*` once deleted nm-spmm's archive when nm was packed)."""
    import re

    pattern = re.compile(rf"{re.escape(name)}(-\d+of\d+)?\.tar\.xz")
    return sorted(f for f in Path(carry).glob("*.tar.xz") if pattern.fullmatch(f.name))


def verified_parts(listing: Path, carried: bool = False) -> list[Path]:
    """The archives a `<name>.parts.json` lists, each checked against its SHA-256; ValueError naming
    the first one missing or altered. `carried`: the ones there (a device call may carry some parts of
    a bundle too large for one call; each part is a bundle of its own), a missing one skipped."""
    facts = json.loads(Path(listing).read_text())
    out = []
    for part in facts["parts"]:
        archive = Path(listing).parent / part["file"]
        if not archive.is_file() and carried:
            continue
        if not archive.is_file():
            raise ValueError(f"{archive}: missing (listed in {listing.name})")
        if file_sha256(archive) != part["sha256"]:
            raise ValueError(f"{archive}: its SHA-256 is not the one {listing.name} lists (damaged or replaced)")
        out.append(archive)
    return out


def opened(bundle: Path, into: Path = Path("/tmp/lospmm-bundles")) -> Path:
    """A bundle folder, or the folder a .tar.xz bundle unpacks to under `into`."""
    bundle = Path(bundle)
    if bundle.is_dir():
        return bundle
    with tarfile.open(bundle, "r:xz") as tar:
        tar.extractall(into, filter="data")
        top = {Path(name).parts[0] for name in tar.getnames()}
    if len(top) != 1:
        raise ValueError(f"{bundle}: not one bundle folder inside ({sorted(top)})")
    return Path(into) / top.pop()
