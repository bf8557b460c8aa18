"""A deterministic discrete-event simulator of Airflow's slot hand-out to a plan DAG's node instances,
driving the provider's waiting policy (``airflow_plan_provider/plan/waiting.py``).

- :mod:`~bench.simulator.model`: plans, caps, costs (and the costs calibrated on ``bench/``'s runs);
- :mod:`~bench.simulator.engine`: the event loop, the scheduler, the task processes (:func:`simulate`);
- :mod:`~bench.simulator.policy`: what it asks of a policy, and a deliberately broken one;
- :mod:`~bench.simulator.plans`: ``bench/``'s plans and their measured makespans;
- :mod:`~bench.simulator.cases`: random cases for the property tests;
- :mod:`~bench.simulator.calibrate`, :mod:`~bench.simulator.sweep`: fitting the costs, tuning the policy;
- :mod:`~bench.simulator.families`: the generated plan families (``bench/plan_families.py``) run wide,
  plan DAG against static DAG, hand-off variants, sessions sharing a pool;
- :mod:`~bench.simulator.heldout`: the prediction error on plans the costs were not fitted to.

``python bench/simulate.py`` prints the comparison with the measured runs (``bench/README.md``);
``--families N``, ``--mechanisms``, ``--sessions`` and ``--heldout`` the rest (its docstring).
"""
