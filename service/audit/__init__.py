"""The audit log: who did what, through which route, kept in the database (docs/security.md)."""
