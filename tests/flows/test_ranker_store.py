"""Ranker model files: the shipped model and its version, save/load round trips, and the errors that name the file."""

from __future__ import annotations

import hashlib
import json
import re
import stat

import lightgbm
import numpy as np
import pytest

from lospmm.flows.storage.ranker_store import SHIPPED, RankerError, load_ranker, ranker_metadata, save_ranker

_FEATURES = ["a", "b", "c"]


def _tiny_ranker(seed=0):
    rng = np.random.default_rng(seed)
    groups = [8, 6, 10, 7]
    x = rng.random((sum(groups), len(_FEATURES)))
    y = rng.integers(0, 4, sum(groups))
    ranker = lightgbm.LGBMRanker(n_estimators=5, num_leaves=4, min_child_samples=2, verbose=-1, random_state=seed)
    ranker.fit(x, y, group=groups, feature_name=_FEATURES)
    return ranker.booster_, x


def test_the_shipped_model_loads_and_its_version_is_the_hash_of_its_text():
    booster, meta = load_ranker()
    text = SHIPPED.with_suffix(".txt").read_bytes()
    assert meta["version"] == ranker_metadata()["version"] == hashlib.sha256(text).hexdigest()[:12]
    assert booster.num_trees() > 0
    assert booster.num_feature() == len(meta["features"])  # the features rank.py feeds it


def test_save_writes_both_files_and_they_round_trip(tmp_path):
    booster, x = _tiny_ranker()
    meta = save_ranker(tmp_path / "sub" / "model", booster, {"timer": "model", "samples": 31, "features": _FEATURES})
    txt, js = tmp_path / "sub" / "model.txt", tmp_path / "sub" / "model.json"
    assert sorted(p.name for p in txt.parent.iterdir()) == ["model.json", "model.txt"]  # no temp files left over
    assert all(stat.S_IMODE(p.stat().st_mode) == 0o644 for p in (txt, js))  # mkstemp's 0600 would hide it
    assert meta == {"timer": "model", "samples": 31, "features": _FEATURES,
                    "version": hashlib.sha256(txt.read_bytes()).hexdigest()[:12]}
    assert json.loads(js.read_text()) == meta == ranker_metadata(tmp_path / "sub" / "model")
    # any of base, base.txt, base.json names the same model
    for base in ("model", "model.txt", "model.json"):
        loaded, loaded_meta = load_ranker(tmp_path / "sub" / base)
        assert loaded_meta == meta
        np.testing.assert_allclose(loaded.predict(x), booster.predict(x))


def test_saving_again_replaces_the_model_and_its_version(tmp_path):
    first = save_ranker(tmp_path / "m", _tiny_ranker(0)[0], {})
    second = save_ranker(tmp_path / "m", _tiny_ranker(1)[0], {})
    assert first["version"] != second["version"]
    assert load_ranker(tmp_path / "m")[1]["version"] == second["version"]


def test_unserialisable_metadata_leaves_the_previous_model_alone(tmp_path):
    booster, _ = _tiny_ranker()
    before = save_ranker(tmp_path / "m", booster, {})
    with pytest.raises(TypeError):
        save_ranker(tmp_path / "m", _tiny_ranker(1)[0], {"bad": object()})
    assert load_ranker(tmp_path / "m")[1] == before  # the .txt was not replaced before the .json failed
    assert sorted(p.name for p in tmp_path.iterdir()) == ["m.json", "m.txt"]


@pytest.mark.parametrize("missing", ["m.txt", "m.json"])
def test_a_missing_model_is_named(tmp_path, missing):
    save_ranker(tmp_path / "m", _tiny_ranker()[0], {})
    (tmp_path / missing).unlink()
    with pytest.raises(RankerError, match=re.escape(str(tmp_path / missing)) + ".* not found"):
        load_ranker(tmp_path / "m")


def test_missing_or_garbage_metadata_is_named(tmp_path):
    with pytest.raises(RankerError, match=re.escape(str(tmp_path / "none.json"))):
        ranker_metadata(tmp_path / "none")
    (tmp_path / "bad.json").write_text("{not json")
    with pytest.raises(RankerError, match=re.escape(str(tmp_path / "bad.json")) + ": unreadable metadata"):
        ranker_metadata(tmp_path / "bad")


def test_a_garbage_model_is_named(tmp_path):
    save_ranker(tmp_path / "m", _tiny_ranker()[0], {})
    (tmp_path / "m.txt").write_text("this is not a LightGBM model\n")
    with pytest.raises(RankerError, match=re.escape(str(tmp_path / "m.txt")) + ": not a LightGBM text model"):
        load_ranker(tmp_path / "m")
    good = _tiny_ranker()[0].model_to_string()
    (tmp_path / "m.txt").write_text(good[: len(good) // 3])  # a model cut short (LightGBM crashed on it)
    with pytest.raises(RankerError, match=re.escape(str(tmp_path / "m.txt")) + ": a LightGBM model cut short"):
        load_ranker(tmp_path / "m")


def test_metadata_listing_other_features_is_refused(tmp_path):
    save_ranker(tmp_path / "m", _tiny_ranker()[0], {"features": ["a", "b", "c", "d"]})
    with pytest.raises(RankerError, match="expects 3 features, metadata lists 4"):
        load_ranker(tmp_path / "m")
    # other names but the same count pass: a model trained on unnamed columns is still usable
    save_ranker(tmp_path / "m", _tiny_ranker()[0], {"features": ["x", "y", "z"]})
    assert load_ranker(tmp_path / "m")[0].num_feature() == 3
