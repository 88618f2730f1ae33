"""The gpuinfra command line: typer commands that parse options and call one engine function."""
