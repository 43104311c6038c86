"""Beat deduplication: a 1 s schedule for a 3 s job (``python -m examples.beat_dedup.run``)."""
