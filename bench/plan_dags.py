"""Every plan-DAG question in one run: the unbalanced 60-node plan, the seed plan, deep plans and the
500-node plan, in one cluster per database (SQLite, then PostgreSQL), each question's table printing the
databases side by side. The questions' own scripts take the same options and run one question alone.

Run::

    .venv/bin/python bench/plan_dags.py [--db sqlite postgresql] [--repeat 3] [--cap 16] [--json out.json]
"""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from _planbench import main
from depth import Depth
from seed import Seed
from unbalanced import Unbalanced
from wide import Wide

if __name__ == "__main__":
    sys.exit(main([Unbalanced(), Seed(), Depth(), Wide()], __doc__.split("\n\n")[0]))
