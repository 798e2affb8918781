"""The recording gateway: OpenAI chat completions over any `SamplingClient`, one base URL per
rollout, every turn recorded token-exact as a `Turn` so outside agents train like native ones.

- `service.Gateway`: the rollouts and their ledgers (no HTTP);
- `app.make_app`: the ASGI app serving a `Gateway`;
- `server`: serving it on a port, in-process or as `conveyor gateway`;
- `external.ExternalAgentStages`: rollouts of an outside agent program pointed at the gateway.

See docs/gateway.md for the HTTP contract.
"""
