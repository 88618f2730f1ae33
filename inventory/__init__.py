"""The cluster model: load, validate and derive the topology the roles need."""
