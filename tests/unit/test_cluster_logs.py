"""error_lines finds error-level lines in every log format an AirflowCluster writes, and nothing else."""

from __future__ import annotations

import json

from harness.logs import error_lines


def test_error_lines_reads_task_component_and_celery_logs(tmp_path):
    task_log = tmp_path / "dag_id=d" / "run_id=r" / "task_id=t" / "attempt=1.log"
    task_log.parent.mkdir(parents=True)
    records = [{"level": "info", "event": "an error in the text only"}, {"level": "error", "event": "boom"}]
    task_log.write_text("\n".join(json.dumps(r) for r in records) + "\n{not json\n")
    (tmp_path / "scheduler.log").write_text(
        "2026-01-01T00:00:00.000000Z [info     ] Started server process [uvicorn.error]\n"
        "2026-01-01T00:00:01.000000Z [warning  ] slow\n"
        "2026-01-01T00:00:02.000000Z [error    ] XCom not found [airflow.sdk.api.client]\n"
        "Traceback (most recent call last):\n"
        '  File "x.py", line 1, in <module>\n'
    )
    (tmp_path / "worker-a.log").write_text(
        "[2026-01-01 00:00:00,000: INFO/MainProcess] ERROR in a message\n"
        "[2026-01-01 00:00:01,000: CRITICAL/MainProcess] Unrecoverable error\n"
        "ERROR:    Exception in ASGI application\n"
    )
    found = error_lines(tmp_path)
    assert [line.split(": ", 1)[0] for line in found] == [
        "dag_id=d/run_id=r/task_id=t/attempt=1.log",
        "scheduler.log",
        "scheduler.log",
        "worker-a.log",
        "worker-a.log",
    ]
    assert '"event": "boom"' in found[0]
    assert found[1].endswith("XCom not found [airflow.sdk.api.client]")
    assert found[2] == "scheduler.log: Traceback (most recent call last):"
    assert "CRITICAL/MainProcess" in found[3] and found[4].endswith("Exception in ASGI application")


def test_error_lines_of_quiet_logs_is_empty(tmp_path):
    (tmp_path / "api-server.log").write_text("2026-01-01T00:00:00Z [info     ] ok [uvicorn.error]\n")
    assert error_lines(tmp_path) == []
