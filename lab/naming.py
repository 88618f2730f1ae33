"""Names of everything a lab creates, derived from its name and slot so `down` finds it all."""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

from lab.errors import LabInvalid

# Labs live outside the repository: upper dirs hold whole root filesystems, keys are secrets.
LABS_DIR = Path("/var/lib/gpuinfra/labs")
DEFAULT_NAME = "lab"
# A valid cluster name (inventory.model.HostName) without dots or underscores, so that
# "gpuinfra.NAME.HOST" and "gpuinfra_lab_NAME" can be split back unambiguously.
_NAME = re.compile(r"^[a-z]([a-z0-9-]{0,22}[a-z0-9])?$")
# Names that already mean something else in the repository's inventory folder.
RESERVED_NAMES = frozenset({"sample"})
# Written as each link's alias: links are found again by it even when the state is lost.
LINK_ALIAS_PREFIX = "gpuinfra-lab:"
NETNS_PREFIX = "gpuinfra."
NFT_TABLE_PREFIX = "gpuinfra_lab_"
# Linux limits interface names to 15 characters (IFNAMSIZ 16 with the NUL).
IFNAME_MAX = 15


def check_lab_name(name: str) -> str:
    if name in RESERVED_NAMES:
        raise LabInvalid(f"the lab name {name!r} is reserved (inventory/{name} is not a lab)")
    if not _NAME.match(name):
        raise LabInvalid(
            f"invalid lab name {name!r}: use 1 to 24 lowercase letters, digits and dashes, "
            "starting with a letter"
        )
    return name


@dataclass(frozen=True)
class LabNames:
    """Every name a lab uses on the machine; slot is the lab's number in the address plan."""

    lab: str
    slot: int

    @property
    def state_dir(self) -> Path:
        return LABS_DIR / self.lab

    @property
    def bridge(self) -> str:
        return f"glab{self.slot}"

    @property
    def link_alias(self) -> str:
        return f"{LINK_ALIAS_PREFIX}{self.lab}"

    @property
    def nft_table(self) -> str:
        return nft_table_of(self.lab)

    def host_dir(self, host: str) -> Path:
        return self.state_dir / "hosts" / host

    def netns(self, host: str) -> str:
        return f"{netns_prefix_of(self.lab)}{host}"

    def veth_outside(self, index: int) -> str:
        """The machine's end of a host's veth pair, attached to the lab bridge."""
        return _ifname(f"gl{self.slot}h{index}")

    def veth_inside(self, index: int) -> str:
        """The host's end before it is moved into the namespace and renamed eth0."""
        return _ifname(f"gl{self.slot}p{index}")


def netns_prefix_of(lab: str) -> str:
    return f"{NETNS_PREFIX}{lab}."


def nft_table_of(lab: str) -> str:
    # nft identifiers allow no dashes; lab names allow no underscores, so this is reversible.
    return NFT_TABLE_PREFIX + lab.replace("-", "_")


def _ifname(name: str) -> str:
    if len(name) > IFNAME_MAX:
        raise LabInvalid(f"interface name {name} is longer than {IFNAME_MAX} characters")
    return name
