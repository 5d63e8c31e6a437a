"""Django management commands of the agents app (thin wrappers over agents/ code)."""
