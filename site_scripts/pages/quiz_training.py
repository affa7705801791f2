"""Generator of the Training chapter's quiz (site_scripts/pages/_quiz.py): the learning rate at step 0, which
parameters weight decay pulls, what clipping does, and what a window's targets are, each answer and each wrong
choice computed by the training code itself (the schedule, `is_decayed`, `clip_grads` on the tiny model's real
gradients, `sample_batch`)."""

import json

import numpy as np

from transformer.config import PRESETS
from transformer.data import CharTokenizer, sample_batch
from transformer.model import init_params, loss_and_grads, param_shapes
from transformer.optim import clip_grads, global_norm, is_decayed, lr_at
from transformer.train_config import TrainConfig

from ..sections import page_link
from ._quiz import Choice, Question, page

CFG = PRESETS["tiny"]
TEXT = "First Citizen: Before we proceed any further, hear me speak."
WINDOW, BATCH_SEED = 6, 1  # a window that does not start the text, so the window before it exists


def warmup_start():
    """`lr_at` at step 0 with the training defaults, against the three other rates of the schedule a reader
    may expect there: zero, the floor and the peak."""
    tc = TrainConfig()
    first = lr_at(0, tc.lr, tc.warmup, tc.steps, tc.min_lr)
    peak_at = next(s for s in range(tc.steps) if lr_at(s, tc.lr, tc.warmup, tc.steps, tc.min_lr) == tc.lr)
    floor_at = tc.steps  # the schedule's floor: lr_at gives min_lr from here on
    if lr_at(floor_at, tc.lr, tc.warmup, tc.steps, tc.min_lr) != tc.min_lr:
        raise ValueError("lr_at no longer reaches its floor at the last step: rewrite this question")
    return Question(
        "quiz-warmup",
        f"With the training defaults (peak \\(\\eta_{{\\max}}\\) = {tc.lr:g}, \\(N_w\\) = {tc.warmup} warm-up steps, "
        f"\\(N_s\\) = {tc.steps} steps, floor \\(\\eta_{{\\min}}\\) = {tc.min_lr:g}), what learning rate does "
        f"`lr_at` give step 0?",
        (Choice(f"{first:g}",
                f"Warm-up counts step \\(s\\) as \\((s + 1)/N_w\\) of the way to the peak: step 0 gets "
                f"\\(\\eta_{{\\max}}/N_w\\) = {tc.lr:g}/{tc.warmup} = {first:g}, so the first update already moves "
                f"the weights, and step {peak_at} reaches the peak.", right=True),
         Choice("0",
                f"A warm-up from zero would make step 0 an update that changes nothing. `lr_at` uses "
                f"\\(s + 1\\), so step 0 already gets {first:g}."),
         Choice(f"{tc.min_lr:g}",
                f"That is the floor, where the cosine ends: `lr_at` gives it from step {floor_at} on. Warm-up starts "
                f"below it, at {first:g}."),
         Choice(f"{tc.lr:g}",
                f"That is the peak, reached at the end of warm-up (step {peak_at}). Starting there, while Adam's "
                f"estimates of \\(v\\) are still noisy, is what warm-up avoids.")),
        page_link("quiz_training", "optim", "eq-lr-warmup"), "AdamW, the schedule and clipping: linear warm-up")


def decayed():
    """Which parameter weight decay pulls towards zero: one name `is_decayed` accepts, three it refuses (a
    bias, a LayerNorm gain, a LayerNorm shift), all names of the tiny model."""
    shapes = param_shapes(CFG)
    right, bias, gain, shift = "tok_emb", "b0.bq", "b0.ln1_g", "lnf_b"
    named = {right, bias, gain, shift} <= set(shapes)
    if not (named and is_decayed(right) and not any(map(is_decayed, (bias, gain, shift)))):
        raise ValueError("is_decayed or the parameters' names changed: rewrite this question")
    names = [n for n in shapes if is_decayed(n)]
    scalars = sum(int(np.prod(shapes[n])) for n in names)
    total = sum(int(np.prod(s)) for s in shapes.values())
    return Question(
        "quiz-decay",
        "Which of these parameters does AdamW's weight decay pull towards zero?",
        (Choice(f"`{right}`",
                f"`is_decayed(\"{right}\")` is True: the weight matrices and the embedding tables are decayed. "
                f"In the tiny model that is {len(names)} of its {len(shapes)} tensors, {scalars} of its {total} "
                f"scalars.", right=True),
         Choice(f"`{bias}`",
                f"A bias, which `is_decayed` leaves alone: it only shifts a layer's output, and pulling it towards "
                f"zero regularises nothing."),
         Choice(f"`{gain}`",
                f"A LayerNorm gain, which `is_decayed` leaves alone: shrinking a gain towards zero would fight the "
                f"normalisation rather than regularise the model."),
         Choice(f"`{shift}`",
                f"The final LayerNorm's shift, which `is_decayed` leaves alone, like every bias and shift.")),
        page_link("quiz_training", "optim", "which-parameters-are-decayed"),
        "AdamW, the schedule and clipping: which parameters are decayed")


def clipping():
    """What `clip_grads` does to the tiny model's real gradients with a threshold of half their global norm,
    against per-tensor clipping, clipping of entries, and normalising, each worked out on the same gradients."""
    params = init_params(CFG, seed=0)
    ids = np.array([[2, 0, 2, 1]])
    _, grads = loss_and_grads(params, ids, np.array([[0, 2, 1, 3]]), CFG)
    norm = global_norm(grads)
    limit = norm / 2
    clipped, _ = clip_grads(grads, limit)
    factor = float(clipped["tok_emb"].ravel()[0] / grads["tok_emb"].ravel()[0])
    own = {name: float(np.linalg.norm(g)) for name, g in grads.items()}
    largest_tensor = max(own, key=own.get)
    largest_entry = max(float(np.abs(g).max()) for g in grads.values())
    return Question(
        "quiz-clipping",
        f"The tiny model's gradients on the window `{ids[0].tolist()}` have a global norm of {norm:.4f}. What does "
        f"`clip_grads(grads, max_norm)` do with `max_norm` = {limit:.4f}, half of it?",
        (Choice("Multiplies every gradient by one factor, so that the global norm becomes `max_norm`",
                f"The factor is `max_norm`/(norm + 1e-6) = {factor:.6f}, the same for every entry of every tensor; "
                f"the global norm after is {global_norm(clipped):.4f}. The step keeps its direction and gets "
                f"shorter.", right=True),
         Choice("Scales down each tensor whose own norm exceeds `max_norm`, one tensor at a time",
                f"That is per-tensor clipping. Here no tensor's own norm exceeds {limit:.4f} (the largest, "
                f"`{largest_tensor}`'s, is {own[largest_tensor]:.4f}), so it would change nothing, and the global "
                f"norm would stay {norm:.4f}."),
         Choice("Cuts every entry larger than `max_norm` in magnitude down to `max_norm`",
                f"That is clipping by value, which changes the step's direction. Here the largest entry is "
                f"{largest_entry:.4f}, below {limit:.4f}: it would change nothing."),
         Choice("Divides every gradient by the global norm, so that the norm becomes 1",
                f"That would normalise every step, large or small, and ignore `max_norm`. Clipping leaves a norm "
                f"at or below `max_norm` alone and scales larger ones down to it: {limit:.4f} here, not 1.")),
        page_link("quiz_training", "optim", "eq-clip"), "AdamW, the schedule and clipping: global-norm clipping")


def targets():
    """A window `sample_batch` draws and its targets, against the targets of three slips: the window itself,
    its last next token alone, and the window one token earlier."""
    tok = CharTokenizer.from_text(TEXT)
    data = tok.encode(TEXT)
    x, y = sample_batch(data, 1, WINDOW, np.random.default_rng(BATCH_SEED))
    starts = [s for s in range(len(data) - WINDOW) if (data[s:s + WINDOW] == x[0]).all()
              and (data[s + 1:s + WINDOW + 1] == y[0]).all()]
    if len(starts) != 1 or starts[0] == 0:
        raise ValueError(f"the window is found at {starts}: choose another seed or text")
    start = starts[0]

    def quote(ids):
        return f"`{json.dumps(tok.decode(ids))}`"
    return Question(
        "quiz-targets",
        f"From the text {quote(data)}, `sample_batch` with \\(T\\) = {WINDOW} draws the window `x` = {quote(x[0])}. "
        f"What are its targets `y`?",
        (Choice(quote(y[0]),
                f"The window shifted by one character: at each of the {WINDOW} positions the target is the character "
                f"that follows it in the text, so one window gives {WINDOW} predictions to learn from.", right=True),
         Choice(quote(x[0]),
                "Targets equal to the inputs would teach the model to copy the character it reads, which it can do "
                "without learning anything about the text. The target of a position is the next character."),
         Choice(quote(y[0][-1:]),
                f"Only the character after the window. `sample_batch` gives a target at every position, "
                f"{WINDOW} per window: the causal mask lets each position predict its next character from what came "
                f"before it, all in one forward pass."),
         Choice(quote(data[start - 1:start - 1 + WINDOW]),
                "That is the window shifted the other way, one character earlier: each position would be asked for "
                "the character before it, which it has already seen.")),
        page_link("quiz_training", "training", "eq-next-token"),
        "Training loop and data: targets are the inputs shifted by one")


def questions():
    """The quiz's questions, in the order of the chapter's pages."""
    return [warmup_start(), decayed(), clipping(), targets()]


def generate(context):
    return page(questions())
