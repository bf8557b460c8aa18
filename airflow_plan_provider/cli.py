"""``airflow-plan``: check plans from the command line, without Airflow.

::

    airflow-plan validate PLAN.json [--tools module:attr|entry-point-name] [--max-nodes N] [--max-depth N]

Exit status: 0 and ``{"layers": [...]}`` on stdout for a valid plan; 1 and one line per problem on
stderr (``code: message [nodes: ...] at path``) for an invalid one; 2 for a usage error, an unreadable
file or tools that cannot be loaded. ``-`` reads the plan from stdin.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Sequence

from airflow_plan_provider.exceptions import PlanValidationError
from airflow_plan_provider.plan.validate import Limits, validate_plan
from airflow_plan_provider.tools.registry import ToolRegistry, load_tools

EXIT_OK = 0
EXIT_INVALID = 1
EXIT_USAGE = 2


def _positive_int(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not an integer") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"{text!r} must be at least 1")
    return value


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="airflow-plan", description="Work with plans outside Airflow.")
    commands = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)
    defaults = Limits()
    validate = commands.add_parser(
        "validate",
        help="check a plan and print its layers",
        description="Check a plan; print its layers as JSON, or every problem found (exit status 1).",
    )
    validate.add_argument("plan", metavar="PLAN", help="plan JSON file, or - for stdin")
    validate.add_argument(
        "--tools",
        metavar="SPEC",
        help="tool registry as module:attribute or an installed entry-point name; "
        "when given, unknown tools and bad params are problems (without it tools are not checked)",
    )
    validate.add_argument(
        "--max-nodes", type=_positive_int, default=defaults.max_nodes, help="default: %(default)s"
    )
    validate.add_argument(
        "--max-depth",
        type=_positive_int,
        default=defaults.max_depth,
        help="most layers; default: %(default)s",
    )
    return parser


def _fail(message: str) -> int:
    print(f"airflow-plan: {message}", file=sys.stderr)
    return EXIT_USAGE


def _read_plan(source: str) -> bytes:
    if source == "-":
        return sys.stdin.buffer.read()
    with open(source, "rb") as handle:
        return handle.read()


def _validate(args: argparse.Namespace) -> int:
    try:
        raw = _read_plan(args.plan)
    except OSError as error:
        return _fail(f"cannot read {args.plan}: {error.strerror or error}")
    tools: ToolRegistry | None = None
    if args.tools:
        try:
            tools = load_tools(args.tools)
        except (ImportError, AttributeError, LookupError, TypeError, ValueError) as error:
            return _fail(f"cannot load tools {args.tools!r}: {error}")
    try:
        plan = validate_plan(raw, tools, Limits(max_nodes=args.max_nodes, max_depth=args.max_depth))
    except PlanValidationError as error:
        for problem in error.problems:
            print(str(problem).replace("\n", "\\n"), file=sys.stderr)  # one line per problem
        return EXIT_INVALID
    print(json.dumps({"layers": plan.layers}))
    return EXIT_OK


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    if args.command == "validate":
        return _validate(args)
    return _fail(f"unknown command {args.command!r}")  # pragma: no cover - argparse rejects it first


if __name__ == "__main__":
    sys.exit(main())
