"""Measurement probe of ``bench/node_tax.py``, loaded by every process of its cluster (this folder is on
their ``PYTHONPATH``) and active only when ``PLAN_BENCH_TAX_LOG`` names a file. It changes no behaviour;
it appends one JSON line to that file for:

- every task process a worker supervises (``supervise_task``): wall start and end, the supervisor's own
  CPU seconds and the task process's (the worker's reaped-children CPU, which the task process adds when
  it exits), and the task instance;
- every DAG file parse in a task process (``task_runner.parse``): wall and CPU milliseconds, modules
  imported;
- every request to the execution API (``httpx.Client.send`` of a path under ``/execution/``): the process,
  the task instance being supervised (if any), method, path, status and bytes each way (a request
  answered 404, which Airflow's client raises for, included: a look for a key that is not there).

With ``PLAN_BENCH_PROFILE_SCHEDULER`` it also profiles the scheduler's loop (see ``patch_scheduler``).

The patches are installed when their module is first imported (a finder on ``sys.meta_path``), so no
process imports anything it would not have imported anyway.
"""

from __future__ import annotations

import os

_LOG = os.environ.get("PLAN_BENCH_TAX_LOG")


def _install() -> None:
    import importlib.abc
    import json
    import resource
    import sys
    import time

    current: dict[str, object] = {}

    def write(record: dict[str, object]) -> None:
        line = json.dumps(record, default=str, separators=(",", ":")) + "\n"
        fd = os.open(_LOG, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)  # type: ignore[arg-type]
        try:
            os.write(fd, line.encode())
        finally:
            os.close(fd)

    def cpu(who: int) -> float:
        usage = resource.getrusage(who)
        return usage.ru_utime + usage.ru_stime

    def ti_of(ti: object) -> dict[str, object]:
        return {k: getattr(ti, k, None) for k in ("dag_id", "run_id", "task_id", "map_index", "try_number")}

    def patch_supervisor(module: object) -> None:
        original = module.supervise_task  # type: ignore[attr-defined]

        def supervise_task(**kwargs: object) -> int:
            ti = ti_of(kwargs.get("ti"))
            current.clear()
            current.update(ti)
            t0, self0, kids0 = time.time(), cpu(resource.RUSAGE_SELF), cpu(resource.RUSAGE_CHILDREN)
            try:
                return original(**kwargs)
            finally:
                t1, self1, kids1 = time.time(), cpu(resource.RUSAGE_SELF), cpu(resource.RUSAGE_CHILDREN)
                current.clear()
                write(
                    {
                        "kind": "process",
                        **ti,
                        "t0": t0,
                        "t1": t1,
                        "supervisor_cpu": self1 - self0,
                        "task_cpu": kids1 - kids0,
                        "pid": os.getpid(),
                    }
                )

        module.supervise_task = supervise_task  # type: ignore[attr-defined]

    def patch_task_runner(module: object) -> None:
        original = module.parse  # type: ignore[attr-defined]

        def parse(what: object, log: object) -> object:
            before, t0, c0 = len(sys.modules), time.perf_counter(), time.process_time()
            try:
                return original(what, log)
            finally:
                write(
                    {
                        "kind": "parse",
                        **ti_of(getattr(what, "ti", None)),
                        "ms": (time.perf_counter() - t0) * 1000,
                        "cpu_ms": (time.process_time() - c0) * 1000,
                        "modules": len(sys.modules) - before,
                        "file": str(getattr(what, "dag_rel_path", "")),
                    }
                )

        module.parse = parse  # type: ignore[attr-defined]

        folder = os.environ.get("PLAN_BENCH_PROFILE")
        if folder:
            original_main = module.main  # type: ignore[attr-defined]

            def main() -> object:
                import cProfile

                profile = cProfile.Profile(time.process_time)
                profile.enable()
                try:
                    return original_main()
                finally:
                    profile.disable()
                    name = f"{current.get('dag_id')}.{current.get('task_id')}.{current.get('map_index')}"
                    profile.dump_stats(f"{folder}/{name}.{os.getpid()}.prof")

            module.main = main  # type: ignore[attr-defined]

    def patch_httpx(module: object) -> None:
        client = module.Client  # type: ignore[attr-defined]
        original = client.send

        def send(self: object, request: object, *args: object, **kwargs: object) -> object:
            url = request.url  # type: ignore[attr-defined]
            response: object = None
            try:
                response = original(self, request, *args, **kwargs)
                return response
            except Exception as error:  # the client's hook raises for a 4xx / 5xx answer (a 404 too)
                response = getattr(error, "response", None)
                raise
            finally:
                if "/execution/" in url.path:
                    try:
                        received = len(response.content)  # type: ignore[attr-defined]
                    except Exception:  # a streamed response: its length as announced
                        headers = getattr(response, "headers", None) or {}
                        received = int(headers.get("content-length") or 0)
                    write(
                        {
                            "kind": "request",
                            "t": time.time(),
                            "pid": os.getpid(),
                            "proc": " ".join(sys.argv[1:3])[:40],
                            "ti": dict(current) or None,
                            "method": request.method,  # type: ignore[attr-defined]
                            "path": url.path,
                            "query": url.query.decode()[:300],
                            "status": getattr(response, "status_code", None),
                            "sent": len(request.content or b""),  # type: ignore[attr-defined]
                            "received": received,
                        }
                    )

        client.send = send

    def patch_scheduler(module: object) -> None:
        """With ``PLAN_BENCH_PROFILE_SCHEDULER`` (a folder): a cProfile (CPU time) of the scheduler's
        ``_do_scheduling``, cut where the benchmark asks: after a loop, a file ``cut`` in the folder names
        the profile to write (``-``: discard), and a new profile starts."""
        folder = os.environ.get("PLAN_BENCH_PROFILE_SCHEDULER")
        if not folder:
            return
        import cProfile

        runner = module.SchedulerJobRunner  # type: ignore[attr-defined]
        original = runner._do_scheduling
        profile = [cProfile.Profile(time.process_time)]
        cut = os.path.join(folder, "cut")

        def _do_scheduling(self: object, session: object) -> object:
            profile[0].enable()
            try:
                return original(self, session)
            finally:
                profile[0].disable()
                if os.path.exists(cut):
                    with open(cut) as named:
                        name = named.read().strip()
                    os.unlink(cut)
                    if name != "-":
                        profile[0].dump_stats(os.path.join(folder, f"{name}.prof"))
                    profile[0] = cProfile.Profile(time.process_time)

        runner._do_scheduling = _do_scheduling

    patches = {
        "airflow.jobs.scheduler_job_runner": patch_scheduler,
        "airflow.sdk.execution_time.supervisor": patch_supervisor,
        "airflow.sdk.execution_time.task_runner": patch_task_runner,
        "httpx": patch_httpx,
    }

    class Loader(importlib.abc.Loader):
        def __init__(self, inner: importlib.abc.Loader, name: str) -> None:
            self.inner, self.name = inner, name

        def create_module(self, spec):  # type: ignore[no-untyped-def]
            return self.inner.create_module(spec)

        def exec_module(self, module):  # type: ignore[no-untyped-def]
            self.inner.exec_module(module)
            patches[self.name](module)

    class Finder(importlib.abc.MetaPathFinder):
        def find_spec(self, name, path, target=None):  # type: ignore[no-untyped-def]
            if name not in patches:
                return None
            for finder in sys.meta_path:
                if finder is self or not hasattr(finder, "find_spec"):
                    continue
                spec = finder.find_spec(name, path, target)
                if spec is not None and spec.loader is not None:
                    spec.loader = Loader(spec.loader, name)
                    return spec
            return None

    sys.meta_path.insert(0, Finder())


if _LOG:
    _install()
