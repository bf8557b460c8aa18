"""A cluster's requests and waits against a real HTTP server on 127.0.0.1 that answers as a busy
Airflow API does: "database is locked" is asked again, a wait polls through a 5xx, a 4xx ends it."""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from harness.cluster import AirflowApiError, AirflowCluster, ClusterTimeout


class Answers:
    """What the server answers any request, in order (the last one again and again)."""

    def __init__(self, *answers: tuple[int, dict[str, object]]) -> None:
        self.answers = list(answers)
        self.asked = 0

    def next(self) -> tuple[int, dict[str, object]]:
        self.asked += 1
        return self.answers.pop(0) if len(self.answers) > 1 else self.answers[0]


@pytest.fixture
def api() -> Iterator[tuple[int, list[Answers]]]:
    current: list[Answers] = []

    class Handler(BaseHTTPRequestHandler):
        def do_POST(self) -> None:
            self.rfile.read(int(self.headers.get("Content-Length", 0)))
            self.do_GET()

        def do_GET(self) -> None:
            status, body = current[0].next()
            data = json.dumps(body).encode()
            self.send_response(status)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def log_message(self, *args: object) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield server.server_address[1], current
    finally:
        server.shutdown()
        server.server_close()


LOCKED = (500, {"detail": {"reason": "Database error", "message": "database is locked"}})


def listed(*runs: tuple[str, str]) -> tuple[int, dict[str, object]]:
    """The runs list's answer (``GET /dags/{dag_id}/dagRuns``) holding runs ``(run id, state)``."""
    return 200, {"dag_runs": [{"dag_run_id": r, "state": s} for r, s in runs], "total_entries": len(runs)}


def test_a_wait_polls_through_server_errors_to_the_runs_state(tmp_path, api) -> None:
    port, current = api
    current.append(Answers(LOCKED, LOCKED, listed(("r", "running")), listed(("r", "success"))))
    cluster = AirflowCluster(tmp_path, home=tmp_path / "home", port=port)
    assert cluster.wait_for_run("d", "r", timeout=30, poll=0.01) == "success"
    assert current[0].asked == 4


def test_a_run_is_read_from_the_runs_list_by_its_exact_id(tmp_path, api) -> None:
    """The list is asked for the runs whose id starts with the run's; only the run itself answers."""
    port, current = api
    current.append(Answers(listed(("r_2", "success"), ("r", "running"))))
    cluster = AirflowCluster(tmp_path, home=tmp_path / "home", port=port)
    assert cluster.get_run("d", "r") == {"dag_run_id": "r", "state": "running"}
    current[0] = Answers(listed(("r_2", "success")))
    with pytest.raises(AirflowApiError, match="HTTP 404") as raised:
        cluster.get_run("d", "r")
    assert not raised.value.busy
    # a full page of other runs sharing the prefix: the one-run endpoint is asked
    current[0] = Answers(listed(*[(f"r_{n}", "success") for n in range(100)]), (200, {"dag_run_id": "r"}))
    assert cluster.get_run("d", "r") == {"dag_run_id": "r"}
    assert current[0].asked == 2


def test_a_wait_that_only_got_server_errors_says_so_when_it_runs_out(tmp_path, api) -> None:
    port, current = api
    current.append(Answers((503, {"detail": "the scheduler is not healthy"})))
    cluster = AirflowCluster(tmp_path, home=tmp_path / "home", port=port)
    with pytest.raises(ClusterTimeout, match=r"last poll: HTTP 503: .*the scheduler is not healthy"):
        cluster.wait_for_run("d", "r", timeout=0.5, poll=0.01)
    assert current[0].asked > 1


def test_a_client_error_ends_the_wait_at_once(tmp_path, api) -> None:
    port, current = api
    current.append(Answers((404, {"detail": "The DagRun with dag_id: `d` and run_id: `r` was not found"})))
    cluster = AirflowCluster(tmp_path, home=tmp_path / "home", port=port)
    with pytest.raises(AirflowApiError, match="HTTP 404"):
        cluster.wait_for_run("d", "r", timeout=30, poll=0.01)
    assert current[0].asked == 1


def test_only_a_server_error_is_busy() -> None:
    def error(status: int) -> AirflowApiError:
        return AirflowApiError("GET", "http://127.0.0.1/api/v2/x", status, "  some\n  body ")

    assert [error(s).busy for s in (500, 503, 404, 409)] == [True, True, False, False]
    assert error(503).reason() == "HTTP 503: some body"


def test_a_request_answered_database_is_locked_is_sent_again(tmp_path, api) -> None:
    port, current = api
    current.append(Answers(LOCKED, LOCKED, (200, {"dag_run_id": "manual__1"})))
    cluster = AirflowCluster(tmp_path, home=tmp_path / "home", port=port)
    assert cluster.trigger("d", {"goal": "g"}) == "manual__1"
    assert current[0].asked == 3
    other = (500, {"detail": {"reason": "Database error", "message": "no such table: dag_run"}})
    current[0] = Answers(other)
    with pytest.raises(AirflowApiError, match="no such table"):
        cluster.trigger("d", {"goal": "g"})
    assert current[0].asked == 1
