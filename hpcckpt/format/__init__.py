"""What is on disk: the metadata document and the chunk table (docs/format.md)."""
