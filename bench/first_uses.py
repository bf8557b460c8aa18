"""What a plan DAG's task process pays the first time it does what every node does, in a process forked
from one that preloaded the provider (as a Celery worker's or a LocalExecutor's task processes are), side
by side with the way the provider avoids it.

Each figure is the median CPU time (``time.process_time``) of ``--repeat`` forked children doing, once:

- **checkpoints**: what a node with two parents does with the artifact store on a ``file://`` store: look
  for its own checkpoint (none), read its two parents' checkpoints of this run, save its own. Through
  ``ObjectStoragePath`` (each process sets up fsspec's local file system and Airflow's hook lineage on its
  first open) against the ``os`` module (``artifacts._local_file``, what the provider does);
- **label renders**: Airflow rendering a node's ``map_index_template`` before and after ``execute`` (two
  compiles with a DAG's Jinja environment), in children of a parent that preloaded the modules only
  against a parent that also ran ``preload.first_uses`` (Jinja's lexer built once);
- **params**: Airflow validating the plan DAG's trigger-form params as its task runner does, twice per
  task (``process_params``), with and without ``first_uses`` in the parent (``jsonschema``'s validators
  built once).

Run::

    .venv/bin/python bench/first_uses.py [--repeat 21]
"""

from __future__ import annotations

import argparse
import gc
import os
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

os.environ.setdefault("AIRFLOW_HOME", tempfile.mkdtemp(prefix="first-uses-"))


def forked_cpu_ms(work: Callable[[], None], repeat: int) -> float:
    """Median CPU milliseconds ``work`` takes in a child forked from this process."""
    spent = []
    for _ in range(repeat):
        read, write = os.pipe()
        pid = os.fork()
        if pid == 0:  # the child: measure, report, leave without the parent's exit handlers
            os.close(read)
            started = time.process_time()
            work()
            os.write(write, repr((time.process_time() - started) * 1000).encode())
            os._exit(0)
        os.close(write)
        os.waitpid(pid, 0)
        with os.fdopen(read) as answer:
            spent.append(float(answer.read()))
    return statistics.median(spent)


def in_parent(prepare: Callable[[], None], work: Callable[[], None], repeat: int) -> float:
    """``forked_cpu_ms`` of ``work`` in children of a parent (forked from this process) that ran
    ``prepare`` and froze its objects, as the provider's preload does."""
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:
        os.close(read)
        prepare()
        gc.freeze()
        os.write(write, repr(forked_cpu_ms(work, repeat)).encode())
        os._exit(0)
    os.close(write)
    os.waitpid(pid, 0)
    with os.fdopen(read) as answer:
        return float(answer.read())


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--repeat", type=int, default=21, help="forked children per figure (median)")
    args = parser.parse_args()

    import airflow.sdk.execution_time.task_runner  # noqa: F401  what a worker holds when it forks
    from airflow.providers.standard.operators.empty import EmptyOperator
    from airflow.sdk import DAG
    from airflow.sdk.definitions.param import process_params

    from airflow_plan_provider import artifacts, preload
    from airflow_plan_provider.dag_factory import MAP_INDEX_TEMPLATE, plan_params

    for name in preload.TASK_MODULES:  # the preload's imports, without its first uses
        __import__(name)
    preload.build_validators()

    store = f"file://{tempfile.mkdtemp(prefix='first-uses-store-')}"
    for parent in ("a", "b"):
        artifacts.save_checkpoint(f"parent-{parent}", {"run_id": "run", "output": parent}, store)
    with DAG("first_uses", schedule=None, params=plan_params("a goal")) as dag:
        task = EmptyOperator(task_id="a_task")

    def checkpoints() -> None:
        artifacts.load_checkpoint("this node", store)
        artifacts.checkpoint_of_run("parent-a", "run", store)
        artifacts.checkpoint_of_run("parent-b", "run", store)
        artifacts.save_checkpoint(f"this node {os.getpid()}", {"run_id": "run", "output": 1}, store)

    def through_object_storage_path() -> None:
        local = artifacts._local_file
        artifacts._local_file = lambda uri: None  # type: ignore[assignment]  # every file through _path
        try:
            checkpoints()
        finally:
            artifacts._local_file = local  # type: ignore[assignment]

    class Task:
        instance_label = "n1 · a node"

    def renders() -> None:
        for _ in range(2):
            dag.get_template_env().from_string(MAP_INDEX_TEMPLATE).render(task=Task())

    def params() -> None:
        for _ in range(2):
            process_params(dag, task, {"goal": "a goal", "plan_file": "x"}, suppress_exception=False)

    def nothing() -> None:
        pass

    rows = [
        (
            "checkpoints (own look, 2 parents, save)",
            in_parent(nothing, through_object_storage_path, args.repeat),
            in_parent(nothing, checkpoints, args.repeat),
            "ObjectStoragePath",
            "os module",
        ),
        (
            "label renders (2)",
            in_parent(nothing, renders, args.repeat),
            in_parent(preload.first_uses, renders, args.repeat),
            "cold",
            "first_uses",
        ),
        (
            "trigger-form params (process_params x 2)",
            in_parent(nothing, params, args.repeat),
            in_parent(preload.first_uses, params, args.repeat),
            "cold",
            "first_uses",
        ),
    ]
    print(f"\nCPU ms in a forked task-like process, medians of {args.repeat} children")
    print(f"  {'':<44}{'before':>10}{'after':>10}{'after/before':>14}   (before → after)")
    for label, before, after, was, now in rows:
        print(f"  {label:<44}{before:>10.2f}{after:>10.2f}{after / before:>14.2f}   ({was} → {now})")
    total_before, total_after = sum(r[1] for r in rows), sum(r[2] for r in rows)
    print(f"  {'together':<44}{total_before:>10.2f}{total_after:>10.2f}{total_after / total_before:>14.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
