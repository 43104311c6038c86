"""The invariant checker's judgements on hand-made records: each violation kind is found
where its definition says, and nothing is flagged for a run that kept every promise. No
process is started here (the scenarios that run real workers are in test_invariants.py)."""

from __future__ import annotations

from typing import Any

from tests.invariants.checker import STOP_GRACE, check, limit_shares, saturated_seconds
from tests.invariants.modes import HOLD, MODES, STACK, Mode
from tests.invariants.records import (
    BodyRun,
    Call,
    Exec,
    FaultRecord,
    Kill,
    Observation,
    Outcome,
    Publish,
    Receipt,
    SignalRecord,
    WorkerInfo,
)


class Records:
    """Builds an observation call by call."""

    def __init__(self) -> None:
        self.obs = Observation(seed=7, lease=8.0, visibility_timeout=12.0, ended=100.0,
                               workers=[WorkerInfo("w1", "prefork", 2)])  # fmt: skip

    def call(
        self, mode: str, at: float, *, key: str = "k0", result: str | None = "", **more: Any
    ) -> Call:
        n = len(self.obs.calls)
        own = f"id{n}"
        rid = own if result == "" else result
        item = Call(i=n, mode=mode, key=key, n=n, seconds=0.1, own_id=own, t_call=at,
                    t_return=at + 0.01, result_id=rid, **more)  # fmt: skip
        self.obs.calls.append(item)
        return item

    def body(
        self, task_id: str, n: int, start: float, end: float | None, *, mode: str,
        key: str = "k0", how: str = "ok", pid: int = 10,
    ) -> BodyRun:  # fmt: skip
        item = BodyRun(id=f"b{len(self.obs.bodies)}", task_id=task_id, mode=mode, key=key, n=n,
                       pid=pid, worker="w1", start=start, end=end, how=how)  # fmt: skip
        self.obs.bodies.append(item)
        return item

    def result(self, task_id: str, state: str = "SUCCESS", value: Any = None, **more: Any) -> None:
        self.obs.outcomes[task_id] = Outcome(task_id, state, value, seen=50.0, **more)

    def ran(self, call: Call, start: float, end: float, **more: Any) -> None:
        """``call`` ran as itself."""
        self.body(call.own_id, call.n, start, end, mode=call.mode, key=call.key, **more)
        self.result(call.own_id, value=call.n)

    def kinds(self, **flags: bool) -> list[str]:
        verdict = check(self.obs)
        return sorted(v.kind for v in verdict.violations
                      if all(getattr(v, k) == want for k, want in flags.items()))  # fmt: skip


def test_a_clean_run_has_no_violation() -> None:
    r = Records()
    first = r.call("run_skip", 1.0)
    second = r.call("run_skip", 1.1)
    r.ran(first, 1.2, 2.0)
    r.result(second.own_id, value=None, skip_holder=first.own_id, skip_reason="held")
    later = r.call("run_skip", 3.0)
    r.ran(later, 3.1, 3.5)
    verdict = check(r.obs)
    assert verdict.violations == []
    assert verdict.terminals == {0: "ran", 1: "skipped", 2: "ran"}


def test_a_pending_id_is_lost_and_a_refused_call_is_reported() -> None:
    r = Records()
    r.call("coalesce", 1.0)
    r.call("coalesce", 1.1, result=None, error="LockBackendError")
    assert r.kinds() == ["lost"]
    assert check(r.obs).terminals == {0: "lost", 1: "refused"}
    r.call("run_retry", 2.0, result=None, error="LockBackendError")  # run scope never refuses
    assert r.kinds() == ["lost", "not_allowed"]


def test_a_follow_up_runs_the_latest_arguments() -> None:
    r = Records()
    holder = r.call("coalesce", 1.0)
    r.ran(holder, 1.1, 2.0)
    first = r.call("coalesce", 1.2)  # creates the follow-up under its own id
    r.call("coalesce", 1.3, result=first.own_id)
    last = r.call("coalesce", 1.4, result=first.own_id)
    r.body(first.own_id, last.n, 2.1, 2.5, mode="coalesce")
    r.result(first.own_id, value=last.n)
    assert r.kinds() == []
    assert check(r.obs).terminals == {0: "ran", 1: "coalesced", 2: "coalesced", 3: "coalesced"}
    r.obs.bodies[-1].n = first.n
    r.result(first.own_id, value=first.n)
    assert r.kinds() == ["wrong_arguments"]


def test_a_throttled_follow_up_that_failed_is_not_allowed() -> None:
    r = Records()
    call = r.call("coalesce_rate", 1.0)
    r.result(call.own_id, "FAILURE", error="TaskThrottled", error_text="throttled")
    assert r.kinds() == ["not_allowed"]


def test_a_skip_needs_its_record_and_another_holder() -> None:
    r = Records()
    call = r.call("run_skip", 1.0)
    r.result(call.own_id, value=None)
    assert r.kinds() == ["skip_unreported"]
    r.result(call.own_id, value=None, skip_holder=call.own_id, skip_reason="held")
    assert r.kinds() == ["skipped_by_itself"]
    r.result(call.own_id, value=None, skip_holder="other", skip_reason="held")
    assert r.kinds() == []
    debounced = r.call("debounce", 2.0)
    r.result(debounced.own_id, value=None, skip_holder="other", skip_reason="held")
    assert r.kinds() == ["not_allowed"]  # a burst is never skipped


def test_superseded_calls_are_reported_and_never_run() -> None:
    r = Records()
    old = r.call("replace", 1.0)
    new = r.call("replace", 1.2)
    r.result(old.own_id, "REVOKED", error="TaskRevokedError")
    r.ran(new, 1.5, 2.0)
    assert r.kinds() == ["superseded_unreported"]
    r.obs.signals.append(SignalRecord("lock_superseded", "key", old.own_id, 1.21, 1,
                                      {"by": new.own_id, "running": False}))  # fmt: skip
    assert r.kinds() == []
    r.body(old.own_id, old.n, 3.0, 3.5, mode="replace")
    assert r.kinds() == ["ran_after_superseded"]


def _replaced_while_running() -> tuple[Records, Any, Any]:
    """A replace_running call superseded while running by a later one (reported so)."""
    r = Records()
    old = r.call("replace_running", 1.0)
    new = r.call("replace_running", 2.0)
    r.result(old.own_id, "REVOKED", error="TaskRevokedError")
    r.obs.signals.append(SignalRecord("lock_superseded", "key", old.own_id, 2.0, 1,
                                      {"by": new.own_id, "running": True}))  # fmt: skip
    return r, old, new


def test_a_replaced_running_run_must_stop() -> None:
    r, old, new = _replaced_while_running()
    r.body(old.own_id, old.n, 1.1, 2.3, mode="replace_running", how="terminated")
    r.ran(new, 2.4, 3.0)
    assert r.kinds() == []
    r.obs.bodies[0].end, r.obs.bodies[0].how = 2.6, "ok"  # ran on beside the new run
    assert r.kinds() == ["overlap"]
    r.obs.bodies[0].end = 5.0
    r.obs.bodies[1].start = 5.1
    assert r.kinds() == ["superseded_not_stopped"]


def test_overlaps_count_against_the_limit_and_killed_runs_end_at_their_kill() -> None:
    r = Records()
    calls = [r.call("limit2", 1.0 + i / 10) for i in range(3)]
    r.ran(calls[0], 1.0, 3.0)
    r.ran(calls[1], 1.5, 2.5)
    r.ran(calls[2], 2.6, 3.5)
    assert r.kinds() == []  # never more than two at once
    r.obs.bodies[2].start = 2.4
    assert r.kinds() == ["overlap"]
    r = Records()
    one, two = r.call("run_wait", 1.0), r.call("run_wait", 1.1)
    r.body(one.own_id, one.n, 1.0, 2.0, mode="run_wait", how="killed")
    r.ran(two, 2.1, 3.0)
    r.ran(one, 3.1, 3.5)  # the redelivery ran later
    assert r.kinds() == []


def test_a_success_holds_its_slot_and_a_failure_does_not() -> None:
    r = Records()
    one, two, three = (r.call("success_run", t) for t in (1.0, 1.5, 3.0))
    r.ran(one, 1.0, 1.2)
    r.ran(two, 1.2 + HOLD + 0.1, 2.5)  # after the hold
    r.ran(three, 2.5 + HOLD, 4.0)
    assert r.kinds() == []
    r.obs.bodies[1].start = 1.5
    assert r.kinds() == ["hold_not_kept"]
    r.obs.bodies[0].how = "fail"
    r.result(one.own_id, "FAILURE", error="RuntimeError")
    assert r.kinds() == []


def test_a_queue_scope_id_completes_once() -> None:
    r = Records()
    call = r.call("queue_skip", 1.0)
    r.ran(call, 1.0, 1.5)
    r.body(call.own_id, call.n, 1.6, 2.0, mode="queue_skip")
    assert r.kinds() == ["ran_twice"]
    r.obs.kills.append(Kill(pid=10, t=1.0 + 0.9, kind="worker_kill"))  # long after its end
    assert r.kinds() == ["ran_twice"]
    r.obs.kills.append(Kill(pid=10, t=1.5 - 0.1, kind="worker_kill"))  # it ended as it died
    assert r.kinds() == ["ran_twice_unrecorded"]
    r = Records()
    call = r.call("run_skip", 1.0)
    r.ran(call, 1.0, 1.5)
    r.body(call.own_id, call.n, 1.6, 2.0, mode="run_skip")
    assert r.kinds() == []  # run scope: a redelivered message may run again


def test_rate_windows() -> None:
    r = Records()
    calls = [r.call("rate_retry", 1.0) for _ in range(4)]
    for index, call in enumerate(calls):
        r.ran(call, 1.0 + 0.5 * index, 1.1 + 0.5 * index)  # 2 per second: allowed
    assert r.kinds() == []
    r.obs.bodies[2].start = 1.6
    r.obs.bodies[2].end = 1.7
    assert r.kinds() == ["rate_exceeded"]


def test_a_burst_runs_its_last_arguments_in_time() -> None:
    r = Records()
    first = r.call("debounce_max", 1.0)
    r.call("debounce_max", 1.5, result=first.own_id)
    last = r.call("debounce_max", 2.0, result=first.own_id)
    r.body(first.own_id, last.n, 2.61, 3.0, mode="debounce_max")  # max_wait 1.5: due 2.5
    r.result(first.own_id, value=last.n)
    assert r.kinds() == []
    r.obs.bodies[0].start = 5.0  # 2.5 s late, the worker idle
    assert r.kinds() == ["debounce_late"]
    # The worker that held it had every pool process busy until 4.6: within the slack.
    r.obs.receipts.append(Receipt(first.own_id, "inv.debounce_max", "w1", 1.0, 3))
    r.obs.execs += [Exec("x", "inv.run_skip", 10, "w1", 2.0, 4.6),
                    Exec("y", "inv.run_skip", 11, "w1", 2.2, 4.6)]  # fmt: skip
    assert r.kinds() == []


def test_saturation_fills_short_gaps() -> None:
    execs = [Exec("a", "t", 1, "w", 0.0, 1.0), Exec("b", "t", 1, "w", 1.1, 2.0)]
    assert abs(saturated_seconds(execs, 1, 0.0, 2.0, 10.0) - 2.0) < 1e-9
    assert saturated_seconds(execs, 2, 0.0, 2.0, 10.0) == 0.0


def test_lifetimes_of_deduplicated_calls() -> None:
    r = Records()
    queued = r.call("release_start", 1.0)
    r.ran(queued, 2.0, 3.0)
    r.call("release_start", 1.5, result=queued.own_id)
    assert r.kinds() == []
    r.call("release_start", 2.5, result=queued.own_id)  # it had started: a new message
    assert r.kinds() == ["dedup_into_started"]
    r = Records()
    done = r.call("success_queue", 1.0)
    r.ran(done, 1.0, 1.5)
    r.call("success_queue", 1.5 + HOLD - 0.2, result=done.own_id)
    assert r.kinds() == []
    r.call("success_queue", 1.5 + HOLD + 1.0, result=done.own_id)
    assert r.kinds() == ["held_too_long"]


def test_violations_under_a_restart_are_counted_apart() -> None:
    r = Records()
    r.call("coalesce", 10.0)
    r.obs.faults.append(FaultRecord("redis_restart", 12.0, 12.2))
    verdict = check(r.obs)
    assert [(v.kind, v.restart) for v in verdict.violations] == [("lost", True)]
    assert verdict.safe == []
    r.obs.faults[0].t0 = r.obs.faults[0].t1 = 200.0  # after the end: not in its window
    assert r.kinds(restart=False) == ["lost"]


def test_lost_leases_are_flagged_unless_the_faults_allow_them() -> None:
    r = Records()
    call = r.call("run_skip", 1.0)
    r.ran(call, 1.0, 2.0, how="lease_lost")
    assert r.kinds() == ["lease_lost"]
    r.obs.leases_may_be_lost = True
    assert r.kinds() == []


def test_a_message_a_killed_worker_took_off_the_broker_is_counted_apart() -> None:
    """A call never received by any worker, published as a whole worker was killed, was
    lost by kombu's Redis transport (celery/celery#7950), not by the lock."""
    r = Records()
    call = r.call("replace", 5.0)
    r.obs.faults.append(FaultRecord("worker_kill", 4.9, 6.0, "w1"))
    assert r.kinds() == ["lost"]  # never published: the lock lost it
    r.obs.published.append(Publish(call.own_id, "inv.replace", 5.005, "driver"))
    verdict = check(r.obs)
    assert [v.kind for v in verdict.violations] == ["lost_in_transport"]
    assert verdict.safe == []
    assert len(verdict.transport) == 1
    r.obs.receipts.append(Receipt(call.own_id, "inv.replace", "w1", 5.1))
    assert r.kinds() == ["lost"]  # a worker had it: the lock must not lose it
    # A worker received it and published a retry, which no worker received: the retry
    # published as a worker was killed was the transport's, one published far from any
    # kill was not.
    r.obs.published.append(Publish(call.own_id, "inv.replace", 5.3, "w1"))
    assert r.kinds() == ["lost_in_transport"]
    r.obs.published[-1] = Publish(call.own_id, "inv.replace", 9.0, "w1")
    assert r.kinds() == ["lost"]
    r.obs.published[-1] = Publish(call.own_id, "inv.replace", 5.3, "w1")
    r.obs.receipts.append(Receipt(call.own_id, "inv.replace", "w2", 5.4))
    assert r.kinds() == ["lost"]  # the retry was received: the lock must not lose it


def test_a_message_gone_from_the_broker_unreceived_went_with_a_killed_worker() -> None:
    """A call published long before a whole worker was killed, never received, and not in
    the broker at the end (neither queued nor unacknowledged) was taken off the queue by
    the killed worker's consumer (it waited there until then): the transport's. Still in
    the broker, or with no kill after its publish, it is lost by the lock."""
    r = Records()
    call = r.call("park_limit2_rate", 5.0)
    r.obs.published.append(Publish(call.own_id, "inv.park_limit2_rate", 5.005, "driver"))
    r.obs.faults.append(FaultRecord("parked_kill", 8.3, 9.4, "w1"))
    r.obs.notes["broker_left"] = {}
    assert r.kinds() == ["lost_in_transport"]
    r.obs.notes["broker_left"] = {call.own_id: "queued"}
    assert r.kinds() == ["lost"]
    r.obs.notes["broker_left"] = {}
    r.obs.faults[0] = FaultRecord("parked_kill", 3.0, 4.0, "w1")
    assert r.kinds() == ["lost"]


def test_a_throttled_retry_comes_back_at_the_next_free_start() -> None:
    r = Records()
    call = r.call("rate_retry", 1.0)
    r.obs.execs.append(Exec(call.own_id, "inv.rate_retry", 10, "w1", 1.0, 1.01))
    r.obs.signals.append(SignalRecord("lock_throttled", "key", call.own_id, 1.005, 10,
                                      {"policy": "retry", "retry_in": 0.4}))  # fmt: skip
    r.obs.execs.append(Exec(call.own_id, "inv.rate_retry", 11, "w1", 1.43, 1.6, retries=1))
    r.ran(call, 1.44, 1.6)
    assert r.kinds() == []
    r.obs.execs[-1].start = 1.1  # back before the next free start: paced by something else
    assert r.kinds() == ["throttle_paced_wrong"]
    r.obs.execs[-1].start = 5.0  # 3.6 s late with an idle worker
    assert r.kinds() == ["throttle_paced_wrong"]


def test_a_run_superseded_as_it_starts_may_begin_its_body_within_the_grace() -> None:
    """Superseded while running (it held its key for the body): the body may begin a moment
    after the replacing call returned and be terminated; beginning after STOP_GRACE is a
    body that ran after being superseded."""
    r, old, new = _replaced_while_running()
    r.body(old.own_id, old.n, new.t_return + 0.01, new.t_return + 0.02, mode="replace_running",
           how="terminated")  # fmt: skip
    r.ran(new, 2.4, 3.0)
    assert r.kinds() == []
    r.obs.bodies[0].start = new.t_return + STOP_GRACE + 0.5
    r.obs.bodies[0].end = new.t_return + STOP_GRACE + 0.6
    assert r.kinds() == ["ran_after_superseded"]


def test_a_lost_result_needs_a_completed_body_whose_process_was_killed() -> None:
    r = Records()
    call = r.call("park_limit2_rate", 1.0)
    r.body(call.own_id, call.n, 1.0, 1.5, mode="park_limit2_rate", pid=21)
    r.result(call.own_id, "FAILURE", error="ResultLost")
    assert check(r.obs).terminals == {0: "result_lost"}
    assert r.kinds() == ["result_lost_unfounded"]  # nothing died: a copy gave up too soon
    r.obs.kills.append(Kill(pid=21, t=0.9, kind="worker_kill"))
    assert r.kinds() == ["result_lost_unfounded"]  # killed before the body ended
    r.obs.kills.append(Kill(pid=21, t=1.6, kind="worker_kill"))
    assert r.kinds() == []
    r = Records()
    call = r.call("run_skip", 1.0)  # run scope runs a late copy again: never ResultLost
    r.ran(call, 1.0, 1.5)
    r.result(call.own_id, "FAILURE", error="ResultLost")
    r.obs.kills.append(Kill(pid=10, t=1.6, kind="worker_kill"))
    assert r.kinds() == ["not_allowed"]


def test_a_message_taken_back_after_its_body_was_killed_then_gone_with_a_killed_worker() -> None:
    """A call received once, whose body was killed (its message goes back to the queue:
    requeued by the worker, or restored once unacknowledged too long), never received
    again, gone from the broker, with a whole worker killed after that body's kill, was
    taken off the queue by that worker's consumer: the transport's (seed 2107 under two
    suites at once). With no later worker kill, still in the broker, or received again,
    it is the lock's."""
    r = Records()
    call = r.call("park_queue", 5.0)
    r.obs.published.append(Publish(call.own_id, "inv.park_queue", 5.005, "w1"))
    r.obs.receipts.append(Receipt(call.own_id, "inv.park_queue", "w1", 5.02))
    r.body(call.own_id, call.n, 5.1, 5.9, mode="park_queue", how="killed")
    r.result(call.own_id, "PARKED")
    r.obs.faults.append(FaultRecord("child_kill", 5.9, 5.9, "w1"))
    r.obs.notes["broker_left"] = {}
    assert r.kinds() == ["lost"]  # no whole worker killed after the body's kill
    r.obs.faults.append(FaultRecord("parked_kill", 6.4, 7.4, "w1"))
    verdict = check(r.obs)
    assert [v.kind for v in verdict.violations] == ["lost_in_transport"]
    assert verdict.safe == []
    assert "its delivery's body was killed at +0.90 s" in verdict.violations[0].got
    r.obs.notes["broker_left"] = {call.own_id: "queued"}
    assert r.kinds() == ["lost"]
    r.obs.notes["broker_left"] = {}
    r.obs.receipts.append(Receipt(call.own_id, "inv.park_queue", "w2", 6.0))
    assert r.kinds() == ["lost"]  # received again after the kill: the lock must not lose it
    del r.obs.receipts[-1]
    r.obs.bodies[-1].how = "ok"
    assert r.kinds() == ["lost"]  # its body was not killed


def test_a_message_left_unacknowledged_names_kombu_s_restore_mutex_when_held() -> None:
    """A lost call whose message is still unacknowledged in the broker says so, and says
    when kombu's restore mutex was still held at the end (a worker killed holding it
    blocks every redelivery for 300 s)."""
    r = Records()
    call = r.call("queue_skip", 1.0)
    r.obs.notes["broker_left"] = {call.own_id: "unacknowledged"}
    assert "still unacknowledged in the broker" in check(r.obs).violations[0].got
    assert "restore mutex" not in check(r.obs).violations[0].got
    r.obs.notes["restore_mutex_ms"] = 250_000
    assert "kombu's restore mutex still held, 250 s left" in check(r.obs).violations[0].got


def test_a_call_s_limits_render_from_its_arguments_as_the_package_renders_them() -> None:
    """The checker reads the limits from the Mode: names rendered by the package's own
    render_limit, every third call heavy."""
    assert STACK == (("grp:{key}", 3), ("global", 4))
    bound = {"key": "k1", "n": 3, "seconds": 0.2, "fail": False}
    assert limit_shares(MODES["stack_wait"], bound) == (2, {"grp:k1": 3, "global": 4})
    assert limit_shares(MODES["stack_skip"], {**bound, "n": 4}) == (1, {"grp:k1": 3, "global": 4})
    assert limit_shares(MODES["run_wait"], bound) == (1, {})
    # Two templates rendering one name count its smaller number; an odd value is digested.
    odd = Mode("odd", "", {}, frozenset({"ran"}), limits=(("a:{key}", 5), ("a:{key}", 2)))
    weight, numbers = limit_shares(odd, {**bound, "key": "x y"})
    assert weight == 1
    assert [(name[:3], number) for name, number in numbers.items()] == [("a:#", 2)]


def _stacked() -> Records:
    """Three stacked modes sharing grp:k0 and global: a heavy run (call 0, weight 2) of
    stack_wait k0, a light one of stack_skip k0 (3 in grp:k0) and one of stack_retry k1
    (4 in global): full, never over."""
    r = Records()
    heavy = r.call("stack_wait", 1.0)  # n=0: weight 2
    light = r.call("stack_skip", 1.1)  # n=1: weight 1
    other = r.call("stack_retry", 1.2, key="k1")  # n=2: weight 1
    r.ran(heavy, 1.0, 3.0)
    r.ran(light, 1.5, 2.5, pid=11)
    r.ran(other, 1.6, 2.6, pid=12)
    return r


def test_stacked_limits_full_but_never_over_pass() -> None:
    r = _stacked()
    late = r.call("stack_raise", 2.5, key="k1")  # n=3: weight 2
    r.ran(late, 2.6, 3.5, pid=13)  # as the others leave (an end counts first): 2 + 2 in global
    verdict = check(r.obs)
    assert verdict.violations == []
    assert verdict.terminals == {0: "ran", 1: "ran", 2: "ran", 3: "ran"}


def test_a_run_entering_a_full_limit_is_reported() -> None:
    """A heavy run of key k1 entering while global holds 4: limit_exceeded on global (peak
    6, allowed 4, every run inside named), not on grp:k1 (2 + 1 = 3 fits)."""
    r = _stacked()
    late = r.call("stack_raise", 2.0, key="k1")  # n=3: weight 2
    r.ran(late, 2.0, 2.2, pid=13)
    verdict = check(r.obs)
    assert [(v.kind, v.key) for v in verdict.violations] == [("limit_exceeded", "global")]
    found = verdict.violations[0]
    assert found.mode == "stack_raise"
    assert "peak weight 6 (allowed 4)" in found.got
    assert found.calls == [0, 1, 2, 3]
    assert found.window == (1.0, 2.2)
    assert found.restart is False


def test_a_group_limit_counts_weights_across_modes() -> None:
    """grp:k0 is one budget for key k0 of every stacked mode: a second heavy run of k0
    (another mode, so another lock key) beside the first makes 2 + 2 > 3."""
    r = _stacked()
    r.obs.bodies[1].end, r.obs.bodies[2].end = 1.9, 1.7  # global: 2 + 2 = 4 fits
    late = r.call("stack_raise", 2.0)  # n=3: weight 2, key k0: 2 + 2 in grp:k0
    r.ran(late, 2.0, 2.2, pid=13)
    assert [(v.kind, v.key) for v in check(r.obs).violations] == [("limit_exceeded", "grp:k0")]


def test_a_killed_run_leaves_a_limit_at_its_kill() -> None:
    """As for overlap: a killed run is inside until its kill; one still running at the end
    is inside until the end."""
    r = _stacked()
    r.obs.bodies[0].end, r.obs.bodies[0].how = 2.0, "killed"
    late = r.call("stack_raise", 2.0, key="k1")  # n=3: weight 2: 1 + 1 + 2 = 4 in global
    r.ran(late, 2.05, 2.2, pid=13)
    r.body(r.obs.calls[0].own_id, 0, 3.0, 3.5, mode="stack_wait", pid=14)  # redelivered
    assert r.kinds() == []
    r.obs.bodies[0].end, r.obs.bodies[0].how = None, None  # never ended: inside till the end
    found = sorted((v.kind, v.key, v.calls) for v in check(r.obs).violations)
    assert found == [
        ("limit_exceeded", "global", [0, 1, 2, 3]),  # 2 + 1 + 1 + 2 as call 3 enters
        ("limit_exceeded", "grp:k0", [0]),  # 2 + 2 as the redelivery of call 0 enters
    ]


def _lost_at_start(r: Records, call: Call, start: float) -> BodyRun:
    """``call`` ran with its lease already lost when its body began (its reply came back
    after its lease ran out: a lock Redis stopped past the lease): it never saw the lease
    valid, and stopped 10 ms later."""
    r.ran(call, start, start + 0.01, how="lease_lost")
    body = r.obs.bodies[-1]
    body.trusted = start
    return body


def test_a_run_whose_lease_was_lost_as_it_began_leaves_the_limit_at_once() -> None:
    """As for overlap, a run that lost its lease is inside a limit until the last moment
    it saw the lease valid, also when that moment is its start (soak seed 228887009: two
    such runs stayed counted for 28 s and 19 runs admitted after them were flagged). It is
    still judged as it enters, and a lost lease seen valid for a while counts that long."""
    r = Records()
    r.obs.leases_may_be_lost = True
    heavy = r.call("stack_wait", 2.0)  # n=0: weight 2
    first, second = r.call("stack_skip", 1.0), r.call("stack_skip", 1.0)  # n=1, 2: weight 1
    other = r.call("stack_raise", 2.1, key="k1")  # n=3: weight 2
    _lost_at_start(r, first, 1.0)
    _lost_at_start(r, second, 1.0005)
    r.ran(heavy, 2.0, 3.0, pid=11)  # grp:k0 2 of 3, global 2 of 4
    r.ran(other, 2.1, 2.8, pid=12)  # global 4 of 4
    verdict = check(r.obs)
    assert verdict.violations == []
    assert verdict.figures["limits"] == {
        "global": {"peak": 4, "number": 4},
        "grp:k0": {"peak": 2, "number": 3},
        "grp:k1": {"peak": 2, "number": 3},
    }
    # The overlap check judges such a run the same way (run_wait: one run of a key).
    one, two = r.call("run_wait", 4.0), r.call("run_wait", 4.1)
    lost = _lost_at_start(r, one, 4.0)
    r.ran(two, 4.5, 5.0, pid=13)
    assert check(r.obs).violations == []
    lost.trusted, lost.end = 4.6, 4.7  # seen valid until 4.6: call 5 entered at 4.5
    assert [(v.kind, v.calls) for v in check(r.obs).violations] == [("overlap", [4, 5])]
    lost.trusted, lost.end = 4.0, 4.01
    # A run whose lease was seen valid until 2.5 s is inside until then: call 3 entering
    # at 2.1 makes global 1 + 2 + 2 = 5.
    r.obs.bodies[1].trusted, r.obs.bodies[1].end = 2.5, 2.6
    assert [(v.kind, v.key, v.calls) for v in check(r.obs).violations] == [
        ("limit_exceeded", "global", [0, 2, 3])
    ]
    r.obs.bodies[1].trusted, r.obs.bodies[1].end = 1.0005, 1.0105
    # A run that enters a full limit is flagged as it enters, its lease lost or not.
    late = r.call("stack_retry", 2.2, key="k2")  # n=6: weight 2, global 2 + 2 + 2
    _lost_at_start(r, late, 2.2)
    found = check(r.obs).violations
    assert [(v.kind, v.key, v.calls) for v in found] == [("limit_exceeded", "global", [0, 3, 6])]
    assert "peak weight 6 (allowed 4)" in found[0].got
    assert found[0].window == (2.0, 2.2)


def test_the_limits_are_read_from_the_mode() -> None:
    """A mode of the caller's own (a fixed weight, a template over the key) is judged by
    its own numbers; a restart of the lock Redis in the window is counted apart."""
    mine = Mode("mine", "", {}, frozenset({"ran"}), limit=2, limits=(("tenant:{key}", 1),))
    r = Records()
    one, two = r.call("mine", 1.0), r.call("mine", 1.1, key="k1")
    r.ran(one, 1.0, 2.0)
    r.ran(two, 1.5, 2.5)  # another tenant: fits
    assert check(r.obs, {"mine": mine}).violations == []
    r.obs.bodies[1].key = "k0"
    verdict = check(r.obs, {"mine": mine})
    assert [(v.kind, v.key) for v in verdict.violations] == [("limit_exceeded", "tenant:k0")]
    r.obs.faults.append(FaultRecord("redis_restart", 1.2, 1.3))
    assert check(r.obs, {"mine": mine}).safe == []


def _parked_then_killed(r: Records, redelivered: bool, *, kill_after: float = 2.0) -> Call:
    """A stack_park call parked at 2.0 s; its worker killed ``kill_after`` s later; its
    next message received 12 s after the kill (a redelivery, or a fresh publish), then it
    ran."""
    call = r.call("stack_park", 1.0)
    r.obs.published.append(Publish(call.own_id, "inv.stack_park", 1.0, "driver"))
    r.obs.receipts.append(Receipt(call.own_id, "inv.stack_park", "w1", 1.1))
    r.obs.signals.append(SignalRecord("lock_parked", "k0", call.own_id, 2.0, 11))
    kill = 2.0 + kill_after
    r.obs.faults.append(FaultRecord("parked_kill", kill, kill + 1.0, "w1", "", [10, 11]))
    if redelivered:  # the countdown retry the killed worker kept comes back
        r.obs.published.append(Publish(call.own_id, "inv.stack_park", 1.9, "w1", eta=True))
        back = Receipt(call.own_id, "inv.stack_park", "w1", kill + 12.0, redelivered=True,
                       eta=True, lock_retries=1)  # fmt: skip
    else:  # published from the lock Redis once its limit had room
        r.obs.published.append(Publish(call.own_id, "inv.stack_park", kill + 3.0, "w1"))
        back = Receipt(call.own_id, "inv.stack_park", "w1", kill + 3.1)
    r.obs.receipts.append(back)
    r.ran(call, back.t + 0.1, back.t + 0.5)
    return call


def test_a_parked_call_that_waited_in_its_killed_worker_is_flagged() -> None:
    """A call parked when its whole worker was killed that came back as the broker's
    redelivery of a countdown retry waited in that worker: parked_in_worker. One published
    again from the lock Redis is fine, and so is a redelivery right after it parked (its
    message may not have been acknowledged yet)."""
    r = Records()
    _parked_then_killed(r, redelivered=True)
    assert r.kinds() == ["parked_in_worker"]
    r = Records()
    _parked_then_killed(r, redelivered=False)
    assert r.kinds() == []
    r = Records()
    _parked_then_killed(r, redelivered=True, kill_after=0.1)
    assert r.kinds() == []


def test_scenarios_of_held_back_modes_kill_a_worker_while_calls_are_parked() -> None:
    """A scenario with a mode whose calls a limit or a rate holds back also kills a whole
    worker while calls wait parked (drawn last: the seed gives the same calls with or
    without it); a scenario without such a mode does not."""
    from tests.invariants.scenario import generate  # noqa: PLC0415 - the generator

    spec = generate(900, modes=["stack_park", "stack_park_queue"], restarts=False)
    assert [f.kind for f in spec.faults].count("parked_kill") == 1
    plain = generate(900, modes=["stack_park", "stack_park_queue"], restarts=False,
                     faults=[f.kind for f in spec.faults if f.kind != "parked_kill"])  # fmt: skip
    assert [(c.at, c.n, c.key) for c in plain.calls] == [(c.at, c.n, c.key) for c in spec.calls]
    assert "parked_kill" not in {f.kind for f in generate(900, modes=["park", "run_skip"]).faults}
