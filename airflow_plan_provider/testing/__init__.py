"""Test helpers: scripted planners and tools, an OpenAI-compatible server, a real Airflow cluster."""

from __future__ import annotations

from airflow_plan_provider.testing.scripted import CallLog, ScriptedPlanner, ScriptedTool, scripted_registry

__all__ = ["CallLog", "ScriptedPlanner", "ScriptedTool", "scripted_registry"]
