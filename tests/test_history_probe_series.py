"""What the history records of a verdict comes from its probe: the direction and kind of each
metric (``metrics``: :class:`glmfb.core.probe.MetricSpec`), and the secondary series beside the
headline (``series``): bench's each side's own time per shape, or per shape of one target
alone; gap's each side's own time per iteration. Fast: verdicts built here, no probe runs."""

from __future__ import annotations

import random

from glmfb.bench.evidence import Measurement, ShapeChange
from glmfb.contract.verdict import Layer, Metric, Run, Status, Verdict
from glmfb.core.probe import get_probe
from glmfb.gap.evidence import GapMeasurement
from glmfb.workflows.history.metrics import DEFAULT_KIND, MetricKind, Worse, metric_kind
from glmfb.workflows.history.record import Origin, records_of


def samples(level: float, count: int = 40, seed: int = 0) -> tuple[float, ...]:
    rng = random.Random(seed)
    return tuple(level * (1 + rng.gauss(0, 0.01)) for _ in range(count))


def test_each_probe_declares_how_its_metrics_read() -> None:
    assert metric_kind("bench", "time_change") == MetricKind(Worse.HIGHER, relative=True)
    assert metric_kind("bench", "median_time") == MetricKind(Worse.HIGHER, relative=False)
    assert metric_kind("bench", "candidate_time[8x4096]") == MetricKind(Worse.HIGHER, relative=False)
    assert metric_kind("bench", "normalized_time") == MetricKind(Worse.HIGHER, relative=False)
    assert metric_kind("gap", "gap") == MetricKind(Worse.HIGHER, relative=True)
    assert metric_kind("gil", "starvation_p99") == MetricKind(Worse.HIGHER, relative=False)
    assert metric_kind("diff", "output_rel_l2") == MetricKind(Worse.HIGHER, relative=False)
    assert metric_kind("no-such-probe", "gap") == DEFAULT_KIND  # not read by name
    assert metric_kind("bench", "undeclared") == DEFAULT_KIND
    for kind in ("bench", "gap", "gil", "diff"):
        assert get_probe(kind).metrics, f"{kind} declares no metric"


def test_a_bench_pair_records_each_sides_time_per_shape() -> None:
    shapes = [ShapeChange(shape=shape, decision="equivalent", change=0.001, ci=(-0.01, 0.01),
                          side_time_s={"baseline": (1e-4 * k, 0.99e-4 * k, 1.01e-4 * k),
                                       "candidate": (1.1e-4 * k, 1.09e-4 * k, 1.11e-4 * k)})
              for k, shape in ((1, "8x4096"), (2, "32x2048"))]
    verdict = Verdict(probe="bench", name="k", status=Status.PASS, layer=Layer.KERNEL, why="w",
                      metric=Metric("geomean_time_change", 0.001, "fraction", 0.05, (-0.01, 0.01)), evidence=tuple(shapes))
    run = Run(id="r1", started="2026-12-06T10:00:00+00:00", verdicts=(verdict,))
    rows = {r.metric: r for r in records_of(run, {"k": Origin("h", None, "abc", False)})}
    assert set(rows) == {"geomean_time_change", "baseline_time[8x4096]", "candidate_time[8x4096]",
                         "baseline_time[32x2048]", "candidate_time[32x2048]"}
    side = rows["candidate_time[32x2048]"]
    assert (side.value, side.low, side.high, side.unit) == (2.2e-4, 2.18e-4, 2.22e-4, "s")
    assert side.relative is False and side.commit == "abc" and side.status == "pass"
    assert rows["geomean_time_change"].relative is True


def test_one_target_alone_records_a_series_per_shape_when_it_measured_several() -> None:
    measured = tuple(Measurement(shape=s, samples=40, calls_per_sample=10, median_s=t, time_s=t, ci_s=(t * 0.99, t * 1.01))
                     for s, t in (("8", 1e-5), ("16", 2e-5)))
    verdict = Verdict(probe="bench", name="alone", status=Status.PASS, layer=Layer.KERNEL, why="w",
                      metric=Metric("median_time", 1e-5, "s", ci=(0.99e-5, 1.01e-5)), evidence=measured)
    rows = records_of(Run(id="r", started="s", verdicts=(verdict,)), {})
    assert [r.metric for r in rows] == ["median_time", "median_time[8]", "median_time[16]"]
    one = Verdict(probe="bench", name="alone", status=Status.PASS, layer=Layer.KERNEL, why="w",
                  metric=Metric("median_time", 1e-5, "s"), evidence=measured[:1])
    assert [r.metric for r in records_of(Run(id="r", started="s", verdicts=(one,)), {})] == ["median_time"]


def test_one_target_over_processes_records_its_time_in_the_references_units() -> None:
    """With a reference timed in each process, the run also records ``normalized_time`` (per
    shape when it measured several), never from a busy host, never without the reference."""
    from glmfb.contract.evidence import HostActivity

    def measured(shape: str, ratio: float | None) -> Measurement:
        extra = {} if ratio is None else {"normalized_time": ratio, "normalized_ci": (ratio * 0.98, ratio * 1.02),
                                          "reference_version": 1, "process_times_s": (1e-5, 1.1e-5),
                                          "process_reference_s": (1e-5 / ratio, 1.1e-5 / ratio),
                                          "process_ratios": (ratio, ratio)}
        return Measurement(shape=shape, samples=40, calls_per_sample=10, median_s=1e-5, time_s=1e-5,
                           ci_s=(0.9e-5, 1.1e-5), processes=2, **extra)

    def metrics(*evidence: object) -> list[str | None]:
        verdict = Verdict(probe="bench", name="alone", status=Status.PASS, layer=Layer.KERNEL, why="w",
                          metric=Metric("median_time", 1e-5, "s", ci=(0.9e-5, 1.1e-5)), evidence=evidence)
        return [r.metric for r in records_of(Run(id="r", started="s", verdicts=(verdict,)), {})]

    assert metrics(measured("8", 2.5)) == ["median_time", "normalized_time"]
    assert metrics(measured("8", 2.5), measured("16", 5.0)) == [
        "median_time", "median_time[8]", "median_time[16]", "normalized_time[8]", "normalized_time[16]"]
    assert metrics(measured("8", None)) == ["median_time"]  # no reference: no normalized series
    assert metrics(measured("8", 2.5), measured("16", None)) == [  # one shape without: the names stay per shape
        "median_time", "median_time[8]", "median_time[16]", "normalized_time[8]"]
    busy = HostActivity(window_s=2.0, cpus=2, host_busy_cpus=1.9, own_busy_cpus=1.0, other_busy_cpus=0.9, busy=True)
    assert metrics(measured("8", 2.5), busy) == ["median_time"]


def test_the_normalized_time_is_read_from_each_processs_paired_samples() -> None:
    """Each process's ratio is the batch-means statistic (each batch's median log) of its
    pairs, a kernel sample over the reference's right after it: the machine's speed, which
    moves both samples of a pair, cancels; the run is their geometric mean over the processes."""
    import math
    import statistics

    from glmfb.bench.engine import ProcessRun, _normalized, _process_run

    rng = random.Random(1)
    speed = [1 + 0.5 * rng.random() for _ in range(40)]  # the machine's speed, sample by sample
    kernel = [100e-6 * v * (1 + 0.04 * rng.random()) for v in speed]
    reference = [50e-6 * v * (1 + 0.04 * rng.random()) for v in speed]
    run = _process_run(kernel, reference)
    logs = [math.log(k / r) for k, r in zip(kernel, reference, strict=True)]
    expected = math.exp(statistics.fmean(statistics.median(logs[i * 5:(i + 1) * 5]) for i in range(8)))
    assert run.ratio is not None and abs(run.ratio / expected - 1) < 1e-12
    assert abs(run.ratio / 2.0 - 1) < 0.05  # the speed (up to +50%) cancels out of the pairs
    assert run.reference_s is not None and abs(run.ratio - run.time_s / run.reference_s) > 1e-9  # read from pairs
    assert _process_run(kernel, []).ratio is None and _process_run(kernel, reference[:10]).ratio is None
    normalized = _normalized([run, ProcessRun(120e-6, 60e-6, 2.0), ProcessRun(90e-6, 45e-6, 2.0)])
    assert normalized is not None and normalized.process_ratios == (run.ratio, 2.0, 2.0)
    assert abs(normalized.value - (run.ratio * 4.0) ** (1 / 3)) < 1e-12 and normalized.low < normalized.value
    assert _normalized([run, ProcessRun(120e-6)]) is None  # a process without its reference: no ratio
    assert _normalized([]) is None


def test_gap_records_each_sides_own_time_per_iteration() -> None:
    measurement = GapMeasurement(gap=0.02, ci=(0.0, 0.04), confidence=0.95, threshold=0.05, baseline_median_s=0.010,
                                 candidate_median_s=0.0102, iterations_per_side=40, stopped_by="decided",
                                 elapsed_s=1.0, baseline_samples_s=samples(0.010),
                                 candidate_samples_s=samples(0.0102, seed=1))
    verdict = Verdict(probe="gap", name="g", status=Status.PASS, layer=Layer.TRANSFER, why="w",
                      metric=Metric("gap", 0.02, "ratio", 0.05, (0.0, 0.04)), evidence=(measurement,))
    rows = {r.metric: r for r in records_of(Run(id="r", started="s", verdicts=(verdict,)), {})}
    assert set(rows) == {"gap", "baseline_time", "candidate_time"}
    candidate = rows["candidate_time"]
    assert candidate.low is not None and candidate.high is not None
    assert candidate.low < 0.0102 < candidate.high and candidate.high - candidate.low < 0.0102 * 0.02
    assert candidate.relative is False and rows["gap"].relative is True


def test_an_error_verdict_records_one_row_without_a_series() -> None:
    verdict = Verdict.harness_error("bench", "broken", "the target raised")
    assert [r.metric for r in records_of(Run(id="r", started="s", verdicts=(verdict,)), {})] == [None]


def test_two_serving_endpoints_record_each_sides_latency_per_token() -> None:
    from glmfb.diff.evidence import ServingThroughput

    throughput = ServingThroughput(requests=8, calls=16, tokens=128, wall_s=2.0, requests_per_s=8.0, glmfb_cpu_s=0.1,
                                   glmfb_share=0.05, baseline_call_s=0.8, candidate_call_s=0.9,
                                   baseline_token_s=samples(0.006, 8), candidate_token_s=samples(0.007, 8, seed=2))
    verdict = Verdict(probe="diff", name="servers", status=Status.PASS, layer=Layer.NUMERICS, why="w",
                      metric=Metric("logprob_diff_max", 0.0, "nats", 0.01), evidence=(throughput,))
    rows = {r.metric: r for r in records_of(Run(id="r", started="s", verdicts=(verdict,)), {})}
    assert set(rows) == {"logprob_diff_max", "baseline_token_time", "candidate_token_time"}
    latency = rows["candidate_token_time"]
    assert latency.low is not None and latency.high is not None and latency.low < 0.007 < latency.high
    assert latency.unit == "s" and latency.worse == "higher" and latency.relative is False


def test_no_sides_own_time_is_recorded_from_a_busy_host() -> None:
    """The interleaving cancels other processes' load out of a pair's change, not out of either
    side's own time: measured beside other work, a pair records its change alone."""
    from glmfb.contract.evidence import HostActivity

    shape = ShapeChange(shape="8", decision="equivalent", change=0.0, ci=(-0.01, 0.01),
                        side_time_s={"baseline": (1e-4, 0.99e-4, 1.01e-4), "candidate": (1e-4, 0.99e-4, 1.01e-4)})
    for busy, expected in ((True, ["time_change"]), (False, ["time_change", "baseline_time[8]", "candidate_time[8]"])):
        load = HostActivity(window_s=2.0, cpus=2, host_busy_cpus=1.9, own_busy_cpus=1.0, other_busy_cpus=0.9 if busy else 0,
                            busy=busy)
        verdict = Verdict(probe="bench", name="k", status=Status.PASS, layer=Layer.KERNEL, why="w",
                          metric=Metric("time_change", 0.0, "fraction", 0.05, (-0.01, 0.01)), evidence=(shape, load))
        assert [r.metric for r in records_of(Run(id="r", started="s", verdicts=(verdict,)), {})] == expected


def test_a_run_over_fresh_processes_is_their_geometric_mean_with_their_spread() -> None:
    from glmfb.core.measure.intervals import processes_interval

    value, low, high = processes_interval([100e-6, 110e-6, 121e-6])  # type: ignore[misc]
    assert abs(value - 110e-6) < 1e-9 and low < 100e-6 < 121e-6 < high  # 2 degrees of freedom: a wide t
    assert processes_interval([100e-6]) is None
