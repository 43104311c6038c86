"""The chaos soak's judgements (``benchmarks.soak.analysis``) on hand-made ledger records:
each verdict the soak's exit status depends on is computed as its definition says."""

from __future__ import annotations

from typing import Any

from benchmarks.soak.analysis import (
    Fault,
    analyse,
    fencing_order,
    fencing_violations,
    lost_and_duplicates,
    overlaps,
    paused_holders,
    recoveries,
    unreported_losses,
)
from benchmarks.soak.ledger import Body, Snapshot


def body(
    name: str,
    enter: float | None,
    last: float | None,
    *,
    key: str = "k",
    token: int = 0,
    outcome: str = "committed",
    exit: float | None = None,  # noqa: A002 - the ledger's field name
    task_id: str | None = None,
    **more: Any,
) -> Body:
    """A body record as the ledger would hold it."""
    return Body(
        id=name, task_id=task_id or f"task-{name}", kind="soak.run_wait", key=key,
        token=token, pid=1, worker="w1", enter=enter, last=last, outcome=outcome,
        exit=exit if exit is not None else last, **more,
    )  # fmt: skip


def test_intersecting_windows_of_one_key_overlap() -> None:
    """Windows [enter, last] of one key that intersect are an overlap; touching windows,
    other keys and refused enters are not."""
    bodies = [
        body("a", 0.0, 1.0, token=1),
        body("b", 0.5, 2.0, token=2),  # overlaps a
        body("c", 2.0, 3.0, token=3),  # starts where b's window ends: no overlap
        body("x", 0.2, 5.0, key="other", token=1),
        body("r", None, None, token=0, outcome="refused"),
    ]
    found = overlaps(bodies, restarts=[])
    assert [(item.first, item.second, item.data_loss) for item in found] == [("a", "b", False)]
    assert abs(found[0].seconds - 0.5) < 1e-9


def test_a_long_window_overlaps_every_body_inside_it() -> None:
    """Each body is compared with the earlier window that reaches furthest, so a long hold
    overlapping two later ones counts twice."""
    bodies = [body("long", 0.0, 10.0), body("b", 1.0, 2.0), body("c", 3.0, 4.0)]
    assert [(item.first, item.second) for item in overlaps(bodies, [])] == [
        ("long", "b"),
        ("long", "c"),
    ]


def test_an_overlap_across_a_restart_is_data_loss() -> None:
    """An overlap whose second hold began after a restart of the lock Redis that came after
    the first hold began counts as data loss, not as a broken promise."""
    bodies = [body("a", 10.0, 12.0), body("b", 11.0, 13.0)]
    (lossy,) = overlaps(bodies, restarts=[10.5])
    assert lossy.data_loss
    (kept,) = overlaps(bodies, restarts=[20.0])
    assert not kept.data_loss


def test_fencing_tokens_must_grow_in_the_order_bodies_entered() -> None:
    """A body whose token is not above every earlier token of its key is a violation."""
    bodies = [
        body("a", 0.0, 1.0, token=10),
        body("b", 2.0, 3.0, token=30),
        body("c", 4.0, 5.0, token=20),
        body("d", 6.0, 7.0, token=30),
        body("e", 8.0, 9.0, token=31),
    ]
    assert fencing_violations(bodies) == [("b", "c"), ("b", "d")]


def test_a_retry_that_continues_its_own_hold_is_not_a_violation() -> None:
    """Equal tokens of one task id (a queue-scope retry took its own hold over) are a
    continued hold; equal tokens of two task ids are a violation."""
    bodies = [
        body("a", 0.0, 1.0, token=10, task_id="t1", outcome="lease_lost"),
        body("b", 2.0, 3.0, token=10, task_id="t1"),
        body("c", 4.0, 5.0, token=10, task_id="t2"),
    ]
    assert fencing_order(bodies) == ([("a", "c")], [("a", "b")])
    assert fencing_violations(bodies) == [("a", "c")]


def test_lost_tasks_and_duplicates() -> None:
    """Sent but neither committed nor skipped is lost; committed twice is a duplicate."""
    snapshot = Snapshot(
        sent={"a": {}, "b": {}, "c": {}, "d": {}},
        commits={"a": 1, "b": 2},
        skips={"c": 1},
    )
    assert lost_and_duplicates(snapshot) == (["d"], ["b"])


def test_a_loss_must_be_reported_to_the_body_that_ran_on() -> None:
    """A body still running when a rival entered must have seen its lease lost or got the
    lock_lost signal; one that did neither is an unreported loss."""
    silent = body("a", 0.0, 1.0, token=1, exit=3.0)
    rival = body("b", 2.0, 4.0, token=2)
    assert unreported_losses(Snapshot(bodies=[silent, rival])) == [("a", "b")]
    told = body("a", 0.0, 1.0, token=1, exit=3.0, outcome="lease_lost")
    assert unreported_losses(Snapshot(bodies=[told, rival])) == []
    signal = {"task_id": "task-a", "token": 1, "key": "csl:x", "t": 3.0}
    assert unreported_losses(Snapshot(bodies=[silent, rival], lost_signals=[signal])) == []
    finished = body("a", 0.0, 1.0, token=1, exit=1.5)
    assert unreported_losses(Snapshot(bodies=[finished, rival])) == []


def test_recovery_is_measured_to_the_next_body_of_each_held_key() -> None:
    """After a crash, recovery of each key the victim held ends when the next body of that
    key enters; a key nobody took again has none; other faults are not measured."""
    bodies = [body("victim", 9.0, 10.0), body("next", 12.5, 13.0), body("o", 9.5, 9.6, key="o")]
    crash = Fault("worker_kill", 10.0, 11.0, "w1", held=[("victim", "k", "soak.run_wait")])
    orphan = Fault("child_kill", 20.0, 20.0, "w1", held=[("o", "o", "soak.run_wait")])
    cut = Fault("net_cut", 10.0, 10.0, "w1", held=[("victim", "k", "soak.run_wait")])
    rows = recoveries(bodies, [crash, orphan, cut])
    assert [(row["fault"], row["key"], row["seconds"]) for row in rows] == [
        ("worker_kill", "k", 2.5),
        ("child_kill", "o", None),
    ]


def test_a_paused_holder_must_learn_that_its_lease_was_lost() -> None:
    """A body that held a lock when its worker was stopped and ran on after it must have
    been told (lease_lost in the body, or lock_lost); bodies that ended before the pause
    or died are not counted."""
    pause = Fault(
        "worker_stop", 10.0, 15.0, "w1",
        held=[("told", "k", "x"), ("silent", "k", "x"), ("done", "k", "x"), ("dead", "k", "x")],
    )  # fmt: skip
    snapshot = Snapshot(
        bodies=[
            body("told", 9.0, 9.5, exit=15.1, outcome="lease_lost"),
            body("silent", 9.0, 9.9, exit=15.2),
            body("done", 9.0, 9.5, exit=9.8),
            body("dead", 9.0, 9.5, exit=None),
        ]
    )
    snapshot.bodies[-1].exit = None
    assert paused_holders(snapshot, [pause]) == (2, ["silent"])


def test_only_an_overlap_while_redis_kept_its_data_fails_the_soak() -> None:
    """analyse() fails the safety targets for an overlap with the data kept, and passes one
    caused by a restart (reported apart), all else being clean."""
    sent = {"task-a": {}, "task-b": {}}
    commits = {"task-a": 1, "task-b": 1}
    pair = [body("a", 10.0, 12.0, token=1), body("b", 11.0, 13.0, token=2)]
    told = [{"task_id": "task-a", "token": 1, "key": "csl:k", "t": 12.0}]

    def snapshot() -> Snapshot:
        return Snapshot(sent=sent, bodies=pair, commits=commits, lost_signals=told)

    kept = analyse(snapshot(), [], lease=3.0, lock_commands=100)
    assert not kept.safe
    assert kept.figures["overlaps_data_kept"] == 1
    restart = Fault("redis_restart", 10.5, 10.6, "lock redis")
    lossy = analyse(snapshot(), [restart], lease=3.0, lock_commands=100)
    assert lossy.safe
    assert lossy.figures["overlaps_after_data_loss"] == 1
    assert lossy.figures["lock_commands_per_task"] == 50.0


def test_a_message_no_worker_received_is_lost_in_the_transport_not_by_the_lock() -> None:
    """A lost task that some worker received fails the lost-tasks target; one that no
    worker ever received is counted apart (lost between broker and worker)."""
    sent = {"seen": {"t": 5.0}, "unseen": {"t": 7.0}}
    kill = Fault("worker_kill", 6.9, 8.0, "w2")
    received = {"seen": {"worker": "w1", "t": 5.1}}
    results = analyse(Snapshot(sent=sent, received=received), [kill], lease=3.0, lock_commands=0)
    assert results.figures["lost_tasks"] == 1
    assert results.figures["lost_in_broker_transport"] == 1
    assert not results.safe
    (row,) = results.examples["lost_in_broker_transport"]
    assert row[0] == "unseen"
    assert row[2] == {"kind": "worker_kill", "target": "w2", "after_s": 0.1}
    transport_only = analyse(
        Snapshot(sent={"unseen": {"t": 7.0}}), [kill], lease=3.0, lock_commands=0
    )
    assert transport_only.figures["lost_tasks"] == 0
    assert transport_only.safe
