"""The monitoring role: node exporter on every host, Prometheus with alert rules on the monitoring
group, Grafana dashboards as cluster files."""
