"""speczoo.bench."""
