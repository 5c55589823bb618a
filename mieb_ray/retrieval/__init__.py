"""BioVITA text-to-image taxon retrieval: the benchmark's data, group-max scoring and metrics (no Ray here)."""
