"""speczoo.spec."""
