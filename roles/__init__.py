"""Roles: one package per role (config, deploy, facts, managed files), plus the pyinfra runner."""
