"""Benchmarks: gpuinfra against raw pyinfra and ansible on lab hosts (`make bench`)."""
