"""Sampling clients: token ids in, token ids and logprobs out."""
