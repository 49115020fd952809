"""The save run: describe, plan, select, stage, transform, write and commit, blocking or in the background."""
