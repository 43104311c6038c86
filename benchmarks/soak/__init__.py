"""The chaos soak: real workers, real beat, real redis-servers, injected faults, and a
ledger outside the lock Redis that judges exclusion, fencing and exactly-once completion.

``make soak`` (``python -m benchmarks.soak``) runs it; see :mod:`benchmarks.soak.run`.
"""
