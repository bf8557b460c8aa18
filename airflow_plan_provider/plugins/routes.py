"""Where the plan view is served: imported by the plugin (which the scheduler and workers load too) and by
the API server's app, so it imports nothing."""

from __future__ import annotations

URL_PREFIX = "/plan-view"  # the app's mount point in the API server
URL_ROUTE = "plan"  # the tab's path under the run page: /dags/<dag>/runs/<run>/plugin/plan
