"""Day-2 flows: operations on a running cluster, calling the engine from the layer above it."""
