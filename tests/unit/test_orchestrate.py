"""Rolling by topology: steps never split a quorum group's bootstrap, never hold two members of
a one-at-a-time group, respect --batch and --rate, and reboots go one quorum member at a time."""

from __future__ import annotations

import pytest

from engine.orchestrate import BatchInvalid, batch_size, group_policies, plan_steps
from engine.registry import PHASES
from toolkit.spec import Rolling

GROUPS = {
    **{f"etcd-{i}": ["etcd"] for i in range(1, 6)},
    "cp-1": ["control_plane"],
    "cp-2": ["control_plane"],
    "lb-1": ["loadbalancer"],
    "lb-2": ["loadbalancer"],
    "dns-1": ["dns"],
    "mon-1": ["monitoring", "dns"],
    **{f"cpu-{i}": ["cpu_worker"] for i in range(1, 7)},
}
HOSTS = list(GROUPS)
POLICIES = group_policies(PHASES)


def test_the_registered_roles_give_each_group_its_policy():
    assert POLICIES["etcd"] is Rolling.together
    for group in ("control_plane", "loadbalancer", "dns"):
        assert POLICIES[group] is Rolling.one_at_a_time
    assert POLICIES.get("cpu_worker", Rolling.batches) is Rolling.batches


@pytest.mark.parametrize(("batch", "size"), [("3", 3), ("50%", 9), ("1%", 1), ("100%", 18)])
def test_batch_sizes(batch, size):
    assert batch_size(batch, 18) == size


@pytest.mark.parametrize("batch", ["1.5", "0", "-2", "0%", "101%", "x", "", "5%%"])
def test_bad_batches_are_refused(batch):
    with pytest.raises(BatchInvalid, match="invalid batch"):
        batch_size(batch, 18)


def exclusive_groups_respected(steps, groups=("control_plane", "loadbalancer", "dns")):
    for step in steps:
        for group in groups:
            assert sum(group in GROUPS[h] for h in step) <= 1, (group, step)


def test_batch_one_keeps_the_etcd_members_together():
    """`apply --batch 1` on bare hosts: etcd's members must start in the same step."""
    steps = plan_steps(HOSTS, GROUPS, POLICIES, 1)
    etcd_steps = [s for s in steps if any(h.startswith("etcd") for h in s)]
    assert etcd_steps == [[f"etcd-{i}" for i in range(1, 6)]]
    assert all(len(s) == 1 for s in steps if s not in etcd_steps)
    assert sorted(h for s in steps for h in s) == sorted(HOSTS)


def test_half_batches_never_hold_two_members_of_a_serving_group():
    steps = plan_steps(HOSTS, GROUPS, POLICIES, batch_size("50%", len(HOSTS)))
    exclusive_groups_respected(steps)
    assert sorted(h for s in steps for h in s) == sorted(HOSTS)
    assert all(len(s) <= 9 for s in steps if "etcd-1" not in s)


def test_reboots_take_quorum_members_one_at_a_time():
    steps = plan_steps(HOSTS, GROUPS, POLICIES, batch_size("50%", len(HOSTS)), rebooting=True)
    exclusive_groups_respected(steps, ("etcd", "control_plane", "loadbalancer", "dns"))
    assert len([s for s in steps if any(h.startswith("etcd") for h in s)]) == 5
    # Workers still go in big steps alongside them.
    assert max(sum(h.startswith("cpu") for h in s) for s in steps) > 1


def test_rate_caps_the_workers_per_step():
    steps = plan_steps(HOSTS, GROUPS, POLICIES, None, paced_per_step=2)
    for step in steps:
        assert sum(h.startswith("cpu") for h in step) <= 2
    exclusive_groups_respected(steps)


def test_phase_on_every_host_sets_no_group_policy():
    assert "all" not in POLICIES
