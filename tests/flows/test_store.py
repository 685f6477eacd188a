import importlib
import sys

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from lospmm.flows.storage.store import (
    ArtifactError, artifact_key, artifact_path, module_closure, module_closure_hash, read_artifact, valid_sidecar,
    write_artifact,
)


def _table():
    return pa.table({"x": [1, 2, 3], "y": ["a", "b", "c"]})


def test_key_depends_on_stage_version_params_and_inputs():
    base = artifact_key("prune", "v1", {"sparsity": 0.9}, ["in1"])
    assert base == artifact_key("prune", "v1", {"sparsity": 0.9}, ["in1"])
    for other in (artifact_key("reorder", "v1", {"sparsity": 0.9}, ["in1"]),
                  artifact_key("prune", "v2", {"sparsity": 0.9}, ["in1"]),
                  artifact_key("prune", "v1", {"sparsity": 0.8}, ["in1"]),
                  artifact_key("prune", "v1", {"sparsity": 0.9}, ["in2"])):
        assert other != base


def test_the_closure_follows_every_kind_of_import_and_skips_what_it_is_told(tmp_path, monkeypatch):
    pkg = tmp_path / "tmpdeps"
    pkg.mkdir()
    (pkg / "__init__.py").write_text("")
    for name in ("a", "b", "c", "d", "noise"):
        (pkg / f"{name}.py").write_text(f"X = '{name}'\n")
    (pkg / "top.py").write_text("from tmpdeps import a\nimport tmpdeps.b\nfrom .c import X\n\n"
                                "def f():\n    from tmpdeps.d import X\n    return X\n")
    (pkg / "d.py").write_text("from tmpdeps import noise\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    found = set(module_closure("tmpdeps.top", prefix="tmpdeps"))
    assert found == {"tmpdeps", "tmpdeps.top", "tmpdeps.a", "tmpdeps.b", "tmpdeps.c", "tmpdeps.d", "tmpdeps.noise"}
    skipped = set(module_closure("tmpdeps.top", prefix="tmpdeps", skip=("tmpdeps.d",)))
    assert skipped == found - {"tmpdeps.d", "tmpdeps.noise"}


def test_editing_a_helper_module_changes_the_stage_version(tmp_path, monkeypatch):
    pkg = tmp_path / "tmpstages"
    pkg.mkdir()
    (pkg / "__init__.py").write_text("")
    (pkg / "helper.py").write_text("def f():\n    return 1\n")
    (pkg / "stage.py").write_text("from tmpstages.helper import f\n\ndef out():\n    return f()\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    before = module_closure_hash("tmpstages.stage", prefix="tmpstages")
    (pkg / "helper.py").write_text("def f():\n    return 2\n")
    for mod in ("tmpstages.helper", "tmpstages.stage"):
        sys.modules.pop(mod, None)
    importlib.invalidate_caches()
    module_closure_hash.cache_clear()
    assert module_closure_hash("tmpstages.stage", prefix="tmpstages") != before


def test_editing_only_comments_docstrings_or_layout_keeps_the_version(tmp_path, monkeypatch):
    # what only a reader sees is not code: every cached artifact and prepared GPU bundle stays valid
    pkg = tmp_path / "tmpdocs"
    pkg.mkdir()
    (pkg / "__init__.py").write_text("")
    stage = pkg / "stage.py"
    stage.write_text('"""A stage."""\n\ndef out(x):\n    """Twice x."""\n    return 2 * x\n')
    monkeypatch.syspath_prepend(str(tmp_path))

    def version(text: str) -> str:
        stage.write_text(text)
        module_closure_hash.cache_clear()
        return module_closure_hash("tmpdocs.stage", prefix="tmpdocs")

    before = version(stage.read_text())
    assert version('"""A stage, said better."""\n# why it doubles\n\n\ndef out(x):\n'
                   '    """x, doubled."""\n    "a string as a comment"\n    return 2*x  # doubled\n') == before
    assert version('def out(x):\n    return 3 * x\n') != before
    assert version('def out(x):\n    return 2 * x\n\nNAME = "a string that is data"\n') != before


def test_write_then_read_round_trips_and_leaves_no_temp_files(tmp_path):
    path = artifact_path(tmp_path, "prune", "m-s0.9", "ab" * 32)
    side = write_artifact(path, _table(), {"stage": "prune", "key": "k"})
    assert side["rows"] == 3 and valid_sidecar(path)["sha256"] == side["sha256"]
    assert read_artifact(path).to_pylist() == _table().to_pylist()
    assert pq.read_table(path).num_rows == 3  # plain pyarrow opens it
    assert sorted(p.name for p in path.parent.iterdir()) == [path.with_suffix(".json").name, path.name]


def test_truncated_or_missing_artifacts_are_detected(tmp_path):
    path = tmp_path / "01_shapes" / "a.parquet"
    write_artifact(path, _table(), {"stage": "extract"})
    data = path.read_bytes()
    path.write_bytes(data[: len(data) // 2])
    assert valid_sidecar(path) is None
    with pytest.raises(ArtifactError, match="a.parquet") as raised:
        read_artifact(path)
    # the error carries the file and what is wrong with it (the CLI's and lospmm.torch's hints read them)
    assert raised.value.path == path and raised.value.reason == "a.parquet does not match its checksum (truncated or edited)"
    path.write_bytes(data[:-1] + bytes([data[-1] ^ 1]))  # same size, one bit flipped
    assert valid_sidecar(path) is None
    path.with_suffix(".json").write_text("[1, 2]", encoding="utf-8")  # a sidecar lospmm did not write
    with pytest.raises(ArtifactError, match="is not one lospmm wrote"):
        read_artifact(path)
    path.unlink()
    assert valid_sidecar(path) is None
    with pytest.raises(ArtifactError, match="a.parquet is missing") as raised:
        read_artifact(path)
    assert raised.value.path == path


def test_failed_write_keeps_the_previous_artifact(tmp_path):
    path = tmp_path / "01_shapes" / "a.parquet"
    write_artifact(path, _table(), {"stage": "extract"})

    with pytest.raises(Exception):
        write_artifact(path, "not a table", {"stage": "extract"})  # type: ignore[arg-type]
    assert valid_sidecar(path) is not None
    assert [p.name for p in path.parent.iterdir() if p.name.endswith(".tmp")] == []


def test_code_versions_do_not_depend_on_the_locale():
    """Module sources are read as UTF-8 even where the locale says ASCII (docstrings hold `§`, `·`)."""
    import os
    import subprocess
    import sys

    env = {**os.environ, "LC_ALL": "C", "LANG": "C", "PYTHONCOERCECLOCALE": "0", "PYTHONUTF8": "0"}
    code = ("import locale; from lospmm.flows.dag import stage_version; "
            "print(locale.getpreferredencoding(False), stage_version('reorder'))")
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr[-2000:]
    encoding, version = out.stdout.split()
    from lospmm.flows.dag import stage_version

    assert encoding.upper() in ("ANSI_X3.4-1968", "ASCII", "US-ASCII") and version == stage_version("reorder")


def test_a_bundles_code_version_is_known_on_a_machine_without_prefect():
    # the device program hashes a bundle's code (benchmarks.bundle.inputs_hash) on the GPU machine, whose
    # image has no Prefect: reading the sources must not import the flow's stack (it did, and failed there)
    import subprocess
    import sys

    from benchmarks.bundle import inputs_hash

    probe = ("import sys; sys.modules['prefect'] = None; sys.modules['prefect_dask'] = None\n"
             "from benchmarks.bundle import inputs_hash\n"
             "print(inputs_hash('ab', {}))\n"
             "assert 'lospmm.flows.execution.taskio' not in sys.modules")
    out = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.strip() == inputs_hash("ab", {})


def test_a_lock_waited_on_a_while_says_who_holds_it(tmp_path):
    # a second run on the same artifacts seemed to hang: its wait now names the holder, once
    import threading

    from lospmm.flows.storage.store import lock_holder, locked

    path = tmp_path / "artifact.parquet"
    held, release, said = threading.Event(), threading.Event(), []

    def holder():
        with locked(path):
            held.set()
            release.wait(10)

    t = threading.Thread(target=holder, name="the-holder")
    t.start()
    held.wait(10)
    lines = lock_holder(tmp_path / ".artifact.parquet.lock")
    assert f"pid {__import__('os').getpid()}" in lines and "the-holder" in lines
    timer = threading.Timer(0.5, release.set)
    timer.start()
    with locked(path, poll_s=0.02, waiting=said.append, note_after_s=0.1):
        pass
    t.join()
    assert len(said) == 1 and "waiting for artifact.parquet" in said[0] and "the-holder" in said[0]
    with locked(path, waiting=said.append, note_after_s=0.0):  # free: taken at once, nothing said
        pass
    assert len(said) == 1
