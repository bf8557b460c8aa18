"""The kit for testing your own plan DAGs.

- here, from :mod:`.scripted`: ``ScriptedPlanner`` (a plan, and a revision chosen by the replan's
  error), ``ScriptedTool`` (returns, sleeps, fails transiently or for good, asks for a replan, as
  declared), ``CallLog`` (every call, from every process, so a test can show a tool ran once) and
  ``scripted_registry``;
- :mod:`.openai_server`: ``OpenAITestServer``, a real HTTP server on 127.0.0.1 speaking the OpenAI chat
  completions API with scripted replies and errors, for an ``LLMPlanner`` (also ``python -m``, for
  Airflow processes to reach);
- :mod:`.in_process`: ``run_session`` and ``run_plan_dag``, a plan DAG's whole session (or one run) in the
  test process with ``dag.test()``, every task really running.

Example::

    log = CallLog(tmp_path)
    tools = scripted_registry(ScriptedTool("fetch", log=log, returns={"rows": 3}))
    dag = build_plan_dag("my_plan", planner=ScriptedPlanner(plan), tools=tools)
    session = run_session(dag, {"goal": "load the export"})
    assert session.result.status == "completed"

The multi-process Airflow deployment this repository's own end-to-end tests and benchmarks run on is
not part of the package: it is the ``harness`` package at the root of the source repository.
"""

from __future__ import annotations

from airflow_plan_provider.testing.scripted import CallLog, ScriptedPlanner, ScriptedTool, scripted_registry

__all__ = ["CallLog", "ScriptedPlanner", "ScriptedTool", "scripted_registry"]
