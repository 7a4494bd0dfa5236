"""Each plot builder on small evidence in the JSON shape the probes write: it draws an SVG, names
its elements, says what it shows, and declines (missing, with the reason) without its evidence."""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import pytest

from glmfb.core.plotting import figure_to_svg, new_axes, number, resolve_artifact, style
from glmfb.gap.plots import stacked_phases
from glmfb.workflows.report.plots import Drawn, VerdictView, draw, specs_for

RUN_ID = "20260101-000000-abcd"


def view(probe: str, evidence: list[dict[str, Any]], *, where: Mapping[str, Any] | None = None,
         artifacts: Mapping[str, str] | None = None, run_dir: Path | None = None) -> VerdictView:
    data = {"schema": "glmfb.verdict/1", "probe": probe, "name": f"{probe}-case", "status": "fail",
            "layer": "numerics", "where": dict(where or {}), "why": "w", "metric": None,
            "evidence": evidence, "next": [], "artifacts": dict(artifacts or {}), "env": {}, "duration_s": 1.0}
    return VerdictView(data, run_dir=run_dir, run_id=RUN_ID)


def drawn(plot_id: str, v: VerdictView) -> Drawn:
    spec = next(s for s in specs_for(str(v.data["probe"])) if s.plot_id == plot_id)
    result = draw(spec, v, prefix="t0")
    assert result.state == "drawn", result.reason
    assert result.svg.startswith("<svg")
    assert f'aria-label="{spec.title}: {v.name}"' in result.svg
    assert "<?xml" not in result.svg and "width=\"" not in result.svg.split(">", 1)[0]
    assert "<metadata" not in result.svg
    assert "http" not in re.sub(r'xmlns(:\w+)?="[^"]*"', "", result.svg)  # namespaces are names, not requests
    return result


def element_ids(svg: str) -> set[str]:
    return {i.removeprefix("t0-") for i in re.findall(r'\bid="([^"]+)"', svg)}


# --------------------------------------------------------------------------------------------
# diff
# --------------------------------------------------------------------------------------------

POSITIONS = {"kind": "error_by_position", "request": "scan-1024", "tap": "layers.0.scan", "local": True,
             "first_failing_position": 130, "failing_positions": 767,
             "positions": [16.5, 48.5, 80.5, 112.5, 144.5, 176.5], "rel_l2": [8e-4, 1.5e-3, 2.1e-3, 2.4e-3, 2.9e-3, 3.1e-3]}
SHAPE = {"kind": "error_shape", "shape": "growing", "measure": "relative L2 error",
         "fit": {"basis": "requests", "points": 4, "slope": 1.3e-5, "r2": 0.98, "loglog_exponent": 0.76,
                 "loglog_r2": 0.99, "lengths": [64.0, 128.0, 256.0, 512.0], "errors": [2e-3, 2.6e-3, 4.9e-3, 9.4e-3]}}
REQUESTS = {"kind": "requests", "rows": [
    {"request": f"scan-{n}", "length": n, "status": "pass" if n == 64 else "fail", "output_rel_l2": e}
    for n, e in ((64, 2e-3), (128, 2.6e-3), (256, 4.9e-3), (512, 9.4e-3))]}
LOCAL = {"kind": "local_error", "request": "scan-512", "rows": [
    {"module": "layers.0.scan", "call": 0, "tap": "layers.0.scan", "local_exceeds_tolerance": True,
     "local_rel_l2": 9e-3, "total_rel_l2": 9e-3},
    {"module": "layers.0.out", "call": 0, "tap": "layers.0.out", "local_exceeds_tolerance": False,
     "local_rel_l2": 0.0, "total_rel_l2": 9.4e-3}]}


def test_error_by_position_marks_the_first_failing_position() -> None:
    result = drawn("diff-error-by-position", view("diff", [POSITIONS]))
    assert {"error-by-position", "first-failing-position"} <= element_ids(result.svg)
    assert "First position outside tolerance: 130; 767 positions fail." in result.caption


def test_error_growth_draws_the_fit_with_the_evidences_exponent() -> None:
    result = drawn("diff-error-growth", view("diff", [REQUESTS, SHAPE]))
    assert {"growth-fit", "requests-pass", "requests-fail"} <= element_ids(result.svg)
    assert "error ∝ length^0.76, log-log r² 0.99" in result.caption


def test_error_growth_of_a_clean_twin_says_zero_error() -> None:
    rows = [dict(r, output_rel_l2=0.0, status="pass") for r in REQUESTS["rows"]]
    result = drawn("diff-error-growth", view("diff", [{"kind": "requests", "rows": rows},
                                                       {"kind": "error_shape", "shape": "none", "fit": None}]))
    assert "growth-fit" not in element_ids(result.svg)
    assert "Every request matches exactly." in result.caption


def test_module_errors_show_own_against_inherited_and_name_the_culprit() -> None:
    result = drawn("diff-module-errors", view("diff", [LOCAL], where={"module": "layers.0.scan"}))
    ids = element_ids(result.svg)
    assert {"own-layers-0-scan", "total-layers-0-scan", "total-layers-0-out"} <= ids
    assert "The verdict names layers.0.scan" in result.caption


def test_counterfactual_is_drawn_only_when_present() -> None:
    spec = next(s for s in specs_for("diff") if s.plot_id == "diff-counterfactual")
    absent = draw(spec, view("diff", [REQUESTS]), prefix="t0")
    assert absent.state == "missing" and spec.optional
    evidence = {"kind": "counterfactual", "knob": "merge_precision", "candidate_value": "tf32",
                "candidate_rel_l2": 1.5e-2, "closes": "tf32x3",
                "results": [{"value": "ieee", "rel_l2": 1e-6, "failed": False},
                            {"value": "tf32x3", "rel_l2": 2e-6, "failed": False}]}
    result = drawn("diff-counterfactual", view("diff", [evidence]))
    assert {"counterfactual-tf32-as-run", "counterfactual-tf32x3"} <= element_ids(result.svg)
    assert "merge_precision=tf32x3 closes the gap" in result.caption


def test_error_by_position_reads_zero_based_bins_and_shades_the_failing_ones() -> None:
    item = {"kind": "error_by_position", "request": "s64", "tap": "model.layers.0.self_attn.o_proj", "local": False,
            "first_failing_position": 16, "failing_positions": 48, "positions": [8, 24, 40, 56],
            "rel_l2": [0.0, 1.1, 1.2, 1.3], "bin_edges": [0, 16, 32, 48, 64], "outside_fraction": [0.0, 0.9, 1.0, 1.0],
            "length": 64}
    result = drawn("diff-error-by-position", view("diff", [item]))
    ids = element_ids(result.svg)
    assert {"outside-tolerance-0", "outside-tolerance-2", "first-failing-position"} <= ids
    assert "outside-tolerance-3" not in ids  # one shaded span per failing bin: bins 1, 2, 3
    assert "(64 positions)" in result.caption and "Shaded: bins with elements outside tolerance." in result.caption


def test_error_growth_uses_the_evidences_intercept() -> None:
    fit = dict(SHAPE["fit"], loglog_intercept=-9.0)
    result = drawn("diff-error-growth", view("diff", [REQUESTS, dict(SHAPE, fit=fit)]))
    assert "growth-fit" in element_ids(result.svg)


def test_module_errors_show_the_error_measured_at_the_inputs() -> None:
    rows = [dict(LOCAL["rows"][0], inherited_rel_l2=0.0), dict(LOCAL["rows"][1], inherited_rel_l2=9e-3)]
    result = drawn("diff-module-errors", view("diff", [dict(LOCAL, rows=rows)], where={"module": "layers.0.scan"}))
    assert {"inherited-layers-0-out", "own-layers-0-scan"} <= element_ids(result.svg)
    assert "grey bar is the error measured at the module's inputs" in result.caption


def test_counterfactual_values_not_tried_are_named_not_drawn() -> None:
    evidence = {"kind": "counterfactual", "knob": "tf32", "candidate_value": True, "candidate_rel_l2": 1.5e-2,
                "closes": False,
                "results": [{"value": False, "rel_l2": 0.0, "failed": False, "lengths": [64, 128], "errors": [0.0, 0.0],
                             "tried": True},
                            {"value": "x", "rel_l2": None, "failed": None, "tried": False, "note": "no CUDA device"}]}
    result = drawn("diff-counterfactual", view("diff", [evidence]))
    assert "counterfactual-false" in element_ids(result.svg)
    assert "tf32=false closes the gap" in result.caption and "Not tried: x (no CUDA device)." in result.caption


# --------------------------------------------------------------------------------------------
# bench
# --------------------------------------------------------------------------------------------

SUMMARY = {"kind": "summary", "shapes": 2, "geomean_change": 3.0, "geomean_ci": [2.8, 6.4], "threshold": 0.05}
SHAPES = [
    {"kind": "shape", "shape": "8x4096", "decision": "regression", "change": 3.3, "ci": [3.15, 8.3],
     "aa_ci": [0.011, 0.025]},
    {"kind": "shape", "shape": "32x2048", "decision": "equivalent", "change": 0.01, "ci": [-0.02, 0.03]},
]
OP_DIFF = {"kind": "op_diff", "shape": "8x4096", "profiled_calls": 100, "rule": "redundant-recomputation",
           "repeated_reductions": ["aten::sum"],
           "ops": [{"op": "aten::sum", "baseline_calls": 1.0, "candidate_calls": 4.0, "baseline_self_us": 3.0,
                    "candidate_self_us": 11.0, "reduction": True},
                   {"op": "aten::silu", "baseline_calls": 1.0, "candidate_calls": 4.0, "baseline_self_us": 15.0,
                    "candidate_self_us": 59.0, "reduction": False}]}


def test_forest_plot_places_each_shape_against_the_threshold_band() -> None:
    result = drawn("bench-forest", view("bench", [SUMMARY, *SHAPES]))
    assert {"threshold-band", "interval-8x4096", "change-8x4096", "change-32x2048", "change-geomean"} <= element_ids(result.svg)
    assert "Slower beyond the threshold: 8x4096." in result.caption
    assert "32x2048" not in result.caption


def test_op_diff_shows_calls_and_self_time_of_both_sides() -> None:
    result = drawn("bench-op-diff", view("bench", [OP_DIFF]))
    assert {"op-calls", "op-self_us"} <= element_ids(result.svg)
    assert "Repeated reductions (bold): aten::sum." in result.caption


def test_samples_are_read_from_the_saved_artifact(tmp_path: Path) -> None:
    run_dir = tmp_path / RUN_ID
    (run_dir / "probe").mkdir(parents=True)
    samples = {"schema": "glmfb.bench/1", "shapes": {"8x4096": {"calls_per_sample": 3,
               "baseline": [4.7e-5, 4.8e-5, 4.6e-5, "nan"], "candidate": [2.6e-4, 2.7e-4, 2.5e-4]}}}
    (run_dir / "probe" / "bench-samples.json").write_text(json.dumps(samples))
    # Written relative to where the run started: found under the run folder wherever that is now.
    v = view("bench", [], artifacts={"samples": f"reports/{RUN_ID}/probe/bench-samples.json"}, run_dir=run_dir)
    result = drawn("bench-samples", v)
    assert "samples-8x4096" in element_ids(result.svg)
    assert "bench-samples.json" in result.caption


def test_samples_without_the_artifact_say_so() -> None:
    spec = next(s for s in specs_for("bench") if s.plot_id == "bench-samples")
    result = draw(spec, view("bench", [], artifacts={"samples": "gone/bench-samples.json"}), prefix="t0")
    assert result.state == "missing" and "no samples artifact" in result.reason


def test_op_diff_marks_the_operators_only_one_side_runs() -> None:
    item = dict(OP_DIFF, rule="lost-fusion", repeated_reductions=[], only_in_candidate=["aten::sub", "aten::pow"],
                only_in_candidate_share=1.0, only_in_baseline=["aten::layer_norm"], only_in_baseline_share=-0.4,
                ops=[{"op": "aten::sub", "baseline_calls": 0.0, "candidate_calls": 2.0, "baseline_self_us": 0.0,
                      "candidate_self_us": 800.0, "only_in": "candidate"},
                     {"op": "aten::pow", "baseline_calls": 0.0, "candidate_calls": 1.0, "baseline_self_us": 0.0,
                      "candidate_self_us": 400.0, "only_in": "candidate"},
                     *[{"op": f"aten::op{i}", "baseline_calls": 1.0, "candidate_calls": 1.0, "baseline_self_us": 1.0,
                        "candidate_self_us": 1.0} for i in range(20)],
                     {"op": "aten::layer_norm", "baseline_calls": 1.0, "candidate_calls": 0.0,
                      "baseline_self_us": 400.0, "candidate_self_us": 0.0, "only_in": "baseline"}])
    result = drawn("bench-op-diff", view("bench", [item]))
    assert "Only in the candidate: aten::sub, aten::pow (+100% of the added time)." in result.caption
    assert "Only in the baseline: aten::layer_norm" in result.caption
    assert "12 of 23 ops shown." in result.caption


def test_samples_come_from_the_shapes_quantiles_without_the_artifact() -> None:
    shape = dict(SHAPES[0], quantiles_s={"baseline": [4.5e-5, 4.6e-5, 4.7e-5, 4.8e-5, 4.9e-5, 5.2e-5, 6e-5],
                                         "candidate": [2.5e-4, 2.5e-4, 2.6e-4, 2.7e-4, 2.7e-4, 2.8e-4, 3e-4]})
    result = drawn("bench-samples", view("bench", [shape], artifacts={"samples": "gone/bench-samples.json"}))
    assert "quantiles-8x4096" in element_ids(result.svg)
    assert "From the quantiles in the verdict" in result.caption


# --------------------------------------------------------------------------------------------
# gil
# --------------------------------------------------------------------------------------------

STARVATION = {"kind": "starvation", "threads": ["kv-transfer", "glmfb-heartbeat"], "canary": "glmfb-heartbeat",
              "ticks": 91, "period_ms": 1.0, "p50_ms": 19.4, "p99_ms": 90.9, "max_ms": 90.9, "threshold_ms": 10.0,
              "starved": True, "windows_total": 83, "starved_ms_total": 2575.5,
              "waiting_for_gil": [{"thread": "kv-transfer", "tid": 2, "waiting_share": 0.94}],
              "windows": [{"start_s": 0.0125, "duration_ms": 90.9, "waiting_threads": ["kv-transfer"],
                           "holder": "moe-dispatch"},
                          {"start_s": 1.38, "duration_ms": 58.8, "waiting_threads": ["kv-transfer"],
                           "holder": "moe-dispatch"}]}
THREADS = {"kind": "gil_threads", "samples": 289, "sample_instants": 300, "threads": [
    {"thread": "moe-dispatch", "tid": 3, "samples": 287, "share": 0.957, "excluded": False},
    {"thread": "kv-transfer", "tid": 2, "samples": 2, "share": 0.007, "excluded": False}]}


def test_gil_timeline_has_a_lane_per_thread_and_state() -> None:
    result = drawn("gil-timeline", view("gil", [STARVATION]))
    assert {"holding-moe-dispatch", "waiting-kv-transfer", "starved-glmfb-heartbeat-canary"} <= element_ids(result.svg)
    assert "The 2 longest of 83 starved windows" in result.caption
    assert "Holding the GIL in them: moe-dispatch." in result.caption


def test_gil_timeline_without_a_starved_window_says_so() -> None:
    quiet = dict(STARVATION, windows=[], p99_ms=0.2, starved=False)
    spec = next(s for s in specs_for("gil") if s.plot_id == "gil-timeline")
    result = draw(spec, view("gil", [quiet]), prefix="t0")
    assert result.state == "missing" and "no starved window" in result.reason


def test_gil_wait_shares_per_thread() -> None:
    result = drawn("gil-wait-shares", view("gil", [STARVATION, THREADS]))
    assert {"holding-moe-dispatch", "waiting-kv-transfer"} <= element_ids(result.svg)
    assert "Starved threads (red): glmfb-heartbeat, kv-transfer." in result.caption


def test_gil_wait_shares_with_only_the_heartbeat_sampled_says_so() -> None:
    quiet = dict(STARVATION, waiting_for_gil=[], threads=[], starved=False)
    heartbeat_only = dict(THREADS, samples=1, threads=[
        {"thread": "glmfb-heartbeat", "tid": 9, "samples": 1, "share": 0.0033, "excluded": True}])
    spec = next(s for s in specs_for("gil") if s.plot_id == "gil-wait-shares")
    result = draw(spec, view("gil", [quiet, heartbeat_only]), prefix="t0")
    assert result.state == "missing"
    assert result.reason == ("no thread (glmfb-heartbeat, glmfb's own, aside) held or waited for the GIL "
                             "in any of 300 sampled instants")


def test_gil_lateness_against_the_threshold() -> None:
    result = drawn("gil-lateness", view("gil", [STARVATION]))
    assert {"lateness-p99", "threshold"} <= element_ids(result.svg)
    assert "p99 90.9 ms > 10 ms: starved." in result.caption


THREAD_TIMES = {"kind": "thread_times", "observed_s": 4.0, "native_snapshots": 12, "threads": [
    {"thread": "MainThread", "tid": 1, "cpu_share": 0.29, "runqueue_share": 0.3, "gil_wait_share": 0.41,
     "other_wait_share": 0.0, "gil_wait_ci": [0.37, 0.45], "glmfb": False},
    {"thread": "serializer", "tid": 4, "cpu_share": 0.56, "runqueue_share": 0.13, "gil_wait_share": 0.01,
     "other_wait_share": 0.3, "c_function": "pickle.dumps", "glmfb": False}]}
TIMELINE = {"kind": "gil_timeline", "observed_s": 4.0, "threads": [
    {"thread": "serializer", "tid": 4, "spans": [[0.0, 0.5, "holding"], [0.5, 0.6, "running"]]},
    {"thread": "MainThread", "tid": 1, "spans": [[0.0, 0.5, "waiting"], [0.5, 1.0, "running"]]}]}
SERIES = dict(STARVATION, observed_s=4.0, expected_ticks=4000, stall_ms=2100.0, stall_start_s=0.5,
              stall_gil_share=0.93, lateness_series=[[0.01, 0.2], [0.5, 2100.0], [3.9, 0.3]])


def test_gil_thread_times_stack_each_threads_window() -> None:
    result = drawn("gil-thread-times", view("gil", [THREAD_TIMES]))
    ids = element_ids(result.svg)
    assert {"gil_wait_share-MainThread", "cpu_share-serializer", "gil-ci-MainThread"} <= ids
    assert "schedstat" in result.caption


def test_gil_thread_timeline_draws_each_state_and_the_stall() -> None:
    result = drawn("gil-thread-timeline", view("gil", [TIMELINE, SERIES]))
    assert {"holding-serializer", "waiting-MainThread", "running-MainThread", "stall"} <= element_ids(result.svg)
    assert "longest stretch without a wake-up: 2.10 s, blocked on the GIL 93% of it" in result.caption


def test_gil_lateness_over_time_counts_the_ticks_that_never_came() -> None:
    result = drawn("gil-lateness-series", view("gil", [SERIES]))
    assert {"lateness-points", "threshold"} <= element_ids(result.svg)
    assert "91 wake-ups recorded of 4000" in result.caption


# --------------------------------------------------------------------------------------------
# gap
# --------------------------------------------------------------------------------------------

GAP = {"kind": "gap", "gap": 0.25, "ci": [0.15, 0.44], "confidence": 0.95, "threshold": 0.05,
       "baseline_median_s": 0.5705, "candidate_median_s": 0.715, "iterations_per_side": 8}
PHASES = [
    {"kind": "phase", "phase": "kv_wait_s", "baseline_s": None, "candidate_s": 0.1406, "change": None, "ci": None,
     "concurrent": False},
    {"kind": "phase", "phase": "dispatch_s", "baseline_s": 0.4806, "candidate_s": 0.4821, "change": 0.003,
     "ci": [-0.008, 0.005], "concurrent": False},
    {"kind": "phase", "phase": "prefill_s", "baseline_s": 0.5705, "candidate_s": 0.5708, "change": 0.0006,
     "ci": [-0.06, 0.13], "concurrent": False},
    {"kind": "phase", "phase": "transfer_busy_s", "baseline_s": None, "candidate_s": 0.58, "change": None,
     "ci": None, "concurrent": True},
]
BANDWIDTH = {"kind": "bandwidth", "transfer_path": "mooncake", "bytes_per_iteration": 4194304.0,
             "achieved_bytes_per_s": 7.2e6, "ceiling_bytes_per_s": 1.52e9, "page_rate_bytes_per_s": 1.98e7}


def test_phases_that_overlap_are_not_stacked() -> None:
    stacked, nested = stacked_phases(PHASES[:3], [0.5705, 0.715])
    assert set(stacked) == {"kv_wait_s", "prefill_s"} and nested == ["dispatch_s"]
    declared = [dict(PHASES[0]), dict(PHASES[1], within="prefill_s"), dict(PHASES[2])]
    assert stacked_phases(declared, [None, None])[1] == ["dispatch_s"]


def test_gap_phases_stack_each_side() -> None:
    result = drawn("gap-phases", view("gap", [GAP, *PHASES]))
    ids = element_ids(result.svg)
    assert {"phase-baseline-prefill_s", "phase-candidate-prefill_s", "phase-candidate-kv_wait_s",
            "phase-candidate-dispatch_s", "phase-candidate-transfer_busy_s", "iteration-candidate"} <= ids
    assert "phase-baseline-kv_wait_s" not in ids
    assert "Only in the candidate: kv_wait_s." in result.caption


def test_gap_interval_against_the_threshold() -> None:
    result = drawn("gap-interval", view("gap", [GAP, *PHASES]))
    assert {"interval-iteration-gap", "interval-prefill_s", "threshold"} <= element_ids(result.svg)
    assert "The gap: +25.0%, 95% interval [+15.0%, +44.0%], threshold 5%" in result.caption


def test_gap_bandwidth_against_the_ceiling() -> None:
    result = drawn("gap-bandwidth", view("gap", [BANDWIDTH]))
    assert {"achieved", "page-rate", "ceiling"} <= element_ids(result.svg)
    assert "36% of its page-by-page rate alone (held back, not the link)." in result.caption


def test_gap_gil_timeline_from_the_saved_gil_verdict(tmp_path: Path) -> None:
    nested = view("gil", [STARVATION]).data
    (tmp_path / "gil-verdict.json").write_text(json.dumps(nested))
    result = drawn("gap-gil-timeline", view("gap", [GAP], artifacts={"gil_verdict": str(tmp_path / "gil-verdict.json")}))
    assert "holding-moe-dispatch" in element_ids(result.svg)


# --------------------------------------------------------------------------------------------
# Shared behaviour
# --------------------------------------------------------------------------------------------


@pytest.mark.parametrize("probe", ["diff", "bench", "gil", "gap"])
def test_no_evidence_leaves_every_plot_missing_with_a_reason(probe: str) -> None:
    for spec in specs_for(probe):
        result = draw(spec, view(probe, []), prefix="t0")
        assert result.state == "missing", (spec.plot_id, result.reason)
        assert result.reason


def test_malformed_evidence_is_an_error_result_not_an_exception() -> None:
    spec = next(s for s in specs_for("bench") if s.plot_id == "bench-op-diff")
    result = draw(spec, view("bench", [dict(OP_DIFF, ops=5)]), prefix="t0")
    assert result.state == "error" and "TypeError" in result.reason


def test_svg_ids_are_prefixed_and_references_follow() -> None:
    with style():
        figure, axes = new_axes()
        axes.plot([1, 2], [1, 2], gid="curve")
        axes.set_title("T")
        svg = figure_to_svg(figure, "abc", "label")
    ids = re.findall(r'\bid="([^"]+)"', svg)
    assert ids and all(i.startswith("abc-") for i in ids)
    refs = re.findall(r'(?:href="#|url\(#)([^")]+)', svg)
    assert refs and all(r.startswith("abc-") and r in ids for r in refs)


def test_numbers_from_evidence() -> None:
    assert number("nan") is None and number("inf") is None and number(True) is None
    assert number("1.5") == 1.5 and number(2) == 2.0


def test_artifacts_resolve_under_a_moved_run_folder(tmp_path: Path) -> None:
    moved = tmp_path / "elsewhere" / RUN_ID
    (moved / "p").mkdir(parents=True)
    (moved / "p" / "a.csv").write_text("x")
    assert resolve_artifact(f"reports/{RUN_ID}/p/a.csv", moved, RUN_ID) == (moved / "p" / "a.csv").resolve()
    assert resolve_artifact("p/a.csv", moved, RUN_ID) == (moved / "p" / "a.csv").resolve()
    assert resolve_artifact(f"reports/{RUN_ID}/p/missing.csv", moved, RUN_ID) is None
    original = tmp_path / "original" / RUN_ID
    (original / "p").mkdir(parents=True)
    (original / "p" / "a.csv").write_text("x")
    # an absolute path into the original folder: the copy's own file wins
    assert resolve_artifact(str(original / "p" / "a.csv"), moved, RUN_ID) == (moved / "p" / "a.csv").resolve()
