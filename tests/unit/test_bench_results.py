"""The benchmarks' recorded measurements (``bench/results/``): every file valid, and the summary table of
``bench/README.md`` the render of them (``python bench/results.py``)."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from bench import results


def test_every_result_file_validates() -> None:
    records = results.load()
    assert records, "no file in bench/results/"
    assert len({path.name for path, _ in records}) == len(records)


def test_readme_table_is_the_render() -> None:
    readme = results.README.read_text(encoding="utf-8")
    assert results.current(readme) == results.render(), "run: python bench/results.py"
    assert results.main(["--check"]) == 0


def test_the_summary_has_one_line_per_question() -> None:
    questions = {record["question"] for _, record in results.load()}
    table = results.render().splitlines()[3:-1]
    assert len(table) == len(questions)


def _copy(tmp_path: Path) -> Path:
    folder = tmp_path / "results"
    shutil.copytree(results.RESULTS, folder)
    return folder


def _one(folder: Path) -> tuple[Path, dict]:
    path = sorted(folder.glob("*.json"))[-1]
    return path, json.loads(path.read_text(encoding="utf-8"))


@pytest.mark.parametrize(
    "breaks",
    [
        lambda record: record.pop("headline"),
        lambda record: record.update(met="yes"),
        lambda record: record["figures"].update(ratio="1.00 x"),
        lambda record: record.update(date="4 Dec 2026"),
        lambda record: record.update(commit="not a hash"),
        lambda record: record.update(extra="field"),
    ],
    ids=["missing-headline", "met-not-boolean", "figure-not-number", "date-format", "commit", "extra-field"],
)
def test_a_broken_file_fails(tmp_path: Path, breaks) -> None:
    folder = _copy(tmp_path)
    path, record = _one(folder)
    breaks(record)
    path.write_text(json.dumps(record), encoding="utf-8")
    with pytest.raises(ValueError, match=path.name):
        results.load(folder)


def test_a_file_named_for_another_question_fails(tmp_path: Path) -> None:
    folder = _copy(tmp_path)
    path, _ = _one(folder)
    path.rename(folder / "2026-01-01-elsewhere.json")
    with pytest.raises(ValueError, match="expected"):
        results.load(folder)


def test_a_file_that_is_not_json_fails(tmp_path: Path) -> None:
    folder = _copy(tmp_path)
    path, _ = _one(folder)
    path.write_text("{", encoding="utf-8")
    with pytest.raises(ValueError, match="not JSON"):
        results.load(folder)


def test_a_changed_result_makes_the_readme_differ(tmp_path: Path) -> None:
    folder = _copy(tmp_path)
    readme = tmp_path / "README.md"
    readme.write_text(results.README.read_text(encoding="utf-8"), encoding="utf-8")
    assert not results.write(readme, folder)
    newest = results.newest(results.load(folder))[0]
    path = next(path for path, record in results.load(folder) if record == newest)
    newest["headline"] = "changed"
    path.write_text(json.dumps(newest), encoding="utf-8")
    assert results.current(readme.read_text(encoding="utf-8")) != results.render(folder)
    assert results.write(readme, folder)
    assert "| changed |" in readme.read_text(encoding="utf-8")


def test_check_fails_when_the_readme_differs(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    readme = tmp_path / "README.md"
    text = results.README.read_text(encoding="utf-8")
    readme.write_text(text.replace(results.END, "| stale | line |\n" + results.END), encoding="utf-8")
    monkeypatch.setattr(results, "README", readme)
    assert results.main(["--check"]) == 1
    assert results.main([]) == 0
    assert results.main(["--check"]) == 0


def test_history_lists_a_question_oldest_first() -> None:
    question = results.newest(results.load())[0]["question"]
    lines = [line for line in results.history(question).splitlines() if line.startswith("| 2")]
    assert lines == sorted(lines)
    with pytest.raises(ValueError):
        results.history("no-such-question")


def test_a_days_second_measurement_of_a_question_gets_a_file_of_its_own(tmp_path: Path) -> None:
    first = results.beside(tmp_path / "run.json", "families-airflow-fan")
    first.write_text("{}")
    second = results.beside(tmp_path / "run.json", "families-airflow-fan")
    second.write_text("{}")
    third = results.beside(tmp_path / "run.json", "families-airflow-fan")
    assert first.name.endswith("-families-airflow-fan.json")
    assert (second.name, third.name) == (
        first.name.replace(".json", "-1.json"),
        first.name.replace(".json", "-2.json"),
    )
