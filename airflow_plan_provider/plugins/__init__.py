"""The plan view: an Airflow UI plugin that shows a plan session's graph, revisions and nodes.

Registered through the ``airflow.plugins`` entry point (:class:`~.plugin.PlanViewPlugin`); the API
server mounts its routes (:mod:`.app`), which read the session's runs (:mod:`.store`) and assemble what
the page draws (:mod:`.data`).
"""
