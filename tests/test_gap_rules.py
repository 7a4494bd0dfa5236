"""The rules of glmfb gap as tables: findings in, rule and diagnosis out (no timing)."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import pytest

from glmfb.contract.verdict import Status
from glmfb.core.commandline import shell_line
from glmfb.core.measure.hostload import HostLoad
from glmfb.core.rules import diagnose
from glmfb.core.targets import Target
from glmfb.gap.attribution import GilFinding
from glmfb.gap.bandwidth import BandwidthCheck
from glmfb.gap.config import GapConfig
from glmfb.gap.engine import next_steps
from glmfb.gap.phases import PhaseChange
from glmfb.gap.rules import RULES, GapFindings

GREW = (PhaseChange("kv_wait_s", None, 0.169),)
# The prefill itself grew (it waits for the GIL or a CPU inside it): no phase only the candidate
# runs carries the gap.
PREFILL_GREW = (PhaseChange("prefill_s", 0.05, 0.095, 0.9, (0.7, 1.1)),)
HOLDER_IDLE = GilFinding(available=True, status="fail", holder_thread="MainThread", holder_function="intranode_dispatch",
                         holder_file="scenarios/kv_transfer/dispatch.py", holder_line=39, holder_idle_share=0.97,
                         native_frame="usleep", starved_thread="kv-transfer", starved_waiting_share=0.4)
HOLDER_BUSY = GilFinding(available=True, status="fail", holder_thread="sender", holder_function="dumps",
                         holder_file="x.py", holder_line=3, holder_idle_share=0.05, starved_thread="MainThread")
SATURATED = BandwidthCheck("mooncake", 1e8, 9.5e8, 1e9, 1e9)
BULK_HELD_BACK = BandwidthCheck("mooncake", 134217728, 491029198, 1175335769, 1198408577,
                                ceiling_samples=(926736778, 1158116343, 1179977906, 1176973542, 1175335769))
PICKLING = GilFinding(available=True, status="fail", holder_thread="kv-sender", holder_function="pickle.dumps",
                      holder_c_function="pickle.dumps", holder_python_function="PrefillKV._send_loop",
                      holder_file="gap_workloads.py", holder_line=244, holder_idle_share=0.0,
                      starved_thread="prefill", starved_waiting_share=0.27, starved_of_runnable=0.51,
                      starved_of_runnable_ci=(0.42, 0.6))
COMPRESSING = GilFinding(available=True, status="pass", holder_thread="prefill",
                         holder_function="torch::autograd::THPVariable_linear", holder_idle_share=0.0,
                         starved_thread="kv-sender", starved_waiting_share=0.03, starved_of_runnable=0.05,
                         starved_of_runnable_ci=(0.0, 0.1), cpu_victim="prefill", cpu_victim_runqueue_share=0.72,
                         cpu_victim_cpu_share=0.14, cpu_victim_gil_share=0.066, cpu_victim_gil_of_runnable=0.24,
                         competitor_thread="kv-sender", competitor_function="zlib.compress",
                         competitor_cpu_share=0.16, competitor_cpu_fraction=0.52, shared_cpus="0")
# Issue 37: a prefill beside two reused pool threads serializing each layer with
# pickle.dumps(tensor.tolist()): the prefill waited for the GIL 13% [11.8%, 15.3%] of its time
# off the run queue, under the fixed 20%, against a gap of +22-30%; it read over-threshold with
# an empty where while the why named THPVariable_tolist on kv-serializer_0 as the holder.
TOLIST = GilFinding(available=True, status="pass", holder_thread="kv-serializer_0",
                    holder_function="torch::autograd::THPVariable_tolist",
                    holder_c_function="torch::autograd::THPVariable_tolist", holder_python_function="_serialize",
                    holder_c_source="py-spy --native", holder_file="gap_workloads.py", holder_line=132,
                    holder_idle_share=0.0, holder_share=0.2, starved_thread="prefill", starved_waiting_share=0.122,
                    starved_waiting_ci=(0.111, 0.144), starved_of_runnable=0.13, starved_of_runnable_ci=(0.118, 0.153),
                    canary_p99_ms=3.0)
# Its clean twin, the same work in forked processes: the prefill barely waits for the GIL.
FORKED = replace(TOLIST, holder_thread="prefill", holder_function="torch::autograd::THPVariable_linear",
                 holder_c_function="torch::autograd::THPVariable_linear", holder_python_function="Linear.forward",
                 holder_file="linear.py", holder_line=134, starved_thread="kv-serializer_0", starved_waiting_share=0.012,
                 starved_waiting_ci=(0.004, 0.02), starved_of_runnable=0.013, starved_of_runnable_ci=(0.004, 0.022),
                 canary_p99_ms=0.4)


CONFIG = GapConfig(name="gap", baseline=Target("a.py:prefill"), candidate=Target("a.py:transfer"), repeats=30,
                   budget_s=30.0)


def findings(gap: float, low: float, high: float, **kwargs: Any) -> GapFindings:
    values: dict[str, Any] = dict(gap=gap, low=low, high=high, threshold=0.05, iterations=20, stopped_by="decided",
                                  budget_s=30.0, repeats=30, grown=GREW,
                                  **next_steps(CONFIG, attributed="gil" in kwargs))
    values.update(kwargs)
    return GapFindings(**values)


TABLE = [
    (findings(0.04, 0.01, 0.08, stopped_by="budget"), "undecided", Status.INCONCLUSIVE, ["straddles", "30 s budget"]),
    (findings(0.01, -0.01, 0.03), "pass", Status.PASS, ["Within the threshold"]),
    (findings(0.4, 0.3, 0.5, gil=HOLDER_IDLE), "gil-starved-sender", Status.FAIL,
     ["kv_wait_s 169 ms (only in the candidate)", "A missing GIL release in intranode_dispatch",
      "idle in a native call (usleep)"]),
    (findings(0.4, 0.3, 0.5, gil=HOLDER_BUSY), "gil-starved-sender", Status.FAIL, ["held by dumps", "computing"]),
    (findings(1.0, 0.9, 1.1, gil=PICKLING), "gil-starved-sender", Status.FAIL,
     ["prefill thread waited for the GIL 27% of the time (51% of the time it was not waiting for a CPU)",
      "held by pickle.dumps, called from PrefillKV._send_loop (gap_workloads.py:244), on thread kv-sender"]),
    (findings(1.0, 0.9, 1.1, gil=COMPRESSING), "cpu-contention", Status.FAIL,
     ["The prefill thread waited for a CPU 72% of the time", "thread kv-sender ran in zlib.compress",
      "52% of the CPU time", "CPU contention, not the GIL"]),
    # A helper that waits for the GIL a little (noisy interval) beside a computing prefill: not the GIL.
    (findings(1.0, 0.9, 1.1, gil=replace(COMPRESSING, starved_thread="kv-sender", starved_of_runnable=0.19,
                                         starved_of_runnable_ci=(0.01, 0.37))), "cpu-contention", Status.FAIL, []),
    # Measured under load: the short-lived zlib senders waited for the GIL the CPU-starved prefill
    # held (its attention code); their GIL wait follows from the CPU contention, the gap is the CPU's.
    (findings(1.0, 0.9, 1.1, gil=replace(COMPRESSING, holder_function="sdpa_attention_forward",
                                         starved_thread="Thread-N (_send_layer)", starved_of_runnable=0.31,
                                         starved_of_runnable_ci=(0.18, 0.44), competitor_thread="Thread-N (_send_layer)",
                                         competitor_thread_count=95)), "cpu-contention", Status.FAIL,
     ["95 short-lived threads Thread-N (_send_layer) (taken as one) waited for the GIL 31% of the time it was not "
      "waiting for a CPU, held by prefill, the thread the contention slowed: CPU contention, not the GIL"]),
    # The same waits when the holder is not the thread the contention slowed: the GIL's.
    (findings(1.0, 0.9, 1.1, gil=replace(COMPRESSING, holder_thread="kv-sender", starved_thread="prefill",
                                         starved_of_runnable=0.31, starved_of_runnable_ci=(0.18, 0.44))),
     "gil-starved-sender", Status.FAIL, []),
    # A CI run of gap-sender-zlib-cpu-contention on a loaded host: the prefill waited 33% of the
    # time for its one CPU (1% in the baseline's run) and 18% for the GIL, an unsettled share
    # ([0.4%, 56%] of its time off the run queue); the sender ran zlib.compress there 49% of the
    # time. It read over-threshold ("neither explains"); the CPU wait is the larger, decided part.
    (findings(2.18, 1.65, 2.82, gil=replace(
        COMPRESSING, holder_thread="kv-sender", holder_function="torch::autograd::THPVariable_numpy",
        starved_thread="prefill", starved_waiting_share=0.1847, starved_of_runnable=0.2766,
        starved_of_runnable_ci=(0.0039, 0.5614), cpu_victim_runqueue_share=0.3323, cpu_victim_cpu_share=0.3061,
        cpu_victim_gil_share=0.1847, cpu_victim_gil_of_runnable=0.2766, competitor_cpu_share=0.4918,
        competitor_cpu_fraction=0.6081, baseline_compared=True, cpu_victim_baseline_runqueue_share=0.0113)),
     "cpu-contention", Status.FAIL,
     ["The prefill thread waited for a CPU 33% of the time against 1% in the baseline's run",
      "the GIL explains less of it: prefill waited for the GIL 18% of the time, less than for a CPU, and that "
      "share is not settled (0% to 56% of its time off the run queue)", "CPU contention, not the GIL"]),
    # A fresh-clone run of gap-sender-zlib-thread-per-layer-cpu-contention on a loaded host: the
    # gil probe named the prefill the holder and the per-layer senders the starved threads (8% of
    # their time off the run queue); the prefill itself waited 33% of the time for its one CPU
    # (2% in the baseline's run) and 22% for the GIL, an unsettled share ([8%, 55%]). It read
    # over-threshold: the unsettled test looked only at the thread named most starved.
    (findings(2.10, 1.40, 2.99, threshold=0.5, gil=replace(
        COMPRESSING, status="fail", starved_thread="Thread-N (_send_layer)", starved_waiting_share=0.044,
        starved_of_runnable=0.0839, starved_of_runnable_ci=(0.0164, 0.2468), cpu_victim_runqueue_share=0.3309,
        cpu_victim_cpu_share=0.2189, cpu_victim_gil_share=0.2201, cpu_victim_gil_of_runnable=0.3289,
        cpu_victim_gil_of_runnable_ci=(0.0811, 0.5546), competitor_thread="Thread-N (_send_layer)",
        competitor_thread_count=49, competitor_cpu_share=0.3053, competitor_cpu_fraction=0.5338,
        baseline_compared=True, cpu_victim_baseline_runqueue_share=0.0208)),
     "cpu-contention", Status.FAIL,
     ["The prefill thread waited for a CPU 33% of the time against 2% in the baseline's run",
      "prefill waited for the GIL 22% of the time, less than for a CPU, and that share is not settled (8% to 55% "
      "of its time off the run queue)"]),
    # Its twin with the prefill's own GIL wait settled (interval clear of 10%): neither explains
    # it alone, and the verdict does not call it CPU contention.
    (findings(2.10, 1.40, 2.99, threshold=0.5, gil=replace(
        COMPRESSING, status="fail", starved_thread="Thread-N (_send_layer)", starved_waiting_share=0.044,
        starved_of_runnable=0.0839, starved_of_runnable_ci=(0.0164, 0.2468), cpu_victim_runqueue_share=0.3309,
        cpu_victim_gil_share=0.2201, cpu_victim_gil_of_runnable_ci=(0.2, 0.45))),
     "over-threshold", Status.FAIL, []),
    # The same run with the GIL wait settled (its interval clear of 10%, the share over 20%): the
    # GIL rule decides it, as before.
    (findings(2.18, 1.65, 2.82, gil=replace(
        COMPRESSING, holder_thread="kv-sender", starved_thread="prefill", starved_of_runnable=0.2766,
        starved_of_runnable_ci=(0.15, 0.4), cpu_victim_runqueue_share=0.3323, cpu_victim_gil_share=0.1847)),
     "gil-starved-sender", Status.FAIL, []),
    # A competitor that took little of the CPU, or a victim that mostly waited for the GIL: no CPU contention.
    (findings(1.0, 0.9, 1.1, gil=replace(COMPRESSING, competitor_cpu_fraction=0.1)), "over-threshold",
     Status.FAIL, []),
    (findings(1.0, 0.9, 1.1, gil=replace(COMPRESSING, cpu_victim_gil_share=0.4)), "over-threshold", Status.FAIL, []),
    (findings(0.4, 0.3, 0.5, bandwidth=SATURATED), "bandwidth-bound", Status.FAIL, ["the link is saturated"]),
    # A CI run of gap-bulk-transfer-bandwidth-bound (one 128 MiB write after the prefill, all on
    # one CPU): 7 of 12 iterations moved it at a quarter of the ceiling, so the transfer read 42%
    # of it, and the CPU wait the gil probe saw read cpu-contention. At the fastest ceiling
    # measured the bytes alone take 114 ms, more than a whole iteration may (72 ms): the link's.
    (findings(5.60, 4.48, 6.94, threshold=0.5, gil=replace(COMPRESSING, competitor_function=None),
              baseline_median_s=0.0481, bandwidth=BULK_HELD_BACK),
     "bandwidth-bound", Status.FAIL,
     ["42% of the mooncake ceiling", "the sender was held back, yet the bytes alone keep it over the threshold: at "
      "the fastest ceiling measured (1.18 GB/s) an iteration's 134 MB take 114 ms, longer than the 72 ms the "
      "threshold allows a whole iteration (the baseline's 48 ms + 50%)"]),
    # The same bytes where the ceiling's spread leaves the link's share unsettled: the why keeps
    # saying so rather than "the link was not the limit".
    (findings(5.60, 4.48, 6.94, threshold=0.5, baseline_median_s=0.0481,
              bandwidth=replace(BULK_HELD_BACK, achieved_bytes_per_s=9.0e8, page_rate_bytes_per_s=None)),
     "bandwidth-bound", Status.FAIL,
     ["whether the link was the limit is not settled: the ceiling's own spread decides it, yet the bytes alone "
      "keep it over the threshold: at the fastest ceiling measured (1.18 GB/s) an iteration's 134 MB take 114 ms"]),
    # Its twin: 1 MiB held back the same way (0.9 ms at the ceiling): the CPU's.
    (findings(5.60, 4.48, 6.94, threshold=0.5, gil=COMPRESSING, baseline_median_s=0.0481,
              bandwidth=replace(BULK_HELD_BACK, bytes_per_iteration=2**20)), "cpu-contention", Status.FAIL, []),
    # The bytes at the ceiling (80 ms) over the 75 ms a whole iteration may take, by less than
    # the gap's interval reaches below the gap: not shown, so not the link's.
    (findings(1.0, 0.6, 1.4, threshold=0.5, baseline_median_s=0.05,
              bandwidth=BandwidthCheck("mooncake", 8e7, 5e8, 1e9, None, ceiling_samples=(1e9,))),
     "candidate-only-phase", Status.FAIL, ["the link was not the limit", "Only the candidate runs kv_wait_s"]),
    (findings(0.4, 0.3, 0.5, gil=GilFinding(available=False, reason="py-spy missing")), "over-threshold",
     Status.FAIL, ["The GIL signal is missing: py-spy missing"]),
    # Issue 37: a GIL wait under the fixed share that explains most of the time the gap added.
    (findings(0.26, 0.22, 0.30, gil=TOLIST, baseline_median_s=0.05), "gil-starved-sender", Status.FAIL,
     ["The prefill thread waited for the GIL 12% of the time (13% of the time it was not waiting for a CPU)",
      "held by torch::autograd::THPVariable_tolist, called from _serialize (gap_workloads.py:132), on thread "
      "kv-serializer_0", "That wait comes to 8.2 ms of each candidate iteration, 63% of the 13 ms the gap added (at "
      "least 51% at the ends of both intervals): the GIL wait explains the gap."]),
    # The same wait against a gap three times as large: a quarter of it, not the GIL's.
    (findings(0.9, 0.7, 1.1, gil=TOLIST, baseline_median_s=0.05, grown=PREFILL_GREW), "over-threshold", Status.FAIL,
     ["The prefill thread waited for the GIL 12% of the time", "too little to lay the gap on the GIL"]),
    # Its clean twin over the threshold (a busy host's CPUs): the GIL wait is small against the gap.
    (findings(0.18, 0.12, 0.25, threshold=0.1, gil=FORKED, baseline_median_s=0.05, grown=PREFILL_GREW), "over-threshold", Status.FAIL,
     ["The gil probe saw no thread starved of the GIL", "neither the GIL nor CPU contention explains the gap"]),
    # ... with a GIL wait of a tenth of its time off the run queue: quoted, weighed, not blamed.
    (findings(0.9, 0.7, 1.1, threshold=0.1, baseline_median_s=0.05, grown=PREFILL_GREW, gil=replace(
        FORKED, starved_waiting_share=0.1, starved_waiting_ci=(0.08, 0.12), starved_of_runnable=0.11,
        starved_of_runnable_ci=(0.09, 0.13))), "over-threshold", Status.FAIL,
     ["The kv-serializer_0 thread waited for the GIL 10% of the time (11% of the time it was not waiting for a CPU)",
      "That wait comes to 10 ms of each candidate iteration, 23% of the 45 ms the gap added (at least 17% at the ends "
      "of both intervals): too little to lay the gap on the GIL."]),
    # ... and under it.
    (findings(0.027, 0.0, 0.06, threshold=0.1, gil=FORKED), "pass", Status.PASS, ["Within the threshold"]),
    # Half of the added time at the estimates, but under a quarter at the ends of both intervals.
    (findings(0.26, 0.07, 0.9, gil=replace(TOLIST, starved_of_runnable_ci=(0.05, 0.2)), baseline_median_s=0.05, grown=PREFILL_GREW),
     "over-threshold", Status.FAIL, ["63% of the 13 ms the gap added (at least 11% at the ends of both intervals): "
                                     "not settled enough to lay the gap on the GIL"]),
]


def test_a_c_function_named_from_the_source_line_says_so() -> None:
    from dataclasses import replace

    from glmfb.gil.holders import SOURCE_LINE

    sentence = replace(PICKLING, holder_c_source=SOURCE_LINE).sentence()
    assert "held by pickle.dumps, called from PrefillKV._send_loop (gap_workloads.py:244) (named from that line's " \
           "only call, a C function; py-spy --native sampled no frame below it), on thread kv-sender" in sentence
    assert "named from" not in PICKLING.sentence()


@pytest.mark.parametrize(("case", "rule", "status", "phrases"), TABLE, ids=[row[1] for row in TABLE])
def test_rule_table(case: GapFindings, rule: str, status: Status, phrases: list[str]) -> None:
    outcome = diagnose(RULES, case)
    assert outcome.rule.name == rule, outcome.diagnosis.why
    assert outcome.diagnosis.status is status
    for phrase in phrases:
        assert phrase in outcome.diagnosis.why, outcome.diagnosis.why


def test_a_missing_release_names_the_starved_thread_and_the_holder() -> None:
    diagnosis = diagnose(RULES, findings(0.4, 0.3, 0.5, gil=HOLDER_IDLE)).diagnosis
    assert diagnosis.where == {"thread": "kv-transfer", "function": "intranode_dispatch",
                               "file": "scenarios/kv_transfer/dispatch.py", "line": 39}
    after = diagnosis.next[-1]
    assert (after.command, after.why) == ("gap", "after the fix")
    assert after.arguments == {"baseline": "a.py:prefill", "candidate": "a.py:transfer", "repeats": 30,
                               "budget": "30s"}
    assert shell_line(after) == "glmfb gap a.py:prefill a.py:transfer --repeats 30 --budget 30s  # after the fix"


def test_undecided_asks_for_twice_the_repeats_and_budget() -> None:
    (step,) = diagnose(RULES, findings(0.04, 0.01, 0.08, stopped_by="budget")).diagnosis.next
    assert step.command == "gap" and step.arguments == {
        "baseline": "a.py:prefill", "candidate": "a.py:transfer", "repeats": 60, "budget": "60s"}
    assert step.why == "more evidence, on a quieter machine"


def test_cpu_contention_names_the_competitors_function_never_glmfb() -> None:
    diagnosis = diagnose(RULES, findings(1.0, 0.9, 1.1, gil=COMPRESSING)).diagnosis
    assert diagnosis.where == {"thread": "prefill", "function": "zlib.compress"}
    assert "glmfb/" not in diagnosis.why and "held by" not in diagnosis.why


def test_the_starved_prefill_thread_and_the_holders_c_function_are_where() -> None:
    diagnosis = diagnose(RULES, findings(1.0, 0.9, 1.1, gil=PICKLING)).diagnosis
    assert diagnosis.where == {"thread": "prefill", "function": "pickle.dumps", "file": "gap_workloads.py",
                               "line": 244}


def test_without_the_gil_probe_the_next_step_runs_it() -> None:
    diagnosis = diagnose(RULES, findings(0.4, 0.3, 0.5, gil=GilFinding(available=False, reason="x"))).diagnosis
    gil = [step for step in diagnosis.next if step.command == "gil"]
    assert [step.arguments for step in gil] == [{"target": "a.py:transfer", "duration": "15s", "rate": 200}]
    assert diagnosis.where == {}


def _times(*rows: tuple[str, float, float, str | None]) -> Any:
    from glmfb.gil.evidence import ThreadTimeRow, ThreadTimes

    return ThreadTimes(observed_s=4.0, threads=tuple(
        ThreadTimeRow(thread=name, tid=i, cpu_share=cpu, runqueue_share=runqueue, gil_wait_share=0.0,
                      other_wait_share=max(0.0, 1 - cpu - runqueue), cpus="0", c_function=c_function)
        for i, (name, cpu, runqueue, c_function) in enumerate(rows)))


# A CI run of gap-sender-zlib-cpu-contention: on one core the sender, compressing with the GIL
# released, held the GIL in more sampled instants than the prefill and waited about as long for
# the CPU, so "the thread that held the GIL most drives the iteration" named the sender slowed.
ONE_CORE = _times(("kv-sender", 0.484, 0.393, "zlib.compress"),
                  ("prefill", 0.387, 0.419, "torch::autograd::THPVariable_scaled_dot_product_attention"),
                  ("thread 25649", 0.011, 0.037, None))
PREFILL_ALONE = _times(("prefill", 0.83, 0.02, "torch::autograd::THPVariable_linear"), ("thread 31002", 0.01, 0.0, None))


def test_the_baseline_tells_the_slowed_thread_from_the_one_the_candidate_added() -> None:
    from glmfb.gap.attribution import _cpu_contention

    alone = _cpu_contention(ONE_CORE, "kv-sender")
    assert (alone["cpu_victim"], alone["competitor_thread"]) == ("kv-sender", "prefill")  # what the heuristic said
    compared = _cpu_contention(ONE_CORE, "kv-sender", PREFILL_ALONE)
    assert (compared["cpu_victim"], compared["competitor_thread"], compared["competitor_function"]) == (
        "prefill", "kv-sender", "zlib.compress")
    assert compared["baseline_compared"] and compared["cpu_victim_baseline_runqueue_share"] == 0.02
    assert "competitor_baseline_cpu_share" not in compared  # the baseline has no sender
    finding = replace(COMPRESSING, **compared)
    diagnosis = diagnose(RULES, findings(1.0, 0.9, 1.1, gil=finding)).diagnosis
    assert diagnosis.where == {"thread": "prefill", "function": "zlib.compress"}
    assert "waited for a CPU 42% of the time against 2% in the baseline's run (and ran 39%)" in diagnosis.why
    assert "thread kv-sender (a thread the baseline does not run) ran in zlib.compress" in diagnosis.why


def test_a_competitor_the_baseline_also_runs_is_the_one_whose_cpu_time_grew() -> None:
    from glmfb.gap.attribution import _cpu_contention

    candidate = _times(("prefill", 0.40, 0.45, None), ("logger", 0.30, 0.10, None), ("packer", 0.25, 0.2, "zlib.compress"))
    baseline = _times(("prefill", 0.80, 0.05, None), ("logger", 0.30, 0.05, None), ("packer", 0.02, 0.0, None))
    found = _cpu_contention(candidate, "prefill", baseline)
    assert (found["cpu_victim"], found["competitor_thread"], found["competitor_baseline_cpu_share"]) == (
        "prefill", "packer", 0.02)


def test_without_a_thread_whose_cpu_wait_grew_the_comparison_is_not_claimed() -> None:
    from glmfb.gap.attribution import _cpu_contention

    found = _cpu_contention(ONE_CORE, "prefill", _times(("prefill", 0.3, 0.6, None)))
    assert found["cpu_victim"] == "prefill" and "baseline_compared" not in found


def test_a_gap_the_gil_and_the_cpus_do_not_explain_says_so_and_blames_no_holder() -> None:
    # A sender that sleeps 20 ms per layer (an acknowledgement round trip): kv_wait_s grew, the
    # gil probe saw nothing starved. The why once read "A canary thread woke p99 0 ms late,
    # held by torch::autograd::THPVariable_numel ... on thread prefill", blaming the busiest thread.
    sleeping = GilFinding(available=True, status="pass", holder_thread="prefill",
                          holder_function="torch::autograd::THPVariable_numel",
                          holder_c_function="torch::autograd::THPVariable_numel",
                          holder_python_function="PrefillKV._iteration", holder_file="gap_workloads.py",
                          holder_line=226, holder_idle_share=0.0, canary_p99_ms=0.3)
    diagnosis = diagnose(RULES, findings(0.76, 0.58, 0.96, gil=sleeping)).diagnosis
    assert diagnosis.where == {}
    assert ("The gil probe saw no thread starved of the GIL (a canary thread woke p99 0.3 ms late), and no "
            "thread waiting for a CPU another thread of the candidate took: neither the GIL nor CPU contention "
            "explains the gap.") in diagnosis.why
    assert "held by" not in diagnosis.why and "THPVariable_numel" not in diagnosis.why


def test_a_thread_that_barely_waited_for_the_gil_is_not_starved_and_no_holder_is_blamed() -> None:
    # A sender that waits on its acknowledgement: the gil probe passed, and the thread that waited
    # most for the GIL (always named) waited 0.3% of its time; the sampled "holder" is whatever
    # ran most (here a start-up function of transformers), which nothing blames.
    quiet = GilFinding(available=True, status="pass", holder_thread="prefill",
                       holder_function="_register_model_output_pytree_node", holder_file="generic.py", holder_line=67,
                       holder_idle_share=0.0, starved_thread="MainThread", starved_waiting_share=0.003,
                       starved_of_runnable=0.003, starved_of_runnable_ci=(0.0, 0.009), canary_p99_ms=0.449)
    assert not quiet.starved and not quiet.gil_bound
    outcome = diagnose(RULES, findings(1.3, 0.57, 2.4, threshold=0.5, gil=quiet))
    why = outcome.diagnosis.why
    assert outcome.record.rule == "over-threshold" and "held by" not in why and "_register_model" not in why
    assert "neither the GIL nor CPU contention explains the gap" in why
    # the same thread waiting 30% of its time off the run queue is starved, and its holder named
    starved = replace(quiet, starved_waiting_share=0.3, starved_of_runnable=0.3, starved_of_runnable_ci=(0.2, 0.4))
    assert starved.starved and "held by _register_model_output_pytree_node" in starved.sentence()


def test_an_unsettled_bandwidth_share_is_not_called_the_link_not_the_limit() -> None:
    """The achieved rate is under 80% of the median ceiling but over 80% of the lowest one: the
    why says the ceiling's spread decides, never "the link was not the limit"."""
    unsettled = BandwidthCheck("mooncake", 9e8, 9e8, 1.2e9, None, ceiling_samples=(1.0e9, 1.2e9, 1.3e9))
    clear = BandwidthCheck("mooncake", 9e8, 9e8, 1.55e9, None, ceiling_samples=(1.5e9, 1.55e9, 1.6e9))
    outcome = diagnose(RULES, findings(1.0, 0.8, 1.2, bandwidth=unsettled))
    assert outcome.rule.name == "over-threshold"
    assert "whether the link was the limit is not settled" in outcome.diagnosis.why
    assert "the link was not the limit" not in outcome.diagnosis.why
    assert "the link was not the limit" in diagnose(RULES, findings(1.0, 0.8, 1.2, bandwidth=clear)).diagnosis.why


def test_an_unexplained_gap_on_a_busy_host_is_not_decided() -> None:
    from glmfb.core.measure.hostload import HostLoad

    # A fresh-clone run of the bundled releasing case (the fix): +199.7% [+104.7%, +338.6%] against
    # 5%, nothing measured explaining it, other processes keeping 0.7 of the 2 CPUs busy; 3 runs
    # on the quiet host read +0.7%, +31% (undecided) and +99%.
    busy = HostLoad(window_s=40.0, cpus=2, host_busy_s=68.0, own_busy_s=40.0)
    outcome = diagnose(RULES, findings(1.997, 1.047, 3.386, host_load=busy))
    assert outcome.rule.name == "undecided-busy-host" and outcome.diagnosis.status is Status.INCONCLUSIVE
    assert outcome.diagnosis.why.startswith(
        "Not decided: the candidate takes +199.7% [+104.7%, +338.6%] against the baseline (20 interleaved "
        "iterations a side, threshold 5%), over the threshold as measured, but nothing measured explains the gap "
        "and the host was busy, so it may be the other processes' doing. The time went to kv_wait_s")
    assert outcome.diagnosis.why.endswith("other processes kept 0.7 of the host's 2 CPUs busy while it measured.")
    assert outcome.diagnosis.next[0].why == "more evidence, on a quieter machine"
    # the same on a quiet host: a regression; and explained on a busy one: decided by its rule
    quiet = HostLoad(window_s=40.0, cpus=2, host_busy_s=42.0, own_busy_s=40.0)
    assert diagnose(RULES, findings(1.997, 1.047, 3.386, host_load=quiet)).rule.name == "over-threshold"
    assert diagnose(RULES, findings(1.997, 1.047, 3.386, host_load=busy, gil=COMPRESSING)).rule.name == "cpu-contention"
    assert diagnose(RULES, findings(0.4, 0.3, 0.5, host_load=busy, bandwidth=SATURATED)).rule.name == "bandwidth-bound"


# Issue 53: a transfer path that stages each layer's KV through a synchronous copy on the
# prefill's own thread (no threads): staging_s only in the candidate, on a busy host.
STAGED = (PhaseChange("staging_s", None, 0.040),)
BUSY_HOST = HostLoad(window_s=25.0, cpus=2, host_busy_s=47.0, own_busy_s=25.0)  # others: 0.88 CPUs


def test_a_phase_only_the_candidate_runs_that_accounts_for_the_gap_is_the_explanation_on_a_busy_host() -> None:
    outcome = diagnose(RULES, findings(0.85, 0.60, 1.10, threshold=0.5, grown=STAGED, baseline_median_s=0.048,
                                       host_load=BUSY_HOST))
    assert outcome.rule.name == "candidate-only-phase" and outcome.diagnosis.status is Status.FAIL
    why = outcome.diagnosis.why
    assert ("Only the candidate runs staging_s: 40 ms of each candidate iteration, 98% of the 41 ms the gap added "
            "(at least 76% at the gap's high end): that phase accounts for the gap.") in why, why
    assert "nothing measured explains" not in why and why.endswith(
        "other processes kept 0.9 of the host's 2 CPUs busy while it measured."), why
    assert outcome.diagnosis.next[0].why == "cut or overlap staging_s: the baseline's iteration does without it"
    # the same on a quiet host
    quiet = diagnose(RULES, findings(0.85, 0.60, 1.10, threshold=0.5, grown=STAGED, baseline_median_s=0.048))
    assert quiet.rule.name == "candidate-only-phase" and "busy" not in quiet.diagnosis.why


def test_an_undecided_gap_names_a_phase_only_the_candidate_runs_as_the_lead() -> None:
    outcome = diagnose(RULES, findings(0.60, 0.35, 0.90, threshold=0.5, grown=STAGED, baseline_median_s=0.048,
                                       stopped_by="budget", host_load=BUSY_HOST))
    assert outcome.rule.name == "undecided" and outcome.diagnosis.status is Status.INCONCLUSIVE
    why = outcome.diagnosis.why
    assert "The lead: only the candidate runs staging_s: 40 ms of each candidate iteration, more than all of" in why
    assert "nothing measured explains" not in why and "The host was busy" in why


def test_a_phase_that_may_wait_for_the_candidates_own_activity_on_a_busy_host_is_the_lead_not_the_verdict() -> None:
    # kv_wait_s waits for transfer_busy_s, a transfer thread only the candidate runs: on a busy
    # host the other processes may have slowed that thread (the bundled fix read +199.7% beside
    # 0.7 busy CPUs of others), so not decided; but the phase is named, never "nothing explains".
    busy = HostLoad(window_s=40.0, cpus=2, host_busy_s=68.0, own_busy_s=40.0)
    outcome = diagnose(RULES, findings(1.997, 1.047, 3.386, baseline_median_s=0.05, host_load=busy,
                                       added_activities=("transfer_busy_s",)))
    assert outcome.rule.name == "undecided-busy-host" and outcome.diagnosis.status is Status.INCONCLUSIVE
    why = outcome.diagnosis.why
    assert "The lead: only the candidate runs kv_wait_s: 169 ms of each candidate iteration" in why, why
    assert "the candidate also runs transfer_busy_s beside the iteration" in why and "nothing measured" not in why
    # on a quiet host the phase decides
    assert diagnose(RULES, findings(1.997, 1.047, 3.386, baseline_median_s=0.05,
                                    added_activities=("transfer_busy_s",))).rule.name == "candidate-only-phase"


def test_a_phase_only_the_candidate_runs_that_is_a_small_part_of_the_gap_explains_nothing() -> None:
    small = (PhaseChange("staging_s", None, 0.005), PhaseChange("prefill_s", 0.048, 0.085, 0.77, (0.6, 0.95)))
    outcome = diagnose(RULES, findings(0.85, 0.60, 1.10, threshold=0.5, grown=small, baseline_median_s=0.048,
                                       host_load=BUSY_HOST))
    assert outcome.rule.name == "undecided-busy-host"
    assert "nothing measured explains the gap" in outcome.diagnosis.why


def test_undecided_on_a_busy_host_says_how_busy_it_was() -> None:
    from glmfb.core.measure.hostload import HostLoad

    # A CI run of the bundled releasing case: +5.8% [+0.6%, +11.4%] against 5% on a loaded host.
    busy = HostLoad(window_s=40.0, cpus=2, host_busy_s=76.0, own_busy_s=24.0)
    why = diagnose(RULES, findings(0.058, 0.006, 0.114, stopped_by="budget", host_load=busy)).diagnosis.why
    assert why.endswith("The host was busy: other processes kept 1.3 of the host's 2 CPUs busy while it measured.")
    quiet = HostLoad(window_s=40.0, cpus=2, host_busy_s=26.0, own_busy_s=24.0)
    why = diagnose(RULES, findings(0.058, 0.006, 0.114, stopped_by="budget", host_load=quiet)).diagnosis.why
    assert "busy" not in why


def test_the_tolist_pool_gap_is_the_gils_and_where_names_the_holder() -> None:
    """Issue 37: the rule fires on a GIL wait under the fixed share that explains the gap, and
    ``where`` carries the thread that waited and the holder's function and line."""
    before = replace(TOLIST, starved_of_runnable=0.13)
    assert not before.gil_bound  # the fixed share alone: 13% < 20%
    case = findings(0.26, 0.22, 0.30, gil=TOLIST, baseline_median_s=0.05)
    weight = case.gil_weight
    assert weight is not None and weight.substantial
    assert weight.explains == pytest.approx(0.13 * 1.26 / 0.26) and weight.explains_low == pytest.approx(0.118 * 1.3 / 0.3)
    outcome = diagnose(RULES, case)
    assert outcome.rule.name == "gil-starved-sender"
    assert outcome.diagnosis.where == {"thread": "prefill", "function": "torch::autograd::THPVariable_tolist",
                                       "file": "gap_workloads.py", "line": 132}
    assert outcome.record.saw["gil_explains"] == pytest.approx(0.63, abs=1e-4)


def test_the_weight_of_an_older_gil_verdict_is_of_the_wall_share() -> None:
    """A gil verdict without the share of the time off the run queue: the wait is weighed as its
    share of wall time, with that share's interval; without the baseline's time, in shares of
    an iteration."""
    older = replace(TOLIST, starved_of_runnable=None, starved_of_runnable_ci=())
    assert older.starved_wait == (0.122, 0.111)
    outcome = diagnose(RULES, findings(0.26, 0.22, 0.30, gil=older))
    assert outcome.rule.name == "gil-starved-sender"
    assert ("That wait comes to 12% of each candidate iteration against the 21% of it the gap added: 59% of that "
            "time (at least 48% at the ends of both intervals)") in outcome.diagnosis.why


def test_a_gil_wait_that_follows_cpu_contention_is_not_the_gils_whatever_it_weighs() -> None:
    """The waiter took the CPU of the holder the contention slowed: the GIL wait follows from the
    contention, even when it would explain the gap."""
    finding = replace(COMPRESSING, starved_thread="kv-sender", starved_waiting_share=0.05, starved_waiting_ci=(0.04, 0.06),
                      starved_of_runnable=0.15, starved_of_runnable_ci=(0.12, 0.18))
    assert not finding.gil_bound  # under the fixed share: only the weight could lay the gap on the GIL
    case = findings(0.2, 0.15, 0.25, gil=finding)
    assert case.gil_weight is not None and case.gil_weight.substantial and finding.waiter_took_holders_cpu
    assert diagnose(RULES, case).rule.name == "cpu-contention"


@pytest.mark.parametrize(("case", "rule", "status", "phrases"), TABLE, ids=[row[1] for row in TABLE])
def test_a_why_names_no_holder_its_where_and_rule_do_not_carry(case: GapFindings, rule: str, status: Status,
                                                               phrases: list[str]) -> None:
    """What the why lays the gap on, ``where`` and the rule carry: a why that names the GIL's
    holder (its function, or "on thread" its thread) is the GIL rule's, with that function in
    ``where``."""
    outcome = diagnose(RULES, case)
    why, where, gil = outcome.diagnosis.why, outcome.diagnosis.where or {}, case.gil
    if gil is None or not gil.holder_known or outcome.rule.name == "gil-starved-sender":
        if outcome.rule.name == "gil-starved-sender":
            assert gil is not None and where.get("function") == gil.holder_function
        return
    assert "held by" not in why.replace(f"held by {gil.cpu_victim}, the thread the contention slowed", "")
    assert f"{gil.holder_function} (" not in why and f"held by {gil.holder_function}" not in why
    assert f"on thread {gil.holder_thread}" not in why


def test_a_failing_gil_probe_without_a_waiter_names_no_holder_when_the_gap_is_not_the_gils() -> None:
    """The gil probe failed on its canary's lateness, no thread of the candidate named waiting:
    the gap is not laid on the GIL, and its why names no holder."""
    canary = GilFinding(available=True, status="fail", holder_thread="kv-serializer_0", holder_function="_serialize",
                        holder_file="gap_workloads.py", holder_line=132, holder_idle_share=0.0, canary_p99_ms=41.0)
    outcome = diagnose(RULES, findings(0.4, 0.3, 0.5, gil=canary))
    assert outcome.rule.name == "over-threshold" and outcome.diagnosis.where == {}
    assert ("A canary thread woke p99 41 ms late, but the gil probe named no thread of the candidate that waited for "
            "the GIL: the GIL is not shown to explain the gap.") in outcome.diagnosis.why
    assert "_serialize" not in outcome.diagnosis.why and "held by" not in outcome.diagnosis.why
    assert "held by _serialize" in canary.sentence()  # the finding itself still knows the holder


def test_the_top_holders_own_wait_does_not_outweigh_cpu_contention() -> None:
    """On a shared core the prefill holds the GIL most and waits for it behind the compressing
    sender's Python: when CPU contention explains the gap, that reading is left aside (the CPU
    rule decides), as it is whenever the thread named starved already explains the gap."""
    own = replace(COMPRESSING, holder_thread="kv-sender", holder_function="torch::autograd::THPVariable_numpy",
                  starved_thread="prefill", starved_waiting_share=0.18, starved_of_runnable=0.3,
                  starved_of_runnable_ci=(0.15, 0.45))
    contended = replace(COMPRESSING, holder_own_wait=own)
    case = findings(1.0, 0.9, 1.1, gil=contended)
    assert case.explained_by(own) and case.gil_seen is contended
    assert diagnose(RULES, case).rule.name == "cpu-contention"
    explained = replace(TOLIST, holder_own_wait=replace(TOLIST, starved_thread="other", starved_of_runnable=0.9))
    assert findings(0.26, 0.22, 0.30, gil=explained).gil_seen is explained


def test_a_backwards_cpu_guess_on_a_busy_host_is_not_decided() -> None:
    """A busy-host run of the tolist pool (other processes kept 1.7 of 2 CPUs busy): no thread the
    baseline also runs waited longer for a CPU, so the thread called slowed was the guess (the
    top GIL holder, a pool thread the baseline does not run) and the prefill, which it does, its
    competitor; the GIL wait explained a quarter of the gap. Not decided; on a quiet host, with
    a guess the other way round (the zlib sender's runs), or compared with the baseline, the CPU
    rule decides as before."""
    from glmfb.core.measure.hostload import HostLoad

    guessed = replace(COMPRESSING, holder_thread="kv-serializer_0", holder_function="pickle.dumps",
                      starved_thread="prefill", starved_waiting_share=0.0768, starved_of_runnable=0.1393,
                      starved_of_runnable_ci=(0.0547, 0.2507), cpu_victim="kv-serializer_0",
                      cpu_victim_runqueue_share=0.3062, cpu_victim_cpu_share=0.1227, cpu_victim_gil_share=0.073,
                      cpu_victim_gil_of_runnable=0.1052, cpu_victim_gil_of_runnable_ci=(0.0414, 0.2269),
                      competitor_thread="prefill", competitor_function="at::native::_fused_sdp_choice_cpp",
                      competitor_cpu_share=0.2701, competitor_cpu_fraction=0.5563, shared_cpus="0,1",
                      baseline_reason="no thread the baseline also runs waited longer for a CPU",
                      cpu_victim_in_baseline=False, competitor_in_baseline=True)
    busy = HostLoad(window_s=16.93, cpus=2, host_busy_s=33.8, own_busy_s=5.3)
    outcome = diagnose(RULES, findings(1.143, 0.589, 1.889, threshold=0.5, gil=guessed, host_load=busy))
    assert outcome.rule.name == "undecided-busy-host" and outcome.diagnosis.where == {}
    why = outcome.diagnosis.why
    assert ("The kv-serializer_0 thread, which the baseline does not run, waited for a CPU 31% of the time beside "
            "thread prefill, which it does, but no thread the baseline also runs waited longer for a CPU: on a host "
            "this busy that does not tell which thread the contention slowed.") in why
    assert "held by" not in why and "pickle.dumps" not in why
    assert diagnose(RULES, findings(1.143, 0.589, 1.889, threshold=0.5, gil=guessed)).rule.name == "cpu-contention"
    compared = replace(guessed, baseline_reason=None, baseline_compared=True)
    assert diagnose(RULES, findings(1.143, 0.589, 1.889, threshold=0.5, gil=compared,
                                    host_load=busy)).rule.name == "cpu-contention"
    # The zlib sender's busy-host runs: the guess is the prefill (the baseline runs it) slowed by
    # the sender (it does not); and a baseline whose gil run failed says nothing of either.
    zlib = replace(guessed, cpu_victim="prefill", competitor_thread="kv-sender", competitor_function="zlib.compress",
                   cpu_victim_in_baseline=True, competitor_in_baseline=False)
    assert diagnose(RULES, findings(1.143, 0.589, 1.889, threshold=0.5, gil=zlib, host_load=busy)).rule.name == (
        "cpu-contention")
    failed = replace(guessed, cpu_victim_in_baseline=None, competitor_in_baseline=None,
                     baseline_reason="the gil probe could not run the baseline: it timed out")
    assert diagnose(RULES, findings(1.143, 0.589, 1.889, threshold=0.5, gil=failed, host_load=busy)).rule.name == (
        "cpu-contention")


def test_the_cpu_finding_says_which_of_its_threads_the_baseline_runs() -> None:
    from glmfb.gap.attribution import _cpu_contention

    compared = _cpu_contention(ONE_CORE, "kv-sender", PREFILL_ALONE)
    assert (compared["cpu_victim_in_baseline"], compared["competitor_in_baseline"]) == (True, False)
    guessed = _cpu_contention(ONE_CORE, "kv-sender", _times(("prefill", 0.3, 0.6, None)))
    assert guessed["cpu_victim"] == "kv-sender" and "baseline_compared" not in guessed
    assert (guessed["cpu_victim_in_baseline"], guessed["competitor_in_baseline"]) == (False, True)
    alone = _cpu_contention(ONE_CORE, "kv-sender")
    assert "cpu_victim_in_baseline" not in alone and "competitor_in_baseline" not in alone


# ---- no why states what its evidence contradicts (glmfb.gap.rules.CLAIMS) --------------------

from hypothesis import given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402

from glmfb.core.rules import contradicted  # noqa: E402
from glmfb.gap.rules import CLAIMS  # noqa: E402

_phase = st.builds(
    lambda name, base, cand, concurrent: PhaseChange(name, base, cand, None if base is None else cand / base - 1,
                                                     None if base is None else (cand / base - 1.2, cand / base - 0.8),
                                                     concurrent),
    st.sampled_from(["stage_s", "send_s", "kv_wait_s", "prefill_s", "transfer_busy_s"]),
    st.one_of(st.none(), st.floats(0.001, 0.2)), st.floats(0.0005, 0.3), st.booleans())


@st.composite
def gap_findings(draw: st.DrawFn) -> GapFindings:
    gap = draw(st.floats(-0.5, 4.0))
    low = gap - draw(st.floats(0.0, 1.0))
    high = gap + draw(st.floats(0.0, 2.0))
    busy = draw(st.one_of(st.none(), st.floats(0.0, 1.9)))
    return findings(gap, low, high, threshold=draw(st.sampled_from([0.05, 0.25, 0.5])),
                    stopped_by=draw(st.sampled_from(["decided", "budget", "repeats"])),
                    grown=tuple(draw(st.lists(_phase, max_size=3, unique_by=lambda c: c.name))),
                    baseline_median_s=draw(st.one_of(st.none(), st.floats(0.01, 0.3))),
                    host_load=None if busy is None else HostLoad(window_s=20.0, cpus=2, host_busy_s=20.0 * (1 + busy),
                                                                 own_busy_s=20.0),
                    added_activities=tuple(draw(st.lists(st.sampled_from(["transfer_busy_s"]), max_size=1))),
                    gil=draw(st.sampled_from([None, TOLIST, FORKED, COMPRESSING, PICKLING])))


@settings(max_examples=300, deadline=None)
@given(gap_findings())
def test_no_gap_why_states_what_its_evidence_contradicts(case: GapFindings) -> None:
    why = diagnose(RULES, case).diagnosis.why
    assert contradicted(CLAIMS, case, why) == [], why


def test_the_gap_claims_catch_the_old_contradiction() -> None:
    # issue 53's why: "nothing measured explains the gap" beside a phase that accounts for it
    case = findings(0.85, 0.60, 1.10, threshold=0.5, grown=STAGED, baseline_median_s=0.048, host_load=BUSY_HOST)
    old = ("Not decided: ..., over the threshold as measured, but nothing measured explains the gap and the host "
           "was busy. The time went to staging_s 40 ms (only in the candidate).")
    assert contradicted(CLAIMS, case, old) == ["nothing-explains"]
