"""The dispatch simulator: a virtual-time engine, runtime and SWE workload that the dispatch
benchmarks and tests drive (no real model, no sandboxes)."""
