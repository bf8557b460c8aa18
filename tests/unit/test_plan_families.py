"""The generated plan families (``bench/plan_families.py``) are what their docstring says, and seeded."""

from __future__ import annotations

import itertools
from pathlib import Path

import pytest

from bench.plan_families import CAPS, FAMILIES, generate, sample


@pytest.mark.parametrize("family", FAMILIES)
def test_a_family_plan_is_a_dag_in_id_order_and_the_same_for_the_same_seed(family: str) -> None:
    plan = generate(family, 3, size=80, cap=4)
    assert plan == generate(family, 3, size=80, cap=4)
    assert plan != generate(family, 4, size=80, cap=4)
    parents = plan.parents()
    assert list(parents) == [str(i) for i in range(1, 81)]
    assert all(int(p) < int(node) for node, ps in parents.items() for p in ps)  # topological ids
    assert set(plan.seconds) == set(parents) and plan.caps().dag_cap == 4
    cp, chain = plan.critical_path()
    assert cp == pytest.approx(sum(plan.seconds[n] for n in chain))
    assert all(a in parents[b] for a, b in itertools.pairwise(chain))


def test_local_plans_have_0_to_3_parents_among_the_nodes_just_before() -> None:
    parents = generate("local", 1, size=200, cap=16).parents()
    assert {len(ps) for ps in parents.values()} == {0, 1, 2, 3}
    assert all(int(node) - int(p) <= 8 for node, ps in parents.items() for p in ps)


def test_durations_and_lanes_per_family() -> None:
    assert all(0.5 <= s <= 8 for s in generate("local", 1, 100, 8).seconds.values())
    assert all(5 <= s <= 30 for s in generate("chains", 1, 100, 8).seconds.values())
    mixed = generate("mixed", 1, 400, 8).seconds.values()
    assert 0.1 <= min(mixed) < 0.5 and 15 < max(mixed) <= 30
    lanes = generate("lanes", 1, 100, 8)
    assert set(lanes.lanes.values()) == {"gpu", "db"} and set(lanes.lane_pools) == {"gpu", "db"}
    assert not generate("local", 1, 100, 8).lanes


def test_a_plan_drawn_from_its_seed_is_the_plan_its_name_gives() -> None:
    for drawn in sample(40):
        family, seed, size, cap = drawn.name.split("-")
        named = generate(family, int(seed[1:]), int(size[1:]), int(cap[1:]))
        assert (named.parents(), named.seconds, named.lanes) == (drawn.parents(), drawn.seconds, drawn.lanes)


def test_a_sample_covers_every_family_and_cap() -> None:
    plans = sample(len(FAMILIES) * len(CAPS))
    assert {(p.family, p.cap) for p in plans} == {(f, c) for f in FAMILIES for c in CAPS}
    assert all(20 <= p.size <= 500 for p in sample(200))


def test_the_held_out_check_reads_a_record_as_it_reads_the_run_it_was_written_from(tmp_path: Path) -> None:
    """``simulate.py --heldout --measured`` takes a ``plan_dags.py --json`` file or the ``bench/results/``
    record written from it: the same plans, databases and makespans (with the plan DAG started on the
    triggerer where the run measured it)."""
    import json

    from bench.simulator.families import STARTED_AS_BUILT, STARTED_NEAR_ALWAYS, STARTED_READY_WITHOUT_SPARE
    from bench.simulator.heldout import measured_families

    run = {
        "results": {
            "families": {
                "sqlite": {
                    "mixed-s2-n100-c16": {"plan": {"makespan": 89.0}, "static": {"makespan": 84.9}},
                    "fan-s1-n80-c8": {
                        "plan": {"makespan": 70.0},
                        "static": {"makespan": 72.0},
                        "started": {"makespan": 71.5},
                    },
                }
            }
        }
    }
    record = {
        "date": "2026-12-07T10:00",
        "figures": {
            "mixed_s2_n100_c16_sqlite_plan_s": 89.0,
            "mixed_s2_n100_c16_sqlite_static_s": 84.9,
            "mixed_s2_n100_c16_sqlite_ratio": 1.048,
            "fan_s1_n80_c8_sqlite_plan_s": 70.0,
            "fan_s1_n80_c8_sqlite_static_s": 72.0,
            "fan_s1_n80_c8_sqlite_started_s": 71.5,
            "fan_s1_n80_c8_sqlite_started_ratio": 0.993,
        },
    }
    (tmp_path / "run.json").write_text(json.dumps(run))
    (tmp_path / "record.json").write_text(json.dumps(record))
    expected = [
        ("sqlite", "mixed-s2-n100-c16", 89.0, 84.9, None, STARTED_AS_BUILT),
        ("sqlite", "fan-s1-n80-c8", 70.0, 72.0, 71.5, STARTED_AS_BUILT),
    ]
    assert (
        measured_families([tmp_path / "run.json"])
        == measured_families([tmp_path / "record.json"])
        == expected
    )
    # a record measured by an earlier build of the start on the triggerer: the build it measured
    (tmp_path / "record.json").write_text(json.dumps(record | {"date": "2026-12-06T14:00"}))
    assert {row[5] for row in measured_families([tmp_path / "record.json"])} == {STARTED_NEAR_ALWAYS}
    (tmp_path / "record.json").write_text(json.dumps(record | {"date": "2026-12-07T00:19"}))
    assert {row[5] for row in measured_families([tmp_path / "record.json"])} == {STARTED_READY_WITHOUT_SPARE}


def test_the_costs_of_each_database_are_fitted_to_its_newest_figures_of_the_training_plans(
    tmp_path: Path,
) -> None:
    """The costs of SQLite are fitted to the bench plans (their newest records, measured on SQLite) and
    to the training plans as the newest record measured them on SQLite, with the plan DAG started on the
    triggerer; those of PostgreSQL to the training plans as measured there only. A record set without one
    of them is refused, naming it and the database."""
    import json

    from bench.simulator.calibrate import figures
    from bench.simulator.heldout import TRAINING, fitting_plans
    from bench.simulator.model import Costs
    from bench.simulator.plans import bench_plans

    def record(date: str, seconds: float, names: tuple[str, ...]) -> dict[str, object]:
        figures_: dict[str, float] = {}
        for name in names:
            stem = name.replace("-", "_")
            figures_ |= {f"{stem}_sqlite_plan_s": seconds, f"{stem}_sqlite_static_s": seconds + 1}
            figures_ |= {f"{stem}_postgresql_plan_s": 1.0, f"{stem}_postgresql_static_s": 1.0}
            figures_ |= {f"{stem}_sqlite_started_s": seconds - 1}
        return {"date": date, "figures": figures_}

    (tmp_path / "a.json").write_text(json.dumps(record("2026-12-07T04:00", 50.0, TRAINING)))
    (tmp_path / "b.json").write_text(json.dumps(record("2026-12-07T05:00", 60.0, TRAINING)))
    plans = fitting_plans([tmp_path / "a.json", tmp_path / "b.json"])
    bench = len(bench_plans())
    assert [p.name for p in plans[bench:]] == list(TRAINING)
    assert [(p.plan_s, p.static_s, p.started_s) for p in plans[bench:]] == [(60.0, 61.0, 59.0)] * len(
        TRAINING
    )
    assert plans[bench].started["starts_deferred"]  # the build's start on the triggerer, simulated
    simulated = figures(Costs(cores=2.0), plans[bench:])
    assert set(simulated) == {
        f"{name}{kind}" for name in TRAINING for kind in ("", " (static)", " (started)")
    }
    on_postgresql = fitting_plans([tmp_path / "a.json", tmp_path / "b.json"], database="postgresql")
    assert [(p.name, p.source, p.plan_s, p.static_s, p.started_s) for p in on_postgresql] == [
        (name, "postgresql", 1.0, 1.0, None) for name in TRAINING
    ]
    (tmp_path / "b.json").write_text(json.dumps(record("2026-12-07T05:00", 60.0, TRAINING[:1])))
    with pytest.raises(ValueError, match=f"no sqlite measurement .*{TRAINING[1]}"):
        fitting_plans([tmp_path / "b.json"])
