"""The collective helpers: every exchange between ranks, agreement, the watchdog, error reporting."""
