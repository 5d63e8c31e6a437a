"""Django models of this app (none yet)."""
