"""The etcd role: five dedicated members on local disk, mutual TLS, and their day-2 operations."""
