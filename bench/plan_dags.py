"""Every plan-DAG question in one run: the unbalanced 60-node plan, the seed plan, deep plans and the
500-node plan, in one cluster per database (SQLite, then PostgreSQL), each question's table printing the
databases side by side. The questions' own scripts take the same options and run one question alone.

Run::

    .venv/bin/python bench/plan_dags.py [--questions unbalanced seed depth wide] [--db sqlite postgresql]
        [--repeat 3] [--cap 16] [--json out.json]
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from _planbench import Question, main
from depth import Depth
from seed import Seed
from unbalanced import Unbalanced
from wide import Wide

QUESTIONS: dict[str, type[Question]] = {"unbalanced": Unbalanced, "seed": Seed, "depth": Depth, "wide": Wide}

if __name__ == "__main__":
    parser = argparse.ArgumentParser(add_help=False)
    parser.add_argument("--questions", nargs="+", choices=QUESTIONS, default=list(QUESTIONS))
    chosen, rest = parser.parse_known_args()
    questions = [QUESTIONS[name]() for name in chosen.questions]
    sys.exit(main(questions, __doc__.split("\n\n")[0], rest))
