"""``airflow-plan``: check plans from the command line, without Airflow.

::

    airflow-plan validate PLAN.json [--tools module:attr|entry-point-name] [--max-nodes N] [--max-depth N]
                                    [--max-bytes N]

Exit status: 0 and ``{"layers": [...]}`` on stdout for a valid plan; 1 and one line per problem on
stderr (``code: message [nodes: ...] at path``) for an invalid one; 2 for a usage error, an unreadable
or too large file (over ``--max-bytes``, default 16 MiB) or tools that cannot be loaded (one line
naming the module and its error). ``-`` reads the plan from stdin. Without ``--tools`` only the plan's
structure is checked (tool names and params are not), and a last line on stderr says so.

Everything written to the terminal has its control characters escaped (the escape character is printed
as the four characters ``\\x1b``): plan keys, ids and messages are untrusted text.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Sequence
from typing import BinaryIO

from airflow_plan_provider.exceptions import PlanValidationError
from airflow_plan_provider.plan.validate import Limits, validate_plan
from airflow_plan_provider.tools.registry import ToolRegistry, load_tools

EXIT_OK = 0
EXIT_INVALID = 1
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
    validate.add_argument(
        "--max-bytes",
        type=_positive_int,
        default=DEFAULT_MAX_BYTES,
        help="read at most this many bytes of PLAN; default: %(default)s (16 MiB)",
    )
    return parser


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


def _validate(args: argparse.Namespace) -> int:
    name = "stdin" if args.plan == "-" else args.plan
    try:
        raw = _read_plan(args.plan, args.max_bytes)
    except _TooLarge:
        return _fail(f"{name} is larger than --max-bytes ({args.max_bytes} bytes); not validated")
    except OSError as error:
        return _fail(f"cannot read {name}: {error.strerror or error}")
    tools: ToolRegistry | None = None
    if args.tools:
        try:
            tools = load_tools(args.tools)
        except (Exception, SystemExit) as error:  # a tool module may raise anything: one line, no traceback
            # load_tools's ImportError already names the module and the error it raised
            detail = str(error) if isinstance(error, ImportError) else f"{type(error).__name__}: {error}"
            return _fail(f"cannot load tools {args.tools!r}: {detail}")
    status = EXIT_OK
    try:
        plan = validate_plan(raw, tools, Limits(max_nodes=args.max_nodes, max_depth=args.max_depth))
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
    return _fail(f"unknown command {args.command!r}")  # pragma: no cover - argparse rejects it first


if __name__ == "__main__":
    sys.exit(main())
