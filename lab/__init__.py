"""A lab of real Debian 13 hosts booted with systemd-nspawn on one machine, for tests."""
