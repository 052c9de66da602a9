"""The process runtime: threads, started processes and their watchdog, shutdown, the event-loop runner and the version
checks (docs/architecture.md)."""
