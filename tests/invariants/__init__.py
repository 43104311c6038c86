"""The mode invariant checker (issue 21): every call of every mode ends in exactly one
terminal, reported state, under busy workers, countdowns, duplicate deliveries, killed
processes and a lock Redis that stalls or restarts.

- :mod:`.modes`: the modes under test, as task options and what each promises;
- :mod:`.recording`: what the task bodies, signals and worker hooks write to the ledger
  (a private redis-server the faults never touch);
- :mod:`.records`: the records of one run (calls, bodies, results, faults);
- :mod:`.checker`: the invariants, as pure functions over those records;
- :mod:`.scenario`: the seeded scenario generator; :mod:`.faults`: the fault injectors;
- :mod:`.driver`: makes the calls (publishing some twice), follows their results, notices
  bodies whose process died;
- :mod:`.runner`: runs one scenario on real processes; ``python -m tests.invariants``
  runs many and prints the figures (:mod:`.__main__`);
- ``test_checker.py``: the checker on hand-made records; ``test_invariants.py``: six seeded
  scenarios on real workers (marked slow, about two minutes).

The chaos soak (``benchmarks/soak``) drives the same modes and judges them with the same
checker. See docs/soak.md.
"""
