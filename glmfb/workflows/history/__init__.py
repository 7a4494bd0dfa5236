"""The history of verdicts: the store, its series, and the change points found in them."""
