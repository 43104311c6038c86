"""Three real ``celery beat -S celery_singleton_lock.beat:LeaderScheduler`` replicas and a
worker, on a private broker and a private lock Redis, while the leader is SIGKILLed,
SIGSTOPped past its lease, cut from the lock Redis, and the lock Redis is restarted (its
data kept). A ledger outside the lock Redis (the broker's database 2) records every send.

Every wait is for an event in the ledger, bounded generously; the one bound that is the
claim (failover within lease + 1 s) is measured and printed, and asserted here only with
room for a loaded CI host (the benchmark ``python -m benchmarks.beat_failover`` reports it
over many kills)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.replicas.harness import Rig, analyse

pytestmark = [pytest.mark.slow, pytest.mark.timeout(240)]

LEASE = 2.0


def test_three_replicas_send_every_slot_once_through_every_fault(tmp_path: Path) -> None:
    """Each slot of each entry (every 1 s, every 5 s, one sent by name) is sent at most once;
    a slot is missing only where the catch-up rule skips it (the gap ends with a caught-up
    send); no two replicas send in the same second; each fault is followed by a send from
    another replica, a leader kill within a generous bound."""
    rig = Rig("ours", tmp_path, lease=LEASE)
    try:
        rig.start()
        assert rig.wait_sends(4, rig.started_at), "no sends at all"
        rig.kill_leader()
        assert rig.wait_sends(3, rig.faults[-1].began), "nothing sent after the leader kill"
        rig.stop_leader(pause=LEASE + 1.5)
        assert rig.wait_sends(3, rig.faults[-1].ended), "nothing sent after the leader froze"
        rig.cut_leader(pause=LEASE + 1.5)
        assert rig.wait_sends(3, rig.faults[-1].ended), "nothing sent after the partition"
        rig.restart_lock(keep_data=True)
        assert rig.wait_sends(6, rig.faults[-1].ended), "nothing sent after the Redis restart"
    finally:
        rig.stop()
    figures = analyse(rig, rig.final)
    print(json.dumps({k: v for k, v in figures.items() if k != "faults"}, indent=2))
    assert figures["duplicates"] == 0, figures["examples"]
    assert figures["lost"] == 0, figures["examples"]
    assert figures["seconds_with_two_senders"] == 0, figures
    assert figures["sends"] >= 20
    for fault in rig.faults:
        assert fault.failover is not None, fault
    (kill,) = figures["failover_seconds"]["leader_kill"]
    # The claim is lease + 1 s (measured by the benchmark); a loaded CI host gets room here.
    assert kill < LEASE + 15, kill
