"""Many runs: the tables and plots of a comparison (no JAX)."""
