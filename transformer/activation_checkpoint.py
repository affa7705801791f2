"""Activation checkpointing per block: keep a block's input, replay the block when its backward comes.

`block_forward`'s cache holds every intermediate of the block (two LayerNorms, attention's queries, keys,
values and probabilities, the feed-forward hidden layer): most of a training step's memory. A checkpointed
block throws that cache away as soon as its output is known and keeps only its input. The backward runs
`block_forward` once more on the kept input, gets the same cache back (the same operations on the same
arrays), and hands it to `block_backward`. Gradients are therefore bitwise the same; the price is one
extra block forward per block per step.
"""

from typing import NamedTuple

from .block import block_backward, block_forward


class BlockReplay(NamedTuple):
    """What `checkpointed_block_forward` keeps for `checkpointed_block_backward`: enough to run the block again.

    Attributes
    ----------
    x : ndarray of shape (B, T, d)
        The block's input, the one activation kept.
    p : dict
        The block's parameters (the arrays themselves, not copies).
    cfg : ModelConfig
        The configuration the block ran with.
    """

    x: object
    p: dict
    cfg: object


def checkpointed_block_forward(x, p, cfg, trace=None):
    """`block_forward`, keeping only what a replay needs.

    Parameters
    ----------
    x : ndarray of shape (B, T, d)
        The residual stream entering the block.
    p : dict
        The block's parameters, as `block_params` returns them.
    cfg : ModelConfig
        The model configuration.
    trace : dict, optional
        Passed to `block_forward`.

    Returns
    -------
    y : ndarray of shape (B, T, d)
        The residual stream leaving the block, exactly `block_forward`'s.
    replay : BlockReplay
        The input, the parameters and the config; the block's own cache is dropped here.
    """
    y, _ = block_forward(x, p, cfg, trace)  # eq:ckpt-keep
    return y, BlockReplay(x, p, cfg)  # eq:ckpt-keep


def checkpointed_block_backward(dy, replay, trace=None):
    """Replay the block from its kept input, then run `block_backward` on the fresh cache.

    Parameters
    ----------
    dy : ndarray of shape (B, T, d)
        Gradient with respect to the block's output.
    replay : BlockReplay
        What `checkpointed_block_forward` kept.
    trace : dict, optional
        Passed to `block_backward`.

    Returns
    -------
    dx : ndarray of shape (B, T, d)
        Gradient with respect to the block's input.
    grads : dict
        Gradient of each block parameter; the same as `block_backward` gives without checkpointing.
    """
    _, cache = block_forward(replay.x, replay.p, replay.cfg)  # eq:ckpt-replay
    return block_backward(dy, cache, trace)  # eq:ckpt-replay
