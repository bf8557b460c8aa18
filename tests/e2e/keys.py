"""Random values that the end-to-end conftest and the test modules must see as one.

Pytest imports ``tests/e2e/conftest.py`` as ``conftest`` while the modules import it as
``tests.e2e.conftest``: two module objects, so a random value made there would differ between the cluster
a fixture starts and the test that checks it. A value made here is made once per test process.
"""

from __future__ import annotations

import secrets

#: The key of the shared cluster's ``plan_llm_default`` connection: distinctive, so that a test can look
#: for it everywhere a run leaves text behind.
LLM_API_KEY = f"sk-test-{secrets.token_hex(16)}"
