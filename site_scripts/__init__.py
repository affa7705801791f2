"""Page generators for the documentation site (they import transformer; never the reverse)."""
