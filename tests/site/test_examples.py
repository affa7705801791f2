"""The shared inputs of the pages' examples: the tiny model's backward, replayed call by call, is the
model's own backward."""

import numpy as np

from site_scripts.examples import TINY_TARGETS, tiny
from site_scripts.tiny_backward import tiny_backward
from transformer.model import loss_and_grads


def test_the_replayed_backward_gives_what_loss_and_grads_gives():
    ex, replay = tiny(), tiny_backward()
    loss, grads = loss_and_grads(ex.params, ex.ids, np.array([TINY_TARGETS]), ex.cfg)
    assert replay.loss == loss and replay.grads.keys() == grads.keys()
    for name, g in grads.items():
        np.testing.assert_array_equal(replay.grads[name], g, err_msg=name)


def test_the_replay_starts_from_the_cross_entropy_gradient_and_ends_at_the_embedding():
    ex, replay = tiny(), tiny_backward()
    z = ex.trace["logits"][0]
    p = np.exp(z - z.max(-1, keepdims=True))
    p /= p.sum(-1, keepdims=True)
    expected = (p - np.eye(ex.cfg.vocab_size)[TINY_TARGETS]) / len(TINY_TARGETS)  # (P - e_y) / N, by hand
    np.testing.assert_allclose(replay.steps["dlogits"][0], expected, rtol=1e-12, atol=1e-15)
    names = list(replay.steps)
    assert names[:2] == ["dlogits", "dlnf"] and names[-1] == "dembedding"
    assert names.index(f"b{ex.cfg.num_layers - 1}.dout") < names.index("b0.dout")
    np.testing.assert_array_equal(replay.steps["dembedding"], replay.steps["b0.din"])
