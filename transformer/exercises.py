"""Exercises: write a function of the model yourself, and let the project's own checks grade it.

    python -m transformer exercise list
    python -m transformer exercise start layernorm --dir exercises     writes exercises/layernorm.py
    python -m transformer exercise check layernorm exercises/layernorm.py

Each exercise (EXERCISES) names the functions the reader writes and the checks that grade them: the shapes and
dtypes, the tiny example's numbers, central differences, the properties the unit tests state and, where torch is
installed, PyTorch. A failed check says which property failed and where on the site it is explained, never the
answer.
"""

from . import exercise_layers, exercise_systems
from .exercise_files import ExerciseError, load, skeleton, solution
from .exercise_grade import Exercise, Result, grade

EXERCISES = {e.name: e for e in (*exercise_layers.exercises(), *exercise_systems.exercises())}

__all__ = ["EXERCISES", "Exercise", "ExerciseError", "Result", "grade", "load", "skeleton", "solution"]
