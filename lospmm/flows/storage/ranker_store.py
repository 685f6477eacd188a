"""Ranker model files: a LightGBM text model plus JSON metadata (timer, device, sample count,
held-out NDCG), written atomically. A model ships with the package so `run` works out of the box."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

from lospmm.files import atomic_write

SHIPPED = Path(__file__).resolve().parents[2] / "models" / "ranker"  # lospmm/models/ranker.{txt,json}
# the half designs' (fp16/bf16: one packed pair per thread): trained on their own candidates and estimate
SHIPPED_HALF = SHIPPED.with_name("ranker-half")
# `--design auto`'s: the fp32 tiles of every design of kernel.choices.DESIGN_CANDIDATES ranked together
SHIPPED_DESIGNS = SHIPPED.with_name("ranker-designs")


def shipped_ranker(half: bool = False) -> Path:
    """The model a run uses unless told: the fp32 kernels' or the half kernels'."""
    return SHIPPED_HALF if half else SHIPPED


class RankerError(RuntimeError):
    """A ranker model file is missing or unreadable; the message names the file."""


def ranker_files(base: Path) -> tuple[Path, Path]:
    """(model .txt, metadata .json) of a ranker named with or without either suffix."""
    base = Path(base)
    if base.suffix in (".txt", ".json"):
        base = base.with_suffix("")
    return base.with_suffix(".txt"), base.with_suffix(".json")


def save_ranker(base: Path, booster, metadata: dict) -> dict:
    """Write `base`.txt (model) and `base`.json (metadata + version = hash of the model text)."""
    model_path, meta_path = ranker_files(base)
    model_path.parent.mkdir(parents=True, exist_ok=True)
    text = booster.model_to_string()
    meta = {**metadata, "version": hashlib.sha256(text.encode()).hexdigest()[:12]}
    for path, content in ((model_path, text), (meta_path, json.dumps(meta, indent=2, sort_keys=True) + "\n")):
        atomic_write(path, lambda tmp, content=content: Path(tmp).write_text(content, encoding="utf-8"))
    return meta


def ranker_metadata(base: Path | None = None) -> dict:
    """The JSON metadata of a model (default: the shipped one) without loading the model itself."""
    _, meta_path = ranker_files(Path(base) if base else SHIPPED)
    try:
        return json.loads(meta_path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise RankerError(f"ranker model {meta_path} not found (train one with `lospmm train-ranker`)") from None
    except ValueError as e:
        raise RankerError(f"ranker model {meta_path}: unreadable metadata ({e})") from None


def checked_ranker(base: Path | None = None) -> tuple[str, dict]:
    """(model text, metadata) of `base` (default: the shipped model), checked without LightGBM (a run
    validates its ranker this way before it knows whether anything is left to rank): the metadata
    names a version, the model is a whole LightGBM text model, its features agree with the
    metadata. RankerError names the file at fault: the metadata (.json) or the model (.txt)."""
    model_path, meta_path = ranker_files(Path(base) if base else SHIPPED)
    meta = ranker_metadata(meta_path)
    if not isinstance(meta, dict) or not isinstance(meta.get("version"), str):
        raise RankerError(f"ranker model {meta_path}: its metadata has no version (not written by "
                          f"`lospmm train-ranker`)")
    try:
        text = model_path.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise RankerError(f"ranker model {model_path} not found (train one with `lospmm train-ranker`)") from None
    except (OSError, ValueError) as e:
        raise RankerError(f"ranker model {model_path}: unreadable ({type(e).__name__}: {e})") from None
    # LightGBM's text models begin and end so; it reports anything else on stderr, and a model cut
    # short can crash the process (a segmentation fault, seen with a third of a model)
    if not text.startswith("tree\n"):
        raise RankerError(f"ranker model {model_path}: not a LightGBM text model")
    if "\nend of trees\n" not in text:
        raise RankerError(f"ranker model {model_path}: a LightGBM model cut short (no 'end of trees')")
    header = dict(line.split("=", 1) for line in text[:text.find("\nTree=")].splitlines() if "=" in line)
    try:
        count = int(header["max_feature_idx"]) + 1
    except (KeyError, ValueError):
        raise RankerError(f"ranker model {model_path}: its header has no max_feature_idx") from None
    names = header.get("feature_names", "").split()
    if meta.get("features") and list(meta["features"]) != names and len(meta["features"]) != count:
        raise RankerError(f"ranker model {model_path}: expects {count} features, metadata lists {len(meta['features'])}")
    return text, meta


def load_ranker(base: Path | None = None):
    """(booster, metadata) from `base` (default: the shipped model), checked_ranker's checks first."""
    import lightgbm

    text, meta = checked_ranker(base)
    try:
        booster = lightgbm.Booster(model_str=text)
    except Exception as e:
        model_path, _ = ranker_files(Path(base) if base else SHIPPED)
        raise RankerError(f"ranker model {model_path}: unreadable ({type(e).__name__}: {e})") from None
    return booster, meta
