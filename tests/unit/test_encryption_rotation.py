"""`kubernetes rotate-secrets-key` offline (day2/encryption.py): a stand-in for the nodes keeps
each control-plane node's key file and what its API server has loaded, and etcd's Secrets by the
key that encrypted them. The order that keeps every Secret readable, the waits, a stop that an
apply refuses to walk over, and a second run that finishes it. The real API servers and etcd
are the lab test's (tests/integration/test_kubernetes.py)."""

from __future__ import annotations

import hashlib
import re

import pytest
from typer.testing import CliRunner

from cli.main import app
from day2 import encryption as rotation
from day2.kubernetes import KubernetesOperationError
from roles.kubernetes import encryption
from toolkit.remote import RemoteResult

OLD = encryption.new_key()


@pytest.fixture
def loaded(small_cluster, load_small):
    small_cluster["hosts"]["cp-3"] = {"address": "10.0.0.23", "groups": ["control_plane"]}
    cluster = load_small()
    path = cluster.state_dir / encryption.KEY_STATE
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(OLD + "\n")
    return cluster


class Nodes:
    """Control-plane nodes and etcd as the flow's commands see them. An API server in `stale`
    never loads a new file (its wait times out); `unwritten` Secrets keep their key through
    the rewrite (one the rewrite missed)."""

    def __init__(self, stale: set[str] = frozenset(), unwritten: int = 0):
        self.files: dict[str, str] = {}
        self.loaded: dict[str, str] = {}
        self.secrets = [encryption.key_name(OLD)] * 3  # the key each Secret is under
        self.stale = set(stale)
        self.unwritten = unwritten
        self.calls: list[tuple[str, str, bytes | None]] = []

    def __call__(self, loaded, host, command, timeout, stdin=None):
        self.calls.append((host, command, stdin))
        if "cat > " in command:
            self.files[host] = stdin.decode()
            if host not in self.stale:
                digest = hashlib.sha256(stdin).hexdigest()
                self.loaded[host] = f"sha256:{digest}"
            return RemoteResult(host, 0, "")
        if rotation.LOADED_METRIC in command:
            wanted = re.search(r'hash="(sha256:[0-9a-f]+)"', command).group(1)
            return RemoteResult(host, 0 if self.loaded.get(host) == wanted else 1, "")
        if "replace -f -" in command:
            # Each Secret written again goes under the key that encrypts on the first node.
            first = re.search(r"name: (key-[0-9a-f]+)", self.files["cp-1"]).group(1)
            kept = self.secrets[: self.unwritten]
            self.secrets = kept + [first] * (len(self.secrets) - len(kept))
            return RemoteResult(host, 0, "")
        if "etcdctl" in command:
            name = re.search(r"v1:(key-[0-9a-f]+):", command).group(1)
            return RemoteResult(host, 0, f"{self.secrets.count(name)}\n")
        return RemoteResult(host, 0, "")

    def keys_on(self, host: str) -> list[str]:
        return re.findall(r"name: (key-[0-9a-f]+)", self.files.get(host, ""))


def test_a_rotation_adds_switches_rewrites_then_drops_the_old_key(loaded):
    nodes = Nodes()
    outcome = rotation.rotate_key(loaded, runner=nodes)
    new = (loaded.state_dir / encryption.KEY_STATE).read_text().strip()
    assert new != OLD and not (loaded.state_dir / encryption.NEXT_KEY_STATE).exists()
    old_name, new_name = encryption.key_name(OLD), encryption.key_name(new)
    # The files each node was given, in order: both keys (old first), both (new first), new.
    writes = [(host, stdin.decode()) for host, command, stdin in nodes.calls if "cat > " in command]
    expected = [(OLD, new), (new, OLD), (new,)]
    assert [text for _, text in writes] == [
        encryption.config_file_text(*keys) for keys in expected for _ in range(3)
    ]
    assert [host for host, _ in writes] == ["cp-1", "cp-2", "cp-3"] * 3
    # Each node's API server reported the file loaded before the next node was given it.
    steps = [(s.host, s.action) for s in outcome.steps]
    for action in ("add the next key", "encrypt with the next key", "drop the old key"):
        order = [h for h, a in steps if a.startswith(action)]
        assert order == ["cp-1", "cp-1", "cp-2", "cp-2", "cp-3", "cp-3"], (action, order)
    # Every Secret rewritten, etcd counted on an etcd member before the old key went.
    rewrite = steps.index(("cp-1", "rewrite every Secret with the next key"))
    count = steps.index(("etcd-1", "count the Secrets etcd holds under the old key"))
    assert (
        steps.index(("cp-3", "encrypt with the next key: wait until the API server loaded it"))
        < rewrite
        < count
    )
    assert count < steps.index(("cp-1", "drop the old key: write the key file"))
    assert nodes.secrets == [new_name] * 3
    assert all(nodes.keys_on(host) == [new_name] for host in ("cp-1", "cp-2", "cp-3"))
    # No key on any command line: the files went on stdin.
    assert not any(OLD in command or new in command for _, command, _ in nodes.calls)
    assert any(old_name in note and new_name in note for note in outcome.notes)


def test_an_api_server_that_does_not_load_the_file_stops_the_rotation_and_apply_waits(loaded):
    nodes = Nodes(stale={"cp-2"})
    with pytest.raises(KubernetesOperationError) as stopped:
        rotation.rotate_key(loaded, runner=nodes)
    said = str(stopped.value)
    assert "step add" in said and "cp-2" in said and "run the command again" in said.lower()
    # cp-3 was never given a file; the old key still encrypts everywhere; the state keeps both.
    assert "cp-3" not in nodes.files
    assert all(nodes.keys_on(h)[0] == encryption.key_name(OLD) for h in nodes.files)
    assert (loaded.state_dir / encryption.KEY_STATE).read_text().strip() == OLD
    assert (loaded.state_dir / encryption.NEXT_KEY_STATE).exists()
    assert "rotate-secrets-key" in encryption.rotation_findings(loaded)[0]
    # Control: once cp-2 loads what it is given, running again finishes with the same next key.
    upcoming = (loaded.state_dir / encryption.NEXT_KEY_STATE).read_text().strip()
    nodes.stale.clear()
    rotation.rotate_key(loaded, runner=nodes)
    assert (loaded.state_dir / encryption.KEY_STATE).read_text().strip() == upcoming
    assert encryption.rotation_findings(loaded) == []


def test_a_secret_left_under_the_old_key_keeps_the_old_key(loaded):
    nodes = Nodes(unwritten=1)
    with pytest.raises(KubernetesOperationError, match="etcd still holds 1 Secret"):
        rotation.rotate_key(loaded, runner=nodes)
    # Nothing dropped: every node still reads the old key.
    old_name = encryption.key_name(OLD)
    assert all(old_name in nodes.keys_on(h) for h in ("cp-1", "cp-2", "cp-3"))
    assert (loaded.state_dir / encryption.KEY_STATE).read_text().strip() == OLD


def test_the_command_lists_its_steps_and_needs_a_kept_key(loaded):
    result = CliRunner().invoke(app, ["kubernetes", "rotate-secrets-key", "--help"])
    assert result.exit_code == 0
    for step in ("new-key", "add", "switch", "rewrite", "drop"):
        assert step in result.output
    (loaded.state_dir / encryption.KEY_STATE).unlink()
    with pytest.raises(KubernetesOperationError, match="no Secrets key is kept"):
        rotation.rotate_key(loaded, runner=Nodes())
