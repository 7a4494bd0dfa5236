"""The agent server's root holds for what a definition names, as it holds for a probe tool's
arguments: the ``run`` and ``bisect`` tools refuse a definition under the root whose target,
rules file or path option lies outside it (a symbolic link leading out, an absolute path, a
``..``), naming the definition and the key, and import nothing of it. Before, the run tool ran
such a definition and the outside file was imported (its marker file written)."""

from __future__ import annotations

import threading
import time
from pathlib import Path

import pytest

pytest.importorskip("mcp")

from glmfb.contract.errors import InputError
from glmfb.workflows.mcp.boundary import Boundary
from glmfb.workflows.mcp.tools import CallContext, Toolbox

OUTSIDE_TARGET = '''from pathlib import Path

Path({marker!r}).write_text("imported")


def make(shape):
    return lambda: None
'''

INSIDE_TARGET = "def make(shape):\n    return lambda: None\n"


def definition(target: str, extra: str = "") -> str:
    return (f'[[probe]]\nname = "escapes"\nprobe = "bench"\nbaseline = "{target}"\ncandidate = "{target}"\n'
            f'options = {{ shapes = ["8"], budget = "1s" }}\n{extra}')


@pytest.fixture
def setting(tmp_path: Path) -> tuple[Path, Path, Path]:
    """A root with probes/ and a target inside; outside it, a target that leaves a marker when
    imported, and a symbolic link to it inside the root."""
    root, outside = tmp_path / "root", tmp_path / "outside"
    (root / "probes").mkdir(parents=True)
    outside.mkdir()
    marker = tmp_path / "imported.txt"
    (outside / "evil.py").write_text(OUTSIDE_TARGET.format(marker=str(marker)))
    (outside / "rules.py").write_text(f"from pathlib import Path\nPath({str(marker)!r}).write_text('r')\nRULES = []\n")
    (root / "link.py").symlink_to(outside / "evil.py")
    (root / "inside.py").write_text(INSIDE_TARGET)
    return root, outside, marker


def prepare(root: Path, tool: str, arguments: dict[str, object]) -> str:
    box = Toolbox(Boundary(root))
    with pytest.raises(InputError) as caught:
        box.prepare(tool, arguments).work(CallContext(
            run_id="r", progress=lambda message: None, cancel=threading.Event(), deadline=time.monotonic() + 60,
            slot=threading.Lock()))
    return str(caught.value)


@pytest.mark.parametrize(("case", "target", "extra"), [
    ("a symbolic link leading outside", "../link.py:make", ""),
    ("an absolute path outside", "{outside}/evil.py:make", ""),
    ("a relative path climbing out", "../../outside/evil.py:make", ""),
    ("a rules file outside", "../inside.py:make", 'rules = "../../outside/rules.py"\n'),
])
def test_the_run_tool_refuses_a_definition_that_names_a_path_outside_the_root(
        setting: tuple[Path, Path, Path], case: str, target: str, extra: str) -> None:
    root, outside, marker = setting
    (root / "probes" / "escape.toml").write_text(definition(target.format(outside=outside), extra))
    message = prepare(root, "run", {"paths": "probes/escape.toml"})
    assert "definition 'escapes'" in message and "outside the root" in message, (case, message)
    assert not marker.exists(), f"{case}: the outside file was imported"


def test_the_bisect_tool_holds_the_definition_to_the_root_too(setting: tuple[Path, Path, Path]) -> None:
    root, _, marker = setting
    (root / "probes" / "escape.toml").write_text(definition("../link.py:make"))
    message = prepare(root, "bisect", {"good": "HEAD~1", "bad": "HEAD", "definition": "probes/escape.toml"})
    assert "definition 'escapes'" in message and "outside the root" in message, message
    assert not marker.exists()


def test_a_definition_inside_the_root_is_still_accepted(setting: tuple[Path, Path, Path]) -> None:
    root, _, _ = setting
    (root / "probes" / "fine.toml").write_text(definition("../inside.py:make"))
    prepared = Toolbox(Boundary(root)).prepare("run", {"paths": "probes/fine.toml"})
    assert prepared.label == "run of 1 definition(s)"


def test_what_a_probe_addresses_outside_the_file_system_is_the_probes_to_say(tmp_path: Path) -> None:
    """The root holds paths; a serving endpoint is not one. The boundary asks the probe
    (diff's ``outside_side``) rather than knowing diff's ``openai:`` syntax: the diff tool and
    the capture command's tool take an endpoint, a malformed one is refused naming the
    argument, and a probe that addresses nothing outside (bench) does not take it."""
    box = Toolbox(Boundary(tmp_path))
    endpoint = "openai:http://127.0.0.1:9/v1#tiny"
    (tmp_path / "requests.jsonl").write_text('{"id": "a", "prompt": "hi"}\n')
    assert box.prepare("diff", {"baseline": endpoint, "candidate": endpoint, "requests": "requests.jsonl"})
    assert box.boundary.side(endpoint, "target") == endpoint  # a command a probe brings (capture)
    for tool, arguments in (("diff", {"baseline": "openai:ftp://x", "candidate": endpoint}),
                            ("bench", {"baseline": endpoint, "candidate": endpoint})):
        with pytest.raises(InputError) as caught:
            box.prepare(tool, {**arguments, "requests": "requests.jsonl"} if tool == "diff" else
                        {**arguments, "shapes": ["8"]})
        assert "argument 'baseline'" in str(caught.value), str(caught.value)
