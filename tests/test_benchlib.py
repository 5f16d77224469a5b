"""The benchmarks' shared writer: a second result of the same day goes to a file of its own, so an
earlier one (a race that took an hour) is never overwritten."""
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "experiments"))
import benchlib  # noqa: E402 - experiments/ is a folder of scripts, not a package


def test_a_second_result_the_same_day_never_overwrites_the_first(tmp_path, monkeypatch):
    monkeypatch.setattr(benchlib, "RESULTS", tmp_path)
    written = [benchlib.write_dated_result("peers", "pong", f"race {n}\n") for n in (1, 2, 3)]
    assert [path.read_text() for path in written] == ["race 1\n", "race 2\n", "race 3\n"]
    assert written[0].name.endswith("-pong.md")
    assert [path.name[len(written[0].stem):] for path in written[1:]] == ["-2.md", "-3.md"]
    assert len(list((tmp_path / "peers").iterdir())) == 3
