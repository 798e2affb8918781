"""Chunked logprobs equal the full computation (values, entropy and gradients), float32."""

import pytest
import torch

from conveyor.trainer.chunked import chunked_token_logprobs, full_token_logprobs


def _inputs(n: int = 300, h: int = 32, v: int = 997, seed: int = 0):
    g = torch.Generator().manual_seed(seed)
    hidden = torch.randn(n, h, generator=g, dtype=torch.float32)
    weight = torch.randn(v, h, generator=g, dtype=torch.float32) * 0.3
    targets = torch.randint(0, v, (n,), generator=g)
    return hidden, weight, targets


@pytest.mark.parametrize("chunk", [64, 77, 300, 5000])
@pytest.mark.parametrize("temperature", [1.0, 0.7])
def test_values_entropy_and_gradients_equal_full(chunk: int, temperature: float) -> None:
    hidden, weight, targets = _inputs()
    advantages = torch.linspace(-1, 1, hidden.shape[0])
    grads = []
    outs = []
    for fn in (full_token_logprobs, chunked_token_logprobs):
        h = hidden.clone().requires_grad_(True)
        w = weight.clone().requires_grad_(True)
        kwargs = {"chunk_tokens": chunk} if fn is chunked_token_logprobs else {}
        lp, ent = fn(h, w, targets, temperature=temperature, with_entropy=True, **kwargs)
        assert ent is not None
        ((lp * advantages).sum() + 0.1 * ent.sum()).backward()
        outs.append((lp.detach(), ent.detach()))
        grads.append((h.grad, w.grad))
    assert torch.allclose(outs[0][0], outs[1][0], atol=1e-6, rtol=0)
    assert torch.allclose(outs[0][1], outs[1][1], atol=1e-6, rtol=0)
    assert torch.allclose(grads[0][0], grads[1][0], atol=1e-6, rtol=0)
    assert torch.allclose(grads[0][1], grads[1][1], atol=1e-5, rtol=0)


def test_tiny_chunks_differ_only_by_matmul_rounding() -> None:
    """Chunks of 1-2 rows take another BLAS kernel (matrix-vector): the same sums rounded in
    another order, 1-2 float32 ulps of a logprob near -10 (ulp 9.5e-7)."""
    hidden, weight, targets = _inputs()
    full, _ = full_token_logprobs(hidden, weight, targets)
    for chunk in (1, 2):
        lp, _ = chunked_token_logprobs(hidden, weight, targets, chunk_tokens=chunk)
        assert (lp - full).abs().max() <= 2 * 9.6e-7


def test_logprobs_are_log_softmax_at_the_targets() -> None:
    hidden, weight, targets = _inputs(n=10, v=50)
    lp, ent = chunked_token_logprobs(hidden, weight, targets, chunk_tokens=3)
    expected = (hidden @ weight.t()).log_softmax(-1).gather(1, targets[:, None]).squeeze(1)
    assert ent is None
    assert torch.allclose(lp, expected, atol=1e-6)


def test_chunking_keeps_one_chunk_of_logits_for_backward() -> None:
    """Under checkpointing, the saved tensors of the forward hold no [chunk x vocab] logits."""
    hidden, weight, targets = _inputs(n=256, h=16, v=4096)
    h = hidden.requires_grad_(True)
    biggest = 0

    def pack_hook(t: torch.Tensor) -> torch.Tensor:
        nonlocal biggest
        biggest = max(biggest, t.numel())
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack_hook, lambda t: t):
        chunked_token_logprobs(h, weight, targets, chunk_tokens=32)
    assert biggest < 32 * 4096  # the full path saves 256 x 4096 logits
    biggest = 0
    with torch.autograd.graph.saved_tensors_hooks(pack_hook, lambda t: t):
        full_token_logprobs(h, weight, targets)
    assert biggest >= 256 * 4096


def test_bad_input_is_refused() -> None:
    hidden, weight, targets = _inputs(n=4)
    with pytest.raises(ValueError, match="must be \\[N, H\\]"):
        chunked_token_logprobs(hidden[None], weight, targets)
    with pytest.raises(ValueError, match="chunk_tokens must be positive"):
        chunked_token_logprobs(hidden, weight, targets, chunk_tokens=0)
