"""The project's own account tooling: ``createsuperuser`` that, in production, never
creates an admin whose password fails the validators (docs/security.md)."""
