from lospmm.flows.execution import progress


def test_progress_is_the_weighted_share_of_items_done_and_never_goes_back():
    run = "test-progress-run"
    tasks = [("prune", "m-s0.9"), ("compile", "m-s0.9"), ("emit", "m-s0.9")]
    progress.started(run, tasks)
    try:
        total = progress._OTHER_WEIGHT + progress.STAGE_WEIGHTS["compile"] + progress.STAGE_WEIGHTS["emit"]
        assert progress.snapshot(run)[0] == 0.0
        progress.report(run, "prune", "m-s0.9", 1, 1)
        progress.report(run, "compile", "m-s0.9", 3, 4, "fc M1=8")
        percent, latest = progress.snapshot(run)
        expected = 100 * (progress._OTHER_WEIGHT + 0.75 * progress.STAGE_WEIGHTS["compile"]) / total
        assert abs(percent - expected) < 1e-9 and latest == "compile m-s0.9: 3/4 (fc M1=8)"
        progress.report(run, "compile", "m-s0.9", 1, 4)  # a late, smaller count from another thread
        assert abs(progress.snapshot(run)[0] - expected) < 1e-9
        for stage, label in tasks:
            progress.report(run, stage, label, 1, 1)
        assert abs(progress.snapshot(run)[0] - 100.0) < 1e-9
    finally:
        progress.finished(run)
    progress.report(run, "emit", "m-s0.9", 1, 2)  # after the run: ignored, no error
    assert progress.snapshot(run) == (100.0, "")


class _Log:
    def __init__(self):
        self.lines = []

    def info(self, fmt, *args):
        self.lines.append(fmt % args)


def test_publisher_logs_moves_and_a_still_running_line(monkeypatch):
    import prefect.artifacts as pa

    pushed = []
    monkeypatch.setattr(pa, "create_progress_artifact", lambda **kw: "artifact-id")
    monkeypatch.setattr(pa, "update_progress_artifact", lambda artifact_id, progress: pushed.append(progress))
    clock = [1000.0]
    monkeypatch.setattr(progress.time, "monotonic", lambda: clock[0])
    run, log = "test-publisher-run", _Log()
    progress.started(run, [("compile", "m"), ("emit", "m")])
    try:
        pub = progress.Publisher(run, log, every_s=10, quiet_s=60)
        progress.report(run, "compile", "m", 1, 2, "fc M1=8")
        clock[0] += 5
        pub.push()  # moved, but too soon after the start
        assert pushed == [] and log.lines == []
        clock[0] += 5
        pub.push()
        assert len(pushed) == 1 and log.lines[-1].startswith("progress 14% — compile m: 1/2 (fc M1=8)")
        clock[0] += 30
        pub.push()  # nothing moved, not yet quiet for long
        assert len(log.lines) == 1
        clock[0] += 31
        pub.push()
        assert "still running, nothing finished for 61 s" in log.lines[-1] and len(pushed) == 1
        progress.report(run, "compile", "m", 2, 2)
        progress.report(run, "emit", "m", 1, 1)
        pub.push(final=True)
        assert pushed[-1] == 100.0
    finally:
        progress.finished(run)


def test_units_count_before_their_item_finishes_and_only_once():
    run = "test-progress-units"
    progress.started(run, [("emit", "m")])
    try:
        progress.units(run, "emit", "m", "fc", 0, 4, items=2)
        assert progress.snapshot(run)[0] == 0.0
        progress.units(run, "emit", "m", "fc", 3, 4, items=2)
        percent, latest = progress.snapshot(run)
        assert abs(percent - 100 * 3 / 4 / 2) < 1e-9 and latest == "emit m: fc, 3/4 units compiled"
        progress.units(run, "emit", "m", "fc", 4, 4, items=2)
        progress.report(run, "emit", "m", 1, 2, "fc")  # the item is done: its units are not counted again
        assert abs(progress.snapshot(run)[0] - 50.0) < 1e-9
        progress.units(run, "emit", "m", "conv", 2, 2, items=2)
        progress.units(run, "emit", "m", "conv", 2, 2, items=2)  # a repeated report is no extra share
        assert abs(progress.snapshot(run)[0] - 100.0) < 1e-9
    finally:
        progress.finished(run)
