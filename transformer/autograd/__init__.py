"""Reverse-mode automatic differentiation on a tape, in NumPy, and the model composed from it.

- `tensor`: the engine: `Tensor`, its primitive operations with their gradient rules, `backward`;
- `custom`: the seam that puts a fused operation with its own backward (a vector-Jacobian product)
  on the tape;
- `model`: the transformer of `transformer.model`, built from the engine's operations.
"""
