"""Loads: read plans over the chunk index, the chunk directory, the reader, views and redistribution."""
