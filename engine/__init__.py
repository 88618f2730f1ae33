"""The engine: load with the registry's roles, run (plan, apply, drift, exact and fast),
orchestrate, lock, keep the controller's records, reboot, verify and report.

Standard library only at import: `gpuinfra drift` sends its probes from engine.fingerprint
before typer, pydantic or pyinfra is imported."""

from toolkit.limits import raise_open_files_limit

# Before the runner imports pyinfra, whose state module caps parallelism by this limit.
raise_open_files_limit()
