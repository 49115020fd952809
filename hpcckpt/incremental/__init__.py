"""Incremental saves: the rules, block hashes, deduplication, chains of versions and their compaction."""
