"""Storage backends: where the bytes of a version live.  Only POSIX directories for now."""
