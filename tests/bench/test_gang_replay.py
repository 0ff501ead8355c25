"""The gang replay's pure parts (bench/gang_replay.py): the fixed sequence, the order its events are played in, and
the comparison of where Slurm and the platform put each job; the run on the real cluster is `python -m bench.run
gang_replay`."""

from bench import gang_replay
from bench.gang_replay import PREFERRED, REQUIRED, SEQUENCE, WAITING, Job, compare, events, replay, rows
from bench.report import gang_replay as gang_replay_report

SWITCHES = {"s1": ("n1", "n2", "n3"), "s2": ("n4", "n5", "n6")}
SMALL = (Job("a", 1, 2, "", 1, 2), Job("b", 2, 2, REQUIRED, 1, None), Job("c", 3, 2, PREFERRED, 2, None))


def test_the_sequence_fits_the_cluster_and_each_job_ends_after_it_arrives():
    assert 8 <= len(SEQUENCE) <= 12 and len({job.name for job in SEQUENCE}) == len(SEQUENCE)
    switch_size = gang_replay.NODES // gang_replay.LEAF_SWITCHES
    for job in SEQUENCE:
        assert 1 <= job.nodes <= switch_size and 1 <= job.cards <= 2  # every job fits one switch of 2-card nodes
        assert (job.nodes > 1) == bool(job.rack) and job.rack in ("", REQUIRED, PREFERRED)
        assert job.ends is None or job.ends > job.arrives
    assert {job.nodes for job in SEQUENCE} == {1, 2, 3} and {job.rack for job in SEQUENCE} == {"", REQUIRED, PREFERRED}
    assert sorted(job.limit for job in SEQUENCE if job.ends) == sorted(10 * job.ends for job in SEQUENCE if job.ends)


def test_each_step_plays_its_ends_before_its_arrivals_in_the_sequences_order():
    played = [(step, kind, job.name) for step, kind, job in events(SMALL)]
    assert played == [(1, "arrive", "a"), (1, "arrive", "b"), (2, "end", "a"), (2, "arrive", "c")]


class _FirstFree:
    """A stand-in system: each job on the first free whole nodes, in node order (no topology); what the replay asked
    of it, in order."""

    def __init__(self):
        self.calls, self.running, self.waiting = [], {}, []

    def arrive(self, job):
        self.calls.append(("arrive", job.name))
        self.waiting.append(job)

    def end(self, job):
        self.calls.append(("end", job.name))
        self.running.pop(job.name, None)

    def settle(self):
        self.calls.append(("settle",))
        for job in list(self.waiting):
            used = {node for nodes in self.running.values() for node in nodes}
            free = [node for switch in SWITCHES.values() for node in switch if node not in used]
            if len(free) >= job.nodes:
                self.running[job.name] = tuple(free[: job.nodes])
                self.waiting.remove(job)

    def snapshot(self):
        return {**self.running, **{job.name: WAITING for job in self.waiting}}


def test_the_replay_settles_and_reads_the_system_after_each_event():
    system = _FirstFree()
    played = replay(system, SMALL)
    assert system.calls == [
        ("arrive", "a"), ("settle",), ("arrive", "b"), ("settle",), ("end", "a"), ("settle",), ("arrive", "c"),
        ("settle",),
    ]  # fmt: skip
    assert [(event["step"], event["event"], event["job"]) for event in played] == [
        (1, "arrive", "a"), (1, "arrive", "b"), (2, "end", "a"), (2, "arrive", "c"),
    ]  # fmt: skip
    assert played[-1]["jobs"] == {"b": ("n2", "n3"), "c": ("n1", "n4", "n5")}


def _played(*snapshots):
    return [
        {"step": step, "event": event, "job": job, "jobs": jobs}
        for (step, event, job), jobs in zip([(1, "arrive", "a"), (1, "arrive", "b"), (2, "end", "a"),
                                              (2, "arrive", "c")], snapshots, strict=True)
    ]  # fmt: skip


def test_the_comparison_says_where_each_ran_its_switches_and_the_running_and_waiting_after_each_event():
    slurm = _played(
        {"a": ("n1",)},
        {"a": ("n1",), "b": ("n3", "n4")},  # b split over both switches: a required-rack violation
        {"b": ("n3", "n4")},
        {"b": ("n3", "n4"), "c": WAITING},
    )
    platform = _played(
        {"a": ("n4",)},
        {"a": ("n4",), "b": ("n1", "n2")},
        {"b": ("n1", "n2")},
        {"b": ("n1", "n2"), "c": ("n4", "n5", "n6")},
    )
    report = compare(SMALL, SWITCHES, slurm, platform)

    b = report["jobs"]["b"]
    assert b["job"] == "2x2, rack required" and (b["arrives"], b["ends"]) == (1, None)
    assert b["slurm"] == {"nodes": ["n3", "n4"], "switches": ["s1", "s2"], "one_switch": False, "started": 1}
    assert b["platform"] == {"nodes": ["n1", "n2"], "switches": ["s1"], "one_switch": True, "started": 1}
    assert report["jobs"]["c"]["slurm"] == {"nodes": [], "switches": [], "one_switch": None, "started": None}
    assert [(e["slurm_running"], e["slurm_waiting"], e["platform_running"], e["platform_waiting"])
            for e in report["events"]] == [(1, 0, 1, 0), (2, 0, 2, 0), (1, 0, 1, 0), (1, 1, 2, 0)]  # fmt: skip
    assert report["totals"]["slurm"] == {
        "gangs_ran": 1,
        "gangs": 2,
        "gangs_in_one_switch": 0,
        "required_violations": 1,
        "never_started": ["c"],
        "waiting_after_events": 1,
    }
    assert report["totals"]["platform"]["gangs_in_one_switch"] == 2
    assert report["totals"]["platform"]["required_violations"] == 0


def test_a_job_that_waited_shows_the_step_it_started_and_the_totals_close_the_table():
    slurm = _played(
        {"a": ("n1",)}, {"a": ("n1",), "b": WAITING}, {"b": ("n1", "n2")}, {"b": ("n1", "n2"), "c": WAITING}
    )
    platform = _played({"a": ("n1",)}, {"a": ("n1",), "b": ("n2", "n3")}, {"b": ("n2", "n3")}, {"b": ("n2", "n3"),
                       "c": ("n4", "n5", "n6")})  # fmt: skip
    report = {**compare(SMALL, SWITCHES, slurm, platform), "seconds": 61.5, "books_disagree": []}

    table = rows(report)
    assert table[1] == {
        "step": 1,
        "event": "b arrives (2x2, rack required)",
        "slurm: nodes (switch)": "waits; step 2: n1,n2 (s1)",
        "platform: nodes (switch)": "n2,n3 (s1)",
        "slurm run/wait": "1/1",
        "platform run/wait": "2/0",
    }
    assert table[2]["event"] == "a ends" and table[2]["slurm: nodes (switch)"] == "-"
    assert table[3]["slurm: nodes (switch)"] == "never ran"

    with_totals = gang_replay_report.report_rows(report, "1.0 -> 1.2")
    assert with_totals[-1]["step"] == "total" and with_totals[-1]["event"] == "61.5 s, load 1.0 -> 1.2"
    assert with_totals[-1]["platform: nodes (switch)"].endswith("; books = Slurm's NodeLists")
    headline = gang_replay_report.headline(with_totals)
    assert headline.figure.startswith("platform: 2/2 gangs in one switch, 0 required-rack violations")
    assert headline.baseline.startswith("Slurm: 1/1 gangs in one switch") and "never ran: c" in headline.baseline
