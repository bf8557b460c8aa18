"""The plan view in a real browser: Debian's chromium (headless, through chromium-driver and Selenium)
against a real API server with Airflow's auth on (simple auth manager, signed in through its login form).

One cluster and one browser serve the module: the example DAG's seed session (node 3 finds no deploy and
asks for a replan; revision 1 revises node 5) is run once. The first test watches its plan view while it
runs; the others read the finished session's view as a user sees it and compare it with what the REST
API says. Screenshots go to ``tests/e2e/output/plan_view/``
(``$PLAN_E2E_OUTPUT/plan_view/`` when set).
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from airflow_plan_provider.contract import NODES_TASK, PLAN_TASK, REPLAN_TASK
from harness.cluster import AirflowCluster
from tests.e2e.conftest import EXAMPLE_FILES, demo_env, plan_cluster

pytestmark = pytest.mark.e2e

ROOT = Path(__file__).resolve().parents[2]
DAG = "plan_and_execute"
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
WAIT = 30.0
RUN_TIMEOUT = 240.0


@dataclass
class Session:
    cluster: AirflowCluster
    root: str
    child: str

    def finished(self) -> None:
        """Wait for the whole chain: the root run ends after its replan run."""
        state = self.cluster.wait_for_run(DAG, self.root, timeout=RUN_TIMEOUT)
        assert state == "success", self.cluster.diagnostics()

    @property
    def password(self) -> str:
        users = json.loads((self.cluster.home / "simple_auth_manager_passwords.json.generated").read_text())
        return str(users[USER])

    def url(self, path: str) -> str:
        return self.cluster.base_url + path


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
    with plan_cluster(base, EXAMPLE_FILES, [DAG], env=env) as cluster:
        root = cluster.trigger(DAG, {"goal": GOAL})
        yield Session(cluster, root, f"{root}__replan_1")


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


def open_view(driver: Any, session: Session, run_id: str) -> None:
    """The plan view of a run on its own (no frame), once its data is drawn."""
    driver.get(session.url(f"/plan-view/dags/{DAG}/runs/{quoted(run_id)}"))
    wait_loaded(driver)


def wait_loaded(driver: Any) -> None:
    from selenium.webdriver.common.by import By

    wait(driver, lambda d: d.find_elements(By.CSS_SELECTOR, "body[data-loaded='true'] g.node"))


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


# ----------------------------------------------------------------------------------------------- tests


def test_view_follows_the_session_while_it_runs(session: Session, browser: Any) -> None:
    """Opened right after the trigger, the page redraws itself (no reload) until the chain is over."""
    browser.get(session.url(f"/plan-view/dags/{DAG}/runs/{quoted(session.root)}"))
    browser.execute_script("window.openedOnce = true;")
    seen: list[dict[str, str]] = []
    runs_seen: set[int] = set()
    deadline = time.monotonic() + RUN_TIMEOUT
    while True:
        snapshot = browser.execute_script(
            "return {loaded: document.body.dataset.loaded, finished: document.body.dataset.finished,"
            " runs: document.querySelectorAll('#chain [data-run-id]').length};"
        )
        states = drawn_states(browser)
        if states and (not seen or seen[-1] != states):
            seen.append(states)
        runs_seen.add(snapshot["runs"])
        if snapshot["finished"] == "true":
            break
        assert time.monotonic() < deadline, f"the view did not see the session end; states seen: {seen}"
        time.sleep(0.5)
    session.finished()
    assert browser.execute_script("return window.openedOnce === true;")  # the same page all along
    assert seen[-1] == session.cluster.node_states(DAG, session.root)
    assert len(seen) >= 2, seen  # it showed the states change
    assert {1, 2} <= runs_seen  # and the replan run join the chain
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
    finally:
        browser.switch_to.default_content()
    time.sleep(0.5)  # let the frame settle before the picture
    shot(browser, "01_plan_tab_of_the_root_run")


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
    node5 = details(browser, "5")
    ti = task_instance(cluster, session.child, NODES_TASK, 4)
    assert node5["Tool"] == "analyze_correlation" and node5["Reused"] == "no"
    assert node5["Worker"] == ti["hostname"] and node5["Attempts"] == str(ti["try_number"])
    assert node5["Revision"] == "revised"
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

    # the same way inside the Plan tab: to the replan run and back to its parent
    browser.get(session.url(f"/dags/{DAG}/runs/{quoted(root)}/plugin/plan"))
    browser.switch_to.frame(
        wait(browser, lambda d: d.find_elements(By.CSS_SELECTOR, "iframe[title='Plan']"))[0]
    )
    try:
        wait_loaded(browser)
        browser.find_element(By.CSS_SELECTOR, "a.child-link").click()
        wait(browser, lambda d: d.find_element(By.ID, "this-run").text == child)
        wait_loaded(browser)
        assert (
            browser.find_element(By.CSS_SELECTOR, "#chain span.current").get_attribute("data-run-id") == child
        )
        browser.find_element(By.CSS_SELECTOR, "a.parent-link").click()
        wait(browser, lambda d: d.find_element(By.ID, "this-run").text == root)
    finally:
        browser.switch_to.default_content()
    shot(browser, "06_plan_tab_back_at_the_root")
