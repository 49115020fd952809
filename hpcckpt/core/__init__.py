"""Pure building blocks: regions, planning, encoding, names, checksums and the like (no MPI, no I/O)."""
