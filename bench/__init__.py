"""`make bench`: every figure the issues ask for, each beside a baseline measured in the same run."""
