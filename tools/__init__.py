"""The developer tools (the mutation runners, the benchmarks), importable as `tools.<name>` from the project
root; each is also a script: `python tools/<name>.py`."""
