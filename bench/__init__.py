"""`make bench`: every benchmark figure with its target, each beside a baseline measured in the same run."""
