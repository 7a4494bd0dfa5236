"""Change points of a series of runs (glmfb.workflows.history.changepoints), on synthetic series with
planted steps and seeded noise."""

from __future__ import annotations

import random

import pytest

from glmfb.workflows.history.changepoints import Observation, change_points, segments


def series(levels: list[float], *, sd: float = 0.01, half_width: float = 0.005, seed: int = 0
           ) -> list[Observation]:
    """Runs at ``levels`` with relative Gaussian scatter ``sd``, each with a 95% interval of
    relative ``half_width`` around its value."""
    rng = random.Random(seed)
    values = [level * (1.0 + rng.gauss(0.0, sd)) for level in levels]
    return [Observation(v, v * (1.0 - half_width), v * (1.0 + half_width)) for v in values]


def step(at: int, size: float, runs: int = 30) -> list[float]:
    return [1.0 if i < at else 1.0 + size for i in range(runs)]


def test_a_clean_step_is_found_at_its_run_with_an_interval_covering_its_size() -> None:
    points = change_points(series(step(17, 0.08)))
    assert [p.index for p in points] == [17]
    (point,) = points
    assert point.change_low < 0.08 < point.change_high
    assert point.relative_change == pytest.approx(0.08, abs=0.01)
    assert point.p_value <= 0.01
    assert (point.before_runs, point.after_runs) == (17, 13)


@pytest.mark.parametrize("seed", range(8))
def test_pure_noise_has_no_change_point(seed: int) -> None:
    assert change_points(series([1.0] * 30, seed=seed)) == []


def test_a_spike_is_not_a_change_point() -> None:
    levels = [1.0] * 30
    levels[12] = 1.5  # one run 50% slow
    assert change_points(series(levels, seed=3)) == []


def test_wide_intervals_make_a_marginal_step_insignificant_and_narrow_ones_significant() -> None:
    """The same values, only the runs' own intervals differ: a +1.5% step on 0.5% scatter is
    clear from the values, and lost when each run says it is known only to +-4%."""
    levels = step(15, 0.015)
    narrow = series(levels, sd=0.005, half_width=0.001, seed=5)
    wide = [Observation(o.value, o.value * 0.96, o.value * 1.04) for o in narrow]
    assert [p.index for p in change_points(narrow)] == [15]
    assert change_points(wide) == []


def test_a_plateau_shorter_than_min_segment_is_not_a_segment() -> None:
    """Four runs 20% slow in the middle: two change points with segments of three runs or
    more, none with five."""
    levels = [1.2 if 13 <= i < 17 else 1.0 for i in range(30)]
    runs = series(levels, sd=0.005)
    assert [p.index for p in change_points(runs, min_segment=3)] == [13, 17]
    assert change_points(runs, min_segment=5) == []


def test_min_change_drops_a_significant_change_smaller_than_it() -> None:
    runs = series(step(15, 0.03), sd=0.003)
    assert [p.index for p in change_points(runs)] == [15]
    assert change_points(runs, min_change=0.05) == []


def test_segments_cut_at_the_change_points() -> None:
    runs = series([*[1.0] * 10, *[1.1] * 10, *[0.95] * 10], sd=0.005)
    points = change_points(runs)
    assert [p.index for p in points] == [10, 20]
    assert segments(runs, points) == [(0, 10), (10, 20), (20, 30)]


def test_the_answer_is_deterministic() -> None:
    runs = series(step(15, 0.02), seed=2)
    assert change_points(runs) == change_points(runs)


def test_runs_without_intervals_use_their_scatter() -> None:
    runs = [Observation(o.value) for o in series(step(12, 0.05))]
    assert [p.index for p in change_points(runs)] == [12]


@pytest.mark.parametrize("runs", [[], [Observation(1.0)], [Observation(v) for v in (1.0, 2.0, 1.0, 2.0, 1.0)]])
def test_empty_and_short_series_have_no_change_point(runs: list[Observation]) -> None:
    assert change_points(runs) == []
    assert segments(runs, []) == ([(0, len(runs))] if runs else [])


def test_a_constant_series_and_a_step_between_exact_levels() -> None:
    assert change_points([Observation(1.0)] * 12) == []
    exact = [Observation(1.0)] * 6 + [Observation(2.0)] * 6
    assert [p.index for p in change_points(exact)] == [6]


def test_a_value_that_is_not_finite_is_refused() -> None:
    with pytest.raises(ValueError, match="NaN"):
        change_points([Observation(1.0)] * 5 + [Observation(float("nan"))])


def test_scattered_slow_runs_do_not_hide_a_step() -> None:
    """Three runs preempted (+60%) on either side of a +8% step: each is a burst shorter than
    a segment, taken out before the test, so the step's segments keep their own scatter."""
    levels = step(15, 0.08)
    for at in (4, 11, 23):
        levels[at] *= 1.6
    runs = series(levels, seed=4)
    assert [p.index for p in change_points(runs)] == [15]
    assert change_points(runs, despike=False) == []


def test_where_a_change_starts_is_given_as_the_runs_it_may_start_at() -> None:
    """A sharp step has one run for its start; on noisier +9% steps (7 runs, then 8, Gaussian
    noise of 2, 4 and 6% of the level, 200 series each) the bootstrap's runs hold the true start
    more often than ``index`` is it: the figures docs/history.md gives (96, 88, 77% against 95,
    72, 51% of the steps found)."""
    import random

    from glmfb.workflows.history.changepoints import Observation, change_points

    [sharp] = change_points([Observation(v) for v in [1.0, 1.002, 1.001] * 2 + [1.0] + [1.5, 1.502, 1.501] * 2
                             + [1.5] * 2])
    assert (sharp.index, sharp.earliest, sharp.latest) == (7, 7, 7)
    measured = {}
    for noise in (0.02, 0.04, 0.06):
        rng = random.Random(7)
        found = covered = right = 0
        for _ in range(200):
            values = [1 + rng.gauss(0, noise) for _ in range(7)] + [1.09 + rng.gauss(0, noise) for _ in range(8)]
            points = change_points([Observation(v) for v in values])
            if len(points) == 1:
                found += 1
                right += points[0].index == 7
                covered += points[0].earliest <= 7 <= points[0].latest
                assert points[0].earliest <= points[0].index <= points[0].latest
        measured[noise] = (round(100 * covered / found), round(100 * right / found))
    # measured here: {0.02: (96, 95), 0.04: (88, 72), 0.06: (77, 51)}
    assert measured[0.02][0] >= 90 and all(covered >= right for covered, right in measured.values()), measured
    assert all(measured[noise][0] - measured[noise][1] >= 10 for noise in (0.04, 0.06)), measured


def test_a_change_points_line_names_the_runs_its_start_may_be_at() -> None:
    """Through the document and its schema to the line a person reads."""
    import jsonschema

    from glmfb.workflows.history.render import change_point_line
    from glmfb.workflows.history.series import HISTORY_JSON_SCHEMA

    run = {"run_id": "r", "time": "t", "commit": None, "dirty": None}
    point = {"index": 7, "last_before": run, "first_after": {**run, "commit": "c" * 40}, "before": 1.0, "after": 1.09,
             "change": 0.09, "change_ci": [0.05, 0.13], "regression": 0.09, "regression_ci": [0.05, 0.13],
             "p_value": 0.002, "confidence": 0.998,
             "location": {"earliest": 5, "latest": 8, "nominal": 0.95, "earliest_run": {**run, "commit": "a" * 40},
                          "latest_run": {**run, "commit": "b" * 40}}}
    item = HISTORY_JSON_SCHEMA["properties"]["series"]["items"]["properties"]["change_points"]["items"]
    jsonschema.validate(point, item)
    line = change_point_line(point, "s", relative=False)
    assert line.endswith("the split's bootstrap puts its first run at runs 6-9 (aaaaaaaaaa..bbbbbbbbbb)"), line
    sharp = change_point_line({**point, "location": {**point["location"], "earliest": 7, "latest": 7}}, "s", False)
    assert "bootstrap" not in sharp


def test_a_series_imports_neither_ruptures_nor_scipy() -> None:
    """A recording run's report reads its series' history: it must not pay ruptures' and
    scipy's imports (1.5 s a run here), for a series too short to split or a long one."""
    import subprocess
    import sys

    code = ("import sys\nfrom glmfb.workflows.history.changepoints import Observation, change_points\n"
            "assert change_points([Observation(v) for v in (1.0, 1.1, 0.9, 1.0, 1.05)]) == []\n"
            "assert change_points([Observation(1.0 + 0.01 * (i % 3) + (0.5 if i >= 30 else 0)) for i in range(60)])\n"
            "print(sorted(m for m in ('ruptures', 'scipy') if m in sys.modules))")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip().splitlines()[-1] == "[]", done.stdout


def test_the_candidates_are_ruptures_binary_segmentation_split_for_split() -> None:
    """glmfb's binary segmentation is ruptures' ``Binseg(model="l2", min_size, jump=1)``, on
    steps, creeps, spikes, flat and tied series of 3 to 200 runs."""
    import random

    import numpy as np
    import ruptures

    from glmfb.workflows.history.changepoints import _candidates

    rng = random.Random(5)
    series: list[list[float]] = [[1.0] * 12, [1.0, 2.0] * 10, [0.5] * 3]
    for length in (4, 7, 15, 24, 60, 200):
        for _ in range(6):
            level = rng.choice([0.0, 1.0, 100.0])
            steps = {rng.randrange(length): rng.gauss(0, 1) for _ in range(rng.randrange(4))}
            values, current = [], level
            for index in range(length):
                current += steps.get(index, 0.0) + rng.choice([0.0, 0.01]) * index / length
                values.append(round(current + rng.gauss(0, rng.choice([0.0, 0.01, 0.3])), rng.choice([2, 6, 12])))
            series.append(values)
    for values in series:
        for min_segment in (2, 3, 5):
            most = len(values) // min_segment - 1
            if most < 1:
                assert _candidates(values, min_segment) == []
                continue
            try:
                ends = ruptures.Binseg(model="l2", min_size=min_segment, jump=1).fit(
                    np.asarray(values, dtype=np.float64)).predict(n_bkps=most)
                expected = sorted(int(e) for e in ends if e < len(values))
            except ruptures.exceptions.BadSegmentationParameters:
                expected = []
            assert _candidates(values, min_segment) == expected, (values, min_segment)
