"""How a run reports to its readers: defined in :mod:`airflow_plan_provider.contract`, named here too for
the cluster launcher of the test support, which imports them from this module."""

from __future__ import annotations

from airflow_plan_provider.contract import labelled_node, session_outcome

__all__ = ["labelled_node", "session_outcome"]
