"""The plan view in a real browser: Debian's chromium (headless, through chromium-driver and Selenium)
against a real API server with Airflow's auth on (simple auth manager, signed in through its login form).

One cluster and one browser serve the module: the example DAG's seed session (node 3 finds no deploy and
asks for a replan; revision 1 revises node 5) is run once, and so is a run of the approval example
``plan_and_publish`` whose plan is rejected in the UI. The first test watches the plan view while the
session runs; the others read the finished session's view as a user sees it and compare it with what
the REST API says. Beside them: the frozen ``daily_payment_report`` triggered through the REST API
without a logical date, a node seen waiting for its named parents and then running
(``tests/e2e/dags/phase_dags.py``; also where it starts on the triggerer), the trigger form's tool list
on a 1600 px wide page, and the report opened from the plan view. No page shows "null", "undefined" or
a raw translation key. Screenshots go to ``tests/e2e/output/plan_view/`` (``$PLAN_E2E_OUTPUT/plan_view/``
when set).
"""

from __future__ import annotations

import json
import os
import re
import shutil
import tempfile
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta, timezone
from pathlib import Path
from typing import Any

import pytest

from airflow_plan_provider.contract import (
    APPROVE_TASK,
    NODE_KEY,
    NODES_TASK,
    PLAN_TASK,
    REPLAN_TASK,
    after_lane,
    lane_task_id,
    select_task_id,
)
from harness.cluster import AirflowCluster
from tests.e2e.conftest import E2E_DAGS, EXAMPLE_FILES, demo_env, plan_cluster

pytestmark = pytest.mark.e2e

ROOT = Path(__file__).resolve().parents[2]
DAG = "plan_and_execute"
PUBLISH = "plan_and_publish"  # the approval example: rejected here
DAILY = "daily_payment_report"  # the frozen example: triggered without a logical date
PHASES = "e2e_phases"  # node 3 waits for its slow parent 1, then runs its own tool
PHASES_STARTED = "e2e_phases_started"  # the same plan, node 3 started on the triggerer
GOAL = "find why the payment API got slow yesterday and write a report"
CHROMIUM = shutil.which("chromium") or "/usr/bin/chromium"
CHROMEDRIVER = shutil.which("chromedriver") or "/usr/bin/chromedriver"
CHROMIUM_FLAGS = (
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-dev-shm-usage",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--window-size=1500,1100",
)
OUTPUT = Path(os.environ.get("PLAN_E2E_OUTPUT") or Path(__file__).resolve().parent / "output") / "plan_view"
USER = "admin"
#: what a page must never show: a value the page forgot to leave out, or a translation key it shows raw
#: (``runTypes.operator_triggered``, ``common:dagRun.runType``)
BAD_TEXT = re.compile(r"\bnull\b|\bundefined\b|\b(?:[a-z]+:)?[a-z]+[A-Z][A-Za-z]*\.[A-Za-z_]+\b")
WAIT = 30.0
RUN_TIMEOUT = 240.0


@dataclass
class Session:
    cluster: AirflowCluster
    root: str
    child: str
    rejected: str  # a run of the approval example, rejected by test_a_rejected_plans_nodes_show_as_not_run
    pool_slots: int  # the default pool's, given back once the session is over

    def finished(self) -> None:
        """Wait for the whole chain: the root run ends after its replan run. Then give the pool back its
        slots."""
        self.start()
        state = self.cluster.wait_for_run(DAG, self.root, timeout=RUN_TIMEOUT)
        assert state == "success", self.cluster.diagnostics()
        set_default_pool_slots(self.cluster, self.pool_slots)

    def start(self) -> None:
        """Let the session's queued run start (its DAG is paused until a page is open to watch it)."""
        self.cluster.unpause(DAG)

    @property
    def password(self) -> str:
        users = json.loads((self.cluster.home / "simple_auth_manager_passwords.json.generated").read_text())
        return str(users[USER])

    def url(self, path: str) -> str:
        return self.cluster.base_url + path


def hold_nodes_after_planning(session: Session) -> bool:
    """Once the root run's planning task has succeeded, take the default pool's one slot away, so that
    the nodes still waiting for it wait until the test gives it back: a fast machine runs the whole run
    within one of the page's refreshes (every 3 s), and the page could not be seen drawing the plan
    before its nodes ran. True once the pool is held."""
    deadline = time.monotonic() + WAIT
    while time.monotonic() < deadline:
        tis = session.cluster.task_instances(DAG, session.root)
        if any(ti["task_id"] == PLAN_TASK and ti.get("state") == "success" for ti in tis):
            set_default_pool_slots(session.cluster, 0)
            return True
        time.sleep(0.1)
    raise AssertionError(f"the planning task of {session.root} did not succeed in {WAIT} s")


def set_default_pool_slots(cluster: AirflowCluster, slots: int) -> int:
    """Set the default pool's slots; returns how many it had."""
    had = cluster.api("GET", "/pools/default_pool")["slots"]
    cluster.api("PATCH", "/pools/default_pool", {"slots": slots}, params={"update_mask": "slots"})
    return int(had)


def quoted(run_id: str) -> str:
    return urllib.parse.quote(run_id, safe="")


@pytest.fixture(scope="module")
def session(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Session]:
    if not (Path(CHROMIUM).exists() and Path(CHROMEDRIVER).exists()):
        message = "needs Debian's chromium and chromium-driver (apt-get install chromium chromium-driver)"
        if os.environ.get("CI"):
            pytest.fail(message)
        pytest.skip(message)
    base = tmp_path_factory.mktemp("plan_view")
    env = {
        **demo_env(base),
        # auth on: no anonymous admin; one user whose password the API server generates
        "AIRFLOW__CORE__SIMPLE_AUTH_MANAGER_ALL_ADMINS": "False",
        "AIRFLOW__CORE__SIMPLE_AUTH_MANAGER_USERS": f"{USER}:admin",
    }
    dags = ROOT / "dags"
    files = (
        *EXAMPLE_FILES,
        dags / "plan_and_publish.py",
        dags / "daily_payment_report.py",
        E2E_DAGS / "phase_dags.py",
    )
    dag_ids = [DAG, PUBLISH, DAILY, PHASES, PHASES_STARTED]
    with plan_cluster(base, files, dag_ids, env=env, unpause=False) as cluster:
        # the session waits, queued, until the first test has its page open (it unpauses the DAG); its
        # nodes then run one at a time, held until the page has drawn the plan
        # (hold_nodes_after_planning), so their states change across several of the page's refreshes.
        # The other DAGs wait, paused, for their tests: nothing else takes the pool's one slot meanwhile
        for dag_id in (DAG, DAILY, PHASES, PHASES_STARTED):
            cluster.pause(dag_id)
        cluster.unpause(PUBLISH)
        pool_slots = set_default_pool_slots(cluster, 1)
        root = cluster.trigger(DAG, {"goal": GOAL})
        rejected = cluster.trigger(PUBLISH)
        yield Session(cluster, root, f"{root}__replan_1", rejected, pool_slots)


@pytest.fixture(scope="module")
def browser(session: Session) -> Iterator[Any]:
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service
    from selenium.webdriver.common.by import By

    OUTPUT.mkdir(parents=True, exist_ok=True)
    profile = tempfile.mkdtemp(prefix="plan-view-chromium-")
    options = webdriver.ChromeOptions()
    options.binary_location = CHROMIUM
    for flag in (*CHROMIUM_FLAGS, f"--user-data-dir={profile}"):
        options.add_argument(flag)
    driver = webdriver.Chrome(service=Service(CHROMEDRIVER), options=options)
    try:
        # the simple auth manager's own login form, as a user signs in
        driver.get(session.url("/auth/login"))
        wait(driver, lambda d: d.find_elements(By.NAME, "username"))
        driver.find_element(By.NAME, "username").send_keys(USER)
        driver.find_element(By.NAME, "password").send_keys(session.password)
        driver.find_element(By.CSS_SELECTOR, "button[type=submit]").click()
        wait(driver, lambda d: d.get_cookie("_token"))
        yield driver
    finally:
        driver.quit()
        shutil.rmtree(profile, ignore_errors=True)


def wait(driver: Any, condition: Any, timeout: float = WAIT) -> Any:
    from selenium.webdriver.support.ui import WebDriverWait

    return WebDriverWait(driver, timeout).until(condition)


def shot(driver: Any, name: str) -> None:
    driver.save_screenshot(str(OUTPUT / f"{name}.png"))


def open_view(driver: Any, session: Session, run_id: str, dag_id: str = DAG) -> None:
    """The plan view of a run on its own (no frame), once its data is drawn."""
    driver.get(session.url(f"/plan-view/dags/{dag_id}/runs/{quoted(run_id)}"))
    wait_loaded(driver)


def shown_text(driver: Any) -> str:
    """The page's text as a user reads it, without the JSON of params and outputs (where null is data)."""
    return str(
        driver.execute_script(
            "const copy = document.body.cloneNode(true);"
            "copy.querySelectorAll('pre, script, style').forEach(e => e.remove());"
            "return copy.innerText || copy.textContent;"
        )
    )


def assert_clean(driver: Any, where: str) -> None:
    text = shown_text(driver)
    bad = sorted({m.group(0) for m in BAD_TEXT.finditer(text)})
    assert not bad, f"{where} shows {bad}: {text[:2000]}"


def open_plan_tab(driver: Any, session: Session, run_id: str) -> Any:
    """The run's page with its Plan tab open; returns the tab's frame once the page shows the run."""
    from selenium.webdriver.common.by import By

    driver.get(session.url(f"/dags/{DAG}/runs/{quoted(run_id)}/plugin/plan"))
    return wait(driver, lambda d: d.find_elements(By.CSS_SELECTOR, "iframe[title='Plan']"))[0]


def top_url(driver: Any) -> str:
    return urllib.parse.unquote(driver.current_url).rstrip("/")


def wait_loaded(driver: Any, timeout: float = WAIT) -> None:
    from selenium.webdriver.common.by import By

    wait(driver, lambda d: d.find_elements(By.CSS_SELECTOR, "body[data-loaded='true'] g.node"), timeout)


def drawn_states(driver: Any) -> dict[str, str]:
    """Node id → drawn state, read in one go (the page redraws itself as it polls)."""
    return dict(
        driver.execute_script(
            "return [...document.querySelectorAll('svg#plan-graph g.node')]"
            ".map(g => [g.dataset.nodeId, g.dataset.state]);"
        )
    )


def select_revision(driver: Any, revision: int) -> None:
    from selenium.webdriver.common.by import By

    driver.find_element(By.CSS_SELECTOR, f"#tabs button[data-revision='{revision}']").click()
    wait(
        driver,
        lambda d: (
            d.find_element(By.CSS_SELECTOR, f"#tabs button[data-revision='{revision}']").get_attribute(
                "aria-selected"
            )
            == "true"
        ),
    )


def details(driver: Any, node_id: str) -> dict[str, str]:
    """Click a node; the rows of its details table."""
    from selenium.webdriver.common.by import By

    driver.find_element(By.CSS_SELECTOR, f"svg#plan-graph g.node[data-node-id='{node_id}']").click()
    table = wait(
        driver, lambda d: d.find_elements(By.CSS_SELECTOR, f"#details table[data-node-id='{node_id}']")
    )
    rows = table[0].find_elements(By.CSS_SELECTOR, "tr")
    return {
        row.find_elements(By.TAG_NAME, "td")[0].text: row.find_elements(By.TAG_NAME, "td")[1].text
        for row in rows
    }


def http_status(url: str, headers: dict[str, str] | None = None) -> int:
    request = urllib.request.Request(url, headers=headers or {})
    try:
        with urllib.request.urlopen(request, timeout=30) as response:
            return int(response.status)
    except urllib.error.HTTPError as error:
        return error.code


def task_instance(cluster: AirflowCluster, run_id: str, task_id: str, map_index: int) -> dict[str, Any]:
    [ti] = [
        ti
        for ti in cluster.task_instances(DAG, run_id)
        if ti["task_id"] == task_id and ti["map_index"] == map_index
    ]
    return ti


def reject_in_the_ui(browser: Any) -> str:
    """Press Reject on the open request; the toast's text once it says the answer was recorded. A busy
    SQLite server may refuse the answer ("Response failed"): pressed again then."""
    from selenium.webdriver.common.by import By

    for _ in range(5):
        browser.find_element(By.CSS_SELECTOR, "[data-testid='hitl-option-Reject']").click()
        toast = wait(
            browser,
            lambda d: [
                e.text
                for e in d.find_elements(
                    By.XPATH, "//*[contains(text(), 'response successful') or text()='Response failed']"
                )
                if e.text
            ],
        )[0]
        if toast != "Response failed":
            return str(toast)
        time.sleep(2)
    raise AssertionError("the answer was refused five times")


# ----------------------------------------------------------------------------------------------- tests


def test_view_follows_the_session_while_it_runs(session: Session, browser: Any) -> None:
    """Opened before the session starts (its run queued), the Plan tab redraws itself (no reload) as the
    plan is made and its nodes run, until the chain is over."""
    from selenium.webdriver.common.by import By

    browser.switch_to.frame(open_plan_tab(browser, session, session.root))
    try:
        wait(browser, lambda d: d.find_elements(By.ID, "session-state"))
        assert browser.execute_script("return document.body.dataset.finished;") != "true"
        assert_clean(browser, "the Plan tab of a queued session")
        browser.execute_script("window.openedOnce = true;")
        session.start()
        held = hold_nodes_after_planning(session)  # until the tab has drawn the plan before its nodes ran
        seen: list[dict[str, str]] = []
        runs_seen: set[int] = set()
        shown_while_running: set[str] = set()
        deadline = time.monotonic() + RUN_TIMEOUT
        while True:
            snapshot = browser.execute_script(
                "return {loaded: document.body.dataset.loaded, finished: document.body.dataset.finished,"
                " runs: document.querySelectorAll('#chain [data-run-id]').length,"
                " session: (document.getElementById('session-state') || {}).textContent};"
            )
            states = drawn_states(browser)
            if states and (not seen or seen[-1] != states):
                seen.append(states)
                if len(seen) == 1:
                    shot(browser, "00_plan_tab_while_running")
            if held and states and any(state != "success" for state in states.values()):
                set_default_pool_slots(session.cluster, 1)  # the nodes go on, one at a time
                held = False
            runs_seen.add(snapshot["runs"])
            if snapshot["finished"] == "true":
                break
            if states:
                shown_while_running.add(snapshot["session"])
            assert_clean(browser, "the Plan tab of a running session")
            assert time.monotonic() < deadline, f"the view did not see the session end; states seen: {seen}"
            time.sleep(0.5)
        session.finished()
        assert browser.execute_script("return window.openedOnce === true;")  # the same page all along
        assert seen[-1] == session.cluster.node_states(DAG, session.root)
        assert len(seen) >= 2, seen  # it showed the states change
        assert any(state != "success" for state in seen[0].values()), seen  # from before the nodes ran
        # the badge follows the runs: running while its nodes ran, and until the runs had ended (never
        # "success" while Airflow's header still says "Running")
        assert shown_while_running == {"running"}, shown_while_running
        assert {1, 2} <= runs_seen  # and the replan run join the chain
        assert_clean(browser, "the plan view of a finished session")
    finally:
        browser.switch_to.default_content()
    wait(browser, lambda d: "Run Type" in d.find_element(By.TAG_NAME, "body").text)
    assert_clean(browser, "the run page of a finished session")
    shot(browser, "00_live_view_at_the_end")


def test_plan_view_answers_only_a_signed_in_user(session: Session) -> None:
    session.finished()
    for path in (
        f"/plan-view/dags/{DAG}/runs/{quoted(session.root)}",
        f"/plan-view/data/dags/{DAG}/runs/{quoted(session.root)}",
    ):
        assert http_status(session.url(path)) == 401, path
        assert http_status(session.url(path), {"Authorization": "Bearer forged"}) in (401, 403), path
    data = session.cluster.request("GET", f"/plan-view/data/dags/{DAG}/runs/{quoted(session.child)}")
    assert [run["run_id"] for run in data["runs"]] == [session.root, session.child]
    plugins = session.cluster.api("GET", "/plugins")["plugins"]
    [view] = [v for p in plugins if p["name"] == "plan_view" for v in p["external_views"]]
    assert (view["destination"], view["url_route"]) == ("dag_run", "plan")


def test_plan_tab_of_the_run_page_draws_the_plan(session: Session, browser: Any) -> None:
    session.finished()
    from selenium.webdriver.common.by import By

    browser.get(session.url(f"/dags/{DAG}/runs/{quoted(session.root)}/plugin/plan"))
    frame = wait(browser, lambda d: d.find_elements(By.CSS_SELECTOR, "iframe[title='Plan']"))[0]
    assert "/plan-view/dags/plan_and_execute/runs/" in frame.get_attribute("src")
    browser.switch_to.frame(frame)
    try:
        wait_loaded(browser)
        states = drawn_states(browser)
        assert len(states) == 6
        assert states == session.cluster.node_states(DAG, session.root)
        assert browser.find_element(By.ID, "this-run").text == session.root
        assert_clean(browser, "the Plan tab of a finished session")
    finally:
        browser.switch_to.default_content()
    time.sleep(0.5)  # let the frame settle before the picture
    assert_clean(browser, "the run page of a finished session")
    shot(browser, "01_plan_tab_of_the_root_run")


def test_a_replan_run_and_the_runs_list_name_its_run_type(session: Session, browser: Any) -> None:
    """A replan run's type (operator_triggered) reads as words, on its page and in the runs list."""
    session.finished()
    from selenium.webdriver.common.by import By

    assert session.cluster.get_run(DAG, session.child)["run_type"] == "operator_triggered"
    browser.get(session.url(f"/dags/{DAG}/runs/{quoted(session.child)}"))
    wait(browser, lambda d: "Triggered by a task" in d.find_element(By.TAG_NAME, "body").text)
    assert_clean(browser, "a replan run's page")
    shot(browser, "07_replan_run_page_run_type")
    browser.get(session.url(f"/dags/{DAG}/runs"))
    wait(browser, lambda d: "Triggered by a task" in d.find_element(By.TAG_NAME, "body").text)
    assert_clean(browser, "the runs list")
    shot(browser, "08_runs_list_run_types")


def test_each_revision_shows_its_states_and_revision_1_its_diff(session: Session, browser: Any) -> None:
    session.finished()
    from selenium.webdriver.common.by import By

    cluster = session.cluster
    open_view(browser, session, session.root)
    select_revision(browser, 0)
    root_states = cluster.node_states(DAG, session.root)
    assert root_states == dict.fromkeys("1234", "success") | {"5": "skipped", "6": "skipped"}
    assert drawn_states(browser) == root_states
    flags = browser.find_element(By.CSS_SELECTOR, "g.node[data-node-id='3'] text.flags").text
    assert "replan requested" in flags
    node3 = details(browser, "3")
    assert node3["Tool"] == "query_deploys" and node3["Reused"] == "no"
    assert "no deploys" in browser.find_element(By.CSS_SELECTOR, "#details pre.node-error").text
    shot(browser, "02_revision_0_node_3")

    select_revision(browser, 1)
    child_states = cluster.node_states(DAG, session.child)
    assert child_states == dict.fromkeys("123456", "success")
    assert drawn_states(browser) == child_states
    diff = {
        kind: [
            item.text for item in browser.find_elements(By.CSS_SELECTOR, f"[data-diff-kind='{kind}'] .item")
        ]
        for kind in ("revised", "added", "removed")
    }
    assert diff == {"revised": ["5"], "added": [], "removed": []}
    graph = browser.find_element(By.ID, "plan-graph")
    assert (
        graph.find_element(By.CSS_SELECTOR, "g.node[data-node-id='5']").get_attribute("data-diff")
        == "revised"
    )
    assert "no deploys" in browser.find_element(By.ID, "reason").text
    # what the revision changed in node 5: its params, before -> after
    [row] = browser.find_elements(By.CSS_SELECTOR, "#changes tr[data-node-id='5'][data-field='params']")
    before = json.loads(row.find_element(By.CSS_SELECTOR, "pre.before").text)
    after = json.loads(row.find_element(By.CSS_SELECTOR, "pre.after").text)
    assert (before["against"], after["against"]) == ("${3}", "${2}")
    changed = {
        (r.get_attribute("data-node-id"), r.get_attribute("data-field"))
        for r in browser.find_elements(By.CSS_SELECTOR, "#changes tr[data-node-id]")
    }
    assert changed == {("5", "action"), ("5", "params")}  # its tool stayed the same
    node5 = details(browser, "5")
    ti = task_instance(cluster, session.child, NODES_TASK, 4)
    assert node5["Tool"] == "analyze_correlation" and node5["Reused"] == "no"
    assert node5["Worker"] == ti["hostname"] and node5["Attempts"] == str(ti["try_number"])
    # its own details say what the revision changed, before -> after
    assert node5["Revision"].startswith("revised\n"), node5
    assert 'params.against: "${3}" → "${2}"' in node5["Revision"].splitlines(), node5
    assert any(
        line.startswith('action: "correlate latency with the deploy" →')
        for line in node5["Revision"].splitlines()
    )
    shot(browser, "03_revision_1_diff_node_5")
    assert details(browser, "1")["Reused"].startswith("yes")


def test_replan_links_lead_from_the_root_to_the_child_and_back(session: Session, browser: Any) -> None:
    session.finished()
    from selenium.webdriver.common.by import By

    cluster, root, child = session.cluster, session.root, session.child
    links = cluster.api("GET", f"/dags/{DAG}/dagRuns/{quoted(root)}/taskInstances/replan/links")
    assert links["extra_links"]["Triggered DAG"].endswith(f"/dags/{DAG}/runs/{child}")
    links = cluster.api("GET", f"/dags/{DAG}/dagRuns/{quoted(child)}/taskInstances/plan/links")
    assert links["extra_links"]["Parent run"].endswith(f"/dags/{DAG}/runs/{root}")

    def follow(run_id: str, task_id: str, link: str, target: str, picture: str) -> None:
        browser.get(session.url(f"/dags/{DAG}/runs/{quoted(run_id)}/tasks/{task_id}/details"))
        anchor = wait(browser, lambda d: d.find_elements(By.XPATH, f"//a[normalize-space()='{link}']"))[0]
        anchor.click()
        wait(browser, lambda d: urllib.parse.unquote(d.current_url).rstrip("/").endswith(f"/runs/{target}"))
        wait(browser, lambda d: "Run Type" in d.find_element(By.TAG_NAME, "body").text)
        body = browser.find_element(By.TAG_NAME, "body").text
        assert target in body and "Not Found" not in body
        shot(browser, picture)

    follow(root, REPLAN_TASK, "Triggered DAG", child, "04_triggered_dag_link_to_the_child")
    follow(child, PLAN_TASK, "Parent run", root, "05_parent_run_link_back_to_the_root")

    # the same way inside the Plan tab: the whole page goes to the replan run (its Plan tab open) and back
    for start, link, target in ((root, "a.child-link", child), (child, "a.parent-link", root)):
        browser.switch_to.frame(open_plan_tab(browser, session, start))
        try:
            wait_loaded(browser)
            browser.find_element(By.CSS_SELECTOR, link).click()
        finally:
            browser.switch_to.default_content()
        wait(browser, lambda d, target=target: top_url(d).endswith(f"/dags/{DAG}/runs/{target}/plugin/plan"))
        browser.switch_to.frame(
            wait(browser, lambda d: d.find_elements(By.CSS_SELECTOR, "iframe[title='Plan']"))[0]
        )
        try:
            wait(
                browser,
                lambda d, target=target: (
                    d.find_elements(By.ID, "this-run") and d.find_element(By.ID, "this-run").text == target
                ),
            )
            current = browser.find_element(By.CSS_SELECTOR, "#chain span.current").get_attribute(
                "data-run-id"
            )
            assert current == target
        finally:
            browser.switch_to.default_content()
        # the page around the tab shows the same run
        wait(browser, lambda d, target=target: target in d.find_element(By.TAG_NAME, "body").text)
    time.sleep(0.5)
    shot(browser, "06_plan_tab_link_back_at_the_root")


def test_one_node_duration_in_the_log_the_event_the_view_and_the_rest_xcom(
    session: Session, browser: Any
) -> None:
    """Node 5 of the replan run: the tool call's duration, the same (+- 10 ms) wherever it is shown."""
    session.finished()
    cluster = session.cluster
    ti = task_instance(cluster, session.child, NODES_TASK, 4)
    record = cluster.xcom(DAG, session.child, NODES_TASK, NODE_KEY, map_index=4)  # REST: the XCom entry
    assert record["node_id"] == "5"
    [event] = [e for e in record["events"] if e["type"] == "node.succeeded"]
    log = cluster.task_log(DAG, session.child, NODES_TASK, ti["try_number"], map_index=4)
    found = re.search(r"node 5 succeeded in ([0-9.]+) s", log)
    assert found, log[-3000:]
    open_view(browser, session, session.child)
    select_revision(browser, 1)
    row = details(browser, "5")
    shown = re.fullmatch(r"([0-9.]+) s \(the tool call\)", row["Duration"])
    assert shown, row
    figures = {
        "log": float(found.group(1)),
        "event": float(event["data"]["duration_s"]),
        "plan view": float(shown.group(1)),
        "REST XCom": float(record["duration_s"]),
    }
    assert max(figures.values()) - min(figures.values()) <= 0.010, figures
    # the waiting before the call and the task's own duration are shown apart, named
    assert row["Waited before the call"].endswith("(for its parents or a slot, in its task)")
    assert row["Task in Airflow"].endswith(" s")
    # times as Airflow shows them: YYYY-MM-DD HH:mm:ss in the timezone chosen in Airflow's UI (its
    # localStorage "timezone"; UTC here), and in another once the user picks it
    started = datetime.fromisoformat(ti["start_date"].replace("Z", "+00:00"))
    assert row["Started"] == started.astimezone(UTC).strftime("%Y-%m-%d %H:%M:%S"), row
    shot(browser, "09_node_5_duration")
    browser.execute_script("localStorage.setItem('timezone', JSON.stringify('Asia/Kolkata'));")
    try:
        browser.refresh()
        wait_loaded(browser)
        select_revision(browser, 1)
        shown_in_india = details(browser, "5")["Started"]
    finally:
        browser.execute_script("localStorage.removeItem('timezone');")
    india = timezone(timedelta(hours=5, minutes=30))
    assert shown_in_india == started.astimezone(india).strftime("%Y-%m-%d %H:%M:%S")


def test_a_rejected_plans_nodes_show_as_not_run(session: Session, browser: Any) -> None:
    """The approval example, rejected: no node runs, and the Plan view draws every node "not run"."""
    from selenium.webdriver.common.by import By

    cluster, run_id = session.cluster, session.rejected
    hitl = f"/api/v2/dags/{PUBLISH}/dagRuns/{quoted(run_id)}/taskInstances/approve/-1/hitlDetails"
    deadline = time.monotonic() + RUN_TIMEOUT
    parked = f"TaskInstance Finished: dag_id={PUBLISH}, task_id=approve, run_id={run_id},"
    while True:  # answered once the scheduler has seen the task park (see tests/e2e/test_approval.py)
        states = {t["task_id"]: t["state"] for t in cluster.task_instances(PUBLISH, run_id)}
        if states.get("approve") == "awaiting_input" and parked in cluster.log_path("scheduler").read_text():
            break
        assert time.monotonic() < deadline, (states, cluster.diagnostics())
        time.sleep(0.5)
    request = cluster.request("GET", hitl)
    assert request["options"] == ["Approve", "Reject"] and not request.get("defaults")
    assert "| node | action | tool | approval |" in request["body"]
    browser.get(session.url(f"/dags/{PUBLISH}/runs/{quoted(run_id)}/required_actions"))
    wait(browser, lambda d: "publish" in d.find_element(By.TAG_NAME, "body").text.lower())
    # Approve and Reject: two buttons drawn alike (the request has no default answer to single out)
    buttons = [
        wait(
            browser, lambda d, o=option: d.find_elements(By.CSS_SELECTOR, f"[data-testid='hitl-option-{o}']")
        )[0]
        for option in ("Approve", "Reject")
    ]
    assert buttons[0].get_attribute("class") == buttons[1].get_attribute("class")
    browser.execute_script("arguments[0].scrollIntoView({block: 'center'});", buttons[0])
    time.sleep(1.0)
    shot(browser, "10_approval_request")
    # the user presses Reject; Airflow's toast says the answer was recorded, in Airflow's words
    # (docs/plan-view-and-approval.md, Approval), and the request then reads as a rejection
    toast = reject_in_the_ui(browser)
    assert toast == "approve response successful", toast
    shot(browser, "12_rejected_toast")
    assert cluster.wait_for_run(PUBLISH, run_id, timeout=RUN_TIMEOUT) == "failed"
    # the run's page lists the task as the provider names it, failed, and its node task upstream failed
    browser.get(session.url(f"/dags/{PUBLISH}/runs/{quoted(run_id)}"))
    listed = ("\napproval\nFailed\n", "\nnodes\nUpstream Failed\n")
    wait(browser, lambda d: all(words in d.find_element(By.TAG_NAME, "body").text for words in listed))
    assert_clean(browser, "the rejected run's page")
    shot(browser, "13_rejected_run_approval_failed")

    # the provider's words: the task named "approval" ends failed, saying who rejected the plan
    [approve] = [t for t in cluster.task_instances(PUBLISH, run_id) if t["task_id"] == APPROVE_TASK]
    assert (approve["state"], approve["task_display_name"]) == ("failed", "approval"), approve
    log = cluster.task_log(PUBLISH, run_id, APPROVE_TASK, approve["try_number"])
    assert f"plan rejected: rejected by {USER}; no node runs" in log, log[-3000:]

    open_view(browser, session, run_id, PUBLISH)
    states = drawn_states(browser)
    assert states == dict.fromkeys("12345", "not_run"), states
    flags = browser.find_element(By.CSS_SELECTOR, "g.node[data-node-id='5'] text.flags").text
    assert flags.startswith("not run")
    outcome = browser.find_element(By.ID, "outcome").text
    assert outcome.startswith(f"failed (rejected): the plan was not approved: rejected by {USER}"), outcome
    assert_clean(browser, "the plan view of a rejected run")
    shot(browser, "11_rejected_run_nodes_not_run")


OVERLAPS = """
const start = [...document.querySelectorAll('p, li')].find(e => e.textContent.includes(arguments[0]));
let box = start;
while (box && !box.textContent.includes(arguments[1])) box = box.parentElement;
if (!box) return null;
const inline = [...box.querySelectorAll('code, strong, em, a')];
const blocks = [...box.querySelectorAll('p, li, pre, h1, h2, h3, h4')];
const r = e => e.getBoundingClientRect();
const hit = (a, b) => a.left < b.right && b.left < a.right && a.top < b.bottom && b.top < a.bottom;
const found = [];
for (const e of [...inline, ...blocks]) for (const b of blocks) {
  if (e === b || b.contains(e) || e.contains(b)) continue;
  const name = (x) => `${x.tagName} "${x.textContent.slice(0, 30)}"`;
  if (hit(r(e), r(b))) found.push(`${name(e)} over ${name(b)}`);
}
return {checked: inline.length + blocks.length, overlaps: found};
"""


def test_the_trigger_forms_tool_list_reads_without_overlaps_at_1600_px(
    session: Session, browser: Any
) -> None:
    """The Ready plan field's example and tool list on a 1600 px wide page: no element's box intersects
    another line's, and the example calls this DAG's own tools."""
    from selenium.webdriver.common.by import By

    browser.set_window_size(1600, 1300)
    try:
        browser.get(session.url(f"/dags/{DAG}"))
        wait(browser, lambda d: d.find_elements(By.XPATH, "//button[normalize-space()='Trigger']"))[0].click()
        heading = wait(browser, lambda d: d.find_elements(By.XPATH, '//strong[text()="This DAG\'s tools"]'))[
            0
        ]
        browser.execute_script("arguments[0].scrollIntoView({block: 'start'});", heading)
        time.sleep(1.0)
        found = browser.execute_script(OVERLAPS, "Optional. A plan to run as given", "This DAG's tools")
        assert found is not None and found["checked"] >= 15, found  # the list was found and measured
        assert found["overlaps"] == [], found["overlaps"]
        example = browser.find_element(By.TAG_NAME, "body").text  # the example's nodes name their tools
        tools = set(re.findall(r'"tool": "([a-z_]+)"', example))
        assert tools and tools <= {
            "analyze_correlation",
            "query_deploys",
            "query_error_logs",
            "query_metrics",
            "query_service_health",
            "write_report",
        }, example
        assert "<a tool of this DAG>" not in browser.find_element(By.TAG_NAME, "body").text
        shot(browser, "15_trigger_form_tool_list_1600px")
    finally:
        browser.set_window_size(1500, 1100)


def test_a_frozen_run_triggered_without_a_logical_date_completes(session: Session, browser: Any) -> None:
    """``POST .../dagRuns`` with ``"logical_date": null``: the frozen plan renders with the run's
    run_after (the report covers the day before it), and the form offers only what applies."""
    session.finished()
    from airflow_plan_provider.contract import FINALIZE_TASK, RESULT_KEY

    cluster = session.cluster
    run_id = cluster.trigger(DAILY)
    cluster.unpause(DAILY)
    assert cluster.wait_for_run(DAILY, run_id, timeout=RUN_TIMEOUT) == "success", cluster.diagnostics()
    run = cluster.get_run(DAILY, run_id)
    assert run["logical_date"] is None
    day_before = (datetime.fromisoformat(run["run_after"].replace("Z", "+00:00")) - timedelta(days=1)).date()
    outputs = cluster.xcom(DAILY, run_id, FINALIZE_TASK, RESULT_KEY)["outputs"]
    assert outputs["1"]["day"] == outputs["2"]["day"] == day_before.isoformat()
    params = cluster.api("GET", f"/dags/{DAILY}/details")["params"]
    assert sorted(params) == ["max_steps"]
    open_view(browser, session, run_id, DAILY)
    assert set(drawn_states(browser).values()) == {"success"}
    assert_clean(browser, "the plan view of a frozen run without a logical date")
    shot(browser, "16_frozen_run_without_logical_date")
    # its docs: a short list, the source run named as a run of the Airflow the plan was read from
    from selenium.common.exceptions import StaleElementReferenceException, TimeoutException
    from selenium.webdriver.common.by import By

    browser.get(session.url(f"/dags/{DAILY}"))
    wait(browser, lambda d: d.find_elements(By.CSS_SELECTOR, "button[aria-label='Dag Docs']"))[0].click()
    # read until the dialog shows the whole list: while it opens, an item may read as no text yet, and
    # the list may be drawn again
    heads = ["Goal", "Frozen from", "Revision", "Schedule"]
    items: list[str] = []

    def listed(d: Any) -> bool:
        found = d.find_elements(By.XPATH, "//li[starts-with(normalize-space(), 'Goal:')]/../li")
        try:
            items[:] = [e.text for e in found]
        except StaleElementReferenceException:  # the list was drawn again as it was read
            return False
        return [item.split(":", 1)[0] for item in items] == heads

    try:
        wait(browser, listed)
    except TimeoutException:
        raise AssertionError(f"the DAG's docs list {items}, not the items {heads}") from None
    assert "of DAG plan_and_execute, made on 20" in items[1] and "which may not be this one" in items[1], (
        items
    )
    shot(browser, "16_frozen_dag_docs")


@pytest.mark.parametrize("dag_id", [PHASES, PHASES_STARTED])
def test_a_waiting_node_is_drawn_waiting_for_its_parents_then_running(
    session: Session, browser: Any, dag_id: str
) -> None:
    """Node 3 of ``e2e_phases`` waits for its slow parent 1 (Airflow says "running" or "deferred"): the view
    draws it waiting and names the parent, then running once its own tool runs. In ``e2e_phases_started``
    node 3 starts on the triggerer, in a task of its own, and is drawn the same."""
    session.finished()
    cluster = session.cluster
    run_id = cluster.trigger(dag_id)
    cluster.unpause(dag_id)
    browser.get(session.url(f"/plan-view/dags/{dag_id}/runs/{quoted(run_id)}"))
    wait_loaded(browser, RUN_TIMEOUT)  # once planned
    seen: list[tuple[str, str, str]] = []  # node 3's (phase, parents named, Airflow's state), as drawn
    deadline = time.monotonic() + RUN_TIMEOUT
    picture = "17_node_3" if dag_id == PHASES else "18_started_node_3"
    while browser.execute_script("return document.body.dataset.finished;") != "true":
        drawn = browser.execute_script(
            "const g = document.querySelector(\"svg#plan-graph g.node[data-node-id='3']\");"
            "return g && [g.dataset.phase, g.dataset.waitingFor, g.dataset.state,"
            " g.querySelector('text.flags').textContent];"
        )
        if drawn and (not seen or seen[-1] != tuple(drawn[:3])):
            seen.append(tuple(drawn[:3]))
            if drawn[0] in ("waiting", "running") and [s[0] for s in seen].count(drawn[0]) == 1:
                if drawn[0] == "waiting":
                    assert drawn[3].startswith("waiting for 1"), drawn
                shot(browser, f"{picture}_{drawn[0]}")
        assert time.monotonic() < deadline, seen
        time.sleep(0.5)
    assert cluster.wait_for_run(dag_id, run_id, timeout=RUN_TIMEOUT) == "success"
    phases = [phase for phase, _parents, _state in seen]
    assert "waiting" in phases and "running" in phases, seen
    assert phases.index("waiting") < phases.index("running"), seen
    # waiting while Airflow called it running (in its slot) or deferred, and named its slow parent
    waiting = [s for s in seen if s[0] == "waiting"]
    assert all("1" in parents.split(",") for _phase, parents, _state in waiting), seen
    assert {state for _phase, _parents, state in waiting} <= {"running", "deferred", "up_for_reschedule"}, (
        seen
    )
    legend = browser.find_element("css selector", "#legend [data-phase='waiting']").text
    assert legend.startswith("waiting: for the parents it names to finish"), legend
    if dag_id == PHASES_STARTED:
        # the view finds it in the task its lane's nodes with parents run in (the roots' task is another);
        # its parents run their tools from the first, so it comes to a slot at once to wait near them
        after = lane_task_id(after_lane(None))
        assert details(browser, "3")["Task"] == f"{after}[0]"
        assert details(browser, "1")["Task"] == f"{NODES_TASK}[0]"
        # Airflow's own run page lists the task and the select task it maps over, as words
        from selenium.webdriver.common.by import By

        browser.get(session.url(f"/dags/{dag_id}/runs/{quoted(run_id)}"))
        wait(browser, lambda d: after in d.find_element(By.TAG_NAME, "body").text)
        assert select_task_id(after) in browser.find_element(By.TAG_NAME, "body").text
        assert_clean(browser, "the run page of a plan started on the triggerer")
        shot(browser, "19_started_run_page")


def test_the_report_opens_from_the_plan_view_and_names_its_dag_and_run(
    session: Session, browser: Any
) -> None:
    """Node 6 of the replan run wrote the report: its details in the Plan tab link to it, and the page
    that opens renders the report and says which node, run and DAG wrote it."""
    session.finished()
    from selenium.webdriver.common.by import By

    browser.switch_to.frame(open_plan_tab(browser, session, session.child))
    try:
        wait_loaded(browser)
        details(browser, "6")
        browser.find_element(By.CSS_SELECTOR, "#details a.document-link").click()
    finally:
        browser.switch_to.default_content()
    wait(browser, lambda d: d.find_elements(By.ID, "document"))
    source = browser.find_element(By.ID, "source").text
    assert source.startswith(f"Written by node 6 of run {session.child} of DAG {DAG}"), source
    report = browser.find_element(By.ID, "document").text
    assert "investigation report" in browser.find_element(By.CSS_SELECTOR, "#document h1").text
    footer = f"Written by node 6 of run {session.child} of DAG {DAG} (revision 1, try 1)."
    assert footer in report, report[-500:]
    assert browser.find_elements(By.CSS_SELECTOR, "#document svg")  # the chart, drawn
    shot(browser, "18_report_opened_from_the_plan_view")
