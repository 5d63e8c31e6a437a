"""Who may see what in the studies admin: one rule per kind of data."""

import functools

from django.contrib import admin
from django.contrib.auth import get_permission_codename
from django.core.exceptions import PermissionDenied
from django.urls import path

from studies.models import (
    Participant,
)


def pages(model_admin: admin.ModelAdmin, *routes) -> list:
    """A ModelAdmin's own pages, each (route, view, url name, permission), behind the admin's
    login and, like the built-in pages, the model permission: "view" to read, "change" to act,
    "participants" to read what participants wrote (see can_read_participants)."""
    return [
        path(
            route, model_admin.admin_site.admin_view(permitted(model_admin, perm, view)), name=name
        )
        for route, view, name, perm in routes
    ]


def can_read_participants(request) -> bool:
    """The one rule for participants' own data (transcripts, answers, every per-participant page
    and export): the permission to view participants, as their list and pages require."""
    opts = Participant._meta
    return any(
        request.user.has_perm(f"{opts.app_label}.{get_permission_codename(action, opts)}")
        for action in ("view", "change")  # as ModelAdmin.has_view_permission
    )


def permitted(model_admin: admin.ModelAdmin, perm: str, view):
    """The view, refused (403) to whoever lacks the permission on the model or its object."""
    has_permission = {
        "view": model_admin.has_view_permission,
        "change": model_admin.has_change_permission,
        "participants": lambda request, obj: (
            model_admin.has_view_permission(request, obj) and can_read_participants(request)
        ),
    }[perm]

    @functools.wraps(view)
    def checked(request, *args, **kwargs):
        obj = model_admin.get_object(request, str(kwargs["pk"])) if "pk" in kwargs else None
        if not has_permission(request, obj):
            raise PermissionDenied
        return view(request, *args, **kwargs)

    return checked


def can_change_participants(request) -> bool:
    """Decisions and bonuses act on participants' submissions: the permission to change them."""
    opts = Participant._meta
    return request.user.has_perm(f"{opts.app_label}.{get_permission_codename('change', opts)}")


def identified(request, names, pseudonyms: dict[str, str]) -> list[str]:
    """A ModelAdmin's field names as a user sees them: a field that names a participant (a
    Participant's str is their Prolific id, a Conversation's "conversation of <id>") gives way to
    its pseudonym in `pseudonyms` (a display by number) for anyone without the participants
    permission."""
    if can_read_participants(request):
        return list(names)
    return [pseudonyms.get(name, name) for name in names]


class NamesParticipants:
    """A ModelAdmin whose rows name participants throughout (Prolific's events carry the
    participant's id and submission id, which together resume their study; bonus lines name
    who is paid): viewed with its own permission and the participants permission."""

    def has_view_permission(self, request, obj=None):
        return super().has_view_permission(request, obj) and can_read_participants(request)
