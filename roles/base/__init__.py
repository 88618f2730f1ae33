"""The base role: hostname, /etc/hosts, apt sources, baseline packages, time sync, journald, sshd."""
