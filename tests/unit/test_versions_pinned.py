"""Versions pinned together: the defaults are what the lab runs, and `inventory validate`
refuses Kubernetes with an etcd or containerd it cannot run on, or a minor gpuinfra lacks."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
import yaml
from typer.testing import CliRunner

from cli.main import app
from inventory import versions
from inventory.ansible_import import import_ansible
from inventory.model import Versions
from lab.gobuild import MODULES_DIR, GoModule

ROOT = Path(__file__).resolve().parents[2]
SAMPLE = ROOT / "inventory" / "sample" / "cluster.yml"
KUBESPRAY = Path(__file__).parent / "data" / "kubespray"
runner = CliRunner()


def module(name: str) -> GoModule:
    return GoModule(name, MODULES_DIR / name)


def test_the_defaults_and_the_sample_are_what_the_lab_builds():
    built = {
        "kubernetes": module("kubernetes-1.35").requirement("k8s.io/kubernetes"),
        "etcd": module("etcd-3.6").requirement("go.etcd.io/etcd/server/v3"),
        "containerd": module("containerd-2").requirement("github.com/containerd/containerd/v2"),
    }
    built = {key: version.lstrip("v") for key, version in built.items() if version}
    defaults = Versions()
    assert {key: getattr(defaults, key) for key in built} == built
    pinned = yaml.safe_load(SAMPLE.read_text())["versions"]
    assert {key: str(pinned[key]) for key in built} == built


def validate(tmp_path: Path, **pins: str):
    folder = tmp_path / "inv"
    folder.mkdir()
    data = yaml.safe_load(SAMPLE.read_text())
    data["versions"].update(pins)
    (folder / "cluster.yml").write_text(yaml.safe_dump(data, sort_keys=False))
    return runner.invoke(app, ["inventory", "validate", str(folder)])


def test_the_sample_validates():
    result = runner.invoke(app, ["inventory", "validate", str(SAMPLE.parent)])
    assert result.exit_code == 0, result.output


@pytest.mark.parametrize(
    ("pins", "expected"),
    [
        ({"etcd": "3.5.16"}, "versions.etcd: 3.5.16 is too old for Kubernetes 1.35: it needs "
         "etcd 3.5.24 or later"),
        ({"kubernetes": "1.36.1", "containerd": "1.7.24"}, "versions.containerd: 1.7.24 is too "
         "old for Kubernetes 1.36: it needs containerd 2.0.0 or later"),
    ],
)  # fmt: skip
def test_a_pin_below_what_kubernetes_needs_is_refused(tmp_path, pins, expected):
    result = validate(tmp_path, **pins)
    assert result.exit_code == 2
    lines = [line for line in result.output.splitlines() if line.startswith("error:")]
    assert len(lines) == 1 and expected in lines[0]


def test_the_minimum_is_the_oldest_that_passes(tmp_path):
    assert validate(tmp_path, etcd="3.5.24").exit_code == 0


def test_an_unsupported_minor_names_the_supported_range_first(tmp_path):
    result = validate(tmp_path, kubernetes="1.31.4")
    assert result.exit_code == 2
    lines = [line for line in result.output.splitlines() if line.startswith("error:")]
    assert "gpuinfra supports Kubernetes 1.35 to 1.36, not 1.31" in lines[0]
    assert "versions.kubernetes to a release of 1.35 to 1.36" in lines[0]


def test_an_import_pinned_to_an_unsupported_release_says_so_in_one_line(tmp_path):
    inventory = tmp_path / "kubespray"
    shutil.copytree(KUBESPRAY, inventory)
    settings = inventory / "group_vars" / "all.yml"
    settings.write_text(settings.read_text().replace("v1.35.4", "v1.31.4"))
    result = import_ansible(inventory / "inventory.ini", name="mycluster")
    lines = [line for line in result.unmapped if line.startswith("kube_version")]
    assert lines == [f"kube_version 1.31.4: {versions.unsupported_kubernetes('1.31.4')}"]
    # Positive control: the fixture as it is pins a supported release.
    supported = import_ansible(KUBESPRAY / "inventory.ini", name="mycluster")
    assert not [line for line in supported.unmapped if line.startswith("kube_version")]
