"""The rollout Job: worker rollouts from inside the cluster (docs/fleet-jobs.md)."""
