"""A Checkpointer root: its versions (catalog), writer lock, halt file, tracked output files and pacing."""
