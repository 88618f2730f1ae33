"""The loadbalancer role: HAProxy in front of the API servers, keepalived for a shared address."""
