"""What every command shares: one-line refusals and flag parsing, stop signals, durable file writes and
locks, intervals over seeds (statistics), plot styles."""
