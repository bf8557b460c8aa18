"""What the LLM planner reads back: a chat-completion HTTP body, decoded defensively.

The body is untrusted bytes. :func:`read_completion` turns every shape into a :class:`PlannerReply`
(the plan text for the validator, and the token counts it could read) or a :class:`MalformedReply`
naming what is wrong; parsing is linear, and nothing in the body is ever turned into text except the
strings it holds.
"""

from __future__ import annotations

import json
import logging
import re
from typing import Any

from airflow_plan_provider.planners.base import PlannerReply
from airflow_plan_provider.planners.llm_prompt import decode_reply, utf8_safe

log = logging.getLogger(__name__)

_FENCE_INFO = re.compile(r"[A-Za-z0-9_+-]*[ \t]*\n?")
_USAGE_KEYS = ("prompt_tokens", "completion_tokens")
_MAX_COUNT = 2**53  # a token count at or above this is nonsense, recorded as unknown
_EXCERPT = 4096  # bytes of a malformed body kept for its (redacted, cut) excerpt in the error


class MalformedReply(Exception):
    """A 200 reply that is no plan: not a chat completion (``what`` says why), or a refusal.

    ``text`` is the endpoint's own words (an excerpt of the body, or the refusal), not yet redacted;
    ``usage`` holds the token counts the reply did state, so they are not lost with it. Internal to
    the LLM planner: :meth:`LLMPlanner.plan` turns it into a :class:`PlanningError` with the key
    redacted, so it never reaches a caller.
    """

    def __init__(
        self, what: str, usage: dict[str, int] | None = None, *, text: str = "", refused: bool = False
    ) -> None:
        super().__init__(what)
        self.what = what
        self.usage = usage or {}
        self.text = text
        self.refused = refused


def strip_fence(text: str) -> str:
    """The content of the first ``` fenced block when the text is not bare JSON; else the text.

    Found with two ``str.find`` calls, so a reply full of unclosed fences costs linear time.
    """
    stripped = text.strip()
    if stripped.startswith(("{", "[")):
        return stripped
    start = stripped.find("```")
    if start < 0:
        return stripped
    info = _FENCE_INFO.match(stripped, start + 3)
    body = info.end() if info else start + 3
    end = stripped.find("```", body)
    return stripped[body:end].strip() if end >= 0 else stripped


_JSON_TYPES = {dict: "an object", list: "a list", str: "a string", bool: "a boolean", int: "a number"}


def _kind(value: Any) -> str:
    """What a decoded JSON value is, for messages: ``null``, ``a list``, ``an object``, ..."""
    return "null" if value is None else _JSON_TYPES.get(type(value), "a number")


def _count(value: Any) -> int | None:
    if isinstance(value, int) and not isinstance(value, bool) and 0 <= value < _MAX_COUNT:
        return value
    return None


def _usage(value: Any) -> dict[str, int]:
    """The token counts a reply states; a missing count, or one that is not a non-negative integer,
    is left out (unknown): the plan is never lost over its usage."""
    if value is None:
        return {}
    if not isinstance(value, dict):
        log.warning(
            "LLM planner: reply usage is not an object (it is %s); token counts unknown", _kind(value)
        )
        return {}
    usage: dict[str, int] = {}
    for name in _USAGE_KEYS:
        count = _count(value.get(name))
        if count is not None:
            usage[name] = count
        elif value.get(name) is not None:
            log.warning("LLM planner: reply usage.%s is not a token count; recorded as unknown", name)
    return usage


def _content_text(content: Any) -> str:
    """``message.content``: a string, null, or a list of ``{"type": "text", "text": ...}`` parts."""
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    if isinstance(content, list) and all(
        isinstance(part, dict) and isinstance(part.get("text", ""), str) for part in content
    ):
        return "".join(part.get("text", "") for part in content)
    raise MalformedReply(f"choices[0].message.content is not a string (it is {_kind(content)})")


def read_completion(body: bytes, content_type: str = "application/json") -> PlannerReply:
    """A chat-completion HTTP body (status 200) read defensively into a :class:`PlannerReply`.

    The plan text (``choices[0].message.content``, fence stripped, wire form decoded) goes to the
    validator as it is. Raises :class:`MalformedReply` naming what is wrong when the body is not a
    chat completion, or when the model refused (``refused``).
    """
    try:
        data = json.loads(body)
    except RecursionError:
        raise MalformedReply(
            f"reply is nested too deeply to be a chat completion ({len(body)} bytes)"
        ) from None
    except ValueError:  # JSONDecodeError, or bytes that are not UTF-8/16/32
        what = f"reply is not JSON ({content_type or 'no content type'}, {len(body)} bytes)"
        raise MalformedReply(what, text=body[:_EXCERPT].decode("utf-8", "replace")) from None
    if not isinstance(data, dict):
        raise MalformedReply(f"reply is not a JSON object (it is {_kind(data)})")
    usage = _usage(data.get("usage"))
    choices = data.get("choices")
    if not isinstance(choices, list):
        raise MalformedReply(f"choices is not a list (it is {_kind(choices)})", usage)
    if not choices:
        return PlannerReply(plan="", usage=usage)
    choice = choices[0]
    if not isinstance(choice, dict):
        raise MalformedReply(f"choices[0] is not an object (it is {_kind(choice)})", usage)
    message = choice.get("message")
    if not isinstance(message, dict):
        raise MalformedReply(f"choices[0].message is not an object (it is {_kind(message)})", usage)
    refusal = message.get("refusal")
    if isinstance(refusal, str) and refusal.strip():
        raise MalformedReply("the model refused to plan", usage, text=utf8_safe(refusal), refused=True)
    try:
        content = utf8_safe(_content_text(message.get("content")))
    except MalformedReply as error:
        raise MalformedReply(str(error), usage) from None
    return PlannerReply(plan=decode_reply(strip_fence(content)), usage=usage)
