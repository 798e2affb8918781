"""The RL trainer: algorithms (advantages, status filtering, policy losses) and the training loop.

`conveyor.trainer.advantages` and `conveyor.trainer.filtering` are pure Python; only
`conveyor.trainer.losses` imports torch, so importing this package stays cheap. The math is
written out in `docs/algorithms.md`.
"""
