"""ml_collections configs, one per experiment. Plain data: imports only ml_collections."""
