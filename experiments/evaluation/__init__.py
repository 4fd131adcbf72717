"""What reads a finished run: scores at any length (windows, long_context, task_lengths), context extension
(rope_scaling, factor_search), retrieval probes (probes, probe_grid), decoding, and the tables over seeds
(lineage, length_table). Imports runs/ and shared/, never sweeps/."""
