"""Participants' data rights in the admin: the per-person export (studies.export_participant)
and erasure on request (studies.erase_participant), each under its own permission, from the
participants' list (an action) or by Prolific id (the erasures' page), and the audit records."""

from django import forms
from django.contrib import admin, messages
from django.core.exceptions import PermissionDenied
from django.http import HttpResponse
from django.shortcuts import redirect, render
from django.urls import path, reverse

from studies.models import ErasureRecord, Participant
from studies.privacy.erasure import ErasureRefused, erase_by_prolific_id, erase_participant
from studies.privacy.export import export_json

ERASE = "studies.erase_participant"
EXPORT = "studies.export_participant"


class ErasureForm(forms.Form):
    reason = forms.CharField(
        widget=forms.Textarea(attrs={"rows": 3, "cols": 80}),
        strip=True,
        help_text="The request as received (who asked, when, how): kept in the audit record. "
        "Never paste the person's Prolific id or words here.",
    )
    confirm = forms.BooleanField(
        label="Erase now: this cannot be undone",
        help_text="Their messages, answers, ratings, ids and every copy go; a paid bonus keeps "
        "its submission id, amount and date.",
    )


class FindForm(ErasureForm):
    prolific_pid = forms.CharField(
        label="Prolific id", max_length=64, strip=True, help_text="Every study they took part in."
    )
    field_order = ["prolific_pid", "reason", "confirm"]


class DataRights:
    """ParticipantAdmin's actions: export everything held (JSON), erase on request."""

    def has_erase_permission(self, request):
        return request.user.has_perm(ERASE)

    def has_access_request_export_permission(self, request):
        return request.user.has_perm(EXPORT)

    @admin.action(
        permissions=["access_request_export"], description="Export everything held (JSON)"
    )
    def access_request_export(self, request, queryset):
        people = list(queryset.select_related("study"))
        response = HttpResponse(export_json(people), content_type="application/json")
        # Named by internal numbers: the file name is seen by more eyes than its content.
        numbers = "-".join(str(p.pk) for p in people[:5])
        response["Content-Disposition"] = f'attachment; filename="participant-{numbers}.json"'
        return response

    @admin.action(permissions=["erase"], description="Erase on request (cannot be undone)")
    def erase_on_request(self, request, queryset):
        form = ErasureForm(request.POST if "apply" in request.POST else None)
        if form.is_valid():
            erased = 0
            for participant in queryset:
                try:
                    erase_participant(
                        participant,
                        reason=form.cleaned_data["reason"],
                        by=request.user.get_username(),
                    )
                    erased += 1
                except ErasureRefused as refused:
                    self.message_user(request, str(refused), messages.ERROR)
            if erased:
                self.message_user(request, f"{erased} participant(s) erased.", messages.SUCCESS)
            return None
        context = {
            **self.admin_site.each_context(request),
            "title": "Erase on request",
            "intro": "Everything parley holds about these participants will be erased.",
            "form": form,
            "participants": list(queryset),
            "action": "erase_on_request",
            "submit": "Erase",
            "opts": self.model._meta,
            "action_checkbox_name": admin.helpers.ACTION_CHECKBOX_NAME,
        }
        return render(request, "admin/studies/prolific_action.html", context)


@admin.register(ErasureRecord)
class ErasureRecordAdmin(admin.ModelAdmin):
    """The audit of erasures: what went, when, by whom and why; never the data."""

    list_display = ["erased_at", "participant_number", "study", "erased_by", "reason"]
    list_filter = ["study"]
    fields = ["erased_at", "participant_number", "study", "erased_by", "reason", "counts", "kept"]
    readonly_fields = fields

    def has_add_permission(self, request):
        return False  # made by an erasure only (the page below)

    def has_change_permission(self, request, obj=None):
        return False

    def has_delete_permission(self, request, obj=None):
        return False  # the audit stays

    def has_view_permission(self, request, obj=None):
        return super().has_view_permission(request, obj) or request.user.has_perm(ERASE)

    def get_urls(self):
        return [
            path(
                "erase/",
                self.admin_site.admin_view(self.erase_by_pid),
                name="studies_erasurerecord_erase",
            )
        ] + super().get_urls()

    def erase_by_pid(self, request):
        if not request.user.has_perm(ERASE):
            raise PermissionDenied
        form = FindForm(request.POST or None)
        if request.method == "POST" and form.is_valid():
            data = form.cleaned_data
            try:
                records = erase_by_prolific_id(
                    data["prolific_pid"], reason=data["reason"], by=request.user.get_username()
                )
            except ErasureRefused as refused:
                form.add_error(None, str(refused))
            else:
                self.message_user(
                    request,
                    f"Erased {len(records)} participation(s): records "
                    + ", ".join(f"#{r.pk}" for r in records),
                    messages.SUCCESS,
                )
                return redirect(reverse("admin:studies_erasurerecord_changelist"))
        found = []
        if form.is_bound and form.data.get("prolific_pid"):
            found = list(Participant.objects.filter(prolific_pid=form.data["prolific_pid"].strip()))
        context = {
            **self.admin_site.each_context(request),
            "title": "Erase a person by Prolific id",
            "intro": "Every participation of this Prolific id is erased from every place parley "
            "keeps it; an audit record without the data stays.",
            "form": form,
            "participants": found,
            "action": "",
            "submit": "Erase",
            "opts": self.model._meta,
        }
        return render(request, "admin/studies/prolific_action.html", context)
