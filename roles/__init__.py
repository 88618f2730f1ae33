"""Roles: one package per role (its record, config, files, deploy, facts), and nothing else."""

from toolkit.limits import raise_open_files_limit

# Before any role imports pyinfra, whose state module caps parallelism by this limit at import.
raise_open_files_limit()
