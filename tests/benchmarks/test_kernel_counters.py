"""benchmarks/kernel_counters.py without a GPU or ncu: ncu's CSV in both layouts, the command line
each profile call builds, a failing kernel as a row, an unknown metric dropped and retried, the
summary's stall shares, and a missing ncu as one line and exit 2."""

from __future__ import annotations

import json
import math
import stat
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from benchmarks import kernel_counters as kc



HEADER = ('"ID","Process ID","Process Name","Host Name","Kernel Name","Context","Stream","Block Size","Grid Size",'
          '"Device","CC","Section Name","Metric Name","Metric Unit","Metric Value"')


def _details(kernel: str, metrics: list[tuple[str, str, str]], launch: int = 0) -> str:
    """ncu --csv --page details rows for one launch, as ncu 2023+ prints them."""
    return "\n".join(f'"{launch}","4242","python3","127.0.0.1","{kernel}","1","7","(128, 1, 1)","(96, 2, 1)","0",'
                     f'"9.0","Command line profiler metrics","{name}","{unit}","{value}"' for name, unit, value in metrics)


def _stall(reason: str) -> str:
    return kc.STALL_METRIC.format(reason)


GOOD_METRICS = [
    (kc.INST_EXECUTED, "inst", "1,234,567"),
    (kc.ISSUE_ACTIVE, "%", "21.5"),
    (kc.ACHIEVED_OCCUPANCY, "%", "40"),
    (kc.GRID_SIZE, "block", "192"),
    (kc.BLOCK_SIZE, "thread", "128"),
    (_stall("no_instruction"), "", "6"),
    (_stall("branch_resolving"), "", "1"),
    (_stall("long_scoreboard"), "", "2"),
    (_stall("wait"), "", "1"),
    (_stall("selected"), "", "1"),
    (kc.GCC_INSTRUCTION_REQUESTS, "", "1,000"),
    (kc.GCC_INSTRUCTION_MISSES, "", "250"),
    ("dram__throughput.avg.pct_of_peak_sustained_elapsed", "", "n/a"),
]


def test_details_csv_with_prof_lines_rules_and_thousands_separators():
    text = "\n".join([
        '==PROF== Connected to process 4242 (/usr/bin/python3)',
        'k1: lospmm_full_kernel launched 3x',  # the program's own line before the table
        '==PROF== Profiling "lospmm_full": 0%....50%....100% - 12 passes',
        HEADER + ',"Rule Name","Rule Type","Rule Description","Estimated Speedup Type","Estimated Speedup"',
        '"0","4242","python3","127.0.0.1","lospmm_full","1","7","(128, 1, 1)","(96, 2, 1)","0","9.0",'
        '"Warp State Statistics","","","","CPIStall","WRN","On average each warp ...","local","12.5"',
        '"0","4242","python3","127.0.0.1","lospmm_full","1","7","(128, 1, 1)","(96, 2, 1)","0","9.0",'
        '"Command line profiler metrics","smsp__inst_executed.sum","inst","1,234,567","","","","",""',
        '"0","4242","python3","127.0.0.1","lospmm_full","1","7","(128, 1, 1)","(96, 2, 1)","0","9.0",'
        '"Command line profiler metrics","dram__throughput.avg.pct_of_peak_sustained_elapsed","","n/a","","","","",""',
        '==PROF== Disconnected from process 4242',
    ])
    rows = kc.parse_ncu_csv(text)
    assert [r["metric"] for r in rows] == ["smsp__inst_executed.sum", "dram__throughput.avg.pct_of_peak_sustained_elapsed"]
    assert rows[0] == {"launch": 0, "kernel": "lospmm_full", "metric": "smsp__inst_executed.sum", "unit": "inst",
                       "value": 1234567.0, "text": "1,234,567"}
    assert math.isnan(rows[1]["value"]) and rows[1]["text"] == "n/a"


def test_raw_csv_one_column_per_metric_units_below_the_header():
    text = "\n".join([
        '"ID","Process ID","Process Name","Host Name","Kernel Name","Context","Stream","Block Size","Grid Size",'
        '"Device","CC","launch__grid_size","smsp__inst_executed.sum","sm__warps_active.avg.pct_of_peak_sustained_active"',
        '==WARNING== Found outstanding GPU clock reset, trying to revert...',  # ncu's lines come anywhere
        '"","","","","","","","","","","","block","inst","%"',
        '"0","4242","python3","127.0.0.1","lospmm_full","1","7","(128, 1, 1)","(96, 2, 1)","0","9.0","192",'
        '"2,469,134","38.5"',
    ])
    rows = kc.parse_ncu_csv(text)
    assert {r["metric"]: (r["unit"], r["value"]) for r in rows} == {
        "launch__grid_size": ("block", 192.0), "smsp__inst_executed.sum": ("inst", 2469134.0),
        "sm__warps_active.avg.pct_of_peak_sustained_active": ("%", 38.5)}
    assert {r["launch"] for r in rows} == {0}


def test_no_table_is_no_rows():
    assert kc.parse_ncu_csv("==PROF== Connected to process 1\n==WARNING== No kernels were profiled.\n") == []


ROW = {"id": "k7", "kernel": "lospmm_bert_fc1_m8", "launch": json.dumps({"row_blocks": 12, "threads": 128}),
       "m": 96, "k": 64, "n": 200, "set": "ab", "instructions": 900}


def _after(cmd: list[str], flag: str) -> str:
    return cmd[cmd.index(flag) + 1]


def test_metrics_command_profiles_the_second_launch_of_exactly_this_kernel():
    cmd = kc.ncu_command("/opt/ncu", Path("/b"), ROW, kc.ProfileOptions(), python="/py")
    assert cmd[0] == "/opt/ncu" and "--csv" in cmd
    assert _after(cmd, "--kernel-name") == "lospmm_bert_fc1_m8" and _after(cmd, "--kernel-name-base") == "mangled"
    assert (_after(cmd, "--launch-skip"), _after(cmd, "--launch-count")) == ("1", "1")
    assert _after(cmd, "--clock-control") == "none" and _after(cmd, "--cache-control") == "all"
    assert _after(cmd, "--page") == "details" and _after(cmd, "--print-units") == "base"
    assert _after(cmd, "--metrics").split(",") == list(kc.DEFAULT_METRICS)
    assert "smsp__average_warps_issue_stalled_no_instruction_per_issue_active.ratio" in kc.DEFAULT_METRICS
    assert "--section" not in cmd
    assert cmd[cmd.index("/py"):] == ["/py", "-m", "benchmarks.kernel_counters", "launch", str(Path("/b").resolve()), "k7",
                                      "--repeats", "3"]


def test_sections_command_reads_the_raw_page_and_adds_only_the_icache_metrics():
    cmd = kc.ncu_command("ncu", Path("/b"), ROW, kc.ProfileOptions(collect="sections", n=512), python="/py")
    assert [cmd[i + 1] for i, c in enumerate(cmd) if c == "--section"] == list(kc.DEFAULT_SECTIONS)
    assert _after(cmd, "--page") == "raw"
    assert _after(cmd, "--metrics").split(",") == list(kc.ICACHE_METRICS)
    assert cmd[-2:] == ["--n", "512"]


def test_options_refuse_a_launch_the_process_never_makes():
    assert kc.ProfileOptions().problem() == ""
    assert "--repeats" in kc.ProfileOptions(repeats=1).problem()
    assert kc.ProfileOptions(collect="everything").problem()


def _ok_output(kernel: str) -> str:
    return "==PROF== Connected\n" + HEADER + "\n" + _details(kernel, GOOD_METRICS) + "\n"


def test_a_failing_kernel_is_a_row_with_one_line_and_the_loop_goes_on():
    calls = []

    def fake_run(cmd, timeout_s):
        calls.append(cmd)
        kernel = _after(list(cmd), "--kernel-name")
        if kernel == "bad":
            return kc.Ran(1, "==PROF== Connected to process 9\n",
                          "==ERROR== Failed to initialize the profiler: LibraryNotLoaded\nmore text\n")
        return kc.Ran(0, _ok_output(kernel), "")

    profiler = kc.Profiler("ncu", Path("/b"), run=fake_run)
    bad = profiler.profile(ROW | {"id": "k1", "kernel": "bad"})
    good = profiler.profile(ROW | {"id": "k2", "kernel": "good"})
    assert [(r["id"], r["status"], r["message"]) for r in bad] == [
        ("k1", "error", "==ERROR== Failed to initialize the profiler: LibraryNotLoaded")]
    assert {r["status"] for r in good} == {"ok"} and len(good) == len(GOOD_METRICS)
    assert len(calls) == 2


def test_no_profiled_launch_is_a_row_naming_ncus_warning():
    ran = kc.Ran(0, "==PROF== Connected to process 9\n==WARNING== No kernels were profiled.\n",
                 "k7: lospmm_bert_fc1_m8 launched 3x, grid (12, 2, 1), block 128, N 200\n")
    (row,) = kc.Profiler("ncu", Path("/b"), run=lambda cmd, t: ran).profile(ROW)
    assert row["status"] == "error"
    assert row["message"] == "ncu profiled no launch of lospmm_bert_fc1_m8: ==WARNING== No kernels were profiled."


def test_a_kernel_past_its_time_limit_is_a_row():
    profiler = kc.Profiler("ncu", Path("/b"), kc.ProfileOptions(timeout_s=7), run=lambda cmd, t: kc.Ran(None, "", ""))
    (row,) = profiler.profile(ROW)
    assert row["status"] == "error" and "7 s" in row["message"]


def test_an_unknown_metric_is_dropped_reported_and_not_asked_for_again():
    calls = []

    def fake_run(cmd, timeout_s):
        asked = _after(list(cmd), "--metrics").split(",")
        calls.append(asked)
        if kc.ICC_HIT_RATE in asked:
            return kc.Ran(1, "==ERROR== Failed to find metric regex:^sm__icc_request_hit_rate\\.(sum|avg|pct)$\n", "")
        return kc.Ran(0, _ok_output("k"), "")

    profiler = kc.Profiler("ncu", Path("/b"), run=fake_run)
    first = profiler.profile(ROW)
    assert [(r["metric"], r["status"]) for r in first if r["status"] != "ok"] == [(kc.ICC_HIT_RATE, "skipped")]
    assert any(r["status"] == "ok" for r in first)
    profiler.profile(ROW | {"id": "k8"})
    assert [kc.ICC_HIT_RATE in asked for asked in calls] == [True, False, False]


def test_ncu_refusing_metrics_without_end_is_a_row_not_a_hang():
    def fake_run(cmd, timeout_s):  # names a new unknown metric every time
        asked = _after(list(cmd), "--metrics").split(",")
        return kc.Ran(1, f"==ERROR== Failed to find metric regex:^{asked[0].split('.')[0]}\\.(sum)$\n", "")

    rows = kc.Profiler("ncu", Path("/b"), max_attempts=3, run=fake_run).profile(ROW)
    assert [r["status"] for r in rows] == ["skipped"] * 3 + ["error"]


def test_summary_splits_stalls_into_fetch_and_data():
    counters = [kc._row("k7", "k", "ok", metric=m, value=kc.numeric(v)) for m, _, v in GOOD_METRICS]
    counters.append(kc._row("k9", "k", "error", "==ERROR== boom"))
    ok, failed = kc.summary_rows(counters, [ROW])
    # stalls excluding `selected`: no_instruction 6, branch_resolving 1, long_scoreboard 2, wait 1 = 10
    assert ok["fetch_stall_pct"] == pytest.approx(70.0) and ok["data_stall_pct"] == pytest.approx(20.0)
    assert ok["top_stalls"].startswith("no_instruction 6.00 (60%), long_scoreboard 2.00 (20%)")
    assert ok["inst_per_warp"] == pytest.approx(1234567 / (192 * 4))
    assert ok["gcc_instruction_miss_pct"] == pytest.approx(25.0) and ok["sass_instructions"] == 900
    assert failed == {"id": "k9", "status": "error", "message": "==ERROR== boom"}


def test_query_metrics_check_knows_launch_attributes_are_unlisted():
    listing = ("Device GH100\n------------------------\nMetric Name    Metric Type   Metric Unit   Metric Description\n"
               "smsp__inst_executed            Counter  inst   # of warp instructions executed\n"
               "smsp__average_warps_issue_stalled_no_instruction_per_issue_active  Ratio  ...\n")
    verdict = dict(kc.metric_check(listing, [kc.INST_EXECUTED, _stall("no_instruction"), _stall("wait"), kc.GRID_SIZE]))
    assert verdict == {kc.INST_EXECUTED: "listed", _stall("no_instruction"): "listed", _stall("wait"): "NOT LISTED",
                       kc.GRID_SIZE: "launch attribute (not listed by --query-metrics)"}


def _bundle(tmp_path: Path, ids=("k1", "k2")) -> Path:
    """A stand-in bundle (benchmarks.bundle's layout): launch rows and a package per kernel whose cubin
    cannot load (no GPU here; a bad cubin there)."""
    from lospmm.files import write_manifest
    from lospmm.kernel.layout import LaunchLayout
    from lospmm.kernel.package import KERNEL_FILES
    from lospmm.kernel.spec import KernelSpec

    bundle = tmp_path / "bundle"
    bundle.mkdir()
    pq.write_table(pa.Table.from_pylist([ROW | {"id": i, "kernel": f"sym_{i}", "package": i, "count": ROW["n"]}
                                         for i in ids]), bundle / "launches.parquet")
    for i in ids:
        pkg = bundle / "kernels" / i
        pkg.mkdir(parents=True)
        (pkg / "kernel.cubin").write_bytes(b"\0" * 16)
        spec = KernelSpec(f"sym_{i}", "gemm", ROW["m"], ROW["k"], 8, LaunchLayout(3, 128), 3, tile_ptr=(0, 8, 16, 24))
        (pkg / "kernel.json").write_text(spec.to_json({}))
        write_manifest(pkg, KERNEL_FILES)
    return bundle


def test_missing_ncu_is_one_line_and_exit_2(tmp_path, capsys, monkeypatch):
    monkeypatch.setattr(kc, "find_ncu", lambda explicit=None: None)
    with pytest.raises(SystemExit) as stopped:
        kc.main(["profile", str(_bundle(tmp_path)), str(tmp_path / "out")])
    assert stopped.value.code == 2
    out = capsys.readouterr().out
    assert out.strip() == kc.NCU_MISSING and len(out.strip().splitlines()) == 1
    assert not (tmp_path / "out").exists()


def test_profile_end_to_end_with_a_stand_in_ncu(tmp_path, capsys):
    """The whole subcommand, with a shell script in ncu's place: the row that fails stays a row,
    counters.parquet and the commands are written."""
    fake = tmp_path / "ncu"
    (tmp_path / "ok.csv").write_text(_ok_output("sym_k2"))
    fake.write_text("#!/bin/sh\n"
                    'case "$*" in *sym_k1*) echo "==ERROR== ERR_NVGPUCTRPERM - no permission" >&2; exit 1;; esac\n'
                    'case "$*" in *sym_k3*) printf "\\377\\376 not text"; exit 0;; esac\n'
                    f'cat "{tmp_path / "ok.csv"}"\n')
    fake.chmod(fake.stat().st_mode | stat.S_IEXEC)
    out = tmp_path / "out"
    kc.main(["profile", str(_bundle(tmp_path, ("k1", "k3", "k2"))), str(out), "--ncu", str(fake), "--timeout-s", "20"])
    rows = pq.read_table(out / "counters.parquet").to_pylist()
    assert [(r["id"], r["status"]) for r in rows if r["status"] != "ok"] == [("k1", "error"), ("k3", "error")]
    assert sum(r["id"] == "k2" and r["status"] == "ok" for r in rows) == len(GOOD_METRICS)
    assert len((out / "ncu-commands.txt").read_text().splitlines()) == 3
    printed = capsys.readouterr().out
    assert "[1/3] k1 sym_k1: error ==ERROR== ERR_NVGPUCTRPERM - no permission" in printed
    assert "[2/3] k3 sym_k3: error UnicodeDecodeError" in printed


def test_launch_says_one_line_and_exits_non_zero(tmp_path, capsys):
    """No bundle or an id it lacks is exit 2; a cubin that cannot load (or no driver, as on CI) is exit 1:
    one line on stderr each, nothing on stdout (where ncu prints its table)."""
    bundle = _bundle(tmp_path)
    for folder, kernel_id, status in ((tmp_path / "no-bundle", "k1", 2), (bundle, "nope", 2), (bundle, "k1", 1)):
        with pytest.raises(SystemExit) as stopped:
            kc.main(["launch", str(folder), kernel_id])
        assert stopped.value.code == status
        captured = capsys.readouterr()
        assert captured.out == "" and len(captured.err.strip().splitlines()) == 1
        assert captured.err.startswith(f"{kernel_id}: ")
