"""The developer tools (the mutation runners, the measurement of which tests check what, the benchmarks).

Run each from the project root as `python -m tools.<name>`."""
