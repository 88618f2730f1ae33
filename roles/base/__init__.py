"""The base role: hostname, /etc/hosts, apt sources, packages, time sync, journald, sshd."""
