"""glmfb's vLLM plugin (glmfb.capture.vllm) where no vLLM runs: it does nothing without
``GLMFB_CAPTURE_DIR``, how it reads its environment, and how it waits for vLLM's model runner to
be imported. The plugin inside real vLLM servers: tests/test_vllm.py."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from glmfb.capture.vllm import RUNNER_MODULE, CaptureSettings, after_import, parse_bytes, register


@pytest.fixture
def meta_path(monkeypatch: pytest.MonkeyPatch) -> list[object]:
    """``sys.meta_path`` as it is, put back after the test."""
    monkeypatch.setattr(sys, "meta_path", list(sys.meta_path))
    return sys.meta_path


def test_without_the_variable_register_does_nothing(monkeypatch: pytest.MonkeyPatch, meta_path: list[object]) -> None:
    monkeypatch.delenv("GLMFB_CAPTURE_DIR", raising=False)
    finders, modules = list(meta_path), set(sys.modules)
    register()
    assert sys.meta_path == finders and set(sys.modules) == modules


def test_with_the_variable_the_runner_is_hooked_once_imported(monkeypatch: pytest.MonkeyPatch, tmp_path: Path,
                                                             meta_path: list[object]) -> None:
    monkeypatch.setenv("GLMFB_CAPTURE_DIR", str(tmp_path))
    register()
    assert [getattr(f, "name", None) for f in sys.meta_path].count(RUNNER_MODULE) == 1
    assert not any(name == "vllm" or name.startswith("vllm.") for name in sys.modules)  # nothing imported
    assert list(tmp_path.iterdir()) == []


def test_after_import_runs_after_the_module_and_a_failure_is_a_note(monkeypatch: pytest.MonkeyPatch, tmp_path: Path,
                                                                    meta_path: list[object]) -> None:
    (tmp_path / "glmfb_probe_module.py").write_text("VALUE = 1\n")
    (tmp_path / "glmfb_probe_failing.py").write_text("VALUE = 2\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.setenv("GLMFB_CAPTURE_DIR", str(tmp_path / "captures"))
    seen: list[int] = []
    try:
        after_import("glmfb_probe_module", lambda module: seen.append(module.VALUE))
        assert seen == []
        import glmfb_probe_module  # type: ignore[import-not-found]

        assert seen == [1] and glmfb_probe_module.VALUE == 1
        after_import("glmfb_probe_module", lambda module: seen.append(module.VALUE + 10))  # imported: at once
        assert seen == [1, 11]

        def fail(module: object) -> None:
            raise RuntimeError("no such method")

        after_import("glmfb_probe_failing", fail)
        import glmfb_probe_failing  # type: ignore[import-not-found]  # the import itself goes on

        assert glmfb_probe_failing.VALUE == 2
        note = (tmp_path / "captures" / "capture.note.txt").read_text()
        assert "could not hook glmfb_probe_failing (RuntimeError: no such method); nothing is recorded" in note
    finally:
        sys.modules.pop("glmfb_probe_module", None)
        sys.modules.pop("glmfb_probe_failing", None)


def test_settings_from_the_environment() -> None:
    assert CaptureSettings.from_environ({"GLMFB_CAPTURE_MARK": "1,2"}) is None
    settings = CaptureSettings.from_environ({
        "GLMFB_CAPTURE_DIR": "/captures/a", "GLMFB_CAPTURE_MARK": "253, 254 255", "GLMFB_CAPTURE_REQUESTS": "3",
        "GLMFB_CAPTURE_MAX_BYTES": "64MiB", "GLMFB_CAPTURE_MODULES": "model.layers.*, logits_processor"})
    assert settings == CaptureSettings(Path("/captures/a"), (253, 254, 255), 3, 64 << 20,
                                       ("model.layers.*", "logits_processor"))
    assert [settings.request_name(k) for k in (1, 2)] == ["match:253,254,255", "match:253,254,255.2"]
    defaults = CaptureSettings.from_environ({"GLMFB_CAPTURE_DIR": "c", "GLMFB_CAPTURE_MARK": "7"})
    assert defaults == CaptureSettings(Path("c"), (7,), None, 1 << 30, ("*",))


@pytest.mark.parametrize(("variables", "message"), [
    ({}, "GLMFB_CAPTURE_MARK='': give the token ids"),
    ({"GLMFB_CAPTURE_MARK": "w250"}, "GLMFB_CAPTURE_MARK='w250'"),
    ({"GLMFB_CAPTURE_MARK": "1", "GLMFB_CAPTURE_REQUESTS": "0"}, "GLMFB_CAPTURE_REQUESTS='0'"),
    ({"GLMFB_CAPTURE_MARK": "1", "GLMFB_CAPTURE_MAX_BYTES": "lots"}, "GLMFB_CAPTURE_MAX_BYTES: 'lots' is not a size"),
])
def test_a_value_that_does_not_parse_names_its_variable(variables: dict[str, str], message: str) -> None:
    with pytest.raises(ValueError) as raised:
        CaptureSettings.from_environ({"GLMFB_CAPTURE_DIR": "c", **variables})
    assert str(raised.value).startswith(message), raised.value


def test_sizes() -> None:
    assert [parse_bytes(s) for s in ("1024", "64MiB", "1GiB", "1.5KiB")] == [1024, 64 << 20, 1 << 30, 1536]
    with pytest.raises(ValueError, match="'64MB' is not a size"):
        parse_bytes("64MB")
