"""Runtimes: where a rollout's tools execute (simulated, bubblewrap, local, docker)."""
