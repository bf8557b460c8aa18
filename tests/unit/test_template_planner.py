"""Where the template planner reads its templates: a dict as given, an absolute path as is, a relative
path from ``template_dir``, which a planner with relative templates must have."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from airflow_plan_provider.exceptions import PlanningError
from airflow_plan_provider.planners.base import PlanRequest
from airflow_plan_provider.planners.template import PlanRule, ReplanRule, TemplatePlanner


def template(action: str) -> dict[str, Any]:
    return {"nodes": [{"id": "1", "action": action, "tool": "t", "params": {"who": "{{who}}"}}]}


def plan(planner: TemplatePlanner, goal: str = "greet ann") -> dict[str, Any]:
    reply = planner.plan(PlanRequest(goal=goal, tools={}, conf={"who": "ann"}))
    assert reply is not None
    return reply


def test_relative_templates_are_read_from_template_dir(tmp_path: Path) -> None:
    (tmp_path / "nested").mkdir()
    (tmp_path / "greet.json").write_text(json.dumps(template("greet")))
    (tmp_path / "nested" / "wave.json").write_text(json.dumps(template("wave")))
    planner = TemplatePlanner(
        [PlanRule("greet", "greet.json"), PlanRule("wave", Path("nested") / "wave.json")],
        template_dir=tmp_path,
    )
    assert plan(planner) == {
        "nodes": [{"id": "1", "action": "greet", "tool": "t", "params": {"who": "ann"}}],
        "goal": "greet ann",
    }
    assert plan(planner, "wave at ann")["nodes"][0]["action"] == "wave"


def test_absolute_and_dict_templates_need_no_template_dir(tmp_path: Path) -> None:
    path = tmp_path / "greet.json"
    path.write_text(json.dumps(template("greet")))
    planner = TemplatePlanner([PlanRule("greet", str(path)), PlanRule("wave", template("wave"))])
    assert plan(planner)["nodes"][0]["action"] == "greet"
    assert plan(planner, "wave")["nodes"][0]["action"] == "wave"


def test_relative_templates_without_template_dir_are_refused_when_declared() -> None:
    with pytest.raises(
        ValueError,
        match=r"plan templates \['greet.json', 'x.json'\] are relative paths: "
        r"pass template_dir",
    ):
        TemplatePlanner([PlanRule("greet", "greet.json")], [ReplanRule("x.json", when_tool="t")])


def test_a_missing_template_file_is_a_planning_error_naming_it(tmp_path: Path) -> None:
    planner = TemplatePlanner([PlanRule("greet", "gone.json")], template_dir=tmp_path)
    with pytest.raises(PlanningError, match=r"cannot read plan template .*gone\.json"):
        plan(planner)
