"""Stage 9, time: each chosen candidate's proxy, compiled, as one launch for the run's timer (the
`estimate` model without a GPU, the `cuda` timer with one: lospmm.kernel.estimate and
lospmm.kernel.cuda behind the one Timer protocol of lospmm.kernel.timing)."""

from __future__ import annotations

from lospmm.kernel.layout import proxy_layout
from lospmm.kernel.spec import KernelSpec
from lospmm.kernel.timing import LaunchUnderTest
from lospmm.kernel.design import KernelDesign
from lospmm.stages.pad import proxy_dynamic_shared
from lospmm.status import Status


def untimed_reason(launch: dict, compiled: dict | None, has_clusters: bool) -> str:
    """Why a chosen candidate's proxy cannot be timed ("" if it can): its launch failed upstream,
    or its proxy did not compile (or has no clusters)."""
    if launch["status"] != Status.OK:
        return launch["message"]
    if compiled is None or compiled["status"] != Status.OK or not has_clusters:
        return "its proxy did not compile"
    return ""


def proxy_under_test(launch: dict, compiled: dict, clusters, design: KernelDesign,
                     cubin: bytes | None = None) -> LaunchUnderTest:
    """The launch of a candidate's proxy (its 07_launch row `launch`, its M1's 08_compiled row
    `compiled` and clusters): at the candidate's N1 with its Eq. 6 shared memory (less what the proxy declares), registers and
    spills as compiled (the most one thread executes), and the compiled proxy's spec for a timer
    that runs it (with its `cubin`)."""
    m, k = launch["m"], launch["k"]
    spec = KernelSpec(compiled["kernel"], "proxy", m, k, clusters.m1, proxy_layout(len(clusters.cluster_of), design),
                      len(clusters.cluster_of), design)
    return LaunchUnderTest(None, m, k, launch["n"], launch["n1"], compiled["registers"],
                           int(compiled["thread_spill_bytes"]), proxy_dynamic_shared(launch["smem_bytes"], clusters, design, launch["n1"]),
                           clusters=clusters, spec=spec, cubin=cubin)
