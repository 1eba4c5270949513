"""What a run leaves: Cycle and Trace, forward records, divergences, text tables."""
