"""One JSONL reader for a model's requests and a serving endpoint's (they were two loops, and
only one of them turned a line nested too deeply into a one-line error): the same problems
give the same one-line errors, naming the file and the line."""

from __future__ import annotations

from pathlib import Path

import pytest

from glmfb.contract.errors import InputError
from glmfb.diff.endpoint import read_serving_requests
from glmfb.diff.requests import read_requests

MODEL = '{"id": "a", "length": 8, "seed": 1, "vocab": 64}'
SERVING = '{"id": "a", "prompt": "hello"}'


@pytest.mark.parametrize(("reader", "good"), [(read_requests, MODEL), (read_serving_requests, SERVING)])
@pytest.mark.parametrize(("lines", "said"), [
    (["[" * 100000 + "]" * 100000], "nested too deeply to be a request"),
    (["{bad"], "not valid JSON"),
    (["{good}", "{good}"], "duplicate id 'a' (first on line 1)"),
    (["# only a comment", ""], "no requests"),
])
def test_both_readers_refuse_the_same_way(tmp_path: Path, reader: object, good: str, lines: list[str],
                                          said: str) -> None:
    path = tmp_path / "requests.jsonl"
    path.write_text("\n".join(line.replace("{good}", good) for line in lines) + "\n")
    with pytest.raises(InputError) as caught:
        reader(path)  # type: ignore[operator]
    message = str(caught.value)
    assert said in message and str(path) in message and "\n" not in message, message


def test_both_readers_read_their_requests(tmp_path: Path) -> None:
    (tmp_path / "m.jsonl").write_text(MODEL + "\n")
    (tmp_path / "s.jsonl").write_text("# a comment\n" + SERVING + "\n")
    assert [r.id for r in read_requests(tmp_path / "m.jsonl")] == ["a"]
    assert [r.id for r in read_serving_requests(tmp_path / "s.jsonl")] == ["a"]
