"""glmfb gap: the runner, phases, bandwidth, attribution reading, probe definitions and the CLI,
on small pure-Python targets defined here (a planted 2x slowdown, an A/A pair, a target that
raises). The real scenario (Mooncake, receiver process, GIL) is in test_gap_scenario.py."""

from __future__ import annotations

import json
import re
import time
from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner

from glmfb.contract.errors import InputError, TargetError, UsageError
from glmfb.contract.verdict import Layer, Status, Verdict
from glmfb.core.measure.stats import paired_median_ratio
from glmfb.core.targets import Target
from glmfb.gap import GapConfig
from glmfb.gap.attribution import GilFinding, finding_from_verdict
from glmfb.gap.bandwidth import achieved_bytes_per_s, check_bandwidth, paired_times
from glmfb.gap.interleave import phase_dict
from glmfb.gap.phases import compare_phases, grown_phases, median_bytes
from glmfb.gil.evidence import (
    GilHolder,
    GilSite,
    GilThreads,
    Starvation,
    ThreadTimeRow,
    ThreadTimes,
    WaitingThread,
)
from glmfb.workflows.suite import load_definitions

HERE = Path(__file__).resolve()
THIS = f"{HERE}"


# --------------------------------------------------------------------------------------------
# Targets (factories returning one iteration each)
# --------------------------------------------------------------------------------------------


def spin(units: int = 20_000, extra_units: int = 0) -> Any:
    """Pure-Python work: ``units`` of setup-like work, then ``extra_units`` in a phase of its own."""

    def iteration() -> dict[str, float]:
        started = time.perf_counter()
        total = 0
        for i in range(units):
            total += i * i
        compute_s = time.perf_counter() - started
        phases = {"compute_s": compute_s, "payload_bytes": 1000.0, "sender_busy_s": compute_s / 2}
        if extra_units:
            started = time.perf_counter()
            for i in range(extra_units):
                total += i * i
            phases["extra_s"] = time.perf_counter() - started
        return phases

    return iteration


ERRATIC_CALLS = {"n": 0}


def erratic() -> Any:
    """Alternately a quarter and three times the work of ``spin()`` (the alternation runs
    across every build, so the builds disagree): an interval that straddles."""
    small, big = spin(5_000), spin(60_000)

    def iteration() -> dict[str, float]:
        ERRATIC_CALLS["n"] += 1
        return small() if ERRATIC_CALLS["n"] % 2 else big()

    return iteration


def broken_after(calls: int = 3) -> Any:
    count = {"n": 0}

    def iteration() -> None:
        count["n"] += 1
        if count["n"] > calls:
            raise ConnectionError("peer went away")

    return iteration


def not_callable() -> int:
    return 42


class SlowClose:
    """An iteration whose ``close()`` takes a second (a build that waits for its own process
    to end) and writes when it started and ended into ``folder``."""

    def __init__(self, folder: str) -> None:
        self.folder = Path(folder)
        self.work = spin(2_000)

    def __call__(self) -> dict[str, float]:
        return self.work()

    def close(self) -> None:
        started = time.time()
        time.sleep(1.0)
        (self.folder / f"{id(self)}-{started}.json").write_text(json.dumps([started, time.time()]))


def slow_close(folder: str) -> SlowClose:
    return SlowClose(folder)


def run_gap(config: GapConfig, folder: Path) -> Verdict:
    from helpers import run

    return run("gap", config, folder)


def config_from_definition(definition: Any) -> GapConfig:
    return definition.config  # type: ignore[no-any-return]


def config(factory: str, **overrides: Any) -> GapConfig:
    values: dict[str, Any] = {
        "name": "t", "baseline": Target(f"{THIS}:spin"), "candidate": Target(f"{THIS}:{factory}"),
        "threshold": 0.05, "repeats": 30, "min_repeats": 6, "warmup": 1, "budget_s": 20.0, "attribute": False,
    }
    values.update(overrides)
    return GapConfig(**values)


# --------------------------------------------------------------------------------------------
# Engine on planted effects
# --------------------------------------------------------------------------------------------


def test_planted_2x_slowdown_fails_with_the_phase_that_grew(tmp_path: Path) -> None:
    cfg = config("spin", candidate=Target(f"{THIS}:spin", {"extra_units": 60_000}))
    verdict = run_gap(cfg, tmp_path)
    assert verdict.status is Status.FAIL
    assert verdict.layer is Layer.TRANSFER
    assert verdict.metric is not None and verdict.metric.ci is not None
    assert verdict.metric.ci[0] > 0.05
    assert (verdict.metric.value or 0.0) > 0.3  # planted: about +100%, noisy on a busy host
    phases = [e for e in (x.to_dict() for x in verdict.evidence) if e["kind"] == "phase"]
    assert phases[0]["phase"] == "extra_s" and phases[0]["baseline_s"] is None
    assert "extra_s" in verdict.why and "only in the candidate" in verdict.why
    gap = next(e for e in (x.to_dict() for x in verdict.evidence) if e["kind"] == "gap")
    assert gap["stopped_by"] == "decided"
    assert len(gap["baseline_samples_s"]) == len(gap["candidate_samples_s"]) == gap["iterations_per_side"]
    assert Verdict.from_dict(verdict.to_dict()) == verdict


def test_every_build_is_closed_at_once(tmp_path: Path) -> None:
    """12 builds (6 a side), each closing in 1 s: closed one after another they would take 12 s;
    at once, every close has begun before any has ended."""
    folder = tmp_path / "closes"
    folder.mkdir()
    side = Target(f"{THIS}:slow_close", {"folder": str(folder)})
    verdict = run_gap(config("spin", baseline=side, candidate=side, repeats=48, threshold=0.5), tmp_path)
    assert verdict.status is not Status.ERROR, verdict.why
    spans = sorted(json.loads(f.read_text()) for f in folder.iterdir())
    assert len(spans) == 12
    extra, first = spans[:10], spans[10:]  # closed by the measurement, then the first two by the engine
    for batch in (extra, first):
        assert max(start for start, _ in batch) < min(end for _, end in batch)


def test_same_work_passes_a_wide_threshold(tmp_path: Path) -> None:
    # ~10 ms iterations: a preemption on a busy 2-core host is then small beside them
    work = Target(f"{THIS}:spin", {"units": 150_000})
    verdict = run_gap(config("spin", baseline=work, candidate=work, threshold=0.5), tmp_path)
    assert verdict.status is Status.PASS, verdict.why
    assert verdict.exit_code == 0


def test_too_few_repeats_is_inconclusive_not_a_pass(tmp_path: Path) -> None:
    verdict = run_gap(config("erratic", repeats=4, min_repeats=4), tmp_path)
    assert verdict.status is Status.INCONCLUSIVE
    assert "repeats ran out" in verdict.why
    assert verdict.exit_code == 4


def test_budget_stops_the_loop_inconclusive(tmp_path: Path) -> None:
    verdict = run_gap(config("erratic", repeats=10_000, min_repeats=10_000, budget_s=0.3), tmp_path)
    assert verdict.status is Status.INCONCLUSIVE
    gap = next(e for e in (x.to_dict() for x in verdict.evidence) if e["kind"] == "gap")
    assert gap["stopped_by"] == "budget"
    assert "budget" in verdict.why


def test_target_that_raises_is_an_error_verdict(tmp_path: Path) -> None:
    # each build raises on its second call: one warm-up call, then in the first round
    verdict = run_gap(config("broken_after", candidate=Target(f"{THIS}:broken_after", {"calls": 1})), tmp_path)
    assert verdict.status is Status.ERROR and verdict.layer is Layer.HARNESS
    assert "ConnectionError" in verdict.why and "peer went away" in verdict.why
    kinds = {e.kind for e in verdict.evidence}
    assert {"target_error", "traceback"} <= kinds


def test_factory_returning_a_non_callable_is_an_error_verdict(tmp_path: Path) -> None:
    verdict = run_gap(config("not_callable"), tmp_path)
    assert verdict.status is Status.ERROR
    assert "not a zero-argument callable" in verdict.why


def test_unknown_target_is_a_usage_error(tmp_path: Path) -> None:
    with pytest.raises(TargetError):
        run_gap(config("no_such_factory"), tmp_path)


def test_config_rejects_bad_values() -> None:
    with pytest.raises(UsageError):
        config("spin", threshold=0.0)
    with pytest.raises(UsageError):
        config("spin", repeats=1)
    with pytest.raises(UsageError):
        config("spin", budget_s=0)


# --------------------------------------------------------------------------------------------
# Pieces
# --------------------------------------------------------------------------------------------


def test_phase_dict_keeps_finite_numbers_only() -> None:
    assert phase_dict({"a_s": 1, "b": "x", "c": float("nan"), "d": True}) == {"a_s": 1.0}
    assert phase_dict(None) == {}


def test_phases_rank_growth_and_keep_busy_time_off_the_critical_path() -> None:
    baseline = [{"prefill_s": 1.0 + 0.01 * i, "kv_bytes": 10.0} for i in range(10)]
    candidate = [{"prefill_s": 1.3 + 0.01 * i, "kv_wait_s": 0.1, "transfer_busy_s": 2.0, "kv_bytes": 10.0}
                 for i in range(10)]
    changes = compare_phases(baseline, candidate)
    names = [c.name for c in changes]
    assert names[-1] == "transfer_busy_s"  # concurrent: listed last, never "grew"
    assert "kv_bytes" not in names
    grown = grown_phases(changes, 0.05)
    assert [c.name for c in grown] == ["prefill_s", "kv_wait_s"]
    assert grown[0].change == pytest.approx(0.3, abs=0.02)
    assert median_bytes(candidate) == {"kv_bytes": 10.0}


def test_paired_bootstrap_cancels_shared_round_noise() -> None:
    # Each round has a large shared factor; the candidate is always exactly 10% slower.
    noise = [1.0, 3.0, 0.5, 2.0, 1.5, 0.7, 2.5, 1.2, 0.9, 1.8] * 3
    baseline = [n for n in noise]
    candidate = [1.1 * n for n in noise]
    estimate = paired_median_ratio(baseline, candidate)
    assert estimate.value == pytest.approx(0.1)
    assert estimate.low == pytest.approx(0.1) and estimate.high == pytest.approx(0.1)
    with pytest.raises(ValueError):
        paired_median_ratio([1.0, 2.0], [1.0])


class _Transfers:
    transfer_path = "mooncake"

    def __init__(self, ceiling: float, page_rate: float) -> None:
        self.ceiling = ceiling
        self.page_rate = page_rate

    def __call__(self) -> None:
        return None

    def measure_ceiling(self) -> float:
        return self.ceiling

    def measure_page_rate(self) -> float:
        return self.page_rate

    def describe(self) -> dict[str, Any]:
        return {"fallback_reason": None}


def test_bandwidth_against_ceiling_and_page_rate() -> None:
    samples = [{"kv_bytes": 100e6, "transfer_busy_s": 1.0}] * 5  # 100 MB/s while busy
    held_back = check_bandwidth(_Transfers(ceiling=1e9, page_rate=400e6), samples)
    assert held_back is not None
    assert held_back.ceiling_share == pytest.approx(0.1) and held_back.page_rate_share == pytest.approx(0.25)
    assert held_back.starved and not held_back.bandwidth_bound
    assert "10% of the mooncake ceiling" in held_back.summary()
    saturated = check_bandwidth(_Transfers(ceiling=110e6, page_rate=105e6), samples)
    assert saturated is not None and saturated.bandwidth_bound and not saturated.starved
    assert check_bandwidth(lambda: None, [{"compute_s": 1.0}]) is None


class _NoisyCeiling(_Transfers):
    """A link whose one-shot ceiling is as noisy as a loaded host's: each call answers the next
    rate of a list."""

    def __init__(self, ceilings: list[float]) -> None:
        super().__init__(ceilings[0], ceilings[0])
        self.rates = iter(ceilings)
        self.calls = 0

    def measure_ceiling(self) -> float:
        self.calls += 1
        return next(self.rates)


def test_the_ceiling_is_the_median_of_several_measurements() -> None:
    """Measured here under load: one 128 MiB write read 877 MB/s, the next 1.10 GB/s, for
    iterations that moved 888 MB/s; one call decided bound or not by which came first."""
    samples = [{"kv_bytes": 888e6, "transfer_busy_s": 1.0}] * 5
    target = _NoisyCeiling([1.10e9, 877e6, 0.95e9, 1.02e9, 0.90e9, 5e9])
    check = check_bandwidth(target, samples)
    assert check is not None and target.calls == 5  # quick calls: CEILING_CALLS of them
    assert check.ceiling_samples == (1.10e9, 877e6, 0.95e9, 1.02e9, 0.90e9)
    assert check.ceiling_bytes_per_s == pytest.approx(0.95e9) and check.bandwidth_bound
    assert "median of 5 measurements, 877 MB/s to 1.10 GB/s" in check.summary()
    assert check.evidence().ceiling_samples == tuple(check.ceiling_samples)


def test_a_share_the_ceilings_spread_decides_is_not_called_either_way() -> None:
    samples = [{"kv_bytes": 900e6, "transfer_busy_s": 1.0}] * 5
    unsettled = check_bandwidth(_NoisyCeiling([1.0e9, 1.2e9, 1.3e9, 1.25e9, 1.2e9]), samples)
    assert unsettled is not None and not unsettled.bandwidth_bound and unsettled.bound_unsettled
    clear = check_bandwidth(_NoisyCeiling([1.5e9, 1.6e9, 1.55e9, 1.5e9, 1.6e9]), samples)
    assert clear is not None and not clear.bandwidth_bound and not clear.bound_unsettled


def test_slow_ceiling_calls_stop_after_the_first_three_once_the_budget_is_spent() -> None:
    from glmfb.gap.bandwidth import CEILING_BUDGET_S, _optional_rates

    now = [0.0]

    class Slow:
        def measure_ceiling(self) -> float:
            now[0] += CEILING_BUDGET_S / 2  # each call takes half the budget
            return 1e9

    assert _optional_rates(Slow(), "measure_ceiling", clock=lambda: now[0]) == (1e9,) * 3
    assert _optional_rates(object(), "measure_ceiling") == ()


def test_a_synchronous_phase_pairs_with_its_bytes_by_name() -> None:
    """A target that prefills, then sends and waits for the acknowledgement, reports send_s
    and send_bytes (no *_busy_s): the bytes pair with send_s, and a send at the link's
    ceiling is bandwidth-bound, as a background transfer would be."""
    samples = [{"prefill_s": 0.5, "send_s": 0.64, "send_bytes": 64e6}] * 5  # 100 MB/s while sending
    check = check_bandwidth(_Transfers(ceiling=101e6, page_rate=101e6), samples)
    assert check is not None and check.achieved_bytes_per_s == pytest.approx(100e6)
    assert check.timed_by == ("send_s",) and check.synchronous and check.bandwidth_bound
    assert "during send_s, on the critical path" in check.summary()
    held_back = check_bandwidth(_Transfers(ceiling=1e9, page_rate=1e9), samples)
    assert held_back is not None and not held_back.bandwidth_bound


def test_bytes_pair_with_their_own_busy_time_before_an_unclaimed_one() -> None:
    sample = {"kv_bytes": 10.0, "transfer_busy_s": 1.0, "meta_bytes": 2.0, "meta_s": 0.5, "prefill_s": 3.0}
    assert paired_times(sample) == {"kv_bytes": ("transfer_busy_s",), "meta_bytes": ("meta_s",)}
    assert achieved_bytes_per_s([sample]) == (12.0, pytest.approx(12.0 / 1.5))
    assert paired_times({"kv_bytes": 1.0, "prefill_s": 1.0}) == {"kv_bytes": ()}  # no time: no rate
    assert achieved_bytes_per_s([{"kv_bytes": 1.0, "prefill_s": 1.0}])[1] is None


def _starvation(p99_ms: float = 61.0, max_ms: float = 300.0) -> Starvation:
    return Starvation(
        threads=("kv-transfer", "glmfb-heartbeat"), canary="glmfb-heartbeat", threshold_ms=10.0, starved=True,
        ticks=400, period_ms=1.0, p50_ms=0.2, p99_ms=p99_ms, max_ms=max_ms, wall_p99_ms=p99_ms, cpu_wait_total_ms=0.0,
        waiting_for_gil=(WaitingThread(thread="kv-transfer", tid=2, waiting_share=0.17),
                         WaitingThread(thread="other", tid=3, waiting_share=0.5)),
    )


def _gil_verdict(holder_file: str, holder_function: str, starvation: Starvation | None = None) -> Verdict:
    holder = GilHolder(thread="MainThread", tid=1, function=holder_function, qualname=holder_function,
                       file=holder_file, line=241, samples=40, idle_share=0.0, share_of_time=0.4,
                       native_frame="dlopen")
    site = GilSite(thread="MainThread", tid=1, function="intranode_dispatch", qualname="intranode_dispatch",
                   file="scenarios/kv_transfer/dispatch.py", line=39, samples=35, idle_share=1.0,
                   share_of_time=0.35, native_frame="usleep")
    threads = GilThreads(samples=100, sample_instants=100, native=True, threads=(), sites=(site,))
    return Verdict(probe="gil", name="g", status=Status.FAIL, layer=Layer.RUNTIME, why="w",
                   evidence=(starvation or _starvation(), holder, threads))


def test_gil_finding_names_starved_thread_and_skips_startup_imports() -> None:
    finding = finding_from_verdict(_gil_verdict("<frozen importlib._bootstrap>", "_call_with_frames_removed"))
    assert finding.holder_function == "intranode_dispatch" and finding.holder_line == 39
    assert finding.holder_source is not None and "import machinery" in finding.holder_source
    assert finding.starved_thread == "kv-transfer"  # "other" was not called starved
    assert finding.idle_in_native
    sentence = finding.sentence()
    assert "kv-transfer thread waited for the GIL 17% of the time" in sentence
    assert "p99 61 ms" in sentence and "intranode_dispatch" in sentence and "idle in a native call (usleep)" in sentence


def test_gil_finding_keeps_the_starved_threads_wall_share_interval() -> None:
    """The interval of the starved thread's GIL wait as a share of wall time reaches the finding
    (the gap weighs its low end against the gap) and the gil_attribution evidence."""
    starvation = _starvation()
    waiting = (WaitingThread(thread="prefill", tid=2, waiting_share=0.122, waiting_ci=(0.111, 0.144),
                             of_runnable_share=0.13, of_runnable_ci=(0.118, 0.153)),)
    verdict = _gil_verdict("scenarios/x.py", "hog", Starvation(**{
        **{f: getattr(starvation, f) for f in ("threads", "canary", "threshold_ms", "starved", "ticks", "period_ms",
                                               "p50_ms", "p99_ms", "max_ms", "wall_p99_ms", "cpu_wait_total_ms")},
        "waiting_for_gil": waiting}))
    finding = finding_from_verdict(verdict)
    assert finding.starved_thread == "prefill" and finding.starved_waiting_ci == (0.111, 0.144)
    assert finding.starved_wait == (0.13, 0.118)  # the share off the run queue is weighed
    assert finding.evidence().to_dict()["starved_waiting_ci"] == [0.111, 0.144]


def _pool_verdict() -> Verdict:
    """A gil run of the tolist pool on a busy host: the prefill held the GIL most (its Python
    between torch ops) and waited for it 41% of its time off the run queue, behind the pool
    threads' Tensor.tolist; the thread named most starved besides it is a pool thread."""
    starvation = _starvation()
    waiting = (WaitingThread(thread="prefill", tid=1, waiting_share=0.2692, waiting_ci=(0.1415, 0.4534),
                             of_runnable_share=0.4094, of_runnable_ci=(0.2297, 0.6172)),
               WaitingThread(thread="kv-serializer_0", tid=5, waiting_share=0.1884, waiting_ci=(0.0332, 0.4075),
                             of_runnable_share=0.23, of_runnable_ci=(0.0433, 0.463)))
    holder = GilHolder(thread="prefill", tid=1, function="rotate_half", qualname="rotate_half",
                       file="modeling_llama.py", line=121, samples=117, idle_share=0.0, share_of_time=0.146,
                       c_function="torch::autograd::THPVariable_getitem", c_source="py-spy --native")
    sites = (GilSite(thread="glmfb-heartbeat", tid=9, function="beat", qualname="beat", file="hb.py", line=3,
                     samples=90),
             GilSite(thread="kv-serializer_0", tid=5, function="_pickle_tolist", qualname="_pickle_tolist",
                     file="gap_workloads.py", line=139, samples=85, share_of_time=0.106, idle_share=0.0,
                     c_function="torch::autograd::THPVariable_tolist", c_source="py-spy --native"))
    threads = GilThreads(samples=300, sample_instants=800, native=True, threads=(), sites=sites)
    return Verdict(probe="gil", name="g", status=Status.INCONCLUSIVE, layer=Layer.RUNTIME, why="busy", evidence=(
        Starvation(**{**{f: getattr(starvation, f) for f in (
            "threads", "canary", "threshold_ms", "starved", "ticks", "period_ms", "p50_ms", "p99_ms", "max_ms",
            "wall_p99_ms", "cpu_wait_total_ms")}, "waiting_for_gil": waiting}), holder, threads))


def test_gil_finding_reads_the_top_holders_own_wait_too() -> None:
    """The top holder waited for the GIL too: the finding keeps that reading, its holder the
    site of another thread that held the GIL most (not glmfb's canary)."""
    finding = finding_from_verdict(_pool_verdict())
    assert (finding.holder_thread, finding.starved_thread) == ("prefill", "kv-serializer_0")
    own = finding.holder_own_wait
    assert own is not None and (own.holder_thread, own.starved_thread) == ("kv-serializer_0", "prefill")
    assert (own.holder_function, own.holder_python_function, own.holder_line) == (
        "torch::autograd::THPVariable_tolist", "_pickle_tolist", 139)
    assert own.starved_of_runnable == 0.4094 and own.starved_of_runnable_ci == (0.2297, 0.6172)
    assert own.holder_source == "gil_threads.sites[1] (the top holder, prefill, waited for the GIL too)"
    amended = finding.amended(baseline_reason="r")
    assert amended.baseline_reason == "r" and amended.holder_own_wait is not None
    assert amended.holder_own_wait.baseline_reason == "r"


def test_the_gap_reads_the_top_holders_own_wait_when_the_named_waiter_does_not_explain_it() -> None:
    """The same run against its gap (+135% [+54%, +257%], threshold 50%): the pool thread's wait
    explains too little and is unsettled; the prefill's own wait, 41% [23%, 62%] of its time off
    the run queue, behind kv-serializer_0's Tensor.tolist, is the GIL's part of the gap."""
    from glmfb.core.rules import diagnose
    from glmfb.gap.phases import PhaseChange
    from glmfb.gap.rules import RULES, GapFindings

    finding = finding_from_verdict(_pool_verdict())
    case = GapFindings(gap=1.347, low=0.545, high=2.565, threshold=0.5, iterations=12, stopped_by="decided",
                       budget_s=25.0, repeats=40, grown=(PhaseChange("prefill_s", 0.0712, 0.1415),), gil=finding,
                       baseline_median_s=0.0712)
    assert not case.explained_by(finding) and case.gil_seen is finding.holder_own_wait
    outcome = diagnose(RULES, case)
    assert outcome.rule.name == "gil-starved-sender"
    assert outcome.diagnosis.where == {"thread": "prefill", "function": "torch::autograd::THPVariable_tolist",
                                       "file": "gap_workloads.py", "line": 139}
    assert ("The prefill thread waited for the GIL 27% of the time (41% of the time it was not waiting for a CPU)"
            in outcome.diagnosis.why)
    assert "held by torch::autograd::THPVariable_tolist, called from _pickle_tolist" in outcome.diagnosis.why
    assert "on thread kv-serializer_0" in outcome.diagnosis.why and "rotate_half" not in outcome.diagnosis.why
    assert outcome.record.saw["gil_waiter"] == "the top holder's own wait"


def test_gil_finding_drops_implausible_canary_lateness() -> None:
    verdict = _gil_verdict("scenarios/x.py", "hog", _starvation(p99_ms=1633183.5, max_ms=1633323.8))
    finding = finding_from_verdict(verdict)
    assert finding.canary_p99_ms is None and finding.canary_p50_ms == 0.2
    assert "canary" not in finding.sentence()


def test_gil_finding_keeps_a_real_top_holder() -> None:
    finding = finding_from_verdict(_gil_verdict("scenarios/x.py", "hog"))
    assert finding.holder_function == "hog" and finding.holder_source == "gil_holder"
    assert not finding.idle_in_native and "computing" in finding.sentence()


def test_a_gil_verdict_without_a_holder_says_so_in_words() -> None:
    """No thread held the GIL in the gil probe's window: the sentence says it, and no internal
    name (an evidence kind such as gil_holder) reaches the prose."""
    verdict = Verdict(probe="gil", name="g", status=Status.PASS, layer=Layer.RUNTIME, why="calm",
                      evidence=(_starvation(p99_ms=0.3, max_ms=1.0),))
    sentence = finding_from_verdict(verdict).sentence()
    assert "named no GIL holder: it sampled no thread holding the GIL" in sentence
    assert not re.search(r"\b[a-z]+_[a-z_]+\b", sentence), sentence


def test_gil_error_verdict_means_the_signal_is_missing() -> None:
    error = Verdict.harness_error("gil", "g", "py-spy not found")
    finding = finding_from_verdict(error)
    assert not finding.available
    assert finding.sentence().startswith("The GIL signal is missing") and "py-spy not found" in finding.sentence()
    assert GilFinding(available=False, reason="x").evidence().kind == "gil_attribution"


# --------------------------------------------------------------------------------------------
# Probe definitions and CLI
# --------------------------------------------------------------------------------------------


def _definition(tmp_path: Path, options: str) -> Path:
    path = tmp_path / "gap.toml"
    path.write_text(
        "[[probe]]\nname = \"p\"\nprobe = \"gap\"\n"
        f"baseline = \"{THIS}:spin\"\ncandidate = \"{THIS}:spin\"\n"
        f"candidate_args = {{ extra_units = 100 }}\noptions = {options}\n",
        encoding="utf-8",
    )
    return path


def test_definition_options(tmp_path: Path) -> None:
    (definition,) = load_definitions([_definition(tmp_path, '{ threshold = "10%", repeats = 12, budget = 5 }')])
    cfg = config_from_definition(definition)
    assert cfg.threshold == pytest.approx(0.1) and cfg.repeats == 12 and cfg.budget_s == 5.0
    assert cfg.candidate.args == {"extra_units": 100}


@pytest.mark.parametrize("options", ['{ treshold = "5%" }', '{ repeats = "many" }', "{ repeats = 1 }",
                                     "{ threshold = 20 }"])
def test_definition_errors_name_the_problem(tmp_path: Path, options: str) -> None:
    with pytest.raises(InputError, match=r"gap\.toml: probe 'p'"):
        load_definitions([_definition(tmp_path, options)])


def test_shipped_definitions_parse() -> None:
    definitions = load_definitions([HERE.parents[1] / "probes" / "gap.toml"])
    configs = {d.name: config_from_definition(d) for d in definitions}
    holding = configs["kv-transfer-dispatch-holds-gil"]
    assert holding.candidate.ref.endswith("prefill_transfer_holding")
    expect = next(d.expect for d in definitions if d.name == holding.name)
    assert expect is not None and expect.where["function"] == "intranode_dispatch"


def test_cli_json_fail_and_exit_code(tmp_path: Path) -> None:
    from glmfb.cli import app

    result = CliRunner().invoke(app, [
        "gap", f"{THIS}:spin", f"{THIS}:spin", "--candidate-arg", "extra_units=60000",
        "--threshold", "5%", "--repeats", "20", "--budget", "20", "--no-attribute", "--json",
        "--out", str(tmp_path), "--csv", str(tmp_path / "tables"),
    ])
    assert result.exit_code == 1, result.output
    data = json.loads(result.stdout)
    import pandas as pd

    samples = pd.read_csv(tmp_path / "tables" / "gap_samples.csv")
    assert set(samples["side"]) == {"baseline", "candidate"} and (samples["seconds"] > 0).all()
    assert "extra_s" in set(pd.read_csv(tmp_path / "tables" / "phases.csv")["phase"])
    assert data["probe"] == "gap" and data["status"] == "fail" and data["layer"] == "transfer"
    assert data["metric"]["name"] == "gap" and data["metric"]["threshold"] == 0.05


def test_cli_bad_threshold_is_a_usage_error(tmp_path: Path) -> None:
    from glmfb.cli import app

    result = CliRunner().invoke(app, ["gap", f"{THIS}:spin", f"{THIS}:spin", "--threshold", "lots", "--json",
                                      "--out", str(tmp_path)])
    assert result.exit_code == 2


def test_failure_without_the_gil_probe_names_the_missing_signal(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import glmfb.gap.attribution as attribution

    def no_gil(kind: str) -> Any:
        raise InputError(f"unknown probe kind {kind!r}")

    monkeypatch.setattr(attribution, "get_probe", no_gil)  # an installation without the gil probe
    cfg = config("spin", candidate=Target(f"{THIS}:spin", {"extra_units": 60_000}), attribute=True)
    verdict = run_gap(cfg, tmp_path)
    assert verdict.status is Status.FAIL
    assert "The GIL signal is missing: the gil probe is not installed" in verdict.why
    gil = next(e for e in (x.to_dict() for x in verdict.evidence) if e["kind"] == "gil_attribution")
    assert gil["available"] is False
    assert verdict.where == {}
    assert any(step.command == "gil" and step.arguments["target"] == f"{THIS}:spin"
               and step.arguments["args"] == {"extra_units": 60_000} for step in verdict.next)


def test_a_group_of_short_lived_senders_reads_as_one_holder_and_one_competitor() -> None:
    """One sender thread per layer: the gil probe takes them as one thread (thread_count); the
    finding names it with the count, as holder and as CPU competitor."""
    holder = GilHolder(thread="Thread-N (_send_layer)", tid=7, function="_send_layer",
                       qualname="PrefillKV._send_layer", file="w.py", line=288, samples=60, idle_share=0.0,
                       share_of_time=0.6, c_function="pickle.dumps", c_symbol="_pickle_dumps", thread_count=58)
    starvation = Starvation(
        threads=("prefill", "glmfb-heartbeat"), canary="glmfb-heartbeat", threshold_ms=10.0, starved=True,
        ticks=400, period_ms=1.0, p50_ms=0.2, p99_ms=20.0, max_ms=50.0, wall_p99_ms=20.0, cpu_wait_total_ms=0.0,
        waiting_for_gil=(WaitingThread(thread="prefill", tid=2, waiting_share=0.3, of_runnable_share=0.45,
                                       of_runnable_ci=(0.4, 0.5)),))
    times = ThreadTimes(observed_s=4.0, threads=(
        ThreadTimeRow(thread="prefill", tid=2, cpu_share=0.35, runqueue_share=0.45, gil_wait_share=0.02,
                      other_wait_share=0.18, cpus="0"),
        ThreadTimeRow(thread="Thread-N (_send_layer)", tid=7, cpu_share=0.5, runqueue_share=0.1,
                      gil_wait_share=0.0, other_wait_share=0.4, cpus="0", c_function="zlib.compress",
                      thread_count=58)))
    verdict = Verdict(probe="gil", name="g", status=Status.FAIL, layer=Layer.RUNTIME, why="w",
                      evidence=(starvation, holder, times))
    finding = finding_from_verdict(verdict)
    assert finding.holder_thread_count == 58 and finding.gil_bound
    assert "on 58 short-lived threads Thread-N (_send_layer) (taken as one)" in finding.sentence()
    assert finding.competitor_thread == "Thread-N (_send_layer)" and finding.competitor_thread_count == 58
    assert "while 58 short-lived threads Thread-N (_send_layer) (taken as one) ran in zlib.compress" in (
        finding.cpu_sentence())
    assert finding.evidence().holder_thread_count == 58


def test_the_cpu_victims_own_gil_wait_interval_is_read_when_another_thread_is_named_starved() -> None:
    """The gil probe names the prefill the holder and the per-layer senders the most starved
    thread; the prefill, slowed by CPU contention, also waited for the GIL. Whether that wait is
    settled is read from the prefill's own interval, not the senders' (a fresh-clone run read
    over-threshold for want of it)."""
    holder = GilHolder(thread="prefill", tid=2, function="forward", qualname="Linear.forward", file="linear.py",
                       line=134, samples=60, idle_share=0.0, share_of_time=0.03,
                       c_function="torch::autograd::THPVariable_linear")
    starvation = Starvation(
        threads=("glmfb-heartbeat",), canary="glmfb-heartbeat", threshold_ms=10.0, starved=True,
        ticks=400, period_ms=1.0, p50_ms=0.1, p99_ms=37.0, max_ms=106.0, wall_p99_ms=46.0, cpu_wait_total_ms=0.0,
        waiting_for_gil=(WaitingThread(thread="prefill", tid=2, waiting_share=0.22, of_runnable_share=0.33,
                                       of_runnable_ci=(0.08, 0.55)),
                         WaitingThread(thread="Thread-N (_send_layer)", tid=7, waiting_share=0.044,
                                       of_runnable_share=0.084, of_runnable_ci=(0.016, 0.25))))
    times = ThreadTimes(observed_s=4.0, threads=(
        ThreadTimeRow(thread="prefill", tid=2, cpu_share=0.22, runqueue_share=0.33, gil_wait_share=0.22,
                      other_wait_share=0.23, cpus="0", gil_wait_of_runnable=0.33),
        ThreadTimeRow(thread="Thread-N (_send_layer)", tid=7, cpu_share=0.31, runqueue_share=0.48,
                      gil_wait_share=0.044, other_wait_share=0.17, cpus="0", c_function="zlib.compress",
                      thread_count=49)))
    verdict = Verdict(probe="gil", name="g", status=Status.FAIL, layer=Layer.RUNTIME, why="w",
                      evidence=(starvation, holder, times))
    finding = finding_from_verdict(verdict)
    assert finding.starved_thread == "Thread-N (_send_layer)" and finding.cpu_victim == "prefill"
    assert finding.cpu_victim_gil_of_runnable_ci == (0.08, 0.55)
    assert finding.victim_gil_wait_unsettled and finding.cpu_bound and not finding.gil_bound
    assert "that share is not settled (8% to 55% of its time off the run queue)" in finding.cpu_sentence()
    assert tuple(finding.evidence().cpu_victim_gil_of_runnable_ci) == (0.08, 0.55)
