"""glmfb run's scheduler: timing probes have the machine to themselves, numerics probes run
side by side within the machine's cores, the verdicts stay in definition order, and an error,
a timeout or a Ctrl-C beside another probe is handled as it is alone.

The probes are the toy of tests/toy, installed through the entry-point mechanism twice: as
``toy`` (a timing probe, the default of a probe that does not say) and as ``toy-numerics``
(``timing`` false, occupying its ``cores`` option). Each run sleeps as long as it is told in
its own supervised child and says when it started and finished, so overlap is read from the
verdicts; the sleeps are seconds long, far beyond the host's noise.
"""

from __future__ import annotations

import faulthandler
import gc
import signal
import threading
import time
import warnings
from collections.abc import Iterator
from pathlib import Path

import pytest

from glmfb.contract.verdict import Run, Status, Verdict
from glmfb.core.probe import Placement, get_probe, placement, reset_registry
from glmfb.workflows import suite
from glmfb.workflows.suite import SuiteContext, next_startable

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture
def toys(toy: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    """The toy as ``toy`` and as ``toy-numerics`` (a second dist-info naming TOY_NUMERICS)."""
    site = tmp_path / "site"
    info = site / "glmfb_toy_numerics-0.1.dist-info"
    info.mkdir(parents=True)
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: glmfb-toy-numerics\nVersion: 0.1\n")
    (info / "entry_points.txt").write_text("[glmfb.probes]\ntoy-numerics = toy_probe:TOY_NUMERICS\n")
    monkeypatch.syspath_prepend(str(site))
    reset_registry()
    yield site
    reset_registry()


def definitions(tmp_path: Path, *tables: str) -> list[suite.ProbeDefinition]:
    file = tmp_path / "schedule.toml"
    file.write_text("\n".join(f"[[probe]]\n{table}\n" for table in tables))
    return suite.load_definitions([file])


def numerics(name: str, sleep: float, cores: int = 1, extra: str = "") -> str:
    return f"name = '{name}'\nprobe = 'toy-numerics'\noptions = {{ sleep = {sleep}, cores = {cores}{extra} }}"


def timing(name: str, sleep: float) -> str:
    return f"name = '{name}'\nprobe = 'toy'\noptions = {{ sleep = {sleep} }}"


def span(verdict: Verdict) -> tuple[float, float]:
    reading = next(e for e in verdict.to_dict()["evidence"] if e["kind"] == "toy_reading")
    return reading["started"], reading["finished"]


def overlap(a: Verdict, b: Verdict) -> bool:
    (a0, a1), (b0, b1) = span(a), span(b)
    return a0 < b1 and b0 < a1


def test_next_startable() -> None:
    one, two, alone = Placement(False, 1), Placement(False, 2), Placement(True, 2)
    places = [one, one, alone, two, one]
    assert next_startable(places, [0, 1, 2, 3, 4], [], 2) == 0
    assert next_startable(places, [1, 2, 3, 4], [one], 2) == 1
    assert next_startable(places, [2, 3, 4], [one, one], 2) is None  # every core taken
    assert next_startable(places, [2, 3, 4], [one], 2) == 4  # the timing probe waits; a later numerics one fits
    assert next_startable(places, [2, 3], [one], 2) is None  # two cores do not fit beside one
    assert next_startable(places, [2, 3], [], 2) == 2  # an exclusive one starts when nothing runs
    assert next_startable(places, [3, 4], [alone], 2) is None  # nothing beside an exclusive run
    assert next_startable(places, [0, 1], [two], 4) == 0


def test_placement_of_each_kind(toys: Path) -> None:
    """Timing probes (and any probe that does not say) run alone; a diff occupies its ranks."""
    probes = ROOT / "probes"
    loaded = {d.name: d for d in suite.load_definitions(suite.discover([probes]))}
    assert suite.definition_placement(loaded["llama-clean-vs-itself"], 2) == Placement(False, 1)
    assert suite.definition_placement(loaded["kda-cp-merge-tf32"], 2) == Placement(True, 2)  # 2 lockstep ranks
    assert suite.definition_placement(loaded["kda-cp-merge-tf32"], 8) == Placement(False, 2)
    for name in ("gated-norm-tiled-vs-fused", "gil-dispatch-holds-gil", "kv-transfer-dispatch-holds-gil"):
        assert suite.definition_placement(loaded[name], 16).exclusive, name

    class Older:  # a probe from a package that predates `timing`
        kind = "older"

    assert placement(Older(), None, 4) == Placement(True, 4)
    assert placement(get_probe("toy"), None, 4) == Placement(True, 4)


def test_numerics_share_the_machine_and_timing_probes_never_do(toys: Path, tmp_path: Path) -> None:
    chosen = definitions(
        tmp_path,
        numerics("a", 1), numerics("b", 6), timing("t", 0.5), numerics("c", 1),
        numerics("wide", 0.5, cores=2),
    )
    done: list[str] = []
    messages: list[str] = []
    context = SuiteContext("r", tmp_path / "reports", on_progress=messages.append)
    run = suite.run_suite(chosen, context, on_done=lambda d, v: done.append(d.name), capacity=2)
    assert [v.name for v in run.verdicts] == ["a", "b", "t", "c", "wide"] == done
    assert all(v.status is Status.PASS for v in run.verdicts), [v.why for v in run.verdicts]
    by = {v.name: v for v in run.verdicts}
    assert overlap(by["a"], by["b"])  # two one-core numerics probes on two cores
    assert overlap(by["b"], by["c"])  # c starts when a ends: it fits beside b, t waits for the machine
    assert span(by["c"])[1] <= span(by["t"])[0]
    for alone in ("t", "wide"):  # a timing probe, and a numerics one that takes every core
        assert not any(overlap(by[alone], v) for v in run.verdicts if v.name != alone), alone
    assert "b: sleeping 6 s" in messages and "sleeping 0.5 s" in messages  # whose progress, when shared
    assert Run.from_dict(run.to_dict()) == run


def test_an_error_and_a_timeout_beside_another_probe(toys: Path, tmp_path: Path) -> None:
    chosen = definitions(
        tmp_path,
        numerics("boom", 0.5, extra=", outcome = 'raise'"),
        numerics("hangs", 60) + "\ntimeout = '3s'",
        numerics("fine", 4) + "\nexpect = { status = 'pass' }",
    )
    started = time.monotonic()
    run = suite.run_suite(chosen, SuiteContext("r", tmp_path / "reports"), capacity=3)
    assert time.monotonic() - started < 45  # the hung one was stopped at its timeout
    boom, hangs, fine = run.verdicts
    assert boom.status is Status.ERROR and "glmfb toy-numerics broke: RuntimeError: engine exploded" in boom.why
    assert hangs.status is Status.ERROR and "killed after 3 s timeout" in hangs.why
    assert fine.status is Status.PASS and fine.expect_met is True
    assert not run.interrupted


def _take_back_sigint() -> str:
    """Restore Python's SIGINT handling in this process (its handler, unblocked); say what was
    found instead, or ""."""
    found = []
    handler = signal.getsignal(signal.SIGINT)
    if handler is not signal.default_int_handler:
        found.append(f"handler {handler!r}")
    if signal.SIGINT in signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGINT}):
        found.append("blocked in the main thread")
    signal.signal(signal.SIGINT, signal.default_int_handler)  # also the C-level disposition
    return ", ".join(found)


def test_ctrl_c_stops_every_running_probe(toys: Path, tmp_path: Path) -> None:
    chosen = definitions(tmp_path, numerics("x", 60), numerics("y", 60) + "\nexpect = { status = 'pass' }",
                         timing("later", 0))
    # Ctrl-C 2 s after the second probe has started, so both are running when it comes. Runs of
    # the whole suite started in the background by a script (`cmd &` without job control) took
    # 60 s here, the probes' full sleep: such a shell starts its background commands with SIGINT
    # ignored, and Python then installs no KeyboardInterrupt handler, so the test's SIGINT was
    # dropped (reproduced: with SIG_IGN on entry the test read "not taken" after 60.5 s). The
    # test starts from Python's own SIGINT handling and warns when it found something else.
    # Past 20 s every thread's stack goes to stderr.
    found = _take_back_sigint()
    if found:
        warnings.warn(f"on entry SIGINT was not Python's: {found} (inherited, or an earlier test left it)", stacklevel=1)
    gc.collect()
    timer = threading.Timer(2.0, signal.pthread_kill, (threading.main_thread().ident, signal.SIGINT))
    begun: list[str] = []

    def on_start(definition: suite.ProbeDefinition) -> None:
        begun.append(definition.name)
        if len(begun) == 2:
            timer.start()

    started = time.monotonic()
    faulthandler.dump_traceback_later(20)
    try:
        run = suite.run_suite(chosen, SuiteContext("r", tmp_path / "reports"), capacity=2, on_start=on_start)
    finally:
        faulthandler.cancel_dump_traceback_later()
        timer.cancel()
    took = time.monotonic() - started
    assert run.interrupted and int(run.exit_code) == 3, f"the interrupt was not taken ({took:.1f} s)"
    assert took < 40, f"interrupted, but its probes ran on: {[v.why for v in run.verdicts]}"  # stopped, not waited for
    x, y, later = run.verdicts
    assert x.why == y.why == "interrupted (SIGINT) while running; its processes were stopped"
    assert y.expect_met is False
    assert later.status is Status.ERROR and later.why == "not run: the run was interrupted"
