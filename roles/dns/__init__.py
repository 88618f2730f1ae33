"""The dns role: Bind9 for the cluster domain (primary, secondaries) and every host's resolver."""
