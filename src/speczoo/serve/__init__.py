"""speczoo.serve."""
