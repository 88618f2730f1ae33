"""The role toolkit: what every role shares (the record types, templates, operations, facts,
controller state, the SSH command line, the pyinfra seam), below the roles and the engine.

Standard library only at import: the drift fast path imports the engine's fingerprint modules,
which reach this package, without pydantic or pyinfra."""

from toolkit.limits import raise_open_files_limit

# Before any toolkit module imports pyinfra, whose state module caps parallelism by this limit.
raise_open_files_limit()
