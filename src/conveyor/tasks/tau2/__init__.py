"""The `tau2` task family: tau2-bench's airline and retail customer-service domains
(see `conveyor.tasks.tau2.family` and docs/domains/tau2.md)."""

from conveyor.tasks.tau2.family import Tau2Family, Tau2Options

__all__ = ["Tau2Family", "Tau2Options"]
