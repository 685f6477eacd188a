"""The device program (issue 30): every figure still owed by a GPU, as ordered steps, most valuable
first. One entry point:

    python -m benchmarks.device status               # from the committed results alone: what is done, where, what is next
    python -m benchmarks.device prepare STEP [--jobs N]   # here, no GPU: build the step's bundles, pack them to carry
    python -m benchmarks.device run STEP [--budget-s S]   # on the GPU machine: one step, resumable
    python -m benchmarks.device next [--budget-s S]       # on the GPU machine: the next steps that fit the time left
    python -m benchmarks.device report [STEP]             # anywhere: a step's tables from its results
    python -m benchmarks.device verdict [--device h100]   # anywhere: every open issue's device target, met or not
    python -m benchmarks.device wheels                    # here: the wheels the GPU image lacks, into .whl/
    python -m benchmarks.device window [--kind h100]      # here: a window's device calls, what each carries and runs

Each step fits one command (STEP_LIMIT_S, 9 minutes on the H100), writes its Parquet and log.txt
under benchmarks/results/<device>/<step>/ as it goes, and can be run again after it was cut off:
it goes on from what it measured (benchmarks.measure's progress files). A step whose launches are
all measured writes done.json; `status` reads those, from any device folder.

A step's bundles (benchmarks.bundle) are built ahead of time on the CPU into ~/.cache/lospmm/bundles
(outside the work tree: a later checkout on this machine finds them) and packed into .gpu/<step>/
to carry (git-ignored, at most 64 MiB a device call), each archive checked by its SHA-256 before it
is unpacked there. A bundle built from other code than today's (its `inputs` hash) is stale: `status`
says so and `prepare` builds it again. `run --build` builds a missing bundle on the GPU machine's
cores instead (quicker there for the big sets).
"""

from __future__ import annotations

import argparse
import json
import math
import os
import shutil
import subprocess
import sys
import time
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Callable

from benchmarks import bundle as bundles
from benchmarks import pack as packing
from benchmarks.measure import ContextLost, Deadline, RunOptions, measured_key, progress, run_bundle
from benchmarks.sets import AB_HELD_OUT_LAYERS, AB_LAYERS
from lospmm.files import atomic_write

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "benchmarks" / "results"
CARRY = ROOT / ".gpu"
STEP_LIMIT_S = 540.0  # one device command is at most 10 minutes; a step leaves a minute for start and copy-back


@dataclass(frozen=True)
class BundleSpec:
    """A bundle a step measures: its name, the kernel set (benchmarks.sets.set_jobs) and its options,
    and how it is run (RunOptions' baselines)."""

    name: str
    set: str
    options: dict = field(default_factory=dict)
    baselines: tuple[str, ...] = ("sgemm", "tf32", "fp16")

    @property
    def inputs(self) -> str:
        return bundles.inputs_hash(self.set, self.options)


@dataclass(frozen=True)
class Step:
    """One step of the program: `name`, what it measures (`title`), the issue it serves, the bundles
    it runs (none for a step with its own runner), its own runner (`runner(step, out, deadline)`),
    the device seconds it needs at most, and what the GPU machine must have besides the checkout."""

    name: str
    title: str
    issue: str
    bundles: tuple[BundleSpec, ...] = ()
    runner: Callable | None = None
    device_seconds: float = STEP_LIMIT_S
    needs: tuple[str, ...] = ()
    device: str = "h100"
    reads: tuple[str, ...] = ()  # steps whose results on the same GPU it reads
    opens: tuple[str, ...] = ()  # bundles of those steps it opens (by name)
    # the launches (ids) it needs of what it opens, from the results of a GPU's folder: only the parts
    # holding them are carried (a profiler of a few kernels of a 7-part bundle)
    picks: Callable[[Path], list[str]] | None = None


# --- the program, most valuable first ----------------------------------------------------------------------

# the headline in the design the A/B chose (issue 30 item 2.4; benchmarks/results/h200/designs/decision.json)
HEADLINE = dict(design="chained", sparsities=(0.7, 0.9, 0.95), batches=(4, 32))
STEPS: tuple[Step, ...] = (
    Step("gate", "correctness gate: pytest -m gpu (every design's inline PTX, half and conv kernels, the "
                 "loader on torch and CuPy, the registered operators)", "30.2.1", runner=lambda *a: _gate(*a),
         device_seconds=300, needs=("wheels",)),
    Step("designs", "design A/B on the A/B layers at 0.9 and the diagnosis micro sweeps: the decision table",
         "20, 30.2.2", (BundleSpec("ab", "ab"), BundleSpec("micro", "micro")), device_seconds=540),
    Step("counters", "hardware counters (ncu) on the best and worst kernels of the A/B", "30.2.3",
         runner=lambda *a: _counters(*a), device_seconds=480, needs=("ncu",), reads=("designs",), opens=("ab",),
         picks=lambda folder: _best_and_worst(folder, ("designs",))),
    # diagnosis before more tables (issue 30 item 3: no design reaches 0.35 per nonzero): the counters
    # found B's loads waiting (long_scoreboard) with one load in flight a thread
    Step("latency", "the latency A/B on the A/B layers at 0.9 in the chosen design: B loaded 4, 8, 16 columns "
                    "ahead with as many more registers, and ptxas -O3 with 16 more, against the flow's kernel",
         "30.3", (BundleSpec("latency", "latency", {}, ("sgemm",)),), device_seconds=300),
    # the diagnosis's other half: B's traffic through L2 binds most work-bound kernels
    Step("staged", "the staged design on the A/B layers at 0.9: B through shared memory 4 and 8 tiles of a warp "
                   "and 4 tiles of 4 warps a block share, against the chained kernel on the same tiles", "30.3, 35",
         (BundleSpec("staged", "staged", {}, ("sgemm",)),), device_seconds=300),
    *(Step(f"headline-{model}", f"the headline table, {model}: every GEMM layer at 0.7/0.9/0.95 (CNN batch 4 and "
                                f"32, BERT 32×128) against SGEMM, TF32, FP16 and cuSPARSE", "20, 30.2.4",
           (BundleSpec(f"headline-{model}", "headline", HEADLINE | {"models": (model,)},
                       ("sgemm", "tf32", "fp16", "cusparse")),), device_seconds=540)
      for model in ("shufflenetv2", "mobilenetv2", "resnet50", "bert-base")),
    # the headline's diagnosis: the retrained ranker's taller tiles raised the multiply-adds per B load,
    # not the share of peak (H200, 2026-11-27: 12% in median where L2 would allow 27%); the estimate
    # names the longest tile's walk, whose loads deeper prefetch barely hid. What do those warps wait on?
    Step("counters-headline", "hardware counters (ncu, with L1, L2 and DRAM throughput) on the headline's largest "
                              "layers at 0.9 (ResNet-50 and BERT-base, batch 32)", "30.3",
         runner=lambda *a: _counters(*a), device_seconds=240, needs=("ncu",),
         reads=("headline-resnet50", "headline-bert-base"), opens=("headline-resnet50", "headline-bert-base"),
         picks=lambda folder: _largest(folder, ("headline-resnet50", "headline-bert-base"))),
    Step("half", "the half set at 0.9 and 0.95 on the A/B layers: every accumulation against cuBLAS FP16/BF16, "
                 "with cuBLAS's error on the same data", "23, 30.2.5",
         (BundleSpec("half", "half", {"layers": AB_LAYERS}),),
         device_seconds=540),
    Step("conv", "implicit-im2col convolutions, baked (v=1 and v=2), streamed and staged, against the GEMM kernel of "
                 "the same A and cuDNN; the N:M conv kernel (fp32, fp16) against the baked one on the same 2:4 weights",
         "13, 22, 34, 35",
         (BundleSpec("conv", "conv", {}, ()),), device_seconds=320),
    Step("serving", "launch overhead of the registered operators, and whole models end to end (fp32, fp16)",
         "22, 30.2.6", runner=lambda *a: _serving(*a), device_seconds=540, needs=("wheels",)),
    *(Step(f"table4-{s:g}", f"Table 4 at {s:g}: proxies, ranker and estimate against every kept candidate of 10 "
                            f"layers per model", "24, 30.2.7",
           (BundleSpec(f"sample-{s:g}", "sample", {"sparsity": s, "per_model": 10, "every_kept": True}, ()),),
           device_seconds=540)
      for s in (0.9, 0.7, 0.95, 0.5)),
    Step("h200-calibration", "on an H200: the estimate's calibration and ranker launches, and a headline subset",
         "30.2.8", (BundleSpec("sample-0.9-h200", "sample", {"sparsity": 0.9, "per_model": 10, "every_kept": True,
                                                              "gpu": "h200"}, ()),
                    BundleSpec("headline-shufflenetv2", "headline", HEADLINE | {"models": ("shufflenetv2",)},
                               ("sgemm", "tf32", "fp16", "cusparse"))), device_seconds=540, device="h200"),
    # the later issues' steps, after issue 30's own (its item 2: "Later issues add their device steps to
    # the same program ..., after these")
    # issue 35's device target on layers the design price never saw (report designs-held-out; python -m
    # benchmarks.design_estimate prices them with the factors fitted on the A/B)
    Step("designs-held-out", "every A/B design on 11 layers outside the A/B at 0.9, each on its measured tile: "
                             "does the design price fitted on the A/B choose within 5% of the best there?", "35",
         (BundleSpec("ab-held-out", "ab", {"layers": AB_HELD_OUT_LAYERS}),), device_seconds=300),
    Step("reorder", "row orders on the A/B layers at 0.9: identity, Algorithm 1 and the order the flow keeps, "
                    "same tile and design: time against Σ nnc", "33",
         (BundleSpec("reorder", "reorder", {}, ("sgemm",)),), device_seconds=240),
    Step("nm", "N:M layers (16/12/8/4 of 32 in vectors of 32 rows, and 2:4; random positions) on the A/B layers: "
               "our baked kernel and our N:M kernel against our kernel on the same layer pruned at random to the "
               "same sparsity, SGEMM, TF32, FP16 and cuSPARSELt 2:4 (fp16, TF32)", "34",
         (BundleSpec("nm", "nm", {}, ("sgemm", "tf32", "fp16", "cusparselt_fp16", "cusparselt_tf32")),),
         device_seconds=540),
    Step("nm-spmm", "NM-SpMM's comparison: 16/12/8/4 of 32 (vectors of 32 rows) on LLaMA-like GEMMs (4096×4096, "
                    "11008×4096, 4096×11008 at 256 and 4096 tokens): our N:M kernel against SGEMM, TF32, FP16 and "
                    "cuSPARSELt 2:4", "34",
         (BundleSpec("nm-spmm", "nm-spmm", {}, ("sgemm", "tf32", "fp16", "cusparselt_fp16", "cusparselt_tf32")),),
         device_seconds=480),
    # what the latency and staged steps found: tiles too short to feed more than one multiply-add a B
    # load, whose walks the latency A/B deepened only on the flow's own short tiles. Last since the
    # H200 measured it (2026-11-27): deep prefetch's tiles 1.08-1.11x the flow's kernel, no gain to
    # look for first on the H100
    Step("prefetch-tiles", "tall tiles fed by deep prefetch on the A/B layers at 0.9: for B loaded 4 and 8 "
                           "columns ahead, the estimate's cheapest tile at that depth, against the flow's kernel "
                           "and that tile at depth 1", "30.3, 35",
         (BundleSpec("prefetch-tiles", "prefetch-tiles", {}, ("sgemm",)),), device_seconds=300),
)
STEP_NAMES = tuple(s.name for s in STEPS)


def step_named(name: str) -> Step:
    for s in STEPS:
        if s.name == name:
            return s
    raise SystemExit(f"no step {name!r}; steps in order: {', '.join(STEP_NAMES)}")


# --- where things are ---------------------------------------------------------------------------------------


GPU_KINDS = ("h100", "h200", "a100", "v100")  # the results folders device_slug names (else the name's words)


def device_slug(name: str) -> str:
    """The results folder of a GPU by its name: h100, h200, else its name in lower-case words."""
    low = name.lower()
    for kind in GPU_KINDS:
        if kind in low:
            return kind
    return "-".join("".join(c if c.isalnum() else " " for c in low).split()) or "unknown"


def step_folder(step: Step, device: str | None = None, results: Path = RESULTS) -> Path:
    return Path(results) / (device or step.device) / step.name


def step_state(step: Step, results: Path = RESULTS) -> dict:
    """A step's state from the committed results alone: `done` (done.json: when, on which device,
    what it measured), `partial` (some launches measured, the rest not yet) or `not run`; over every
    device folder that holds it."""
    found = {}
    for folder in sorted(Path(results).glob(f"*/{step.name}")):
        device = folder.parent.name
        done = folder / "done.json"
        if done.is_file():
            found[device] = {"state": "done", **json.loads(done.read_text())}
        elif any(folder.glob("*.progress.jsonl")) or any(folder.glob("*.parquet")):
            found[device] = {"state": "partial"}
    return found


def unmeasured_parts(step: Step, device: str, carry: Path = CARRY, results: Path = RESULTS) -> dict[str, set[int]] | None:
    """Per carried bundle of the step, the parts (their indexes in its listing) holding a launch not yet
    measured under results/<device>/<step>: a launch is its id and its kernel's hash
    (measure.measured_key), so a step done on older kernels has parts to measure again. None where a
    bundle is not carried as today's or its listing does not name its launches: nothing can be told."""
    out = step_folder(step, device, results)
    parts: dict[str, set[int]] = {}
    for spec in step.bundles:
        listing = Path(carry) / f"{spec.name}.parts.json"
        facts = json.loads(listing.read_text()) if listing.is_file() else {}
        launches = [[tuple(k) for k in q.get("launches", [])] for q in facts.get("parts", [])]
        if facts.get("inputs") != spec.inputs or not launches or not all(launches):
            return None
        measured = {measured_key(d["row"]) for d in progress(out, spec.name)}
        parts[spec.name] = {i for i, keys in enumerate(launches) if not measured.issuperset(keys)}
    return parts


def planned_launches(spec: BundleSpec, home: Path = bundles.HOME, say=None) -> list[str]:
    """Every launch id today's code plans for a bundle (its jobs, and each at its N1s at launch),
    without compiling: what tells a step done on older code from its new launches (a design added to
    the A/B) before its bundle is prepared. Kept by the bundle's inputs hash under home/plans: a
    headline set's plan searches tiles for a minute; `say` is told when one is made."""
    from benchmarks.sets import set_jobs

    path = Path(home) / "plans" / f"{spec.name}-{spec.inputs}.json"
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        pass
    if say is not None:
        say(f"(planning {spec.name} to tell its new launches from today's code; kept until the code changes)")
    ids = [i for job in set_jobs(spec.set, **spec.options) for i in
           (job.planned.id, *(f"{job.planned.id}-n{n1}" for n1, _ in job.planned.also_at))]
    path.parent.mkdir(parents=True, exist_ok=True)
    atomic_write(path, lambda tmp: Path(tmp).write_text(json.dumps(ids), encoding="utf-8"))
    for older in path.parent.glob("*.json"):  # one plan a bundle: the older code's go
        if older != path and older.stem.rsplit("-", 1)[0] == spec.name:
            older.unlink(missing_ok=True)
    return ids


_UNPLANNED: set[tuple[str, str]] = set()  # bundles (name, inputs) whose plan could not be made, said once


def new_launches(step: Step, device: str, results: Path = RESULTS, home: Path = bundles.HOME, say=None) -> int:
    """How many launches today's code plans for a step's bundles that were never measured under
    results/<device>/<step> (by id: a kernel changed under the same id is told only by a carried
    listing, unmeasured_parts)."""
    out = step_folder(step, device, results)
    new = 0
    for spec in step.bundles:
        try:
            planned = set(planned_launches(spec, home, say))
        except Exception as e:  # a plan that cannot be made today says so, once; the step stays as its results say
            if (spec.name, spec.inputs) not in _UNPLANNED:
                _UNPLANNED.add((spec.name, spec.inputs))
                (say or print)(f"{spec.name}: today's plan could not be made ({type(e).__name__}: {e}); its new "
                               f"launches are not told")
            continue
        new += len(planned - {d["row"]["id"] for d in progress(out, spec.name)})
    return new


def _what_changed(step: Step, device: str, carry: Path = CARRY, results: Path = RESULTS,
                  home: Path = bundles.HOME, say=None, plan: bool = True) -> str:
    """What a step done on `device` has in today's code that it did not measure there ("" where
    nothing): by the carried bundles' listings (ids and kernels), "on older kernels"; else (`plan`) by
    today's plan (ids; no bundle needed; not on the GPU machine, where a bundle not carried cannot be
    measured anyway), "N launches new since"."""
    parts = unmeasured_parts(step, device, carry, results)
    if parts is not None:
        return "on older kernels" if any(parts.values()) else ""
    new = new_launches(step, device, results, home, say) if plan else 0
    return f"{new} launch{'es' if new > 1 else ''} new since" if new else ""


def _changed_since(step: Step, device: str, carry: Path = CARRY, results: Path = RESULTS,
                   home: Path = bundles.HOME, say=None, plan: bool = True) -> bool:
    """Whether a step done on `device` has launches in today's code it did not measure there (_what_changed)."""
    return bool(_what_changed(step, device, carry, results, home, say, plan))


def _state_words(step: Step, device: str, state: str, carry: Path = CARRY, results: Path = RESULTS,
                 home: Path = bundles.HOME, say=None, plan: bool = True) -> str:
    """A step's state on `device` as status and report say it: "done, on older kernels" or "done, N
    launches new since" where it is (_what_changed)."""
    changed = _what_changed(step, device, carry, results, home, say, plan) if state == "done" else ""
    return f"{state}, {changed}" if changed else state


def bundle_state(spec: BundleSpec, home: Path = bundles.HOME, carry: Path = CARRY) -> dict:
    """Where a step's bundle is and whether it is today's: `ready` (built from today's code, at
    `path`; `carried` when its archives are packed under .gpu/ to carry), `stale` (built from other
    code), `missing`."""
    folder = Path(home) / spec.name
    facts = bundles.bundle_facts(folder)
    listing = Path(carry) / f"{spec.name}.parts.json"
    carried = listing.is_file() and json.loads(listing.read_text()).get("inputs") == spec.inputs
    if not facts:
        if carried:
            return {"state": "ready", "path": str(listing), "carried": True}
        return {"state": "missing", "path": str(folder)}
    if facts.get("inputs") != spec.inputs:
        return {"state": "stale", "path": str(folder), "built_from": facts.get("inputs"), "today": spec.inputs}
    return {"state": "ready", "path": str(folder), "carried": carried, "kernels": facts.get("kernels"),
            "launches": facts.get("launches")}


# --- status ---------------------------------------------------------------------------------------------------


def status(results: Path = RESULTS, home: Path = bundles.HOME, carry: Path = CARRY, say=print) -> list[dict]:
    """Each step in order: its state per device, its bundles' state, and the next command; the first
    step not done is the next one."""
    rows, next_step = [], None
    for step in STEPS:
        state = step_state(step, results)
        words = {d: _state_words(step, d, s["state"], carry, results, home, say) for d, s in state.items()}
        done_here = words.get(step.device) == "done"  # done there, on today's kernels and plan
        inputs = {b.name: bundle_state(b, home, carry) for b in step.bundles}
        if not done_here and next_step is None:
            next_step = step.name
        needs = list(step.needs) + [f"bundle {name} ({s['state']})" for name, s in inputs.items() if s["state"] != "ready"]
        rows.append({"step": step.name, "issue": step.issue, "device": step.device,
                     "state": ", ".join(f"{d}: {w}" for d, w in words.items()) or "not run",
                     "bundles": ", ".join(f"{n}: {s['state']}{' (carried)' if s.get('carried') else ''}"
                                          for n, s in inputs.items()) or "-",
                     "needs": ", ".join(needs) or "-", "title": step.title})
    for r in rows:
        mark = ">" if r["step"] == next_step else " "
        say(f"{mark} {r['step']:<22} {r['state']:<36} bundles: {r['bundles']}")
        if r["step"] == next_step:
            say(f"    next: {r['title']}")
            here = (f"python -m benchmarks.device prepare {r['step']}" if "bundle " in r["needs"]
                    else "its bundles are ready" if r["bundles"] != "-" else "no bundle")
            say(f"    needs: {r['needs']}; here: {here}; then `python -m benchmarks.device window --kind h100` "
                f"says each device call (what to carry, the command, its timeout)")
    if next_step is None:
        say("every step is done")
    from benchmarks.verdict import tally, verdict_rows

    say(f"the issues' targets on the H100: {tally(verdict_rows(results, 'h100'))} (python -m benchmarks.device verdict)")
    return rows


# --- a window's calls (no GPU) ---------------------------------------------------------------------------------

CARRY_LIMIT = 64 * 2**20  # what one device call carries, the checkout included
# the results a window brings back join the checkout the later calls carry (1.3 MiB on 2026-11-27,
# when a call planned at 63.5 MiB no longer fitted): the plan leaves room for them
RESULTS_GROWTH = 3 * 2**20
WHEELS_DIR = ".whl"
START_S = 40.0  # a fresh machine's start, counted against the window (the H200 windows: 22-30 s, a margin)
# between two calls the machine waits, held (idle time counts), while the results are unpacked here and
# the next call is sent; past its 30 s idle release the next call starts a fresh machine (START_S)
CALL_GAP_S = 20.0


@dataclass(frozen=True)
class DeviceCall:
    """One command of a window: the steps it runs in order, the ignored paths it carries (relative to
    the checkout), their bytes with the checkout's, and its seconds (each step's observed time where
    a log shows one, else its budget)."""

    steps: tuple[str, ...]
    carry: tuple[str, ...]
    carry_bytes: int
    seconds: float
    builds: tuple[str, ...] = ()  # steps that build their missing bundles on the GPU machine (--build)
    limit_s: float = STEP_LIMIT_S  # the command's own budget (B): at most what the window has left at its start

    @property
    def command(self) -> str:
        """The call's command: each step with the budget left, the results packed into $OUT after each
        (a call cut off at its limit brings back only what $OUT holds; all of them, since the call may
        run on another kind of GPU than planned, whose results go to its own folder). Each step also
        runs under `timeout` at the call's end, so that a step past its own budget (on 2026-11-26 a
        build did) still leaves the pack of the steps before it and of what it wrote."""
        runs = "; ".join(f"timeout -k 5 $(left) python -m benchmarks.device run {name} --budget-s $(($(left) - 15))"
                         f" --pack $OUT/results.tgz{' --build --jobs 16' if name in self.builds else ''}; pack"
                         for name in self.steps)
        # left: at least 1 (`timeout 0` would mean no limit). The step packs its results as it goes
        # (--pack): a call the device tool kills at its own limit still brings back what was measured
        # (on 2026-11-27 a call with B past the tool's limit brought back nothing of 7 minutes). Each
        # pack replaces the archive whole, never leaving a part of one.
        return (f"B={int(self.limit_s)}; s=$(date +%s); left() {{ t=$((B - $(date +%s) + s)); echo $((t > 1 ? t : 1)); }}; "
                f"pack() {{ tar czf $OUT/results.tgz.part benchmarks/results; [ $? -le 1 ] && mv $OUT/results.tgz.part $OUT/results.tgz; }}; "
                f"{runs}")

    @property
    def timeout_s(self) -> int:
        """The device tool's limit for the call: past the command's own (B), which it must never cut."""
        return int(self.limit_s) + 20


def observed_seconds(step: Step, results: Path = RESULTS) -> float | None:
    """How long the step took where it ran (the span of its log.txt's last run, the lines after its
    last "step <name> on" line, on any device: the longest), or None. A run stopped at its budget
    says nothing of what the step needs (the H200's serving was cut off at 140 s of its 540): None
    when any last run did not finish."""
    spans = []
    for log in Path(results).glob(f"*/{step.name}/log.txt"):
        lines = log.read_text(encoding="utf-8").splitlines()
        starts = [i for i, line in enumerate(lines) if f" step {step.name} on " in line]
        lines = lines[starts[-1]:] if starts else lines
        if any(f"step {step.name}: not finished" in line for line in lines):
            return None
        stamps = [line[:8] for line in lines if line[:2].isdigit()]
        if len(stamps) >= 2:
            first, last = (int(t[:2]) * 3600 + int(t[3:5]) * 60 + int(t[6:8]) for t in (stamps[0], stamps[-1]))
            spans.append((last - first) % 86400)
    return float(max(spans)) if spans else None


def launch_seconds(results: Path = RESULTS) -> dict[str, list[float]]:
    """The seconds each measured launch took (its baselines and check included), by its set, from
    every step's kernel-speed tables under `results` (their `set` and `seconds` columns only)."""
    import pyarrow.parquet as pq

    took: dict[str, list[float]] = {}
    for f in Path(results).glob("*/*/kernel-speed-*.parquet"):
        names = pq.read_schema(f).names
        if "seconds" not in names:
            continue
        for r in pq.read_table(f, columns=[c for c in ("set", "seconds") if c in names]).to_pylist():
            if r.get("seconds") is not None:
                took.setdefault(str(r.get("set")), []).append(float(r["seconds"]))
    return took


def expected_seconds(step: Step, carry: Path = CARRY, results: Path = RESULTS,
                     took: dict[str, list[float]] | None = None, cap: bool = True) -> float:
    """An estimate of a step never run: its carried bundles' launches (their listings) times the
    90th percentile of the seconds a launch of the same set took wherever it was measured (baselines
    and check included; the median of every set's when fewer than 20 were), and a minute for
    unpacking and loading;
    its budget where it has a runner of its own, where a listing is missing, stale or does not count
    its launches, or where that is more. On 2026-11-26 the planner took each headline step for its
    whole 540 s, and two measured 186 launches in 63 s. `took`: launch_seconds(results), read once
    by a caller asking for many steps. `cap`: at most the step's device_seconds (False: a step that
    takes more than one call's budget, as the Table 4 steps, says so)."""
    launches = 0
    for spec in step.bundles:
        listing = Path(carry) / f"{spec.name}.parts.json"
        facts = json.loads(listing.read_text()) if listing.is_file() else {}
        counted = [len(q.get("launches", [])) for q in facts.get("parts", [])]
        if facts.get("inputs") != spec.inputs or not counted or not all(counted):
            return step.device_seconds
        launches += sum(counted)
    if step.runner is not None or not launches:
        return step.device_seconds
    took = launch_seconds(results) if took is None else took
    sets_ = {spec.set for spec in step.bundles}
    same = sorted(t for name in sets_ for t in took.get(name, []))
    every = sorted(t for ts in took.values() for t in ts)
    # the set's own 90th percentile; a set never measured, every set's median (their 90th percentile is
    # the micro and N:M sweeps' 9-40 s launches: a Table 4 launch took about 0.3 s on the H200, where it
    # would have planned 1.8 s)
    per_launch = (same[int(0.9 * (len(same) - 1))] if len(same) >= 20
                  else every[len(every) // 2] if len(every) >= 20 else 2.0)
    return min(step.device_seconds, 60.0 + launches * per_launch) if cap else 60.0 + launches * per_launch


def checkout_bytes(root: Path = ROOT) -> int:
    """The bytes a device call copies of the checkout: tracked files and untracked ones git does not ignore."""
    listed = subprocess.run(["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"], cwd=root,
                            capture_output=True, check=True).stdout.split(b"\0")
    return sum((root / f.decode()).stat().st_size for f in listed if f and (root / f.decode()).is_file())


def window_calls(kind: str, budget_s: float, checkout: int, results: Path = RESULTS, home: Path = bundles.HOME,
                 carry: Path = CARRY, wheels: Path | None = None, again: tuple[str, ...] = (),
                 build_there: bool = False, say=None) -> tuple[list[DeviceCall], list[str]]:
    """The calls that spend a window of `budget_s` device seconds on a GPU of `kind` (its results
    folder: h100, h200): the steps done neither on their own device nor on this kind, in the program's
    order, as many to a call as its carry (CARRY_LIMIT with the checkout) and STEP_LIMIT_S allow, each
    fresh machine's start counted. Returns the calls and why each other step is left out (a bundle to
    prepare or carry, the window's time). `again`: steps to run even where done (their kernels changed
    since: a step run again measures them again, measure.measured_key). `build_there`: a step whose
    bundles are not prepared here builds them on the GPU machine's cores (its wheels carried; the
    build stops at a share of the step's budget and what it built is measured: run_step), rather than
    being left out; its time is its whole budget."""
    wheels = Path(wheels or Path(carry).parent / WHEELS_DIR)
    wheel_bytes = sum(f.stat().st_size for f in wheels.glob("*.whl")) if wheels.is_dir() else 0
    calls: list[DeviceCall] = []
    left_out: list[str] = []
    current: dict = {"steps": [], "carry": {}, "seconds": 0.0, "builds": []}  # carry: {path: bytes}
    spent = START_S  # the first call starts a machine

    def close() -> None:
        if current["steps"]:
            calls.append(DeviceCall(tuple(current["steps"]), tuple(current["carry"]),
                                    checkout + sum(current["carry"].values()), current["seconds"],
                                    tuple(current["builds"])))
        current.update(steps=[], carry={}, seconds=0.0, builds=[])

    planned: set[str] = set()
    took = launch_seconds(results)  # what a launch took, for the steps never run (expected_seconds)
    for step in STEPS:
        if step.device != STEPS[0].device and step.device != kind:  # a step of one kind of GPU only
            left_out.append(f"{step.name}: runs on an {step.device.upper()} only")
            continue
        state = step_state(step, results)
        # done where its results count, on today's kernels; a step done on older ones (the ranker
        # retrained since, say) is measured again on this kind: only its changed launches
        if step.name not in again and any(state.get(d, {}).get("state") == "done"
                                          and not _changed_since(step, d, carry, results, home, say)
                                          for d in (step.device, kind)):
            continue
        unread = [r for r in step.reads if r not in planned and step_state(step_named(r), results).get(kind, {})
                  .get("state") != "done"]
        if unread:
            left_out.append(f"{step.name}: reads {', '.join(unread)} measured on this GPU, not done nor in this window")
            continue
        opened = [*step.bundles, *(b for r in step.reads for b in step_named(r).bundles if b.name in step.opens)]
        missing = [b.name for b in opened if not bundle_state(b, home, carry).get("carried")]
        # a reader's opened bundles are its read step's, built there: only a step's own are built here
        builds = build_there and bool(missing) and all(b in step.bundles for b in opened if b.name in missing)
        if missing and not builds:
            left_out.append(f"{step.name}: prepare {', '.join(missing)} first (python -m benchmarks.device prepare "
                            f"{step.name}{'' if build_there else '; or window --build-there'})")
            continue
        if ("wheels" in step.needs or builds) and not wheel_bytes:
            left_out.append(f"{step.name}: needs the wheels (python -m benchmarks.device wheels)")
            continue
        # what the step carries, a unit per part of a bundle (its listing and archive) and the wheels:
        # {path: bytes}, a listing shared by the units of its bundle; a step building its bundles
        # carries the wheels and no part of the bundles it builds
        wheel_unit = {WHEELS_DIR: wheel_bytes} if "wheels" in step.needs or builds else {}
        # the parts already measured on this kind stay here (a step cut off, or done on older kernels
        # whose unchanged launches it keeps): only the parts with a launch to measure go; a step that
        # picks a few launches of what it opens carries the parts holding them
        if step.picks is not None:
            # what it picks is read from its reads' results here and now: not from a read this window
            # measures (its picks would change by the time the step runs, and their parts not travel)
            pending = [r for r in step.reads if r in planned or step_state(step_named(r), results).get(kind, {})
                       .get("state") != "done"]
            picked = [] if pending else step.picks(Path(results) / kind)
            if not picked:
                left_out.append(f"{step.name}: picks its kernels from {', '.join(step.reads)} measured on this GPU: "
                                f"a window after those")
                continue
            to_measure = {b.name: _parts_holding(b.name, carry, picked) for b in opened if b.name not in missing}
        else:
            to_measure = (None if step.name in again else unmeasured_parts(step, kind, carry, results)) or {}
            if to_measure and not any(to_measure.values()):
                # every launch measured, the step not done (a call killed after its last launch, before its
                # tables and done.json): the smallest part lets it finish from its progress file
                name, part, _ = min(((n, i, int(q["bytes"])) for n in to_measure
                                     for i, q in enumerate(_listed_parts(n, carry))), key=lambda p: p[2])
                to_measure = {b: set() for b in to_measure} | {name: {part}}
        # (each unit with the launches its part holds: its share of the step's time)
        weighted = [(wheel_unit | unit, launches) for b in opened if b.name not in missing
                    for i, (unit, launches) in enumerate(zip(_bundle_carry(b, carry), _part_launches(b.name, carry)))
                    if b.name not in to_measure or i in to_measure[b.name]] or ([(wheel_unit, 0)] if wheel_unit else [])
        carried = [unit for unit, _ in weighted]
        if any(checkout + sum(unit.values()) > CARRY_LIMIT for unit in carried):
            left_out.append(f"{step.name}: a part of {max(sum(u.values()) for u in carried) / 2**20:.1f} MiB with the "
                            f"{checkout / 2**20:.1f} MiB checkout is over what one call carries "
                            f"({CARRY_LIMIT / 2**20:.0f} MiB)")
            continue
        # what the step needs: a step of bundles as long as its launches take (over several calls where
        # that is past one call's limit: the Table 4 steps), one with a runner of its own one call
        need = ((step.device_seconds if builds else (observed_seconds(step, results)
                 or expected_seconds(step, carry, results, took, cap=step.runner is not None))
                 * (1.0 if step.picks else _share_to_measure(to_measure, carry))) + 15)
        groups = _call_groups(weighted, need if step.runner is None else min(need, STEP_LIMIT_S), checkout,
                              by_time=step.runner is None)
        seconds = sum(t for _, t in groups)
        if spent + seconds > budget_s:
            left_out.append(f"{step.name}: about {seconds:.0f} s{f' in {len(groups)} calls' if len(groups) > 1 else ''}, "
                            f"past the window's {budget_s:.0f} s")
            continue
        for group, share in groups:
            fits = (checkout + sum((current["carry"] | group).values()) <= CARRY_LIMIT
                    and current["seconds"] + share <= STEP_LIMIT_S)
            if not fits:
                close()
            current["steps"].append(step.name)
            if builds:
                current["builds"].append(step.name)
            current["carry"] |= group
            current["seconds"] += share
            spent += share
        planned.add(step.name)
    close()
    # the waits between the calls, last: the program's order keeps the first steps, the last calls go
    dropped: dict[str, list[float]] = {}  # per step, the seconds of each of its calls dropped
    while calls and START_S + sum(c.seconds for c in calls) + CALL_GAP_S * (len(calls) - 1) > budget_s:
        call = calls.pop()
        for name in dict.fromkeys(call.steps):
            dropped.setdefault(name, []).append(call.seconds)
    for name, seconds in reversed(dropped.items()):
        still = sum(name in c.steps for c in calls)
        calls_word = "its call" if len(seconds) == 1 else f"its {len(seconds)} calls"
        left_out.append(f"{name}: {calls_word if not still else f'after {still} call(s) in this window, {calls_word}'} "
                        f"(about {sum(seconds):.0f} s) {'is' if len(seconds) == 1 else 'are'} past the window's {budget_s:.0f} s with {CALL_GAP_S:.0f} s "
                        f"between calls{'' if not still else ': the step goes on next window'}")
    # each call's own budget: what the window has left when it starts (the device tool's limit is
    # that time left, and a command past it is killed)
    started = START_S
    for i, call in enumerate(calls):
        calls[i] = replace(call, limit_s=max(60.0, min(STEP_LIMIT_S, budget_s - started - 20)))
        started += call.seconds + CALL_GAP_S
    return calls, left_out


def _listed_parts(name: str, carry: Path) -> list[dict]:
    """The parts a carried bundle's listing names: each part's archive, bytes and launches."""
    return json.loads((Path(carry) / f"{name}.parts.json").read_text())["parts"]


def _part_launches(name: str, carry: Path) -> list[int]:
    """The launches each part of a carried bundle holds, as its listing names them (0 where it does not)."""
    return [len(q.get("launches", [])) for q in _listed_parts(name, carry)]


def _call_groups(weighted: list[tuple[dict[str, int], int]], need: float, checkout: int,
                 by_time: bool = True) -> list[tuple[dict, float]]:
    """A step's calls: its carried units (each with its launches) in order, as many to a call as the
    carry allows and at most STEP_LIMIT_S of the step's `need` seconds each (shared by launches); a
    part that needs more than one call's time travels in as many calls (the step resumes). Not
    `by_time` (a step with a runner of its own: it runs once a call), the carry alone splits them,
    the `need` shared equally. Each call's seconds at least 15 (unpacking)."""
    if not weighted:
        return [({}, max(15.0, min(need, STEP_LIMIT_S)))]
    if not by_time:
        carried: list[dict] = [{}]
        for unit, _ in weighted:
            if carried[-1] and checkout + sum((carried[-1] | unit).values()) > CARRY_LIMIT:
                carried.append({})
            carried[-1] |= unit
        return [(g, max(15.0, need / len(carried))) for g in carried]
    total = sum(launches for _, launches in weighted)
    cap = STEP_LIMIT_S - 15
    groups: list[list] = []
    for unit, launches in weighted:
        left = need * (launches / total if total else 1 / len(weighted))
        while True:
            piece = min(left, cap)
            if (groups and checkout + sum((groups[-1][0] | unit).values()) <= CARRY_LIMIT
                    and groups[-1][1] + piece <= cap):
                groups[-1][0] |= unit
                groups[-1][1] += piece
            else:
                groups.append([dict(unit), piece])
            left -= piece
            if left <= 1e-6:
                break
    return [(g, max(15.0, t)) for g, t in groups]


def _share_to_measure(to_measure: dict[str, set[int]], carry: Path) -> float:
    """Of the launches the listings of `to_measure`'s bundles name, the share in its parts (1 when it names none)."""
    listed = {name: _part_launches(name, carry) for name in to_measure}
    total = sum(sum(counts) for counts in listed.values())
    return sum(counts[i] for name, counts in listed.items() for i in to_measure[name]) / total if total else 1.0


def _bundle_carry(spec: BundleSpec, carry: Path) -> list[dict[str, int]]:
    """A carried bundle's parts, each as {path: bytes} of what a call carries for it (the listing and
    the part's archive, relative to the checkout): a bundle too large for one call goes a part per
    call (each part is a bundle of its own; its listing names each part's launches)."""
    listing = Path(carry) / f"{spec.name}.parts.json"
    name, size = f"{Path(carry).name}/{listing.name}", listing.stat().st_size
    return [{name: size, f"{Path(carry).name}/{q['file']}": int(q["bytes"])}
            for q in json.loads(listing.read_text())["parts"]]


def print_window(kind: str, budget_s: float, again: tuple[str, ...] = (), say=print,
                 build_there: bool = False) -> list[DeviceCall]:
    """The window's calls, each with what to carry and its command; what is left out and why."""
    calls, left_out = window_calls(kind, budget_s, checkout_bytes() + RESULTS_GROWTH, again=again,
                                   say=lambda line: print(line, file=sys.stderr, flush=True),
                                   build_there=build_there)
    for i, call in enumerate(calls, 1):
        say(f"call {i}: {', '.join(call.steps)} (about {call.seconds:.0f} s; carries {call.carry_bytes / 2**20:.1f} MiB "
            f"with the checkout)")
        say(f"  carry: {json.dumps(list(call.carry))}")
        say(f"  command: {call.command}")
        say(f"  timeout_s: {call.timeout_s} (B={call.limit_s:.0f} in the command; where status' budget_left_s "
            f"is less than {call.timeout_s}, set B to budget_left_s less 30: the tool's limit is the time left)")
        say("  then here: tar xzf <files_at>/results.tgz, and send the next call at once (the machine goes back "
            "after 30 s idle; the next call carries the results); commit once the window is over")
    for line in left_out:
        say(f"left out: {line}")
    if not calls:
        say("no step to run in this window")
    return calls


# --- prepare (no GPU) -----------------------------------------------------------------------------------------


def prepare(step: Step, jobs: int = 2, home: Path = bundles.HOME, carry: Path = CARRY, pack: bool = True,
            say=print) -> list[Path]:
    """Build the step's bundles that are missing or stale into `home`, and pack each into `carry` (the
    archives a device call carries, with their SHA-256 listing). Returns the listings."""
    from benchmarks.sets import set_jobs

    listings = []
    for spec in step.bundles:
        state = bundle_state(spec, home, carry)
        if state["state"] != "ready":
            if state["state"] == "stale":
                say(f"{spec.name}: built from other code ({state['built_from']}, today {state['today']}): rebuilding")
                shutil.rmtree(Path(home) / spec.name)
            say(f"{spec.name}: planning the {spec.set} set {spec.options or ''}")
            bundles.build(spec.name, set_jobs(spec.set, **spec.options), home, jobs, set_name=spec.set,
                          options=spec.options, say=say)
        if pack:
            listing = Path(carry) / f"{spec.name}.parts.json"
            if not (listing.is_file() and json.loads(listing.read_text()).get("inputs") == spec.inputs):
                for old in packing.archives_of(spec.name, Path(carry)):
                    old.unlink()
                archives = packing.packed_parts(Path(home) / spec.name, Path(carry))
                say(f"{spec.name}: {len(archives)} archive(s), "
                    f"{sum(a.stat().st_size for a in archives) / 2**20:.1f} MiB in {carry}")
            listings.append(listing)
    total = sum(f.stat().st_size for f in Path(carry).glob("*.tar.xz")) if Path(carry).exists() else 0
    say(f"{carry}: {total / 2**20:.1f} MiB to carry in all (a device call carries at most 64 MiB with the checkout)")
    return listings


# --- run (on the GPU machine) -----------------------------------------------------------------------------------


def env_facts() -> dict:
    """The device, driver and the libraries the program measures with."""
    import importlib.metadata as md
    import platform

    from cuda.bindings import driver

    from lospmm.kernel.cuda import _ck, device_facts

    facts = device_facts() | {"driver_api": _ck(driver.cuDriverGetVersion(), "cuDriverGetVersion"),
                              "python": platform.python_version()}
    try:
        facts["nvidia_smi"] = subprocess.run(["nvidia-smi", "--query-gpu=name,driver_version,clocks.max.sm,"
                                              "clocks.max.mem,power.limit", "--format=csv,noheader"],
                                             capture_output=True, text=True, timeout=30).stdout.strip()
    except (OSError, subprocess.SubprocessError) as e:
        facts["nvidia_smi"] = f"unavailable: {e}"
    for pkg in ("torch", "cupy-cuda13x", "cupy-cuda12x", "cuda-bindings", "nvidia-cuda-nvrtc", "nvidia-nvjitlink",
                "numpy", "scipy", "lightgbm", "prefect"):
        try:
            facts[pkg] = md.version(pkg)
        except md.PackageNotFoundError:
            pass
    return facts


# Of a step's time left, the share after which a bundle build on the GPU machine starts no more
# kernels, and the share at which it stops those still compiling (a 150-kernel N:M set took more than
# one command's 10 minutes on 16 cores; sixteen half kernels started in time compiled for 400-500 s
# each): what it built by then is measured in the rest.
BUILD_SHARE = 0.6
BUILD_HARD_SHARE = 0.8


def carried_complete(spec: BundleSpec, out: Path, carry: Path = CARRY) -> bool:
    """Whether every launch of a carried bundle, all its parts, is in the step's progress under `out`:
    by its listing where this call carries it (kept beside the results as `<name>.expected.json`, for a
    later call that carries none of it), else by what an earlier call kept; False when neither says."""
    expected = Path(out) / f"{spec.name}.expected.json"
    listing = Path(carry) / f"{spec.name}.parts.json"
    if listing.is_file():
        expected.write_text(json.dumps(sorted(_listed_keys(listing), key=str)))
    if not expected.is_file():
        return False
    measured = {measured_key(d["row"]) for d in progress(out, spec.name)}
    return measured >= {tuple(k) for k in json.loads(expected.read_text())}


def _listed_keys(listing: Path) -> set:
    """The launches (id, kernel) of every part of a carried bundle, as its listing names them; a
    listing packed before listings named them has a placeholder no launch matches, so a step carried
    part by part is never taken for done on its word (all parts carried at once still are: their rows)."""
    facts = json.loads(listing.read_text())
    keys = {tuple(k) for q in facts["parts"] for k in q.get("launches", [])}
    if keys or all((listing.parent / q["file"]).is_file() for q in facts["parts"]):
        return keys
    return {("a part packed before listings named its launches", None)}


def bundle_here(spec: BundleSpec, carry: Path = CARRY, home: Path = bundles.HOME) -> bool:
    """Whether a step's bundle is on this machine: carried (its listing), or built and today's in `home`."""
    return (Path(carry) / f"{spec.name}.parts.json").is_file() or bundle_state(spec, home, carry)["state"] == "ready"


def built_within(name: str, jobs, into: Path, threads: int, hard_at: float, say=print, **options) -> Path:
    """bundles.build() in a child process, killed at `hard_at` (time.monotonic()) with the kernels it is still
    compiling; then the unfinished bundle of what it finished (each package's row.json is written last,
    atomically). NVRTC and ptxas run in the build's threads, which nothing can stop: `stop_at` alone
    only starts no more kernels, and on 2026-11-26 sixteen half kernels started before it compiled
    for 400-500 s each, past the command's limit, and the call brought nothing back. The child is
    forked (it inherits the planned jobs: planning the half set is a minute of search); it compiles
    and never touches the GPU, which the parent may have opened. Here, not in benchmarks.bundle: how a
    build is run is not what it builds, and a change to it leaves prepared bundles current."""
    import multiprocessing

    options = {k: v for k, v in options.items() if k != "say"}
    child = multiprocessing.get_context("fork").Process(
        target=bundles.build, args=(name, jobs, into, threads), kwargs=options | {"say": say}, daemon=True)
    child.start()
    child.join(max(0.0, hard_at - time.monotonic()))
    if child.is_alive():
        say(f"{name}: the build's time is up: stopping the kernels still compiling")
        child.kill()
        child.join()
    elif child.exitcode == 0 and bundles.bundle_facts(Path(into) / name):
        return Path(into) / name
    elif child.exitcode != 0:  # (exit 0 without bundle.json: it stopped at stop_at, and said so)
        say(f"{name}: the build stopped with exit code {child.exitcode}; measuring what it finished")
    # no kernel started (its time is up): the packages the child finished, as an unfinished bundle
    return bundles.build(name, jobs, into, threads, **(options | {"stop_at": 0.0}), say=say)


def opened_bundle(spec: BundleSpec, carry: Path, unpack: Path, build: bool, jobs: int, say=print,
                  stop_at: float | None = None, hard_at: float | None = None,
                  measured: frozenset[str] = frozenset()) -> list[Path]:
    """The folders of a step's bundle on the GPU machine: its carried archives, checked by their
    SHA-256 and unpacked; else, with `build`, built here on `jobs` cores, no kernel started after
    `stop_at` and those still compiling stopped at `hard_at` (time.monotonic(); what was built by
    then is an unfinished bundle to measure), the launches never `measured` (ids) first: a step done
    on a smaller plan builds and measures what it added before it rebuilds what it has (which is
    measured again only where its kernel changed); else SystemExit naming what to prepare."""
    listing = Path(carry) / f"{spec.name}.parts.json"
    if listing.is_file():
        facts = json.loads(listing.read_text())
        if facts.get("inputs") != spec.inputs:
            say(f"{spec.name}: the carried bundle was built from other code ({facts.get('inputs')}, today "
                f"{spec.inputs}): its kernels are not today's")
            if not build:
                raise SystemExit(f"{spec.name}: stale; prepare it again (python -m benchmarks.device prepare ...) "
                                 f"or pass --build")
        else:
            parts = packing.verified_parts(listing, carried=True)
            if not parts:
                raise SystemExit(f"{spec.name}: {listing.name} is here but none of its archives")
            if len(parts) < len(facts["parts"]):
                say(f"{spec.name}: {len(parts)} of its {len(facts['parts'])} parts carried in this call; the step goes "
                    f"on when the others are")
            return [packing.opened(a, unpack) for a in parts]
    home_state = bundle_state(spec, bundles.HOME, carry)
    if home_state["state"] == "ready" and not home_state.get("carried"):
        return [Path(home_state["path"])]
    if not build:
        raise SystemExit(f"{spec.name}: no bundle at {listing} or {bundles.HOME / spec.name}; prepare it "
                         f"(python -m benchmarks.device prepare STEP) or pass --build to build it here")
    from benchmarks.sets import set_jobs

    if hard_at is None:  # a build with no hard stop is what lost a whole call (built_within's docstring)
        raise ValueError(f"{spec.name}: a build on the GPU machine needs the time it is stopped at (hard_at)")
    say(f"{spec.name}: building here on {jobs} cores")
    from lospmm.kernel.sass import NvdisasmMissing, nvdisasm

    try:
        sass = bool(nvdisasm())
    except NvdisasmMissing:  # the GPU's time is for measuring: built without, and said so in its log
        sass = False
        say(f"{spec.name}: no nvdisasm on this machine: its rows carry no SASS facts (instructions per multiply-add, "
            f"code bytes); a bundle prepared ahead (python -m benchmarks.device prepare) has them")
    planned = sorted(set_jobs(spec.set, **spec.options), key=lambda job: job.planned.id in measured)  # stable
    new = sum(job.planned.id not in measured for job in planned)
    if measured and new:
        say(f"{spec.name}: the {new} kernels with launches never measured here first")
    return [built_within(spec.name, planned, bundles.HOME, jobs, hard_at, say=say, set_name=spec.set,
                         options=spec.options, stop_at=stop_at, sass=sass)]


class Log:
    """A step's log: printed and appended to log.txt as it goes."""

    def __init__(self, folder: Path):
        folder.mkdir(parents=True, exist_ok=True)
        self.file = open(folder / "log.txt", "a", encoding="utf-8")

    def __call__(self, text: str) -> None:
        line = f"{time.strftime('%H:%M:%S')} {text}"
        print(line, flush=True)
        self.file.write(line + "\n")
        self.file.flush()


PACK_EVERY_S = 30.0  # how often a step packs its results while it runs (--pack)


class ResultsPacker:
    """While a step runs, `results` packed into the archive `dest` every `every_s` seconds and once
    more at the end, each pack replacing the last whole (see pack): a command killed at the
    device tool's limit brings back what $OUT holds, the results of at most `every_s` ago. No `dest`:
    nothing is packed."""

    def __init__(self, dest: Path | None, results: Path = RESULTS, every_s: float = PACK_EVERY_S):
        import threading

        self.dest, self.results, self.every_s = (Path(dest) if dest else None), Path(results), every_s
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._every, name="results-packer", daemon=True)

    def pack(self) -> None:
        """The archive written whole beside `dest` under one fixed name (`<dest>.part`, the shell's `pack`
        writes the same: a command killed mid-pack leaves at most that one file beside the archive),
        synced, then renamed over `dest`."""
        import tarfile

        part = self.dest.with_name(self.dest.name + ".part")
        with tarfile.open(part, "w:gz") as tar:  # named as `tar czf … benchmarks/results` names them
            tar.add(self.results, arcname=str(self.results.relative_to(ROOT)) if self.results.is_relative_to(ROOT)
                    else self.results.name)
        with open(part, "rb") as f:
            os.fsync(f.fileno())
        os.replace(part, self.dest)

    def _every(self) -> None:
        while not self._stop.wait(self.every_s):
            self._pack_or_say()

    def _pack_or_say(self) -> None:
        try:
            self.pack()
        except OSError as e:  # a full disk or a file vanishing mid-walk: the next pack tries again
            print(f"packing the results into {self.dest}: {e}", flush=True)

    def __enter__(self) -> "ResultsPacker":
        if self.dest:
            self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        if self.dest:
            self._stop.set()
            self._thread.join()
            self._pack_or_say()  # never in place of the step's own error (a lost context re-runs the command)


def run_step(step: Step, budget_s: float = STEP_LIMIT_S, carry: Path = CARRY, unpack: Path = Path("/tmp/lospmm-gpu"),
             build: bool = False, jobs: int = 16, results: Path = RESULTS, pack: Path | None = None) -> Path:
    """One step on this GPU: its folder under results/<device>/, env.json, its bundles measured until
    the budget (resumable), done.json once every launch is measured. Returns the folder. `pack`: an
    archive the results are packed into as the step goes (ResultsPacker)."""
    with ResultsPacker(pack, results):
        return _run_step(step, budget_s, carry, unpack, build, jobs, results)


def _run_step(step: Step, budget_s: float, carry: Path, unpack: Path, build: bool, jobs: int, results: Path) -> Path:
    import torch  # noqa: F401  (before anything loads NVRTC: see lospmm.kernel.cuda.SPIN_PTX)

    deadline = Deadline.after(budget_s)
    if "wheels" in step.needs or build:  # a build plans with the ranker (LightGBM), compiles through Prefect tasks
        with_wheels(ROOT / ".whl")
    env = env_facts()
    device = device_slug(env["name"])
    if device != step.device:
        print(f"note: step {step.name} is {step.device}'s; this is {env['name']} ({device}): its results go under "
              f"{device}/", flush=True)
    out = step_folder(step, device, results)
    say = Log(out)
    (out / "env.json").write_text(json.dumps(env, indent=1))
    say(f"step {step.name} on {env['name']}: {step.title}")
    complete = True
    if step.runner is not None:
        complete = step.runner(step, out, deadline, say)
    # a step whose bundles do not fit one call together runs over several, each carrying some of them
    here = [spec for spec in step.bundles if build or bundle_here(spec, carry)]
    for spec in step.bundles:
        listing = Path(carry) / f"{spec.name}.parts.json"
        if here and spec not in here:
            if not carried_complete(spec, out, carry):
                say(f"{spec.name}: not carried in this call; the step goes on when it is")
                complete = False
            continue
        options = RunOptions(baselines=spec.baselines)
        # a build here takes at most BUILD_SHARE of the time left, and what it built is measured
        left = max(0.0, deadline.left())
        stop_at, hard_at = time.monotonic() + BUILD_SHARE * left, time.monotonic() + BUILD_HARD_SHARE * left
        measured_ids = frozenset(d["row"]["id"] for d in progress(out, spec.name))
        for folder in opened_bundle(spec, carry, unpack, build, jobs, say, stop_at, hard_at, measured_ids):  # or each part
            tables = run_bundle(folder, out, spec.name, deadline, options, say)
            done_rows = progress(out, spec.name)
            measured = {measured_key(d["row"]) for d in done_rows}
            complete &= measured >= {measured_key(r) for r in bundles.bundle_rows(folder)}
            complete &= not none_compiled(done_rows, say)
            complete &= bool(bundles.bundle_facts(folder))  # a build cut off at its time: kernels still to build
            say(f"{folder.name}: tables {', '.join(str(p.name) for p in tables.values())}")
        if listing.is_file():  # the parts not carried in this call: measured in an earlier one
            complete &= carried_complete(spec, out, carry)
        if spec.set == "ab":
            decision = analysis_decision(out, spec.name)
            say(f"decision: {json.dumps(decision)}")
    if complete:
        (out / "done.json").write_text(json.dumps({"device": env["name"], "driver": env.get("nvidia_smi", ""),
                                                   "finished": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
                                                   "bundles": {b.name: b.inputs for b in step.bundles}}, indent=1))
        say(f"step {step.name}: done")
    else:
        # a done step measured again (its kernels changed) and cut off is partial again
        (out / "done.json").unlink(missing_ok=True)
        say(f"step {step.name}: " + ("not finished in the budget; run it again to go on from here" if deadline.over()
                                     else "what this call carried is measured; the parts still to measure travel "
                                          "in a later call (`window` plans them)"))
    return out


def none_compiled(done: list[dict], say=print) -> bool:
    """Whether a bundle's launches were measured without a single compiled kernel: a build that could
    not compile (on the GPU machine, a stand-in Prefect once made every kernel of the conv set an
    error), not a finding; the step is then not done, so that `next` and `window` run it again."""
    rows = [d["row"] for d in done]
    if rows and all(r.get("status") == "not compiled" for r in rows):
        say(f"none of the {len(rows)} kernels compiled: the build failed, the step is not done")
        return True
    return False


def analysis_decision(out: Path, name: str) -> dict:
    """The design decision of a measured A/B (analysis.design_decision), written to decision.json."""
    import pyarrow.parquet as pq

    from benchmarks.analysis import design_decision

    path = out / f"kernel-speed-{name}.parquet"
    decision = design_decision(pq.read_table(path).to_pylist()) if path.is_file() else {}
    (out / "decision.json").write_text(json.dumps(decision, indent=1))
    return decision


def next_steps(budget_s: float = STEP_LIMIT_S, build: bool = False, jobs: int = 16, here: str | None = None,
               results: Path = RESULTS, run: Callable = None, carry: Path = CARRY) -> None:
    """The next steps done neither on their own device nor on this one (`here`: this GPU's results
    folder; an H200 window goes on past what an earlier H200 window measured), in order, while the
    time left covers a step's need. A step done there but with carried bundles it did not measure
    (`carry`) runs again."""
    run = run or run_step
    here = here or device_slug(env_facts()["name"])
    deadline = Deadline.after(budget_s)
    for step in STEPS:
        state = step_state(step, results)
        if any(state.get(d, {}).get("state") == "done"
               and not _changed_since(step, d, carry=carry, results=results, plan=False)
               for d in (step.device, here)):
            continue
        if deadline.left() < min(step.device_seconds, STEP_LIMIT_S) / 2:
            print(f"{deadline.left():.0f} s left: {step.name} needs about {step.device_seconds:.0f} s; stopping here")
            return
        run(step, min(deadline.left(), STEP_LIMIT_S), build=build, jobs=jobs)


# --- steps with runners of their own ---------------------------------------------------------------------------


def _gate(step: Step, out: Path, deadline: Deadline, say) -> bool:
    """`pytest -m gpu`: its whole output in pytest.txt and the counts in gate.json; complete when it
    ran to the end (passed or not: a failure is a finding, recorded)."""
    cmd = [sys.executable, "-m", "pytest", "-m", "gpu", "-q", "-p", "no:cacheprovider", str(ROOT / "tests")]
    t0 = time.perf_counter()
    try:
        p = subprocess.run(cmd, capture_output=True, text=True, cwd=ROOT, timeout=max(30.0, deadline.left()))
        text, rc = p.stdout + p.stderr, p.returncode
    except subprocess.TimeoutExpired as e:
        partial = e.stdout.decode(errors="replace") if isinstance(e.stdout, bytes) else (e.stdout or "")
        text, rc = f"{partial}\nstopped after {e.timeout:.0f} s", 124
    (out / "pytest.txt").write_text(text)
    last = text.strip().splitlines()[-1] if text.strip() else ""
    (out / "gate.json").write_text(json.dumps({"exit": rc, "summary": last, "seconds": time.perf_counter() - t0}))
    say(f"pytest -m gpu: exit {rc}: {last}")
    return rc != 124


def _measured(folder: Path, steps: tuple[str, ...]) -> list[dict]:
    """The launch rows `steps` measured under `folder` (a GPU's results folder)."""
    from benchmarks.verdict import found

    return found(Path(folder).parent, Path(folder).name, steps).rows


def _best_and_worst(folder: Path, steps: tuple[str, ...], count: int = 5) -> list[str]:
    """The `count` kernels of least and of most per-nonzero efficiency that `steps` measured under
    `folder` (a GPU's results), least first; [] before any of them ran there."""
    from benchmarks.analysis import efficiency

    rows = [r for r in _measured(folder, steps)
            if r.get("status") == "ok" and r.get("sgemm_us") and math.isfinite(float(r.get("ours_us") or "inf"))]
    ranked = sorted({str(r["id"]): r for r in rows}.values(), key=efficiency)  # a launch measured again: its last row
    return [r["id"] for r in (ranked if len(ranked) <= 2 * count else ranked[:count] + ranked[-count:])]


# the issue's largest layers (BERT's FFN, ResNet-50's layer4: its block 0, two bundle parts) at batch
# 32: on the H200 they span 0.12-0.28 per-nonzero efficiency at 0.9
LARGEST_LAYERS = (("bert-base", "encoder.layer.0.intermediate.dense"), ("bert-base", "encoder.layer.0.output.dense"),
                  ("resnet50", "layer4.0.conv1"), ("resnet50", "layer4.0.conv2"), ("resnet50", "layer4.0.conv3"),
                  ("resnet50", "layer4.0.downsample.0"))


def _largest(folder: Path, steps: tuple[str, ...], sparsity: float = 0.9, batch: int = 32) -> list[str]:
    """The kernels of LARGEST_LAYERS at `sparsity` and `batch` that `steps` measured under `folder`
    (a GPU's results), in that order; [] before any of them ran there."""
    rows = [r for r in _measured(folder, steps)
            if r.get("status") == "ok" and int(r.get("batch") or 0) == batch
            and math.isclose(float(r.get("sparsity") or 0), sparsity)]
    found = {(r["model"], r["layer"]): str(r["id"]) for r in rows}
    return [found[layer] for layer in LARGEST_LAYERS if layer in found]


def _counters(step: Step, out: Path, deadline: Deadline, say) -> bool:
    """ncu on the kernels the step picks (`step.picks` of the results of the steps it reads, on this
    GPU), found in whichever carried part of the bundles it opens holds them; their counters in one
    table, counters.parquet."""
    import pyarrow.parquet as pq

    from benchmarks import kernel_counters

    picked = step.picks(out.parent)
    if not picked:
        say(f"nothing to profile: run {', '.join(step.reads)} on this GPU first")
        return False
    specs = [b for name in step.reads for b in step_named(name).bundles if b.name in step.opens]
    say(f"profiling {len(picked)} kernels: {', '.join(picked)}")
    # each part's picked kernels profiled into a folder of its own (named after the bundle and part: a
    # call that carries some parts keeps what earlier calls profiled), then their counters in one table
    for spec in specs:
        if not bundle_here(spec, CARRY):
            say(f"{spec.name}: not carried in this call")
            continue
        if (Path(CARRY) / f"{spec.name}.parts.json").is_file() and not _parts_holding(spec.name, CARRY, picked):
            continue  # holds none of the picked kernels
        try:
            folders = opened_bundle(spec, CARRY, Path("/tmp/lospmm-gpu"), False, 16, say)
        except SystemExit as e:  # a bundle none of whose parts this call carries
            say(str(e))
            continue
        for folder in folders:
            here = sorted({str(r["id"]) for r in bundles.bundle_rows(folder)} & set(picked))
            if not here:
                continue
            part = out / f"part-{folder.name}"
            kernel_counters.main(["profile", str(folder), str(part), "--ids", *here, "--timeout-s",
                                  str(max(60, deadline.left() / (len(picked) + 1)))])
    tables = [pq.read_table(f) for f in sorted(out.glob("part-*/counters.parquet"))]
    if tables:
        import pyarrow as pa

        pq.write_table(pa.concat_tables(tables), out / "counters.parquet")
    profiled = {str(r["id"]) for t in tables for r in t.to_pylist()}
    return (out / "counters.parquet").is_file() and profiled >= set(picked)


def _parts_holding(name: str, carry: Path, ids: list[str]) -> set[int]:
    """The parts (indexes) of a carried bundle whose launches include one of `ids`."""
    wanted = set(ids)
    return {i for i, q in enumerate(_listed_parts(name, carry)) if any(k[0] in wanted for k in q.get("launches", []))}


def _serving(step: Step, out: Path, deadline: Deadline, say) -> bool:
    """The registered operators' launch overhead, and whole models end to end in fp32 and fp16 (each
    its own process: the flow runs on the GPU machine)."""
    done = True
    # the search on the estimate: its kernels only are compiled (the cuda timer compiles and times ten
    # proxies a layer, more than a command's 10 minutes for BERT on the GPU machine's 16 cores)
    for args in (["benchmarks.launch_overhead", "--out", str(out / "launch-overhead.parquet")],
                 ["benchmarks.end_to_end", "--timer", "estimate", "--out", str(out / "end-to-end.parquet")],
                 ["benchmarks.end_to_end", "--timer", "estimate", "--dtype", "fp16", "--out",
                  str(out / "end-to-end-fp16.parquet")]):
        if deadline.over():
            return False
        try:
            p = subprocess.run([sys.executable, "-m", *args], capture_output=True, text=True, cwd=ROOT,
                               timeout=max(30.0, deadline.left()))
            say(f"{' '.join(args)}: exit {p.returncode}\n{(p.stdout + p.stderr)[-3000:]}")
            done &= p.returncode == 0
        except subprocess.TimeoutExpired:
            say(f"{' '.join(args)}: stopped at the time budget")
            return False
    return done


# --- report ---------------------------------------------------------------------------------------------------


COUNTER_COLUMNS = ("id", "status", "issue_active_pct", "occupancy_pct", "theoretical_occupancy_pct",
                   "cycles_per_issue", "data_stall_pct", "fetch_stall_pct", "l1_pct", "l2_pct", "dram_pct",
                   "l1_hit_pct", "l2_hit_pct", "top_stall", "message")


def report(step: Step | None = None, results: Path = RESULTS) -> None:
    """The tables of a step's results (every step's when none is given), on any machine."""
    import pyarrow.parquet as pq

    from benchmarks import analysis

    markdown = analysis._table_format[0] == "markdown"

    def heading(text: str) -> None:
        print(f"\n### {text}" if markdown else f"\n== {text}")

    for s in ([step] if step else STEPS):
        folders = sorted(Path(results).glob(f"*/{s.name}"))
        if step is not None and not folders:
            print(f"{s.name}: no results under {Path(results)}/*/{s.name} (`status` says what it needs)")
        for folder in folders:
            speed = with_plan_columns([r for f in sorted(folder.glob("kernel-speed-*.parquet"))
                                       for r in pq.read_table(f).to_pylist()])
            state = _state_words(s, folder.parent.name,
                                 step_state(s, results).get(folder.parent.name, {}).get("state", "not run"), CARRY, results,
                                 plan=False)  # the tables of what was measured: status tells what is new
            for table in ("launch-overhead", "end-to-end", "end-to-end-fp16"):  # the serving step's
                if (folder / f"{table}.parquet").is_file():
                    heading(f"{s.name} on {folder.parent.name} ({state}): {table}")
                    analysis.print_table(f"{table} ({folder / f'{table}.parquet'})",
                                         pq.read_table(folder / f"{table}.parquet").to_pylist())
            if (folder / "counters.parquet").is_file():
                from benchmarks import kernel_counters

                counters = pq.read_table(folder / "counters.parquet").to_pylist()
                heading(f"{s.name} on {folder.parent.name} ({state}): {len({r['id'] for r in counters})} kernels profiled")
                analysis.print_table("hardware counters (ncu): issue-slot use, achieved and theoretical occupancy, "
                                     "cycles between a warp's instructions, the shares of stall cycles spent waiting "
                                     "for data (" + "+".join(kernel_counters.DATA_STALLS) + ") and instructions ("
                                     + "+".join(kernel_counters.FETCH_STALLS) + "), each memory level's throughput "
                                     "as % of its peak (- where not collected)",
                                     [{header: kernel_counters._cell(r.get(key), fmt) for key, header, fmt
                                       in kernel_counters.SUMMARY_COLUMNS if key in COUNTER_COLUMNS}
                                      for r in kernel_counters.summary_rows(counters)])
            if not speed:
                continue
            measured = sum(r.get("status") == "ok" for r in speed)
            heading(f"{s.name} on {folder.parent.name} ({state}): {len(speed)} launches"
                    + (f", {measured} measured, {len(speed) - measured} failed or not compiled" if measured < len(speed)
                       else ""))
            if any(r.get("set") == "ab" for r in speed):
                analysis.print_table("A/B: each design's time over today's kernel on the same tile (< 1 is faster)",
                       analysis.ab_summary(speed))
                decision = analysis.design_decision(speed)
                analysis.print_table("each design against the baseline on the same tiles (issue 30, item 3)",
                                     analysis.design_table(speed, decision))
                print(f"the default by issue 30's rule: {decision['default']} ("
                      f"{'changed from the baseline' if decision['changed'] else 'the baseline kept'}); the best "
                      f"median per-nonzero efficiency at 0.9 is {decision['best_median_efficiency']:.3f}"
                      + (f", under {analysis.DIAGNOSIS_EFFICIENCY}: diagnosis first" if decision["diagnose_first"] else ""))
                per_layer, verdict = analysis.design_choice(speed)
                analysis.print_table("the estimate alone (the bundle's, before the design price): its design per layer "
                                     "against the best measured (issue 35)", per_layer)
                analysis.print_table("the estimate alone: its verdict (targets: within 5% on ≥ 80% of layers, geomean "
                                     "≥ 1.2× the best single design)", [verdict])
                from benchmarks.design_estimate import price_verdicts

                for path in sorted(folder.glob("kernel-speed-ab*.parquet")):
                    analysis.print_table(f"--design auto's design price on {path.name} (issue 35; the same targets)",
                                         price_verdicts(path))
            if any(r.get("set") == "micro" for r in speed):
                analysis.print_table("diagnosis kernels (µs)", [{k: r.get(k) for k in ("layer", "design", "ours_us", "spread",
                                                                          "tile_code_bytes_mean")}
                                                 for r in speed if r.get("set") == "micro"])
                split = analysis.split_summary(speed)
                if split:
                    analysis.print_table("the K split on the footprint tiles at 16 walks (issue 35: a section's code "
                                         "cached over the walks)", split)
            if any(r.get("set") == "reorder" for r in speed):
                rows, corr = analysis.reorder_summary(speed, reorder_nnc())
                analysis.print_table("row orders, same tile and design (issue 33): µs and Σ nnc; kept over Algorithm 1",
                                     rows)
                print(f"time against Σ nnc (each over its layer's Algorithm 1 kernel): Pearson r = {corr:.3f}; "
                      f"layers slower than Algorithm 1's order beyond the spreads: "
                      f"{sum(r.get('slower_beyond_spread', False) for r in rows)} of {len(rows)}")
            if any(r.get("set") == "nm" for r in speed):
                analysis.print_table("N:M layers: ours against our unstructured kernel at the same sparsity and SGEMM "
                                     "(target: NM-SpMM's A100 ratios, work-bound layers)", analysis.nm_summary(speed))
            if any(r.get("set") == "nm-spmm" for r in speed):
                analysis.print_table("NM-SpMM's shapes: our N:M kernel against SGEMM (target: NM-SpMM's A100 ratios)",
                                     analysis.nm_spmm_summary(speed))
            if any(r.get("set") == "latency" for r in speed):
                from lospmm.devices import device_named
                from lospmm.kernel.estimate import estimate_timer

                # beside the bundle's estimate, today's (the bundle's came before the occupancy fix)
                today = {"today's estimate": estimate_timer(device_named("h100"))}
                analysis.print_table("latency A/B: each variant's time over the flow's kernel (prefetch 1, the "
                                     "predicted registers, -O1) on the same layer and tile; < 1 is faster",
                                     analysis.variant_summary(speed, "latency", analysis.LATENCY_REFERENCE, True,
                                                              today))
            if any(r.get("set") == "prefetch-tiles" for r in speed):
                analysis.print_table("tall tiles and deep prefetch: each kernel's time over the flow's (the "
                                     "estimate's cheapest tile at depth 1) on the same layer; prefetch-P: the "
                                     "cheapest tile at depth P, prefetch-P-tile: that tile at depth 1; < 1 is faster",
                                     analysis.variant_summary(speed, "prefetch-tiles", analysis.PREFETCH_REFERENCE))
                analysis.print_table("what the depth alone saves: each deep kernel over its tile at depth 1 (< 1 is "
                                     "faster), measured and as the estimate said",
                                     analysis.prefetch_depth_summary(speed))
            if any(r.get("set") == "staged" for r in speed):
                from lospmm.devices import device_named
                from lospmm.kernel.estimate import estimate_timer

                # which model of instruction supply holds: the calibrations' (1.5-1.8 bytes a cycle an SM)
                # predict the staged kernels slower, the datasheet's (32) faster (benchmarks/results/staged_estimate.txt)
                gpu = device_named(folder.parent.name if folder.parent.name in ("h100", "h200") else "h100")
                models = {"calibrated": estimate_timer(gpu), "datasheet": estimate_timer(gpu, calibrated=False)}
                analysis.print_table("staged A/B: the staged design's time over the chained kernel on the same tiles "
                                     "(< 1 is faster), beside what the estimate predicted (the bundle's: the H100's "
                                     "calibration) and what it gives on this GPU calibrated and from the datasheet",
                                     analysis.variant_summary(speed, "staged", "chained", True, models))
            if any(r.get("set") == "conv" for r in speed):
                analysis.print_table("implicit-im2col convolutions: ours against the GEMM kernel of the same A on B "
                                     "already expanded (im2col not counted), the streamed and staged designs' conv "
                                     "kernels of the same M1 and cuDNN fp32; the N:M conv kernel against the baked "
                                     "conv kernel of the same 2:4 A", analysis.conv_summary(speed))
            half = analysis.half_rows(speed)
            if half:
                analysis.print_table("half precision against cuBLAS in the same dtype and our fp32 kernel on the same tile",
                       analysis.half_summary(half))
                for dtype in ("fp16", "bf16"):
                    print(f"{dtype}: the fastest sums meeting the accuracy bar on every kernel: "
                          f"{analysis.chosen_accumulation(half, dtype) or 'none meets it'}")
            gemm = [r for r in speed if r.get("set") in ("headline", "ab") and r.get("role") == "full"]
            if gemm:
                analysis.print_table("against cuBLAS (the fastest design per layer and N)", analysis.headline_summary(gemm))
                from lospmm.devices import device_named

                gpu = device_named(folder.parent.name if folder.parent.name in ("h100", "h200") else "h100")
                analysis.print_table(f"work-bound kernels by multiply-adds per B load: % of {gpu.name}'s FP32 peak, and "
                                     f"what B's loads allow through L2 and L1", analysis.reuse_summary(gemm, gpu))
                analysis.print_table(f"work-bound kernels by the estimate's largest term ({gpu.name})",
                                     analysis.binding_terms(gemm, gpu))
            launches = [r for r in speed if r.get("set") == "sample"]
            if launches:
                analysis.print_table("Table 4, measured", analysis.table4_rows(launches))


# the plan's columns that name what was measured whatever the code: a row order, a pruning, an epilogue
# (not an N:M blocking: the plan's blocking today need not be the one a row measured then)
STABLE_PLAN_COLUMNS = ("order", "prune", "epilogue")


def with_plan_columns(rows: list[dict]) -> list[dict]:
    """Launch rows with their plan's stable columns (STABLE_PLAN_COLUMNS). Rows measured before the
    launch rows carried them (the H200's reorder and nm-spmm steps of 2026-11-26) get them from their
    set's plan, matched by kernel id; those two plans are pure and take a fraction of a second."""
    from benchmarks.sets import nm_spmm_plan, reorder_plan

    lacking = {r.get("set") for r in rows if any(c not in r for c in STABLE_PLAN_COLUMNS)}
    planned = {p.id: p for name, plan in (("reorder", reorder_plan), ("nm-spmm", nm_spmm_plan)) if name in lacking
               for p in plan()}
    return [{**{c: getattr(planned[r["id"]], c) for c in STABLE_PLAN_COLUMNS}, **r} if r.get("id") in planned else r
            for r in rows]


def reorder_nnc() -> dict[str, tuple[int, int]]:
    """Σ nnc and max nnc of every kernel of the reorder set, from its planned tiles (host only)."""
    from benchmarks.sets import matrix_of, ordered, reorder_plan

    out = {}
    for p in reorder_plan():
        tiles = ordered(matrix_of(p), p)
        out[p.id] = (int(tiles.tile_nnc.sum()), int(tiles.tile_nnc.max()))
    return out


# --- wheels the GPU image lacks ---------------------------------------------------------------------------------

# What the GPU image already holds (its package list, as the workplace's KINDS.md read it on
# 2026-11-17); a wheel of one of these is not carried, so the image's own version is used.
ON_IMAGE = set("""absl-py accelerate aiofiles aiohappyeyeballs aiohttp aiosignal annotated-doc anyio attrs botorch build
certifi charset-normalizer chex click cloudpickle cmake colorama contourpy coverage cuda-bindings cuda-core
cuda-pathfinder cuda-toolkit cupy-cuda13x cycler cython diffrax e3nn einops equinox etils execnet filelock flatbuffers
flax fonttools formulaic frozenlist fsspec gpytorch grpcio h11 h5py hf-xet httpcore httpx humanize hypothesis idna
imageio iniconfig interface-meta jax jaxlib jaxtyping jinja2 joblib kiwisolver lazy-loader lightning linear-operator
lineax llvmlite lxml markdown markdown-it-py markupsafe matplotlib mdurl meson ml-dtypes mpi4py mpmath msgpack multidict
multipledispatch mypy-extensions nanobind narwhals networkx ninja numba numba-cuda numpy numpyro onnx onnx-ir onnxruntime
onnxscript opencv-python-headless optax opt-einsum optimistix packaging pandas pathspec patsy peft pillow pip pluggy
portalocker prometheus-client propcache protobuf psutil pyarrow pybind11 py-cpuinfo pygments pyparsing pyproject-hooks
python-dateutil pyyaml regex requests rich safetensors scikit-learn scipy seaborn setuptools shellingham simplejson six
sortedcontainers statsmodels sympy tabulate threadpoolctl tifffile timm tokenizers toolz torch tqdm typer
typing-extensions typing-inspect urllib3 uvloop werkzeug wheel wrapt xarray xxhash yarl zipp""".split())
WHEELS = ("prefect==3.8.8", "fastapi==0.150.0", "lightgbm==4.7.0", "mtkahypar==1.7.post1")  # the versions pyproject.toml resolves to here
PLATFORMS = ("manylinux_2_35_x86_64", "manylinux_2_34_x86_64", "manylinux_2_31_x86_64", "manylinux_2_28_x86_64",
             "manylinux_2_27_x86_64", "manylinux_2_24_x86_64", "manylinux_2_17_x86_64", "manylinux2014_x86_64",
             "manylinux1_x86_64")


def wheels(dest: Path = ROOT / ".whl") -> None:
    """The wheels (with their dependencies) that the GPU image lacks, for CPython 3.12 x86-64, into
    `dest` (git-ignored): Prefect's stack for `pytest -m gpu`'s flow test and the serving step, and
    LightGBM. On the GPU machine `run` installs them itself (with_wheels)."""
    import re
    import tempfile

    with tempfile.TemporaryDirectory() as tmp:
        cmd = [sys.executable, "-m", "pip", "download", "-q", "--only-binary=:all:", "--python-version", "3.12",
               "--implementation", "cp", *(f"--platform={p}" for p in PLATFORMS), "-d", tmp, *WHEELS]
        if subprocess.run(cmd).returncode:
            raise SystemExit("pip download failed (is PyPI reachable?)")
        dest.mkdir(exist_ok=True)
        kept = []
        for whl in sorted(Path(tmp).glob("*.whl")):
            name = re.sub(r"[-_.]+", "-", whl.name.split("-")[0]).lower()
            if name not in ON_IMAGE:
                shutil.copy(whl, dest / whl.name)
                kept.append(whl.name)
    size = sum((dest / k).stat().st_size for k in kept)
    print(f"{len(kept)} wheels, {size / 2**20:.1f} MiB in {dest}")


WHEEL_MODULES = ("prefect", "lightgbm")  # what the steps that need the wheels import


def with_wheels(wheel_dir: Path, modules: tuple[str, ...] = WHEEL_MODULES, install: Callable = subprocess.run) -> None:
    """The carried wheels installed into this Python when a module the step needs is missing: with
    `sys.executable -m pip` (the GPU image's `pip` on PATH belongs to another Python: it found neither
    numpy nor anyio and installed nothing), offline from `wheel_dir`. SystemExit with one line when
    they are not carried or the install leaves a module missing, before any device time is spent."""
    import importlib
    import importlib.util

    missing = [m for m in modules if importlib.util.find_spec(m) is None]
    if not missing:
        return
    if not any(Path(wheel_dir).glob("*.whl")):
        raise SystemExit(f"this step needs {', '.join(missing)}, not on this machine and no wheels carried in "
                         f"{wheel_dir}: run `python -m benchmarks.device wheels` there and carry .whl")
    names = [w.split("==")[0] for w in WHEELS]
    done = install([sys.executable, "-m", "pip", "install", "-q", "--no-index", "--find-links", str(wheel_dir), *names])
    importlib.invalidate_caches()
    still = [m for m in modules if importlib.util.find_spec(m) is None]
    if getattr(done, "returncode", 0) or still:
        raise SystemExit(f"installing the wheels of {wheel_dir} left {', '.join(still) or 'pip failing'}: "
                         f"`{sys.executable} -m pip install --no-index --find-links {wheel_dir} {' '.join(names)}` "
                         f"says why")


RESTARTS = "LOSPMM_DEVICE_RESTARTS"  # how many times this command has started itself again
MAX_RESTARTS = 4


def restarted(argv: list[str], left_s: float, lost: ContextLost) -> None:
    """The same command in a fresh process (this one's CUDA context is lost), with the budget left:
    the step goes on from its progress file past the kernel that faulted (its row records the fault).
    Exits 75 instead when it has restarted MAX_RESTARTS times or too little time is left."""
    count = int(os.environ.get(RESTARTS, "0"))
    print(f"{lost}", flush=True)
    if count >= MAX_RESTARTS or left_s < 60:
        print(f"not starting again ({count} restarts, {left_s:.0f} s left): run the command again to go on",
              flush=True)
        sys.exit(75)
    os.environ[RESTARTS] = str(count + 1)
    args = [a for i, a in enumerate(argv) if a != "--budget-s" and (i == 0 or argv[i - 1] != "--budget-s")]
    args = [a for a in args if not a.startswith("--budget-s=")]
    print(f"starting again in a fresh process ({count + 1} of at most {MAX_RESTARTS}), {left_s:.0f} s left", flush=True)
    os.execv(sys.executable, [sys.executable, "-m", "benchmarks.device", *args, "--budget-s", f"{left_s:.0f}"])


def _positive_seconds(text: str) -> float:
    value = float(text)
    if not value > 0:
        raise argparse.ArgumentTypeError(f"must be a number of seconds above 0, got {text}")
    return value


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(prog="python -m benchmarks.device", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = ap.add_subparsers(dest="command", required=True)
    sub.add_parser("status", help="what is done, on which device, and what the next step needs")
    p = sub.add_parser("prepare", help="build a step's bundles here (no GPU) and pack them to carry")
    p.add_argument("step", choices=STEP_NAMES)
    p.add_argument("--jobs", type=int, default=os.cpu_count() or 2)
    p.add_argument("--no-pack", action="store_true", help="build only (into ~/.cache/lospmm/bundles)")
    for name, help_ in (("run", "one step on this GPU (resumable)"), ("next", "the next steps that fit the time left")):
        p = sub.add_parser(name, help=help_)
        if name == "run":
            p.add_argument("step", choices=STEP_NAMES)
        p.add_argument("--budget-s", type=_positive_seconds, default=STEP_LIMIT_S,
                       help=f"seconds this command may take (default {STEP_LIMIT_S:.0f}, the most a step takes in one "
                            f"device command; `next` runs steps while they fit)")
        p.add_argument("--build", action="store_true", help="build a missing bundle here (the GPU machine's cores)")
        p.add_argument("--jobs", type=int, default=os.cpu_count() or 16,
                       help="cores for a build here (default: this machine's)")
        p.add_argument("--pack", type=Path, help="an archive of benchmarks/results, packed as the step goes "
                       f"(every {PACK_EVERY_S:.0f} s and at its end): $OUT/results.tgz on the GPU machine")
    p = sub.add_parser("window", help="here: the device calls a window should make, what each carries and runs")
    p.add_argument("--kind", default="h100", choices=GPU_KINDS, help="the GPU's results folder (default h100)")
    p.add_argument("--budget-s", type=_positive_seconds, default=900.0,
                   help="the window's device seconds (default 900: status' budget_left_s)")
    p.add_argument("--build-there", action="store_true",
                   help="a step whose bundles are not prepared here builds them on the GPU machine (wheels carried)")
    p.add_argument("--again", nargs="*", default=[], choices=STEP_NAMES,
                   help="steps to measure again where done (their kernels changed since)")
    p = sub.add_parser("report", help="a step's tables from its results (every step's by default)")
    p.add_argument("step", nargs="?", choices=STEP_NAMES)
    p.add_argument("--markdown", action="store_true", help="the tables as GitHub Markdown (the README's)")
    p = sub.add_parser("verdict", help="every open issue's device target against the committed results: "
                                       "measured, met or not, or which step measures it")
    p.add_argument("--device", default="h100", choices=GPU_KINDS,
                   help="the results folder judged (default h100: the issues name the H100)")
    p.add_argument("--markdown", action="store_true", help="the table as GitHub Markdown (the README's)")
    sub.add_parser("wheels", help="download the wheels the GPU image lacks into .whl/ (no GPU)")
    args = ap.parse_args(argv)
    if args.command == "status":
        status()
    elif args.command == "prepare":
        from lospmm.kernel.sass import NvdisasmMissing

        try:
            prepare(step_named(args.step), args.jobs, pack=not args.no_pack)
        except NvdisasmMissing as e:  # before anything is built: one line, what to install
            raise SystemExit(f"error: {e}") from None
    elif args.command in ("run", "next"):
        started = time.monotonic()
        try:
            if args.command == "run":
                run_step(step_named(args.step), min(args.budget_s, STEP_LIMIT_S), build=args.build, jobs=args.jobs,
                         pack=args.pack)
            else:
                with ResultsPacker(args.pack):
                    next_steps(args.budget_s, args.build, args.jobs)
        except ContextLost as e:
            restarted(argv if argv is not None else sys.argv[1:], args.budget_s - (time.monotonic() - started), e)
    elif args.command == "window":
        print_window(args.kind, args.budget_s, tuple(args.again), build_there=args.build_there)
    elif args.command == "report":
        from benchmarks import analysis

        analysis.set_table_format("markdown" if args.markdown else "terminal")
        report(step_named(args.step) if args.step else None)
    elif args.command == "verdict":
        from benchmarks import analysis
        from benchmarks.verdict import tally, verdict_rows

        analysis.set_table_format("markdown" if args.markdown else "terminal")
        rows = verdict_rows(RESULTS, args.device)
        analysis.print_table(f"the open issues' device targets on {args.device}'s committed results "
                             f"(benchmarks/results/{args.device}/): {tally(rows)}; work-bound: cuBLAS SGEMM "
                             f"≥ {analysis.WORK_BOUND_US:g} µs (FP16 ≥ {analysis.HALF_WORK_BOUND_US:g} µs) at that N",
                             rows)
    else:
        wheels()


if __name__ == "__main__":
    main()
