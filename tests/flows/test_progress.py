from lospmm.flows import progress


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
