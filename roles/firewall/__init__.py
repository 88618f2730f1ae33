"""The firewall role: one nftables table of gpuinfra's own, input policy drop, topology peers."""
