"""The run type label the plan view's plugin adds to the UI's translations, served by a real Starlette
app (static files from a directory, as Airflow's API server serves its UI) over HTTP in-process."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from starlette.applications import Starlette
from starlette.staticfiles import StaticFiles
from starlette.testclient import TestClient

from airflow_plan_provider.compat import MISSING_RUN_TYPE_LABELS as MISSING_LABELS
from airflow_plan_provider.compat import RunTypeLabels
from airflow_plan_provider.compat import with_run_type_labels as with_labels

PATH = "/static/i18n/locales/{}/common.json"


def served(tmp_path: Path, translations: dict[str, dict[str, object]]) -> TestClient:
    for language, data in translations.items():
        folder = tmp_path / "i18n" / "locales" / language
        folder.mkdir(parents=True)
        (folder / "common.json").write_text(json.dumps(data))
    app = Starlette()
    app.mount("/static", StaticFiles(directory=tmp_path))
    app.add_middleware(RunTypeLabels)
    return TestClient(app)


def test_the_missing_label_is_added_and_the_others_are_kept(tmp_path: Path) -> None:
    client = served(tmp_path, {"en": {"runTypes": {"manual": "Manual"}, "other": "x"}})
    first = client.get(PATH.format("en"))
    assert first.status_code == 200
    assert first.json() == {
        "runTypes": {"manual": "Manual", "operator_triggered": "Triggered by a task"},
        "other": "x",
    }
    assert int(first.headers["content-length"]) == len(first.content)
    # a browser's cached copy is never confirmed: the file is always sent whole, with the label
    again = client.get(PATH.format("en"), headers={"If-None-Match": first.headers.get("etag", '"x"')})
    assert again.status_code == 200 and again.json()["runTypes"]["operator_triggered"]


def test_a_label_airflow_ships_wins_and_other_files_pass_through(tmp_path: Path) -> None:
    client = served(
        tmp_path,
        {
            "en": {"runTypes": {"operator_triggered": "Operator Triggered"}},
            "de": {"runTypes": {"manual": "Manuell"}},
        },
    )
    assert client.get(PATH.format("en")).json()["runTypes"] == {"operator_triggered": "Operator Triggered"}
    assert client.get(PATH.format("de")).json() == {"runTypes": {"manual": "Manuell"}}
    assert client.get("/static/i18n/locales/en/missing.json").status_code == 404


@pytest.mark.parametrize("document", [b"not json", b"[]", b'{"runTypes": 3}'])
def test_a_file_of_another_shape_is_left_alone(document: bytes) -> None:
    assert with_labels(document) is None


def test_airflows_own_english_translations_get_a_label_for_every_run_type() -> None:
    """Against the translations of the Airflow installed here: every run type has a label once served."""
    import importlib.util

    spec = importlib.util.find_spec("airflow")
    assert spec is not None and spec.origin is not None
    shipped = Path(spec.origin).parent / "ui" / "dist" / "i18n" / "locales" / "en" / "common.json"
    document = shipped.read_bytes()
    labels = json.loads(with_labels(document) or document)["runTypes"]
    from airflow.utils.types import DagRunType

    assert {t.value for t in DagRunType} <= set(labels), sorted(labels)
    assert set(MISSING_LABELS) <= set(labels)
