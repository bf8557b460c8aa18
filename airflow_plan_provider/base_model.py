"""The base of the package's pydantic models: each builds its validator and serializer when first used,
not when its module is imported.

A node task imports the whole package when it parses its DAG file, yet validates only the few records
it reads and writes (the plan, the run's context, node records); the schemas of the others (the
session, its result, approvals, replan records) would be built for nothing in every task process.
"""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict


class Model(BaseModel):
    """A pydantic model whose schema is built on first use (``defer_build``); a subclass's own
    ``model_config`` is merged with this one."""

    model_config = ConfigDict(defer_build=True)
