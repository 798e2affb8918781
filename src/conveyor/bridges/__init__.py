"""Bridges to other training systems (Tinker, VeRL, SkyRL-train) and the checks that prove them.

Each bridge turns our token-exact samples into the other system's own request or batch types,
built with that system's real classes, and `conveyor bridge check --backend NAME` checks the
result against our samples (`conveyor.bridges.report`).
"""
