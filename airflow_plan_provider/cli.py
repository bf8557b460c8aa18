"""``airflow-plan``: check, run and freeze plans from the command line, without Airflow.

::

    airflow-plan validate PLAN.json [--tools SPEC] [--max-nodes N] [--max-bytes N]
    airflow-plan freeze (PLAN.json | --api URL --source-dag DAG --source-run RUN [--token T | --user U])
                        --tools module:attr --dag-id ID --schedule SCHEDULE [--start-date YYYY-MM-DD]
                        [--param [NODE.]NAME=VALUE ...] [--approval risky|always|never] [-o FILE]
                        [--max-nodes N] [--max-depth N]
    airflow-plan run PLAN.json --tools SPEC [--planner SPEC [--max-replans N]] [--max-workers N]
                               [--max-steps N] [--json] [--max-nodes N] [--max-bytes N]
    airflow-plan tools SPEC [--json]

``validate`` exits with status 0 and ``{"layers": [...]}`` on stdout for a valid plan; 1 and one line per
problem on stderr (``code: message [nodes: ...] at path``) for an invalid one; 2 for a usage error, an
unreadable or too large file (over ``--max-bytes``, default 16 MiB) or tools that cannot be loaded (one
line naming the module and its error). ``-`` reads the plan from stdin. Without ``--tools`` only the plan's
structure is checked (tool names and params are not), and a last line on stderr says so.

``run`` validates the plan as ``validate`` does, runs it in this process on ``--max-workers`` threads
with the tools ``SPEC`` names (:mod:`airflow_plan_provider.local_runner`: the plan DAG's rules, no
Airflow) and prints the SessionResult (a summary, or with ``--json`` the JSON). With ``--planner`` a
failure or a replan request is answered by a replan, as a plan DAG's replan run does. Exit status 0 when
the session completed, 1 when it failed, 2 for bad input (an unreadable or invalid plan, tools or a
planner that cannot be loaded). A tools ``SPEC`` is ``module:attribute``, ``path/to/file.py:attribute``
or an installed entry-point name; a planner ``SPEC`` names a planner, or a class or function making one.

``--max-nodes`` and ``--max-depth`` default to :class:`~airflow_plan_provider.plan.validate.Limits`'s
defaults, the ones a plan DAG applies when built without ``limits=``: a plan these commands accept with
their defaults is one such a DAG accepts.

``validate --tools``, ``run`` and ``freeze`` ask a registry's sources for their tools first, as a plan
DAG's planning task does. ``tools`` lists the tools a DAG offers its planner, live: its Python and
connection tools, and the tools its sources (MCP servers) list now, each with where it comes from,
whether it needs approval and its params (``--json``: the argument schemas too). ``SPEC`` names a
registry (as ``--tools`` does) or a plan DAG (``dags/plan_over_mcp.py:plan_over_mcp``); a source that
cannot be listed is reported, and the exit status is 1. Its connections are read as Airflow reads them
(``AIRFLOW_CONN_<ID>``, the metadata database, a secrets backend).

``freeze`` writes a DAG file that runs a completed session's final plan on a schedule with no planner
call (:mod:`airflow_plan_provider.freeze`). The REST API token comes from ``--token`` or
``$AIRFLOW_PLAN_API_TOKEN``; or a user (``--user`` or ``$AIRFLOW_PLAN_API_USER``) logs in with
``$AIRFLOW_PLAN_API_PASSWORD``. Exit status 0 when written; 1 when the session or plan cannot be frozen
(not completed, invalid, a secret in its params; the reason on stderr); 2 for usage errors.

Everything written to the terminal has its control characters escaped (the escape character is printed
as the four characters ``\\x1b``): plan keys, ids and messages are untrusted text.
"""

from __future__ import annotations

import argparse
import contextlib
import importlib
import json
import os
import sys
import tempfile
from collections.abc import Callable, Sequence
from datetime import UTC, date, datetime
from typing import Any, BinaryIO

from airflow_plan_provider.exceptions import FreezeError, PlanValidationError
from airflow_plan_provider.freeze import (
    FrozenSource,
    ParamTemplate,
    SessionApi,
    apply_templates,
    render_dag_file,
    source_from_plan,
)
from airflow_plan_provider.local_runner import run_plan
from airflow_plan_provider.plan.approval import APPROVAL_MODES
from airflow_plan_provider.plan.budgets import Budgets
from airflow_plan_provider.plan.validate import Limits, validate_plan
from airflow_plan_provider.planners.base import Planner
from airflow_plan_provider.settings import NodeExecution
from airflow_plan_provider.tools.registry import ToolRegistry, import_spec, load_tools

EXIT_OK = 0
EXIT_INVALID = 1
EXIT_FAILED = 1  # run: the session failed
EXIT_USAGE = 2

DEFAULT_MAX_BYTES = 16 * 1024 * 1024
_READ_CHUNK = 64 * 1024
STRUCTURE_ONLY_NOTE = (
    "airflow-plan: no --tools given: checked the plan's structure only, not its tools or params"
)


def printable(text: str) -> str:
    """``text`` with every character that is not printable escaped as Python writes it (``\\x1b``,
    ``\\n``, ``\\u202e``): C0/C1 controls, DEL, format characters such as bidirectional overrides,
    line/paragraph separators, lone surrogates."""
    if text.isprintable():
        return text
    return "".join(c if c.isprintable() else c.encode("unicode_escape").decode("ascii") for c in text)


def _int_at_least(minimum: int) -> Callable[[str], int]:
    """An argparse type: an integer of at least ``minimum``, else an error naming the text."""

    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{text!r} is not an integer") from None
        if value < minimum:
            raise argparse.ArgumentTypeError(f"{text!r} must be at least {minimum}")
        return value

    return parse


_positive_int = _int_at_least(1)
_non_negative_int = _int_at_least(0)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="airflow-plan", description="Work with plans outside Airflow.")
    commands = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)
    validate = commands.add_parser(
        "validate",
        help="check a plan and print its layers",
        description="Check a plan; print its layers as JSON, or every problem found (exit status 1).",
    )
    validate.add_argument("plan", metavar="PLAN", help="plan JSON file, or - for stdin")
    validate.add_argument(
        "--tools",
        metavar="SPEC",
        help="tool registry as module:attribute, path/to/file.py:attribute or an installed entry-point "
        "name; when given, unknown tools and bad params are problems (without it tools are not checked)",
    )
    _add_plan_limits(validate)
    _add_freeze(commands)
    _add_run(commands)
    tools = commands.add_parser(
        "tools",
        help="list a DAG's tools live, with where each comes from and its params",
        description="List the tools a plan DAG (or a registry) offers its planner; its MCP servers are "
        "asked now.",
    )
    tools.add_argument(
        "spec", metavar="SPEC", help="a registry or a plan DAG, as module:attr or file.py:attr"
    )
    tools.add_argument("--json", action="store_true", help="print JSON, with each tool's argument schema")
    return parser


def _add_plan_limits(command: argparse.ArgumentParser) -> None:
    """The limits a plan is validated with, and the most bytes of it read."""
    defaults = Limits()
    command.add_argument(
        "--max-nodes", type=_positive_int, default=defaults.max_nodes, help="default: %(default)s"
    )
    _add_max_bytes(command)


def _add_max_bytes(command: argparse.ArgumentParser) -> None:
    command.add_argument(
        "--max-bytes",
        type=_positive_int,
        default=DEFAULT_MAX_BYTES,
        help="read at most this many bytes of PLAN; default: %(default)s (16 MiB)",
    )


def _limits(args: argparse.Namespace) -> Limits:
    return Limits(max_nodes=args.max_nodes)


TOKEN_ENV = "AIRFLOW_PLAN_API_TOKEN"
USER_ENV = "AIRFLOW_PLAN_API_USER"
PASSWORD_ENV = "AIRFLOW_PLAN_API_PASSWORD"


def _add_freeze(commands: Any) -> None:
    freeze = commands.add_parser(
        "freeze",
        help="write a DAG file that runs a finished session's plan on a schedule",
        description="Write a readable DAG file that runs a completed session's final plan (read through "
        "Airflow's REST API, or from a plan file) on a schedule, with no planner call.",
    )
    freeze.add_argument("plan", nargs="?", metavar="PLAN", help="plan JSON file (or -); or use --api")
    freeze.add_argument("--api", metavar="URL", help="Airflow's base URL, e.g. http://localhost:8080")
    freeze.add_argument("--source-dag", metavar="DAG_ID", help="the session's DAG (with --api)")
    freeze.add_argument("--source-run", metavar="RUN_ID", help="a run of the session (with --api)")
    freeze.add_argument("--token", help=f"API bearer token; default: ${TOKEN_ENV}")
    freeze.add_argument("--user", help=f"API user (password from ${PASSWORD_ENV}); default: ${USER_ENV}")
    freeze.add_argument("--tools", required=True, metavar="SPEC", help="the tools, as module:attribute")
    freeze.add_argument("--dag-id", required=True, help="the new DAG's id")
    freeze.add_argument("--schedule", required=True, help="a cron expression or preset such as @daily")
    freeze.add_argument(
        "--start-date", type=_iso_date, default=None, metavar="YYYY-MM-DD", help="default: today (UTC)"
    )
    freeze.add_argument(
        "--param",
        action="append",
        default=[],
        metavar="[NODE.]NAME=VALUE",
        help="replace a param (of NODE, else of every node that has it), e.g. day='{{ ds }}'; repeatable",
    )
    freeze.add_argument("--approval", choices=APPROVAL_MODES, help="approval mode of the new DAG")
    freeze.add_argument("-o", "--output", metavar="FILE", help="write here (default: stdout)")
    _add_plan_limits(freeze)


def _add_run(commands: Any) -> None:
    run = commands.add_parser(
        "run",
        help="run a plan in this process with a tool registry, and print its SessionResult",
        description="Validate a plan, run it here on a thread pool (each node starts when its own parents "
        "finish, by the rules of the plan DAG's node tasks) and print the SessionResult. Exit status 0 "
        "when the session completed, 1 when it failed, 2 for bad input.",
    )
    run.add_argument("plan", metavar="PLAN", help="plan JSON file, or - for stdin")
    run.add_argument(
        "--tools",
        required=True,
        metavar="SPEC",
        help="tool registry as module:attribute, path/to/file.py:attribute or an installed entry-point name",
    )
    run.add_argument(
        "--max-workers",
        type=_positive_int,
        default=NodeExecution().max_active_nodes,
        help="nodes running at once (NodeExecution.max_active_nodes); default: %(default)s",
    )
    run.add_argument(
        "--max-steps",
        type=_positive_int,
        default=Budgets().max_steps,
        help="node executions allowed; default: %(default)s",
    )
    run.add_argument(
        "--planner",
        metavar="SPEC",
        help="a planner (or a function returning one) as module:attribute or path/to/file.py:attribute; "
        "with it, a failure or a replan request is answered by a replan (without it the plan runs as given)",
    )
    run.add_argument(
        "--max-replans",
        type=_non_negative_int,
        default=Budgets().max_replans,
        help="with --planner; default: %(default)s",
    )
    run.add_argument("--json", action="store_true", help="print the SessionResult as JSON")
    _add_plan_limits(run)


def _run(args: argparse.Namespace) -> int:
    raw = _plan_bytes(args)
    if isinstance(raw, int):
        return raw
    tools = _tools(args.tools)
    if isinstance(tools, int):
        return tools
    planner = _planner(args.planner) if args.planner else None
    if isinstance(planner, int):
        return planner
    try:
        plan = validate_plan(raw, tools, _limits(args))
    except PlanValidationError as error:
        _say("airflow-plan: the plan is invalid; nothing ran:")
        for problem in error.problems:
            _say(str(problem))
        return EXIT_USAGE
    result = run_plan(
        plan,
        tools,
        planner=planner,
        budgets=Budgets(max_steps=args.max_steps, max_replans=args.max_replans),
        limits=_limits(args),
        execution=NodeExecution(max_active_nodes=args.max_workers),
    )
    if args.json:
        print(json.dumps(result.model_dump(mode="json"), indent=2))  # ASCII: every control escaped
    else:
        print("\n".join(printable(line) for line in result.summary_text().splitlines()))
    return EXIT_OK if result.status == "completed" else EXIT_FAILED


def _iso_date(text: str) -> date:
    try:
        return date.fromisoformat(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a date (YYYY-MM-DD)") from None


def _freeze_source(args: argparse.Namespace) -> FrozenSource | int:
    if args.api:
        if args.plan or not (args.source_dag and args.source_run):
            return _fail("freeze: give PLAN, or --api with --source-dag and --source-run")
        api = SessionApi(
            args.api,
            token=args.token or os.environ.get(TOKEN_ENV) or None,
            user=args.user or os.environ.get(USER_ENV) or None,
            password=os.environ.get(PASSWORD_ENV),
        )
        return api.session(args.source_dag, args.source_run)
    if not args.plan:
        return _fail("freeze: give PLAN, or --api with --source-dag and --source-run")
    raw = _plan_bytes(args)
    if isinstance(raw, int):
        return raw
    return source_from_plan(raw, "stdin" if args.plan == "-" else os.path.basename(args.plan))


def _freeze(args: argparse.Namespace) -> int:
    tools = _tools(args.tools)
    if isinstance(tools, int):
        return tools
    try:
        templates = [ParamTemplate.parse(text) for text in args.param]
        source = _freeze_source(args)
        if isinstance(source, int):
            return source
        text = render_dag_file(  # refuses secrets first: the checks below never see one
            source,
            dag_id=args.dag_id,
            tools=args.tools,
            schedule=args.schedule,
            start_date=args.start_date or datetime.now(UTC).date(),
            templates=templates,
            approval=args.approval,
            import_tools=_is_registry_attribute(args.tools),
            limits=_limits(args),
        )
        validate_plan(apply_templates(source.plan, templates), tools, _limits(args))  # as every run will
    except PlanValidationError as error:
        _say("airflow-plan: the frozen plan is invalid:")
        for problem in error.problems:
            _say(str(problem))
        return EXIT_INVALID
    except FreezeError as error:
        _say(f"airflow-plan: cannot freeze: {error}")
        return EXIT_INVALID
    if not args.output:
        sys.stdout.write(text)
        return EXIT_OK
    try:
        _write_atomically(args.output, text)
    except OSError as error:
        return _fail(f"cannot write {args.output}: {error.strerror or error}")
    _say(f"airflow-plan: wrote DAG {args.dag_id} to {args.output}")
    return EXIT_OK


def _is_registry_attribute(spec: str) -> bool:
    """Whether ``spec`` is ``module:attribute`` naming a registry itself (then the DAG file imports it)."""
    module, _, attribute = spec.partition(":")
    if not attribute:
        return False
    try:
        return isinstance(getattr(importlib.import_module(module), attribute, None), ToolRegistry)
    except (Exception, SystemExit):
        return False


def _write_atomically(path: str, text: str) -> None:
    directory = os.path.dirname(os.path.abspath(path))
    fd, tmp = tempfile.mkstemp(prefix=".freeze.", suffix=".py.tmp", dir=directory)
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as handle:
            handle.write(text)
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise


def _say(message: str) -> None:
    print(printable(message), file=sys.stderr)


def _fail(message: str) -> int:
    _say(f"airflow-plan: {message}")
    return EXIT_USAGE


class _TooLarge(Exception):
    pass


def _read_bounded(handle: BinaryIO, limit: int) -> bytes:
    """At most ``limit`` bytes, read by chunks; :class:`_TooLarge` when there is more (an endless
    source such as /dev/zero stops after ``limit + 1`` bytes)."""
    chunks: list[bytes] = []
    size = 0
    while size <= limit:
        chunk = handle.read(min(_READ_CHUNK, limit + 1 - size))
        if not chunk:
            break
        chunks.append(chunk)
        size += len(chunk)
    if size > limit:
        raise _TooLarge
    return b"".join(chunks)


def _read_plan(source: str, limit: int) -> bytes:
    if source == "-":
        return _read_bounded(sys.stdin.buffer, limit)
    with open(source, "rb") as handle:
        return _read_bounded(handle, limit)


def _plan_bytes(args: argparse.Namespace) -> bytes | int:
    """The bytes of ``args.plan`` (at most ``args.max_bytes``), or the exit status after saying why not."""
    name = "stdin" if args.plan == "-" else args.plan
    try:
        return _read_plan(args.plan, args.max_bytes)
    except _TooLarge:
        return _fail(f"{name} is larger than --max-bytes ({args.max_bytes} bytes); not validated")
    except OSError as error:
        return _fail(f"cannot read {name}: {error.strerror or error}")


def _tools(spec: str) -> ToolRegistry | int:
    """The registry ``spec`` names, with the tools its sources list now, or the exit status after one
    line saying why it cannot be loaded (or a source listed)."""
    try:
        registry = load_tools(spec)
        return registry.listed()[0] if registry.sources else registry
    except (Exception, SystemExit) as error:  # a tool module may raise anything: one line, no traceback
        # load_tools's ImportError already names the module and the error it raised
        detail = str(error) if isinstance(error, ImportError) else f"{type(error).__name__}: {error}"
        return _fail(f"cannot load tools {spec!r}: {detail}")


def _list_tools(args: argparse.Namespace) -> int:
    """``airflow-plan tools``: the tools of a registry or plan DAG, listed now."""
    from airflow_plan_provider.tools.catalog import tools_table

    try:
        target = import_spec(args.spec) if ":" in args.spec else load_tools(args.spec)
        registry = load_tools(getattr(_planning_task(target), "tools", None)) if _is_dag(target) else target
        registry = load_tools(registry)
    except (Exception, SystemExit) as error:
        return _fail(f"cannot load tools {args.spec!r}: {type(error).__name__}: {error}")
    listed, listing = registry.listed(strict=False)
    rows = tools_table(listed)
    if args.json:
        print(json.dumps({"tools": rows, "sources": listing.summary()}, indent=2, default=str))
    else:
        for row in rows:
            risky = " (needs approval)" if row["needs_approval"] else ""
            print(printable(f"{row['name']}({row['params']})  [{row['origin']}]{risky}"))
            if row["description"]:
                print(printable(f"    {row['description']}"))
    for source in listing.sources:
        if source.error:
            _say(f"airflow-plan: tool source {source.source} not listed: {source.error}")
        elif source.skipped:
            _say(
                f"airflow-plan: tool source {source.source}: {len(source.skipped)} tool(s) left out, "
                f"first: {source.skipped[0]}"
            )
    return EXIT_FAILED if any(source.error for source in listing.sources) else EXIT_OK


def _is_dag(value: Any) -> bool:
    return hasattr(value, "task_dict") and hasattr(value, "dag_id")


def _planning_task(dag: Any) -> Any:
    """The planning task of a plan DAG (the task carrying its planner and tools)."""
    for task in dag.task_dict.values():
        if hasattr(task, "planner") and hasattr(task, "tools"):
            return task
    raise ValueError(f"DAG {dag.dag_id!r} has no planning task: it was not built by build_plan_dag")


def _planner(spec: str) -> Planner | int:
    """The planner ``spec`` names (called when it names a class or a function), or the exit status after
    one line saying why it cannot be loaded."""
    try:
        planner = import_spec(spec)
        if isinstance(planner, type) or (callable(planner) and not isinstance(planner, Planner)):
            planner = planner()
    except (Exception, SystemExit) as error:  # a planner module may raise anything: one line
        detail = str(error) if isinstance(error, ImportError) else f"{type(error).__name__}: {error}"
        return _fail(f"cannot load planner {spec!r}: {detail}")
    if not isinstance(planner, Planner):
        return _fail(f"planner {spec!r} is not a planner (no plan method): {type(planner).__name__}")
    return planner


def _validate(args: argparse.Namespace) -> int:
    raw = _plan_bytes(args)
    if isinstance(raw, int):
        return raw
    tools: ToolRegistry | None = None
    if args.tools:
        loaded = _tools(args.tools)
        if isinstance(loaded, int):
            return loaded
        tools = loaded
    status = EXIT_OK
    try:
        plan = validate_plan(raw, tools, _limits(args))
    except PlanValidationError as error:
        for problem in error.problems:
            _say(str(problem))  # one line per problem: newlines are escaped too
        status = EXIT_INVALID
    else:
        print(json.dumps({"layers": plan.layers}))
    if tools is None:
        _say(STRUCTURE_ONLY_NOTE)
    return status


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    if args.command == "validate":
        return _validate(args)
    if args.command == "freeze":
        return _freeze(args)
    if args.command == "tools":
        return _list_tools(args)
    if args.command == "run":
        return _run(args)
    return _fail(f"unknown command {args.command!r}")  # pragma: no cover - argparse rejects it first


if __name__ == "__main__":
    sys.exit(main())
