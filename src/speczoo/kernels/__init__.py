"""speczoo.kernels."""
