"""Topology-aware rolling: which hosts may change, or reboot, in the same step.

Each phase of each role declares how it may roll (toolkit/spec.py `Rolling`); a group takes the
policy of the phases that target it by name (a phase on every host sets none):

- together (etcd): the group's hosts are applied in one step, so a new cluster bootstraps with
  every member starting at once; restarts inside the deploy go one member at a time.
- one at a time (API servers, load balancers, DNS servers): never two of a group in a step.
- batches (workers): `--batch` sizes the steps, `--rate N/INTERVAL` spaces them.

Reboots take a member down whatever the policy says about applying, so every group with a
policy other than batches (a quorum or a served address) reboots one host at a time; and each
step waits for its hosts to come back before the next begins.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence

from toolkit.spec import Phase, Rolling

# When phases disagree about a group, the stricter requirement wins; `together` is needed for a
# bootstrap and its restarts are serial inside the deploy, so it outranks one at a time.
_STRICTNESS = {Rolling.batches: 0, Rolling.one_at_a_time: 1, Rolling.together: 2}


class BatchInvalid(ValueError):
    """A --batch value that is not N or P% (N >= 1, 0 < P <= 100)."""


def batch_size(batch: str, hosts: int) -> int:
    """Hosts per step for `--batch N` or `--batch P%` (at least one)."""
    text = batch.strip()
    try:
        if text.endswith("%"):
            percent = float(text[:-1])
            if not 0 < percent <= 100:
                raise ValueError
            return max(1, round(hosts * percent / 100))
        size = int(text)
        if size < 1:
            raise ValueError
        return size
    except ValueError:
        raise BatchInvalid(
            f"invalid batch {batch!r}: use N hosts (N >= 1) or P% (0 < P <= 100)"
        ) from None


def group_policies(phases: Iterable[Phase]) -> dict[str, Rolling]:
    policies: dict[str, Rolling] = {}
    for phase in phases:
        for group in phase.groups or ():
            current = policies.get(group, Rolling.batches)
            if _STRICTNESS[phase.rolling] > _STRICTNESS[current]:
                policies[group] = phase.rolling
            else:
                policies.setdefault(group, current)
    return policies


def plan_steps(
    hosts: Sequence[str],
    groups_of: Mapping[str, Sequence[str]],
    policies: Mapping[str, Rolling],
    size: int | None,
    *,
    rebooting: bool = False,
    paced_per_step: int | None = None,
) -> list[list[str]]:
    """Hosts in steps: at most `size` hosts a step (None: no limit) except that a `together`
    group never splits; never two hosts of a one-at-a-time group in a step; at most
    `paced_per_step` batch-policy hosts a step. Rebooting, every non-batch group is one at a
    time. Hosts keep their inventory order within a step; steps fill first-fit."""
    together: dict[str, list[str]] = {}
    units: list[list[str]] = []
    for host in hosts:
        groups = groups_of[host]
        quorum = next((g for g in groups if policies.get(g) is Rolling.together), None)
        if quorum is not None and not rebooting:
            if quorum not in together:
                together[quorum] = []
                units.append(together[quorum])
            together[quorum].append(host)
        else:
            units.append([host])

    exclusive_policies = {Rolling.one_at_a_time}
    if rebooting:
        exclusive_policies.add(Rolling.together)

    def exclusive(host: str) -> set[str]:
        return {g for g in groups_of[host] if policies.get(g) in exclusive_policies}

    steps: list[list[str]] = []
    for unit in units:
        unit_groups = set().union(*(exclusive(h) for h in unit))
        unit_paced = paced_hosts(unit, groups_of, policies)
        for step in steps:
            taken = set().union(*(exclusive(h) for h in step))
            if size is not None and len(step) + len(unit) > size:
                continue
            if unit_groups & taken:
                continue
            paced = paced_hosts(step, groups_of, policies) + unit_paced
            if paced_per_step is not None and paced > paced_per_step:
                continue
            step.extend(unit)
            break
        else:
            steps.append(list(unit))
    order = {host: index for index, host in enumerate(hosts)}
    return [sorted(step, key=order.__getitem__) for step in steps]


def paced_hosts(step: Sequence[str], groups_of, policies) -> int:
    """How many of a step's hosts draw from the --rate limit (the batch-policy ones)."""
    return sum(
        all(policies.get(g, Rolling.batches) is Rolling.batches for g in groups_of[host])
        for host in step
    )
