from __future__ import annotations

from pathlib import Path

import pytest

from glmfb.contract.errors import TargetError, UsageError
from glmfb.core.targets import Target, parse_arg, parse_args, resolve, side_args


def write(path: Path, text: str) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    return path


def test_parse_arg_json_or_string() -> None:
    assert parse_arg("n=3") == ("n", 3)
    assert parse_arg("scale=0.5") == ("scale", 0.5)
    assert parse_arg("flag=true") == ("flag", True)
    assert parse_arg("dims=[1, 2]") == ("dims", [1, 2])
    assert parse_arg("mode=fast") == ("mode", "fast")
    assert parse_arg("expr=a=b") == ("expr", "a=b")
    assert parse_arg("empty=") == ("empty", "")
    with pytest.raises(UsageError, match="key=value"):
        parse_arg("novalue")
    with pytest.raises(UsageError):
        parse_arg("=3")


def test_side_args_merge() -> None:
    base, cand = side_args(["n=1", "m=2"], ["n=5"], ["m=7"])
    assert base == {"n": 5, "m": 2}
    assert cand == {"n": 1, "m": 7}
    assert parse_args([]) == {}


def test_resolve_file_target(tmp_path: Path) -> None:
    file = write(
        tmp_path / "kern.py",
        "def make(n=1):\n    return lambda: n\nclass K:\n    @staticmethod\n    def build():\n        return 5\n",
    )
    assert resolve(f"{file}:make")(n=3)() == 3
    assert resolve(f"{file}:K.build")() == 5


def test_resolve_relative_to_base_dir(tmp_path: Path) -> None:
    write(tmp_path / "scen" / "k.py", "def f():\n    return 'ok'\n")
    target = Target("scen/k.py:f", base_dir=tmp_path)
    assert target.load()() == "ok"


def test_resolve_module_target() -> None:
    assert resolve("glmfb.contract.units:parse_shape")("2x3") == (2, 3)


def test_package_file_supports_relative_imports(tmp_path: Path) -> None:
    write(tmp_path / "pkgx" / "__init__.py", "")
    write(tmp_path / "pkgx" / "helper.py", "VALUE = 41\n")
    file = write(
        tmp_path / "pkgx" / "main.py", "from .helper import VALUE\ndef f():\n    return VALUE + 1\n"
    )
    assert resolve(f"{file}:f")() == 42


@pytest.mark.parametrize(
    ("body", "attr", "message"),
    [
        (None, "f", "not found"),
        (
            "import does_not_exist_xyz\n",
            "f",
            "ModuleNotFoundError: No module named 'does_not_exist_xyz'",
        ),
        ("raise RuntimeError('boom at import')\n", "f", "RuntimeError: boom at import"),
        ("x = 1\n", "f", "has no attribute 'f'"),
        ("x = 1\n", "x", "is a int, not callable"),
        ("def f(:\n", "f", "SyntaxError"),
    ],
)
def test_resolve_errors_are_one_line(
    tmp_path: Path, body: str | None, attr: str, message: str
) -> None:
    file = tmp_path / "t.py"
    if body is not None:
        write(file, body)
    with pytest.raises(TargetError) as info:
        resolve(f"{file}:{attr}")
    text = str(info.value)
    assert message in text
    assert "\n" not in text
    assert info.value.exit_code == 2


def test_resolve_missing_module_and_bad_ref() -> None:
    with pytest.raises(TargetError, match="no module named 'nopkg_zz'"):
        resolve("nopkg_zz.mod:f")
    with pytest.raises(TargetError, match="no ':attr'"):
        resolve("glmfb.contract.units")


def test_portable_ref_is_typed_from_the_current_directory(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    write(tmp_path / "scenarios" / "k.py", "def f():\n    return 1\n")
    (tmp_path / "probes").mkdir()
    monkeypatch.chdir(tmp_path)
    target = Target("../scenarios/k.py:f", {"n": 2}, base_dir=tmp_path / "probes")
    assert target.portable_ref == "scenarios/k.py:f"
    assert target.describe() == "scenarios/k.py:f --arg n=2"
    assert Target("scenarios/k.py:f", base_dir=tmp_path / "probes").portable_ref == "scenarios/k.py:f"
    assert Target("glmfb.contract.units:parse_shape", base_dir=tmp_path).portable_ref == "glmfb.contract.units:parse_shape"


def test_a_side_is_anchored_in_its_definitions_folder_one_way_for_every_surface(tmp_path: Path) -> None:
    """bisect (GOOD's baseline in GOOD's worktree), the agent server's boundary and the history's
    commit all read a side through ProbeSpec.anchored: a file it names is made absolute beside
    the definition; a serving endpoint, a module name and an absolute path are left as written
    (an endpoint's ``host:port/v1`` once read as ``file:attr``)."""
    from glmfb.core.probe import ProbeSpec, anchored

    write(tmp_path / "kernels" / "norm.py", "def make():\n    return None\n")
    (tmp_path / "saved.json").write_text("{}")
    spec = ProbeSpec(kind="diff", name="x", label="t", base_dir=tmp_path,
                     baseline="openai:http://127.0.0.1:8000/v1#tiny", candidate="kernels/norm.py:make")
    assert spec.anchored("kernels/norm.py:make") == f"{tmp_path}/kernels/norm.py:make"
    assert spec.anchored("openai:http://127.0.0.1:8000/v1#tiny") == "openai:http://127.0.0.1:8000/v1#tiny"
    assert spec.anchored("glmfb.diff.hf:causal_lm") == "glmfb.diff.hf:causal_lm"
    assert spec.anchored("/abs/k.py:make") == "/abs/k.py:make"
    assert anchored("saved.json#norm", tmp_path, "bench") == f"{tmp_path}/saved.json#norm"
    assert anchored("../up/k.py:make", tmp_path / "kernels", "bench") == f"{tmp_path}/up/k.py:make"
    assert anchored("kernels/norm.py:make", None, "bench") == "kernels/norm.py:make"
    assert spec.code_folder() == (tmp_path / "kernels").resolve()
    served = ProbeSpec(kind="diff", name="x", label="t", base_dir=tmp_path,
                       baseline="openai:http://127.0.0.1:8000/v1", candidate="openai:http://127.0.0.1:8001/v1")
    assert served.code_folder() is None
