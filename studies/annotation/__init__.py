"""Annotation studies: the pool of conversations raters read, and how it is shared out."""
