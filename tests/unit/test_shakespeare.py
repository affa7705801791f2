"""The model really learns: a short float32 run on Tiny Shakespeare (slow; CI runs it).

    scripts/test -m slow
"""

import pytest

from transformer.config import PRESETS
from transformer.train import train
from transformer.train_config import TrainConfig

@pytest.mark.slow
def test_config_a_learns_tiny_shakespeare_in_1000_steps(tmp_path, corpus):
    """1000 steps of config A with the demo's batch and warm-up at a peak rate
    of 3e-3 (about 100 s here). scripts/demo (15000 steps at 6e-3) ended at a
    validation loss of 1.54 in a run of 2026-12-05, at 1.89 at step 1000. A model that only
    learned character frequencies scores 3.35 on the validation split (the
    training split's unigram distribution), an untrained one about ln 65 = 4.17."""
    cfg = TrainConfig(steps=1000, batch_size=32, lr=3e-3, warmup=200, eval_every=1000, ckpt_every=1000)
    summary = train(corpus, tmp_path / "run", PRESETS["A"], cfg, progress=False)
    assert summary["val_loss"] < 2.0
