"""speczoo.spec.drafters."""
