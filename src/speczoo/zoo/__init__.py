"""speczoo.zoo."""
