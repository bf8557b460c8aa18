"""Test helpers: scripted planners and tools, an OpenAI-compatible server (``openai_server``), a whole
session in-process under ``dag.test()`` (``in_process``), a real Airflow cluster (``cluster``)."""

from __future__ import annotations

from airflow_plan_provider.testing.scripted import CallLog, ScriptedPlanner, ScriptedTool, scripted_registry

__all__ = ["CallLog", "ScriptedPlanner", "ScriptedTool", "scripted_registry"]
