"""NoPE (Haviv et al. 2022): e_ij = q_i . k_j / sqrt(d); nothing else."""
