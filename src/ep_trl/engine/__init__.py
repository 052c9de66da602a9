"""What every adapter shares: the caller it reads, the settings that combine, the stream of played and scored episodes,
and the metrics of a call (docs/architecture.md)."""
