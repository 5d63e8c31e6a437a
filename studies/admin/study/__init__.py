"""The study page, assembled in study_admin.py from a mixin per concern."""

from studies.admin.study.study_admin import StudyAdmin

__all__ = ["StudyAdmin"]
