"""One comparison of a NumPy tensor with torch's, and the tolerances it is judged by: the rows of every
cross-check (transformer/crosscheck.py and the checks of fine-tuning, memory policies and serving beside it).

Each gap is reported two ways: max |ours - torch| and that divided by the larger of max |ours| and max |torch|
(a scale-free relative gap, as in gradcheck.relative_gap).
"""

from dataclasses import dataclass

import numpy as np

from .gradcheck import relative_gap


@dataclass(frozen=True)
class Tolerance:
    rel: float  # passes when max|ours - torch| / max|ours| <= rel ...
    abs: float  # ... or when max|ours - torch| <= abs (tensors that are ~0, like the key-bias gradient)
    why: str


TOLERANCES = {
    "float64": Tolerance(1e-9, 1e-12, (
        "both sides compute in float64 and differ only in the order of additions (matmul blocking, "
        "reductions); that leaves relative gaps of 1e-16 to 1e-12 through this model and ten "
        "training steps, so 1e-9 keeps a margin of 1e3 while a gradient 0.1% wrong (gap 1e-3) fails "
        "by a factor of 1e6")),
    "float32": Tolerance(1e-4, 3e-8, (
        "torch computes in float32 (unit round-off 6e-8) against our float64 reference; rounding "
        "grows through a few layers, the backward pass and ten AdamW steps to gaps of 1e-7 to a few "
        "1e-6, so 1e-4 passes them and still fails a 0.1% error by a factor of 10. The key-bias "
        "gradient, zero in exact arithmetic, comes out of float32 as noise near 3e-9")),
}

# The engine against the hand-written backward: both NumPy float64, the same sums in another order.
AUTOGRAD_TOLERANCE = Tolerance(1e-12, 1e-14, (
    "both are NumPy float64 computations of the same gradients that differ only in the order of "
    "operations, which leaves relative gaps of 1e-16 to 1e-15; 1e-12 keeps a margin of 1e3. The key-bias "
    "gradient, exactly zero, is rounding noise near 1e-17 on both sides: the absolute bound 1e-14 covers it"))


@dataclass
class Row:
    """One comparison of a NumPy tensor with torch's. A report holds these as dicts: `Row(**d)` reads one back."""
    device: str
    dtype: str
    check: str  # forward, loss, intermediate, gradient, kv-cache, adamw step, train step
    tensor: str
    max_abs: float
    max_rel: float
    tol_rel: float
    tol_abs: float
    passed: bool
    step: int | None = None  # the optimizer or training step (from 1) of an "adamw step" or "train step" row

    @property
    def label(self):
        """The check as a reader names it: "gradient", "adamw step 3"."""
        return self.check if self.step is None else f"{self.check} {self.step}"

    @property
    def on_floor(self):
        """Passed on the absolute tolerance alone (a tensor that is ~0, whose relative gap is noise)."""
        return self.passed and self.max_rel > self.tol_rel


def compare(rows, device, dtype, check, tensor, ours, theirs, tol=None, step=None):
    """Append one Row comparing our float64 array with a torch tensor.

    Parameters
    ----------
    rows : list of Row
        The rows so far; one is appended.
    device : str
        The device name, for the row.
    dtype : str
        The torch dtype name; it selects the tolerance.
    check : str
        What is compared (forward, loss, gradient, ...), for the row.
    tensor : str
        Which tensor, for the row.
    ours : array_like
        The NumPy value.
    theirs : torch.Tensor or array_like
        The torch value.
    tol : Tolerance, optional
        Used instead of the dtype's tolerance.
    step : int, optional
        The optimizer or training step, for the rows of check_steps.

    Raises
    ------
    ValueError
        If the two shapes differ.
    """
    theirs = theirs.detach().cpu().double().numpy() if hasattr(theirs, "detach") else np.asarray(theirs)
    ours = np.asarray(ours, dtype=np.float64)
    if ours.shape != theirs.shape:
        raise ValueError(f"{check} {step or ''} {tensor}: shapes differ, ours {ours.shape}, torch {theirs.shape}")
    tol = tol or TOLERANCES[dtype]
    max_abs = float(np.abs(ours - theirs).max())
    max_rel = float(relative_gap(ours, theirs))
    rows.append(Row(device, dtype, check, tensor, max_abs, max_rel, tol.rel, tol.abs,
                    max_rel <= tol.rel or max_abs <= tol.abs, step))
