"""speczoo.decoding.drafters."""
