"""The command line stays light: commands that do not connect never import the engine's heavy
dependencies (pyinfra, gevent, ansible), the ones that connect still get gevent's patch, and a
command imports only its own command module: `--help` builds no inventory model and
`inventory validate` neither rich nor any other command's module."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
HEAVY = ("pyinfra", "gevent", "ansible", "cryptography", "jinja2")
# What an inventory's model needs, and --help does not.
MODEL = ("pydantic", "yaml", "inventory.model", "engine.registry")
# Every command module but the inventory group's, and what only they import.
OTHER_COMMANDS = (
    "cli.engine",
    "cli.render",
    "cli.verify",
    "cli.lab",
    "cli.health",
    "cli.etcd",
    "cli.kubernetes",
    "lab",
    "day2",
    "engine.verify",
)


def loaded_after(*argv: str, names: tuple[str, ...] = HEAVY) -> dict[str, bool]:
    """Run the CLI in a fresh interpreter and report which of `names` it imported."""
    script = f"""
import json, sys
sys.argv = ["gpuinfra", *{list(argv)!r}]
from cli.main import app
try:
    app()
except SystemExit:
    pass
print(json.dumps({{name: name in sys.modules for name in {list(names)!r}}}), file=sys.stderr)
"""
    result = subprocess.run(
        [sys.executable, "-c", script], cwd=REPO, capture_output=True, text=True, check=True
    )
    return json.loads(result.stderr.strip().splitlines()[-1])


@pytest.mark.parametrize(
    "argv",
    [("--help",), ("inventory", "validate", "inventory/sample"), ("lab", "--help")],
)
def test_commands_that_do_not_connect_skip_the_engine(argv: tuple[str, ...]) -> None:
    loaded = loaded_after(*argv)
    assert loaded == dict.fromkeys(HEAVY, False)


def test_help_builds_no_inventory_model() -> None:
    loaded = loaded_after("--help", names=MODEL)
    assert loaded == dict.fromkeys(MODEL, False)


def test_validate_imports_no_other_command_and_no_rich() -> None:
    names = (*OTHER_COMMANDS, "rich")
    loaded = loaded_after("inventory", "validate", "inventory/sample", names=names)
    assert loaded == dict.fromkeys(names, False)


def test_the_probe_sees_each_command_module_when_it_is_needed() -> None:
    # Positive controls: --help lists every command, so it builds them all (with rich's help
    # panels); validate builds the inventory's model; a table is printed with rich.
    names = (*OTHER_COMMANDS[:7], "rich")
    assert loaded_after("--help", names=names) == dict.fromkeys(names, True)
    assert loaded_after("inventory", "validate", "inventory/sample", names=MODEL) == dict.fromkeys(
        MODEL, True
    )
    assert loaded_after("inventory", "show", "inventory/sample", names=("rich",)) == {"rich": True}


def test_the_probe_sees_heavy_imports_when_they_happen(tmp_path: Path) -> None:
    # Positive control: rendering imports the roles' files and their templates (jinja2); the
    # deploys (pyinfra) stay unloaded, the role records name them lazily.
    loaded = loaded_after("render", "inventory/sample", "--out", str(tmp_path))
    assert loaded["jinja2"] and not loaded["pyinfra"]


def test_connecting_patches_the_standard_library_for_gevent() -> None:
    script = """
import socket, warnings
warnings.simplefilter("error")  # a MonkeyPatchWarning (ssl imported too early) fails the run
import cli.main
from cli import connecting
connecting()
from gevent import monkey
import engine.runner
assert monkey.is_module_patched("socket") and monkey.is_module_patched("ssl")
print("patched")
"""
    result = subprocess.run(
        [sys.executable, "-c", script], cwd=REPO, capture_output=True, text=True, check=False
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "patched"


def test_every_listed_command_is_built_under_its_name() -> None:
    from typer.main import get_command

    from cli.main import COMMANDS, app

    root = get_command(app)
    assert list(root.list_commands(None)) == list(COMMANDS)
    for name in COMMANDS:
        command = root.get_command(None, name)
        assert command is not None and command.name == name
        assert command.help, f"{name} has no help text"
