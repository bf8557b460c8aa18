"""docker-compose.yml, Dockerfile and .env.example describe one consistent Airflow deployment.

No Docker engine runs here, so the files are checked as data: every Airflow service runs the same image
with the same metadata database, broker, executor, DAGs and shared volumes; the init service runs first;
PostgreSQL and Redis are healthy before anything uses them; every Airflow option set names a real option;
no secret is committed; the Dockerfile installs this project on the official image of the Airflow version
the project is tested with. The init service's script itself runs here under bash, with its paths moved
to a temporary folder and the image's entrypoint replaced by a recorder.
"""

from __future__ import annotations

import json
import os
import re
import shlex
import stat
import subprocess
import sys
import tomllib
import urllib.parse
from importlib.metadata import version
from pathlib import Path
from typing import Any

import pytest
import yaml
from packaging.requirements import Requirement
from packaging.version import Version


class _StrictLoader(yaml.SafeLoader):
    """A YAML loader that rejects a key given twice in one mapping (docker compose rejects it too;
    PyYAML would silently keep the last one)."""

    def construct_mapping(self, node: yaml.MappingNode, deep: bool = False) -> dict[Any, Any]:
        keys = [key.value for key, _ in node.value if key.tag != "tag:yaml.org,2002:merge"]
        repeated = {k for k in keys if keys.count(k) > 1}
        if repeated:
            raise yaml.constructor.ConstructorError(
                None, None, f"keys given twice: {repeated}", node.start_mark
            )
        return super().construct_mapping(node, deep=deep)


ROOT = Path(__file__).resolve().parents[2]
COMPOSE = yaml.load((ROOT / "docker-compose.yml").read_text(), Loader=_StrictLoader)
SERVICES: dict[str, dict[str, Any]] = COMPOSE["services"]
AIRFLOW_HOME = "/opt/airflow"  # of the official image
INIT = "airflow-init"
LONG_RUNNING = {
    "airflow-apiserver": "api-server",
    "airflow-scheduler": "scheduler",
    "airflow-dag-processor": "dag-processor",
    "airflow-triggerer": "triggerer",
    "airflow-worker-1": "celery worker",
    "airflow-worker-2": "celery worker",
}
AIRFLOW = {INIT, *LONG_RUNNING}
SHARED_ENV = (
    "AIRFLOW__CORE__EXECUTOR",
    "AIRFLOW__DATABASE__SQL_ALCHEMY_CONN",
    "AIRFLOW__CELERY__RESULT_BACKEND",
    "AIRFLOW__CELERY__BROKER_URL",
    "AIRFLOW__CORE__EXECUTION_API_SERVER_URL",
    "AIRFLOW__CORE__FERNET_KEY_CMD",
    "AIRFLOW__API__SECRET_KEY_CMD",
    "AIRFLOW__API_AUTH__JWT_SECRET_CMD",
    "AIRFLOW__CORE__AUTH_MANAGER",
    "AIRFLOW__CORE__SIMPLE_AUTH_MANAGER_USERS",
    "AIRFLOW__CORE__SIMPLE_AUTH_MANAGER_PASSWORDS_FILE",
    "AIRFLOW_CONN_PLAN_LLM_DEFAULT",
    "PLAN_ARTIFACT_STORE",
    "PLAN_REPORT_DIR",
)
SENSITIVE_NAME = re.compile(r"KEY|SECRET|TOKEN|PASSWORD|AIRFLOW_CONN_", re.IGNORECASE)
API_KEY_LIKE = re.compile(r"\b(sk|pk|rk)-[A-Za-z0-9_-]{12,}")
VARIABLE = re.compile(r"\$\$|\$\{([A-Za-z_][A-Za-z0-9_]*)(?::?-([^}]*))?\}")


def env(service: str) -> dict[str, str]:
    return {k: str(v) for k, v in (SERVICES[service].get("environment") or {}).items()}


def mounts(service: str) -> dict[str, str]:
    """Container path → source (a named volume, or a host path) of the service's volumes."""
    out = {}
    for spec in SERVICES[service].get("volumes", []):
        source, target, *_ = spec.split(":")
        out[target] = source
    return out


def interpolate(text: str, values: dict[str, str]) -> str:
    """What docker compose makes of ``text``: ``$$`` is a literal ``$``, ``${VAR:-default}`` a value."""

    def one(match: re.Match[str]) -> str:
        if match.group(0) == "$$":
            return "$"
        return values.get(match.group(1)) or (match.group(2) or "")

    return VARIABLE.sub(one, text)


def database(url: str) -> tuple[str | None, str | None, int | None, str]:
    """(user, host, port, database) of an SQLAlchemy URL, whatever its driver or ``db+`` prefix."""
    parts = urllib.parse.urlsplit(url.removeprefix("db+"))
    return parts.username, parts.hostname, parts.port, parts.path.lstrip("/")


# ------------------------------------------------------------------------------------------ services


def test_the_airflow_services_are_the_official_layout() -> None:
    assert set(SERVICES) == AIRFLOW | {"postgres", "redis"}
    assert {name for name, svc in SERVICES.items() if "build" in svc} == AIRFLOW
    for name, command in LONG_RUNNING.items():
        assert SERVICES[name]["command"] == command, name
        assert SERVICES[name]["restart"] == "always", name
        assert SERVICES[name]["healthcheck"]["test"], name
    workers = [n for n, c in LONG_RUNNING.items() if c == "celery worker"]
    hostnames = [SERVICES[n]["hostname"] for n in workers]
    assert len(set(hostnames)) == len(workers) == 2  # distinct names on the tasks they run
    assert SERVICES["airflow-apiserver"]["ports"] == ["8080:8080"]


def test_every_airflow_service_uses_one_image_database_broker_and_executor() -> None:
    reference = env("airflow-apiserver")
    for name in AIRFLOW:
        svc = SERVICES[name]
        assert (svc["build"], svc["image"]) == (".", SERVICES["airflow-apiserver"]["image"]), name
        assert {k: env(name).get(k) for k in SHARED_ENV} == {k: reference[k] for k in SHARED_ENV}, name
        assert svc["user"] == SERVICES["airflow-apiserver"]["user"] or name == INIT
    assert reference["AIRFLOW__CORE__EXECUTOR"] == "CeleryExecutor"

    # The Celery result backend is the metadata database, served by the postgres service.
    metadata = database(reference["AIRFLOW__DATABASE__SQL_ALCHEMY_CONN"])
    assert database(reference["AIRFLOW__CELERY__RESULT_BACKEND"]) == metadata
    postgres = env("postgres")
    assert metadata == (postgres["POSTGRES_USER"], "postgres", None, postgres["POSTGRES_DB"])
    password = urllib.parse.urlsplit(reference["AIRFLOW__DATABASE__SQL_ALCHEMY_CONN"]).password
    assert password == postgres["POSTGRES_PASSWORD"]

    broker = urllib.parse.urlsplit(reference["AIRFLOW__CELERY__BROKER_URL"])
    assert (broker.scheme, broker.hostname, broker.port) == ("redis", "redis", 6379)
    api = urllib.parse.urlsplit(reference["AIRFLOW__CORE__EXECUTION_API_SERVER_URL"])
    assert (api.hostname, api.port, api.path) == ("airflow-apiserver", 8080, "/execution/")


def test_every_airflow_service_mounts_the_dags_and_the_shared_volumes() -> None:
    reference = mounts("airflow-apiserver")
    assert reference[f"{AIRFLOW_HOME}/dags"] == "./dags"
    named = {target: source for target, source in reference.items() if not source.startswith(".")}
    assert set(named.values()) <= set(COMPOSE["volumes"])
    assert named == {
        f"{AIRFLOW_HOME}/logs": "airflow-logs",
        f"{AIRFLOW_HOME}/secrets": "airflow-secrets",
        f"{AIRFLOW_HOME}/plan_artifacts": "plan-artifacts",
    }
    for name in AIRFLOW:
        assert mounts(name) == reference, name
    # The provider's store is that volume: by the environment variable, and by its default location
    # ($AIRFLOW_HOME/plan_artifacts) as well.
    store = urllib.parse.urlsplit(env("airflow-apiserver")["PLAN_ARTIFACT_STORE"])
    assert store.scheme == "file" and store.path == f"{AIRFLOW_HOME}/plan_artifacts"
    assert env("airflow-apiserver")["PLAN_REPORT_DIR"].startswith(f"{AIRFLOW_HOME}/plan_artifacts/")
    assert (ROOT / "dags" / "plan_and_execute.py").is_file()
    # the image holds only the provider: the mounted folder brings the demo the example DAG imports
    assert (ROOT / "dags" / "plan_demo" / "tools.py").is_file()


def test_the_init_service_runs_first_and_postgres_and_redis_are_healthy_before_use() -> None:
    for backend in ("postgres", "redis"):
        assert SERVICES[backend]["healthcheck"]["test"], backend
    for name in AIRFLOW:
        depends = SERVICES[name]["depends_on"]
        assert depends["postgres"] == {"condition": "service_healthy"}, name
        assert depends["redis"] == {"condition": "service_healthy"}, name
        if name != INIT:
            assert depends[INIT] == {"condition": "service_completed_successfully"}, name
    for name, command in LONG_RUNNING.items():
        if command == "celery worker":
            assert SERVICES[name]["depends_on"]["airflow-apiserver"] == {"condition": "service_healthy"}
    init = SERVICES[INIT]
    assert "restart" not in init and INIT not in init["depends_on"]
    assert "airflow db migrate" in init["command"][-1]


def test_every_airflow_option_set_is_a_real_option() -> None:
    from airflow.configuration import conf

    conf.load_providers_configuration()  # the celery provider's section
    options = conf.configuration_description
    if "celery" not in options:  # Airflow 3.1 keeps the providers' sections apart
        from airflow.providers_manager import ProvidersManager

        for sections in ProvidersManager().provider_configs:
            options = {**sections[1], **options}
    for name in AIRFLOW:
        for key in env(name):
            if not key.startswith("AIRFLOW__"):
                continue
            section, option = key.removeprefix("AIRFLOW__").lower().split("__", 1)
            from_command = option.endswith("_cmd")
            option = option.removesuffix("_cmd")
            assert option in options.get(section, {}).get("options", {}), f"{name}: {key}"
            if from_command:  # Airflow runs *_CMD only for its sensitive options
                assert (section, option) in conf.sensitive_config_values, f"{name}: {key}"


# ------------------------------------------------------------------------------------------- secrets


def test_no_secret_is_committed() -> None:
    secrets_dir = f"{AIRFLOW_HOME}/secrets/"
    for name, svc in SERVICES.items():
        for key, value in env(name).items():
            if not SENSITIVE_NAME.search(key) or key.endswith("_PASSWORDS_FILE"):  # a path
                continue
            if key == "POSTGRES_PASSWORD":  # the database is reachable only on the compose network
                assert "ports" not in svc
                continue
            if key.endswith("_CMD"):  # read from what airflow-init generated
                assert shlex.split(value)[0] == "cat" and shlex.split(value)[1].startswith(secrets_dir)
                continue
            assert VARIABLE.fullmatch(value) and not VARIABLE.fullmatch(value).group(2), (name, key, value)
    assert SERVICES[INIT]["environment"]["AIRFLOW__CORE__SIMPLE_AUTH_MANAGER_PASSWORDS_FILE"].startswith(
        secrets_dir
    )

    example = dotenv(ROOT / ".env.example")
    assert example["AIRFLOW_CONN_PLAN_LLM_DEFAULT"] == ""
    for key, value in example.items():
        if SENSITIVE_NAME.search(key):
            assert value == "", key
    for path in ("docker-compose.yml", "Dockerfile", ".env.example", ".dockerignore"):
        assert not API_KEY_LIKE.search((ROOT / path).read_text()), path
    ignored = {line.strip() for line in (ROOT / ".gitignore").read_text().splitlines()}
    assert ".env" in ignored and ".env.example" not in ignored


def dotenv(path: Path) -> dict[str, str]:
    out = {}
    for line in path.read_text().splitlines():
        if line.strip() and not line.lstrip().startswith("#"):
            key, _, value = line.partition("=")
            out[key.strip()] = value.strip().strip("'\"")
    return out


def test_every_variable_the_compose_file_reads_is_in_env_example() -> None:
    text = (ROOT / "docker-compose.yml").read_text()
    used = {m.group(1) for m in VARIABLE.finditer(text) if m.group(1)}
    # $${HOSTNAME} and the init script's $${...} are the containers' own shell variables, not compose's.
    assert used == set(dotenv(ROOT / ".env.example"))


# ------------------------------------------------------------------------------------------ the image


def test_the_dockerfile_installs_this_project_on_the_tested_airflow_image() -> None:
    lines = [line.strip() for line in (ROOT / "Dockerfile").read_text().splitlines()]
    instructions = [line for line in lines if line and not line.startswith("#")]
    image, _, tag = instructions[0].removeprefix("FROM ").partition(":")
    assert image == "apache/airflow"
    pyproject = tomllib.loads((ROOT / "pyproject.toml").read_text())
    [airflow] = [
        req for req in map(Requirement, pyproject["project"]["dependencies"]) if req.name == "apache-airflow"
    ]
    assert tag in airflow.specifier, (tag, str(airflow.specifier))
    # the image's Airflow is the newest stable release the tests run on (the main suite's; the supported
    # releases' tier runs the same tests on older ones, and on the newest release line's pre-release)
    running = Version(version("apache-airflow"))
    if Version(tag).release[:2] == running.release[:2]:
        assert tag == str(running), "the image's Airflow should be the one the tests run on"
    elif not running.is_prerelease:
        assert Version(tag) > running, (tag, str(running))

    copied: dict[str, Path] = {}  # source → destination folder
    for copy in (shlex.split(i)[1:] for i in instructions if i.startswith("COPY")):
        *sources, destination = [arg for arg in copy if not arg.startswith("--")]
        copied |= dict.fromkeys(sources, Path(destination))
    for needed in ("pyproject.toml", "README.md", "airflow_plan_provider"):
        assert needed in copied and (ROOT / needed).exists(), needed
    project_dir = str(copied["pyproject.toml"])
    assert copied["airflow_plan_provider"] == Path(project_dir, "airflow_plan_provider")
    [install] = [shlex.split(i.removeprefix("RUN ")) for i in instructions if "pip install" in i]
    assert project_dir.rstrip("/") in [arg.rstrip("/") for arg in install]
    assert "apache-airflow==${AIRFLOW_VERSION}" in install  # pip must not replace the image's Airflow
    [celery] = [Requirement(arg) for arg in install if arg.startswith("celery")]
    assert "5.7.0" not in celery.specifier and "5.6.3" in celery.specifier

    # .dockerignore keeps exactly what the COPY lines need in the build context.
    rules = [r for r in (ROOT / ".dockerignore").read_text().splitlines() if r and not r.startswith("#")]
    assert rules[0] == "*"
    assert {r[1:] for r in rules if r.startswith("!")} == {
        "pyproject.toml",
        "README.md",
        "airflow_plan_provider",
    }


# ------------------------------------------------------------------------------- the init script, run


@pytest.fixture
def init_run(tmp_path: Path):
    """Run airflow-init's script with ``/opt/airflow`` moved under ``tmp_path``; returns a runner."""
    home, stubs = tmp_path / "opt-airflow", tmp_path / "bin"
    stubs.mkdir()
    calls = tmp_path / "calls.txt"
    for tool in ("entrypoint", "chown"):  # the image's entrypoint; chown needs root
        (stubs / tool).write_text(f'#!/bin/sh\necho "{tool} $*" >> "{calls}"\n')
        (stubs / tool).chmod(0o755)
    (stubs / "python").symlink_to(sys.executable)
    script = SERVICES[INIT]["command"][-1]

    def run(dotenv_values: dict[str, str]) -> tuple[str, list[str]]:
        values = {"AIRFLOW_UID": str(os.getuid()), **dotenv_values}
        text = interpolate(script, values).replace("/entrypoint", str(stubs / "entrypoint"))
        environment = {
            k: interpolate(str(v), values).replace(AIRFLOW_HOME, str(home))
            for k, v in SERVICES[INIT]["environment"].items()
        }
        result = subprocess.run(
            ["bash", "-c", text.replace(AIRFLOW_HOME, str(home))],
            env={**environment, "PATH": f"{stubs}:{os.environ['PATH']}"},
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert result.returncode == 0, result.stderr
        recorded = calls.read_text().splitlines() if calls.exists() else []
        calls.unlink(missing_ok=True)
        return result.stdout, recorded

    return run, home


def test_the_init_script_generates_secrets_once_and_keeps_the_login(init_run) -> None:
    run, home = init_run
    out, calls = run({})
    assert calls[:2] == ["entrypoint airflow db migrate", "entrypoint airflow version"]
    assert calls[2] == f"chown -R {os.getuid()}:0 {home}/logs {home}/secrets {home}/plan_artifacts"
    secrets = {p.name: p.read_text() for p in (home / "secrets").iterdir()}
    assert set(secrets) == {
        "fernet_key",
        "api_secret_key",
        "jwt_secret",
        "simple_auth_manager_passwords.json",
    }
    for path in (home / "secrets").iterdir():
        assert stat.S_IMODE(path.stat().st_mode) == 0o600, path
    from cryptography.fernet import Fernet

    Fernet(secrets["fernet_key"].encode())  # a valid Fernet key
    assert len(secrets["jwt_secret"]) >= 64 and secrets["jwt_secret"] != secrets["api_secret_key"]
    [(user, password)] = json.loads(secrets["simple_auth_manager_passwords.json"]).items()
    assert user == "airflow" and len(password) >= 12
    assert f"UI login: user 'airflow', password '{password}'" in out
    assert (home / "plan_artifacts" / "reports").is_dir()

    # A second start keeps every secret and the password; a password set in .env replaces it.
    run({})
    assert {p.name: p.read_text() for p in (home / "secrets").iterdir()} == secrets
    out, _ = run({"_AIRFLOW_WWW_USER_PASSWORD": "chosen-in-dotenv"})
    assert json.loads((home / "secrets" / "simple_auth_manager_passwords.json").read_text()) == {
        "airflow": "chosen-in-dotenv"
    }
    assert (home / "secrets" / "jwt_secret").read_text() == secrets["jwt_secret"]
