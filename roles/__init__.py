"""Roles: one package per role (config, deploy, facts, managed files), plus the pyinfra runner."""

from roles.limits import raise_open_files_limit

# Before any role imports pyinfra, whose state module caps parallelism by this limit at import.
raise_open_files_limit()
